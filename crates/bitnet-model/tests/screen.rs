//! The screened LM head: its choice is the full logits' choice, bit for bit.
//!
//! Every case computes the full logits with the backend's own head (fast numerics) and
//! checks the screen against them: the arg-max (lowest id among equal maxima) and the `n`
//! most likely tokens with their logits' bits, in the sampler's order. Heads and hidden
//! states are random (Gaussian-like, heavy-tailed, with outlier dimensions, with duplicated
//! rows for exact ties, and rows one f16 step apart for ties the screen cannot resolve by
//! itself), then the golden model's real steps.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss
)]

mod common;

use std::borrow::Cow;

use bitnet_kernels::rows::quantize_row_into;
use bitnet_kernels::{Pool, RowMatrix, RowType};
use bitnet_model::{Backend, Exec, HeadScreen, Model, Numerics, Outputs, Pick, Picked};

/// Seeded floats over the test kit's generator.
struct Rng(bitnet_testkit::Xorshift);
impl Rng {
    fn new(seed: u64) -> Self {
        Rng(bitnet_testkit::Xorshift(seed | 1))
    }
    /// Uniform in [-1, 1).
    fn f32(&mut self) -> f32 {
        ((self.0.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// Roughly Gaussian (a sum of four uniforms).
    fn gauss(&mut self) -> f32 {
        (0..4).map(|_| self.f32()).sum::<f32>() * 0.866
    }
    fn below(&mut self, n: usize) -> usize {
        self.0.below(n)
    }
}

fn f16_matrix(values: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    let rb = RowType::F16.row_bytes(cols).unwrap();
    let mut bytes = vec![0u8; rows * rb];
    for (row, out) in values.chunks_exact(cols).zip(bytes.chunks_exact_mut(rb)) {
        quantize_row_into(RowType::F16, row, out);
    }
    bytes
}

/// The full head's logits of `h` (fast numerics, one row).
fn full_logits(head: &RowMatrix<'_>, h: &[f32], pool: &Pool) -> Vec<f32> {
    let mut out = vec![0f32; head.rows()];
    Backend::lm_head(pool, head, h, 1, Numerics::Fast, &mut out).unwrap();
    out
}

/// The arg-max with the lowest id among equal maxima.
fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// The `n` most likely (higher logit, then lower id).
fn top(v: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut all: Vec<(u32, f32)> = (0u32..).zip(v.iter().copied()).collect();
    all.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(&b.0)));
    all.truncate(n);
    all
}

/// Check every pick of `h` against the full logits; returns how many the screen decided.
fn check(screen: &HeadScreen, head: &RowMatrix<'_>, h: &[f32], pool: &Pool, what: &str) -> usize {
    let full = full_logits(head, h, pool);
    let mut decided = 0;
    for pick in [
        Pick::Greedy,
        Pick::Top(1),
        Pick::Top(5),
        Pick::Top(40),
        Pick::Top(64),
    ] {
        match screen.pick(head, h, pick, pool).unwrap() {
            Some(Picked::Chosen(t)) => {
                assert_eq!(pick, Pick::Greedy, "{what}");
                assert_eq!(t, argmax(&full), "{what}: greedy");
                decided += 1;
            }
            Some(Picked::Top(got)) => {
                let Pick::Top(n) = pick else {
                    panic!("{what}: a top list for a greedy pick")
                };
                let want = top(&full, n);
                assert_eq!(got.len(), want.len(), "{what}: top {n}");
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(g.0, w.0, "{what}: top {n} ids");
                    assert_eq!(
                        g.1.to_bits(),
                        w.1.to_bits(),
                        "{what}: top {n} logit of {}",
                        g.0
                    );
                }
                decided += 1;
            }
            Some(Picked::Logits(_)) => panic!("{what}: the screen gave logits"),
            None => {}
        }
    }
    decided
}

