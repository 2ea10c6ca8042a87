//! Kernel tiers. `scalar` is the reference; the others are selected at run time by
//! `crate::dispatch` and tested against it.

pub(crate) mod scalar;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod lut_avx2;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
#[cfg(target_arch = "x86_64")]
pub(crate) mod panel_x86;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni256;

/// Size in bytes of one core's L1 data cache, read once from CPUID: AMD's leaf 0x8000_0005,
/// else the deterministic cache parameters of leaf 4 (Intel); 32 KiB (the smallest of the x86
/// cores with AVX2) when neither says.
#[cfg(target_arch = "x86_64")]
pub(crate) fn l1d_bytes() -> usize {
    static L1D: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *L1D.get_or_init(|| detect_l1d().unwrap_or(32 * 1024))
}

#[cfg(target_arch = "x86_64")]
fn detect_l1d() -> Option<usize> {
    use std::arch::x86_64::__cpuid_count;
    let ext_max = __cpuid_count(0x8000_0000, 0).eax;
    if ext_max >= 0x8000_0005 {
        let kib = __cpuid_count(0x8000_0005, 0).ecx >> 24;
        if kib > 0 {
            return usize::try_from(kib).ok()?.checked_mul(1024);
        }
    }
    if __cpuid_count(0, 0).eax < 4 {
        return None;
    }
    for sub in 0..16 {
        let r = __cpuid_count(4, sub);
        let kind = r.eax & 0x1f;
        if kind == 0 {
            break;
        }
        let level = (r.eax >> 5) & 0x7;
        if level == 1 && kind == 1 {
            let ways = u64::from((r.ebx >> 22) + 1);
            let parts = u64::from(((r.ebx >> 12) & 0x3ff) + 1);
            let line = u64::from((r.ebx & 0xfff) + 1);
            let sets = u64::from(r.ecx) + 1;
            let bytes = ways
                .checked_mul(parts)?
                .checked_mul(line)?
                .checked_mul(sets)?;
            return usize::try_from(bytes).ok();
        }
    }
    None
}
