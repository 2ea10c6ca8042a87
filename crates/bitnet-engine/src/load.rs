//! One loading call: a path and options in, a ready [`Engine`] out.
//!
//! open (memory-mapped, or read into memory) → bind the model → optionally re-encode the LM
//! head (releasing the mapped pages of its source as they are converted) → tokenizer →
//! engine. Every option is validated once, before anything heavy runs. Progress is reported
//! through a callback (the CLI turns it into progress bars and notes).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use web_time::Instant;

use bitnet_gguf::{GgufError, GgufFile, Limits};
use bitnet_kernels::{Pool, RowMatrix, RowType};
use bitnet_model::{ApproxHead, ApproxOptions, KvType, Model, Numerics, OwnedModel};
use bitnet_tokenizer::{PreTokenizer, Tokenizer};

use crate::{Engine, EngineError, EngineOptions, Result};

/// How the LM head is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LmHeadFormat {
    /// The file's own matrix (the tied F16 embedding of the official file): exact.
    #[default]
    File,
    /// A Q8_0 copy built at load (less to read per token, small logit error).
    Q8_0,
    /// A Q6_K copy built at load.
    Q6K,
    /// A Q4_0 copy built at load.
    Q4_0,
    /// The file's matrix with its vocabulary clustered at load (k-means): with fast numerics
    /// only the best clusters' members get exact logits ([`bitnet_model::ApproxHead`]).
    Approx(ApproxOptions),
}

impl std::fmt::Display for LmHeadFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LmHeadFormat::File => "f16",
            LmHeadFormat::Q8_0 => "q8_0",
            LmHeadFormat::Q6K => "q6_k",
            LmHeadFormat::Q4_0 => "q4_0",
            LmHeadFormat::Approx(_) => "approx",
        })
    }
}

impl LmHeadFormat {
    /// Whether the GPU backend runs this head: the file's rows, or Q8_0 / Q4_0 rows it
    /// quantizes as they are uploaded.
    pub fn on_gpu(self) -> bool {
        matches!(
            self,
            LmHeadFormat::File | LmHeadFormat::Q8_0 | LmHeadFormat::Q4_0
        )
    }

    pub(crate) fn row_type(self) -> Option<RowType> {
        match self {
            LmHeadFormat::File | LmHeadFormat::Approx(_) => None,
            LmHeadFormat::Q8_0 => Some(RowType::Q8_0),
            LmHeadFormat::Q6K => Some(RowType::Q6K),
            LmHeadFormat::Q4_0 => Some(RowType::Q4_0),
        }
    }
}

/// Where the forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The CPU kernels (default).
    #[default]
    Cpu,
    /// The GPU backend (`bitnet_gpu`); loading fails when no adapter can run the model.
    Gpu,
    /// The GPU when an adapter can run the model, else the CPU (with a note saying why).
    Auto,
}

/// Everything [`load`] needs besides the path.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Threads of the engine's pool (and of the LM-head conversion).
    pub threads: usize,
    pub numerics: Numerics,
    pub kv_type: KvType,
    pub lm_head: LmHeadFormat,
    /// Read the whole file into memory instead of mapping it (immune to the file changing
    /// underneath; costs its size in RAM).
    pub in_memory: bool,
    /// Pre-tokenizer override (default: from the file, LLaMA-3 for the official one).
    pub pre_tokenizer: Option<PreTokenizer>,
    /// Tokens per prefill batch.
    pub n_batch: usize,
    /// Upper bound for one session's KV cache.
    pub kv_budget_bytes: u64,
    /// Repack I2_S weights for the panel GEMM when the CPU's kernel tier has one (default);
    /// `false` keeps the file's layout only (llama.cpp's `--no-repack`).
    pub repack: bool,
    /// Run within a RAM budget (the low-memory mode, [`crate::budget`]): weights streamed
    /// through a window of two blocks, the head in chunks, the KV type and context fitted.
    pub budget: Option<crate::budget::BudgetRequest>,
    /// CPU, GPU or whichever is there.
    pub device: Device,
    /// The GPU adapter (an index of `bitnet_gpu::adapters()`); `None`: the best one found.
    pub gpu_adapter: Option<usize>,
    /// Build a Q8_0 screen of the file's LM head ([`bitnet_model::HeadScreen`]): greedy and
    /// top-k generation steps on the CPU then compute only the logits that can decide the
    /// token (the same token as from every logit), reading about half the head's bytes.
    /// Fast numerics, the file's head, no RAM budget.
    pub screen_head: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        let e = EngineOptions::default();
        LoadOptions {
            threads: e.threads,
            numerics: e.numerics,
            kv_type: e.kv_type,
            lm_head: LmHeadFormat::File,
            in_memory: false,
            pre_tokenizer: None,
            n_batch: e.n_batch,
            kv_budget_bytes: e.kv_budget_bytes,
            repack: true,
            budget: None,
            device: Device::Cpu,
            gpu_adapter: None,
            screen_head: false,
        }
    }
}

