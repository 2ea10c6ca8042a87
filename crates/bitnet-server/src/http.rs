//! Routes, handlers, the auth/loading gate and the accept loop.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bitnet_tokenizer::Tokenizer;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::api::{
    self, ApiError, CallOut, CompletionRequest, Endpoint, Input, Prompt, RequestLimits,
    ResponseMeta,
};
use crate::request::{
    admit, counted, json_object, loading_error, read_body, tokenize_blocking, unavailable, AppState,
};
use crate::scheduler::{GenEvent, Job, Msg};
use crate::{Phase, Ready, ServerError, Shared};
use bitnet_engine::tools::{split_reply, ToolCallParser, ToolEvent};

fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/embeddings", post(crate::embeddings::route))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize_route))
        .route("/detokenize", post(detokenize_route))
        .route("/props", get(props))
        .route("/slots", get(slots))
        .route("/", get(crate::web::index))
        .route("/assets/{file}", get(crate::web::asset))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(Arc::clone(&state), gate))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), cors))
        .with_state(state)
}

/// Paths answered without the API key and while the model loads: the health check and
/// the chat page (which asks for the key and shows the loading state itself).
fn is_public(path: &str) -> bool {
    path == "/health" || path == "/" || path.starts_with("/assets/")
}

/// Checks a `--cors-origin` value: `*`, or `scheme://host[:port]` (an origin as browsers
/// send it: no path, no trailing slash).
pub(crate) fn check_origin(o: &str) -> Result<(), String> {
    if o == "*" {
        return Ok(());
    }
    let Some((scheme, rest)) = o.split_once("://") else {
        return Err("an origin is `scheme://host[:port]` (or `*`)".into());
    };
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    {
        return Err("the scheme is not valid".into());
    }
    if rest.is_empty()
        || rest.contains(['/', '?', '#', '@'])
        || rest.bytes().any(|b| !b.is_ascii_graphic())
    {
        return Err("an origin has a host and an optional port, and nothing after them".into());
    }
    HeaderValue::from_str(o).map_err(|e| e.to_string())?;
    Ok(())
}

/// The `Access-Control-Allow-Origin` value for a request's `Origin`, if it is allowed.
fn allowed_origin(s: &Shared, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
    let origin = origin?;
    if s.cfg.cors_origins.iter().any(|o| o == "*") {
        return Some(HeaderValue::from_static("*"));
    }
    let o = origin.to_str().ok()?;
    s.cfg
        .cors_origins
        .iter()
        .any(|a| a.eq_ignore_ascii_case(o))
        .then(|| origin.clone())
}

/// CORS: answers preflights (before the key check: browsers send them without
/// credentials) and marks responses to allowed origins. Only origins given with
/// `--cors-origin` are allowed; the API key is still required on every API call.
async fn cors(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let allowed = allowed_origin(&s, req.headers().get(header::ORIGIN));
    let preflight = req.method() == axum::http::Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        let Some(allow) = allowed else {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                "cross-origin requests from this origin are not allowed (see `bitnet serve --cors-origin`)",
            )
            .into_response();
        };
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        // Whatever headers the page wants to send (clients add their own, such as the
        // OpenAI SDK's `x-stainless-*`); `Authorization` is still checked on the call.
        let asked = req
            .headers()
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static("authorization, content-type"));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
        return r;
    }
    let mut r = next.run(req).await;
    if let Some(allow) = allowed {
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("retry-after"),
        );
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    r
}

/// 503 while loading, 401 without the right key; `/health` and the page pass through.
async fn gate(State(s): State<AppState>, req: Request, next: Next) -> Response {
    if is_public(req.uri().path()) {
        return next.run(req).await;
    }
    if s.ready.get().is_none() || matches!(*s.phase.borrow(), Phase::Failed(_)) {
        return loading_error(&s).into_response();
    }
    if let Some(key) = &s.cfg.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .unwrap_or_default();
        // Constant time in the key's contents (a length mismatch fails at once).
        if !bool::from(given.ct_eq(key.as_bytes())) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid or missing API key (send `Authorization: Bearer <key>`)",
            )
            .into_response();
        }
    }
    next.run(req).await
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found_error",
        format!("no route for {} {}", req.method(), req.uri().path()),
    )
}

