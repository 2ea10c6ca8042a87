//! Single kernels run on their own, for the tests that compare each one with the CPU's
//! scalar reference (`tests/kernels.rs`). Not a compute API: the model records these same
//! dispatches into one command buffer.

use bitnet_kernels::TernaryMatrix;

/// The GPU tests' gate (CI installs Mesa's software Vulkan driver): true when an adapter is
/// there. Without one it panics, unless `BITNET_GPU_TESTS=skip` says to skip on purpose
/// (then false, with a note), so that no GPU test passes silently for want of a GPU.
#[allow(clippy::panic)]
pub fn gpu_tests_enabled() -> bool {
    if !crate::adapters().is_empty() {
        return true;
    }
    if std::env::var("BITNET_GPU_TESTS").as_deref() == Ok("skip") {
        eprintln!("no GPU adapter; skipped (BITNET_GPU_TESTS=skip)");
        return false;
    }
    panic!(
        "no GPU adapter found. Install a Vulkan driver (Debian: `apt-get install -y \
         mesa-vulkan-drivers libvulkan1`) or set BITNET_GPU_TESTS=skip"
    );
}

use crate::cache::GpuKv;
use crate::device::Gpu;
use crate::kernels::{
    attn_part_len, attn_split, step_words, MvKind, ARGMAX_GROUPS, ATTN_SPLIT_TOKENS, GEMM_ROWS,
    GEMM_TOKENS, TERNARY_TOKENS,
};
use crate::upload::{upload_glu, upload_matrix};
use crate::{GpuError, Result};

fn le_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

fn n32(n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| GpuError::Overflow("probe size"))
}

fn rw(gpu: &Gpu, label: &str, bytes: usize) -> Result<wgpu::Buffer> {
    gpu.storage(
        label,
        u64::try_from(bytes).map_err(|_| GpuError::Overflow("probe size"))?,
        wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
    )
}

fn run(
    gpu: &Gpu,
    pipeline: &wgpu::ComputePipeline,
    bind: &wgpu::BindGroup,
    x: u32,
    y: u32,
) -> Result<()> {
    run3(gpu, pipeline, bind, x, y, 1)
}

fn run3(
    gpu: &Gpu,
    pipeline: &wgpu::ComputePipeline,
    bind: &wgpu::BindGroup,
    x: u32,
    y: u32,
    z: u32,
) -> Result<()> {
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    {
        let mut p = enc.begin_compute_pass(&Default::default());
        p.set_pipeline(pipeline);
        p.set_bind_group(0, bind, &[]);
        p.dispatch_workgroups(x, y, z);
    }
    gpu.queue.submit([enc.finish()]);
    gpu.wait()
}

/// The ternary kernel: `Lin(W, x)` for `scales.len()` int8 rows `xq` (`n × w.n_in()`).
pub fn ternary(gpu: &Gpu, w: &TernaryMatrix<'_>, xq: &[i8], scales: &[f32]) -> Result<Vec<f32>> {
    let n = scales.len();
    let step = gpu.uniform("step", &step_words(n32(n)?, 0, 0, 0, 0));
    let packed: Vec<u8> = xq.iter().map(|&q| q.to_le_bytes()[0]).collect();
    let xqb = gpu.upload("xq", &packed)?;
    let xsb = gpu.upload("xs", bytemuck::cast_slice(scales))?;
    let out = rw(gpu, "out", n * w.n_out() * 4)?;
    let (m, _) = upload_matrix(gpu, w, &step, &xqb, &xsb, &out, 0, false)?;
    let tiles = n32(n.div_ceil(TERNARY_TOKENS))?;
    run(gpu, &gpu.k.ternary, m.bind(), n32(w.n_out())?, tiles)?;
    Ok(le_f32(&gpu.read(&out, u64::from(n32(n * w.n_out() * 4)?))?))
}

