//! Loading, sessions, the generation loop, stop rules and the context policy.
//!
//! One call turns a path into a ready engine; an engine holds its model (and the file the
//! weights live in), so it is `'static` and `Send`:
//!
//! ```
//! use bitnet_engine::{load, Event, GenParams, LoadOptions};
//! use bitnet_sampling::SamplerParams;
//!
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/golden/tiny/bitnet-tiny-i2_s.gguf");
//! let engine = load(path.as_ref(), &LoadOptions { threads: 2, ..Default::default() }, &mut |_| {})?;
//! let prompt = engine.tokenizer.encode("Once upon a time", true, false)?;
//! let mut session = engine.new_session(256)?;
//! let params = GenParams {
//!     max_tokens: 8,
//!     sampler: SamplerParams { temperature: 0.0, ..Default::default() },
//!     ..Default::default()
//! };
//! let mut text = String::new();
//! let stats = engine.generate(&mut session, &prompt, false, &params, &mut |e| {
//!     if let Event::Text(t) = e {
//!         text.push_str(t);
//!     }
//!     true // keep going
//! })?;
//! assert!((1..=8).contains(&stats.generated_tokens)); // fewer if it ends its text
//! # Ok::<(), bitnet_engine::EngineError>(())
//! ```
#![forbid(unsafe_code)]

pub mod budget;
mod constrain;
mod embed;
mod load;
mod pread;
pub mod quality;
pub mod skip;
mod stop;
mod stream;
pub mod sys;
pub mod tools;

use std::time::Duration;

// std's Instant panics on wasm32-unknown-unknown; web-time's is std's elsewhere.
use web_time::Instant;

use bitnet_kernels::Pool;
use bitnet_model::{
    Config, Exec, KvCache, KvType, Model, ModelError, Numerics, Outputs, OwnedModel, Scratch,
};
use bitnet_sampling::{Sampler, SamplerParams, SamplingError};
use bitnet_tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

pub use bitnet_gguf::FileIdentity;
pub use bitnet_model::{Pick, Picked};
pub use constrain::{Constraint, ConstraintState, Grammars};
pub use embed::{embed_tokens, quantize_embedding, EmbedOptions, QuantizedEmbedding};
pub use load::{
    build_head_screen, build_lm_head, load, load_file, load_file_async, open_file, repack_weights,
    Device, LmHeadFormat, LoadEvent, LoadOptions,
};
pub use stop::StopMatcher;
pub use stream::GpuStream;