async fn health(State(s): State<AppState>) -> Response {
    let failed = matches!(*s.phase.borrow(), Phase::Failed(_));
    if let Some(ready) = s.ready.get().filter(|_| !failed) {
        // A mapped model file changed on disk: its next page read may end the process.
        if let Some(why) = ready.file.as_ref().and_then(|f| f.changed()) {
            let message = format!(
                "the model file changed on disk: {why}; restart the server (or serve with \
                 --in-memory to be immune)"
            );
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "error", "error": {
                    "message": message, "type": "unavailable_error", "param": null, "code": null,
                }})),
            )
                .into_response();
        }
        if s.draining.load(Relaxed) {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "shutting down"})),
            )
                .into_response();
        }
        return Json(json!({"status": "ok"})).into_response();
    }
    let e = loading_error(&s);
    let status = match &*s.phase.borrow() {
        Phase::Failed(_) => "error",
        _ => "loading",
    };
    let mut r = e.clone().into_response();
    *r.body_mut() = Body::from(json!({"status": status, "error": e.body()["error"]}).to_string());
    r
}

async fn metrics(State(s): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        s.metrics.render(),
    )
        .into_response()
}

async fn models(State(s): State<AppState>) -> Json<Value> {
    let ready = s.ready.get();
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.cfg.model_name,
            "object": "model",
            "created": s.started,
            "owned_by": "bitnet-rs",
            "meta": {
                "n_ctx": ready.map(|r| r.n_ctx),
                "n_vocab": ready.map(|r| r.n_vocab),
                "parallel": s.cfg.parallel,
            },
        }],
    }))
}

fn opt_bool(o: &serde_json::Map<String, Value>, k: &str, default: bool) -> Result<bool, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid(k, format!("`{k}` must be a boolean"))),
    }
}

fn ready_or_503(s: &Shared) -> Result<&Ready, ApiError> {
    s.ready.get().ok_or_else(|| loading_error(s))
}

/// llama-server's `POST /tokenize`: `{"content", "add_special": false,
/// "parse_special": true, "with_pieces": false}` → `{"tokens": [ids]}`, or with pieces
/// `{"tokens": [{"id", "piece"}]}` (a piece that is not whole UTF-8 is its byte array).
async fn tokenize_route(State(s): State<AppState>, req: Request) -> Result<Json<Value>, ApiError> {
    let ready = ready_or_503(&s)?;
    let o = json_object(&s, req).await?;
    let content = match o.get("content") {
        Some(Value::String(c)) => c.clone(),
        _ => return Err(ApiError::invalid("content", "`content` must be a string")),
    };
    let add_special = opt_bool(&o, "add_special", false)?;
    let parse_special = opt_bool(&o, "parse_special", true)?;
    let with_pieces = opt_bool(&o, "with_pieces", false)?;
    let tok = Arc::clone(&ready.tokenizer);
    let ids = tokenize_blocking(move || {
        tok.encode(&content, add_special && tok.add_bos(), parse_special)
            .map_err(|e| ApiError::invalid("content", e.to_string()))
    })
    .await?;
    if !with_pieces {
        return Ok(Json(json!({ "tokens": ids })));
    }
    let tok = &ready.tokenizer;
    let tokens: Vec<Value> = ids
        .iter()
        .map(|&id| {
            let bytes = tok.token_bytes(id).unwrap_or_default();
            let piece = match std::str::from_utf8(bytes) {
                Ok(t) => json!(t),
                Err(_) => json!(bytes),
            };
            json!({ "id": id, "piece": piece })
        })
        .collect();
    Ok(Json(json!({ "tokens": tokens })))
}

