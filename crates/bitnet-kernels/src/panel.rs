//! I2_S weights repacked at load for the integer GEMM (prefill, batched decode) and the
//! matvec alike: panels of 16 rows whose codes sit where `vpdpbusd` wants them.
//!
//! ```text
//! panel p = rows 16p .. 16p+15 (rows past n_out are padding: code 01, value 0)
//! group g of a panel = columns 16g .. 16g+15, 64 bytes, one `PanelGroup`
//! byte 4j + b of group g (row 16p + j, b = 0..3):
//!   bits 1 0  | 3 2    | 5 4    | 7 6
//!   col  16g+b| 16g+4+b| 16g+8+b| 16g+12+b        (plane s = bits 2s+1..2s ↔ column 16g+4s+b)
//! code u = value + 1 (0, 1, 2); the never-written I2_S code 11 is stored as 01 (value 0)
//! ```
//! Plane s of a group (`(v >> 2s) & 3` on every byte) holds, in 32-bit lane j, row j's codes
//! for the four consecutive columns `16g+4s .. 16g+4s+3`: one `vpdpbusd` against those four
//! activation bytes broadcast to every lane adds `Σ u·q` of the four columns to all 16 rows.
//! The integer sums are the same as the I2_S kernels' (`Σ u·q`), so every output is
//! bit-identical whichever path computes it.

use std::ops::Range;

use crate::layout::i2s;
use crate::pool::{Pool, SharedMut};
use crate::KernelError;

/// Rows per panel.
pub const PANEL_ROWS: usize = 16;
/// Columns per group.
pub const GROUP_COLS: usize = 16;

/// 16 rows × 16 columns of 2-bit codes (see the module doc), 64-byte aligned.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PanelGroup(pub [u8; 64]);

/// A whole matrix in panels: `n_panels × groups_per_panel` groups, panel-major.
#[derive(Debug)]
pub struct Panels {
    groups: Vec<PanelGroup>,
    n_out: usize,
    n_in: usize,
}

impl Panels {
    /// Repack the packed codes of an I2_S matrix (`n_out · n_in / 4` bytes, `n_in` a multiple
    /// of 128), splitting the work over `pool`.
    pub fn from_i2s(
        codes: &[u8],
        n_out: usize,
        n_in: usize,
        pool: &Pool,
    ) -> Result<Self, KernelError> {
        if !n_in.is_multiple_of(i2s::BLOCK_ELEMS) {
            return Err(KernelError::BadRowLength {
                layout: crate::TernaryLayout::I2S,
                cols: n_in,
                multiple: i2s::BLOCK_ELEMS,
            });
        }
        let row_bytes = n_in / 4;
        let need = n_out.checked_mul(row_bytes).ok_or(KernelError::Overflow {
            what: "panel bytes",
        })?;
        if codes.len() != need {
            return Err(KernelError::ShapeMismatch {
                what: "I2_S codes",
                expected: need,
                got: codes.len(),
            });
        }
        let n_panels = n_out.div_ceil(PANEL_ROWS);
        let gpp = n_in / GROUP_COLS;
        let total = n_panels.checked_mul(gpp).ok_or(KernelError::Overflow {
            what: "panel groups",
        })?;
        let mut groups = vec![PanelGroup([0; 64]); total];
        {
            let dst = SharedMut::new(&mut groups);
            let f = |ps: Range<usize>| {
                for p in ps {
                    // SAFETY: panels are disjoint between chunks; p < n_panels so the range
                    // p·gpp .. (p+1)·gpp lies inside `groups`.
                    let out = unsafe { dst.slice_mut(p * gpp..(p + 1) * gpp) };
                    pack_panel(codes, n_out, n_in, p, out);
                }
            };
            pool.for_rows(n_panels, 1, &f);
        }
        Ok(Panels {
            groups,
            n_out,
            n_in,
        })
    }

