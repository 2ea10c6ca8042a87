//! What the CPU offers, read once: the instruction-set features the kernel tiers need, the
//! size of the L1 data cache, and whether this process may use the AMX tile unit (the one
//! question that asks the OS, once). A leaf: it knows nothing of the kernels.

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

/// Whether this process may use the AMX-INT8 tile unit: `Ok` once the CPU reports AMX-TILE
/// and AMX-INT8, the OS enables the tile state (XCR0 bits 17 and 18), and the kernel has
/// granted this process the tile data (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`,
/// asked once, here); otherwise the reason it may not.
#[cfg(target_arch = "x86_64")]
pub(crate) fn amx() -> Result<(), &'static str> {
    static AMX: std::sync::OnceLock<Result<(), &'static str>> = std::sync::OnceLock::new();
    *AMX.get_or_init(|| {
        use std::arch::x86_64::__cpuid_count;
        let leaf7 = (__cpuid_count(0, 0).eax >= 7).then(|| __cpuid_count(7, 0).edx);
        let has_tile = leaf7.is_some_and(|d| d & (1 << 24) != 0);
        let has_int8 = leaf7.is_some_and(|d| d & (1 << 25) != 0);
        let osxsave = __cpuid_count(1, 0).ecx & (1 << 27) != 0;
        amx_verdict(has_tile && has_int8, osxsave.then(xcr0), request_tile_data)
    })
}
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn amx() -> Result<(), &'static str> {
    Err("not an x86-64 CPU")
}

/// The AMX decision from what was read: AMX-TILE and AMX-INT8 in CPUID, XCR0 (when the OS
/// uses XSAVE) and the kernel's answer to the permission request (asked only when the rest
/// allows it).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn amx_verdict(
    cpu_has_amx_int8: bool,
    xcr0: Option<u64>,
    request: impl FnOnce() -> Result<(), &'static str>,
) -> Result<(), &'static str> {
    if !cpu_has_amx_int8 {
        return Err("the CPU has no AMX-INT8");
    }
    const TILE_STATE: u64 = (1 << 17) | (1 << 18);
    if xcr0.is_none_or(|x| x & TILE_STATE != TILE_STATE) {
        return Err("the OS does not enable the AMX tile state");
    }
    request()
}

/// XCR0, the state components the OS saves and restores.
#[cfg(target_arch = "x86_64")]
fn xcr0() -> u64 {
    /// # Safety
    /// The CPU supports XSAVE and the OS has set CR4.OSXSAVE (CPUID.1:ECX bit 27).
    #[target_feature(enable = "xsave")]
    unsafe fn read() -> u64 {
        // SAFETY: XSAVE is enabled for this function and available (the caller's contract).
        unsafe { std::arch::x86_64::_xgetbv(0) }
    }
    // SAFETY: called only when CPUID reports OSXSAVE (see `amx`).
    unsafe { read() }
}

/// Ask Linux for the AMX tile data state for this process (all its threads).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn request_tile_data() -> Result<(), &'static str> {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM takes two integers and touches no memory
    // of ours; it only changes which state components this process may use.
    let r = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err("the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)")
    }
}
/// Other systems: the tier is used on Linux only.
#[cfg(all(not(target_os = "linux"), target_arch = "x86_64"))]
fn request_tile_data() -> Result<(), &'static str> {
    Err("the AMX tier runs on Linux only")
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
    {
        use std::arch::x86_64::__cpuid_count;
        if __cpuid_count(0, 0).eax >= 7 && __cpuid_count(7, 0).edx & (1 << 25) != 0 {
            v.push("amx-int8");
        }
    }
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

#[cfg(test)]
mod tests {
    use super::amx_verdict;

    #[test]
    fn amx_needs_the_cpu_the_os_and_the_kernel() {
        let tiles = Some((1u64 << 17) | (1 << 18) | 0xe7);
        assert_eq!(amx_verdict(true, tiles, || Ok(())), Ok(()));
        assert!(amx_verdict(false, tiles, || Ok(())).is_err_and(|e| e.contains("CPU")));
        assert!(amx_verdict(true, Some(0xe7), || Ok(())).is_err_and(|e| e.contains("OS")));
        assert!(amx_verdict(true, None, || Ok(())).is_err_and(|e| e.contains("OS")));
        assert_eq!(amx_verdict(true, tiles, || Err("refused")), Err("refused"));
        // The kernel is asked only when the CPU and the OS allow it.
        let mut asked = false;
        let _ = amx_verdict(false, tiles, || {
            asked = true;
            Ok(())
        });
        assert!(!asked);
    }
}