/// llama-server's `POST /detokenize`: `{"tokens": [ids]}` → `{"content"}`.
async fn detokenize_route(
    State(s): State<AppState>,
    req: Request,
) -> Result<Json<Value>, ApiError> {
    let ready = ready_or_503(&s)?;
    let o = json_object(&s, req).await?;
    let Some(Value::Array(items)) = o.get("tokens") else {
        return Err(ApiError::invalid(
            "tokens",
            "`tokens` must be an array of token ids",
        ));
    };
    let n_vocab = ready.n_vocab;
    let ids = items
        .iter()
        .map(|t| {
            t.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .filter(|&id| usize::try_from(id).is_ok_and(|i| i < n_vocab))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tokens",
                        format!("token id {t} is not an integer in [0, {n_vocab})"),
                    )
                })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let content = ready
        .tokenizer
        .decode(&ids)
        .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(Json(json!({ "content": content })))
}

/// llama-server's `GET /props`: the default generation settings and the server's shape.
async fn props(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let ready = ready_or_503(&s)?;
    let d = &s.cfg.sampling_defaults;
    let tok = &ready.tokenizer;
    let text = |id: Option<u32>| id.and_then(|i| tok.piece(i).ok()).unwrap_or_default();
    Ok(Json(json!({
        "default_generation_settings": {
            "n_ctx": ready.n_ctx,
            "params": {
                "n_predict": -1,
                "temperature": d.temperature,
                "top_k": d.top_k,
                "top_p": d.top_p,
                "min_p": d.min_p,
                "repeat_penalty": d.repeat_penalty,
                "repeat_last_n": d.repeat_last_n,
                "presence_penalty": d.presence_penalty,
                "frequency_penalty": d.frequency_penalty,
            },
        },
        "total_slots": s.cfg.parallel,
        "model_alias": s.cfg.model_name,
        "n_ctx_train": ready.n_ctx_train,
        "n_vocab": ready.n_vocab,
        "bos_token": text(tok.bos()),
        "eos_token": text(tok.eos()),
        "chat_format": "llama3",
        "modalities": { "vision": false, "audio": false },
        "build_info": concat!("bitnet-rs ", env!("CARGO_PKG_VERSION")),
    })))
}

/// `GET /slots`: each slot's state, for monitoring (behind the API key).
async fn slots(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let ready = ready_or_503(&s)?;
    let list: Vec<Value> = ready
        .slots
        .iter()
        .enumerate()
        .map(|(id, st)| {
            json!({
                "id": id,
                "n_ctx": ready.n_ctx,
                "is_processing": st.busy.load(Relaxed),
                "n_tokens_cached": st.cached.load(Relaxed),
                "n_prompt_tokens": st.prompt.load(Relaxed),
                "n_decoded": st.generated.load(Relaxed),
            })
        })
        .collect();
    Ok(Json(Value::Array(list)))
}

async fn chat(State(s): State<AppState>, req: Request) -> Response {
    completion(s, req, Endpoint::Chat).await
}

async fn completions(State(s): State<AppState>, req: Request) -> Response {
    completion(s, req, Endpoint::Completion).await
}

async fn completion(s: AppState, req: Request, endpoint: Endpoint) -> Response {
    s.metrics.requests.fetch_add(1, Relaxed);
    counted(&s, handle(&s, req, endpoint).await)
}

