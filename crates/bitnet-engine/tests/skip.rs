//! Layer skip: which blocks `auto` chooses, and that skipped blocks are not run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bitnet_engine::skip::{self, SkipLayers};
use bitnet_engine::{load, EngineError, LoadOptions};
use bitnet_model::{Exec, Numerics, Outputs, TraceEvent};
use bitnet_testkit::synth::{self, Preset, SynthSpec};

fn small(dir: &std::path::Path, numerics: Numerics) -> bitnet_engine::Engine {
    let path = dir.join("small.gguf");
    if !path.exists() {
        let vocab = synth::vocab_from_gguf_bytes(bitnet_testkit::TINY_VOCAB_GGUF).unwrap();
        let f = std::fs::File::create(&path).unwrap();
        synth::write(
            &SynthSpec::preset(Preset::Small),
            &vocab,
            std::io::BufWriter::new(f),
            &mut |_, _| {},
        )
        .unwrap();
    }
    load(
        &path,
        &LoadOptions {
            threads: 2,
            numerics,
            ..LoadOptions::default()
        },
        &mut |_| {},
    )
    .unwrap()
}

#[test]
fn auto_skips_the_least_important_middle_blocks() {
    // 10 blocks: the middle six are candidates; 0.3 of 10 = 3 blocks.
    let imp = [0.9, 0.1, 0.5, 0.05, 0.4, 0.2, 0.3, 0.6, 0.01, 0.02];
    assert_eq!(skip::choose(&imp, 0.3), vec![3, 5, 6]);
    assert_eq!(skip::choose(&imp, 0.05), Vec::<usize>::new());
    assert_eq!(skip::choose(&imp[..4], 0.5), Vec::<usize>::new());
    // Ties go to the lower index.
    assert_eq!(
        skip::choose(&[1.0, 1.0, 0.5, 0.5, 0.5, 1.0, 1.0], 0.2),
        vec![2]
    );
}

#[test]
fn skipped_blocks_are_not_run_and_change_the_logits() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = small(dir.path(), Numerics::Fast);
    let ids: Vec<u32> = (0..12).map(|i| (i * 313 + 5) % 4000).collect();
    let run = |e: &bitnet_engine::Engine| {
        let mut blocks = 0;
        let l = {
            let mut hook = |ev: &TraceEvent<'_>| {
                if ev.name == "l_out" {
                    blocks += 1;
                }
            };
            let mut cache = e
                .model()
                .unwrap()
                .new_cache(16, e.options().kv_type, u64::MAX)
                .unwrap();
            let mut exec = Exec {
                backend: e.backend(),
                numerics: Numerics::Fast,
                trace: Some(&mut hook),
                scratch: None,
            };
            e.model()
                .unwrap()
                .forward(&ids, &mut cache, Outputs::Last, &mut exec)
                .unwrap()
        };
        (l, blocks)
    };
    let (full, n) = run(&e);
    assert_eq!(n, 6);
    assert_eq!(
        e.set_skip_layers(&SkipLayers::List(vec![3, 2, 3])).unwrap(),
        vec![2, 3]
    );
    let (skipped, n) = run(&e);
    assert_eq!(n, 4);
    assert!(full.iter().zip(&skipped).any(|(a, b)| a != b));

    let imp = skip::importance(&e).unwrap();
    assert_eq!(imp.len(), 6);
    assert!(imp.iter().all(|&x| (0.0..=2.0).contains(&x)), "{imp:?}");
    let auto = e
        .set_skip_layers(&SkipLayers::Auto { fraction: 0.34 })
        .unwrap();
    assert_eq!(auto, skip::choose(&imp, 0.34));
    assert_eq!(auto.len(), 2);
    assert!(auto.iter().all(|&i| (2..4).contains(&i)));

    for bad in [
        SkipLayers::List(vec![6]),
        SkipLayers::List((0..6).collect()),
        SkipLayers::Auto { fraction: 0.0 },
        SkipLayers::Auto { fraction: 1.0 },
    ] {
        assert!(
            matches!(e.set_skip_layers(&bad), Err(EngineError::Skip(_))),
            "{bad:?}"
        );
    }
    let mut exact = small(dir.path(), Numerics::Exact);
    assert!(matches!(
        exact.set_skip_layers(&SkipLayers::List(vec![2])),
        Err(EngineError::Skip(_))
    ));
}
