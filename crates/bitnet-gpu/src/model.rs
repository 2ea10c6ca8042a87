//! The model on the device: weights uploaded as stored, the forward pass recorded into one
//! command buffer per call.

use bitnet_kernels::{RowMatrix, RowType, TernaryLayout, TernaryMatrix};
use bitnet_model::numerics::{rope_back_for, rope_row};
use bitnet_model::{Activation, Config, Layer, Model, Outputs, RopeStyle};

use crate::device::{attn_part_len, attn_split, Gpu};
use crate::rec::{KernelTime, Profile, Rec, PROFILE_QUERIES};
use crate::{GpuError, Result};

/// Token rows per workgroup of the ternary kernel (`TT` in ternary.wgsl).
pub(crate) const TERNARY_TOKENS: usize = 4;
/// Token rows a call may have for the decode kernels (mv.wgsl; `TT`), output rows per
/// workgroup by default (`RPW`), and the widest input they take (4 · 256 threads · `PV`).
pub(crate) const MV_TOKENS: usize = 4;
pub(crate) const MV_ROWS: usize = 16;
pub(crate) const MV_MAX_IN: usize = 8192;
/// The prompt GEMM's tile (gemm.wgsl: `BM` rows × `BN` tokens), and the fewest tokens a call
/// has for it to take over from the row kernel.
pub(crate) const GEMM_ROWS: usize = 64;
pub(crate) const GEMM_TOKENS: usize = 64;
pub(crate) const GEMM_MIN_TOKENS: usize = 16;
/// Workgroups of the greedy arg-max (`GROUPS` in argmax.wgsl), one (index, value) pair each.
pub(crate) const ARGMAX_GROUPS: usize = 64;
/// LM-head rows per workgroup (`RPW` in head.wgsl; head_lanes.wgsl takes
/// `device::LANES_ROWS`).
pub(crate) const HEAD_ROWS: usize = 4;
/// Head size the attention kernel holds (`qs` and `ACC` in attention.wgsl).
const MAX_HEAD_DIM: usize = 256;
/// Tokens the top-k read-back returns (`K` in topk_local.wgsl and topk_merge.wgsl).
pub const TOP_CANDIDATES: usize = 64;
/// Workgroups of the top-k's first pass at most, and logits per workgroup at most (256 threads
/// × `P` in topk_select.wgsl).
const TOPK_GROUPS: usize = 256;
const TOPK_CHUNK: usize = 256 * 64;

/// What a forward call reads back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuOutputs {
    /// Logits of the positions [`Outputs`] names.
    Logits(Outputs),
    /// Only the index of the largest logit of the last position (greedy decoding).
    Greedy,
    /// The [`TOP_CANDIDATES`] most likely tokens of the last position, with their logits.
    Top,
}

/// Options of [`GpuModel::new`].
#[derive(Debug, Clone, Copy)]
pub struct GpuOptions {
    /// Adapter index (see [`crate::adapters`]), or `None` for the best one found.
    pub adapter: Option<usize>,
    /// Token rows one submission computes (longer inputs run in several).
    pub max_batch: usize,
    /// Largest buffer one chunk of the LM head or the embedding may take (the adapter's
    /// storage-binding limit when `None`).
    pub chunk_bytes: Option<u64>,
    /// The kernels of a decode step's matrices.
    pub decode: DecodeKernels,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            adapter: None,
            max_batch: 512,
            chunk_bytes: None,
            decode: DecodeKernels::default(),
        }
    }
}

/// The kernels of a decode step's matrices (calls of up to 4 rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodeKernels {
    /// `Lanes` on an adapter that runs invocations as a CPU's SIMD lanes (lavapipe,
    /// SwiftShader), else `Mv`.
    #[default]
    Auto,
    /// One workgroup an output row (ternary.wgsl), each norm a dispatch of its own.
    Rows,
    /// Teams of threads an output row with wide loads (mv.wgsl), Q, K and V in one dispatch
    /// of concatenated rows; each norm a dispatch of its own.
    Mv,
    /// As `Mv`, with each norm in its matrix kernel's prologue: 8 dispatches a block.
    Fused,
    /// One thread four output rows over the whole input, the packed dot written out, each
    /// norm in the kernel's prologue (mv_rows.wgsl): for adapters that run invocations as
    /// SIMD lanes, where a reduction across threads costs more than it saves. 8 dispatches a
    /// block; only where the adapter is a CPU device.
    Lanes,
}

/// Which decode kernels a model's blocks are bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MvKind {
    /// mv.wgsl over rows norm_quant.wgsl quantized first.
    Quant,
    /// mv.wgsl norming and quantizing its input in its prologue.
    Norm,
    /// mv_rows.wgsl (four rows a thread), norming in its prologue.
    Lanes,
}

impl MvKind {
    /// The kernel norms its input itself (its inputs are the f32 rows and the norm's weights).
    pub(crate) fn normed(self) -> bool {
        self != MvKind::Quant
    }

    /// The matrix kernel, the gate+up kernel and the output rows a workgroup computes.
    pub(crate) fn pipelines(
        self,
        k: &crate::device::Kernels,
    ) -> Option<(&wgpu::ComputePipeline, &wgpu::ComputePipeline, usize)> {
        let (m, g, rows) = match self {
            MvKind::Quant => (&k.mv_q, &k.mv_glu_q, k.mv_rows),
            MvKind::Norm => (&k.mv, &k.mv_glu, k.mv_rows),
            MvKind::Lanes => (&k.mv_lanes, &k.mv_glu_lanes, crate::device::LANES_ROWS),
        };
        Some((m.as_ref()?, g.as_ref()?, rows))
    }
}

/// One ternary projection on the device.
#[derive(Debug)]
pub(crate) struct GpuMatrix {
    n_out: usize,
    bind: wgpu::BindGroup,
    /// The prompt GEMM's bindings (gemm.wgsl; I2_S only): one, or for the FFN the gate's
    /// then the up projection's.
    gemm: Vec<wgpu::BindGroup>,
}

impl GpuMatrix {
    pub(crate) fn bind(&self) -> &wgpu::BindGroup {
        &self.bind
    }
}

#[derive(Debug)]
struct GpuLayer {
    norm_attn: wgpu::BindGroup,
    q: GpuMatrix,
    k: GpuMatrix,
    v: GpuMatrix,
    norm_sub: wgpu::BindGroup,
    o: GpuMatrix,
    norm_ffn: wgpu::BindGroup,
    /// gate, up and the activation, fused
    glu: GpuMatrix,
    norm_ffn_sub: wgpu::BindGroup,
    down: GpuMatrix,
    /// The decode kernels' bindings and workgroups (mv.wgsl, mv_glu.wgsl), where the shapes
    /// and the adapter allow them.
    mv: Option<MvLayer>,
}

/// The decode kernels' input pair: `normed` (rows, norm weights) when the kernel norms its
/// input, else `quant`.
fn mv_input<'a>(
    kind: MvKind,
    normed: (&'a wgpu::Buffer, &'a wgpu::Buffer),
    quant: (&'a wgpu::Buffer, &'a wgpu::Buffer),
) -> (&'a wgpu::Buffer, &'a wgpu::Buffer) {
    if kind.normed() {
        normed
    } else {
        quant
    }
}

/// A decode kernel's input: (rows, norm weights) when it norms them itself, else
/// (quantized rows, their scales); eps; the kernels.
pub(crate) type MvInput<'a> = ((&'a wgpu::Buffer, &'a wgpu::Buffer), u32, MvKind);

/// A decode kernel's binding and its workgroups.
pub(crate) type MvBind = (wgpu::BindGroup, u32);

#[derive(Debug)]
struct MvLayer {
    /// The kernels (unless they norm in their prologues, each norm a norm_quant dispatch
    /// first).
    kind: MvKind,
    qkv: MvBind,
    o: MvBind,
    glu: MvBind,
    down: MvBind,
}

/// Rows of an F16/F32 row matrix (the LM head, the embedding) split into buffers that each
/// fit one storage binding.
#[derive(Debug)]
pub(crate) struct Chunks {
    pub(crate) bufs: Vec<wgpu::Buffer>,
    pub(crate) rows_per_chunk: usize,
    pub(crate) row_bytes: usize,
}

#[derive(Debug)]
struct Activations {
    /// Embedding rows as stored ([max_batch][row_bytes]).
    rows: wgpu::Buffer,
    q: wgpu::Buffer,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    o: wgpu::Buffer,
    logits: wgpu::Buffer,
    logits_staging: wgpu::Buffer,
    best: wgpu::Buffer,
    best_staging: wgpu::Buffer,
    top: wgpu::Buffer,
    top_staging: wgpu::Buffer,
}

/// A model resident on the GPU. Built from a bound [`Model`]; it keeps no reference to it.
/// Calls from several threads take turns (its activation buffers are shared).
#[derive(Debug)]
pub struct GpuModel {
    gpu: Gpu,
    /// Held for the whole of a call that writes the shared buffers.
    turn: std::sync::Mutex<()>,
    config: Config,
    max_batch: usize,
    /// Rows of logits one submission may produce.
    out_cap: usize,
    step: wgpu::Buffer,
    act: Activations,
    layers: Vec<GpuLayer>,
    skip: Vec<bool>,
    embd: Option<Chunks>,
    head: Chunks,
    embed_bind: wgpu::BindGroup,
    final_norm: wgpu::BindGroup,
    head_binds: Vec<(usize, wgpu::BindGroup)>,
    argmax_bind: wgpu::BindGroup,
    topk_local: wgpu::BindGroup,
    topk_merge: wgpu::BindGroup,
    /// Workgroups of the top-k's first pass.
    topk_groups: u32,
    /// Bytes of weights and activation buffers on the device.
    bytes: u64,
    /// Dispatches of the last submission.
    dispatches: std::sync::atomic::AtomicU32,
    /// Submissions of the last call.
    submits: std::sync::atomic::AtomicU32,
    /// Kernel timing, when on.
    prof: std::sync::Mutex<Option<ProfState>>,
}

/// The query set and buffers of kernel timing, and the times so far.
#[derive(Debug)]
struct ProfState {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    staging: wgpu::Buffer,
    acc: Profile,
}

/// The element type of a [`GpuCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuKv {
    /// Half the memory; values rounded to f16 as the CPU's default cache rounds them.
    F16,
    F32,
}

/// A sequence's KV cache on the device (f16 or f32), with its RoPE table.
#[derive(Debug)]
pub struct GpuCache {
    ty: GpuKv,
    k: Vec<wgpu::Buffer>,
    v: Vec<wgpu::Buffer>,
    attn: Vec<wgpu::BindGroup>,
    /// The merge of a split attention call's chunk states (one for every layer).
    merge: wgpu::BindGroup,
    /// Per block: RoPE on the new rows' Q and K, and their K and V into the cache.
    rope: Vec<wgpu::BindGroup>,
    len: usize,
    n_ctx: usize,
    bytes: u64,
}

