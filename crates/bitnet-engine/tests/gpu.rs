//! The engine on the GPU backend (`LoadOptions::device`): greedy generation gives the CPU
//! engine's ids on the tiny golden model, sampling with a seed runs, and the combinations the
//! GPU does not run are refused at load (or, with `auto`, fall back to the CPU).
//! Needs a GPU adapter (CI installs Mesa's software Vulkan driver); without one it fails
//! unless `BITNET_GPU_TESTS=skip`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bitnet_engine::{load, Device, EngineError, Event, GenParams, LoadEvent, LoadOptions};
use bitnet_model::Numerics;
use bitnet_sampling::SamplerParams;

fn have_gpu() -> bool {
    bitnet_gpu::probe::gpu_tests_enabled()
}

fn opts(device: Device) -> LoadOptions {
    LoadOptions {
        threads: 2,
        device,
        ..LoadOptions::default()
    }
}

fn generate(device: Device, sampler: SamplerParams) -> (Vec<u32>, Vec<String>) {
    let path = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    let mut events = Vec::new();
    let e = load(&path, &opts(device), &mut |ev| {
        if let LoadEvent::Gpu { adapter, .. } = ev {
            events.push(format!("gpu {adapter}"));
        }
    })
    .unwrap();
    assert_eq!(e.gpu().is_some(), device != Device::Cpu);
    let prompt = e
        .tokenizer
        .encode("The quick brown fox", true, false)
        .unwrap();
    let mut s = e.new_session(64).unwrap();
    let mut ids = Vec::new();
    let params = GenParams {
        max_tokens: 24,
        sampler,
        ..GenParams::default()
    };
    e.generate(&mut s, &prompt, false, &params, &mut |ev| {
        if let Event::Token(t) = ev {
            ids.push(t);
        }
        true
    })
    .unwrap();
    if ids.len() == 24 {
        assert_eq!(s.tokens().len(), prompt.len() + ids.len());
    }
    (ids, events)
}

/// The GPU engine's greedy ids, fed back one at a time through `eval` on the same engine (its
/// logits read back, the sampler's argmax): the device argmax `generate` uses must agree.
fn stepwise(device: Device, n: usize) -> Vec<u32> {
    stepwise_margins(device, n)
        .into_iter()
        .map(|(t, _)| t)
        .collect()
}

/// [`stepwise`] with each step's margin of the top logit over the second.
fn stepwise_margins(device: Device, n: usize) -> Vec<(u32, f32)> {
    let path = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    let e = load(&path, &opts(device), &mut |_| {}).unwrap();
    let prompt = e
        .tokenizer
        .encode("The quick brown fox", true, false)
        .unwrap();
    let mut s = e.new_session(64).unwrap();
    let mut logits = e
        .eval(&mut s, &prompt, bitnet_model::Outputs::Last)
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..n {
        let t = bitnet_sampling::argmax(&logits).unwrap();
        let mut sorted = logits.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        ids.push((t, sorted[0] - sorted[1]));
        logits = e.eval(&mut s, &[t], bitnet_model::Outputs::Last).unwrap();
    }
    ids
}

#[test]
fn greedy_generation_on_the_gpu() {
    if !have_gpu() {
        return;
    }
    let (gpu, events) = generate(Device::Gpu, SamplerParams::greedy());
    assert_eq!(events.len(), 1, "the upload is reported");
    assert_eq!(
        gpu,
        stepwise(Device::Gpu, 24),
        "device argmax against read-back logits"
    );
    let (auto, _) = generate(Device::Auto, SamplerParams::greedy());
    assert_eq!(auto, gpu);
    // The same loop on the CPU: the GPU's logits are within the tolerance of the CPU's (the
    // bitnet-gpu tests), so the ids agree while the CPU's margins are clear (> 0.08, the
    // issue's rule); on this random model a near-tie comes early.
    for (k, (id, margin)) in stepwise_margins(Device::Cpu, 24).into_iter().enumerate() {
        if margin <= 0.08 {
            break;
        }
        assert_eq!(gpu[k], id, "step {k}, CPU margin {margin}");
    }
    // Seeded sampling with top-k reads back the device's top candidates; the sampler draws
    // from them what it draws from the whole row of logits (the stepwise loop reads those).
    for (seed, top_k, temperature) in [(7, 40, 0.8), (8, 1, 1.0), (9, 64, 1.3)] {
        let seeded = SamplerParams {
            seed,
            top_k,
            temperature,
            ..SamplerParams::default()
        };
        let (a, _) = generate(Device::Gpu, seeded.clone());
        let b = stepwise_sampled(seeded);
        assert!(!a.is_empty());
        assert_eq!(a[..], b[..a.len()], "seed {seed}, top-k {top_k}");
    }
}

