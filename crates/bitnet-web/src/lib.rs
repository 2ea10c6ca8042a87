//! The engine for the web: what `wasm-bindgen` exports to JavaScript.
//!
//! JavaScript sees two classes (the npm package's `bitnet.js` wraps them in the documented
//! `Model` API; `scripts/build-web` builds the package):
//!
//! - [`Loader`]: the model file's bytes, pushed in chunks as they arrive (a fetch, a `File`,
//!   a cache entry), into one buffer reserved up front, so the page never holds the file
//!   twice; `finish` turns them into a model.
//! - [`WebModel`]: tokenize, logits of the last position, and a generation taken one token
//!   at a time (`start`, `next`, `finish`), so the caller returns to its event loop between
//!   tokens (streaming, a Stop button). The forward pass runs on the CPU kernels or, through
//!   the browser's WebGPU, on the GPU backend; the calls that may wait on the GPU return
//!   Promises.
//!
//! Every failure is a JavaScript `Error` carrying the engine's message. The same code
//! compiles natively, where its tests run.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use bitnet_engine::{
    ContextPolicy, Device, Engine, GenParams, Generation, LmHeadFormat, LoadOptions, Session,
};
use bitnet_gguf::{GgufFile, Limits};
use bitnet_model::{Numerics, Outputs};
use bitnet_sampling::SamplerParams;
use bitnet_tokenizer::{ChatMessage, ChatRole};
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;

/// An error as JavaScript sees it: an `Error` whose message is the engine's.
type JsResult<T> = Result<T, JsError>;

