//! `LmHeadFormat::Approx` through the loading call: probing every cluster gives the exact
//! head's logits bit for bit, the low-memory mode gives normal mode's approximate logits bit
//! for bit, and the combinations it cannot serve are refused before the file is opened.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use bitnet_engine::budget::{BudgetRequest, StreamMode};
use bitnet_engine::{load, Device, Engine, EngineError, LmHeadFormat, LoadEvent, LoadOptions};
use bitnet_model::{ApproxOptions, Numerics, Outputs};

fn tiny() -> std::path::PathBuf {
    bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf")
}

fn engine(lm_head: LmHeadFormat, budget: Option<BudgetRequest>) -> Engine {
    let mut built = None;
    let e = load(
        &tiny(),
        &LoadOptions {
            threads: 2,
            lm_head,
            budget,
            ..LoadOptions::default()
        },
        &mut |ev| {
            if let LoadEvent::LmHeadDone { bytes, .. } = ev {
                built = Some(bytes);
            }
        },
    )
    .unwrap();
    assert_eq!(
        built.is_some(),
        matches!(lm_head, LmHeadFormat::Approx(_)),
        "the approximate head's build is reported"
    );
    e
}

/// Logits of every prompt position, then of 12 tokens fed one at a time.
fn run(e: &Engine) -> Vec<f32> {
    let prompt: Vec<u32> = (0..30).map(|i| (i * 131 + 7) % 4000).collect();
    let mut s = e.new_session(128).unwrap();
    let mut out = e.eval(&mut s, &prompt, Outputs::All).unwrap();
    for i in 0..12u32 {
        out.extend(e.eval(&mut s, &[(i * 997) % 4000], Outputs::Last).unwrap());
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn budget() -> Option<BudgetRequest> {
    Some(BudgetRequest {
        bytes: 1 << 30,
        n_ctx: Some(128),
        kv_type_explicit: true,
        stream: StreamMode::default(),
        reserve_bytes: 0,
    })
}

#[test]
fn probing_every_cluster_is_the_exact_head() {
    let exact = run(&engine(LmHeadFormat::File, None));
    let all = LmHeadFormat::Approx(ApproxOptions {
        clusters: 64,
        probe: 64,
        ..Default::default()
    });
    assert!(bits(&run(&engine(all, None))) == bits(&exact));
    assert!(bits(&run(&engine(all, budget()))) == bits(&exact));
}

#[test]
fn the_approximate_head_streams_to_the_same_logits_and_differs_from_the_exact_head() {
    let approx = LmHeadFormat::Approx(ApproxOptions {
        clusters: 64,
        probe: 4,
        ..Default::default()
    });
    let normal = run(&engine(approx, None));
    let streamed = run(&engine(approx, budget()));
    assert!(bits(&normal) == bits(&streamed));
    let exact = run(&engine(LmHeadFormat::File, None));
    let same = normal
        .iter()
        .zip(&exact)
        .filter(|(a, b)| a.to_bits() == b.to_bits())
        .count();
    // 4 of 64 clusters: a small share of each row is computed exactly.
    assert!(
        same > 0 && same < exact.len() / 2,
        "{same} of {}",
        exact.len()
    );
}

#[test]
fn combinations_the_approximate_head_cannot_serve_are_refused() {
    let approx = LmHeadFormat::Approx(ApproxOptions::default());
    let exact = LoadOptions {
        numerics: Numerics::Exact,
        lm_head: approx,
        ..LoadOptions::default()
    };
    assert!(matches!(
        load(Path::new("/nonexistent.gguf"), &exact, &mut |_| {}),
        Err(EngineError::ExactNeedsF16Head)
    ));
    let gpu = LoadOptions {
        device: Device::Gpu,
        lm_head: approx,
        ..LoadOptions::default()
    };
    assert!(matches!(
        load(Path::new("/nonexistent.gguf"), &gpu, &mut |_| {}),
        Err(EngineError::Device(_))
    ));
}
