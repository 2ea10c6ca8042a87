//! Runtime ISA selection: detect once (`OnceLock`) into a table of plain functions.
//!
//! Model code never sees `cfg(target_feature)`: it calls [`crate::TernaryMatrix::matmul`] and
//! [`crate::RowMatrix::matmul_f32`], which take their kernels from [`kernels`]. The env var
//! `BITNET_ISA=scalar|neon|avx2|avx2lut|avxvnni|avx512|avx512vnni` may only lower the detected
//! tier (to one the CPU has), so every tier can be forced and measured on a CPU above it; the
//! two AVX2 tiers may also be swapped for each other.

use std::sync::OnceLock;

use crate::simd::scalar;
use crate::ternary::Prepared;

/// An instruction-set tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust, the reference.
    Scalar,
    /// aarch64 NEON (dotprod used when the CPU has it).
    Neon,
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
}

impl Isa {
    /// The lower-case name used by `BITNET_ISA`.
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Neon => "neon",
            Isa::Avx2 => "avx2",
            Isa::Avx2Lut => "avx2lut",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512vnni",
        }
    }

    /// Parse a `BITNET_ISA` value.
    pub fn from_name(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Some(Isa::Scalar),
            "neon" => Some(Isa::Neon),
            "avx2" => Some(Isa::Avx2),
            "avx2lut" => Some(Isa::Avx2Lut),
            "avxvnni" => Some(Isa::AvxVnni),
            "avx512" => Some(Isa::Avx512),
            "avx512vnni" => Some(Isa::Avx512Vnni),
            _ => None,
        }
    }

    /// True when this CPU can run the tier.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 | Isa::Avx2Lut => has_avx2(),
            Isa::AvxVnni => has_avx2() && has_feature_avxvnni(),
            Isa::Avx512 => has_avx512(),
            Isa::Avx512Vnni => has_avx512() && has_feature_avx512vnni(),
            Isa::Neon => has_neon(),
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}
#[cfg(not(target_arch = "x86_64"))]
fn has_avx2() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    has_avx2()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
}
#[cfg(not(target_arch = "x86_64"))]
fn has_avx512() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn has_feature_avxvnni() -> bool {
    std::arch::is_x86_feature_detected!("avxvnni")
}
#[cfg(target_arch = "x86_64")]
fn has_feature_avx512vnni() -> bool {
    std::arch::is_x86_feature_detected!("avx512vnni")
}
#[cfg(not(target_arch = "x86_64"))]
fn has_feature_avxvnni() -> bool {
    false
}
#[cfg(not(target_arch = "x86_64"))]
fn has_feature_avx512vnni() -> bool {
    false
}

#[cfg(target_arch = "aarch64")]
fn has_neon() -> bool {
    std::arch::is_aarch64_feature_detected!("neon")
}
#[cfg(not(target_arch = "aarch64"))]
fn has_neon() -> bool {
    false
}

/// A ternary kernel: raw per-block sums `Σ u·q` for one weight row and tokens `t0..t0+nt`
/// (`nt ≤ TOKEN_TILE`), written to `out[ti·nb + b]`.
pub(crate) type TernaryKernel =
    fn(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]);
/// I2_S, one token, four consecutive rows at once: `w4` holds the rows back to back (K/4
/// bytes each); returns `Σ u·q` of each row for token `t`. `clean` = the rows hold no code 11
/// (the kernel may skip the fix-up).
pub(crate) type I2sQuadKernel = fn(w4: &[u8], p: &Prepared<'_>, t: usize, clean: bool) -> [i32; 4];
/// A float row dot: `row` (encoded bytes) · `x`.
pub(crate) type RowDot = fn(row: &[u8], x: &[f32]) -> f32;
/// A quantized row · activations quantized per 32 (Q8_0's quantizer): codes `xq` (|q| ≤ 127)
/// and one scale per 32 in `xd` (the f16 scale, widened).
pub(crate) type RowDotQ8 = fn(row: &[u8], xq: &[i8], xd: &[f32]) -> f32;
/// Consecutive rows (`rows.len() / row_bytes` of them, back to back) against several tokens'
/// activations: `out[r·n_tok + t] = dot(row r, xs[t])`, each result exactly what the
/// single-token dot of the same order gives.
pub(crate) type RowsDotMulti = fn(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]);
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

/// The function table of one tier.
#[derive(Debug)]
pub(crate) struct Kernels {
    #[allow(dead_code)] // kept for debugging output of the table
    pub isa: Isa,
    pub i2s: TernaryKernel,
    /// I2_S for tensors verified to hold no code 11 (may skip the fix-up).
    pub i2s_clean: TernaryKernel,
    /// Four I2_S rows for one token (decode matvecs), sharing the activation loads and
    /// prefetching the rows as one stream; `None` where the per-row kernel is as good.
    pub i2s_quad: Option<I2sQuadKernel>,
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
}