fn err(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

/// A JavaScript number that is a whole number from 0 to 2^53 (every such number is exact).
fn js_uint(v: f64) -> Option<u64> {
    if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= 9_007_199_254_740_992.0 {
        // Checked just above: whole, in range, so the conversion is exact.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Some(v as u64)
    } else {
        None
    }
}

/// The model file, arriving in chunks: gathered in memory (the CPU runs it from there), or
/// streamed onto WebGPU's device as it comes ([`Loader::stream_to_gpu`]).
#[wasm_bindgen]
#[derive(Debug)]
pub struct Loader {
    kind: LoaderKind,
}

#[derive(Debug)]
enum LoaderKind {
    /// The whole file, in one buffer reserved up front.
    Bytes(Vec<u8>),
    /// Each block uploaded as soon as its bytes are in; the file is never held whole.
    Gpu(Box<bitnet_engine::GpuStream>),
}

#[wasm_bindgen]
impl Loader {
    /// An empty loader with room for `size` bytes (the file's size when known, else 0): the
    /// whole buffer is reserved once, so it is never copied while growing.
    #[wasm_bindgen(constructor)]
    pub fn new(size: f64) -> JsResult<Loader> {
        let mut bytes = Vec::new();
        if size != 0.0 {
            let n = file_size(size).map_err(err).and_then(|n| {
                usize::try_from(n)
                    .map_err(|_| err(format!("a model of {size} bytes does not fit in memory")))
            })?;
            bytes.try_reserve_exact(n).map_err(|_| {
                err(format!(
                    "cannot reserve {} MiB for the model: out of memory",
                    n >> 20
                ))
            })?;
        }
        Ok(Loader {
            kind: LoaderKind::Bytes(bytes),
        })
    }

    /// A Promise of a loader that uploads a file of `size` bytes to WebGPU's device as its
    /// bytes arrive, holding only the block being gathered (`options`: see
    /// [`ModelOptions`]; the device is WebGPU's). Rejects when WebGPU cannot be opened or
    /// the options ask for what the GPU does not run.
    #[wasm_bindgen(js_name = streamToGpu)]
    pub fn stream_to_gpu(size: f64, options: JsValue) -> js_sys::Promise {
        promise(async move {
            let n = file_size(size)?;
            let o: ModelOptions = options_of(options)?;
            let mut opts = load_options(&o)?;
            opts.device = Device::Gpu;
            let s = bitnet_engine::GpuStream::new_async(n, &opts)
                .await
                .map_err(|e| e.to_string())?;
            Ok(Loader {
                kind: LoaderKind::Gpu(Box::new(s)),
            }
            .into())
        })
    }

    /// Append the next chunk of the file.
    pub fn push(&mut self, chunk: &[u8]) -> JsResult<()> {
        match &mut self.kind {
            LoaderKind::Bytes(bytes) => {
                bytes.try_reserve(chunk.len()).map_err(|_| {
                    err(format!(
                        "out of memory after {} MiB of the model",
                        bytes.len() >> 20
                    ))
                })?;
                bytes.extend_from_slice(chunk);
                Ok(())
            }
            LoaderKind::Gpu(s) => s.push(chunk).map_err(err),
        }
    }

    /// Bytes received so far.
    #[wasm_bindgen(getter)]
    pub fn received(&self) -> f64 {
        match &self.kind {
            LoaderKind::Bytes(b) => b.len() as f64,
            LoaderKind::Gpu(s) => s.received() as f64,
        }
    }

    /// Whether the file streams onto the GPU (else it is gathered in memory).
    #[wasm_bindgen(getter)]
    pub fn streaming(&self) -> bool {
        matches!(self.kind, LoaderKind::Gpu(_))
    }

    /// Parse the file and build the model (`options`: see [`ModelOptions`]; a streaming
    /// loader takes its context size from them, the rest it was opened with); a Promise of
    /// a [`WebModel`] (WebGPU's device is opened asynchronously).
    pub fn finish(self, options: JsValue) -> js_sys::Promise {
        let kind = self.kind;
        promise(async move {
            let o: ModelOptions = options_of(options)?;
            let m = match kind {
                LoaderKind::Bytes(bytes) => WebModel::from_bytes_async(bytes, &o).await?,
                LoaderKind::Gpu(s) => {
                    let engine = s.finish().map_err(|e| e.to_string())?;
                    WebModel::from_engine(engine, &o)?
                }
            };
            Ok(m.into())
        })
    }
}

/// A file size from JavaScript (a whole number of bytes).
fn file_size(size: f64) -> Result<u64, String> {
    js_uint(size).ok_or_else(|| format!("size {size}: give the file's size in bytes, or 0"))
}

/// The engine's load options for `o`.
fn load_options(o: &ModelOptions) -> Result<LoadOptions, String> {
    let lm_head = match o.lm_head.as_deref() {
        None | Some("f16") => LmHeadFormat::File,
        Some("q8_0") => LmHeadFormat::Q8_0,
        Some("q4_0") => LmHeadFormat::Q4_0,
        Some(o) => return Err(format!("lmHead {o:?}: use \"f16\", \"q8_0\" or \"q4_0\"")),
    };
    let numerics: Numerics = match o.numerics.as_deref() {
        None => Numerics::Fast,
        Some(s) => s.parse()?,
    };
    let device = match o.device.as_deref() {
        None | Some("cpu") => Device::Cpu,
        Some("webgpu") => Device::Gpu,
        Some("auto") => Device::Auto,
        Some(o) => return Err(format!("device {o:?}: use \"cpu\", \"webgpu\" or \"auto\"")),
    };
    if o.ctx_size == Some(0) {
        return Err("ctxSize 0: must be at least 1".into());
    }
    Ok(LoadOptions {
        threads: 1,
        numerics,
        lm_head,
        device,
        ..LoadOptions::default()
    })
}

/// What [`Loader::finish`] accepts (all optional).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelOptions {
    /// Context positions of the session (default: the model's, at most 4096).
    pub ctx_size: Option<usize>,
    /// The LM head: `"f16"` (the file's, default), `"q8_0"` or `"q4_0"` (built at load).
    pub lm_head: Option<String>,
    /// `"fast"` (default) or `"exact"`.
    pub numerics: Option<String>,
    /// `"cpu"` (default), `"webgpu"` (the GPU backend through the browser's WebGPU) or
    /// `"auto"` (WebGPU when it can run the model, else the CPU).
    pub device: Option<String>,
}

