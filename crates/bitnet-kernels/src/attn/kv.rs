//! Reading the cache: its element types widened to f32, and a block of rows.

use half::f16;

use super::{LANES, Q8_BLOCK};

/// A cache storage unit (an f16 or f32 element, an i8 Q8_0 code, or a byte of two Q4_0
/// nibbles): widened to f32 exactly, by any instruction. Rows are addressed in units
/// (`PER` elements each) and read in 16-element chunks.
pub(super) trait KvElem: Copy + Send + Sync {
    /// The element is an IEEE half.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    const HALF: bool;
    /// The element is a code, to be multiplied by its 32-element block's scale.
    const SCALED: bool;
    /// Elements per unit (2 for Q4_0 bytes, else 1).
    const PER: usize = 1;
    /// Element `e` of a row that starts at `row[0]` (for a code, before its scale).
    fn elem(row: &[Self], e: usize) -> f32;
    /// Elements `16c..16c+16` of a row that holds them all, widened: [`Self::elem`] lane by
    /// lane (the plain tiers' chunk).
    #[inline(always)]
    fn whole_chunk(row: &[Self], c: usize) -> [f32; LANES] {
        std::array::from_fn(|x| Self::elem(row, c * LANES + x))
    }
    /// Elements `16c..16c+16` of the row at `row`, widened.
    ///
    /// # Safety
    /// AVX-512 F and F16C are enabled in the caller (this is inlined into it); the row holds
    /// at least `16c + 16` elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn chunk16(row: *const Self, c: usize) -> std::arch::x86_64::__m512;
    /// [`Self::chunk16`] times the chunk's scale `d` (codes only): each lane the exact
    /// product `code · d`, however it is formed.
    ///
    /// # Safety
    /// As [`Self::chunk16`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk16_scaled(row: *const Self, c: usize, d: f32) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::{_mm512_mul_ps, _mm512_set1_ps};
        // SAFETY: the caller's contract.
        unsafe { _mm512_mul_ps(Self::chunk16(row, c), _mm512_set1_ps(d)) }
    }
    /// Elements `16c + 8h..16c + 8h + 8` (`h` 0 or 1) of the row at `row`, widened.
    ///
    /// # Safety
    /// AVX2 and F16C are enabled in the caller; the row holds at least `16c + 16` elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn chunk8(row: *const Self, c: usize, h: usize) -> std::arch::x86_64::__m256;
    /// Both halves of chunk `c`: `[chunk8(row, c, 0), chunk8(row, c, 1)]`.
    ///
    /// # Safety
    /// As [`Self::chunk8`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn halves8(row: *const Self, c: usize) -> [std::arch::x86_64::__m256; 2] {
        // SAFETY: the caller's contract.
        unsafe { [Self::chunk8(row, c, 0), Self::chunk8(row, c, 1)] }
    }
    /// Half `h` of chunks `2b` and `2b + 1` (one 32-element block):
    /// `[chunk8(row, 2b, h), chunk8(row, 2b + 1, h)]`.
    ///
    /// # Safety
    /// As [`Self::chunk8`], with the row holding at least `32b + 32` elements.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn pair8(row: *const Self, b: usize, h: usize) -> [std::arch::x86_64::__m256; 2] {
        // SAFETY: the caller's contract.
        unsafe { [Self::chunk8(row, 2 * b, h), Self::chunk8(row, 2 * b + 1, h)] }
    }
}

impl KvElem for f16 {
    const HALF: bool = true;
    const SCALED: bool = false;
    #[inline(always)]
    fn elem(row: &[Self], e: usize) -> f32 {
        row[e].to_f32()
    }
    /// WebAssembly has no half conversion instruction: sixteen at once in SIMD (the same
    /// values as `elem`'s software conversion; a NaN stays a NaN).
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    #[inline(always)]
    fn whole_chunk(row: &[Self], c: usize) -> [f32; LANES] {
        crate::simd::wasm::f16x16_to_f32(&row.as_chunks::<LANES>().0[c])
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk16(row: *const Self, c: usize) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::{_mm256_loadu_si256, _mm512_cvtph_ps};
        // SAFETY: the caller's contract.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(row.add(c * LANES).cast())) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk8(row: *const Self, c: usize, h: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{_mm256_cvtph_ps, _mm_loadu_si128};
        // SAFETY: the caller's contract.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(row.add(c * LANES + 8 * h).cast())) }
    }
}

impl KvElem for f32 {
    const HALF: bool = false;
    const SCALED: bool = false;
    #[inline(always)]
    fn elem(row: &[Self], e: usize) -> f32 {
        row[e]
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk16(row: *const Self, c: usize) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(row.add(c * LANES)) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk8(row: *const Self, c: usize, h: usize) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(row.add(c * LANES + 8 * h)) }
    }
}

