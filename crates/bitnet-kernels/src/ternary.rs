//! A borrowed ternary weight matrix and its int8-activation matmul.
//!
//! Output formula per layout (T = exact i32 integer sums, s = the token's activation scale):
//! - I2_S: `T = Σ_k value_k · q_k`, `y = ((T as f32) / s) · β`  (divide first, then multiply).
//! - per-block layouts: `T_b = Σ_(k in b) value_k · q_k`,
//!   `acc = Σ_b (T_b as f32) · d_b` accumulated in f32 in block order from 0.0,
//!   `y = acc / s`.
//!
//! The kernels return `Σ u·q` with `u = value + offset` (an unsigned code, see the layout
//! modules) and this module subtracts `offset · Σ q` per block, so every tier produces the
//! same integers and the float steps above run in the same order: outputs are bit-identical
//! across tiers.

use std::ops::Range;
use std::sync::Arc;

use crate::dispatch::{kernels, kernels_for};
use crate::layout::{i2s, qk256, seq32, tq1_0, tq2_0, ExternalScales, TernaryLayout};
use crate::panel::{Panels, GROUP_COLS, PANEL_ROWS};
use crate::pool::{Pool, SharedMut};
use crate::tier::{Amx, Isa, Kernels, Prepared};
use crate::KernelError;

/// A parallel-for over rows: `runner(n, grain, f)` calls `f` on disjoint ranges covering
/// `0..n` and returns once all calls have finished (e.g. `|n, g, f| pool.for_rows(n, g, f)`).
pub type RowRunner<'r> = dyn Fn(usize, usize, &(dyn Fn(Range<usize>) + Sync)) + 'r;

/// Tokens processed together per weight row (weights decoded once per tile).
pub const TOKEN_TILE: usize = 4;

/// Where a layout's scales live.
#[derive(Debug, Clone, Copy)]
enum Scales<'a> {
    /// I2_S: one f32 per tensor.
    Tensor(f32),
    /// Inside the blocks (TQ2_0, TQ1_0, BitNet32F16).
    Inline,
    /// Sibling / companion tensor, one per block (row-major over rows × blocks_per_row).
    External(ExternalScales<'a>),
    /// QK256 without a companion tensor: 1.0.
    One,
}

/// A borrowed ternary weight matrix: `n_out` rows (output features) × `n_in` (K) columns,
/// bytes borrowed from the mmap; I2_S matrices may also hold a repacked copy for the panel
/// GEMM ([`Self::repack`]), shared between clones.
#[derive(Debug, Clone)]
pub struct TernaryMatrix<'a> {
    layout: TernaryLayout,
    n_out: usize,
    n_in: usize,
    /// The packed weights (for I2_S without its 32-byte tail).
    data: &'a [u8],
    scales: Scales<'a>,
    /// Bytes per row in `data`.
    row_bytes: usize,
    /// Scale blocks per row.
    nb: usize,
    /// I2_S only: the packed codes were checked to hold no code 11 (see [`Self::check_codes`]).
    codes_clean: bool,
    /// The codes repacked into panels (`crate::panel`), used by the tiers that have a panel
    /// kernel: I2_S's, or a block layout's ([`Self::repack`]).
    panels: Option<Arc<Panels>>,
    /// The one scale of every block of a block-layout matrix repacked into panels: the
    /// panels' β.
    uniform: Option<f32>,
    /// The block scales of a block-layout matrix repacked into panels whose blocks do not
    /// all share one scale.
    block_scales: Option<Arc<BlockScales>>,
}

/// Block scales as stored: f16 bits where every scale is an f16 (TQ2_0, TQ1_0, BitNet32F16,
/// a Split32 sibling of F16 or of f16-exact F32 values), else f32 (half the memory where it
/// can be: BitNet32F16's scales are an eighth of its codes' bytes).
#[derive(Debug)]
enum ScaleStore {
    F16(Vec<u16>),
    F32(Vec<f32>),
}

impl ScaleStore {
    #[inline]
    fn get(&self, i: usize) -> f32 {
        match self {
            ScaleStore::F16(v) => half::f16::from_bits(v[i]).to_f32(),
            ScaleStore::F32(v) => v[i],
        }
    }

    fn nbytes(&self) -> usize {
        match self {
            ScaleStore::F16(v) => v.len() * 2,
            ScaleStore::F32(v) => v.len() * 4,
        }
    }
}

/// The scales of a repacked block-layout matrix, kept apart so that the file's bytes are not
/// read again.
#[derive(Debug)]
struct BlockScales {
    /// `n_out × nb`, row-major.
    d: ScaleStore,
    /// Each row's one scale when all its blocks carry the same (I2_S's float steps).
    row_one: Vec<Option<f32>>,
}

impl<'a> TernaryMatrix<'a> {
    /// Build a view over exactly the tensor's bytes (`data.len()` must equal
    /// [`TernaryLayout::tensor_bytes`]). `sibling_scales` is the exact byte content of the
    /// scale tensor (F32: 4 bytes per scale, F16: 2) for Split32WithSibling (required) and
    /// QK256 (optional; 1.0 without); it must be `None` for the other layouts.
    /// I2_S reads its f32 tensor scale at byte n/4.
    pub fn new(
        layout: TernaryLayout,
        n_out: usize,
        n_in: usize,
        data: &'a [u8],
        sibling_scales: Option<&'a [u8]>,
    ) -> Result<Self, KernelError> {
        let expected = layout.tensor_bytes(n_out, n_in)?;
        if data.len() != expected {
            return Err(KernelError::SizeMismatch {
                layout,
                what: "weights",
                rows: n_out,
                cols: n_in,
                expected,
                got: data.len(),
            });
        }
        let nb = layout.blocks_per_row(n_in);
        let n_blocks = n_out
            .checked_mul(nb)
            .ok_or(KernelError::Overflow { what: "blocks" })?;
        let row_bytes = layout.row_bytes(n_in);
        let packed_len = n_out * row_bytes;
        let scales = match (layout, sibling_scales) {
            (TernaryLayout::I2S, None) => {
                let n = n_out * n_in;
                Scales::Tensor(i2s::tensor_scale(data, n).ok_or(KernelError::SizeMismatch {
                    layout,
                    what: "tensor scale",
                    rows: n_out,
                    cols: n_in,
                    expected,
                    got: data.len(),
                })?)
            }
            (TernaryLayout::Tq2_0 | TernaryLayout::Tq1_0 | TernaryLayout::BitNet32F16, None) => {
                Scales::Inline
            }
            (TernaryLayout::Qk256, None) => Scales::One,
            (TernaryLayout::Split32WithSibling, None) => {
                return Err(KernelError::Scales {
                    layout,
                    reason: "needs a sibling scale tensor",
                })
            }
            (TernaryLayout::Split32WithSibling | TernaryLayout::Qk256, Some(b)) => {
                Scales::External(ExternalScales::from_exact_len(b, n_blocks).ok_or(
                    KernelError::SizeMismatch {
                        layout,
                        what: "scales (f32 or f16, one per block)",
                        rows: n_out,
                        cols: n_in,
                        expected: n_blocks.saturating_mul(4),
                        got: b.len(),
                    },
                )?)
            }
            (_, Some(_)) => {
                return Err(KernelError::Scales {
                    layout,
                    reason: "takes no sibling scale tensor",
                })
            }
        };
        Ok(TernaryMatrix {
            layout,
            n_out,
            n_in,
            data: &data[..packed_len],
            scales,
            row_bytes,
            nb,
            codes_clean: false,
            uniform: None,
            block_scales: None,
            panels: None,
        })
    }

