//! Per-token int8 activation quantization (docs/FORMATS.md §1), bit-exact with bitnet.cpp.
//!
//! For one token row `x` (length K):
//! 1. `m = max(1e-5, max_k |x_k|)`, the maximum taken in f64;
//! 2. `s = (f32)(127 / m)`, the division in f64 rounded to f32;
//! 3. `q_k = clamp(round_half_even(x_k · s), −128, 127)`, `x_k · s` an f32 product.
//!
//! A row that holds a NaN has no such scale: it gets `s = NaN` and codes of 0, so the
//! projection's outputs for that token are NaN, and the NaN goes on to the model's output
//! checks instead of being quantized away into finite, wrong numbers. (An infinite value gives
//! `s = 0`, whose outputs `0 / 0` are NaN as well.)
//!
//! A ternary projection then computes `T = Σ_k w_k · q_k` in i32 and
//! `y = ((T as f32) / s) · β` (see [`crate::TernaryMatrix::matmul`]).
//!
//! [`quantize_i8_scalar`] is the reference; on every x86 SIMD tier [`quantize_i8`]
//! runs an AVX2 kernel, and on WebAssembly's `simd128` tier a kernel four lanes wide, that
//! return bit-identical scales and codes for every input (NaN, ±inf, −0.0, exact .5 ties,
//! any length).

use crate::dispatch::{kernels, kernels_for};
use crate::tier::{Isa, Kernels};

/// The floor of the absolute maximum, so an all-zero row gives `s = 127e5` and `q = 0`.
pub const ABSMAX_FLOOR: f64 = 1e-5;

/// Quantize one token row; returns its scale `s = (f32)(127/m)`.
///
/// `q.len()` must equal `x.len()`; if it does not, only the common prefix is written
/// (callers in this crate check lengths first; see [`quantize_rows`] for a checked form).
/// A row that holds a NaN gets the scale NaN and codes of 0 (see the module docs).
///
/// Runs on the selected kernel tier ([`crate::isa`]); every tier gives the result of
/// [`quantize_i8_scalar`] bit for bit.
pub fn quantize_i8(x: &[f32], q: &mut [i8]) -> f32 {
    quantize_i8_with(kernels(), x, q)
}

/// [`quantize_i8`] on a chosen tier (tests, benchmarks); `None` if this CPU lacks it.
pub fn quantize_i8_on(isa: Isa, x: &[f32], q: &mut [i8]) -> Option<f32> {
    kernels_for(isa).map(|k| quantize_i8_with(k, x, q))
}

fn quantize_i8_with(k: &Kernels, x: &[f32], q: &mut [i8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = avx2::quantize_i8(k, x, q) {
        return s;
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if k.isa == Isa::Simd128 {
        return wasm::quantize(x, q);
    }
    #[cfg(not(any(
        target_arch = "x86_64",
        all(target_arch = "wasm32", target_feature = "simd128")
    )))]
    let _ = k;
    quantize_i8_scalar(x, q)
}

