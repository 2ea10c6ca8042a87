//! Logit error of a quantized LM head (built from the F16 embedding) against the exact F16
//! head, over every position of every tiny golden prompt and over a synthetic model.
//! Bounds are stated per format; run with `--nocapture` to see the measured numbers.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

mod common;

use bitnet_gguf::{GgufFile, Limits};
use bitnet_kernels::{Pool, RowMatrix, RowType};
use bitnet_model::{Exec, KvType, Model, Numerics, Outputs};

struct Err {
    max_abs: f32,
    top1_agree: usize,
    rows: usize,
}

fn compare(file: &GgufFile, prompts: &[Vec<u32>], ty: RowType) -> Err {
    let pool = Pool::new(2);
    let f16 = Model::load(file).unwrap();
    let mut q = Model::load(file).unwrap();
    let head = RowMatrix::quantize_from(q.lm_head(), ty, &pool).unwrap();
    q.set_lm_head(head);
    let mut e = Err {
        max_abs: 0.0,
        top1_agree: 0,
        rows: 0,
    };
    let n_vocab = f16.config.n_vocab;
    for p in prompts {
        let run = |m: &Model<'_>| {
            let mut exec = Exec {
                backend: &pool,
                numerics: Numerics::Fast,
                trace: None,
                scratch: None,
            };
            let mut c = m.new_cache(p.len(), KvType::F16, u64::MAX).unwrap();
            m.forward(p, &mut c, Outputs::All, &mut exec).unwrap()
        };
        let (a, b) = (run(&f16), run(&q));
        for (ra, rb) in a.chunks_exact(n_vocab).zip(b.chunks_exact(n_vocab)) {
            let am = |v: &[f32]| {
                v.iter()
                    .enumerate()
                    .fold(0, |bi, (i, &x)| if x > v[bi] { i } else { bi })
            };
            e.top1_agree += usize::from(am(ra) == am(rb));
            e.rows += 1;
            for (x, y) in ra.iter().zip(rb) {
                e.max_abs = e.max_abs.max((x - y).abs());
            }
        }
    }
    e
}

#[test]
fn quantized_lm_head_error_is_bounded() {
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
    let prompts = common::golden_prompts();
    // (format, max |Δ| bound, minimum top-1 agreement)
    for (ty, bound, agree) in [
        (RowType::Q8_0, 0.02, 0.95),
        (RowType::Q6K, 0.05, 0.90),
        (RowType::Q4_0, 0.25, 0.70),
    ] {
        for (name, file) in [("golden", &golden), ("synth", &synth)] {
            let e = compare(file, &prompts, ty);
            let frac = e.top1_agree as f64 / e.rows as f64;
            eprintln!(
                "{ty:?} {name}: max |Δ| {:.5}, top-1 agreement {}/{} ({:.1}%)",
                e.max_abs,
                e.top1_agree,
                e.rows,
                100.0 * frac
            );
            assert!(
                e.max_abs <= bound,
                "{ty:?} {name}: max |Δ| {} > {bound}",
                e.max_abs
            );
            assert!(frac >= agree, "{ty:?} {name}: top-1 agreement {frac}");
        }
    }
}