/// What one generation does (all optional; the defaults are llama.cpp's).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GenerateOptions {
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_k: Option<i32>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<usize>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// A 64-bit seed, as a number (an integer up to 2^53).
    pub seed: Option<f64>,
    pub stop: Option<Vec<String>>,
}

impl GenerateOptions {
    fn params(&self) -> Result<GenParams, String> {
        let d = SamplerParams::default();
        let seed = match self.seed {
            None => d.seed,
            Some(s) => {
                js_uint(s).ok_or_else(|| format!("seed {s}: use an integer from 0 to 2^53"))?
            }
        };
        let sampler = SamplerParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.unwrap_or(d.top_k),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            repeat_last_n: self.repeat_last_n.unwrap_or(d.repeat_last_n),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            seed,
        };
        sampler.validate().map_err(|e| e.to_string())?;
        Ok(GenParams {
            max_tokens: self.max_tokens.unwrap_or(GenParams::default().max_tokens),
            sampler,
            stop: self.stop.clone().unwrap_or_default(),
            // A page's chat ends its reply when the context fills instead of failing.
            context_policy: ContextPolicy::Stop,
            constraint: None,
        })
    }
}

/// One chat message from JavaScript: `{ role, content }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsMessage {
    role: String,
    content: String,
}

/// What [`WebModel::info`] returns.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Info {
    arch: String,
    n_vocab: usize,
    n_ctx: usize,
    n_ctx_train: usize,
    n_layer: usize,
    n_embd: usize,
    bos: Option<u32>,
    eos: Option<u32>,
    device: String,
    isa: &'static str,
    file_bytes: f64,
    /// Whether the weights are in the module's memory (false: streamed onto the GPU).
    host_weights: bool,
    /// The module's linear memory now (it only grows: the peak so far); 0 natively.
    memory_bytes: f64,
}

/// Bytes of the WebAssembly module's linear memory (0 when not compiled to wasm32).
fn memory_bytes() -> f64 {
    #[cfg(target_arch = "wasm32")]
    {
        core::arch::wasm32::memory_size(0) as f64 * 65536.0
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        0.0
    }
}

/// One streamed token: `{ token, text }`.
#[derive(Debug, Serialize)]
struct JsPiece {
    token: u32,
    text: String,
}

/// What ends a generation: `{ text, finishReason, promptTokens, cachedTokens,
/// generatedTokens, promptMs, generationMs }` (`text`: what was held back to the end).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct JsDone {
    text: String,
    finish_reason: &'static str,
    prompt_tokens: usize,
    cached_tokens: usize,
    generated_tokens: usize,
    prompt_ms: f64,
    generation_ms: f64,
}

/// The message of the last panic (a bug: the engine returns errors for bad input), kept by
/// the hook [`start`] installs, so that JavaScript can report it instead of a bare trap.
static LAST_PANIC: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// Runs when the module is instantiated: keep panic messages for [`last_panic`].
#[wasm_bindgen(start)]
pub fn start() {
    std::panic::set_hook(Box::new(|info| {
        if let Ok(mut m) = LAST_PANIC.lock() {
            *m = info.to_string();
        }
    }));
}

/// The message of the last panic, or an empty string.
#[wasm_bindgen(js_name = lastPanic)]
pub fn last_panic() -> String {
    LAST_PANIC.lock().map(|m| m.clone()).unwrap_or_default()
}

/// The kernel tier this module runs (`simd128`, or `simd128-relaxed` in the relaxed-SIMD
/// module).
#[wasm_bindgen(js_name = kernelTier)]
pub fn kernel_tier() -> String {
    bitnet_kernels::isa().name().to_string()
}

/// Whether this module's head dots and attention fuse their multiply-adds (relaxed SIMD's,
/// where the engine rounds them once): then they equal the scalar kernels' bit for bit.
#[wasm_bindgen(js_name = fusedMultiplyAdd)]
pub fn fused_multiply_add() -> bool {
    bitnet_kernels::wasm_fused_madd()
}

