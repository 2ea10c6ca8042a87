//! The official `openai` Python package as a real client (tests/openai_client.py).
//!
//! Needs `python3` with `openai` installed (`.ci/run` installs it). Without them the test
//! fails when `CI` is set and is skipped, loudly, otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers

mod common;

use std::process::Command;
use std::time::Duration;

use bitnet_engine::{ContextPolicy, Event, GenParams};
use bitnet_sampling::SamplerParams;
use bitnet_server::ServerConfig;
use bitnet_tokenizer::{ChatMessage, ChatRole};
use common::*;
use serde_json::{json, Value};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py");
const KEY: &str = "sk-bitnet-test-key";

fn python_with_openai() -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-c", "import openai; print(openai.__version__)"])
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "python3 cannot import openai: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Text and generated-token count from the engine's own single-sequence loop.
fn reference(prompt: &[u32], max_tokens: usize, sampler: SamplerParams) -> (String, usize) {
    let engine = tiny_engine();
    let mut session = engine.new_session(512).unwrap();
    let mut text = String::new();
    let params = GenParams {
        max_tokens,
        sampler,
        stop: Vec::new(),
        context_policy: ContextPolicy::Stop,
    };
    let stats = engine
        .generate(&mut session, prompt, false, &params, &mut |ev| {
            let Event::Text(t) = ev;
            text.push_str(t);
            true
        })
        .unwrap();
    (text, stats.generated_tokens)
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_client() {
    if let Err(why) = python_with_openai() {
        if std::env::var_os("CI").is_some() {
            panic!("{why}: CI must install it (python3 -m pip install openai)");
        }
        eprintln!("\n*** SKIPPING official_openai_client: {why} ***\n");
        return;
    }
    let s = TestServer::start(ServerConfig {
        api_key: Some(KEY.into()),
        parallel: 2,
        ..test_config()
    })
    .await;

    let port = s.addr.port().to_string();
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .args([SCRIPT, &port, KEY])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the python client timed out")
    .unwrap();
    assert!(
        out.status.success(),
        "python client failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();

    // Expected values from the engine's single-sequence generation loop.
    let engine = tiny_engine();
    let sampler = SamplerParams {
        temperature: 0.9,
        seed: 1234,
        ..SamplerParams::default()
    };
    let chat_ids = engine
        .tokenizer
        .encode_chat(
            &[
                ChatMessage::new(ChatRole::System, "Be brief."),
                ChatMessage::new(ChatRole::User, "Name three colors."),
            ],
            true,
        )
        .unwrap();
    let (chat_text, chat_n) = reference(&chat_ids, 24, sampler.clone());
    let compl_ids = engine
        .tokenizer
        .encode("The quick brown fox", true, false)
        .unwrap();
    let (compl_text, compl_n) = reference(&compl_ids, 24, sampler);

    assert_eq!(v["chat"]["object"], "chat.completion");
    assert_eq!(v["chat"]["role"], "assistant");
    assert_eq!(v["chat"]["text"], chat_text);
    assert_eq!(v["chat"]["usage"], usage(chat_ids.len(), chat_n));
    assert_eq!(v["chat_stream"]["text"], v["chat"]["text"]);
    assert_eq!(v["chat_stream"]["finish"], v["chat"]["finish"]);
    assert_eq!(v["chat_stream"]["usage"], v["chat"]["usage"]);
    assert_eq!(v["chat_stream"]["roles"], json!(["assistant"]));

    assert_eq!(v["completion"]["text"], compl_text);
    assert_eq!(v["completion"]["usage"], usage(compl_ids.len(), compl_n));
    assert_eq!(v["completion_stream"]["text"], v["completion"]["text"]);
    assert_eq!(v["completion_stream"]["finish"], v["completion"]["finish"]);
    assert_eq!(v["completion_stream"]["usage"], v["completion"]["usage"]);

    assert_eq!(v["short"]["usage"]["completion_tokens"], 5);
    assert_eq!(v["short"]["finish"], "length");
    assert_eq!(v["models"], json!(["tiny"]));
    assert_eq!(v["errors"]["n"], json!([400, "n"]));
    assert_eq!(v["errors"]["temperature"], json!([400, "temperature"]));
    assert_eq!(v["errors"]["auth"], json!([401, null]));
}
