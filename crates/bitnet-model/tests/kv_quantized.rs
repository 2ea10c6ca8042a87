//! The Q8_0 and Q4_0 KV caches against the f32 and f16 caches: logits over every position of
//! the tiny golden prompts (golden tiny model and a synthetic one) stay within a small multiple
//! of what the f16 cache (for Q8_0) or the Q8_0 cache (for Q4_0) moves them and mostly pick the
//! same top token; a head size that is not a multiple of 32 is refused at cache creation.

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
fn quantized_cache_logits_stay_close_to_the_f32_cache() {
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
        // Against the f32 cache: max |Δ logit| and top-1 agreements of the f16, Q8_0 and Q4_0
        // caches.
        let (mut err, mut agree, mut rows) = ([0f32; 3], [0usize; 3], 0usize);
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
            let r32 = run(KvType::F32);
            let others = [KvType::F16, KvType::Q8_0, KvType::Q4_0].map(run);
            for (i, x) in r32.chunks_exact(n_vocab).enumerate() {
                let t = argmax(x);
                rows += 1;
                for (k, o) in others.iter().enumerate() {
                    let y = &o[i * n_vocab..][..n_vocab];
                    agree[k] += usize::from(argmax(y) == t);
                    for (&x, &y) in x.iter().zip(y) {
                        err[k] = err[k].max((x - y).abs());
                    }
                }
            }
        }
        let ([e16, e8, e4], [a16, a8, a4]) = (err, agree);
        eprintln!(
            "{name}: against the f32 cache, max |Δ logit| f16 {e16:.5}, q8_0 {e8:.5}, \
             q4_0 {e4:.5}; top-1 f16 {a16}/{rows}, q8_0 {a8}/{rows}, q4_0 {a4}/{rows}"
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
        // A Q4_0 step is 1/8 of the block's largest magnitude, 16 × Q8_0's 1/127, and the
        // end opposite the largest value clamps at 7 (up to a whole step): at most about 32 ×
        // Q8_0's error. Its top token changes far more often on these random models' near
        // ties (reported above, not asserted).
        assert!(
            e4 <= 32.0 * e8 + 1e-3,
            "{name}: q4_0 {e4} against q8_0 {e8}"
        );
    }
}

#[test]
fn quantized_caches_need_a_head_size_in_whole_blocks() {
    let synth = GgufFile::from_bytes(
        bitnet_testkit::tiny_model_bytes(5).unwrap(),
        &Limits::default(),
    )
    .unwrap();
    let mut m = Model::load(&synth).unwrap();
    m.config.head_dim = 40;
    for ty in [KvType::Q8_0, KvType::Q4_0] {
        let err = m.new_cache(16, ty, u64::MAX).unwrap_err();
        assert!(matches!(err, ModelError::BadHparam { .. }), "{err:?}");
    }
    // The other types do not care.
    m.new_cache(16, KvType::F16, u64::MAX).unwrap();
}
