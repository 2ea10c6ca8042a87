//! A model file loaded onto the GPU as it arrives (a download in a web page), never held
//! whole: the header is read from the file's first bytes; then each block's tensors are
//! gathered (one block at a time for a file in the usual order), bound and uploaded, and
//! the embedding's and LM head's bytes go straight into their GPU buffers.
//!
//! What stays on the host: the metadata (the tokenizer's vocabulary), the config, and the
//! pieces not yet complete. The engine it makes runs only on its GPU
//! ([`Engine::model`] is an error there).

use std::ops::Range;

use bitnet_gguf::{GgufHeader, Limits, TensorInfo};
use bitnet_model::{model::row_type_of, names, Config, KvType, Layer, ModelError, Numerics};
use bitnet_tokenizer::Tokenizer;

use crate::load::{gpu_options, LoadOptions};
use crate::{Engine, EngineError, Result};

/// Where a run of the file's bytes goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Block `il`'s tensors, gathered and uploaded together.
    Block(usize),
    /// The final norm's weights.
    OutputNorm,
    /// The token embedding's rows, written as they come.
    Embd,
    /// The separate LM head's rows, written as they come.
    Output,
}

/// One part's bytes: the file range it covers, and for a gathered part the bytes so far.
#[derive(Debug)]
struct Piece {
    part: Part,
    range: Range<u64>,
    bytes: Vec<u8>,
    done: bool,
}

#[derive(Debug)]
enum Stage {
    /// The file's first bytes, until the header is all there; the next size at which to
    /// try reading it (doubling, so a long header is not re-read for every small piece).
    Header {
        prefix: Vec<u8>,
        next_try: usize,
        gpu: Box<bitnet_gpu::Gpu>,
    },
    Body(Box<Body>),
    /// A push failed: the loader takes nothing more.
    Failed,
}

#[derive(Debug)]
struct Body {
    header: GgufHeader,
    config: Config,
    tokenizer: Tokenizer,
    builder: bitnet_gpu::GpuBuilder,
    pieces: Vec<Piece>,
    embd_scan: RowScan,
}

/// The rows of the embedding table that hold NaN or infinity, found as its bytes go by on
/// their way to the GPU (`rows::first_non_finite_value` over each row's part; the GPU takes
/// F32 and F16 tables). The engine refuses those tokens as the CPU refuses a non-finite row
/// it reads.
#[derive(Debug)]
struct RowScan {
    ty: bitnet_kernels::RowType,
    /// Bytes per unit (a value, or a block of a block type) and units per row.
    size: usize,
    cols: usize,
    /// Units seen so far; the first bytes of a unit split between pieces.
    seen: usize,
    carry: Vec<u8>,
    /// The rows found, ascending.
    bad: Vec<u32>,
}

impl RowScan {
    fn new(ty: bitnet_kernels::RowType, cols: usize) -> Self {
        RowScan {
            ty,
            size: ty.block_bytes(),
            cols: (cols / ty.block_elems()).max(1),
            seen: 0,
            carry: Vec::new(),
            bad: Vec::new(),
        }
    }

    /// The next bytes of the table, in file order.
    fn feed(&mut self, mut bytes: &[u8]) {
        if !self.carry.is_empty() {
            let take = (self.size - self.carry.len()).min(bytes.len());
            self.carry.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.carry.len() < self.size {
                return;
            }
            let v = std::mem::take(&mut self.carry);
            self.values(&v);
        }
        let whole = bytes.len() - bytes.len() % self.size;
        self.values(&bytes[..whole]);
        self.carry.extend_from_slice(&bytes[whole..]);
    }

    /// Whole units, a row's part at a time: a non-finite value marks its row.
    fn values(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let n = (self.cols - self.seen % self.cols).min(bytes.len() / self.size);
            if n == 0 {
                break;
            }
            let (part, rest) = bytes.split_at(n * self.size);
            if bitnet_kernels::rows::first_non_finite_value(self.ty, part).is_some() {
                let row = u32::try_from(self.seen / self.cols).unwrap_or(u32::MAX);
                if self.bad.last() != Some(&row) {
                    self.bad.push(row);
                }
            }
            self.seen += n;
            bytes = rest;
        }
    }
}

/// A model file loaded onto the GPU as it arrives (see the module's doc).
#[derive(Debug)]
pub struct GpuStream {
    opts: LoadOptions,
    size: u64,
    received: u64,
    stage: Stage,
}

/// The first header read tries this many bytes (a small model's whole header).
const FIRST_TRY: usize = 64 << 10;

