//! What every kernel tier shares, and nothing else: the [`Isa`] names and the CPU features
//! each needs, the kernel function types, the [`Kernels`] table a tier fills in, and the
//! int8 activations prepared for a layout ([`Prepared`]).
//!
//! The tiers stand on this module: `crate::simd::*` depend on it (and on the layouts, panels
//! and lookup tables they compute over), `crate::dispatch` depends on the tiers, and nothing
//! here looks back up.

use crate::cpu;
use crate::layout::TernaryLayout;

/// An instruction-set tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust, the reference.
    Scalar,
    /// aarch64 NEON (dotprod used when the CPU has it).
    Neon,
    /// WebAssembly SIMD (`simd128`), compiled in when the module is built with it (named
    /// `simd128-relaxed` in a module built with `relaxed-simd` too).
    Simd128,
    /// x86-64 AVX2 + FMA + F16C (the I2_S panel GEMM on `vpmaddubsw`).
    Avx2,
    /// The AVX2 tier with the I2_S GEMM of multi-token calls on table lookups (`vpshufb`,
    /// `crate::lut`). Never chosen by detection: on Zen 3 it only ties the `vpmaddubsw`
    /// panels at 128 tokens and loses below (`cargo bench --bench gemm`); `BITNET_ISA=avx2lut`
    /// selects it to measure it on other CPUs.
    Avx2Lut,
    /// AVX2 plus 256-bit VNNI: the I2_S panel GEMM on `vpdpbusd` ymm.
    AvxVnni,
    /// x86-64 AVX-512 F + BW (on top of the AVX2 tier), `vpmaddubsw` products.
    Avx512,
    /// AVX-512 F + BW + VNNI: `vpdpbusd` products, and the I2_S panel GEMM on zmm.
    Avx512Vnni,
    /// The AVX-512 VNNI tier with the I2_S GEMM of batches on AMX-INT8 tiles (Intel Xeon
    /// from Sapphire Rapids on), where the OS grants the tile state.
    Amx,
}

impl Isa {
    /// The lower-case name used by `BITNET_ISA`.
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Neon => "neon",
            Isa::Simd128 if cfg!(target_feature = "relaxed-simd") => "simd128-relaxed",
            Isa::Simd128 => "simd128",
            Isa::Avx2 => "avx2",
            Isa::Avx2Lut => "avx2lut",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Amx => "amx",
        }
    }

    /// Parse a `BITNET_ISA` value.
    pub fn from_name(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Some(Isa::Scalar),
            "neon" => Some(Isa::Neon),
            "simd128" | "simd128-relaxed" => Some(Isa::Simd128),
            "avx2" => Some(Isa::Avx2),
            "avx2lut" => Some(Isa::Avx2Lut),
            "avxvnni" => Some(Isa::AvxVnni),
            "avx512" => Some(Isa::Avx512),
            "avx512vnni" => Some(Isa::Avx512Vnni),
            "amx" => Some(Isa::Amx),
            _ => None,
        }
    }

    /// True when this CPU can run the tier.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 | Isa::Avx2Lut => cpu::has_avx2(),
            Isa::AvxVnni => cpu::has_avx2() && cpu::has_avxvnni(),
            Isa::Avx512 => cpu::has_avx512(),
            Isa::Avx512Vnni => cpu::has_avx512() && cpu::has_avx512vnni(),
            Isa::Amx => cpu::has_avx512() && cpu::has_avx512vnni() && cpu::amx().is_ok(),
            Isa::Neon => cpu::has_neon(),
            Isa::Simd128 => cfg!(all(target_arch = "wasm32", target_feature = "simd128")),
        }
    }
}

/// A ternary kernel: raw per-block sums `Σ u·q` for one weight row and tokens `t0..t0+nt`
/// (`nt ≤ TOKEN_TILE`), written to `out[ti·nb + b]`.
pub(crate) type TernaryKernel =
    fn(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]);
/// I2_S, one token, `out.len()` consecutive rows at once (the [`I2sRows::rows`] of its
/// table): `w` holds the rows back to back (K/4 bytes each); `out[i]` = `Σ u·q` of row `i` for
/// token `t`. `clean` = the rows hold no code 11 (the kernel may skip the fix-up).
pub(crate) type I2sRowsKernel =
    fn(w: &[u8], p: &Prepared<'_>, t: usize, clean: bool, out: &mut [i32]);

/// A tier's decode kernel for I2_S and the number of rows it takes a call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct I2sRows {
    pub kernel: I2sRowsKernel,
    pub rows: usize,
}

