//! Float steps over rows, on the widest vectors the selected tier has: the sums of squares
//! of fast numerics' RMSNorm ([`sum_sq_rows`]), its weighted scaling ([`scale_row`]) and the
//! float epilogue of the integer GEMM (`panel_out`: `y = ((T − Σq) as f32 / s) · β`), and
//! the sums `Σq` of int8 activations that epilogue needs ([`sum_i8`]).
//!
//! The sums of squares keep their one order of additions (eight f64 lanes, each summed in
//! sequence: [`sum_sq_lanes8`]); a lane's additions form a dependency chain, so the tiers
//! sum four rows at once, in registers side by side, each row in its own order.
//!
//! Each step is one inlined body of independent per-element operations, compiled three times
//! on x86-64: plainly (SSE2, the scalar twin), with AVX2 and with AVX-512 F enabled, where the
//! compiler turns the same operations into 4-, 8- or 16-lane instructions. No operation is
//! reordered, fused or reassociated (Rust never contracts `a * b + c`), so every build gives
//! the plain body's bits; the tests compare the tiers with the twins over random lengths.
//! Elsewhere (NEON, WebAssembly) the plain body is what runs, vectorized for that target.

use crate::tier::Isa;

/// `y[i] = (x[i] · s) · w[i]`: two f32 products, each rounded; over the common length of
/// `x`, `w` and `y`. Runs on the selected kernel tier ([`crate::isa`]).
pub fn scale_row(x: &[f32], s: f32, w: &[f32], y: &mut [f32]) {
    scale_row_with(crate::isa(), x, s, w, y);
}

/// [`scale_row`] on a chosen tier (tests, benchmarks); `None` if this CPU lacks it.
pub fn scale_row_on(isa: Isa, x: &[f32], s: f32, w: &[f32], y: &mut [f32]) -> Option<()> {
    isa.is_supported().then(|| scale_row_with(isa, x, s, w, y))
}

/// The plain compilation of [`scale_row`] (the twin the tiers are tested against).
#[doc(hidden)]
pub fn scale_row_scalar(x: &[f32], s: f32, w: &[f32], y: &mut [f32]) {
    scale_body(x, s, w, y);
}

#[inline(always)]
fn scale_body(x: &[f32], s: f32, w: &[f32], y: &mut [f32]) {
    for ((o, &xi), &wi) in y.iter_mut().zip(x).zip(w) {
        *o = (xi * s) * wi;
    }
}

fn scale_row_with(isa: Isa, x: &[f32], s: f32, w: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 && Isa::Avx512.is_supported() {
            // SAFETY: AVX-512 F is available (the AVX-512 tiers require it; checked above).
            unsafe { x86::scale_avx512(x, s, w, y) };
            return;
        }
        if isa >= Isa::Avx2 && Isa::Avx2.is_supported() {
            // SAFETY: AVX2 is available (checked above).
            unsafe { x86::scale_avx2(x, s, w, y) };
            return;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    scale_body(x, s, w, y);
}

/// The integer GEMM's float epilogue for one token and a run of output rows:
/// `dst[i] = ((raw[i] − b) as f32 / s) · β` (the difference in wrapping i32 arithmetic, the
/// conversion rounded to nearest), over the common length of `raw` and `dst`.
pub(crate) fn panel_out(isa: Isa, raw: &[i32], b: i32, s: f32, beta: f32, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 && Isa::Avx512.is_supported() {
            // SAFETY: AVX-512 F is available (checked above).
            unsafe { x86::out_avx512(raw, b, s, beta, dst) };
            return;
        }
        if isa >= Isa::Avx2 && Isa::Avx2.is_supported() {
            // SAFETY: AVX2 is available (checked above).
            unsafe { x86::out_avx2(raw, b, s, beta, dst) };
            return;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    out_body(raw, b, s, beta, dst);
}

/// The GEMM epilogue on a chosen tier (tests); `None` if this CPU lacks it.
#[doc(hidden)]
pub fn panel_out_on(
    isa: Isa,
    raw: &[i32],
    b: i32,
    s: f32,
    beta: f32,
    dst: &mut [f32],
) -> Option<()> {
    isa.is_supported()
        .then(|| panel_out(isa, raw, b, s, beta, dst))
}

/// The plain compilation of the GEMM epilogue (the twin the tiers are tested against).
#[doc(hidden)]
pub fn panel_out_scalar(raw: &[i32], b: i32, s: f32, beta: f32, dst: &mut [f32]) {
    out_body(raw, b, s, beta, dst);
}

#[inline(always)]
fn out_body(raw: &[i32], b: i32, s: f32, beta: f32, dst: &mut [f32]) {
    for (d, &v) in dst.iter_mut().zip(raw) {
        // An i32 → f32 conversion rounds to nearest, as `cvtdq2ps` does.
        #[allow(clippy::cast_precision_loss)]
        let t = v.wrapping_sub(b) as f32;
        *d = (t / s) * beta;
    }
}

/// The f32 squares of `x` summed in f64 as fast numerics' RMSNorm sums them: element `i`
/// into lane `i mod 8`, each lane in order from 0.0, then the lanes added 0+4, 1+5, 2+6,
/// 3+7, then (0+4)+(2+6) and (1+5)+(3+7), then those two. (The plain twin of
/// [`sum_sq_rows`].)
pub fn sum_sq_lanes8(x: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let (chunks, tail) = x.as_chunks::<8>();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += f64::from(v * v);
        }
    }
    for (l, &v) in lanes.iter_mut().zip(tail) {
        *l += f64::from(v * v);
    }
    fold8(lanes)
}

