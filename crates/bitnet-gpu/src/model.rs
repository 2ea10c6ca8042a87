//! The model on the device and its pass: the options, the model's blocks as bound kernels,
//! a cache's creation and context shift, and each forward call recorded into one command
//! buffer and submitted once. Uploads are upload.rs's, the building builder.rs's, the kernels'
//! geometry kernels.rs's.

use bitnet_model::numerics::{rope_back_for, rope_row};
use bitnet_model::{Activation, Config, Outputs, RopeStyle};

use crate::cache::{GpuCache, GpuKv};
use crate::device::Gpu;
use crate::kernels::{
    attn_part_len, attn_split, bytes_of, mul, step_words, u32_of, MvKind, ARGMAX_GROUPS,
    ATTN_SPLIT_TOKENS, GEMM_MIN_TOKENS, GEMM_ROWS, GEMM_TOKENS, LANES_GEMM_MIN_TOKENS, MV_TOKENS,
    TERNARY_TOKENS, TOP_CANDIDATES,
};
use crate::rec::{KernelTime, Profile, Rec, PROFILE_QUERIES};
use crate::upload::{Chunks, GpuMatrix, MvBind, QkvRope};
use crate::{GpuError, Result};

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
    /// The LM head quantized at upload (`Q8_0` or `Q4_0`, with bitnet_kernels' quantizer:
    /// the CPU's `--lm-head` codes) and dotted in integers with the normed rows quantized per
    /// 32, as the CPU's `RowMatrix::matmul_q8`; `None`: the file's rows as they are. A tied
    /// head keeps its F16 rows on the device for the embedding beside the quantized copy.
    pub head: Option<bitnet_kernels::RowType>,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            adapter: None,
            max_batch: 512,
            chunk_bytes: None,
            decode: DecodeKernels::default(),
            head: None,
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

#[derive(Debug)]
pub(crate) struct GpuLayer {
    pub(crate) norm_attn: wgpu::BindGroup,
    pub(crate) q: GpuMatrix,
    pub(crate) k: GpuMatrix,
    pub(crate) v: GpuMatrix,
    pub(crate) norm_sub: wgpu::BindGroup,
    pub(crate) o: GpuMatrix,
    pub(crate) norm_ffn: wgpu::BindGroup,
    /// gate, up and the activation, fused
    pub(crate) glu: GpuMatrix,
    pub(crate) norm_ffn_sub: wgpu::BindGroup,
    pub(crate) down: GpuMatrix,
    /// The decode kernels' bindings and workgroups (mv.wgsl, mv_glu.wgsl), where the shapes
    /// and the adapter allow them.
    pub(crate) mv: Option<MvLayer>,
}

#[derive(Debug)]
pub(crate) struct MvLayer {
    /// The kernels (unless they norm in their prologues, each norm a norm_quant dispatch
    /// first).
    pub(crate) kind: MvKind,
    pub(crate) qkv: MvBind,
    /// The lane kernels' QKV with RoPE and the cache store, where the shape allows it (a
    /// cache binds it with its own buffers).
    pub(crate) qkv_rope: Option<QkvRope>,
    pub(crate) o: MvBind,
    pub(crate) glu: MvBind,
    pub(crate) down: MvBind,
}

impl MvLayer {
    /// Whether a call of `n` tokens runs on these kernels: a decode step (up to MV_TOKENS),
    /// and on the lane kernels any call shorter than the prompt GEMM takes.
    pub(crate) fn takes(&self, n: usize) -> bool {
        n <= MV_TOKENS || (self.kind == MvKind::Lanes && n < GEMM_MIN_TOKENS)
    }
}

#[derive(Debug)]
pub(crate) struct Activations {
    /// Embedding rows as stored ([max_batch][row_bytes]).
    pub(crate) rows: wgpu::Buffer,
    pub(crate) q: wgpu::Buffer,
    pub(crate) k: wgpu::Buffer,
    pub(crate) v: wgpu::Buffer,
    pub(crate) o: wgpu::Buffer,
    pub(crate) logits: wgpu::Buffer,
    pub(crate) logits_staging: wgpu::Buffer,
    pub(crate) best: wgpu::Buffer,
    pub(crate) best_staging: wgpu::Buffer,
    pub(crate) top: wgpu::Buffer,
    pub(crate) top_staging: wgpu::Buffer,
}

