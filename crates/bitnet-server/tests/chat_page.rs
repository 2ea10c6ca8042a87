//! The chat page in a real browser: Chromium, headless, driven over the DevTools protocol.
//!
//! Starts the server on the trained model of testdata/trained, opens `/`, enters the API key, sends a
//! message and checks the streamed reply against the engine's own generation, then stops
//! a long reply and checks that the server saw the cancellation. On failure a screenshot
//! is saved next to the test's other output (the path is printed); on success the page
//! is saved as `chat_page.png` there (and to `$BITNET_SCREENSHOT` when set).
//!
//! Needs Chromium (`chromium`, `chromium-browser` or `google-chrome` on the PATH, or
//! `$BITNET_CHROMIUM`; `.ci/run` installs Debian's). Without it the test fails when `CI`
//! is set and is skipped, loudly, otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bitnet_sampling::SamplerParams;
use bitnet_server::{ServerConfig, ServerHandle};
use bitnet_tokenizer::{ChatMessage, ChatRole};
use common::*;
use serde_json::{json, Value};
use tungstenite::{Message, WebSocket};

const KEY: &str = "sk-page-test";

fn find_chromium() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("BITNET_CHROMIUM") {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ] {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err("no Chromium found (chromium, chromium-browser, google-chrome, or $BITNET_CHROMIUM)".into())
}

/// A headless Chromium and a DevTools connection to its page.
struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    ws: WebSocket<TcpStream>,
    next_id: u64,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP GET (the DevTools target list).
fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    // Read the head, then Content-Length bytes (the DevTools server keeps the
    // connection open).
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        let n = s.read(&mut chunk).map_err(|e| format!("GET {path}: {e}"))?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let len = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok());
        if len.is_some_and(|len| buf.len() >= end + 4 + len) {
            break;
        }
    }
    let r = parse_response(&buf);
    String::from_utf8(r.body).map_err(|e| e.to_string())
}

