//! ggml tensor type ids, names and block sizes.
//!
//! Ids 0..=30 and 34/35/39 follow upstream ggml (`enum ggml_type` in ggml.h; block structs in
//! ggml-common.h). Microsoft's llama.cpp fork used by bitnet.cpp assigns 36 = I2_S,
//! 37 = I8_S (runtime only, never stored), 38 = TL1, 39 = TL2, while upstream uses 39 for MXFP4.
//! An id alone therefore does not name a type: [`GgmlType::from_id`] takes the file's context.

/// A ggml tensor element type.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ2XXS,
    IQ2XS,
    IQ3XXS,
    IQ1S,
    IQ4NL,
    IQ3S,
    IQ2S,
    IQ4XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1M,
    BF16,
    TQ1_0,
    TQ2_0,
    /// bitnet.cpp's ternary type (id 36). Several ternary layouts share this id; see
    /// [`GgmlType::nbytes`].
    I2S,
    /// bitnet.cpp lookup-table layout for ARM (id 38 in a BitNet context).
    TL1,
    /// bitnet.cpp lookup-table layout for x86 (id 39 in a BitNet context).
    TL2,
    /// Upstream MXFP4 (id 39 outside a BitNet context).
    MXFP4,
    /// An id this reader does not know (or a fork id outside its context).
    Unknown(u32),
}