impl GpuCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Positions it can hold.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    /// Forget every position.
    pub fn reset(&mut self) {
        self.len = 0;
    }
    /// Keep the first `n` positions (no-op when it holds fewer).
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }
    /// Device bytes of K and V (and the RoPE table).
    pub fn nbytes(&self) -> u64 {
        self.bytes
    }
    /// Its element type.
    pub fn kv_type(&self) -> GpuKv {
        self.ty
    }
}

fn bytes_of(n: usize) -> Result<u64> {
    u64::try_from(n).map_err(|_| GpuError::Overflow("buffer size"))
}

fn u32_of(n: usize, what: &'static str) -> Result<u32> {
    u32::try_from(n).map_err(|_| GpuError::Overflow(what))
}

fn mul(a: usize, b: usize, what: &'static str) -> Result<usize> {
    a.checked_mul(b).ok_or(GpuError::Overflow(what))
}

/// I2_S bytes with the never-written code 11 turned into 01 (value 0, as the CPU decodes it).
fn clean_i2s(data: &[u8]) -> Vec<u8> {
    data.iter()
        .map(|&b| b ^ ((b & (b >> 1) & 0x55) << 1))
        .collect()
}

/// TQ2_0 blocks (64 code bytes, least significant pair first, then an f16 d) as I2_S-ordered
/// codes and f32 block scales.
fn tq2_to_i2s_order(data: &[u8], n_out: usize, n_in: usize) -> Result<(Vec<u8>, Vec<f32>)> {
    let nb = n_in / 256;
    let expected = mul(mul(n_out, nb, "TQ2_0 blocks")?, 66, "TQ2_0 bytes")?;
    if data.len() != expected {
        return Err(GpuError::Shape {
            what: "TQ2_0 tensor bytes",
            expected,
            got: data.len(),
        });
    }
    let mut codes = Vec::with_capacity(n_out * nb * 64);
    let mut scales = Vec::with_capacity(n_out * nb);
    for blk in data.chunks_exact(66) {
        for &b in &blk[..64] {
            let mut o = 0u8;
            for l in 0..4 {
                o |= ((b >> (2 * l)) & 3) << (6 - 2 * l);
            }
            codes.push(o);
        }
        scales.push(half::f16::from_le_bytes([blk[64], blk[65]]).to_f32());
    }
    Ok((codes, scales))
}

pub(crate) fn ty_of(m: &RowMatrix<'_>, what: &str) -> Result<u32> {
    ty_of_type(m.row_type(), what)
}

/// The kernels build the `bitnet*` block (sub-norms, NEOX RoPE) and the ternary `llama` block
/// (no sub-norms, normal RoPE); the embedding models' blocks (input norms, Q/K norms,
/// post-norms, a head size apart from n_embd / n_head) are refused before a device is opened,
/// so `--device auto` can fall back to the CPU.
pub fn check_architecture(c: &Config) -> Result<()> {
    if c.norm_in
        || c.qk_norm
        || c.post_norms
        || c.embd_scale.is_some()
        || c.q_prescale
        || c.n_embd_q() != c.n_embd
    {
        return Err(GpuError::Unsupported(format!(
            "architecture '{}' on the GPU (the GPU runs the `bitnet*` and ternary `llama` \
             blocks): run it on the CPU",
            c.arch
        )));
    }
    Ok(())
}

impl GpuModel {
    /// Open the GPU and upload `model` (fast numerics; the cache is f32).
    pub fn new(model: &Model<'_>, opts: GpuOptions) -> Result<Self> {
        check_architecture(&model.config)?;
        let gpu = Gpu::open(opts.adapter)?;
        Self::upload(gpu, model, opts)
    }

    /// [`GpuModel::new`], for callers that must not block (a browser's WebGPU).
    pub async fn new_async(model: &Model<'_>, opts: GpuOptions) -> Result<Self> {
        check_architecture(&model.config)?;
        let gpu = Gpu::open_async(opts.adapter).await?;
        Self::upload(gpu, model, opts)
    }

    fn upload(gpu: Gpu, model: &Model<'_>, opts: GpuOptions) -> Result<Self> {
        let mut b = GpuModel::builder(
            gpu,
            &model.config,
            RowsSpec::of(&model.tok_embd),
            model.output.as_ref().map(RowsSpec::of),
            opts,
        )?;
        for (il, l) in model.layers.iter().enumerate() {
            b.layer(il, l)?;
        }
        b.output_norm(&model.output_norm)?;
        b.write_embd(model.tok_embd.data())?;
        if let Some(o) = &model.output {
            b.write_output(o.data())?;
        }
        b.skip = model.skip.clone();
        b.finish()
    }