    /// Rows of the matrix (without padding).
    pub fn n_out(&self) -> usize {
        self.n_out
    }
    /// Columns.
    pub fn n_in(&self) -> usize {
        self.n_in
    }
    /// Panels (the last one may be part padding).
    pub fn n_panels(&self) -> usize {
        self.n_out.div_ceil(PANEL_ROWS)
    }
    /// Groups per panel (`n_in / 16`).
    pub fn groups_per_panel(&self) -> usize {
        self.n_in / GROUP_COLS
    }
    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        self.groups.len() * std::mem::size_of::<PanelGroup>()
    }
    /// Panels `ps` as one slice of groups.
    pub(crate) fn panels(&self, ps: Range<usize>) -> &[PanelGroup] {
        let gpp = self.groups_per_panel();
        &self.groups[ps.start * gpp..ps.end * gpp]
    }

    /// The code (0..=2) of row `r`, column `c` (tests and reference use).
    pub fn code(&self, r: usize, c: usize) -> u8 {
        let gpp = self.groups_per_panel();
        let g = &self.groups[(r / PANEL_ROWS) * gpp + c / GROUP_COLS];
        let o = c % GROUP_COLS;
        (g.0[4 * (r % PANEL_ROWS) + o % 4] >> (2 * (o / 4))) & 3
    }
}

/// Fill panel `p`'s groups from the I2_S codes.
fn pack_panel(codes: &[u8], n_out: usize, n_in: usize, p: usize, out: &mut [PanelGroup]) {
    let row_bytes = n_in / 4;
    for j in 0..PANEL_ROWS {
        let r = PANEL_ROWS * p + j;
        if r >= n_out {
            // Padding rows: code 01 (value 0) in every plane.
            for g in out.iter_mut() {
                g.0[4 * j..4 * j + 4].fill(0x55);
            }
            continue;
        }
        let row = &codes[r * row_bytes..(r + 1) * row_bytes];
        // I2_S block bb, byte pb holds columns 128bb + 32l + pb (l = 0..3, bits 7−2l..6−2l).
        for (bb, blk) in row.chunks_exact(i2s::BLOCK_BYTES).enumerate() {
            for (pb, &raw) in blk.iter().enumerate() {
                let v = i2s::sanitize_byte(raw);
                let byte = 4 * j + pb % 4;
                let shift = 2 * ((pb % 16) / 4);
                for l in 0..4 {
                    let c = (v >> (6 - 2 * l)) & 3;
                    out[8 * bb + 2 * l + pb / 16].0[byte] |= c << shift;
                }
            }
        }
    }
}

