//! GGUF container reader and writer.
//!
//! [`GgufFile`] validates a GGUF v2/v3 little-endian file (memory-mapped, read into memory, or
//! from a byte buffer) and lends out tensor bytes without copying. Every length, count and
//! offset in the file is checked before it is used; hostile input yields a [`GgufError`],
//! never a panic or an unbounded allocation (see [`Limits`]). [`GgufWriter`] streams v3 files.
//!
//! This crate knows the container only: it does not interpret model hyperparameters,
//! tokenizers or the ternary layouts that share type id 36 (see [`GgmlType::nbytes`]).

mod error;
mod limits;
mod reader;
mod types;
mod value;
mod writer;

pub use error::GgufError;
pub use limits::Limits;
pub use reader::{GgufFile, TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_ALIGNMENT};
pub use types::GgmlType;
pub use value::{type_id as value_type, Array, Metadata, Value};
pub use writer::GgufWriter;
