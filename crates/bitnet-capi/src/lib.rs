//! The C API of bitnet-rs (`include/bitnet.h`, generated from this file by cbindgen).
//!
//! An opaque engine handle owns a loaded model ([`bitnet_engine::load`]) and one session
//! (its KV cache), so consecutive generations that share a prefix (a chat that grows)
//! reuse it. Every entry point:
//! * checks its pointers (null is `BITNET_ERR_NULL`; one misaligned for its type, or a
//!   length no buffer can have, is `BITNET_ERR_INVALID`) and values (`BITNET_ERR_INVALID`);
//! * runs inside `catch_unwind`, so no panic crosses into C (`BITNET_ERR_PANIC`);
//! * on failure stores a message that [`bitnet_last_error`] returns (per thread).
#![allow(non_camel_case_types)] // C names

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use ::bitnet_engine::{
    Constraint, ContextPolicy, Engine, EngineError, Event, FinishReason, GenParams, GenStats,
    LmHeadFormat, LoadOptions, Session,
};
use bitnet_model::{KvType, Numerics, Outputs};
use bitnet_sampling::{Sampler, SamplerParams};
use bitnet_tokenizer::{ChatMessage, ChatRole};

/// Success.
pub const BITNET_OK: i32 = 0;
/// A required pointer argument was null.
pub const BITNET_ERR_NULL: i32 = -1;
/// An argument is out of range, not UTF-8, a pointer misaligned for its type, or not allowed
/// here.
pub const BITNET_ERR_INVALID: i32 = -2;
/// The model file cannot be opened or is not a model this engine runs.
pub const BITNET_ERR_LOAD: i32 = -3;
/// Evaluation or generation failed (for instance the context is full).
pub const BITNET_ERR_ENGINE: i32 = -4;
/// An output buffer is too small; the size needed was written to the size output.
pub const BITNET_ERR_BUFFER: i32 = -5;
/// The option is not available in this build.
pub const BITNET_ERR_UNSUPPORTED: i32 = -6;
/// An internal error (a bug), caught before it reached the caller.
pub const BITNET_ERR_PANIC: i32 = -7;

/// `bitnet_config.numerics`: fastest reductions (the default).
pub const BITNET_NUMERICS_FAST: i32 = 0;
/// `bitnet_config.numerics`: bitnet.cpp's float paths, bit for bit.
pub const BITNET_NUMERICS_EXACT: i32 = 1;

/// `bitnet_config.kv_type`: f16 KV cache (the default).
pub const BITNET_KV_F16: i32 = 0;
/// `bitnet_config.kv_type`: f32 KV cache.
pub const BITNET_KV_F32: i32 = 1;
/// `bitnet_config.kv_type`: ggml Q8_0 KV cache (fast numerics only).
pub const BITNET_KV_Q8_0: i32 = 2;
/// `bitnet_config.kv_type`: ggml Q4_0 KV cache (fast numerics only).
pub const BITNET_KV_Q4_0: i32 = 3;

/// `bitnet_config.lm_head`: the file's own head (the default; needed by exact numerics).
pub const BITNET_LM_HEAD_FILE: i32 = 0;
/// `bitnet_config.lm_head`: a Q8_0 copy built at load.
pub const BITNET_LM_HEAD_Q8_0: i32 = 1;
/// `bitnet_config.lm_head`: a Q6_K copy built at load.
pub const BITNET_LM_HEAD_Q6_K: i32 = 2;
/// `bitnet_config.lm_head`: a Q4_0 copy built at load.
pub const BITNET_LM_HEAD_Q4_0: i32 = 3;
/// `bitnet_config.lm_head`: the file's head with its vocabulary clustered at load (k-means,
/// default clusters and probe): exact logits only for the best clusters' members.
pub const BITNET_LM_HEAD_APPROX: i32 = 4;

/// `bitnet_config.device`: the CPU (the default).
pub const BITNET_DEVICE_CPU: i32 = 0;
/// `bitnet_config.device`: the GPU backend (wgpu: Vulkan, Metal or DX12; fast numerics and the
/// file's F16 head). Loading fails with `BITNET_ERR_ENGINE` when no adapter can run the model.
pub const BITNET_DEVICE_GPU: i32 = 1;
/// `bitnet_config.device`: a GPU when one is usable, else the CPU.
pub const BITNET_DEVICE_AUTO: i32 = 2;

/// `bitnet_gen_result.finish`: an end-of-generation token.
pub const BITNET_FINISH_EOG: i32 = 0;
/// `bitnet_gen_result.finish`: a stop string matched.
pub const BITNET_FINISH_STOP: i32 = 1;
/// `bitnet_gen_result.finish`: `max_tokens` reached or the context is full.
pub const BITNET_FINISH_LENGTH: i32 = 2;
/// `bitnet_gen_result.finish`: the piece callback returned false.
pub const BITNET_FINISH_CANCELLED: i32 = 3;