    /// Detect the flavor of a GGUF type-36 tensor from its available bytes (up to the next
    /// tensor's offset or the end of the data section, so it includes alignment padding) and
    /// build the view (docs/FORMATS.md §3).
    ///
    /// Each candidate's exact size is computed and accepted only when
    /// `expected ≤ available ≤ align_up(expected, alignment)`:
    /// bitnet.cpp I2_S (`n/4 + 32`), QK256 (`n_out·ceil(K/256)·64`; with a companion scale
    /// tensor of one scale per 256-block when `sibling` is given), Split32WithSibling
    /// (`n/32·8`, only with a sibling of one scale per 32-block) and BitNet32F16 (`n/32·10`).
    /// `sibling` holds the exact bytes of a scale tensor named after the weight. No candidate,
    /// or more than one, is an error naming the tensor, its element count, the available
    /// bytes and every candidate's size.
    pub fn detect_type36(
        name: &str,
        n_out: usize,
        n_in: usize,
        available: &'a [u8],
        alignment: usize,
        sibling: Option<&'a [u8]>,
    ) -> Result<Self, KernelError> {
        let n = n_out
            .checked_mul(n_in)
            .ok_or(KernelError::Overflow { what: "n_elements" })?;
        let cands = detect_candidates(n_out, n_in, available.len(), alignment, sibling);
        let fits: Vec<(TernaryLayout, usize)> =
            cands.iter().filter(|c| c.2).map(|c| (c.0, c.1)).collect();
        let all: Vec<(TernaryLayout, usize)> = cands.iter().map(|c| (c.0, c.1)).collect();
        match fits.as_slice() {
            [(layout, expected)] => {
                let sib = match layout {
                    TernaryLayout::Split32WithSibling | TernaryLayout::Qk256 => sibling,
                    _ => None,
                };
                TernaryMatrix::new(*layout, n_out, n_in, &available[..*expected], sib)
            }
            [] => Err(KernelError::NoLayout {
                tensor: name.to_owned(),
                n_elements: n,
                available: available.len(),
                candidates: all,
            }),
            _ => Err(KernelError::AmbiguousLayout {
                tensor: name.to_owned(),
                n_elements: n,
                available: available.len(),
                candidates: fits,
            }),
        }
    }

    /// The layout.
    pub fn layout(&self) -> TernaryLayout {
        self.layout
    }
    /// Output features (rows).
    pub fn n_out(&self) -> usize {
        self.n_out
    }
    /// Input features (K).
    pub fn n_in(&self) -> usize {
        self.n_in
    }
    /// Bytes of packed weights read per full matvec (excludes external scales and the I2_S tail).
    pub fn nbytes(&self) -> usize {
        self.data.len()
    }
    /// True when the scales come from a sibling / companion tensor.
    pub fn has_external_scales(&self) -> bool {
        matches!(self.scales, Scales::External(_))
    }
    /// True for QK256 without a companion scale tensor (all scales 1.0; the loader should say so).
    pub fn scales_default_to_one(&self) -> bool {
        matches!(self.scales, Scales::One)
    }
    /// The per-tensor scale β of I2_S.
    pub fn tensor_scale(&self) -> Option<f32> {
        match self.scales {
            Scales::Tensor(b) => Some(b),
            _ => None,
        }
    }

    /// Bytes of row `r` (in range).
    #[inline]
    fn row(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Scale of block `b` of row `r`.
    #[inline]
    fn block_scale(&self, r: usize, b: usize) -> f32 {
        match self.scales {
            Scales::Tensor(beta) => beta,
            Scales::One => 1.0,
            Scales::External(e) => e.get(r * self.nb + b),
            Scales::Inline => {
                let row = self.row(r);
                match self.layout {
                    TernaryLayout::Tq2_0 => crate::layout::read_f16(row, b * 66 + 64),
                    TernaryLayout::Tq1_0 => crate::layout::read_f16(row, b * 54 + 52),
                    _ => crate::layout::read_f16(row, b * 10 + 8),
                }
            }
        }
    }

    /// The one scale of row `r` of a block-layout matrix (TQ2_0, TQ1_0, BitNet32F16,
    /// Split32) when all its blocks carry the same one (bit for bit): such a row is computed
    /// with I2_S's float steps (one multiply by the scale after the whole row's integer sum),
    /// so a file converted from I2_S gives the I2_S file's logits bit for bit, in both
    /// numerics, whether or not it is repacked. `None` for I2_S and QK256 (a tensor scale,
    /// or values that are not ternary) and for rows whose block scales differ (blocks in
    /// order).
    #[inline]
    fn row_uniform_scale(&self, r: usize) -> Option<f32> {
        if !self.layout.is_ternary_block_layout() {
            return None;
        }
        let d = self.block_scale(r, 0);
        (1..self.nb)
            .all(|b| self.block_scale(r, b).to_bits() == d.to_bits())
            .then_some(d)
    }

    /// Count codes that no writer produces (I2_S `11`, BitNet32/Split32 `00`); 0 for others.
    pub fn count_invalid_codes(&self) -> usize {
        match self.layout {
            TernaryLayout::I2S => i2s::count_invalid(self.data),
            TernaryLayout::Split32WithSibling => seq32::count_invalid(self.data),
            TernaryLayout::BitNet32F16 => self
                .data
                .chunks_exact(seq32::INLINE_BLOCK_BYTES)
                .map(|b| seq32::count_invalid(&b[..8]))
                .sum(),
            _ => 0,
        }
    }

    /// Count invalid codes ([`Self::count_invalid_codes`]) and remember whether there were
    /// none: an I2_S matrix without code 11 may then use a kernel that skips the code-11
    /// fix-up (about 20% fewer instructions per block on AVX2). Results are identical either
    /// way; call it once at load (it reads every weight byte).
    pub fn check_codes(&mut self) -> usize {
        let n = self.count_invalid_codes();
        self.codes_clean = n == 0;
        n
    }

    /// The index (row · blocks per row + block) of the first scale that is NaN or infinite:
    /// `Some(0)` for a non-finite I2_S tensor scale. Such a scale makes its rows' outputs
    /// non-finite, and the next int8 quantization would turn those into silently wrong
    /// numbers, so a loader refuses the matrix. Reads every block scale once.
    pub fn first_non_finite_scale(&self) -> Option<usize> {
        match self.scales {
            Scales::Tensor(beta) => (!beta.is_finite()).then_some(0),
            Scales::One => None,
            Scales::External(_) | Scales::Inline => (0..self.n_out * self.nb)
                .find(|&i| !self.block_scale(i / self.nb, i % self.nb).is_finite()),
        }
    }

    /// True after [`Self::check_codes`] found no invalid code.
    pub fn codes_checked_clean(&self) -> bool {
        self.codes_clean
    }

    /// The packed weight bytes the kernels read (for I2_S without β and its tail): what a
    /// loader may release once the matrix is [repacked](Self::repack).
    pub fn packed_data(&self) -> &'a [u8] {
        self.data
    }

