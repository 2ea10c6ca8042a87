//! The low-memory mode (`LoadOptions::budget`): the same logits as normal mode, bit for bit,
//! in both numerics; the plan fits what it can and refuses, with numbers, what it cannot.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use bitnet_engine::budget::{self, BudgetRequest, StreamMode};
use bitnet_engine::{load, Engine, EngineError, LmHeadFormat, LoadEvent, LoadOptions};
use bitnet_model::{KvType, Numerics, Outputs};
use bitnet_testkit::synth::{self, Preset, SynthSpec};

fn tiny() -> PathBuf {
    bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf")
}

/// A synthetic model with the small preset's shapes (6 blocks: the window moves) and the
/// tiny golden vocabulary.
fn small_synth(dir: &Path) -> PathBuf {
    synth_with(dir, "small.gguf", SynthSpec::preset(Preset::Small))
}

/// The small preset with twice its feed-forward width: every block's weights span more than
/// 4 MiB, so each holds a whole 2 MiB piece and the mmap window's huge-page probe (and, where
/// the page cache holds the freshly written file in small pages, its drop) runs at load.
fn wide_synth(dir: &Path) -> PathBuf {
    let mut spec = SynthSpec::preset(Preset::Small);
    spec.n_ff *= 2;
    synth_with(dir, "wide.gguf", spec)
}

fn synth_with(dir: &Path, name: &str, spec: SynthSpec) -> PathBuf {
    let path = dir.join(name);
    let vocab = synth::vocab_from_gguf_bytes(bitnet_testkit::TINY_VOCAB_GGUF).unwrap();
    let f = std::fs::File::create(&path).unwrap();
    synth::write(&spec, &vocab, std::io::BufWriter::new(f), &mut |_, _| {}).unwrap();
    // On disk, so that its pages in the page cache are clean (only clean pages can be
    // dropped, as the huge-page probe may do).
    std::fs::File::open(&path).unwrap().sync_all().unwrap();
    path
}

fn budget(bytes: u64) -> Option<BudgetRequest> {
    budget_streaming(bytes, StreamMode::default())
}

fn budget_streaming(bytes: u64, stream: StreamMode) -> Option<BudgetRequest> {
    Some(BudgetRequest {
        bytes,
        n_ctx: Some(256),
        kv_type_explicit: true,
        stream,
        reserve_bytes: 0,
    })
}

fn engine(path: &Path, numerics: Numerics, b: Option<BudgetRequest>) -> Engine {
    load(
        path,
        &LoadOptions {
            threads: 2,
            numerics,
            budget: b,
            ..LoadOptions::default()
        },
        &mut |_| {},
    )
    .unwrap()
}

