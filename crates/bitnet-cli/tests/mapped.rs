//! A model file truncated under a running `bitnet serve`: `/health` turns unhealthy naming
//! the change, and the next read of the lost pages ends the process with one line naming the
//! file (exit status 135) instead of a bare SIGBUS. With `--in-memory` the server is immune.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    let d =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("mapped-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// `bitnet serve` on `model` (port 0); returns the child, its address and its stderr lines.
fn serve(model: &Path, extra: &[&str]) -> (Child, String, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_bitnet"))
        .args(["serve", "-m"])
        .arg(model)
        .args(["--port", "0", "-t", "1"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) else {
            break;
        };
        if let Some(addr) = line
            .split("listening on http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
        {
            let addr = addr.to_string();
            return (child, addr, rx);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("bitnet serve did not say where it listens");
}

/// One HTTP/1.1 exchange; the status code and body, or `None` when the connection failed.
fn http(addr: &str, req: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Some((status, body))
}

fn health(addr: &str) -> Option<(u16, String)> {
    http(
        addr,
        "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
}

fn wait_healthy(addr: &str) {
    let t = Instant::now();
    while health(addr).map(|h| h.0) != Some(200) {
        assert!(t.elapsed() < Duration::from_secs(60), "never healthy");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn completion(addr: &str) -> Option<(u16, String)> {
    let body = r#"{"prompt":"The quick brown fox","max_tokens":4,"temperature":0}"#;
    http(
        addr,
        &format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

fn truncate(model: &Path) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(model)
        .unwrap()
        .set_len(4096)
        .unwrap();
}

fn copy_of_tiny(name: &str) -> PathBuf {
    let model = scratch(name);
    std::fs::copy(
        bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf"),
        &model,
    )
    .unwrap();
    model
}

#[test]
fn truncated_under_a_running_server() {
    let model = copy_of_tiny("model.gguf");
    let (mut child, addr, rx) = serve(&model, &[]);
    wait_healthy(&addr);
    assert_eq!(completion(&addr).unwrap().0, 200);

    truncate(&model);
    let (status, body) = health(&addr).unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("the model file changed on disk"), "{body}");
    assert!(body.contains("truncated"), "{body}");

    // The next generation reads pages that are gone.
    let r = completion(&addr);
    let t = Instant::now();
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the server survived reading a truncated map: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // Every line up to the end of the pipe (its reader thread may lag behind the exit).
    let mut lines = Vec::new();
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(10)) {
        lines.push(l);
    }
    let last = lines.last().cloned().unwrap_or_default();
    assert_eq!(code, Some(135), "{lines:?}");
    assert!(
        last.starts_with("bitnet: the model file ")
            && last.contains(&model.display().to_string())
            && last.contains("changed while in use"),
        "{lines:?}"
    );
}

#[test]
fn in_memory_is_immune() {
    let model = copy_of_tiny("in-memory.gguf");
    let (mut child, addr, _rx) = serve(&model, &["--in-memory"]);
    wait_healthy(&addr);
    truncate(&model);
    assert_eq!(health(&addr).unwrap().0, 200);
    assert_eq!(completion(&addr).unwrap().0, 200);
    child.kill().unwrap();
    child.wait().unwrap();
}