impl LoadOptions {
    pub(crate) fn engine_options(&self) -> EngineOptions {
        EngineOptions {
            threads: self.threads,
            numerics: self.numerics,
            kv_type: self.kv_type,
            n_batch: self.n_batch,
            kv_budget_bytes: self.kv_budget_bytes,
        }
    }

    /// Every combination that cannot run, refused before the file is opened.
    pub fn validate(&self) -> Result<()> {
        self.engine_options().validate()?;
        if self.numerics == Numerics::Exact && self.lm_head != LmHeadFormat::File {
            return Err(EngineError::ExactNeedsF16Head);
        }
        if self.screen_head {
            let refuse = |why: &str| Err(EngineError::HeadScreen(why.into()));
            if self.numerics == Numerics::Exact {
                return refuse("fast numerics only (exact numerics computes every logit)");
            }
            if self.lm_head != LmHeadFormat::File {
                return refuse("it screens the file's own head (drop --lm-head)");
            }
            if self.budget.is_some() {
                return refuse("not under a RAM budget (the screen is held in memory)");
            }
            if self.device == Device::Gpu {
                return refuse("the CPU only (the GPU picks its token on the device)");
            }
        }
        if self.device == Device::Gpu {
            let refuse = |what: &str| {
                Err(EngineError::Device(format!(
                    "the GPU backend does not run {what} (use --device cpu or auto)"
                )))
            };
            if self.numerics == Numerics::Exact {
                return refuse("exact numerics (bitnet.cpp's CPU float order)");
            }
            if self.budget.is_some() {
                return refuse("the low-memory mode (--ram-budget)");
            }
            if !self.lm_head.on_gpu() {
                return refuse(&format!(
                    "a {} LM head (the file's, q8_0 or q4_0)",
                    self.lm_head
                ));
            }
            if self.kv_type == KvType::Q4_0 {
                return refuse("a q4_0 KV cache (its cache is f16, f32 or q8_0)");
            }
        }
        if self.budget.is_some() {
            if self.in_memory {
                return Err(EngineError::Budget {
                    reason: "the low-memory mode streams the weights from the mapped file; \
                             it cannot read the whole file into memory (drop --in-memory)"
                        .into(),
                });
            }
            if self.lm_head.row_type().is_some() {
                return Err(EngineError::Budget {
                    reason: "a quantized LM head built at load is held whole in memory; under a \
                             budget the file's head is streamed instead (drop --lm-head)"
                        .into(),
                });
            }
        }
        Ok(())
    }
}