#[test]
fn random_heads_choose_what_the_full_logits_choose() {
    let pool = Pool::new(2);
    let mut rng = Rng::new(0x05c4_ee11);
    let (mut cases, mut decided, mut decided_greedy) = (0, 0, 0);
    for (rows, cols) in [(700, 32), (1500, 64), (3000, 256), (2000, 2560), (257, 96)] {
        for style in 0..4 {
            let w: Vec<f32> = (0..rows * cols)
                .map(|_| match style {
                    // Heavy tails: a few large weights per row.
                    1 => rng.gauss().powi(3),
                    _ => rng.gauss() * 0.05,
                })
                .collect();
            let bytes = f16_matrix(&w, rows, cols);
            let head = RowMatrix::new(RowType::F16, rows, cols, Cow::Borrowed(&bytes)).unwrap();
            let screen = HeadScreen::build(&head, &pool, &|_| {}).unwrap();
            let mut here = 0;
            for case in 0..6 {
                let mut h: Vec<f32> = (0..cols).map(|_| rng.gauss()).collect();
                match style {
                    // Outlier dimensions, as real hidden states have.
                    2 => {
                        for _ in 0..3 {
                            let j = rng.below(cols);
                            h[j] *= 60.0;
                        }
                    }
                    // Tiny and large scales.
                    3 => {
                        let s = if case % 2 == 0 { 1e-3 } else { 3e3 };
                        h.iter_mut().for_each(|v| *v *= s);
                    }
                    _ => {}
                }
                // Aim at a row now and then: one clear winner.
                if case == 5 {
                    let r = rng.below(rows);
                    h.copy_from_slice(&w[r * cols..(r + 1) * cols]);
                }
                let what = format!("{rows}x{cols} style {style} case {case}");
                let n = check(&screen, &head, &h, &pool, &what);
                decided += n;
                let greedy = screen.pick(&head, &h, Pick::Greedy, &pool).unwrap();
                decided_greedy += usize::from(greedy.is_some());
                here += n + usize::from(greedy.is_some());
                cases += 5;
            }
            // The screen's own tally: six picks a case, each decided or declined, and every
            // decided one with at least as many candidates as it returned.
            let c = screen.counts();
            assert_eq!(c.decided, here as u64, "{rows}x{cols} style {style}");
            assert_eq!(c.decided + c.declined, 36, "{rows}x{cols} style {style}");
            assert!(c.decided == 0 || (c.candidates >= c.decided && c.max_candidates >= 1));
            assert!(c.max_candidates <= rows as u64 / 4);
        }
    }
    // The screen must decide most cases, or this test would check nothing. (It declines a
    // top-40 or top-64 of the small vocabularies here, where those are a large share.)
    assert!(
        decided * 10 >= cases * 8,
        "the screen decided {decided} of {cases} picks"
    );
    assert!(
        decided_greedy * 20 >= cases / 5 * 19,
        "the screen decided {decided_greedy} of {} arg-maxes",
        cases / 5
    );
}

#[test]
fn ties_go_to_the_lowest_id_as_in_the_full_logits() {
    let pool = Pool::new(2);
    let mut rng = Rng::new(77);
    let (rows, cols) = (600, 128);
    let mut w: Vec<f32> = (0..rows * cols).map(|_| rng.gauss() * 0.05).collect();
    let h: Vec<f32> = (0..cols).map(|_| rng.gauss()).collect();
    // Rows 40 and 9 equal and the best by far (an exact tie); row 500 one f16 step above them
    // in one element, row 300 one step below (ties the bounds cannot separate).
    let best: Vec<f32> = h.iter().map(|v| v * 0.2).collect();
    for r in [40, 9, 500, 300] {
        w[r * cols..(r + 1) * cols].copy_from_slice(&best);
    }
    let j = (0..cols)
        .max_by(|&a, &b| h[a].abs().total_cmp(&h[b].abs()))
        .unwrap();
    let step = |v: f32, up: bool| {
        let b = half::f16::from_f32(v);
        let bits = if (up == (h[j] > 0.0)) == (b.to_f32() >= 0.0) {
            b.to_bits() + 1
        } else {
            b.to_bits() - 1
        };
        half::f16::from_bits(bits).to_f32()
    };
    w[500 * cols + j] = step(best[j], true);
    w[300 * cols + j] = step(best[j], false);
    let bytes = f16_matrix(&w, rows, cols);
    let head = RowMatrix::new(RowType::F16, rows, cols, Cow::Borrowed(&bytes)).unwrap();
    let screen = HeadScreen::build(&head, &pool, &|_| {}).unwrap();
    let full = full_logits(&head, &h, &pool);
    assert_eq!(full[9].to_bits(), full[40].to_bits());
    assert!(
        full[500] > full[9] && full[9] > full[300],
        "{:?}",
        [full[500], full[9], full[300]]
    );
    assert_eq!(check(&screen, &head, &h, &pool, "near ties"), 5);
    let Some(Picked::Top(t)) = screen.pick(&head, &h, Pick::Top(4), &pool).unwrap() else {
        panic!("the screen declined")
    };
    let ids: Vec<u32> = t.iter().map(|c| c.0).collect();
    assert_eq!(ids, [500, 9, 40, 300]);
    // Without the nudged rows the exact tie goes to the lower id.
    let mut w2 = w.clone();
    for r in [500, 300] {
        w2[r * cols..(r + 1) * cols].fill(0.0);
    }
    let bytes2 = f16_matrix(&w2, rows, cols);
    let head2 = RowMatrix::new(RowType::F16, rows, cols, Cow::Borrowed(&bytes2)).unwrap();
    let screen2 = HeadScreen::build(&head2, &pool, &|_| {}).unwrap();
    assert_eq!(
        screen2.pick(&head2, &h, Pick::Greedy, &pool).unwrap(),
        Some(Picked::Chosen(9))
    );
}

