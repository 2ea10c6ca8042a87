//! Typed errors for reading and writing GGUF containers.
//!
//! Every way a hostile or damaged file can fail has its own variant, so tests (and callers) can
//! tell "truncated" from "too big" from "wrong type" without parsing messages.

/// Everything that can go wrong while reading, validating or writing a GGUF file.
#[derive(thiserror::Error, Debug)]
#[non_exhaustive]
pub enum GgufError {
    /// The operating system refused a read, write or map.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),

    /// The file ends before a field that must be there.
    #[error("file truncated: {what} at byte offset {offset} runs past the end of the file")]
    Truncated { what: &'static str, offset: u64 },

    /// The header goes on past the first bytes of the file given so far
    /// ([`crate::GgufHeader::parse_prefix`] asks for more).
    #[error("the header continues past byte offset {offset}: more of the file is needed")]
    Incomplete { offset: u64 },

    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file (bad magic)")]
    BadMagic,

    /// Version 0, 1 (u32 counts, never supported) or newer than 3.
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),

    /// The version field reads as a byte-swapped 2 or 3: a big-endian GGUF.
    #[error("big-endian GGUF files are not supported")]
    BigEndian,

    /// A tensor or key-value count cannot fit in the bytes that follow it.
    #[error("{what} count {count} cannot fit in the file")]
    CountTooLarge { what: &'static str, count: u64 },

    /// A metadata key of length zero.
    #[error("metadata key is empty")]
    KeyEmpty,

    /// The same metadata key appears twice.
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),

    /// A key, string value or tensor name is not valid UTF-8.
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str },

    /// A string length prefix is above [`crate::Limits::max_string_len`].
    #[error("string of {len} bytes at offset {offset} exceeds the limit of {limit}")]
    StringTooLong { len: u64, limit: u64, offset: u64 },

    /// An array length prefix is above [`crate::Limits::max_array_len`].
    #[error("array of {len} elements at offset {offset} exceeds the limit of {limit}")]
    ArrayTooLong { len: u64, limit: u64, offset: u64 },

    /// Arrays of arrays nested deeper than [`crate::Limits::max_array_depth`].
    #[error("arrays nested deeper than {limit} levels")]
    ArrayNestingTooDeep { limit: u32 },

    /// A metadata value type id outside 0..=12.
    #[error("unknown metadata value type {0}")]
    BadValueType(u32),

    /// A bool stored as a byte other than 0 or 1.
    #[error("bool value stored as byte {0} (must be 0 or 1)")]
    BadBool(u8),

    /// `general.alignment` is zero, not a power of two, or above the limit.
    #[error("bad general.alignment {value}: {reason}")]
    BadAlignment { value: u64, reason: &'static str },

    /// A tensor name at least [`crate::Limits::max_name_len`] bytes long.
    #[error("tensor name of {len} bytes is too long (must be shorter than {limit})")]
    NameTooLong { len: u64, limit: usize },

    /// An empty tensor name.
    #[error("tensor name is empty")]
    NameEmpty,

    /// Two tensors share a name (ggml refuses such a file too): the name and the indices of
    /// the first two tensors that carry it.
    #[error("duplicate tensor name {name:?}: tensors #{first} and #{second}")]
    DuplicateTensor {
        name: String,
        first: usize,
        second: usize,
    },

    /// `n_dims` is 0 or above [`crate::Limits::max_dims`], or the shape does not suit the type.
    #[error("tensor {tensor:?}: bad dimensions: {reason}")]
    BadDims { tensor: String, reason: String },

    /// A dimension of size zero.
    #[error("tensor {tensor:?}: dimension {axis} is zero")]
    ZeroDim { tensor: String, axis: usize },

    /// The element count or byte size overflows u64, i64 or usize.
    #[error("tensor {tensor:?}: shape {dims:?} overflows")]
    ShapeOverflow { tensor: String, dims: Vec<u64> },

    /// A tensor offset that is not a multiple of the file's alignment.
    #[error("tensor {tensor:?}: offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        tensor: String,
        offset: u64,
        alignment: u64,
    },

    /// Two tensors' byte ranges overlap.
    #[error(
        "tensor {tensor:?} (offset {offset}, needs at least {needed} bytes) overlaps tensor {next:?} at offset {next_offset}"
    )]
    OverlappingTensors {
        tensor: String,
        offset: u64,
        needed: u64,
        next: String,
        next_offset: u64,
    },

    /// A tensor's bytes run past the end of the data section.
    #[error(
        "tensor {tensor:?}: bytes {offset}..{offset}+{needed} lie outside the data section of {data_len} bytes (file truncated or corrupt)"
    )]
    TensorOutOfBounds {
        tensor: String,
        offset: u64,
        needed: u64,
        data_len: u64,
    },

    /// A required metadata key is absent.
    #[error("missing metadata key {key:?}")]
    MissingKey { key: String },

    /// A metadata key holds a different type than requested.
    #[error("metadata key {key:?}: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },

    /// A metadata integer does not fit the requested range.
    #[error("metadata key {key:?}: value {value} out of range for {expected}")]
    OutOfRange {
        key: String,
        value: String,
        expected: &'static str,
    },

    /// The tensor's type has no context-free byte size known to this reader.
    #[error("tensor {tensor:?}: type {type_name} (id {type_id}) is not supported")]
    UnsupportedType {
        tensor: String,
        type_name: &'static str,
        type_id: u32,
    },

    /// A declared tensor byte size does not match its type and shape.
    #[error("tensor {tensor:?}: {got} bytes given, type and shape require {expected}")]
    SizeMismatch {
        tensor: String,
        expected: u64,
        got: u64,
    },

    /// A configured [`crate::Limits`] value was exceeded.
    #[error("{what} of {value} exceeds the limit of {limit}")]
    LimitExceeded {
        what: &'static str,
        value: u64,
        limit: u64,
    },

    /// A byte range handed to [`crate::GgufFile::release`] that does not lie in the file.
    #[error("the {len}-byte range to release is not part of this file's bytes")]
    NotInFile { len: usize },

    /// The writer was used out of order (data before header, wrong tensor, ...).
    #[error("GGUF writer misuse: {0}")]
    Writer(String),
}
