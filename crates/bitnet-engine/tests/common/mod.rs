//! Shared by the engine's tests.
#![allow(dead_code, clippy::unwrap_used)]

use bitnet_engine::{load, Engine, LoadOptions};
use bitnet_model::{KvType, Numerics};

/// The tiny golden model at 2 threads with these numerics and KV type.
pub fn tiny_engine(numerics: Numerics, kv_type: KvType) -> Engine {
    load(
        &bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf"),
        &LoadOptions {
            threads: 2,
            numerics,
            kv_type,
            ..LoadOptions::default()
        },
        &mut |_| {},
    )
    .unwrap()
}