    /// A model uploaded piece by piece (for a file that arrives in pieces and is never held
    /// whole): the activation buffers and empty weight buffers now, then each block, the
    /// final norm and the bytes of the embedding (and of the separate LM head, `output`)
    /// through the [`GpuBuilder`], in any order; [`GpuBuilder::finish`] checks that all came.
    pub fn builder(
        gpu: Gpu,
        config: &Config,
        embd: RowsSpec,
        output: Option<RowsSpec>,
        opts: GpuOptions,
    ) -> Result<GpuBuilder> {
        let c = config.clone();
        let (e, kv, ff, nv) = (c.n_embd, c.n_embd_kv(), c.n_ff, c.n_vocab);
        check_architecture(&c)?;
        if c.head_dim > MAX_HEAD_DIM
            || !c.n_rot.is_multiple_of(2)
            || !c.head_dim.is_multiple_of(2)
            || !e.is_multiple_of(4)
            || !ff.is_multiple_of(4)
        {
            return Err(GpuError::Unsupported(format!(
                "this shape (head size {} > {MAX_HEAD_DIM}, or odd head size / n_rot / n_embd / n_ff)",
                c.head_dim
            )));
        }
        for (spec, what) in [
            (Some(&embd), "token embedding"),
            (output.as_ref(), "LM head"),
        ] {
            if let Some(s) = spec {
                if s.rows != nv {
                    return Err(GpuError::Shape {
                        what,
                        expected: nv,
                        got: s.rows,
                    });
                }
            }
        }
        let max_batch = opts.max_batch.max(1);
        let dispatch_max =
            usize::try_from(gpu.limits.max_compute_workgroups_per_dimension).unwrap_or(usize::MAX);
        if ff.max(e).max(max_batch) > dispatch_max {
            return Err(GpuError::Limit {
                adapter: gpu.info.name.clone(),
                what: "workgroups per dispatch dimension",
                need: bytes_of(ff.max(e).max(max_batch))?,
                have: u64::from(gpu.limits.max_compute_workgroups_per_dimension),
            });
        }
        let limit = gpu
            .limits
            .max_storage_buffer_binding_size
            .min(gpu.limits.max_buffer_size);
        let chunk_limit = opts.chunk_bytes.map_or(limit, |b| b.min(limit));
        let f32s = |n: usize| -> Result<u64> { bytes_of(mul(n, 4, "buffer size")?) };
        let mut bytes = 0u64;

        // Activations, sized for the largest batch.
        let rw = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let head_spec = output.as_ref().unwrap_or(&embd);
        let head_ty = ty_of_type(head_spec.ty, "LM head")?;
        let embd_ty = ty_of_type(embd.ty, "token embedding")?;
        let embd_row = embd.row_bytes()?;
        let out_cap = usize::try_from(limit / f32s(nv)?.max(1))
            .unwrap_or(1)
            .clamp(1, max_batch);
        let mut buf = |label: &str, size: u64| -> Result<wgpu::Buffer> {
            bytes += size;
            gpu.storage(label, size, rw)
        };
        let act_rows = buf(
            "embedding rows",
            bytes_of(mul(max_batch, embd_row, "rows")?)?,
        )?;
        let h = buf("h", f32s(max_batch * e)?)?;
        let q = buf("q", f32s(max_batch * e)?)?;
        let k = buf("k", f32s(max_batch * kv)?)?;
        let v = buf("v", f32s(max_batch * kv)?)?;
        let o = buf("o", f32s(max_batch * e)?)?;
        let g = buf("g", f32s(max_batch * ff)?)?;
        let xq = buf("xq", bytes_of(max_batch * e.max(ff))?)?;
        let xs = buf("xs", f32s(max_batch)?)?;
        let hn = buf("hn", f32s(out_cap * e)?)?;
        let logits = buf("logits", f32s(mul(out_cap, nv, "logits")?)?)?;
        let best = buf("best", bytes_of(ARGMAX_GROUPS * 8)?)?;
        let top_bytes = bytes_of(TOP_CANDIDATES * 8)?;
        let top = buf("top", top_bytes)?;
        let topk_chunk = nv.div_ceil(TOPK_GROUPS).next_multiple_of(256).max(256);
        if topk_chunk > TOPK_CHUNK {
            return Err(GpuError::Unsupported(format!(
                "a vocabulary of {nv} tokens (the top-k kernels take {})",
                TOPK_GROUPS * TOPK_CHUNK
            )));
        }
        let topk_groups = nv.div_ceil(topk_chunk);
        let cand = buf(
            "top candidates",
            bytes_of(topk_groups * TOP_CANDIDATES * 8)?,
        )?;
        let spare = [buf("spare", 4)?, buf("spare", 4)?];
        let staging = |label: &str, size: u64| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let logits_staging = staging("logits staging", f32s(mul(out_cap, nv, "logits")?)?);
        let best_staging = staging("best staging", bytes_of(ARGMAX_GROUPS * 8)?);
        let top_staging = staging("top staging", top_bytes);
        let step = gpu.uniform("step", &[0, 0, 0, 0]);

        let kp = &gpu.k;
        let eps = c.rms_eps.to_bits();
        let dims_e = gpu.uniform("dims n_embd", &[u32_of(e, "n_embd")?, eps, 0, 0]);
        let dims_ff = gpu.uniform("dims n_ff", &[u32_of(ff, "n_ff")?, eps, 0, 0]);
        // A block without sub-norms (`llama`): its O and down inputs quantized as they are.
        let plain = (!c.sub_norms)
            .then(|| -> Result<Plain> {
                let ones = vec![1.0f32; e.max(ff)];
                Ok(Plain {
                    dims_e: gpu.uniform("dims n_embd plain", &[u32_of(e, "n_embd")?, eps, 1, 0]),
                    dims_ff: gpu.uniform("dims n_ff plain", &[u32_of(ff, "n_ff")?, eps, 1, 0]),
                    ones: gpu.upload("ones", bytemuck::cast_slice(&ones))?,
                })
            })
            .transpose()?;
        let act_mode = match c.activation {
            Activation::Relu2 => 1,
            Activation::Silu => 2,
            Activation::Gelu => {
                return Err(GpuError::Unsupported(
                    "GELU on the GPU: run the model on the CPU".into(),
                ))
            }
        };
        // The decode kernels take inputs of up to MV_MAX_IN values that fit their workgroup
        // memory, in at most the dispatch's workgroups.
        if opts.decode == DecodeKernels::Lanes && MvKind::Lanes.pipelines(kp).is_none() {
            return Err(GpuError::Unsupported(format!(
                "the lane decode kernels on {} (not a CPU device)",
                gpu.info.name
            )));
        }
        let kind = match opts.decode {
            DecodeKernels::Auto if kp.mv_lanes.is_some() => Some(MvKind::Lanes),
            DecodeKernels::Auto | DecodeKernels::Mv => Some(MvKind::Quant),
            DecodeKernels::Fused => Some(MvKind::Norm),
            DecodeKernels::Lanes => Some(MvKind::Lanes),
            DecodeKernels::Rows => None,
        };
        let mv_kind = kind.filter(|k| {
            k.pipelines(kp).is_some_and(|(_, _, rows)| {
                e.max(ff) <= MV_MAX_IN
                    && e.max(ff) / 4 <= kp.mv_words
                    && (e + 2 * kv).max(ff).div_ceil(rows) <= dispatch_max
            })
        });

        // The LM head, and the embedding when it is not the same matrix: empty buffers
        // that the rows' bytes fill as they come.
        let head = RowsUpload::new(&gpu, head_spec, chunk_limit, "lm head")?;
        bytes += head.chunks.bufs.iter().map(wgpu::Buffer::size).sum::<u64>();
        let embd_up = if output.is_some() {
            let ch = RowsUpload::new(&gpu, &embd, chunk_limit, "embedding")?;
            bytes += ch.chunks.bufs.iter().map(wgpu::Buffer::size).sum::<u64>();
            Some(ch)
        } else {
            None
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        layers.resize_with(c.n_layer, || None);
        Ok(GpuBuilder {
            config: c,
            max_batch,
            out_cap,
            step,
            act: Activations {
                rows: act_rows,
                q,
                k,
                v,
                o,
                logits,
                logits_staging,
                best,
                best_staging,
                top,
                top_staging,
            },
            h,
            g,
            xq,
            xs,
            hn,
            cand,
            spare,
            dims_e,
            dims_ff,
            plain,
            eps,
            act_mode,
            mv_kind,
            topk_chunk,
            topk_groups,
            head_ty,
            embd_ty,
            layers,
            head,
            embd: embd_up,
            output_norm: None,
            skip: Vec::new(),
            bytes,
            gpu,
        })
    }

    /// The adapter it runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Device bytes of the weights and activation buffers (the caches come on top).
    pub fn nbytes(&self) -> u64 {
        self.bytes
    }

    /// Skip the blocks marked `true` (the residual stream passes them unchanged), as
    /// [`Model::skip`] does on the CPU; an empty mask skips none.
    pub fn set_skip(&mut self, mask: Vec<bool>) {
        self.skip = mask;
    }

    /// The model's shape.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A KV cache of `n_ctx` positions of type `ty` on the device, with its RoPE table.
    pub fn new_cache(&self, n_ctx: usize, ty: GpuKv) -> Result<GpuCache> {
        let c = &self.config;
        let n_ctx = n_ctx.max(1);
        let kv = c.n_embd_kv();
        let elem = match ty {
            GpuKv::F16 => 2,
            GpuKv::F32 => 4,
        };
        let per = bytes_of(mul(mul(n_ctx, kv, "cache")?, elem, "cache")?)?;
        let usage = wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
        let mut k = Vec::with_capacity(c.n_layer);
        let mut v = Vec::with_capacity(c.n_layer);
        for _ in 0..c.n_layer {
            k.push(self.gpu.storage("cache k", per, usage)?);
            v.push(self.gpu.storage("cache v", per, usage)?);
        }
        let half = c.n_rot / 2;
        let mut table = vec![0f32; mul(mul(n_ctx, half, "rope table")?, 2, "rope table")?];
        let (cos, sin) = table.split_at_mut(n_ctx * half);
        for p in 0..n_ctx {
            let r = rope_row(p, c.n_rot, c.rope_freq_base);
            cos[p * half..(p + 1) * half].copy_from_slice(&r.cos);
            sin[p * half..(p + 1) * half].copy_from_slice(&r.sin);
        }
        let tb = self
            .gpu
            .upload("rope table", bytemuck::cast_slice(&table))?;
        let kp = &self.gpu.k;
        let rope_dims = self.gpu.uniform(
            "dims rope",
            &[
                u32_of(c.n_head, "n_head")?,
                u32_of(c.n_head_kv, "n_head_kv")?,
                u32_of(c.head_dim, "head_dim")?,
                u32_of(half, "n_rot")?,
                u32::from(c.rope_style == RopeStyle::Norm),
                0,
                0,
                0,
            ],
        );
        let ctx = self.gpu.uniform("ctx", &[u32_of(n_ctx, "n_ctx")?, 0, 0, 0]);
        let a = &self.act;
        let rope_kernel = match ty {
            GpuKv::F16 => &kp.rope_f16,
            GpuKv::F32 => &kp.rope_f32,
        };
        let rope = (0..c.n_layer)
            .map(|il| {
                self.gpu.bind(
                    rope_kernel,
                    &[
                        &self.step, &rope_dims, &a.q, &a.k, &tb, &ctx, &a.v, &k[il], &v[il],
                    ],
                )
            })
            .collect();
        #[allow(clippy::cast_precision_loss)] // head sizes are small integers
        let scale = 1.0f32 / (c.head_dim as f32).sqrt();
        let attn_dims = self.gpu.uniform(
            "dims attention",
            &[
                u32_of(c.n_head, "n_head")?,
                u32_of(c.n_head_kv, "n_head_kv")?,
                u32_of(c.head_dim, "head_dim")?,
                scale.to_bits(),
            ],
        );
        let pipeline = match ty {
            GpuKv::F16 => &kp.attention_f16,
            GpuKv::F32 => &kp.attention_f32,
        };
        // Chunk states of a split call: per (row, head, chunk) head_dim + 2 floats.
        let part_len = attn_part_len(c.n_head, c.head_dim)?;
        let part = self.gpu.storage(
            "attention chunks",
            bytes_of(mul(part_len, 4, "attention chunks")?)?,
            wgpu::BufferUsages::empty(),
        )?;
        let attn = (0..c.n_layer)
            .map(|il| {
                self.gpu.bind(
                    pipeline,
                    &[&self.step, &attn_dims, &a.q, &k[il], &v[il], &a.o, &part],
                )
            })
            .collect();
        let merge = self
            .gpu
            .bind(&kp.attention_merge, &[&self.step, &attn_dims, &part, &a.o]);
        self.gpu.wait()?;
        Ok(GpuCache {
            bytes: per * 2 * bytes_of(c.n_layer)? + tb.size() + part.size(),
            ty,
            k,
            v,
            attn,
            merge,
            rope,
            len: 0,
            n_ctx,
        })
    }

    /// Context shift, as [`bitnet_model::KvCache::shift`] does it: drop positions
    /// `keep..keep + discard`, move the later ones down by `discard`, and turn their keys back
    /// by `discard` positions of RoPE. The cache makes one round trip through memory (a rare
    /// event: when a generation fills its context).
    pub fn shift(&self, cache: &mut GpuCache, keep: usize, discard: usize) -> Result<()> {
        let _turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        let c = &self.config;
        let from = keep
            .checked_add(discard)
            .filter(|&f| f <= cache.len && discard > 0)
            .ok_or(GpuError::Shape {
                what: "context shift (kept + dropped positions)",
                expected: cache.len,
                got: keep.saturating_add(discard),
            })?;
        let (kv, d) = (c.n_embd_kv(), c.head_dim);
        let rope = rope_row(discard, c.n_rot, c.rope_freq_base);
        let rope_back = rope_back_for(c.rope_style);
        let moved = cache.len - from;
        let elem = match cache.ty {
            GpuKv::F16 => 2,
            GpuKv::F32 => 4,
        };
        let bytes = bytes_of(mul(mul(cache.len, kv, "cache")?, elem, "cache")?)?;
        for il in 0..c.n_layer {
            for (buf, is_k) in [(&cache.k[il], true), (&cache.v[il], false)] {
                let raw = self.gpu.read(buf, bytes)?;
                let mut rows: Vec<f32> = match cache.ty {
                    GpuKv::F16 => raw
                        .chunks_exact(2)
                        .map(|w| half::f16::from_le_bytes([w[0], w[1]]).to_f32())
                        .collect(),
                    GpuKv::F32 => raw
                        .chunks_exact(4)
                        .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                        .collect(),
                };
                if is_k {
                    for head in rows[from * kv..].chunks_exact_mut(d) {
                        rope_back(head, &rope);
                    }
                }
                // Rotated keys are stored again in the cache's type, as the CPU does.
                let tail = &rows[from * kv..(from + moved) * kv];
                let at = bytes_of(mul(keep, kv, "cache")? * elem)?;
                match cache.ty {
                    GpuKv::F16 => {
                        let h: Vec<u8> = tail
                            .iter()
                            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                            .collect();
                        self.gpu.queue.write_buffer(buf, at, &h);
                    }
                    GpuKv::F32 => self
                        .gpu
                        .queue
                        .write_buffer(buf, at, bytemuck::cast_slice(tail)),
                }
            }
        }
        self.gpu.wait()?;
        cache.len -= discard;
        Ok(())
    }

    /// Evaluate `tokens` at positions `cache.len()..`, append their K/V, and return the
    /// logits `outputs` asks for (`[rows][n_vocab]`), as [`Model::forward`] does.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut GpuCache,
        outputs: Outputs,
    ) -> Result<Vec<f32>> {
        crate::device::block(self.forward_async(tokens, cache, outputs))?
    }