/// Errors of a generation.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the model's weights are only on the GPU: this needs them on the host (load the file on the CPU)")]
    WeightsOnDevice,
    #[error("the context is full: {n_past} of {n_ctx} positions used (raise --ctx-size or start a new session)")]
    ContextFull { n_past: usize, n_ctx: usize },
    #[error("exact numerics needs an f16 KV cache")]
    ExactNeedsF16,
    #[error("exact numerics needs the file's F16 LM head, every logit computed (drop --lm-head)")]
    ExactNeedsF16Head,
    #[error("exact numerics needs prefill batches of 512 tokens (bitnet.cpp's ubatch), not {0}")]
    ExactNeedsBatch512(usize),
    #[error("cannot open model {}: {error}", path.display())]
    Open {
        path: std::path::PathBuf,
        error: bitnet_gguf::GgufError,
    },
    #[error("cannot open model {}: {error}", path.display())]
    OpenQsf {
        path: std::path::PathBuf,
        error: bitnet_qsf::QsfError,
    },
    #[error(
        "the low-memory mode streams a mapped file; an LZ4-compressed QSF is decompressed \
         whole. Write it without --compress lz4, or drop --ram-budget"
    )]
    QsfStreaming,
    #[error(transparent)]
    Gpu(#[from] bitnet_gpu::GpuError),
    #[error("{0}")]
    Device(String),
    #[error("{what} must be at least 1")]
    Zero { what: &'static str },
    #[error(transparent)]
    Kernel(#[from] bitnet_kernels::KernelError),
    #[error("a sliding context window (context shift) needs fast numerics: its rotation of the cached keys is not bitnet.cpp's")]
    ShiftNeedsFast,
    #[error("layer skip: {0}")]
    Skip(String),
    #[error("KL base file: {0}")]
    KlBase(String),
    #[error("invalid {what}: {reason}")]
    Grammar { what: &'static str, reason: String },
    /// A tool definition or `tool_choice` that cannot be used; `field` names it
    /// (`tools[0].function.name`).
    #[error("{reason}")]
    Tools { field: String, reason: String },
    #[error("screened LM head: {0}")]
    HeadScreen(String),
    #[error("RAM budget: {reason}")]
    Budget { reason: String },
    #[error("embedding quantization takes 8, 4, 2 or 1 bits per value, not {0}")]
    EmbedBits(u32),
    #[error("a RAM budget of {} MiB is too small: {detail}", budget >> 20)]
    BudgetTooSmall {
        budget: u64,
        needed: u64,
        detail: String,
    },
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// What to do when generation reaches the end of the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContextPolicy {
    /// Fail with [`EngineError::ContextFull`] (the default: never silently lose context).
    #[default]
    Error,
    /// Stop generating and report [`FinishReason::Length`].
    Stop,
    /// A sliding window: keep the first `keep` positions (attention sinks), drop half of the
    /// rest, and go on ([`Engine::shift`]). Fast numerics only.
    Shift { keep: usize },
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token (EOS, `<|eot_id|>`, `<|eom_id|>`).
    Eog,
    /// A stop string matched.
    StopString,
    /// `max_tokens` reached, or the context filled under [`ContextPolicy::Stop`].
    Length,
    /// The caller cancelled.
    Cancelled,
}

impl FinishReason {
    /// OpenAI's `finish_reason`.
    pub fn as_openai(self) -> &'static str {
        match self {
            FinishReason::Eog | FinishReason::StopString | FinishReason::Cancelled => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Generation parameters.
#[derive(Debug, Clone)]
pub struct GenParams {
    pub max_tokens: usize,
    pub sampler: SamplerParams,
    /// Text that ends generation; never emitted, matched across token boundaries.
    pub stop: Vec<String>,
    pub context_policy: ContextPolicy,
    /// Hold the output to a JSON schema, a regular expression or a grammar
    /// ([`Constraint`]); `None`: free text.
    pub constraint: Option<Constraint>,
}

impl Default for GenParams {
    fn default() -> Self {
        GenParams {
            max_tokens: 128,
            sampler: SamplerParams::default(),
            stop: Vec::new(),
            context_policy: ContextPolicy::Error,
            constraint: None,
        }
    }
}

/// Timings and counts of one generation.
#[derive(Debug, Clone, Copy)]
pub struct GenStats {
    /// Prompt tokens evaluated (after reusing the cached prefix).
    pub prompt_tokens: usize,
    /// Prompt tokens found in the cache and not evaluated again.
    pub cached_tokens: usize,
    pub prompt_time: Duration,
    pub generated_tokens: usize,
    pub generation_time: Duration,
    pub finish: FinishReason,
}

impl GenStats {
    pub fn prompt_tok_s(&self) -> f64 {
        rate(self.prompt_tokens, self.prompt_time)
    }
    pub fn generation_tok_s(&self) -> f64 {
        rate(self.generated_tokens, self.generation_time)
    }
}

fn rate(n: usize, t: Duration) -> f64 {
    let s = t.as_secs_f64();
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// Engine settings.
#[derive(Debug, Clone, Copy)]
pub struct EngineOptions {
    pub threads: usize,
    pub numerics: Numerics,
    pub kv_type: KvType,
    /// Tokens per prefill batch (bitnet.cpp's ubatch is 512; exact numerics depends on it).
    pub n_batch: usize,
    /// Upper bound for one session's KV cache.
    pub kv_budget_bytes: u64,
}

impl EngineOptions {
    /// Every combination the engine cannot run, refused once, here.
    pub fn validate(&self) -> Result<()> {
        if self.threads == 0 {
            return Err(EngineError::Zero { what: "threads" });
        }
        if self.n_batch == 0 {
            return Err(EngineError::Zero { what: "n_batch" });
        }
        if self.numerics == Numerics::Exact && self.kv_type != KvType::F16 {
            return Err(EngineError::ExactNeedsF16);
        }
        if self.numerics == Numerics::Exact && self.n_batch != 512 {
            return Err(EngineError::ExactNeedsBatch512(self.n_batch));
        }
        Ok(())
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: 1,
            numerics: Numerics::Fast,
            kv_type: KvType::F16,
            n_batch: 512,
            kv_budget_bytes: 8 << 30,
        }
    }
}

/// A model (owning its file), its tokenizer and a thread pool that lives for the whole run.
/// `'static` and `Send`: it can be moved to a server thread or into a foreign handle.
#[derive(Debug)]
pub struct Engine {
    model: Weights,
    pub tokenizer: Tokenizer,
    pool: std::sync::Arc<Pool>,
    /// The low-memory backend, when the engine runs under a RAM budget.
    streamer: Option<budget::LayerStreamer>,
    plan: Option<budget::MemoryPlan>,
    opts: EngineOptions,
    /// The forward pass's activation buffers, allocated once and reused by every call.
    scratch: std::sync::Mutex<Scratch>,
    /// The model on a GPU, when the engine runs there (see [`Device`]).
    gpu: Option<bitnet_gpu::GpuModel>,
    /// The grammar compiler over the vocabulary, built at the first constrained generation.
    grammars: std::sync::OnceLock<constrain::Grammars>,
}

/// The model's weights: a file and the model bound over it, or only on a GPU (uploaded
/// piece by piece, see [`load::Stream`]), with what the host needs of the model.
#[derive(Debug)]
enum Weights {
    Host(OwnedModel),
    /// `bad_rows`: the embedding rows that hold NaN or infinity (ascending), found as the
    /// table streamed by.
    Device {
        config: Config,
        file_size: u64,
        bad_rows: Vec<u32>,
    },
}

/// A session's KV cache: in memory, or on the GPU for an engine that runs there.
#[derive(Debug)]
enum Cache {
    Cpu(KvCache),
    Gpu(bitnet_gpu::GpuCache),
}

impl Cache {
    fn len(&self) -> usize {
        match self {
            Cache::Cpu(c) => c.len(),
            Cache::Gpu(c) => c.len(),
        }
    }
    fn n_ctx(&self) -> usize {
        match self {
            Cache::Cpu(c) => c.n_ctx(),
            Cache::Gpu(c) => c.n_ctx(),
        }
    }
    fn reset(&mut self) {
        match self {
            Cache::Cpu(c) => c.reset(),
            Cache::Gpu(c) => c.reset(),
        }
    }
    fn truncate(&mut self, n: usize) {
        match self {
            Cache::Cpu(c) => c.truncate(n),
            Cache::Gpu(c) => c.truncate(n),
        }
    }
    fn nbytes(&self) -> usize {
        match self {
            Cache::Cpu(c) => c.nbytes(),
            Cache::Gpu(c) => usize::try_from(c.nbytes()).unwrap_or(usize::MAX),
        }
    }
}

/// One conversation: its KV cache and the tokens it holds.
#[derive(Debug)]
pub struct Session {
    cache: Cache,
    tokens: Vec<u32>,
}

impl Session {
    /// Tokens in the cache.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    pub fn n_ctx(&self) -> usize {
        self.cache.n_ctx()
    }
    pub fn reset(&mut self) {
        self.cache.reset();
        self.tokens.clear();
    }
    /// Positions `keep..keep + discard` leave the session (cache and tokens); see
    /// [`KvCache::shift`].
    fn shift(
        &mut self,
        config: &bitnet_model::Config,
        gpu: Option<&bitnet_gpu::GpuModel>,
        keep: usize,
        discard: usize,
    ) -> Result<()> {
        match (&mut self.cache, gpu) {
            (Cache::Cpu(c), _) => c.shift(config, keep, discard)?,
            (Cache::Gpu(c), Some(g)) => g.shift(c, keep, discard)?,
            (Cache::Gpu(_), None) => {
                return Err(EngineError::Device("a GPU session on a CPU engine".into()))
            }
        }
        self.tokens.drain(keep..keep + discard);
        Ok(())
    }

    /// Keep only the first `n` tokens (and their cache entries).
    pub fn truncate(&mut self, n: usize) {
        self.cache.truncate(n);
        self.tokens.truncate(n);
    }
    pub fn kv_bytes(&self) -> usize {
        self.cache.nbytes()
    }
}

/// Whether every session of `work` has room for its new tokens.
fn check_room(work: &[(&mut Session, &[u32], Outputs)]) -> Result<()> {
    for (s, t, _) in work {
        if s.cache.len() + t.len() > s.cache.n_ctx() {
            return Err(EngineError::ContextFull {
                n_past: s.cache.len() + t.len(),
                n_ctx: s.cache.n_ctx(),
            });
        }
    }
    Ok(())
}

/// `work`'s sessions as the model's sequences (CPU caches only).
fn cpu_seqs<'a>(
    work: &'a mut [(&mut Session, &[u32], Outputs)],
) -> Result<Vec<bitnet_model::Seq<'a>>> {
    let mut seqs = Vec::with_capacity(work.len());
    for (s, t, o) in work.iter_mut() {
        let Cache::Cpu(cache) = &mut s.cache else {
            return Err(EngineError::Device("a GPU session on a CPU engine".into()));
        };
        seqs.push(bitnet_model::Seq {
            tokens: t,
            cache,
            outputs: *o,
        });
    }
    Ok(seqs)
}

/// The device's refusal of a NaN or infinite logit (its arg-max and top-k) as the CPU's.
fn non_finite_logit(e: bitnet_gpu::GpuError) -> EngineError {
    match e {
        bitnet_gpu::GpuError::NonFiniteLogit { index } => {
            EngineError::Model(ModelError::NonFiniteOutput {
                what: "a logit",
                row: 0,
                index: usize::try_from(index).unwrap_or(usize::MAX),
            })
        }
        e => e.into(),
    }
}

/// What a generation step reads back from the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadBack {
    Logits,
    Greedy,
    /// The most likely tokens: the device's [`bitnet_gpu::TOP_CANDIDATES`], or on the CPU
    /// the sampler's top-k (this many, at most that).
    Top(usize),
}

/// A piece of generated output.
#[derive(Debug)]
pub enum Event<'t> {
    /// A token was sampled (every one, end-of-generation and control tokens included),
    /// before any text it adds.
    Token(u32),
    /// Newly generated text (complete UTF-8, stop strings held back).
    Text(&'t str),
}

impl Engine {
    /// An engine over a loaded model (see [`load`] for the whole loading sequence from a
    /// path). The options are validated here.
    pub fn new(model: OwnedModel, tokenizer: Tokenizer, opts: EngineOptions) -> Result<Self> {
        Self::with_weights(Weights::Host(model), tokenizer, opts)
    }

    /// An engine whose weights are only on `gpu` (see [`GpuStream`]).
    pub(crate) fn on_device(
        config: Config,
        file_size: u64,
        bad_rows: Vec<u32>,
        tokenizer: Tokenizer,
        gpu: bitnet_gpu::GpuModel,
        opts: EngineOptions,
    ) -> Result<Self> {
        let weights = Weights::Device {
            config,
            file_size,
            bad_rows,
        };
        Self::with_weights(weights, tokenizer, opts)?.on_gpu(gpu)
    }

    fn with_weights(model: Weights, tokenizer: Tokenizer, opts: EngineOptions) -> Result<Self> {
        opts.validate()?;
        let pool = std::sync::Arc::new(Pool::new(opts.threads.max(1)));
        Ok(Engine {
            model,
            tokenizer,
            pool,
            streamer: None,
            plan: None,
            opts,
            scratch: std::sync::Mutex::new(Scratch::default()),
            gpu: None,
            grammars: std::sync::OnceLock::new(),
        })
    }

    /// Run on `gpu` (the model uploaded from this engine's own).
    pub(crate) fn on_gpu(mut self, gpu: bitnet_gpu::GpuModel) -> Result<Self> {
        self.gpu = Some(gpu);
        Ok(self)
    }

    /// The GPU the engine runs on, if it does.
    pub fn gpu(&self) -> Option<&bitnet_gpu::GpuModel> {
        self.gpu.as_ref()
    }

    /// Where the forward pass runs, for reports: `cpu`, or `gpu (adapter, backend)`.
    pub fn device_name(&self) -> String {
        match &self.gpu {
            Some(g) => format!("gpu ({}, {})", g.gpu().info().name, g.gpu().info().backend),
            None => "cpu".to_string(),
        }
    }

    /// Switch to the low-memory backend with `plan` (see [`budget`]), streaming as `mode`
    /// says (the mmap window for a file held in memory or in a container without a file
    /// handle: `pread` has nothing to read from there). `huge_pages`: the mapped file comes in
    /// huge pages ([`budget::prefer_huge_pages`]), so the window reads ahead by faulting
    /// rather than by `MADV_WILLNEED`, whose read-ahead would bring pages in at 4 KiB.
    pub(crate) fn stream(
        mut self,
        plan: budget::MemoryPlan,
        mode: budget::StreamMode,
        huge_pages: bool,
    ) -> Result<Self> {
        let owned = self.host()?;
        let layers = budget::layer_ranges(owned.model(), owned.file())?;
        let io = match mode {
            budget::StreamMode::Pread if owned.file().is_mapped() => Some(
                pread::PreadIo::new(owned.file_arc()).map_err(|e| EngineError::Budget {
                    reason: format!("cannot start the low-memory reader's I/O thread: {e}"),
                })?,
            ),
            _ => None,
        };
        self.streamer = Some(budget::LayerStreamer {
            io,
            pool: std::sync::Arc::clone(&self.pool),
            file: owned.file_arc(),
            layers,
            read_ahead: plan.window_layers >= 2,
            huge_pages,
            pinned_layers: plan.pinned_layers,
            pinned: {
                let head = owned.model().lm_head();
                let len = usize::try_from(plan.pinned_head_bytes).unwrap_or(0);
                owned
                    .file()
                    .range_of(head.data())
                    .map_or(0..0, |r| r.start..r.start + len.min(r.len()))
            },
        });
        self.plan = Some(plan);
        Ok(self)
    }

    /// Skip blocks (see [`skip`]); returns the blocks skipped. Fast numerics only.
    pub fn set_skip_layers(&mut self, which: &skip::SkipLayers) -> Result<Vec<usize>> {
        if self.opts.numerics == Numerics::Exact {
            return Err(EngineError::Skip(
                "skipping blocks changes the function; exact numerics cannot".into(),
            ));
        }
        let n = self.config().n_layer;
        let list = match which {
            skip::SkipLayers::List(l) => {
                if let Some(&bad) = l.iter().find(|&&i| i >= n) {
                    return Err(EngineError::Skip(format!(
                        "block {bad} does not exist (the model has {n})"
                    )));
                }
                let mut l = l.clone();
                l.sort_unstable();
                l.dedup();
                if l.len() >= n {
                    return Err(EngineError::Skip("cannot skip every block".into()));
                }
                l
            }
            skip::SkipLayers::Auto { fraction } => {
                if !(*fraction > 0.0 && *fraction < 1.0) {
                    return Err(EngineError::Skip(format!(
                        "the fraction {fraction} is not in (0, 1)"
                    )));
                }
                if let Weights::Host(m) = &mut self.model {
                    m.with_model_mut(|_, m| m.skip.clear());
                }
                let imp = skip::importance(self)?;
                skip::choose(&imp, *fraction)
            }
        };
        let mut mask = vec![false; n];
        for &i in &list {
            mask[i] = true;
        }
        if let Some(g) = &mut self.gpu {
            g.set_skip(mask.clone());
        }
        if let Weights::Host(m) = &mut self.model {
            m.with_model_mut(|_, m| m.skip = mask);
        }
        Ok(list)
    }

    /// The memory plan, when the engine runs under a RAM budget.
    pub fn plan(&self) -> Option<&budget::MemoryPlan> {
        self.plan.as_ref()
    }

    /// Where the forward pass's heavy operations run.
    pub fn backend(&self) -> &dyn bitnet_model::Backend {
        match &self.streamer {
            Some(s) => s,
            None => &*self.pool,
        }
    }

    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }

    /// The model's config.
    pub fn config(&self) -> &Config {
        match &self.model {
            Weights::Host(m) => &m.model().config,
            Weights::Device { config, .. } => config,
        }
    }

    /// The model (an engine whose weights are only on its GPU has none on the host).
    pub fn model(&self) -> Result<&Model<'_>> {
        Ok(self.host()?.model())
    }

    fn host(&self) -> Result<&OwnedModel> {
        match &self.model {
            Weights::Host(m) => Ok(m),
            Weights::Device { .. } => Err(EngineError::WeightsOnDevice),
        }
    }

    /// Before the GPU looks up `tokens`: their embedding rows, read from the host's file
    /// ([`Model::check_embedding_rows`]), or for weights only on the device, the rows found
    /// non-finite as the table streamed by.
    fn check_embedding_rows(&self, tokens: &[u32]) -> Result<()> {
        match &self.model {
            Weights::Host(_) => Ok(self.model()?.check_embedding_rows(tokens)?),
            Weights::Device { bad_rows, .. } => {
                match tokens.iter().find(|t| bad_rows.binary_search(t).is_ok()) {
                    Some(&token) => Err(ModelError::NonFiniteEmbedding { token }.into()),
                    None => Ok(()),
                }
            }
        }
    }

    /// The size of the model's file in bytes.
    pub fn file_size(&self) -> u64 {
        match &self.model {
            Weights::Host(m) => m.file().file_size(),
            Weights::Device { file_size, .. } => *file_size,
        }
    }

    /// The forward pass's context on this engine's backend and numerics, with `scratch`'s
    /// buffers and no trace.
    fn exec<'e>(&'e self, scratch: &'e mut Scratch) -> Exec<'e> {
        Exec {
            backend: self.backend(),
            numerics: self.opts.numerics,
            trace: None,
            scratch: Some(scratch),
        }
    }

    /// The forward pass's reusable buffers (one forward pass at a time uses them).
    pub fn scratch(&self) -> std::sync::MutexGuard<'_, Scratch> {
        // A poisoned lock only means a forward pass panicked; the buffers are plain data.
        self.scratch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The file the model reads (none for an engine whose weights are only on its GPU).
    pub fn file(&self) -> Result<&bitnet_gguf::GgufFile> {
        Ok(self.host()?.file())
    }

    /// What the memory-mapped model file was when it was loaded (`None` when the engine does
    /// not read a mapped file: loaded `in_memory`, or weights only on its GPU). Its
    /// [`FileIdentity::changed`] says whether the file changed since.
    pub fn mapped_file(&self) -> Option<FileIdentity> {
        let f = self.file().ok()?;
        if f.is_mapped() {
            f.identity().cloned()
        } else {
            None
        }
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// A new session with room for `n_ctx` positions (at most the training context).
    pub fn new_session(&self, n_ctx: usize) -> Result<Session> {
        let n_ctx = n_ctx.min(self.config().n_ctx_train).max(1);
        let cache = match &self.gpu {
            Some(g) => Cache::Gpu(g.new_cache(
                n_ctx,
                match self.opts.kv_type {
                    KvType::F32 => bitnet_gpu::GpuKv::F32,
                    KvType::Q8_0 => bitnet_gpu::GpuKv::Q8_0,
                    // Load refuses q4_0 on the GPU.
                    KvType::F16 | KvType::Q4_0 => bitnet_gpu::GpuKv::F16,
                },
            )?),
            None => Cache::Cpu(self.model()?.new_cache(
                n_ctx,
                self.opts.kv_type,
                self.opts.kv_budget_bytes,
            )?),
        };
        Ok(Session {
            cache,
            tokens: Vec::new(),
        })
    }

    /// Evaluate `tokens` after the session's cached ones, in batches; logits of the last.
    pub fn eval(&self, s: &mut Session, tokens: &[u32], outputs: Outputs) -> Result<Vec<f32>> {
        bitnet_gpu::block(self.eval_async(s, tokens, outputs))?
    }

    /// [`Engine::eval`], for callers that must not block (a browser's WebGPU): the one
    /// implementation.
    // The scratch guard keeps one caller at a time on the device across its read-back (see
    // `bitnet_gpu::GpuModel`'s `run`).
    #[allow(clippy::await_holding_lock)]
    pub async fn eval_async(
        &self,
        s: &mut Session,
        tokens: &[u32],
        outputs: Outputs,
    ) -> Result<Vec<f32>> {
        if s.cache.len() + tokens.len() > s.cache.n_ctx() {
            return Err(EngineError::ContextFull {
                n_past: s.cache.len() + tokens.len(),
                n_ctx: s.cache.n_ctx(),
            });
        }
        let mut scratch = self.scratch();
        let cache = match (&mut s.cache, &self.gpu) {
            (Cache::Cpu(c), _) => c,
            (Cache::Gpu(_), Some(_)) if tokens.is_empty() => return Ok(Vec::new()),
            (Cache::Gpu(c), Some(g)) => {
                self.check_embedding_rows(tokens)?;
                // The GPU model splits the tokens into batches itself; one caller at a time.
                // A failed call keeps only the positions the session's tokens account for.
                let logits = g
                    .forward_async(tokens, c, outputs)
                    .await
                    .inspect_err(|_| c.truncate(s.tokens.len()))?;
                bitnet_model::model::check_finite(&logits, self.config().n_vocab, "a logit")
                    .inspect_err(|_| c.truncate(s.tokens.len()))?;
                s.tokens.extend_from_slice(tokens);
                return Ok(logits);
            }
            (Cache::Gpu(_), None) => {
                return Err(EngineError::Device("a GPU session on a CPU engine".into()))
            }
        };
        let mut exec = self.exec(&mut scratch);
        let chunks: Vec<&[u32]> = tokens.chunks(self.opts.n_batch.max(1)).collect();
        let mut logits = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            // Every chunk contributes rows to `All`; otherwise only the last one has logits.
            let out = if outputs == Outputs::All || i + 1 == chunks.len() {
                outputs
            } else {
                Outputs::None
            };
            let l = self.model()?.forward(chunk, cache, out, &mut exec)?;
            if outputs == Outputs::All {
                logits.extend(l);
            } else {
                logits = l;
            }
            s.tokens.extend_from_slice(chunk);
        }
        Ok(logits)
    }

    /// Evaluate `tokens` after the session's cached ones and return the arg-max of the last
    /// position's logits (the lowest id among equal maxima): on the GPU only that id comes
    /// back, as greedy generation reads it.
    pub fn eval_greedy(&self, s: &mut Session, tokens: &[u32]) -> Result<u32> {
        match bitnet_gpu::block(self.eval_next(s, tokens, ReadBack::Greedy))?? {
            Picked::Chosen(id) => Ok(id),
            Picked::Logits(l) => bitnet_sampling::argmax(&l)
                .ok_or_else(|| EngineError::Device("no logits to take the arg-max of".into())),
            Picked::Top(t) => t
                .first()
                .map(|&(id, _)| id)
                .ok_or_else(|| EngineError::Device("no candidates came back".into())),
        }
    }

    /// One decode step for several sessions at once: `tokens[i]` is appended to
    /// `sessions[i]`; every ternary matmul is shared (continuous batching). Returns the
    /// last-position logits of each session.
    pub fn decode_batch(
        &self,
        sessions: &mut [&mut Session],
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>> {
        let mut work: Vec<(&mut Session, &[u32], Outputs)> = sessions
            .iter_mut()
            .zip(tokens.chunks(1))
            .map(|(s, t)| (&mut **s, t, Outputs::Last))
            .collect();
        self.forward_sessions(&mut work)
    }

    /// What a generation step reads back: on the GPU, a step the arg-max decides takes the
    /// device's argmax (the lowest id among equal maxima, as the sampler does, 512 bytes), a
    /// chain that only looks at the top-k takes the top candidates (512 bytes); on the CPU
    /// with a screened LM head ([`Engine::screened`]) the same choices come from the screen;
    /// anything else takes the last row of logits.
    fn read_back_for(&self, sampler: &Sampler, constrained: bool) -> ReadBack {
        if (self.gpu.is_none() && !self.screened()) || constrained {
            ReadBack::Logits
        } else if sampler.argmax_suffices() {
            ReadBack::Greedy
        } else if sampler.candidates_suffice(bitnet_gpu::TOP_CANDIDATES) {
            let k = usize::try_from(sampler.params().top_k).unwrap_or(0);
            ReadBack::Top(k.clamp(1, bitnet_gpu::TOP_CANDIDATES))
        } else {
            ReadBack::Logits
        }
    }

    /// Whether generation steps on the CPU choose their token through the model's screened
    /// LM head (built at load by [`LoadOptions::screen_head`], fast numerics).
    pub fn screened(&self) -> bool {
        self.gpu.is_none()
            && self.streamer.is_none()
            && self.opts.numerics == Numerics::Fast
            && self
                .model()
                .is_ok_and(|m| m.head_screen.is_some() && m.approx_head.is_none())
    }

    /// How the screened LM head has served the steps so far (`None` without one).
    pub fn screen_counts(&self) -> Option<bitnet_model::ScreenCounts> {
        self.model()
            .ok()
            .and_then(|m| m.head_screen.as_ref().map(bitnet_model::HeadScreen::counts))
    }

    /// [`Engine::eval_next`] on the CPU with a screened head: the prompt's batches, then the
    /// last one's choice through [`Model::forward_pick`].
    fn eval_pick(&self, s: &mut Session, tokens: &[u32], rb: ReadBack) -> Result<Picked> {
        let Cache::Cpu(cache) = &mut s.cache else {
            return Err(EngineError::Device("a GPU session on a CPU engine".into()));
        };
        if cache.len() + tokens.len() > cache.n_ctx() {
            return Err(EngineError::ContextFull {
                n_past: cache.len() + tokens.len(),
                n_ctx: cache.n_ctx(),
            });
        }
        // The sampler keeps its top-k of these (`Sampler::sample_candidates` with the
        // device's count as the searched one: the `k` most likely are all it reads).
        let pick = match rb {
            ReadBack::Top(k) => bitnet_model::Pick::Top(k),
            _ => bitnet_model::Pick::Greedy,
        };
        let mut scratch = self.scratch();
        let mut exec = self.exec(&mut scratch);
        let model = self.model()?;
        let chunks: Vec<&[u32]> = tokens.chunks(self.opts.n_batch.max(1)).collect();
        let Some((last, head)) = chunks.split_last() else {
            return Err(EngineError::EmptyPrompt);
        };
        for chunk in head {
            model.forward(chunk, cache, Outputs::None, &mut exec)?;
            s.tokens.extend_from_slice(chunk);
        }
        let next = model.forward_pick(last, cache, pick, &mut exec)?;
        s.tokens.extend_from_slice(last);
        Ok(next)
    }

    /// Evaluate `tokens` and return what picks the next token (see [`Engine::read_back`]).
    // The scratch guard keeps one caller at a time on the device across its read-back (see
    // `bitnet_gpu::GpuModel`'s `run`).
    #[allow(clippy::await_holding_lock)]
    async fn eval_next(&self, s: &mut Session, tokens: &[u32], rb: ReadBack) -> Result<Picked> {
        if self.gpu.is_none() && rb != ReadBack::Logits && self.screened() {
            return self.eval_pick(s, tokens, rb);
        }
        let (Some(g), Cache::Gpu(c), false) = (&self.gpu, &mut s.cache, rb == ReadBack::Logits)
        else {
            return Ok(Picked::Logits(
                self.eval_async(s, tokens, Outputs::Last).await?,
            ));
        };
        if c.len() + tokens.len() > c.n_ctx() {
            return Err(EngineError::ContextFull {
                n_past: c.len() + tokens.len(),
                n_ctx: c.n_ctx(),
            });
        }
        self.check_embedding_rows(tokens)?;
        // One caller at a time on the device, as in `eval`.
        let _guard = self.scratch();
        let next = match rb {
            ReadBack::Greedy => g.forward_greedy_async(tokens, c).await.map(Picked::Chosen),
            _ => g.forward_top_async(tokens, c).await.map(Picked::Top),
        };
        // The device's arg-max and top-k refuse a NaN or infinite logit as the CPU does.
        let next = next
            .map_err(non_finite_logit)
            .inspect_err(|_| c.truncate(s.tokens.len()))?;
        s.tokens.extend_from_slice(tokens);
        Ok(next)
    }

    /// One forward pass over several sessions, each with its own new tokens and outputs (a
    /// server's step: some sessions prefill, others decode). On the CPU every ternary matmul
    /// is shared ([`Model::forward_seqs`]); on the GPU the sessions that decode one token
    /// step together in one pass ([`bitnet_gpu::GpuModel::forward_batch`]) and the others
    /// run one after the other. Returns each session's logits as [`Engine::eval`] would;
    /// tokens join their sessions.
    pub fn forward_sessions(
        &self,
        work: &mut [(&mut Session, &[u32], Outputs)],
    ) -> Result<Vec<Vec<f32>>> {
        check_room(work)?;
        if let Some(g) = &self.gpu {
            let none = vec![false; work.len()];
            return self
                .forward_sessions_gpu(g, work, &none)?
                .into_iter()
                .map(|p| match p {
                    Picked::Logits(l) => Ok(l),
                    _ => Err(EngineError::Device("a pick where logits were asked".into())),
                })
                .collect();
        }
        let mut scratch = self.scratch();
        let mut exec = self.exec(&mut scratch);
        let mut seqs = cpu_seqs(work)?;
        let logits = self.model()?.forward_seqs(&mut seqs, &mut exec)?;
        drop(seqs);
        for (s, t, _) in work.iter_mut() {
            s.tokens.extend_from_slice(t);
        }
        Ok(logits)
    }

    /// What a step of a session sampled by `sampler` needs from [`Engine::forward_sessions_pick`]:
    /// on a screened engine ([`Engine::screened`]), the arg-max or the sampler's top-k when
    /// that is all the sampler reads (as [`Engine::generate`]'s steps choose); otherwise
    /// `None`, the full logits. A caller that masks or reports the logits (constrained
    /// output, log-probabilities) passes `None` itself.
    pub fn pick_for(&self, sampler: &Sampler) -> Option<Pick> {
        // On the GPU a batched step reads back each arg-max (not the top-k).
        if self.gpu.is_some() {
            return (self.read_back_for(sampler, false) == ReadBack::Greedy)
                .then_some(Pick::Greedy);
        }
        if !self.screened() {
            return None;
        }
        match self.read_back_for(sampler, false) {
            ReadBack::Greedy => Some(Pick::Greedy),
            ReadBack::Top(k) => Some(Pick::Top(k)),
            ReadBack::Logits => None,
        }
    }

    /// [`Engine::forward_sessions`] for a step that needs only each session's next token:
    /// `picks[i]` (from [`Engine::pick_for`]) says what chooses session `i`'s, and on a
    /// screened engine those are answered through the screen ([`Model::forward_seqs_pick`]),
    /// in one pass over it for all of them; the rest get their logits as `forward_sessions`
    /// gives them. [`Engine::choose`] turns an answer into the token.
    pub fn forward_sessions_pick(
        &self,
        work: &mut [(&mut Session, &[u32], Outputs)],
        picks: &[Option<Pick>],
    ) -> Result<Vec<Picked>> {
        if let Some(g) = &self.gpu {
            check_room(work)?;
            let greedy: Vec<bool> = picks
                .iter()
                .map(|p| matches!(p, Some(Pick::Greedy)))
                .collect();
            return self.forward_sessions_gpu(g, work, &greedy);
        }
        if !self.screened() || picks.iter().all(Option::is_none) {
            let logits = self.forward_sessions(work)?;
            return Ok(logits.into_iter().map(Picked::Logits).collect());
        }
        check_room(work)?;
        let mut scratch = self.scratch();
        let mut exec = self.exec(&mut scratch);
        let mut seqs = cpu_seqs(work)?;
        let picked = self
            .model()?
            .forward_seqs_pick(&mut seqs, picks, &mut exec)?;
        drop(seqs);
        for (s, t, _) in work.iter_mut() {
            s.tokens.extend_from_slice(t);
        }
        Ok(picked)
    }

    /// [`Engine::forward_sessions_pick`] on the GPU: the sessions that take one token and want
    /// its logits step together in one pass, reading back only each arg-max where every one
    /// of them is picked greedily (`greedy[i]`); the others (prompts) run one after the other.
    fn forward_sessions_gpu(
        &self,
        g: &bitnet_gpu::GpuModel,
        work: &mut [(&mut Session, &[u32], Outputs)],
        greedy: &[bool],
    ) -> Result<Vec<Picked>> {
        let steps = |w: &(&mut Session, &[u32], Outputs)| {
            w.1.len() == 1 && w.2 == Outputs::Last && matches!(w.0.cache, Cache::Gpu(_))
        };
        let mut out: Vec<Option<Picked>> = Vec::with_capacity(work.len());
        for w in work.iter_mut() {
            out.push(if steps(w) {
                None
            } else {
                Some(Picked::Logits(self.eval(w.0, w.1, w.2)?))
            });
        }
        let tokens: Vec<u32> = work.iter().filter(|w| steps(w)).map(|w| w.1[0]).collect();
        if tokens.is_empty() {
            return Ok(out.into_iter().flatten().collect());
        }
        self.check_embedding_rows(&tokens)?;
        // A session without a pick (`greedy` shorter than `work`) wants its logits.
        let all_greedy = work
            .iter()
            .enumerate()
            .filter(|(_, w)| steps(w))
            .all(|(i, _)| greedy.get(i).copied().unwrap_or(false));
        let answer = {
            let mut caches: Vec<&mut bitnet_gpu::GpuCache> = work
                .iter_mut()
                .filter_map(|w| match (&mut w.0.cache, w.1.len(), w.2) {
                    (Cache::Gpu(c), 1, Outputs::Last) => Some(c),
                    _ => None,
                })
                .collect();
            // One caller at a time on the device, as in `eval`.
            let _guard = self.scratch();
            if all_greedy {
                g.forward_batch_greedy(&tokens, &mut caches)
                    .map(|p| p.into_iter().map(Picked::Chosen).collect::<Vec<_>>())
                    .map_err(non_finite_logit)
            } else {
                let nv = self.config().n_vocab;
                g.forward_batch(&tokens, &mut caches)
                    .map_err(EngineError::from)
                    .and_then(|l| {
                        bitnet_model::model::check_finite(&l, nv, "a logit")?;
                        Ok(l.chunks(nv.max(1))
                            .map(|r| Picked::Logits(r.to_vec()))
                            .collect())
                    })
            }
        };
        let mut answer = match answer {
            Ok(a) => a.into_iter(),
            Err(e) => {
                // A failed step keeps only the positions each session's tokens account for.
                for w in work.iter_mut().filter(|w| steps(w)) {
                    let n = w.0.tokens.len();
                    w.0.cache.truncate(n);
                }
                return Err(e);
            }
        };
        for (w, o) in work.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                w.0.tokens.push(w.1[0]);
                *o = answer.next();
            }
        }
        out.into_iter()
            .map(|o| o.ok_or_else(|| EngineError::Device("a batched step lost a row".into())))
            .collect()
    }

    /// The token `sampler` draws from a step's answer: from the full logits, the arg-max, or
    /// the top-k candidates (the same token and random numbers as from the full logits, see
    /// `Sampler::sample_candidates`).
    pub fn choose(&self, sampler: &mut Sampler, picked: &Picked) -> Result<u32> {
        Ok(match picked {
            Picked::Logits(l) => sampler.sample(l)?,
            Picked::Chosen(t) => *t,
            Picked::Top(c) => {
                sampler.sample_candidates(c, bitnet_gpu::TOP_CANDIDATES, self.config().n_vocab)?
            }
        })
    }

    /// Make room in a full session: keep its first `keep` positions, drop half of the rest
    /// (llama.cpp's context shift), turning the kept keys back to their new positions.
    pub fn shift(&self, s: &mut Session, keep: usize) -> Result<()> {
        if self.opts.numerics == Numerics::Exact {
            return Err(EngineError::ShiftNeedsFast);
        }
        let n = s.tokens.len();
        let discard = n.saturating_sub(keep) / 2;
        if discard == 0 {
            return Err(EngineError::ContextFull {
                n_past: n + 1,
                n_ctx: s.cache.n_ctx(),
            });
        }
        s.shift(self.config(), self.gpu.as_ref(), keep, discard)
    }

    /// Generate after `prompt` (the full token sequence of the conversation so far, or just
    /// the new part when `append` is true). The cached prefix shared with `prompt` is reused.
    /// `on_event` returns `false` to cancel.
    pub fn generate(
        &self,
        s: &mut Session,
        prompt: &[u32],
        append: bool,
        params: &GenParams,
        on_event: &mut dyn FnMut(Event<'_>) -> bool,
    ) -> Result<GenStats> {
        self.generate_compiled(s, prompt, append, params, None, on_event)
    }

    /// [`Engine::generate`] under a constraint the caller compiled already (with
    /// [`Grammars::start`] over this engine's vocabulary, to report a bad schema before the
    /// generation runs); `compiled`, when given, replaces `params.constraint`.
    pub fn generate_compiled(
        &self,
        s: &mut Session,
        prompt: &[u32],
        append: bool,
        params: &GenParams,
        compiled: Option<ConstraintState>,
        on_event: &mut dyn FnMut(Event<'_>) -> bool,
    ) -> Result<GenStats> {
        let mut g = bitnet_gpu::block(self.start_inner(s, prompt, append, params, compiled))??;
        while let Some(tok) = g.sample(self)? {
            if !on_event(Event::Token(tok)) {
                g.cancel();
                break;
            }
            let emit = g.advance(self, s, tok)?;
            if !emit.is_empty() && !on_event(Event::Text(&emit)) {
                g.cancel();
                break;
            }
        }
        let (tail, stats) = g.finish();
        if !tail.is_empty() {
            on_event(Event::Text(&tail));
        }
        Ok(stats)
    }

    /// Compile `c` for one generation over this engine's vocabulary (the compiler is built
    /// at the first call). Invalid schemas and grammars are [`EngineError::Grammar`].
    pub fn constraint(&self, c: &Constraint) -> Result<ConstraintState> {
        let grammars = match self.grammars.get() {
            Some(g) => g,
            None => {
                let g = constrain::Grammars::new(&self.tokenizer)?;
                self.grammars.get_or_init(|| g)
            }
        };
        grammars.start(c)
    }

    /// Begin a generation one token at a time (what [`Engine::generate`] runs; for callers
    /// that must return to an event loop between tokens, such as a web page): reuse the
    /// cached prefix shared with `prompt` (the whole conversation, or the new part when
    /// `append`), evaluate the rest, and hold what chooses the first token.
    pub fn start(
        &self,
        s: &mut Session,
        prompt: &[u32],
        append: bool,
        params: &GenParams,
    ) -> Result<Generation> {
        bitnet_gpu::block(self.start_async(s, prompt, append, params))?
    }

    /// [`Engine::start`], for callers that must not block.
    pub async fn start_async(
        &self,
        s: &mut Session,
        prompt: &[u32],
        append: bool,
        params: &GenParams,
    ) -> Result<Generation> {
        self.start_inner(s, prompt, append, params, None).await
    }

    async fn start_inner(
        &self,
        s: &mut Session,
        prompt: &[u32],
        append: bool,
        params: &GenParams,
        compiled: Option<ConstraintState>,
    ) -> Result<Generation> {
        // 1. Reuse the cached prefix (full-history callers), keep one token to evaluate.
        let full: Vec<u32> = if append {
            [s.tokens.as_slice(), prompt].concat()
        } else {
            prompt.to_vec()
        };
        if full.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let common = s
            .tokens
            .iter()
            .zip(&full)
            .take_while(|(a, b)| a == b)
            .count()
            .min(full.len() - 1);
        s.cache.truncate(common);
        s.tokens.truncate(common);
        let new = &full[common..];

        // 2. Prefill. The sampler comes first: on the GPU, what it needs decides what a step
        // reads back (all logits under a constraint).
        let mut sampler = Sampler::new(params.sampler.clone())?;
        for &t in &full {
            sampler.accept(t);
        }
        let constraint = match compiled {
            Some(c) => Some(c),
            None => params
                .constraint
                .as_ref()
                .map(|c| self.constraint(c))
                .transpose()?,
        };
        let read_back = self.read_back_for(&sampler, constraint.is_some());
        let t0 = Instant::now();
        let next = self.eval_next(s, new, read_back).await?;
        let prompt_time = t0.elapsed();
        Ok(Generation {
            sampler,
            decoder: StreamDecoder::new(),
            stops: StopMatcher::new(&params.stop),
            next,
            max_tokens: params.max_tokens,
            context_policy: params.context_policy,
            generated: 0,
            prompt_tokens: new.len(),
            cached_tokens: common,
            prompt_time,
            t1: Instant::now(),
            finish: None,
            constrained: constraint.is_some(),
            constraint,
        })
    }
}

/// One token of a [`Generation`]: its id and the text it completes (complete UTF-8, stop
/// strings held back; empty for end-of-generation and control tokens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub token: u32,
    pub text: String,
}