#[test]
fn what_is_not_finite_is_left_to_the_full_logits() {
    let pool = Pool::new(1);
    let mut rng = Rng::new(5);
    let (rows, cols) = (300, 64);
    let mut w: Vec<f32> = (0..rows * cols).map(|_| rng.gauss() * 0.05).collect();
    let h: Vec<f32> = (0..cols).map(|_| rng.gauss()).collect();
    let bytes = f16_matrix(&w, rows, cols);
    let head = RowMatrix::new(RowType::F16, rows, cols, Cow::Borrowed(&bytes)).unwrap();
    let screen = HeadScreen::build(&head, &pool, &|_| {}).unwrap();
    // A hidden state with a NaN or an infinity, and one so large the logits could overflow.
    for bad in [f32::NAN, f32::INFINITY, 1e30] {
        let mut x = h.clone();
        x[3] = bad;
        for pick in [Pick::Greedy, Pick::Top(8)] {
            assert_eq!(screen.pick(&head, &x, pick, &pool).unwrap(), None, "{bad}");
        }
    }
    // A head row with a NaN or an infinity.
    for bad in [f32::NAN, f32::INFINITY] {
        w[17 * cols + 5] = bad;
        let bytes = f16_matrix(&w, rows, cols);
        let head = RowMatrix::new(RowType::F16, rows, cols, Cow::Borrowed(&bytes)).unwrap();
        let screen = HeadScreen::build(&head, &pool, &|_| {}).unwrap();
        for pick in [Pick::Greedy, Pick::Top(8)] {
            assert_eq!(screen.pick(&head, &h, pick, &pool).unwrap(), None, "{bad}");
        }
    }
    // More wanted than the vocabulary holds, or none.
    for n in [0, rows, rows + 1] {
        assert_eq!(
            screen.pick(&head, &h, Pick::Top(n), &pool).unwrap(),
            None,
            "{n}"
        );
    }
    // A hidden state of the wrong width, and a head that is not the screened one.
    assert!(screen.pick(&head, &h[1..], Pick::Greedy, &pool).is_err());
    let other = RowMatrix::new(
        RowType::F16,
        rows - 1,
        cols,
        Cow::Borrowed(&bytes[..(rows - 1) * cols * 2]),
    )
    .unwrap();
    assert!(screen.pick(&other, &h, Pick::Greedy, &pool).is_err());
}

#[test]
fn a_head_the_screen_cannot_bound_is_refused() {
    let pool = Pool::new(1);
    let bytes = f16_matrix(&vec![0.5; 10 * 48], 10, 48);
    let head = RowMatrix::new(RowType::F16, 10, 48, Cow::Borrowed(&bytes)).unwrap();
    let err = HeadScreen::build(&head, &pool, &|_| {}).unwrap_err();
    assert!(err.to_string().contains("multiple of 32"), "{err}");
    // Quantized heads (their own dot quantizes the activations) are refused; float ones are
    // built, and decide as the F16 head does.
    let mut rng = Rng::new(3);
    let (rows, cols) = (400, 256);
    let values: Vec<f32> = (0..rows * cols).map(|_| rng.gauss() * 0.05).collect();
    let h: Vec<f32> = (0..cols).map(|_| rng.gauss()).collect();
    for ty in [
        RowType::Q8_0,
        RowType::Q4_0,
        RowType::Q6K,
        RowType::F32,
        RowType::BF16,
    ] {
        let rb = ty.row_bytes(cols).unwrap();
        let mut bytes = vec![0u8; rows * rb];
        for (row, out) in values.chunks_exact(cols).zip(bytes.chunks_exact_mut(rb)) {
            quantize_row_into(ty, row, out);
        }
        let head = RowMatrix::new(ty, rows, cols, Cow::Borrowed(&bytes)).unwrap();
        let built = HeadScreen::build(&head, &pool, &|_| {});
        let float = matches!(ty, RowType::F32 | RowType::BF16);
        assert_eq!(built.is_ok(), float, "{ty:?}");
        if let Ok(screen) = built {
            assert_eq!(
                check(&screen, &head, &h, &pool, &format!("{ty:?}")),
                5,
                "{ty:?}"
            );
        }
    }
}

