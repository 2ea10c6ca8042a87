//! Rewrite a GGUF file with edited metadata or tensors: the source of malformed-but-parseable
//! models for negative tests.

use bitnet_gguf::{GgufFile, GgufWriter, Value};

use crate::SynthError;

/// Extreme u32 values for edited metadata (counts, lengths, ids): zero and one, small
/// counts, powers of two and their neighbours, 2^31 and u32::MAX.
pub const EXTREME_U32S: [u32; 16] = [
    0,
    1,
    2,
    3,
    4,
    7,
    16,
    64,
    255,
    256,
    257,
    4096,
    65535,
    1 << 20,
    1 << 31,
    u32::MAX,
];

/// Extreme f32 values for edited metadata and tensor bytes: zero, negative, NaN, ∞, the
/// smallest subnormal, huge and f32::MAX.
pub const EXTREME_F32S: [f32; 8] = [
    0.0,
    -1.0,
    0.5,
    f32::NAN,
    f32::INFINITY,
    1e-45,
    1e30,
    f32::MAX,
];

/// A tensor to write: name, ggml ne, type id and raw bytes.
#[derive(Debug, Clone)]
pub struct RawTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

/// Copy `src`, letting `edit` change the key/value list and the tensor list first.
pub fn rewrite(
    src: &GgufFile,
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<RawTensor>),
) -> Result<Vec<u8>, SynthError> {
    let mut kv: Vec<(String, Value)> = src
        .metadata()
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let mut tensors = Vec::with_capacity(src.tensors().len());
    for t in src.tensors() {
        let nbytes = t.nbytes().unwrap_or(t.available);
        let bytes = src.tensor_bytes(t)?;
        let n =
            usize::try_from(nbytes).map_err(|_| SynthError::Shape("tensor too large".into()))?;
        tensors.push(RawTensor {
            name: t.name.clone(),
            dims: t.dims.clone(),
            type_id: t.type_id,
            data: bytes[..n.min(bytes.len())].to_vec(),
        });
    }
    edit(&mut kv, &mut tensors);
    let mut w = GgufWriter::new(Vec::new(), src.alignment())?;
    for (k, v) in kv {
        if k != "general.alignment" {
            w.add_kv(&k, v)?;
        }
    }
    for t in &tensors {
        w.add_tensor(&t.name, &t.dims, t.type_id, t.data.len() as u64)?;
    }
    w.write_header()?;
    for t in &tensors {
        w.write_tensor_data(&t.name, &t.data)?;
    }
    Ok(w.finish()?)
}
