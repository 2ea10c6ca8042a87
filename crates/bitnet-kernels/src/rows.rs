//! Row formats for the embedding and the (tied) LM head: F32, F16, BF16, Q8_0, Q6_K, Q4_0.
//!
//! ```text
//! F32   4 bytes/elem LE             F16 / BF16   2 bytes/elem LE
//! Q8_0  block of 32 = 34 bytes: d: f16 | qs: [i8; 32]                 w = d·q
//! Q4_0  block of 32 = 18 bytes: d: f16 | qs: [u8; 16]                 w = d·(nibble − 8)
//!       byte j: low nibble → element j, high nibble → element j+16
//! Q6_K  block of 256 = 210 bytes: ql[128] | qh[64] | scales: [i8; 16] | d: f16
//!       per half n (128 elements; ql += 64, qh += 32, scales += 8 per half), l = 0..32:
//!         q(l)    = (ql[l]    & 15) | ((qh[l] >> 0) & 3) << 4     scale index l/16
//!         q(l+32) = (ql[l+32] & 15) | ((qh[l] >> 2) & 3) << 4     scale index l/16 + 2
//!         q(l+64) = (ql[l]    >> 4) | ((qh[l] >> 4) & 3) << 4     scale index l/16 + 4
//!         q(l+96) = (ql[l+32] >> 4) | ((qh[l] >> 6) & 3) << 4     scale index l/16 + 6
//!       w = (d · scale) · (q − 32)
//! ```
//! Dots with f32 activations use fixed accumulation orders (see `simd::scalar`), reproduced
//! exactly by every SIMD tier.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::OnceLock;

use crate::dispatch::{kernels, kernels_for};
use crate::layout::read_f16;
use crate::pool::Pool;
use crate::tier::{Isa, Kernels, RowDot, RowDotQ8, RowDotQ8Multi};
use crate::KernelError;

pub use crate::formats::RowType;

impl RowType {
    /// The ggml type id of this format.
    pub const fn ggml_type(self) -> u32 {
        match self {
            RowType::F32 => 0,
            RowType::F16 => 1,
            RowType::Q4_0 => 2,
            RowType::Q8_0 => 8,
            RowType::Q6K => 14,
            RowType::BF16 => 30,
        }
    }

    /// The row format of a ggml type id, if it is one of ours.
    pub const fn from_ggml_type(id: u32) -> Option<RowType> {
        match id {
            0 => Some(RowType::F32),
            1 => Some(RowType::F16),
            2 => Some(RowType::Q4_0),
            8 => Some(RowType::Q8_0),
            14 => Some(RowType::Q6K),
            30 => Some(RowType::BF16),
            _ => None,
        }
    }

    /// Elements per block.
    pub const fn block_elems(self) -> usize {
        match self {
            RowType::F32 | RowType::F16 | RowType::BF16 => 1,
            RowType::Q8_0 | RowType::Q4_0 => 32,
            RowType::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            RowType::F32 => 4,
            RowType::F16 | RowType::BF16 => 2,
            RowType::Q8_0 => 34,
            RowType::Q4_0 => 18,
            RowType::Q6K => 210,
        }
    }

    /// Bytes of one row of `cols` elements (cols must be a multiple of the block).
    pub fn row_bytes(self, cols: usize) -> Result<usize, KernelError> {
        let be = self.block_elems();
        if !cols.is_multiple_of(be) {
            return Err(KernelError::ShapeMismatch {
                what: "row length (multiple of the block size)",
                expected: be,
                got: cols,
            });
        }
        (cols / be)
            .checked_mul(self.block_bytes())
            .ok_or(KernelError::Overflow { what: "row bytes" })
    }
}

/// ggml Q8_0 block.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: half::f16,
    /// Quants.
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// ggml Q4_0 block.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: half::f16,
    /// Nibbles: low → element j, high → element j+16.
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

/// ggml Q6_K block.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits.
    pub ql: [u8; 128],
    /// High 2 bits.
    pub qh: [u8; 64],
    /// Sub-block scales (16 elements each).
    pub scales: [i8; 16],
    /// Super-block scale.
    pub d: half::f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

/// Accumulation order of an F16 row dot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum F16DotOrder {
    /// One token: ggml_vec_dot_f16 order; n ≥ 2 tokens: tinyBLAS order (what bitnet.cpp does).
    Auto,
    /// ggml_vec_dot_f16 (4×8 lanes over chunks of 32).
    Ggml,
    /// llamafile tinyBLAS (one 8-lane accumulator).
    Lanes8,
}