/// A generation in progress ([`Engine::start`]): [`Generation::sample`] chooses a token,
/// [`Generation::advance`] takes it into the text and the cache and evaluates it, and
/// [`Generation::finish`] gives the text held back and the statistics. Used with the engine
/// and session it was started on.
#[derive(Debug)]
pub struct Generation {
    sampler: Sampler,
    decoder: StreamDecoder,
    stops: StopMatcher,
    next: Picked,
    max_tokens: usize,
    context_policy: ContextPolicy,
    generated: usize,
    prompt_tokens: usize,
    cached_tokens: usize,
    prompt_time: Duration,
    t1: Instant,
    finish: Option<FinishReason>,
    constraint: Option<ConstraintState>,
    /// Whether the generation runs under a constraint (`constraint` is away on its mask
    /// thread during [`Generation::advance`]).
    constrained: bool,
}

impl Generation {
    /// Choose the next token; `None` once the generation has ended (end of generation, a
    /// stop string, the length limit, a full context under [`ContextPolicy::Stop`]).
    pub fn sample(&mut self, engine: &Engine) -> Result<Option<u32>> {
        if self.finish.is_some() {
            return Ok(None);
        }
        if self.generated >= self.max_tokens {
            self.finish = Some(FinishReason::Length);
            return Ok(None);
        }
        if let Some(c) = &mut self.constraint {
            let Picked::Logits(l) = &mut self.next else {
                return Err(EngineError::Grammar {
                    what: "constrained output",
                    reason: "the step read back no logits".into(),
                });
            };
            c.apply(l)?;
        }
        let tok = match &self.next {
            Picked::Logits(l) => self.sampler.sample(l)?,
            Picked::Chosen(t) => *t,
            Picked::Top(c) => self.sampler.sample_candidates(
                c,
                bitnet_gpu::TOP_CANDIDATES,
                engine.config().n_vocab,
            )?,
        };
        if let Some(c) = &mut self.constraint {
            c.commit(tok)?;
        }
        self.sampler.accept(tok);
        self.generated += 1;
        Ok(Some(tok))
    }