impl KvElem for i8 {
    const HALF: bool = false;
    const SCALED: bool = true;
    #[inline(always)]
    fn elem(row: &[Self], e: usize) -> f32 {
        f32::from(row[e])
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk16(row: *const Self, c: usize) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::{_mm512_cvtepi32_ps, _mm512_cvtepi8_epi32, _mm_loadu_si128};
        // SAFETY: the caller's contract.
        unsafe {
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                row.add(c * LANES).cast(),
            )))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk8(row: *const Self, c: usize, h: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{_mm256_cvtepi32_ps, _mm256_cvtepi8_epi32, _mm_loadl_epi64};
        // SAFETY: the caller's contract (AVX2 enabled in the caller: the AVX2 tier's loops).
        unsafe {
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                row.add(c * LANES + 8 * h).cast(),
            )))
        }
    }
}

/// Q4_0 bytes: element `e` of a row is the low nibble of byte `16(e / 32) + e mod 16` when
/// `e mod 32 < 16`, else its high nibble; its code is the nibble minus 8. Chunk `c` (16
/// elements) is one nibble half of the 16 bytes of block `c / 2`: low for even `c`.
impl KvElem for u8 {
    const HALF: bool = false;
    const SCALED: bool = true;
    const PER: usize = 2;
    #[inline(always)]
    fn elem(row: &[Self], e: usize) -> f32 {
        let b = row[e / 32 * 16 + e % 16];
        let nib = if e % 32 < 16 { b & 15 } else { b >> 4 };
        f32::from(nib) - 8.0
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk16(row: *const Self, c: usize) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract: block c / 2 (16 bytes) lies inside the row.
        unsafe {
            let b = _mm_loadu_si128(row.add(c / 2 * 16).cast());
            let b = if c.is_multiple_of(2) {
                b
            } else {
                _mm_srli_epi16::<4>(b)
            };
            let n = _mm_sub_epi8(_mm_and_si128(b, _mm_set1_epi8(15)), _mm_set1_epi8(8));
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(n))
        }
    }
    /// The 16 products `(n − 8) · d` as a table, looked up by nibble (the permute reads the
    /// low 4 bits of each index): no conversion and no multiply per element.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk16_scaled(row: *const Self, c: usize, d: f32) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract: block c / 2 (16 bytes) lies inside the row.
        unsafe {
            let codes = _mm512_setr_ps(
                -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0,
                7.0,
            );
            let table = _mm512_mul_ps(codes, _mm512_set1_ps(d));
            let w = _mm512_cvtepu8_epi32(_mm_loadu_si128(row.add(c / 2 * 16).cast()));
            let idx = if c.is_multiple_of(2) {
                w
            } else {
                _mm512_srli_epi32::<4>(w)
            };
            _mm512_permutexvar_ps(idx, table)
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk8(row: *const Self, c: usize, h: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract: bytes 8h..8h+8 of block c / 2 lie inside the row.
        unsafe {
            let b = _mm_loadl_epi64(row.add(c / 2 * 16 + 8 * h).cast());
            let b = if c.is_multiple_of(2) {
                b
            } else {
                _mm_srli_epi16::<4>(b)
            };
            let n = _mm_sub_epi8(_mm_and_si128(b, _mm_set1_epi8(15)), _mm_set1_epi8(8));
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(n))
        }
    }
    /// One 16-byte load for both halves.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn halves8(row: *const Self, c: usize) -> [std::arch::x86_64::__m256; 2] {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract: block c / 2 (16 bytes) lies inside the row.
        unsafe {
            let b = _mm_loadu_si128(row.add(c / 2 * 16).cast());
            let b = if c.is_multiple_of(2) {
                b
            } else {
                _mm_srli_epi16::<4>(b)
            };
            let n = _mm_sub_epi8(_mm_and_si128(b, _mm_set1_epi8(15)), _mm_set1_epi8(8));
            [
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(n)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(n))),
            ]
        }
    }
    /// One 8-byte load for both chunks: their elements share bytes (low and high nibbles).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn pair8(row: *const Self, b: usize, h: usize) -> [std::arch::x86_64::__m256; 2] {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract: bytes 8h..8h+8 of block b lie inside the row.
        unsafe {
            let x = _mm_loadl_epi64(row.add(b * 16 + 8 * h).cast());
            let (m, e) = (_mm_set1_epi8(15), _mm_set1_epi8(8));
            let lo = _mm_sub_epi8(_mm_and_si128(x, m), e);
            let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(x), m), e);
            [
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
            ]
        }
    }
}

