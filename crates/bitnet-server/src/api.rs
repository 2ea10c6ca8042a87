//! The OpenAI request schema: parsing, validation and the JSON of responses.
//!
//! Requests are parsed into a [`serde_json::Value`] first and then read field by field,
//! so every error names the offending field (`param` in OpenAI's error object). Fields
//! this server does not know are ignored, as OpenAI's own API does.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use bitnet_engine::tools::{call_text, ToolSet};
use bitnet_engine::{Constraint, EngineError};
use bitnet_sampling::SamplerParams;
use bitnet_tokenizer::{ChatMessage, ChatRole, Tokenizer};
use serde_json::{json, Map, Value};

/// An error answered with OpenAI's error object
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429 and 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// 400 naming `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: Some(param.into()),
            code: None,
            retry_after: None,
        }
    }

    /// 400 about the request as a whole (malformed JSON, not an object).
    pub fn bad_body(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

/// Server-side bounds a request is checked against.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    /// Positions of one slot's KV cache (prompt + generated tokens must fit).
    pub n_ctx: usize,
    /// Vocabulary size (token-id prompts are range-checked against it).
    pub n_vocab: usize,
    /// Most stop strings per request.
    pub max_stop: usize,
    /// Longest stop string, in bytes.
    pub max_stop_bytes: usize,
    /// Default sampling parameters for fields a request leaves out.
    pub defaults: SamplerParams,
}

/// A prompt of `/v1/completions`.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    /// Token ids, already range-checked.
    Tokens(Vec<u32>),
}

/// What the model is asked to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Chat(Vec<ChatMessage>),
    Completion(Prompt),
}

/// A validated completion request.
#[derive(Debug, Clone)]
pub struct CompletionRequest {
    pub input: Input,
    /// `max_completion_tokens` or `max_tokens` (>= 1, at most the context); `None` means
    /// "until the context is full".
    pub max_tokens: Option<usize>,
    pub sampler: SamplerParams,
    /// Whether the request gave a seed (otherwise the server draws one).
    pub seeded: bool,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Log-probabilities asked for: `Some(n)` returns each generated token's and the
    /// `n` most likely alternatives (chat: `logprobs: true` + `top_logprobs: n`;
    /// completions: `logprobs: n`).
    pub logprobs: Option<usize>,
    /// Structured output: `response_format` (`json_object`, `json_schema`), or llama-server's
    /// `json_schema` and `grammar` fields.
    pub constraint: Option<Constraint>,
    /// The field the constraint came from (named in a 400 when it does not compile).
    pub constraint_field: &'static str,
    /// Chat with `tools` the reply may call: the reply is split into content and
    /// `tool_calls` (the messages already carry the tool definitions, the constraint holds
    /// the reply to text or calls).
    pub tools: bool,
}