    /// Take `tok` (just returned by [`Generation::sample`]) into the text and the cache;
    /// returns the text it completes. Evaluates it unless the generation ends with it.
    pub fn advance(&mut self, engine: &Engine, s: &mut Session, tok: u32) -> Result<String> {
        // Under a constraint, the next token mask is computed on a thread of its own while
        // the forward pass runs (on the CPU or the GPU), not after it. (A web page has one
        // thread: there the mask follows the pass.)
        #[cfg(not(target_arch = "wasm32"))]
        {
            if let Some(mut c) = self.constraint.take() {
                return std::thread::scope(|scope| {
                    let thread_err = |why: &str| EngineError::Grammar {
                        what: "constrained output",
                        reason: format!("the token mask's thread {why}"),
                    };
                    let mask = std::thread::Builder::new()
                        .name("bitnet-mask".into())
                        .stack_size(constrain::MASK_STACK)
                        .spawn_scoped(scope, move || {
                            let r = c.prepare();
                            (c, r)
                        })
                        .map_err(|e| thread_err(&format!("cannot start: {e}")))?;
                    let r = bitnet_gpu::block(self.advance_async(engine, s, tok));
                    let (c, prepared) = mask.join().map_err(|_| thread_err("panicked"))?;
                    self.constraint = Some(c);
                    let text = r??;
                    prepared?;
                    Ok(text)
                });
            }
        }
        bitnet_gpu::block(self.advance_async(engine, s, tok))?
    }

