//! Caps applied while parsing, so hostile files cannot exhaust memory or time.

/// Caps applied while parsing a GGUF file. Every constructor of [`crate::GgufFile`] takes one.
///
/// [`Limits::default`] is generous but finite: it admits the official 2B-4T file and a
/// llama3-sized vocabulary (128 256 tokens, 280 147 merges) with room to spare. Tests use small
/// limits so "too big" cases stay cheap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest file accepted, in bytes.
    pub max_file_size: u64,
    /// Longest string (key, string value, array element) in bytes.
    pub max_string_len: u64,
    /// Most elements in one metadata array.
    pub max_array_len: u64,
    /// Most tensors in one file.
    pub max_tensors: u64,
    /// Most metadata key-value pairs in one file.
    pub max_kv: u64,
    /// Tensor names must be *shorter* than this many bytes (ggml's `GGML_MAX_NAME` = 64
    /// counts the terminating NUL, so 63 bytes is the longest name ggml can load).
    pub max_name_len: usize,
    /// Most dimensions of one tensor.
    pub max_dims: usize,
    /// Largest accepted `general.alignment`.
    pub max_alignment: u64,
    /// Deepest nesting of arrays of arrays (1 = arrays of scalars and strings only).
    pub max_array_depth: u32,
    /// Total heap bytes the parser may allocate for metadata and the tensor table
    /// (string contents, `String`/`Vec` headers and array element storage).
    pub max_alloc: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_file_size: 1 << 40,   // 1 TiB
            max_string_len: 64 << 20, // 64 MiB (chat templates are a few KiB)
            max_array_len: 1 << 26,   // 67 M elements (llama3 merges: 280 147)
            max_tensors: 1 << 16,     // the 2B-4T file has 332
            max_kv: 1 << 16,          // real files have a few dozen
            max_name_len: 64,         // GGML_MAX_NAME
            max_dims: 4,              // GGML_MAX_DIMS
            max_alignment: 1 << 16,   // real files use 32
            max_array_depth: 8,       // real files never nest arrays
            max_alloc: 2 << 30,       // 2 GiB; the llama3 vocab needs ~20 MiB
        }
    }
}
