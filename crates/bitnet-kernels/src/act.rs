//! Per-token int8 activation quantization (FORMATS.md §1), bit-exact with bitnet.cpp.
//!
//! For one token row `x` (length K):
//! 1. `m = max(1e-5, max_k |x_k|)`, the maximum taken in f64;
//! 2. `s = (f32)(127 / m)`, the division in f64 rounded to f32;
//! 3. `q_k = clamp(round_half_even(x_k · s), −128, 127)`, `x_k · s` an f32 product.
//!
//! A ternary projection then computes `T = Σ_k w_k · q_k` in i32 and
//! `y = ((T as f32) / s) · β` (see [`crate::TernaryMatrix::matmul`]).

/// The floor of the absolute maximum, so an all-zero row gives `s = 127e5` and `q = 0`.
pub const ABSMAX_FLOOR: f64 = 1e-5;

/// Quantize one token row; returns its scale `s = (f32)(127/m)`.
///
/// `q.len()` must equal `x.len()`; if it does not, only the common prefix is written
/// (callers in this crate check lengths first; see [`quantize_rows`] for a checked form).
/// NaN inputs do not take part in the maximum and quantize to 0.
pub fn quantize_i8(x: &[f32], q: &mut [i8]) -> f32 {
    debug_assert_eq!(x.len(), q.len());
    let mut m = ABSMAX_FLOOR;
    for &v in x {
        // f64::max ignores NaN.
        m = m.max(f64::from(v.abs()));
    }
    #[allow(clippy::cast_possible_truncation)] // f64 -> f32 rounding is the specification
    let s = (127.0 / m) as f32;
    for (qo, &v) in q.iter_mut().zip(x) {
        *qo = quantize_one(v, s);
    }
    s
}

/// `clamp(round_half_even(v · s), −128, 127)` with an f32 product; NaN gives 0.
#[inline]
pub fn quantize_one(v: f32, s: f32) -> i8 {
    let r = (v * s).round_ties_even().clamp(-128.0, 127.0);
    // In range after the clamp; `as` maps NaN to 0.
    #[allow(clippy::cast_possible_truncation)]
    let q = r as i8;
    q
}

/// Quantize `n_tok` token rows of length `k` (row-major) into `q`, writing one scale per row.
pub fn quantize_rows(
    x: &[f32],
    k: usize,
    q: &mut [i8],
    s: &mut [f32],
) -> Result<(), crate::KernelError> {
    let n_tok = s.len();
    let n = n_tok
        .checked_mul(k)
        .ok_or(crate::KernelError::Overflow { what: "n_tok*k" })?;
    if x.len() != n {
        return Err(crate::KernelError::ShapeMismatch {
            what: "x",
            expected: n,
            got: x.len(),
        });
    }
    if q.len() != n {
        return Err(crate::KernelError::ShapeMismatch {
            what: "q",
            expected: n,
            got: q.len(),
        });
    }
    if k == 0 {
        s.fill(127e5);
        return Ok(());
    }
    for ((xr, qr), sr) in x
        .chunks_exact(k)
        .zip(q.chunks_exact_mut(k))
        .zip(s.iter_mut())
    {
        *sr = quantize_i8(xr, qr);
    }
    Ok(())
}