/// A float row dot: `row` (encoded bytes) · `x`.
pub(crate) type RowDot = fn(row: &[u8], x: &[f32]) -> f32;
/// A quantized row · activations quantized per 32 (Q8_0's quantizer): codes `xq` (|q| ≤ 127)
/// and one scale per 32 in `xd` (the f16 scale, widened).
pub(crate) type RowDotQ8 = fn(row: &[u8], xq: &[i8], xd: &[f32]) -> f32;
/// Consecutive rows (`rows.len() / row_bytes` of them, back to back) against several tokens'
/// activations: `out[r·n_tok + t] = dot(row r, xs[t])`, each result exactly what the
/// single-token dot of the same order gives.
pub(crate) type RowsDotMulti = fn(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]);
/// One token's dots of consecutive rows (`row_bytes` apart), one per `out` value; the `bool`
/// says that every half of the rows is finite (the caller checked).
pub(crate) type F16FastRows =
    fn(rows: &[u8], row_bytes: usize, x: &[f32], finite: bool, out: &mut [f32]);
/// [`RowDotQ8`] for `out.len()` tokens: codes `xq` (`cols` per token), scales `xd` (`cols/32`
/// per token); each result exactly the single-token dot's.
pub(crate) type RowDotQ8Multi = fn(row: &[u8], xq: &[i8], xd: &[f32], cols: usize, out: &mut [f32]);
/// An f32 · f32 dot in the 8-lane order.
pub(crate) type F32Dot = fn(w: &[f32], x: &[f32]) -> f32;
/// The I2_S panel GEMM (`crate::panel`): `Σ u·q` of the rows of the one or two consecutive
/// panels in `w` (`gpp` groups each) for tokens `t0 .. t0 + nt` (`nt ≤ panel_tokens`) of `x`
/// (`k = 16·gpp` bytes per token), into `out[ti·16P + 16pi + j]`.
pub(crate) type PanelKernel = fn(
    w: &[crate::panel::PanelGroup],
    gpp: usize,
    x: &[i8],
    k: usize,
    t0: usize,
    nt: usize,
    out: &mut [i32],
);

/// The AMX GEMM (`crate::simd::amx`): `Σ u·q` of the rows of the one or two consecutive
/// panels in `w` (`gpp` groups each) for tokens `t0 .. t0 + nt` (`nt ≤ chunk_tokens`) of `x`
/// (`k = 16·gpp` bytes per token), into `out[ti·16P + 16pi + j]`; `codes` is the caller's
/// scratch for the unpacked codes (grown as needed, reused across calls).
pub(crate) type AmxKernel = fn(
    w: &[crate::panel::PanelGroup],
    gpp: usize,
    x: &[i8],
    k: usize,
    t0: usize,
    nt: usize,
    out: &mut [i32],
    codes: &mut Vec<u8>,
);

/// A tier's tile GEMM and when to use it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Amx {
    pub gemm: AmxKernel,
    /// Most tokens per call.
    pub chunk_tokens: usize,
    /// Fewest tokens in a matmul for which the tiles beat the panel kernel.
    pub min_tokens: usize,
}

