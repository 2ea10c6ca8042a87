//! Every reduction of the forward pass lives here, in small functions, so the two numerics
//! modes differ only in which of these is called:
//!
//! - [`Numerics::Fast`]: f32 activations, plain f32 reductions, fastest kernels.
//! - [`Numerics::Exact`]: reproduces bitnet.cpp (x86 AVX2+FMA+F16C build) bit for bit: the f16
//!   roundings it makes, and the accumulation orders of `ggml_vec_dot_f16`, llamafile's tinyBLAS
//!   and `ggml_v_expf`. The rules are listed on each function.
//!
//! RMSNorm sums its squares in f64 in both modes: one sequential sum in exact numerics (ggml's
//! order), eight lanes added pairwise at the end in fast numerics ([`rms_norm_fast`]: no chain of
//! 2,560 dependent additions; the sums differ only in f64 rounding). Shared by both modes: RoPE
//! tables from libm `powf`/`cosf`/`sinf` of an iterated f32 angle.

use bitnet_kernels::rowops;

use crate::config::RopeStyle;

/// Which float paths the forward pass follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Numerics {
    /// f32 activations and fast reductions (the default).
    #[default]
    Fast,
    /// Bit-identical to bitnet.cpp's logits.
    Exact,
}

impl std::str::FromStr for Numerics {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fast" => Ok(Numerics::Fast),
            "exact" => Ok(Numerics::Exact),
            _ => Err(format!("unknown numerics mode '{s}' (fast|exact)")),
        }
    }
}

/// RMSNorm of one row: f32 squares summed sequentially in f64, `mean = (f32)(sum / n)`,
/// `scale = 1 / sqrtf(mean + eps)` in f32, `y = (x * scale) * w` in f32 (ggml's order).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    debug_assert!(x.len() == w.len() && x.len() == y.len());
    scale_row(x, scale_of(sum_sq(x), x.len(), eps), w, y);
}

fn sum_sq(x: &[f32]) -> f64 {
    x.iter().map(|&v| f64::from(v * v)).sum()
}

/// `1 / sqrtf((f32)(sum / n) + eps)` in f32.
fn scale_of(sum: f64, n: usize, eps: f32) -> f32 {
    let n = n.max(1) as f64;
    #[allow(clippy::cast_possible_truncation)] // f64 -> f32 rounding is the rule
    let mean = (sum / n) as f32;
    1.0f32 / (mean + eps).sqrt()
}

/// `y = (x * scale) * w` in f32: the end of every RMSNorm.
pub fn scale_row(x: &[f32], scale: f32, w: &[f32], y: &mut [f32]) {
    rowops::scale_row(x, scale, w, y);
}

/// RMSNorm of one row for fast numerics: [`rms_norm`] with the f32 squares summed in eight f64
/// lanes (element `i` into lane `i mod 8`, the lanes then added pairwise: 0+4, 1+5, 2+6, 3+7,
/// then 0+2, 1+3, then 0+1: `bitnet_kernels::rowops::sum_sq_lanes8`). The rest is
/// [`rms_norm`]'s.
pub fn rms_norm_fast(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    debug_assert!(x.len() == w.len() && x.len() == y.len());
    scale_row(x, scale_of(sum_sq_fast(x), x.len(), eps), w, y);
}

fn sum_sq_fast(x: &[f32]) -> f64 {
    let mut s = [0f64];
    rowops::sum_sq_rows(x, x.len(), &mut s);
    s[0]
}

/// The factor the RMSNorm of `numerics` multiplies `x` by (before the weights): rows normed
/// with several weights share it ([`scale_row`] then applies each), bit for bit what
/// [`rms_norm_for`] gives.
pub fn rms_scale(x: &[f32], eps: f32, numerics: Numerics) -> f32 {
    let sum = match numerics {
        Numerics::Exact => sum_sq(x),
        Numerics::Fast => sum_sq_fast(x),
    };
    scale_of(sum, x.len(), eps)
}

