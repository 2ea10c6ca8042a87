//! Pieces shared by subcommands: opening a model, thread defaults.

use std::path::Path;

use anyhow::{Context, Result};
use bitnet_gguf::{GgufFile, Limits};

/// Open a GGUF file (memory-mapped, or read into memory with `in_memory`).
pub fn open_gguf(path: &Path, in_memory: bool) -> Result<GgufFile> {
    let limits = Limits::default();
    let f = if in_memory {
        GgufFile::open_in_memory(path, &limits)
    } else {
        GgufFile::open(path, &limits)
    };
    f.with_context(|| format!("cannot open model {}", path.display()))
}

/// Physical cores (logical / 2 when SMT is on), at least 1.
pub fn default_threads() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    physical_cores().unwrap_or(logical).clamp(1, logical)
}

fn physical_cores() -> Option<usize> {
    // Linux: count distinct (physical id, core id) pairs.
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mut cores = std::collections::BTreeSet::new();
    let (mut phys, mut core) = (None::<String>, None::<String>);
    for line in info.lines().chain(std::iter::once("")) {
        if line.trim().is_empty() {
            if let (Some(p), Some(c)) = (phys.take(), core.take()) {
                cores.insert((p, c));
            }
            continue;
        }
        if let Some((k, v)) = line.split_once(':') {
            match k.trim() {
                "physical id" => phys = Some(v.trim().to_string()),
                "core id" => core = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// Human-readable bytes.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Options every command that runs a model shares.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// Model file (GGUF). Without it, --hf is used.
    #[arg(short, long)]
    pub model: Option<std::path::PathBuf>,
    /// Hugging Face repo[:file] to download into the HF cache when -m is not given.
    #[arg(
        long,
        default_value = "microsoft/bitnet-b1.58-2B-4T-gguf:ggml-model-i2_s.gguf"
    )]
    pub hf: String,
    /// Threads (default: physical cores). `bench` also takes a comma-separated list.
    #[arg(short, long, value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Context size in tokens (default: the model's training context, at most 4096).
    #[arg(short = 'c', long)]
    pub ctx_size: Option<usize>,
    /// fast (default) or exact (bit-identical to bitnet.cpp's logits).
    #[arg(long, default_value = "fast")]
    pub numerics: bitnet_model::Numerics,
    /// KV cache element type: f16 (default) or f32.
    #[arg(long, default_value = "f16")]
    pub kv_cache: bitnet_model::KvType,
    /// Read the whole model into memory instead of memory-mapping it.
    #[arg(long)]
    pub in_memory: bool,
    /// Pre-tokenizer override: llama3 or default (bitnet.cpp's fallback).
    #[arg(long)]
    pub pre: Option<String>,
    /// LM head format: f16 (the file's tied embedding, exact; default), or q8_0 / q6_k / q4_0
    /// built from it at load and kept in memory (less to read per token, small logit error).
    #[arg(long, default_value = "f16")]
    pub lm_head: LmHead,
}

/// The LM head's storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LmHead {
    F16,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q6_k")]
    Q6K,
    #[value(name = "q4_0")]
    Q4_0,
}

