//! `serve --device gpu`: the scheduler runs its slots on the GPU backend (two at once, prompts
//! prefilled in chunks) and answers with the texts the GPU engine's own generation loop gives
//! (greedy, and seeded sampling). Needs a GPU adapter (CI has Mesa's software Vulkan driver);
//! without one it fails unless `BITNET_GPU_TESTS=skip`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use bitnet_engine::{load, Device, Engine, LoadOptions};
use bitnet_sampling::SamplerParams;
use bitnet_server::ServerConfig;
use common::*;
use serde_json::json;

fn gpu_engine() -> Result<Engine, String> {
    let opts = LoadOptions {
        threads: 1,
        device: Device::Gpu,
        ..LoadOptions::default()
    };
    load(&tiny_path(), &opts, &mut |_| {}).map_err(|e| e.to_string())
}

/// The engine's single-sequence generation, as text.
fn generate(engine: &Engine, prompt: &str, temperature: f32, seed: u64) -> String {
    let ids = engine.tokenizer.encode(prompt, true, false).unwrap();
    let sampler = SamplerParams {
        temperature,
        seed,
        ..SamplerParams::default()
    };
    reference_pieces_on(engine, &ids, 24, sampler).0.concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_on_the_gpu_answer_the_engine_texts() {
    if !bitnet_gpu::probe::gpu_tests_enabled() {
        return;
    }
    let cases: Vec<(String, f32, u64)> = vec![
        ("The capital of France".into(), 0.0, 0),
        ("1, 2, 3, 4,".into(), 0.8, 11),
        ("def main():".into(), 0.0, 0),
    ];
    let engine = gpu_engine().unwrap();
    let expected: Vec<String> = cases
        .iter()
        .map(|(p, temp, seed)| generate(&engine, p, *temp, *seed))
        .collect();
    drop(engine);
    let s = TestServer::start_unloaded(ServerConfig {
        parallel: 2,
        prefill_chunk: 4,
        ..test_config()
    })
    .await;
    s.handle.load(gpu_engine);
    tokio::time::timeout(Duration::from_secs(60), s.handle.wait_ready())
        .await
        .unwrap()
        .unwrap();
    let mut tasks = Vec::new();
    for (p, temp, seed) in cases {
        let addr = s.addr;
        tasks.push(tokio::spawn(async move {
            let body = json!({"prompt": p, "max_tokens": 24, "temperature": temp, "seed": seed})
                .to_string();
            post(addr, "/v1/completions", &body).await
        }));
    }
    for (t, want) in tasks.into_iter().zip(&expected) {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(&text_of(&r.json()), want);
    }
}