    /// [`GpuModel::forward`], for callers that must not block: the one implementation.
    pub async fn forward_async(
        &self,
        tokens: &[u32],
        cache: &mut GpuCache,
        outputs: Outputs,
    ) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        self.run(tokens, cache, GpuOutputs::Logits(outputs), &mut out)
            .await?;
        Ok(out)
    }

    /// [`GpuModel::forward`] that returns only the argmax of the last position's logits
    /// (the lowest index among equal maxima), reading back 8 bytes per argmax workgroup.
    pub fn forward_greedy(&self, tokens: &[u32], cache: &mut GpuCache) -> Result<u32> {
        crate::device::block(self.forward_greedy_async(tokens, cache))?
    }

    /// [`GpuModel::forward_greedy`], for callers that must not block.
    pub async fn forward_greedy_async(&self, tokens: &[u32], cache: &mut GpuCache) -> Result<u32> {
        let mut out = Vec::new();
        let best = self
            .run(tokens, cache, GpuOutputs::Greedy, &mut out)
            .await?;
        best.filter(|&b| b != u32::MAX).ok_or(GpuError::Readback(
            "no logit to take the maximum of".to_string(),
        ))
    }

    /// [`GpuModel::forward`] that returns only the [`TOP_CANDIDATES`] most likely tokens of
    /// the last position as `(id, logit)`, most likely first (higher logit, then lower id),
    /// reading back 512 bytes; a NaN or infinite logit is [`GpuError::NonFiniteLogit`]. A
    /// sampler whose chain only looks at the top-k
    /// (`bitnet_sampling::Sampler::candidates_suffice`) draws from these what it would draw
    /// from the whole row.
    pub fn forward_top(&self, tokens: &[u32], cache: &mut GpuCache) -> Result<Vec<(u32, f32)>> {
        crate::device::block(self.forward_top_async(tokens, cache))?
    }

    /// [`GpuModel::forward_top`], for callers that must not block.
    pub async fn forward_top_async(
        &self,
        tokens: &[u32],
        cache: &mut GpuCache,
    ) -> Result<Vec<(u32, f32)>> {
        let mut out = Vec::new();
        self.run(tokens, cache, GpuOutputs::Top, &mut out).await?;
        top_of_pairs(
            out.chunks_exact(2)
                .map(|p| (p[0].to_bits(), p[1].to_bits())),
        )
    }

    // The guards make one caller at a time use the device, across its read-back: natively
    // the future runs to completion on the calling thread; a page's one thread never
    // interleaves two calls (the web model refuses a second while one runs).
    #[allow(clippy::await_holding_lock)]
    async fn run(
        &self,
        tokens: &[u32],
        cache: &mut GpuCache,
        want: GpuOutputs,
        out: &mut Vec<f32>,
    ) -> Result<Option<u32>> {
        // A call that panicked left only plain buffers behind.
        let _turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        let c = &self.config;
        if tokens.is_empty() {
            return Err(GpuError::Shape {
                what: "tokens",
                expected: 1,
                got: 0,
            });
        }
        if let Some(&id) = tokens
            .iter()
            .find(|&&t| usize::try_from(t).map_or(true, |t| t >= c.n_vocab))
        {
            return Err(GpuError::TokenOutOfRange {
                id,
                n_vocab: c.n_vocab,
            });
        }
        let need = cache.len + tokens.len();
        if need > cache.n_ctx {
            return Err(GpuError::ContextFull {
                need,
                n_ctx: cache.n_ctx,
            });
        }
        let all = want == GpuOutputs::Logits(Outputs::All);
        let per_call = if all {
            self.max_batch.min(self.out_cap)
        } else {
            self.max_batch
        };
        let n_chunks = tokens.len().div_ceil(per_call);
        self.submits.store(0, std::sync::atomic::Ordering::Relaxed);
        let mut best = None;
        for (i, chunk) in tokens.chunks(per_call).enumerate() {
            let last = i + 1 == n_chunks;
            let n = chunk.len();
            let (out_first, out_rows) = match want {
                GpuOutputs::Logits(Outputs::All) => (0, n),
                GpuOutputs::Logits(Outputs::Last) | GpuOutputs::Greedy | GpuOutputs::Top
                    if last =>
                {
                    (n - 1, 1)
                }
                _ => (0, 0),
            };
            self.gpu.queue.write_buffer(
                &self.step,
                0,
                bytemuck::cast_slice(&[
                    u32_of(n, "tokens")?,
                    u32_of(cache.len, "position")?,
                    u32_of(out_first, "rows")?,
                    u32_of(out_rows, "rows")?,
                ]),
            );
            let mut enc = self.gpu.device.create_command_encoder(&Default::default());
            let mut prof = self.prof.lock().unwrap_or_else(|e| e.into_inner());
            let names = {
                let mut rec = Rec::new(&mut enc, prof.as_ref().map(|p| &p.set));
                self.record(&mut rec, chunk, cache, out_rows, want)?;
                self.dispatches
                    .store(rec.count, std::sync::atomic::Ordering::Relaxed);
                std::mem::take(&mut rec.names)
            };
            let n_queries = u32_of(2 * names.len(), "queries")?;
            if let Some(p) = prof.as_ref().filter(|_| n_queries > 0) {
                enc.resolve_query_set(&p.set, 0..n_queries, &p.resolve, 0);
                enc.copy_buffer_to_buffer(&p.resolve, 0, &p.staging, 0, u64::from(n_queries) * 8);
            }
            let nv = c.n_vocab;
            if out_rows > 0 && want == GpuOutputs::Top {
                let size = bytes_of(TOP_CANDIDATES * 8)?;
                enc.copy_buffer_to_buffer(&self.act.top, 0, &self.act.top_staging, 0, size);
                self.gpu.queue.submit([enc.finish()]);
                self.submits
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let b = self.gpu.map_read_async(&self.act.top_staging, size).await?;
                // (id, logit bits) pairs, carried as f32 bit patterns.
                out.extend(
                    b.chunks_exact(4)
                        .map(|w| f32::from_bits(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))),
                );
            } else if out_rows > 0 && want == GpuOutputs::Greedy {
                let size = bytes_of(ARGMAX_GROUPS * 8)?;
                enc.copy_buffer_to_buffer(&self.act.best, 0, &self.act.best_staging, 0, size);
                self.gpu.queue.submit([enc.finish()]);
                self.submits
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let b = self
                    .gpu
                    .map_read_async(&self.act.best_staging, size)
                    .await?;
                best = Some(best_of_groups(&b)?);
            } else if out_rows > 0 {
                let size = bytes_of(mul(mul(out_rows, nv, "logits")?, 4, "logits")?)?;
                enc.copy_buffer_to_buffer(&self.act.logits, 0, &self.act.logits_staging, 0, size);
                self.gpu.queue.submit([enc.finish()]);
                self.submits
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let b = self
                    .gpu
                    .map_read_async(&self.act.logits_staging, size)
                    .await?;
                out.extend(
                    b.chunks_exact(4)
                        .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]])),
                );
            } else {
                self.gpu.queue.submit([enc.finish()]);
                self.submits
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.gpu.wait()?;
            }
            if let Some(p) = prof.as_mut().filter(|_| n_queries > 0) {
                let b = self
                    .gpu
                    .map_read_async(&p.staging, u64::from(n_queries) * 8)
                    .await?;
                let period = f64::from(self.gpu.queue.get_timestamp_period());
                let at = |i: usize| {
                    let w = &b[8 * i..8 * i + 8];
                    u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]])
                };
                for (i, name) in names.iter().enumerate() {
                    #[allow(clippy::cast_precision_loss)] // tick counts of one kernel
                    let ns = at(2 * i + 1).saturating_sub(at(2 * i)) as f64 * period;
                    let e = p.acc.totals.entry(name).or_insert((0.0, 0));
                    e.0 += ns;
                    e.1 += 1;
                }
                p.acc.tokens += u64::try_from(n).unwrap_or(0);
            }
            cache.len += n;
        }
        Ok(best)
    }

    /// The device's copy bandwidth in GB/s (bytes read plus bytes written per second): 20
    /// copies of a 256 MiB buffer (less where the adapter's buffers are smaller) in one
    /// submission, after one untimed. What the decode's GB/s is measured against.
    pub fn copy_probe(&self) -> Result<f64> {
        let _turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        let size = (256u64 << 20).min(self.gpu.limits.max_buffer_size) / 4 * 4;
        let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let make = |label| {
            self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: false,
            })
        };
        let (src, dst) = (make("probe src"), make("probe dst"));
        let copies = |n: u32| -> Result<f64> {
            let mut enc = self.gpu.device.create_command_encoder(&Default::default());
            for _ in 0..n {
                enc.copy_buffer_to_buffer(&src, 0, &dst, 0, size);
            }
            let t0 = std::time::Instant::now();
            self.gpu.queue.submit([enc.finish()]);
            self.gpu.wait()?;
            Ok(t0.elapsed().as_secs_f64())
        };
        copies(1)?;
        let secs = copies(20)?;
        #[allow(clippy::cast_precision_loss)] // a buffer size
        let moved = 2.0 * 20.0 * size as f64;
        Ok(moved / secs.max(1e-9) / 1e9)
    }

    /// Bytes of weights a call of `n` tokens that wants the last row's logits reads from
    /// device memory, by the kernels' geometry: each matrix's codes (2 bits a weight) once
    /// per workgroup column of tokens (a prompt GEMM tile of 64, a row-kernel group of 4; the
    /// team decode kernels once per call of up to 4, the lane kernels once per token) and the
    /// LM head once.
    pub fn weight_reads(&self, n: usize) -> u64 {
        let c = &self.config;
        let w = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        let (e, kv, ff) = (w(c.n_embd), w(c.n_embd_kv()), w(c.n_ff));
        let n = n.max(1);
        let mut total = 0u64;
        for (il, l) in self.layers.iter().enumerate() {
            if self.skip.get(il).copied().unwrap_or(false) {
                continue;
            }
            let mats = [
                (e.saturating_mul(e + 2 * kv), !l.q.gemm.is_empty()),
                (e.saturating_mul(e), !l.o.gemm.is_empty()),
                (
                    e.saturating_mul(ff).saturating_mul(2),
                    !l.glu.gemm.is_empty(),
                ),
                (e.saturating_mul(ff), !l.down.gemm.is_empty()),
            ];
            for (weights, gemm) in mats {
                let reads = match &l.mv {
                    Some(m) if n <= MV_TOKENS && m.kind == MvKind::Lanes => n,
                    Some(_) if n <= MV_TOKENS => 1,
                    _ if n >= GEMM_MIN_TOKENS && gemm => n.div_ceil(GEMM_TOKENS),
                    _ => n.div_ceil(TERNARY_TOKENS),
                };
                total = total.saturating_add((weights / 4).saturating_mul(w(reads)));
            }
        }
        let head: u64 = self.head.bufs.iter().map(wgpu::Buffer::size).sum();
        total.saturating_add(head)
    }

    /// Submissions the last forward call made (one per call of up to `max_batch` tokens).
    pub fn last_submits(&self) -> u32 {
        self.submits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Dispatches the last submission recorded.
    pub fn last_dispatches(&self) -> u32 {
        self.dispatches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Time every kernel of the calls that follow (each in a pass of its own between two
    /// timestamps: slower calls, exact kernel times), or stop and forget the times (`false`).
    /// Fails when the adapter has no timestamp queries.
    pub fn set_profile(&self, on: bool) -> Result<()> {
        let mut prof = self.prof.lock().unwrap_or_else(|e| e.into_inner());
        if !on {
            *prof = None;
            return Ok(());
        }
        if !self
            .gpu
            .device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
        {
            return Err(GpuError::Unsupported(format!(
                "kernel timing on {} (no timestamp queries)",
                self.gpu.info.name
            )));
        }
        let bytes = u64::from(PROFILE_QUERIES) * 8;
        let set = self.gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profile"),
            ty: wgpu::QueryType::Timestamp,
            count: PROFILE_QUERIES,
        });
        let buffer = |usage| {
            self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("profile"),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        *prof = Some(ProfState {
            set,
            resolve: buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            staging: buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
            acc: Profile::default(),
        });
        Ok(())
    }

    /// Each kernel's time per token over the calls profiled since [`GpuModel::set_profile`],
    /// the slowest first.
    pub fn profile(&self) -> Vec<KernelTime> {
        let prof = self.prof.lock().unwrap_or_else(|e| e.into_inner());
        let Some(p) = prof.as_ref() else {
            return Vec::new();
        };
        #[allow(clippy::cast_precision_loss)] // token counts
        let tokens = p.acc.tokens.max(1) as f64;
        let mut v: Vec<KernelTime> = p
            .acc
            .totals
            .iter()
            .map(|(&name, &(ns, count))| KernelTime {
                name,
                us_per_token: ns / 1e3 / tokens,
                #[allow(clippy::cast_precision_loss)]
                per_token: count as f64 / tokens,
            })
            .collect();
        v.sort_by(|a, b| b.us_per_token.total_cmp(&a.us_per_token));
        v
    }

    /// Record one call of `tokens` (≤ max_batch).
    fn record(
        &self,
        rec: &mut Rec<'_>,
        tokens: &[u32],
        cache: &GpuCache,
        out_rows: usize,
        want: GpuOutputs,
    ) -> Result<()> {
        let c = &self.config;
        let kp = &self.gpu.k;
        let a = &self.act;
        let n = tokens.len();
        let n32 = u32_of(n, "tokens")?;

        // 1. h = E[token]: copy each token's stored row, then widen.
        let src = self.embd.as_ref().unwrap_or(&self.head);
        let rb = bytes_of(src.row_bytes)?;
        for (i, &tok) in tokens.iter().enumerate() {
            let id = usize::try_from(tok).map_err(|_| GpuError::Overflow("token id"))?;
            let (ci, r) = (id / src.rows_per_chunk, id % src.rows_per_chunk);
            let buf = src.bufs.get(ci).ok_or(GpuError::TokenOutOfRange {
                id: tok,
                n_vocab: c.n_vocab,
            })?;
            rec.copy(buf, bytes_of(r)? * rb, &a.rows, bytes_of(i)? * rb, rb);
        }
        rec.dispatch("embed", &kp.embed, &self.embed_bind, [n32, 1, 1]);
        let tok_tiles = u32_of(n.div_ceil(TERNARY_TOKENS), "tokens")?;
        // A prompt's I2_S matrices through the tiled GEMM, the rest through the row kernel.
        let gemm_tiles = u32_of(n.div_ceil(GEMM_TOKENS), "tokens")?;
        let lin = |rec: &mut Rec<'_>, name: &'static str, m: &GpuMatrix| -> Result<()> {
            if n >= GEMM_MIN_TOKENS && !m.gemm.is_empty() {
                let rows = u32_of(m.n_out.div_ceil(GEMM_ROWS), "rows")?;
                for b in &m.gemm {
                    rec.dispatch(name, &kp.gemm, b, [rows, gemm_tiles, 1]);
                }
            } else {
                rec.dispatch(
                    name,
                    &kp.ternary,
                    &m.bind,
                    [u32_of(m.n_out, "rows")?, tok_tiles, 1],
                );
            }
            Ok(())
        };
        let heads = u32_of(c.n_head, "n_head")?;
        let rope_heads = u32_of(c.n_head + c.n_head_kv, "n_head")?;
        // A decode step's positions in chunks (attention_split.wgsl).
        let split = attn_split(n, cache.len + n)?;
        for (il, l) in self.layers.iter().enumerate() {
            if self.skip.get(il).copied().unwrap_or(false) {
                continue;
            }
            // A decode step's kernels: Q, K and V in one (fused: the norms in their prologues).
            let mv = l.mv.as_ref().filter(|_| n <= MV_TOKENS).and_then(|m| {
                let (k, g, _) = m.kind.pipelines(kp)?;
                Some(((m, k), g))
            });
            // 1.–2. a = RMS(h); Q, K, V = Lin(W, a)
            if let Some(((m, mv_k), _)) = mv {
                if !m.kind.normed() {
                    rec.dispatch("norm_quant", &kp.norm_quant, &l.norm_attn, [n32, 1, 1]);
                }
                rec.dispatch("mv qkv", mv_k, &m.qkv.0, [m.qkv.1, 1, 1]);
            } else {
                rec.dispatch("norm_quant", &kp.norm_quant, &l.norm_attn, [n32, 1, 1]);
                lin(rec, "ternary q", &l.q)?;
                lin(rec, "ternary k", &l.k)?;
                lin(rec, "ternary v", &l.v)?;
            }
            // 3. RoPE on Q and K, and the new K and V rows into the cache (f16: rounded), in
            // one kernel.
            let rope_kernel = match cache.ty {
                GpuKv::F16 => &kp.rope_f16,
                GpuKv::F32 => &kp.rope_f32,
            };
            let rope = cache
                .rope
                .get(il)
                .ok_or(GpuError::Overflow("block index"))?;
            rec.dispatch("rope+store", rope_kernel, rope, [n32, rope_heads, 1]);
            // 4. O = Attn(Q, K, V)
            let attention = match cache.ty {
                GpuKv::F16 => &kp.attention_f16,
                GpuKv::F32 => &kp.attention_f32,
            };
            rec.dispatch("attention", attention, &cache.attn[il], [heads, n32, split]);
            if split > 1 {
                rec.dispatch(
                    "attention_merge",
                    &kp.attention_merge,
                    &cache.merge,
                    [heads, n32, 1],
                );
            }
            if let Some(((m, mv_k), mv_glu)) = mv {
                // 5.–10. as below (fused: the norms in the kernels' prologues).
                let steps = [
                    (&l.norm_sub, "mv o", mv_k, &m.o),
                    (&l.norm_ffn, "mv gate+up", mv_glu, &m.glu),
                    (&l.norm_ffn_sub, "mv down", mv_k, &m.down),
                ];
                for (norm, name, pipeline, (bind, groups)) in steps {
                    if !m.kind.normed() {
                        rec.dispatch("norm_quant", &kp.norm_quant, norm, [n32, 1, 1]);
                    }
                    rec.dispatch(name, pipeline, bind, [*groups, 1, 1]);
                }
                continue;
            }
            // 5.–6. h += Lin(Wo, RMS(O))
            rec.dispatch("norm_quant", &kp.norm_quant, &l.norm_sub, [n32, 1, 1]);
            lin(rec, "ternary o", &l.o)?;
            // 7.–8. g = act(Lin(Wgate, f)) · Lin(Wup, f), f = RMS(h), in one kernel
            rec.dispatch("norm_quant", &kp.norm_quant, &l.norm_ffn, [n32, 1, 1]);
            if n >= GEMM_MIN_TOKENS && !l.glu.gemm.is_empty() {
                lin(rec, "ternary gate+up", &l.glu)?;
            } else {
                rec.dispatch(
                    "ternary gate+up",
                    &kp.ternary_glu,
                    &l.glu.bind,
                    [u32_of(l.glu.n_out, "rows")?, tok_tiles, 1],
                );
            }
            // 9.–10. h += Lin(Wdown, RMS(g))
            rec.dispatch("norm_quant", &kp.norm_quant, &l.norm_ffn_sub, [n32, 1, 1]);
            lin(rec, "ternary down", &l.down)?;
        }
        if out_rows > 0 {
            let rows = u32_of(out_rows, "rows")?;
            rec.dispatch("rmsnorm", &kp.rmsnorm, &self.final_norm, [rows, 1, 1]);
            let (head, head_rows) = kp.head(true);
            for (chunk_rows, bind) in &self.head_binds {
                let groups = u32_of(chunk_rows.div_ceil(head_rows), "head rows")?;
                rec.dispatch("head", head, bind, [groups, rows, 1]);
            }
            match want {
                GpuOutputs::Greedy => {
                    let groups = u32_of(ARGMAX_GROUPS, "groups")?;
                    rec.dispatch("argmax", &kp.argmax, &self.argmax_bind, [groups, 1, 1]);
                }
                GpuOutputs::Top => {
                    rec.dispatch(
                        "topk",
                        &kp.topk_local,
                        &self.topk_local,
                        [self.topk_groups, 1, 1],
                    );
                    rec.dispatch("topk", &kp.topk_merge, &self.topk_merge, [1, 1, 1]);
                }
                GpuOutputs::Logits(_) => {}
            }
        }
        Ok(())
    }
}

/// The id argmax.wgsl and the top-k kernels give a range that held a NaN or infinite logit;
/// the pair's second word is the lowest such index (common.wgsl's `NONFINITE`).
pub(crate) const NON_FINITE: u32 = 0xffff_fffe;

/// The arg-max over argmax.wgsl's (index, value bits) pairs, one a workgroup in range order:
/// the larger value, the lower index among equal ones; `u32::MAX` where no range had a valid
/// logit. A range that held a NaN or infinite logit makes it [`GpuError::NonFiniteLogit`].
pub(crate) fn best_of_groups(b: &[u8]) -> Result<u32> {
    let mut best = (u32::MAX, f32::NEG_INFINITY);
    let mut bad: Option<u32> = None;
    for p in b.chunks_exact(8) {
        let id = u32::from_le_bytes([p[0], p[1], p[2], p[3]]);
        let bits = u32::from_le_bytes([p[4], p[5], p[6], p[7]]);
        if id == NON_FINITE {
            bad = Some(bad.map_or(bits, |i| i.min(bits)));
            continue;
        }
        let v = f32::from_bits(bits);
        if id != u32::MAX && (best.0 == u32::MAX || v > best.1 || (v == best.1 && id < best.0)) {
            best = (id, v);
        }
    }
    match bad {
        Some(index) => Err(GpuError::NonFiniteLogit { index }),
        None => Ok(best.0),
    }
}

/// The top-k kernels' read-back, (id, logit bits) pairs best first: the candidates, empty
/// slots left out, or [`GpuError::NonFiniteLogit`] when the first pair says the row held a
/// NaN or infinite logit.
pub(crate) fn top_of_pairs(pairs: impl Iterator<Item = (u32, u32)>) -> Result<Vec<(u32, f32)>> {
    let mut out = Vec::new();
    for (id, bits) in pairs {
        if id == NON_FINITE {
            return Err(GpuError::NonFiniteLogit { index: bits });
        }
        if id != u32::MAX {
            out.push((id, f32::from_bits(bits)));
        }
    }
    Ok(out)
}

/// One ternary matrix on the device: 2-bit codes in I2_S order, its scales, and the kernels'
/// `mode` (0: one I2_S tensor scale, 1: TQ2_0 block scales).
pub(crate) struct Codes {
    pub(crate) codes: wgpu::Buffer,
    pub(crate) scales: wgpu::Buffer,
    mode: u32,
}

impl Codes {
    fn nbytes(&self) -> u64 {
        self.codes.size() + self.scales.size()
    }
}

/// A ternary matrix's codes in I2_S order, its scales and mode, ready to upload.
fn prepare_codes<'a>(
    m: &'a TernaryMatrix<'_>,
    il: usize,
) -> Result<(std::borrow::Cow<'a, [u8]>, Vec<f32>, u32)> {
    let (n_out, n_in) = (m.n_out(), m.n_in());
    let (codes, scales, mode) = match m.layout() {
        TernaryLayout::I2S => {
            let beta = m.tensor_scale().ok_or_else(|| {
                GpuError::Unsupported(format!("block {il}: an I2_S matrix without its scale"))
            })?;
            let data = m.packed_data();
            let codes = if m.codes_checked_clean() {
                std::borrow::Cow::Borrowed(data)
            } else {
                std::borrow::Cow::Owned(clean_i2s(data))
            };
            (codes, vec![beta], 0u32)
        }
        TernaryLayout::Tq2_0 => {
            let (codes, scales) = tq2_to_i2s_order(m.packed_data(), n_out, n_in)?;
            (std::borrow::Cow::Owned(codes), scales, 1u32)
        }
        other => {
            return Err(GpuError::Unsupported(format!(
                "{other:?} weights (block {il}; the GPU kernels take I2_S and TQ2_0: \
                 `bitnet convert --to i2_s` writes one)"
            )))
        }
    };
    let expected = mul(n_out, n_in / 4, "codes")?;
    if codes.len() != expected || !n_in.is_multiple_of(128) {
        return Err(GpuError::Shape {
            what: "ternary codes",
            expected,
            got: codes.len(),
        });
    }
    Ok((codes, scales, mode))
}

