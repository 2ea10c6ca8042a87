//! Weights onto the device: ternary codes (I2_S as stored, TQ2_0 re-ordered), their scales,
//! the F16/F32 rows of the embedding and the LM head in chunks a storage binding holds, and
//! the bindings of the matrix kernels over them.

use bitnet_kernels::{RowMatrix, RowType, TernaryLayout, TernaryMatrix};

use crate::device::Gpu;
use crate::kernels::{bytes_of, mul, u32_of, MvKind, HEAD_ROWS, LANES_ROWS};
use crate::{GpuError, Result};

/// One ternary projection on the device.
#[derive(Debug)]
pub(crate) struct GpuMatrix {
    pub(crate) n_out: usize,
    pub(crate) bind: wgpu::BindGroup,
    /// The prompt GEMM's bindings (gemm.wgsl; I2_S only): one, or for the FFN the gate's
    /// then the up projection's.
    pub(crate) gemm: Vec<wgpu::BindGroup>,
}

impl GpuMatrix {
    pub(crate) fn bind(&self) -> &wgpu::BindGroup {
        &self.bind
    }
}

/// The decode kernels' input pair: `normed` (rows, norm weights) when the kernel norms its
/// input, else `quant`.
pub(crate) fn mv_input<'a>(
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

/// Rows of an F16/F32 row matrix (the LM head, the embedding) split into buffers that each
/// fit one storage binding.
#[derive(Debug)]
pub(crate) struct Chunks {
    pub(crate) bufs: Vec<wgpu::Buffer>,
    pub(crate) rows_per_chunk: usize,
    pub(crate) row_bytes: usize,
}

/// I2_S bytes with the never-written code 11 turned into 01 (value 0, as the CPU decodes it).
pub(crate) fn clean_i2s(data: &[u8]) -> Vec<u8> {
    data.iter()
        .map(|&b| b ^ ((b & (b >> 1) & 0x55) << 1))
        .collect()
}

/// TQ2_0 blocks (64 code bytes, least significant pair first, then an f16 d) as I2_S-ordered
/// codes and f32 block scales.
pub(crate) fn tq2_to_i2s_order(
    data: &[u8],
    n_out: usize,
    n_in: usize,
) -> Result<(Vec<u8>, Vec<f32>)> {
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

/// One ternary matrix on the device: 2-bit codes in I2_S order, its scales, and the kernels'
/// `mode` (0: one I2_S tensor scale, 1: TQ2_0 block scales).
pub(crate) struct Codes {
    pub(crate) codes: wgpu::Buffer,
    pub(crate) scales: wgpu::Buffer,
    pub(crate) mode: u32,
}

impl Codes {
    fn nbytes(&self) -> u64 {
        self.codes.size() + self.scales.size()
    }
}

/// A ternary matrix's codes in I2_S order, its scales and mode, ready to upload.
pub(crate) fn prepare_codes<'a>(
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
    pub(crate) codes: wgpu::Buffer,
    /// mode 0: each matrix's tensor scale; mode 1: every row's block scales
    pub(crate) mv_scales: wgpu::Buffer,
    pub(crate) mode: u32,
    /// the prefill kernel's matrices
    pub(crate) parts: Vec<GpuMatrix>,
    /// rows of each matrix
    pub(crate) rows: Vec<usize>,
    pub(crate) n_in: usize,
    pub(crate) bytes: u64,
}

/// The buffers of one block's lane QKV kernel with RoPE and the cache store
/// (mv_out_rope.wgsl) that do not depend on the cache; a cache binds them with its own.
#[derive(Debug)]
pub(crate) struct QkvRope {
    pub(crate) dims: wgpu::Buffer,
    pub(crate) codes: wgpu::Buffer,
    pub(crate) scales: wgpu::Buffer,
    pub(crate) x: wgpu::Buffer,
    pub(crate) nw: wgpu::Buffer,
    pub(crate) q: wgpu::Buffer,
    /// Workgroups of a call.
    pub(crate) groups: u32,
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
                gpu.k.model_gemm(),
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
    /// The decode kernels' shape, modes and segments (mv_common.wgsl's `Dims`) and the rows
    /// of all segments.
    fn mv_dims(&self, gpu: &Gpu, op: u32, eps: u32) -> Result<(wgpu::Buffer, usize)> {
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
        Ok((dims, n_out))
    }