impl Browser {
    fn launch(exe: &Path) -> Result<Browser, String> {
        let profile = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--window-size=1000,760",
                "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        // The browser prints its DevTools address on stderr; keep draining it after.
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| "Chromium did not report its DevTools address within 60 s".to_string())?;
        // ws://127.0.0.1:PORT/devtools/browser/ID -> the page target's socket.
        let host = url
            .strip_prefix("ws://")
            .and_then(|r| r.split('/').next())
            .ok_or_else(|| format!("unexpected DevTools address {url}"))?;
        let addr: SocketAddr = host.parse().map_err(|e| format!("{host}: {e}"))?;
        let list: Value = serde_json::from_str(&http_get(addr, "/json/list")?)
            .map_err(|e| format!("target list: {e}"))?;
        let page_ws = list
            .as_array()
            .and_then(|l| l.iter().find(|t| t["type"] == "page"))
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .ok_or_else(|| format!("no page target in {list}"))?
            .to_string();
        let stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(|e| e.to_string())?;
        let (ws, _) = tungstenite::client(page_ws.as_str(), stream)
            .map_err(|e| format!("DevTools WebSocket: {e}"))?;
        Ok(Browser {
            child,
            _profile: profile,
            ws,
            next_id: 0,
        })
    }

    /// One DevTools command; events arriving meanwhile are skipped.
    fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.ws
            .send(Message::text(msg))
            .map_err(|e| format!("{method}: {e}"))?;
        loop {
            let m = self.ws.read().map_err(|e| format!("{method}: {e}"))?;
            let Message::Text(t) = m else { continue };
            let v: Value = serde_json::from_str(t.as_str()).map_err(|e| e.to_string())?;
            if v["id"] != id {
                continue;
            }
            if let Some(e) = v.get("error") {
                return Err(format!("{method}: {e}"));
            }
            return Ok(v["result"].clone());
        }
    }

    /// Evaluates a JavaScript expression in the page (promises awaited); its JSON value.
    fn eval(&mut self, expr: &str) -> Result<Value, String> {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        )?;
        if let Some(e) = r.get("exceptionDetails") {
            return Err(format!("`{expr}` threw: {e}"));
        }
        Ok(r["result"]["value"].clone())
    }

    /// Polls `expr` until it is true.
    fn wait_for(&mut self, expr: &str, within: Duration) -> Result<(), String> {
        let t = Instant::now();
        loop {
            if self.eval(expr)? == json!(true) {
                return Ok(());
            }
            if t.elapsed() > within {
                return Err(format!("`{expr}` not true within {within:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn screenshot(&mut self, path: &Path) -> Result<(), String> {
        let r = self.call("Page.captureScreenshot", json!({"format": "png"}))?;
        let data = r["data"].as_str().ok_or("no screenshot data")?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| e.to_string())?;
        std::fs::write(path, png).map_err(|e| format!("{}: {e}", path.display()))
    }
}

fn out_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chat_page");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Sets a form field as a user would (value, then the `change` event).
fn set_field(id: &str, value: &str) -> String {
    format!(
        "(() => {{ const e = document.getElementById({id}); e.value = {value}; \
         e.dispatchEvent(new Event('change')); return true; }})()",
        id = json!(id),
        value = json!(value)
    )
}

fn send_message(text: &str) -> String {
    format!(
        "(() => {{ document.getElementById('input').value = {}; \
         document.getElementById('send').click(); return true; }})()",
        json!(text)
    )
}

/// What the page must show for the first message: the engine's greedy reply.
struct Want {
    text: String,
    tokens: usize,
}

fn drive(
    b: &mut Browser,
    addr: SocketAddr,
    handle: &ServerHandle,
    want: &Want,
) -> Result<(), String> {
    b.call("Page.navigate", json!({"url": format!("http://{addr}/")}))?;
    b.wait_for(
        "document.readyState === 'complete' && !!window.bitnetChat",
        Duration::from_secs(20),
    )?;
    // The markdown renderer in this browser: escaped text, then the marks.
    let html = b.eval(r##"bitnetMarkdown("# Title\n**bold** and `a<b`\n\n```rust\nlet x = 1 < 2;\n```\n- one\n- two\n<script>x</script> [l](https://example.com)")"##)?;
    let html = html.as_str().unwrap_or_default().to_string();
    for part in [
        "<h1>Title</h1>",
        "<strong>bold</strong>",
        "<code>a&lt;b</code>",
        "<pre><code class=\"language-rust\">let x = 1 &lt; 2;</code></pre>",
        "<ul><li>one</li><li>two</li></ul>",
        "&lt;script&gt;x&lt;/script&gt;",
        "<a href=\"https://example.com\" target=\"_blank\" rel=\"noopener noreferrer\">l</a>",
    ] {
        if !html.contains(part) {
            return Err(format!("markdown: {part:?} missing from {html:?}"));
        }
    }

    // No key yet: the page says so. Then enter it.
    b.wait_for(
        "document.getElementById('status').textContent.includes('API key')",
        Duration::from_secs(20),
    )?;
    b.eval(&set_field("api-key", KEY))?;
    b.wait_for(
        "document.getElementById('status').textContent === 'ready' && \
         document.getElementById('model').textContent.startsWith('kjv')",
        Duration::from_secs(20),
    )?;

    // A message, answered greedily: the streamed reply is the engine's own.
    b.eval(&set_field("temperature", "0"))?;
    b.eval(&set_field("max-tokens", "16"))?;
    b.eval(&send_message("And Abraham said unto Isaac,"))?;
    b.wait_for(
        "bitnetChat.replies.length === 1 && bitnetChat.replies[0].done",
        Duration::from_secs(60),
    )?;
    let reply = b.eval("bitnetChat.replies[0]")?;
    if reply["error"] != Value::Null || reply["content"] != want.text.as_str() {
        return Err(format!("reply {reply}, expected text {:?}", want.text));
    }
    if reply["tokens"] != want.tokens || reply["pieces"].as_u64().unwrap_or(0) < 2 {
        return Err(format!(
            "reply {reply}: not streamed as {} tokens",
            want.tokens
        ));
    }
    let stats = b.eval("document.querySelector('.msg.assistant .stats').textContent")?;
    if !stats.as_str().unwrap_or_default().contains("tok/s") {
        return Err(format!("stats line {stats}"));
    }
    let shown = b.eval("document.querySelector('.msg.assistant .body').textContent.length > 0")?;
    if shown != json!(true) {
        return Err("the reply is not shown".into());
    }
    b.screenshot(&out_dir().join("chat_page.png"))?;
    if let Some(p) = std::env::var_os("BITNET_SCREENSHOT") {
        b.screenshot(Path::new(&p))?;
    }

    // A long reply, stopped while it streams: the page ends it and the server frees the
    // slot (the request is no longer in flight).
    b.eval(&set_field("max-tokens", "400"))?;
    b.eval(&send_message("Tell me a long story."))?;
    b.wait_for(
        "bitnetChat.replies.length === 2 && bitnetChat.replies[1].pieces >= 3 && \
         !document.getElementById('stop').disabled",
        Duration::from_secs(30),
    )?;
    b.eval("document.getElementById('stop').click(), true")?;
    b.wait_for("bitnetChat.replies[1].done", Duration::from_secs(5))?;
    let r = b.eval("bitnetChat.replies[1]")?;
    if r["stopped"] != true || r["finish"] != Value::Null {
        return Err(format!("not stopped: {r}"));
    }
    b.wait_for(
        "!document.getElementById('send').disabled && document.getElementById('stop').disabled \
         && document.querySelectorAll('.msg.assistant .stats')[1].textContent.includes('stopped')",
        Duration::from_secs(5),
    )?;
    let t = Instant::now();
    while handle.in_flight() > 0 {
        if t.elapsed() > Duration::from_secs(5) {
            return Err("the server kept generating after stop".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The stopped reply stays in the conversation; a new chat clears it.
    if b.eval("bitnetChat.messages.length")? != 4 {
        return Err(format!(
            "messages: {}",
            b.eval("JSON.stringify(bitnetChat.messages)")?
        ));
    }
    b.eval("document.getElementById('new-chat').click(), true")?;
    b.wait_for(
        "bitnetChat.messages.length === 0 && document.querySelectorAll('.msg').length === 0",
        Duration::from_secs(5),
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_page_in_a_real_browser() {
    let exe = match find_chromium() {
        Ok(p) => p,
        Err(why) => {
            if std::env::var_os("CI").is_some() {
                panic!("{why}: CI must install it (apt-get install chromium)");
            }
            eprintln!("\n*** SKIPPING chat_page_in_a_real_browser: {why} ***\n");
            return;
        }
    };
    // What the page must show: the engine's greedy reply to the same conversation.
    let engine = trained_engine();
    let ids = engine
        .tokenizer
        .encode_chat(
            &[ChatMessage::new(
                ChatRole::User,
                "And Abraham said unto Isaac,",
            )],
            true,
        )
        .unwrap();
    let (pieces, tokens) = reference_pieces_on(&engine, &ids, 16, SamplerParams::greedy());
    let text = pieces.concat();
    let want = Want { text, tokens };

    let s = TestServer::start_with(
        ServerConfig {
            api_key: Some(KEY.into()),
            // Slow enough that a reply can be stopped while it streams.
            step_delay: Some(Duration::from_millis(30)),
            model_name: "kjv".into(),
            ..test_config()
        },
        trained_engine,
    )
    .await;
    let addr = s.addr;
    let handle = s.handle.clone();
    let result = tokio::task::spawn_blocking(move || {
        let mut b = Browser::launch(&exe)?;
        let r = drive(&mut b, addr, &handle, &want);
        if let Err(e) = &r {
            let shot = out_dir().join("chat_page_failure.png");
            match b.screenshot(&shot) {
                Ok(()) => return Err(format!("{e}\n(screenshot: {})", shot.display())),
                Err(se) => return Err(format!("{e}\n(no screenshot: {se})")),
            }
        }
        r
    })
    .await
    .unwrap();
    if let Err(e) = result {
        panic!("{e}");
    }
}
