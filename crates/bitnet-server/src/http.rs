//! Routes, handlers, the auth/loading gate and the accept loop.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bitnet_tokenizer::Tokenizer;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::api::{
    self, ApiError, CompletionRequest, Endpoint, Input, Prompt, RequestLimits, ResponseMeta,
};
use crate::scheduler::{GenEvent, Job, Msg, Ticket};
use crate::{Phase, Ready, ServerError, Shared};

type AppState = Arc<Shared>;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(Arc::clone(&state), gate))
        .with_state(state)
}

/// 503 while loading, 401 without the right key; `/health` passes through.
async fn gate(State(s): State<AppState>, req: Request, next: Next) -> Response {
    if req.uri().path() == "/health" {
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

fn loading_error(s: &Shared) -> ApiError {
    match &*s.phase.borrow() {
        Phase::Failed(e) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            format!("the model failed to load: {e}"),
        ),
        _ => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            "Loading model",
        )
        .retry_after(1),
    }
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
    if s.ready.get().is_some() && !failed {
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

async fn chat(State(s): State<AppState>, req: Request) -> Response {
    completion(s, req, Endpoint::Chat).await
}

async fn completions(State(s): State<AppState>, req: Request) -> Response {
    completion(s, req, Endpoint::Completion).await
}

async fn completion(s: AppState, req: Request, endpoint: Endpoint) -> Response {
    s.metrics.requests.fetch_add(1, Relaxed);
    match handle(&s, req, endpoint).await {
        Ok(r) => r,
        Err(e) => {
            let counter = match e.status.as_u16() {
                429 => &s.metrics.rejected_busy,
                400..=499 => &s.metrics.rejected_invalid,
                _ => &s.metrics.errors,
            };
            counter.fetch_add(1, Relaxed);
            e.into_response()
        }
    }
}

async fn read_body(s: &Shared, req: Request) -> Result<Bytes, ApiError> {
    let limit = s.cfg.max_body_bytes;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| u64::try_from(limit).is_ok_and(|l| n > l)) {
        return Err(too_large());
    }
    let body = Limited::new(req.into_body(), limit);
    match tokio::time::timeout(s.cfg.read_timeout, body.collect()).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "the request body was not received in time",
        )),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Ok(Err(e)) => Err(ApiError::bad_body(format!(
            "cannot read the request body: {e}"
        ))),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
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

fn unavailable(msg: &str) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", msg).retry_after(1)
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
    } = api::parse_request(&body, endpoint, &limits)?;
    drop(body);
    let field = match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completion => "prompt",
    };

    // Tokenize on a blocking thread: a large prompt must not stall the runtime.
    let tok = Arc::clone(&ready.tokenizer);
    let prompt = tokio::task::spawn_blocking(move || tokenize(&tok, &input))
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("tokenization failed: {e}"),
            )
        })??;
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

    // Admission: a bounded number of requests in the scheduler's hands.
    let ticket = Ticket::try_take(&s.in_flight, s.cfg.parallel.saturating_add(s.cfg.max_queue))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "the server is busy: {} requests are generating or waiting; retry later",
                    s.cfg.parallel.saturating_add(s.cfg.max_queue)
                ),
            )
            .with_code("queue_full")
            .retry_after(1)
        })?;
    let (tx, mut rx) = unbounded_channel();
    let job = Job {
        prompt,
        max_tokens,
        sampler,
        stop,
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
        }) => return Err(event_error(status, kind, message)),
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
    if stream {
        return Ok(sse(meta, rx, include_usage));
    }
    let mut text = String::new();
    loop {
        match rx.recv().await {
            Some(GenEvent::Text(t)) => text.push_str(&t),
            Some(GenEvent::Done { finish, usage }) => {
                return Ok(Json(meta.full(&text, finish, usage)).into_response())
            }
            Some(GenEvent::Error {
                status,
                kind,
                message,
            }) => return Err(event_error(status, kind, message)),
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

fn event_error(status: u16, kind: &'static str, message: String) -> ApiError {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let e = ApiError::new(status, kind, message);
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
    out: VecDeque<String>,
    done: bool,
}

/// Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.
fn sse(meta: ResponseMeta, rx: UnboundedReceiver<GenEvent>, include_usage: bool) -> Response {
    let mut out = VecDeque::new();
    if meta.endpoint == Endpoint::Chat {
        out.push_back(meta.chunk(None, None, include_usage).to_string());
    }
    let st = StreamState {
        rx,
        meta,
        include_usage,
        out,
        done: false,
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
                Some(GenEvent::Text(t)) => st
                    .out
                    .push_back(st.meta.chunk(Some(&t), None, st.include_usage).to_string()),
                Some(GenEvent::Done { finish, usage }) => {
                    st.out.push_back(
                        st.meta
                            .chunk(None, Some(finish), st.include_usage)
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
                }) => {
                    st.out
                        .push_back(event_error(status, kind, message).body().to_string());
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