fn tokenize(tok: &Tokenizer, input: &Input) -> Result<Vec<u32>, ApiError> {
    match input {
        Input::Chat(msgs) => tok
            .encode_chat(msgs, true)
            .map_err(|e| ApiError::invalid("messages", e.to_string())),
        Input::Completion(Prompt::Text(t)) => tok
            .encode(t, tok.add_bos(), false)
            .map_err(|e| ApiError::invalid("prompt", e.to_string())),
        Input::Completion(Prompt::Tokens(ids)) => Ok(ids.clone()),
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh 64-bit value (seeds and ids): std's randomly keyed SipHash of a counter.
fn random_u64() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(COUNTER.fetch_add(1, Relaxed))
}

async fn handle(s: &AppState, req: Request, endpoint: Endpoint) -> Result<Response, ApiError> {
    let deadline = crate::deadline(&s.cfg);
    let ready: &Ready = s.ready.get().ok_or_else(|| loading_error(s))?;
    if s.draining.load(Relaxed) {
        return Err(unavailable("the server is shutting down"));
    }
    let body = read_body(s, req).await?;
    let limits = RequestLimits {
        n_ctx: ready.n_ctx,
        n_vocab: ready.n_vocab,
        max_stop: s.cfg.max_stop,
        max_stop_bytes: s.cfg.max_stop_bytes,
        defaults: s.cfg.sampling_defaults.clone(),
    };
    let CompletionRequest {
        input,
        max_tokens,
        mut sampler,
        seeded,
        stop,
        stream,
        include_usage,
        logprobs,
        constraint,
        constraint_field,
        tools,
    } = api::parse_request(&body, endpoint, &limits)?;
    drop(body);
    let field = match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completion => "prompt",
    };
    // Admission, before the prompt is tokenized and the constraint compiled.
    let ticket = admit(s)?;

    let tok = Arc::clone(&ready.tokenizer);
    let prompt = tokenize_blocking(move || tokenize(&tok, &input)).await?;
    if prompt.is_empty() {
        return Err(ApiError::invalid(field, format!("`{field}` has no tokens")));
    }
    let n_ctx = ready.n_ctx;
    if prompt.len() >= n_ctx {
        return Err(ApiError::invalid(
            field,
            format!(
                "the prompt has {} tokens; the context holds {n_ctx}, so nothing can be generated",
                prompt.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let max_tokens = match max_tokens {
        Some(m) if prompt.len() + m > n_ctx => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!(
                    "prompt ({} tokens) + max_tokens ({m}) exceeds the context of {n_ctx} tokens",
                    prompt.len()
                ),
            )
            .with_code("context_length_exceeded"))
        }
        Some(m) => m,
        None => n_ctx - prompt.len(),
    };
    if !seeded {
        sampler.seed = random_u64();
    }
    // Compile the constraint here, so that a schema or grammar that does not compile is a
    // 400 before anything is queued; at most `parallel` compilations at once.
    let constraint = match constraint {
        None => None,
        Some(c) => {
            let _permit = s
                .compiles
                .acquire()
                .await
                .map_err(|_| unavailable("the server is shutting down"))?;
            let grammars = Arc::clone(&ready.grammars);
            let tok = Arc::clone(&ready.tokenizer);
            let compiled = tokenize_blocking(move || {
                let g = grammars
                    .get_or_init(|| bitnet_engine::Grammars::new(&tok).map_err(|e| e.to_string()));
                match g {
                    Ok(g) => g
                        .start(&c)
                        .map_err(|e| ApiError::invalid(constraint_field, e.to_string())),
                    Err(e) => Err(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        format!("constrained output is unavailable: {e}"),
                    )),
                }
            })
            .await?;
            Some(Box::new(compiled))
        }
    };

    let (tx, mut rx) = unbounded_channel();
    let job = Job {
        prompt,
        max_tokens,
        sampler,
        stop,
        logprobs,
        constraint,
        constraint_field,
        deadline,
        events: tx,
        _ticket: ticket,
    };
    ready
        .tx
        .send(Msg::Job(job))
        .map_err(|_| unavailable("the server is shutting down"))?;

    // Wait for a slot (or a refusal).
    match rx.recv().await {
        Some(GenEvent::Started) => {}
        Some(GenEvent::Error {
            status,
            kind,
            message,
            param,
        }) => return Err(event_error(status, kind, message, param)),
        _ => return Err(unavailable("the server is shutting down")),
    }

    let meta = ResponseMeta {
        id: format!(
            "{}-{:016x}",
            match endpoint {
                Endpoint::Chat => "chatcmpl",
                Endpoint::Completion => "cmpl",
            },
            random_u64()
        ),
        created: api::unix_now(),
        model: s.cfg.model_name.clone(),
        endpoint,
    };
    let tok = Arc::clone(&ready.tokenizer);
    if stream {
        return Ok(sse(meta, rx, include_usage, logprobs.map(|_| tok), tools));
    }
    let mut text = String::new();
    let mut entries = Vec::new();
    loop {
        match rx.recv().await {
            Some(GenEvent::Text { text: t, logprobs }) => {
                text.push_str(&t);
                entries.extend(logprobs);
            }
            Some(GenEvent::Done { finish, usage }) => {
                let lp = logprobs.map(|_| api::logprobs_json(endpoint, &entries, &tok, &mut 0));
                let (text, calls) = if tools {
                    let (content, calls) = split_reply(&text);
                    let calls: Vec<CallOut> = calls
                        .into_iter()
                        .map(|(name, arguments)| CallOut {
                            id: call_id(),
                            name,
                            arguments,
                        })
                        .collect();
                    (content, calls)
                } else {
                    (text, Vec::new())
                };
                let finish = tool_finish(finish, calls.len());
                return Ok(Json(meta.full(&text, &calls, finish, usage, lp)).into_response());
            }
            Some(GenEvent::Error {
                status,
                kind,
                message,
                param,
            }) => return Err(event_error(status, kind, message, param)),
            Some(GenEvent::Started) => {}
            None => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    "the generation ended without a result",
                ))
            }
        }
    }
}

