//! QSF: a model container made for streaming one layer at a time.
//!
//! One file, seekable per layer, every byte after the header covered by a CRC32, each layer
//! optionally LZ4-compressed (`lz4_flex` block format, raw size in the index).
//!
//! ```text
//! header, 192 bytes (little-endian)
//!   0  magic "QSF1"          4  version u32 = 1     8  header_bytes u32 = 192
//!   12 n_layer  16 n_embd  20 n_ff  24 n_head  28 n_head_kv  32 n_vocab  36 n_ctx   (u32 each)
//!   40 quant_type u32 (GGUF type id of the projections)   44 compression u32 (layers: 0 none, 1 lz4)
//!   48 file_size u64
//!   56 meta  88 index  120 embedding  152 head            (section descriptors, 32 bytes each)
//!   184 reserved u32 = 0     188 CRC32 of bytes 0..188
//! section descriptor: offset u64 | stored u64 | raw u64 | crc32 u32 (of the stored bytes) | compression u32
//!
//! sections, contiguous in this order, no gaps, the last ending at file_size:
//!   meta       a GGUF file holding only the metadata (every key of the source, tokenizer included)
//!   index      n_layer entries of 48 bytes:
//!                offset u64 | stored u64 | raw u64 | quant u32 | compression u32 |
//!                tensor_count u32 | crc32 u32 | importance f32 (NaN: not measured) | reserved u32
//!   embedding  the token_embd tensor record
//!   head       every other tensor outside the layers (output_norm, output), in file order
//!   layer 0 .. layer n-1   the layer's tensors, contiguous (after decompression)
//! tensor record: name_len u32 | name | ggml_type u32 | n_dims u32 | dims u64 × n_dims |
//!                data_len u64 | pad u32 | pad zero bytes | data
//!   (in a stored section the padding puts each tensor's data at a file offset that is a
//!    multiple of 32, so an uncompressed file can be memory-mapped and used in place)
//! ```
//!
//! Opening checks the header CRC, the layout of every section and the CRCs of the meta and
//! index sections; the embedding, head and each layer are checked when first read. A mismatch
//! is [`QsfError::Crc`] naming the section.
#![forbid(unsafe_code)]

use std::io::Write;
use std::path::Path;

use bitnet_gguf::{GgufFile, GgufWriter, Limits, MappedFile, Metadata};

/// The file's first four bytes.
pub const MAGIC: &[u8; 4] = b"QSF1";
/// The format version this crate reads and writes.
pub const VERSION: u32 = 1;
/// Bytes of the fixed header.
pub const HEADER_BYTES: usize = 192;
/// Alignment of tensor data in the file (uncompressed sections).
pub const DATA_ALIGNMENT: u64 = 32;
const ENTRY_BYTES: usize = 48;

/// Errors of reading or writing QSF.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QsfError {
    #[error(transparent)]
    Gguf(#[from] bitnet_gguf::GgufError),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a QSF file (bad magic)")]
    BadMagic,
    #[error("unsupported QSF version {0} (supported: 1)")]
    Version(u32),
    #[error("QSF file truncated: {0}")]
    Truncated(String),
    #[error("QSF {section}: CRC32 mismatch (stored {stored:08x}, computed {computed:08x})")]
    Crc {
        section: String,
        stored: u32,
        computed: u32,
    },
    #[error("QSF {section}: {why}")]
    Layout { section: String, why: String },
    #[error("QSF {section}: LZ4 data does not decompress to its recorded size: {why}")]
    Lz4 { section: String, why: String },
    #[error("the model cannot be written as QSF: {0}")]
    Unsupported(String),
    #[error("cancelled")]
    Cancelled,
}

type Result<T> = std::result::Result<T, QsfError>;

/// How layer sections are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    None,
    Lz4,
}

impl Compression {
    fn id(self) -> u32 {
        match self {
            Compression::None => 0,
            Compression::Lz4 => 1,
        }
    }
    fn from_id(id: u32, section: &str) -> Result<Self> {
        match id {
            0 => Ok(Compression::None),
            1 => Ok(Compression::Lz4),
            other => Err(layout(section, format!("unknown compression {other}"))),
        }
    }
}