    /// The same matrix over `data`, a copy of [`Self::packed_data`] held elsewhere (a buffer
    /// the weights were read into): scales, repacked panels and the code check are shared. The
    /// copy must be exactly as long (checked) and hold the same bytes (the caller's to ensure;
    /// other bytes give other results, never unsafety).
    pub fn with_packed<'b>(&self, data: &'b [u8]) -> Result<TernaryMatrix<'b>, KernelError>
    where
        'a: 'b,
    {
        if data.len() != self.data.len() {
            return Err(KernelError::SizeMismatch {
                layout: self.layout,
                what: "weights (a copy of the packed bytes)",
                rows: self.n_out,
                cols: self.n_in,
                expected: self.data.len(),
                got: data.len(),
            });
        }
        Ok(TernaryMatrix {
            data,
            scales: self.scales,
            panels: self.panels.clone(),
            uniform: self.uniform,
            block_scales: self.block_scales.clone(),
            ..*self
        })
    }

    /// Repack an I2_S, TQ2_0, TQ1_0, BitNet32F16 or Split32 matrix into panels when the
    /// selected tier has a panel kernel ([`crate::isa`]); K must be a multiple of 128 (I2_S's
    /// block). A block layout's codes go into the same panels as I2_S's. When all its blocks
    /// share one scale (as the writers make a BitNet model's per-tensor scale), that scale is
    /// their β and every panel kernel runs it as it runs I2_S (its rows take I2_S's float
    /// steps on every path, see `row_uniform_scale`); otherwise its scales are kept beside
    /// the panels and the panel kernel runs one block (256 or 32 columns) at a time, the
    /// float steps those of the block kernels. Returns the bytes of the new copy (scales
    /// included), 0 when nothing was done (QK256, whose values are not ternary; a code the
    /// layout never writes: TQ2_0's 3, BitNet32F16's and Split32's 0; a tier without the
    /// kernel). Results are bit-identical either way, in both numerics; once repacked, the
    /// tiers with a panel kernel no longer read [`Self::packed_data`].
    pub fn repack(&mut self, pool: &Pool) -> Result<usize, KernelError> {
        if kernels().i2s_panel.is_none() {
            return Ok(0);
        }
        self.repack_always(pool)
    }

    /// [`Self::repack`] whatever the selected tier (tests, benchmarks).
    pub fn repack_always(&mut self, pool: &Pool) -> Result<usize, KernelError> {
        if self.layout == TernaryLayout::I2S {
            if let Some(p) = &self.panels {
                return Ok(p.nbytes());
            }
            let p = Panels::from_i2s(self.data, self.n_out, self.n_in, pool)?;
            let n = p.nbytes();
            self.panels = Some(Arc::new(p));
            return Ok(n);
        }
        if !self.layout.is_ternary_block_layout() || self.n_out == 0 {
            return Ok(0);
        }
        if let Some(p) = &self.panels {
            return Ok(p.nbytes());
        }
        if !self.n_in.is_multiple_of(i2s::BLOCK_ELEMS) {
            return Ok(0);
        }
        // Each row's one scale, if it has one; the matrix shares one when every row has the
        // first row's.
        let row_one: Vec<Option<f32>> =
            (0..self.n_out).map(|r| self.row_uniform_scale(r)).collect();
        let d = self.block_scale(0, 0);
        let uniform = d.is_finite()
            && row_one
                .iter()
                .all(|o| o.is_some_and(|x| x.to_bits() == d.to_bits()));
        // The codes in I2_S's order, row by row; a code the layout never writes leaves the
        // matrix as it is.
        let row_i2s = self.n_in / 4;
        let total = self
            .n_out
            .checked_mul(row_i2s)
            .ok_or(KernelError::Overflow {
                what: "panel bytes",
            })?;
        let mut codes = vec![0u8; total];
        let bad = std::sync::atomic::AtomicBool::new(false);
        {
            let dst = SharedMut::new(&mut codes);
            let f = |rows: Range<usize>| {
                for r in rows {
                    // SAFETY: row ranges are disjoint between chunks and r < n_out, so the
                    // range lies inside `codes` and no other chunk writes it.
                    let out = unsafe { dst.slice_mut(r * row_i2s..(r + 1) * row_i2s) };
                    if !block_codes_as_i2s(self.layout, self.row(r), out) {
                        bad.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            };
            pool.for_rows(self.n_out, ROW_GRAIN, &f);
        }
        if bad.into_inner() {
            return Ok(0);
        }
        let p = Panels::from_i2s(&codes, self.n_out, self.n_in, pool)?;
        let mut n = p.nbytes();
        if uniform {
            self.uniform = Some(d);
        } else {
            let this = &*self;
            let all =
                || (0..this.n_out).flat_map(|r| (0..this.nb).map(move |b| this.block_scale(r, b)));
            let f16_exact = |x: f32| half::f16::from_f32(x).to_f32().to_bits() == x.to_bits();
            let d = if all().all(f16_exact) {
                ScaleStore::F16(all().map(|x| half::f16::from_f32(x).to_bits()).collect())
            } else {
                ScaleStore::F32(all().collect())
            };
            n += d.nbytes() + self.n_out * std::mem::size_of::<Option<f32>>();
            self.block_scales = Some(Arc::new(BlockScales { d, row_one }));
        }
        self.panels = Some(Arc::new(p));
        Ok(n)
    }

    /// The panels' β: I2_S's tensor scale, or the one scale of a repacked block layout.
    fn panel_beta(&self) -> Option<f32> {
        match self.scales {
            Scales::Tensor(beta) => Some(beta),
            _ => self.uniform,
        }
    }

    /// Bytes of the repacked copy, if any.
    pub fn repacked_bytes(&self) -> usize {
        self.panels.as_ref().map_or(0, |p| p.nbytes())
    }

    /// Reference dequantization of row `r` into `out` (length K). Not for the hot path.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), KernelError> {
        if r >= self.n_out {
            return Err(KernelError::RowOutOfRange {
                row: r,
                rows: self.n_out,
            });
        }
        if out.len() != self.n_in {
            return Err(KernelError::ShapeMismatch {
                what: "dequantize_row out",
                expected: self.n_in,
                got: out.len(),
            });
        }
        let row = self.row(r);
        match (self.layout, &self.scales) {
            (TernaryLayout::I2S, Scales::Tensor(beta)) => i2s::dequantize_row(row, *beta, out),
            (TernaryLayout::Tq2_0, _) => tq2_0::dequantize_row(row, out),
            (TernaryLayout::Tq1_0, _) => tq1_0::dequantize_row(row, out),
            (TernaryLayout::BitNet32F16, _) => seq32::dequantize_row_inline(row, out),
            (TernaryLayout::Split32WithSibling, Scales::External(e)) => {
                seq32::dequantize_row_split(row, e, r * self.nb, out)
            }
            (TernaryLayout::Qk256, Scales::External(e)) => {
                qk256::dequantize_row(row, Some(e), r * self.nb, out)
            }
            (TernaryLayout::Qk256, _) => qk256::dequantize_row(row, None, r * self.nb, out),
            _ => {
                return Err(KernelError::Scales {
                    layout: self.layout,
                    reason: "inconsistent scale source",
                })
            }
        }
        Ok(())
    }

    /// `out[t·n_out + r] = y(t, r)` for tokens `t in 0..n_tok` (n_tok = `s.len()`), with
    /// `xq` the `n_tok × n_in` int8 activations (row-major per token) and `s` their scales
    /// from [`crate::act::quantize_i8`]. Rows are split over the pool's threads.
    pub fn matmul(
        &self,
        xq: &[i8],
        s: &[f32],
        out: &mut [f32],
        pool: &Pool,
    ) -> Result<(), KernelError> {
        self.matmul_with(kernels(), xq, s, out, pool)
    }

    /// [`Self::matmul`] on a chosen tier (tests and benchmarks); `None` if the CPU lacks it.
    pub fn matmul_on(
        &self,
        isa: Isa,
        xq: &[i8],
        s: &[f32],
        out: &mut [f32],
        pool: &Pool,
    ) -> Option<Result<(), KernelError>> {
        kernels_for(isa).map(|k| self.matmul_with(k, xq, s, out, pool))
    }

    /// [`Self::matmul_on`] with a caller-supplied parallel-for in place of [`Pool::for_rows`]
    /// (`runner(n, grain, f)` must call `f` on disjoint ranges covering `0..n` and return
    /// after all calls finished). Used by the benchmarks to compare thread pools.
    #[doc(hidden)]
    pub fn matmul_with_runner(
        &self,
        isa: Isa,
        xq: &[i8],
        s: &[f32],
        out: &mut [f32],
        runner: &RowRunner<'_>,
    ) -> Option<Result<(), KernelError>> {
        kernels_for(isa).map(|k| self.matmul_impl(k, xq, s, out, runner))
    }

    fn matmul_with(
        &self,
        kern: &Kernels,
        xq: &[i8],
        s: &[f32],
        out: &mut [f32],
        pool: &Pool,
    ) -> Result<(), KernelError> {
        self.matmul_impl(kern, xq, s, out, &|n, g, f| pool.for_rows(n, g, f))
    }

    fn matmul_impl(
        &self,
        kern: &Kernels,
        xq: &[i8],
        s: &[f32],
        out: &mut [f32],
        runner: &RowRunner<'_>,
    ) -> Result<(), KernelError> {
        let n_tok = s.len();
        let nx = n_tok
            .checked_mul(self.n_in)
            .ok_or(KernelError::Overflow { what: "n_tok*n_in" })?;
        let ny = n_tok.checked_mul(self.n_out).ok_or(KernelError::Overflow {
            what: "n_tok*n_out",
        })?;
        if xq.len() != nx {
            return Err(KernelError::ShapeMismatch {
                what: "xq",
                expected: nx,
                got: xq.len(),
            });
        }
        if out.len() != ny {
            return Err(KernelError::ShapeMismatch {
                what: "out",
                expected: ny,
                got: out.len(),
            });
        }
        if n_tok == 0 || self.n_out == 0 {
            return Ok(());
        }
        if let (Some(lut), Some(panels), Some(beta)) =
            (kern.i2s_lut, self.panels.as_deref(), self.panel_beta())
        {
            if n_tok >= lut.min_tokens {
                self.lut_matmul(lut, panels, beta, xq, s, out, runner);
                return Ok(());
            }
        }
        let bsum = self.block_sums(kern.isa, xq, n_tok);
        if let (Some(pk), Some(panels), Some(bsc)) = (
            kern.i2s_panel,
            self.panels.as_deref(),
            self.block_scales.as_deref(),
        ) {
            // Block-major activations: block b of every token, then block b + 1.
            let be = self.layout.block_elems();
            let k = self.n_in;
            let mut xg = vec![0i8; xq.len()];
            for (b, dst) in xg.chunks_exact_mut(n_tok * be).enumerate() {
                for (t, d) in dst.chunks_exact_mut(be).enumerate() {
                    d.copy_from_slice(&xq[t * k + b * be..t * k + (b + 1) * be]);
                }
            }
            let outp = SharedMut::new(out);
            let tile = kern.panel_tokens.max(1);
            let f = |ps: Range<usize>| {
                self.block_panel_rows(pk, tile, panels, bsc, &xg, &bsum, s, ps, &outp);
            };
            runner(panels.n_panels(), 1, &f);
            return Ok(());
        }
        // The panel kernels take Σq over the whole row.
        let bsum_k: std::borrow::Cow<'_, [i32]> = if self.nb == 1 || self.panels.is_none() {
            std::borrow::Cow::Borrowed(&bsum)
        } else {
            std::borrow::Cow::Owned(bsum.chunks(self.nb).map(|b| b.iter().sum()).collect())
        };
        if let (Some(amx), Some(panels), Some(beta)) =
            (kern.i2s_amx, self.panels.as_deref(), self.panel_beta())
        {
            if n_tok >= amx.min_tokens {
                let outp = SharedMut::new(out);
                let f = |ps: Range<usize>| {
                    self.amx_rows((amx, kern.isa), panels, beta, xq, &bsum_k, s, ps, &outp);
                };
                runner(panels.n_panels(), 2, &f);
                return Ok(());
            }
        }
        if let (Some(pk), Some(panels), Some(beta)) =
            (kern.i2s_panel, self.panels.as_deref(), self.panel_beta())
        {
            let outp = SharedMut::new(out);
            let tile = kern.panel_tokens.max(1);
            let f = |ps: Range<usize>| {
                self.panel_rows(
                    (pk, kern.isa),
                    tile,
                    panels,
                    beta,
                    xq,
                    &bsum_k,
                    s,
                    ps,
                    &outp,
                );
            };
            runner(panels.n_panels(), 2, &f);
            return Ok(());
        }
        let p = Prepared::new(self.layout, xq, self.n_in, n_tok);
        let kernel = match self.layout {
            TernaryLayout::I2S if self.codes_clean => kern.i2s_clean,
            TernaryLayout::I2S => kern.i2s,
            TernaryLayout::Tq2_0 => kern.tq2,
            TernaryLayout::Tq1_0 => kern.tq1,
            TernaryLayout::BitNet32F16 => kern.bitnet32,
            TernaryLayout::Split32WithSibling => kern.split32,
            TernaryLayout::Qk256 => kern.qk256,
        };
        let outp = SharedMut::new(out);
        let several = kern
            .i2s_rows
            .filter(|_| self.layout == TernaryLayout::I2S && n_tok == 1)
            .map(|k| (k, kern.isa));
        let f = |rows: Range<usize>| {
            self.rows_kernel(kernel, several, &p, &bsum, s, rows, &outp);
        };
        runner(self.n_out, ROW_GRAIN, &f);
        Ok(())
    }

    /// `Σ q` per token and scale block (`n_tok × nb`).
    fn block_sums(&self, isa: Isa, xq: &[i8], n_tok: usize) -> Vec<i32> {
        let k = self.n_in;
        let be = match self.layout {
            TernaryLayout::I2S => k,
            other => other.block_elems(),
        };
        let mut bs = Vec::with_capacity(n_tok * self.nb);
        for t in 0..n_tok {
            let x = &xq[t * k..(t + 1) * k];
            for b in 0..self.nb {
                let end = ((b + 1) * be).min(k);
                bs.push(crate::rowops::sum_i8_with(isa, &x[b * be..end]));
            }
        }
        bs
    }

    #[allow(clippy::too_many_arguments)]
    fn rows_kernel(
        &self,
        kernel: crate::tier::TernaryKernel,
        several: Option<(crate::tier::I2sRows, Isa)>,
        p: &Prepared<'_>,
        bsum: &[i32],
        s: &[f32],
        rows: Range<usize>,
        out: &SharedMut<f32>,
    ) {
        let n_tok = s.len();
        let nb = self.nb;
        let off = self.layout.code_offset();
        let mut rows = rows;
        if let (Some((several, isa)), Scales::Tensor(beta)) = (several, self.scales) {
            // I2_S matvec: several rows per call, same integers and float steps as below.
            let n = several.rows.max(1);
            let mut t = vec![0i32; n];
            while rows.len() >= n {
                let r = rows.start;
                let w = &self.data[r * self.row_bytes..(r + n) * self.row_bytes];
                (several.kernel)(w, p, 0, self.codes_clean, &mut t);
                // SAFETY: r + n ≤ rows.end ≤ n_out and n_tok = 1, so the range is inside
                // `out`; row ranges are disjoint between chunks.
                let dst = unsafe { out.slice_mut(r..r + n) };
                // y = ((T as f32) / s) · β, T = Σ u·q − Σ q
                crate::rowops::panel_out(isa, &t, off * bsum[0], s[0], beta, dst);
                rows.start += n;
            }
        }
        let mut raw = vec![0i32; TOKEN_TILE * nb];
        // Blocks of ROW_BLOCK rows × tiles of TOKEN_TILE tokens: within a block, one token
        // tile's activations stay in L1 while the block's rows (L2-resident) go by, instead of
        // every token's activations streaming from L2 for every row.
        let mut rb = rows.start;
        while rb < rows.end {
            let rb_end = (rb + ROW_BLOCK).min(rows.end);
            let mut t0 = 0;
            while t0 < n_tok {
                let nt = (n_tok - t0).min(TOKEN_TILE);
                for r in rb..rb_end {
                    self.tile_out(kernel, p, bsum, s, r, t0, nt, &mut raw, out);
                }
                t0 += nt;
            }
            rb = rb_end;
        }
    }

    /// Panels `ps` for every token: blocks of `PANEL_BLOCK` panels (L2-resident) × tiles of
    /// `tile` tokens, two panels per kernel call; `y = ((T − Σq) / s) · β` as in `tile_out`.
    #[allow(clippy::too_many_arguments)]
    fn panel_rows(
        &self,
        (kernel, isa): (crate::tier::PanelKernel, Isa),
        tile: usize,
        panels: &Panels,
        beta: f32,
        xq: &[i8],
        bsum: &[i32],
        s: &[f32],
        ps: Range<usize>,
        out: &SharedMut<f32>,
    ) {
        let n_tok = s.len();
        let k = self.n_in;
        let gpp = panels.groups_per_panel();
        let mut raw = vec![0i32; tile * 2 * PANEL_ROWS];
        let mut pb = ps.start;
        while pb < ps.end {
            let pb_end = (pb + PANEL_BLOCK).min(ps.end);
            let mut t0 = 0;
            while t0 < n_tok {
                let nt = (n_tok - t0).min(tile);
                let mut p = pb;
                while p < pb_end {
                    let np = (pb_end - p).min(2);
                    let rows = PANEL_ROWS * np;
                    kernel(
                        panels.panels(p..p + np),
                        gpp,
                        xq,
                        k,
                        t0,
                        nt,
                        &mut raw[..nt * rows],
                    );
                    let raw = &raw[..nt * rows];
                    self.panel_out(isa, raw, p, np, t0, nt, bsum, s, beta, out);
                    p += np;
                }
                t0 += nt;
            }
            pb = pb_end;
        }
    }

    /// Panels `ps` of a block-layout matrix with its block scales apart, for every token: one
    /// panel and one block of 256 or 32 columns (`xg`'s block-major activations) per call,
    /// then `tile_out`'s float steps: `y = (Σ_b (T_b as f32) · d_b) / s`, blocks in order, or
    /// `y = ((Σ_b T_b) as f32 / s) · d` for a row with one scale.
    #[allow(clippy::too_many_arguments)]
    fn block_panel_rows(
        &self,
        kernel: crate::tier::PanelKernel,
        tile: usize,
        panels: &Panels,
        bsc: &BlockScales,
        xg: &[i8],
        bsum: &[i32],
        s: &[f32],
        ps: Range<usize>,
        out: &SharedMut<f32>,
    ) {
        let n_tok = s.len();
        let nb = self.nb;
        let be = self.layout.block_elems();
        let gpb = be / GROUP_COLS;
        let mut raw = vec![0i32; tile * PANEL_ROWS];
        let mut acc_f = vec![0f32; tile * PANEL_ROWS];
        let mut acc_i = vec![0i32; tile * PANEL_ROWS];
        // The panel's scales as f32, block-major (0 for padding rows).
        let mut ds = vec![[0f32; PANEL_ROWS]; nb];
        for p in ps {
            let w = panels.panels(p..p + 1);
            let r0 = PANEL_ROWS * p;
            let nr = (r0 + PANEL_ROWS).min(self.n_out) - r0;
            for (b, d) in ds.iter_mut().enumerate() {
                for (j, dj) in d.iter_mut().enumerate() {
                    *dj = if j < nr {
                        bsc.d.get((r0 + j) * nb + b)
                    } else {
                        0.0
                    };
                }
            }
            let mut t0 = 0;
            while t0 < n_tok {
                let nt = (n_tok - t0).min(tile);
                acc_f[..nt * PANEL_ROWS].fill(0.0);
                acc_i[..nt * PANEL_ROWS].fill(0);
                for (b, d) in ds.iter().enumerate() {
                    let raw = &mut raw[..nt * PANEL_ROWS];
                    let x = &xg[b * n_tok * be..(b + 1) * n_tok * be];
                    kernel(&w[b * gpb..(b + 1) * gpb], gpb, x, be, t0, nt, raw);
                    let rows = raw.chunks_exact(PANEL_ROWS);
                    let accs = acc_i.chunks_exact_mut(PANEL_ROWS);
                    let accf = acc_f.chunks_exact_mut(PANEL_ROWS);
                    for (ti, ((rw, ai), af)) in rows.zip(accs).zip(accf).enumerate() {
                        let q = bsum[(t0 + ti) * nb + b];
                        for j in 0..PANEL_ROWS {
                            // T_b = Σ u·q − Σ q over the block
                            let tb = rw[j].wrapping_sub(q);
                            ai[j] = ai[j].wrapping_add(tb);
                            af[j] += tb as f32 * d[j];
                        }
                    }
                }
                for ti in 0..nt {
                    let t = t0 + ti;
                    let at = t * self.n_out;
                    // SAFETY: t < n_tok and r0 .. r0 + nr lie in 0..n_out, so the range is
                    // inside `out`; panel ranges are disjoint between chunks, so no other
                    // thread touches it.
                    let dst = unsafe { out.slice_mut(at + r0..at + r0 + nr) };
                    for (j, y) in dst.iter_mut().enumerate() {
                        let i = ti * PANEL_ROWS + j;
                        *y = match bsc.row_one[r0 + j] {
                            Some(d) => (acc_i[i] as f32 / s[t]) * d,
                            None => acc_f[i] / s[t],
                        };
                    }
                }
                t0 += nt;
            }
        }
    }

    /// `y = ((T as f32) / s) · β` with `T = Σ u·q − Σ q` for the `np` panels from panel `p`
    /// and tokens `t0 .. t0 + nt`, from their raw sums (`raw[ti·16np + 16pi + j]`).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn panel_out(
        &self,
        isa: Isa,
        raw: &[i32],
        p: usize,
        np: usize,
        t0: usize,
        nt: usize,
        bsum: &[i32],
        s: &[f32],
        beta: f32,
        out: &SharedMut<f32>,
    ) {
        let rows = PANEL_ROWS * np;
        let r0 = PANEL_ROWS * p;
        let r_end = (r0 + rows).min(self.n_out);
        for ti in 0..nt {
            let t = t0 + ti;
            let (b, st) = (bsum[t], s[t]);
            let src = &raw[ti * rows..ti * rows + (r_end - r0)];
            let at = t * self.n_out;
            // SAFETY: t < n_tok and r0 .. r_end lie in 0..n_out, so the range is inside
            // `out`; panel ranges are disjoint between chunks, so no other thread touches it.
            let dst = unsafe { out.slice_mut(at + r0..at + r_end) };
            // y = ((T as f32) / s) · β, T = Σ u·q − Σ q
            crate::rowops::panel_out(isa, src, b, st, beta, dst);
        }
    }

    /// Panels `ps` for every token on the tile unit (`crate::simd::amx`): chunks of
    /// `chunk_tokens` tokens (outer: a chunk's activations stay in L2 while the panels go by),
    /// then pairs of panels; the epilogue is `panel_rows`'.
    #[allow(clippy::too_many_arguments)]
    fn amx_rows(
        &self,
        (amx, isa): (Amx, Isa),
        panels: &Panels,
        beta: f32,
        xq: &[i8],
        bsum: &[i32],
        s: &[f32],
        ps: Range<usize>,
        out: &SharedMut<f32>,
    ) {
        let n_tok = s.len();
        let k = self.n_in;
        let gpp = panels.groups_per_panel();
        let chunk = amx.chunk_tokens.max(1);
        let mut raw = vec![0i32; chunk.min(n_tok) * 2 * PANEL_ROWS];
        let mut codes = Vec::new();
        let mut t0 = 0;
        while t0 < n_tok {
            let nt = (n_tok - t0).min(chunk);
            let mut p = ps.start;
            while p < ps.end {
                let np = (ps.end - p).min(2);
                let raw = &mut raw[..nt * PANEL_ROWS * np];
                (amx.gemm)(
                    panels.panels(p..p + np),
                    gpp,
                    xq,
                    k,
                    t0,
                    nt,
                    raw,
                    &mut codes,
                );
                self.panel_out(isa, raw, p, np, t0, nt, bsum, s, beta, out);
                p += np;
            }
            t0 += nt;
        }
    }

    /// The table-lookup GEMM (`crate::lut`) over every panel: tokens in chunks of
    /// [`LUT_CHUNK`], whose tables are built first (split over tokens), then blocks of
    /// [`LUT_PANELS`] panels split over the threads; each block's index words are expanded
    /// once per chunk and meet the chunk's tokens [`LUT_TOKENS`] at a time.
    /// `y = (T / s) · β` with `T = Σ w·q`, the integer the panel path forms as `Σ u·q − Σ q`.
    #[allow(clippy::too_many_arguments)]
    fn lut_matmul(
        &self,
        lut: crate::lut::Lut,
        panels: &Panels,
        beta: f32,
        xq: &[i8],
        s: &[f32],
        out: &mut [f32],
        runner: &RowRunner<'_>,
    ) {
        use crate::lut::{PairIdx, PairTable, LUT_PANELS, LUT_TOKENS};
        let n_tok = s.len();
        let k = self.n_in;
        let npairs = k / 2;
        let gpp = panels.groups_per_panel();
        let n_blocks = panels.n_panels().div_ceil(LUT_PANELS);
        let outp = SharedMut::new(out);
        let mut tables = vec![PairTable::default(); n_tok.min(LUT_CHUNK) * npairs];
        let mut c0 = 0;
        while c0 < n_tok {
            let nc = (n_tok - c0).min(LUT_CHUNK);
            {
                let tp = SharedMut::new(&mut tables[..nc * npairs]);
                let build = |ts: Range<usize>| {
                    // SAFETY: token ranges are disjoint between calls, so the table ranges
                    // are too; ts.end ≤ nc.
                    let dst = unsafe { tp.slice_mut(ts.start * npairs..ts.end * npairs) };
                    (lut.tables)(xq, k, c0 + ts.start, ts.len(), dst);
                };
                runner(nc, 1, &build);
            }
            let tables = &tables[..nc * npairs];
            let f = |bs: Range<usize>| {
                let mut idx = vec![PairIdx::default(); npairs * LUT_PANELS];
                let mut raw = [0i32; LUT_TOKENS * LUT_PANELS * PANEL_ROWS];
                for b in bs {
                    let p = LUT_PANELS * b;
                    let np = (panels.n_panels() - p).min(LUT_PANELS);
                    let idx = &mut idx[..npairs * np];
                    (lut.expand)(panels.panels(p..p + np), gpp, idx);
                    let rows = PANEL_ROWS * np;
                    let r0 = PANEL_ROWS * p;
                    let r_end = (r0 + rows).min(self.n_out);
                    let mut t = 0;
                    while t < nc {
                        let nt = (nc - t).min(LUT_TOKENS);
                        let raw = &mut raw[..nt * rows];
                        (lut.kernel)(idx, np, &tables[t * npairs..], npairs, nt, raw);
                        for ti in 0..nt {
                            let tok = c0 + t + ti;
                            for r in r0..r_end {
                                // y = ((T as f32) / s) · β, T = Σ w·q
                                let y = (raw[ti * rows + (r - r0)] as f32 / s[tok]) * beta;
                                // SAFETY: tok < n_tok and r < n_out; blocks are disjoint
                                // between chunks, so each (tok, r) is written once.
                                unsafe { outp.write(tok * self.n_out + r, y) };
                            }
                        }
                        t += nt;
                    }
                }
            };
            runner(n_blocks, 1, &f);
            c0 += nc;
        }
    }

    /// One row × one token tile: raw sums by `kernel`, then scaled into `out`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn tile_out(
        &self,
        kernel: crate::tier::TernaryKernel,
        p: &Prepared<'_>,
        bsum: &[i32],
        s: &[f32],
        r: usize,
        t0: usize,
        nt: usize,
        raw: &mut [i32],
        out: &SharedMut<f32>,
    ) {
        let nb = self.nb;
        let off = self.layout.code_offset();
        let w = self.row(r);
        kernel(w, p, t0, nt, &mut raw[..nt * nb]);
        let row_scale = self.row_uniform_scale(r);
        for ti in 0..nt {
            let t = t0 + ti;
            let y = match (self.scales, row_scale) {
                (Scales::Tensor(beta), _) => {
                    // y = ((T as f32) / s) · β
                    let tt = raw[ti] - off * bsum[t];
                    (tt as f32 / s[t]) * beta
                }
                (_, Some(d)) => {
                    // I2_S's steps with the row's one scale: y = ((T as f32) / s) · d,
                    // T = Σ_b T_b summed as integers (exact), as I2_S sums the whole row.
                    let tt = (0..nb).fold(0i32, |a, b| {
                        a.wrapping_add(raw[ti * nb + b].wrapping_sub(off * bsum[t * nb + b]))
                    });
                    (tt as f32 / s[t]) * d
                }
                _ => {
                    // y = (Σ_b (T_b as f32) · d_b) / s, blocks in order
                    let mut acc = 0f32;
                    for b in 0..nb {
                        let tb = raw[ti * nb + b] - off * bsum[t * nb + b];
                        acc += tb as f32 * self.block_scale(r, b);
                    }
                    acc / s[t]
                }
            };
            // SAFETY: t < n_tok and r < n_out, so the index is < out.len(); each
            // (t, r) is written by exactly one chunk because row ranges are disjoint.
            unsafe { out.write(t * self.n_out + r, y) };
        }
    }
}