/// A model resident on the GPU. Built from a bound [`Model`]; it keeps no reference to it.
/// Calls from several threads take turns (its activation buffers are shared).
#[derive(Debug)]
pub struct GpuModel {
    pub(crate) gpu: Gpu,
    /// Held for the whole of a call that writes the shared buffers.
    pub(crate) turn: std::sync::Mutex<()>,
    pub(crate) config: Config,
    pub(crate) max_batch: usize,
    /// Rows of logits one submission may produce.
    pub(crate) out_cap: usize,
    pub(crate) step: wgpu::Buffer,
    pub(crate) act: Activations,
    pub(crate) layers: Vec<GpuLayer>,
    /// The blocks run the lane decode kernels (all or none).
    pub(crate) lane_blocks: bool,
    pub(crate) skip: Vec<bool>,
    pub(crate) embd: Option<Chunks>,
    pub(crate) head: Chunks,
    pub(crate) embed_bind: wgpu::BindGroup,
    pub(crate) final_norm: wgpu::BindGroup,
    pub(crate) head_binds: Vec<(usize, wgpu::BindGroup)>,
    /// The head kernels' code of a Q8_0 / Q4_0 head (the final norm then quantizes its rows:
    /// rmsnorm_q8.wgsl).
    pub(crate) head_quant: Option<u32>,
    pub(crate) argmax_bind: wgpu::BindGroup,
    pub(crate) topk_local: wgpu::BindGroup,
    pub(crate) topk_merge: wgpu::BindGroup,
    /// Workgroups of the top-k's first pass.
    pub(crate) topk_groups: u32,
    /// Bytes of weights and activation buffers on the device.
    pub(crate) bytes: u64,
    /// Dispatches of the last submission.
    pub(crate) dispatches: std::sync::atomic::AtomicU32,
    /// Submissions of the last call.
    pub(crate) submits: std::sync::atomic::AtomicU32,
    /// Kernel timing, when on.
    pub(crate) prof: std::sync::Mutex<Option<ProfState>>,
}

/// The query set and buffers of kernel timing, and the times so far.
#[derive(Debug)]
pub(crate) struct ProfState {
    pub(crate) set: wgpu::QuerySet,
    pub(crate) resolve: wgpu::Buffer,
    pub(crate) staging: wgpu::Buffer,
    pub(crate) acc: Profile,
}

/// The kernels build the `bitnet*` block (sub-norms, NEOX RoPE) and the ternary `llama` block
/// (no sub-norms, normal RoPE); the embedding models' blocks (input norms, Q/K norms,
/// post-norms, a head size apart from n_embd / n_head) are refused before a device is opened,
/// so `--device auto` can fall back to the CPU. Every field of [`Config`] is named here, so a
/// new architecture feature does not build until this says whether the GPU runs it.
pub fn check_architecture(c: &Config) -> Result<()> {
    let Config {
        arch,
        // Shapes: checked against the kernels' limits when the model is built.
        n_vocab: _,
        n_ctx_train: _,
        n_embd: _,
        n_layer: _,
        n_ff: _,
        n_head: _,
        n_head_kv: _,
        n_rot: _,
        head_dim: _,
        rms_eps: _,
        rope_freq_base: _,
        activation,
        // Both pairings (rope.wgsl's `normal`), with or without sub-norms (norm_common.wgsl's
        // `plain`).
        rope_style: _,
        sub_norms: _,
        norm_in,
        qk_norm,
        post_norms,
        embd_scale,
        q_prescale,
        // Pooling is the embedding path's, which the GPU does not run.
        pooling: _,
    } = c;
    let mut missing = Vec::new();
    for (have, what) in [
        (*norm_in, "input norms per projection"),
        (*qk_norm, "Q/K norms"),
        (*post_norms, "post-norms"),
        (embd_scale.is_some(), "scaled embeddings"),
        (*q_prescale, "pre-scaled Q"),
        (
            c.n_embd_q() != c.n_embd,
            "a head size apart from n_embd / n_head",
        ),
        (*activation == Activation::Gelu, "GELU"),
    ] {
        if have {
            missing.push(what);
        }
    }
    if !missing.is_empty() {
        return Err(GpuError::Unsupported(format!(
            "architecture '{arch}' on the GPU ({}; the GPU runs the `bitnet*` and ternary \
             `llama` blocks): run it on the CPU",
            missing.join(", ")
        )));
    }
    Ok(())
}