/// Logits of every prompt position, then of 12 tokens fed one at a time.
fn run(e: &Engine, prompt: &[u32]) -> Vec<u8> {
    let mut s = e.new_session(256).unwrap();
    let mut out = e.eval(&mut s, prompt, Outputs::All).unwrap();
    for i in 0..12u32 {
        out.extend(e.eval(&mut s, &[(i * 997) % 4000], Outputs::Last).unwrap());
    }
    out.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn streamed_logits_equal_normal_mode_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let small = small_synth(dir.path());
    let wide = wide_synth(dir.path());
    let prompt: Vec<u32> = (0..40).map(|i| (i * 131 + 7) % 4000).collect();
    for path in [tiny(), small, wide] {
        for numerics in [Numerics::Fast, Numerics::Exact] {
            let normal = engine(&path, numerics, None);
            assert!(normal.plan().is_none());
            let want = run(&normal, &prompt);
            // Its map goes, so that the streamed engines' huge-page probe can drop the file's
            // cached pages (pages a map holds are never dropped).
            drop(normal);
            for stream in [StreamMode::Mmap, StreamMode::Pread] {
                let streamed = engine(&path, numerics, budget_streaming(1 << 30, stream));
                assert!(streamed.plan().is_some());
                assert_eq!(streamed.backend().name(), "cpu (streamed)");
                assert!(
                    want == run(&streamed, &prompt),
                    "{} {numerics:?} {stream:?}: logits differ",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn the_plan_is_reported_and_fits_the_budget() {
    let mut plan = None;
    let e = load(
        &tiny(),
        &LoadOptions {
            budget: Some(BudgetRequest {
                bytes: 512 << 20,
                n_ctx: None,
                kv_type_explicit: false,
                stream: StreamMode::default(),
                reserve_bytes: 0,
            }),
            ..LoadOptions::default()
        },
        &mut |ev| {
            if let LoadEvent::Plan(p) = ev {
                plan = Some(p.clone());
            }
        },
    )
    .unwrap();
    let plan = plan.expect("a Plan event");
    assert_eq!(Some(&plan), e.plan());
    assert!(plan.total() <= plan.budget);
    // Room to spare: the default context and the f16 cache, two blocks resident.
    assert_eq!(
        (plan.n_ctx, plan.kv_type, plan.window_layers),
        (512, KvType::F16, 2)
    );
    assert_eq!(e.options().kv_type, KvType::F16);
    assert!(plan.table().contains("KV cache: 512 positions, f16"));
}

#[test]
fn the_plan_lowers_what_was_not_asked_for_and_refuses_what_was() {
    // The planner itself, with the measured runtime part fixed at 0 (deterministic).
    let file = std::sync::Arc::new(
        bitnet_gguf::GgufFile::open(&tiny(), &bitnet_gguf::Limits::default()).unwrap(),
    );
    let owned = bitnet_model::OwnedModel::load(file).unwrap();
    let (model, file) = (owned.model(), owned.file());
    let layers = budget::layer_ranges(model, file).unwrap();
    let c = &model.config;
    let kv = |n: usize, t: KvType| c.kv_cache_bytes(n, t).unwrap();
    let plan = |bytes: u64, n_ctx: Option<usize>, explicit: bool, numerics: Numerics| {
        let req = BudgetRequest {
            bytes,
            n_ctx,
            kv_type_explicit: explicit,
            stream: StreamMode::default(),
            reserve_bytes: 0,
        };
        budget::plan(model, &layers, &req, KvType::F16, numerics, 2, 0)
    };
    let all = plan(1 << 30, Some(512), true, Numerics::Fast).unwrap();
    // With room to spare, every block and the whole head stay resident.
    assert_eq!(all.pinned_layers, layers.len());
    assert_eq!(
        all.pinned_head_bytes,
        u64::try_from(model.lm_head().nbytes()).unwrap()
    );
    let fixed: u64 = all
        .items
        .iter()
        .filter(|i| !i.what.starts_with("KV cache") && !i.what.starts_with("kept resident"))
        .map(|i| i.bytes)
        .sum();

    // A caller's reserve (the server's) is a line of the plan and counts against the budget.
    let exact_fit = fixed + kv(512, KvType::F16);
    assert_eq!(
        plan(exact_fit, Some(512), true, Numerics::Fast)
            .unwrap()
            .window_layers,
        2
    );
    let reserved = |reserve_bytes: u64| {
        let req = BudgetRequest {
            bytes: exact_fit,
            n_ctx: Some(512),
            kv_type_explicit: true,
            stream: StreamMode::default(),
            reserve_bytes,
        };
        budget::plan(model, &layers, &req, KvType::F16, Numerics::Fast, 2, 0)
    };
    let p = reserved(64 << 10).unwrap();
    assert_eq!(
        p.window_layers, 1,
        "the reserve takes the read-ahead's room"
    );
    assert!(p
        .items
        .iter()
        .any(|i| i.what.starts_with("reserved") && i.bytes == 64 << 10));
    assert!(p.total() <= exact_fit);
    assert!(matches!(
        reserved(exact_fit),
        Err(EngineError::BudgetTooSmall { .. })
    ));

    // Room for 512 positions of Q8_0, and not of F16 even with one block of weights
    // resident instead of two: the KV type is lowered...
    let bytes = fixed + kv(512, KvType::Q8_0);
    assert!(kv(512, KvType::F16) - kv(512, KvType::Q8_0) > u64::try_from(layers[0].len()).unwrap());
    let p = plan(bytes, Some(512), false, Numerics::Fast).unwrap();
    assert_eq!(
        (p.kv_type, p.n_ctx, p.window_layers),
        (KvType::Q8_0, 512, 2)
    );
    assert!(p.total() <= bytes);
    assert!(p.notes.iter().any(|n| n.contains("q8_0")));
    // ...unless it was chosen: then the explicit context does not fit, and the error says
    // what would.
    match plan(bytes, Some(512), true, Numerics::Fast) {
        Err(EngineError::BudgetTooSmall { detail, needed, .. }) => {
            assert!(needed > bytes);
            assert!(
                detail.contains("-c 512") && detail.contains("would fit"),
                "{detail}"
            );
        }
        other => panic!("expected BudgetTooSmall, got {other:?}"),
    }
    // Beside one block only: room for 512 positions of Q8_0 gives one block and Q8_0, not two
    // blocks and the coarser Q4_0 (whether or not that would fit too); room for Q4_0 only
    // gives Q4_0.
    let one_block = fixed - u64::try_from(layers[0].len()).unwrap();
    for t in [KvType::Q8_0, KvType::Q4_0] {
        let p = plan(one_block + kv(512, t), Some(512), false, Numerics::Fast).unwrap();
        assert_eq!((p.kv_type, p.n_ctx, p.window_layers), (t, 512, 1));
        assert!(
            p.notes.iter().any(|n| n.contains(t.name())),
            "{:?}",
            p.notes
        );
    }
    // Exact numerics keeps f16 (its batch of 512 also needs more room for activations).
    assert!(matches!(
        plan(bytes, Some(512), false, Numerics::Exact),
        Err(EngineError::BudgetTooSmall { .. })
    ));
    // Without -c, the context shrinks to what fits (whole multiples of 256).
    let p = plan(fixed + kv(300, KvType::F16), None, true, Numerics::Fast).unwrap();
    assert_eq!((p.n_ctx, p.kv_type), (256, KvType::F16));
    assert!(p.notes.iter().any(|n| n.contains("context lowered")));
    // Not even 256 positions beside two blocks: one block resident.
    let p = plan(one_block + kv(256, KvType::F16), None, true, Numerics::Fast).unwrap();
    assert_eq!((p.window_layers, p.n_ctx), (1, 256));
    // A budget below the model's minimum.
    match plan(1 << 20, None, false, Numerics::Fast) {
        Err(EngineError::BudgetTooSmall { budget, detail, .. }) => {
            assert_eq!(budget, 1 << 20);
            assert!(detail.contains("smallest plan"), "{detail}");
        }
        other => panic!("expected BudgetTooSmall, got {other:?}"),
    }
}

#[test]
fn budget_combinations_that_cannot_work_are_refused() {
    for opts in [
        LoadOptions {
            in_memory: true,
            budget: budget(1 << 30),
            ..LoadOptions::default()
        },
        LoadOptions {
            lm_head: LmHeadFormat::Q8_0,
            budget: budget(1 << 30),
            ..LoadOptions::default()
        },
    ] {
        match load(Path::new("/nonexistent.gguf"), &opts, &mut |_| {}) {
            Err(EngineError::Budget { .. }) => {}
            other => panic!("expected a Budget error, got {:?}", other.map(|_| ())),
        }
    }
}
