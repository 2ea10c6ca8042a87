//! The table-lookup GEMM for I2_S panels (T-MAC's idea, exact): for every pair of columns and
//! every token, the eight non-zero values a ternary pair can take are computed once, and each
//! row's pair of codes selects one of them with a byte shuffle instead of being multiplied.
//!
//! ```text
//! pair q = 8g + 2b + h of panel group g (b = 0..3, h = 0..1): columns c0 = 16g + 8h + b and
//!   c1 = c0 + 4, whose codes are nibble h of byte 4j + b of the group (row j): n = u0 | u1 << 2
//! table (per token, per pair), eight i16, 16 bytes:
//!   e:     0    1     2    3     4        5          6        7
//!   value  a0   −a0   a1   −a1   a0 + a1  −(a0 + a1)  a0 − a1  a1 − a0     (a = the int8 activations)
//! index word (per row, per pair): bytes (2e, 2e + 1), or 0x80 0x80 when both weights are 0
//! ```
//! `vpshufb` with the table in both 128-bit lanes and 16 index words turns one register into
//! the 16 rows' `w0·a0 + w1·a1` as i16 (an index byte with bit 7 set reads 0). That is one
//! shuffle and one add per 32 multiply-adds, where `vpmaddubsw` needs the same two plus the
//! planes' decoding and the activations' broadcasts. The index words are expanded from the
//! panels (2 bits per weight) per block of two panels into a per-thread scratch (8 bits per
//! weight), once per call, and reused by every token of the call.
//!
//! The sums are `Σ w·q` exactly (|entry| ≤ 256, and i16 partial sums are widened to i32 every
//! [`WIDEN_PAIRS`] pairs), so a matmul through the tables gives the same integers, and the same
//! output bits, as the panel kernels (`Σ u·q − Σ q`). The plain functions here are the scalar
//! twins of the tiers' kernels.

use crate::panel::{PanelGroup, GROUP_COLS, PANEL_ROWS};

/// Column pairs per panel group.
pub const PAIRS_PER_GROUP: usize = GROUP_COLS / 2;
/// Pairs whose i16 sums are added before widening (|Σ| ≤ 64 · 256 = 16384).
pub const WIDEN_PAIRS: usize = 64;
/// Tokens per kernel call.
pub const LUT_TOKENS: usize = 4;
/// Panels per kernel call (the register tile: 2 panels × 4 tokens of i16 sums).
pub const LUT_PANELS: usize = 2;

/// One column pair's eight values for one token (see the module doc).
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PairTable(pub [i16; 8]);

/// One column pair's index words for the 16 rows of a panel.
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PairIdx(pub [u16; 16]);

/// The index word of a pair of zero weights: both bytes read 0.
pub const ZERO_WORD: u16 = 0x8080;

/// Table entry of the pair whose codes are the nibble `n = u0 | u1 << 2` (u = w + 1; the
/// I2_S code 3 is 0, as everywhere), or `None` when both weights are 0.
const fn weight(u: u8) -> i8 {
    match u {
        0 => -1,
        2 => 1,
        _ => 0,
    }
}

const fn entry(n: u8) -> Option<u8> {
    match (weight(n & 3), weight((n >> 2) & 3)) {
        (1, 0) => Some(0),
        (-1, 0) => Some(1),
        (0, 1) => Some(2),
        (0, -1) => Some(3),
        (1, 1) => Some(4),
        (-1, -1) => Some(5),
        (1, -1) => Some(6),
        (-1, 1) => Some(7),
        _ => None,
    }
}

const fn nibble_bytes(hi: bool) -> [u8; 16] {
    let mut t = [0u8; 16];
    let mut n = 0;
    while n < 16 {
        // n < 16, so the cast is exact.
        #[allow(clippy::cast_possible_truncation)]
        let e = entry(n as u8);
        t[n] = match e {
            Some(e) => 2 * e + hi as u8,
            None => 0x80,
        };
        n += 1;
    }
    t
}

