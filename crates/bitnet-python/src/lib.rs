//! `bitnet_rs._native`: the engine behind the `bitnet_rs` Python package
//! (`python/bitnet_rs/__init__.py` builds the user-facing API on it).
//!
//! Generation runs on a thread of its own and streams its text through a channel; the
//! Python side waits for it with the GIL released, so other Python threads keep running.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};

use ::bitnet_engine::tools::{call_text, ToolCallParser, ToolEvent, ToolSet};
use ::bitnet_engine::{
    Constraint, ContextPolicy, Engine, EngineError, Event, FinishReason, GenParams, LmHeadFormat,
    LoadOptions, Session,
};
use bitnet_model::{KvType, Numerics, Outputs};
use bitnet_sampling::SamplerParams;
use bitnet_tokenizer::{ChatMessage, ChatRole, Tokenizer};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

create_exception!(
    _native,
    BitnetError,
    PyException,
    "A model that cannot be loaded, or an evaluation that failed."
);

fn engine_err(e: EngineError) -> PyErr {
    BitnetError::new_err(e.to_string())
}

struct Inner {
    engine: Engine,
    session: Session,
}

/// A loaded model and one session (its KV cache, reused across calls that share a
/// prefix).
#[pyclass(frozen, module = "bitnet_rs._native")]
struct NativeModel {
    inner: Arc<Mutex<Inner>>,
    tokenizer: Arc<Tokenizer>,
    n_vocab: usize,
    n_ctx: usize,
    n_ctx_train: usize,
    /// Checks constraints when a generation is asked for (built at the first one).
    grammars: std::sync::OnceLock<Result<bitnet_engine::Grammars, String>>,
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    // A panic during a generation left the session in an unknown state: start over.
    m.lock().unwrap_or_else(|p| {
        let mut g = p.into_inner();
        g.session.reset();
        g
    })
}

#[allow(clippy::too_many_arguments)]
fn parse_options(
    n_threads: Option<usize>,
    n_ctx: Option<usize>,
    numerics: &str,
    kv_cache: Option<&str>,
    lm_head: &str,
    device: &str,
    ram_budget: Option<u64>,
    in_memory: bool,
    screen_head: bool,
) -> PyResult<LoadOptions> {
    let numerics = match numerics {
        "fast" => Numerics::Fast,
        "exact" => Numerics::Exact,
        o => {
            return Err(PyValueError::new_err(format!(
                "numerics={o:?}: use \"fast\" or \"exact\""
            )))
        }
    };
    let kv_type = match kv_cache.unwrap_or("f16") {
        "f16" => KvType::F16,
        "f32" => KvType::F32,
        "q8_0" => KvType::Q8_0,
        "q4_0" => KvType::Q4_0,
        o => {
            return Err(PyValueError::new_err(format!(
                "kv_cache={o:?}: use \"f16\", \"f32\", \"q8_0\" or \"q4_0\""
            )))
        }
    };
    let lm_head = match lm_head {
        "f16" | "file" => LmHeadFormat::File,
        "q8_0" => LmHeadFormat::Q8_0,
        "q6_k" => LmHeadFormat::Q6K,
        "q4_0" => LmHeadFormat::Q4_0,
        "approx" => LmHeadFormat::Approx(Default::default()),
        o => {
            return Err(PyValueError::new_err(format!(
                "lm_head={o:?}: use \"f16\", \"q8_0\", \"q6_k\", \"q4_0\" or \"approx\""
            )))
        }
    };
    let device = match device {
        "cpu" => ::bitnet_engine::Device::Cpu,
        "gpu" => ::bitnet_engine::Device::Gpu,
        "auto" => ::bitnet_engine::Device::Auto,
        o => {
            return Err(PyValueError::new_err(format!(
                "device={o:?}: use \"cpu\", \"gpu\" or \"auto\""
            )))
        }
    };
    let threads = match n_threads {
        None => ::bitnet_engine::sys::default_threads(),
        Some(n) if (1..=1024).contains(&n) => n,
        Some(n) => {
            return Err(PyValueError::new_err(format!(
                "n_threads={n}: must be in 1..=1024"
            )))
        }
    };
    let opts = LoadOptions {
        threads,
        numerics,
        kv_type,
        lm_head,
        device,
        in_memory,
        screen_head,
        budget: ram_budget.map(|bytes| ::bitnet_engine::budget::BudgetRequest {
            bytes,
            n_ctx,
            kv_type_explicit: kv_cache.is_some(),
            stream: ::bitnet_engine::budget::StreamMode::default(),
            reserve_bytes: 0,
        }),
        ..LoadOptions::default()
    };
    if ram_budget == Some(0) {
        return Err(PyValueError::new_err(
            "ram_budget=0: give a size in bytes, or None",
        ));
    }
    opts.validate()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(opts)
}

