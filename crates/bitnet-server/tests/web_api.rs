//! The chat page's routes, CORS, and llama-server's /tokenize, /detokenize, /props and
//! /slots, over real HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers

mod common;

use std::time::Duration;

use bitnet_server::{Server, ServerConfig, ServerError};
use common::*;
use serde_json::{json, Value};

const KEY: &str = "sk-web-test";
const AUTH: (&str, &str) = ("Authorization", "Bearer sk-web-test");

async fn options(s: &TestServer, path: &str, headers: &[(&str, &str)]) -> Resp {
    let mut r = format!("OPTIONS {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    raw(s.addr, r.as_bytes()).await
}

const PREFLIGHT: [(&str, &str); 2] = [
    ("Access-Control-Request-Method", "POST"),
    (
        "Access-Control-Request-Headers",
        "authorization, content-type, x-stainless-os",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_by_default() {
    let s = TestServer::start(test_config()).await;
    let mut h = PREFLIGHT.to_vec();
    h.push(("Origin", "http://localhost:3000"));
    let r = options(&s, "/v1/chat/completions", &h).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.header("access-control-allow-origin"), None);
    let r = get(s.addr, "/v1/models", &[("Origin", "http://localhost:3000")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_allows_the_listed_origins_and_still_wants_the_key() {
    let s = TestServer::start(ServerConfig {
        api_key: Some(KEY.into()),
        cors_origins: vec!["http://localhost:3000".into(), "https://app.example".into()],
        ..test_config()
    })
    .await;
    // Preflight: answered without the key (browsers send none), naming what is allowed.
    for origin in ["http://localhost:3000", "https://app.example"] {
        let mut h = PREFLIGHT.to_vec();
        h.push(("Origin", origin));
        let r = options(&s, "/v1/chat/completions", &h).await;
        assert_eq!(r.status, 204, "{origin}");
        assert_eq!(r.header("access-control-allow-origin"), Some(origin));
        assert_eq!(
            r.header("access-control-allow-headers"),
            Some("authorization, content-type, x-stainless-os")
        );
        assert!(r
            .header("access-control-allow-methods")
            .unwrap()
            .contains("POST"));
        assert_eq!(r.header("vary"), Some("Origin"));
    }
    let mut h = PREFLIGHT.to_vec();
    h.push(("Origin", "https://evil.example"));
    let r = options(&s, "/v1/chat/completions", &h).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.header("access-control-allow-origin"), None);

    // The actual request: the key is still required; the error is readable cross-origin.
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
    let origin = ("Origin", "http://localhost:3000");
    let r = post_with(s.addr, "/v1/chat/completions", body.as_bytes(), &[origin]).await;
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    let r = post_with(
        s.addr,
        "/v1/chat/completions",
        body.as_bytes(),
        &[origin, AUTH],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    // Another origin's actual request gets no CORS header (the browser hides the reply).
    let r = post_with(
        s.addr,
        "/v1/chat/completions",
        body.as_bytes(),
        &[("Origin", "https://evil.example"), AUTH],
    )
    .await;
    assert_eq!(r.header("access-control-allow-origin"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_wildcard() {
    let s = TestServer::start(ServerConfig {
        cors_origins: vec!["*".into()],
        ..test_config()
    })
    .await;
    let mut h = PREFLIGHT.to_vec();
    h.push(("Origin", "https://anything.example"));
    let r = options(&s, "/v1/completions", &h).await;
    assert_eq!(r.status, 204);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    let r = get(s.addr, "/health", &[("Origin", "https://anything.example")]).await;
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
}

#[tokio::test]
async fn bad_cors_origins_are_refused_at_start() {
    for bad in [
        "",
        "localhost:3000",
        "http://a.example/",
        "http://a.example/path",
        "http://",
        "http://a b",
    ] {
        let cfg = ServerConfig {
            cors_origins: vec![bad.into()],
            ..test_config()
        };
        match Server::bind("127.0.0.1:0".parse().unwrap(), cfg).await {
            Err(ServerError::Config { field, .. }) => assert_eq!(field, "cors_origins", "{bad:?}"),
            other => panic!("{bad:?} accepted: {:?}", other.map(|_| ())),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_served_without_the_key_even_while_loading() {
    let s = TestServer::start_unloaded(ServerConfig {
        api_key: Some(KEY.into()),
        ..test_config()
    })
    .await;
    let r = get(s.addr, "/", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(r
        .header("content-security-policy")
        .unwrap()
        .contains("script-src 'self'"));
    let html = r.text();
    assert!(html.contains(r#"<script src="/assets/chat.js""#));
    assert!(html.contains(r#"href="/assets/chat.css""#));
    // No third-party resources: the page works offline.
    assert!(!html.contains("https://") && !html.contains("http://"));
    for (path, ty) in [
        ("/assets/chat.js", "text/javascript; charset=utf-8"),
        ("/assets/chat.css", "text/css; charset=utf-8"),
    ] {
        let r = get(s.addr, path, &[]).await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("content-type"), Some(ty));
        assert!(!r.text().contains("https://"), "{path}");
    }
    assert_eq!(get(s.addr, "/assets/other.js", &[]).await.status, 404);
    assert_eq!(get(s.addr, "/assets/../lib.rs", &[]).await.status, 404);
    // The API itself is still closed while loading.
    assert_eq!(get(s.addr, "/props", &[AUTH]).await.status, 503);
}

async fn post_json(s: &TestServer, path: &str, body: Value) -> Resp {
    post_with(s.addr, path, body.to_string().as_bytes(), &[AUTH]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize_round_trip() {
    let s = TestServer::start(ServerConfig {
        api_key: Some(KEY.into()),
        ..test_config()
    })
    .await;
    let tok = tiny_engine().tokenizer;
    for text in [
        "Hello world",
        "  leading spaces, tabs\tand\nnew lines",
        "Ünïcödé — 東京 🙂",
        "<|eot_id|> is special",
        "",
    ] {
        let r = post_json(&s, "/tokenize", json!({ "content": text })).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let ids: Vec<u32> = serde_json::from_value(r.json()["tokens"].clone()).unwrap();
        assert_eq!(ids, tok.encode(text, false, true).unwrap(), "{text:?}");
        let r = post_json(&s, "/detokenize", json!({ "tokens": ids })).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["content"], text);

        // With pieces: ids and pieces; the pieces' bytes make up the text.
        let r = post_json(
            &s,
            "/tokenize",
            json!({ "content": text, "with_pieces": true, "add_special": true }),
        )
        .await;
        let toks = r.json()["tokens"].as_array().unwrap().clone();
        assert_eq!(toks[0]["id"], tok.bos().unwrap());
        let mut bytes = Vec::new();
        for t in &toks[1..] {
            match &t["piece"] {
                Value::String(p) => bytes.extend_from_slice(p.as_bytes()),
                Value::Array(b) => {
                    bytes.extend(b.iter().map(|x| u8::try_from(x.as_u64().unwrap()).unwrap()))
                }
                other => panic!("piece {other}"),
            }
        }
        assert_eq!(String::from_utf8(bytes).unwrap(), text);
    }
    // parse_special: false keeps a control token's text as text.
    let r = post_json(
        &s,
        "/tokenize",
        json!({ "content": "<|eot_id|>", "parse_special": false }),
    )
    .await;
    let ids = r.json()["tokens"].as_array().unwrap().len();
    assert!(ids > 1, "{}", r.text());

    for (path, body, param) in [
        ("/tokenize", json!({}), Some("content")),
        ("/tokenize", json!({ "content": 5 }), Some("content")),
        (
            "/tokenize",
            json!({ "content": "a", "with_pieces": "yes" }),
            Some("with_pieces"),
        ),
        ("/detokenize", json!({ "tokens": "abc" }), Some("tokens")),
        ("/detokenize", json!({ "tokens": [4256] }), Some("tokens")),
        ("/detokenize", json!({ "tokens": [-1] }), Some("tokens")),
        ("/detokenize", json!({ "tokens": [1.5] }), Some("tokens")),
        ("/detokenize", json!([1, 2]), None),
    ] {
        let r = post_json(&s, path, body.clone()).await;
        assert_eq!(r.status, 400, "{path} {body}");
        assert_eq!(r.error_param().as_deref(), param, "{path} {body}");
    }
    let r = post_with(s.addr, "/tokenize", b"{not json", &[AUTH]).await;
    assert_eq!(r.status, 400);
    // Behind the key.
    let r = post(s.addr, "/tokenize", r#"{"content":"a"}"#).await;
    assert_eq!(r.status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn props_and_slots() {
    let s = TestServer::start(ServerConfig {
        api_key: Some(KEY.into()),
        parallel: 2,
        step_delay: Some(Duration::from_millis(40)),
        ..test_config()
    })
    .await;
    assert_eq!(get(s.addr, "/props", &[]).await.status, 401);
    assert_eq!(get(s.addr, "/slots", &[]).await.status, 401);
    let p = get(s.addr, "/props", &[AUTH]).await.json();
    assert_eq!(p["total_slots"], 2);
    assert_eq!(p["model_alias"], "tiny");
    assert_eq!(p["default_generation_settings"]["n_ctx"], 512);
    let params = &p["default_generation_settings"]["params"];
    assert_eq!(params["top_k"], 40);
    assert!((params["temperature"].as_f64().unwrap() - 0.8).abs() < 1e-6);
    assert_eq!(p["bos_token"], "<|begin_of_text|>");

    let idle = get(s.addr, "/slots", &[AUTH]).await.json();
    assert_eq!(idle.as_array().unwrap().len(), 2);
    assert!(idle
        .as_array()
        .unwrap()
        .iter()
        .all(|x| x["is_processing"] == false && x["n_tokens_cached"] == 0));

    // A slow generation: one slot is busy while it runs.
    let addr = s.addr;
    let gen = tokio::spawn(async move {
        post_with(
            addr,
            "/v1/completions",
            br#"{"prompt":"Once upon a time","max_tokens":40,"temperature":0}"#,
            &[AUTH],
        )
        .await
    });
    let t = std::time::Instant::now();
    let busy = loop {
        let v = get(s.addr, "/slots", &[AUTH]).await.json();
        if let Some(b) = v
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["is_processing"] == true && x["n_decoded"].as_u64().unwrap() > 0)
        {
            break b.clone();
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no slot became busy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(busy["n_prompt_tokens"].as_u64().unwrap() > 0);
    let r = gen.await.unwrap();
    assert_eq!(r.status, 200);
    let usage = &r.json()["usage"];
    let id = usize::try_from(busy["id"].as_u64().unwrap()).unwrap();
    let t = std::time::Instant::now();
    let done = loop {
        let v = get(s.addr, "/slots", &[AUTH]).await.json();
        if s.handle.in_flight() == 0 && v[id]["is_processing"] == false {
            break v;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the slot stayed busy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(done[id]["is_processing"], false);
    // Prompt and generated tokens stay cached for reuse (the last sampled one is not).
    assert_eq!(
        done[id]["n_tokens_cached"].as_u64().unwrap(),
        usage["total_tokens"].as_u64().unwrap() - 1
    );
    assert_eq!(done[id]["n_decoded"], usage["completion_tokens"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_requests_are_checked() {
    let s = TestServer::start(test_config()).await;
    let msgs = r#""messages":[{"role":"user","content":"hi"}],"max_tokens":2"#;
    for (body, param) in [
        (format!(r#"{{{msgs},"top_logprobs":2}}"#), "top_logprobs"),
        (
            format!(r#"{{{msgs},"logprobs":true,"top_logprobs":21}}"#),
            "top_logprobs",
        ),
        (
            format!(r#"{{{msgs},"logprobs":true,"top_logprobs":-1}}"#),
            "top_logprobs",
        ),
        (format!(r#"{{{msgs},"logprobs":1}}"#), "logprobs"),
    ] {
        let r = post(s.addr, "/v1/chat/completions", &body).await;
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.error_param().as_deref(), Some(param), "{body}");
    }
    for body in [
        r#"{"prompt":"a","logprobs":21}"#,
        r#"{"prompt":"a","logprobs":-1}"#,
        r#"{"prompt":"a","logprobs":"2"}"#,
    ] {
        let r = post(s.addr, "/v1/completions", body).await;
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.error_param().as_deref(), Some("logprobs"), "{body}");
    }
    // Without logprobs the field is null, as before; with it, one entry per token.
    let r = post(s.addr, "/v1/chat/completions", &format!("{{{msgs}}}")).await;
    assert_eq!(r.json()["choices"][0]["logprobs"], Value::Null);
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &format!(r#"{{{msgs},"logprobs":true,"temperature":0}}"#),
    )
    .await
    .json();
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len(),
        usize::try_from(r["usage"]["completion_tokens"].as_u64().unwrap()).unwrap()
    );
    assert!(content
        .iter()
        .all(|e| e["top_logprobs"].as_array().unwrap().is_empty()));
    let r = post(
        s.addr,
        "/v1/completions",
        r#"{"prompt":"a","max_tokens":3,"logprobs":0,"temperature":0}"#,
    )
    .await
    .json();
    assert_eq!(
        r["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}