/// Most alternatives per token `top_logprobs` (chat) or `logprobs` (completions) may
/// ask for: OpenAI's limit for chat (its legacy completions allow 5).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// Parse and validate a request body.
pub fn parse_request(
    body: &[u8],
    endpoint: Endpoint,
    limits: &RequestLimits,
) -> Result<CompletionRequest, ApiError> {
    // serde_json refuses nesting deeper than 128 and numbers beyond f64 (1e400) itself.
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_body(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(obj) = v else {
        return Err(ApiError::bad_body("the body must be a JSON object"));
    };
    let o = Obj(&obj);

    if let Some(m) = o.get("model") {
        if !m.is_string() {
            return Err(ApiError::invalid("model", "`model` must be a string"));
        }
    }
    if let Some(n) = o.int("n")? {
        if n != 1 {
            return Err(ApiError::invalid(
                "n",
                format!(
                    "`n` = {n} is not supported: this server returns exactly one choice (n = 1)"
                ),
            ));
        }
    }

    let mut input = match endpoint {
        Endpoint::Chat => Input::Chat(parse_messages(o.get("messages"))?),
        Endpoint::Completion => Input::Completion(parse_prompt(o.get("prompt"), limits.n_vocab)?),
    };

    // max_completion_tokens supersedes max_tokens (OpenAI); either may be given.
    let max_tokens = match o.int("max_completion_tokens")? {
        Some(n) => Some(("max_completion_tokens", n)),
        None => o.int("max_tokens")?.map(|n| ("max_tokens", n)),
    };
    let max_tokens = match max_tokens {
        None => None,
        Some((field, n)) => {
            if n < 1 {
                return Err(ApiError::invalid(
                    field,
                    format!("`{field}` = {n}: must be at least 1"),
                ));
            }
            let n = usize::try_from(n)
                .map_err(|_| ApiError::invalid(field, format!("`{field}` = {n} is too large")))?;
            if n > limits.n_ctx {
                return Err(ApiError::invalid(
                    field,
                    format!(
                        "`{field}` = {n} exceeds the context size of {} tokens",
                        limits.n_ctx
                    ),
                )
                .with_code("context_length_exceeded"));
            }
            Some(n)
        }
    };

    let d = &limits.defaults;
    let mut sampler = SamplerParams {
        temperature: o.float("temperature", 0.0, 2.0)?.unwrap_or(d.temperature),
        top_p: o.float("top_p", 0.0, 1.0)?.unwrap_or(d.top_p),
        min_p: o.float("min_p", 0.0, 1.0)?.unwrap_or(d.min_p),
        presence_penalty: o
            .float("presence_penalty", -2.0, 2.0)?
            .unwrap_or(d.presence_penalty),
        frequency_penalty: o
            .float("frequency_penalty", -2.0, 2.0)?
            .unwrap_or(d.frequency_penalty),
        repeat_penalty: o
            .float("repeat_penalty", f32::MIN_POSITIVE, 10.0)?
            .unwrap_or(d.repeat_penalty),
        ..d.clone()
    };
    if let Some(k) = o.int("top_k")? {
        // <= 0 means "off" (vLLM spells it -1); larger than the vocabulary is clamped.
        sampler.top_k = i32::try_from(k.clamp(-1, i64::from(i32::MAX)))
            .map_err(|_| ApiError::invalid("top_k", "`top_k` is out of range"))?;
    }
    let seed = match o.get("seed") {
        None => None,
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Some(u),
            // A negative seed is a seed too: reinterpret its bits.
            (None, Some(i)) => Some(u64::from_le_bytes(i.to_le_bytes())),
            _ => return Err(ApiError::invalid("seed", "`seed` must be an integer")),
        },
        Some(_) => return Err(ApiError::invalid("seed", "`seed` must be an integer")),
    };
    let seeded = seed.is_some();
    if let Some(s) = seed {
        sampler.seed = s;
    }
    sampler.validate().map_err(|e| match e {
        bitnet_sampling::SamplingError::InvalidParam { field, reason } => {
            ApiError::invalid(field, format!("`{field}`: {reason}"))
        }
        other => ApiError::bad_body(other.to_string()),
    })?;

    let stop = parse_stop(o.get("stop"), limits)?;
    let stream = o.bool("stream")?.unwrap_or(false);
    let include_usage = match o.get("stream_options") {
        None => false,
        Some(Value::Object(so)) => Obj(so).bool("include_usage")?.unwrap_or(false),
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` must be an object",
            ))
        }
    };

    let logprobs = parse_logprobs(&o, endpoint)?;
    let (mut constraint, mut constraint_field) = parse_constraint(&o)?;
    let mut tools = false;
    if let (Endpoint::Chat, Some(set)) = (endpoint, parse_tools(&o)?) {
        if set.active() {
            if constraint.is_some() {
                return Err(ApiError::invalid(
                    constraint_field,
                    format!("`{constraint_field}` cannot be combined with `tools` (unless `tool_choice` is \"none\")"),
                ));
            }
            if let Input::Chat(msgs) = &mut input {
                set.apply_to(msgs);
            }
            constraint = set.constraint();
            constraint_field = "tools";
            tools = true;
        }
    }

    Ok(CompletionRequest {
        input,
        max_tokens,
        sampler,
        seeded,
        stop,
        stream,
        include_usage,
        logprobs,
        constraint,
        constraint_field,
        tools,
    })
}

/// Chat's `tools`, `tool_choice` and `parallel_tool_calls` ([`ToolSet::from_openai`]).
/// `tool_choice` without `tools` is refused unless it is `none` or `auto`.
fn parse_tools(o: &Obj<'_>) -> Result<Option<ToolSet>, ApiError> {
    let parallel = o.bool("parallel_tool_calls")?;
    let choice = o.get("tool_choice");
    let Some(tools) = o.get("tools") else {
        return match choice {
            None => Ok(None),
            Some(Value::String(c)) if c == "none" || c == "auto" => Ok(None),
            Some(_) => Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` needs `tools`",
            )),
        };
    };
    ToolSet::from_openai(tools, choice, parallel).map_err(|e| match e {
        EngineError::Tools { field, reason } => ApiError::invalid(field, reason),
        other => ApiError::invalid("tools", other.to_string()),
    })
}