pub(crate) fn upload_codes(gpu: &Gpu, m: &TernaryMatrix<'_>, il: usize) -> Result<Codes> {
    let (codes, scales, mode) = prepare_codes(m, il)?;
    Ok(Codes {
        codes: gpu.upload("ternary codes", &codes)?,
        scales: gpu.upload("ternary scales", bytemuck::cast_slice(&scales))?,
        mode,
    })
}

/// Matrices with one input (Q, K and V; or one alone) as one buffer of concatenated rows for
/// mv.wgsl, with the prefill kernel's binding of each over its slice of that buffer (or a copy
/// of its own where the slice's offset is not aligned for a binding).
pub(crate) struct Segmented {
    codes: wgpu::Buffer,
    /// mode 0: each matrix's tensor scale; mode 1: every row's block scales
    mv_scales: wgpu::Buffer,
    mode: u32,
    /// the prefill kernel's matrices
    pub(crate) parts: Vec<GpuMatrix>,
    /// rows of each matrix
    rows: Vec<usize>,
    n_in: usize,
    pub(crate) bytes: u64,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn upload_segmented(
    gpu: &Gpu,
    mats: &[&TernaryMatrix<'_>],
    step: &wgpu::Buffer,
    xq: &wgpu::Buffer,
    xs: &wgpu::Buffer,
    outs: &[&wgpu::Buffer],
    il: usize,
    accumulate: bool,
) -> Result<Segmented> {
    let n_in = mats.first().map_or(0, |m| m.n_in());
    let mut all = Vec::new();
    let mut mv_sc = Vec::new();
    let mut cpu = Vec::with_capacity(mats.len());
    let mut mode = None;
    for m in mats {
        if m.n_in() != n_in {
            return Err(GpuError::Shape {
                what: "input width of matrices read together",
                expected: n_in,
                got: m.n_in(),
            });
        }
        let (codes, scales, md) = prepare_codes(m, il)?;
        if mode.is_some_and(|x| x != md) {
            return Err(GpuError::Unsupported(format!(
                "block {il}: Q, K and V in different layouts"
            )));
        }
        mode = Some(md);
        let off = all.len();
        all.extend_from_slice(&codes);
        mv_sc.extend_from_slice(&scales);
        cpu.push((off, codes.len(), scales));
    }
    let codes = gpu.upload("ternary codes", &all)?;
    let mv_scales = gpu.upload("ternary scales", bytemuck::cast_slice(&mv_sc))?;
    let mut bytes = codes.size() + mv_scales.size();
    let align = u64::from(gpu.limits.min_storage_buffer_offset_alignment).max(1);
    let mut parts = Vec::with_capacity(mats.len());
    for ((m, (off, len, scales)), out) in mats.iter().zip(&cpu).zip(outs) {
        let md = mode.unwrap_or(0);
        let sc = gpu.upload("ternary scales", bytemuck::cast_slice(scales))?;
        let dims = ternary_dims(gpu, m, md, u32::from(accumulate))?;
        let (off, len) = (bytes_of(*off)?, bytes_of(*len)?);
        let own;
        let (buf, off, len) = if off % align == 0 {
            (&codes, off, Some(len))
        } else {
            own = upload_codes(gpu, m, il)?;
            bytes += own.codes.size();
            (&own.codes, 0, None)
        };
        let bind_over = |pipeline: &wgpu::ComputePipeline, dims: &wgpu::Buffer| {
            gpu.bind_parts(
                pipeline,
                &[
                    (step, 0, None),
                    (dims, 0, None),
                    (buf, off, len),
                    (&sc, 0, None),
                    (xq, 0, None),
                    (xs, 0, None),
                    (out, 0, None),
                ],
            )
        };
        let bind = bind_over(&gpu.k.ternary, &dims);
        let gemm = if md == 0 {
            vec![bind_over(
                &gpu.k.gemm,
                &gemm_dims(gpu, m, u32::from(accumulate))?,
            )]
        } else {
            Vec::new()
        };
        bytes += sc.size();
        parts.push(GpuMatrix {
            n_out: m.n_out(),
            bind,
            gemm,
        });
    }
    Ok(Segmented {
        codes,
        mv_scales,
        mode: mode.unwrap_or(0),
        parts,
        rows: mats.iter().map(|m| m.n_out()).collect(),
        n_in,
        bytes,
    })
}

impl Segmented {
    /// Bind mv.wgsl over these rows: input rows `x` normed by `nw`, outputs `outs` (one a
    /// matrix; the spare ones are never written), `op` 1 to add into `outs[0]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bind_mv(
        &self,
        gpu: &Gpu,
        step: &wgpu::Buffer,
        (x, nw): (&wgpu::Buffer, &wgpu::Buffer),
        outs: [&wgpu::Buffer; 3],
        op: u32,
        eps: u32,
        kind: MvKind,
    ) -> Result<(wgpu::BindGroup, u32)> {
        let n_out: usize = self.rows.iter().sum();
        let seg1 = self.rows.first().copied().unwrap_or(n_out);
        let seg2 = seg1 + self.rows.get(1).copied().unwrap_or(0);
        let seg2 = if self.rows.len() > 1 { seg2 } else { n_out };
        let dims = gpu.uniform(
            "dims mv",
            &[
                u32_of(self.n_in, "n_in")?,
                u32_of(n_out, "rows")?,
                u32_of(self.n_in / 64, "n_in")?,
                self.mode,
                op,
                eps,
                u32_of(seg1, "rows")?,
                u32_of(seg2, "rows")?,
            ],
        );
        let (pipeline, _, rows) = kind
            .pipelines(&gpu.k)
            .ok_or_else(|| GpuError::Unsupported("the decode kernels on this adapter".into()))?;
        let bind = gpu.bind(
            pipeline,
            &[
                step,
                &dims,
                &self.codes,
                &self.mv_scales,
                x,
                nw,
                outs[0],
                outs[1],
                outs[2],
            ],
        );
        Ok((bind, u32_of(n_out.div_ceil(rows), "rows")?))
    }
}

/// gemm.wgsl's shape and `op` (0 store, 1 add, 2 ReLU²(y)·v, 3 SiLU(y)·v).
fn gemm_dims(gpu: &Gpu, m: &TernaryMatrix<'_>, op: u32) -> Result<wgpu::Buffer> {
    Ok(gpu.uniform(
        "dims gemm",
        &[
            u32_of(m.n_in(), "n_in")?,
            u32_of(m.n_out(), "n_out")?,
            u32_of(m.n_in() / 16, "n_in")?,
            op,
        ],
    ))
}

fn ternary_dims(gpu: &Gpu, m: &TernaryMatrix<'_>, mode: u32, extra: u32) -> Result<wgpu::Buffer> {
    let (n_out, n_in) = (m.n_out(), m.n_in());
    Ok(gpu.uniform(
        "dims ternary",
        &[
            u32_of(n_in, "n_in")?,
            u32_of(n_out, "n_out")?,
            u32_of(n_in / 16, "n_in")?,
            mode,
            extra,
            0,
            0,
            0,
        ],
    ))
}

/// Upload one ternary matrix and bind it between the quantized activations and `out`
/// (`accumulate`: `out += Lin(W, x)`). Returns the matrix and its device bytes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn upload_matrix(
    gpu: &Gpu,
    m: &TernaryMatrix<'_>,
    step: &wgpu::Buffer,
    xq: &wgpu::Buffer,
    xs: &wgpu::Buffer,
    out: &wgpu::Buffer,
    il: usize,
    accumulate: bool,
) -> Result<(GpuMatrix, u64)> {
    let c = upload_codes(gpu, m, il)?;
    let dims = ternary_dims(gpu, m, c.mode, u32::from(accumulate))?;
    let bind = gpu.bind(
        &gpu.k.ternary,
        &[step, &dims, &c.codes, &c.scales, xq, xs, out],
    );
    let gemm = if c.mode == 0 {
        let dims = gemm_dims(gpu, m, u32::from(accumulate))?;
        vec![gpu.bind(
            &gpu.k.gemm,
            &[step, &dims, &c.codes, &c.scales, xq, xs, out],
        )]
    } else {
        Vec::new()
    };
    Ok((
        GpuMatrix {
            n_out: m.n_out(),
            bind,
            gemm,
        },
        c.nbytes(),
    ))
}