fn layout(section: &str, why: impl Into<String>) -> QsfError {
    QsfError::Layout {
        section: section.to_string(),
        why: why.into(),
    }
}

fn u64_of(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// A section's place in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    pub offset: u64,
    pub stored: u64,
    pub raw: u64,
    pub crc: u32,
    pub compression: Compression,
}

/// One layer's index entry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerEntry {
    pub section: Section,
    pub quant: u32,
    pub tensor_count: u32,
    /// `NaN` when not measured.
    pub importance: f32,
}

/// Hyperparameters in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hparams {
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_ff: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub n_vocab: u32,
    pub n_ctx: u32,
    pub quant_type: u32,
}

/// A tensor read from a section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    pub name: String,
    pub ggml_type: u32,
    pub dims: Vec<u64>,
    pub data: Vec<u8>,
}

// ---- little-endian cursor ---------------------------------------------------------------------

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
    what: &'a str,
}

impl<'a> Cursor<'a> {
    fn new(b: &'a [u8], what: &'a str) -> Self {
        Cursor { b, at: 0, what }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                QsfError::Truncated(format!("{} ends at byte {}", self.what, self.b.len()))
            })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn section(&mut self) -> Result<Section> {
        let (offset, stored, raw, crc) = (self.u64()?, self.u64()?, self.u64()?, self.u32()?);
        let compression = Compression::from_id(self.u32()?, self.what)?;
        Ok(Section {
            offset,
            stored,
            raw,
            crc,
            compression,
        })
    }
}

fn put_section(out: &mut Vec<u8>, s: &Section) {
    out.extend_from_slice(&s.offset.to_le_bytes());
    out.extend_from_slice(&s.stored.to_le_bytes());
    out.extend_from_slice(&s.raw.to_le_bytes());
    out.extend_from_slice(&s.crc.to_le_bytes());
    out.extend_from_slice(&s.compression.id().to_le_bytes());
}

/// Append a tensor record to a section that starts at file offset `base`: the data lands on a
/// multiple of [`DATA_ALIGNMENT`] in the file.
fn put_record(
    out: &mut Vec<u8>,
    base: u64,
    name: &str,
    ty: u32,
    dims: &[u64],
    data: &[u8],
) -> Result<()> {
    let len =
        |n: usize| u32::try_from(n).map_err(|_| QsfError::Unsupported(format!("{name}: too long")));
    out.extend_from_slice(&len(name.len())?.to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&ty.to_le_bytes());
    out.extend_from_slice(&len(dims.len())?.to_le_bytes());
    for d in dims {
        out.extend_from_slice(&d.to_le_bytes());
    }
    out.extend_from_slice(&u64_of(data.len()).to_le_bytes());
    let at = base + u64_of(out.len()) + 4;
    let pad = (DATA_ALIGNMENT - at % DATA_ALIGNMENT) % DATA_ALIGNMENT;
    out.extend_from_slice(&u32::try_from(pad).unwrap_or(0).to_le_bytes());
    out.resize(out.len() + usize::try_from(pad).unwrap_or(0), 0);
    out.extend_from_slice(data);
    Ok(())
}
/// A record located in a section's raw bytes: the data is `raw[data.clone()]`.
struct Located {
    name: String,
    ggml_type: u32,
    dims: Vec<u64>,
    data: std::ops::Range<usize>,
}

fn locate_records(raw: &[u8], section: &str) -> Result<Vec<Located>> {
    let mut c = Cursor::new(raw, section);
    let mut out = Vec::new();
    while c.at < raw.len() {
        let name_len = usize::try_from(c.u32()?).map_err(|_| layout(section, "name length"))?;
        if name_len == 0 || name_len > 4096 {
            return Err(layout(section, format!("tensor name length {name_len}")));
        }
        let name = std::str::from_utf8(c.take(name_len)?)
            .map_err(|_| layout(section, "tensor name is not UTF-8"))?
            .to_string();
        let ggml_type = c.u32()?;
        let n_dims = c.u32()?;
        if n_dims == 0 || n_dims > 4 {
            return Err(layout(section, format!("{name}: {n_dims} dimensions")));
        }
        let dims = (0..n_dims).map(|_| c.u64()).collect::<Result<Vec<u64>>>()?;
        let data_len = usize::try_from(c.u64()?).map_err(|_| layout(section, "data length"))?;
        let pad = c.u32()?;
        if u64::from(pad) >= DATA_ALIGNMENT {
            return Err(layout(section, format!("{name}: padding {pad}")));
        }
        if c.take(usize::try_from(pad).unwrap_or(usize::MAX))?
            .iter()
            .any(|&b| b != 0)
        {
            return Err(layout(section, format!("{name}: non-zero padding")));
        }
        let start = c.at;
        c.take(data_len)?;
        out.push(Located {
            name,
            ggml_type,
            dims,
            data: start..c.at,
        });
    }
    Ok(out)
}