/// `response_format` as OpenAI defines it — `{"type": "text"}`, `{"type": "json_object"}`,
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}` — with
/// llama-server's `{"type": "json_object", "schema": {…}}`; or llama-server's top-level
/// `json_schema` (a schema) and `grammar` (llguidance Lark text). At most one of the three.
fn parse_constraint(o: &Obj<'_>) -> Result<(Option<Constraint>, &'static str), ApiError> {
    let given: Vec<&'static str> = ["response_format", "json_schema", "grammar"]
        .into_iter()
        .filter(|k| o.get(k).is_some_and(|v| !v.is_null()))
        .collect();
    if given.len() > 1 {
        return Err(ApiError::invalid(
            given[1],
            format!("give one of {}, not several", given.join(", ")),
        ));
    }
    let schema = |field: &'static str, v: &Value| match v {
        Value::Object(_) | Value::Bool(true) => Ok(Constraint::JsonSchema(v.clone())),
        other => Err(ApiError::invalid(
            field,
            format!(
                "`{field}` must be a JSON schema object, not {}",
                type_name(other)
            ),
        )),
    };
    match given.first().copied() {
        None => Ok((None, "")),
        Some("json_schema") => {
            let v = o.get("json_schema").unwrap_or(&Value::Null);
            Ok((Some(schema("json_schema", v)?), "json_schema"))
        }
        Some("grammar") => match o.get("grammar") {
            Some(Value::String(g)) => Constraint::grammar_text(g)
                .map(|c| (Some(c), "grammar"))
                .map_err(|e| ApiError::invalid("grammar", e.to_string())),
            Some(other) => Err(ApiError::invalid(
                "grammar",
                format!("`grammar` must be a string, not {}", type_name(other)),
            )),
            None => Ok((None, "")),
        },
        Some(_) => {
            const F: &str = "response_format";
            let Some(Value::Object(rf)) = o.get(F) else {
                return Err(ApiError::invalid(F, "`response_format` must be an object"));
            };
            let c = match rf.get("type").and_then(Value::as_str) {
                Some("text") => None,
                Some("json_object") => Some(match rf.get("schema") {
                    None | Some(Value::Null) => Constraint::JsonObject,
                    Some(s) => schema(F, s)?,
                }),
                Some("json_schema") => {
                    let Some(Value::Object(js)) = rf.get("json_schema") else {
                        return Err(ApiError::invalid(
                            F,
                            "`response_format.json_schema` must be an object with a `schema`",
                        ));
                    };
                    if let Some(n) = js.get("name") {
                        if !n.is_string() {
                            return Err(ApiError::invalid(
                                F,
                                "`response_format.json_schema.name` must be a string",
                            ));
                        }
                    }
                    match js.get("schema") {
                        Some(s) => Some(schema(F, s)?),
                        None => {
                            return Err(ApiError::invalid(
                                F,
                                "`response_format.json_schema.schema` is missing",
                            ))
                        }
                    }
                }
                Some(t) => {
                    return Err(ApiError::invalid(
                        F,
                        format!(
                            "`response_format.type` = {t:?}: expected \"text\", \"json_object\" \
                             or \"json_schema\""
                        ),
                    ))
                }
                None => {
                    return Err(ApiError::invalid(
                        F,
                        "`response_format.type` must be a string",
                    ))
                }
            };
            Ok((c, F))
        }
    }
}

/// Chat: `logprobs` (boolean) and `top_logprobs` (0..=20, only with `logprobs: true`).
/// Completions: `logprobs` (integer 0..=20; 0 returns the chosen tokens only).
fn parse_logprobs(o: &Obj<'_>, endpoint: Endpoint) -> Result<Option<usize>, ApiError> {
    let in_range = |field: &str, n: i64| {
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= MAX_TOP_LOGPROBS)
            .ok_or_else(|| {
                ApiError::invalid(
                    field,
                    format!("`{field}` = {n} is not in [0, {MAX_TOP_LOGPROBS}]"),
                )
            })
    };
    match endpoint {
        Endpoint::Chat => {
            let on = o.bool("logprobs")?.unwrap_or(false);
            let top = o.int("top_logprobs")?;
            match (on, top) {
                (false, Some(_)) => Err(ApiError::invalid(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs: true`",
                )),
                (false, None) => Ok(None),
                (true, None) => Ok(Some(0)),
                (true, Some(n)) => in_range("top_logprobs", n).map(Some),
            }
        }
        Endpoint::Completion => match o.get("logprobs") {
            None => Ok(None),
            // Some clients send the chat form here; `true` means the tokens alone.
            Some(Value::Bool(b)) => Ok(b.then_some(0)),
            Some(_) => match o.int("logprobs")? {
                Some(n) => in_range("logprobs", n).map(Some),
                None => Ok(None),
            },
        },
    }
}