/// A `rows × cols` matrix in a row format (embedding / LM head), borrowed or owned.
#[derive(Debug, Clone)]
pub struct RowMatrix<'a> {
    ty: RowType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    /// `rows × row_bytes` bytes.
    data: Cow<'a, [u8]>,
    /// F16: whether every half is finite, found on first use by the tiers that ask
    /// ([`Kernels::f16_fast_rows`]).
    finite: OnceLock<bool>,
}

impl<'a> RowMatrix<'a> {
    /// Wrap `data` (exactly `rows × row_bytes(cols)` bytes).
    pub fn new(
        ty: RowType,
        rows: usize,
        cols: usize,
        data: Cow<'a, [u8]>,
    ) -> Result<Self, KernelError> {
        let row_bytes = ty.row_bytes(cols)?;
        let expected = rows.checked_mul(row_bytes).ok_or(KernelError::Overflow {
            what: "matrix bytes",
        })?;
        if data.len() != expected {
            return Err(KernelError::ShapeMismatch {
                what: "row matrix bytes",
                expected,
                got: data.len(),
            });
        }
        Ok(RowMatrix {
            ty,
            rows,
            cols,
            row_bytes,
            data,
            finite: OnceLock::new(),
        })
    }

    /// The format.
    pub fn row_type(&self) -> RowType {
        self.ty
    }
    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Total bytes.
    pub fn nbytes(&self) -> usize {
        self.data.len()
    }
    /// The raw bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    fn row(&self, r: usize) -> &[u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// An F16 matrix: whether none of its halves is infinite or NaN (one pass, on first use).
    fn halves_finite(&self) -> bool {
        *self.finite.get_or_init(|| {
            self.data.chunks(1 << 16).all(|c| {
                // |h| below 0x7c00 (exponent 31): the max over a chunk vectorizes.
                let big = c.chunks_exact(2).fold(0u16, |m, b| {
                    m.max(u16::from_le_bytes([b[0], b[1]]) & 0x7fff)
                });
                big < 0x7c00
            })
        })
    }