/// The function table of one tier.
#[derive(Debug)]
pub(crate) struct Kernels {
    pub isa: Isa,
    pub i2s: TernaryKernel,
    /// I2_S for tensors verified to hold no code 11 (may skip the fix-up).
    pub i2s_clean: TernaryKernel,
    /// Several I2_S rows for one token (decode matvecs), sharing the activation loads and
    /// reading the rows as one stream; `None` where the per-row kernel is as good.
    pub i2s_rows: Option<I2sRows>,
    pub tq2: TernaryKernel,
    pub tq1: TernaryKernel,
    pub bitnet32: TernaryKernel,
    pub split32: TernaryKernel,
    pub qk256: TernaryKernel,
    pub f16_dot_ggml: RowDot,
    pub f16_dot_tiny: RowDot,
    pub q8_0_dot: RowDot,
    pub q4_0_dot: RowDot,
    pub bf16_dot: RowDot,
    pub f32_dot: F32Dot,
    /// `f16_dot_ggml` for several rows and tokens at once (each F16 chunk converted once).
    pub f16_dot_ggml_multi: RowsDotMulti,
    /// The F16 dots of fast numerics (`RowMatrix::matmul_q8`, `matmul_q8_rows`): the ggml
    /// order, with the fused multiply-add on every tier whose hardware has one (there they
    /// are `f16_dot_ggml` and `f16_dot_ggml_multi` themselves); WebAssembly's tier fuses them
    /// only where relaxed SIMD's multiply-add is fused (`wasm_fused_madd`), and elsewhere
    /// multiplies, then adds. Exact numerics never uses them.
    pub f16_dot_fast: RowDot,
    pub f16_dot_fast_multi: RowsDotMulti,
    /// One token's `f16_dot_fast` of consecutive rows, bit for bit, with the token prepared
    /// once per call; `None`: `f16_dot_fast` per row is as good.
    pub f16_fast_rows: Option<F16FastRows>,
    /// Q8_0 row · Q8_0 activations (integer block dots).
    pub q8_0_q8: RowDotQ8,
    /// Q4_0 row · Q8_0 activations (integer block dots).
    pub q4_0_q8: RowDotQ8,
    /// `q8_0_q8` for several tokens (each weight block loaded and prepared once).
    pub q8_0_q8_multi: RowDotQ8Multi,
    /// `q4_0_q8` for several tokens.
    pub q4_0_q8_multi: RowDotQ8Multi,
    /// The I2_S panel GEMM; a tier with one gets its I2_S matrices repacked at load.
    pub i2s_panel: Option<PanelKernel>,
    /// Tokens per call of `i2s_panel`.
    pub panel_tokens: usize,
    /// The table-lookup GEMM, used instead of `i2s_panel` for calls of at least its
    /// `min_tokens` tokens.
    pub i2s_lut: Option<crate::lut::Lut>,
    /// The tile GEMM, used instead of `i2s_panel` for calls of at least its `min_tokens`.
    pub i2s_amx: Option<Amx>,
}

/// Int8 activations of `n_tok` tokens prepared for one layout.
#[derive(Debug)]
#[allow(dead_code)] // xp / kp are read by the SIMD tiers
pub(crate) struct Prepared<'a> {
    /// `n_tok × k` activations in their original order.
    pub x: &'a [i8],
    /// Row length K.
    pub k: usize,
    /// `n_tok × kp` activations permuted for sequentially packed layouts (BitNet32F16,
    /// Split32, QK256) and zero-padded: within each 128-element chunk c,
    /// `xp[128c + 32l + B] = x[128c + 4B + l]` (l = 0..4, B = 0..32). Empty for others.
    pub xp: Vec<i8>,
    /// Padded row length of `xp`.
    pub kp: usize,
}

impl<'a> Prepared<'a> {
    pub(crate) fn new(layout: TernaryLayout, x: &'a [i8], k: usize, n_tok: usize) -> Self {
        let kp = match layout {
            TernaryLayout::BitNet32F16 | TernaryLayout::Split32WithSibling => k.div_ceil(128) * 128,
            TernaryLayout::Qk256 => k.div_ceil(256) * 256,
            _ => 0,
        };
        let mut xp = vec![0i8; kp * n_tok];
        if kp > 0 {
            for t in 0..n_tok {
                let src = &x[t * k..(t + 1) * k];
                let dst = &mut xp[t * kp..(t + 1) * kp];
                for (j, &v) in src.iter().enumerate() {
                    let c = j / 128;
                    let r = j % 128;
                    dst[128 * c + 32 * (r % 4) + r / 4] = v;
                }
            }
        }
        Prepared { x, k, xp, kp }
    }

    /// Token `t`'s activations in original order.
    #[inline]
    pub fn token(&self, t: usize) -> &[i8] {
        &self.x[t * self.k..(t + 1) * self.k]
    }

    /// Token `t`'s permuted, padded activations.
    #[inline]
    #[allow(dead_code)]
    pub fn token_perm(&self, t: usize) -> &[i8] {
        &self.xp[t * self.kp..(t + 1) * self.kp]
    }
}