/// Ask for the cache lines of the `d` elements at element `at` (no effect on results).
#[inline(always)]
pub(super) fn prefetch<T: KvElem>(s: &[T], at: usize, d: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let (at, d) = (at / T::PER, d.div_ceil(T::PER));
        if at + d > s.len() {
            return;
        }
        let ptr: *const u8 = s[at..].as_ptr().cast();
        let bytes = d * std::mem::size_of::<T>();
        let mut off = 0;
        while off < bytes {
            // SAFETY: a prefetch never faults, and `ptr + off` lies inside the row.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(ptr.add(off).cast()) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, at, d);
}

/// The K or V rows of one block: `n ≥ 1` rows of `d` elements, `stride` units apart, from
/// the start of `s` (which ends with the last row); for codes, `sc` holds the scales of the
/// same elements (`sc[e / 32]` for element `e` of `s`; the block starts on a scale boundary).
#[derive(Clone, Copy)]
pub(super) struct Block<'a, T> {
    pub(super) s: &'a [T],
    pub(super) sc: &'a [f32],
    /// Units from one row to the next.
    pub(super) stride: usize,
    pub(super) n: usize,
    /// Elements per row.
    pub(super) d: usize,
}

impl<'a, T: KvElem> Block<'a, T> {
    /// Rows at elements `at`, `at + stride`, … of `all` (with `scales` for codes, else
    /// empty); `at` and `stride` are whole units (the caller checked: multiples of 32 for
    /// codes). Panics when the rows do not fit (the caller checked).
    pub(super) fn new(
        all: &'a [T],
        scales: &'a [f32],
        at: usize,
        stride: usize,
        n: usize,
        d: usize,
    ) -> Block<'a, T> {
        let len = (n - 1) * stride + d;
        let sc = if T::SCALED {
            &scales[at / Q8_BLOCK..(at + len).div_ceil(Q8_BLOCK)]
        } else {
            &[]
        };
        Block {
            s: &all[at / T::PER..(at + len).div_ceil(T::PER)],
            sc,
            stride: stride / T::PER,
            n,
            d,
        }
    }

    /// Ask for row `jj`'s cache lines, if the block has that row (no effect on results).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only the x86 tiers prefetch
    #[inline(always)]
    pub(super) fn prefetch_row(&self, jj: usize) {
        if jj < self.n {
            prefetch(self.s, jj * self.stride * T::PER, self.d);
        }
    }

    /// Row `jj`'s units.
    pub(super) fn row(&self, jj: usize) -> &'a [T] {
        &self.s[jj * self.stride..][..self.d.div_ceil(T::PER)]
    }

    /// The scale of lanes `16c..16c+16` of row `jj` (codes only).
    #[inline(always)]
    pub(super) fn scale(&self, jj: usize, c: usize) -> f32 {
        self.sc[(jj * self.stride * T::PER + c * LANES) / Q8_BLOCK]
    }

    /// Where row `jj`'s scales start: lanes `16c..` use element `c / 2` (codes only).
    ///
    /// # Safety
    /// `T::SCALED` and `jj < n`; reads through the pointer stay below `d / 16` chunks.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) unsafe fn scales_of(&self, jj: usize) -> *const f32 {
        // SAFETY: row jj starts at element jj·stride·PER (a multiple of 32) inside `s`, so
        // its first scale is inside `sc`.
        unsafe { self.sc.as_ptr().add(jj * self.stride * T::PER / Q8_BLOCK) }
    }

    /// Lanes `16c..16c+16` of row `jj` as values, zero past the row's end (the plain way).
    #[inline(always)]
    pub(super) fn chunk(&self, jj: usize, c: usize) -> [f32; LANES] {
        let r = self.row(jj);
        let lo = c * LANES;
        let hi = (lo + LANES).min(self.d);
        let mut out = [0f32; LANES];
        if hi - lo == LANES {
            out = T::whole_chunk(r, c);
        } else {
            for (o, e) in out.iter_mut().zip(lo..hi) {
                *o = T::elem(r, e);
            }
        }
        if T::SCALED {
            // An exact product: a code of at most 8 bits times a half's 11-bit significand.
            let d = self.scale(jj, c);
            for o in &mut out {
                *o *= d;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every half, in every lane of a chunk: the chunk conversion (SIMD on WebAssembly) gives
    /// `elem`'s value, bit for bit (any NaN for a NaN).
    #[test]
    fn whole_chunks_widen_every_half_exactly() {
        let row: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        for shift in [0usize, 5] {
            let row = &row[shift..];
            for c in 0..row.len() / LANES {
                let got = f16::whole_chunk(row, c);
                for (x, g) in got.iter().enumerate() {
                    let want = f16::elem(row, c * LANES + x);
                    assert!(
                        g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                        "half {:#06x}: {g} vs {want}",
                        row[c * LANES + x].to_bits()
                    );
                }
            }
        }
    }
}