/// Low byte of the index word of nibble n (`2e` or 0x80).
pub(crate) const NIBBLE_LO: [u8; 16] = nibble_bytes(false);
/// High byte of the index word of nibble n (`2e + 1` or 0x80).
pub(crate) const NIBBLE_HI: [u8; 16] = nibble_bytes(true);

/// The index word of nibble `n`.
pub fn index_word(n: u8) -> u16 {
    let n = usize::from(n & 15);
    u16::from_le_bytes([NIBBLE_LO[n], NIBBLE_HI[n]])
}

/// The columns of pair `q` (see the module doc).
pub fn pair_columns(q: usize) -> (usize, usize) {
    let g = q / PAIRS_PER_GROUP;
    let b = (q % PAIRS_PER_GROUP) / 2;
    let h = q % 2;
    let c0 = GROUP_COLS * g + 8 * h + b;
    (c0, c0 + 4)
}

/// The eight values of a pair with activations `a0`, `a1`.
pub fn pair_table(a0: i8, a1: i8) -> PairTable {
    let (a0, a1) = (i16::from(a0), i16::from(a1));
    PairTable([a0, -a0, a1, -a1, a0 + a1, -(a0 + a1), a0 - a1, a1 - a0])
}

/// The value an index word selects from a table (`vpshufb`'s rule, byte by byte).
pub fn lookup(t: &PairTable, idx: u16) -> i16 {
    let [lo, hi] = idx.to_le_bytes();
    let bytes: [u8; 16] = {
        let mut b = [0u8; 16];
        for (i, v) in t.0.iter().enumerate() {
            b[2 * i..2 * i + 2].copy_from_slice(&v.to_le_bytes());
        }
        b
    };
    let pick = |i: u8| {
        if i & 0x80 != 0 {
            0
        } else {
            bytes[usize::from(i & 15)]
        }
    };
    i16::from_le_bytes([pick(lo), pick(hi)])
}

/// Tables of tokens `t0 .. t0 + nt` of `x` (`k` activations each, `k` a multiple of 16):
/// `out[(t − t0)·k/2 + q]`.
pub(crate) type TableBuilder = fn(x: &[i8], k: usize, t0: usize, nt: usize, out: &mut [PairTable]);
/// Index words of the `np` panels in `w` (`gpp` groups each): `out[q·np + pi]`.
pub(crate) type Expander = fn(w: &[PanelGroup], gpp: usize, out: &mut [PairIdx]);
/// `Σ_q table[t][q][idx[q][pi] row j]` for `nt ≤ LUT_TOKENS` tokens whose tables start at
/// `tables[0]` (`npairs` per token) and the `np ≤ LUT_PANELS` panels of `idx`
/// (`idx.len() = npairs · np`): `out[t·16np + 16pi + j]`.
pub(crate) type LutKernel =
    fn(idx: &[PairIdx], np: usize, tables: &[PairTable], npairs: usize, nt: usize, out: &mut [i32]);

/// A tier's table-lookup GEMM.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lut {
    pub tables: TableBuilder,
    pub expand: Expander,
    pub kernel: LutKernel,
    /// Fewest tokens in a call for which the tables beat the panel kernel.
    pub min_tokens: usize,
}

/// Plain [`TableBuilder`].
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the x86 tier's fallback; tests
pub(crate) fn tables_plain(x: &[i8], k: usize, t0: usize, nt: usize, out: &mut [PairTable]) {
    let npairs = k / 2;
    for ti in 0..nt {
        let xt = &x[(t0 + ti) * k..(t0 + ti + 1) * k];
        for (q, o) in out[ti * npairs..(ti + 1) * npairs].iter_mut().enumerate() {
            let (c0, c1) = pair_columns(q);
            *o = pair_table(xt[c0], xt[c1]);
        }
    }
}

/// Plain [`Expander`].
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the x86 tier's fallback; tests
pub(crate) fn expand_plain(w: &[PanelGroup], gpp: usize, out: &mut [PairIdx]) {
    let np = w.len() / gpp.max(1);
    for pi in 0..np {
        for (g, grp) in w[pi * gpp..(pi + 1) * gpp].iter().enumerate() {
            for b in 0..4 {
                for h in 0..2 {
                    let q = PAIRS_PER_GROUP * g + 2 * b + h;
                    let dst = &mut out[q * np + pi];
                    for j in 0..PANEL_ROWS {
                        dst.0[j] = index_word(grp.0[4 * j + b] >> (4 * h));
                    }
                }
            }
        }
    }
}