/// The module's kernel tier against the scalar kernels, bit for bit, on `rounds` rounds of
/// random ternary matmuls: the number of outputs compared, or an `Error` naming the first
/// difference.
#[wasm_bindgen(js_name = selfTest)]
pub fn self_test(rounds: u32) -> JsResult<f64> {
    let rounds = usize::try_from(rounds).map_err(err)?;
    bitnet_kernels::check::tier_against_scalar(0x5eed, rounds)
        .map(|n| n as f64)
        .map_err(err)
}

fn to_js<T: Serialize>(v: &T) -> Result<JsValue, String> {
    v.serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .map_err(|e| e.to_string())
}

/// An options object from JavaScript (`undefined` or `null`: every default).
fn options_of<T: Default + serde::de::DeserializeOwned>(v: JsValue) -> Result<T, String> {
    if v.is_undefined() || v.is_null() {
        Ok(T::default())
    } else {
        serde_wasm_bindgen::from_value(v).map_err(|e| e.to_string())
    }
}

/// A loaded model with its one session (the KV cache that consecutive calls share).
/// JavaScript holds it while its asynchronous calls run, so its state is shared with them;
/// a call made while another one runs is refused with an Error.
#[wasm_bindgen]
#[derive(Debug, Clone)]
pub struct WebModel {
    inner: Rc<RefCell<Inner>>,
}

#[derive(Debug)]
struct Inner {
    engine: Engine,
    session: Session,
    generation: Option<Generation>,
}

const BUSY: &str = "the model is busy with another call: wait for it first";

impl WebModel {
    /// Build a model from a whole GGUF file in memory (no threads: the pool runs on the
    /// calling thread), blocking (the CPU; see [`WebModel::from_bytes_async`]).
    pub fn from_bytes(bytes: Vec<u8>, o: &ModelOptions) -> Result<WebModel, String> {
        bitnet_gpu::block(Self::from_bytes_async(bytes, o)).map_err(|e| e.to_string())?
    }

    /// [`WebModel::from_bytes`], opening WebGPU's device where `o.device` asks for it.
    pub async fn from_bytes_async(bytes: Vec<u8>, o: &ModelOptions) -> Result<WebModel, String> {
        let opts = load_options(o)?;
        let file = GgufFile::from_bytes(bytes, &Limits::default()).map_err(|e| e.to_string())?;
        let engine = bitnet_engine::load_file_async(Arc::new(file), &opts, &mut |_| {})
            .await
            .map_err(|e| e.to_string())?;
        Self::from_engine(engine, o)
    }

    /// A model over a loaded engine, with its session.
    fn from_engine(engine: Engine, o: &ModelOptions) -> Result<WebModel, String> {
        let n_ctx_train = engine.config().n_ctx_train;
        let n_ctx = o.ctx_size.unwrap_or(4096).min(n_ctx_train).max(1);
        let session = engine.new_session(n_ctx).map_err(|e| e.to_string())?;
        Ok(WebModel {
            inner: Rc::new(RefCell::new(Inner {
                engine,
                session,
                generation: None,
            })),
        })
    }

