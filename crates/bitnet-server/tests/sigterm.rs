//! A real SIGTERM to a server started with `run_blocking` (as `bitnet serve` does): the
//! in-flight request finishes, the server returns. Its own test binary, since the signal
//! goes to the whole process.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers
#![cfg(unix)]

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use bitnet_server::{Lifecycle, ServerConfig};
use common::*;

#[test]
fn sigterm_drains_and_returns() {
    let (ev_tx, ev_rx) = mpsc::channel();
    let cfg = ServerConfig {
        step_delay: Some(Duration::from_millis(10)),
        shutdown_grace: Duration::from_secs(5),
        ..test_config()
    };
    let server = std::thread::spawn(move || {
        bitnet_server::run_blocking(
            "127.0.0.1:0".parse().unwrap(),
            cfg,
            || Ok(tiny_engine()),
            move |e| {
                let _ = ev_tx.send(e);
            },
        )
    });
    let next = || ev_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let Lifecycle::Listening(addr) = next() else {
        panic!("first event must be Listening")
    };
    assert!(matches!(next(), Lifecycle::Ready { n_ctx: 512, .. }));

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // ~0.5 s of generation, well inside the grace period.
        let req = tokio::spawn(async move {
            // Greedy: this prompt gives 50 tokens without an end-of-generation token.
            post(
                addr,
                "/v1/completions",
                r#"{"prompt":"a","max_tokens":50,"temperature":0}"#,
            )
            .await
        });
        let t = Instant::now();
        while get(addr, "/metrics", &[])
            .await
            .text()
            .lines()
            .all(|l| l != "bitnet_slots_busy 1")
        {
            assert!(t.elapsed() < Duration::from_secs(10));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let status = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let r = req.await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["usage"]["completion_tokens"], 50);
    });
    assert!(matches!(next(), Lifecycle::ShuttingDown { .. }));
    let t = Instant::now();
    while !server.is_finished() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the server did not return"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    server.join().unwrap().unwrap();
}