impl GpuStream {
    /// Open the GPU for a file of `size` bytes, loaded with `opts` (fast numerics, the
    /// file's LM head or one quantized to q8_0 / q4_0 on upload, an f16, f32 or q8_0 cache:
    /// what the GPU backend runs).
    pub async fn new_async(size: u64, opts: &LoadOptions) -> Result<Self> {
        opts.validate()?;
        let refuse = |what: &str| {
            Err(EngineError::Gpu(bitnet_gpu::GpuError::Unsupported(
                what.to_string(),
            )))
        };
        if opts.numerics != Numerics::Fast {
            return refuse("exact numerics (the GPU runs fast numerics)");
        }
        if !opts.lm_head.on_gpu() {
            return refuse("a Q6_K or approximate LM head (the GPU runs the file's, q8_0 or q4_0)");
        }
        if opts.budget.is_some() {
            return refuse("a RAM budget (the low-memory mode runs on the CPU)");
        }
        if opts.kv_type == KvType::Q4_0 {
            return refuse("a q4_0 KV cache (the GPU's is f16, f32 or q8_0)");
        }
        let gpu = bitnet_gpu::Gpu::open_async(opts.gpu_adapter).await?;
        Ok(GpuStream {
            opts: opts.clone(),
            size,
            received: 0,
            stage: Stage::Header {
                prefix: Vec::new(),
                next_try: FIRST_TRY,
                gpu: Box::new(gpu),
            },
        })
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// The next piece of the file. After an error the loader is spent.
    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        let r = self.push_inner(chunk);
        if r.is_err() {
            self.stage = Stage::Failed;
        }
        r
    }

    fn push_inner(&mut self, chunk: &[u8]) -> Result<()> {
        let at = self.received;
        let n = u64::try_from(chunk.len()).map_err(|_| ModelError::Overflow("piece size"))?;
        let end = at
            .checked_add(n)
            .filter(|&e| e <= self.size)
            .ok_or_else(|| {
                bad_file(format!(
                    "more bytes than the file's size ({} after {at})",
                    self.size
                ))
            })?;
        self.received = end;
        match &mut self.stage {
            Stage::Failed => Err(bad_file("an earlier piece failed".to_string())),
            Stage::Body(b) => b.take(at, chunk),
            Stage::Header {
                prefix,
                next_try,
                gpu: _,
            } => {
                prefix
                    .try_reserve(chunk.len())
                    .map_err(|_| ModelError::Overflow("the file's header (out of memory)"))?;
                prefix.extend_from_slice(chunk);
                if prefix.len() < *next_try && end < self.size {
                    return Ok(());
                }
                *next_try = prefix.len().saturating_mul(2);
                let Some(header) = GgufHeader::parse_prefix(prefix, self.size, &Limits::default())
                    .map_err(ModelError::from)?
                else {
                    return Ok(());
                };
                let Stage::Header { prefix, gpu, .. } =
                    std::mem::replace(&mut self.stage, Stage::Failed)
                else {
                    return Err(bad_file("the loader's state".to_string()));
                };
                let mut body = Body::new(header, *gpu, &self.opts)?;
                body.take(0, &prefix)?;
                self.stage = Stage::Body(Box::new(body));
                Ok(())
            }
        }
    }

    /// The engine, once the whole file has come.
    pub fn finish(self) -> Result<Engine> {
        if self.received != self.size {
            return Err(bad_file(format!(
                "the file ended after {} of its {} bytes",
                self.received, self.size
            )));
        }
        let Stage::Body(b) = self.stage else {
            return Err(bad_file("no model header was read".to_string()));
        };
        let Body {
            config,
            tokenizer,
            builder,
            pieces,
            embd_scan,
            ..
        } = *b;
        if let Some(p) = pieces.iter().find(|p| !p.done) {
            return Err(bad_file(format!("{:?} never came whole", p.part)));
        }
        let gpu = builder.finish()?;
        Engine::on_device(
            config,
            self.size,
            embd_scan.bad,
            tokenizer,
            gpu,
            self.opts.engine_options(),
        )
    }
}

/// A count as a file offset (usize is at most 64 bits wide on every target).
fn u64_of(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn bad_file(reason: String) -> EngineError {
    EngineError::Gpu(bitnet_gpu::GpuError::Unsupported(format!(
        "streaming the model: {reason}"
    )))
}

/// The bytes of a row matrix (`rows` × `cols` of its type) and its spec.
fn rows_spec(t: &TensorInfo, rows: usize, cols: usize) -> Result<bitnet_gpu::RowsSpec> {
    let bad = |expected: &'static str| ModelError::WrongType {
        name: t.name.clone(),
        expected,
        found: t.ggml_type.name().to_string(),
    };
    let ty = row_type_of(t.ggml_type).ok_or_else(|| bad("F16 or F32"))?;
    let expected = vec![u64_of(cols), u64_of(rows)];
    if t.dims != expected {
        return Err(ModelError::WrongShape {
            name: t.name.clone(),
            expected,
            found: t.dims.clone(),
        }
        .into());
    }
    let bytes = t
        .nbytes()
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| bad("F16 or F32"))?;
    Ok(bitnet_gpu::RowsSpec { ty, rows, bytes })
}