/// Load settings. Start from `bitnet_config_default()` and change what you need.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct bitnet_config {
    /// Threads; 0 = the physical cores.
    pub n_threads: u32,
    /// Context positions of the engine's session; 0 = the training context, at most 4096.
    pub n_ctx: u32,
    /// `BITNET_NUMERICS_*`.
    pub numerics: i32,
    /// `BITNET_KV_*`.
    pub kv_type: i32,
    /// `BITNET_LM_HEAD_*`.
    pub lm_head: i32,
    /// `BITNET_DEVICE_*`.
    pub device: i32,
    /// Largest RAM the process may use, in bytes; 0 = no limit. A limit runs the
    /// low-memory mode: weights streamed from the mapped file, the KV cache (when left at
    /// f16) and the context (when `n_ctx` is 0) fitted to it; `BITNET_ERR_ENGINE` with the
    /// numbers when the model cannot fit. `bitnet_info_get` gives the context chosen.
    pub ram_budget: u64,
    /// Read the file into memory instead of mapping it.
    pub in_memory: bool,
    /// Build a Q8_0 screen of the LM head at load: greedy and top-k generation (top-k at
    /// most 64, no penalty) then computes only the logits that can decide each token, the
    /// same tokens, faster where memory bounds decode, for about half the head's size in RAM.
    /// Fast numerics and the file's head only.
    pub screen_head: bool,
}

/// Generation and sampling settings. Start from `bitnet_gen_params_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct bitnet_gen_params {
    /// Most tokens to generate (at least 1).
    pub max_tokens: u32,
    /// Temperature; <= 0 is greedy decoding.
    pub temperature: f32,
    /// Top-k; <= 0 is off.
    pub top_k: i32,
    /// Top-p in [0, 1]; 1 is off.
    pub top_p: f32,
    /// Min-p in [0, 1]; 0 is off.
    pub min_p: f32,
    /// Repetition penalty (> 0); 1 is off.
    pub repeat_penalty: f32,
    /// Recent tokens the penalties look at; 0 turns them off.
    pub repeat_last_n: u32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// Seed of the sampler's random generator.
    pub seed: u64,
    /// Treat the prompt as one user message in the model's chat format (instead of
    /// plain text after BOS).
    pub chat: bool,
    /// Stop strings (`n_stop` NUL-terminated UTF-8 strings; never emitted); may be null
    /// when `n_stop` is 0.
    pub stop: *const *const c_char,
    pub n_stop: usize,
    /// Structured output: a JSON schema (NUL-terminated JSON text) the reply must match;
    /// null for none. A schema that does not compile fails with `BITNET_ERR_INVALID`.
    pub json_schema: *const c_char,
    /// Structured output: a grammar in llguidance's Lark syntax (`start: ...`), NUL-
    /// terminated; null for none. At most one of `json_schema` and `grammar`.
    pub grammar: *const c_char,
}

/// What a generation did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct bitnet_gen_result {
    /// Prompt tokens evaluated, and prompt tokens reused from the session's cache.
    pub n_prompt_tokens: u64,
    pub n_cached_tokens: u64,
    /// Tokens generated (the end-of-generation token included when it ended the reply).
    pub n_generated: u64,
    /// `BITNET_FINISH_*`.
    pub finish: i32,
    pub prompt_tok_per_s: f64,
    pub gen_tok_per_s: f64,
}

/// Model and engine facts.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct bitnet_info {
    pub n_vocab: u64,
    /// Positions of the engine's session.
    pub n_ctx: u64,
    pub n_ctx_train: u64,
    pub n_layer: u64,
    pub n_embd: u64,
    pub n_threads: u64,
    /// Token ids; -1 when the vocabulary has none.
    pub bos: i64,
    pub eos: i64,
}

/// Speed of the last generation and memory use.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct bitnet_stats {
    /// The last `bitnet_generate` (zeros before the first).
    pub last: bitnet_gen_result,
    /// Peak resident memory of the process in bytes (0 where unknown).
    pub peak_rss_bytes: u64,
    /// Bytes held by the session's KV cache.
    pub kv_cache_bytes: u64,
    /// Bytes of the model file.
    pub model_file_bytes: u64,
}

/// Receives generated text: `len` bytes of UTF-8 at `text` (also NUL-terminated; the
/// text may itself contain NUL). The pointer is valid only during the call. Return true
/// to continue, false to stop the generation. It runs on the thread that called
/// `bitnet_generate` and must not call functions on the same engine.
pub type bitnet_piece_fn =
    Option<unsafe extern "C" fn(text: *const c_char, len: usize, user_data: *mut c_void) -> bool>;

/// A loaded model with one session. Create with `bitnet_load`, release with `bitnet_free`.
pub struct bitnet_engine {
    inner: Mutex<Inner>,
}

struct Inner {
    engine: Engine,
    session: Session,
    last: bitnet_gen_result,
}

impl std::fmt::Debug for bitnet_engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("bitnet_engine")
    }
}

/// A sampler chain with its own random generator and recent-token window. Create with
/// `bitnet_sampler_new`, release with `bitnet_sampler_free`.
#[derive(Debug)]
pub struct bitnet_sampler {
    inner: Sampler,
}

/// A failure: an error code and its message.
struct Fail(i32, String);

type Res<T = ()> = Result<T, Fail>;

fn invalid(msg: impl Into<String>) -> Fail {
    Fail(BITNET_ERR_INVALID, msg.into())
}

