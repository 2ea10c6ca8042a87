//! Typed errors of the kernel crate.

use crate::formats::{RowType, TernaryLayout};

/// Everything that can go wrong when building a weight view or running a kernel.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum KernelError {
    /// Slice lengths do not match the shapes the call was given.
    #[error("shape mismatch in {what}: expected {expected}, got {got}")]
    ShapeMismatch {
        /// Which argument was wrong.
        what: &'static str,
        /// Expected length (elements).
        expected: usize,
        /// Actual length (elements).
        got: usize,
    },
    /// The byte length of a weight (or its scale tensor) does not match its layout.
    #[error("{layout:?}: {rows}x{cols} needs {expected} bytes of {what}, got {got}")]
    SizeMismatch {
        /// Layout the size was computed for.
        layout: TernaryLayout,
        /// Which buffer (weights, scales).
        what: &'static str,
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
        /// Exact expected bytes.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// The row length is not allowed by the layout (e.g. I2_S needs K % 128 == 0).
    #[error("{layout:?} cannot hold rows of {cols} elements (needs a multiple of {multiple})")]
    BadRowLength {
        /// The layout.
        layout: TernaryLayout,
        /// Row length requested.
        cols: usize,
        /// The multiple the layout requires.
        multiple: usize,
    },
    /// A row longer than the kernels accept ([`crate::layout::MAX_K`]).
    #[error("rows of {cols} elements are longer than the supported {max}")]
    RowTooLong {
        /// Row length requested.
        cols: usize,
        /// The limit.
        max: usize,
    },
    /// A size computation overflowed `usize`.
    #[error("size overflow computing {what}")]
    Overflow {
        /// What was being computed.
        what: &'static str,
    },
    /// More than one ternary layout matches the available bytes of a type-36 tensor.
    #[error(
        "tensor '{tensor}' ({n_elements} elements, {available} bytes available): \
         ambiguous ternary layout, candidates {candidates:?}"
    )]
    AmbiguousLayout {
        /// Tensor name.
        tensor: String,
        /// Element count.
        n_elements: usize,
        /// Bytes available up to the next tensor (incl. alignment padding).
        available: usize,
        /// Every layout whose exact size fits, with its expected size.
        candidates: Vec<(TernaryLayout, usize)>,
    },
    /// No ternary layout matches the available bytes of a type-36 tensor.
    #[error(
        "tensor '{tensor}' ({n_elements} elements, {available} bytes available): \
         no ternary layout fits; expected sizes {candidates:?}"
    )]
    NoLayout {
        /// Tensor name.
        tensor: String,
        /// Element count.
        n_elements: usize,
        /// Bytes available up to the next tensor (incl. alignment padding).
        available: usize,
        /// Every layout tried, with the exact size it would need.
        candidates: Vec<(TernaryLayout, usize)>,
    },
    /// A row format this crate does not implement for the requested operation.
    #[error("row type {ty:?} is not supported for {op}")]
    UnsupportedRowType {
        /// The row type.
        ty: RowType,
        /// The operation.
        op: &'static str,
    },
    /// A row index past the end.
    #[error("row {row} out of range (rows = {rows})")]
    RowOutOfRange {
        /// Requested row.
        row: usize,
        /// Number of rows.
        rows: usize,
    },
    /// A layout that needs a scale tensor was given none, or one was given where none is used.
    #[error("{layout:?}: {reason}")]
    Scales {
        /// The layout.
        layout: TernaryLayout,
        /// What is wrong.
        reason: &'static str,
    },
}