/// One generated token's log-probability and the most likely alternatives at its
/// position (ids; turned into text by [`logprobs_json`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// The `logprobs` object of one choice (or one streamed chunk) for `entries`.
///
/// Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}`.
/// Completions (OpenAI's legacy shape): `{"tokens", "token_logprobs", "top_logprobs",
/// "text_offset"}`; `text_offset` counts bytes of generated text before each token,
/// starting at `*offset`, which is advanced past `entries`.
pub fn logprobs_json(
    endpoint: Endpoint,
    entries: &[TokenLogprob],
    tok: &Tokenizer,
    offset: &mut usize,
) -> Value {
    let bytes = |id: u32| tok.token_bytes(id).unwrap_or_default();
    let text = |id: u32| String::from_utf8_lossy(bytes(id)).into_owned();
    match endpoint {
        Endpoint::Chat => {
            let content: Vec<Value> = entries
                .iter()
                .map(|e| {
                    let top: Vec<Value> = e
                        .top
                        .iter()
                        .map(|&(id, lp)| json!({"token": text(id), "logprob": lp, "bytes": bytes(id)}))
                        .collect();
                    json!({
                        "token": text(e.id),
                        "logprob": e.logprob,
                        "bytes": bytes(e.id),
                        "top_logprobs": top,
                    })
                })
                .collect();
            json!({ "content": content, "refusal": null })
        }
        Endpoint::Completion => {
            let mut offsets = Vec::with_capacity(entries.len());
            for e in entries {
                offsets.push(*offset);
                *offset = offset.saturating_add(bytes(e.id).len());
            }
            let top: Vec<Value> = entries
                .iter()
                .map(|e| {
                    let m: Map<String, Value> = e
                        .top
                        .iter()
                        .map(|&(id, lp)| (text(id), json!(lp)))
                        .collect();
                    Value::Object(m)
                })
                .collect();
            json!({
                "tokens": entries.iter().map(|e| text(e.id)).collect::<Vec<_>>(),
                "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
                "top_logprobs": top,
                "text_offset": offsets,
            })
        }
    }
}

/// A JSON object with typed getters; `null` counts as absent (as in OpenAI's API).
struct Obj<'a>(&'a Map<String, Value>);

impl Obj<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    fn int(&self, k: &str) -> Result<Option<i64>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                if let Some(i) = n.as_i64() {
                    Ok(Some(i))
                } else if n.as_u64().is_some() {
                    Err(ApiError::invalid(k, format!("`{k}` = {n} is too large")))
                } else {
                    Err(ApiError::invalid(
                        k,
                        format!("`{k}` must be an integer, got {n}"),
                    ))
                }
            }
            Some(other) => Err(ApiError::invalid(
                k,
                format!("`{k}` must be an integer, got {}", type_name(other)),
            )),
        }
    }

    /// A number in `[lo, hi]`.
    fn float(&self, k: &str, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                if !(f64::from(lo)..=f64::from(hi)).contains(&x) {
                    return Err(ApiError::invalid(
                        k,
                        format!("`{k}` = {n} is not in [{lo}, {hi}]"),
                    ));
                }
                // In range of f32 by the check above; only precision is lost.
                #[allow(clippy::cast_possible_truncation)]
                let x = x as f32;
                Ok(Some(x))
            }
            Some(other) => Err(ApiError::invalid(
                k,
                format!("`{k}` must be a number, got {}", type_name(other)),
            )),
        }
    }

    fn bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(ApiError::invalid(
                k,
                format!("`{k}` must be a boolean, got {}", type_name(other)),
            )),
        }
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn parse_messages(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(Value::Array(items)) = v else {
        return Err(ApiError::invalid(
            "messages",
            match v {
                None => "`messages` is required".to_string(),
                Some(o) => format!("`messages` must be an array, got {}", type_name(o)),
            },
        ));
    };
    if items.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` is empty"));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, m) in items.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(ApiError::invalid(
                format!("messages[{i}]"),
                format!("`messages[{i}]` must be an object"),
            ));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) => match r.as_str() {
                "system" | "developer" => ChatRole::System,
                "user" => ChatRole::User,
                "assistant" => ChatRole::Assistant,
                "tool" => ChatRole::Tool,
                other => {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].role"),
                        format!(
                            "`messages[{i}].role` = {:?} is not supported (system, developer, user, assistant, tool)",
                            truncate(other, 32)
                        ),
                    ))
                }
            },
            _ => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    format!("`messages[{i}].role` must be a string"),
                ))
            }
        };
        let field = || format!("messages[{i}].content");
        let content = match m.get("content") {
            // An assistant turn may carry no content.
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for (j, p) in parts.iter().enumerate() {
                    let text = match p {
                        Value::String(t) => Some(t),
                        Value::Object(p) => match (p.get("type"), p.get("text")) {
                            (Some(Value::String(ty)), Some(Value::String(t))) if ty == "text" => {
                                Some(t)
                            }
                            _ => None,
                        },
                        _ => None,
                    };
                    let Some(text) = text else {
                        return Err(ApiError::invalid(
                            format!("messages[{i}].content[{j}]"),
                            format!("`messages[{i}].content[{j}]`: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported"),
                        ));
                    };
                    s.push_str(text);
                }
                s
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    field(),
                    format!(
                        "`{}` must be a string or an array of text parts, got {}",
                        field(),
                        type_name(other)
                    ),
                ))
            }
        };
        let mut content = content;
        if role == ChatRole::Assistant {
            let calls = parse_history_calls(m.get("tool_calls"), i)?;
            if !calls.is_empty() && !content.is_empty() {
                content.push('\n');
            }
            content.push_str(&calls);
        }
        out.push(ChatMessage::new(role, content));
    }
    Ok(out)
}

/// An assistant message's `tool_calls` (`[{"id", "type": "function", "function": {"name",
/// "arguments"}}]`), written as the reply format writes calls, one per line.
fn parse_history_calls(v: Option<&Value>, i: usize) -> Result<String, ApiError> {
    let items = match v {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(ApiError::invalid(
                format!("messages[{i}].tool_calls"),
                format!("`messages[{i}].tool_calls` must be an array"),
            ))
        }
    };
    let mut s = String::new();
    for (j, c) in items.iter().enumerate() {
        let f = c.get("function");
        let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
        let args = f.and_then(|f| f.get("arguments")).and_then(Value::as_str);
        let (Some(name), Some(args)) = (name, args) else {
            return Err(ApiError::invalid(
                format!("messages[{i}].tool_calls[{j}]"),
                format!(
                    "`messages[{i}].tool_calls[{j}]` must be {{\"type\": \"function\", \"function\": {{\"name\": string, \"arguments\": string}}}}"
                ),
            ));
        };
        if j > 0 {
            s.push('\n');
        }
        s.push_str(&call_text(name, args));
    }
    Ok(s)
}

fn parse_prompt(v: Option<&Value>, n_vocab: usize) -> Result<Prompt, ApiError> {
    let bad = |msg: String| ApiError::invalid("prompt", msg);
    let ids = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .filter(|&id| usize::try_from(id).is_ok_and(|id| id < n_vocab))
                    .ok_or_else(|| {
                        bad(format!(
                            "`prompt` token id {t} is not an integer in [0, {n_vocab})"
                        ))
                    })
            })
            .collect()
    };
    match v {
        None => Err(bad("`prompt` is required".into())),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(items)) => match items.first() {
            None => Err(bad("`prompt` is empty".into())),
            Some(Value::String(s)) if items.len() == 1 => Ok(Prompt::Text(s.clone())),
            Some(Value::Number(_)) => Ok(Prompt::Tokens(ids(items)?)),
            Some(Value::Array(inner)) if items.len() == 1 => match inner.first() {
                None => Err(bad("`prompt` is empty".into())),
                _ => Ok(Prompt::Tokens(ids(inner)?)),
            },
            Some(Value::String(_)) | Some(Value::Array(_)) => Err(bad(format!(
                "`prompt` holds {} prompts; this server takes one per request",
                items.len()
            ))),
            Some(other) => Err(bad(format!(
                "`prompt` must be a string, an array of token ids or a one-element array, got an array of {}",
                type_name(other)
            ))),
        },
        Some(other) => Err(bad(format!(
            "`prompt` must be a string or an array of token ids, got {}",
            type_name(other)
        ))),
    }
}