fn engine_err(e: EngineError) -> Fail {
    match e {
        // A schema or grammar the caller gave that does not compile.
        EngineError::Grammar { .. } => invalid(e.to_string()),
        e => Fail(BITNET_ERR_ENGINE, e.to_string()),
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// Set while a piece callback runs: calls into the same engine would deadlock.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

fn set_last_error(msg: &str) {
    // An interior NUL cannot be represented: cut the message there.
    let msg = msg.split('\0').next().unwrap_or_default();
    let c = CString::new(msg).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs `f` behind the boundary: catches panics, turns failures into codes and messages.
fn guard(f: impl FnOnce() -> Res) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => BITNET_OK,
        Ok(Err(Fail(code, msg))) => {
            set_last_error(&msg);
            code
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            set_last_error(&format!("internal error (a bug, please report it): {what}"));
            BITNET_ERR_PANIC
        }
    }
}

/// `p`, which must not be null, and aligned for `T`: reading or writing through a misaligned
/// pointer is undefined behaviour even where the CPU allows it, so it is an error here.
fn not_null<T>(p: *const T, what: &str) -> Res<*const T> {
    match optional(p, what)? {
        Some(p) => Ok(p),
        None => Err(Fail(BITNET_ERR_NULL, format!("`{what}` is null"))),
    }
}

/// `p` where it may be null (`None`); a pointer that is not aligned for `T` is an error.
fn optional<T>(p: *const T, what: &str) -> Res<Option<*const T>> {
    if p.is_null() {
        Ok(None)
    } else if !p.is_aligned() {
        Err(invalid(format!(
            "`{what}` is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )))
    } else {
        Ok(Some(p))
    }
}

/// # Safety
/// `p` is null or points to a NUL-terminated string valid for the call.
unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Res<&'a str> {
    let p = not_null(p, what)?;
    // SAFETY: non-null, and the caller guarantees a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| invalid(format!("`{what}` is not valid UTF-8")))
}

/// # Safety
/// `p` is null (only allowed when `n` is 0) or points to `n` readable values.
unsafe fn c_slice<'a, T>(p: *const T, n: usize, what: &str) -> Res<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    let p = not_null(p, what)?;
    // A length no caller's buffer can have (-1 passed as size_t): an error, rather than a
    // slice that is undefined behaviour to make.
    if n > isize::MAX.unsigned_abs() / std::mem::size_of::<T>().max(1) {
        return Err(invalid(format!(
            "`{what}`: {n} values cannot fit in memory"
        )));
    }
    // SAFETY: non-null and aligned (`not_null`), and `n` values span at most isize::MAX
    // bytes; the caller guarantees `n` readable, initialized values.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// # Safety
/// `e` is null or a pointer returned by `bitnet_load` and not yet freed.
unsafe fn lock<'a>(e: *const bitnet_engine) -> Res<MutexGuard<'a, Inner>> {
    if IN_CALLBACK.with(Cell::get) {
        return Err(invalid(
            "called from inside a piece callback (the engine is busy generating)",
        ));
    }
    let e = not_null(e, "engine")?;
    // SAFETY: a live handle from `bitnet_load` (the caller's contract).
    let e = unsafe { &*e };
    // A panic while the lock was held left the session in an unknown state: start over.
    Ok(e.inner.lock().unwrap_or_else(|poisoned| {
        let mut g = poisoned.into_inner();
        g.session.reset();
        g
    }))
}

fn u64_of(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The library version, a static NUL-terminated string.
#[unsafe(no_mangle)]
pub extern "C" fn bitnet_version() -> *const c_char {
    static V: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
    V.as_ptr()
}

/// The message of the last failed call on this thread ("" if none failed yet). The
/// string belongs to the library and stays valid until the next failing call on this
/// thread.
#[unsafe(no_mangle)]
pub extern "C" fn bitnet_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The default load settings.
#[unsafe(no_mangle)]
pub extern "C" fn bitnet_config_default() -> bitnet_config {
    bitnet_config {
        n_threads: 0,
        n_ctx: 0,
        numerics: BITNET_NUMERICS_FAST,
        kv_type: BITNET_KV_F16,
        lm_head: BITNET_LM_HEAD_FILE,
        device: BITNET_DEVICE_CPU,
        ram_budget: 0,
        in_memory: false,
        screen_head: false,
    }
}

/// The default generation settings (llama.cpp's sampling defaults, 128 tokens).
#[unsafe(no_mangle)]
pub extern "C" fn bitnet_gen_params_default() -> bitnet_gen_params {
    let d = SamplerParams::default();
    bitnet_gen_params {
        max_tokens: 128,
        temperature: d.temperature,
        top_k: d.top_k,
        top_p: d.top_p,
        min_p: d.min_p,
        repeat_penalty: d.repeat_penalty,
        repeat_last_n: u32::try_from(d.repeat_last_n).unwrap_or(u32::MAX),
        presence_penalty: d.presence_penalty,
        frequency_penalty: d.frequency_penalty,
        seed: d.seed,
        chat: false,
        stop: std::ptr::null(),
        n_stop: 0,
        json_schema: std::ptr::null(),
        grammar: std::ptr::null(),
    }
}

fn load_options(c: &bitnet_config) -> Res<LoadOptions> {
    let numerics = match c.numerics {
        BITNET_NUMERICS_FAST => Numerics::Fast,
        BITNET_NUMERICS_EXACT => Numerics::Exact,
        n => {
            return Err(invalid(format!(
                "numerics = {n} is not a BITNET_NUMERICS_* value"
            )))
        }
    };
    let kv_type = match c.kv_type {
        BITNET_KV_F16 => KvType::F16,
        BITNET_KV_F32 => KvType::F32,
        BITNET_KV_Q8_0 => KvType::Q8_0,
        BITNET_KV_Q4_0 => KvType::Q4_0,
        n => return Err(invalid(format!("kv_type = {n} is not a BITNET_KV_* value"))),
    };
    let lm_head = match c.lm_head {
        BITNET_LM_HEAD_FILE => LmHeadFormat::File,
        BITNET_LM_HEAD_Q8_0 => LmHeadFormat::Q8_0,
        BITNET_LM_HEAD_Q6_K => LmHeadFormat::Q6K,
        BITNET_LM_HEAD_Q4_0 => LmHeadFormat::Q4_0,
        BITNET_LM_HEAD_APPROX => LmHeadFormat::Approx(Default::default()),
        n => {
            return Err(invalid(format!(
                "lm_head = {n} is not a BITNET_LM_HEAD_* value"
            )))
        }
    };
    let device = match c.device {
        BITNET_DEVICE_CPU => ::bitnet_engine::Device::Cpu,
        BITNET_DEVICE_GPU => ::bitnet_engine::Device::Gpu,
        BITNET_DEVICE_AUTO => ::bitnet_engine::Device::Auto,
        n => {
            return Err(invalid(format!(
                "device = {n} is not a BITNET_DEVICE_* value"
            )))
        }
    };
    let threads = match usize::try_from(c.n_threads) {
        Ok(0) => ::bitnet_engine::sys::default_threads(),
        Ok(n) if n <= 1024 => n,
        _ => {
            return Err(invalid(format!(
                "n_threads = {} is more than 1024",
                c.n_threads
            )))
        }
    };
    let opts = LoadOptions {
        threads,
        numerics,
        kv_type,
        lm_head,
        device,
        in_memory: c.in_memory,
        screen_head: c.screen_head,
        budget: (c.ram_budget != 0).then(|| ::bitnet_engine::budget::BudgetRequest {
            bytes: c.ram_budget,
            n_ctx: usize::try_from(c.n_ctx).ok().filter(|&n| n != 0),
            kv_type_explicit: kv_type != KvType::F16,
            stream: ::bitnet_engine::budget::StreamMode::default(),
            reserve_bytes: 0,
        }),
        ..LoadOptions::default()
    };
    opts.validate().map_err(|e| invalid(e.to_string()))?;
    Ok(opts)
}

/// Loads a GGUF model. `config` may be null (the defaults). On success `*out` is a new
/// engine (release it with `bitnet_free`); on failure `*out` is set to null.
///
/// # Safety
/// `path` is a NUL-terminated string; `config` is null or points to a `bitnet_config`;
/// `out` points to writable storage for one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bitnet_load(
    path: *const c_char,
    config: *const bitnet_config,
    out: *mut *mut bitnet_engine,
) -> i32 {
    guard(|| {
        let out = not_null(out, "out")?.cast_mut();
        // SAFETY: `out` is non-null and writable (the caller's contract).
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: NUL-terminated (the caller's contract).
        let path = unsafe { c_str(path, "path") }?;
        let cfg = match optional(config, "config")? {
            None => bitnet_config_default(),
            // SAFETY: non-null, aligned, and points to a config (the caller's contract).
            Some(config) => unsafe { *config },
        };
        let opts = load_options(&cfg)?;
        let engine = ::bitnet_engine::load(Path::new(path), &opts, &mut |_| {}).map_err(|e| {
            let code = match e {
                EngineError::Open { .. } | EngineError::Model(_) | EngineError::Tokenizer(_) => {
                    BITNET_ERR_LOAD
                }
                _ => BITNET_ERR_ENGINE,
            };
            Fail(code, e.to_string())
        })?;
        let n_ctx = match (engine.plan(), usize::try_from(cfg.n_ctx)) {
            (Some(p), _) => p.n_ctx,
            (None, Ok(0) | Err(_)) => engine.config().n_ctx_train.min(4096),
            (None, Ok(n)) => n,
        };
        let session = engine.new_session(n_ctx).map_err(engine_err)?;
        let handle = Box::new(bitnet_engine {
            inner: Mutex::new(Inner {
                engine,
                session,
                last: bitnet_gen_result::default(),
            }),
        });
        // SAFETY: as above.
        unsafe { out.write(Box::into_raw(handle)) };
        Ok(())
    })
}

/// Releases an engine (null is ignored).
///
/// # Safety
/// `engine` is null or a pointer from `bitnet_load` not yet freed, and no other thread is
/// using it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bitnet_free(engine: *mut bitnet_engine) {
    if engine.is_null() {
        return;
    }
    // A panic while dropping must not unwind into C; there is nothing to report it to.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: from `Box::into_raw` in `bitnet_load`, freed once (the caller's contract).
        drop(unsafe { Box::from_raw(engine) });
    }));
}