fn parse_records(raw: &[u8], section: &str) -> Result<Vec<Tensor>> {
    Ok(locate_records(raw, section)?
        .into_iter()
        .map(|l| Tensor {
            data: raw[l.data.clone()].to_vec(),
            name: l.name,
            ggml_type: l.ggml_type,
            dims: l.dims,
        })
        .collect())
}

/// The layer a GGUF tensor belongs to (`blk.N.…`), if any.
pub fn layer_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    let (n, _) = rest.split_once('.')?;
    n.parse().ok()
}

// ---- writing ----------------------------------------------------------------------------------

/// Progress after each section: (sections done, sections in all).
pub type Progress<'a> = &'a mut dyn FnMut(usize, usize) -> bool;

/// Write a GGUF model as QSF. Layers are compressed with `compression`; the other sections are
/// stored as they are. `importance` (one score per layer, e.g. `1 − cos` of each block's input
/// and output) goes into the index; without it the scores are NaN. `progress` returning false
/// stops with [`QsfError::Cancelled`].
pub fn write_from_gguf<W: Write>(
    f: &GgufFile,
    compression: Compression,
    importance: Option<&[f32]>,
    mut out: W,
    progress: Progress<'_>,
) -> Result<W> {
    let md = f.metadata();
    let arch = md.get_str("general.architecture")?.to_string();
    let get = |k: &str| -> u32 {
        md.get_uint(&format!("{arch}.{k}"))
            .ok()
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(0)
    };
    let n_layer = get("block_count");
    let n_layers =
        usize::try_from(n_layer).map_err(|_| QsfError::Unsupported("block_count".into()))?;

    // Group the tensors.
    let mut embd = None;
    let mut head = Vec::new();
    let mut layers: Vec<Vec<&bitnet_gguf::TensorInfo>> = vec![Vec::new(); n_layers];
    for t in f.tensors() {
        match layer_of(&t.name) {
            Some(i) if i < n_layers => layers[i].push(t),
            Some(i) => {
                return Err(QsfError::Unsupported(format!(
                    "{} names layer {i} of {n_layers}",
                    t.name
                )))
            }
            None if t.name == "token_embd.weight" => embd = Some(t),
            None => head.push(t),
        }
    }
    let embd = embd.ok_or_else(|| QsfError::Unsupported("no token_embd.weight".into()))?;
    if let Some(imp) = importance {
        if imp.len() != n_layers {
            return Err(QsfError::Unsupported(format!(
                "{} importance scores for {n_layers} layers",
                imp.len()
            )));
        }
    }
    let quant_type = layers
        .first()
        .and_then(|l| l.iter().find(|t| t.dims.len() == 2))
        .map_or(0, |t| t.ggml_type.id());

    // Meta: a GGUF holding the metadata only.
    let mut mw = GgufWriter::new(Vec::new(), 32)?;
    for (k, v) in md.iter() {
        if k != bitnet_gguf::KEY_ALIGNMENT {
            mw.add_kv(k, v.clone())?;
        }
    }
    mw.write_header()?;
    let meta = mw.finish()?;

    // A section's records, for a section starting at file offset `base`.
    let record = |ts: &[&bitnet_gguf::TensorInfo], base: u64| -> Result<Vec<u8>> {
        let mut raw = Vec::new();
        for t in ts {
            put_record(
                &mut raw,
                base,
                &t.name,
                t.ggml_type.id(),
                &t.dims,
                f.tensor_data(t)?,
            )?;
        }
        Ok(raw)
    };

    let n_vocab = embd.dims.get(1).copied().unwrap_or(0);
    let hp = Hparams {
        n_layer,
        n_embd: get("embedding_length"),
        n_ff: get("feed_forward_length"),
        n_head: get("attention.head_count"),
        n_head_kv: get("attention.head_count_kv"),
        n_vocab: u32::try_from(n_vocab).map_err(|_| QsfError::Unsupported("vocabulary".into()))?,
        n_ctx: get("context_length"),
        quant_type,
    };

    // Offsets: header, meta, index, embedding, head, then layers as they are compressed.
    let plain = |offset: u64, bytes: &[u8]| Section {
        offset,
        stored: u64_of(bytes.len()),
        raw: u64_of(bytes.len()),
        crc: crc32fast::hash(bytes),
        compression: Compression::None,
    };
    let index_len = n_layers * ENTRY_BYTES;
    let meta_s = plain(u64_of(HEADER_BYTES), &meta);
    let index_off = meta_s.offset + meta_s.stored;
    let embd_off = index_off + u64_of(index_len);
    let embd_raw = record(&[embd], embd_off)?;
    let embd_s = plain(embd_off, &embd_raw);
    let head_raw = record(&head, embd_s.offset + embd_s.stored)?;
    let head_s = plain(embd_s.offset + embd_s.stored, &head_raw);
    let mut next = head_s.offset + head_s.stored;

    // The index precedes the layers, so a first pass sizes and checksums every layer, and the
    // second builds each one again to write it: one layer is held at a time.
    let stored_layer = |ts: &[&bitnet_gguf::TensorInfo], offset: u64| -> Result<(Vec<u8>, u64)> {
        // Compressed records are aligned within the raw bytes (they are not used in place).
        let base = if compression == Compression::None {
            offset
        } else {
            0
        };
        let raw = record(ts, base)?;
        let raw_len = u64_of(raw.len());
        Ok(match compression {
            Compression::None => (raw, raw_len),
            Compression::Lz4 => (lz4_flex::block::compress(&raw), raw_len),
        })
    };
    let total = 2 * n_layers + 1;
    let mut entries = Vec::with_capacity(n_layers);
    for (i, ts) in layers.iter().enumerate() {
        let (stored, raw_len) = stored_layer(ts, next)?;
        let s = Section {
            offset: next,
            stored: u64_of(stored.len()),
            raw: raw_len,
            crc: crc32fast::hash(&stored),
            compression,
        };
        next += s.stored;
        entries.push(LayerEntry {
            section: s,
            quant: ts
                .iter()
                .find(|t| t.dims.len() == 2)
                .map_or(0, |t| t.ggml_type.id()),
            tensor_count: u32::try_from(ts.len()).unwrap_or(u32::MAX),
            importance: importance.map_or(f32::NAN, |imp| imp[i]),
        });
        if !progress(i, total) {
            return Err(QsfError::Cancelled);
        }
    }
    let mut index = Vec::with_capacity(index_len);
    for e in &entries {
        index.extend_from_slice(&e.section.offset.to_le_bytes());
        index.extend_from_slice(&e.section.stored.to_le_bytes());
        index.extend_from_slice(&e.section.raw.to_le_bytes());
        index.extend_from_slice(&e.quant.to_le_bytes());
        index.extend_from_slice(&e.section.compression.id().to_le_bytes());
        index.extend_from_slice(&e.tensor_count.to_le_bytes());
        index.extend_from_slice(&e.section.crc.to_le_bytes());
        index.extend_from_slice(&e.importance.to_le_bytes());
        index.extend_from_slice(&0u32.to_le_bytes());
    }
    let index_s = plain(index_off, &index);

    let mut h = Vec::with_capacity(HEADER_BYTES);
    h.extend_from_slice(MAGIC);
    for v in [
        VERSION,
        u32::try_from(HEADER_BYTES).unwrap_or(0),
        hp.n_layer,
        hp.n_embd,
        hp.n_ff,
        hp.n_head,
        hp.n_head_kv,
        hp.n_vocab,
        hp.n_ctx,
        hp.quant_type,
        compression.id(),
    ] {
        h.extend_from_slice(&v.to_le_bytes());
    }
    h.extend_from_slice(&next.to_le_bytes());
    for s in [&meta_s, &index_s, &embd_s, &head_s] {
        put_section(&mut h, s);
    }
    h.extend_from_slice(&0u32.to_le_bytes());
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(h.len(), HEADER_BYTES);

    out.write_all(&h)?;
    out.write_all(&meta)?;
    out.write_all(&index)?;
    out.write_all(&embd_raw)?;
    out.write_all(&head_raw)?;
    for (i, (ts, e)) in layers.iter().zip(&entries).enumerate() {
        let (stored, _) = stored_layer(ts, e.section.offset)?;
        if crc32fast::hash(&stored) != e.section.crc || u64_of(stored.len()) != e.section.stored {
            return Err(QsfError::Unsupported(format!(
                "layer {i} changed between the two passes"
            )));
        }
        out.write_all(&stored)?;
        if !progress(n_layers + i, total) {
            return Err(QsfError::Cancelled);
        }
    }
    progress(total, total);
    Ok(out)
}