    /// Dequantize row `r` (embedding lookup) into `out` (length `cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), KernelError> {
        if r >= self.rows {
            return Err(KernelError::RowOutOfRange {
                row: r,
                rows: self.rows,
            });
        }
        if out.len() != self.cols {
            return Err(KernelError::ShapeMismatch {
                what: "dequantize_row out",
                expected: self.cols,
                got: out.len(),
            });
        }
        dequantize_row_bytes(self.ty, self.row(r), out);
        Ok(())
    }

    /// `out[t·rows + r] = dot(row r, x[t·cols..])` for `n_tok = x.len() / cols` tokens,
    /// F16 in [`F16DotOrder::Auto`] order.
    pub fn matmul_f32(&self, x: &[f32], out: &mut [f32], pool: &Pool) -> Result<(), KernelError> {
        self.matmul_f32_with(kernels(), x, out, pool, F16DotOrder::Auto, false)
    }

    /// [`Self::matmul_f32`] with an explicit F16 accumulation order.
    pub fn matmul_f32_order(
        &self,
        x: &[f32],
        out: &mut [f32],
        pool: &Pool,
        order: F16DotOrder,
    ) -> Result<(), KernelError> {
        self.matmul_f32_with(kernels(), x, out, pool, order, false)
    }

    /// [`Self::matmul_f32_order`] on a chosen tier (tests, benchmarks); `None` if unsupported.
    pub fn matmul_f32_on(
        &self,
        isa: Isa,
        x: &[f32],
        out: &mut [f32],
        pool: &Pool,
        order: F16DotOrder,
    ) -> Option<Result<(), KernelError>> {
        kernels_for(isa).map(|k| self.matmul_f32_with(k, x, out, pool, order, false))
    }

    /// Like [`Self::matmul_f32`], but for Q8_0 and Q4_0 rows the activations are first
    /// quantized per 32 to Q8_0 (the same quantizer as [`quantize_row_into`]) and every block
    /// is dotted in integers, scaled by `d_w·d_x` — llama.cpp's CPU scheme for these types.
    /// Faster than the f32-activation dot (the 128256×2560 head: 16.8 against 12.4 GB/s at
    /// 2 threads, the matvec bench), at the cost of the activations' own rounding error. Other row types, or `cols` not a multiple of 32, behave as
    /// [`Self::matmul_f32_order`] with [`F16DotOrder::Ggml`] for any token count, so every
    /// output depends only on its own row and token, never on how many tokens share the
    /// call (batched sequences get the logits they would get alone).
    pub fn matmul_q8(&self, x: &[f32], out: &mut [f32], pool: &Pool) -> Result<(), KernelError> {
        self.matmul_f32_with(kernels(), x, out, pool, F16DotOrder::Ggml, true)
    }

    /// [`Self::matmul_q8`] on a chosen tier (tests, benchmarks); `None` if unsupported.
    pub fn matmul_q8_on(
        &self,
        isa: Isa,
        x: &[f32],
        out: &mut [f32],
        pool: &Pool,
    ) -> Option<Result<(), KernelError>> {
        kernels_for(isa).map(|k| self.matmul_f32_with(k, x, out, pool, F16DotOrder::Ggml, true))
    }

    /// One token's dots with selected rows: `out[i] = dot(row ids[i], x)`, each exactly the
    /// value [`Self::matmul_q8`] gives for that row and token (the same kernels in the same
    /// order), threaded over `ids`. The approximate LM head computes only its candidates'
    /// logits with it.
    pub fn matmul_q8_rows(
        &self,
        ids: &[u32],
        x: &[f32],
        out: &mut [f32],
        pool: &Pool,
    ) -> Result<(), KernelError> {
        self.matmul_q8_rows_with(kernels(), ids, x, out, pool)
    }

    /// [`Self::matmul_q8_rows`] on a chosen tier (tests, benchmarks); `None` if unsupported.
    pub fn matmul_q8_rows_on(
        &self,
        isa: Isa,
        ids: &[u32],
        x: &[f32],
        out: &mut [f32],
        pool: &Pool,
    ) -> Option<Result<(), KernelError>> {
        kernels_for(isa).map(|k| self.matmul_q8_rows_with(k, ids, x, out, pool))
    }

    fn matmul_q8_rows_with(
        &self,
        kern: &Kernels,
        ids: &[u32],
        x: &[f32],
        out: &mut [f32],
        pool: &Pool,
    ) -> Result<(), KernelError> {
        if x.len() != self.cols {
            return Err(KernelError::ShapeMismatch {
                what: "x (one token)",
                expected: self.cols,
                got: x.len(),
            });
        }
        if out.len() != ids.len() {
            return Err(KernelError::ShapeMismatch {
                what: "out (one per id)",
                expected: ids.len(),
                got: out.len(),
            });
        }
        if let Some(&bad) = ids.iter().find(|&&r| r as usize >= self.rows) {
            return Err(KernelError::RowOutOfRange {
                row: bad as usize,
                rows: self.rows,
            });
        }
        if ids.is_empty() {
            return Ok(());
        }
        let cols = self.cols;
        let int_dot = int_dots(kern, self.ty)
            .map(|(dot, _)| dot)
            .filter(|_| cols.is_multiple_of(32));
        let act = match int_dot {
            Some(_) => Some(quantize_q8_act(x, cols)?),
            None => None,
        };
        // The same 64-byte alignment as the full matmul gives its float activations.
        let aligned = AlignedRows::new(x, cols);
        let xa = &aligned.as_slice()[..cols];
        let direct = direct_dot(kern, self.ty, F16DotOrder::Ggml, true);
        let outp = crate::pool::SharedMut::new(out);
        let f = |range: Range<usize>| {
            let mut buf = Vec::new();
            for i in range {
                // Checked above: every id is a row.
                let row = self.row(ids[i] as usize);
                let y = match (int_dot, &act, direct) {
                    (Some(dot), Some((xq, xd)), _) => dot(row, xq, xd),
                    (_, _, Some(d)) => d(row, xa),
                    _ => {
                        buf.resize(cols, 0.0);
                        dequantize_row_bytes(self.ty, row, &mut buf);
                        (kern.f32_dot)(&buf, xa)
                    }
                };
                // SAFETY: i < ids.len() = out.len(); the ranges are disjoint between chunks.
                unsafe { outp.write(i, y) };
            }
        };
        pool.for_rows(ids.len(), 64, &f);
        Ok(())
    }

    fn matmul_f32_with(
        &self,
        kern: &Kernels,
        x: &[f32],
        out: &mut [f32],
        pool: &Pool,
        order: F16DotOrder,
        q8_act: bool,
    ) -> Result<(), KernelError> {
        if self.cols == 0 || !x.len().is_multiple_of(self.cols) {
            return Err(KernelError::ShapeMismatch {
                what: "x (a multiple of cols)",
                expected: self.cols,
                got: x.len(),
            });
        }
        let n_tok = x.len() / self.cols;
        let ny = n_tok
            .checked_mul(self.rows)
            .ok_or(KernelError::Overflow { what: "n_tok*rows" })?;
        if out.len() != ny {
            return Err(KernelError::ShapeMismatch {
                what: "out",
                expected: ny,
                got: out.len(),
            });
        }
        if ny == 0 {
            return Ok(());
        }
        let order = match order {
            F16DotOrder::Auto if n_tok == 1 => F16DotOrder::Ggml,
            F16DotOrder::Auto => F16DotOrder::Lanes8,
            o => o,
        };
        let cols = self.cols;
        // Float rows read every token's activations once per weight row: give each token's
        // row a 64-byte boundary, so 512-bit loads never straddle two cache lines (measured:
        // the 4-token F16 head takes ~1.6× longer with activations 4 bytes off).
        let aligned;
        let (xa, xstride): (&[f32], usize) = if matches!(self.ty, RowType::F16 | RowType::BF16) {
            aligned = AlignedRows::new(x, cols);
            (aligned.as_slice(), aligned.stride)
        } else {
            (x, cols)
        };
        let token = |t: usize| &xa[t * xstride..t * xstride + cols];
        let int_dot = int_dots(kern, self.ty).filter(|_| q8_act && cols.is_multiple_of(32));
        // Row kernels that take every token at once: `g(rows, y)` writes y[(r − start)·n_tok + t]
        // for the rows of the range and all tokens.
        type AllTokens<'g> = Box<dyn Fn(Range<usize>, &mut [f32]) + Sync + 'g>;
        let all_tokens: Option<AllTokens<'_>> = if let Some((dot, multi)) = int_dot {
            let (xq, xd) = quantize_q8_act(x, cols)?;
            let nb = cols / 32;
            Some(Box::new(move |rows: Range<usize>, y: &mut [f32]| {
                for (r, yr) in rows.zip(y.chunks_exact_mut(n_tok)) {
                    let row = self.row(r);
                    if n_tok == 1 {
                        yr[0] = dot(row, &xq, &xd[..nb]);
                    } else {
                        multi(row, &xq, &xd, cols, yr);
                    }
                }
            }))
        } else if self.ty == RowType::F16 && order == F16DotOrder::Ggml && n_tok > 1 {
            // Each row read once for all tokens, each F16 chunk converted once.
            let xs: Vec<&[f32]> = (0..n_tok).map(token).collect();
            let rb = self.row_bytes;
            let multi = if q8_act {
                kern.f16_dot_fast_multi
            } else {
                kern.f16_dot_ggml_multi
            };
            Some(Box::new(move |rows: Range<usize>, y: &mut [f32]| {
                let bytes = &self.data[rows.start * rb..rows.end * rb];
                multi(bytes, rb, &xs, y);
            }))
        } else {
            None
        };
        if let Some(g) = all_tokens {
            let outp = crate::pool::SharedMut::new(out);
            let f = |rows: Range<usize>| {
                let mut y = vec![0f32; ALL_TOKENS_ROWS * n_tok];
                let mut r0 = rows.start;
                while r0 < rows.end {
                    let r1 = (r0 + ALL_TOKENS_ROWS).min(rows.end);
                    let y = &mut y[..(r1 - r0) * n_tok];
                    g(r0..r1, y);
                    for (r, yr) in (r0..r1).zip(y.chunks_exact(n_tok)) {
                        for (t, &v) in yr.iter().enumerate() {
                            // SAFETY: t < n_tok, r < rows; rows are disjoint between chunks.
                            unsafe { outp.write(t * self.rows + r, v) };
                        }
                    }
                    r0 = r1;
                }
            };
            pool.for_rows(self.rows, 16, &f);
            return Ok(());
        }
        let outp = crate::pool::SharedMut::new(out);
        if let (Some(fast_rows), true, RowType::F16, F16DotOrder::Ggml) =
            (kern.f16_fast_rows, q8_act && n_tok == 1, self.ty, order)
        {
            let finite = self.halves_finite();
            let xt = token(0);
            let f = |rows: Range<usize>| {
                let bytes = &self.data[rows.start * self.row_bytes..rows.end * self.row_bytes];
                // SAFETY: rows ⊆ 0..self.rows = out.len() (one token); rows are disjoint
                // between chunks, and `out` outlives `for_rows`.
                let y = unsafe { outp.slice_mut(rows) };
                fast_rows(bytes, self.row_bytes, xt, finite, y);
            };
            pool.for_rows(self.rows, 16, &f);
            return Ok(());
        }
        let direct = direct_dot(kern, self.ty, order, q8_act);
        let f = |rows: Range<usize>| {
            let mut buf = Vec::new();
            for r in rows {
                let row = self.row(r);
                if direct.is_none() {
                    buf.resize(cols, 0.0);
                    dequantize_row_bytes(self.ty, row, &mut buf);
                }
                for t in 0..n_tok {
                    let xt = token(t);
                    let y = match direct {
                        Some(d) => d(row, xt),
                        None => (kern.f32_dot)(&buf, xt),
                    };
                    // SAFETY: t < n_tok, r < rows; rows are disjoint between chunks.
                    unsafe { outp.write(t * self.rows + r, y) };
                }
            }
        };
        pool.for_rows(self.rows, 16, &f);
        Ok(())
    }

    /// Re-encode `src` into `ty` (e.g. a Q8_0 LM head from the F16 embedding), rows in parallel.
    /// Quantizers follow ggml's reference ones (Q8_0: round half away from zero of x/d with
    /// d = absmax/127; Q4_0: d = −max/8; Q6_K: per-16 scale search, `make_qx_quants`).
    pub fn quantize_from(
        src: &RowMatrix<'_>,
        ty: RowType,
        pool: &Pool,
    ) -> Result<RowMatrix<'static>, KernelError> {
        Self::quantize_from_releasing(src, ty, pool, &|_| {})
    }

    /// [`Self::quantize_from`], handing each run of at most [`RELEASE_ROWS`] source rows to
    /// `release` once they are converted (in no particular order across threads), so a caller
    /// whose source is memory-mapped can drop those pages as it goes and the source is never
    /// resident in full beside the result.
    pub fn quantize_from_releasing(
        src: &RowMatrix<'_>,
        ty: RowType,
        pool: &Pool,
        release: &(dyn Fn(&[u8]) + Sync),
    ) -> Result<RowMatrix<'static>, KernelError> {
        let row_bytes = ty.row_bytes(src.cols)?;
        let total = src
            .rows
            .checked_mul(row_bytes)
            .ok_or(KernelError::Overflow {
                what: "matrix bytes",
            })?;
        let mut data = vec![0u8; total];
        let dst = crate::pool::SharedMut::new(&mut data);
        let f = |rows: Range<usize>| {
            let mut buf = vec![0f32; src.cols];
            let mut start = rows.start;
            while start < rows.end {
                let end = (start + RELEASE_ROWS).min(rows.end);
                for r in start..end {
                    dequantize_row_bytes(src.ty, src.row(r), &mut buf);
                    // SAFETY: row r's byte range is written only by the chunk holding r.
                    let out = unsafe { dst.slice_mut(r * row_bytes..(r + 1) * row_bytes) };
                    quantize_row_into(ty, &buf, out);
                }
                release(&src.data[start * src.row_bytes..end * src.row_bytes]);
                start = end;
            }
        };
        pool.for_rows(src.rows, 16, &f);
        RowMatrix::new(ty, src.rows, src.cols, Cow::Owned(data))
    }
}

