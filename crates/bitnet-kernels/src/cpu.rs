//! What the CPU offers, read once: the instruction-set features the kernel tiers need, and
//! the size of the L1 data cache. A leaf: it knows nothing of the kernels.

#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn has_avx2() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512() -> bool {
    has_avx2()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
}
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn has_avx512() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avxvnni() -> bool {
    std::arch::is_x86_feature_detected!("avxvnni")
}
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512vnni() -> bool {
    std::arch::is_x86_feature_detected!("avx512vnni")
}
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn has_avxvnni() -> bool {
    false
}
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn has_avx512vnni() -> bool {
    false
}

#[cfg(target_arch = "aarch64")]
pub(crate) fn has_neon() -> bool {
    std::arch::is_aarch64_feature_detected!("neon")
}
#[cfg(not(target_arch = "aarch64"))]
pub(crate) fn has_neon() -> bool {
    false
}

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

/// The features `isa_report` lists.
#[cfg(target_arch = "x86_64")]
pub(crate) fn features() -> Vec<&'static str> {
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
pub(crate) fn features() -> Vec<&'static str> {
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
pub(crate) fn features() -> Vec<&'static str> {
    Vec::new()
}
