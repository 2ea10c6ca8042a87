//! The GPU tests' gate: they need an adapter (CI installs Mesa's software Vulkan driver). One
//! that finds none fails, unless `BITNET_GPU_TESTS=skip` says to skip on purpose.
#![allow(dead_code, clippy::panic)]

use bitnet_gpu::Gpu;

/// True when the GPU tests should run; panics when they cannot and skipping was not asked.
pub fn have_gpu() -> bool {
    if !bitnet_gpu::adapters().is_empty() {
        return true;
    }
    if std::env::var("BITNET_GPU_TESTS").as_deref() == Ok("skip") {
        eprintln!("no GPU adapter; skipped (BITNET_GPU_TESTS=skip)");
        return false;
    }
    panic!(
        "no GPU adapter found. Install a Vulkan driver (Debian: `apt-get install -y \
         mesa-vulkan-drivers libvulkan1`) or set BITNET_GPU_TESTS=skip"
    );
}

/// The first adapter, opened.
pub fn open() -> Option<Gpu> {
    if !have_gpu() {
        return None;
    }
    match Gpu::open(None) {
        Ok(g) => Some(g),
        Err(e) => panic!("opening the GPU failed: {e}"),
    }
}