/// The [`ToolSet`] of OpenAI's `tools` and `tool_choice` (JSON text) and
/// `parallel_tool_calls`; None where they ask for no calls. Bad tools are `ValueError`.
fn tool_set(
    tools: &str,
    tool_choice: Option<&str>,
    parallel: Option<bool>,
) -> PyResult<Option<ToolSet>> {
    let json = |field: &str, t: &str| {
        serde_json::from_str::<serde_json::Value>(t)
            .map_err(|e| PyValueError::new_err(format!("{field}: {e}")))
    };
    let tools = json("tools", tools)?;
    let choice = tool_choice.map(|c| json("tool_choice", c)).transpose()?;
    ToolSet::from_openai(&tools, choice.as_ref(), parallel)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The constraint of a `("tools", text)` pair: `text` is a JSON object with `tools` and
/// `tool_choice` (JSON values, the latter may be null) and `parallel_tool_calls` (a bool or
/// null), as [`NativeModel::chat_tokens_tools`] took them.
fn tools_constraint(text: &str) -> PyResult<Constraint> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| PyValueError::new_err(format!("tools: {e}")))?;
    let field = |k: &str| v.get(k).filter(|x| !x.is_null());
    let tools = field("tools").ok_or_else(|| PyValueError::new_err("tools: no `tools`"))?;
    let parallel = match field("parallel_tool_calls") {
        None => None,
        Some(serde_json::Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(PyValueError::new_err(
                "parallel_tool_calls must be a bool or None",
            ))
        }
    };
    ToolSet::from_openai(tools, field("tool_choice"), parallel)
        .map_err(|e| PyValueError::new_err(e.to_string()))?
        .and_then(|set| set.constraint())
        .ok_or_else(|| PyValueError::new_err("tools: these tools ask for no constraint"))
}

fn chat_role(r: &str) -> PyResult<ChatRole> {
    match r {
        "system" | "developer" => Ok(ChatRole::System),
        "user" => Ok(ChatRole::User),
        "assistant" => Ok(ChatRole::Assistant),
        "tool" => Ok(ChatRole::Tool),
        o => Err(PyValueError::new_err(format!(
            "role {o:?}: use \"system\", \"user\", \"assistant\" or \"tool\""
        ))),
    }
}

