//! `POST /v1/embeddings` on a `qwen3` embedding model (the synthetic one of
//! testdata/golden/embed): the vectors are the engine's, and for the golden prompt the numpy
//! oracle's; every input form and option; hostile requests are 400s naming the field; and the
//! official `openai` client's `client.embeddings.create` (tests/openai_embeddings.py; needs
//! python3 with `openai`, which `.ci/run` installs: without it the test fails when `CI` is set
//! and is skipped, loudly, otherwise).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)] // test helpers

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bitnet_engine::{EmbedOptions, Engine, EngineOptions};
use bitnet_gguf::{GgufFile, Limits};
use bitnet_model::OwnedModel;
use bitnet_server::ServerConfig;
use bitnet_testkit::{synth, Preset, SynthArch, SynthSpec};
use bitnet_tokenizer::Tokenizer;
use common::*;
use serde_json::{json, Value};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_embeddings.py");

/// The qwen3-tiny model of testdata/golden/embed (make/embed.sh's arguments).
fn qwen3_engine() -> Engine {
    let mut spec = SynthSpec::preset(Preset::Tiny);
    spec.seed = 7;
    spec.arch = SynthArch::Qwen3;
    (spec.n_head, spec.n_head_kv, spec.head_dim) = (4, 2, Some(128));
    spec.pre = Some("qwen2".into());
    let vocab = synth::vocab_from_gguf_bytes(bitnet_testkit::TINY_VOCAB_GGUF).unwrap();
    let bytes = synth::write(&spec, &vocab, Vec::new(), &mut |_, _| {}).unwrap();
    let f = Arc::new(GgufFile::from_bytes(bytes, &Limits::default()).unwrap());
    let tok = Tokenizer::from_gguf(f.metadata(), None).unwrap();
    Engine::new(
        OwnedModel::load(f).unwrap(),
        tok,
        EngineOptions {
            threads: 1,
            ..Default::default()
        },
    )
    .unwrap()
}

