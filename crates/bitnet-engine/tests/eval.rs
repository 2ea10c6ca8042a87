#![allow(clippy::unwrap_used)]

use bitnet_engine::{Engine, EngineOptions};
use bitnet_gguf::{GgufFile, Limits};
use bitnet_model::{Outputs, OwnedModel};
use bitnet_tokenizer::Tokenizer;

/// A prompt split into several prefill batches still yields one logits row per position, and
/// the same rows as one big batch (fast numerics: per-token work does not depend on batching
/// except in attention's summation order, hence the small tolerance).
#[test]
fn all_outputs_span_every_prefill_batch() {
    let f = std::sync::Arc::new(
        GgufFile::from_bytes(
            bitnet_testkit::tiny_model_bytes(2).unwrap(),
            &Limits::default(),
        )
        .unwrap(),
    );
    let engine = |n_batch| {
        let tok = Tokenizer::from_gguf(f.metadata(), None).unwrap();
        Engine::new(
            OwnedModel::load(std::sync::Arc::clone(&f)).unwrap(),
            tok,
            EngineOptions {
                n_batch,
                ..Default::default()
            },
        )
        .unwrap()
    };
    let ids: Vec<u32> = (0..11).map(|i| 100 + 37 * i).collect();
    let (small, big) = (engine(4), engine(512));
    let mut s1 = small.new_session(32).unwrap();
    let mut s2 = big.new_session(32).unwrap();
    let a = small.eval(&mut s1, &ids, Outputs::All).unwrap();
    let b = big.eval(&mut s2, &ids, Outputs::All).unwrap();
    let n_vocab = small.config().n_vocab;
    assert_eq!(a.len(), ids.len() * n_vocab);
    assert_eq!(b.len(), a.len());
    let max = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(max < 1e-3, "max |Δ| {max}");
    assert_eq!(s1.tokens(), ids.as_slice());
}