/// What loading reports as it goes.
#[derive(Debug)]
pub enum LoadEvent<'a> {
    /// The file is open.
    Opened { path: &'a Path, bytes: u64 },
    /// The LM head conversion started (`rows` to convert).
    LmHeadStart { format: LmHeadFormat, rows: usize },
    /// The LM head is built.
    LmHeadDone {
        format: LmHeadFormat,
        /// Bytes of the new head, and of the matrix it was built from.
        bytes: usize,
        source_bytes: usize,
        elapsed: Duration,
        /// Whether the source's mapped pages were released.
        released: bool,
    },
    /// The LM head's screen is built ([`LoadOptions::screen_head`]).
    HeadScreen {
        /// Bytes of the screen, and of the head it screens.
        bytes: usize,
        head_bytes: usize,
        elapsed: Duration,
        /// Whether the head's mapped pages were released (read again only row by row).
        released: bool,
    },
    /// The I2_S projections were repacked for the panel GEMM.
    Repacked {
        /// Matrices repacked, and the bytes of the new copies.
        matrices: usize,
        bytes: usize,
        elapsed: Duration,
        /// Whether the mapped pages of the file's copies were released.
        released: bool,
    },
    /// The low-memory mode's plan (under a RAM budget).
    Plan(&'a crate::budget::MemoryPlan),
    /// The model was uploaded to a GPU.
    Gpu {
        adapter: &'a str,
        backend: &'a str,
        /// Device bytes of the weights and activation buffers (each session's cache adds
        /// its own).
        bytes: u64,
        elapsed: Duration,
    },
    /// Something the user should know that does not stop loading.
    Note(String),
}

/// Open `path` and build an engine with `opts`, reporting progress to `progress`.
pub fn load(
    path: &Path,
    opts: &LoadOptions,
    progress: &mut dyn FnMut(LoadEvent<'_>),
) -> Result<Engine> {
    opts.validate()?;
    let file = open_file(path, opts.in_memory)?;
    if opts.budget.is_some() && !file.is_mapped() {
        // Only a compressed QSF gets here (--in-memory is refused with a budget).
        return Err(EngineError::QsfStreaming);
    }
    progress(LoadEvent::Opened {
        path,
        bytes: file.file_size(),
    });
    load_file(Arc::new(file), opts, progress)
}

/// [`load`] for a file already opened (for example a GGUF built in memory by the converter).
pub fn load_file(
    file: Arc<GgufFile>,
    opts: &LoadOptions,
    progress: &mut dyn FnMut(LoadEvent<'_>),
) -> Result<Engine> {
    bitnet_gpu::block(load_file_async(file, opts, progress))?
}

/// [`load_file`], for callers that must not block (a browser's WebGPU): the one
/// implementation.
pub async fn load_file_async(
    file: Arc<GgufFile>,
    opts: &LoadOptions,
    progress: &mut dyn FnMut(LoadEvent<'_>),
) -> Result<Engine> {
    opts.validate()?;
    if let Some(req) = &opts.budget {
        if req.stream == crate::budget::StreamMode::Mmap {
            // Before binding reads every projection (its code check): what is not cached yet
            // then comes in huge pages, as the window wants it (`prefer_huge_pages`).
            file.advise_huge_pages()
                .map_err(bitnet_model::ModelError::from)?;
        }
        let model = OwnedModel::load_releasing(file)?;
        return load_budgeted(model, opts, req, progress);
    }
    let mut model = OwnedModel::load(file)?;
    if gpu_wanted(opts) {
        if let Some(gpu) = load_gpu(&model, opts, progress).await? {
            let tokenizer = Tokenizer::from_gguf(model.file().metadata(), opts.pre_tokenizer)?;
            return Engine::new(model, tokenizer, opts.engine_options())?.on_gpu(gpu);
        }
    }
    let pool = Pool::new(opts.threads);
    if opts.lm_head != LmHeadFormat::File {
        model.with_model_mut(|file, m| build_lm_head(m, file, opts.lm_head, &pool, progress))?;
    }
    if opts.screen_head {
        model.with_model_mut(|file, m| build_head_screen(m, file, &pool, progress))?;
    }
    if opts.repack {
        model.with_model_mut(|file, m| repack_weights(m, file, &pool, progress))?;
    }
    let tokenizer = Tokenizer::from_gguf(model.file().metadata(), opts.pre_tokenizer)?;
    Engine::new(model, tokenizer, opts.engine_options())
}

/// Whether this load tries the GPU (`auto` gives way to the CPU's exact numerics, budget,
/// Q6_K and approximate heads, screened head and q4_0 cache, which the GPU backend does not
/// run).
fn gpu_wanted(opts: &LoadOptions) -> bool {
    match opts.device {
        Device::Cpu => false,
        Device::Gpu => true,
        Device::Auto => {
            opts.numerics == Numerics::Fast
                && opts.budget.is_none()
                && opts.lm_head.on_gpu()
                && !opts.screen_head
                && opts.kv_type != KvType::Q4_0
        }
    }
}

/// The GPU backend's options for a load with `opts`.
pub(crate) fn gpu_options(opts: &LoadOptions) -> bitnet_gpu::GpuOptions {
    bitnet_gpu::GpuOptions {
        adapter: opts.gpu_adapter,
        max_batch: opts.n_batch.max(1),
        // The decode kernels are measured against each other with this set.
        decode: match std::env::var("BITNET_GPU_DECODE").as_deref() {
            Ok("rows") => bitnet_gpu::DecodeKernels::Rows,
            Ok("mv") => bitnet_gpu::DecodeKernels::Mv,
            Ok("fused") => bitnet_gpu::DecodeKernels::Fused,
            Ok("lanes") => bitnet_gpu::DecodeKernels::Lanes,
            _ => bitnet_gpu::DecodeKernels::default(),
        },
        // Q8_0 / Q4_0: quantized as the rows are uploaded (no copy on the host).
        head: opts.lm_head.row_type(),
        ..Default::default()
    }
}

/// Upload the model to the GPU. `Ok(None)`: `auto` found no GPU that can run it (noted).
async fn load_gpu(
    model: &OwnedModel,
    opts: &LoadOptions,
    progress: &mut dyn FnMut(LoadEvent<'_>),
) -> Result<Option<bitnet_gpu::GpuModel>> {
    let t0 = Instant::now();
    match bitnet_gpu::GpuModel::new_async(model.model(), gpu_options(opts)).await {
        Ok(g) => {
            // The weights now live on the device: the mapped pages read while uploading go.
            let m = model.model();
            for l in &m.layers {
                for p in l.projections() {
                    let _ = model.file().release(p.packed_data());
                }
            }
            let _ = model.file().release(m.lm_head().data());
            let info = g.gpu().info();
            progress(LoadEvent::Gpu {
                adapter: &info.name,
                backend: &info.backend,
                bytes: g.nbytes(),
                elapsed: t0.elapsed(),
            });
            Ok(Some(g))
        }
        Err(e) if opts.device == Device::Auto => {
            progress(LoadEvent::Note(format!("running on the CPU: {e}")));
            Ok(None)
        }
        Err(e) => Err(EngineError::Gpu(e)),
    }
}

/// The low-memory mode: no repacked copy, no quantized head (an approximate head's index is
/// built, reading the file with pread); plan, then stream.
fn load_budgeted(
    mut model: OwnedModel,
    opts: &LoadOptions,
    req: &crate::budget::BudgetRequest,
    progress: &mut dyn FnMut(LoadEvent<'_>),
) -> Result<Engine> {
    let tokenizer = Tokenizer::from_gguf(model.file().metadata(), opts.pre_tokenizer)?;
    // Whatever binding touched of the file (metadata, norms, scales) can go: it is read
    // again when needed.
    let _ = model.file().release(model.file().as_bytes());
    if let LmHeadFormat::Approx(a) = opts.lm_head {
        let file = model.file_arc();
        let pool = Pool::new(opts.threads);
        model.with_model_mut(|_, m| -> Result<()> {
            let head = m.lm_head();
            // Rows copied from the file (pread), so the mapped head never becomes resident;
            // a head that is not the file's bytes has nothing mapped to keep out.
            let at = file.range_of(head.data()).map(|at| (&*file, at.start));
            let approx = build_approx(m, a, &pool, &head_rows(head, at)?, progress)?;
            m.approx_head = Some(approx);
            Ok(())
        })?;
    }
    let layers = crate::budget::layer_ranges(model.model(), model.file())?;
    let (huge_pages, huge_note) = match req.stream {
        crate::budget::StreamMode::Mmap => {
            // The blocks and the head: what streams per token.
            let head = model.file().range_of(model.model().lm_head().data());
            let streamed: Vec<_> = layers.iter().cloned().chain(head).collect();
            crate::budget::prefer_huge_pages(model.file(), &streamed)?
        }
        crate::budget::StreamMode::Pread => (false, None),
    };
    let runtime = crate::sys::rss_bytes().unwrap_or(0);
    let mut plan = crate::budget::plan(
        model.model(),
        &layers,
        req,
        opts.kv_type,
        opts.numerics,
        opts.threads,
        runtime,
    )?;
    plan.notes.extend(huge_note);
    progress(LoadEvent::Plan(&plan));
    let mut eo = opts.engine_options();
    eo.kv_type = plan.kv_type;
    eo.n_batch = plan.n_batch;
    Engine::new(model, tokenizer, eo)?.stream(plan, req.stream, huge_pages)
}

/// Open a GGUF file, memory-mapped or (`in_memory`) read whole, with the default limits.
/// A QSF file has every section's CRC checked; an uncompressed one is then used in place
/// (mapped, like a GGUF), a compressed one (or `in_memory`) is rebuilt in memory.
pub fn open_file(path: &Path, in_memory: bool) -> Result<GgufFile> {
    if bitnet_qsf::is_qsf(path) {
        return bitnet_qsf::QsfFile::open(path)
            .and_then(|q| {
                if in_memory {
                    q.to_gguf()
                } else {
                    q.into_gguf()
                }
            })
            .map_err(|error| EngineError::OpenQsf {
                path: PathBuf::from(path),
                error,
            });
    }
    let limits = Limits::default();
    let opened = if in_memory {
        GgufFile::open_in_memory(path, &limits)
    } else {
        GgufFile::open(path, &limits)
    };
    opened.map_err(|error| EngineError::Open {
        path: PathBuf::from(path),
        error,
    })
}

/// Repack `model`'s I2_S projections for the panel GEMM when the selected kernel tier has one
/// (`bitnet_kernels::has_panel_kernel`), releasing the mapped pages of the file's copies as
/// each matrix is done: the tiers that use panels never read them again, so the weights stay
/// resident once, not twice. (A file read into memory keeps its copy: +1× the projections.)
/// TQ2_0, TQ1_0, BitNet32F16 and Split32 projections go into the same panels, in both numerics
/// (`TernaryMatrix::repack`: the same integer sums and float steps; a matrix whose blocks
/// share one scale takes I2_S's on every path, another keeps its block scales apart).
/// Returns the bytes of the repacked copies (0 when the tier has no panel kernel).
pub fn repack_weights(
    model: &mut Model<'_>,
    file: &GgufFile,
    pool: &Pool,
    progress: &mut dyn FnMut(LoadEvent<'_>),
) -> Result<usize> {
    if !bitnet_kernels::has_panel_kernel(bitnet_kernels::isa()) {
        return Ok(0);
    }
    let t = Instant::now();
    let (mut matrices, mut bytes) = (0usize, 0usize);
    let mut released = true;
    let mut release_error = None;
    for layer in &mut model.layers {
        for m in layer.projections_mut() {
            let n = m.repack(pool)?;
            if n == 0 {
                continue;
            }
            matrices += 1;
            bytes += n;
            match file.release(m.packed_data()) {
                Ok(r) => released &= r,
                Err(e) => {
                    released = false;
                    release_error.get_or_insert(e.to_string());
                }
            }
        }
    }
    if let Some(e) = release_error {
        progress(LoadEvent::Note(format!(
            "the file's copy of the weights stays resident ({e})"
        )));
    }
    if matrices > 0 {
        progress(LoadEvent::Repacked {
            matrices,
            bytes,
            elapsed: t.elapsed(),
            released,
        });
    }
    Ok(bytes)
}

/// Replace `model`'s LM head with a `format` copy of it (no-op for [`LmHeadFormat::File`]).
///
/// When `file` is memory-mapped, the pages of the source matrix (the F16 embedding of a tied
/// head) are released as they are converted, so they are not resident beside the new copy:
/// token embedding lookups later fault in only the rows they read. Returns the byte range of
/// the file so released, if any.
pub fn build_lm_head(
    model: &mut Model<'_>,
    file: &GgufFile,
    format: LmHeadFormat,
    pool: &Pool,
    progress: &mut dyn FnMut(LoadEvent<'_>),
) -> Result<Option<std::ops::Range<usize>>> {
    if let LmHeadFormat::Approx(a) = format {
        let approx = build_approx(model, a, pool, &head_rows(model.lm_head(), None)?, progress)?;
        model.approx_head = Some(approx);
        return Ok(None);
    }
    let Some(ty) = format.row_type() else {
        return Ok(None);
    };
    progress(LoadEvent::LmHeadStart {
        format,
        rows: model.lm_head().rows(),
    });
    let t = Instant::now();
    let pages = Release::new(file);
    let q = RowMatrix::quantize_from_releasing(model.lm_head(), ty, pool, &|b| pages.hand(b))?;
    let released = pages.finish(progress, "the source of the LM head stays resident");
    let range = file.range_of(model.lm_head().data()).filter(|_| released);
    progress(LoadEvent::LmHeadDone {
        format,
        bytes: q.nbytes(),
        source_bytes: model.lm_head().nbytes(),
        elapsed: t.elapsed(),
        released,
    });
    model.set_lm_head(q);
    Ok(range)
}

/// Build the screen of `model`'s LM head ([`bitnet_model::HeadScreen`]), releasing the mapped
/// pages of the head as they are read (greedy and top-k steps then read only the candidates'
/// rows of it; the tied embedding's lookups, one row a token). Returns the byte range of the
/// file so released, if any.
pub fn build_head_screen(
    model: &mut Model<'_>,
    file: &GgufFile,
    pool: &Pool,
    progress: &mut dyn FnMut(LoadEvent<'_>),
) -> Result<Option<std::ops::Range<usize>>> {
    let t = Instant::now();
    let pages = Release::new(file);
    let screen = bitnet_model::HeadScreen::build(model.lm_head(), pool, &|b| pages.hand(b))?;
    let released = pages.finish(
        progress,
        "the LM head's pages stay resident beside its screen",
    );
    progress(LoadEvent::HeadScreen {
        bytes: screen.nbytes(),
        head_bytes: model.lm_head().nbytes(),
        elapsed: t.elapsed(),
        released,
    });
    model.head_screen = Some(screen);
    Ok(file.range_of(model.lm_head().data()).filter(|_| released))
}

/// The mapped pages of a matrix released run by run while a copy of it is built, from the
/// builder's threads: whether every run was released, and the first error.
struct Release<'f> {
    file: &'f GgufFile,
    released: std::sync::atomic::AtomicBool,
    error: std::sync::OnceLock<String>,
}

impl<'f> Release<'f> {
    fn new(file: &'f GgufFile) -> Self {
        Release {
            file,
            released: std::sync::atomic::AtomicBool::new(false),
            error: std::sync::OnceLock::new(),
        }
    }

    /// Release `bytes` (a run of the source's rows, read for the last time).
    fn hand(&self, bytes: &[u8]) {
        match self.file.release(bytes) {
            Ok(r) => {
                self.released
                    .fetch_or(r, std::sync::atomic::Ordering::Relaxed);
            }
            // A source that is not the file's bytes (nothing mapped to release).
            Err(GgufError::NotInFile { .. }) => {}
            Err(e) => {
                let _ = self.error.set(e.to_string());
            }
        }
    }

    /// Whether the pages went; an error is noted with `what` first.
    fn finish(self, progress: &mut dyn FnMut(LoadEvent<'_>), what: &str) -> bool {
        if let Some(e) = self.error.get() {
            progress(LoadEvent::Note(format!("{what} ({e})")));
        }
        self.released.into_inner() && self.error.get().is_none()
    }
}

/// Rows of `head` by index as f32, for the clustering: with `pread` (the file and where the
/// head starts in it), copied from the file; else dequantized where they are.
fn head_rows<'r>(
    head: &'r RowMatrix<'r>,
    pread: Option<(&'r GgufFile, usize)>,
) -> Result<impl Fn(&[u32], &mut [f32]) -> bitnet_model::Result<()> + 'r> {
    let rb = head.row_type().row_bytes(head.cols())?;
    Ok(move |ids: &[u32], out: &mut [f32]| {
        let mut bytes = Vec::new();
        for (&r, o) in ids.iter().zip(out.chunks_exact_mut(head.cols())) {
            let r = r as usize;
            match pread {
                Some((file, start)) => {
                    bytes.resize(rb, 0);
                    file.read_at(start.saturating_add(r.saturating_mul(rb)), &mut bytes)?;
                    bitnet_kernels::rows::dequantize_row_bytes(head.row_type(), &bytes, o);
                }
                None => head.dequantize_row(r, o)?,
            }
        }
        Ok(())
    })
}

/// Cluster `model`'s LM head (rows from `read`) into an approximate head.
fn build_approx(
    model: &Model<'_>,
    opts: ApproxOptions,
    pool: &Pool,
    read: &bitnet_model::RowReader<'_>,
    progress: &mut dyn FnMut(LoadEvent<'_>),
) -> Result<ApproxHead> {
    let head = model.lm_head();
    let format = LmHeadFormat::Approx(opts);
    progress(LoadEvent::LmHeadStart {
        format,
        rows: head.rows(),
    });
    let t = Instant::now();
    let a = ApproxHead::build(head.rows(), head.cols(), &opts, pool, read)?;
    progress(LoadEvent::LmHeadDone {
        format,
        bytes: a.nbytes(),
        source_bytes: head.nbytes(),
        elapsed: t.elapsed(),
        released: false,
    });
    progress(LoadEvent::Note(format!(
        "approximate LM head: {} clusters of the {} rows; per token, exact logits for the \
         members of the {} best (about {:.1}% of the vocabulary), an estimate from its cluster for the rest",
        a.clusters(),
        head.rows(),
        a.probe(),
        100.0 * a.probe() as f64 / a.clusters().max(1) as f64
    )));
    Ok(a)
}