/// Model and engine facts.
///
/// # Safety
/// `engine` is a live handle; `out` points to a writable `bitnet_info`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bitnet_info_get(
    engine: *const bitnet_engine,
    out: *mut bitnet_info,
) -> i32 {
    guard(|| {
        let out = not_null(out, "out")?.cast_mut();
        // SAFETY: a live handle (the caller's contract).
        let g = unsafe { lock(engine) }?;
        let c = g.engine.config();
        let tok = &g.engine.tokenizer;
        let id = |t: Option<u32>| t.map_or(-1, i64::from);
        let info = bitnet_info {
            n_vocab: u64_of(c.n_vocab),
            n_ctx: u64_of(g.session.n_ctx()),
            n_ctx_train: u64_of(c.n_ctx_train),
            n_layer: u64_of(c.n_layer),
            n_embd: u64_of(c.n_embd),
            n_threads: u64_of(g.engine.options().threads),
            bos: id(tok.bos()),
            eos: id(tok.eos()),
        };
        // SAFETY: non-null and writable (the caller's contract).
        unsafe { out.write(info) };
        Ok(())
    })
}

fn sampler_params(p: &bitnet_gen_params) -> Res<SamplerParams> {
    let s = SamplerParams {
        temperature: p.temperature,
        top_k: p.top_k,
        top_p: p.top_p,
        min_p: p.min_p,
        repeat_penalty: p.repeat_penalty,
        repeat_last_n: usize::try_from(p.repeat_last_n)
            .map_err(|_| invalid("repeat_last_n is too large"))?,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        seed: p.seed,
    };
    s.validate().map_err(|e| invalid(e.to_string()))?;
    Ok(s)
}