/// Upload the gate and up projections and bind the fused kernel that writes
/// `act(gate) · up` into `out` (`act`: 1 ReLU², 2 SiLU); with `mv` (input rows, norm
/// weights, eps) also the decode kernel mv_glu.wgsl, and its workgroups.
#[allow(clippy::too_many_arguments)]
pub(crate) fn upload_glu(
    gpu: &Gpu,
    gate: &TernaryMatrix<'_>,
    up: &TernaryMatrix<'_>,
    step: &wgpu::Buffer,
    xq: &wgpu::Buffer,
    xs: &wgpu::Buffer,
    out: &wgpu::Buffer,
    act: u32,
    il: usize,
    mv: Option<MvInput<'_>>,
) -> Result<(GpuMatrix, Option<MvBind>, u64)> {
    if (gate.n_out(), gate.n_in()) != (up.n_out(), up.n_in()) {
        return Err(GpuError::Shape {
            what: "ffn_up rows",
            expected: gate.n_out(),
            got: up.n_out(),
        });
    }
    let g = upload_codes(gpu, gate, il)?;
    let u = upload_codes(gpu, up, il)?;
    if g.mode != u.mode {
        return Err(GpuError::Unsupported(format!(
            "block {il}: ffn_gate and ffn_up in different layouts"
        )));
    }
    let dims = ternary_dims(gpu, gate, g.mode, act)?;
    let bind = gpu.bind(
        &gpu.k.ternary_glu,
        &[
            step, &dims, &g.codes, &g.scales, &u.codes, &u.scales, xq, xs, out,
        ],
    );
    let mv_bind = match mv.map(|m| (m, m.2.pipelines(&gpu.k))) {
        Some((((x, nw), eps, _), Some((_, pipeline, rows)))) => {
            let (n_out, n_in) = (gate.n_out(), gate.n_in());
            let dims = gpu.uniform(
                "dims mv glu",
                &[
                    u32_of(n_in, "n_in")?,
                    u32_of(n_out, "rows")?,
                    u32_of(n_in / 64, "n_in")?,
                    g.mode,
                    act,
                    eps,
                    u32_of(n_out, "rows")?,
                    u32_of(n_out, "rows")?,
                ],
            );
            Some((
                gpu.bind(
                    pipeline,
                    &[
                        step, &dims, &g.codes, &g.scales, &u.codes, &u.scales, x, nw, out,
                    ],
                ),
                u32_of(n_out.div_ceil(rows), "rows")?,
            ))
        }
        _ => None,
    };
    // The prompt GEMM: the gate into `out`, then the up projection times act(out).
    let gemm = if g.mode == 0 {
        let gd = gemm_dims(gpu, gate, 0)?;
        let ud = gemm_dims(gpu, up, act + 1)?;
        vec![
            gpu.bind(&gpu.k.gemm, &[step, &gd, &g.codes, &g.scales, xq, xs, out]),
            gpu.bind(&gpu.k.gemm, &[step, &ud, &u.codes, &u.scales, xq, xs, out]),
        ]
    } else {
        Vec::new()
    };
    Ok((
        GpuMatrix {
            n_out: gate.n_out(),
            bind,
            gemm,
        },
        mv_bind,
        g.nbytes() + u.nbytes(),
    ))
}