#[pymethods]
impl NativeModel {
    #[new]
    #[pyo3(signature = (path, n_threads=None, n_ctx=None, numerics="fast", kv_cache=None, lm_head="f16", device="cpu", ram_budget=None, in_memory=false, screen_head=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        n_threads: Option<usize>,
        n_ctx: Option<usize>,
        numerics: &str,
        kv_cache: Option<&str>,
        lm_head: &str,
        device: &str,
        ram_budget: Option<u64>,
        in_memory: bool,
        screen_head: bool,
    ) -> PyResult<Self> {
        let opts = parse_options(
            n_threads,
            n_ctx,
            numerics,
            kv_cache,
            lm_head,
            device,
            ram_budget,
            in_memory,
            screen_head,
        )?;
        if n_ctx == Some(0) {
            return Err(PyValueError::new_err("n_ctx=0: must be at least 1"));
        }
        let engine = py
            .detach(|| ::bitnet_engine::load(&path, &opts, &mut |_| {}))
            .map_err(engine_err)?;
        let n_ctx_train = engine.config().n_ctx_train;
        let n_ctx = match engine.plan() {
            Some(p) => p.n_ctx,
            None => n_ctx.unwrap_or(n_ctx_train.min(4096)).min(n_ctx_train),
        };
        let session = engine.new_session(n_ctx).map_err(engine_err)?;
        Ok(NativeModel {
            tokenizer: Arc::new(engine.tokenizer.clone()),
            n_vocab: engine.config().n_vocab,
            n_ctx: session.n_ctx(),
            n_ctx_train,
            inner: Arc::new(Mutex::new(Inner { engine, session })),
            grammars: std::sync::OnceLock::new(),
        })
    }

    #[getter]
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    #[getter]
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    #[getter]
    fn n_ctx_train(&self) -> usize {
        self.n_ctx_train
    }

    #[getter]
    fn bos(&self) -> Option<u32> {
        self.tokenizer.bos()
    }

    #[getter]
    fn eos(&self) -> Option<u32> {
        self.tokenizer.eos()
    }

    /// Token ids of `text` (BOS first with `add_bos`; special-token text parsed with
    /// `special`).
    #[pyo3(signature = (text, add_bos=true, special=false))]
    fn tokenize(
        &self,
        py: Python<'_>,
        text: &str,
        add_bos: bool,
        special: bool,
    ) -> PyResult<Vec<u32>> {
        let tok = &self.tokenizer;
        let text = text.to_owned();
        py.detach(|| tok.encode(&text, add_bos && tok.add_bos(), special))
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The ids of a chat in the model's format, ending with the assistant's turn opener.
    fn chat_tokens(&self, messages: Vec<(String, String)>) -> PyResult<Vec<u32>> {
        let msgs = messages
            .into_iter()
            .map(|(r, c)| Ok(ChatMessage::new(chat_role(&r)?, c)))
            .collect::<PyResult<Vec<_>>>()?;
        self.tokenizer
            .encode_chat(&msgs, true)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// [`NativeModel::chat_tokens`] with OpenAI's `tools` (JSON text), `tool_choice` (JSON
    /// text or None) and `parallel_tool_calls`: the tool definitions join the system
    /// message; returns the ids and the grammar (llguidance Lark) that holds the reply to
    /// text or calls (None when `tool_choice` is "none"). Bad tools are `ValueError`.
    #[pyo3(signature = (messages, tools, tool_choice=None, parallel=None))]
    fn chat_tokens_tools(
        &self,
        messages: Vec<(String, String)>,
        tools: &str,
        tool_choice: Option<&str>,
        parallel: Option<bool>,
    ) -> PyResult<(Vec<u32>, Option<String>)> {
        let set = tool_set(tools, tool_choice, parallel)?;
        let mut msgs = messages
            .into_iter()
            .map(|(r, c)| Ok(ChatMessage::new(chat_role(&r)?, c)))
            .collect::<PyResult<Vec<_>>>()?;
        if let Some(set) = &set {
            set.apply_to(&mut msgs);
        }
        let ids = self
            .tokenizer
            .encode_chat(&msgs, true)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let grammar = match set.and_then(|s| s.constraint()) {
            Some(Constraint::Lark(g)) => Some(g),
            _ => None,
        };
        Ok((ids, grammar))
    }

    /// The text of `ids` (bytes that are not valid UTF-8 become U+FFFD).
    fn detokenize(&self, ids: Vec<u32>) -> PyResult<String> {
        self.tokenizer
            .decode(&ids)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The raw bytes of one token.
    fn token_bytes(&self, id: u32) -> PyResult<Vec<u8>> {
        self.tokenizer
            .token_bytes(id)
            .map(<[u8]>::to_vec)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Logits of the last position of `ids` (a 1-D float32 array), or with `all` of every
    /// position (2-D, one row per id).
    #[pyo3(signature = (ids, all=false))]
    fn logits<'py>(
        &self,
        py: Python<'py>,
        ids: Vec<u32>,
        all: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        if ids.is_empty() {
            return Err(PyValueError::new_err("ids is empty"));
        }
        if let Some(bad) = ids
            .iter()
            .find(|&&t| usize::try_from(t).map_or(true, |t| t >= self.n_vocab))
        {
            return Err(PyValueError::new_err(format!(
                "token id {bad} is not below n_vocab={}",
                self.n_vocab
            )));
        }
        if ids.len() > self.n_ctx {
            return Err(PyValueError::new_err(format!(
                "{} ids do not fit in the context of {}",
                ids.len(),
                self.n_ctx
            )));
        }
        let inner = Arc::clone(&self.inner);
        let n = ids.len();
        let out = py
            .detach(move || {
                let mut g = lock(&inner);
                let Inner { engine, session } = &mut *g;
                if all {
                    session.reset();
                    engine.eval(session, &ids, Outputs::All)
                } else {
                    let common = session
                        .tokens()
                        .iter()
                        .zip(&ids)
                        .take_while(|(a, b)| a == b)
                        .count()
                        .min(ids.len() - 1);
                    session.truncate(common);
                    engine.eval(session, &ids[common..], Outputs::Last)
                }
            })
            .map_err(engine_err)?;
        let arr = PyArray1::from_vec(py, out);
        if all {
            Ok(arr.reshape([n, self.n_vocab])?.into_any())
        } else {
            Ok(arr.into_any())
        }
    }

    /// Embeddings of `inputs` (texts, or lists of token ids used as given), one float32 row
    /// each (2-D array, `len(inputs)` × n_embd): the file's pooling (or `pooling`: "none",
    /// "mean", "cls", "last"), L2-normalized unless `normalize` is false. With "none" each
    /// input must be alone and its rows are the positions. Texts are tokenized as
    /// `bitnet embed` does (BOS where the vocabulary adds it, EOS where the file asks).
    /// Returns the vectors and the number of tokens read.
    #[pyo3(signature = (inputs, normalize=true, pooling=None))]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Bound<'py, PyAny>>,
        normalize: bool,
        pooling: Option<&str>,
    ) -> PyResult<(Bound<'py, PyAny>, usize)> {
        let pooling = pooling
            .map(str::parse::<bitnet_model::Pooling>)
            .transpose()
            .map_err(PyValueError::new_err)?;
        if inputs.is_empty() {
            return Err(PyValueError::new_err("no inputs"));
        }
        let mut ids: Vec<Vec<u32>> = Vec::with_capacity(inputs.len());
        for (i, item) in inputs.iter().enumerate() {
            let t: Vec<u32> = if let Ok(text) = item.extract::<String>() {
                if text.is_empty() {
                    return Err(PyValueError::new_err(format!(
                        "input {i} is an empty string"
                    )));
                }
                bitnet_engine::embed_tokens(&self.tokenizer, &text)
                    .map_err(|e| PyValueError::new_err(format!("input {i}: {e}")))?
            } else if let Ok(list) = item.extract::<Vec<u32>>() {
                list
            } else {
                return Err(PyValueError::new_err(format!(
                    "input {i} is neither a string nor a list of token ids"
                )));
            };
            if t.is_empty() {
                return Err(PyValueError::new_err(format!("input {i} has no tokens")));
            }
            if let Some(bad) = t
                .iter()
                .find(|&&x| usize::try_from(x).map_or(true, |x| x >= self.n_vocab))
            {
                return Err(PyValueError::new_err(format!(
                    "input {i}: token id {bad} is not below n_vocab={}",
                    self.n_vocab
                )));
            }
            if t.len() > self.n_ctx {
                return Err(PyValueError::new_err(format!(
                    "input {i} has {} tokens; the context holds {}",
                    t.len(),
                    self.n_ctx
                )));
            }
            ids.push(t);
        }
        let per_position = pooling == Some(bitnet_model::Pooling::None);
        if per_position && ids.len() != 1 {
            return Err(PyValueError::new_err(
                "pooling \"none\" gives one row per position: embed one input at a time",
            ));
        }
        let n_tokens: usize = ids.iter().map(Vec::len).sum();
        let inner = Arc::clone(&self.inner);
        let opts = bitnet_engine::EmbedOptions {
            pooling,
            raw: !normalize,
        };
        let rows = py
            .detach(move || lock(&inner).engine.embed(&ids, &opts))
            .map_err(engine_err)?;
        let n_rows = if per_position { n_tokens } else { rows.len() };
        let flat: Vec<f32> = rows.into_iter().flatten().collect();
        let width = flat.len() / n_rows.max(1);
        let arr = PyArray1::from_vec(py, flat).reshape([n_rows, width])?;
        Ok((arr.into_any(), n_tokens))
    }

    /// Starts generating after `prompt` (token ids); returns a [`Stream`] of text pieces.
    /// `constraint`: `(kind, text)` with kind `json_schema` (the schema as JSON text),
    /// `json_object`, `grammar` (llguidance Lark), `regex` or `tools` (the calls' grammar of
    /// the tools, see `tools_constraint`); checked here (`ValueError`).
    #[pyo3(signature = (prompt, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty, seed, stop, constraint=None))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        prompt: Vec<u32>,
        max_tokens: usize,
        temperature: f32,
        top_k: i32,
        top_p: f32,
        min_p: f32,
        repeat_penalty: f32,
        repeat_last_n: usize,
        presence_penalty: f32,
        frequency_penalty: f32,
        seed: u64,
        stop: Vec<String>,
        constraint: Option<(String, String)>,
    ) -> PyResult<Stream> {
        if max_tokens == 0 {
            return Err(PyValueError::new_err("max_tokens must be at least 1"));
        }
        if prompt.is_empty() {
            return Err(PyValueError::new_err("the prompt has no tokens"));
        }
        if prompt.len() >= self.n_ctx {
            return Err(PyValueError::new_err(format!(
                "the prompt has {} tokens; the context holds {}",
                prompt.len(),
                self.n_ctx
            )));
        }
        if let Some(bad) = prompt
            .iter()
            .find(|&&t| usize::try_from(t).map_or(true, |t| t >= self.n_vocab))
        {
            return Err(PyValueError::new_err(format!(
                "token id {bad} is not below n_vocab={}",
                self.n_vocab
            )));
        }
        let sampler = SamplerParams {
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            repeat_last_n,
            presence_penalty,
            frequency_penalty,
            seed,
        };
        sampler
            .validate()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let constraint = match constraint {
            None => None,
            Some((kind, text)) => {
                let c = match kind.as_str() {
                    "json_schema" => Constraint::JsonSchema(
                        serde_json::from_str(&text)
                            .map_err(|e| PyValueError::new_err(format!("json_schema: {e}")))?,
                    ),
                    "json_object" => Constraint::JsonObject,
                    "grammar" => Constraint::grammar_text(&text)
                        .map_err(|e| PyValueError::new_err(e.to_string()))?,
                    "regex" => Constraint::Regex(text),
                    // The tool-call grammar is rebuilt here from the tools themselves (it is
                    // the engine's own, so it skips the checks a user's grammar gets).
                    "tools" => tools_constraint(&text)?,
                    other => {
                        return Err(PyValueError::new_err(format!(
                            "unknown constraint kind {other:?}"
                        )))
                    }
                };
                let g = self.grammars.get_or_init(|| {
                    bitnet_engine::Grammars::new(&self.tokenizer).map_err(|e| e.to_string())
                });
                // Compiled once, here (a bad schema is a ValueError now); the generation
                // runs under this state.
                match g {
                    Ok(g) => Some(
                        g.start(&c)
                            .map_err(|e| PyValueError::new_err(e.to_string()))?,
                    ),
                    Err(e) => return Err(BitnetError::new_err(e.clone())),
                }
            }
        };
        let params = GenParams {
            max_tokens,
            sampler,
            stop,
            context_policy: ContextPolicy::Stop,
            constraint: None,
        };
        let (tx, rx) = channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let inner = Arc::clone(&self.inner);
        let stop_flag = Arc::clone(&cancel);
        let n_prompt = prompt.len();
        std::thread::Builder::new()
            .name("bitnet-generate".into())
            .spawn(move || {
                let mut g = lock(&inner);
                let Inner { engine, session } = &mut *g;
                let mut tokens = Vec::new();
                let r = engine.generate_compiled(
                    session,
                    &prompt,
                    false,
                    &params,
                    constraint,
                    &mut |e| {
                        match e {
                            Event::Token(t) => tokens.push(t),
                            Event::Text(t) => {
                                if tx.send(Msg::Text(t.to_string())).is_err() {
                                    return false;
                                }
                            }
                        }
                        !stop_flag.load(Ordering::Relaxed)
                    },
                );
                let _ = tx.send(Msg::Done(r.map(|s| (s, tokens)).map_err(|e| e.to_string())));
            })
            .map_err(|e| BitnetError::new_err(format!("cannot start a generation thread: {e}")))?;
        Ok(Stream {
            rx: Mutex::new(Some(rx)),
            cancel,
            state: Mutex::new(StreamState {
                n_prompt,
                ..StreamState::default()
            }),
        })
    }
}