// ---- reading ----------------------------------------------------------------------------------

enum Bytes {
    Mapped(MappedFile),
    Owned(Vec<u8>),
}

/// An opened QSF file: header, metadata and index checked; sections checked when read.
pub struct QsfFile {
    bytes: Bytes,
    pub hparams: Hparams,
    pub compression: Compression,
    meta: Section,
    embd: Section,
    head: Section,
    pub layers: Vec<LayerEntry>,
    /// The meta section parsed on first use (its CRC is checked at open).
    metadata: std::sync::OnceLock<GgufFile>,
}

impl std::fmt::Debug for QsfFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QsfFile")
            .field("hparams", &self.hparams)
            .field("layers", &self.layers.len())
            .finish()
    }
}

/// A section's stored bytes and their offset, checked to lie in the file.
fn section_bytes<'a>(b: &'a [u8], name: &str, s: &Section) -> Result<(usize, &'a [u8])> {
    let past = || QsfError::Truncated(format!("{name} runs past the end of the file"));
    let start = usize::try_from(s.offset).map_err(|_| past())?;
    let end = s
        .offset
        .checked_add(s.stored)
        .and_then(|e| usize::try_from(e).ok())
        .ok_or_else(past)?;
    Ok((start, b.get(start..end).ok_or_else(past)?))
}