#[inline(always)]
fn fold8([a, b, c, d, e, f, g, h]: [f64; 8]) -> f64 {
    ((a + e) + (c + g)) + ((b + f) + (d + h))
}

/// `out[r]` = [`sum_sq_lanes8`] of row `r` of `x` (rows of `width` values; `out.len()` rows,
/// as many as `x` holds), bit for bit, on the selected tier.
pub fn sum_sq_rows(x: &[f32], width: usize, out: &mut [f64]) {
    sum_sq_rows_with(crate::isa(), x, width, out);
}

/// [`sum_sq_rows`] on a chosen tier (tests, benchmarks); `None` if this CPU lacks it.
pub fn sum_sq_rows_on(isa: Isa, x: &[f32], width: usize, out: &mut [f64]) -> Option<()> {
    isa.is_supported()
        .then(|| sum_sq_rows_with(isa, x, width, out))
}

fn sum_sq_rows_with(isa: Isa, x: &[f32], width: usize, out: &mut [f64]) {
    let rows = match x.len().checked_div(width) {
        Some(n) => n.min(out.len()),
        None => {
            // Rows of no values sum to 0.
            out.fill(0.0);
            return;
        }
    };
    let (x, out) = (&x[..rows * width], &mut out[..rows]);
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 && Isa::Avx512.is_supported() {
            // SAFETY: AVX-512 F is available (checked above).
            unsafe { x86::sum_sq_avx512(x, width, out) };
            return;
        }
        if isa >= Isa::Avx2 && Isa::Avx2.is_supported() {
            // SAFETY: AVX2 is available (checked above).
            unsafe { x86::sum_sq_avx2(x, width, out) };
            return;
        }
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if isa == Isa::Simd128 {
        for (o, row) in out.iter_mut().zip(x.chunks_exact(width)) {
            *o = wasm::sum_sq(row);
        }
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    for (o, row) in out.iter_mut().zip(x.chunks_exact(width)) {
        *o = sum_sq_lanes8(row);
    }
}

/// WebAssembly's [`sum_sq_lanes8`]: the eight f64 lanes as four `f64x2`, each f32 square
/// (`f32x4.mul`, the scalar product) widened exactly and added to its own lane in order; a
/// ragged tail is zero-padded, and adding a square of 0 to a lane that is never −0 changes
/// nothing.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm {
    use std::arch::wasm32::*;

    use crate::simd::wasm::load;

    pub(super) fn sum_sq(x: &[f32]) -> f64 {
        let (chunks, tail) = x.as_chunks::<8>();
        let mut pad = [0f32; 8];
        pad[..tail.len()].copy_from_slice(tail);
        let mut acc = [f64x2_splat(0.0); 4];
        for c in chunks.iter().chain((!tail.is_empty()).then_some(&pad)) {
            for h in 0..2 {
                let v = load(c, 4 * h);
                let sq = f32x4_mul(v, v);
                let hi = i32x4_shuffle::<2, 3, 0, 1>(sq, sq);
                acc[2 * h] = f64x2_add(acc[2 * h], f64x2_promote_low_f32x4(sq));
                acc[2 * h + 1] = f64x2_add(acc[2 * h + 1], f64x2_promote_low_f32x4(hi));
            }
        }
        let l = |v: v128| [f64x2_extract_lane::<0>(v), f64x2_extract_lane::<1>(v)];
        let [a, b] = l(acc[0]);
        let [c, d] = l(acc[1]);
        let [e, f] = l(acc[2]);
        let [g, h] = l(acc[3]);
        super::fold8([a, b, c, d, e, f, g, h])
    }
}

