//! Metadata values, arrays and the ordered key-value table.

use crate::GgufError;

/// GGUF metadata value type ids (`gguf_type` in ggml's gguf.h).
pub mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A homogeneous metadata array. Arrays of arrays may hold differently typed inner arrays;
/// their nesting depth is capped by [`crate::Limits::max_array_depth`] when parsing.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    /// Short type name, e.g. `"u32"`, `"string"`, `"array<f32>"`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(a) => a.type_name(),
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }

    /// The GGUF value type id (0..=12).
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => type_id::U8,
            Value::I8(_) => type_id::I8,
            Value::U16(_) => type_id::U16,
            Value::I16(_) => type_id::I16,
            Value::U32(_) => type_id::U32,
            Value::I32(_) => type_id::I32,
            Value::F32(_) => type_id::F32,
            Value::Bool(_) => type_id::BOOL,
            Value::String(_) => type_id::STRING,
            Value::Array(_) => type_id::ARRAY,
            Value::U64(_) => type_id::U64,
            Value::I64(_) => type_id::I64,
            Value::F64(_) => type_id::F64,
        }
    }

    /// The value as an integer, for any integer type (not bool, not float).
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The string, if this is a string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The array, if this is an array value.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Type name including the element type, e.g. `"array<string>"`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Array::U8(_) => "array<u8>",
            Array::I8(_) => "array<i8>",
            Array::U16(_) => "array<u16>",
            Array::I16(_) => "array<i16>",
            Array::U32(_) => "array<u32>",
            Array::I32(_) => "array<i32>",
            Array::F32(_) => "array<f32>",
            Array::Bool(_) => "array<bool>",
            Array::String(_) => "array<string>",
            Array::Array(_) => "array<array>",
            Array::U64(_) => "array<u64>",
            Array::I64(_) => "array<i64>",
            Array::F64(_) => "array<f64>",
        }
    }

    /// The GGUF value type id of the elements.
    pub fn elem_type_id(&self) -> u32 {
        match self {
            Array::U8(_) => type_id::U8,
            Array::I8(_) => type_id::I8,
            Array::U16(_) => type_id::U16,
            Array::I16(_) => type_id::I16,
            Array::U32(_) => type_id::U32,
            Array::I32(_) => type_id::I32,
            Array::F32(_) => type_id::F32,
            Array::Bool(_) => type_id::BOOL,
            Array::String(_) => type_id::STRING,
            Array::Array(_) => type_id::ARRAY,
            Array::U64(_) => type_id::U64,
            Array::I64(_) => type_id::I64,
            Array::F64(_) => type_id::F64,
        }
    }
}

macro_rules! value_from {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Self { Value::$v(x) }
        }
        impl From<Vec<$t>> for Array {
            fn from(x: Vec<$t>) -> Self { Array::$v(x) }
        }
    )*};
}
value_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for Value {
    fn from(x: &str) -> Self {
        Value::String(x.to_owned())
    }
}

impl From<Array> for Value {
    fn from(x: Array) -> Self {
        Value::Array(x)
    }
}

impl From<Vec<Array>> for Array {
    fn from(x: Vec<Array>) -> Self {
        Array::Array(x)
    }
}

/// Ordered metadata table: iteration follows file order; lookup is a binary search over a
/// sorted index (O(log n)) that costs no extra key copies.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    /// Entries in file order.
    entries: Vec<(String, Value)>,
    /// Indices into `entries`, sorted by key.
    sorted: Vec<usize>,
}