/// Replace the model's LM head with a quantized copy when asked (progress on stderr).
///
/// When `file` is memory-mapped, the pages of the source matrix (the F16 embedding of a tied
/// head) are released as they are converted, so they are not resident beside the quantized
/// copy: token embedding lookups later fault in only the rows they read. Returns the byte
/// range of the file so released, if any.
pub fn apply_lm_head(
    model: &mut bitnet_model::Model<'_>,
    file: &GgufFile,
    a: &ModelArgs,
    pool: &bitnet_kernels::Pool,
) -> Result<Option<std::ops::Range<usize>>> {
    use bitnet_kernels::{RowMatrix, RowType};
    let ty = match a.lm_head {
        LmHead::F16 => return Ok(None),
        LmHead::Q8_0 => RowType::Q8_0,
        LmHead::Q6K => RowType::Q6K,
        LmHead::Q4_0 => RowType::Q4_0,
    };
    if a.numerics == bitnet_model::Numerics::Exact {
        anyhow::bail!("--numerics exact needs the F16 LM head (drop --lm-head)");
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(format!(
        "building a {:?} LM head from the embedding",
        a.lm_head
    ));
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let t = std::time::Instant::now();
    let release_error = std::sync::OnceLock::new();
    let released = std::sync::atomic::AtomicBool::new(false);
    let q = RowMatrix::quantize_from_releasing(model.lm_head(), ty, pool, &|bytes| {
        match file.release(bytes) {
            Ok(r) => {
                released.fetch_or(r, std::sync::atomic::Ordering::Relaxed);
            }
            // A source that is not the file's bytes (nothing mapped to release).
            Err(bitnet_gguf::GgufError::NotInFile { .. }) => {}
            Err(e) => {
                let _ = release_error.set(e.to_string());
            }
        }
    })?;
    bar.finish_and_clear();
    if let Some(e) = release_error.get() {
        eprintln!("note: the source of the LM head stays resident ({e})");
    }
    let range = file
        .range_of(model.lm_head().data())
        .filter(|_| released.into_inner() && release_error.get().is_none());
    eprintln!(
        "LM head: {:?}, {} in memory (was {}), built in {:.1} s",
        a.lm_head,
        human_bytes(q.nbytes() as u64),
        human_bytes(model.lm_head().nbytes() as u64),
        t.elapsed().as_secs_f64()
    );
    model.set_lm_head(q);
    Ok(range)
}

impl ModelArgs {
    /// The local model path, downloading it first when needed.
    pub fn path(&self) -> Result<std::path::PathBuf> {
        match &self.model {
            Some(p) => Ok(p.clone()),
            None => crate::download::resolve_hf(&self.hf, true),
        }
    }

    /// The thread count (the first of a list; [`Self::single_threads`] refuses lists).
    pub fn threads(&self) -> usize {
        self.threads
            .first()
            .copied()
            .unwrap_or_else(default_threads)
            .max(1)
    }

    /// The thread count for commands that run one configuration: a list is an error.
    pub fn single_threads(&self) -> Result<usize> {
        if self.threads.len() > 1 {
            anyhow::bail!("-t takes one thread count here (a comma-separated list is for `bench`)");
        }
        if self.threads.first() == Some(&0) {
            anyhow::bail!("-t must be at least 1");
        }
        Ok(self.threads())
    }

    pub fn pre_tokenizer(&self) -> Result<Option<bitnet_tokenizer::PreTokenizer>> {
        self.pre
            .as_deref()
            .map(|s| bitnet_tokenizer::PreTokenizer::from_gguf_name(s).map_err(anyhow::Error::from))
            .transpose()
    }
}

/// Build the engine over an opened file.
pub fn load_engine<'a>(file: &'a GgufFile, a: &ModelArgs) -> Result<bitnet_engine::Engine<'a>> {
    let threads = a.single_threads()?;
    let mut model = bitnet_model::Model::load(file).context("cannot load model")?;
    apply_lm_head(&mut model, file, a, &bitnet_kernels::Pool::new(threads))?;
    let tokenizer = bitnet_tokenizer::Tokenizer::from_gguf(file.metadata(), a.pre_tokenizer()?)
        .context("cannot build the tokenizer")?;
    let opts = bitnet_engine::EngineOptions {
        threads,
        numerics: a.numerics,
        kv_type: a.kv_cache,
        ..Default::default()
    };
    Ok(bitnet_engine::Engine::new(model, tokenizer, opts)?)
}

/// The session context size: `--ctx-size`, else the training context capped at 4096.
pub fn ctx_size(a: &ModelArgs, engine: &bitnet_engine::Engine<'_>) -> usize {
    a.ctx_size
        .unwrap_or_else(|| engine.model.config.n_ctx_train.min(4096))
}

/// Peak resident memory of this process (Linux `VmHWM`), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// Sampling flags in llama.cpp's spelling and defaults.
#[derive(Debug, Clone, clap::Args)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: i32,
    /// Top-p (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the repetition penalties look back over.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// RNG seed (default: random, printed in the summary).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn params(&self) -> Result<bitnet_sampling::SamplerParams> {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| {
                    u64::try_from(d.as_nanos() % (1u128 << 64)).unwrap_or(0)
                })
        });
        let p = bitnet_sampling::SamplerParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repeat_last_n: self.repeat_last_n,
            seed,
        };
        p.validate()?;
        Ok(p)
    }
}
