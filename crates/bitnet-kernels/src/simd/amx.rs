//! The AMX-INT8 tier: the I2_S GEMM of prompt batches and batched decode on the tile unit
//! (`tdpbsud`, signed int8 activations × unsigned 2-bit codes widened to bytes), everything
//! else from the AVX-512 VNNI tier.
//!
//! ```text
//! tile registers (palette 1; a tile is at most 16 rows × 64 bytes):
//!   tmm0 tmm1   C  i32  tokens t..t+16    × rows of panel 0 | panel 1   (16 i32 per row)
//!   tmm2 tmm3   C  i32  tokens t+16..t+32 × rows of panel 0 | panel 1
//!   tmm4 tmm5   A  i8   tokens t..t+16 | t+16..t+32 × 64 columns 64kb .. 64kb+63
//!   tmm6 tmm7   B  u8   panel 0 | panel 1: row r = columns 64kb+4r .. +3, bytes 4j..4j+3 = panel row j
//! tdpbsud C, A, B:   C[m][j] += Σ_c A[m][c] · B[c/4][4j + c%4]   (exact i32 sums)
//! ```
//! Row `4g + s` of a B tile is plane s of group g of the panel's 64-column block (see
//! `crate::panel`: plane s holds, in 32-bit lane j, row j's codes of columns 16g+4s .. +3),
//! so a block is unpacked into B form with one shift and one mask per plane, into a small
//! ring per panel that stays in L1, one block ahead of the tile loads that read it. Each pair
//! of token tiles unpacks for itself: with eight tile registers no more tokens can share an
//! unpacked block, and keeping whole rows unpacked for the next pair would send them to L2
//! and back (measured slower). Unpacking a slice of K (8 or 16 blocks, in L1) once for every
//! pair of the call, the accumulators stored and reloaded between slices, was slower too
//! (0.65–0.9× of this, with or without the next slice unpacked during the current one): the
//! pairs' A rows then stream in short runs. Skipping the unpacking altogether (wrong sums, a
//! bound) gains only 1.1–1.45×. A tiles are read straight from the activations (stride K). The
//! sums `Σ u·q` equal the VNNI panels' and the scalar twin's exactly, so the float epilogue
//! gives the same bits on every tier.
//!
//! Stable Rust has no AMX intrinsics: the six instructions used are written with `asm!` in
//! the small `tiles` module below, with the conditions each needs. The tier exists only
//! where `crate::cpu::amx` found AMX-INT8 in CPUID, the tile state enabled in XCR0, and the
//! kernel's permission for it granted (`arch_prctl(ARCH_REQ_XCOMP_PERM)`).

use std::arch::x86_64::*;

use crate::panel::{PanelGroup, GROUP_COLS, PANEL_ROWS};
use crate::tier::{Amx, Isa, Kernels};

/// The AMX tier's table: the VNNI tier plus the tile GEMM.
pub(crate) static TABLE: Kernels = Kernels {
    isa: Isa::Amx,
    i2s_amx: Some(Amx {
        gemm,
        chunk_tokens: CHUNK_TOKENS,
        min_tokens: MIN_TOKENS,
    }),
    ..super::avx512::TABLE_VNNI
};

/// Fewest tokens in a matmul for which the tiles beat the VNNI panels. At 4 and 6 tokens the
/// two are level (a B tile is unpacked and loaded for each 64 columns of each panel whatever
/// the token count); at 8 the tiles are 1.3–1.7× faster, at 16 2.0–2.8×
/// (`BENCH_TOKENS=4,6,8,16,128 cargo bench -p bitnet-kernels --bench gemm`, Intel Xeon
/// Emerald Rapids, 2-vCPU virtual machine, 1 and 2 threads).
pub(crate) const MIN_TOKENS: usize = 8;

/// Most tokens of one call (the caller loops over chunks of this many): 128 tokens of
/// K = 6912 are 864 KiB of activations, which stay in L2 while the panels go by.
pub(crate) const CHUNK_TOKENS: usize = 128;

/// Prefetch distance of the codes in groups (64 bytes each): 4 KiB ahead.
const PF_GROUPS: usize = 64;

