//! BitNet b1.58 model: validated config, one tensor-name table, weight binding over the GGUF
//! map, KV cache and the forward pass (docs/MODEL.md).
#![forbid(unsafe_code)]

mod approx;
mod attention;
pub mod backend;
pub mod config;
mod error;
mod exact;
pub mod kv_cache;
pub mod model;
pub mod names;
pub mod numerics;
mod owned;
mod screen;

pub use approx::{ApproxHead, ApproxOptions, RowReader};
pub use backend::Backend;
pub use config::{Activation, Config, KvType, Pooling, RopeStyle};
pub use error::{ModelError, Result};
pub use kv_cache::KvCache;
pub use model::{Exec, Layer, Model, NormIn, Outputs, Scratch, Seq, TraceEvent};
pub use numerics::Numerics;
pub use owned::OwnedModel;
pub use screen::{HeadScreen, Pick, Picked, ScreenCounts};