fn parse_stop(v: Option<&Value>, limits: &RequestLimits) -> Result<Vec<String>, ApiError> {
    let list: Vec<String> = match v {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            if items.len() > limits.max_stop {
                return Err(ApiError::invalid(
                    "stop",
                    format!(
                        "`stop` has {} entries; at most {} are allowed",
                        items.len(),
                        limits.max_stop
                    ),
                ));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, s)| match s {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(ApiError::invalid(
                        "stop",
                        format!("`stop[{i}]` must be a string, got {}", type_name(other)),
                    )),
                })
                .collect::<Result<_, _>>()?
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "`stop` must be a string or an array of strings, got {}",
                    type_name(other)
                ),
            ))
        }
    };
    if let Some(s) = list.iter().find(|s| s.len() > limits.max_stop_bytes) {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "a stop string of {} bytes is longer than the limit of {} bytes",
                s.len(),
                limits.max_stop_bytes
            ),
        ));
    }
    // The empty string would stop before anything is generated: it is ignored.
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens found in a slot's cache and not evaluated again.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

impl Usage {
    pub fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": self.cached_tokens },
        })
    }
}

/// One function call of a chat reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallOut {
    /// `call_` and 24 hexadecimal digits.
    pub id: String,
    pub name: String,
    /// The arguments' JSON text.
    pub arguments: String,
}

impl CallOut {
    fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": { "name": self.name, "arguments": self.arguments },
        })
    }
}

/// Identity of one response: `id`, `created`, `model`.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
}

impl ResponseMeta {
    /// A whole (non-streamed) response.
    /// A whole (non-streamed) response; a chat reply's `calls` become its message's
    /// `tool_calls` (its `content` null when it has no text).
    pub fn full(
        &self,
        text: &str,
        calls: &[CallOut],
        finish: &str,
        usage: Usage,
        logprobs: Option<Value>,
    ) -> Value {
        match self.endpoint {
            Endpoint::Chat => {
                let mut message = json!({
                    "role": "assistant",
                    "content": if text.is_empty() && !calls.is_empty() {
                        Value::Null
                    } else {
                        json!(text)
                    },
                });
                if !calls.is_empty() {
                    message["tool_calls"] = calls.iter().map(CallOut::to_json).collect();
                }
                json!({
                    "id": self.id,
                    "object": "chat.completion",
                    "created": self.created,
                    "model": self.model,
                    "choices": [{
                        "index": 0,
                        "message": message,
                        "logprobs": logprobs,
                        "finish_reason": finish,
                    }],
                    "usage": usage.to_json(),
                })
            }
            Endpoint::Completion => json!({
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [{
                    "index": 0,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }],
                "usage": usage.to_json(),
            }),
        }
    }

