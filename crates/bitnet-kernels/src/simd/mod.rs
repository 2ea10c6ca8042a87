//! Kernel tiers. `scalar` is the reference; the others are selected at run time by
//! `crate::dispatch` and tested against it.

pub(crate) mod scalar;

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
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
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(crate) mod wasm;