/// The portable reference of [`quantize_i8`] (the SIMD kernels are tested against it).
#[doc(hidden)]
pub fn quantize_i8_scalar(x: &[f32], q: &mut [i8]) -> f32 {
    debug_assert_eq!(x.len(), q.len());
    let mut m = ABSMAX_FLOOR;
    let mut nan = false;
    for &v in x {
        nan |= v.is_nan();
        m = m.max(f64::from(v.abs()));
    }
    #[allow(clippy::cast_possible_truncation)] // f64 -> f32 rounding is the specification
    let s = if nan { f32::NAN } else { (127.0 / m) as f32 };
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

/// The bits of `|x|` are above this exactly when `x` is a NaN (it is +∞'s).
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
const NAN_ABOVE: u32 = 0x7f80_0000;

/// The scale of a row whose largest `|x|`, as bits, is `m_bits` (see [`NAN_ABOVE`]): NaN for
/// a row with a NaN, else [`quantize_i8_scalar`]'s `(f32)(127 / max(floor, m))`.
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
fn scale_of_bits(m_bits: u32) -> f32 {
    if m_bits > NAN_ABOVE {
        return f32::NAN;
    }
    let m = f64::from(f32::from_bits(m_bits)).max(ABSMAX_FLOOR);
    #[allow(clippy::cast_possible_truncation)] // f64 -> f32 rounding is the specification
    let s = (127.0 / m) as f32;
    s
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
    let kern = kernels();
    for ((xr, qr), sr) in x
        .chunks_exact(k)
        .zip(q.chunks_exact_mut(k))
        .zip(s.iter_mut())
    {
        *sr = quantize_i8_with(kern, xr, qr);
    }
    Ok(())
}

/// The AVX2 twin of [`quantize_i8_scalar`], 32 values per step.
///
/// Bit-exactness with the scalar code, step by step:
/// - max: taken on the bits of `|x|` as unsigned integers (`_mm256_max_epu32`), which order
///   every non-NaN `|x|` as the floats are ordered and put every NaN above +∞. A maximum
///   above +∞'s bits is a row with a NaN ([`NAN_ABOVE`]); otherwise it is the scalar f64
///   maximum of the same values converted to f64 (the conversion is exact and monotone). The
///   floor and the division stay scalar.
/// - product: `_mm256_mul_ps`, a correctly rounded f32 multiply like `v * s` (no FMA).
/// - rounding: `_mm256_round_ps` to nearest, ties to even = `round_ties_even`.
/// - clamp to [−128, 127], then lanes whose product is NaN are zeroed through an ordered
///   compare mask (`as i8` maps NaN to 0; max/min alone would turn NaN into −128). −0.0
///   converts to 0 as in the scalar code.
/// - the ragged tail (< 32 values) goes through the same code on a zero-padded copy; zero
///   padding changes neither the maximum (all `|x| ≥ 0`) nor the written codes.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::scale_of_bits;
    use crate::tier::{Isa, Kernels};

    /// Run the AVX2 kernel when `k` is the table of a tier that includes AVX2 (every x86 tier
    /// from AVX2 up, the order the attention kernels use too); `None` otherwise.
    pub(super) fn quantize_i8(k: &Kernels, x: &[f32], q: &mut [i8]) -> Option<f32> {
        if k.isa < Isa::Avx2 {
            return None;
        }
        debug_assert_eq!(x.len(), q.len());
        // SAFETY: kernel tables are only handed out by `dispatch::kernels_for` after
        // `Isa::is_supported` confirmed the tier at run time, and both the AVX2 and the
        // AVX-512 tier require AVX2, which is all `quantize` needs. The kernel itself only
        // touches memory through bounds-checked slices and fixed-size arrays.
        Some(unsafe { quantize(x, q) })
    }

    /// Scale of `x` and codes of the common prefix of `x` and `q`.
    #[target_feature(enable = "avx2")]
    fn quantize(x: &[f32], q: &mut [i8]) -> f32 {
        let s = scale_of_bits(absmax_bits(x));
        let n = x.len().min(q.len());
        let (x, q) = (&x[..n], &mut q[..n]);
        let sv = _mm256_set1_ps(s);
        let (xc, xt) = x.as_chunks::<32>();
        let (qc, qt) = q.as_chunks_mut::<32>();
        for (xb, qb) in xc.iter().zip(qc.iter_mut()) {
            store32(qb, quant32(xb, sv));
        }
        if !xt.is_empty() {
            let mut xb = [0f32; 32];
            xb[..xt.len()].copy_from_slice(xt);
            let mut qb = [0i8; 32];
            store32(&mut qb, quant32(&xb, sv));
            qt.copy_from_slice(&qb[..qt.len()]);
        }
        s
    }

    /// The largest bits of `|x_k|` as an unsigned integer (0 for an empty row).
    #[target_feature(enable = "avx2")]
    fn absmax_bits(x: &[f32]) -> u32 {
        let (xc, xt) = x.as_chunks::<32>();
        let mut acc = [_mm256_setzero_si256(); 4];
        for xb in xc {
            absmax_step(&mut acc, xb);
        }
        if !xt.is_empty() {
            let mut xb = [0f32; 32];
            xb[..xt.len()].copy_from_slice(xt);
            absmax_step(&mut acc, &xb);
        }
        let v = _mm256_max_epu32(
            _mm256_max_epu32(acc[0], acc[1]),
            _mm256_max_epu32(acc[2], acc[3]),
        );
        let h = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let h = _mm_max_epu32(h, _mm_shuffle_epi32::<0b00_00_11_10>(h));
        let h = _mm_max_epu32(h, _mm_shuffle_epi32::<0b00_00_00_01>(h));
        _mm_cvtsi128_si32(h).cast_unsigned()
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn absmax_step(acc: &mut [__m256i; 4], xb: &[f32; 32]) {
        let magnitude = _mm256_set1_epi32(0x7fff_ffff);
        for (a, v) in acc.iter_mut().zip(load32(xb)) {
            *a = _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(v), magnitude), *a);
        }
    }

    /// Codes of 32 values, in order.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn quant32(xb: &[f32; 32], s: __m256) -> __m256i {
        let [a, b, c, d] = load32(xb).map(|v| quant8(v, s));
        // packs works within each 128-bit lane: the bytes come out as 4-value groups
        // a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7; the permute restores a0-7 b0-7 …
        // Saturation never applies (all values are in [−128, 127]).
        let ab = _mm256_packs_epi32(a, b);
        let cd = _mm256_packs_epi32(c, d);
        let abcd = _mm256_packs_epi16(ab, cd);
        _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// `clamp(round_half_even(v · s), −128, 127)` per lane as i32; NaN gives 0.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn quant8(v: __m256, s: __m256) -> __m256i {
        let p = _mm256_mul_ps(v, s);
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(p);
        let c = _mm256_min_ps(
            _mm256_max_ps(r, _mm256_set1_ps(-128.0)),
            _mm256_set1_ps(127.0),
        );
        let ordered = _mm256_cmp_ps::<_CMP_ORD_Q>(p, p);
        _mm256_cvtps_epi32(_mm256_and_ps(c, ordered))
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn load32(xb: &[f32; 32]) -> [__m256; 4] {
        let p = xb.as_ptr();
        // SAFETY: the four unaligned 8-float loads at offsets 0, 8, 16 and 24 read exactly
        // the 32 floats of `xb`; loadu has no alignment requirement.
        unsafe {
            [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ]
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn store32(qb: &mut [i8; 32], v: __m256i) {
        // SAFETY: the unaligned 32-byte store writes exactly the 32 bytes of `qb`, which is
        // exclusively borrowed; storeu has no alignment requirement.
        unsafe { _mm256_storeu_si256(qb.as_mut_ptr().cast(), v) }
    }
}

/// The `simd128` kernel of [`quantize_i8`], the scalar operations four lanes at a time:
/// - maximum: `u32x4.max` of the bits of `|v|`, as the AVX2 kernel takes it (every NaN above
///   +∞, [`NAN_ABOVE`]); the lanes' maximum, the floor and the division stay scalar (in f64,
///   as the reference takes them).
/// - product: `f32x4.mul`, the same correctly rounded f32 product as `v * s`.
/// - rounding: `f32x4.nearest`, ties to even, as `round_ties_even`.
/// - clamp: `f32x4.max`/`f32x4.min`, which keep a NaN, and `i32x4.trunc_sat_f32x4_s`, which
///   turns it into 0 as `as i8` does; the narrowing never saturates (values in [−128, 127]).
/// - the ragged tail (< 16 values) goes through the same code on a zero-padded copy.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm {
    use std::arch::wasm32::*;

    use super::scale_of_bits;
    use crate::simd::wasm::{bytes, load};

    pub(super) fn quantize(x: &[f32], q: &mut [i8]) -> f32 {
        let n = x.len().min(q.len());
        let (x, q) = (&x[..n], &mut q[..n]);
        let (xc, xt) = x.as_chunks::<16>();
        let mut pad = [0f32; 16];
        pad[..xt.len()].copy_from_slice(xt);
        let mut acc = u32x4_splat(0);
        let magnitude = u32x4_splat(0x7fff_ffff);
        for xb in xc.iter().chain((!xt.is_empty()).then_some(&pad)) {
            for h in 0..4 {
                acc = u32x4_max(acc, v128_and(load(xb, 4 * h), magnitude));
            }
        }
        let s = scale_of_bits(
            u32x4_extract_lane::<0>(acc)
                .max(u32x4_extract_lane::<1>(acc))
                .max(u32x4_extract_lane::<2>(acc))
                .max(u32x4_extract_lane::<3>(acc)),
        );
        let sv = f32x4_splat(s);
        let (qc, qt) = q.as_chunks_mut::<16>();
        for (xb, qb) in xc.iter().zip(qc.iter_mut()) {
            *qb = quant16(xb, sv);
        }
        if !qt.is_empty() {
            let codes = quant16(&pad, sv);
            let len = qt.len();
            qt.copy_from_slice(&codes[..len]);
        }
        s
    }

    /// Codes of 16 values, in order.
    #[inline(always)]
    fn quant16(xb: &[f32; 16], s: v128) -> [i8; 16] {
        let lo = f32x4_splat(-128.0);
        let hi = f32x4_splat(127.0);
        let c: [v128; 4] = std::array::from_fn(|h| {
            let r = f32x4_nearest(f32x4_mul(load(xb, 4 * h), s));
            i32x4_trunc_sat_f32x4(f32x4_min(f32x4_max(r, lo), hi))
        });
        let v = i8x16_narrow_i16x8(
            i16x8_narrow_i32x4(c[0], c[1]),
            i16x8_narrow_i32x4(c[2], c[3]),
        );
        bytes(v)
    }
}