/// Sampling on the GPU engine through `eval` (the last row of logits read back) and the
/// sampler, step by step, as `generate` orders it; stops after an end-of-generation token.
fn stepwise_sampled(p: SamplerParams) -> Vec<u32> {
    let path = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    let e = load(&path, &opts(Device::Gpu), &mut |_| {}).unwrap();
    let prompt = e
        .tokenizer
        .encode("The quick brown fox", true, false)
        .unwrap();
    let mut sampler = bitnet_sampling::Sampler::new(p).unwrap();
    for &t in &prompt {
        sampler.accept(t);
    }
    let mut s = e.new_session(64).unwrap();
    let mut logits = e
        .eval(&mut s, &prompt, bitnet_model::Outputs::Last)
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..24 {
        let t = sampler.sample(&logits).unwrap();
        sampler.accept(t);
        ids.push(t);
        if e.tokenizer.is_eog(t) {
            break;
        }
        logits = e.eval(&mut s, &[t], bitnet_model::Outputs::Last).unwrap();
    }
    ids
}

#[test]
fn what_the_gpu_does_not_run_is_refused_or_falls_back() {
    if !have_gpu() {
        return;
    }
    let path = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    let exact = LoadOptions {
        numerics: Numerics::Exact,
        ..opts(Device::Gpu)
    };
    assert!(matches!(
        load(&path, &exact, &mut |_| {}),
        Err(EngineError::Device(_))
    ));
    // A q4_0 cache is the CPU's only (q8_0 runs: quantized_heads_and_cache_on_the_gpu_…).
    let kv_q4 = LoadOptions {
        kv_type: bitnet_model::KvType::Q4_0,
        ..opts(Device::Gpu)
    };
    assert!(matches!(
        load(&path, &kv_q4, &mut |_| {}),
        Err(EngineError::Device(_))
    ));
    // A Q6_K head is the CPU's only (Q8_0 and Q4_0 run).
    let q6 = LoadOptions {
        lm_head: bitnet_engine::LmHeadFormat::Q6K,
        ..opts(Device::Gpu)
    };
    assert!(matches!(
        load(&path, &q6, &mut |_| {}),
        Err(EngineError::Device(_))
    ));
    let auto_q6 = LoadOptions {
        lm_head: bitnet_engine::LmHeadFormat::Q6K,
        ..opts(Device::Auto)
    };
    assert!(load(&path, &auto_q6, &mut |_| {}).unwrap().gpu().is_none());
    // `auto` with exact numerics stays on the CPU.
    let auto_exact = LoadOptions {
        numerics: Numerics::Exact,
        ..opts(Device::Auto)
    };
    assert!(load(&path, &auto_exact, &mut |_| {})
        .unwrap()
        .gpu()
        .is_none());
    // `auto` asked for the screened head loads on the CPU, screened: the screen is not
    // dropped for an adapter that cannot use it.
    let auto_screen = LoadOptions {
        screen_head: true,
        ..opts(Device::Auto)
    };
    let e = load(&path, &auto_screen, &mut |_| {}).unwrap();
    assert!(
        e.gpu().is_none(),
        "auto chose the GPU and dropped the screen"
    );
    assert!(e.screened());
    let bad = LoadOptions {
        gpu_adapter: Some(42),
        ..opts(Device::Gpu)
    };
    assert!(matches!(
        load(&path, &bad, &mut |_| {}),
        Err(EngineError::Gpu(bitnet_gpu::GpuError::NoSuchAdapter {
            index: 42,
            ..
        }))
    ));
    // Skipped blocks are skipped on the GPU too: the logits move with the mask, and equal the
    // CPU engine's with the same mask.
    let mut cpu = load(&path, &opts(Device::Cpu), &mut |_| {}).unwrap();
    let mut gpu = load(&path, &opts(Device::Gpu), &mut |_| {}).unwrap();
    let logits = |e: &bitnet_engine::Engine| {
        let mut s = e.new_session(16).unwrap();
        e.eval(&mut s, &[4000, 791, 1864, 315], bitnet_model::Outputs::Last)
            .unwrap()
    };
    let before = logits(&gpu);
    let skip = bitnet_engine::skip::SkipLayers::List(vec![1]);
    cpu.set_skip_layers(&skip).unwrap();
    gpu.set_skip_layers(&skip).unwrap();
    let (a, b) = (logits(&cpu), logits(&gpu));
    let md = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(md <= 0.25, "skipped block: max |Δ| {md}");
    assert!(
        before.iter().zip(&b).any(|(x, y)| (x - y).abs() > 1e-3),
        "the mask reached the GPU"
    );
    // A generation longer than its context shifts it on the device and goes on.
    let e = load(&path, &opts(Device::Gpu), &mut |_| {}).unwrap();
    let mut s = e.new_session(16).unwrap();
    let params = GenParams {
        max_tokens: 30,
        sampler: SamplerParams::greedy(),
        context_policy: bitnet_engine::ContextPolicy::Shift { keep: 4 },
        ..GenParams::default()
    };
    let stats = e
        .generate(
            &mut s,
            &[4000, 791, 1864, 315, 9],
            false,
            &params,
            &mut |_| true,
        )
        .unwrap();
    assert_eq!(stats.generated_tokens, 30);
    assert!(s.tokens().len() <= 16);
    // Running out of context is the engine's error, not a panic.
    let e = load(&path, &opts(Device::Gpu), &mut |_| {}).unwrap();
    let mut s = e.new_session(4).unwrap();
    assert!(matches!(
        e.eval(&mut s, &[1, 2, 3, 4, 5], bitnet_model::Outputs::Last),
        Err(EngineError::ContextFull { .. })
    ));
}