/// Source rows per call of the `release` hook of [`RowMatrix::quantize_from_releasing`]
/// (1.3 MB of a 2560-wide F16 matrix).
pub const RELEASE_ROWS: usize = 256;

/// A copy of `n` rows of activations, each starting on a 64-byte boundary (`stride` floats
/// apart, `cols` rounded up to 16).
struct AlignedRows {
    buf: crate::aligned::AlignedBuf<f32>,
    stride: usize,
}

impl AlignedRows {
    fn new(x: &[f32], cols: usize) -> Self {
        let stride = cols.next_multiple_of(16);
        let n = x.len().checked_div(cols).unwrap_or(0);
        let mut buf = crate::aligned::AlignedBuf::zeroed(n * stride);
        for (dst, src) in buf
            .chunks_exact_mut(stride.max(1))
            .zip(x.chunks_exact(cols.max(1)))
        {
            dst[..cols].copy_from_slice(src);
        }
        AlignedRows { buf, stride }
    }

    fn as_slice(&self) -> &[f32] {
        &self.buf
    }
}

/// Rows handed at once to a kernel that takes every token (the F16 multi-token kernels block
/// them further).
const ALL_TOKENS_ROWS: usize = 16;

/// The index of the first NaN or infinite value of `v`.
pub fn first_non_finite(v: &[f32]) -> Option<usize> {
    const EXP: u32 = 0x7f80_0000;
    // All exponent bits set: NaN or ±∞. A branch-free pass first (it vectorizes); the
    // position only when there is one.
    let hit = v.iter().fold(false, |a, x| a | (x.to_bits() & EXP == EXP));
    hit.then(|| v.iter().position(|x| !x.is_finite())).flatten()
}