    /// What the lane QKV kernel with RoPE and the cache store (mv_out_rope.wgsl) binds
    /// besides the cache: Q, K and V over input `x` normed with weights `nw`, Q into `q`.
    pub(crate) fn qkv_rope(
        &self,
        gpu: &Gpu,
        (x, nw): (&wgpu::Buffer, &wgpu::Buffer),
        q: &wgpu::Buffer,
        eps: u32,
    ) -> Result<QkvRope> {
        let (dims, n_out) = self.mv_dims(gpu, 0, eps)?;
        Ok(QkvRope {
            dims,
            codes: self.codes.clone(),
            scales: self.mv_scales.clone(),
            x: x.clone(),
            nw: nw.clone(),
            q: q.clone(),
            groups: u32_of(n_out.div_ceil(LANES_ROWS), "rows")?,
        })
    }

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
        let (dims, n_out) = self.mv_dims(gpu, op, eps)?;
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
pub(crate) fn gemm_dims(gpu: &Gpu, m: &TernaryMatrix<'_>, op: u32) -> Result<wgpu::Buffer> {
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

/// The model's prompt GEMM over matrix `m` (codes `c`) with `op`, between the quantized
/// activations `xq`, `xs` and `out`.
fn bind_gemm(
    gpu: &Gpu,
    m: &TernaryMatrix<'_>,
    c: &Codes,
    op: u32,
    step: &wgpu::Buffer,
    (xq, xs, out): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
) -> Result<wgpu::BindGroup> {
    let dims = gemm_dims(gpu, m, op)?;
    Ok(gpu.bind(
        gpu.k.model_gemm(),
        &[step, &dims, &c.codes, &c.scales, xq, xs, out],
    ))
}

pub(crate) fn ternary_dims(
    gpu: &Gpu,
    m: &TernaryMatrix<'_>,
    mode: u32,
    extra: u32,
) -> Result<wgpu::Buffer> {
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
        vec![bind_gemm(
            gpu,
            m,
            &c,
            u32::from(accumulate),
            step,
            (xq, xs, out),
        )?]
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
        vec![
            bind_gemm(gpu, gate, &g, 0, step, (xq, xs, out))?,
            bind_gemm(gpu, up, &u, act + 1, step, (xq, xs, out))?,
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

/// The shader's code of a row type (F16 0, F32 1).
pub(crate) fn ty_of_type(t: RowType, what: &str) -> Result<u32> {
    match t {
        RowType::F16 => Ok(0),
        RowType::F32 => Ok(1),
        other => Err(GpuError::Unsupported(format!(
            "a {other:?} {what} (F16 or F32 only; load without --lm-head, or convert the file)"
        ))),
    }
}

/// The LM head kernels' code of a row type: head.wgsl's F16 0 and F32 1, head_q*.wgsl's
/// Q8_0 2 and Q4_0 3.
pub(crate) fn head_code(t: RowType) -> Result<u32> {
    match t {
        RowType::Q8_0 => Ok(2),
        RowType::Q4_0 => Ok(3),
        RowType::F16 | RowType::F32 => ty_of_type(t, "LM head"),
        other => Err(GpuError::Unsupported(format!(
            "a {other:?} LM head (F16, F32, Q8_0 or Q4_0)"
        ))),
    }
}

/// Whether the head kernels read `t` as quantized blocks (head_q*.wgsl).
pub(crate) fn quantized(t: RowType) -> bool {
    matches!(t, RowType::Q8_0 | RowType::Q4_0)
}

/// Bytes of one `cols`-wide Q8_0 / Q4_0 row as the quantized head kernels read it
/// (head_q_common.wgsl): its codes, then its blocks' f16 scales two a word.
pub(crate) fn quant_row_bytes(t: RowType, cols: usize) -> Result<usize> {
    if !cols.is_multiple_of(32) || !quantized(t) {
        return Err(GpuError::Unsupported(format!(
            "a {t:?} LM head {cols} wide (Q8_0 or Q4_0 rows, a multiple of 32 wide)"
        )));
    }
    let codes = if t == RowType::Q8_0 { cols } else { cols / 2 };
    Ok(codes + (cols / 32).div_ceil(2) * 4)
}

/// The head kernels' layout of one row of ggml Q8_0 / Q4_0 blocks, appended to `out`.
pub(crate) fn append_quant_row(t: RowType, blocks: &[u8], out: &mut Vec<u8>) {
    let bb = t.block_bytes();
    for b in blocks.chunks_exact(bb) {
        out.extend_from_slice(&b[2..]);
    }
    let mut n = 0;
    for b in blocks.chunks_exact(bb) {
        out.extend_from_slice(&b[..2]);
        n += 1;
    }
    if n % 2 == 1 {
        out.extend_from_slice(&[0, 0]);
    }
}

/// Rows re-encoded on their way to the device: an LM head quantized at upload (from F16,
/// BF16 or F32 rows, with bitnet_kernels' quantizer: the CPU's `--lm-head` codes), or Q8_0 /
/// Q4_0 rows put in the head kernels' layout. Source bytes come in any pieces.
#[derive(Debug)]
pub(crate) struct Requant {
    src: RowType,
    dst: RowType,
    cols: usize,
    src_row: usize,
    rows_left: usize,
    /// A source row's first bytes, waiting for the rest.
    pending: Vec<u8>,
    f: Vec<f32>,
    blk: Vec<u8>,
    /// Converted rows not yet written.
    out: Vec<u8>,
}

/// Converted bytes gathered before a write.
const REQUANT_FLUSH: usize = 4 << 20;

impl Requant {
    pub(crate) fn new(src: &RowsSpec, dst: RowType, cols: usize) -> Result<Self> {
        quant_row_bytes(dst, cols)?;
        let direct = src.ty == dst;
        if !direct && !matches!(src.ty, RowType::F16 | RowType::BF16 | RowType::F32) {
            return Err(GpuError::Unsupported(format!(
                "a {:?} LM head quantized to {dst:?} at upload (from F16, BF16 or F32 rows)",
                src.ty
            )));
        }
        let src_row = src.ty.row_bytes(cols).map_err(|e| {
            GpuError::Unsupported(format!("a {:?} LM head {cols} wide: {e}", src.ty))
        })?;
        if src.rows.checked_mul(src_row) != Some(src.bytes) {
            return Err(GpuError::Shape {
                what: "bytes of the LM head",
                expected: src.rows.saturating_mul(src_row),
                got: src.bytes,
            });
        }
        Ok(Requant {
            src: src.ty,
            dst,
            cols,
            src_row,
            rows_left: src.rows,
            pending: Vec::new(),
            f: vec![0.0; if direct { 0 } else { cols }],
            blk: vec![
                0;
                if direct {
                    0
                } else {
                    dst.row_bytes(cols).unwrap_or(0)
                }
            ],
            out: Vec::new(),
        })
    }

    /// Take the next source bytes, handing converted rows to `put` as they gather.
    fn feed(&mut self, mut data: &[u8], put: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        while !data.is_empty() {
            if self.rows_left == 0 {
                return Err(GpuError::Shape {
                    what: "bytes of the LM head",
                    expected: 0,
                    got: data.len(),
                });
            }
            if self.pending.is_empty() && data.len() >= self.src_row {
                let (row, rest) = data.split_at(self.src_row);
                self.convert(row);
                data = rest;
            } else {
                let n = (self.src_row - self.pending.len()).min(data.len());
                self.pending.extend_from_slice(&data[..n]);
                data = &data[n..];
                if self.pending.len() == self.src_row {
                    let row = std::mem::take(&mut self.pending);
                    self.convert(&row);
                    self.pending = row;
                    self.pending.clear();
                }
            }
            if self.out.len() >= REQUANT_FLUSH {
                put(&self.out)?;
                self.out.clear();
            }
        }
        Ok(())
    }

    fn convert(&mut self, row: &[u8]) {
        self.rows_left -= 1;
        if self.src == self.dst {
            append_quant_row(self.dst, row, &mut self.out);
            return;
        }
        bitnet_kernels::rows::dequantize_row_bytes(self.src, row, &mut self.f);
        bitnet_kernels::rows::quantize_row_into(self.dst, &self.f, &mut self.blk);
        append_quant_row(self.dst, &self.blk, &mut self.out);
    }

    /// Every source row came: the last converted rows to `put`.
    fn finish(&mut self, put: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        if self.rows_left != 0 || !self.pending.is_empty() {
            return Err(GpuError::Shape {
                what: "rows of the LM head",
                expected: self.rows_left + usize::from(!self.pending.is_empty()),
                got: 0,
            });
        }
        put(&self.out)?;
        self.out.clear();
        Ok(())
    }

    /// The converted rows' spec (what the device buffers hold).
    pub(crate) fn spec(&self, rows: usize) -> Result<RowsSpec> {
        let rb = quant_row_bytes(self.dst, self.cols)?;
        Ok(RowsSpec {
            ty: self.dst,
            rows,
            bytes: mul(rows, rb, "LM head bytes")?,
        })
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
    up.done(gpu)?;
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

    pub(crate) fn row_bytes(&self) -> Result<usize> {
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
pub(crate) struct RowsUpload {
    pub(crate) chunks: Chunks,
    /// Bytes written to the buffers so far (a multiple of 4).
    pub(crate) written: u64,
    pub(crate) total: u64,
    /// Up to 3 bytes waiting for the rest of their 4-byte word.
    pub(crate) carry: Vec<u8>,
    /// Where the rows are re-encoded on the way (a quantized LM head).
    pub(crate) requant: Option<Requant>,
}

impl RowsUpload {
    pub(crate) fn new(gpu: &Gpu, spec: &RowsSpec, limit: u64, label: &str) -> Result<Self> {
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
            requant: None,
        })
    }

    /// Rows of `src` (`cols` wide) re-encoded as `dst` on their way (a quantized LM head).
    pub(crate) fn requant(
        gpu: &Gpu,
        src: &RowsSpec,
        dst: RowType,
        cols: usize,
        limit: u64,
        label: &str,
    ) -> Result<Self> {
        let rq = Requant::new(src, dst, cols)?;
        let mut up = Self::new(gpu, &rq.spec(src.rows)?, limit, label)?;
        up.requant = Some(rq);
        Ok(up)
    }

    /// The next `data` bytes of the rows (of the source rows, when re-encoded).
    pub(crate) fn write(&mut self, gpu: &Gpu, data: &[u8]) -> Result<()> {
        match self.requant.take() {
            Some(mut rq) => {
                let r = rq.feed(data, &mut |b| self.write_bytes(gpu, b));
                self.requant = Some(rq);
                r
            }
            None => self.write_bytes(gpu, data),
        }
    }

    /// The next bytes as the buffers hold them.
    fn write_bytes(&mut self, gpu: &Gpu, mut data: &[u8]) -> Result<()> {
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
    pub(crate) fn put(&mut self, gpu: &Gpu, mut data: &[u8]) -> Result<()> {
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
    pub(crate) fn done(&mut self, gpu: &Gpu) -> Result<()> {
        if let Some(mut rq) = self.requant.take() {
            rq.finish(&mut |b| self.write_bytes(gpu, b))?;
        }
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
