//! Element-wise float steps over rows, on the widest vectors the selected tier has: the
//! weighted scaling of RMSNorm ([`scale_row`]) and the float epilogue of the integer GEMM
//! (`panel_out`: `y = ((T − Σq) as f32 / s) · β`).
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The plain bodies compiled with wider vectors enabled.

    use super::{out_body, scale_body};

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