    /// [`Generation::advance`], for callers that must not block.
    pub async fn advance_async(
        &mut self,
        engine: &Engine,
        s: &mut Session,
        tok: u32,
    ) -> Result<String> {
        if engine.tokenizer.is_eog(tok) {
            // The EOG token enters the history (a chat turn ends with it) but not the text.
            if s.cache.len() < s.cache.n_ctx() {
                engine.eval_async(s, &[tok], Outputs::None).await?;
            }
            self.finish = Some(FinishReason::Eog);
            return Ok(String::new());
        }
        // Control tokens (reserved specials) are not text: they enter the cache but are
        // never printed, as in llama-server.
        let is_control =
            engine.tokenizer.token_kind(tok) == Some(bitnet_tokenizer::TokenKind::Control);
        let piece = if is_control {
            String::new()
        } else {
            self.decoder.push(&engine.tokenizer, tok)?
        };
        let (emit, hit) = self.stops.push(&piece);
        if hit {
            self.finish = Some(FinishReason::StopString);
            return Ok(emit);
        }
        if s.cache.len() >= s.cache.n_ctx() {
            match self.context_policy {
                ContextPolicy::Error => {
                    return Err(EngineError::ContextFull {
                        n_past: s.cache.len() + 1,
                        n_ctx: s.cache.n_ctx(),
                    })
                }
                ContextPolicy::Stop => {
                    self.finish = Some(FinishReason::Length);
                    return Ok(emit);
                }
                ContextPolicy::Shift { keep } => engine.shift(s, keep)?,
            }
        }
        self.next = engine
            .eval_next(
                s,
                &[tok],
                engine.read_back_for(&self.sampler, self.constrained),
            )
            .await?;
        Ok(emit)
    }