impl GgmlType {
    /// Resolves a stored type id. `bitnet_context` is true for files written by bitnet.cpp's
    /// fork (`general.architecture` starting with "bitnet" or `general.file_type` = 40); it
    /// decides ids 38 (TL1) and 39 (TL2 vs MXFP4).
    pub fn from_id(id: u32, bitnet_context: bool) -> GgmlType {
        use GgmlType::*;
        match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2K,
            11 => Q3K,
            12 => Q4K,
            13 => Q5K,
            14 => Q6K,
            15 => Q8K,
            16 => IQ2XXS,
            17 => IQ2XS,
            18 => IQ3XXS,
            19 => IQ1S,
            20 => IQ4NL,
            21 => IQ3S,
            22 => IQ2S,
            23 => IQ4XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            36 => I2S,
            38 if bitnet_context => TL1,
            39 if bitnet_context => TL2,
            39 => MXFP4,
            other => Unknown(other),
        }
    }

    /// The stored type id.
    pub fn id(&self) -> u32 {
        use GgmlType::*;
        match *self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2K => 10,
            Q3K => 11,
            Q4K => 12,
            Q5K => 13,
            Q6K => 14,
            Q8K => 15,
            IQ2XXS => 16,
            IQ2XS => 17,
            IQ3XXS => 18,
            IQ1S => 19,
            IQ4NL => 20,
            IQ3S => 21,
            IQ2S => 22,
            IQ4XS => 23,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            IQ1M => 29,
            BF16 => 30,
            TQ1_0 => 34,
            TQ2_0 => 35,
            I2S => 36,
            TL1 => 38,
            TL2 => 39,
            MXFP4 => 39,
            Unknown(id) => id,
        }
    }

    /// The ggml name, e.g. `"Q4_K"`, `"I2_S"`; `"UNKNOWN"` for unknown ids.
    pub fn name(&self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2K => "Q2_K",
            Q3K => "Q3_K",
            Q4K => "Q4_K",
            Q5K => "Q5_K",
            Q6K => "Q6_K",
            Q8K => "Q8_K",
            IQ2XXS => "IQ2_XXS",
            IQ2XS => "IQ2_XS",
            IQ3XXS => "IQ3_XXS",
            IQ1S => "IQ1_S",
            IQ4NL => "IQ4_NL",
            IQ3S => "IQ3_S",
            IQ2S => "IQ2_S",
            IQ4XS => "IQ4_XS",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            IQ1M => "IQ1_M",
            BF16 => "BF16",
            TQ1_0 => "TQ1_0",
            TQ2_0 => "TQ2_0",
            I2S => "I2_S",
            TL1 => "TL1",
            TL2 => "TL2",
            MXFP4 => "MXFP4",
            Unknown(_) => "UNKNOWN",
        }
    }

    /// (elements per block, bytes per block) for types with a fixed block layout.
    fn block(&self) -> Option<(u64, u64)> {
        use GgmlType::*;
        // Byte counts follow the block structs of ggml-common.h (QK_K = 256).
        Some(match self {
            F32 => (1, 4),
            F16 => (1, 2),
            Q4_0 => (32, 18),  // f16 d + 16 B nibbles
            Q4_1 => (32, 20),  // f16 d, m + 16 B
            Q5_0 => (32, 22),  // f16 d + 4 B qh + 16 B
            Q5_1 => (32, 24),  // f16 d, m + 4 B qh + 16 B
            Q8_0 => (32, 34),  // f16 d + 32 i8
            Q8_1 => (32, 36),  // f16 d, s + 32 i8
            Q2K => (256, 84),  // 16 scales + 64 qs + f16 d, dmin
            Q3K => (256, 110), // 32 hmask + 64 qs + 12 scales + f16 d
            Q4K => (256, 144), // f16 d, dmin + 12 scales + 128 qs
            Q5K => (256, 176), // f16 d, dmin + 12 scales + 32 qh + 128 qs
            Q6K => (256, 210), // 128 ql + 64 qh + 16 scales + f16 d
            Q8K => (256, 292), // f32 d + 256 i8 + 16 i16 bsums
            IQ2XXS => (256, 66),
            IQ2XS => (256, 74),
            IQ3XXS => (256, 98),
            IQ1S => (256, 50),
            IQ4NL => (32, 18),
            IQ3S => (256, 110),
            IQ2S => (256, 82),
            IQ4XS => (256, 136),
            I8 => (1, 1),
            I16 => (1, 2),
            I32 => (1, 4),
            I64 => (1, 8),
            F64 => (1, 8),
            IQ1M => (256, 56),
            BF16 => (1, 2),
            TQ1_0 => (256, 54), // 48 qs + 4 qh + f16 d
            TQ2_0 => (256, 66), // 64 qs + f16 d
            MXFP4 => (32, 17),  // e8m0 scale + 16 B nibbles
            I2S | TL1 | TL2 | Unknown(_) => return None,
        })
    }

    /// Elements per block, for types with a fixed block layout (None for I2_S, TL1, TL2 and
    /// unknown ids, whose sizes are not a per-block constant).
    pub fn block_elems(&self) -> Option<u64> {
        self.block().map(|(e, _)| e)
    }

    /// Bytes per block, for types with a fixed block layout.
    pub fn block_bytes(&self) -> Option<u64> {
        self.block().map(|(_, b)| b)
    }

    /// Exact byte size of `n_elements` elements, for types whose size does not depend on the
    /// shape or producer. None when `n_elements` is not a whole number of blocks, on overflow,
    /// and for TL1/TL2/unknown ids.
    ///
    /// I2_S returns bitnet.cpp's size, `n/4 + 32` (packed codes plus a 32-byte tail holding the
    /// f32 scale; docs/FORMATS.md §1). Other ternary layouts share id 36 with different sizes, so
    /// the parser does not require this size; it only bounds-checks against available bytes.
    pub fn nbytes(&self, n_elements: u64) -> Option<u64> {
        if *self == GgmlType::I2S {
            return if n_elements.is_multiple_of(4) {
                (n_elements / 4).checked_add(32)
            } else {
                None
            };
        }
        let (elems, bytes) = self.block()?;
        if !n_elements.is_multiple_of(elems) {
            return None;
        }
        (n_elements / elems).checked_mul(bytes)
    }

    /// Fewest bytes any known layout of this type can occupy for `n_elements` elements (used
    /// to reject overlapping tensors). I2_S: `n/4` (every ternary layout stores at least 2 bits
    /// per element); types with unknown sizes: 1.
    pub(crate) fn min_bytes(&self, n_elements: u64) -> Option<u64> {
        match self {
            GgmlType::I2S => Some(n_elements / 4),
            GgmlType::TL1 | GgmlType::TL2 | GgmlType::Unknown(_) => Some(1),
            _ => self.nbytes(n_elements),
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GgmlType::Unknown(id) => write!(f, "UNKNOWN({id})"),
            other => f.write_str(other.name()),
        }
    }
}