    /// The model's state, unless another call holds it.
    fn state(&self) -> Result<std::cell::RefMut<'_, Inner>, String> {
        self.inner.try_borrow_mut().map_err(|_| BUSY.to_string())
    }

    /// The model's state to read, unless another call holds it.
    fn view(&self) -> JsResult<std::cell::Ref<'_, Inner>> {
        self.inner.try_borrow().map_err(|_| err(BUSY))
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> Result<T, String>) -> Result<T, String> {
        f(&mut *self.state()?)
    }

    /// The logits of the last position after `ids`, evaluated from the start.
    // The model is held for the whole call: a call made meanwhile is refused (BUSY).
    #[allow(clippy::await_holding_refcell_ref)]
    pub async fn last_logits(&self, ids: &[u32]) -> Result<Vec<f32>, String> {
        if ids.is_empty() {
            return Err(bitnet_engine::EngineError::EmptyPrompt.to_string());
        }
        let mut g = self.state()?;
        let Inner {
            engine,
            session,
            generation,
        } = &mut *g;
        *generation = None;
        session.reset();
        engine
            .eval_async(session, ids, Outputs::Last)
            .await
            .map_err(|e| e.to_string())
    }

    /// Begin generating after `ids` (the cached prefix they share with the session is
    /// reused); the prompt is evaluated here.
    // The model is held for the whole call: a call made meanwhile is refused (BUSY).
    #[allow(clippy::await_holding_refcell_ref)]
    pub async fn start_ids(&self, ids: &[u32], o: &GenerateOptions) -> Result<(), String> {
        let params = o.params()?;
        let mut g = self.state()?;
        let Inner {
            engine,
            session,
            generation,
        } = &mut *g;
        *generation = None;
        let started = engine
            .start_async(session, ids, false, &params)
            .await
            .map_err(|e| e.to_string())?;
        *generation = Some(started);
        Ok(())
    }

    /// The next token of the generation and its text; `None` when it has ended.
    // The model is held for the whole call: a call made meanwhile is refused (BUSY).
    #[allow(clippy::await_holding_refcell_ref)]
    pub async fn next_piece(&self) -> Result<Option<(u32, String)>, String> {
        let mut g = self.state()?;
        let Inner {
            engine,
            session,
            generation,
        } = &mut *g;
        let Some(gen) = generation.as_mut() else {
            return Err("no generation in progress: call start first".into());
        };
        match gen.next_piece_async(engine, session).await {
            Ok(p) => Ok(p.map(|p| (p.token, p.text))),
            Err(e) => {
                *generation = None;
                Err(e.to_string())
            }
        }
    }

    /// End the generation: the text held back and the statistics.
    pub fn finish_generation(&self) -> Result<(String, bitnet_engine::GenStats), String> {
        self.with(|i| {
            i.generation
                .take()
                .map(Generation::finish)
                .ok_or_else(|| "no generation in progress: call start first".to_string())
        })
    }

    /// The tokenizer's ids of a conversation, ready for the assistant's reply.
    pub fn chat_ids(&self, messages: &[(String, String)]) -> Result<Vec<u32>, String> {
        let msgs = messages
            .iter()
            .map(|(role, content)| {
                let role = match role.as_str() {
                    "system" | "developer" => ChatRole::System,
                    "user" => ChatRole::User,
                    "assistant" => ChatRole::Assistant,
                    o => {
                        return Err(format!(
                            "role {o:?}: use \"system\", \"user\" or \"assistant\""
                        ))
                    }
                };
                Ok(ChatMessage::new(role, content.clone()))
            })
            .collect::<Result<Vec<_>, String>>()?;
        self.with(|i| {
            i.engine
                .tokenizer
                .encode_chat(&msgs, true)
                .map_err(|e| e.to_string())
        })
    }
}

/// A Promise of what `f` resolves to, the error an Error with its message.
fn promise<F>(f: F) -> js_sys::Promise
where
    F: std::future::Future<Output = Result<JsValue, String>> + 'static,
{
    wasm_bindgen_futures::future_to_promise(
        async move { f.await.map_err(|e| JsValue::from(err(e))) },
    )
}

#[wasm_bindgen]
impl WebModel {
    /// Facts about the model: `{ arch, nVocab, nCtx, nCtxTrain, nLayer, nEmbd, bos, eos,
    /// device, isa, fileBytes, memoryBytes }`.
    pub fn info(&self) -> JsResult<JsValue> {
        let i = self.view()?;
        let c = i.engine.config();
        to_js(&Info {
            arch: c.arch.clone(),
            n_vocab: c.n_vocab,
            n_ctx: i.session.n_ctx(),
            n_ctx_train: c.n_ctx_train,
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            bos: i.engine.tokenizer.bos(),
            eos: i.engine.tokenizer.eos(),
            device: match i.engine.gpu().map(|g| g.gpu().info().name.as_str()) {
                None => "cpu".to_string(),
                // Browsers may keep the adapter's name to themselves.
                Some("") => "webgpu".to_string(),
                Some(name) => format!("webgpu ({name})"),
            },
            isa: bitnet_kernels::isa().name(),
            file_bytes: i.engine.file_size() as f64,
            host_weights: i.engine.model().is_ok(),
            memory_bytes: memory_bytes(),
        })
        .map_err(err)
    }