    /// [`Generation::sample`] then [`Generation::advance`]: the next token and its text,
    /// `None` once the generation has ended.
    pub fn next_piece(&mut self, engine: &Engine, s: &mut Session) -> Result<Option<Piece>> {
        bitnet_gpu::block(self.next_piece_async(engine, s))?
    }

    /// [`Generation::next_piece`], for callers that must not block.
    pub async fn next_piece_async(
        &mut self,
        engine: &Engine,
        s: &mut Session,
    ) -> Result<Option<Piece>> {
        let Some(token) = self.sample(engine)? else {
            return Ok(None);
        };
        let text = self.advance_async(engine, s, token).await?;
        Ok(Some(Piece { token, text }))
    }

    /// The caller stops the generation.
    pub fn cancel(&mut self) {
        self.finish = Some(FinishReason::Cancelled);
    }

    /// Whether the generation has ended.
    pub fn is_done(&self) -> bool {
        self.finish.is_some()
    }

    /// End the generation: the text still held back (an incomplete character or a partial
    /// stop string; nothing after a stop string or a cancel) and the statistics. Ending
    /// before the generation did counts as a cancel.
    pub fn finish(mut self) -> (String, GenStats) {
        let finish = self.finish.unwrap_or(FinishReason::Cancelled);
        let mut emit = String::new();
        if !matches!(finish, FinishReason::StopString | FinishReason::Cancelled) {
            let tail = self.decoder.finish();
            let (e, _) = self.stops.push(&tail);
            emit = e;
            emit.push_str(&self.stops.finish());
        }
        let stats = GenStats {
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            prompt_time: self.prompt_time,
            generated_tokens: self.generated,
            generation_time: self.t1.elapsed(),
            finish,
        };
        (emit, stats)
    }
}