/// The model's error for a NaN or infinite logit 7.
/// `--lm-head q8_0` / `q4_0` on the GPU (quantized as the rows are uploaded) and
/// `--kv-cache q8_0` against the CPU engine with the same options: the prompt's logits
/// within the fast gates, then steps fed the CPU's greedy ids, the same pick while the CPU's
/// margins are clear; `auto` takes the GPU for them.
#[test]
fn quantized_heads_and_cache_on_the_gpu_match_the_cpu() {
    if !have_gpu() {
        return;
    }
    let path = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    use bitnet_engine::LmHeadFormat;
    use bitnet_model::KvType;
    for (head, kv_type) in [
        (LmHeadFormat::Q8_0, KvType::F16),
        (LmHeadFormat::Q4_0, KvType::F16),
        (LmHeadFormat::File, KvType::Q8_0),
    ] {
        let with = |d| LoadOptions {
            lm_head: head,
            kv_type,
            ..opts(d)
        };
        let cpu = load(&path, &with(Device::Cpu), &mut |_| {}).unwrap();
        let gpu = load(&path, &with(Device::Gpu), &mut |_| {}).unwrap();
        assert!(gpu.gpu().is_some());
        assert!(load(&path, &with(Device::Auto), &mut |_| {})
            .unwrap()
            .gpu()
            .is_some());
        let prompt = cpu
            .tokenizer
            .encode("The quick brown fox", true, false)
            .unwrap();
        let (mut sc, mut sg) = (cpu.new_session(64).unwrap(), gpu.new_session(64).unwrap());
        let a = cpu
            .eval(&mut sc, &prompt, bitnet_model::Outputs::All)
            .unwrap();
        let b = gpu
            .eval(&mut sg, &prompt, bitnet_model::Outputs::All)
            .unwrap();
        let nv = cpu.config().n_vocab;
        let g = bitnet_testdata::compare_logits(&b, &a, nv, 0.08);
        assert!(
            g.max_abs <= 0.25 && g.min_cos >= 0.995,
            "{head} {kv_type:?}: {g:?}"
        );
        assert_eq!(g.top1_misses_above_margin, 0, "{head} {kv_type:?}: {g:?}");
        let (mut la, mut lb) = (a[a.len() - nv..].to_vec(), b[b.len() - nv..].to_vec());
        for step in 0..16 {
            let mut sorted = la.clone();
            sorted.sort_by(|x, y| y.total_cmp(x));
            let t = bitnet_sampling::argmax(&la).unwrap();
            if sorted[0] - sorted[1] > 0.08 {
                assert_eq!(
                    bitnet_sampling::argmax(&lb).unwrap(),
                    t,
                    "{head}: step {step}"
                );
            }
            la = cpu
                .eval(&mut sc, &[t], bitnet_model::Outputs::Last)
                .unwrap();
            lb = gpu
                .eval(&mut sg, &[t], bitnet_model::Outputs::Last)
                .unwrap();
            let g = bitnet_testdata::compare_logits(&lb, &la, nv, 0.08);
            assert!(
                g.max_abs <= 0.25 && g.min_cos >= 0.995,
                "{head} step {step}: {g:?}"
            );
        }
    }
}