static SCALAR: Kernels = Kernels {
    isa: Isa::Scalar,
    i2s: scalar::i2s,
    i2s_clean: scalar::i2s,
    i2s_quad: None,
    tq2: scalar::tq2,
    tq1: scalar::tq1,
    bitnet32: scalar::bitnet32,
    split32: scalar::split32,
    qk256: scalar::qk256,
    f16_dot_ggml: scalar::f16_dot_ggml,
    f16_dot_tiny: scalar::f16_dot_tiny,
    q8_0_dot: scalar::q8_0_dot,
    q4_0_dot: scalar::q4_0_dot,
    bf16_dot: scalar::bf16_dot,
    f32_dot: scalar::f32_dot_lanes8,
    q8_0_q8: scalar::q8_0_q8,
    q4_0_q8: scalar::q4_0_q8,
    f16_dot_ggml_multi: scalar::f16_dot_ggml_multi,
    q8_0_q8_multi: scalar::q8_0_q8_multi,
    q4_0_q8_multi: scalar::q4_0_q8_multi,
    i2s_panel: None,
    panel_tokens: 0,
    i2s_lut: None,
};

/// The table of a tier, if this CPU supports it.
pub(crate) fn kernels_for(isa: Isa) -> Option<&'static Kernels> {
    if !isa.is_supported() {
        return None;
    }
    match isa {
        Isa::Scalar => Some(&SCALAR),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Some(&crate::simd::avx2::TABLE),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Lut => Some(&crate::simd::avx2::TABLE_LUT),
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni => Some(&crate::simd::vnni256::TABLE),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => Some(&crate::simd::avx512::TABLE),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => Some(&crate::simd::avx512::TABLE_VNNI),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => Some(&crate::simd::neon::TABLE),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

struct Selection {
    detected: Isa,
    selected: Isa,
    note: Option<String>,
}

fn detect_best() -> Isa {
    [
        Isa::Avx512Vnni,
        Isa::Avx512,
        Isa::AvxVnni,
        Isa::Avx2,
        Isa::Neon,
    ]
    .into_iter()
    .find(|i| i.is_supported() && kernels_for(*i).is_some())
    .unwrap_or(Isa::Scalar)
}

/// Apply a `BITNET_ISA` value to the detected tier: it may only lower it, to a tier that
/// is available (the two AVX2 tiers count as one level); anything else is ignored with a
/// note.
fn choose(detected: Isa, env: Option<&str>, available: &[Isa]) -> (Isa, Option<String>) {
    let Some(v) = env else {
        return (detected, None);
    };
    let level = |i: Isa| if i == Isa::Avx2Lut { Isa::Avx2 } else { i };
    match Isa::from_name(v) {
        Some(req) if req == detected => (detected, None),
        Some(req) if level(req) <= level(detected) && available.contains(&req) => (req, None),
        Some(req) => (
            detected,
            Some(format!(
                "BITNET_ISA={v} ignored: it may only lower the tier to one this CPU has \
                 (detected {}, requested {})",
                detected.name(),
                req.name()
            )),
        ),
        None => (
            detected,
            Some(format!(
                "BITNET_ISA={v} ignored: expected scalar, neon, avx2, avx2lut, avxvnni, avx512 \
                 or avx512vnni"
            )),
        ),
    }
}

fn selection() -> &'static Selection {
    static SEL: OnceLock<Selection> = OnceLock::new();
    SEL.get_or_init(|| {
        let detected = detect_best();
        let env = std::env::var("BITNET_ISA").ok();
        let (selected, note) = choose(detected, env.as_deref(), &supported_isas());
        Selection {
            detected,
            selected,
            note,
        }
    })
}

/// The tier every kernel call uses (detected once; possibly lowered by `BITNET_ISA`).
pub fn isa() -> Isa {
    selection().selected
}

/// Every tier this CPU can run (for tests and benchmarks).
pub fn supported_isas() -> Vec<Isa> {
    [
        Isa::Scalar,
        Isa::Neon,
        Isa::Avx2,
        Isa::Avx2Lut,
        Isa::AvxVnni,
        Isa::Avx512,
        Isa::Avx512Vnni,
    ]
    .into_iter()
    .filter(|i| kernels_for(*i).is_some())
    .collect()
}

/// Whether tier `isa` runs I2_S through the repacked panels (false when the CPU lacks it).
pub fn has_panel_kernel(isa: Isa) -> bool {
    kernels_for(isa).is_some_and(|k| k.i2s_panel.is_some())
}

/// The table of the selected tier.
pub(crate) fn kernels() -> &'static Kernels {
    kernels_for(isa()).unwrap_or(&SCALAR)
}

