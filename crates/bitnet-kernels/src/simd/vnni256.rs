//! The AVX-VNNI tier (256-bit `vpdpbusd` without AVX-512, e.g. Alder Lake; Zen 4/5 have it
//! too): the AVX2 table plus the panel GEMM on 256-bit VNNI.

use crate::tier::{Isa, Kernels};

pub(crate) static TABLE: Kernels = Kernels {
    isa: Isa::AvxVnni,
    i2s_panel: Some(super::panel_x86::panel_256),
    panel_tokens: super::panel_x86::TOKENS_256,
    ..super::avx2::TABLE_BASE
};
