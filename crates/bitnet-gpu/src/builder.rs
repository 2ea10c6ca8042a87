//! Building a [`GpuModel`]: the device opened, the activation buffers made, then each block,
//! the final norm and the embedding and LM head rows uploaded through a [`GpuBuilder`].

use bitnet_model::{Activation, Config, Layer, Model};

use crate::device::Gpu;
use crate::kernels::{
    bytes_of, mul, step_words, u32_of, MvKind, ARGMAX_GROUPS, MAX_HEAD_DIM, MV_MAX_IN, TOPK_CHUNK,
    TOPK_GROUPS, TOP_CANDIDATES,
};
use crate::model::{
    check_architecture, Activations, DecodeKernels, GpuLayer, GpuModel, GpuOptions, MvLayer,
};
use crate::upload::{
    head_code, mv_input, quantized, ty_of_type, upload_glu, upload_segmented, RowsSpec, RowsUpload,
};
use crate::{GpuError, Result};

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
        // The head as the kernels read it: the file's rows, or quantized at upload.
        let head_target = opts.head.unwrap_or(head_spec.ty);
        let head_quant = quantized(head_target);
        if !head_quant && head_target != head_spec.ty {
            return Err(GpuError::Unsupported(format!(
                "an LM head of {:?} rows converted to {head_target:?} (Q8_0 or Q4_0 only)",
                head_spec.ty
            )));
        }
        let head_ty = head_code(head_target)?;
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
        // A quantized head's input: the normed rows' codes and scales (rmsnorm_q8.wgsl).
        let head_in = if head_quant {
            Some([
                buf("hn codes", bytes_of(mul(out_cap, e, "rows")?)?)?,
                buf("hn scales", f32s(out_cap * (e / 32).max(1))?)?,
            ])
        } else {
            None
        };
        let logits = buf("logits", f32s(mul(out_cap, nv, "logits")?)?)?;
        // An arg-max row for each sequence of a batched step.
        let best = buf("best", bytes_of(mul(out_cap, ARGMAX_GROUPS * 8, "rows")?)?)?;
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
        let best_staging = staging(
            "best staging",
            bytes_of(mul(out_cap, ARGMAX_GROUPS * 8, "rows")?)?,
        );
        let top_staging = staging("top staging", top_bytes);
        let step = gpu.uniform("step", &step_words(0, 0, 0, 0, 0));

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
            // check_architecture refused it above.
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
        let head = if head_quant {
            RowsUpload::requant(&gpu, head_spec, head_target, e, chunk_limit, "lm head")?
        } else {
            RowsUpload::new(&gpu, head_spec, chunk_limit, "lm head")?
        };
        bytes += head.chunks.bufs.iter().map(wgpu::Buffer::size).sum::<u64>();
        // A tied head quantized for the device leaves the embedding its own rows.
        let tied = output.is_none();
        let embd_up = if !tied || head_quant {
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
            head_in,
            tied,
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
}

/// mv_in_norm.wgsl's `eps` for an input with no RMSNorm (a NaN's bits, never an eps).
pub(crate) const NO_NORM: u32 = u32::MAX;

/// The norm inputs of blocks without sub-norms: norm_common.wgsl's `plain` dims and the
/// weights (all ones) bound in their place.
#[derive(Debug)]
pub(crate) struct Plain {
    pub(crate) dims_e: wgpu::Buffer,
    pub(crate) dims_ff: wgpu::Buffer,
    pub(crate) ones: wgpu::Buffer,
}

