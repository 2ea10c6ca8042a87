//! GGUF container reader and writer.
//!
//! [`GgufFile`] validates a GGUF v2/v3 little-endian file (memory-mapped, read into memory, or
//! from a byte buffer) and lends out tensor bytes without copying. Every length, count and
//! offset in the file is checked before it is used; hostile input yields a [`GgufError`],
//! never a panic or an unbounded allocation (see [`Limits`]). [`GgufWriter`] streams v3 files.
//!
//! This crate knows the container only: it does not interpret model hyperparameters,
//! tokenizers or the ternary layouts that share type id 36 (see [`GgmlType::nbytes`]).
//!
//! ```
//! use bitnet_gguf::{GgmlType, GgufFile, GgufWriter, Limits, Value};
//!
//! // Write a file: metadata, then tensor declarations, header, and data in order.
//! let mut w = GgufWriter::new(Vec::new(), 32)?;
//! w.add_kv("general.architecture", Value::from("bitnet-b1.58"))?;
//! w.add_tensor("output_norm.weight", &[4], 0 /* F32 */, 16)?;
//! w.write_header()?;
//! w.write_tensor_data("output_norm.weight", &[0u8; 16])?;
//! let bytes = w.finish()?;
//!
//! // Read it back (use `GgufFile::open` for a memory-mapped file on disk).
//! let f = GgufFile::from_bytes(bytes, &Limits::default())?;
//! assert_eq!(f.metadata().get_str("general.architecture")?, "bitnet-b1.58");
//! let t = f.tensor("output_norm.weight").expect("declared above");
//! assert_eq!((t.ggml_type, t.dims.as_slice()), (GgmlType::F32, &[4u64][..]));
//! assert_eq!(f.tensor_data(t)?.len(), 16);
//! # Ok::<(), bitnet_gguf::GgufError>(())
//! ```

mod error;
mod guard;
mod limits;
mod mapped;
mod reader;
mod types;
mod value;
mod writer;

pub use error::GgufError;
pub use guard::FileIdentity;
pub use limits::Limits;
pub use mapped::MappedFile;
pub use reader::{
    GgufFile, GgufHeader, TableEntry, TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, HUGE_PAGE,
    KEY_ALIGNMENT,
};
pub use types::GgmlType;
pub use value::{type_id as value_type, Array, Metadata, Value};
pub use writer::GgufWriter;

// The parsed file is shared read-only across threads by the model and server.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<GgufFile>();
    assert_send_sync::<Metadata>();
};