/// mv_in_norm.wgsl's `eps` for an input with no RMSNorm (a NaN's bits, never an eps).
const NO_NORM: u32 = u32::MAX;

/// The norm inputs of blocks without sub-norms: norm_common.wgsl's `plain` dims and the
/// weights (all ones) bound in their place.
#[derive(Debug)]
struct Plain {
    dims_e: wgpu::Buffer,
    dims_ff: wgpu::Buffer,
    ones: wgpu::Buffer,
}

/// A [`GpuModel`] being uploaded piece by piece (see [`GpuModel::builder`]).
#[derive(Debug)]
pub struct GpuBuilder {
    gpu: Gpu,
    config: Config,
    max_batch: usize,
    out_cap: usize,
    step: wgpu::Buffer,
    act: Activations,
    h: wgpu::Buffer,
    g: wgpu::Buffer,
    xq: wgpu::Buffer,
    xs: wgpu::Buffer,
    hn: wgpu::Buffer,
    cand: wgpu::Buffer,
    spare: [wgpu::Buffer; 2],
    dims_e: wgpu::Buffer,
    dims_ff: wgpu::Buffer,
    /// Where the blocks have no sub-norms.
    plain: Option<Plain>,
    eps: u32,
    act_mode: u32,
    /// The decode kernels the blocks are bound to (none: the row kernel).
    mv_kind: Option<MvKind>,
    topk_chunk: usize,
    topk_groups: usize,
    head_ty: u32,
    embd_ty: u32,
    layers: Vec<Option<GpuLayer>>,
    /// The LM head's rows (the embedding's, when they are tied).
    head: RowsUpload,
    /// The embedding's rows, when the LM head is a matrix of its own.
    embd: Option<RowsUpload>,
    output_norm: Option<wgpu::Buffer>,
    /// Blocks to skip (see `Model::skip`).
    pub skip: Vec<bool>,
    bytes: u64,
}

impl GpuBuilder {
    /// Upload block `il`.
    pub fn layer(&mut self, il: usize, l: &Layer<'_>) -> Result<()> {
        let gpu = &self.gpu;
        let kp = &gpu.k;
        let (step, xq, xs, h, g) = (&self.step, &self.xq, &self.xs, &self.h, &self.g);
        let (q, k, v, o) = (&self.act.q, &self.act.k, &self.act.v, &self.act.o);
        let (eps, mv_kind) = (self.eps, self.mv_kind);
        let slot = self
            .layers
            .get(il)
            .ok_or(GpuError::Overflow("block index"))?;
        if slot.is_some() {
            return Err(GpuError::Unsupported(format!("block {il} uploaded twice")));
        }
        let mut weight_bytes = 0u64;
        let mut norm = |w: &[f32], dims: &wgpu::Buffer, x: &wgpu::Buffer, label: &str| {
            let wb = gpu.upload(label, bytemuck::cast_slice(w))?;
            weight_bytes += wb.size();
            let bind = gpu.bind(&kp.norm_quant, &[step, dims, x, &wb, xq, xs]);
            Ok::<_, GpuError>((bind, wb))
        };
        let (norm_attn, w_attn) = norm(&l.attn_norm, &self.dims_e, h, "attn_norm")?;
        let (norm_ffn, w_ffn) = norm(&l.ffn_norm, &self.dims_e, h, "ffn_norm")?;
        // The sub-norms, or (a block without them) the rows quantized as they are: the ones
        // as weights, scale 1 (norm_common.wgsl's `plain`; mv_in_norm.wgsl's NO_NORM eps).
        let missing = |name: &str| GpuError::Unsupported(format!("block {il} without {name}"));
        let mut sub = |w: Option<&[f32]>, ff: bool, x: &wgpu::Buffer, label: &str| {
            let dims = if ff { &self.dims_ff } else { &self.dims_e };
            match (w, &self.plain) {
                (Some(w), None) => {
                    let (bind, wb) = norm(w, dims, x, label)?;
                    Ok((bind, wb, eps))
                }
                (None, Some(p)) => {
                    let dims = if ff { &p.dims_ff } else { &p.dims_e };
                    let bind = gpu.bind(&kp.norm_quant, &[step, dims, x, &p.ones, xq, xs]);
                    Ok((bind, p.ones.clone(), NO_NORM))
                }
                _ => Err(missing(label)),
            }
        };
        let (norm_sub, w_sub, eps_sub) =
            sub(l.attn_sub_norm.as_deref(), false, o, "attn_sub_norm")?;
        let (norm_ffn_sub, w_ffn_sub, eps_ffn_sub) =
            sub(l.ffn_sub_norm.as_deref(), true, g, "ffn_sub_norm")?;
        // Fused: each decode kernel norms its input rows (x, w_norm) itself; else the rows
        // norm_quant quantized (xq, xs) come in.
        let qkv = upload_segmented(
            gpu,
            &[&l.wq, &l.wk, &l.wv],
            step,
            xq,
            xs,
            &[q, k, v],
            il,
            false,
        )?;
        // 6. and 10.: h += Lin(W, ·), added in the kernel.
        let os = upload_segmented(gpu, &[&l.wo], step, xq, xs, &[h], il, true)?;
        let ds = upload_segmented(gpu, &[&l.w_down], step, xq, xs, &[h], il, true)?;
        let (glu, glu_mv, b) = upload_glu(
            gpu,
            &l.w_gate,
            &l.w_up,
            step,
            xq,
            xs,
            g,
            self.act_mode,
            il,
            mv_kind.map(|kind| (mv_input(kind, (h, &w_ffn), (xq, xs)), eps, kind)),
        )?;
        let mat_bytes = b + qkv.bytes + os.bytes + ds.bytes;
        let spare = [&self.spare[0], &self.spare[1]];
        let mv = match (mv_kind, glu_mv) {
            (Some(kind), Some(glu)) => Some(MvLayer {
                kind,
                qkv: qkv.bind_mv(
                    gpu,
                    step,
                    mv_input(kind, (h, &w_attn), (xq, xs)),
                    [q, k, v],
                    0,
                    eps,
                    kind,
                )?,
                o: os.bind_mv(
                    gpu,
                    step,
                    mv_input(kind, (o, &w_sub), (xq, xs)),
                    [h, spare[0], spare[1]],
                    1,
                    eps_sub,
                    kind,
                )?,
                glu,
                down: ds.bind_mv(
                    gpu,
                    step,
                    mv_input(kind, (g, &w_ffn_sub), (xq, xs)),
                    [h, spare[0], spare[1]],
                    1,
                    eps_ffn_sub,
                    kind,
                )?,
            }),
            _ => None,
        };
        let mut parts = qkv.parts.into_iter();
        let (Some(qm), Some(km), Some(vm)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(GpuError::Overflow("Q, K and V"));
        };
        let (Some(om), Some(dm)) = (os.parts.into_iter().next(), ds.parts.into_iter().next())
        else {
            return Err(GpuError::Overflow("O and down"));
        };
        self.bytes += weight_bytes + mat_bytes;
        self.layers[il] = Some(GpuLayer {
            norm_attn,
            q: qm,
            k: km,
            v: vm,
            norm_sub,
            o: om,
            norm_ffn,
            glu,
            norm_ffn_sub,
            down: dm,
            mv,
        });
        Ok(())
    }