    /// Token ids of `text`: BOS first with `addBos` (when the model asks for one),
    /// special-token text parsed as those tokens with `special`.
    pub fn tokenize(&self, text: &str, add_bos: bool, special: bool) -> JsResult<Vec<u32>> {
        let i = self.view()?;
        let t = &i.engine.tokenizer;
        t.encode(text, add_bos && t.add_bos(), special).map_err(err)
    }

    /// The text of `ids`.
    pub fn detokenize(&self, ids: &[u32]) -> JsResult<String> {
        let i = self.view()?;
        i.engine.tokenizer.decode(ids).map_err(err)
    }

    /// The ids of a conversation (`[{ role, content }]`) with the model's chat template,
    /// ending where the assistant's reply begins.
    #[wasm_bindgen(js_name = chatTokens)]
    pub fn chat_tokens(&self, messages: JsValue) -> JsResult<Vec<u32>> {
        let msgs: Vec<JsMessage> = serde_wasm_bindgen::from_value(messages).map_err(err)?;
        let pairs: Vec<(String, String)> = msgs.into_iter().map(|m| (m.role, m.content)).collect();
        self.chat_ids(&pairs).map_err(err)
    }

    /// A Promise of the logits at the last of `ids` (a `Float32Array` of `nVocab`).
    pub fn logits(&self, ids: Vec<u32>) -> js_sys::Promise {
        let m = self.clone();
        promise(async move {
            let l = m.last_logits(&ids).await?;
            Ok(js_sys::Float32Array::from(l.as_slice()).into())
        })
    }