#[test]
fn the_build_releases_every_source_row_and_does_not_depend_on_threads() {
    let mut rng = Rng::new(9);
    let (rows, cols) = (1000, 64);
    let w: Vec<f32> = (0..rows * cols).map(|_| rng.gauss()).collect();
    let bytes = f16_matrix(&w, rows, cols);
    let head = RowMatrix::new(RowType::F16, rows, cols, Cow::Borrowed(&bytes)).unwrap();
    let h: Vec<f32> = (0..cols).map(|_| rng.gauss()).collect();
    let released = std::sync::atomic::AtomicUsize::new(0);
    let one = HeadScreen::build(&head, &Pool::new(1), &|b| {
        released.fetch_add(b.len(), std::sync::atomic::Ordering::Relaxed);
    })
    .unwrap();
    assert_eq!(released.into_inner(), bytes.len());
    let two = HeadScreen::build(&head, &Pool::new(2), &|_| {}).unwrap();
    let pool = Pool::new(2);
    for n in [1, 7, 40] {
        assert_eq!(
            one.pick(&head, &h, Pick::Top(n), &pool).unwrap(),
            two.pick(&head, &h, Pick::Top(n), &pool).unwrap()
        );
    }
    assert_eq!(one.nbytes(), rows * (34 * cols / 32 + 8));
}

/// The golden model's prompts, then greedy steps: `forward_pick` with a screen gives the
/// token (and top-k) its full logits give, and leaves the cache where `forward` does.
#[test]
fn the_golden_model_picks_what_its_logits_pick() {
    let file = bitnet_gguf::GgufFile::open(
        &bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf"),
        &bitnet_gguf::Limits::default(),
    )
    .unwrap();
    let plain = Model::load(&file).unwrap();
    let mut screened = Model::load(&file).unwrap();
    let pool = Pool::new(2);
    screened.head_screen = Some(HeadScreen::build(screened.lm_head(), &pool, &|_| {}).unwrap());
    let exec = || Exec {
        backend: &pool,
        numerics: Numerics::Fast,
        trace: None,
        scratch: None,
    };
    let mut decided = 0;
    for prompt in common::golden_prompts() {
        let mut ca = plain
            .new_cache(256, bitnet_model::KvType::F16, u64::MAX)
            .unwrap();
        let mut cb = screened
            .new_cache(256, bitnet_model::KvType::F16, u64::MAX)
            .unwrap();
        let mut input = prompt.clone();
        for step in 0..12 {
            let logits = plain
                .forward(&input, &mut ca, Outputs::Last, &mut exec())
                .unwrap();
            let pick = if step % 2 == 0 {
                Pick::Greedy
            } else {
                Pick::Top(40)
            };
            let got = screened
                .forward_pick(&input, &mut cb, pick, &mut exec())
                .unwrap();
            assert_eq!(ca.len(), cb.len());
            let want = argmax(&logits);
            match got {
                Picked::Chosen(t) => {
                    assert_eq!(t, want, "step {step}");
                    decided += 1;
                }
                Picked::Top(t) => {
                    assert_eq!(t, top(&logits, 40), "step {step}");
                    decided += 1;
                }
                Picked::Logits(l) => assert_eq!(l, logits),
            }
            input = vec![want];
        }
    }
    assert!(decided >= 40, "the screen decided {decided} of 48 steps");
    // Exact numerics computes every logit, screen or not.
    let mut c = screened
        .new_cache(64, bitnet_model::KvType::F16, u64::MAX)
        .unwrap();
    let mut e = Exec {
        backend: &pool,
        numerics: Numerics::Exact,
        trace: None,
        scratch: None,
    };
    let got = screened
        .forward_pick(&[1, 2, 3], &mut c, Pick::Greedy, &mut e)
        .unwrap();
    assert!(matches!(got, Picked::Logits(l) if l.len() == plain.config.n_vocab));
}