fn logit_7_is_refused(err: &EngineError) -> bool {
    matches!(
        err,
        EngineError::Model(bitnet_model::ModelError::NonFiniteOutput { index: 7, .. })
    )
}

/// NaN in token 7's row of the tied embedding, on the GPU: logits holding NaN (read back, or
/// met by the device's arg-max or top-k) and a step that looks the row up are the model's
/// errors, as on the CPU, and the session keeps what it had.
#[test]
fn non_finite_weights_on_the_gpu() {
    if !have_gpu() {
        return;
    }
    let golden = bitnet_testdata::read("tiny/bitnet-tiny-i2_s.gguf");
    let f = bitnet_gguf::GgufFile::from_bytes(golden, &bitnet_gguf::Limits::default()).unwrap();
    let bytes = bitnet_testkit::rewrite(&f, |_, ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.name == "token_embd.weight")
            .unwrap();
        let w = usize::try_from(t.dims[0]).unwrap() * 2;
        for half in t.data[7 * w..8 * w].chunks_exact_mut(2) {
            half.copy_from_slice(&[0x00, 0x7e]);
        }
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nan-row.gguf");
    std::fs::write(&path, bytes).unwrap();
    let e = load(&path, &opts(Device::Gpu), &mut |_| {}).unwrap();
    assert!(e.gpu().is_some());
    let mut s = e.new_session(16).unwrap();
    let err = e
        .eval(&mut s, &[1, 2], bitnet_model::Outputs::Last)
        .unwrap_err();
    assert!(logit_7_is_refused(&err), "{err}");
    assert!(s.tokens().is_empty());
    let err = e.eval_greedy(&mut s, &[5, 7, 6]).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Model(bitnet_model::ModelError::NonFiniteEmbedding { token: 7 })
        ),
        "{err}"
    );
    assert!(s.tokens().is_empty());
    let err = e.eval_greedy(&mut s, &[1, 2]).unwrap_err();
    assert!(logit_7_is_refused(&err), "{err}");
    assert!(s.tokens().is_empty());
    // Sampling from the device's top-k.
    let params = GenParams {
        max_tokens: 4,
        sampler: SamplerParams {
            seed: 1,
            ..SamplerParams::default()
        },
        ..GenParams::default()
    };
    let err = e
        .generate(&mut s, &[1, 2], false, &params, &mut |_| true)
        .unwrap_err();
    assert!(logit_7_is_refused(&err), "{err}");
}

/// An overflow inside a block on the GPU: each listed norm of block 0 set to f32::MAX makes
/// infinities, then NaN, ahead of an activation quantization. The device's quantizers keep
/// the NaN (in the row's scale), so the logits are NaN and refused, by the read-back check
/// and by the device's arg-max, rather than finite and wrong.
#[test]
fn overflow_inside_a_block_on_the_gpu() {
    if !have_gpu() {
        return;
    }
    let golden = bitnet_testdata::read("tiny/bitnet-tiny-i2_s.gguf");
    let f = bitnet_gguf::GgufFile::from_bytes(golden, &bitnet_gguf::Limits::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "blk.0.attn_norm.weight",
        "blk.0.attn_sub_norm.weight",
        "blk.0.ffn_norm.weight",
        "blk.0.ffn_sub_norm.weight",
    ] {
        let bytes = bitnet_testkit::rewrite(&f, |_, ts| {
            let t = ts.iter_mut().find(|t| t.name == name).unwrap();
            for v in t.data.chunks_exact_mut(4) {
                v.copy_from_slice(&f32::MAX.to_le_bytes());
            }
        })
        .unwrap();
        let path = dir.path().join("overflow.gguf");
        std::fs::write(&path, bytes).unwrap();
        let e = load(&path, &opts(Device::Gpu), &mut |_| {}).unwrap();
        assert!(e.gpu().is_some());
        let non_finite = |r: Result<_, EngineError>| match r {
            Err(EngineError::Model(bitnet_model::ModelError::NonFiniteOutput { .. })) => {}
            Err(e) => panic!("{name}: {e}"),
            Ok(_) => panic!("{name}: finite logits"),
        };
        // A prompt (the batched kernels), then one token (the decode kernels), each greedy
        // (the device's arg-max) and with the logits read back.
        for tokens in [&[1u32, 2, 3][..], &[1]] {
            let mut s = e.new_session(16).unwrap();
            non_finite(e.eval_greedy(&mut s, tokens).map(|_| ()));
            assert!(s.tokens().is_empty());
            non_finite(
                e.eval(&mut s, tokens, bitnet_model::Outputs::Last)
                    .map(|_| ()),
            );
            assert!(s.tokens().is_empty());
        }
    }
}