/// Columns per tile block (one A row, one B tile).
const KB: usize = 64;
/// Bytes of one unpacked B tile.
const B_TILE: usize = 16 * KB;
/// Unpacked B tiles kept per panel: a ring that stays in L1 (4 KiB per panel).
const RING: usize = 4;

/// Bytes of scratch a call needs (the rings of two panels, and room to align them).
pub(crate) const SCRATCH_BYTES: usize = 2 * RING * B_TILE + 64;

/// The AMX GEMM (see `crate::tier::AmxKernel`): `Σ u·q` of the rows of the one or two panels
/// in `w` (`gpp` groups each) for tokens `t0 .. t0 + nt` of `x` (`k` bytes per token), into
/// `out[ti·16P + 16pi + j]`; `codes` is scratch for the unpacked codes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    w: &[PanelGroup],
    gpp: usize,
    x: &[i8],
    k: usize,
    t0: usize,
    nt: usize,
    out: &mut [i32],
    codes: &mut Vec<u8>,
) {
    let np = w.len().checked_div(gpp).unwrap_or(0);
    let ok = gpp > 0
        && k == GROUP_COLS * gpp
        && k.is_multiple_of(KB)
        && (np == 1 || np == 2)
        && w.len() == np * gpp
        && nt <= CHUNK_TOKENS
        && t0
            .checked_add(nt)
            .and_then(|e| e.checked_mul(k))
            .is_some_and(|e| x.len() >= e)
        && out.len() >= nt * PANEL_ROWS * np;
    if !ok {
        return crate::panel::scalar_kernel(w, gpp, x, k, t0, nt, out);
    }
    if nt == 0 {
        return;
    }
    if codes.len() < SCRATCH_BYTES {
        codes.resize(SCRATCH_BYTES, 0);
    }
    // The rings start on a 64-byte boundary: rows that straddle two cache lines would cost
    // two accesses each.
    let aligned = codes.as_ptr().align_offset(64).min(64);
    // SAFETY: this kernel is only in the AMX table, which `dispatch::kernels_for` hands out
    // after `Isa::Amx.is_supported()`: AVX-512 F/BW (the unpacking), AMX-TILE and AMX-INT8 in
    // CPUID, the tile state enabled by the OS and this process's permission granted. The
    // shapes were checked above: every tile row read from `x` lies in `x[..(t0+nt)·k]`, every
    // row written lies in `out[..nt·16·np]`, the groups read lie in `w` (`np · gpp` of them,
    // `gpp = 4·K/64`), and `codes[aligned..]` holds the two rings.
    unsafe {
        let x0 = x.as_ptr().add(t0 * k);
        let ring = codes.as_mut_ptr().add(aligned);
        if np == 2 {
            run::<2>(x0, k, nt, w.as_ptr(), ring, out.as_mut_ptr());
        } else {
            run::<1>(x0, k, nt, w.as_ptr(), ring, out.as_mut_ptr());
        }
    }
}

/// Four groups of a panel (one 64-column block) in B-tile form: row `4g + s` of the tile at
/// `dst` (1 KiB) = plane s of group g.
///
/// # Safety
/// AVX-512 F and BW are available; `w` points at 4 readable groups and `dst` at 1 KiB of
/// writable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack_block(w: *const PanelGroup, dst: *mut u8) {
    let mask = _mm512_set1_epi8(3);
    // The panel streams from memory: ask for it 4 KiB ahead (PREFETCHT0 never faults, and
    // the address is formed with `wrapping_add` and never dereferenced).
    _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(PF_GROUPS).cast());
    for g in 0..4 {
        // SAFETY: the caller's contract; unaligned loads and stores are allowed.
        unsafe {
            let v = _mm512_loadu_si512(w.add(g).cast());
            let at = dst.add(g * 4 * 64);
            _mm512_storeu_si512(at.cast(), _mm512_and_si512(v, mask));
            let p1 = _mm512_and_si512(_mm512_srli_epi16::<2>(v), mask);
            _mm512_storeu_si512(at.add(64).cast(), p1);
            let p2 = _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask);
            _mm512_storeu_si512(at.add(128).cast(), p2);
            let p3 = _mm512_and_si512(_mm512_srli_epi16::<6>(v), mask);
            _mm512_storeu_si512(at.add(192).cast(), p3);
        }
    }
}