impl Body {
    fn new(header: GgufHeader, gpu: bitnet_gpu::Gpu, opts: &LoadOptions) -> Result<Self> {
        let meta = header.metadata();
        let embd = header
            .tensor(names::TOKEN_EMBD)
            .ok_or_else(|| ModelError::MissingTensor(names::TOKEN_EMBD.to_string()))?;
        let config = Config::from_metadata(meta, embd.dims.get(1).copied())?;
        let tokenizer = Tokenizer::from_gguf(meta, opts.pre_tokenizer)?;
        let (nv, e) = (config.n_vocab, config.n_embd);
        let embd_spec = rows_spec(embd, nv, e)?;
        let output = header.tensor(names::OUTPUT);
        let output_spec = output.map(|t| rows_spec(t, nv, e)).transpose()?;
        let builder =
            bitnet_gpu::GpuModel::builder(gpu, &config, embd_spec, output_spec, gpu_options(opts))?;
        // Each part's range of the file: a block's from its first tensor's start to its last
        // tensor's available end (an I2_S tensor's scale follows its codes).
        let mut pieces: Vec<Piece> = Vec::new();
        let mut add = |part: Part, r: Range<u64>| match pieces.iter_mut().find(|p| p.part == part) {
            Some(p) => p.range = p.range.start.min(r.start)..p.range.end.max(r.end),
            None => pieces.push(Piece {
                part,
                range: r,
                bytes: Vec::new(),
                done: false,
            }),
        };
        for t in header.tensors() {
            let r = header.tensor_range(t);
            let exact = |len: usize| r.start..r.start.saturating_add(u64_of(len));
            match t.name.as_str() {
                names::TOKEN_EMBD => add(Part::Embd, exact(embd_spec.bytes)),
                names::OUTPUT => {
                    if let Some(s) = output_spec {
                        add(Part::Output, exact(s.bytes));
                    }
                }
                names::OUTPUT_NORM => add(Part::OutputNorm, r),
                name => {
                    let block = name
                        .strip_prefix("blk.")
                        .and_then(|rest| rest.split_once('.'))
                        .and_then(|(i, _)| i.parse::<usize>().ok());
                    match block {
                        Some(il) if il < config.n_layer => add(Part::Block(il), r),
                        Some(_) => return Err(ModelError::UnexpectedTensor(t.name.clone()).into()),
                        None => {}
                    }
                }
            }
        }
        for il in 0..config.n_layer {
            if !pieces.iter().any(|p| p.part == Part::Block(il)) {
                return Err(ModelError::MissingTensor(format!("blk.{il}.*")).into());
            }
        }
        if !pieces.iter().any(|p| p.part == Part::OutputNorm) {
            return Err(ModelError::MissingTensor(names::OUTPUT_NORM.to_string()).into());
        }
        let embd_scan = RowScan::new(embd_spec.ty, e);
        Ok(Body {
            header,
            config,
            tokenizer,
            builder,
            pieces,
            embd_scan,
        })
    }

    /// The file's bytes from offset `at`.
    fn take(&mut self, at: u64, chunk: &[u8]) -> Result<()> {
        let end = at.saturating_add(u64_of(chunk.len()));
        for i in 0..self.pieces.len() {
            let p = &mut self.pieces[i];
            let (s, e) = (p.range.start.max(at), p.range.end.min(end));
            if p.done || s >= e {
                continue;
            }
            // Offsets inside `chunk` (at most its length, so they fit usize).
            let off = |x: u64| usize::try_from(x - at).map_err(|_| ModelError::Overflow("offset"));
            let part = chunk.get(off(s)?..off(e)?).unwrap_or_default();
            match p.part {
                Part::Embd => {
                    self.embd_scan.feed(part);
                    self.builder.write_embd(part)?;
                }
                Part::Output => self.builder.write_output(part)?,
                Part::Block(_) | Part::OutputNorm => {
                    let len = usize::try_from(p.range.end - p.range.start)
                        .map_err(|_| ModelError::Overflow("a block's bytes"))?;
                    if p.bytes.capacity() == 0 {
                        p.bytes
                            .try_reserve_exact(len)
                            .map_err(|_| ModelError::Overflow("a block's bytes (out of memory)"))?;
                    }
                    p.bytes.extend_from_slice(part);
                }
            }
            if e == p.range.end {
                p.done = true;
                let bytes = std::mem::take(&mut p.bytes);
                let (part, start) = (p.part, p.range.start);
                self.complete(part, start, bytes)?;
            }
        }
        Ok(())
    }

    /// A gathered part is whole: bind it from a window of the file and upload it.
    fn complete(&mut self, part: Part, start: u64, bytes: Vec<u8>) -> Result<()> {
        match part {
            Part::Block(il) => {
                let file = self.header.window(start, bytes).map_err(ModelError::from)?;
                let layer = Layer::load(&file, &self.config, il)?;
                self.builder.layer(il, &layer)?;
            }
            Part::OutputNorm => {
                let file = self.header.window(start, bytes).map_err(ModelError::from)?;
                let w =
                    bitnet_model::model::load_f32(&file, names::OUTPUT_NORM, self.config.n_embd)?;
                self.builder.output_norm(&w)?;
            }
            Part::Embd | Part::Output => {}
        }
        Ok(())
    }
}