/// The index of the first value that decodes to NaN or ±∞ among the whole values (or, for
/// the block types, whole blocks) in `bytes` of a row of `ty`. For F32, F16 and BF16 that is
/// a value with all exponent bits set: a branch-free pass first (it vectorizes), the
/// position only on a hit. A Q8_0, Q4_0 or Q6_K block decodes every value as a product with
/// its f16 scale `d`, so a NaN or infinite `d` makes all of them NaN or infinite (∞ · 0 is
/// NaN): the index is that block's first value. (Q6_K's other scales are integers.)
pub fn first_non_finite_value(ty: RowType, bytes: &[u8]) -> Option<usize> {
    match ty {
        RowType::F32 => {
            let bits = |c: &[u8]| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x7f80_0000;
            let hit = bytes
                .chunks_exact(4)
                .fold(false, |a, c| a | (bits(c) == 0x7f80_0000));
            hit.then(|| bytes.chunks_exact(4).position(|c| bits(c) == 0x7f80_0000))
                .flatten()
        }
        RowType::F16 | RowType::BF16 => {
            let exp: u16 = if ty == RowType::F16 { 0x7c00 } else { 0x7f80 };
            let bits = |c: &[u8]| u16::from_le_bytes([c[0], c[1]]) & exp;
            let hit = bytes
                .chunks_exact(2)
                .fold(false, |a, c| a | (bits(c) == exp));
            hit.then(|| bytes.chunks_exact(2).position(|c| bits(c) == exp))
                .flatten()
        }
        RowType::Q8_0 | RowType::Q6K | RowType::Q4_0 => {
            let at = if ty == RowType::Q6K { 208 } else { 0 };
            let bad = |b: &[u8]| u16::from_le_bytes([b[at], b[at + 1]]) & 0x7c00 == 0x7c00;
            bytes
                .chunks_exact(ty.block_bytes())
                .position(bad)
                .map(|i| i * ty.block_elems())
        }
    }
}

