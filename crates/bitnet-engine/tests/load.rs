//! The library's loading call: options validated before anything is opened, typed errors,
//! an engine that owns its model (moved to another thread and used there), the LM-head
//! conversion reported through the progress callback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use bitnet_engine::{load, Engine, EngineError, LmHeadFormat, LoadEvent, LoadOptions};
use bitnet_model::{KvType, Numerics, Outputs};

fn tiny() -> PathBuf {
    bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf")
}

fn assert_send_static<T: Send + 'static>() {}

#[test]
fn an_engine_is_send_and_static_and_works_on_another_thread() {
    assert_send_static::<Engine>();
    let engine = load(&tiny(), &LoadOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(engine.config().n_vocab, 4256);
    let ids = bitnet_testdata::read("tiny/p1_english.tokens.json");
    let meta: serde_json::Value = serde_json::from_slice(&ids).unwrap();
    let prompt: Vec<u32> = meta["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| u32::try_from(v.as_u64().unwrap()).unwrap())
        .collect();
    let logits = std::thread::spawn(move || {
        let mut s = engine.new_session(64).unwrap();
        engine.eval(&mut s, &prompt, Outputs::Last).unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(logits.len(), 4256);
    // The golden model's first greedy token, as bitnet.cpp chose it.
    let first = meta["generated_tokens"][0].as_u64().unwrap();
    let argmax = logits
        .iter()
        .enumerate()
        .fold(0, |b, (i, &x)| if x > logits[b] { i } else { b });
    assert_eq!(argmax as u64, first);
}

#[test]
fn bad_option_combinations_are_refused_before_opening() {
    let nowhere = PathBuf::from("/nonexistent/model.gguf");
    type Expect = fn(&EngineError) -> bool;
    let cases: [(LoadOptions, Expect); 5] = [
        (
            LoadOptions {
                numerics: Numerics::Exact,
                lm_head: LmHeadFormat::Q8_0,
                ..Default::default()
            },
            |e| matches!(e, EngineError::ExactNeedsF16Head),
        ),
        (
            LoadOptions {
                numerics: Numerics::Exact,
                kv_type: KvType::F32,
                ..Default::default()
            },
            |e| matches!(e, EngineError::ExactNeedsF16),
        ),
        (
            LoadOptions {
                numerics: Numerics::Exact,
                n_batch: 256,
                ..Default::default()
            },
            |e| matches!(e, EngineError::ExactNeedsBatch512(256)),
        ),
        (
            LoadOptions {
                threads: 0,
                ..Default::default()
            },
            |e| matches!(e, EngineError::Zero { what: "threads" }),
        ),
        (
            LoadOptions {
                n_batch: 0,
                ..Default::default()
            },
            |e| matches!(e, EngineError::Zero { what: "n_batch" }),
        ),
    ];
    for (opts, want) in cases {
        let e = load(&nowhere, &opts, &mut |_| panic!("nothing may be reported")).unwrap_err();
        assert!(want(&e), "{opts:?}: {e}");
    }
    let e = load(&nowhere, &LoadOptions::default(), &mut |_| {}).unwrap_err();
    assert!(matches!(e, EngineError::Open { .. }), "{e}");
    assert!(e.to_string().contains("/nonexistent/model.gguf"), "{e}");
}

#[test]
fn a_quantized_head_is_built_and_reported() {
    let mut events = Vec::new();
    let opts = LoadOptions {
        lm_head: LmHeadFormat::Q8_0,
        threads: 2,
        repack: false,
        ..Default::default()
    };
    let q8 = load(&tiny(), &opts, &mut |e| {
        events.push(match e {
            LoadEvent::Opened { .. } => "opened",
            LoadEvent::LmHeadStart { rows: 4256, .. } => "start",
            LoadEvent::LmHeadDone {
                format: LmHeadFormat::Q8_0,
                ..
            } => "done",
            LoadEvent::Note(_) => "note",
            _ => "other",
        });
    })
    .unwrap();
    assert_eq!(events, ["opened", "start", "done"]);
    let f16 = load(&tiny(), &LoadOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(
        q8.model().unwrap().lm_head().row_type(),
        bitnet_kernels::RowType::Q8_0
    );
    let ids = [4000u32, 791, 1864, 315];
    let run = |e: &Engine| {
        let mut s = e.new_session(8).unwrap();
        e.eval(&mut s, &ids, Outputs::Last).unwrap()
    };
    let (a, b) = (run(&q8), run(&f16));
    let max = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(max > 0.0 && max < 0.05, "Q8_0 head moved logits by {max}");
}

/// The model at `path` loaded with `numerics` and `repack`: the repacked matrices the load
/// reported (as a share of its 7 · n_layer projections), the repacked bytes of block 0's
/// down projection, and the logits of a 17-token
/// prompt (all positions: the GEMM) then 4 single steps (the matvec).
fn repack_run(
    path: &std::path::Path,
    numerics: Numerics,
    repack: bool,
) -> (usize, usize, Vec<f32>) {
    let ids: Vec<u32> = (0..21u32).map(|i| (i * 733 + 17) % 4256).collect();
    let opts = LoadOptions {
        numerics,
        repack,
        threads: 2,
        ..Default::default()
    };
    let mut reported = 0;
    let e = load(path, &opts, &mut |ev| {
        if let LoadEvent::Repacked { matrices, .. } = ev {
            reported = matrices;
        }
    })
    .unwrap();
    let bytes = e.model().unwrap().layers[0].w_down.repacked_bytes();
    // Every projection or none.
    assert!(
        reported == 0 || reported == 7 * e.config().n_layer,
        "{reported}"
    );
    let mut s = e.new_session(64).unwrap();
    let mut all = e.eval(&mut s, &ids[..17], Outputs::All).unwrap();
    for &t in &ids[17..] {
        all.extend(e.eval(&mut s, &[t], Outputs::Last).unwrap());
    }
    (reported, bytes, all)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Repacking the I2_S weights for the panel GEMM (on a CPU whose tier has one) changes no
/// logit bit in either numerics, over a whole prompt (the GEMM) and single steps (the
/// matvec); it is reported, and skipped where the tier has no panel kernel.
#[test]
fn repacked_weights_give_the_same_logits_bit_for_bit() {
    let panels = bitnet_kernels::has_panel_kernel(bitnet_kernels::isa());
    eprintln!("tier {} repacks: {panels}", bitnet_kernels::isa().name());
    for numerics in [Numerics::Fast, Numerics::Exact] {
        let (r0, b0, plain) = repack_run(&tiny(), numerics, false);
        let (r1, b1, packed) = repack_run(&tiny(), numerics, true);
        assert_eq!((r0, b0), (0, 0));
        if panels {
            assert!(r1 > 0 && b1 > 0);
        } else {
            assert_eq!((r1, b1), (0, 0));
        }
        assert_eq!(bits(&plain), bits(&packed), "{numerics:?}");
    }
}

/// TQ2_0, TQ1_0, BitNet32F16 and Split32 projections (one scale per tensor, as the writers
/// make them from a BitNet model) are repacked into the I2_S panels (on a tier that has them)
/// in both numerics, and give the unrepacked logits bit for bit (their rows take I2_S's float
/// steps either way). Split32, whose sibling holds the I2_S file's f32 scale in every block,
/// gives the I2_S file's logits too, repacked or not, in both numerics.
#[test]
fn block_layouts_with_one_scale_are_repacked_in_both_numerics() {
    use bitnet_testkit::{synth, Preset, SynthSpec, WeightLayout};
    let panels = bitnet_kernels::has_panel_kernel(bitnet_kernels::isa());
    eprintln!("tier {} repacks: {panels}", bitnet_kernels::isa().name());
    let dir = tempfile::tempdir().unwrap();
    let mut i2s = None;
    for layout in [
        WeightLayout::I2S,
        WeightLayout::Tq2_0,
        WeightLayout::Tq1_0,
        WeightLayout::BitNet32F16,
        WeightLayout::Split32WithSibling,
    ] {
        let mut spec = SynthSpec::preset(Preset::Tiny);
        spec.layout = layout;
        let path = dir.path().join(format!("{layout:?}.gguf"));
        let vocab = synth::vocab_from_gguf_bytes(bitnet_testkit::TINY_VOCAB_GGUF).unwrap();
        synth::write(
            &spec,
            &vocab,
            std::fs::File::create(&path).unwrap(),
            &mut |_, _| {},
        )
        .unwrap();
        if layout == WeightLayout::I2S {
            i2s = Some(path);
            continue;
        }
        for numerics in [Numerics::Fast, Numerics::Exact] {
            let (r0, b0, plain) = repack_run(&path, numerics, false);
            let (r1, b1, packed) = repack_run(&path, numerics, true);
            assert_eq!((r0, b0), (0, 0));
            if panels {
                assert!(r1 > 0 && b1 > 0, "{layout:?} {numerics:?}");
            } else {
                assert_eq!((r1, b1), (0, 0), "{layout:?} {numerics:?}");
            }
            assert_eq!(bits(&plain), bits(&packed), "{layout:?} {numerics:?}");
            if layout == WeightLayout::Split32WithSibling {
                let (_, _, want) = repack_run(i2s.as_deref().unwrap(), numerics, false);
                assert_eq!(bits(&plain), bits(&want), "{layout:?} {numerics:?} vs I2_S");
            }
        }
    }
}

/// An overflow inside a block (block 0's attention norm at f32::MAX), through the engine's
/// CPU load, repacked for the panel GEMM where the tier has it, in both numerics: a prompt
/// (the GEMM) and a single step (the matvec) are the model's non-finite error and leave the
/// session empty, rather than finite logits computed past a quantized-away NaN.
#[test]
fn an_overflow_inside_a_block_is_refused_repacked_or_not() {
    let src = bitnet_gguf::GgufFile::open(&tiny(), &bitnet_gguf::Limits::default()).unwrap();
    let bytes = bitnet_testkit::rewrite(&src, |_, ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.name == "blk.0.attn_norm.weight")
            .unwrap();
        for v in t.data.chunks_exact_mut(4) {
            v.copy_from_slice(&f32::MAX.to_le_bytes());
        }
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("overflow.gguf");
    std::fs::write(&path, bytes).unwrap();
    eprintln!("tier {}", bitnet_kernels::isa().name());
    for numerics in [Numerics::Fast, Numerics::Exact] {
        for repack in [false, true] {
            let opts = LoadOptions {
                numerics,
                repack,
                threads: 2,
                ..Default::default()
            };
            let e = load(&path, &opts, &mut |_| {}).unwrap();
            let mut s = e.new_session(32).unwrap();
            for tokens in [&[5u32, 9, 17, 3][..], &[5]] {
                let r = e.eval(&mut s, tokens, Outputs::Last);
                assert!(
                    matches!(
                        r,
                        Err(EngineError::Model(
                            bitnet_model::ModelError::NonFiniteOutput { .. }
                        ))
                    ),
                    "{numerics:?} repack {repack} {} tokens: {:?}",
                    tokens.len(),
                    r.map(|l| l[..4].to_vec())
                );
                assert!(s.tokens().is_empty());
            }
        }
    }
}
