//! Streaming GGUF v3 writer.
//!
//! Usage: declare metadata ([`GgufWriter::add_kv`]) and tensors ([`GgufWriter::add_tensor`]),
//! call [`GgufWriter::write_header`], then stream each tensor's bytes in declaration order
//! ([`GgufWriter::write_tensor_data`] or chunk by chunk with
//! [`GgufWriter::write_tensor_chunk`]), and [`GgufWriter::finish`]. Nothing is buffered beyond
//! the header tables, so multi-GB tensors stream straight through.

use std::collections::{HashMap, HashSet};
use std::io::Write;

use crate::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_ALIGNMENT};
use crate::{Array, GgmlType, GgufError, Value};

/// Longest tensor name the writer accepts (ggml's GGML_MAX_NAME − 1).
const MAX_NAME_BYTES: usize = 63;

#[derive(Debug)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    nbytes: u64,
    /// Relative to the data section start; a multiple of the alignment.
    offset: u64,
}

/// Streaming GGUF v3 writer (little-endian).
#[derive(Debug)]
pub struct GgufWriter<W: Write> {
    w: W,
    alignment: u64,
    kvs: Vec<(String, Value)>,
    keys: HashSet<String>,
    tensors: Vec<PendingTensor>,
    /// Tensor names added so far, with their indices.
    names: HashMap<String, usize>,
    /// End of the declared data (relative to the data section), before final padding.
    data_end: u64,
    header_written: bool,
    /// Bytes written to `w` so far.
    pos: u64,
    /// Absolute offset of the data section (valid once the header is written).
    data_start: u64,
    /// Index of the tensor being written and bytes of it written so far.
    cur: usize,
    cur_written: u64,
}

fn writer_err(msg: impl Into<String>) -> GgufError {
    GgufError::Writer(msg.into())
}

fn len64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

