//! The attention kernel: every tier this CPU has is bit-identical to the plain (scalar twin)
//! build, and all of them match a naive f64 reference over random shapes — head sizes that are
//! not a multiple of the lane width, every GQA ratio, prompts and single-token steps, histories
//! long enough to be split into chunks, f16 and f32 caches.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss
)]

mod common;

use bitnet_kernels::attn::{attend, attend_isa, AttnShape, KvLayout, KvRows};
use bitnet_kernels::{supported_isas, Isa, KernelError, Pool};
use common::Rng;
use half::f16;

/// softmax(q·Kᵀ·scale) · V in f64, position by position (the obvious code).
#[allow(clippy::too_many_arguments)]
fn reference(
    sh: &AttnShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    pos0: usize,
    n: usize,
    scale: f32,
) -> Vec<f32> {
    let d = sh.head_dim;
    let (qw, kvw, gqa) = (sh.n_head * d, sh.n_head_kv * d, sh.n_head / sh.n_head_kv);
    let mut out = vec![0f32; n * qw];
    for t in 0..n {
        for h in 0..sh.n_head {
            let g = h / gqa;
            let qh = &q[t * qw + h * d..][..d];
            let vis = pos0 + t + 1;
            let s: Vec<f64> = (0..vis)
                .map(|j| {
                    let kj = &k[j * kvw + g * d..][..d];
                    qh.iter()
                        .zip(kj)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum::<f64>()
                        * f64::from(scale)
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for i in 0..d {
                let o: f64 = (0..vis)
                    .map(|j| e[j] * f64::from(v[j * kvw + g * d + i]))
                    .sum();
                out[t * qw + h * d + i] = (o / z) as f32;
            }
        }
    }
    out
}

struct Case {
    shape: AttnShape,
    pos0: usize,
    n: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    k16: Vec<f16>,
    v16: Vec<f16>,
    scale: f32,
}

fn case(rng: &mut Rng, shape: AttnShape, pos0: usize, n: usize, spread: f32) -> Case {
    let d = shape.head_dim;
    let n_kv = pos0 + n;
    let mut vec = |len: usize, a: f32| (0..len).map(|_| rng.f32() * a).collect::<Vec<f32>>();
    let q = vec(n * shape.n_head * d, spread);
    // K and V as an f16 cache holds them, so both cache types see the same values.
    let round = |x: Vec<f32>| {
        x.into_iter()
            .map(|x| f16::from_f32(x).to_f32())
            .collect::<Vec<_>>()
    };
    let k = round(vec(n_kv * shape.n_head_kv * d, 1.0));
    let v = round(vec(n_kv * shape.n_head_kv * d, 1.0));
    Case {
        shape,
        pos0,
        n,
        k16: k.iter().map(|&x| f16::from_f32(x)).collect(),
        v16: v.iter().map(|&x| f16::from_f32(x)).collect(),
        q,
        k,
        v,
        scale: 1.0 / (d as f32).sqrt(),
    }
}

fn run(c: &Case, isa: Isa, f16_cache: bool, pool: &Pool) -> Vec<f32> {
    let mut out = vec![f32::NAN; c.q.len()];
    let (k, v) = if f16_cache {
        (KvRows::F16(&c.k16), KvRows::F16(&c.v16))
    } else {
        (KvRows::F32(&c.k), KvRows::F32(&c.v))
    };
    let layout = KvLayout::position_major(&c.shape);
    attend_isa(
        isa, &c.shape, &c.q, k, v, layout, c.pos0, c.n, c.scale, &mut out, pool,
    )
    .unwrap();
    // The same values in the head-major layout give the same bits.
    let n_ctx = c.pos0 + c.n + 3;
    let layout = KvLayout::head_major(&c.shape, n_ctx);
    let mut out2 = vec![f32::NAN; c.q.len()];
    let (k16, v16) = (
        to_head_major(&c.k16, &c.shape, n_ctx),
        to_head_major(&c.v16, &c.shape, n_ctx),
    );
    let (k32, v32) = (
        to_head_major(&c.k, &c.shape, n_ctx),
        to_head_major(&c.v, &c.shape, n_ctx),
    );
    let (k, v) = if f16_cache {
        (KvRows::F16(&k16), KvRows::F16(&v16))
    } else {
        (KvRows::F32(&k32), KvRows::F32(&v32))
    };
    attend_isa(
        isa, &c.shape, &c.q, k, v, layout, c.pos0, c.n, c.scale, &mut out2, pool,
    )
    .unwrap();
    assert!(same_bits(&out, &out2), "layouts disagree");
    out
}

/// `[pos][head][d]` rows rearranged to `[head][n_ctx][d]` (with `n_ctx − n_pos` unused
/// positions at the end of each head).
fn to_head_major<T: Copy + Default>(x: &[T], sh: &AttnShape, n_ctx: usize) -> Vec<T> {
    let d = sh.head_dim;
    let n_pos = x.len() / (sh.n_head_kv * d);
    let mut y = vec![T::default(); sh.n_head_kv * n_ctx * d];
    for j in 0..n_pos {
        for g in 0..sh.n_head_kv {
            y[(g * n_ctx + j) * d..][..d].copy_from_slice(&x[(j * sh.n_head_kv + g) * d..][..d]);
        }
    }
    y
}

/// A random shape (head size from `head_dims`, 1–3 KV heads, GQA 1/2/4/5) and span: by
/// `round % 3`, a single step deep in a history (chunked), a short prompt, or a prompt after
/// a prefix.
fn random_shape(rng: &mut Rng, round: usize, head_dims: &[usize]) -> (AttnShape, usize, usize) {
    let head_dim = head_dims[rng.below(head_dims.len())];
    let n_head_kv = 1 + rng.below(3);
    let gqa = [1, 2, 4, 5][rng.below(4)];
    let shape = AttnShape {
        n_head: n_head_kv * gqa,
        n_head_kv,
        head_dim,
    };
    let (pos0, n) = match round % 3 {
        0 => (rng.below(1200), 1),
        1 => (0, 1 + rng.below(13)),
        _ => (rng.below(300), 1 + rng.below(9)),
    };
    (shape, pos0, n)
}

/// The two outputs hold the same bits.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn every_tier_is_bit_identical_to_the_plain_build_and_close_to_f64() {
    let mut rng = Rng::new(11);
    let pools = [Pool::new(1), Pool::new(2), Pool::new(5)];
    let mut checked = 0;
    for round in 0..60 {
        let (shape, pos0, n) = random_shape(&mut rng, round, &[128, 64, 40, 16, 8, 3, 130]);
        let spread = [0.5, 4.0, 30.0][rng.below(3)];
        let c = case(&mut rng, shape, pos0, n, spread);
        let want = reference(&shape, &c.q, &c.k, &c.v, pos0, n, c.scale);
        for pool in &pools {
            for f16_cache in [true, false] {
                let plain = run(&c, Isa::Scalar, f16_cache, pool);
                for (i, (&a, &b)) in plain.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 2e-5 + 2e-5 * b.abs(),
                        "{shape:?} pos0 {pos0} n {n} spread {spread} threads {}: element {i}: {a} vs {b}",
                        pool.n_threads()
                    );
                }
                for isa in supported_isas() {
                    let got = run(&c, isa, f16_cache, pool);
                    if isa == Isa::Simd128 && !bitnet_kernels::wasm_fused_madd() {
                        // WebAssembly without a fused multiply-add multiplies, then adds: the
                        // plain build's bounds instead of its bits.
                        for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                            assert!(
                                (a - b).abs() <= 2e-5 + 2e-5 * b.abs(),
                                "{isa:?} {shape:?} pos0 {pos0} n {n}: element {i}: {a} vs {b}"
                            );
                        }
                        continue;
                    }
                    assert!(
                        same_bits(&got, &plain),
                        "{isa:?} differs from the plain build: {shape:?} pos0 {pos0} n {n}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 60 * 3 * 2);
}

#[test]
fn thread_count_and_chunking_do_not_change_the_result_much() {
    // A 4096-deep single step is split into chunks at 2+ threads and not at 1.
    let mut rng = Rng::new(5);
    let shape = AttnShape {
        n_head: 20,
        n_head_kv: 5,
        head_dim: 128,
    };
    let c = case(&mut rng, shape, 4095, 1, 8.0);
    let one = run(&c, bitnet_kernels::isa(), true, &Pool::new(1));
    let two = run(&c, bitnet_kernels::isa(), true, &Pool::new(2));
    let want = reference(&shape, &c.q, &c.k, &c.v, 4095, 1, c.scale);
    for ((&a, &b), &w) in one.iter().zip(&two).zip(&want) {
        assert!((a - w).abs() <= 1e-5 + 1e-5 * w.abs(), "{a} vs {w}");
        assert!((b - w).abs() <= 1e-5 + 1e-5 * w.abs(), "{b} vs {w}");
    }
}

#[test]
fn a_prompt_row_is_bit_identical_to_the_same_row_alone() {
    // A prompt's rows share work items; a row's arithmetic must not depend on the rows
    // beside it. One chunk of positions (under 256, one thread) both ways.
    let mut rng = Rng::new(11);
    for gqa in [1, 2, 4, 8] {
        let shape = AttnShape {
            n_head: 2 * gqa,
            n_head_kv: 2,
            head_dim: 64,
        };
        let (pos0, n) = (5, 37);
        let c = case(&mut rng, shape, pos0, n, 4.0);
        let qw = shape.n_head * shape.head_dim;
        for isa in [Isa::Scalar, bitnet_kernels::isa()] {
            let pool = Pool::new(1);
            let batch = run(&c, isa, true, &pool);
            for t in 0..n {
                let kv = (pos0 + t + 1) * shape.n_head_kv * shape.head_dim;
                let one = Case {
                    shape,
                    pos0: pos0 + t,
                    n: 1,
                    q: c.q[t * qw..][..qw].to_vec(),
                    k: c.k[..kv].to_vec(),
                    v: c.v[..kv].to_vec(),
                    k16: c.k16[..kv].to_vec(),
                    v16: c.v16[..kv].to_vec(),
                    scale: c.scale,
                };
                let alone = run(&one, isa, true, &pool);
                assert!(
                    same_bits(&batch[t * qw..][..qw], &alone),
                    "gqa {gqa}, {isa:?}, row {t}"
                );
            }
        }
    }
}

#[test]
fn a_dominant_position_wins_and_masked_positions_are_ignored() {
    // Query row t sees positions 0..=pos0+t only: a huge score at a later position must
    // not leak into earlier rows.
    let shape = AttnShape {
        n_head: 1,
        n_head_kv: 1,
        head_dim: 16,
    };
    let n = 6;
    let q = vec![1.0f32; n * 16];
    let mut k = vec![0.0f32; n * 16];
    let mut v = vec![0.0f32; n * 16];
    for j in 0..n {
        v[j * 16] = j as f32;
    }
    k[5 * 16..6 * 16].fill(10.0); // position 5 dominates wherever it is visible
    let mut out = vec![0f32; n * 16];
    attend(
        &shape,
        &q,
        KvRows::F32(&k),
        KvRows::F32(&v),
        KvLayout::position_major(&shape),
        0,
        n,
        1.0,
        &mut out,
        &Pool::new(2),
    )
    .unwrap();
    for t in 0..5 {
        // uniform over 0..=t: mean of 0..=t
        let want = t as f32 / 2.0;
        assert!(
            (out[t * 16] - want).abs() < 1e-5,
            "row {t}: {}",
            out[t * 16]
        );
    }
    assert!((out[5 * 16] - 5.0).abs() < 1e-5, "{}", out[5 * 16]);
}

#[test]
fn bad_shapes_are_errors() {
    let pool = Pool::new(1);
    let call = |sh: AttnShape, q: &[f32], k: &[f32], pos0: usize| {
        let mut out = vec![0f32; q.len()];
        let v = [0.0f32; 8];
        let layout = KvLayout::position_major(&sh);
        attend(
            &sh,
            q,
            KvRows::F32(k),
            KvRows::F32(&v),
            layout,
            pos0,
            1,
            1.0,
            &mut out,
            &pool,
        )
    };
    // 3 query heads cannot share 2 KV heads.
    let three_two = AttnShape {
        n_head: 3,
        n_head_kv: 2,
        head_dim: 4,
    };
    let e = call(three_two, &[0.0; 12], &[0.0; 8], 0);
    assert!(matches!(e, Err(KernelError::ShapeMismatch { .. })), "{e:?}");
    let sh = AttnShape {
        n_head: 2,
        n_head_kv: 1,
        head_dim: 4,
    };
    // The cache holds fewer positions than pos0 + n.
    let e = call(sh, &[0.0; 8], &[0.0; 4], 1);
    assert!(
        matches!(
            e,
            Err(KernelError::ShapeMismatch {
                what: "attention keys",
                ..
            })
        ),
        "{e:?}"
    );
    // Queries that are not whole rows.
    let e = call(sh, &[0.0; 7], &[0.0; 8], 0);
    assert!(matches!(e, Err(KernelError::ShapeMismatch { .. })), "{e:?}");
}

/// K or V quantized as a `--kv-cache q8_0` or `q4_0` cache holds it: codes and scales.
enum Coded {
    Q8(Vec<i8>, Vec<f32>),
    Q4(Vec<u8>, Vec<f32>),
}

impl Coded {
    /// `x` encoded (Q4_0 when `q4`), with the values the codes stand for.
    fn encode(q4: bool, x: &[f32]) -> (Coded, Vec<f32>) {
        let mut d = vec![0f32; x.len() / 32];
        if q4 {
            let mut q = vec![0u8; x.len() / 2];
            bitnet_kernels::rows::quantize_q4_0_split(x, &mut q, &mut d).unwrap();
            // ggml's Q4_0 order: byte j of a block holds element j (low) and j + 16 (high).
            let deq = (0..x.len())
                .map(|i| {
                    let (blk, e) = (i / 32, i % 32);
                    let b = q[blk * 16 + e % 16];
                    let nib = if e < 16 { b & 15 } else { b >> 4 };
                    (f32::from(nib) - 8.0) * d[blk]
                })
                .collect();
            (Coded::Q4(q, d), deq)
        } else {
            let mut q = vec![0i8; x.len()];
            bitnet_kernels::rows::quantize_q8_0_split(x, &mut q, &mut d).unwrap();
            let deq = q
                .iter()
                .enumerate()
                .map(|(i, &c)| f32::from(c) * d[i / 32])
                .collect();
            (Coded::Q8(q, d), deq)
        }
    }

    fn rows(&self) -> KvRows<'_> {
        match self {
            Coded::Q8(q, d) => KvRows::Q8 { q, d },
            Coded::Q4(q, d) => KvRows::Q4 { q, d },
        }
    }

    /// The same codes in the head-major layout for `n_ctx` positions.
    fn head_major(&self, shape: &AttnShape, n_ctx: usize) -> Coded {
        let per = |n: usize| AttnShape {
            head_dim: shape.head_dim / n,
            ..*shape
        };
        match self {
            Coded::Q8(q, d) => Coded::Q8(
                to_head_major(q, shape, n_ctx),
                to_head_major(d, &per(32), n_ctx),
            ),
            Coded::Q4(q, d) => Coded::Q4(
                to_head_major(q, &per(2), n_ctx),
                to_head_major(d, &per(32), n_ctx),
            ),
        }
    }

    /// The largest distance of a value from what it encodes, for block scale `d`: Q8_0 is
    /// within half a step plus what rounding the scale to f16 moves a code of up to 127
    /// (127 · 2⁻¹¹ of a step); Q4_0 maps the largest magnitude to −8, so its opposite clamps
    /// at 7 (a whole step), plus 8 · 2⁻¹¹ of a step.
    fn bound(&self, d: f32) -> f32 {
        match self {
            Coded::Q8(..) => 0.563 * d.abs() + 1e-7,
            Coded::Q4(..) => 1.004 * d.abs() + 1e-7,
        }
    }

    fn scales(&self) -> &[f32] {
        match self {
            Coded::Q8(_, d) | Coded::Q4(_, d) => d,
        }
    }
}

#[test]
fn quantized_caches_are_bit_identical_across_tiers_and_close_to_f64() {
    let mut rng = Rng::new(23);
    let pools = [Pool::new(1), Pool::new(2)];
    for round in 0..40 {
        let (shape, pos0, n) = random_shape(&mut rng, round, &[128, 64, 32, 96]);
        let c = case(&mut rng, shape, pos0, n, 4.0);
        let q4 = round % 2 == 1;
        let (kc, kdeq) = Coded::encode(q4, &c.k);
        let (vc, vdeq) = Coded::encode(q4, &c.v);
        for (coded, x, deq) in [(&kc, &c.k, &kdeq), (&vc, &c.v, &vdeq)] {
            for (i, (&a, &b)) in x.iter().zip(deq).enumerate() {
                let bound = coded.bound(coded.scales()[i / 32]);
                assert!((a - b).abs() <= bound, "q4 {q4}: {a} vs {b}");
            }
        }
        let want = reference(&shape, &c.q, &kdeq, &vdeq, pos0, n, c.scale);
        let layout = KvLayout::position_major(&shape);
        for pool in &pools {
            let go = |isa: Isa| {
                let mut out = vec![f32::NAN; c.q.len()];
                attend_isa(
                    isa,
                    &shape,
                    &c.q,
                    kc.rows(),
                    vc.rows(),
                    layout,
                    pos0,
                    n,
                    c.scale,
                    &mut out,
                    pool,
                )
                .unwrap();
                out
            };
            let plain = go(Isa::Scalar);
            for (i, (&a, &b)) in plain.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 2e-5 + 2e-5 * b.abs(),
                    "q4 {q4} {shape:?} pos0 {pos0} n {n}: element {i}: {a} vs {b}"
                );
            }
            // The same cache read as f32 values gives the same bits: a coded value is exact.
            let mut out32 = vec![f32::NAN; c.q.len()];
            attend_isa(
                Isa::Scalar,
                &shape,
                &c.q,
                KvRows::F32(&kdeq),
                KvRows::F32(&vdeq),
                layout,
                pos0,
                n,
                c.scale,
                &mut out32,
                pool,
            )
            .unwrap();
            assert!(same_bits(&plain, &out32), "q4 {q4}");
            for isa in supported_isas() {
                let got = go(isa);
                if isa == Isa::Simd128 && !bitnet_kernels::wasm_fused_madd() {
                    // WebAssembly without a fused multiply-add multiplies, then adds: the
                    // plain build's bounds instead.
                    for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() <= 2e-5 + 2e-5 * b.abs(),
                            "{isa:?} q4 {q4} {shape:?} pos0 {pos0} n {n}: element {i}: {a} vs {b}"
                        );
                    }
                    continue;
                }
                assert!(
                    same_bits(&got, &plain),
                    "{isa:?} differs from the plain build: q4 {q4} {shape:?} pos0 {pos0} n {n}"
                );
            }
            // The head-major layout (the model's) gives the same bits.
            let n_ctx = pos0 + n + 3;
            let (k2, v2) = (kc.head_major(&shape, n_ctx), vc.head_major(&shape, n_ctx));
            let mut out2 = vec![f32::NAN; c.q.len()];
            attend(
                &shape,
                &c.q,
                k2.rows(),
                v2.rows(),
                KvLayout::head_major(&shape, n_ctx),
                pos0,
                n,
                c.scale,
                &mut out2,
                pool,
            )
            .unwrap();
            // (`attend` runs the selected tier.)
            assert!(same_bits(&go(bitnet_kernels::isa()), &out2), "q4 {q4}");
        }
    }
}