async fn start() -> TestServer {
    let s = TestServer::start_unloaded(ServerConfig {
        n_ctx: Some(256),
        ..test_config()
    })
    .await;
    s.handle.load(|| Ok(qwen3_engine()));
    tokio::time::timeout(Duration::from_secs(30), s.handle.wait_ready())
        .await
        .expect("model load timed out")
        .unwrap();
    s
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_endpoint() {
    let s = start().await;
    let engine = qwen3_engine();
    let texts = ["query: What is BitNet?", "Paris", "Grüße aus Köln"];
    let want: Vec<Vec<f32>> = {
        let ids: Vec<Vec<u32>> = texts
            .iter()
            .map(|t| engine.embed_tokens(t).unwrap())
            .collect();
        engine.embed(&ids, &EmbedOptions::default()).unwrap()
    };

    // An array of strings: the engine's vectors (f32 through JSON), in order, with usage.
    let r = post(
        s.addr,
        "/v1/embeddings",
        &json!({"model": "x", "input": texts}).to_string(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "tiny");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    let n_tokens: usize = texts
        .iter()
        .map(|t| engine.embed_tokens(t).unwrap().len())
        .sum();
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": n_tokens, "total_tokens": n_tokens})
    );
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["object"], "embedding");
        assert_eq!(d["index"], i);
        assert_eq!(floats(&d["embedding"]), want[i], "input {i}");
    }
    // The golden prompt: the oracle's vector (testdata/golden/embed/qwen3-tiny.query).
    let oracle = bitnet_testdata::read_f32("embed/qwen3-tiny.query.embd.f32");
    assert!(bitnet_testdata::cosine(&floats(&data[0]["embedding"]), &oracle) >= 0.9999);

    // One string; token ids (one list, and a list of lists); base64; dimensions.
    let one = post(
        s.addr,
        "/v1/embeddings",
        &json!({"input": texts[1]}).to_string(),
    )
    .await;
    assert_eq!(floats(&one.json()["data"][0]["embedding"]), want[1]);
    let ids = engine.embed_tokens(texts[1]).unwrap();
    let r = post(s.addr, "/v1/embeddings", &json!({"input": ids}).to_string()).await;
    assert_eq!(floats(&r.json()["data"][0]["embedding"]), want[1]);
    let r = post(
        s.addr,
        "/v1/embeddings",
        &json!({"input": [ids, ids]}).to_string(),
    )
    .await;
    assert_eq!(r.json()["data"].as_array().unwrap().len(), 2);
    assert_eq!(floats(&r.json()["data"][1]["embedding"]), want[1]);
    let r = post(
        s.addr,
        "/v1/embeddings",
        &json!({"input": texts[0], "encoding_format": "base64"}).to_string(),
    )
    .await;
    let b = base64::engine::general_purpose::STANDARD
        .decode(r.json()["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f32> = b
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(decoded, want[0]);
    let r = post(
        s.addr,
        "/v1/embeddings",
        &json!({"input": texts[0], "dimensions": 64}).to_string(),
    )
    .await;
    let short = floats(&r.json()["data"][0]["embedding"]);
    assert_eq!(short.len(), 64);
    assert_eq!(short, bitnet_model::numerics::l2_normalized(&want[0][..64]));

    // Quantized (`bits`): the codes of the float vector (after `dimensions`), and with
    // base64 the packed codes; the scale beside them.
    for bits in [8u32, 4, 2, 1] {
        let v48 = bitnet_model::numerics::l2_normalized(&want[0][..48]);
        for (dims, v) in [(None, &want[0]), (Some(48), &v48)] {
            let q = bitnet_engine::quantize_embedding(v, bits).unwrap();
            let mut body = json!({"input": texts[0], "bits": bits});
            if let Some(d) = dims {
                body["dimensions"] = json!(d);
            }
            let r = post(s.addr, "/v1/embeddings", &body.to_string()).await;
            assert_eq!(r.status, 200, "{}", r.text());
            let d = &r.json()["data"][0];
            let codes: Vec<i8> = d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| i8::try_from(c.as_i64().unwrap()).unwrap())
                .collect();
            assert_eq!(codes, q.codes, "bits {bits}");
            assert_eq!(
                (d["bits"].as_u64(), d["scale"].as_f64().map(|x| x as f32)),
                (Some(u64::from(bits)), Some(q.scale))
            );
            body["encoding_format"] = json!("base64");
            let r = post(s.addr, "/v1/embeddings", &body.to_string()).await;
            let packed = base64::engine::general_purpose::STANDARD
                .decode(r.json()["data"][0]["embedding"].as_str().unwrap())
                .unwrap();
            assert_eq!(packed, q.packed(), "bits {bits} base64");
            assert_eq!(packed.len(), (v.len() * bits as usize).div_ceil(8));
        }
    }

    // Hostile and malformed requests: 400 naming the field, the server unharmed.
    let long = "word ".repeat(400);
    let many: Vec<&str> = vec!["a"; 10_000];
    let cases: Vec<(Value, &str)> = vec![
        (json!({}), "input"),
        (json!({"input": ""}), "input[0]"),
        (json!({"input": []}), "input"),
        (json!({"input": many}), "input"),
        (json!({"input": long}), "input[0]"),
        (json!({"input": 5}), "input"),
        (json!({"input": {"a": 1}}), "input"),
        (json!({"input": ["a", 5]}), "input[1]"),
        (json!({"input": [[1, 2], [-1]]}), "input[1]"),
        (json!({"input": [1_000_000]}), "input"),
        (json!({"input": [[]]}), "input[0]"),
        (
            json!({"input": "a", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (json!({"input": "a", "dimensions": 0}), "dimensions"),
        (json!({"input": "a", "dimensions": 100_000}), "dimensions"),
        (json!({"input": "a", "dimensions": 1.5}), "dimensions"),
        (json!({"input": "a", "model": 3}), "model"),
        (json!({"input": "a", "bits": 3}), "bits"),
        (json!({"input": "a", "bits": "8"}), "bits"),
        (json!({"input": "a", "bits": -1}), "bits"),
        (json!({"input": "a", "bits": 8.5}), "bits"),
    ];
    for (body, param) in cases {
        let r = post(s.addr, "/v1/embeddings", &body.to_string()).await;
        let shown: String = body.to_string().chars().take(80).collect();
        assert_eq!(r.status, 400, "{shown}: {}", r.text());
        assert_eq!(r.error_param().as_deref(), Some(param), "{shown}");
    }
    let r = post(s.addr, "/v1/embeddings", "{not json").await;
    assert_eq!(r.status, 400);
    let r = post(
        s.addr,
        "/v1/embeddings",
        &json!({"input": "still fine"}).to_string(),
    )
    .await;
    assert_eq!(r.status, 200);

    // The official client.
    let out = Command::new("python3")
        .args(["-c", "import openai; print(openai.__version__)"])
        .output();
    let have = out.as_ref().is_ok_and(|o| o.status.success());
    if !have {
        if std::env::var_os("CI").is_some() {
            panic!("python3 cannot import openai: CI must install it");
        }
        eprintln!("\n*** SKIPPING the openai client part: python3 cannot import openai ***\n");
    } else {
        let port = s.addr.port().to_string();
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new("python3")
                .args([SCRIPT, &port])
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
        // Its default (base64, decoded by the client) and float.
        for key in ["default", "float"] {
            let got = v[key].as_array().unwrap();
            assert_eq!(got.len(), 3, "{key}");
            for (i, e) in got.iter().enumerate() {
                assert_eq!(floats(e), want[i], "{key} {i}");
            }
        }
        assert_eq!(v["usage"], n_tokens);
        assert_eq!(v["dimensions"], 32);
        assert_eq!(v["error"], json!([400, "input"]));
    }
    s.stop().await;
}