/// `*params`, or the defaults when it is null.
///
/// # Safety
/// `params` is null or points to a `bitnet_gen_params`.
unsafe fn params_or_default(params: *const bitnet_gen_params) -> Res<bitnet_gen_params> {
    Ok(match optional(params, "params")? {
        None => bitnet_gen_params_default(),
        // SAFETY: non-null, aligned and valid (the caller's contract).
        Some(params) => unsafe { *params },
    })
}

/// # Safety
/// `p.stop` points to `p.n_stop` NUL-terminated strings (or `n_stop` is 0);
/// `p.json_schema` and `p.grammar` are null or NUL-terminated.
unsafe fn gen_params(p: &bitnet_gen_params) -> Res<GenParams> {
    if p.max_tokens == 0 {
        return Err(invalid("max_tokens must be at least 1"));
    }
    // SAFETY: `n_stop` readable pointers (the caller's contract).
    let stops = unsafe { c_slice(p.stop, p.n_stop, "stop") }?;
    let mut stop = Vec::with_capacity(stops.len());
    for (i, &s) in stops.iter().enumerate() {
        // SAFETY: each is NUL-terminated (the caller's contract).
        stop.push(unsafe { c_str(s, &format!("stop[{i}]")) }?.to_string());
    }
    let constraint = match (p.json_schema.is_null(), p.grammar.is_null()) {
        (true, true) => None,
        (false, false) => return Err(invalid("give json_schema or grammar, not both")),
        (false, true) => {
            // SAFETY: non-null and NUL-terminated (the caller's contract).
            let text = unsafe { c_str(p.json_schema, "json_schema") }?;
            let v = serde_json::from_str(text)
                .map_err(|e| invalid(format!("json_schema is not JSON: {e}")))?;
            Some(Constraint::JsonSchema(v))
        }
        (true, false) => {
            // SAFETY: non-null and NUL-terminated (the caller's contract).
            let text = unsafe { c_str(p.grammar, "grammar") }?;
            Some(Constraint::grammar_text(text).map_err(|e| invalid(e.to_string()))?)
        }
    };
    Ok(GenParams {
        max_tokens: usize::try_from(p.max_tokens)
            .map_err(|_| invalid("max_tokens is too large"))?,
        sampler: sampler_params(p)?,
        stop,
        context_policy: ContextPolicy::Stop,
        constraint,
    })
}

fn finish_code(f: FinishReason) -> i32 {
    match f {
        FinishReason::Eog => BITNET_FINISH_EOG,
        FinishReason::StopString => BITNET_FINISH_STOP,
        FinishReason::Length => BITNET_FINISH_LENGTH,
        FinishReason::Cancelled => BITNET_FINISH_CANCELLED,
    }
}

fn result_of(s: &GenStats) -> bitnet_gen_result {
    bitnet_gen_result {
        n_prompt_tokens: u64_of(s.prompt_tokens),
        n_cached_tokens: u64_of(s.cached_tokens),
        n_generated: u64_of(s.generated_tokens),
        finish: finish_code(s.finish),
        prompt_tok_per_s: s.prompt_tok_s(),
        gen_tok_per_s: s.generation_tok_s(),
    }
}

/// Generates a reply to `prompt`, streaming text to `on_piece` (may be null).
///
/// The prompt is plain text (BOS is added; special-token text is not parsed), or with
/// `params->chat` one user message in the model's chat format. The session keeps its
/// cache, so a prompt that extends the previous one (prompt + reply + next turn) is not
/// evaluated again. Generation ends at an end-of-generation token, a stop string,
/// `max_tokens`, the end of the context, or when `on_piece` returns false.
///
/// The ids of the generated tokens are written to `out_tokens` (may be null), at most
/// `out_capacity` of them; `out_result` (may be null) receives the counts and speeds.
///
/// # Safety
/// `engine` is a live handle; `prompt` is NUL-terminated; `params` is null or valid;
/// `out_tokens` is null or has room for `out_capacity` ids; `out_result` is null or
/// writable; `on_piece` is null or a function with that signature.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bitnet_generate(
    engine: *const bitnet_engine,
    prompt: *const c_char,
    params: *const bitnet_gen_params,
    on_piece: bitnet_piece_fn,
    user_data: *mut c_void,
    out_tokens: *mut u32,
    out_capacity: usize,
    out_result: *mut bitnet_gen_result,
) -> i32 {
    guard(|| {
        // SAFETY: a live handle (the caller's contract).
        let mut g = unsafe { lock(engine) }?;
        // SAFETY: NUL-terminated (the caller's contract).
        let prompt = unsafe { c_str(prompt, "prompt") }?;
        // SAFETY: null or valid (the caller's contract).
        let p = unsafe { params_or_default(params) }?;
        // SAFETY: `p.stop` as documented (the caller's contract).
        let gp = unsafe { gen_params(&p) }?;
        if optional(out_tokens, "out_tokens")?.is_none() && out_capacity != 0 {
            return Err(Fail(BITNET_ERR_NULL, "`out_tokens` is null".into()));
        }
        let out_result = optional(out_result, "out_result")?;
        let Inner {
            engine,
            session,
            last,
            ..
        } = &mut *g;
        let tok = &engine.tokenizer;
        let ids = if p.chat {
            tok.encode_chat(&[ChatMessage::new(ChatRole::User, prompt)], true)
        } else {
            tok.encode(prompt, tok.add_bos(), false)
        }
        .map_err(|e| invalid(format!("prompt: {e}")))?;
        if ids.len() >= session.n_ctx() {
            return Err(invalid(format!(
                "the prompt has {} tokens; the context holds {}",
                ids.len(),
                session.n_ctx()
            )));
        }
        let mut n_out = 0usize;
        let mut text = Vec::new();
        let stats = engine
            .generate(session, &ids, false, &gp, &mut |ev| match ev {
                Event::Token(t) => {
                    if n_out < out_capacity {
                        // SAFETY: `out_tokens` has room for `out_capacity` ids.
                        unsafe { out_tokens.add(n_out).write(t) };
                        n_out += 1;
                    }
                    true
                }
                Event::Text(t) => {
                    let Some(cb) = on_piece else { return true };
                    text.clear();
                    text.extend_from_slice(t.as_bytes());
                    text.push(0);
                    IN_CALLBACK.with(|c| c.set(true));
                    // SAFETY: a callback of the documented signature; the text is
                    // NUL-terminated and lives until it returns.
                    let go_on = unsafe { cb(text.as_ptr().cast(), t.len(), user_data) };
                    IN_CALLBACK.with(|c| c.set(false));
                    go_on
                }
            })
            .map_err(engine_err)?;
        *last = result_of(&stats);
        if let Some(out_result) = out_result {
            // SAFETY: non-null, aligned and writable (the caller's contract).
            unsafe { out_result.cast_mut().write(*last) };
        }
        Ok(())
    })
}