/// Dequantize one encoded row (`out.len()` elements; `row` must hold them).
pub fn dequantize_row_bytes(ty: RowType, row: &[u8], out: &mut [f32]) {
    match ty {
        RowType::F32 => {
            for (o, c) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        RowType::F16 => {
            for (o, c) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        RowType::BF16 => {
            for (o, c) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        RowType::Q8_0 => {
            for (ob, b) in out.chunks_exact_mut(32).zip(row.chunks_exact(34)) {
                let d = read_f16(b, 0);
                for (o, &q) in ob.iter_mut().zip(&b[2..34]) {
                    *o = d * f32::from(i8::from_le_bytes([q]));
                }
            }
        }
        RowType::Q4_0 => {
            for (ob, b) in out.chunks_exact_mut(32).zip(row.chunks_exact(18)) {
                let d = read_f16(b, 0);
                for j in 0..16 {
                    let q = b[2 + j];
                    ob[j] = d * (f32::from(q & 15) - 8.0);
                    ob[j + 16] = d * (f32::from(q >> 4) - 8.0);
                }
            }
        }
        RowType::Q6K => {
            for (ob, b) in out.chunks_exact_mut(256).zip(row.chunks_exact(210)) {
                let d = read_f16(b, 208);
                for half in 0..2 {
                    let ql = &b[64 * half..64 * half + 64];
                    let qh = &b[128 + 32 * half..128 + 32 * half + 32];
                    let sc = &b[192 + 8 * half..192 + 8 * half + 8];
                    let y = &mut ob[128 * half..128 * half + 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let q = [
                            (ql[l] & 15) | ((qh[l] & 3) << 4),
                            (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4),
                            (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                            (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                        ];
                        for (g, &qv) in q.iter().enumerate() {
                            let s = f32::from(i8::from_le_bytes([sc[is + 2 * g]]));
                            y[l + 32 * g] = (d * s) * (f32::from(qv) - 32.0);
                        }
                    }
                }
            }
        }
    }
}

/// The per-row float dot of a row type (F16 in the given order; `fast`: fast numerics'
/// dot of that order); `None`: the row is dequantized and dotted with `f32_dot`.
fn direct_dot(kern: &Kernels, ty: RowType, order: F16DotOrder, fast: bool) -> Option<RowDot> {
    match (ty, order) {
        (RowType::F16, F16DotOrder::Ggml) if fast => Some(kern.f16_dot_fast),
        (RowType::F16, F16DotOrder::Ggml) => Some(kern.f16_dot_ggml),
        (RowType::F16, _) => Some(kern.f16_dot_tiny),
        (RowType::Q8_0, _) => Some(kern.q8_0_dot),
        (RowType::Q4_0, _) => Some(kern.q4_0_dot),
        (RowType::BF16, _) => Some(kern.bf16_dot),
        _ => None,
    }
}

/// The integer dots (one token, several tokens) of a row type against Q8_0-quantized
/// activations; `None` for the float-only types.
fn int_dots(kern: &Kernels, ty: RowType) -> Option<(RowDotQ8, RowDotQ8Multi)> {
    match ty {
        RowType::Q8_0 => Some((kern.q8_0_q8, kern.q8_0_q8_multi)),
        RowType::Q4_0 => Some((kern.q4_0_q8, kern.q4_0_q8_multi)),
        _ => None,
    }
}

/// Activations for the integer Q8_0 / Q4_0 dots: each `cols`-long token row encoded with
/// [`quantize_q8_0_split`]: codes (`cols` per token) and scales (`cols/32` per token).
/// `cols % 32 == 0`.
fn quantize_q8_act(x: &[f32], cols: usize) -> Result<(Vec<i8>, Vec<f32>), KernelError> {
    RowType::Q8_0.row_bytes(cols)?;
    let x = &x[..x.len() / cols.max(1) * cols];
    let mut q = vec![0i8; x.len()];
    let mut d = vec![0f32; x.len() / 32];
    quantize_q8_0_split(x, &mut q, &mut d)?;
    Ok((q, d))
}

/// Encode `x` (a multiple of 32 long) with the Q8_0 quantizer of [`quantize_row_into`], split
/// into codes (`q`, one per value) and scales (`d`, each block's f16 scale widened to f32):
/// value `i` decodes as `q[i] · d[i / 32]`. Activations of the integer dots and the Q8_0 KV
/// cache use it.
pub fn quantize_q8_0_split(x: &[f32], q: &mut [i8], d: &mut [f32]) -> Result<(), KernelError> {
    if !x.len().is_multiple_of(32) || q.len() != x.len() || d.len() != x.len() / 32 {
        return Err(KernelError::ShapeMismatch {
            what: "Q8_0 codes and scales",
            expected: x.len().next_multiple_of(32),
            got: q.len(),
        });
    }
    split_blocks(RowType::Q8_0, x, q, 32, d, |codes, out| {
        for (o, &b) in out.iter_mut().zip(codes) {
            *o = i8::from_le_bytes([b]);
        }
    });
    Ok(())
}

/// Quantize `x` block by block (32 values) with `ty`'s quantizer (a block of an f16 scale and
/// its code bytes): each scale, widened, into `d`; each block's code bytes handed to `put`
/// with that block's `per_block` elements of `q`. Shapes are the callers' to check.
fn split_blocks<Q>(
    ty: RowType,
    x: &[f32],
    q: &mut [Q],
    per_block: usize,
    d: &mut [f32],
    put: impl Fn(&[u8], &mut [Q]),
) {
    let mut blk = [0u8; 34];
    let bytes = ty.block_bytes();
    for ((xb, qb), db) in x
        .chunks_exact(32)
        .zip(q.chunks_exact_mut(per_block))
        .zip(d.iter_mut())
    {
        quantize_row_into(ty, xb, &mut blk[..bytes]);
        *db = read_f16(&blk, 0);
        put(&blk[2..bytes], qb);
    }
}

/// Encode `x` (a multiple of 32 long) with the Q4_0 quantizer of [`quantize_row_into`], split
/// into nibbles (`q`, 16 bytes per block in ggml's order: byte `j` of block `b` holds element
/// `32b + j` low and `32b + j + 16` high) and scales (`d`, each block's f16 scale widened to
/// f32): element `i` decodes as `(nibble − 8) · d[i / 32]`. The Q4_0 KV cache uses it.
pub fn quantize_q4_0_split(x: &[f32], q: &mut [u8], d: &mut [f32]) -> Result<(), KernelError> {
    if !x.len().is_multiple_of(32) || q.len() * 2 != x.len() || d.len() != x.len() / 32 {
        return Err(KernelError::ShapeMismatch {
            what: "Q4_0 nibbles and scales",
            expected: x.len().next_multiple_of(32) / 2,
            got: q.len(),
        });
    }
    split_blocks(RowType::Q4_0, x, q, 16, d, |codes, out| {
        out.copy_from_slice(codes)
    });
    Ok(())
}

/// Encode one f32 row into `ty` (`out.len()` = the row's bytes).
pub fn quantize_row_into(ty: RowType, x: &[f32], out: &mut [u8]) {
    match ty {
        RowType::F32 => {
            for (c, v) in out.chunks_exact_mut(4).zip(x) {
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        RowType::F16 => {
            for (c, v) in out.chunks_exact_mut(2).zip(x) {
                c.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
            }
        }
        RowType::BF16 => {
            for (c, v) in out.chunks_exact_mut(2).zip(x) {
                c.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes());
            }
        }
        RowType::Q8_0 => {
            for (b, xb) in out.chunks_exact_mut(34).zip(x.chunks_exact(32)) {
                // The maximum keeps a NaN (`f32::max` would pass over it), so a block with
                // one gets a NaN scale and codes of 0: the values it decodes to are NaN, not
                // finite numbers the NaN was quantized away into.
                let amax = xb.iter().fold(0f32, |m, v| {
                    let a = v.abs();
                    if a > m || a.is_nan() {
                        a
                    } else {
                        m
                    }
                });
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                b[0..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
                for (o, v) in b[2..].iter_mut().zip(xb) {
                    *o = i8_bits(v * id);
                }
            }
        }
        RowType::Q4_0 => {
            for (b, xb) in out.chunks_exact_mut(18).zip(x.chunks_exact(32)) {
                let mut amax = 0f32;
                let mut max = 0f32;
                for &v in xb {
                    // As in Q8_0, a NaN is kept as the maximum: its scale is NaN (the
                    // nibbles are 0, decoding to NaN).
                    if amax < v.abs() || v.is_nan() {
                        amax = v.abs();
                        max = v;
                    }
                }
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                b[0..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
                for j in 0..16 {
                    let lo = nibble(xb[j] * id + 8.5);
                    let hi = nibble(xb[j + 16] * id + 8.5);
                    b[2 + j] = lo | (hi << 4);
                }
            }
        }
        RowType::Q6K => {
            for (b, xb) in out.chunks_exact_mut(210).zip(x.chunks_exact(256)) {
                quantize_block_q6k(xb, b);
            }
        }
    }
}

/// `round half away from zero`, clamped to i8, as a byte.
fn i8_bits(v: f32) -> u8 {
    let r = v.round().clamp(-128.0, 127.0);
    // In range after the clamp.
    #[allow(clippy::cast_possible_truncation)]
    let q = r as i8;
    q.to_le_bytes()[0]
}

/// `min(15, trunc(v))` for v ≥ 0 (ggml Q4_0 reference), as a nibble.
fn nibble(v: f32) -> u8 {
    let t = v.trunc().clamp(0.0, 15.0);
    // In 0..=15 after the clamp.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let q = t as u8;
    q
}

/// Round half to even (ggml `nearest_int` for |v| < 2^22).
fn nearest_int(v: f32) -> i32 {
    let r = v.round_ties_even().clamp(-4_194_304.0, 4_194_304.0);
    // In range after the clamp.
    #[allow(clippy::cast_possible_truncation)]
    let q = r as i32;
    q
}

/// Scale search for `n` values into integers in `[−nmax, nmax−1]` weighted by x² (ggml's
/// `make_qx_quants` with rmse_type 1); writes `l + nmax` into `levels` and returns the scale.
fn make_qx_quants(x: &[f32], nmax: i32, levels: &mut [u8]) -> f32 {
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < 1e-15 {
        levels.fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let quant = |iscale: f32, levels: Option<&mut [u8]>| {
        let mut sumlx = 0f32;
        let mut suml2 = 0f32;
        let mut lv = levels;
        for (i, &v) in x.iter().enumerate() {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            if let Some(lv) = lv.as_deref_mut() {
                lv[i] = u8::try_from(l + nmax).unwrap_or(0);
            }
            let w = v * v;
            let lf = l as f32;
            sumlx += w * v * lf;
            suml2 += w * lf * lf;
        }
        (sumlx, suml2)
    };
    let iscale = -nmaxf / max;
    let (sumlx, suml2) = quant(iscale, Some(levels));
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmaxf + 0.1 * is as f32) / max;
        let (sumlx, suml2) = quant(iscale, None);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            quant(iscale, Some(levels));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

fn quantize_block_q6k(x: &[f32], b: &mut [u8]) {
    let mut levels = [0u8; 256];
    let mut scales = [0f32; 16];
    let mut max_scale = 0f32;
    let mut max_abs = 0f32;
    for ib in 0..16 {
        let s = make_qx_quants(
            &x[16 * ib..16 * ib + 16],
            32,
            &mut levels[16 * ib..16 * ib + 16],
        );
        scales[ib] = s;
        if s.abs() > max_abs {
            max_abs = s.abs();
            max_scale = s;
        }
    }
    b.fill(0);
    if max_abs < 1e-15 {
        return;
    }
    let iscale = -128.0 / max_scale;
    let d16 = half::f16::from_f32(1.0 / iscale);
    b[208..210].copy_from_slice(&d16.to_le_bytes());
    let d = d16.to_f32();
    for ib in 0..16 {
        let sc = nearest_int(iscale * scales[ib]).clamp(-128, 127);
        b[192 + ib] = i8::try_from(sc).unwrap_or(0).to_le_bytes()[0];
        let dd = d * f32::from(i8::try_from(sc).unwrap_or(0));
        if dd == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * ib + ii] / dd).clamp(-32, 31);
            levels[16 * ib + ii] = u8::try_from(l + 32).unwrap_or(0);
        }
    }
    for half in 0..2 {
        let j = 128 * half;
        for l in 0..32 {
            let q = |o: usize| levels[j + l + o];
            b[64 * half + l] = (q(0) & 15) | ((q(64) & 15) << 4);
            b[64 * half + l + 32] = (q(32) & 15) | ((q(96) & 15) << 4);
            b[128 + 32 * half + l] =
                (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
        }
    }
}
