//! `POST /v1/embeddings`: OpenAI's embeddings API over the loaded model.
//!
//! Request: `input` (a string, an array of strings, an array of token ids, or an array of
//! arrays of token ids; at most [`MAX_INPUTS`], none empty), `encoding_format` (`float`, the
//! default, or `base64`: the little-endian f32 bytes), `dimensions` (keep the first N values,
//! then L2-normalize again; 1 to the model's width), `bits` (an extension: 8, 4, 2 or 1 —
//! each vector quantized by [`bitnet_engine::quantize_embedding`]; `embedding` is then its
//! integer codes, or with `base64` the packed codes, and `scale` what one step is worth),
//! `model` and `user` (accepted, not used).
//! Texts are tokenized as `bitnet embed` does (BOS where the vocabulary adds it, EOS where the
//! file asks). The vectors are the file's pooling, L2-normalized; a file that pools nothing
//! (`pooling_type` none) is refused, as llama-server refuses it on this endpoint.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use bitnet_model::Pooling;
use serde_json::{json, Map, Value};

use crate::api::ApiError;
use crate::request::{
    counted, json_object, loading_error, tokenize_blocking, unavailable, AppState,
};
use crate::scheduler::{EmbedJob, Msg};
use crate::Ready;

/// Most inputs in one request (OpenAI's limit).
pub(crate) const MAX_INPUTS: usize = 2048;

/// One input as sent.
#[derive(Debug, Clone, PartialEq)]
enum Input {
    Text(String),
    Tokens(Vec<u32>),
}

/// A validated request.
#[derive(Debug)]
struct Request_ {
    inputs: Vec<Input>,
    base64: bool,
    dimensions: Option<usize>,
    bits: Option<u32>,
}

fn tokens(v: &[Value], n_vocab: usize, field: &str) -> Result<Vec<u32>, ApiError> {
    if v.is_empty() {
        return Err(ApiError::invalid(field, format!("`{field}` has no tokens")));
    }
    v.iter()
        .map(|t| {
            t.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .filter(|&id| usize::try_from(id).is_ok_and(|i| i < n_vocab))
                .ok_or_else(|| {
                    ApiError::invalid(
                        field,
                        format!("token id {t} is not an integer in [0, {n_vocab})"),
                    )
                })
        })
        .collect()
}

fn parse(o: &Map<String, Value>, n_vocab: usize, n_embd: usize) -> Result<Request_, ApiError> {
    let inputs = match o.get("input") {
        None | Some(Value::Null) => return Err(ApiError::invalid("input", "`input` is required")),
        Some(Value::String(t)) => vec![Input::Text(t.clone())],
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid("input", "`input` is an empty array"))
        }
        Some(Value::Array(items)) if items.len() > MAX_INPUTS => {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "`input` has {} items; at most {MAX_INPUTS} are taken",
                    items.len()
                ),
            ))
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            vec![Input::Tokens(tokens(items, n_vocab, "input")?)]
        }
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let field = format!("input[{i}]");
                match item {
                    Value::String(t) => Ok(Input::Text(t.clone())),
                    Value::Array(ids) => Ok(Input::Tokens(tokens(ids, n_vocab, &field)?)),
                    _ => Err(ApiError::invalid(
                        field,
                        "each input is a string or an array of token ids",
                    )),
                }
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                "input",
                "`input` must be a string, an array of strings, or token ids",
            ))
        }
    };
    for (i, input) in inputs.iter().enumerate() {
        if matches!(input, Input::Text(t) if t.is_empty()) {
            return Err(ApiError::invalid(
                format!("input[{i}]"),
                "an input is an empty string",
            ));
        }
    }
    let base64 = match o.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(_) => {
            return Err(ApiError::invalid(
                "encoding_format",
                "`encoding_format` is \"float\" or \"base64\"",
            ))
        }
    };
    let dimensions = match o.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64().and_then(|d| usize::try_from(d).ok()) {
            Some(d) if (1..=n_embd).contains(&d) => Some(d),
            _ => {
                return Err(ApiError::invalid(
                    "dimensions",
                    format!("`dimensions` must be an integer from 1 to {n_embd}"),
                ))
            }
        },
    };
    let bits = match o.get("bits") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(b @ (8 | 4 | 2 | 1)) => u32::try_from(b).ok(),
            _ => {
                return Err(ApiError::invalid(
                    "bits",
                    "`bits` (embedding quantization) is 8, 4, 2 or 1",
                ))
            }
        },
    };
    for key in ["model", "user"] {
        if o.get(key).is_some_and(|v| !v.is_string() && !v.is_null()) {
            return Err(ApiError::invalid(key, format!("`{key}` must be a string")));
        }
    }
    Ok(Request_ {
        inputs,
        base64,
        dimensions,
        bits,
    })
}

