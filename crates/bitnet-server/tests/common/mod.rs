//! Shared test support: the tiny golden model, an in-process server on 127.0.0.1:0 and a
//! raw HTTP/1.1 client (raw so that malformed requests can be sent as they are).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bitnet_engine::{Engine, EngineOptions};
use bitnet_gguf::{GgufFile, Limits};
use bitnet_model::OwnedModel;
use bitnet_server::{Server, ServerConfig, ServerHandle};
use bitnet_tokenizer::Tokenizer;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub fn tiny_path() -> std::path::PathBuf {
    bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf")
}

/// The golden tiny model, opened once per test binary and shared.
pub fn tiny_file() -> Arc<GgufFile> {
    static F: OnceLock<Arc<GgufFile>> = OnceLock::new();
    Arc::clone(F.get_or_init(|| {
        Arc::new(
            GgufFile::open(&tiny_path(), &Limits::default())
                .expect("the golden tiny model (testdata/golden/tiny) opens"),
        )
    }))
}

pub fn tiny_engine() -> Engine {
    engine_of(tiny_file())
}

/// The trained model of testdata/trained (its text is words: the chat page's screenshot).
pub fn trained_engine() -> Engine {
    engine_of(Arc::new(
        GgufFile::open(
            &bitnet_testdata::trained("kjv-i2_s.gguf"),
            &Limits::default(),
        )
        .expect("the trained model (testdata/trained) opens"),
    ))
}