/// A fresh tool call id: `call_` and 24 hexadecimal digits.
fn call_id() -> String {
    format!(
        "call_{:016x}{:08x}",
        random_u64(),
        random_u64() & 0xffff_ffff
    )
}

/// A reply that ended of itself after calling functions ends with `tool_calls`.
fn tool_finish(finish: &'static str, calls: usize) -> &'static str {
    if calls > 0 && finish == "stop" {
        "tool_calls"
    } else {
        finish
    }
}

fn event_error(
    status: u16,
    kind: &'static str,
    message: String,
    param: Option<&'static str>,
) -> ApiError {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut e = ApiError::new(status, kind, message);
    e.param = param.map(str::to_string);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        e.retry_after(1)
    } else {
        e
    }
}

struct StreamState {
    rx: UnboundedReceiver<GenEvent>,
    meta: ResponseMeta,
    include_usage: bool,
    /// Set when the request asked for logprobs: names their tokens.
    logprobs: Option<Arc<Tokenizer>>,
    /// Bytes of text sent so far (the completions shape's `text_offset`).
    offset: usize,
    out: VecDeque<String>,
    done: bool,
    /// Set when the reply may call tools: splits it into content and calls.
    calls: Option<ToolCallParser>,
}

impl StreamState {
    /// The chunks of a reply's pieces split by the tool-call parser; `lp` goes with the
    /// first (or alone, with an empty content delta, when the parser holds the text back).
    fn push_tool_events(&mut self, ev: Vec<ToolEvent>, mut lp: Option<Value>) {
        if ev.is_empty() && lp.is_some() {
            let c = self
                .meta
                .chunk(Some(""), None, self.include_usage, lp.take());
            self.out.push_back(c.to_string());
        }
        for e in ev {
            let c = match e {
                ToolEvent::Content(t) => {
                    self.meta
                        .chunk(Some(&t), None, self.include_usage, lp.take())
                }
                ToolEvent::CallStart { index, name } => self.meta.call_chunk(
                    index,
                    Some((&call_id(), &name)),
                    "",
                    self.include_usage,
                    lp.take(),
                ),
                ToolEvent::Arguments { index, fragment } => {
                    self.meta
                        .call_chunk(index, None, &fragment, self.include_usage, lp.take())
                }
            };
            self.out.push_back(c.to_string());
        }
    }
}

/// Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.
fn sse(
    meta: ResponseMeta,
    rx: UnboundedReceiver<GenEvent>,
    include_usage: bool,
    logprobs: Option<Arc<Tokenizer>>,
    tools: bool,
) -> Response {
    let mut out = VecDeque::new();
    if meta.endpoint == Endpoint::Chat {
        out.push_back(meta.chunk(None, None, include_usage, None).to_string());
    }
    let st = StreamState {
        rx,
        meta,
        include_usage,
        logprobs,
        offset: 0,
        out,
        done: false,
        calls: tools.then(ToolCallParser::new),
    };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(data) = st.out.pop_front() {
                return Some((Ok::<_, Infallible>(Event::default().data(data)), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some(GenEvent::Text { text, logprobs }) => {
                    let lp = st.logprobs.as_ref().map(|tok| {
                        api::logprobs_json(st.meta.endpoint, &logprobs, tok, &mut st.offset)
                    });
                    if let Some(p) = &mut st.calls {
                        let ev = p.push(&text);
                        st.push_tool_events(ev, lp);
                    } else {
                        st.out.push_back(
                            st.meta
                                .chunk(Some(&text), None, st.include_usage, lp)
                                .to_string(),
                        );
                    }
                }
                Some(GenEvent::Done { finish, usage }) => {
                    let mut finish = finish;
                    if let Some(mut p) = st.calls.take() {
                        let ev = p.finish();
                        st.push_tool_events(ev, None);
                        finish = tool_finish(finish, p.calls());
                    }
                    st.out.push_back(
                        st.meta
                            .chunk(None, Some(finish), st.include_usage, None)
                            .to_string(),
                    );
                    if st.include_usage {
                        st.out.push_back(st.meta.usage_chunk(usage).to_string());
                    }
                    st.out.push_back("[DONE]".into());
                    st.done = true;
                }
                Some(GenEvent::Error {
                    status,
                    kind,
                    message,
                    param,
                }) => {
                    st.out
                        .push_back(event_error(status, kind, message, param).body().to_string());
                    st.out.push_back("[DONE]".into());
                    st.done = true;
                }
                Some(GenEvent::Started) => {}
                None => {
                    let e = ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        "the generation ended without a result",
                    );
                    st.out.push_back(e.body().to_string());
                    st.out.push_back("[DONE]".into());
                    st.done = true;
                }
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
        .into_response()
}

/// The accept loop: HTTP/1.1 connections with a header-read timeout, a connection cap
/// and graceful shutdown.
pub(crate) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    let app = router(Arc::clone(&shared));
    let svc = hyper_util::service::TowerToHyperService::new(app);
    let (stop_tx, stop_rx) = watch::channel(false);
    let conns = Arc::new(Semaphore::new(shared.cfg.max_connections));
    let mut tasks = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
        };
        while tasks.try_join_next().is_some() {}
        let (stream, _peer) = match accepted {
            Ok(x) => x,
            Err(_) => {
                // Out of file descriptors and the like: back off, keep serving.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&conns).try_acquire_owned() else {
            drop(stream); // over the connection cap: close at once
            continue;
        };
        let _ = stream.set_nodelay(true);
        let svc = svc.clone();
        let mut stop = stop_rx.clone();
        let read_timeout = shared.cfg.read_timeout;
        tasks.spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(read_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = stop.wait_for(|s| *s) => {}
            }
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
    }

    // Drain: refuse new requests, let running ones finish within the grace period.
    drop(listener);
    shared.draining.store(true, Relaxed);
    let grace = shared.cfg.shutdown_grace;
    if let Some(r) = shared.ready.get() {
        let _ = r.tx.send(Msg::Drain {
            deadline: std::time::Instant::now() + grace,
        });
    }
    let _ = stop_tx.send(true);
    let all_done = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(grace + Duration::from_secs(5), all_done)
        .await
        .is_err()
    {
        tasks.abort_all();
    }
    // The scheduler exits once idle; wait for it (it ends every job at the deadline).
    let handle = shared.scheduler.lock().ok().and_then(|mut g| g.take());
    if let (Some(h), Some(_)) = (handle, shared.ready.get()) {
        let _ = tokio::task::spawn_blocking(move || h.join()).await;
    }
    Ok(())
}