/// A [`GpuModel`] being uploaded piece by piece (see [`GpuModel::builder`]).
#[derive(Debug)]
pub struct GpuBuilder {
    pub(crate) gpu: Gpu,
    pub(crate) config: Config,
    pub(crate) max_batch: usize,
    pub(crate) out_cap: usize,
    pub(crate) step: wgpu::Buffer,
    pub(crate) act: Activations,
    pub(crate) h: wgpu::Buffer,
    pub(crate) g: wgpu::Buffer,
    pub(crate) xq: wgpu::Buffer,
    pub(crate) xs: wgpu::Buffer,
    pub(crate) hn: wgpu::Buffer,
    pub(crate) cand: wgpu::Buffer,
    pub(crate) spare: [wgpu::Buffer; 2],
    pub(crate) dims_e: wgpu::Buffer,
    pub(crate) dims_ff: wgpu::Buffer,
    /// Where the blocks have no sub-norms.
    pub(crate) plain: Option<Plain>,
    pub(crate) eps: u32,
    pub(crate) act_mode: u32,
    /// The decode kernels the blocks are bound to (none: the row kernel).
    pub(crate) mv_kind: Option<MvKind>,
    pub(crate) topk_chunk: usize,
    pub(crate) topk_groups: usize,
    pub(crate) head_ty: u32,
    /// A quantized head's input codes and scales.
    pub(crate) head_in: Option<[wgpu::Buffer; 2]>,
    /// The embedding is the head's matrix (its bytes come through `write_embd` only).
    pub(crate) tied: bool,
    pub(crate) embd_ty: u32,
    pub(crate) layers: Vec<Option<GpuLayer>>,
    /// The LM head's rows (the embedding's, when they are tied).
    pub(crate) head: RowsUpload,
    /// The embedding's rows, when the LM head is a matrix of its own or quantized.
    pub(crate) embd: Option<RowsUpload>,
    pub(crate) output_norm: Option<wgpu::Buffer>,
    /// Blocks to skip (see `Model::skip`).
    pub skip: Vec<bool>,
    pub(crate) bytes: u64,
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
            let bind = gpu.bind(kp.model_norm_quant(), &[step, dims, x, &wb, xq, xs]);
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
                    let bind = gpu.bind(kp.model_norm_quant(), &[step, dims, x, &p.ones, xq, xs]);
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
        // The lane kernels also take RoPE and the cache store into the QKV kernel's epilogue
        // where every head is whole in groups of four rows and every pair of it rotates.
        let c = &self.config;
        let qkv_rope = match mv_kind {
            Some(MvKind::Lanes) if c.n_rot == c.head_dim && c.head_dim.is_multiple_of(4) => {
                Some(qkv.qkv_rope(gpu, (h, &w_attn), q, eps)?)
            }
            _ => None,
        };
        let mv = match (mv_kind, glu_mv) {
            (Some(kind), Some(glu)) => Some(MvLayer {
                kind,
                qkv_rope,
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
        if let Some(e) = &mut self.embd {
            e.write(&self.gpu, data)?;
        }
        if self.tied {
            self.head.write(&self.gpu, data)?;
        }
        Ok(())
    }

    /// The next bytes of the separate LM head's rows (`output.weight`).
    pub fn write_output(&mut self, data: &[u8]) -> Result<()> {
        if self.tied {
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
            head_in,
            embd_ty,
            layers,
            mut head,
            mut embd,
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
        head.done(&gpu)?;
        if let Some(e) = &mut embd {
            e.done(&gpu)?;
        }
        let (head, embd) = (head.chunks, embd.map(|e| e.chunks));
        let kp = &gpu.k;
        let final_norm = match &head_in {
            Some([hq, hd]) => gpu.bind(&kp.rmsnorm_q8, &[&step, &dims_e, &h, &on, hq, hd]),
            None => gpu.bind(&kp.rmsnorm, &[&step, &dims_e, &h, &on, &hn]),
        };
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
            let bind = match &head_in {
                Some([hq, hd]) => gpu.bind(
                    kp.head_q(true, head_ty).0,
                    &[&step, &dims, b, hq, &act.logits, hd],
                ),
                None => gpu.bind(kp.head(true).0, &[&step, &dims, b, &hn, &act.logits]),
            };
            head_binds.push((rows, bind));
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
        let lane_blocks = layers
            .iter()
            .any(|l| l.mv.as_ref().is_some_and(|m| m.kind == MvKind::Lanes));
        Ok(GpuModel {
            turn: std::sync::Mutex::new(()),
            config: c,
            max_batch,
            out_cap,
            step,
            act,
            layers,
            lane_blocks,
            skip,
            embd,
            head,
            embed_bind,
            final_norm,
            head_binds,
            head_quant: head_in.is_some().then_some(head_ty),
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