/// Every token tile of the call: pairs of 16-token tiles over the `NP` panels, a tile
/// configuration for each shape of pair (the last pair may be short).
///
/// # Safety
/// As in [`gemm`]: AVX-512 F/BW and the tile unit may be used; `x` has `nt` rows of `k`
/// bytes, `w` holds `NP` panels of `k/16` groups, `ring` room for `2 · RING` B tiles, `out`
/// has `nt` rows of `16·NP` i32.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn run<const NP: usize>(
    x: *const i8,
    k: usize,
    nt: usize,
    w: *const PanelGroup,
    ring: *mut u8,
    out: *mut i32,
) {
    let stride_x = k;
    let stride_out = 16 * NP * 4;
    let kbs = k / KB;
    let mut loaded: Option<(usize, usize)> = None;
    let mut t = 0;
    while t < nt {
        let r0 = (nt - t).min(16);
        let r1 = (nt - t - r0).min(16);
        if loaded != Some((r0, r1)) {
            let cfg = tiles::Config::new(r0, r1, NP);
            // SAFETY: the caller's contract (AMX usable); the configuration is valid
            // (rows ≤ 16, 64-byte rows).
            unsafe { tiles::load_config(&cfg) };
            loaded = Some((r0, r1));
        }
        // SAFETY: rows t .. t + r0 + r1 of x and out exist (r0 + r1 ≤ nt − t), and the
        // configuration loaded above matches these row counts.
        unsafe {
            let a0 = x.add(t * stride_x);
            let o0 = out.cast::<u8>().add(t * stride_out);
            if r1 > 0 {
                pair::<NP, true>(a0, stride_x, kbs, w, ring, o0, stride_out);
            } else {
                pair::<NP, false>(a0, stride_x, kbs, w, ring, o0, stride_out);
            }
        }
        t += r0 + r1;
    }
    // SAFETY: as above; releasing returns the tile state to its initial form, so the OS
    // need not save it while this thread does other work.
    unsafe { tiles::release() };
}

/// One pair of token tiles (the second present when `TWO`) against `NP` panels, all
/// K blocks, then the accumulators stored to `out`. Each block of codes is unpacked into the
/// panel's ring one block ahead of the tile load that reads it (the ring stays in L1, and the
/// stores have landed when the load asks for them); a pair unpacks for itself, as keeping the
/// whole rows unpacked for the next pair would push them out to L2 and back.
///
/// # Safety
/// AVX-512 F/BW may be used and a tile configuration for these row counts is loaded; `a`
/// has the pair's rows of `stride_a` bytes, `w` `NP` panels of `4·kbs` groups, `ring` room
/// for `2 · RING` B tiles, `out` the pair's rows of `stride_out` bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pair<const NP: usize, const TWO: bool>(
    a: *const i8,
    stride_a: usize,
    kbs: usize,
    w: *const PanelGroup,
    ring: *mut u8,
    out: *mut u8,
    stride_out: usize,
) {
    // SAFETY: the caller's contract; every address below is inside the ranges it names
    // (block kb < kbs, ring slot < RING, tile rows < 16 or the configured count).
    unsafe {
        tiles::zero::<0>();
        if NP == 2 {
            tiles::zero::<1>();
        }
        if TWO {
            tiles::zero::<2>();
            if NP == 2 {
                tiles::zero::<3>();
            }
        }
        let a1 = a.wrapping_add(16 * stride_a);
        let w1 = w.wrapping_add(4 * kbs);
        let ring1 = ring.wrapping_add(RING * B_TILE);
        let slot = |kb: usize| (kb % RING) * B_TILE;
        unpack_block(w, ring);
        if NP == 2 {
            unpack_block(w1, ring1);
        }
        for kb in 0..kbs {
            if kb + 1 < kbs {
                unpack_block(w.add(4 * (kb + 1)), ring.add(slot(kb + 1)));
                if NP == 2 {
                    unpack_block(w1.add(4 * (kb + 1)), ring1.add(slot(kb + 1)));
                }
            }
            tiles::load::<4>(a.add(kb * KB).cast(), stride_a);
            tiles::load::<6>(ring.add(slot(kb)).cast_const(), KB);
            if NP == 2 {
                tiles::load::<7>(ring1.add(slot(kb)).cast_const(), KB);
            }
            tiles::dot::<0, 4, 6>();
            if NP == 2 {
                tiles::dot::<1, 4, 7>();
            }
            if TWO {
                tiles::load::<5>(a1.add(kb * KB).cast(), stride_a);
                tiles::dot::<2, 5, 6>();
                if NP == 2 {
                    tiles::dot::<3, 5, 7>();
                }
            }
        }
        tiles::store::<0>(out, stride_out);
        if NP == 2 {
            tiles::store::<1>(out.add(64), stride_out);
        }
        if TWO {
            let out1 = out.add(16 * stride_out);
            tiles::store::<2>(out1, stride_out);
            if NP == 2 {
                tiles::store::<3>(out1.add(64), stride_out);
            }
        }
    }
}