/// A section's stored bytes, after checking that they lie in the file and match their CRC.
fn checked<'a>(b: &'a [u8], name: &str, s: &Section) -> Result<&'a [u8]> {
    let (_, data) = section_bytes(b, name, s)?;
    crc_matches(name, s, crc32fast::hash(data))?;
    Ok(data)
}

/// A [`QsfError::Crc`] naming the section unless `computed` is its recorded CRC.
fn crc_matches(name: &str, s: &Section, computed: u32) -> Result<()> {
    if computed != s.crc {
        return Err(QsfError::Crc {
            section: name.to_string(),
            stored: s.crc,
            computed,
        });
    }
    Ok(())
}

/// [`checked`] for a mapped section, reading it in 8 MiB chunks and dropping each chunk's
/// pages once hashed: checking a whole model never holds more than a chunk resident.
fn crc_released<'a>(m: &'a MappedFile, name: &str, s: &Section) -> Result<&'a [u8]> {
    const CHUNK: usize = 8 << 20;
    let (start, data) = section_bytes(m.as_bytes(), name, s)?;
    let mut h = crc32fast::Hasher::new();
    for (i, chunk) in data.chunks(CHUNK).enumerate() {
        h.update(chunk);
        let at = start + i * CHUNK;
        m.release(at..at + chunk.len())?;
    }
    crc_matches(name, s, h.finalize())?;
    Ok(data)
}

/// Whether the file at `path` starts with the QSF magic.
pub fn is_qsf(path: &Path) -> bool {
    use std::io::Read;
    let mut m = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut m))
        .is_ok()
        && &m == MAGIC
}

impl QsfFile {
    /// Map and open a file.
    pub fn open(path: &Path) -> Result<Self> {
        Self::parse(Bytes::Mapped(MappedFile::open(path)?))
    }

    /// Open a file held in memory.
    pub fn from_bytes(b: Vec<u8>) -> Result<Self> {
        Self::parse(Bytes::Owned(b))
    }

    fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(m) => m.as_bytes(),
            Bytes::Owned(v) => v,
        }
    }

    fn parse(bytes: Bytes) -> Result<Self> {
        let b: &[u8] = match &bytes {
            Bytes::Mapped(m) => m.as_bytes(),
            Bytes::Owned(v) => v,
        };
        if b.len() < 4 || &b[..4] != MAGIC {
            return Err(QsfError::BadMagic);
        }
        let h = b.get(..HEADER_BYTES).ok_or_else(|| {
            QsfError::Truncated(format!(
                "the header needs {HEADER_BYTES} bytes, the file has {}",
                b.len()
            ))
        })?;
        let mut c = Cursor::new(h, "header");
        c.take(4)?;
        let version = c.u32()?;
        if version != VERSION {
            return Err(QsfError::Version(version));
        }
        let stored_crc = u32::from_le_bytes([h[188], h[189], h[190], h[191]]);
        let computed = crc32fast::hash(&h[..188]);
        if stored_crc != computed {
            return Err(QsfError::Crc {
                section: "header".into(),
                stored: stored_crc,
                computed,
            });
        }
        let header_bytes = c.u32()?;
        if usize::try_from(header_bytes).ok() != Some(HEADER_BYTES) {
            return Err(layout("header", format!("header size {header_bytes}")));
        }
        let mut hv = [0u32; 9];
        for v in &mut hv {
            *v = c.u32()?;
        }
        let hparams = Hparams {
            n_layer: hv[0],
            n_embd: hv[1],
            n_ff: hv[2],
            n_head: hv[3],
            n_head_kv: hv[4],
            n_vocab: hv[5],
            n_ctx: hv[6],
            quant_type: hv[7],
        };
        let compression = Compression::from_id(hv[8], "header")?;
        let file_size = c.u64()?;
        if file_size != u64_of(b.len()) {
            return Err(QsfError::Truncated(format!(
                "the header records {file_size} bytes, the file has {}",
                b.len()
            )));
        }
        let meta = c.section()?;
        let index = c.section()?;
        let embd = c.section()?;
        let head = c.section()?;
        let n_layers = usize::try_from(hparams.n_layer).map_err(|_| layout("header", "n_layer"))?;
        if n_layers > 4096 {
            return Err(layout("header", format!("{n_layers} layers")));
        }
        if index.stored != u64_of(n_layers * ENTRY_BYTES)
            || index.compression != Compression::None
            || meta.compression != Compression::None
        {
            return Err(layout("index", "size does not match the layer count"));
        }

        // The sections tile the file: no byte after the header outside a checked section.
        let mut expect = u64_of(HEADER_BYTES);
        for (name, s) in [
            ("meta", &meta),
            ("index", &index),
            ("embedding", &embd),
            ("head", &head),
        ] {
            if s.offset != expect {
                return Err(layout(
                    name,
                    format!("starts at {}, expected {expect}", s.offset),
                ));
            }
            if s.compression == Compression::None && s.raw != s.stored {
                return Err(layout(
                    name,
                    "raw and stored sizes differ without compression",
                ));
            }
            expect = s
                .offset
                .checked_add(s.stored)
                .filter(|&e| e <= file_size)
                .ok_or_else(|| {
                    QsfError::Truncated(format!("{name} runs past the end of the file"))
                })?;
        }
        let index_bytes = checked(b, "index", &index)?;
        checked(b, "meta", &meta)?;
        let mut layers = Vec::with_capacity(n_layers);
        let mut ic = Cursor::new(index_bytes, "index");
        for i in 0..n_layers {
            let (offset, stored, raw) = (ic.u64()?, ic.u64()?, ic.u64()?);
            let quant = ic.u32()?;
            let compression = Compression::from_id(ic.u32()?, "index")?;
            let tensor_count = ic.u32()?;
            let crc = ic.u32()?;
            let importance = f32::from_bits(ic.u32()?);
            ic.u32()?;
            let name = format!("layer {i}");
            if offset != expect {
                return Err(layout(
                    &name,
                    format!("starts at {offset}, expected {expect}"),
                ));
            }
            if compression == Compression::None && raw != stored {
                return Err(layout(
                    &name,
                    "raw and stored sizes differ without compression",
                ));
            }
            if raw > (1u64 << 36) {
                return Err(layout(&name, format!("raw size {raw}")));
            }
            expect = offset
                .checked_add(stored)
                .filter(|&e| e <= file_size)
                .ok_or_else(|| {
                    QsfError::Truncated(format!("{name} runs past the end of the file"))
                })?;
            layers.push(LayerEntry {
                section: Section {
                    offset,
                    stored,
                    raw,
                    crc,
                    compression,
                },
                quant,
                tensor_count,
                importance,
            });
        }
        if expect != file_size {
            return Err(layout(
                "file",
                format!("{} bytes after the last layer", file_size - expect),
            ));
        }
        Ok(QsfFile {
            bytes,
            hparams,
            compression,
            meta,
            embd,
            head,
            layers,
            metadata: std::sync::OnceLock::new(),
        })
    }

    /// The model's metadata (every key of the source GGUF), parsed and validated on first use.
    pub fn metadata(&self) -> Result<&Metadata> {
        if let Some(m) = self.metadata.get() {
            return Ok(m.metadata());
        }
        let raw = self.read_section("meta", &self.meta)?;
        let parsed = GgufFile::from_bytes(raw, &Limits::default())?;
        if !parsed.tensors().is_empty() {
            return Err(layout("meta", "holds tensors"));
        }
        Ok(self.metadata.get_or_init(|| parsed).metadata())
    }

    fn read_section(&self, name: &str, s: &Section) -> Result<Vec<u8>> {
        let data = checked(self.bytes(), name, s)?;
        match s.compression {
            Compression::None => Ok(data.to_vec()),
            Compression::Lz4 => {
                // LZ4 expands at most 255:1; a larger claim is a lie that would only cost memory.
                if s.raw > s.stored.saturating_mul(255) {
                    return Err(QsfError::Lz4 {
                        section: name.to_string(),
                        why: format!("{} bytes cannot hold {} raw bytes", s.stored, s.raw),
                    });
                }
                let raw = usize::try_from(s.raw).map_err(|_| layout(name, "raw size"))?;
                let out = lz4_flex::block::decompress(data, raw).map_err(|e| QsfError::Lz4 {
                    section: name.to_string(),
                    why: e.to_string(),
                })?;
                if out.len() != raw {
                    return Err(QsfError::Lz4 {
                        section: name.to_string(),
                        why: format!("{} bytes, recorded {raw}", out.len()),
                    });
                }
                Ok(out)
            }
        }
    }

    /// Layer `i`'s tensors (CRC checked, decompressed).
    pub fn layer(&self, i: usize) -> Result<Vec<Tensor>> {
        let e = self
            .layers
            .get(i)
            .ok_or_else(|| layout("index", format!("no layer {i}")))?;
        let name = format!("layer {i}");
        let ts = parse_records(&self.read_section(&name, &e.section)?, &name)?;
        self.check_layer(i, ts.iter().map(|t| t.name.as_str()))?;
        Ok(ts)
    }

    /// Layer `i` holds as many tensors as its index entry says, all named `blk.{i}.…`.
    fn check_layer<'a>(
        &self,
        i: usize,
        names: impl ExactSizeIterator<Item = &'a str>,
    ) -> Result<()> {
        let name = format!("layer {i}");
        let count = self.layers.get(i).map_or(0, |e| e.tensor_count);
        if u64_of(names.len()) != u64::from(count) {
            return Err(layout(
                &name,
                format!("{} tensors, the index says {count}", names.len()),
            ));
        }
        for t in names {
            if layer_of(t) != Some(i) {
                return Err(layout(&name, format!("holds {t}")));
            }
        }
        Ok(())
    }

    /// The embedding tensor.
    pub fn embedding(&self) -> Result<Tensor> {
        let mut ts = parse_records(&self.read_section("embedding", &self.embd)?, "embedding")?;
        match (ts.pop(), ts.is_empty()) {
            (Some(t), true) if t.name == "token_embd.weight" => Ok(t),
            _ => Err(layout("embedding", "must hold token_embd.weight alone")),
        }
    }

    /// The tensors outside the layers other than the embedding.
    pub fn head(&self) -> Result<Vec<Tensor>> {
        parse_records(&self.read_section("head", &self.head)?, "head")
    }

    /// The model as a [`GgufFile`] for the loaders that read GGUF. An uncompressed, mapped
    /// file is used in place: every section's CRC is checked (and its pages dropped from the
    /// resident set again), then the tensors are borrowed from the map, so the low-memory mode
    /// streams them as it streams a GGUF. Otherwise the model is rebuilt in memory
    /// ([`Self::to_gguf`]).
    pub fn into_gguf(self) -> Result<GgufFile> {
        let in_place = matches!(self.bytes, Bytes::Mapped(_))
            && self.embd.compression == Compression::None
            && self.head.compression == Compression::None
            && self
                .layers
                .iter()
                .all(|l| l.section.compression == Compression::None);
        if !in_place {
            return self.to_gguf();
        }
        // (name, section, layer index)
        let mut sections: Vec<(String, Section, Option<usize>)> =
            vec![("embedding".into(), self.embd, None)];
        sections.extend(
            self.layers
                .iter()
                .enumerate()
                .map(|(i, l)| (format!("layer {i}"), l.section, Some(i))),
        );
        sections.push(("head".into(), self.head, None));
        let Bytes::Mapped(m) = &self.bytes else {
            return Err(layout("file", "not mapped"));
        };
        let mut table = Vec::new();
        for (name, s, layer) in &sections {
            let data = crc_released(m, name, s)?;
            let located = locate_records(data, name)?;
            // Reading the record headers faulted pages back in; drop them again.
            let start = usize::try_from(s.offset).unwrap_or(0);
            m.release(start..start.saturating_add(data.len()))?;
            if let Some(i) = *layer {
                self.check_layer(i, located.iter().map(|t| t.name.as_str()))?;
            }
            for l in located {
                table.push(bitnet_gguf::TableEntry {
                    offset: s.offset + u64_of(l.data.start),
                    size: u64_of(l.data.len()),
                    name: l.name,
                    dims: l.dims,
                    type_id: l.ggml_type,
                });
            }
        }
        // The metadata parsed once and moved, not copied: the tokenizer's arrays are large.
        let metadata = match self.metadata.into_inner() {
            Some(parsed) => parsed.into_metadata(),
            None => {
                let b = match &self.bytes {
                    Bytes::Mapped(m) => m.as_bytes(),
                    Bytes::Owned(v) => v,
                };
                let raw = checked(b, "meta", &self.meta)?;
                let (metadata, n_tensors) = GgufFile::metadata_of(raw, &Limits::default())?;
                if n_tensors != 0 {
                    return Err(layout("meta", "holds tensors"));
                }
                metadata
            }
        };
        let Bytes::Mapped(map) = self.bytes else {
            return Err(layout("file", "not mapped"));
        };
        // The header, meta and index were read at open; the tensors never need them again.
        let tensors_start = usize::try_from(self.embd.offset).unwrap_or(0);
        map.release(0..tensors_start)?;
        Ok(GgufFile::from_mapped_table(
            map,
            metadata,
            table,
            &Limits::default(),
        )?)
    }

    /// Rebuild the model as a GGUF image in memory (every section checked on the way), for
    /// the loaders that read GGUF.
    pub fn to_gguf(&self) -> Result<GgufFile> {
        let mut ts = vec![self.embedding()?];
        for i in 0..self.layers.len() {
            ts.extend(self.layer(i)?);
        }
        ts.extend(self.head()?);
        let mut w = GgufWriter::new(Vec::new(), 32)?;
        for (k, v) in self.metadata()?.iter() {
            w.add_kv(k, v.clone())?;
        }
        for t in &ts {
            w.add_tensor(&t.name, &t.dims, t.ggml_type, u64_of(t.data.len()))?;
        }
        w.write_header()?;
        for t in &ts {
            w.write_tensor_data(&t.name, &t.data)?;
        }
        let bytes = w.finish()?;
        Ok(GgufFile::from_bytes(bytes, &Limits::default())?)
    }

    /// Bytes of the meta section (for reports).
    pub fn meta_bytes(&self) -> u64 {
        self.meta.stored
    }
}