/// A one-paragraph description of the CPU features seen and the tier chosen.
pub fn isa_report() -> String {
    let sel = selection();
    let mut s = format!(
        "kernels: {} (detected {}; available: {})",
        sel.selected.name(),
        sel.detected.name(),
        supported_isas()
            .iter()
            .map(|i| i.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let feats = cpu_features();
    if !feats.is_empty() {
        s.push_str(&format!("; cpu features: {}", feats.join(" ")));
    }
    #[cfg(target_arch = "x86_64")]
    s.push_str(&format!(
        "; L1 data cache {} KiB",
        crate::simd::l1d_bytes() / 1024
    ));
    if let Some(n) = &sel.note {
        s.push_str("; ");
        s.push_str(n);
    }
    s
}

#[cfg(target_arch = "x86_64")]
fn cpu_features() -> Vec<&'static str> {
    let mut v = Vec::new();
    macro_rules! f {
        ($($n:tt),*) => {$( if std::arch::is_x86_feature_detected!($n) { v.push($n); } )*};
    }
    f!(
        "sse4.1",
        "ssse3",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vnni",
        "avxvnni"
    );
    v
}
#[cfg(target_arch = "aarch64")]
fn cpu_features() -> Vec<&'static str> {
    let mut v = Vec::new();
    if std::arch::is_aarch64_feature_detected!("neon") {
        v.push("neon");
    }
    if std::arch::is_aarch64_feature_detected!("dotprod") {
        v.push("dotprod");
    }
    v
}
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn cpu_features() -> Vec<&'static str> {
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_may_only_lower_the_tier() {
        let avail = [Isa::Scalar, Isa::Avx2];
        assert_eq!(choose(Isa::Avx2, None, &avail), (Isa::Avx2, None));
        assert_eq!(choose(Isa::Avx2, Some("scalar"), &avail).0, Isa::Scalar);
        assert_eq!(choose(Isa::Avx2, Some(" AVX2 "), &avail), (Isa::Avx2, None));
        // Raising is refused, as is a tier of another architecture or an unknown name.
        let (i, note) = choose(Isa::Avx2, Some("avx512"), &avail);
        assert_eq!(i, Isa::Avx2);
        assert!(note.unwrap().contains("only lower"));
        assert_eq!(choose(Isa::Avx2, Some("neon"), &avail).0, Isa::Avx2);
        let (i, note) = choose(Isa::Avx2, Some("sse9"), &avail);
        assert_eq!(i, Isa::Avx2);
        assert!(note.unwrap().contains("expected"));
        let all = [Isa::Scalar, Isa::Avx2, Isa::Avx512];
        assert_eq!(choose(Isa::Avx512, Some("avx2"), &all).0, Isa::Avx2);
        assert_eq!(
            choose(Isa::Neon, Some("scalar"), &[Isa::Scalar, Isa::Neon]).0,
            Isa::Scalar
        );
    }

    #[test]
    fn every_tier_has_a_name_that_parses_back() {
        for i in [
            Isa::Scalar,
            Isa::Neon,
            Isa::Avx2,
            Isa::Avx2Lut,
            Isa::AvxVnni,
            Isa::Avx512,
            Isa::Avx512Vnni,
        ] {
            assert_eq!(Isa::from_name(i.name()), Some(i));
        }
        // The two AVX2 tiers may be swapped for each other, and both lowered.
        let avx2s = [Isa::Scalar, Isa::Avx2, Isa::Avx2Lut];
        assert_eq!(choose(Isa::Avx2, Some("avx2lut"), &avx2s).0, Isa::Avx2Lut);
        assert_eq!(choose(Isa::Avx2Lut, Some("avx2"), &avx2s).0, Isa::Avx2);
        assert_eq!(choose(Isa::Avx2Lut, Some("scalar"), &avx2s).0, Isa::Scalar);
        assert_eq!(
            choose(Isa::Avx2Lut, Some("avxvnni"), &avx2s).0,
            Isa::Avx2Lut
        );
        // The VNNI tiers sit above their base tiers, so BITNET_ISA can lower to the base.
        assert!(Isa::Avx2 < Isa::AvxVnni && Isa::AvxVnni < Isa::Avx512);
        assert!(Isa::Avx512 < Isa::Avx512Vnni);
        let all = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni];
        assert_eq!(choose(Isa::Avx512Vnni, Some("avx512"), &all).0, Isa::Avx512);
        // The x86 SIMD tiers have a panel kernel (and repack); scalar and NEON do not.
        assert!(!has_panel_kernel(Isa::Scalar));
        assert!(!has_panel_kernel(Isa::Neon));
        for i in [
            Isa::Avx2,
            Isa::Avx2Lut,
            Isa::AvxVnni,
            Isa::Avx512,
            Isa::Avx512Vnni,
        ] {
            assert_eq!(has_panel_kernel(i), i.is_supported(), "{i:?}");
        }
    }

    #[test]
    fn selected_tier_is_supported() {
        assert!(isa().is_supported());
        assert!(kernels_for(isa()).is_some());
        assert!(isa_report().starts_with("kernels: "));
    }
}
