//! The official `openai` Python package as a real client (tests/openai_client.py).
//!
//! Needs `python3` with `openai` installed (`.ci/run` installs it). Without them the test
//! fails when `CI` is set and is skipped, loudly, otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers

mod common;

use std::process::Command;
use std::time::Duration;

use bitnet_sampling::SamplerParams;
use bitnet_server::ServerConfig;
use bitnet_tokenizer::{ChatMessage, ChatRole};
use common::*;
use serde_json::{json, Value};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py");
const KEY: &str = "sk-bitnet-test-key";

fn python_with_openai() -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-c", "import openai, jsonschema; print(openai.__version__)"])
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "python3 cannot import openai and jsonschema: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_client() {
    if let Err(why) = python_with_openai() {
        if std::env::var_os("CI").is_some() {
            panic!("{why}: CI must install them (python3 -m pip install openai jsonschema)");
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
    assert_eq!(
        v["errors"]["response_format"],
        json!([400, "response_format"])
    );

    // `client.chat.completions.parse(response_format=Person)`: a parsed object each time.
    assert_eq!(v["parse"].as_array().unwrap().len(), 3);
    for p in v["parse"].as_array().unwrap() {
        println!("parse: {}", p["content"]);
        assert_eq!(p["finish"], "stop", "{p}");
        assert_eq!(p["is_person"], true, "{p}");
        let person = &p["parsed"];
        assert!(
            person["name"].as_str().unwrap().chars().count() <= 12,
            "{p}"
        );
        assert!(person["married"].is_boolean(), "{p}");
        for pet in person["pets"].as_array().unwrap() {
            assert!(
                ["cat", "dog", "fish"].contains(&pet["kind"].as_str().unwrap()),
                "{p}"
            );
            assert!((0..=30).contains(&pet["age"].as_i64().unwrap()), "{p}");
        }
    }

    // Log-probabilities against the engine's own logits along the same tokens.
    let lp = SamplerParams {
        temperature: 0.7,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 99,
        ..SamplerParams::default()
    };
    // Tool calls (arguments validated by the jsonschema package in the script).
    let tools = v["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 3);
    for t in tools {
        assert_eq!(t["finish"], "tool_calls", "{t}");
        assert_eq!(t["content"], Value::Null, "{t}");
        let calls = t["calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{t}");
        assert_eq!(t["valid"], true, "{t}");
        for c in calls {
            let id = c["id"].as_str().unwrap();
            assert!(id.starts_with("call_") && id.len() == 29, "{t}");
            assert_eq!(c["type"], "function");
        }
        assert_eq!(t["stream_finish"], "tool_calls", "{t}");
        let streamed = t["stream_calls"].as_array().unwrap();
        assert_eq!(streamed.len(), calls.len(), "{t}");
        for (s, c) in streamed.iter().zip(calls) {
            assert_eq!(s["name"], c["name"], "{t}");
            assert_eq!(s["arguments"], c["arguments"], "{t}");
            assert!(s["id"].as_str().unwrap().starts_with("call_"), "{t}");
        }
        assert!(
            ["stop", "length", "tool_calls"].contains(&t["follow_finish"].as_str().unwrap()),
            "{t}"
        );
        assert!(
            t["follow_prompt_tokens"].as_u64() > t["ask_prompt_tokens"].as_u64(),
            "{t}"
        );
    }
    assert_eq!(tools[2]["calls"][0]["name"], "get_weather");
    assert_eq!(v["errors"]["tool_choice"], json!([400, "tool_choice"]));

    let want = expected_logprobs(&chat_ids, 8, &lp, 3);
    let got = v["chat_logprobs"]["entries"].as_array().unwrap();
    assert_eq!(got.len(), want.len(), "{got:?}");
    let mut text = Vec::new();
    for (g, w) in got.iter().zip(&want) {
        let bytes = engine.tokenizer.token_bytes(w.id).unwrap();
        text.extend_from_slice(bytes);
        assert_eq!(g["bytes"], json!(bytes));
        assert_eq!(g["token"], String::from_utf8_lossy(bytes).as_ref());
        assert_close(&g["logprob"], w.logprob);
        let top = g["top"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        for (t, &(id, l)) in top.iter().zip(&w.top) {
            assert_eq!(t[0], json!(engine.tokenizer.token_bytes(id).unwrap()));
            assert_close(&t[1], l);
        }
    }
    assert_eq!(
        v["chat_logprobs"]["text"],
        String::from_utf8_lossy(&text).as_ref()
    );
    assert_eq!(v["chat_logprobs_stream"], v["chat_logprobs"]["entries"]);

    let want = expected_logprobs(&compl_ids, 8, &lp, 2);
    let c = &v["completion_logprobs"];
    let n = want.len();
    assert_eq!(c["tokens"].as_array().unwrap().len(), n);
    let mut offset = 0;
    for (i, w) in want.iter().enumerate() {
        let bytes = engine.tokenizer.token_bytes(w.id).unwrap();
        assert_eq!(c["tokens"][i], String::from_utf8_lossy(bytes).as_ref());
        assert_close(&c["token_logprobs"][i], w.logprob);
        assert_eq!(c["text_offset"][i], offset);
        offset += bytes.len();
        let top = c["top_logprobs"][i].as_object().unwrap();
        for &(id, l) in &w.top {
            let key = String::from_utf8_lossy(engine.tokenizer.token_bytes(id).unwrap());
            assert_close(&top[key.as_ref()], l);
        }
    }
}

/// A token and the log-probabilities the server should report for it.
struct Expected {
    id: u32,
    logprob: f64,
    top: Vec<(u32, f64)>,
}

/// Generates from `prompt` with the engine one token at a time, drawing each token with
/// `params`' sampler, and computes from the engine's logits the log-softmax at the
/// sampler's temperature (every filter in `params` must be off): the chosen token's
/// value and the `n_top` largest.
fn expected_logprobs(
    prompt: &[u32],
    max_tokens: usize,
    params: &SamplerParams,
    n_top: usize,
) -> Vec<Expected> {
    let engine = tiny_engine();
    let mut session = engine.new_session(512).unwrap();
    let mut sampler = bitnet_sampling::Sampler::new(params.clone()).unwrap();
    for &t in prompt {
        sampler.accept(t);
    }
    let mut logits = engine
        .eval(&mut session, prompt, bitnet_model::Outputs::Last)
        .unwrap();
    let t = f64::from(params.temperature);
    let mut out = Vec::new();
    for _ in 0..max_tokens {
        let id = sampler.sample(&logits).unwrap();
        if engine.tokenizer.is_eog(id) {
            break;
        }
        let max = logits
            .iter()
            .map(|&l| f64::from(l))
            .fold(f64::MIN, f64::max);
        let z: f64 = logits
            .iter()
            .map(|&l| ((f64::from(l) - max) / t).exp())
            .sum();
        let ls = |l: f32| (f64::from(l) - max) / t - z.ln();
        let mut order: Vec<u32> = (0..u32::try_from(logits.len()).unwrap()).collect();
        order.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        out.push(Expected {
            id,
            logprob: ls(logits[id as usize]),
            top: order[..n_top]
                .iter()
                .map(|&i| (i, ls(logits[i as usize])))
                .collect(),
        });
        sampler.accept(id);
        logits = engine
            .eval(&mut session, &[id], bitnet_model::Outputs::Last)
            .unwrap();
    }
    out
}

fn assert_close(got: &Value, want: f64) {
    let g = got
        .as_f64()
        .unwrap_or_else(|| panic!("not a number: {got}"));
    assert!((g - want).abs() < 1e-4, "logprob {g}, expected {want}");
}