/// Nanoseconds per `tdpbsud` (16 × 16 × 64 int8 multiply-adds) on this thread, the
/// instruction issued back to back in four independent chains: the tile unit's peak, which
/// `cargo bench --bench gemm` divides the GEMM's rate by. `None` where the tier is not usable.
pub(crate) fn probe_tdpbsud_ns() -> Option<f64> {
    if !Isa::Amx.is_supported() {
        return None;
    }
    const N: usize = 20_000;
    let buf = [0u8; B_TILE];
    let cfg = tiles::Config::new(16, 16, 2);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = std::time::Instant::now();
        // SAFETY: `Isa::Amx.is_supported()` above (the tile unit may be used); the
        // configuration defines tiles 0–7 as 16 rows of 64 bytes, and `buf` holds 16 rows
        // of 64 bytes for every load.
        unsafe {
            tiles::load_config(&cfg);
            tiles::zero::<0>();
            tiles::zero::<1>();
            tiles::zero::<2>();
            tiles::zero::<3>();
            tiles::load::<4>(buf.as_ptr(), KB);
            tiles::load::<5>(buf.as_ptr(), KB);
            tiles::load::<6>(buf.as_ptr(), KB);
            tiles::load::<7>(buf.as_ptr(), KB);
            for _ in 0..N {
                tiles::dot::<0, 4, 6>();
                tiles::dot::<1, 4, 7>();
                tiles::dot::<2, 5, 6>();
                tiles::dot::<3, 5, 7>();
            }
            tiles::release();
        }
        #[allow(clippy::cast_precision_loss)] // N · 4 is exact in f64
        let ns = t.elapsed().as_secs_f64() * 1e9 / (4 * N) as f64;
        best = best.min(ns);
    }
    Some(best)
}

/// The tile instructions, one `asm!` each. Every function requires that the tile unit may be
/// used (AMX-TILE and AMX-INT8 present, the OS's permission granted to this process); those
/// that name a tile require a loaded configuration in which that tile is configured, and
/// those that touch memory require the rows they name to be in bounds.
mod tiles {
    use std::arch::asm;

    /// A palette-1 tile configuration (the 64-byte `ldtilecfg` operand).
    #[repr(C, align(64))]
    pub(super) struct Config {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }
    const _: () = assert!(std::mem::size_of::<Config>() == 64);

    impl Config {
        /// Tiles for `r0` (and `r1`, when non-zero) tokens against `np` panels: C tiles
        /// 0–3, A tiles 4–5, B tiles 6–7 as the module doc lays them out.
        pub(super) fn new(r0: usize, r1: usize, np: usize) -> Config {
            let mut c = Config {
                palette: 1,
                start_row: 0,
                reserved: [0; 14],
                colsb: [0; 16],
                rows: [0; 16],
            };
            let r0 = u8::try_from(r0.min(16)).unwrap_or(16);
            let r1 = u8::try_from(r1.min(16)).unwrap_or(16);
            let mut set = |t: usize, rows: u8| {
                if rows > 0 {
                    c.colsb[t] = 64;
                    c.rows[t] = rows;
                }
            };
            set(0, r0);
            set(4, r0);
            set(6, 16);
            set(2, r1);
            set(5, r1);
            if np == 2 {
                set(1, r0);
                set(3, r1);
                set(7, 16);
            }
            c
        }
    }

