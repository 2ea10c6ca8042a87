//! Load, disconnects, shutdown, and batched decoding against single-sequence decoding.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers

mod common;

use std::time::{Duration, Instant};

use bitnet_sampling::SamplerParams;
use bitnet_server::ServerConfig;
use common::*;
use serde_json::json;
use tokio::io::AsyncReadExt;

const CHAT: &str = "/v1/chat/completions";
const COMPL: &str = "/v1/completions";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_streaming_clients_against_four_slots() {
    let s = TestServer::start(ServerConfig {
        parallel: 4,
        max_queue: 8,
        step_delay: Some(Duration::from_millis(5)),
        ..test_config()
    })
    .await;
    // Warm up allocations before measuring memory.
    post(
        s.addr,
        CHAT,
        r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#,
    )
    .await;
    let rss0 = rss_bytes();
    let t = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..32 {
        let addr = s.addr;
        tasks.push(tokio::spawn(async move {
            let body = json!({
                "messages": [{"role": "user", "content": format!("Client {i} says hello")}],
                "max_tokens": 40, "stream": true, "seed": i,
            })
            .to_string();
            let (status, mut conn, mut rest) = open_stream(addr, CHAT, &body).await;
            tokio::time::timeout(Duration::from_secs(60), conn.read_to_end(&mut rest))
                .await
                .expect("a stream hung")
                .unwrap();
            (status, rest)
        }));
    }
    let (mut ok, mut busy) = (0, 0);
    for t in tasks {
        let (status, body) = t.await.unwrap();
        match status {
            200 => {
                ok += 1;
                let text = String::from_utf8(body).unwrap();
                // The chunked framing is left in `text`; the SSE payloads are intact lines.
                let data: Vec<String> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
                    .collect();
                assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
                let (_, finish, _, _) = collect_stream(&data);
                assert!(finish.is_some(), "a stream without finish_reason");
            }
            429 => busy += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(ok + busy, 32);
    assert!(
        ok >= 12,
        "at least parallel + queue requests are served ({ok})"
    );
    assert!(
        busy >= 1,
        "32 simultaneous requests overflow 4 slots + 8 queued"
    );
    assert!(t.elapsed() < Duration::from_secs(60));
    s.wait_idle(Duration::from_secs(5)).await;
    assert_eq!(
        s.metric("bitnet_requests_rejected_busy_total").await,
        f64::from(busy)
    );
    let growth = rss_bytes().saturating_sub(rss0);
    assert!(growth < 64 << 20, "RSS grew by {growth} bytes");
}

/// A seed whose 400 sampled tokens after `prompt` hold no end-of-generation token, so that a
/// request can only end by its client leaving (with a fresh seed per request, one could end
/// by itself first and miss the cancellation count).
fn seed_without_eog(prompt: &str) -> u64 {
    let engine = tiny_engine();
    let ids = engine.tokenizer.encode(prompt, true, false).unwrap();
    (1..50)
        .find(|&seed| {
            let sampler = SamplerParams {
                seed,
                ..SamplerParams::default()
            };
            reference(&ids, 400, sampler).1 == 400
        })
        .expect("a seed among the first 49 generates 400 tokens")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_killed_mid_stream_free_their_slots() {
    let s = TestServer::start(ServerConfig {
        parallel: 4,
        max_queue: 8,
        // 400 tokens would take 4 s per request at this pace; cancelled ones end at once.
        step_delay: Some(Duration::from_millis(10)),
        ..test_config()
    })
    .await;
    let seed = seed_without_eog("Tell me a long story");
    let body =
        json!({"prompt": "Tell me a long story", "max_tokens": 400, "stream": true, "seed": seed})
            .to_string();
    let t = Instant::now();
    for _round in 0..3 {
        // Four streams take the slots; read a little of each, then drop the connections.
        let mut conns = Vec::new();
        for _ in 0..4 {
            let (status, mut c, _) = open_stream(s.addr, COMPL, &body).await;
            assert_eq!(status, 200);
            let mut buf = [0u8; 256];
            let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0);
            conns.push(c);
        }
        drop(conns);
        s.wait_idle(Duration::from_secs(3)).await;
    }
    assert!(t.elapsed() < Duration::from_secs(12), "{:?}", t.elapsed());
    assert_eq!(s.metric("bitnet_requests_cancelled_total").await, 12.0);
    // Queued requests whose clients leave are dropped too.
    let mut waiting = Vec::new();
    for _ in 0..10 {
        let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        use tokio::io::AsyncWriteExt;
        let req = format!(
            "POST {COMPL} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        c.write_all(req.as_bytes()).await.unwrap();
        waiting.push(c);
    }
    let t = Instant::now();
    while s.handle.in_flight() < 10 {
        assert!(t.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(waiting);
    s.wait_idle(Duration::from_secs(3)).await;
    // The server still works.
    let r = post(s.addr, COMPL, r#"{"prompt":"hi","max_tokens":3}"#).await;
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streaming_client_that_leaves_is_cancelled() {
    let s = TestServer::start(ServerConfig {
        step_delay: Some(Duration::from_millis(10)),
        ..test_config()
    })
    .await;
    let seed = seed_without_eog("Once upon a time");
    let body = json!({"prompt": "Once upon a time", "max_tokens": 400, "seed": seed}).to_string();
    let body = body.as_str();
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    use tokio::io::AsyncWriteExt;
    c.write_all(
        format!(
            "POST {COMPL} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let t = Instant::now();
    while s.metric("bitnet_slots_busy").await < 1.0 {
        assert!(t.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(c);
    s.wait_idle(Duration::from_secs(2)).await;
    assert_eq!(s.metric("bitnet_requests_cancelled_total").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_decode_gives_the_single_sequence_tokens() {
    let engine = tiny_engine();
    let cases: Vec<(String, f32, u64)> = vec![
        ("The capital of France".into(), 0.0, 0),
        ("1, 2, 3, 4,".into(), 0.8, 11),
        ("def main():".into(), 1.0, 12),
        ("Ünïcödé text — with dashes".into(), 0.7, 13),
    ];
    let expected: Vec<String> = cases
        .iter()
        .map(|(p, temp, seed)| {
            let ids = engine.tokenizer.encode(p, true, false).unwrap();
            reference(
                &ids,
                32,
                SamplerParams {
                    temperature: *temp,
                    seed: *seed,
                    ..SamplerParams::default()
                },
            )
            .0
        })
        .collect();
    let s = TestServer::start(ServerConfig {
        parallel: 4,
        // Small prompt chunks: prefill of one request overlaps decode of the others.
        prefill_chunk: 3,
        step_delay: Some(Duration::from_millis(5)),
        ..test_config()
    })
    .await;
    let mut tasks = Vec::new();
    for (p, temp, seed) in cases.clone() {
        let addr = s.addr;
        tasks.push(tokio::spawn(async move {
            let body = json!({"prompt": p, "max_tokens": 32, "temperature": temp, "seed": seed})
                .to_string();
            post(addr, COMPL, &body).await
        }));
    }
    for (t, want) in tasks.into_iter().zip(&expected) {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(&text_of(&r.json()), want);
    }
    // The four requests really shared forward passes.
    let passes = s.metric("bitnet_forward_passes_total").await;
    let tokens = s.metric("bitnet_generated_tokens_total").await;
    assert_eq!(tokens, 128.0);
    assert!(passes < 0.6 * tokens, "{passes} passes for {tokens} tokens");
}

/// `serve --screen-head`: four requests batched through a screened engine get the text the
/// unscreened engine's own loop gives them: greedy and top-k sampling chosen through the
/// screen, beside a request for log-probabilities (which reads every logit) and one without
/// top-k (likewise). The screen must have chosen tokens (the metric counts them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_screened_head_serves_the_same_tokens_batched() {
    let engine = tiny_engine();
    // (prompt, temperature, top_k, seed, logprobs)
    let cases: Vec<(String, f32, i32, u64, bool)> = vec![
        ("The capital of France".into(), 0.0, 40, 0, false),
        ("1, 2, 3, 4,".into(), 0.8, 5, 11, false),
        ("def main():".into(), 1.0, 40, 12, true),
        ("Ünïcödé text — with dashes".into(), 0.7, 0, 13, false),
    ];
    let expected: Vec<String> = cases
        .iter()
        .map(|(p, temperature, top_k, seed, _)| {
            let ids = engine.tokenizer.encode(p, true, false).unwrap();
            reference(
                &ids,
                32,
                SamplerParams {
                    temperature: *temperature,
                    top_k: *top_k,
                    seed: *seed,
                    ..SamplerParams::default()
                },
            )
            .0
        })
        .collect();
    let s = TestServer::start_unloaded(ServerConfig {
        parallel: 4,
        prefill_chunk: 3,
        step_delay: Some(Duration::from_millis(5)),
        ..test_config()
    })
    .await;
    s.handle.load(|| {
        let opts = bitnet_engine::LoadOptions {
            threads: 1,
            screen_head: true,
            ..Default::default()
        };
        let e = bitnet_engine::load(&tiny_path(), &opts, &mut |_| {}).map_err(|e| e.to_string())?;
        assert!(e.screened());
        Ok(e)
    });
    tokio::time::timeout(patience(30), s.handle.wait_ready())
        .await
        .expect("model load timed out")
        .unwrap();
    let mut tasks = Vec::new();
    for (p, temperature, top_k, seed, logprobs) in cases.clone() {
        let addr = s.addr;
        tasks.push(tokio::spawn(async move {
            let mut body = json!({"prompt": p, "max_tokens": 32, "temperature": temperature,
                                  "top_k": top_k, "seed": seed});
            if logprobs {
                body["logprobs"] = json!(2);
            }
            post(addr, COMPL, &body.to_string()).await
        }));
    }
    for (t, want) in tasks.into_iter().zip(&expected) {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(&text_of(&r.json()), want);
    }
    let tokens = s.metric("bitnet_generated_tokens_total").await;
    let screened = s.metric("bitnet_screened_tokens_total").await;
    assert_eq!(tokens, 128.0);
    // The first two requests (64 tokens) may be screened; the others never are.
    assert!(
        (32.0..=64.0).contains(&screened),
        "{screened} of {tokens} tokens chosen through the screen"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_requests() {
    let mut s = TestServer::start(ServerConfig {
        parallel: 2,
        step_delay: Some(Duration::from_millis(10)),
        shutdown_grace: Duration::from_secs(1),
        ..test_config()
    })
    .await;
    let addr = s.addr;
    // A short request (~0.2 s) finishes normally; a long one (~5 s) is ended at the
    // grace deadline with an error event, then [DONE].
    let short = tokio::spawn(async move {
        post(
            addr,
            COMPL,
            r#"{"prompt":"a","max_tokens":20,"temperature":0}"#,
        )
        .await
    });
    let (status, mut long, mut rest) = open_stream(
        addr,
        COMPL,
        // Greedy: a sampled end-of-generation token would end it before the deadline.
        r#"{"prompt":"b","max_tokens":500,"stream":true,"temperature":0}"#,
    )
    .await;
    assert_eq!(status, 200);
    let t = Instant::now();
    s.trigger_stop();
    tokio::time::timeout(Duration::from_secs(10), long.read_to_end(&mut rest))
        .await
        .expect("the long stream hung during shutdown")
        .unwrap();
    let text = String::from_utf8_lossy(&rest).to_string();
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"));
    let err: serde_json::Value = serde_json::from_str(data[data.len() - 2]).unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{err}"
    );
    let r = short.await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["usage"]["completion_tokens"], 20);
    let join = s.join.take().unwrap();
    tokio::time::timeout(Duration::from_secs(10), join)
        .await
        .expect("the server did not stop")
        .unwrap()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // Nothing listens any more.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