    /// One streamed chunk: a text delta (or, for chat, the opening `role` delta when
    /// `text` is `None`), or the final chunk carrying `finish`.
    pub fn chunk(
        &self,
        text: Option<&str>,
        finish: Option<&str>,
        with_usage_null: bool,
        logprobs: Option<Value>,
    ) -> Value {
        let mut v = match self.endpoint {
            Endpoint::Chat => {
                let delta = match (text, finish) {
                    (_, Some(_)) => json!({}),
                    (None, None) => json!({ "role": "assistant", "content": "" }),
                    (Some(t), None) => json!({ "content": t }),
                };
                json!({
                    "id": self.id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": [{
                        "index": 0,
                        "delta": delta,
                        "logprobs": logprobs,
                        "finish_reason": finish,
                    }],
                })
            }
            Endpoint::Completion => json!({
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [{
                    "index": 0,
                    "text": text.unwrap_or(""),
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }],
            }),
        };
        if with_usage_null {
            if let Value::Object(m) = &mut v {
                m.insert("usage".into(), Value::Null);
            }
        }
        v
    }

    /// A streamed chat chunk of call `index`: its first (`start`: id and name, arguments
    /// empty) or a fragment of its arguments, as OpenAI streams `delta.tool_calls`.
    pub fn call_chunk(
        &self,
        index: usize,
        start: Option<(&str, &str)>,
        arguments: &str,
        with_usage_null: bool,
        logprobs: Option<Value>,
    ) -> Value {
        let call = match start {
            Some((id, name)) => json!({
                "index": index,
                "id": id,
                "type": "function",
                "function": { "name": name, "arguments": arguments },
            }),
            None => json!({ "index": index, "function": { "arguments": arguments } }),
        };
        let mut v = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "delta": { "tool_calls": [call] },
                "logprobs": logprobs,
                "finish_reason": null,
            }],
        });
        if with_usage_null {
            v["usage"] = Value::Null;
        }
        v
    }

    /// The usage chunk of `stream_options.include_usage`: no choices.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        json!({
            "id": self.id,
            "object": match self.endpoint {
                Endpoint::Chat => "chat.completion.chunk",
                Endpoint::Completion => "text_completion",
            },
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage.to_json(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> RequestLimits {
        RequestLimits {
            n_ctx: 512,
            n_vocab: 4256,
            max_stop: 4,
            max_stop_bytes: 16,
            defaults: SamplerParams::default(),
        }
    }

    fn chat(body: &str) -> Result<CompletionRequest, ApiError> {
        parse_request(body.as_bytes(), Endpoint::Chat, &limits())
    }

    fn param_of(body: &str) -> Option<String> {
        chat(body).unwrap_err().param
    }

    const MSG: &str = r#""messages":[{"role":"user","content":"hi"}]"#;

    #[test]
    fn minimal_chat_uses_defaults() {
        let r = chat(&format!("{{{MSG}}}")).unwrap();
        assert_eq!(
            r.input,
            Input::Chat(vec![ChatMessage::new(ChatRole::User, "hi")])
        );
        assert_eq!(r.max_tokens, None);
        assert_eq!(r.sampler, SamplerParams::default());
        assert!(!r.seeded && !r.stream && !r.include_usage && r.stop.is_empty());
    }

    #[test]
    fn fields_are_read() {
        let r = chat(&format!(
            r#"{{{MSG},"model":"x","max_tokens":7,"temperature":0,"top_p":0.5,"top_k":3,"min_p":0.1,
               "presence_penalty":-1,"frequency_penalty":1.5,"seed":-1,"stop":["a",""],"stream":true,
               "stream_options":{{"include_usage":true}},"n":1,"unknown":{{"deep":[1,2]}}}}"#
        ))
        .unwrap();
        assert_eq!(r.max_tokens, Some(7));
        assert_eq!(r.sampler.temperature, 0.0);
        assert_eq!(r.sampler.top_p, 0.5);
        assert_eq!(r.sampler.top_k, 3);
        assert_eq!(r.sampler.min_p, 0.1);
        assert_eq!(r.sampler.presence_penalty, -1.0);
        assert_eq!(r.sampler.frequency_penalty, 1.5);
        assert_eq!(r.sampler.seed, u64::MAX);
        assert!(r.seeded && r.stream && r.include_usage);
        assert_eq!(r.stop, vec!["a".to_string()]);
    }

    #[test]
    fn max_completion_tokens_wins() {
        let r = chat(&format!(
            r#"{{{MSG},"max_tokens":7,"max_completion_tokens":9}}"#
        ))
        .unwrap();
        assert_eq!(r.max_tokens, Some(9));
    }

    #[test]
    fn wrong_types_name_the_field() {
        for (body, field) in [
            (r#""temperature":"hot""#, "temperature"),
            (r#""top_p":[1]"#, "top_p"),
            (r#""top_k":1.5"#, "top_k"),
            (r#""max_tokens":"10""#, "max_tokens"),
            (r#""seed":1.5"#, "seed"),
            (r#""stream":"yes""#, "stream"),
            (r#""stop":5"#, "stop"),
            (r#""stop":[5]"#, "stop"),
            (r#""model":5"#, "model"),
            (r#""n":"1""#, "n"),
            (r#""stream_options":true"#, "stream_options"),
            (r#""stream_options":{"include_usage":1}"#, "include_usage"),
        ] {
            assert_eq!(
                param_of(&format!("{{{MSG},{body}}}")).as_deref(),
                Some(field),
                "{body}"
            );
        }
    }

    #[test]
    fn out_of_range_values_name_the_field() {
        for (body, field) in [
            (r#""temperature":-0.1"#, "temperature"),
            (r#""temperature":2.5"#, "temperature"),
            (r#""top_p":1.01"#, "top_p"),
            (r#""min_p":-1"#, "min_p"),
            (r#""presence_penalty":3"#, "presence_penalty"),
            (r#""frequency_penalty":-2.5"#, "frequency_penalty"),
            (r#""max_tokens":0"#, "max_tokens"),
            (r#""max_tokens":-5"#, "max_tokens"),
            (r#""max_tokens":513"#, "max_tokens"),
            (r#""max_tokens":18446744073709551615"#, "max_tokens"),
            (r#""max_tokens":1e300"#, "max_tokens"),
            (r#""max_completion_tokens":0"#, "max_completion_tokens"),
            (r#""n":2"#, "n"),
            (r#""n":0"#, "n"),
            (r#""stop":["a","b","c","d","e"]"#, "stop"),
            (r#""stop":"this stop string is too long""#, "stop"),
        ] {
            assert_eq!(
                param_of(&format!("{{{MSG},{body}}}")).as_deref(),
                Some(field),
                "{body}"
            );
        }
        // exactly the context is fine
        assert!(chat(&format!(r#"{{{MSG},"max_tokens":512}}"#)).is_ok());
    }

    #[test]
    fn huge_top_k_is_clamped_and_huge_seed_accepted() {
        let r = chat(&format!(
            r#"{{{MSG},"top_k":9223372036854775807,"seed":18446744073709551615}}"#
        ))
        .unwrap();
        assert_eq!(r.sampler.top_k, i32::MAX);
        assert_eq!(r.sampler.seed, u64::MAX);
        assert_eq!(
            param_of(&format!(r#"{{{MSG},"top_k":1e20}}"#)).as_deref(),
            Some("top_k")
        );
    }

    #[test]
    fn hostile_json_is_a_400() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        for body in [
            "",
            "{",
            "not json",
            "[]",
            "null",
            r#"{"messages":[],"temperature":1e400}"#,
            &format!(r#"{{"messages":{deep}}}"#),
            "\"\\ud800\"",
        ] {
            let e = chat(body).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body:.40}");
        }
        // Duplicate keys: the last one wins (serde_json's map); still a valid request.
        let r = chat(&format!(r#"{{{MSG},"max_tokens":3,"max_tokens":4}}"#)).unwrap();
        assert_eq!(r.max_tokens, Some(4));
    }

    #[test]
    fn messages_are_checked() {
        assert_eq!(param_of("{}").as_deref(), Some("messages"));
        assert_eq!(
            param_of(r#"{"messages":"hi"}"#).as_deref(),
            Some("messages")
        );
        assert_eq!(param_of(r#"{"messages":[]}"#).as_deref(), Some("messages"));
        assert_eq!(
            param_of(r#"{"messages":[1]}"#).as_deref(),
            Some("messages[0]")
        );
        assert_eq!(
            param_of(
                r#"{"messages":[{"role":"user","content":"a"},{"role":"function","content":"x"}]}"#
            )
            .as_deref(),
            Some("messages[1].role")
        );
        assert_eq!(
            param_of(r#"{"messages":[{"content":"a"}]}"#).as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            param_of(r#"{"messages":[{"role":"user","content":5}]}"#).as_deref(),
            Some("messages[0].content")
        );
        assert_eq!(
            param_of(r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#)
                .as_deref(),
            Some("messages[0].content[0]")
        );
        let r = chat(
            r#"{"messages":[{"role":"developer","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
                {"role":"assistant","content":null}]}"#,
        )
        .unwrap();
        assert_eq!(
            r.input,
            Input::Chat(vec![
                ChatMessage::new(ChatRole::System, "be brief"),
                ChatMessage::new(ChatRole::User, "ab"),
                ChatMessage::new(ChatRole::Assistant, ""),
            ])
        );
    }

    fn completion(body: &str) -> Result<CompletionRequest, ApiError> {
        parse_request(body.as_bytes(), Endpoint::Completion, &limits())
    }

    #[test]
    fn prompts_are_checked() {
        let p = |b: &str| completion(b).map(|r| r.input);
        assert_eq!(
            p(r#"{"prompt":"hi"}"#).unwrap(),
            Input::Completion(Prompt::Text("hi".into()))
        );
        assert_eq!(
            p(r#"{"prompt":["hi"]}"#).unwrap(),
            Input::Completion(Prompt::Text("hi".into()))
        );
        assert_eq!(
            p(r#"{"prompt":[4000,1,4255]}"#).unwrap(),
            Input::Completion(Prompt::Tokens(vec![4000, 1, 4255]))
        );
        assert_eq!(
            p(r#"{"prompt":[[4000,2]]}"#).unwrap(),
            Input::Completion(Prompt::Tokens(vec![4000, 2]))
        );
        for bad in [
            r#"{}"#,
            r#"{"prompt":5}"#,
            r#"{"prompt":[]}"#,
            r#"{"prompt":[[]]}"#,
            r#"{"prompt":["a","b"]}"#,
            r#"{"prompt":[-1]}"#,
            r#"{"prompt":[4256]}"#,
            r#"{"prompt":[2147483648]}"#,
            r#"{"prompt":[4000,"a"]}"#,
            r#"{"prompt":[1.5]}"#,
            r#"{"prompt":[true]}"#,
        ] {
            assert_eq!(
                completion(bad).unwrap_err().param.as_deref(),
                Some("prompt"),
                "{bad}"
            );
        }
    }

    #[test]
    fn error_body_has_openai_shape() {
        let e = ApiError::invalid("top_p", "bad");
        assert_eq!(
            e.body(),
            json!({"error": {"message": "bad", "type": "invalid_request_error", "param": "top_p", "code": null}})
        );
    }

    #[test]
    fn tools_and_tool_history_are_read() {
        let tools = r#""tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}}]"#;
        let r = chat(&format!("{{{MSG},{tools}}}")).unwrap();
        assert!(r.tools);
        assert_eq!(r.constraint_field, "tools");
        assert!(matches!(r.constraint, Some(Constraint::Lark(_))));
        let Input::Chat(m) = &r.input else { panic!() };
        assert_eq!(m[0].role, ChatRole::System);
        assert!(m[0].content.contains(r#"{"name":"f","parameters":"#));

        let r = chat(&format!(r#"{{{MSG},{tools},"tool_choice":"none"}}"#)).unwrap();
        assert!(!r.tools && r.constraint.is_none());
        assert_eq!(
            r.input,
            Input::Chat(vec![ChatMessage::new(ChatRole::User, "hi")])
        );

        let r = chat(
            r#"{"messages":[{"role":"user","content":"a"},
                {"role":"assistant","content":null,"tool_calls":[
                    {"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}},
                    {"id":"call_2","type":"function","function":{"name":"g","arguments":"{}"}}]},
                {"role":"tool","tool_call_id":"call_1","content":"2"}]}"#,
        )
        .unwrap();
        assert_eq!(
            r.input,
            Input::Chat(vec![
                ChatMessage::new(ChatRole::User, "a"),
                ChatMessage::new(
                    ChatRole::Assistant,
                    "<function=f>{\"x\": 1}</function>\n<function=g>{}</function>"
                ),
                ChatMessage::new(ChatRole::Tool, "2"),
            ])
        );

        for (body, param) in [
            (format!(r#"{{{MSG},"tools":{{}}}}"#), "tools"),
            (
                format!(r#"{{{MSG},"tools":[],"tool_choice":"required"}}"#),
                "tool_choice",
            ),
            (
                format!(r#"{{{MSG},"tools":[{{"type":"function","function":{{"name":""}}}}]}}"#),
                "tools[0].function.name",
            ),
            (
                format!(r#"{{{MSG},{tools},"tool_choice":"maybe"}}"#),
                "tool_choice",
            ),
            (
                format!(r#"{{{MSG},"tool_choice":"required"}}"#),
                "tool_choice",
            ),
            (
                format!(r#"{{{MSG},{tools},"parallel_tool_calls":1}}"#),
                "parallel_tool_calls",
            ),
            (
                format!(r#"{{{MSG},{tools},"response_format":{{"type":"json_object"}}}}"#),
                "response_format",
            ),
            (
                r#"{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f"}}]}]}"#
                    .to_string(),
                "messages[0].tool_calls[0]",
            ),
        ] {
            assert_eq!(param_of(&body).as_deref(), Some(param), "{body}");
        }
    }
}