enum Msg {
    Text(String),
    Done(Result<(::bitnet_engine::GenStats, Vec<u32>), String>),
}

#[derive(Default)]
struct StreamState {
    done: bool,
    finish: Option<&'static str>,
    n_prompt: usize,
    tokens: Vec<u32>,
    cached: usize,
    prompt_tok_s: f64,
    gen_tok_s: f64,
}

/// Text pieces of a running generation (an iterator). Dropping it, or `close()`, stops
/// the generation.
#[pyclass(frozen, module = "bitnet_rs._native")]
struct Stream {
    /// Taken out while a `__next__` waits on it (a `Receiver` is `Send` but not `Sync`).
    rx: Mutex<Option<Receiver<Msg>>>,
    cancel: Arc<AtomicBool>,
    state: Mutex<StreamState>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let poisoned = || BitnetError::new_err("the stream is unusable after an earlier panic");
        if self.state.lock().map_err(|_| poisoned())?.done {
            return Ok(None);
        }
        // No lock is held while waiting (with the GIL released): another Python thread
        // may use this object meanwhile without deadlocking.
        let rx = self
            .rx
            .lock()
            .map_err(|_| poisoned())?
            .take()
            .ok_or_else(|| BitnetError::new_err("this stream is being read by another thread"))?;
        let (rx, msg) = py.detach(move || {
            let m = rx.recv();
            (rx, m)
        });
        *self.rx.lock().map_err(|_| poisoned())? = Some(rx);
        let mut st = self.state.lock().map_err(|_| poisoned())?;
        match msg {
            Ok(Msg::Text(t)) => Ok(Some(t)),
            Ok(Msg::Done(Ok((stats, tokens)))) => {
                st.done = true;
                st.finish = Some(match stats.finish {
                    FinishReason::Length => "length",
                    FinishReason::Cancelled => "cancelled",
                    FinishReason::Eog | FinishReason::StopString => "stop",
                });
                st.tokens = tokens;
                st.cached = stats.cached_tokens;
                st.prompt_tok_s = stats.prompt_tok_s();
                st.gen_tok_s = stats.generation_tok_s();
                Ok(None)
            }
            Ok(Msg::Done(Err(e))) => {
                st.done = true;
                Err(BitnetError::new_err(e))
            }
            Err(_) => {
                st.done = true;
                Err(BitnetError::new_err(
                    "the generation thread stopped unexpectedly",
                ))
            }
        }
    }

    /// Stop the generation (the iterator then ends).
    fn close(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// `None` until the iterator is exhausted; then OpenAI's `finish_reason` (`"stop"`,
    /// `"length"`, or `"cancelled"` after `close()`).
    #[getter]
    fn finish_reason(&self) -> Option<&'static str> {
        self.state.lock().ok().and_then(|s| s.finish)
    }

    /// The ids of every sampled token (the end-of-generation token included), once done.
    #[getter]
    fn tokens(&self) -> Vec<u32> {
        self.state
            .lock()
            .map(|s| s.tokens.clone())
            .unwrap_or_default()
    }

    /// Counts and speeds once done: `prompt_tokens`, `cached_tokens`,
    /// `completion_tokens`, `prompt_tok_per_s`, `gen_tok_per_s`.
    #[getter]
    fn stats(&self) -> Option<(usize, usize, usize, f64, f64)> {
        let s = self.state.lock().ok()?;
        s.done.then(|| {
            (
                s.n_prompt,
                s.cached,
                s.tokens.len(),
                s.prompt_tok_s,
                s.gen_tok_s,
            )
        })
    }
}

