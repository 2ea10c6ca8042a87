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
pub use bitnet_kernels::exact::{dot_f16_ggml, dot_tinyblas, round_f16, softmax_exact, v_expf};

#[cfg(test)]
mod tests {
    use super::*;

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