/// Token ids of `text`: BOS first when `add_bos` (and the vocabulary has one); special-
/// token text such as `<|eot_id|>` becomes those tokens when `parse_special`. Writes the
/// count to `*n_out`; if `capacity` is too small nothing is written to `out` and the
/// call fails with `BITNET_ERR_BUFFER` (`*n_out` is the count needed; pass capacity 0 to
/// ask for it).
///
/// # Safety
/// `engine` is a live handle; `text` is NUL-terminated; `out` is null (capacity 0) or has
/// room for `capacity` ids; `n_out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bitnet_tokenize(
    engine: *const bitnet_engine,
    text: *const c_char,
    add_bos: bool,
    parse_special: bool,
    out: *mut u32,
    capacity: usize,
    n_out: *mut usize,
) -> i32 {
    guard(|| {
        let n_out = not_null(n_out, "n_out")?.cast_mut();
        // SAFETY: a live handle (the caller's contract).
        let g = unsafe { lock(engine) }?;
        // SAFETY: NUL-terminated (the caller's contract).
        let text = unsafe { c_str(text, "text") }?;
        let tok = &g.engine.tokenizer;
        let ids = tok
            .encode(text, add_bos && tok.add_bos(), parse_special)
            .map_err(|e| invalid(e.to_string()))?;
        // SAFETY: writable (the caller's contract).
        unsafe { n_out.write(ids.len()) };
        if ids.len() > capacity {
            return Err(Fail(
                BITNET_ERR_BUFFER,
                format!("{} tokens do not fit in {capacity}", ids.len()),
            ));
        }
        if !ids.is_empty() {
            let out = not_null(out, "out")?.cast_mut();
            // SAFETY: room for `capacity` >= ids.len() values; distinct allocations.
            unsafe { std::ptr::copy_nonoverlapping(ids.as_ptr(), out, ids.len()) };
        }
        Ok(())
    })
}

/// The bytes of `ids` (UTF-8, possibly cut inside a character at either end), NUL-
/// terminated. `*n_out` receives their length without the NUL; if `capacity` cannot hold
/// them and the NUL, nothing is written and the call fails with `BITNET_ERR_BUFFER`.
///
/// # Safety
/// `engine` is a live handle; `ids` has `n_ids` values (or `n_ids` is 0); `out` is null
/// (capacity 0) or has room for `capacity` bytes; `n_out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bitnet_detokenize(
    engine: *const bitnet_engine,
    ids: *const u32,
    n_ids: usize,
    out: *mut c_char,
    capacity: usize,
    n_out: *mut usize,
) -> i32 {
    guard(|| {
        let n_out = not_null(n_out, "n_out")?.cast_mut();
        // SAFETY: a live handle (the caller's contract).
        let g = unsafe { lock(engine) }?;
        // SAFETY: `n_ids` readable values (the caller's contract).
        let ids = unsafe { c_slice(ids, n_ids, "ids") }?;
        let bytes = g
            .engine
            .tokenizer
            .decode_bytes(ids)
            .map_err(|e| invalid(e.to_string()))?;
        // SAFETY: writable (the caller's contract).
        unsafe { n_out.write(bytes.len()) };
        if bytes.len() >= capacity {
            return Err(Fail(
                BITNET_ERR_BUFFER,
                format!("{} bytes and a NUL do not fit in {capacity}", bytes.len()),
            ));
        }
        let out = not_null(out, "out")?.cast_mut();
        // SAFETY: room for `capacity` > bytes.len() bytes; distinct allocations.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), bytes.len());
            out.add(bytes.len()).write(0);
        }
        Ok(())
    })
}

