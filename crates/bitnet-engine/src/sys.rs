//! Facts about the host process: default thread count, peak memory.

/// Physical cores (logical / 2 when SMT is on), at least 1: the default thread count.
pub fn default_threads() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    physical_cores().unwrap_or(logical).clamp(1, logical)
}

fn physical_cores() -> Option<usize> {
    // Linux: count distinct (physical id, core id) pairs.
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mut cores = std::collections::BTreeSet::new();
    let (mut phys, mut core) = (None::<String>, None::<String>);
    for line in info.lines().chain(std::iter::once("")) {
        if line.trim().is_empty() {
            if let (Some(p), Some(c)) = (phys.take(), core.take()) {
                cores.insert((p, c));
            }
            continue;
        }
        if let Some((k, v)) = line.split_once(':') {
            match k.trim() {
                "physical id" => phys = Some(v.trim().to_string()),
                "core id" => core = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// Resident memory of this process now (Linux `VmRSS`), in bytes; `None` elsewhere.
pub fn rss_bytes() -> Option<u64> {
    status_kb("VmRSS:")
}

/// Peak resident memory of this process (Linux `VmHWM`), in bytes; `None` elsewhere.
pub fn peak_rss_bytes() -> Option<u64> {
    status_kb("VmHWM:")
}

fn status_kb(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}