/// `Σ x` as i32 (wrapping, as an i32 sum of the values does; exact for any row shorter
/// than 2^24 values). Runs on the selected kernel tier.
pub fn sum_i8(x: &[i8]) -> i32 {
    sum_i8_with(crate::isa(), x)
}

/// [`sum_i8`] on a chosen tier (tests); `None` if this CPU lacks it.
pub fn sum_i8_on(isa: Isa, x: &[i8]) -> Option<i32> {
    isa.is_supported().then(|| sum_i8_with(isa, x))
}

/// The plain [`sum_i8`] (the twin the tiers are tested against).
#[doc(hidden)]
pub fn sum_i8_scalar(x: &[i8]) -> i32 {
    x.iter().fold(0i32, |a, &v| a.wrapping_add(i32::from(v)))
}

pub(crate) fn sum_i8_with(isa: Isa, x: &[i8]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && Isa::Avx2.is_supported() {
        // SAFETY: AVX2 is available (checked above).
        return unsafe { x86::sum_i8_avx2(x) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    sum_i8_scalar(x)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The plain bodies compiled with wider vectors enabled, the sums of squares of four rows
    //! at a time, and the int8 sums.

    use std::arch::x86_64::*;

    use super::{fold8, out_body, scale_body};

    /// Rows summed side by side.
    const GROUP: usize = 4;

    /// The rows of `x` in groups of up to [`GROUP`], each group with its part of `out`.
    fn groups<'a>(
        x: &'a [f32],
        width: usize,
        out: &'a mut [f64],
    ) -> impl Iterator<Item = ([&'a [f32]; GROUP], &'a mut [f64])> {
        x.chunks(GROUP * width)
            .zip(out.chunks_mut(GROUP))
            .map(move |(xs, o)| {
                let mut g: [&[f32]; GROUP] = [&[]; GROUP];
                for (slot, row) in g.iter_mut().zip(xs.chunks_exact(width)) {
                    *slot = row;
                }
                (g, o)
            })
    }

    /// The last, partial chunk of eight values of `row`, zero-padded (a square of 0.0 adds
    /// +0.0, which leaves a lane that starts at +0.0 and only gains squares unchanged).
    #[inline(always)]
    fn tail(row: &[f32]) -> [f32; 8] {
        let (_, t) = row.as_chunks::<8>();
        let mut v = [0f32; 8];
        v[..t.len()].copy_from_slice(t);
        v
    }

    /// Each group's rows summed side by side: `add` puts a row's next eight values into its
    /// accumulator (the eight lanes, in whatever registers), `lanes` reads the eight lanes
    /// back for the fold.
    #[inline(always)]
    fn sum_groups<A: Copy>(
        x: &[f32],
        width: usize,
        out: &mut [f64],
        zero: A,
        add: impl Fn(&mut A, &[f32; 8]),
        lanes: impl Fn(A) -> [f64; 8],
    ) {
        for (g, o) in groups(x, width, out) {
            let chunks = g.map(|row| row.as_chunks::<8>().0);
            let mut acc = [zero; GROUP];
            for c in 0..width / 8 {
                for (a, row) in acc.iter_mut().zip(&chunks[..o.len()]) {
                    add(a, &row[c]);
                }
            }
            if !width.is_multiple_of(8) {
                for (a, row) in acc.iter_mut().zip(&g[..o.len()]) {
                    add(a, &tail(row));
                }
            }
            for (dst, a) in o.iter_mut().zip(acc) {
                *dst = fold8(lanes(a));
            }
        }
    }

    /// # Safety
    /// AVX-512 F is available; `x.len() == out.len() · width`, `width > 0`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum_sq_avx512(x: &[f32], width: usize, out: &mut [f64]) {
        let add = |a: &mut __m512d, v: &[f32; 8]| {
            // SAFETY: `v` is 8 floats; loadu has no alignment requirement.
            let v = unsafe { _mm256_loadu_ps(v.as_ptr()) };
            *a = _mm512_add_pd(*a, _mm512_cvtps_pd(_mm256_mul_ps(v, v)));
        };
        let lanes = |a: __m512d| {
            let mut l = [0f64; 8];
            // SAFETY: `l` is 8 f64.
            unsafe { _mm512_storeu_pd(l.as_mut_ptr(), a) };
            l
        };
        sum_groups(x, width, out, _mm512_setzero_pd(), add, lanes);
    }

    /// # Safety
    /// AVX2 is available; `x.len() == out.len() · width`, `width > 0`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sum_sq_avx2(x: &[f32], width: usize, out: &mut [f64]) {
        // Lanes 0–3 and 4–7 of a row.
        let add = |(lo, hi): &mut (__m256d, __m256d), v: &[f32; 8]| {
            // SAFETY: `v` is 8 floats; loadu has no alignment requirement.
            let v = unsafe { _mm256_loadu_ps(v.as_ptr()) };
            let sq = _mm256_mul_ps(v, v);
            *lo = _mm256_add_pd(*lo, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
            *hi = _mm256_add_pd(*hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(sq)));
        };
        let lanes = |(lo, hi): (__m256d, __m256d)| {
            let mut l = [0f64; 8];
            // SAFETY: `l` is 8 f64; the two stores fill its halves.
            unsafe {
                _mm256_storeu_pd(l.as_mut_ptr(), lo);
                _mm256_storeu_pd(l.as_mut_ptr().add(4), hi);
            }
            l
        };
        let zero = (_mm256_setzero_pd(), _mm256_setzero_pd());
        sum_groups(x, width, out, zero, add, lanes);
    }

    /// [`super::sum_i8`], 32 values a step: each byte's bit 7 flipped makes it `x + 128`
    /// as an unsigned byte, and `vpsadbw` against zero sums eight of those into a 64-bit lane;
    /// the 128 · n added is taken off at the end. Integer sums are exact in any order.
    ///
    /// # Safety
    /// AVX2 is available.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sum_i8_avx2(x: &[i8]) -> i32 {
        let (chunks, tail) = x.as_chunks::<32>();
        let flip = _mm256_set1_epi8(i8::MIN);
        let mut acc = _mm256_setzero_si256();
        for c in chunks {
            // SAFETY: `c` is 32 bytes; loadu has no alignment requirement.
            let v = unsafe { _mm256_loadu_si256(c.as_ptr().cast()) };
            let sums = _mm256_sad_epu8(_mm256_xor_si256(v, flip), _mm256_setzero_si256());
            acc = _mm256_add_epi64(acc, sums);
        }
        let mut lanes = [0u64; 4];
        // SAFETY: `lanes` is 32 bytes.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), acc) };
        // Each lane is at most 255 · 8 per step: no u64 lane or total overflows.
        let biased = lanes.iter().fold(0u64, |a, &l| a.wrapping_add(l));
        let n = u64::try_from(chunks.len() * 32).unwrap_or(u64::MAX);
        // Wrapping to i32 keeps the sum modulo 2^32, as the plain sum does.
        #[allow(clippy::cast_possible_truncation)]
        let full = biased.wrapping_sub(128u64.wrapping_mul(n)) as u32 as i32;
        tail.iter().fold(full, |a, &v| a.wrapping_add(i32::from(v)))
    }

    /// # Safety
    /// AVX2 is available.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn scale_avx2(x: &[f32], s: f32, w: &[f32], y: &mut [f32]) {
        scale_body(x, s, w, y);
    }

    /// # Safety
    /// AVX-512 F is available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scale_avx512(x: &[f32], s: f32, w: &[f32], y: &mut [f32]) {
        scale_body(x, s, w, y);
    }

    /// # Safety
    /// AVX2 is available.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn out_avx2(raw: &[i32], b: i32, s: f32, beta: f32, dst: &mut [f32]) {
        out_body(raw, b, s, beta, dst);
    }

    /// # Safety
    /// AVX-512 F is available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn out_avx512(raw: &[i32], b: i32, s: f32, beta: f32, dst: &mut [f32]) {
        out_body(raw, b, s, beta, dst);
    }
}