/// Evaluates `ids` as the whole sequence (a prefix shared with the session's cache is
/// reused) and writes the logits of its last position (`n_vocab` floats) to `logits`.
///
/// # Safety
/// `engine` is a live handle; `ids` has `n_ids` values; `logits` has room for `capacity`
/// floats.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bitnet_forward(
    engine: *const bitnet_engine,
    ids: *const u32,
    n_ids: usize,
    logits: *mut f32,
    capacity: usize,
) -> i32 {
    guard(|| {
        // SAFETY: a live handle (the caller's contract).
        let mut g = unsafe { lock(engine) }?;
        // SAFETY: `n_ids` readable values (the caller's contract).
        let ids = unsafe { c_slice(ids, n_ids, "ids") }?;
        let Inner {
            engine, session, ..
        } = &mut *g;
        let n_vocab = engine.config().n_vocab;
        if ids.is_empty() {
            return Err(invalid("`ids` is empty"));
        }
        if let Some(&bad) = ids
            .iter()
            .find(|&&t| usize::try_from(t).map_or(true, |t| t >= n_vocab))
        {
            return Err(invalid(format!(
                "token id {bad} is not below n_vocab = {n_vocab}"
            )));
        }
        if capacity < n_vocab {
            return Err(Fail(
                BITNET_ERR_BUFFER,
                format!("the logits need {n_vocab} floats; capacity is {capacity}"),
            ));
        }
        let logits = not_null(logits, "logits")?.cast_mut();
        if ids.len() > session.n_ctx() {
            return Err(invalid(format!(
                "{} tokens do not fit in the context of {}",
                ids.len(),
                session.n_ctx()
            )));
        }
        // Keep the shared prefix, evaluate at least the last token.
        let common = session
            .tokens()
            .iter()
            .zip(ids)
            .take_while(|(a, b)| a == b)
            .count()
            .min(ids.len() - 1);
        session.truncate(common);
        let out = engine
            .eval(session, &ids[common..], Outputs::Last)
            .map_err(engine_err)?;
        if out.len() != n_vocab {
            return Err(Fail(
                BITNET_ERR_ENGINE,
                format!("expected {n_vocab} logits, got {}", out.len()),
            ));
        }
        // SAFETY: room for `capacity` >= n_vocab floats; distinct allocations.
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), logits, n_vocab) };
        Ok(())
    })
}

/// The embedding of one input: `text` (NUL-terminated; tokenized as `bitnet embed` does: BOS
/// where the vocabulary adds it, EOS where the file asks), or, when `text` is null, the
/// `n_ids` token ids `ids` as given. The vector is the file's pooling (last token for
/// bitnet.cpp's embedding models and files that name none), L2-normalized when `normalize`.
/// Writes its `n_embd` floats to `out` and the count to `*n_out`; if `capacity` is too small
/// nothing is written to `out` and the call fails with `BITNET_ERR_BUFFER` (pass capacity 0
/// to ask for the count). A file whose pooling is none is refused (`BITNET_ERR_INVALID`).
///
/// # Safety
/// `engine` is a live handle; `text` is null or NUL-terminated; `ids` has `n_ids` values
/// (or `n_ids` is 0); `out` is null (capacity 0) or has room for `capacity` floats; `n_out`
/// is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bitnet_embed(
    engine: *const bitnet_engine,
    text: *const c_char,
    ids: *const u32,
    n_ids: usize,
    normalize: bool,
    out: *mut f32,
    capacity: usize,
    n_out: *mut usize,
) -> i32 {
    guard(|| {
        let n_out = not_null(n_out, "n_out")?.cast_mut();
        // SAFETY: a live handle (the caller's contract).
        let g = unsafe { lock(engine) }?;
        let engine = &g.engine;
        let opts = ::bitnet_engine::EmbedOptions {
            pooling: None,
            raw: !normalize,
        };
        if engine.pooling(&opts) == bitnet_model::Pooling::None {
            return Err(invalid(
                "the file's pooling_type is none: it has no vector per input",
            ));
        }
        let input: Vec<u32> = if text.is_null() {
            // SAFETY: `n_ids` readable values (the caller's contract).
            unsafe { c_slice(ids, n_ids, "ids") }?.to_vec()
        } else {
            // SAFETY: NUL-terminated (the caller's contract).
            let text = unsafe { c_str(text, "text") }?;
            if text.is_empty() {
                return Err(invalid("`text` is empty"));
            }
            engine.embed_tokens(text).map_err(engine_err)?
        };
        let c = engine.config();
        if input.is_empty() {
            return Err(invalid("the input has no tokens"));
        }
        if let Some(&bad) = input
            .iter()
            .find(|&&t| usize::try_from(t).map_or(true, |t| t >= c.n_vocab))
        {
            return Err(invalid(format!(
                "token id {bad} is not below n_vocab = {}",
                c.n_vocab
            )));
        }
        if input.len() > g.session.n_ctx() {
            return Err(invalid(format!(
                "{} tokens do not fit in the context of {}",
                input.len(),
                g.session.n_ctx()
            )));
        }
        // SAFETY: writable (the caller's contract).
        unsafe { n_out.write(c.n_embd) };
        if capacity < c.n_embd {
            return Err(Fail(
                BITNET_ERR_BUFFER,
                format!(
                    "the vector needs {} floats; capacity is {capacity}",
                    c.n_embd
                ),
            ));
        }
        let out = not_null(out, "out")?.cast_mut();
        let v = engine
            .embed(std::slice::from_ref(&input), &opts)
            .map_err(engine_err)?
            .pop()
            .unwrap_or_default();
        if v.len() != c.n_embd {
            return Err(Fail(
                BITNET_ERR_ENGINE,
                format!("expected {} values, got {}", c.n_embd, v.len()),
            ));
        }
        // SAFETY: room for `capacity` >= n_embd floats; distinct allocations.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, v.len()) };
        Ok(())
    })
}