/// The first `d` values of a unit vector, made unit again.
fn truncated(v: &[f32], d: usize) -> Vec<f32> {
    bitnet_model::numerics::l2_normalized(&v[..d.min(v.len())])
}

pub(crate) async fn route(State(s): State<AppState>, req: Request) -> Response {
    s.metrics.requests.fetch_add(1, Relaxed);
    counted(&s, handle(&s, req).await)
}

async fn handle(s: &AppState, req: Request) -> Result<Response, ApiError> {
    let ready: &Ready = s.ready.get().ok_or_else(|| loading_error(s))?;
    if s.draining.load(Relaxed) {
        return Err(unavailable("the server is shutting down"));
    }
    if ready.pooling == Pooling::None {
        return Err(ApiError::invalid(
            "model",
            "this model's pooling_type is none (one vector per token), which the embeddings \
             API cannot return",
        ));
    }
    let o = json_object(s, req).await?;
    let r = parse(&o, ready.n_vocab, ready.n_embd)?;
    drop(o);
    // Admission before the inputs are tokenized (as for generation).
    let ticket = crate::request::admit(s)?;
    let tok = Arc::clone(&ready.tokenizer);
    let n_ctx = ready.n_ctx;
    let inputs = tokenize_blocking(move || {
        r.inputs
            .iter()
            .enumerate()
            .map(|(i, input)| {
                let field = format!("input[{i}]");
                let ids = match input {
                    Input::Text(t) => bitnet_engine::embed_tokens(&tok, t)
                        .map_err(|e| ApiError::invalid(field.clone(), e.to_string()))?,
                    Input::Tokens(ids) => ids.clone(),
                };
                if ids.is_empty() {
                    return Err(ApiError::invalid(field, "the input has no tokens"));
                }
                if ids.len() > n_ctx {
                    return Err(ApiError::invalid(
                        field,
                        format!(
                            "the input has {} tokens; the context holds {n_ctx}",
                            ids.len()
                        ),
                    )
                    .with_code("context_length_exceeded"));
                }
                Ok(ids)
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    let (reply, rx) = tokio::sync::oneshot::channel();
    ready
        .tx
        .send(Msg::Embed(EmbedJob {
            inputs,
            opts: bitnet_engine::EmbedOptions::default(),
            reply,
            _ticket: ticket,
        }))
        .map_err(|_| unavailable("the server is shutting down"))?;
    let vectors = match rx.await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                e,
            ))
        }
        Err(_) => return Err(unavailable("the server is shutting down")),
    };
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let v = match r.dimensions {
                Some(d) => truncated(v, d),
                None => v.clone(),
            };
            let b64 =
                |bytes: Vec<u8>| json!(base64::engine::general_purpose::STANDARD.encode(bytes));
            match r.bits.map(|b| bitnet_engine::quantize_embedding(&v, b)) {
                None => {
                    let embedding = if r.base64 {
                        b64(v.iter().flat_map(|x| x.to_le_bytes()).collect())
                    } else {
                        json!(v)
                    };
                    Ok(json!({"object": "embedding", "index": i, "embedding": embedding}))
                }
                Some(Ok(q)) => {
                    let embedding = if r.base64 {
                        b64(q.packed())
                    } else {
                        json!(q.codes)
                    };
                    Ok(
                        json!({"object": "embedding", "index": i, "embedding": embedding,
                              "bits": q.bits, "scale": q.scale}),
                    )
                }
                Some(Err(e)) => Err(ApiError::invalid("bits", e.to_string())),
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": s.cfg.model_name,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }))
    .into_response())
}
