//! Every reduction of the forward pass lives here, in small functions, so the two numerics
//! modes differ only in which of these is called:
//!
//! - [`Numerics::Fast`]: f32 activations, plain f32 reductions, fastest kernels.
//! - [`Numerics::Exact`]: reproduces bitnet.cpp (x86 AVX2+FMA+F16C build) bit for bit: the f16
//!   roundings it makes, and the accumulation orders of `ggml_vec_dot_f16`, llamafile's tinyBLAS
//!   and `ggml_v_expf`. The rules are listed on each function.
//!
//! Shared by both modes (they are cheap and already exact): RMSNorm with an f64 sum, RoPE tables
//! from libm `powf`/`cosf`/`sinf` of an iterated f32 angle.

use half::f16;

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
    let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let n = x.len().max(1) as f64;
    #[allow(clippy::cast_possible_truncation)] // f64 -> f32 rounding is the rule
    let mean = (sum / n) as f32;
    let scale = 1.0f32 / (mean + eps).sqrt();
    for ((o, &xi), &wi) in y.iter_mut().zip(x).zip(w) {
        *o = (xi * scale) * wi;
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

/// Round an f32 to the nearest f16 (ties to even, as F16C's `vcvtps2ph` with mode 0) and back.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// `ggml_vec_dot_f16` (AVX2/F16C): both inputs hold f16 values (given as f32). Four
/// accumulators of 8 lanes over chunks of 32 (f16 x f16 products are exact in f32, so FMA and
/// mul+add agree), reduced `(a0 + a2) + (a1 + a3)`, then the 128-bit halves `lo + hi`, then two
/// horizontal adds: `(t0 + t1) + (t2 + t3)`. Leftover elements past the last full chunk are
/// added in f64 and the result rounded to f32.
pub fn dot_f16_ggml(x: &[f32], y: &[f32]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    let n = x.len().min(y.len());
    let np = n - n % 32;
    let mut acc = [[0.0f32; 8]; 4];
    for c in (0..np).step_by(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            let base = c + 8 * j;
            for (l, al) in a.iter_mut().enumerate() {
                *al += x[base + l] * y[base + l];
            }
        }
    }
    let sum = reduce_ggml_f32x8(&acc);
    if np == n {
        return sum;
    }
    let mut s = f64::from(sum);
    for i in np..n {
        s += f64::from(x[i] * y[i]);
    }
    #[allow(clippy::cast_possible_truncation)]
    let r = s as f32;
    r
}

/// GGML_F32x8_REDUCE for four 8-lane accumulators followed by ggml's 8-lane horizontal sum.
#[inline]
fn reduce_ggml_f32x8(acc: &[[f32; 8]; 4]) -> f32 {
    let mut a = [0.0f32; 8];
    for l in 0..8 {
        let a0 = acc[0][l] + acc[2][l];
        let a1 = acc[1][l] + acc[3][l];
        a[l] = a0 + a1;
    }
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// One 8-lane accumulator of llamafile tinyBLAS (F16 A x F32 B, AVX2+FMA) for a single output:
/// `acc = fma(a[l..l+8], b[l..l+8], acc)` over chunks of 8, then `t = lo + hi` and
/// `(t0 + t2) + (t1 + t3)`. `a` holds f16 values (as f32), `b` plain f32; `len % 8 == 0`.
pub fn dot_tinyblas(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    debug_assert_eq!(a.len() % 8, 0);
    let mut acc = [0.0f32; 8];
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] = ca[l].mul_add(cb[l], acc[l]);
        }
    }
    let t = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (t[0] + t[2]) + (t[1] + t[3])
}

/// `ggml_v_expf` (AVX2 + FMA), lane-wise.
pub fn v_expf(x: f32) -> f32 {
    let fma = |a: f32, b: f32, c: f32| a.mul_add(b, c);
    let r = f32::from_bits(0x4B40_0000); // 0x1.8p23
    let z = fma(x, f32::from_bits(0x3FB8_AA3B), r); // 0x1.715476p+0
    let n = z - r;
    let b = fma(
        -n,
        f32::from_bits(0x35BF_BE8E),
        fma(-n, f32::from_bits(0x3F31_7200), x),
    );
    let e = z.to_bits().wrapping_shl(23);
    let k = f32::from_bits(e.wrapping_add(0x3F80_0000));
    let u = b * b;
    let j = fma(
        fma(
            fma(f32::from_bits(0x3C07_2010), b, f32::from_bits(0x3D2B_9F17)),
            u,
            fma(f32::from_bits(0x3E2A_AF33), b, f32::from_bits(0x3EFF_FEDB)),
        ),
        u,
        f32::from_bits(0x3F7F_FFF6) * b,
    );
    if n.abs() <= 126.0 {
        return fma(j, k, k);
    }
    // n is NaN or |n| > 126: the slow path (NaN compares false above and lands here too,
    // where it propagates as in the vector code's blend).
    if n.is_nan() {
        return fma(j, k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7F00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        fma(s2, j, s2) * s1
    }
}

/// Softmax of one attention row as `ggml_compute_forward_soft_max_f32` computes it:
/// `w = kq * scale + mask`; `e = ggml_v_expf(w - max)`; per 8-lane group `t = e[4..8] + e[0..4]`,
/// `(t0 + t2) + (t1 + t3)`, groups added sequentially into an f64; `p = e * (f32)(1 / sum)`.
/// `kq.len()` is a multiple of 8; masked entries are `-inf` in `w` (and give `e = 0`).
pub fn softmax_exact(w: &mut [f32]) {
    debug_assert_eq!(w.len() % 8, 0);
    let mx = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in w.iter_mut() {
        *v = if *v == f32::NEG_INFINITY {
            0.0
        } else {
            v_expf(*v - mx)
        };
    }
    let mut sum = 0.0f64;
    for g in w.chunks_exact(8) {
        let t = [g[4] + g[0], g[5] + g[1], g[6] + g[2], g[7] + g[3]];
        sum += f64::from((t[0] + t[2]) + (t[1] + t[3]));
    }
    #[allow(clippy::cast_possible_truncation)]
    let inv = (1.0 / sum) as f32;
    for v in w.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_expf_tracks_exp() {
        for i in -2000..=2000 {
            let x = i as f32 * 0.01;
            let want = (x as f64).exp();
            let got = v_expf(x) as f64;
            assert!(
                ((got - want) / want).abs() < 4e-7,
                "x={x} got={got} want={want}"
            );
        }
        assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(v_expf(-200.0), 0.0);
    }

    #[test]
    fn ggml_dot_handles_leftovers() {
        let x: Vec<f32> = (0..45).map(|i| round_f16(i as f32 * 0.25)).collect();
        let y: Vec<f32> = (0..45).map(|i| round_f16(1.0 - i as f32 * 0.01)).collect();
        let want: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        assert!((f64::from(dot_f16_ggml(&x, &y)) - want).abs() < 1e-4);
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
}