/// The prompt GEMM (gemm.wgsl, I2_S) over `y0` (`[rows][n_out]`): `op` 0 `Lin(W, x)`,
/// 1 `y0 + Lin`, 2 `ReLU²(y0)·Lin`, 3 `SiLU(y0)·Lin`; `lanes`: gemm_lanes.wgsl where the
/// adapter has it.
pub fn gemm(
    gpu: &Gpu,
    w: &TernaryMatrix<'_>,
    xq: &[i8],
    scales: &[f32],
    y0: &[f32],
    op: u32,
    lanes: bool,
) -> Result<Vec<f32>> {
    if lanes && gpu.k.gemm_lanes.is_none() {
        return Err(GpuError::Unsupported(format!(
            "the lane kernels on {} (not a CPU device)",
            gpu.info.name
        )));
    }
    let kernel = gpu.k.gemm(lanes);
    let n = scales.len();
    let step = gpu.uniform("step", &step_words(n32(n)?, 0, 0, 0, 0));
    let packed: Vec<u8> = xq.iter().map(|&q| q.to_le_bytes()[0]).collect();
    let xqb = gpu.upload("xq", &packed)?;
    let xsb = gpu.upload("xs", bytemuck::cast_slice(scales))?;
    let out = gpu.upload("out", bytemuck::cast_slice(y0))?;
    let c = crate::upload::upload_codes(gpu, w, 0)?;
    let dims = gpu.uniform(
        "dims",
        &[n32(w.n_in())?, n32(w.n_out())?, n32(w.n_in() / 16)?, op],
    );
    let bind = gpu.bind(
        kernel,
        &[&step, &dims, &c.codes, &c.scales, &xqb, &xsb, &out],
    );
    run(
        gpu,
        kernel,
        &bind,
        n32(w.n_out().div_ceil(GEMM_ROWS))?,
        n32(n.div_ceil(GEMM_TOKENS))?,
    )?;
    Ok(le_f32(&gpu.read(&out, u64::from(n32(n * w.n_out() * 4)?))?))
}

/// The fused FFN kernel: `act(Lin(gate, x)) · Lin(up, x)` (`act`: 1 ReLU², 2 SiLU).
pub fn glu(
    gpu: &Gpu,
    gate: &TernaryMatrix<'_>,
    up: &TernaryMatrix<'_>,
    xq: &[i8],
    scales: &[f32],
    act: u32,
) -> Result<Vec<f32>> {
    let n = scales.len();
    let step = gpu.uniform("step", &step_words(n32(n)?, 0, 0, 0, 0));
    let packed: Vec<u8> = xq.iter().map(|&q| q.to_le_bytes()[0]).collect();
    let xqb = gpu.upload("xq", &packed)?;
    let xsb = gpu.upload("xs", bytemuck::cast_slice(scales))?;
    let out = rw(gpu, "out", n * gate.n_out() * 4)?;
    let (m, _, _) = upload_glu(gpu, gate, up, &step, &xqb, &xsb, &out, act, 0, None)?;
    let tiles = n32(n.div_ceil(TERNARY_TOKENS))?;
    run(gpu, &gpu.k.ternary_glu, m.bind(), n32(gate.n_out())?, tiles)?;
    Ok(le_f32(
        &gpu.read(&out, u64::from(n32(n * gate.n_out() * 4)?))?,
    ))
}

/// `RMS(x, nw)` quantized by norm_quant.wgsl into `xq` and `xs` (for the decode kernels that
/// take quantized rows).
#[allow(clippy::too_many_arguments)]
fn quantize_rows(
    gpu: &Gpu,
    step: &wgpu::Buffer,
    x: &wgpu::Buffer,
    nw: &wgpu::Buffer,
    n: usize,
    width: usize,
    eps: f32,
    lanes: bool,
) -> Result<(wgpu::Buffer, wgpu::Buffer)> {
    let dims = gpu.uniform("dims", &[n32(width)?, eps.to_bits(), 0, 0]);
    let xq = rw(gpu, "xq", n * width)?;
    let xs = rw(gpu, "xs", n * 4)?;
    let kernel = gpu.k.norm_quant(lanes);
    let bind = gpu.bind(kernel, &[step, &dims, x, nw, &xq, &xs]);
    run(gpu, kernel, &bind, n32(n)?, 1)?;
    Ok((xq, xs))
}

