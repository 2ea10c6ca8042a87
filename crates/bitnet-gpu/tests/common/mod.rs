//! The GPU tests' gate: they need an adapter (CI installs Mesa's software Vulkan driver). One
//! that finds none fails, unless `BITNET_GPU_TESTS=skip` says to skip on purpose.
#![allow(dead_code, clippy::panic)]

use bitnet_gpu::Gpu;

/// True when the GPU tests should run (see `bitnet_gpu::probe::gpu_tests_enabled`).
pub fn have_gpu() -> bool {
    bitnet_gpu::probe::gpu_tests_enabled()
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