/// `vector` (`n` floats, such as `bitnet_embed` writes) quantized to `bits` per value (8, 4,
/// 2 or 1; docs/MODEL.md, "Embedding quantization"): the codes packed `bits` at a time (two's
/// complement, the first value in each byte's highest bits) to `packed`, their byte count
/// `(n · bits + 7) / 8` to `*n_packed` and what one step of the codes is worth to `*scale`.
/// If `capacity` is too small nothing is written to `packed` and the call fails with
/// `BITNET_ERR_BUFFER` (pass capacity 0 to ask for the count); another width is
/// `BITNET_ERR_INVALID`.
///
/// # Safety
/// `vector` has `n` readable floats; `packed` is null (capacity 0) or has room for
/// `capacity` bytes; `n_packed` and `scale` are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bitnet_embed_quantize(
    vector: *const f32,
    n: usize,
    bits: u32,
    packed: *mut u8,
    capacity: usize,
    n_packed: *mut usize,
    scale: *mut f32,
) -> i32 {
    guard(|| {
        let n_packed = not_null(n_packed, "n_packed")?.cast_mut();
        let scale = not_null(scale, "scale")?.cast_mut();
        // SAFETY: `n` readable floats (the caller's contract).
        let v = unsafe { c_slice(vector, n, "vector") }?;
        let q = ::bitnet_engine::quantize_embedding(v, bits).map_err(|e| invalid(e.to_string()))?;
        let bytes = q.packed();
        // SAFETY: writable (the caller's contract).
        unsafe {
            n_packed.write(bytes.len());
            scale.write(q.scale);
        }
        if capacity < bytes.len() {
            return Err(Fail(
                BITNET_ERR_BUFFER,
                format!(
                    "the codes need {} bytes; capacity is {capacity}",
                    bytes.len()
                ),
            ));
        }
        let out = not_null(packed, "packed")?.cast_mut();
        // SAFETY: room for `capacity` >= bytes.len() bytes; distinct allocations.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out, bytes.len()) };
        Ok(())
    })
}

/// Speeds of the last generation and memory use.
///
/// # Safety
/// `engine` is a live handle; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bitnet_stats_get(
    engine: *const bitnet_engine,
    out: *mut bitnet_stats,
) -> i32 {
    guard(|| {
        let out = not_null(out, "out")?.cast_mut();
        // SAFETY: a live handle (the caller's contract).
        let g = unsafe { lock(engine) }?;
        let s = bitnet_stats {
            last: g.last,
            peak_rss_bytes: ::bitnet_engine::sys::peak_rss_bytes().unwrap_or(0),
            kv_cache_bytes: u64_of(g.session.kv_bytes()),
            model_file_bytes: g.engine.file_size(),
        };
        // SAFETY: writable (the caller's contract).
        unsafe { out.write(s) };
        Ok(())
    })
}

/// A new sampler with the sampling fields of `params` (null: the defaults).
///
/// # Safety
/// `params` is null or valid; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bitnet_sampler_new(
    params: *const bitnet_gen_params,
    out: *mut *mut bitnet_sampler,
) -> i32 {
    guard(|| {
        let out = not_null(out, "out")?.cast_mut();
        // SAFETY: writable (the caller's contract).
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: null or valid (the caller's contract).
        let p = unsafe { params_or_default(params) }?;
        let s = Sampler::new(sampler_params(&p)?).map_err(|e| invalid(e.to_string()))?;
        // SAFETY: writable (the caller's contract).
        unsafe { out.write(Box::into_raw(Box::new(bitnet_sampler { inner: s }))) };
        Ok(())
    })
}

/// Chooses a token from `n` logits (penalties, top-k, top-p, min-p, temperature, then a
/// seeded draw; greedy at temperature <= 0). Does not record it: call
/// `bitnet_sampler_accept` with the token you keep.
///
/// # Safety
/// `sampler` is a live handle; `logits` has `n` values; `out_token` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bitnet_sampler_sample(
    sampler: *mut bitnet_sampler,
    logits: *const f32,
    n: usize,
    out_token: *mut u32,
) -> i32 {
    guard(|| {
        let s = not_null(sampler, "sampler")?.cast_mut();
        let out_token = not_null(out_token, "out_token")?.cast_mut();
        // SAFETY: `n` readable values (the caller's contract).
        let logits = unsafe { c_slice(logits, n, "logits") }?;
        // SAFETY: a live handle, not used by another thread (the caller's contract).
        let s = unsafe { &mut *s };
        let t = s.inner.sample(logits).map_err(|e| invalid(e.to_string()))?;
        // SAFETY: writable (the caller's contract).
        unsafe { out_token.write(t) };
        Ok(())
    })
}

/// Records a token (generated or from the prompt) for the penalties.
///
/// # Safety
/// `sampler` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bitnet_sampler_accept(sampler: *mut bitnet_sampler, token: u32) -> i32 {
    guard(|| {
        let s = not_null(sampler, "sampler")?.cast_mut();
        // SAFETY: a live handle, not used by another thread (the caller's contract).
        unsafe { &mut *s }.inner.accept(token);
        Ok(())
    })
}

/// Releases a sampler (null is ignored).
///
/// # Safety
/// `sampler` is null or a live handle from `bitnet_sampler_new`, not used elsewhere.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bitnet_sampler_free(sampler: *mut bitnet_sampler) {
    if sampler.is_null() {
        return;
    }
    // SAFETY: from `Box::into_raw` in `bitnet_sampler_new`, freed once (the caller's
    // contract). Dropping a sampler cannot panic.
    drop(unsafe { Box::from_raw(sampler) });
}