    /// `ldtilecfg`.
    ///
    /// # Safety
    /// The tile unit may be used, and `c` is a valid configuration.
    #[inline(always)]
    pub(super) unsafe fn load_config(c: &Config) {
        // SAFETY: the caller's contract; `c` is 64 readable bytes.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) std::ptr::from_ref(c),
                 options(nostack, readonly, preserves_flags))
        }
    }

    /// `tilerelease`.
    ///
    /// # Safety
    /// The tile unit may be used.
    #[inline(always)]
    pub(super) unsafe fn release() {
        // SAFETY: the caller's contract.
        unsafe { asm!("tilerelease", options(nomem, nostack, preserves_flags)) }
    }

    /// `tilezero tmmT`.
    ///
    /// # Safety
    /// Tile T is configured.
    #[inline(always)]
    pub(super) unsafe fn zero<const T: u8>() {
        // SAFETY: the caller's contract.
        unsafe {
            match T {
                0 => asm!("tilezero tmm0", options(nomem, nostack, preserves_flags)),
                1 => asm!("tilezero tmm1", options(nomem, nostack, preserves_flags)),
                2 => asm!("tilezero tmm2", options(nomem, nostack, preserves_flags)),
                3 => asm!("tilezero tmm3", options(nomem, nostack, preserves_flags)),
                _ => unreachable!(),
            }
        }
    }

    /// `tileloadd tmmT, [p + stride]`: the configured rows of tile T from `p`, `stride`
    /// bytes apart.
    ///
    /// # Safety
    /// Tile T is configured; its rows (64 bytes each) at `p + i·stride` are readable.
    #[inline(always)]
    pub(super) unsafe fn load<const T: u8>(p: *const u8, stride: usize) {
        // SAFETY: the caller's contract.
        unsafe {
            macro_rules! ld {
                ($t:literal) => {
                    asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"), p = in(reg) p,
                         s = in(reg) stride, options(nostack, readonly, preserves_flags))
                };
            }
            match T {
                4 => ld!("4"),
                5 => ld!("5"),
                6 => ld!("6"),
                7 => ld!("7"),
                _ => unreachable!(),
            }
        }
    }

    /// `tilestored [p + stride], tmmT`.
    ///
    /// # Safety
    /// Tile T is configured; its rows (64 bytes each) at `p + i·stride` are writable and
    /// belong to the caller.
    #[inline(always)]
    pub(super) unsafe fn store<const T: u8>(p: *mut u8, stride: usize) {
        // SAFETY: the caller's contract.
        unsafe {
            macro_rules! st {
                ($t:literal) => {
                    asm!(concat!("tilestored [{p} + {s}*1], tmm", $t), p = in(reg) p,
                         s = in(reg) stride, options(nostack, preserves_flags))
                };
            }
            match T {
                0 => st!("0"),
                1 => st!("1"),
                2 => st!("2"),
                3 => st!("3"),
                _ => unreachable!(),
            }
        }
    }

    /// `tdpbsud tmmC, tmmA, tmmB`: `C[m][j] += Σ_c A[m][c] · B[c/4][4j + c%4]`, A signed and
    /// B unsigned bytes.
    ///
    /// # Safety
    /// Tiles C, A and B are configured with compatible shapes (C: rows of A × 16 i32, A:
    /// rows × 64 bytes, B: 16 rows × 64 bytes).
    #[inline(always)]
    pub(super) unsafe fn dot<const C: u8, const A: u8, const B: u8>() {
        // SAFETY: the caller's contract.
        unsafe {
            match (C, A, B) {
                (0, 4, 6) => asm!(
                    "tdpbsud tmm0, tmm4, tmm6",
                    options(nomem, nostack, preserves_flags)
                ),
                (1, 4, 7) => asm!(
                    "tdpbsud tmm1, tmm4, tmm7",
                    options(nomem, nostack, preserves_flags)
                ),
                (2, 5, 6) => asm!(
                    "tdpbsud tmm2, tmm5, tmm6",
                    options(nomem, nostack, preserves_flags)
                ),
                (3, 5, 7) => asm!(
                    "tdpbsud tmm3, tmm5, tmm7",
                    options(nomem, nostack, preserves_flags)
                ),
                _ => unreachable!(),
            }
        }
    }
}