/// [`rms_scale`] of each `width`-row of `x` into `out` (as many rows as both hold); fast
/// numerics sums several rows at once (the same sums, bit for bit).
pub fn rms_scales(x: &[f32], width: usize, eps: f32, numerics: Numerics, out: &mut [f32]) {
    let rows = x.chunks_exact(width.max(1));
    match numerics {
        Numerics::Exact => {
            for (o, row) in out.iter_mut().zip(rows) {
                *o = scale_of(sum_sq(row), width, eps);
            }
        }
        Numerics::Fast => {
            let n = out.len().min(rows.len());
            let mut sums = vec![0f64; n];
            rowops::sum_sq_rows(x, width, &mut sums);
            for (o, &sum) in out.iter_mut().zip(&sums) {
                *o = scale_of(sum, width, eps);
            }
        }
    }
}

/// The RMSNorm of `numerics`: [`rms_norm`] (exact) or [`rms_norm_fast`].
pub fn rms_norm_for(numerics: Numerics) -> fn(&[f32], &[f32], f32, &mut [f32]) {
    match numerics {
        Numerics::Exact => rms_norm,
        Numerics::Fast => rms_norm_fast,
    }
}

/// Per-position RoPE tables: `theta_0 = pos`, `theta_{i+1} = theta_i * powf(base, -2/n_rot)`,
/// all in f32; `cos`/`sin` are glibc's `cosf`/`sinf` of the f32 angle (Rust's `f32::cos` and
/// `f32::sin` call those on Linux).
#[derive(Debug, Clone)]
pub struct RopeRow {
    /// cos θ_i, i in 0..n_rot/2
    pub cos: Vec<f32>,
    /// sin θ_i, i in 0..n_rot/2
    pub sin: Vec<f32>,
}

pub fn rope_row(pos: usize, n_rot: usize, base: f32) -> RopeRow {
    #[allow(clippy::cast_precision_loss)] // positions < 2^20 and n_rot small: exact in f32
    let (pos_f, n_rot_f) = (pos as f32, n_rot as f32);
    let theta_scale = base.powf(-2.0f32 / n_rot_f);
    let half = n_rot / 2;
    let mut cos = Vec::with_capacity(half);
    let mut sin = Vec::with_capacity(half);
    let mut theta = pos_f;
    for _ in 0..half {
        cos.push(theta.cos());
        sin.push(theta.sin());
        theta *= theta_scale;
    }
    RopeRow { cos, sin }
}

/// NEOX RoPE on one head (dim i pairs with i + n_rot/2; dims past n_rot pass through).
/// Exact: the rotation contracted to FMA as clang does: `o0 = fma(x0, c, -(x1*s))`,
/// `o1 = fma(x0, s, x1*c)`.
pub fn rope_neox(head: &mut [f32], rope: &RopeRow, numerics: Numerics) {
    let half = rope.cos.len();
    let (lo, hi) = head.split_at_mut(half);
    for i in 0..half {
        let (x0, x1, c, s) = (lo[i], hi[i], rope.cos[i], rope.sin[i]);
        match numerics {
            Numerics::Exact => {
                lo[i] = x0.mul_add(c, -(x1 * s));
                hi[i] = x0.mul_add(s, x1 * c);
            }
            Numerics::Fast => {
                lo[i] = x0 * c - x1 * s;
                hi[i] = x0 * s + x1 * c;
            }
        }
    }
}

/// Normal RoPE on one head (llama.cpp's mode 0: dim 2i pairs with 2i + 1; dims past n_rot
/// pass through). Exact: the same FMA contraction as [`rope_neox`] (ggml computes both modes
/// with the same expressions).
pub fn rope_norm(head: &mut [f32], rope: &RopeRow, numerics: Numerics) {
    for (pair, (&c, &s)) in head.chunks_exact_mut(2).zip(rope.cos.iter().zip(&rope.sin)) {
        let (x0, x1) = (pair[0], pair[1]);
        match numerics {
            Numerics::Exact => {
                pair[0] = x0.mul_add(c, -(x1 * s));
                pair[1] = x0.mul_add(s, x1 * c);
            }
            Numerics::Fast => {
                pair[0] = x0 * c - x1 * s;
                pair[1] = x0 * s + x1 * c;
            }
        }
    }
}