/// Peak resident memory of this process in bytes (`None` where unknown).
#[pyfunction]
fn peak_rss_bytes() -> Option<u64> {
    ::bitnet_engine::sys::peak_rss_bytes()
}

/// Splits a reply into text and tool calls as it streams (the server's parser).
#[pyclass(module = "bitnet_rs._native")]
struct ToolParser {
    p: ToolCallParser,
}

/// One event as a tuple: `("content", text)`, `("call", index, name)` or
/// `("arguments", index, fragment)`.
fn tool_events(py: Python<'_>, ev: Vec<ToolEvent>) -> PyResult<Vec<Py<PyAny>>> {
    ev.into_iter()
        .map(|e| {
            Ok(match e {
                ToolEvent::Content(t) => ("content", t).into_pyobject(py)?.into_any().unbind(),
                ToolEvent::CallStart { index, name } => {
                    ("call", index, name).into_pyobject(py)?.into_any().unbind()
                }
                ToolEvent::Arguments { index, fragment } => ("arguments", index, fragment)
                    .into_pyobject(py)?
                    .into_any()
                    .unbind(),
            })
        })
        .collect()
}

#[pymethods]
impl ToolParser {
    #[new]
    fn new() -> Self {
        Self {
            p: ToolCallParser::new(),
        }
    }

