//! What every handler shares: the state they are given, an error as its response, a body
//! read within the limits, admission, the result counted by kind, and tokenizing off the
//! runtime. The routes (http.rs) and the embeddings endpoint (embeddings.rs) both use it.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::Value;

use crate::api::ApiError;
use crate::scheduler::Ticket;
use crate::{Phase, Shared};

pub(crate) type AppState = Arc<Shared>;

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

pub(crate) fn loading_error(s: &Shared) -> ApiError {
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

/// A JSON object body for the llama-server endpoints.
pub(crate) async fn json_object(
    s: &Shared,
    req: Request,
) -> Result<serde_json::Map<String, Value>, ApiError> {
    let body = read_body(s, req).await?;
    match serde_json::from_slice(&body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::bad_body("the body must be a JSON object")),
        Err(e) => Err(ApiError::bad_body(format!(
            "the body is not valid JSON: {e}"
        ))),
    }
}

/// A handler's result as the response, its error counted by kind (busy, invalid, failed).
pub(crate) fn counted(s: &Shared, r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(|e| {
        let counter = match e.status.as_u16() {
            429 => &s.metrics.rejected_busy,
            400..=499 => &s.metrics.rejected_invalid,
            _ => &s.metrics.errors,
        };
        counter.fetch_add(1, Relaxed);
        e.into_response()
    })
}

/// The request's body, within the size limit and the read timeout.
pub(crate) async fn read_body(s: &Shared, req: Request) -> Result<Bytes, ApiError> {
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

/// Admission: a ticket for one of the `parallel + max_queue` requests the server holds at once
/// (generating, embedding or waiting), or a 429 with `Retry-After`. Taken before a request's
/// text is tokenized or its constraint compiled, so that a flood of requests cannot run those
/// without bound.
pub(crate) fn admit(s: &Shared) -> Result<Ticket, ApiError> {
    let cap = s.cfg.parallel.saturating_add(s.cfg.max_queue);
    Ticket::try_take(&s.in_flight, cap).ok_or_else(|| {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!("the server is busy: {cap} requests are in hand; retry later"),
        )
        .with_code("queue_full")
        .retry_after(1)
    })
}

/// Runs a tokenization on a blocking thread: a large text must not stall the runtime.
pub(crate) async fn tokenize_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("tokenization failed: {e}"),
        )
    })?
}

pub(crate) fn unavailable(msg: &str) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", msg).retry_after(1)
}