fn engine_of(f: Arc<GgufFile>) -> Engine {
    let tok = Tokenizer::from_gguf(f.metadata(), None).unwrap();
    let model = OwnedModel::load(f).unwrap();
    Engine::new(
        model,
        tok,
        EngineOptions {
            threads: 1,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Generation through the engine's own single-sequence loop: the text pieces it
/// streams and the number of tokens it generated (the server must match it).
pub fn reference_pieces(
    prompt: &[u32],
    max_tokens: usize,
    sampler: bitnet_sampling::SamplerParams,
) -> (Vec<String>, usize) {
    reference_pieces_on(&tiny_engine(), prompt, max_tokens, sampler)
}

/// [`reference_pieces`] on a given engine (the GPU tests pass one loaded on the GPU).
pub fn reference_pieces_on(
    engine: &Engine,
    prompt: &[u32],
    max_tokens: usize,
    sampler: bitnet_sampling::SamplerParams,
) -> (Vec<String>, usize) {
    let mut session = engine.new_session(512).unwrap();
    let mut pieces = Vec::new();
    let params = bitnet_engine::GenParams {
        max_tokens,
        sampler,
        stop: Vec::new(),
        context_policy: bitnet_engine::ContextPolicy::Stop,
        constraint: None,
    };
    let stats = engine
        .generate(&mut session, prompt, false, &params, &mut |ev| {
            if let bitnet_engine::Event::Text(t) = ev {
                pieces.push(t.to_string());
            }
            true
        })
        .unwrap();
    (pieces, stats.generated_tokens)
}

/// [`reference_pieces`] as one text, with the generated-token count.
pub fn reference(
    prompt: &[u32],
    max_tokens: usize,
    sampler: bitnet_sampling::SamplerParams,
) -> (String, usize) {
    let (pieces, n) = reference_pieces(prompt, max_tokens, sampler);
    (pieces.concat(), n)
}

/// How long to wait on the server for something that takes `secs` at most in a normal build:
/// `secs` times `BITNET_TEST_TIME_SCALE`, which a slow instrumented build sets
/// (scripts/tsan); 1 when unset or not a positive whole number.
pub fn patience(secs: u64) -> Duration {
    let scale = std::env::var("BITNET_TEST_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&k| k > 0)
        .unwrap_or(1);
    Duration::from_secs(secs.saturating_mul(scale))
}

/// A config for tests: small timeouts so that failures show quickly.
pub fn test_config() -> ServerConfig {
    ServerConfig {
        parallel: 2,
        max_queue: 4,
        read_timeout: Duration::from_secs(2),
        shutdown_grace: Duration::from_secs(2),
        model_name: "tiny".into(),
        ..ServerConfig::default()
    }
}

/// A running in-process server; shut down on `stop` (or drop).
pub struct TestServer {
    pub addr: SocketAddr,
    pub handle: ServerHandle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub join: Option<tokio::task::JoinHandle<Result<(), bitnet_server::ServerError>>>,
}

impl TestServer {
    /// Bind, load the tiny model and wait until ready.
    pub async fn start(cfg: ServerConfig) -> TestServer {
        Self::start_with(cfg, tiny_engine).await
    }

    /// Bind, load the engine `make` gives and wait until ready.
    pub async fn start_with(cfg: ServerConfig, make: fn() -> Engine) -> TestServer {
        let s = Self::start_unloaded(cfg).await;
        s.handle.load(move || Ok(make()));
        tokio::time::timeout(patience(30), s.handle.wait_ready())
            .await
            .expect("model load timed out")
            .unwrap();
        s
    }

    /// Bind and serve without a model (every route answers 503).
    pub async fn start_unloaded(cfg: ServerConfig) -> TestServer {
        let server = Server::bind("127.0.0.1:0".parse().unwrap(), cfg)
            .await
            .unwrap();
        let addr = server.local_addr().unwrap();
        let handle = server.handle();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let join = tokio::spawn(server.run(async move {
            let _ = rx.await;
        }));
        TestServer {
            addr,
            handle,
            stop: Some(tx),
            join: Some(join),
        }
    }

    /// Request shutdown and wait (bounded) for the server to return.
    pub async fn stop(mut self) -> Duration {
        let t = std::time::Instant::now();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(j) = self.join.take() {
            tokio::time::timeout(patience(20), j)
                .await
                .expect("server did not stop")
                .unwrap()
                .unwrap();
        }
        t.elapsed()
    }

    pub fn trigger_stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// A `/metrics` sample value.
    pub async fn metric(&self, name: &str) -> f64 {
        let r = get(self.addr, "/metrics", &[]).await;
        assert_eq!(r.status, 200);
        let text = r.text();
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix(' '))
                    .map(|v| v.parse::<f64>().unwrap())
            })
            .unwrap_or_else(|| panic!("metric {name} missing"))
    }

    /// Wait until no request is in the scheduler's hands and no slot is busy.
    pub async fn wait_idle(&self, within: Duration) {
        let t = std::time::Instant::now();
        loop {
            let busy = self.metric("bitnet_slots_busy").await;
            let queued = self.metric("bitnet_queue_depth").await;
            if busy == 0.0 && queued == 0.0 && self.handle.in_flight() == 0 {
                return;
            }
            assert!(
                t.elapsed() < within,
                "still busy after {within:?}: slots {busy}, queue {queued}, in flight {}",
                self.handle.in_flight()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    /// The `param` of an OpenAI error body.
    pub fn error_param(&self) -> Option<String> {
        self.json()["error"]["param"].as_str().map(str::to_string)
    }
    /// `data:` payloads of an SSE body.
    pub fn sse_data(&self) -> Vec<String> {
        sse_data(&self.text())
    }
}

pub fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|ev| {
            let data: Vec<&str> = ev
                .lines()
                .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

/// Send raw bytes, read until the server closes, parse the response.
pub async fn raw(addr: SocketAddr, req: &[u8]) -> Resp {
    raw_within(addr, req, patience(30)).await
}

/// [`raw`], waiting up to `limit` for the whole response.
pub async fn raw_within(addr: SocketAddr, req: &[u8], limit: Duration) -> Resp {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(req).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(limit, s.read_to_end(&mut buf))
        .await
        .expect("response timed out")
        .unwrap();
    parse_response(&buf)
}

pub fn parse_response(buf: &[u8]) -> Resp {
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(buf)));
    let head = std::str::from_utf8(&buf[..split]).unwrap();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = buf[split + 4..].to_vec();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = dechunk(&body);
    }
    Resp {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        b = &b[eol + 2..];
        if size == 0 || b.len() < size {
            out.extend_from_slice(&b[..size.min(b.len())]);
            return out;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[(size + 2).min(b.len())..];
    }
}

fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        r.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    r.push_str("\r\n");
    let mut r = r.into_bytes();
    r.extend_from_slice(body);
    r
}

pub async fn post(addr: SocketAddr, path: &str, body: &str) -> Resp {
    post_with(addr, path, body.as_bytes(), &[]).await
}

/// [`post`], waiting up to `limit` for the whole response.
pub async fn post_within(addr: SocketAddr, path: &str, body: &str, limit: Duration) -> Resp {
    raw_within(
        addr,
        &request_bytes("POST", path, &[], body.as_bytes()),
        limit,
    )
    .await
}

pub async fn post_with(
    addr: SocketAddr,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> Resp {
    raw(addr, &request_bytes("POST", path, headers, body)).await
}

pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Resp {
    raw(addr, &request_bytes("GET", path, headers, b"")).await
}

/// Open a streaming request and return the connection, the response head already read.
pub async fn open_stream(addr: SocketAddr, path: &str, body: &str) -> (u16, TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&request_bytes("POST", path, &[], body.as_bytes()))
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(patience(30), s.read(&mut chunk))
            .await
            .expect("no response head")
            .unwrap();
        assert!(n > 0, "closed before the response head");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let status = std::str::from_utf8(&buf[..p])
                .unwrap()
                .split(' ')
                .nth(1)
                .unwrap()
                .parse()
                .unwrap();
            let rest = buf[p + 4..].to_vec();
            return (status, s, rest);
        }
    }
}

/// The text of a chat or completion response (streamed or not).
pub fn text_of(v: &Value) -> String {
    let c = &v["choices"][0];
    c["message"]["content"]
        .as_str()
        .or_else(|| c["text"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Concatenate the text deltas of SSE `data:` payloads; returns (text, finish_reason,
/// usage, whether `[DONE]` ended it).
pub fn collect_stream(data: &[String]) -> (String, Option<String>, Option<Value>, bool) {
    let mut text = String::new();
    let mut finish = None;
    let mut usage = None;
    let mut done = false;
    for d in data {
        if d == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(d).unwrap();
        assert!(v.get("error").is_none(), "stream error: {d}");
        if let Some(c) = v["choices"].get(0) {
            if let Some(t) = c["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(t) = c["text"].as_str() {
                text.push_str(t);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
        if v["usage"].is_object() {
            usage = Some(v["usage"].clone());
        }
    }
    (text, finish, usage, done)
}

/// Resident set size of this process, in bytes.
pub fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    kb * 1024
}
