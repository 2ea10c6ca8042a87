//! The chat page served at `/`: plain HTML, CSS and JavaScript embedded in the binary
//! (no build step, no CDN, works offline). It talks to this server's own API.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::api::ApiError;

const INDEX: &str = include_str!("../web/index.html");
const JS: &str = include_str!("../web/chat.js");
const CSS: &str = include_str!("../web/chat.css");

/// Scripts and styles only from this server; requests only to it.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn page(content_type: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

pub(crate) async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX)
}

pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    match file.as_str() {
        "chat.js" => page("text/javascript; charset=utf-8", JS),
        "chat.css" => page("text/css; charset=utf-8", CSS),
        _ => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("no asset {file:?}"),
        )
        .into_response(),
    }
}
