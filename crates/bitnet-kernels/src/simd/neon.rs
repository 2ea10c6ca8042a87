//! NEON kernels (I2_S, TQ2_0); the rest scalar.

use super::scalar;
use crate::dispatch::{Isa, Kernels};

pub(crate) static TABLE: Kernels = Kernels {
    isa: Isa::Neon,
    i2s: scalar::i2s,
    tq2: scalar::tq2,
    tq1: scalar::tq1,
    bitnet32: scalar::bitnet32,
    split32: scalar::split32,
    qk256: scalar::qk256,
    f16_dot_ggml: scalar::f16_dot_ggml,
    f16_dot_tiny: scalar::f16_dot_tiny,
    q8_0_dot: scalar::q8_0_dot,
    f32_dot: scalar::f32_dot_lanes8,
};