/// The RoPE of a style, applied to one head's first `n_rot` dimensions.
pub fn rope_for(style: RopeStyle) -> fn(&mut [f32], &RopeRow, Numerics) {
    match style {
        RopeStyle::Neox => rope_neox,
        RopeStyle::Norm => rope_norm,
    }
}

/// [`rope_norm`] turned back (fast numerics): pairs (2i, 2i + 1) of `head` (a whole head;
/// dims past n_rot pass through) rotated by minus the angles of `rope`.
pub fn rope_norm_back(head: &mut [f32], rope: &RopeRow) {
    for (pair, (&c, &s)) in head.chunks_exact_mut(2).zip(rope.cos.iter().zip(&rope.sin)) {
        let (x0, x1) = (pair[0], pair[1]);
        pair[0] = x0 * c + x1 * s;
        pair[1] = x1 * c - x0 * s;
    }
}

/// The turned-back RoPE of a style, for the context shift.
pub fn rope_back_for(style: RopeStyle) -> fn(&mut [f32], &RopeRow) {
    match style {
        RopeStyle::Neox => rope_neox_back,
        RopeStyle::Norm => rope_norm_back,
    }
}

/// GELU (tanh form) of one row in place, as ggml's `ggml_vec_gelu_f32` computes it with
/// `GGML_GELU_FP16`: `x ≤ −10` → 0, `x ≥ 10` → x, else x rounded to f16 and looked up in a
/// table of `f16(0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²))))` over every f16 value. Both
/// numerics use it.
pub fn gelu_row(x: &mut [f32]) {
    let table = gelu_table();
    for v in x.iter_mut() {
        if *v <= -10.0 {
            *v = 0.0;
        } else if *v < 10.0 {
            let i = usize::from(half::f16::from_f32(*v).to_bits());
            *v = half::f16::from_bits(table[i]).to_f32();
        }
    }
}

/// ggml's `ggml_gelu_f32`.
fn gelu_f32(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

fn gelu_table() -> &'static [u16] {
    static TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|i| half::f16::from_f32(gelu_f32(half::f16::from_bits(i).to_f32())).to_bits())
            .collect()
    })
}

/// The L2-normalized copy of `v`, as llama.cpp's `common_embd_normalize(…, 2)` computes it:
/// the sum of the f32 squares in f64, its square root, `v · f32(1 / root)` (a zero vector
/// stays zero).
pub fn l2_normalized(v: &[f32]) -> Vec<f32> {
    let sum: f64 = v.iter().map(|&x| f64::from(x * x)).sum::<f64>().sqrt();
    #[allow(clippy::cast_possible_truncation)]
    let norm = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    v.iter().map(|&x| x * norm).collect()
}

/// [`rope_neox`] turned back (fast numerics): dim i and i + n_rot/2 of `head` (a whole head;
/// dims past n_rot pass through) rotated by minus the angles of `rope`,
/// `(x0, x1) -> (x0 c + x1 s, x1 c − x0 s)`. The context shift moves cached keys to earlier
/// positions with it.
pub fn rope_neox_back(head: &mut [f32], rope: &RopeRow) {
    let half = rope.cos.len();
    let (lo, hi) = head.split_at_mut(half.min(head.len()));
    for i in 0..half.min(hi.len()) {
        let (x0, x1, c, s) = (lo[i], hi[i], rope.cos[i], rope.sin[i]);
        lo[i] = x0 * c + x1 * s;
        hi[i] = x1 * c - x0 * s;
    }
}