impl GpuModel {
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

    /// One decode step of several sequences in one pass: `tokens[i]` joins `caches[i]` at
    /// that cache's next position. The matrices and the LM head read their weights once for
    /// all of them; RoPE, the cache store and attention run per sequence over its own cache.
    /// Returns each sequence's logits, `[sequence][n_vocab]`, as [`GpuModel::forward`] of its
    /// token with [`Outputs::Last`] gives them (the same values within the kernels'
    /// rounding: the matrices may take another kernel for several rows).
    pub fn forward_batch(&self, tokens: &[u32], caches: &mut [&mut GpuCache]) -> Result<Vec<f32>> {
        crate::device::block(self.forward_batch_async(tokens, caches))?
    }

    /// [`GpuModel::forward_batch`], for callers that must not block.
    pub async fn forward_batch_async(
        &self,
        tokens: &[u32],
        caches: &mut [&mut GpuCache],
    ) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        self.run_batch(tokens, caches, GpuOutputs::Logits(Outputs::Last), &mut out)
            .await?;
        Ok(out)
    }

    /// [`GpuModel::forward_batch`] that returns only each sequence's arg-max (as
    /// [`GpuModel::forward_greedy`]), reading back 8 bytes per argmax workgroup and sequence.
    pub fn forward_batch_greedy(
        &self,
        tokens: &[u32],
        caches: &mut [&mut GpuCache],
    ) -> Result<Vec<u32>> {
        crate::device::block(self.forward_batch_greedy_async(tokens, caches))?
    }

    /// [`GpuModel::forward_batch_greedy`], for callers that must not block.
    pub async fn forward_batch_greedy_async(
        &self,
        tokens: &[u32],
        caches: &mut [&mut GpuCache],
    ) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let best = self
            .run_batch(tokens, caches, GpuOutputs::Greedy, &mut out)
            .await?;
        best.into_iter()
            .map(|b| {
                (b != u32::MAX).then_some(b).ok_or(GpuError::Readback(
                    "no logit to take the maximum of".to_string(),
                ))
            })
            .collect()
    }

    /// Every token inside the vocabulary.
    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let n_vocab = self.config.n_vocab;
        match tokens
            .iter()
            .find(|&&t| usize::try_from(t).map_or(true, |t| t >= n_vocab))
        {
            Some(&id) => Err(GpuError::TokenOutOfRange { id, n_vocab }),
            None => Ok(()),
        }
    }

    /// A batched decode step (see [`GpuModel::forward_batch`]) in submissions of up to as
    /// many sequences as the logits buffer holds rows.
    #[allow(clippy::await_holding_lock)]
    async fn run_batch(
        &self,
        tokens: &[u32],
        caches: &mut [&mut GpuCache],
        want: GpuOutputs,
        out: &mut Vec<f32>,
    ) -> Result<Vec<u32>> {
        let _turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        if tokens.is_empty() || tokens.len() != caches.len() {
            return Err(GpuError::Shape {
                what: "batched step (one token a cache)",
                expected: caches.len().max(1),
                got: tokens.len(),
            });
        }
        self.check_tokens(tokens)?;
        if let Some(full) = caches.iter().find(|k| k.len >= k.n_ctx) {
            return Err(GpuError::ContextFull {
                need: full.len + 1,
                n_ctx: full.n_ctx,
            });
        }
        let per_call = self.max_batch.min(self.out_cap).max(1);
        self.submits.store(0, std::sync::atomic::Ordering::Relaxed);
        let mut best = Vec::with_capacity(tokens.len());
        for (chunk, group) in tokens.chunks(per_call).zip(caches.chunks_mut(per_call)) {
            let n = u32_of(chunk.len(), "tokens")?;
            self.gpu.queue.write_buffer(
                &self.step,
                0,
                bytemuck::cast_slice(&step_words(n, 0, 0, n, 0)),
            );
            // Each cache's kernels: its one row, at its position, from activation row i.
            for (i, cache) in group.iter().enumerate() {
                let words = step_words(1, u32_of(cache.len, "position")?, 0, 0, u32_of(i, "rows")?);
                self.gpu
                    .queue
                    .write_buffer(&cache.step, 0, bytemuck::cast_slice(&words));
            }
            let refs: Vec<&GpuCache> = group.iter().map(|k| &**k).collect();
            best.extend(self.submit(chunk, &refs, chunk.len(), want, out).await?);
            for cache in group.iter_mut() {
                cache.len += 1;
            }
        }
        Ok(best)
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
        if tokens.is_empty() {
            return Err(GpuError::Shape {
                what: "tokens",
                expected: 1,
                got: 0,
            });
        }
        self.check_tokens(tokens)?;
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
            let words = step_words(
                u32_of(n, "tokens")?,
                u32_of(cache.len, "position")?,
                u32_of(out_first, "rows")?,
                u32_of(out_rows, "rows")?,
                0,
            );
            self.gpu
                .queue
                .write_buffer(&self.step, 0, bytemuck::cast_slice(&words));
            self.gpu
                .queue
                .write_buffer(&cache.step, 0, bytemuck::cast_slice(&words));
            let picks = self.submit(chunk, &[&*cache], out_rows, want, out).await?;
            if let Some(&b) = picks.first() {
                best = Some(b);
            }
            cache.len += n;
        }
        Ok(best)
    }

    /// Record `tokens` over `caches` (see [`GpuModel::record`]), submit them once and read
    /// back what `want` asks of the `out_rows` output rows: logits into `out`, top-k pairs
    /// into `out` as bit patterns, or each row's arg-max as the result.
    #[allow(clippy::await_holding_lock)]
    async fn submit(
        &self,
        tokens: &[u32],
        caches: &[&GpuCache],
        out_rows: usize,
        want: GpuOutputs,
        out: &mut Vec<f32>,
    ) -> Result<Vec<u32>> {
        let c = &self.config;
        let mut best = Vec::new();
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        let mut prof = self.prof.lock().unwrap_or_else(|e| e.into_inner());
        let names = {
            let mut rec = Rec::new(&mut enc, prof.as_ref().map(|p| &p.set));
            self.record(&mut rec, tokens, caches, out_rows, want)?;
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
            let size = bytes_of(mul(out_rows, ARGMAX_GROUPS * 8, "rows")?)?;
            enc.copy_buffer_to_buffer(&self.act.best, 0, &self.act.best_staging, 0, size);
            self.gpu.queue.submit([enc.finish()]);
            self.submits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let b = self
                .gpu
                .map_read_async(&self.act.best_staging, size)
                .await?;
            for row in b.chunks(ARGMAX_GROUPS * 8) {
                best.push(best_of_groups(row)?);
            }
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
            p.acc.tokens += u64::try_from(tokens.len()).unwrap_or(0);
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
    /// team decode kernels once per call of up to 4, the lane kernels once per token: they
    /// take one row, or more where a matrix has no GEMM) and the LM head once.
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
                let reads = match self.mv_for(l, n) {
                    Some(m) if m.kind == MvKind::Lanes => n,
                    Some(_) => 1,
                    _ if n >= self.gemm_from() && gemm => n.div_ceil(GEMM_TOKENS),
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

    /// Rows a call may have for attention to split its positions over workgroups: a decode
    /// step's, except on the lane kernels, whose adapters' cores the heads alone outnumber
    /// (and a merge would cost a dispatch a block).
    fn attn_split_tokens(&self) -> usize {
        if self.lane_blocks {
            0
        } else {
            ATTN_SPLIT_TOKENS
        }
    }

    /// The fewest rows a call runs the prompt GEMM with, where a matrix has it: on the lane
    /// kernels' adapters with the lane GEMM, LANES_GEMM_MIN_TOKENS (a batched step's rows
    /// share each weight it unpacks); elsewhere GEMM_MIN_TOKENS.
    fn gemm_from(&self) -> usize {
        if self.lane_blocks && self.gpu.k.gemm_lanes_default {
            LANES_GEMM_MIN_TOKENS
        } else {
            GEMM_MIN_TOKENS
        }
    }

    /// The decode kernels of block `l` for a call of `n` rows, unless the prompt GEMM takes
    /// it.
    fn mv_for<'l>(&self, l: &'l GpuLayer, n: usize) -> Option<&'l MvLayer> {
        let gemm = n >= self.gemm_from() && !l.q.gemm.is_empty();
        l.mv.as_ref().filter(|m| m.takes(n) && !gemm)
    }

    /// Record one call of `tokens` (≤ max_batch): into one cache (`caches` of one), or a
    /// batched decode step, token i into `caches[i]` (its RoPE, store and attention
    /// dispatched over its own cache, at activation row i).
    fn record(
        &self,
        rec: &mut Rec<'_>,
        tokens: &[u32],
        caches: &[&GpuCache],
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
        let gemm_from = self.gemm_from();
        let gemm_tiles = u32_of(n.div_ceil(GEMM_TOKENS), "tokens")?;
        let lin = |rec: &mut Rec<'_>, name: &'static str, m: &GpuMatrix| -> Result<()> {
            if n >= gemm_from && !m.gemm.is_empty() {
                let rows = u32_of(m.n_out.div_ceil(GEMM_ROWS), "rows")?;
                for b in &m.gemm {
                    rec.dispatch(name, kp.model_gemm(), b, [rows, gemm_tiles, 1]);
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
        // Each cache's rows: all of the call's, or one of a batched step's.
        let batched = caches.len() > 1;
        let rows_each = if batched { 1 } else { n };
        let rows32 = u32_of(rows_each, "tokens")?;
        // A decode step's positions in chunks (attention_split.wgsl).
        let splits = caches
            .iter()
            .map(|cache| attn_split(rows_each, cache.len + rows_each, self.attn_split_tokens()))
            .collect::<Result<Vec<u32>>>()?;
        for (il, l) in self.layers.iter().enumerate() {
            if self.skip.get(il).copied().unwrap_or(false) {
                continue;
            }
            // A decode step's kernels: Q, K and V in one (fused: the norms in their prologues).
            // The lane kernels also take a prompt too short for the GEMM: on their adapters a
            // pass per token beats the row kernel's workgroup per output row.
            let mv = self.mv_for(l, n).and_then(|m| {
                let (k, g, _) = m.kind.pipelines(kp)?;
                Some(((m, k), g))
            });
            // 1.–2. a = RMS(h); Q, K, V = Lin(W, a)
            // 3. (the lane kernels, one cache) RoPE and the cache store in the same kernel.
            let fused_rope = mv.filter(|_| !batched).and_then(|((m, _), _)| {
                let p = m.qkv_rope.as_ref()?;
                let cache = caches.first()?;
                let pipeline = kp.qkv_rope(cache.ty)?;
                Some((pipeline, cache.qkv_rope.get(il)?, p.groups))
            });
            if let Some((pipeline, bind, groups)) = fused_rope {
                rec.dispatch("mv qkv+rope+store", pipeline, bind, [groups, 1, 1]);
            } else if let Some(((m, mv_k), _)) = mv {
                if !m.kind.normed() {
                    rec.dispatch(
                        "norm_quant",
                        kp.model_norm_quant(),
                        &l.norm_attn,
                        [n32, 1, 1],
                    );
                }
                rec.dispatch("mv qkv", mv_k, &m.qkv.0, [m.qkv.1, 1, 1]);
            } else {
                rec.dispatch(
                    "norm_quant",
                    kp.model_norm_quant(),
                    &l.norm_attn,
                    [n32, 1, 1],
                );
                lin(rec, "ternary q", &l.q)?;
                lin(rec, "ternary k", &l.k)?;
                lin(rec, "ternary v", &l.v)?;
            }
            for (cache, &split) in caches.iter().zip(&splits) {
                // 3. RoPE on Q and K, and the new K and V rows into the cache (f16: rounded),
                // in one kernel.
                let (rope_kernel, attention) = kp.for_cache(cache.ty);
                let rope = cache
                    .rope
                    .get(il)
                    .ok_or(GpuError::Overflow("block index"))?;
                if fused_rope.is_none() {
                    rec.dispatch("rope+store", rope_kernel, rope, [rows32, rope_heads, 1]);
                }
                // 4. O = Attn(Q, K, V)
                let attn = cache
                    .attn
                    .get(il)
                    .ok_or(GpuError::Overflow("block index"))?;
                rec.dispatch("attention", attention, attn, [heads, rows32, split]);
                if split > 1 {
                    rec.dispatch(
                        "attention_merge",
                        &kp.attention_merge,
                        &cache.merge,
                        [heads, rows32, 1],
                    );
                }
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
                        rec.dispatch("norm_quant", kp.model_norm_quant(), norm, [n32, 1, 1]);
                    }
                    rec.dispatch(name, pipeline, bind, [*groups, 1, 1]);
                }
                continue;
            }
            // 5.–6. h += Lin(Wo, RMS(O))
            rec.dispatch(
                "norm_quant",
                kp.model_norm_quant(),
                &l.norm_sub,
                [n32, 1, 1],
            );
            lin(rec, "ternary o", &l.o)?;
            // 7.–8. g = act(Lin(Wgate, f)) · Lin(Wup, f), f = RMS(h), in one kernel
            rec.dispatch(
                "norm_quant",
                kp.model_norm_quant(),
                &l.norm_ffn,
                [n32, 1, 1],
            );
            if n >= gemm_from && !l.glu.gemm.is_empty() {
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
            rec.dispatch(
                "norm_quant",
                kp.model_norm_quant(),
                &l.norm_ffn_sub,
                [n32, 1, 1],
            );
            lin(rec, "ternary down", &l.down)?;
        }
        if out_rows > 0 {
            let rows = u32_of(out_rows, "rows")?;
            let (norm, (head, head_rows, head_outs)) = match self.head_quant {
                Some(ty) => (&kp.rmsnorm_q8, kp.head_q(true, ty)),
                None => (&kp.rmsnorm, kp.head(true)),
            };
            rec.dispatch("rmsnorm", norm, &self.final_norm, [rows, 1, 1]);
            let out_groups = u32_of(out_rows.div_ceil(head_outs), "rows")?;
            for (chunk_rows, bind) in &self.head_binds {
                let groups = u32_of(chunk_rows.div_ceil(head_rows), "head rows")?;
                rec.dispatch("head", head, bind, [groups, out_groups, 1]);
            }
            match want {
                GpuOutputs::Greedy => {
                    let groups = u32_of(ARGMAX_GROUPS, "groups")?;
                    rec.dispatch("argmax", &kp.argmax, &self.argmax_bind, [groups, rows, 1]);
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

impl GpuModel {
    /// A KV cache of `n_ctx` positions of type `ty` on the device, with its RoPE table.
    pub fn new_cache(&self, n_ctx: usize, ty: GpuKv) -> Result<GpuCache> {
        let c = &self.config;
        let n_ctx = n_ctx.max(1);
        let kv = c.n_embd_kv();
        if ty == GpuKv::Q8_0 && !c.head_dim.is_multiple_of(32) {
            return Err(GpuError::Unsupported(format!(
                "a Q8_0 KV cache for a head size of {} (a multiple of 32)",
                c.head_dim
            )));
        }
        let per = bytes_of(mul(n_ctx, ty.row_bytes(kv), "cache")?)?;
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
        // The cache's own call parameters (its kernels' rows and positions in a batched
        // step; the model's in any other call).
        let step = self.gpu.uniform("cache step", &step_words(0, 0, 0, 0, 0));
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
        let (rope_kernel, pipeline) = kp.for_cache(ty);
        let rope = (0..c.n_layer)
            .map(|il| {
                self.gpu.bind(
                    rope_kernel,
                    &[
                        &step, &rope_dims, &a.q, &a.k, &tb, &ctx, &a.v, &k[il], &v[il],
                    ],
                )
            })
            .collect();
        // The lane QKV kernels with RoPE and the store in their epilogue, where the blocks
        // have them (all or none).
        let qkv_rope_kernel = kp.qkv_rope(ty);
        let rope_lanes = self.gpu.uniform(
            "rope qkv",
            &[
                u32_of(c.head_dim, "head_dim")?,
                u32_of(half, "n_rot")?,
                u32::from(c.rope_style == RopeStyle::Norm),
                u32_of(n_ctx, "n_ctx")?,
            ],
        );
        let mut qkv_rope = Vec::new();
        for (il, l) in self.layers.iter().enumerate() {
            let (Some(p), Some(kernel)) = (
                l.mv.as_ref().and_then(|m| m.qkv_rope.as_ref()),
                qkv_rope_kernel,
            ) else {
                qkv_rope.clear();
                break;
            };
            qkv_rope.push(self.gpu.bind(
                kernel,
                &[
                    &step,
                    &p.dims,
                    &p.codes,
                    &p.scales,
                    &p.x,
                    &p.nw,
                    &p.q,
                    &k[il],
                    &v[il],
                    &tb,
                    &rope_lanes,
                ],
            ));
        }
        #[allow(clippy::cast_precision_loss)] // head sizes are small integers
        let scale = 1.0f32 / (c.head_dim as f32).sqrt();
        let attn_dims = self.gpu.uniform(
            "dims attention",
            &[
                u32_of(c.n_head, "n_head")?,
                u32_of(c.n_head_kv, "n_head_kv")?,
                u32_of(c.head_dim, "head_dim")?,
                scale.to_bits(),
                u32_of(self.attn_split_tokens(), "tokens")?,
                0,
                0,
                0,
            ],
        );
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
                    &[&step, &attn_dims, &a.q, &k[il], &v[il], &a.o, &part],
                )
            })
            .collect();
        let merge = self
            .gpu
            .bind(&kp.attention_merge, &[&step, &attn_dims, &part, &a.o]);
        self.gpu.wait()?;
        Ok(GpuCache {
            bytes: per * 2 * bytes_of(c.n_layer)? + tb.size() + part.size(),
            ty,
            k,
            v,
            attn,
            merge,
            rope,
            qkv_rope,
            step,
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
        let row = cache.ty.row_bytes(kv);
        let bytes = bytes_of(mul(cache.len, row, "cache")?)?;
        for il in 0..c.n_layer {
            for (buf, is_k) in [(&cache.k[il], true), (&cache.v[il], false)] {
                let raw = self.gpu.read(buf, bytes)?;
                let mut rows = cache.ty.decode(&raw, kv);
                if is_k {
                    for head in rows[from * kv..].chunks_exact_mut(d) {
                        rope_back(head, &rope);
                    }
                }
                // The moved positions (rotated keys) are stored again in the cache's type, as
                // the CPU does.
                let tail = cache.ty.encode(&rows[from * kv..(from + moved) * kv], kv)?;
                let at = bytes_of(mul(keep, row, "cache")?)?;
                self.gpu.queue.write_buffer(buf, at, &tail);
            }
        }
        self.gpu.wait()?;
        cache.len -= discard;
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
