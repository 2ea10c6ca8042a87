//! Runtime ISA selection: detect once (`OnceLock`) into a table of plain functions.
//!
//! Model code never sees `cfg(target_feature)`: it calls [`crate::TernaryMatrix::matmul`] and
//! [`crate::RowMatrix::matmul_f32`], which take their kernels from [`kernels`]. The env var
//! `BITNET_ISA=scalar|neon|simd128|avx2|avx2lut|avxvnni|avx512|avx512vnni|amx` may only lower the detected
//! tier (to one the CPU has), so every tier can be forced and measured on a CPU above it; the
//! two AVX2 tiers may also be swapped for each other.
//!
//! This module sits above the tiers: it names each tier's table (`crate::simd::*`), and the
//! tiers know only the shared types of `crate::tier`.

use std::sync::OnceLock;

use crate::tier::{Isa, Kernels};

/// The table of a tier, if this CPU supports it.
pub(crate) fn kernels_for(isa: Isa) -> Option<&'static Kernels> {
    if !isa.is_supported() {
        return None;
    }
    match isa {
        Isa::Scalar => Some(&crate::simd::scalar::TABLE),
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
        #[cfg(target_arch = "x86_64")]
        Isa::Amx => Some(&crate::simd::amx::TABLE),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => Some(&crate::simd::neon::TABLE),
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Isa::Simd128 => Some(&crate::simd::wasm::TABLE),
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
        Isa::Amx,
        Isa::Avx512Vnni,
        Isa::Avx512,
        Isa::AvxVnni,
        Isa::Avx2,
        Isa::Neon,
        Isa::Simd128,
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
                "BITNET_ISA={v} ignored: expected scalar, neon, simd128, avx2, avx2lut, avxvnni, avx512, \
                 avx512vnni or amx"
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
        Isa::Simd128,
        Isa::Avx2,
        Isa::Avx2Lut,
        Isa::AvxVnni,
        Isa::Avx512,
        Isa::Avx512Vnni,
        Isa::Amx,
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
    kernels_for(isa()).unwrap_or(&crate::simd::scalar::TABLE)
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
    let feats = crate::cpu::features();
    if !feats.is_empty() {
        s.push_str(&format!("; cpu features: {}", feats.join(" ")));
    }
    #[cfg(target_arch = "x86_64")]
    s.push_str(&format!(
        "; L1 data cache {} KiB",
        crate::cpu::l1d_bytes() / 1024
    ));
    if let Some(why) = amx_refusal(&feats, crate::cpu::amx()) {
        s.push_str(&format!("; amx tier not used: {why}"));
    }
    if let Some(n) = &sel.note {
        s.push_str("; ");
        s.push_str(n);
    }
    s
}

/// Why a CPU that reports AMX-INT8 does not get the AMX tier (nothing for a CPU without it).
fn amx_refusal(features: &[&str], amx: Result<(), &'static str>) -> Option<&'static str> {
    if !features.contains(&"amx-int8") {
        return None;
    }
    match amx {
        Err(why) => Some(why),
        Ok(()) if !Isa::Amx.is_supported() => Some("the CPU lacks the AVX-512 VNNI tier"),
        Ok(()) => None,
    }
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
            Isa::Simd128,
            Isa::Avx2,
            Isa::Avx2Lut,
            Isa::AvxVnni,
            Isa::Avx512,
            Isa::Avx512Vnni,
            Isa::Amx,
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
            Isa::Amx,
        ] {
            assert_eq!(has_panel_kernel(i), i.is_supported(), "{i:?}");
        }
    }

    #[test]
    fn amx_sits_above_vnni_and_falls_back_to_it() {
        assert!(Isa::Avx512Vnni < Isa::Amx);
        let all = [
            Isa::Scalar,
            Isa::Avx2,
            Isa::Avx512,
            Isa::Avx512Vnni,
            Isa::Amx,
        ];
        assert_eq!(
            choose(Isa::Amx, Some("avx512vnni"), &all).0,
            Isa::Avx512Vnni
        );
        assert_eq!(choose(Isa::Amx, None, &all).0, Isa::Amx);
        // Asking for AMX where it was refused keeps the VNNI tier, with a note.
        let (i, note) = choose(Isa::Avx512Vnni, Some("amx"), &all[..4]);
        assert_eq!(i, Isa::Avx512Vnni);
        assert!(note.unwrap().contains("only lower"));
        // The report says why a CPU with AMX-INT8 does not get the tier.
        let feats = ["avx512vnni", "amx-int8"];
        assert_eq!(
            amx_refusal(&feats, Err("the kernel refused")),
            Some("the kernel refused")
        );
        assert_eq!(
            amx_refusal(&["avx512vnni"], Err("the CPU has no AMX-INT8")),
            None
        );
        // Detection on this CPU: the AMX tier is chosen exactly when `cpu::amx` allows it.
        let amx_ok = crate::cpu::amx().is_ok() && Isa::Avx512Vnni.is_supported();
        assert_eq!(Isa::Amx.is_supported(), amx_ok);
        assert_eq!(kernels_for(Isa::Amx).is_some(), amx_ok);
        if amx_ok {
            assert_eq!(detect_best(), Isa::Amx);
        } else {
            assert_ne!(detect_best(), Isa::Amx);
            println!("AMX tier not available here: {:?}", crate::cpu::amx().err());
        }
    }

    #[test]
    fn selected_tier_is_supported() {
        assert!(isa().is_supported());
        assert!(kernels_for(isa()).is_some());
        assert!(isa_report().starts_with("kernels: "));
    }
}