    /// The events of the next piece of the reply.
    fn push(&mut self, py: Python<'_>, text: &str) -> PyResult<Vec<Py<PyAny>>> {
        let ev = self.p.push(text);
        tool_events(py, ev)
    }

    /// The events of the reply's end.
    fn finish(&mut self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        let ev = self.p.finish();
        tool_events(py, ev)
    }
}

/// An embedding quantized to `bits` (8, 4, 2 or 1) per value: `(codes, scale, packed)`
/// ([`bitnet_engine::quantize_embedding`]).
#[pyfunction]
fn quantize_embedding<'py>(
    py: Python<'py>,
    vector: Vec<f32>,
    bits: u32,
) -> PyResult<(Vec<i8>, f32, Bound<'py, pyo3::types::PyBytes>)> {
    let q = ::bitnet_engine::quantize_embedding(&vector, bits)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let packed = pyo3::types::PyBytes::new(py, &q.packed());
    Ok((q.codes, q.scale, packed))
}

/// How an assistant message's call is written into the prompt.
#[pyfunction]
fn tool_call_text(name: &str, arguments: &str) -> String {
    call_text(name, arguments)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeModel>()?;
    m.add_class::<Stream>()?;
    m.add_class::<ToolParser>()?;
    m.add_function(wrap_pyfunction!(tool_call_text, m)?)?;
    m.add_function(wrap_pyfunction!(quantize_embedding, m)?)?;
    m.add("BitnetError", m.py().get_type::<BitnetError>())?;
    m.add_function(wrap_pyfunction!(peak_rss_bytes, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