/// A server's step on the GPU (`Engine::forward_sessions_pick`): one session's prompt beside
/// three sessions' decode tokens, which step together in one batched pass. Each decoding
/// session's logits are the CPU engine's for that session (the bitnet-gpu gates), its greedy
/// pick the arg-max of the batched logits, and every token joins its session.
#[test]
fn batched_sessions_on_the_gpu_match_the_cpu() {
    if !have_gpu() {
        return;
    }
    let path = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    let gpu = load(&path, &opts(Device::Gpu), &mut |_| {}).unwrap();
    let cpu = load(&path, &opts(Device::Cpu), &mut |_| {}).unwrap();
    let nv = cpu.config().n_vocab;
    let prompts: [&[u32]; 4] = [&[1, 450, 3996], &[1, 17, 99, 2000, 5], &[1], &[1, 3000, 12]];
    let mut gs: Vec<_> = (0..4).map(|_| gpu.new_session(32).unwrap()).collect();
    let mut cs: Vec<_> = (0..4).map(|_| cpu.new_session(32).unwrap()).collect();
    // Sessions 1..4 hold their prompts; session 0's comes in the batched step.
    for i in 1..4 {
        gpu.eval(&mut gs[i], prompts[i], bitnet_model::Outputs::None)
            .unwrap();
        cpu.eval(&mut cs[i], prompts[i], bitnet_model::Outputs::None)
            .unwrap();
    }
    let mut next = [0u32, 7, 2500, 41];
    for step in 0..3 {
        let tokens: Vec<&[u32]> = (0..4)
            .map(|i| {
                if i == 0 && step == 0 {
                    prompts[0]
                } else {
                    std::slice::from_ref(&next[i])
                }
            })
            .collect();
        let mut cw: Vec<_> = cs
            .iter_mut()
            .zip(&tokens)
            .map(|(s, t)| (s, *t, bitnet_model::Outputs::Last))
            .collect();
        let want = cpu.forward_sessions(&mut cw).unwrap();
        drop(cw);
        // Logits for all, then (again, from the same positions) greedy picks for all.
        let mut gw: Vec<_> = gs
            .iter_mut()
            .zip(&tokens)
            .map(|(s, t)| (s, *t, bitnet_model::Outputs::Last))
            .collect();
        let got = gpu.forward_sessions(&mut gw).unwrap();
        drop(gw);
        for (s, t) in gs.iter_mut().zip(&tokens) {
            let n = s.tokens().len();
            s.truncate(n - t.len());
        }
        let mut gw: Vec<_> = gs
            .iter_mut()
            .zip(&tokens)
            .map(|(s, t)| (s, *t, bitnet_model::Outputs::Last))
            .collect();
        let picks = vec![Some(bitnet_engine::Pick::Greedy); 4];
        let picked = gpu.forward_sessions_pick(&mut gw, &picks).unwrap();
        drop(gw);
        for i in 0..4 {
            let g = bitnet_testdata::compare_logits(&got[i], &want[i], nv, 0.08);
            assert!(
                g.max_abs <= 0.25,
                "step {step} session {i}: max |Δ| {}",
                g.max_abs
            );
            assert!(
                g.min_cos >= 0.995,
                "step {step} session {i}: cosine {}",
                g.min_cos
            );
            assert_eq!(g.top1_misses_above_margin, 0, "step {step} session {i}");
            let arg = bitnet_sampling::argmax(&got[i]).unwrap();
            match &picked[i] {
                bitnet_engine::Picked::Chosen(id) => assert_eq!(*id, arg, "step {step} {i}"),
                // A prompt is evaluated alone: its logits come back.
                bitnet_engine::Picked::Logits(l) if i == 0 && step == 0 => {
                    assert_eq!(bitnet_sampling::argmax(l), Some(arg));
                }
                other => panic!("step {step} session {i}: {other:?}"),
            }
            assert_eq!(gs[i].tokens(), cs[i].tokens(), "step {step} session {i}");
            next[i] = bitnet_sampling::argmax(&want[i]).unwrap();
        }
    }
}