// The f16 rounding and bitnet.cpp's reductions live in the kernels crate (its attention
// kernel is built from them); the model's exact paths use them from there.
pub use bitnet_kernels::exact::{
    dot_f16_ggml, dot_tinyblas, round_f16, silu_row, softmax_exact, v_expf,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_follows_ggmls_table() {
        // Outside (−10, 10) GELU is cut off; inside, the f16 table value of the rounded input.
        let mut x = vec![-20.0f32, -10.0, 10.0, 25.0, 0.0, 1.0, -1.0, 0.5];
        gelu_row(&mut x);
        assert_eq!(&x[..5], &[0.0, 0.0, 10.0, 25.0, 0.0]);
        // gelu(1) = 0.841192, gelu(−1) = −0.158808, gelu(0.5) = 0.345714 (tanh form), each
        // rounded to f16.
        for (got, want) in x[5..].iter().zip([0.841_192_f32, -0.158_808, 0.345_714]) {
            assert_eq!(*got, half::f16::from_f32(want).to_f32(), "{want}");
        }
    }

    #[test]
    fn row_ranges_get_each_rows_own_scale() {
        // Several rows at once (fast numerics sums four side by side): each row's factor is
        // the one it gets alone, for ragged widths and row counts.
        for width in [1usize, 7, 8, 64, 129, 1024] {
            for rows in [1usize, 3, 4, 5, 9] {
                let x: Vec<f32> = (0..rows * width)
                    .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.0371)
                    .collect();
                for nm in [Numerics::Exact, Numerics::Fast] {
                    let mut got = vec![0.0f32; rows];
                    rms_scales(&x, width, 1e-6, nm, &mut got);
                    for (r, g) in got.iter().enumerate() {
                        let want = rms_scale(&x[r * width..(r + 1) * width], 1e-6, nm);
                        assert_eq!(g.to_bits(), want.to_bits(), "{nm:?} {width}×{rows} row {r}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_shared_scale_gives_the_norms_bits() {
        let x: Vec<f32> = (0..1027)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let w: Vec<f32> = (0..1027).map(|i| 1.0 + (i % 7) as f32 * 0.01).collect();
        for nm in [Numerics::Exact, Numerics::Fast] {
            let (mut a, mut b) = (vec![0.0; x.len()], vec![0.0; x.len()]);
            rms_norm_for(nm)(&x, &w, 1e-6, &mut a);
            scale_row(&x, rms_scale(&x, 1e-6, nm), &w, &mut b);
            assert!(
                a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                "{nm:?}"
            );
        }
    }

    #[test]
    fn l2_normalization() {
        let v = l2_normalized(&[3.0, 4.0]);
        assert_eq!(v, vec![0.6, 0.8]);
        assert_eq!(l2_normalized(&[0.0, 0.0]), vec![0.0, 0.0]);
    }

    #[test]
    fn rms_norm_unit_vector() {
        let x = [3.0f32, 4.0];
        let mut y = [0.0f32; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut y);
        // mean(x^2) = 12.5, 1/sqrt(12.5) = 0.28284271
        assert!((y[0] - 3.0 * 0.282_842_7).abs() < 1e-6);
        assert!((y[1] - 8.0 * 0.282_842_7).abs() < 1e-6);
    }

    /// The eight-lane sum gives the sequential sum's result up to f64 rounding: every output
    /// within two f32 ulps of the sequential one's on random rows of every length class
    /// (multiples of 8 and ragged tails), and every element counts (a row whose only nonzero
    /// value is its last).
    #[test]
    fn fast_rms_norm_tracks_the_sequential_one() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            f32::from(u16::try_from(seed >> 48).unwrap_or(0)) / 32768.0 - 1.0
        };
        for len in [1usize, 7, 8, 9, 31, 128, 2560, 2567, 6912] {
            let x: Vec<f32> = (0..len).map(|_| next() * 3.0).collect();
            let w: Vec<f32> = (0..len).map(|_| next()).collect();
            let (mut a, mut b) = (vec![0f32; len], vec![0f32; len]);
            rms_norm(&x, &w, 1e-5, &mut a);
            rms_norm_fast(&x, &w, 1e-5, &mut b);
            for (p, q) in a.iter().zip(&b) {
                assert!(
                    (p - q).abs() <= 2.0 * f32::EPSILON * p.abs(),
                    "len {len}: {p} vs {q}"
                );
            }
            let mut last = vec![0f32; len];
            last[len - 1] = 2.0;
            let ones = vec![1f32; len];
            rms_norm(&last, &ones, 0.0, &mut a);
            rms_norm_fast(&last, &ones, 0.0, &mut b);
            assert_eq!(a, b, "len {len}");
            assert!(b[len - 1] > 0.0);
        }
    }
}