#[test]
fn quantized_caches_need_whole_blocks_and_one_type_on_both_sides() {
    let pool = Pool::new(1);
    let q = vec![0.5f32; 40];
    let mut out = vec![0f32; 40];
    let codes = vec![1i8; 40];
    let scales = vec![1f32; 2];
    let shape = AttnShape {
        n_head: 1,
        n_head_kv: 1,
        head_dim: 40,
    };
    let q8 = KvRows::Q8 {
        q: &codes,
        d: &scales,
    };
    let err = attend(
        &shape,
        &q,
        q8,
        q8,
        KvLayout::position_major(&shape),
        0,
        1,
        1.0,
        &mut out,
        &pool,
    );
    assert!(
        matches!(err, Err(KernelError::ShapeMismatch { .. })),
        "{err:?}"
    );
    let shape = AttnShape {
        n_head: 1,
        n_head_kv: 1,
        head_dim: 32,
    };
    let f = vec![0.25f32; 32];
    let err = attend(
        &shape,
        &q[..32],
        q8,
        KvRows::F32(&f),
        KvLayout::position_major(&shape),
        0,
        1,
        1.0,
        &mut out[..32],
        &pool,
    );
    assert!(
        matches!(err, Err(KernelError::ShapeMismatch { .. })),
        "{err:?}"
    );
    // Codes without enough scales are refused, not read past.
    let err = attend(
        &shape,
        &q[..32],
        KvRows::Q8 {
            q: &codes[..32],
            d: &[],
        },
        KvRows::Q8 {
            q: &codes[..32],
            d: &scales[..1],
        },
        KvLayout::position_major(&shape),
        0,
        1,
        1.0,
        &mut out[..32],
        &pool,
    );
    assert!(
        matches!(err, Err(KernelError::ShapeMismatch { .. })),
        "{err:?}"
    );
    // Q4_0: keys and values of one type; 16 bytes of nibbles per 32 elements.
    let nibbles = [0x98u8; 16];
    let q4 = |n: usize| KvRows::Q4 {
        q: &nibbles[..n],
        d: &scales[..1],
    };
    let q8_32 = KvRows::Q8 {
        q: &codes[..32],
        d: &scales[..1],
    };
    for (k, v) in [(q4(16), q8_32), (q8_32, q4(16)), (q4(15), q4(16))] {
        let err = attend(
            &shape,
            &q[..32],
            k,
            v,
            KvLayout::position_major(&shape),
            0,
            1,
            1.0,
            &mut out[..32],
            &pool,
        );
        assert!(
            matches!(err, Err(KernelError::ShapeMismatch { .. })),
            "{err:?}"
        );
    }
    // And a whole Q4_0 block works: every value is (9 − 8)·1 or (8 − 8)·1 by nibble, so
    // with one position the output is V's row.
    attend(
        &shape,
        &q[..32],
        q4(16),
        q4(16),
        KvLayout::position_major(&shape),
        0,
        1,
        1.0,
        &mut out[..32],
        &pool,
    )
    .unwrap();
    let want: Vec<f32> = (0..32).map(|e| if e < 16 { 0.0 } else { 1.0 }).collect();
    assert_eq!(&out[..32], &want[..]);
}
