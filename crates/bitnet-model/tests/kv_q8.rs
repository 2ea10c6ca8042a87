//! The Q8_0 KV cache against the f32 and f16 caches: logits over every position of the tiny
//! golden prompts (golden tiny model and a synthetic one) stay within a small multiple of what
//! the f16 cache moves them and mostly pick the same top token; a head size that is not a
//! multiple of 32 is refused at cache creation.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss
)]

mod common;

use bitnet_gguf::{GgufFile, Limits};
use bitnet_kernels::Pool;
use bitnet_model::{Exec, KvType, Model, ModelError, Numerics, Outputs};

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(0, |bi, (i, &x)| if x > v[bi] { i } else { bi })
}

#[test]
fn q8_cache_logits_stay_close_to_the_f32_cache() {
    let golden = GgufFile::open(
        &bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf"),
        &Limits::default(),
    )
    .unwrap();
    let synth = GgufFile::from_bytes(
        bitnet_testkit::tiny_model_bytes(5).unwrap(),
        &Limits::default(),
    )
    .unwrap();
    let pool = Pool::new(2);
    for (name, file) in [("golden", &golden), ("synth", &synth)] {
        let m = Model::load(file).unwrap();
        assert!(
            m.config.head_dim.is_multiple_of(32),
            "{name}: test needs whole blocks"
        );
        let n_vocab = m.config.n_vocab;
        // Against the f32 cache: (max |Δ logit|, top-1 agreements) of the f16 and Q8_0 caches.
        let (mut e16, mut e8, mut a16, mut a8, mut rows) = (0f32, 0f32, 0usize, 0usize, 0usize);
        for p in common::golden_prompts() {
            // Prompt in two batches, then token by token: the cache is written and read in
            // prefill and in decode steps.
            let run = |ty: KvType| {
                let mut exec = Exec {
                    backend: &pool,
                    numerics: Numerics::Fast,
                    trace: None,
                    scratch: None,
                };
                let mut c = m.new_cache(p.len(), ty, u64::MAX).unwrap();
                let half = p.len() / 2;
                let mut out = m
                    .forward(&p[..half], &mut c, Outputs::All, &mut exec)
                    .unwrap();
                for &t in &p[half..] {
                    out.extend(m.forward(&[t], &mut c, Outputs::All, &mut exec).unwrap());
                }
                out
            };
            let (r32, r16, r8) = (run(KvType::F32), run(KvType::F16), run(KvType::Q8_0));
            for ((x, y), z) in r32
                .chunks_exact(n_vocab)
                .zip(r16.chunks_exact(n_vocab))
                .zip(r8.chunks_exact(n_vocab))
            {
                let t = argmax(x);
                a16 += usize::from(argmax(y) == t);
                a8 += usize::from(argmax(z) == t);
                rows += 1;
                for ((&x, &y), &z) in x.iter().zip(y).zip(z) {
                    e16 = e16.max((x - y).abs());
                    e8 = e8.max((x - z).abs());
                }
            }
        }
        eprintln!(
            "{name}: against the f32 cache, max |Δ logit| f16 {e16:.5}, q8_0 {e8:.5}; \
             top-1 f16 {a16}/{rows}, q8_0 {a8}/{rows}"
        );
        // A Q8_0 value is within ~0.56 of a step of 1/127 of its block's largest magnitude
        // (≈ 0.4 % relative), an f16 value within 2⁻¹¹ relative: the Q8_0 cache may move the
        // logits several times as far as the f16 cache does, and not much further; the top
        // token may change on near-ties only.
        assert!(
            e8 <= 4.0 * e16 + 1e-3,
            "{name}: q8_0 {e8} against f16 {e16}"
        );
        assert!(
            a8 as f64 >= 0.9 * a16 as f64,
            "{name}: top-1 agreement q8_0 {a8}, f16 {a16} of {rows}"
        );
    }
}

#[test]
fn q8_cache_needs_a_head_size_in_whole_blocks() {
    let synth = GgufFile::from_bytes(
        bitnet_testkit::tiny_model_bytes(5).unwrap(),
        &Limits::default(),
    )
    .unwrap();
    let mut m = Model::load(&synth).unwrap();
    m.config.head_dim = 40;
    let err = m.new_cache(16, KvType::Q8_0, u64::MAX).unwrap_err();
    assert!(matches!(err, ModelError::BadHparam { .. }), "{err:?}");
    // The other types do not care.
    m.new_cache(16, KvType::F16, u64::MAX).unwrap();
}