/// One block-layout row's codes written in I2_S's order (`out`: K/4 bytes, K a multiple of
/// 128); false when the row holds a code its layout never writes (TQ2_0's 3, +2 there; the
/// 32-blocks' 0, −2 there: neither is ternary) or the layout is another.
fn block_codes_as_i2s(layout: TernaryLayout, row: &[u8], out: &mut [u8]) -> bool {
    match layout {
        TernaryLayout::Tq2_0 => {
            // A block's 64 code bytes hold element 128h + 32l + m at bits 2l of byte
            // 32h + m; I2_S's byte m of block h holds it at bits 6 − 2l: the same bytes
            // with their four pairs in reverse order.
            for (blk, o) in row.chunks_exact(66).zip(out.chunks_exact_mut(64)) {
                for (&b, ob) in blk[..64].iter().zip(o.iter_mut()) {
                    if b & (b >> 1) & 0x55 != 0 {
                        return false;
                    }
                    *ob = (b << 6) | ((b << 2) & 0x30) | ((b >> 2) & 0x0c) | (b >> 6);
                }
            }
            true
        }
        TernaryLayout::Tq1_0 => {
            out.fill(0);
            for (blk, o) in row.chunks_exact(54).zip(out.chunks_exact_mut(64)) {
                for e in 0..256 {
                    let c = crate::layout::tq1_0::code(blk, e);
                    if c > 2 {
                        return false;
                    }
                    o[32 * (e / 128) + e % 32] |= c << (6 - 2 * ((e % 128) / 32));
                }
            }
            true
        }
        TernaryLayout::BitNet32F16 | TernaryLayout::Split32WithSibling => {
            // Element 32l + m of I2_S block h (byte m, bits 6 − 2l) is element m of 32-block
            // 4h + l: byte m/4 of its codes, bits 2(m % 4); code c is value c − 2, I2_S's
            // code is value + 1.
            let stride = if layout == TernaryLayout::BitNet32F16 {
                crate::layout::seq32::INLINE_BLOCK_BYTES
            } else {
                crate::layout::seq32::PACKED_BYTES
            };
            for (h, o) in out.chunks_exact_mut(32).enumerate() {
                for (m, ob) in o.iter_mut().enumerate() {
                    let mut byte = 0u8;
                    for l in 0..4 {
                        let c = crate::layout::seq32::code(&row[(4 * h + l) * stride..], m);
                        if c == 0 {
                            return false;
                        }
                        byte |= (c - 1) << (6 - 2 * l);
                    }
                    *ob = byte;
                }
            }
            true
        }
        _ => false,
    }
}