/// The decode kernel `kind` (mv.wgsl or mv_rows.wgsl) over `mats` read as one (Q, K, V),
/// each matrix's `Lin` of `RMS(x, nw)` for the `x.len() / n_in` rows: the kernel norms and
/// quantizes them in its prologue, or (`MvKind::Quant`) norm_quant.wgsl does first. With
/// `add_to` (one matrix), `add_to + Lin`. Each matrix's output, `[rows][n_out]`.
pub fn mv(
    gpu: &Gpu,
    mats: &[&TernaryMatrix<'_>],
    x: &[f32],
    nw: &[f32],
    eps: f32,
    add_to: Option<&[f32]>,
    kind: MvKind,
) -> Result<Vec<Vec<f32>>> {
    let n_in = nw.len();
    let n = x.len() / n_in.max(1);
    let step = gpu.uniform("step", &step_words(n32(n)?, 0, 0, 0, 0));
    let xb = gpu.upload("x", bytemuck::cast_slice(x))?;
    let nwb = gpu.upload("nw", bytemuck::cast_slice(nw))?;
    let (xq, xs) = quantize_rows(gpu, &step, &xb, &nwb, n, n_in, eps, false)?;
    let mut outs = Vec::with_capacity(mats.len());
    for m in mats {
        outs.push(match add_to {
            Some(init) => gpu.upload("out", bytemuck::cast_slice(init))?,
            None => rw(gpu, "out", n * m.n_out() * 4)?,
        });
    }
    let refs: Vec<&wgpu::Buffer> = outs.iter().collect();
    let seg =
        crate::upload::upload_segmented(gpu, mats, &step, &xq, &xs, &refs, 0, add_to.is_some())?;
    let spare = [rw(gpu, "spare", 4)?, rw(gpu, "spare", 4)?];
    let pick = |i: usize| refs.get(i).copied().unwrap_or(&spare[i.min(2) - 1]);
    let input = if kind.normed() {
        (&xb, &nwb)
    } else {
        (&xq, &xs)
    };
    let (bind, groups) = seg.bind_mv(
        gpu,
        &step,
        input,
        [refs[0], pick(1), pick(2)],
        u32::from(add_to.is_some()),
        eps.to_bits(),
        kind,
    )?;
    let (pipeline, _, _) = kind
        .pipelines(&gpu.k)
        .ok_or_else(|| GpuError::Unsupported("the decode kernels on this adapter".into()))?;
    run(gpu, pipeline, &bind, groups, 1)?;
    outs.iter()
        .zip(mats)
        .map(|(o, m)| Ok(le_f32(&gpu.read(o, u64::from(n32(n * m.n_out() * 4)?))?)))
        .collect()
}

/// The decode FFN kernel `kind` (mv_glu.wgsl or mv_glu_rows.wgsl):
/// `act(Lin(gate, f)) · Lin(up, f)`, f = RMS(x, nw) quantized in its prologue or
/// (`MvKind::Quant`) by norm_quant.wgsl first (`act`: 1 ReLU², 2 SiLU).
#[allow(clippy::too_many_arguments)]
pub fn mv_glu(
    gpu: &Gpu,
    gate: &TernaryMatrix<'_>,
    up: &TernaryMatrix<'_>,
    x: &[f32],
    nw: &[f32],
    eps: f32,
    act: u32,
    kind: MvKind,
) -> Result<Vec<f32>> {
    let n_in = nw.len();
    let n = x.len() / n_in.max(1);
    let step = gpu.uniform("step", &step_words(n32(n)?, 0, 0, 0, 0));
    let xb = gpu.upload("x", bytemuck::cast_slice(x))?;
    let nwb = gpu.upload("nw", bytemuck::cast_slice(nw))?;
    let (xq, xs) = quantize_rows(gpu, &step, &xb, &nwb, n, n_in, eps, false)?;
    let out = rw(gpu, "out", n * gate.n_out() * 4)?;
    let (_, mv, _) = upload_glu(
        gpu,
        gate,
        up,
        &step,
        &xq,
        &xs,
        &out,
        act,
        0,
        Some((
            if kind.normed() {
                (&xb, &nwb)
            } else {
                (&xq, &xs)
            },
            eps.to_bits(),
            kind,
        )),
    )?;
    let ((bind, groups), Some((_, pipeline, _))) = (
        mv.ok_or_else(|| GpuError::Unsupported("the decode kernels on this adapter".into()))?,
        kind.pipelines(&gpu.k),
    ) else {
        return Err(GpuError::Unsupported(
            "the decode kernels on this adapter".into(),
        ));
    };
    run(gpu, pipeline, &bind, groups, 1)?;
    Ok(le_f32(
        &gpu.read(&out, u64::from(n32(n * gate.n_out() * 4)?))?,
    ))
}

/// RMSNorm fused with the int8 quantization over `n` rows of `width`: codes and scales.
/// `lanes`: the lane adapters' kernel (workgroups of 32; an error elsewhere).
pub fn norm_quant(
    gpu: &Gpu,
    x: &[f32],
    w: &[f32],
    eps: f32,
    lanes: bool,
) -> Result<(Vec<i8>, Vec<f32>)> {
    if lanes && gpu.k.norm_quant_lanes.is_none() {
        return Err(GpuError::Unsupported(format!(
            "the lane kernels on {} (not a CPU device)",
            gpu.info.name
        )));
    }
    let width = w.len();
    let n = x.len() / width.max(1);
    let step = gpu.uniform("step", &step_words(n32(n)?, 0, 0, 0, 0));
    let xb = gpu.upload("x", bytemuck::cast_slice(x))?;
    let wb = gpu.upload("w", bytemuck::cast_slice(w))?;
    let (xq, xs) = quantize_rows(gpu, &step, &xb, &wb, n, width, eps, lanes)?;
    let codes = gpu
        .read(&xq, u64::from(n32(n * width)?))?
        .into_iter()
        .map(|b| i8::from_le_bytes([b]))
        .collect();
    let scales = le_f32(&gpu.read(&xs, u64::from(n32(n * 4)?))?);
    Ok((codes, scales))
}

/// Shape of an attention probe.
#[derive(Debug, Clone, Copy)]
pub struct AttnProbe {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Position of the first query row (the cache holds `pos0 + n` rows).
    pub pos0: usize,
    /// Query rows.
    pub n: usize,
    /// A call of at most 4 rows splits its positions over workgroups (false: the lane
    /// kernels' adapters, where it never does).
    pub split: bool,
    /// Rows of other sequences in front of the call's in Q and O (a batched step's
    /// sequence), filled with NaN.
    pub row0: usize,
}

/// The attention kernel: `q` is `n × n_head × head_dim`, `k`/`v` hold `pos0 + n` rows of
/// `n_head_kv × head_dim`, stored as a cache of `kv` stores them (f16: rounded to nearest
/// even; Q8_0: quantized per 32). A call of few rows splits its positions over workgroups
/// and merges them, as the model's calls do.
pub fn attention(
    gpu: &Gpu,
    s: AttnProbe,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    kv: GpuKv,
) -> Result<Vec<f32>> {
    let step = gpu.uniform(
        "step",
        &step_words(n32(s.n)?, n32(s.pos0)?, 0, 0, n32(s.row0)?),
    );
    let split_tokens = if s.split { ATTN_SPLIT_TOKENS } else { 0 };
    #[allow(clippy::cast_precision_loss)] // head sizes are small integers
    let scale = 1.0f32 / (s.head_dim as f32).sqrt();
    let dims = gpu.uniform(
        "dims",
        &[
            n32(s.n_head)?,
            n32(s.n_head_kv)?,
            n32(s.head_dim)?,
            scale.to_bits(),
            n32(split_tokens)?,
            0,
            0,
            0,
        ],
    );
    let pad = s.row0 * s.n_head * s.head_dim;
    let q: Vec<f32> = std::iter::repeat_n(f32::NAN, pad)
        .chain(q.iter().copied())
        .collect();
    let qb = gpu.upload("q", bytemuck::cast_slice(&q))?;
    let kvw = s.n_head_kv * s.head_dim;
    let kb = gpu.upload("k", &kv.encode(k, kvw)?)?;
    let vb = gpu.upload("v", &kv.encode(v, kvw)?)?;
    let pipeline = gpu.k.for_cache(kv).1;
    let out = rw(gpu, "o", q.len() * 4)?;
    let part = rw(gpu, "part", attn_part_len(s.n_head, s.head_dim)? * 4)?;
    let bind = gpu.bind(pipeline, &[&step, &dims, &qb, &kb, &vb, &out, &part]);
    let split = attn_split(s.n, s.pos0 + s.n, split_tokens)?;
    run3(gpu, pipeline, &bind, n32(s.n_head)?, n32(s.n)?, split)?;
    if split > 1 {
        let merge = &gpu.k.attention_merge;
        let bind = gpu.bind(merge, &[&step, &dims, &part, &out]);
        run(gpu, merge, &bind, n32(s.n_head)?, n32(s.n)?)?;
    }
    let mut o = le_f32(&gpu.read(&out, u64::from(n32(q.len() * 4)?))?);
    Ok(o.split_off(pad))
}

/// The two top-k passes over one row of `logits`: the [`crate::TOP_CANDIDATES`] most likely
/// `(id, logit)` pairs, best first, empty slots left out; a NaN or infinite logit is
/// [`crate::GpuError::NonFiniteLogit`].
pub fn top_k(gpu: &Gpu, logits: &[f32]) -> Result<Vec<(u32, f32)>> {
    let nv = logits.len();
    let k = crate::TOP_CANDIDATES;
    let chunk = nv.div_ceil(256).next_multiple_of(256).max(256);
    let groups = nv.div_ceil(chunk);
    let step = gpu.uniform("step", &step_words(1, 0, 0, 1, 0));
    let lb = gpu.upload("logits", bytemuck::cast_slice(logits))?;
    let cand = rw(gpu, "cand", groups * k * 8)?;
    let top = rw(gpu, "top", k * 8)?;
    let d1 = gpu.uniform("dims", &[n32(nv)?, n32(chunk)?, 0, 0]);
    let d2 = gpu.uniform("dims", &[n32(groups * k)?, 0, 0, 0]);
    let b1 = gpu.bind(&gpu.k.topk_local, &[&step, &d1, &lb, &cand]);
    let b2 = gpu.bind(&gpu.k.topk_merge, &[&step, &d2, &cand, &top]);
    run(gpu, &gpu.k.topk_local, &b1, n32(groups)?, 1)?;
    run(gpu, &gpu.k.topk_merge, &b2, 1, 1)?;
    let raw = gpu.read(&top, u64::from(n32(k * 8)?))?;
    crate::model::top_of_pairs(raw.chunks_exact(8).map(|p| {
        (
            u32::from_le_bytes([p[0], p[1], p[2], p[3]]),
            u32::from_le_bytes([p[4], p[5], p[6], p[7]]),
        )
    }))
}

/// The final norm: each `w.len()`-row of `x` RMS-normed.
pub fn rmsnorm(gpu: &Gpu, x: &[f32], w: &[f32], eps: f32) -> Result<Vec<f32>> {
    let n = x.len() / w.len().max(1);
    let step = gpu.uniform("step", &step_words(n32(n)?, 0, 0, n32(n)?, 0));
    let dims = gpu.uniform("dims", &[n32(w.len())?, eps.to_bits(), 0, 0]);
    let xb = gpu.upload("x", bytemuck::cast_slice(x))?;
    let wb = gpu.upload("w", bytemuck::cast_slice(w))?;
    let y = rw(gpu, "y", x.len() * 4)?;
    let bind = gpu.bind(&gpu.k.rmsnorm, &[&step, &dims, &xb, &wb, &y]);
    run(gpu, &gpu.k.rmsnorm, &bind, n32(n)?, 1)?;
    Ok(le_f32(&gpu.read(&y, u64::from(n32(x.len() * 4)?))?))
}

/// The final norm for a quantized head (rmsnorm_q8.wgsl): each `w.len()`-row of `x`
/// RMS-normed, then quantized per 32 to Q8_0: the codes and each block's scale.
pub fn rmsnorm_q8(gpu: &Gpu, x: &[f32], w: &[f32], eps: f32) -> Result<(Vec<i8>, Vec<f32>)> {
    let n = x.len() / w.len().max(1);
    let step = gpu.uniform("step", &step_words(n32(n)?, 0, 0, n32(n)?, 0));
    let dims = gpu.uniform("dims", &[n32(w.len())?, eps.to_bits(), 0, 0]);
    let xb = gpu.upload("x", bytemuck::cast_slice(x))?;
    let wb = gpu.upload("w", bytemuck::cast_slice(w))?;
    let yq = rw(gpu, "codes", x.len())?;
    let yd = rw(gpu, "scales", (x.len() / 32).max(1) * 4)?;
    let k = &gpu.k.rmsnorm_q8;
    let bind = gpu.bind(k, &[&step, &dims, &xb, &wb, &yq, &yd]);
    run(gpu, k, &bind, n32(n)?, 1)?;
    let q = gpu.read(&yq, u64::from(n32(x.len())?))?;
    let d = le_f32(&gpu.read(&yd, u64::from(n32(x.len() / 32 * 4)?))?);
    Ok((q.into_iter().map(|b| i8::from_le_bytes([b])).collect(), d))
}

/// The quantized LM head (head_q.wgsl, or head_q_lanes.wgsl with `lanes`): `m`'s rows
/// (Q8_0 or Q4_0, or F16/F32 quantized to `ty` as the model's upload does, in chunks of at
/// most `chunk_bytes`) against `rows` activation rows given as Q8_0 codes `xq` and scales
/// `xd` (`quantize_q8_0_split`'s). Logits `[rows][m.rows()]`.
#[allow(clippy::too_many_arguments)]
pub fn head_q(
    gpu: &Gpu,
    m: &bitnet_kernels::RowMatrix<'_>,
    ty: bitnet_kernels::RowType,
    xq: &[i8],
    xd: &[f32],
    rows: usize,
    chunk_bytes: u64,
    lanes: bool,
) -> Result<Vec<f32>> {
    if lanes && gpu.k.head_q_lanes.is_none() {
        return Err(GpuError::Unsupported(format!(
            "the lane kernels on {} (not a CPU device)",
            gpu.info.name
        )));
    }
    let code = crate::upload::head_code(ty)?;
    let (kernel, per_group, rows_per_group) = gpu.k.head_q(lanes, code);
    let spec = crate::upload::RowsSpec::of(m);
    let mut up = crate::upload::RowsUpload::requant(gpu, &spec, ty, m.cols(), chunk_bytes, "head")?;
    up.write(gpu, m.data())?;
    up.done(gpu)?;
    let ch = up.chunks;
    let nv = m.rows();
    let step = gpu.uniform("step", &step_words(n32(rows)?, 0, 0, n32(rows)?, 0));
    let bytes: Vec<u8> = xq.iter().map(|&v| v.to_le_bytes()[0]).collect();
    let qb = gpu.upload("codes", &bytes)?;
    let db = gpu.upload("scales", bytemuck::cast_slice(xd))?;
    let shape = HeadShape {
        nv,
        cols: m.cols(),
        code,
        rows,
        groups: (per_group, rows_per_group),
    };
    head_chunks(gpu, kernel, &ch, shape, |dims, b, out| {
        gpu.bind(kernel, &[&step, dims, b, &qb, out, &db])
    })
}

/// Shape of a RoPE probe.
#[derive(Debug, Clone, Copy)]
pub struct RopeProbe {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub base: f32,
    pub pos0: usize,
    pub n: usize,
    /// NeoX (`bitnet*`) or the normal pairwise form (`llama`).
    pub style: bitnet_model::RopeStyle,
    /// Rows of other sequences in front of the call's in Q, K and V (a batched step's
    /// sequence), filled with NaN: left as they are and never stored.
    pub row0: usize,
}

/// RoPE in place on `n` rows of Q and K at positions `pos0..`, and K and V stored into a
/// cache of type `cache` at those positions, in one kernel: returns q, k, and the cache's
/// rows of K and V at those positions (decoded to f32).
pub fn rope(
    gpu: &Gpu,
    s: RopeProbe,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    cache: GpuKv,
) -> Result<RopeOut> {
    let n_ctx = s.pos0 + s.n;
    let half = s.n_rot / 2;
    let mut table = vec![0f32; n_ctx * half * 2];
    let (cos, sin) = table.split_at_mut(n_ctx * half);
    for p in 0..n_ctx {
        let r = bitnet_model::numerics::rope_row(p, s.n_rot, s.base);
        cos[p * half..(p + 1) * half].copy_from_slice(&r.cos);
        sin[p * half..(p + 1) * half].copy_from_slice(&r.sin);
    }
    let step = gpu.uniform(
        "step",
        &step_words(n32(s.n)?, n32(s.pos0)?, 0, 0, n32(s.row0)?),
    );
    let dims = gpu.uniform(
        "dims",
        &[
            n32(s.n_head)?,
            n32(s.n_head_kv)?,
            n32(s.head_dim)?,
            n32(half)?,
            u32::from(s.style == bitnet_model::RopeStyle::Norm),
            0,
            0,
            0,
        ],
    );
    let ctx = gpu.uniform("ctx", &[n32(n_ctx)?, 0, 0, 0]);
    let padded = |x: &[f32], heads: usize| -> Vec<f32> {
        std::iter::repeat_n(f32::NAN, s.row0 * heads * s.head_dim)
            .chain(x.iter().copied())
            .collect()
    };
    let (qp, kp) = (
        s.row0 * s.n_head * s.head_dim,
        s.row0 * s.n_head_kv * s.head_dim,
    );
    let qb = gpu.upload("q", bytemuck::cast_slice(&padded(q, s.n_head)))?;
    let kb = gpu.upload("k", bytemuck::cast_slice(&padded(k, s.n_head_kv)))?;
    let tb = gpu.upload("table", bytemuck::cast_slice(&table))?;
    let vb = gpu.upload("v", bytemuck::cast_slice(&padded(v, s.n_head_kv)))?;
    let kv = s.n_head_kv * s.head_dim;
    let row = cache.row_bytes(kv);
    let kc = rw(gpu, "cache k", n_ctx * row)?;
    let vc = rw(gpu, "cache v", n_ctx * row)?;
    let kernel = gpu.k.for_cache(cache).0;
    let bind = gpu.bind(kernel, &[&step, &dims, &qb, &kb, &tb, &ctx, &vb, &kc, &vc]);
    run(gpu, kernel, &bind, n32(s.n)?, n32(s.n_head + s.n_head_kv)?)?;
    // The cache rows at pos0.., decoded.
    let rows = |b: &wgpu::Buffer| -> Result<Vec<f32>> {
        let all = gpu.read(b, u64::from(n32(n_ctx * row)?))?;
        Ok(cache.decode(&all[s.pos0 * row..], kv))
    };
    let back = |b: &wgpu::Buffer, pad: usize, len: usize| -> Result<Vec<f32>> {
        let mut all = le_f32(&gpu.read(b, u64::from(n32((pad + len) * 4)?))?);
        let rest = all.split_off(pad);
        // The other sequences' rows stay as they were.
        if all.iter().any(|x| !x.is_nan()) {
            return Err(GpuError::Shape {
                what: "rows in front of the call (written)",
                expected: 0,
                got: all.iter().filter(|x| !x.is_nan()).count(),
            });
        }
        Ok(rest)
    };
    Ok(RopeOut {
        q: back(&qb, qp, q.len())?,
        k: back(&kb, kp, k.len())?,
        cache_k: rows(&kc)?,
        cache_v: rows(&vc)?,
    })
}

/// What [`rope`] returns.
#[derive(Debug)]
pub struct RopeOut {
    /// Q and K rotated in place.
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    /// The cache's K and V rows at the call's positions.
    pub cache_k: Vec<f32>,
    pub cache_v: Vec<f32>,
}

/// The LM head over an F16 or F32 row matrix, split into buffers of at most `chunk_bytes`:
/// logits (`rows × m.rows()`) of `rows` hidden states `hn`. `lanes`: head_lanes.wgsl, the
/// kernel of adapters that run invocations as SIMD lanes (an error elsewhere); else
/// head.wgsl.
pub fn head(
    gpu: &Gpu,
    m: &bitnet_kernels::RowMatrix<'_>,
    hn: &[f32],
    rows: usize,
    chunk_bytes: u64,
    lanes: bool,
) -> Result<Vec<f32>> {
    let (kernel, per_group, rows_per_group) = gpu.k.head(lanes);
    if lanes && gpu.k.head_lanes.is_none() {
        return Err(GpuError::Unsupported(format!(
            "the lane kernels on {} (not a CPU device)",
            gpu.info.name
        )));
    }
    let ty = crate::upload::ty_of(m, "head")?;
    let ch = crate::upload::upload_chunks(gpu, m, chunk_bytes, "head")?;
    let nv = m.rows();
    let step = gpu.uniform("step", &step_words(n32(rows)?, 0, 0, n32(rows)?, 0));
    let hb = gpu.upload("hn", bytemuck::cast_slice(hn))?;
    let shape = HeadShape {
        nv,
        cols: m.cols(),
        code: ty,
        rows,
        groups: (per_group, rows_per_group),
    };
    head_chunks(gpu, kernel, &ch, shape, |dims, b, out| {
        gpu.bind(kernel, &[&step, dims, b, &hb, out])
    })
}

/// A head probe's call: the head's rows and hidden size, the kernels' row-type code, the
/// output rows, and the head rows and output rows a workgroup takes.
struct HeadShape {
    nv: usize,
    cols: usize,
    code: u32,
    rows: usize,
    groups: (usize, usize),
}

/// A head kernel over each chunk of `ch` (bound by `bind(dims, chunk, logits)`): the logits.
fn head_chunks(
    gpu: &Gpu,
    kernel: &wgpu::ComputePipeline,
    ch: &crate::upload::Chunks,
    s: HeadShape,
    bind: impl Fn(&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer) -> wgpu::BindGroup,
) -> Result<Vec<f32>> {
    let nv = s.nv;
    let out = rw(gpu, "logits", s.rows * nv * 4)?;
    for (ci, b) in ch.bufs.iter().enumerate() {
        let row0 = ci * ch.rows_per_chunk;
        let n = ch.rows_per_chunk.min(nv - row0);
        let dims = gpu.uniform(
            "dims",
            &[n32(s.cols)?, n32(n)?, n32(row0)?, n32(nv)?, s.code, 0, 0, 0],
        );
        run(
            gpu,
            kernel,
            &bind(&dims, b, &out),
            n32(n.div_ceil(s.groups.0))?,
            n32(s.rows.div_ceil(s.groups.1))?,
        )?;
    }
    Ok(le_f32(&gpu.read(&out, u64::from(n32(s.rows * nv * 4)?))?))
}

/// The embedding lookup: rows `ids` of an F16 or F32 row matrix (split into buffers of at
/// most `chunk_bytes`), copied on the device and widened to f32.
pub fn embed(
    gpu: &Gpu,
    m: &bitnet_kernels::RowMatrix<'_>,
    ids: &[u32],
    chunk_bytes: u64,
) -> Result<Vec<f32>> {
    let ty = crate::upload::ty_of(m, "embedding")?;
    let ch = crate::upload::upload_chunks(gpu, m, chunk_bytes, "embedding")?;
    let n = ids.len();
    let e = m.cols();
    let step = gpu.uniform("step", &step_words(n32(n)?, 0, 0, 0, 0));
    let dims = gpu.uniform("dims", &[n32(e)?, ty, 0, 0]);
    let rows = rw(gpu, "rows", n * ch.row_bytes)?;
    let h = rw(gpu, "h", n * e * 4)?;
    let bind = gpu.bind(&gpu.k.embed, &[&step, &dims, &rows, &h]);
    let rb = u64::from(n32(ch.row_bytes)?);
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    for (i, &id) in (0u64..).zip(ids) {
        let id = usize::try_from(id).map_err(|_| GpuError::Overflow("token id"))?;
        let (c, r) = (id / ch.rows_per_chunk, id % ch.rows_per_chunk);
        let buf = ch.bufs.get(c).ok_or(GpuError::Overflow("token id"))?;
        enc.copy_buffer_to_buffer(buf, u64::from(n32(r)?) * rb, &rows, i * rb, rb);
    }
    {
        let mut p = enc.begin_compute_pass(&Default::default());
        p.set_pipeline(&gpu.k.embed);
        p.set_bind_group(0, &bind, &[]);
        p.dispatch_workgroups(n32(n)?, 1, 1);
    }
    gpu.queue.submit([enc.finish()]);
    gpu.wait()?;
    Ok(le_f32(&gpu.read(&h, u64::from(n32(n * e * 4)?))?))
}

/// The greedy argmax over one row of `logits` (a NaN or infinite logit:
/// [`crate::GpuError::NonFiniteLogit`]).
pub fn argmax(gpu: &Gpu, logits: &[f32]) -> Result<u32> {
    argmax_rows(gpu, logits, 1)?
        .pop()
        .ok_or(GpuError::Overflow("argmax rows"))
}

/// The greedy argmax of each of the `rows` rows of `logits` in one dispatch, as a batched
/// step takes its sequences' tokens.
pub fn argmax_rows(gpu: &Gpu, logits: &[f32], rows: usize) -> Result<Vec<u32>> {
    let nv = logits.len() / rows.max(1);
    let step = gpu.uniform("step", &step_words(n32(rows)?, 0, 0, n32(rows)?, 0));
    let dims = gpu.uniform("dims", &[n32(nv)?, 0, 0, 0]);
    let lb = gpu.upload("logits", bytemuck::cast_slice(logits))?;
    let groups = ARGMAX_GROUPS;
    let best = rw(gpu, "best", rows * groups * 8)?;
    let bind = gpu.bind(&gpu.k.argmax, &[&step, &dims, &lb, &best]);
    run(gpu, &gpu.k.argmax, &bind, n32(groups)?, n32(rows)?)?;
    let b = gpu.read(&best, u64::from(n32(rows * groups * 8)?))?;
    b.chunks(groups * 8)
        .map(crate::model::best_of_groups)
        .collect()
}