/// The scalar twin of the panel kernels: `Σ u·q` of every row of the `w.len() / gpp`
/// consecutive panels in `w` (`gpp` groups each) for tokens `t0 .. t0 + nt` of `x` (`k` = 16·gpp
/// activations per token), into `out[ti · 16P + 16pi + j]`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // called by the x86 tiers and tests
pub(crate) fn scalar_kernel(
    w: &[PanelGroup],
    gpp: usize,
    x: &[i8],
    k: usize,
    t0: usize,
    nt: usize,
    out: &mut [i32],
) {
    let np = w.len() / gpp.max(1);
    for pi in 0..np {
        let pw = &w[pi * gpp..(pi + 1) * gpp];
        for ti in 0..nt {
            let xt = &x[(t0 + ti) * k..(t0 + ti + 1) * k];
            for j in 0..PANEL_ROWS {
                let mut acc = 0i32;
                for (g, grp) in pw.iter().enumerate() {
                    for b in 0..4 {
                        let byte = grp.0[4 * j + b];
                        for s in 0..4 {
                            let u = i32::from((byte >> (2 * s)) & 3);
                            acc += u * i32::from(xt[GROUP_COLS * g + 4 * s + b]);
                        }
                    }
                }
                out[ti * PANEL_ROWS * np + PANEL_ROWS * pi + j] = acc;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::{kernels_for, supported_isas};
    use crate::{TernaryLayout, TernaryMatrix};

    fn next(st: &mut u64) -> u64 {
        *st ^= *st << 13;
        *st ^= *st >> 7;
        *st ^= *st << 17;
        *st
    }

    fn random_i2s(st: &mut u64, n_out: usize, k: usize, with_11: bool) -> Vec<u8> {
        let codes: Vec<u8> = (0..n_out * k)
            .map(|_| u8::try_from(next(st) % if with_11 { 4 } else { 3 }).unwrap_or(0))
            .collect();
        i2s::pack_codes(&codes, 0.75).unwrap()
    }

    fn random_acts(st: &mut u64, n: usize, mode: u64) -> Vec<i8> {
        (0..n)
            .map(|j| match mode {
                0 => 127,
                1 => {
                    if j % 3 == 0 {
                        -128
                    } else {
                        -127
                    }
                }
                _ => i8::from_le_bytes([next(st).to_le_bytes()[0]]),
            })
            .collect()
    }

    /// Every tier's panel kernel against the scalar twin, call by call: one and two panels,
    /// every token count up to the tier's tile, token offsets, K from one I2_S block up.
    #[test]
    fn panel_kernels_match_scalar_twin() {
        let mut st = 0xDEAD_BEEF_0BAD_F00Du64;
        let pool = Pool::new(1);
        let mut tested = 0;
        for isa in supported_isas() {
            let Some(t) = kernels_for(isa) else { continue };
            let Some(kern) = t.i2s_panel else { continue };
            for k in [128usize, 256, 640, 2560] {
                for np in [1usize, 2] {
                    let n_out = 16 * np;
                    let with_11 = next(&mut st).is_multiple_of(2);
                    let w = random_i2s(&mut st, n_out, k, with_11);
                    let p = Panels::from_i2s(&w[..n_out * k / 4], n_out, k, &pool).unwrap();
                    let gpp = p.groups_per_panel();
                    for mode in 0..3 {
                        let n_tok = t.panel_tokens + 3;
                        let x = random_acts(&mut st, n_tok * k, mode);
                        for t0 in [0usize, 3] {
                            for nt in 1..=t.panel_tokens {
                                let mut want = vec![0i32; nt * n_out];
                                scalar_kernel(p.panels(0..np), gpp, &x, k, t0, nt, &mut want);
                                let mut got = vec![i32::MIN; nt * n_out];
                                kern(p.panels(0..np), gpp, &x, k, t0, nt, &mut got);
                                assert_eq!(got, want, "{isa:?} K {k} panels {np} t0 {t0} nt {nt}");
                                tested += 1;
                            }
                        }
                    }
                }
            }
        }
        eprintln!("panel kernel calls checked: {tested}");
    }

    /// The AMX tier's GEMM against the scalar twin, call by call: one and two panels, token
    /// counts around its 16-row tiles and up to its chunk, token offsets, K from one I2_S
    /// block (two tile blocks) up; then at the extremes of the sums.
    #[test]
    fn amx_gemm_matches_scalar_twin() {
        let Some(amx) = kernels_for(crate::Isa::Amx).and_then(|t| t.i2s_amx) else {
            eprintln!(
                "AMX tier not available on this CPU ({}): its GEMM is not run here",
                crate::cpu::amx()
                    .err()
                    .unwrap_or("the CPU lacks the AVX-512 VNNI tier")
            );
            return;
        };
        let mut st = 0x5eed_a3c5_0000_0001u64;
        let pool = Pool::new(1);
        let mut codes = Vec::new();
        let mut tested = 0;
        for k in [128usize, 384, 2560] {
            for np in [1usize, 2] {
                let n_out = 16 * np;
                let w = random_i2s(&mut st, n_out, k, np == 2);
                let p = Panels::from_i2s(&w[..n_out * k / 4], n_out, k, &pool).unwrap();
                let gpp = p.groups_per_panel();
                let n_tok = amx.chunk_tokens + 5;
                for mode in 0..3 {
                    let x = random_acts(&mut st, n_tok * k, mode);
                    for t0 in [0usize, 5] {
                        for nt in [1usize, 2, 15, 16, 17, 31, 32, 33, 64, amx.chunk_tokens] {
                            let mut want = vec![0i32; nt * n_out];
                            scalar_kernel(p.panels(0..np), gpp, &x, k, t0, nt, &mut want);
                            let mut got = vec![i32::MIN; nt * n_out];
                            (amx.gemm)(p.panels(0..np), gpp, &x, k, t0, nt, &mut got, &mut codes);
                            assert_eq!(got, want, "K {k} panels {np} t0 {t0} nt {nt} mode {mode}");
                            tested += 1;
                        }
                    }
                }
            }
        }
        // Every code 2 against activations all −128 or all +127 over K = 6912.
        let k = 6912;
        let w = i2s::pack_codes(&vec![2u8; 32 * k], 1.0).unwrap();
        let p = Panels::from_i2s(&w[..32 * k / 4], 32, k, &pool).unwrap();
        for fill in [-128i8, 127] {
            let x = vec![fill; 33 * k];
            let mut got = vec![0i32; 33 * 32];
            (amx.gemm)(
                p.panels(0..2),
                p.groups_per_panel(),
                &x,
                k,
                0,
                33,
                &mut got,
                &mut codes,
            );
            let want = 2 * i32::from(fill) * i32::try_from(k).unwrap();
            assert!(got.iter().all(|&v| v == want), "fill {fill}");
        }
        eprintln!("AMX GEMM calls checked: {tested}");
    }

    /// Sums at the i16 limits of the `maddubs` kernels: every code 2 (u = 2) against
    /// activations all −128 or all +127, over a row long enough for many widening periods.
    #[test]
    fn panel_kernels_hold_extreme_sums() {
        let pool = Pool::new(1);
        let k = 6912;
        let w = i2s::pack_codes(&vec![2u8; 32 * k], 1.0).unwrap();
        let p = Panels::from_i2s(&w[..32 * k / 4], 32, k, &pool).unwrap();
        let gpp = p.groups_per_panel();
        for fill in [-128i8, 127] {
            let x = vec![fill; 8 * k];
            for isa in supported_isas() {
                let Some(t) = kernels_for(isa) else { continue };
                let Some(kern) = t.i2s_panel else { continue };
                for nt in 1..=t.panel_tokens {
                    let mut got = vec![0i32; nt * 32];
                    kern(p.panels(0..2), gpp, &x, k, 0, nt, &mut got);
                    let want = 2 * i32::from(fill) * i32::try_from(k).unwrap();
                    assert!(
                        got.iter().all(|&v| v == want),
                        "{isa:?} nt {nt} fill {fill}"
                    );
                }
            }
        }
    }

    /// The whole matmul on a repacked matrix, on every tier, equals the scalar tier on the
    /// original layout bit for bit: ragged row counts (padding panels), odd panel counts,
    /// token counts around the tiles, one and two threads.
    #[test]
    fn repacked_matmul_is_bit_identical_on_every_tier() {
        let mut st = 0x0123_4567_89AB_CDEFu64;
        for (n_out, k) in [
            (1usize, 128usize),
            (15, 256),
            (17, 128),
            (40, 384),
            (70, 640),
        ] {
            let w = random_i2s(&mut st, n_out, k, n_out % 2 == 1);
            let plain = TernaryMatrix::new(TernaryLayout::I2S, n_out, k, &w, None).unwrap();
            let mut packed = plain.clone();
            let pool1 = Pool::new(1);
            assert_eq!(
                packed.repack_always(&pool1).unwrap(),
                n_out.div_ceil(16) * k * 4
            );
            // 70 tokens: more than one chunk of the lookup GEMM's tables; 15–17, 64 and 513
            // around the AMX tiles (16 rows) and its chunks (128 tokens).
            for n_tok in [1usize, 2, 5, 8, 9, 13, 15, 16, 17, 20, 64, 70, 513] {
                let x = random_acts(&mut st, n_tok * k, 2);
                let s: Vec<f32> = (0..n_tok).map(|i| 1.5 + i as f32 * 0.25).collect();
                let mut want = vec![0f32; n_tok * n_out];
                plain
                    .matmul_on(crate::Isa::Scalar, &x, &s, &mut want, &pool1)
                    .unwrap()
                    .unwrap();
                for threads in [1usize, 2] {
                    let pool = Pool::new(threads);
                    for isa in supported_isas() {
                        let mut got = vec![f32::NAN; n_tok * n_out];
                        packed
                            .matmul_on(isa, &x, &s, &mut got, &pool)
                            .unwrap()
                            .unwrap();
                        let same = got
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{isa:?} {n_out}x{k} tokens {n_tok} threads {threads}");
                    }
                }
            }
        }
    }

    /// For each of `n_toks` (random activations): every tier, one and two threads, gives
    /// `want`'s scalar-tier output bit for bit from each of `mats`.
    fn assert_tiers_give(
        want: &TernaryMatrix<'_>,
        mats: &[(&TernaryMatrix<'_>, &str)],
        n_toks: &[usize],
        st: &mut u64,
        label: &str,
    ) {
        let (n_out, k) = (want.n_out(), want.n_in());
        for &n_tok in n_toks {
            let x = random_acts(st, n_tok * k, 2);
            let s: Vec<f32> = (0..n_tok).map(|i| 1.5 + i as f32 * 0.25).collect();
            let run = |m: &TernaryMatrix<'_>, isa, pool: &Pool| {
                let mut out = vec![f32::NAN; n_tok * n_out];
                m.matmul_on(isa, &x, &s, &mut out, pool).unwrap().unwrap();
                out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            let expected = run(want, crate::Isa::Scalar, &Pool::new(1));
            for threads in [1usize, 2] {
                let pool = Pool::new(threads);
                for isa in supported_isas() {
                    for &(m, what) in mats {
                        assert_eq!(
                            run(m, isa, &pool),
                            expected,
                            "{label} {what} {isa:?} {n_out}x{k} tokens {n_tok} threads {threads}"
                        );
                    }
                }
            }
        }
    }

    /// A block-layout matrix (TQ2_0, TQ1_0, BitNet32F16, Split32) whose blocks share one
    /// scale computes what the I2_S matrix of the same codes with that scale as β computes,
    /// bit for bit, on every tier, repacked into the panels (`repack_always`) or not: ragged
    /// row counts, token counts around the tiles, one and two threads. Rows with a scale each
    /// give each row's I2_S result, and rows whose block scales differ the block kernels'
    /// result, repacked (the scales kept apart) or not; a code the layout never writes
    /// (TQ2_0's 3, the 32-blocks' 0) is not repacked.
    #[test]
    fn repacked_block_layouts_are_bit_exact() {
        use crate::layout::{seq32, tq1_0, tq2_0};
        const LAYOUTS: [TernaryLayout; 4] = [
            TernaryLayout::Tq2_0,
            TernaryLayout::Tq1_0,
            TernaryLayout::BitNet32F16,
            TernaryLayout::Split32WithSibling,
        ];
        // The layout's bytes and, for Split32, its sibling scales (f32).
        let pack = |layout: TernaryLayout, values: &[i8], scales: &[f32]| match layout {
            TernaryLayout::Tq2_0 => (tq2_0::pack(values, scales).unwrap(), None),
            TernaryLayout::Tq1_0 => (tq1_0::pack(values, scales).unwrap(), None),
            TernaryLayout::BitNet32F16 => (seq32::pack_inline(values, scales).unwrap(), None),
            _ => {
                let (codes, sib) = seq32::pack_split(values, scales).unwrap();
                (codes, Some(sib))
            }
        };
        let mut st = 0x7A11_5CA1_E5EE_D001u64;
        let beta = 0.093_75f32; // exact in f16
        for (n_out, k) in [
            (1usize, 256usize),
            (15, 256),
            (17, 512),
            (40, 768),
            (9, 384),
        ] {
            let values: Vec<i8> = (0..n_out * k)
                .map(|_| i8::try_from(next(&mut st) % 3).unwrap_or(0) - 1)
                .collect();
            let i2s_bytes = i2s::pack_values(&values, beta).unwrap();
            let i2s_m = TernaryMatrix::new(TernaryLayout::I2S, n_out, k, &i2s_bytes, None).unwrap();
            let pool1 = Pool::new(1);
            // K = 384 is not a whole number of TQ blocks.
            let layouts = LAYOUTS.iter().filter(|l| k.is_multiple_of(l.block_elems()));
            for &layout in layouts {
                let be = layout.block_elems();
                let what = format!("{layout:?}");
                let (bytes, sib) = pack(layout, &values, &vec![beta; n_out * k / be]);
                let plain = TernaryMatrix::new(layout, n_out, k, &bytes, sib.as_deref()).unwrap();
                let mut packed = plain.clone();
                assert_eq!(
                    packed.repack_always(&pool1).unwrap(),
                    n_out.div_ceil(16) * k * 4,
                    "{what}"
                );
                let mats = [(&packed, "repacked"), (&plain, "as stored")];
                assert_tiers_give(&i2s_m, &mats, &[1, 2, 5, 16, 17, 70], &mut st, &what);

                // A scale per row (each row's blocks alike): the panels with the scales
                // apart; every row computes what a one-row I2_S matrix with that row's scale
                // computes, repacked or not.
                if n_out > 1 {
                    let row_d = |r: usize| beta * (1.0 + r as f32 / 8.0);
                    let per_row: Vec<f32> = (0..n_out)
                        .flat_map(|r| std::iter::repeat_n(row_d(r), k / be))
                        .collect();
                    let n_tok = 5;
                    let x = random_acts(&mut st, n_tok * k, 2);
                    let s: Vec<f32> = (0..n_tok).map(|i| 1.25 + i as f32 * 0.5).collect();
                    let (bytes, sib) = pack(layout, &values, &per_row);
                    let plain =
                        TernaryMatrix::new(layout, n_out, k, &bytes, sib.as_deref()).unwrap();
                    let mut packed = plain.clone();
                    assert!(packed.repack_always(&pool1).unwrap() > 0, "{what}");
                    for isa in supported_isas() {
                        for (m, how) in [(&packed, "repacked"), (&plain, "as stored")] {
                            let mut out = vec![f32::NAN; n_tok * n_out];
                            m.matmul_on(isa, &x, &s, &mut out, &pool1).unwrap().unwrap();
                            for r in 0..n_out {
                                let row = &values[r * k..(r + 1) * k];
                                let one = i2s::pack_values(row, row_d(r)).unwrap();
                                let m1 = TernaryMatrix::new(TernaryLayout::I2S, 1, k, &one, None)
                                    .unwrap();
                                let mut y = vec![f32::NAN; n_tok];
                                m1.matmul_on(crate::Isa::Scalar, &x, &s, &mut y, &pool1)
                                    .unwrap()
                                    .unwrap();
                                for t in 0..n_tok {
                                    assert_eq!(
                                        out[t * n_out + r].to_bits(),
                                        y[t].to_bits(),
                                        "{what} {how} {isa:?} row {r} token {t}"
                                    );
                                }
                            }
                        }
                    }
                }

                // A scale per block (random, one row keeping one scale): the panels with the
                // scales apart compute what the block kernels compute, bit for bit. Split32's
                // f32 scales are not all f16 values here (kept as f32 beside the panels).
                let nb = k / be;
                if n_out * nb > 1 {
                    let f32_only = if layout == TernaryLayout::Split32WithSibling {
                        1.000_1
                    } else {
                        1.0
                    };
                    let mut mixed: Vec<f32> = (0..n_out * nb)
                        .map(|_| beta * (0.5 + (next(&mut st) % 64) as f32 / 32.0) * f32_only)
                        .collect();
                    mixed[..nb].fill(beta);
                    let (bytes, sib) = pack(layout, &values, &mixed);
                    let plain =
                        TernaryMatrix::new(layout, n_out, k, &bytes, sib.as_deref()).unwrap();
                    let mut packed = plain.clone();
                    assert!(packed.repack_always(&pool1).unwrap() > 0, "{what}");
                    let what = format!("{what} mixed");
                    assert_tiers_give(&plain, &[(&packed, "")], &[1, 2, 5, 17, 70], &mut st, &what);
                }

                // A code the layout never writes: nothing is repacked.
                let (mut bytes, sib) = pack(layout, &values, &vec![beta; n_out * k / be]);
                match layout {
                    // +2 in TQ2_0
                    TernaryLayout::Tq2_0 => bytes[5] |= 0b11 << 2,
                    // −2 in the 32-blocks (element 1 of the first block)
                    TernaryLayout::BitNet32F16 | TernaryLayout::Split32WithSibling => {
                        bytes[0] &= !(0b11 << 2)
                    }
                    // TQ1_0's base-3 digits have no such code.
                    _ => continue,
                }
                let mut m = TernaryMatrix::new(layout, n_out, k, &bytes, sib.as_deref()).unwrap();
                assert_eq!(m.repack_always(&pool1).unwrap(), 0, "{what}");
            }
        }
    }

    /// QK256 (values ±1, ±2, no zero) is never repacked into the ternary panels.
    #[test]
    fn qk256_is_not_repacked() {
        let values: Vec<i8> = (0..16 * 256).map(|i| [-2i8, -1, 1, 2][i % 4]).collect();
        let bytes = crate::layout::qk256::pack(&values, 256).unwrap();
        let mut m = TernaryMatrix::new(TernaryLayout::Qk256, 16, 256, &bytes, None).unwrap();
        assert_eq!(m.repack_always(&Pool::new(1)).unwrap(), 0);
    }

    #[test]
    fn panel_codes_match_i2s_codes() {
        let mut st = 0x1234_5678_9abc_def1u64;
        for (n_out, k) in [
            (1usize, 128usize),
            (16, 128),
            (17, 256),
            (40, 640),
            (33, 384),
        ] {
            let codes: Vec<u8> = (0..n_out * k)
                .map(|_| {
                    st ^= st << 13;
                    st ^= st >> 7;
                    st ^= st << 17;
                    u8::try_from(st % 4).unwrap_or(0)
                })
                .collect();
            let packed = i2s::pack_codes(&codes, 1.0).unwrap();
            let pool = Pool::new(2);
            let p = Panels::from_i2s(&packed[..n_out * k / 4], n_out, k, &pool).unwrap();
            assert_eq!(p.n_panels(), n_out.div_ceil(16));
            for r in 0..p.n_panels() * 16 {
                for c in 0..k {
                    let want = if r < n_out {
                        match codes[r * k + c] {
                            3 => 1,
                            c => c,
                        }
                    } else {
                        1
                    };
                    assert_eq!(p.code(r, c), want, "row {r} col {c} of {n_out}x{k}");
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let pool = Pool::new(1);
        assert!(Panels::from_i2s(&[0u8; 32], 1, 100, &pool).is_err());
        assert!(Panels::from_i2s(&[0u8; 31], 1, 128, &pool).is_err());
    }
}