impl<W: Write> GgufWriter<W> {
    /// Starts a file with the given data alignment (a non-zero power of two that fits u32).
    /// An alignment other than 32 is recorded as the first key, `general.alignment` (u32).
    pub fn new(w: W, alignment: u64) -> Result<Self, GgufError> {
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(GgufError::BadAlignment {
                value: alignment,
                reason: "must be a non-zero power of two",
            });
        }
        let a32 = u32::try_from(alignment).map_err(|_| GgufError::BadAlignment {
            value: alignment,
            reason: "does not fit u32",
        })?;
        let mut me = Self {
            w,
            alignment,
            kvs: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashMap::new(),
            data_end: 0,
            header_written: false,
            pos: 0,
            data_start: 0,
            cur: 0,
            cur_written: 0,
        };
        if alignment != DEFAULT_ALIGNMENT {
            me.add_kv(KEY_ALIGNMENT, Value::U32(a32))?;
        }
        Ok(me)
    }

    /// Appends a metadata pair (file order = call order). Keys must be non-empty and unique.
    pub fn add_kv(&mut self, key: &str, v: Value) -> Result<(), GgufError> {
        if self.header_written {
            return Err(writer_err("add_kv after write_header"));
        }
        if key.is_empty() {
            return Err(GgufError::KeyEmpty);
        }
        if self.keys.contains(key) {
            return Err(GgufError::DuplicateKey(key.to_owned()));
        }
        if key == KEY_ALIGNMENT {
            // Only reachable from `new` (alignment ≠ 32) or for a matching explicit 32.
            if v != Value::U32(u32::try_from(self.alignment).unwrap_or(0)) {
                return Err(writer_err(format!(
                    "general.alignment must be u32 {} (set it through GgufWriter::new)",
                    self.alignment
                )));
            }
        }
        self.keys.insert(key.to_owned());
        self.kvs.push((key.to_owned(), v));
        Ok(())
    }

    /// Declares a tensor: `dims` in ggml `ne` order (dims[0] = row length), the stored type
    /// id, and its byte size. Offsets are assigned in declaration order, each aligned.
    /// For types with a context-free size (all but ids 36..=39 and unknown ids) `nbytes` must
    /// equal the size the type and shape imply.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        type_id: u32,
        nbytes: u64,
    ) -> Result<(), GgufError> {
        if self.header_written {
            return Err(writer_err("add_tensor after write_header"));
        }
        if name.is_empty() {
            return Err(GgufError::NameEmpty);
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(GgufError::NameTooLong {
                len: len64(name.len()),
                limit: MAX_NAME_BYTES + 1,
            });
        }
        if let Some(&first) = self.names.get(name) {
            return Err(GgufError::DuplicateTensor {
                name: name.to_owned(),
                first,
                second: self.names.len(),
            });
        }
        if dims.is_empty() || dims.len() > 4 {
            return Err(GgufError::BadDims {
                tensor: name.to_owned(),
                reason: format!("{} dims, must be 1..=4", dims.len()),
            });
        }
        if let Some(axis) = dims.iter().position(|&d| d == 0) {
            return Err(GgufError::ZeroDim {
                tensor: name.to_owned(),
                axis,
            });
        }
        let n = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .filter(|&n| i64::try_from(n).is_ok())
            .ok_or_else(|| GgufError::ShapeOverflow {
                tensor: name.to_owned(),
                dims: dims.to_vec(),
            })?;
        if nbytes == 0 {
            return Err(GgufError::SizeMismatch {
                tensor: name.to_owned(),
                expected: 1,
                got: 0,
            });
        }
        if !(36..=39).contains(&type_id) {
            let t = GgmlType::from_id(type_id, false);
            if let (Some(be), Some(expected)) = (t.block_elems(), t.nbytes(n)) {
                if !dims[0].is_multiple_of(be) {
                    return Err(GgufError::BadDims {
                        tensor: name.to_owned(),
                        reason: format!(
                            "ne[0] = {} is not a multiple of the {} block size {be}",
                            dims[0],
                            t.name()
                        ),
                    });
                }
                if expected != nbytes {
                    return Err(GgufError::SizeMismatch {
                        tensor: name.to_owned(),
                        expected,
                        got: nbytes,
                    });
                }
            } else if t.block_elems().is_some() {
                return Err(GgufError::BadDims {
                    tensor: name.to_owned(),
                    reason: format!("{n} elements is not a whole number of {} blocks", t.name()),
                });
            }
        }
        let offset = self.data_end;
        let end = offset
            .checked_add(nbytes)
            .and_then(|e| e.checked_next_multiple_of(self.alignment))
            .ok_or_else(|| GgufError::ShapeOverflow {
                tensor: name.to_owned(),
                dims: dims.to_vec(),
            })?;
        let index = self.names.len();
        self.names.insert(name.to_owned(), index);
        self.tensors.push(PendingTensor {
            name: name.to_owned(),
            dims: dims.to_vec(),
            type_id,
            nbytes,
            offset,
        });
        self.data_end = end;
        Ok(())
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        self.w.write_all(bytes)?;
        self.pos = self.pos.saturating_add(len64(bytes.len()));
        Ok(())
    }

    fn put_u32(&mut self, v: u32) -> Result<(), GgufError> {
        self.put(&v.to_le_bytes())
    }

    fn put_u64(&mut self, v: u64) -> Result<(), GgufError> {
        self.put(&v.to_le_bytes())
    }

    fn put_str(&mut self, s: &str) -> Result<(), GgufError> {
        self.put_u64(len64(s.len()))?;
        self.put(s.as_bytes())
    }

    fn put_zeros(&mut self, mut n: u64) -> Result<(), GgufError> {
        const ZEROS: [u8; 256] = [0; 256];
        while n > 0 {
            let k = n.min(256);
            let k_usize = usize::try_from(k).unwrap_or(256);
            self.put(&ZEROS[..k_usize])?;
            n -= k;
        }
        Ok(())
    }

    fn pad_to_alignment(&mut self) -> Result<(), GgufError> {
        let target = self
            .pos
            .checked_next_multiple_of(self.alignment)
            .unwrap_or(self.pos);
        self.put_zeros(target - self.pos)
    }

    fn put_value(&mut self, v: &Value) -> Result<(), GgufError> {
        match v {
            Value::U8(x) => self.put(&x.to_le_bytes()),
            Value::I8(x) => self.put(&x.to_le_bytes()),
            Value::U16(x) => self.put(&x.to_le_bytes()),
            Value::I16(x) => self.put(&x.to_le_bytes()),
            Value::U32(x) => self.put(&x.to_le_bytes()),
            Value::I32(x) => self.put(&x.to_le_bytes()),
            Value::F32(x) => self.put(&x.to_le_bytes()),
            Value::Bool(x) => self.put(&[u8::from(*x)]),
            Value::String(s) => self.put_str(s),
            Value::Array(a) => self.put_array(a),
            Value::U64(x) => self.put(&x.to_le_bytes()),
            Value::I64(x) => self.put(&x.to_le_bytes()),
            Value::F64(x) => self.put(&x.to_le_bytes()),
        }
    }

    fn put_array(&mut self, a: &Array) -> Result<(), GgufError> {
        self.put_u32(a.elem_type_id())?;
        self.put_u64(len64(a.len()))?;
        macro_rules! each {
            ($v:expr) => {{
                for x in $v {
                    self.put(&x.to_le_bytes())?;
                }
                Ok(())
            }};
        }
        match a {
            Array::U8(v) => self.put(v),
            Array::I8(v) => each!(v),
            Array::U16(v) => each!(v),
            Array::I16(v) => each!(v),
            Array::U32(v) => each!(v),
            Array::I32(v) => each!(v),
            Array::F32(v) => each!(v),
            Array::Bool(v) => {
                for &b in v {
                    self.put(&[u8::from(b)])?;
                }
                Ok(())
            }
            Array::String(v) => {
                for s in v {
                    self.put_str(s)?;
                }
                Ok(())
            }
            Array::Array(v) => {
                for inner in v {
                    self.put_array(inner)?;
                }
                Ok(())
            }
            Array::U64(v) => each!(v),
            Array::I64(v) => each!(v),
            Array::F64(v) => each!(v),
        }
    }

    /// Writes magic, version 3, counts, metadata, tensor infos and padding up to the data
    /// section. Called implicitly by [`GgufWriter::finish`] if never called.
    pub fn write_header(&mut self) -> Result<(), GgufError> {
        if self.header_written {
            return Err(writer_err("write_header called twice"));
        }
        self.header_written = true;
        self.put(&GGUF_MAGIC)?;
        self.put_u32(3)?;
        self.put_u64(len64(self.tensors.len()))?;
        self.put_u64(len64(self.kvs.len()))?;
        let kvs = std::mem::take(&mut self.kvs);
        for (k, v) in &kvs {
            self.put_str(k)?;
            self.put_u32(v.type_id())?;
            self.put_value(v)?;
        }
        self.kvs = kvs;
        let tensors = std::mem::take(&mut self.tensors);
        for t in &tensors {
            self.put_str(&t.name)?;
            self.put_u32(u32::try_from(t.dims.len()).unwrap_or(u32::MAX))?;
            for &d in &t.dims {
                self.put_u64(d)?;
            }
            self.put_u32(t.type_id)?;
            self.put_u64(t.offset)?;
        }
        self.tensors = tensors;
        self.pad_to_alignment()?;
        self.data_start = self.pos;
        Ok(())
    }

    /// Writes the whole of the next tensor's data; `bytes.len()` must equal its declared size.
    pub fn write_tensor_data(&mut self, name: &str, bytes: &[u8]) -> Result<(), GgufError> {
        if self.cur_written != 0 {
            return Err(writer_err(format!(
                "write_tensor_data({name:?}) while a chunked tensor is unfinished"
            )));
        }
        let expected = self.tensors.get(self.cur).map_or(0, |t| t.nbytes);
        if len64(bytes.len()) != expected
            && self.tensors.get(self.cur).is_some_and(|t| t.name == name)
        {
            return Err(GgufError::SizeMismatch {
                tensor: name.to_owned(),
                expected,
                got: len64(bytes.len()),
            });
        }
        self.write_tensor_chunk(name, bytes)
    }

    /// Appends a chunk of the next tensor's data. Chunks must arrive in declaration order and
    /// sum to the declared size; padding is inserted automatically.
    pub fn write_tensor_chunk(&mut self, name: &str, bytes: &[u8]) -> Result<(), GgufError> {
        if !self.header_written {
            return Err(writer_err("tensor data before write_header"));
        }
        let Some(t) = self.tensors.get(self.cur) else {
            return Err(writer_err(format!(
                "tensor {name:?}: all declared tensors are already written"
            )));
        };
        if t.name != name {
            return Err(writer_err(format!(
                "tensor {name:?} written out of order; next is {:?}",
                t.name
            )));
        }
        let (nbytes, offset) = (t.nbytes, t.offset);
        let total = self
            .cur_written
            .checked_add(len64(bytes.len()))
            .filter(|&n| n <= nbytes);
        let Some(total) = total else {
            return Err(GgufError::SizeMismatch {
                tensor: name.to_owned(),
                expected: nbytes,
                got: self.cur_written.saturating_add(len64(bytes.len())),
            });
        };
        if self.cur_written == 0 {
            let start = self.data_start.saturating_add(offset);
            debug_assert!(start >= self.pos);
            self.put_zeros(start.saturating_sub(self.pos))?;
        }
        self.put(bytes)?;
        self.cur_written = total;
        if total == nbytes {
            self.cur += 1;
            self.cur_written = 0;
            self.pad_to_alignment()?;
        }
        Ok(())
    }

    /// Checks that every declared tensor was written, flushes, and returns the sink.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if !self.header_written {
            self.write_header()?;
        }
        if self.cur < self.tensors.len() {
            let t = &self.tensors[self.cur];
            return Err(writer_err(format!(
                "finish with tensor {:?} incomplete ({} of {} bytes) and {} more unwritten",
                t.name,
                self.cur_written,
                t.nbytes,
                self.tensors.len() - self.cur - 1
            )));
        }
        self.w.flush()?;
        Ok(self.w)
    }
}