    /// Upload the final norm's weights.
    pub fn output_norm(&mut self, w: &[f32]) -> Result<()> {
        if w.len() != self.config.n_embd {
            return Err(GpuError::Shape {
                what: "output norm",
                expected: self.config.n_embd,
                got: w.len(),
            });
        }
        let b = self.gpu.upload("output_norm", bytemuck::cast_slice(w))?;
        self.bytes += b.size();
        self.output_norm = Some(b);
        Ok(())
    }

    /// The next bytes of the token embedding's rows (in file order; any piece sizes).
    pub fn write_embd(&mut self, data: &[u8]) -> Result<()> {
        match &mut self.embd {
            Some(e) => e.write(&self.gpu, data),
            None => self.head.write(&self.gpu, data),
        }
    }

    /// The next bytes of the separate LM head's rows (`output.weight`).
    pub fn write_output(&mut self, data: &[u8]) -> Result<()> {
        if self.embd.is_none() {
            return Err(GpuError::Unsupported(
                "an LM head of its own for a model built with a tied one".to_string(),
            ));
        }
        self.head.write(&self.gpu, data)
    }

    /// The model, once every piece has come.
    pub fn finish(self) -> Result<GpuModel> {
        let GpuBuilder {
            gpu,
            config: c,
            max_batch,
            out_cap,
            step,
            act,
            h,
            hn,
            cand,
            dims_e,
            topk_chunk,
            topk_groups,
            head_ty,
            embd_ty,
            layers,
            head,
            embd,
            output_norm,
            skip,
            bytes,
            ..
        } = self;
        let (e, nv) = (c.n_embd, c.n_vocab);
        let layers = layers
            .into_iter()
            .enumerate()
            .map(|(il, l)| l.ok_or_else(|| GpuError::Unsupported(format!("block {il} never came"))))
            .collect::<Result<Vec<_>>>()?;
        let on = output_norm
            .ok_or_else(|| GpuError::Unsupported("the output norm never came".to_string()))?;
        head.done()?;
        if let Some(e) = &embd {
            e.done()?;
        }
        let (head, embd) = (head.chunks, embd.map(|e| e.chunks));
        let kp = &gpu.k;
        let final_norm = gpu.bind(&kp.rmsnorm, &[&step, &dims_e, &h, &on, &hn]);
        let mut head_binds = Vec::with_capacity(head.bufs.len());
        for (ci, b) in head.bufs.iter().enumerate() {
            let row0 = ci * head.rows_per_chunk;
            let rows = head.rows_per_chunk.min(nv - row0);
            let dims = gpu.uniform(
                "dims head",
                &[
                    u32_of(e, "n_embd")?,
                    u32_of(rows, "head rows")?,
                    u32_of(row0, "head rows")?,
                    u32_of(nv, "n_vocab")?,
                    head_ty,
                    0,
                    0,
                    0,
                ],
            );
            head_binds.push((
                rows,
                gpu.bind(kp.head(true).0, &[&step, &dims, b, &hn, &act.logits]),
            ));
        }
        let dims_nv = gpu.uniform("dims argmax", &[u32_of(nv, "n_vocab")?, 0, 0, 0]);
        let argmax_bind = gpu.bind(&kp.argmax, &[&step, &dims_nv, &act.logits, &act.best]);
        let dims_local = gpu.uniform(
            "dims topk",
            &[u32_of(nv, "n_vocab")?, u32_of(topk_chunk, "n_vocab")?, 0, 0],
        );
        let topk_local = gpu.bind(&kp.topk_local, &[&step, &dims_local, &act.logits, &cand]);
        let dims_merge = gpu.uniform(
            "dims topk merge",
            &[u32_of(topk_groups * TOP_CANDIDATES, "n_vocab")?, 0, 0, 0],
        );
        let topk_merge = gpu.bind(&kp.topk_merge, &[&step, &dims_merge, &cand, &act.top]);
        let embed_dims = gpu.uniform("dims embed", &[u32_of(e, "n_embd")?, embd_ty, 0, 0]);
        let embed_bind = gpu.bind(&kp.embed, &[&step, &embed_dims, &act.rows, &h]);
        gpu.queue.submit(std::iter::empty());
        gpu.wait()?;
        Ok(GpuModel {
            turn: std::sync::Mutex::new(()),
            config: c,
            max_batch,
            out_cap,
            step,
            act,
            layers,
            skip,
            embd,
            head,
            embed_bind,
            final_norm,
            head_binds,
            argmax_bind,
            topk_local,
            topk_merge,
            topk_groups: u32_of(topk_groups, "n_vocab")?,
            bytes,
            dispatches: std::sync::atomic::AtomicU32::new(0),
            submits: std::sync::atomic::AtomicU32::new(0),
            prof: std::sync::Mutex::new(None),
            gpu,
        })
    }
}

/// The shader's code of a row type (F16 0, F32 1).
fn ty_of_type(t: RowType, what: &str) -> Result<u32> {
    match t {
        RowType::F16 => Ok(0),
        RowType::F32 => Ok(1),
        other => Err(GpuError::Unsupported(format!(
            "a {other:?} {what} (F16 or F32 only; load without --lm-head, or convert the file)"
        ))),
    }
}

/// Split an F16/F32 row matrix into buffers of at most `limit` bytes.
pub(crate) fn upload_chunks(
    gpu: &Gpu,
    m: &RowMatrix<'_>,
    limit: u64,
    label: &str,
) -> Result<Chunks> {
    let mut up = RowsUpload::new(gpu, &RowsSpec::of(m), limit, label)?;
    up.write(gpu, m.data())?;
    up.done()?;
    Ok(up.chunks)
}

/// A row matrix (the token embedding, the LM head) before its bytes: what
/// [`GpuModel::builder`] sizes its buffers by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowsSpec {
    pub ty: RowType,
    pub rows: usize,
    /// Bytes of all rows.
    pub bytes: usize,
}

impl RowsSpec {
    /// The spec of a bound matrix.
    pub fn of(m: &RowMatrix<'_>) -> Self {
        RowsSpec {
            ty: m.row_type(),
            rows: m.rows(),
            bytes: m.data().len(),
        }
    }

    fn row_bytes(&self) -> Result<usize> {
        let row_bytes = self.bytes / self.rows.max(1);
        if row_bytes == 0 || !row_bytes.is_multiple_of(4) || row_bytes * self.rows != self.bytes {
            return Err(GpuError::Unsupported(format!(
                "a matrix of {} rows in {} bytes (whole rows of a multiple of 4 bytes are needed)",
                self.rows, self.bytes
            )));
        }
        Ok(row_bytes)
    }
}

/// A row matrix's buffers, filled in order by the bytes of its rows as they come.
#[derive(Debug)]
struct RowsUpload {
    chunks: Chunks,
    /// Bytes written to the buffers so far (a multiple of 4).
    written: u64,
    total: u64,
    /// Up to 3 bytes waiting for the rest of their 4-byte word.
    carry: Vec<u8>,
}

impl RowsUpload {
    fn new(gpu: &Gpu, spec: &RowsSpec, limit: u64, label: &str) -> Result<Self> {
        let row_bytes = spec.row_bytes()?;
        let per = usize::try_from(limit / bytes_of(row_bytes)?)
            .unwrap_or(usize::MAX)
            .min(65_535 * HEAD_ROWS);
        if per == 0 {
            return Err(GpuError::Limit {
                adapter: gpu.info.name.clone(),
                what: "one row of the LM head (bytes)",
                need: bytes_of(row_bytes)?,
                have: limit,
            });
        }
        let mut bufs = Vec::new();
        let mut row = 0;
        while row < spec.rows {
            let n = per.min(spec.rows - row);
            bufs.push(gpu.storage(
                label,
                bytes_of(mul(n, row_bytes, "rows")?)?,
                wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            )?);
            row += n;
        }
        Ok(RowsUpload {
            chunks: Chunks {
                bufs,
                rows_per_chunk: per,
                row_bytes,
            },
            written: 0,
            total: bytes_of(spec.bytes)?,
            carry: Vec::with_capacity(4),
        })
    }

    /// The next `data` bytes of the rows.
    fn write(&mut self, gpu: &Gpu, mut data: &[u8]) -> Result<()> {
        let pending = bytes_of(self.carry.len() + data.len())?;
        if self.written + pending > self.total {
            return Err(GpuError::Shape {
                what: "bytes of a row matrix",
                expected: usize::try_from(self.total).unwrap_or(usize::MAX),
                got: usize::try_from(self.written + pending).unwrap_or(usize::MAX),
            });
        }
        if !self.carry.is_empty() {
            let n = (4 - self.carry.len()).min(data.len());
            self.carry.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.carry.len() < 4 {
                return Ok(());
            }
            let word = std::mem::take(&mut self.carry);
            self.put(gpu, &word)?;
        }
        let whole = data.len() / 4 * 4;
        self.put(gpu, &data[..whole])?;
        self.carry.extend_from_slice(&data[whole..]);
        Ok(())
    }

    /// Write whole words at `written`, across buffer ends.
    fn put(&mut self, gpu: &Gpu, mut data: &[u8]) -> Result<()> {
        let per = bytes_of(self.chunks.rows_per_chunk * self.chunks.row_bytes)?;
        while !data.is_empty() {
            let (ci, at) = (self.written / per, self.written % per);
            let buf = usize::try_from(ci)
                .ok()
                .and_then(|ci| self.chunks.bufs.get(ci))
                .ok_or(GpuError::Overflow("row matrix chunk"))?;
            let room = usize::try_from(buf.size() - at).unwrap_or(usize::MAX);
            let n = room.min(data.len());
            gpu.write(buf, at, &data[..n])?;
            self.written += bytes_of(n)?;
            data = &data[n..];
        }
        Ok(())
    }

    /// Every byte came.
    fn done(&self) -> Result<()> {
        // Rows are whole words (RowsSpec::row_bytes), so a complete matrix leaves no carry.
        let got = self.written + bytes_of(self.carry.len())?;
        if got != self.total {
            return Err(GpuError::Shape {
                what: "bytes of a row matrix",
                expected: usize::try_from(self.total).unwrap_or(usize::MAX),
                got: usize::try_from(got).unwrap_or(usize::MAX),
            });
        }
        Ok(())
    }
}