/// Plain [`LutKernel`]: the same lookups, i16 sums widened every [`WIDEN_PAIRS`] pairs.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the x86 tier's fallback; tests
pub(crate) fn kernel_plain(
    idx: &[PairIdx],
    np: usize,
    tables: &[PairTable],
    npairs: usize,
    nt: usize,
    out: &mut [i32],
) {
    for t in 0..nt {
        let tt = &tables[t * npairs..(t + 1) * npairs];
        for pi in 0..np {
            for j in 0..PANEL_ROWS {
                let mut total = 0i32;
                for (chunk, tab) in tt.chunks(WIDEN_PAIRS).enumerate() {
                    let mut part = 0i16;
                    for (i, tq) in tab.iter().enumerate() {
                        let q = chunk * WIDEN_PAIRS + i;
                        part = part.wrapping_add(lookup(tq, idx[q * np + pi].0[j]));
                    }
                    total += i32::from(part);
                }
                out[t * PANEL_ROWS * np + PANEL_ROWS * pi + j] = total;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::{kernels_for, supported_isas};
    use crate::layout::i2s;
    use crate::panel::Panels;
    use crate::Pool;

    fn next(st: &mut u64) -> u64 {
        *st ^= *st << 13;
        *st ^= *st >> 7;
        *st ^= *st << 17;
        *st
    }

    /// Codes: 0..=2 at random, 0..=3 at random (code 11 included), or all 2 (w = +1).
    fn codes(st: &mut u64, n: usize, mode: u64) -> Vec<u8> {
        (0..n)
            .map(|_| match mode {
                0 => u8::try_from(next(st) % 3).unwrap_or(0),
                1 => u8::try_from(next(st) % 4).unwrap_or(0),
                _ => 2,
            })
            .collect()
    }

    /// Activations: random, all −128, all +127.
    fn acts(st: &mut u64, n: usize, mode: u64) -> Vec<i8> {
        (0..n)
            .map(|_| match mode {
                0 => i8::from_le_bytes([next(st).to_le_bytes()[0]]),
                1 => -128,
                _ => 127,
            })
            .collect()
    }

    /// The plain lookup GEMM gives the panel kernels' integers: `Σ u·q − Σ q` per row and
    /// token, including sums at the limits (every weight +1, activations all −128 or +127).
    #[test]
    fn lookup_sums_equal_panel_sums() {
        let mut st = 0x5EED_1234_ABCD_0001u64;
        let pool = Pool::new(1);
        for (k, np) in [(128usize, 1usize), (256, 2), (640, 2), (2560, 1), (6912, 2)] {
            for wmode in 0..3 {
                for amode in 0..3 {
                    let n_out = PANEL_ROWS * np;
                    let w = i2s::pack_codes(&codes(&mut st, n_out * k, wmode), 1.0).unwrap();
                    let p = Panels::from_i2s(&w[..n_out * k / 4], n_out, k, &pool).unwrap();
                    let gpp = p.groups_per_panel();
                    let nt = 3;
                    let x = acts(&mut st, nt * k, amode);
                    let mut want = vec![0i32; nt * n_out];
                    crate::panel::scalar_kernel(p.panels(0..np), gpp, &x, k, 0, nt, &mut want);
                    for t in 0..nt {
                        let sum: i32 = x[t * k..(t + 1) * k].iter().map(|&q| i32::from(q)).sum();
                        for v in &mut want[t * n_out..(t + 1) * n_out] {
                            *v -= sum;
                        }
                    }
                    let npairs = k / 2;
                    let mut idx = vec![PairIdx::default(); npairs * np];
                    expand_plain(p.panels(0..np), gpp, &mut idx);
                    let mut tabs = vec![PairTable::default(); nt * npairs];
                    tables_plain(&x, k, 0, nt, &mut tabs);
                    let mut got = vec![i32::MIN; nt * n_out];
                    kernel_plain(&idx, np, &tabs, npairs, nt, &mut got);
                    assert_eq!(got, want, "K {k} panels {np} weights {wmode} acts {amode}");
                }
            }
        }
    }

    /// Every tier's table builder, expander and kernel against the plain twins, call by call:
    /// K from one panel group row up, one and two panels, every token count, token offsets.
    #[test]
    fn lookup_tiers_match_plain_twins() {
        let mut st = 0x0DDB_A11C_0FFE_E123u64;
        let pool = Pool::new(1);
        let mut tested = 0;
        for isa in supported_isas() {
            let Some(lut) = kernels_for(isa).and_then(|t| t.i2s_lut) else {
                continue;
            };
            for k in [128usize, 384, 640, 2560] {
                for np in 1..=LUT_PANELS {
                    for mode in 0..3 {
                        let n_out = PANEL_ROWS * np;
                        let c = codes(&mut st, n_out * k, mode.min(1));
                        let w = i2s::pack_codes(&c, 1.0).unwrap();
                        let p = Panels::from_i2s(&w[..n_out * k / 4], n_out, k, &pool).unwrap();
                        let gpp = p.groups_per_panel();
                        let npairs = k / 2;
                        let mut want_idx = vec![PairIdx::default(); npairs * np];
                        expand_plain(p.panels(0..np), gpp, &mut want_idx);
                        let mut idx = vec![PairIdx([7; 16]); npairs * np];
                        (lut.expand)(p.panels(0..np), gpp, &mut idx);
                        assert_eq!(idx, want_idx, "{isa:?} expand K {k} panels {np}");
                        let n_tok = LUT_TOKENS + 3;
                        let x = acts(&mut st, n_tok * k, mode);
                        for t0 in [0usize, 3] {
                            for nt in 1..=LUT_TOKENS {
                                let mut want_t = vec![PairTable::default(); nt * npairs];
                                tables_plain(&x, k, t0, nt, &mut want_t);
                                let mut tabs = vec![PairTable([9; 8]); nt * npairs];
                                (lut.tables)(&x, k, t0, nt, &mut tabs);
                                assert_eq!(tabs, want_t, "{isa:?} tables K {k} t0 {t0} nt {nt}");
                                let mut want = vec![0i32; nt * n_out];
                                kernel_plain(&idx, np, &tabs, npairs, nt, &mut want);
                                let mut got = vec![i32::MIN; nt * n_out];
                                (lut.kernel)(&idx, np, &tabs, npairs, nt, &mut got);
                                assert_eq!(got, want, "{isa:?} K {k} panels {np} nt {nt}");
                                tested += 1;
                            }
                        }
                    }
                }
            }
        }
        eprintln!("lookup kernel calls checked: {tested}");
    }

    #[test]
    fn entries_cover_every_nonzero_pair_once() {
        let mut seen = [0u8; 8];
        for n in 0..16u8 {
            if let Some(e) = entry(n) {
                seen[usize::from(e)] += 1;
            }
        }
        // Codes 0..=2 per weight give each of the 8 non-zero pairs once; code 3 (read as 0)
        // repeats some of them.
        assert!(seen.iter().all(|&c| c >= 1));
        for a0 in [-128i8, -127, -1, 0, 1, 5, 127] {
            for a1 in [-128i8, -3, 0, 2, 127] {
                let t = pair_table(a0, a1);
                for n in 0..16u8 {
                    let w = |u: u8| i16::from(u == 2) - i16::from(u == 0);
                    let want = w(n & 3) * i16::from(a0) + w((n >> 2) & 3) * i16::from(a1);
                    assert_eq!(lookup(&t, index_word(n)), want, "n {n} a {a0} {a1}");
                }
            }
        }
    }

    #[test]
    fn pairs_tile_every_column_once() {
        let mut seen = [0u8; 64];
        for q in 0..32 {
            let (c0, c1) = pair_columns(q);
            seen[c0] += 1;
            seen[c1] += 1;
        }
        assert!(seen.iter().all(|&c| c == 1));
    }
}