    /// Begin a generation after `ids` (`options`: see [`GenerateOptions`]): a Promise that
    /// resolves once the prompt is evaluated.
    pub fn start(&self, ids: Vec<u32>, options: JsValue) -> js_sys::Promise {
        let m = self.clone();
        promise(async move {
            let o: GenerateOptions = options_of(options)?;
            m.start_ids(&ids, &o).await?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// A Promise of the next token, `{ token, text }`, or `null` once the generation has
    /// ended.
    #[wasm_bindgen(js_name = next)]
    pub fn next_token(&self) -> js_sys::Promise {
        let m = self.clone();
        promise(async move {
            match m.next_piece().await? {
                Some((token, text)) => to_js(&JsPiece { token, text }),
                None => Ok(JsValue::NULL),
            }
        })
    }

    /// End the generation (a Stop, or after `next` gave `null`): the text held back to the
    /// end and the statistics.
    pub fn finish(&self) -> JsResult<JsValue> {
        let (text, s) = self.finish_generation().map_err(err)?;
        to_js(&JsDone {
            text,
            // OpenAI's reasons, but a Stop is told apart from the text's own end.
            finish_reason: match s.finish {
                bitnet_engine::FinishReason::Cancelled => "cancelled",
                f => f.as_openai(),
            },
            prompt_tokens: s.prompt_tokens,
            cached_tokens: s.cached_tokens,
            generated_tokens: s.generated_tokens,
            prompt_ms: s.prompt_time.as_secs_f64() * 1e3,
            generation_ms: s.generation_time.as_secs_f64() * 1e3,
        })
        .map_err(err)
    }

    /// Forget the session's cache (the next generation evaluates its whole prompt).
    pub fn reset(&self) -> JsResult<()> {
        self.with(|i| {
            i.generation = None;
            i.session.reset();
            Ok(())
        })
        .map_err(err)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn tiny() -> WebModel {
        let bytes = bitnet_testdata::read("tiny/bitnet-tiny-i2_s.gguf");
        WebModel::from_bytes(bytes, &ModelOptions::default()).unwrap()
    }

    fn now<F: std::future::Future>(f: F) -> F::Output {
        bitnet_gpu::block(f).unwrap()
    }

    /// A generation taken token by token gives what the engine's own loop gives.
    #[test]
    fn stepped_generation_is_the_engines_generation() {
        let m = tiny();
        let ids = m
            .with(|i| {
                i.engine
                    .tokenizer
                    .encode("Once upon a time", true, false)
                    .map_err(|e| e.to_string())
            })
            .unwrap();
        let o = GenerateOptions {
            max_tokens: Some(20),
            temperature: Some(0.0),
            ..Default::default()
        };
        now(m.start_ids(&ids, &o)).unwrap();
        let mut text = String::new();
        let mut tokens = Vec::new();
        while let Some((t, piece)) = now(m.next_piece()).unwrap() {
            tokens.push(t);
            text.push_str(&piece);
        }
        let (tail, stats) = m.finish_generation().unwrap();
        text.push_str(&tail);
        assert_eq!(stats.generated_tokens, tokens.len());

        let i = m.inner.borrow();
        let mut s = i.engine.new_session(512).unwrap();
        let mut want = String::new();
        let mut want_tokens = Vec::new();
        i.engine
            .generate(&mut s, &ids, false, &o.params().unwrap(), &mut |e| {
                match e {
                    bitnet_engine::Event::Token(t) => want_tokens.push(t),
                    bitnet_engine::Event::Text(t) => want.push_str(t),
                }
                true
            })
            .unwrap();
        assert_eq!(tokens, want_tokens);
        assert_eq!(text, want);
    }

    #[test]
    fn bad_files_and_options_are_errors() {
        let e = WebModel::from_bytes(b"not a model at all".to_vec(), &ModelOptions::default());
        assert!(e.is_err());
        let bytes = bitnet_testdata::read("tiny/bitnet-tiny-i2_s.gguf");
        let half = bytes[..bytes.len() / 2].to_vec();
        assert!(WebModel::from_bytes(half, &ModelOptions::default()).is_err());
        let o = ModelOptions {
            lm_head: Some("q9".into()),
            ..Default::default()
        };
        assert!(WebModel::from_bytes(bytes.clone(), &o)
            .unwrap_err()
            .contains("lmHead"));
        let o = ModelOptions {
            ctx_size: Some(0),
            ..Default::default()
        };
        assert!(WebModel::from_bytes(bytes, &o).is_err());
        for bad in [-1.0, 0.5, f64::NAN, 1e300] {
            let o = GenerateOptions {
                seed: Some(bad),
                ..Default::default()
            };
            assert!(o.params().unwrap_err().contains("seed"), "{bad}");
        }
        let o = GenerateOptions {
            top_p: Some(2.0),
            ..Default::default()
        };
        assert!(o.params().is_err());
        let m = tiny();
        assert!(now(m.last_logits(&[])).is_err());
        assert!(now(m.last_logits(&[u32::MAX])).is_err());
        assert!(now(m.next_piece()).is_err(), "no generation started");
        let o = ModelOptions {
            device: Some("tpu".into()),
            ..Default::default()
        };
        let bytes = bitnet_testdata::read("tiny/bitnet-tiny-i2_s.gguf");
        assert!(WebModel::from_bytes(bytes, &o)
            .unwrap_err()
            .contains("device"));
        assert!(m
            .chat_ids(&[("robot".into(), "hi".into())])
            .unwrap_err()
            .contains("role"));
    }

    #[test]
    fn js_numbers_that_are_whole_and_in_range() {
        assert_eq!(js_uint(0.0), Some(0));
        assert_eq!(js_uint(4096.0), Some(4096));
        assert_eq!(js_uint(9_007_199_254_740_992.0), Some(1 << 53));
        for bad in [-1.0, 0.5, f64::NAN, f64::INFINITY, 1e17] {
            assert_eq!(js_uint(bad), None, "{bad}");
        }
    }
}