/// Rows per block of the multi-token loop in `rows_kernel` (64 rows of K = 6912 are 110 KB of
/// I2_S, well inside L2).
const ROW_BLOCK: usize = 64;

/// Tokens per chunk of the lookup GEMM: their tables (16 bytes per column pair and token,
/// 3.5 MB at K = 6912) are built together and read by every block of rows.
const LUT_CHUNK: usize = 64;

/// Panels per block of the panel GEMM's loop (4 × 16 rows of K = 6912 are 110 KB).
const PANEL_BLOCK: usize = 4;

/// Rows per work unit handed to the pool (a multiple of every SIMD row tile).
pub const ROW_GRAIN: usize = 8;

/// The exact-size candidates for a type-36 tensor: (layout, expected bytes, fits).
pub fn detect_candidates(
    n_out: usize,
    n_in: usize,
    available: usize,
    alignment: usize,
    sibling: Option<&[u8]>,
) -> Vec<(TernaryLayout, usize, bool)> {
    let align = alignment.max(1);
    let fits = |expected: usize| {
        let up = expected.div_ceil(align).saturating_mul(align);
        expected <= available && available <= up
    };
    let n = n_out.saturating_mul(n_in);
    let mut v = Vec::new();
    for layout in [
        TernaryLayout::I2S,
        TernaryLayout::Qk256,
        TernaryLayout::Split32WithSibling,
        TernaryLayout::BitNet32F16,
    ] {
        let expected = match layout {
            TernaryLayout::I2S => (n / 4).saturating_add(i2s::TAIL_BYTES),
            TernaryLayout::Qk256 => n_out.saturating_mul(n_in.div_ceil(256) * 64),
            TernaryLayout::Split32WithSibling => n.div_ceil(32).saturating_mul(8),
            _ => n.div_ceil(32).saturating_mul(10),
        };
        let k_ok = layout.check_k(n_in).is_ok();
        let sib_ok = match (layout, sibling) {
            (TernaryLayout::Split32WithSibling, Some(b)) => {
                ExternalScales::from_exact_len(b, n_out.saturating_mul(n_in / 32)).is_some()
            }
            (TernaryLayout::Split32WithSibling, None) => false,
            (TernaryLayout::Qk256, Some(b)) => {
                ExternalScales::from_exact_len(b, n_out.saturating_mul(n_in.div_ceil(256)))
                    .is_some()
            }
            _ => true,
        };
        v.push((layout, expected, k_ok && sib_ok && fits(expected)));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::supported_isas;
    use crate::simd::scalar;

    /// xorshift64, so the test needs no dependency.
    fn rng(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// Every tier's several-row I2_S kernel against the scalar per-row kernel, on distinct
    /// random rows (a swapped or mixed row fails), with code 11 present (checking kernel) and
    /// absent (clean kernel), extreme and random activations, and K from one block to the
    /// model's.
    #[test]
    fn i2s_rows_match_scalar_rows() {
        const MAX_ROWS: usize = 8;
        let mut st = 0x9E37_79B9_7F4A_7C15u64;
        let mut tested = 0;
        for k in [128usize, 256, 640, 2560, 6912] {
            let rb = k / 4;
            for with_11 in [false, true] {
                let w: Vec<u8> = (0..MAX_ROWS * rb)
                    .map(|_| {
                        let mut b = 0u8;
                        for _ in 0..4 {
                            let c = rng(&mut st) % if with_11 { 4 } else { 3 };
                            b = (b << 2) | u8::try_from(c).unwrap_or(0);
                        }
                        b
                    })
                    .collect();
                for acts in 0..3 {
                    let x: Vec<i8> = (0..k)
                        .map(|j| match acts {
                            0 => 127,
                            1 => {
                                if j % 3 == 0 {
                                    -128
                                } else {
                                    -127
                                }
                            }
                            _ => i8::from_le_bytes([rng(&mut st).to_le_bytes()[0]]),
                        })
                        .collect();
                    let p = Prepared::new(TernaryLayout::I2S, &x, k, 1);
                    let want: [i32; MAX_ROWS] = std::array::from_fn(|r| {
                        let mut o = [0i32; 1];
                        scalar::i2s(&w[r * rb..(r + 1) * rb], &p, 0, 1, &mut o);
                        o[0]
                    });
                    let mut got = [0i32; MAX_ROWS];
                    scalar::i2s_rows(&w, &p, 0, !with_11, &mut got);
                    assert_eq!(got, want);
                    for isa in supported_isas() {
                        let Some(several) = kernels_for(isa).and_then(|t| t.i2s_rows) else {
                            continue;
                        };
                        let n = several.rows;
                        assert!((1..=MAX_ROWS).contains(&n), "{isa:?}: {n} rows a call");
                        let mut got = vec![0i32; n];
                        (several.kernel)(&w[..n * rb], &p, 0, !with_11, &mut got);
                        assert_eq!(
                            got,
                            want[..n],
                            "{isa:?} K {k} code 11 {with_11} acts {acts}"
                        );
                        tested += 1;
                    }
                }
            }
        }
        eprintln!("several-row kernels checked: {tested} cases");
    }
}