impl Metadata {
    /// Builds a table from entries in order; rejects empty and duplicate keys.
    pub fn from_entries(entries: Vec<(String, Value)>) -> Result<Self, GgufError> {
        if entries.iter().any(|(k, _)| k.is_empty()) {
            return Err(GgufError::KeyEmpty);
        }
        let mut sorted: Vec<usize> = (0..entries.len()).collect();
        sorted.sort_unstable_by(|&a, &b| entries[a].0.cmp(&entries[b].0));
        for w in sorted.windows(2) {
            if entries[w[0]].0 == entries[w[1]].0 {
                // Report the later occurrence in file order, as a streaming reader would.
                let dup = w[0].max(w[1]);
                return Err(GgufError::DuplicateKey(entries[dup].0.clone()));
            }
        }
        Ok(Self { entries, sorted })
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of key-value pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no key-value pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value stored under `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.sorted
            .binary_search_by(|&i| self.entries[i].0.as_str().cmp(key))
            .ok()
            .map(|pos| &self.entries[self.sorted[pos]].1)
    }

    /// True when `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    fn wrong(key: &str, expected: &'static str, found: &Value) -> GgufError {
        GgufError::WrongType {
            key: key.to_owned(),
            expected,
            found: found.type_name(),
        }
    }

    /// A `u32` value (strict: other integer types are `WrongType`; see [`Metadata::get_uint`]).
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        match self.require(key)? {
            Value::U32(v) => Ok(*v),
            other => Err(Self::wrong(key, "u32", other)),
        }
    }

    /// A `u64` value (strict).
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        match self.require(key)? {
            Value::U64(v) => Ok(*v),
            other => Err(Self::wrong(key, "u64", other)),
        }
    }

    /// An `i32` value (strict).
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        match self.require(key)? {
            Value::I32(v) => Ok(*v),
            other => Err(Self::wrong(key, "i32", other)),
        }
    }

    /// An `f32` value (strict).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            Value::F32(v) => Ok(*v),
            other => Err(Self::wrong(key, "f32", other)),
        }
    }

    /// A `bool` value (strict).
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(v) => Ok(*v),
            other => Err(Self::wrong(key, "bool", other)),
        }
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(v) => Ok(v),
            other => Err(Self::wrong(key, "string", other)),
        }
    }

    /// Any array value.
    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            other => Err(Self::wrong(key, "array", other)),
        }
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        match self.require(key)? {
            Value::Array(Array::String(v)) => Ok(v),
            other => Err(Self::wrong(key, "array<string>", other)),
        }
    }

    /// An array of `f32`.
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], GgufError> {
        match self.require(key)? {
            Value::Array(Array::F32(v)) => Ok(v),
            other => Err(Self::wrong(key, "array<f32>", other)),
        }
    }

    /// An array of `i32`.
    pub fn get_i32_array(&self, key: &str) -> Result<&[i32], GgufError> {
        match self.require(key)? {
            Value::Array(Array::I32(v)) => Ok(v),
            other => Err(Self::wrong(key, "array<i32>", other)),
        }
    }

    /// An array of `u32`.
    pub fn get_u32_array(&self, key: &str) -> Result<&[u32], GgufError> {
        match self.require(key)? {
            Value::Array(Array::U32(v)) => Ok(v),
            other => Err(Self::wrong(key, "array<u32>", other)),
        }
    }

    /// Lenient unsigned getter: any integer type whose value is ≥ 0 (and fits u64).
    /// Bools, floats, strings and arrays are `WrongType`; negative values are `OutOfRange`.
    pub fn get_uint(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        let i = v
            .as_i128()
            .ok_or_else(|| Self::wrong(key, "unsigned integer", v))?;
        u64::try_from(i).map_err(|_| GgufError::OutOfRange {
            key: key.to_owned(),
            value: i.to_string(),
            expected: "u64",
        })
    }

    /// Lenient signed getter: any integer type whose value fits i64.
    pub fn get_int(&self, key: &str) -> Result<i64, GgufError> {
        let v = self.require(key)?;
        let i = v.as_i128().ok_or_else(|| Self::wrong(key, "integer", v))?;
        i64::try_from(i).map_err(|_| GgufError::OutOfRange {
            key: key.to_owned(),
            value: i.to_string(),
            expected: "i64",
        })
    }
}
