//! Weight binding and the forward pass.

use std::borrow::Cow;

use bitnet_gguf::{GgmlType, GgufFile, TensorInfo};
use bitnet_kernels::rows::first_non_finite;
use bitnet_kernels::{act, RowMatrix, RowType, TernaryLayout, TernaryMatrix};

use crate::approx::ApproxHead;
use crate::backend::Backend;
use crate::config::{Activation, Config, Pooling};
use crate::kv_cache::KvCache;
use crate::names::{self, LayerTensor};
use crate::numerics::{self, Numerics, RopeRow};
use crate::screen::{HeadScreen, Pick, Picked};
use crate::KvType;
use crate::{ModelError, Result};

/// One transformer block's weights (ggml `ne` = (in, out); a ternary matrix is `[out][in]`).
#[derive(Debug)]
pub struct Layer<'a> {
    /// [n_embd]
    pub attn_norm: Vec<f32>,
    /// [n_embd][n_embd]
    pub wq: TernaryMatrix<'a>,
    /// [n_embd_kv][n_embd]
    pub wk: TernaryMatrix<'a>,
    /// [n_embd_kv][n_embd]
    pub wv: TernaryMatrix<'a>,
    /// [n_embd]; `None` where the architecture has no sub-norms (`llama`)
    pub attn_sub_norm: Option<Vec<f32>>,
    /// [n_embd][n_embd]
    pub wo: TernaryMatrix<'a>,
    /// [n_embd]
    pub ffn_norm: Vec<f32>,
    /// [n_ff][n_embd]
    pub w_gate: TernaryMatrix<'a>,
    /// [n_ff][n_embd]
    pub w_up: TernaryMatrix<'a>,
    /// [n_ff]; `None` where the architecture has no sub-norms (`llama`)
    pub ffn_sub_norm: Option<Vec<f32>>,
    /// [n_embd][n_ff]
    pub w_down: TernaryMatrix<'a>,
    /// The projections' own input norms, where the file has them (bitnet.cpp's embedding
    /// models).
    pub norm_in: Option<NormIn>,
    /// [head_dim] each: per-head Q and K norms (`qwen3`, `gemma3`).
    pub attn_q_norm: Option<Vec<f32>>,
    pub attn_k_norm: Option<Vec<f32>>,
    /// [n_embd] each: norms of the attention and FFN outputs (`gemma3`).
    pub post_attn_norm: Option<Vec<f32>>,
    pub post_ffw_norm: Option<Vec<f32>>,
}

/// The input norm of each projection (`blk.N.{attn_q,…,ffn_down}_norm_in`): the projection
/// RMS-normalizes its input with these weights before quantizing it.
#[derive(Debug, Clone)]
pub struct NormIn {
    /// [n_embd] each.
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// [n_head * head_dim]
    pub o: Vec<f32>,
    /// [n_embd] each.
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    /// [n_ff]
    pub down: Vec<f32>,
}

/// A loaded model: config, weights borrowed from the GGUF map, and run options.
#[derive(Debug)]
pub struct Model<'a> {
    pub config: Config,
    /// [n_vocab][n_embd] in its file format (F16 in the official file)
    pub tok_embd: RowMatrix<'a>,
    /// the LM head when it is not the tied embedding (`output.weight`, or a quantized copy)
    pub output: Option<RowMatrix<'a>>,
    /// [n_embd]
    pub output_norm: Vec<f32>,
    pub layers: Vec<Layer<'a>>,
    /// Blocks to skip (`true` at their index): the residual stream passes them unchanged.
    /// Empty: none (the default). An approximation, for fast numerics only.
    pub skip: Vec<bool>,
    /// The clustered vocabulary of `--lm-head approx`: with fast numerics, logits are exact
    /// only for the best clusters' members ([`ApproxHead`]). `None`: every logit exact.
    pub approx_head: Option<ApproxHead>,
    /// A Q8_0 screen of the LM head ([`HeadScreen`]): with fast numerics,
    /// [`Model::forward_pick`] computes only the logits that can decide the next token.
    /// `None`: it computes them all.
    pub head_screen: Option<HeadScreen>,
}

impl<'a> Layer<'a> {
    /// The seven ternary projections.
    pub fn projections(&self) -> [&TernaryMatrix<'_>; 7] {
        [
            &self.wq,
            &self.wk,
            &self.wv,
            &self.wo,
            &self.w_gate,
            &self.w_up,
            &self.w_down,
        ]
    }

    /// The seven ternary projections, mutable (to repack them at load).
    pub fn projections_mut(&mut self) -> [&mut TernaryMatrix<'a>; 7] {
        [
            &mut self.wq,
            &mut self.wk,
            &mut self.wv,
            &mut self.wo,
            &mut self.w_gate,
            &mut self.w_up,
            &mut self.w_down,
        ]
    }
}

/// One sequence of a batch: its new tokens, its cache, the logits it wants.
#[derive(Debug)]
pub struct Seq<'c> {
    pub tokens: &'c [u32],
    pub cache: &'c mut KvCache,
    pub outputs: Outputs,
}

/// Which positions of a batch produce logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outputs {
    /// No logits (prompt prefix).
    None,
    /// Logits of the last position only.
    Last,
    /// Logits of every position.
    All,
}

/// A named intermediate of the forward pass, for the trace hook.
#[derive(Debug)]
pub struct TraceEvent<'t> {
    /// Step name, e.g. `attn_norm`, `q_rope`, `ffn_out`, `result_norm`.
    pub name: &'static str,
    /// Layer index, or `None` for global steps.
    pub layer: Option<usize>,
    /// Row-major `[rows][cols]` values.
    pub data: &'t [f32],
    pub rows: usize,
    pub cols: usize,
}

/// Everything a forward call needs besides the model and the cache.
pub struct Exec<'p> {
    /// Where the heavy operations run (the kernel [`Pool`] for the CPU).
    pub backend: &'p dyn Backend,
    pub numerics: Numerics,
    /// Called with every named intermediate when set.
    pub trace: Option<&'p mut dyn FnMut(&TraceEvent<'_>)>,
    /// Buffers reused from call to call; without them a forward call allocates its own.
    pub scratch: Option<&'p mut Scratch>,
}

/// The activation buffers of a forward pass (llama2.c's `RunState`), kept by the caller and
/// reused by every call: they grow to the largest batch seen and are never shrunk, so a
/// decode step allocates nothing for its layers.
#[derive(Debug, Default)]
pub struct Scratch {
    /// Normed rows (`n × n_embd`) that more than one input norm reads (embedding models), or
    /// any norm's output in a traced pass (up to `n × n_ff`, before the down projection).
    a: Vec<f32>,
    /// A post-norm's output (gemma3).
    b: Vec<f32>,
    /// The RMS factor of each row about to be normed and quantized.
    rs: Vec<f32>,
    /// Their int8 codes and per-row scales.
    xq: Vec<i8>,
    s: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Attention output.
    o: Vec<f32>,
    /// Output of the O and down projections.
    t: Vec<f32>,
    g: Vec<f32>,
    up: Vec<f32>,
}

impl Scratch {
    /// Bytes held (its allocated capacity).
    pub fn capacity_bytes(&self) -> usize {
        let f = [
            &self.a, &self.b, &self.rs, &self.s, &self.q, &self.k, &self.v, &self.o, &self.t,
            &self.g, &self.up,
        ];
        f.iter().map(|v| v.capacity() * 4).sum::<usize>() + self.xq.capacity()
    }
}

/// `v` as `len` elements, reusing its allocation. What they hold is left over from earlier
/// calls (only growth is zeroed): every caller overwrites all of them.
fn sized<T: Clone + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    v.truncate(len);
    v.resize(len, T::default());
    v
}

/// Rows a light step needs before it is split over the row pool: below this, handing the work
/// to the threads costs about what it saves (a batched decode step of 4 rows measured 1.5–4 %
/// slower split than whole).
const ROW_POOL_MIN_ROWS: usize = 16;

/// `f(rows, a_rows, b_rows)` over the rows of `a` (`wa` elements each) and `b` (`wb` each), on
/// the backend's row pool when it has one and there are at least [`ROW_POOL_MIN_ROWS`] rows,
/// else in one call here. Each row must be computed alone, so the result does not depend on
/// where it runs.
fn each_row2<A: Send, B: Send>(
    exec: &Exec<'_>,
    a: &mut [A],
    wa: usize,
    b: &mut [B],
    wb: usize,
    f: &bitnet_kernels::RowsJob2<'_, A, B>,
) -> Result<()> {
    let rows = a.len() / wa.max(1);
    match exec.backend.row_pool() {
        Some(pool) if rows >= ROW_POOL_MIN_ROWS => Ok(pool.for_rows_mut2(a, wa, b, wb, 1, f)?),
        _ => {
            f(0..rows, a, b);
            Ok(())
        }
    }
}

/// [`each_row2`] over one slice.
fn each_row<A: Send>(
    exec: &Exec<'_>,
    a: &mut [A],
    wa: usize,
    f: &(dyn Fn(std::ops::Range<usize>, &mut [A]) + Sync),
) -> Result<()> {
    each_row2(exec, a, wa, &mut [(); 0], 0, &|r, ra, _| f(r, ra))
}

impl std::fmt::Debug for Exec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exec")
            .field("backend", &self.backend.name())
            .field("threads", &self.backend.n_threads())
            .field("numerics", &self.numerics)
            .field("trace", &self.trace.is_some())
            .finish()
    }
}

impl Exec<'_> {
    fn emit(&mut self, name: &'static str, layer: Option<usize>, data: &[f32], rows: usize) {
        if let Some(t) = self.trace.as_mut() {
            let cols = data.len().checked_div(rows).unwrap_or(0);
            t(&TraceEvent {
                name,
                layer,
                data,
                rows,
                cols,
            });
        }
    }
}

fn check_dims(t: &TensorInfo, expected: &[u64]) -> Result<()> {
    if t.dims != expected {
        return Err(ModelError::WrongShape {
            name: t.name.clone(),
            expected: expected.to_vec(),
            found: t.dims.clone(),
        });
    }
    Ok(())
}

fn require<'f>(file: &'f GgufFile, name: &str) -> Result<&'f TensorInfo> {
    file.tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
}

/// An F32 vector (norm weights; F16 ones, as bitnet.cpp's embedding converter writes them,
/// widened exactly), copied out of the map and checked for NaN/Inf.
fn bind_f32(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = require(file, name)?;
    check_dims(t, &[len as u64])?;
    let bytes = file.tensor_data(t)?;
    let v: Vec<f32> = match t.ggml_type {
        GgmlType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        GgmlType::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => {
            return Err(ModelError::WrongType {
                name: name.to_string(),
                expected: "F32 or F16",
                found: other.name().to_string(),
            })
        }
    };
    if let Some(index) = v.iter().position(|x| !x.is_finite()) {
        return Err(ModelError::NonFinite {
            name: name.to_string(),
            index,
        });
    }
    Ok(v)
}

fn bind_ternary<'a>(
    file: &'a GgufFile,
    name: &str,
    n_in: usize,
    n_out: usize,
    release: bool,
) -> Result<TernaryMatrix<'a>> {
    let t = require(file, name)?;
    check_dims(t, &[n_in as u64, n_out as u64])?;
    let sibling = names::sibling_scale_names(name)
        .iter()
        .find_map(|s| file.tensor(s))
        .map(|s| file.tensor_data(s)) // exact bytes: their count tells F32 from F16 scales
        .transpose()?;
    let m = match t.ggml_type {
        GgmlType::I2S => {
            let alignment =
                usize::try_from(file.alignment()).map_err(|_| ModelError::Overflow("alignment"))?;
            let m = TernaryMatrix::detect_type36(
                name,
                n_out,
                n_in,
                file.tensor_bytes(t)?,
                alignment,
                sibling,
            )?;
            if m.scales_default_to_one() {
                return Err(ModelError::MissingScales(name.to_string()));
            }
            m
        }
        GgmlType::TQ2_0 => TernaryMatrix::new(
            TernaryLayout::Tq2_0,
            n_out,
            n_in,
            file.tensor_data(t)?,
            None,
        )?,
        GgmlType::TQ1_0 => TernaryMatrix::new(
            TernaryLayout::Tq1_0,
            n_out,
            n_in,
            file.tensor_data(t)?,
            None,
        )?,
        GgmlType::TL1 | GgmlType::TL2 => {
            return Err(ModelError::TiledLayout {
                name: name.to_string(),
                found: t.ggml_type.name().to_string(),
            })
        }
        other => {
            return Err(ModelError::WrongType {
                name: name.to_string(),
                expected: "I2_S, TQ2_0 or TQ1_0",
                found: other.name().to_string(),
            })
        }
    };
    let mut m = m;
    // One pass over the codes at load: counts the never-written code 3 (decoded as 0) and
    // lets clean I2_S matrices use the kernel without the code-3 fix-up (~20% faster).
    m.check_codes();
    if let Some(block) = m.first_non_finite_scale() {
        return Err(ModelError::NonFiniteScale {
            name: name.to_string(),
            block,
        });
    }
    if release {
        // The check read every byte; a streamed model reads them again when it runs.
        file.release(m.packed_data())?;
    }
    Ok(m)
}

/// The row-matrix type of a GGUF type (F32, F16, BF16, Q8_0, Q6_K or Q4_0), if it is one.
pub fn row_type_of(t: GgmlType) -> Option<RowType> {
    Some(match t {
        GgmlType::F32 => RowType::F32,
        GgmlType::F16 => RowType::F16,
        GgmlType::BF16 => RowType::BF16,
        GgmlType::Q8_0 => RowType::Q8_0,
        GgmlType::Q6K => RowType::Q6K,
        GgmlType::Q4_0 => RowType::Q4_0,
        _ => return None,
    })
}

fn row_type(t: &TensorInfo) -> Result<RowType> {
    row_type_of(t.ggml_type).ok_or_else(|| ModelError::WrongType {
        name: t.name.clone(),
        expected: "F32, F16, BF16, Q8_0, Q6_K or Q4_0",
        found: t.ggml_type.name().to_string(),
    })
}

fn bind_rows<'a>(
    file: &'a GgufFile,
    t: &TensorInfo,
    rows: usize,
    cols: usize,
) -> Result<RowMatrix<'a>> {
    check_dims(t, &[cols as u64, rows as u64])?;
    let ty = row_type(t)?;
    Ok(RowMatrix::new(
        ty,
        rows,
        cols,
        Cow::Borrowed(file.tensor_data(t)?),
    )?)
}

impl<'a> Layer<'a> {
    /// Bind block `il` of a model with `config` from `file` (which may be a window of the
    /// file holding just this block's tensors, see [`bitnet_gguf::GgufHeader::window`]).
    pub fn load(file: &'a GgufFile, config: &Config, il: usize) -> Result<Self> {
        Self::bind(file, config, il, false)
    }

    fn bind(file: &'a GgufFile, c: &Config, il: usize, release: bool) -> Result<Self> {
        let n = |t: LayerTensor| t.name(il);
        let (e, kv, ff, qd) = (c.n_embd, c.n_embd_kv(), c.n_ff, c.n_embd_q());
        // A tensor the architecture has (bound) or has not (refused where present: it would
        // be silently ignored).
        let optional = |has: bool, name: String, len: usize| -> Result<Option<Vec<f32>>> {
            if has {
                return bind_f32(file, &name, len).map(Some);
            }
            match file.tensor(&name) {
                Some(_) => Err(ModelError::UnexpectedTensor(name)),
                None => Ok(None),
            }
        };
        let norm_in =
            |t: LayerTensor, len: usize| optional(c.norm_in, names::norm_in_name(t, il), len);
        let norm_in = match (
            norm_in(LayerTensor::AttnQ, e)?,
            norm_in(LayerTensor::AttnK, e)?,
            norm_in(LayerTensor::AttnV, e)?,
            norm_in(LayerTensor::AttnOutput, qd)?,
            norm_in(LayerTensor::FfnGate, e)?,
            norm_in(LayerTensor::FfnUp, e)?,
            norm_in(LayerTensor::FfnDown, ff)?,
        ) {
            (Some(q), Some(k), Some(v), Some(o), Some(gate), Some(up), Some(down)) => {
                Some(NormIn {
                    q,
                    k,
                    v,
                    o,
                    gate,
                    up,
                    down,
                })
            }
            _ => None,
        };
        let block = |stem: &str| names::block_tensor(il, stem);
        let sub_norm = |t: LayerTensor, len: usize| -> Result<Option<Vec<f32>>> {
            if c.sub_norms {
                return bind_f32(file, &n(t), len).map(Some);
            }
            // A sub-norm in a file whose graph has none would be silently ignored.
            match file.tensor(&n(t)) {
                Some(_) => Err(ModelError::UnexpectedTensor(n(t))),
                None => Ok(None),
            }
        };
        Ok(Layer {
            attn_norm: bind_f32(file, &n(LayerTensor::AttnNorm), e)?,
            wq: bind_ternary(file, &n(LayerTensor::AttnQ), e, qd, release)?,
            wk: bind_ternary(file, &n(LayerTensor::AttnK), e, kv, release)?,
            wv: bind_ternary(file, &n(LayerTensor::AttnV), e, kv, release)?,
            attn_sub_norm: sub_norm(LayerTensor::AttnSubNorm, e)?,
            wo: bind_ternary(file, &n(LayerTensor::AttnOutput), qd, e, release)?,
            ffn_norm: bind_f32(file, &n(LayerTensor::FfnNorm), e)?,
            w_gate: bind_ternary(file, &n(LayerTensor::FfnGate), e, ff, release)?,
            w_up: bind_ternary(file, &n(LayerTensor::FfnUp), e, ff, release)?,
            ffn_sub_norm: sub_norm(LayerTensor::FfnSubNorm, ff)?,
            w_down: bind_ternary(file, &n(LayerTensor::FfnDown), ff, e, release)?,
            norm_in,
            attn_q_norm: optional(c.qk_norm, block(names::ATTN_Q_NORM), c.head_dim)?,
            attn_k_norm: optional(c.qk_norm, block(names::ATTN_K_NORM), c.head_dim)?,
            post_attn_norm: optional(c.post_norms, block(names::POST_ATTN_NORM), e)?,
            post_ffw_norm: optional(c.post_norms, block(names::POST_FFW_NORM), e)?,
        })
    }
}

/// An F32 vector of `len` values (a norm's weights) from `file`, checked as the model's are.
pub fn load_f32(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    bind_f32(file, name, len)
}

impl<'a> Model<'a> {
    /// Validate the config and bind every tensor (no weight is copied or dequantized, only
    /// the small F32 norm vectors are).
    pub fn load(file: &'a GgufFile) -> Result<Self> {
        Self::load_with(file, false)
    }

    /// [`Model::load`] that also releases each projection's pages of a mapped file after the
    /// one pass that checks its codes (for the low-memory mode, which streams them).
    pub fn load_releasing(file: &'a GgufFile) -> Result<Self> {
        Self::load_with(file, true)
    }

    fn load_with(file: &'a GgufFile, release: bool) -> Result<Self> {
        let embd = require(file, names::TOKEN_EMBD)?;
        let vocab_rows = embd.dims.get(1).copied();
        let mut config = Config::from_metadata(file.metadata(), vocab_rows)?;
        // bitnet.cpp's embedding models normalize each projection's input (`*_norm_in`); the
        // architecture names alone do not say it, the tensors do.
        config.norm_in = matches!(config.arch.as_str(), "qwen3" | "gemma3")
            && file
                .tensor(&names::norm_in_name(LayerTensor::AttnQ, 0))
                .is_some();
        let c = &config;
        let tok_embd = bind_rows(file, embd, c.n_vocab, c.n_embd)?;
        let output = match file.tensor(names::OUTPUT) {
            Some(t) => Some(bind_rows(file, t, c.n_vocab, c.n_embd)?),
            None => None,
        };
        let output_norm = bind_f32(file, names::OUTPUT_NORM, c.n_embd)?;
        // Llama 3.1-style RoPE frequency factors are not implemented: refuse, never ignore.
        if file.tensor(names::ROPE_FREQS).is_some() {
            return Err(ModelError::Unsupported(format!(
                "RoPE frequency factors ({})",
                names::ROPE_FREQS
            )));
        }
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            layers.push(Layer::bind(file, c, il, release)?);
        }
        // A block beyond block_count means the metadata disagrees with the tensors.
        let extra = format!("blk.{}.", c.n_layer);
        if let Some(t) = file.tensors().iter().find(|t| t.name.starts_with(&extra)) {
            return Err(ModelError::UnexpectedTensor(t.name.clone()));
        }
        Ok(Model {
            config,
            tok_embd,
            output,
            output_norm,
            layers,
            skip: Vec::new(),
            approx_head: None,
            head_screen: None,
        })
    }

    /// A KV cache for this model.
    pub fn new_cache(&self, n_ctx: usize, ty: KvType, budget_bytes: u64) -> Result<KvCache> {
        KvCache::new(&self.config, n_ctx, ty, budget_bytes)
    }

    /// The matrix that produces logits: `output.weight` if present, else the tied embedding.
    pub fn lm_head(&self) -> &RowMatrix<'a> {
        self.output.as_ref().unwrap_or(&self.tok_embd)
    }

    /// Replace the LM head (e.g. with a quantized copy of the embedding).
    pub fn set_lm_head(&mut self, m: RowMatrix<'a>) {
        self.output = Some(m);
    }

    /// Weight bytes read per generated token (every projection and the LM head; for the
    /// approximate head its centroids and the probed share of the rows, on average; for a
    /// screened head the screen, as a greedy or top-k step reads it).
    pub fn bytes_per_token(&self) -> usize {
        let proj: usize = self
            .layers
            .iter()
            .map(|l| l.projections().iter().map(|m| m.nbytes()).sum::<usize>())
            .sum();
        let head = self.lm_head().nbytes();
        // The approximate head reads its centroids and, on average, the probed share of rows.
        let head = match (&self.approx_head, &self.head_screen) {
            (Some(a), _) => {
                a.centroids().nbytes() + head / a.clusters().max(1) * a.probe().min(a.clusters())
            }
            // The screen, and a few hundred candidate rows at most (left out).
            (None, Some(s)) => s.nbytes(),
            (None, None) => head,
        };
        proj + head
    }

    /// Evaluate `tokens` at positions `cache.len()..` and append their K/V to the cache.
    /// Returns logits `[rows][n_vocab]` for the rows `outputs` asks for.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        outputs: Outputs,
        exec: &mut Exec<'_>,
    ) -> Result<Vec<f32>> {
        let mut seqs = [Seq {
            tokens,
            cache,
            outputs,
        }];
        let mut out = self.forward_seqs(&mut seqs, exec)?;
        Ok(out.pop().unwrap_or_default())
    }

    /// [`Model::forward`] of `tokens` for the choice `pick` of the next token only: with a
    /// [`HeadScreen`] (fast numerics, no approximate head) only the logits that can decide it
    /// are computed, from the head's own rows, so the choice is the one the full logits give
    /// ([`Picked::Chosen`] or [`Picked::Top`]); otherwise, or when the screen declines, the
    /// last position's full logits ([`Picked::Logits`]). Errors leave the cache as it was.
    pub fn forward_pick(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        pick: Pick,
        exec: &mut Exec<'_>,
    ) -> Result<Picked> {
        let screen = match &self.head_screen {
            Some(s) if exec.numerics == Numerics::Fast && self.approx_head.is_none() => s,
            _ => {
                return self
                    .forward(tokens, cache, Outputs::Last, exec)
                    .map(Picked::Logits)
            }
        };
        let Some(last) = tokens.len().checked_sub(1) else {
            return Err(ModelError::EmptyBatch);
        };
        let mut seqs = [Seq {
            tokens,
            cache,
            outputs: Outputs::Last,
        }];
        let h = self.run_blocks(&mut seqs, Some(&[last]), exec)?;
        let c = &self.config;
        let mut hn = vec![0.0f32; c.n_embd];
        numerics::rms_norm_for(exec.numerics)(
            &h[last * c.n_embd..(last + 1) * c.n_embd],
            &self.output_norm,
            c.rms_eps,
            &mut hn,
        );
        exec.emit("result_norm", None, &hn, 1);
        let picked = match screen.pick(self.lm_head(), &hn, pick, exec.backend) {
            Ok(Some(p)) => Ok(p),
            Ok(None) => self.lm_head_logits(&hn, 1, exec).and_then(|l| {
                check_finite(&l, c.n_vocab, "a logit")?;
                exec.emit("result_output", None, &l, 1);
                Ok(Picked::Logits(l))
            }),
            Err(e) => Err(e),
        };
        picked.inspect_err(|_| {
            let s = &mut seqs[0];
            let len = s.cache.len().saturating_sub(s.tokens.len());
            s.cache.truncate(len);
        })
    }

    /// [`Model::forward_seqs`] for a step that needs only each sequence's next token:
    /// `picks[i]` is what chooses sequence `i`'s (`None`: its full logits). With a
    /// [`HeadScreen`] (fast numerics, no approximate head) every sequence with
    /// [`Outputs::Last`] and a pick is screened, all in one pass over the screen
    /// ([`HeadScreen::pick_rows`]), and gets the choice the full logits give
    /// ([`Picked::Chosen`] or [`Picked::Top`]); the others, and those the screen declines, get
    /// [`Picked::Logits`]: what `forward_seqs` gives them, from one head pass. Without a
    /// screen this is `forward_seqs`. Errors leave the caches as they were.
    pub fn forward_seqs_pick(
        &self,
        seqs: &mut [Seq<'_>],
        picks: &[Option<Pick>],
        exec: &mut Exec<'_>,
    ) -> Result<Vec<Picked>> {
        if picks.len() != seqs.len() {
            return Err(ModelError::Backend(format!(
                "{} picks for {} sequences",
                picks.len(),
                seqs.len()
            )));
        }
        let screen = match &self.head_screen {
            Some(s)
                if exec.numerics == Numerics::Fast
                    && self.approx_head.is_none()
                    && picks.iter().any(Option::is_some) =>
            {
                s
            }
            _ => {
                let logits = self.forward_seqs(seqs, exec)?;
                return Ok(logits.into_iter().map(Picked::Logits).collect());
            }
        };
        let c = &self.config;
        let (per_seq, keep) = output_rows(seqs);
        let h = self.run_blocks(seqs, Some(&keep), exec)?;
        let numerics = exec.numerics;
        let normed = |rows: &[usize]| self.output_normed(&h, rows, numerics);
        let mut tail = || -> Result<Vec<Picked>> {
            let mut result: Vec<Option<Picked>> = vec![None; seqs.len()];
            // 1. The screened sequences, one pass over the screen.
            let screened: Vec<(usize, usize, Pick)> = seqs
                .iter()
                .zip(picks)
                .zip(&per_seq)
                .enumerate()
                .filter_map(
                    |(i, ((s, p), rows))| match (s.outputs, p, rows.as_slice()) {
                        (Outputs::Last, Some(p), &[r]) => Some((i, r, *p)),
                        _ => None,
                    },
                )
                .collect();
            let rows: Vec<usize> = screened.iter().map(|&(_, r, _)| r).collect();
            let hn = normed(&rows);
            exec.emit("result_norm", None, &hn, rows.len());
            let which: Vec<Pick> = screened.iter().map(|&(_, _, p)| p).collect();
            let answers = screen.pick_rows(self.lm_head(), &hn, &which, exec.backend)?;
            for (&(i, _, _), a) in screened.iter().zip(answers) {
                result[i] = a;
            }
            // 2. Every other output row (and what the screen declined), one head pass.
            let full: Vec<usize> = (0..seqs.len())
                .filter(|&i| result[i].is_none() && !per_seq[i].is_empty())
                .collect();
            let rows: Vec<usize> = full.iter().flat_map(|&i| per_seq[i].clone()).collect();
            let mut rest: &[f32] = &[];
            let logits;
            if !rows.is_empty() {
                let hn = normed(&rows);
                logits = self.lm_head_logits(&hn, rows.len(), exec)?;
                check_finite(&logits, c.n_vocab, "a logit")?;
                exec.emit("result_output", None, &logits, rows.len());
                rest = &logits;
            }
            Ok(result
                .into_iter()
                .zip(&per_seq)
                .map(|(r, rows)| {
                    r.unwrap_or_else(|| {
                        let (mine, more) = rest.split_at(rows.len() * c.n_vocab);
                        rest = more;
                        Picked::Logits(mine.to_vec())
                    })
                })
                .collect())
        };
        tail().inspect_err(|_| {
            for s in seqs.iter_mut() {
                let len = s.cache.len().saturating_sub(s.tokens.len());
                s.cache.truncate(len);
            }
        })
    }

    /// The blocks over several sequences in one pass: their tokens share every ternary matmul
    /// (continuous batching), attention runs per sequence over its own cache, each cache
    /// advances by its tokens. Returns the hidden states `[n][n_embd]` before the output norm.
    /// Rows outside `keep` (row indices of the whole batch, in order; `None`: every row) are
    /// not computed through the last layer, and hold nothing a caller may read.
    fn run_blocks(
        &self,
        seqs: &mut [Seq<'_>],
        keep: Option<&[usize]>,
        exec: &mut Exec<'_>,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if n == 0 || seqs.iter().any(|s| s.tokens.is_empty()) {
            return Err(ModelError::EmptyBatch);
        }
        let mut tokens = Vec::with_capacity(n);
        let mut ropes: Vec<RopeRow> = Vec::with_capacity(n);
        for s in seqs.iter() {
            if let Some(&id) = s
                .tokens
                .iter()
                .find(|&&t| usize::try_from(t).map_or(true, |t| t >= c.n_vocab))
            {
                return Err(ModelError::TokenOutOfRange {
                    id,
                    n_vocab: c.n_vocab,
                });
            }
            s.cache.check_room(s.tokens.len())?;
            let pos0 = s.cache.len();
            tokens.extend_from_slice(s.tokens);
            ropes.extend(
                (pos0..pos0 + s.tokens.len())
                    .map(|p| numerics::rope_row(p, c.n_rot, c.rope_freq_base)),
            );
        }

        // 1. h = E[token]                                  [n][n_embd]
        let mut h = vec![0.0f32; n * c.n_embd];
        for (row, &t) in h.chunks_exact_mut(c.n_embd).zip(&tokens) {
            let r = usize::try_from(t).map_err(|_| ModelError::TokenOutOfRange {
                id: t,
                n_vocab: c.n_vocab,
            })?;
            exec.backend.embedding_row(&self.tok_embd, r, row)?;
            // A NaN here would reach the other positions only through the int8 quantization
            // of K and V, as silently wrong numbers rather than NaN.
            if first_non_finite(row).is_some() {
                return Err(ModelError::NonFiniteEmbedding { token: t });
            }
            if let Some(f) = c.embd_scale {
                row.iter_mut().for_each(|x| *x *= f);
            }
        }
        exec.emit("inp_embd", None, &h, n);

        let skipped = |il: usize| self.skip.get(il).copied().unwrap_or(false);
        let last = (0..self.layers.len()).rev().find(|&il| !skipped(il));
        let mut taken = exec.scratch.take();
        let mut local = Scratch::default();
        let blocks = {
            let sc = match taken.as_deref_mut() {
                Some(sc) => sc,
                None => &mut local,
            };
            self.layers.iter().enumerate().try_for_each(|(il, layer)| {
                exec.backend.begin_layer(il)?;
                if skipped(il) {
                    return Ok(());
                }
                let keep = keep.filter(|_| Some(il) == last);
                self.block(il, layer, &mut h, &ropes, seqs, keep, exec, sc)
            })
        };
        exec.scratch = taken;
        blocks?;

        for s in seqs.iter_mut() {
            s.cache.advance(s.tokens.len());
        }
        Ok(h)
    }

    /// Refuse `tokens` whose row of the embedding table holds NaN or infinity
    /// ([`ModelError::NonFiniteEmbedding`]; out-of-range ids are left to the forward pass).
    /// The CPU's forward pass checks each row it reads; a backend that looks rows up itself
    /// (the GPU) asks here first.
    pub fn check_embedding_rows(&self, tokens: &[u32]) -> Result<()> {
        let mut row = vec![0.0f32; self.config.n_embd];
        for &t in tokens {
            let Some(r) = usize::try_from(t).ok().filter(|&r| r < self.config.n_vocab) else {
                continue;
            };
            self.tok_embd.dequantize_row(r, &mut row)?;
            if first_non_finite(&row).is_some() {
                return Err(ModelError::NonFiniteEmbedding { token: t });
            }
        }
        Ok(())
    }

    /// Evaluate several sequences in one pass: their tokens share every ternary matmul
    /// (continuous batching), attention runs per sequence over its own cache. Returns the
    /// logits of each sequence as [`Model::forward`] would.
    ///
    /// Logits that are NaN or infinite are an error ([`ModelError::NonFiniteOutput`]), and
    /// the caches are then left as they were.
    pub fn forward_seqs(&self, seqs: &mut [Seq<'_>], exec: &mut Exec<'_>) -> Result<Vec<Vec<f32>>> {
        let out = self.forward_seqs_unchecked(seqs, exec)?;
        let n_vocab = self.config.n_vocab;
        check_outputs(seqs, out.iter().map(|l| (l.as_slice(), n_vocab)), "a logit")?;
        Ok(out)
    }

    /// The rows `rows` of the hidden states `h` through the output norm, `[rows][n_embd]`.
    fn output_normed(&self, h: &[f32], rows: &[usize], numerics: Numerics) -> Vec<f32> {
        let c = &self.config;
        let norm = numerics::rms_norm_for(numerics);
        let mut hn = vec![0.0f32; rows.len() * c.n_embd];
        for (dst, &r) in hn.chunks_exact_mut(c.n_embd).zip(rows) {
            norm(
                &h[r * c.n_embd..(r + 1) * c.n_embd],
                &self.output_norm,
                c.rms_eps,
                dst,
            );
        }
        hn
    }

    fn forward_seqs_unchecked(
        &self,
        seqs: &mut [Seq<'_>],
        exec: &mut Exec<'_>,
    ) -> Result<Vec<Vec<f32>>> {
        let c = &self.config;
        let (per_seq, keep) = output_rows(seqs);
        let h = self.run_blocks(seqs, Some(&keep), exec)?;

        // logits = E · RMS(h, output_norm). Fast numerics: one head pass for every output row
        // of every sequence (the head is the largest read of a decode step; a row's logits
        // do not depend on the other rows of the call). Exact numerics: per sequence, since
        // the reference's accumulation order depends on the number of rows.
        let numerics = exec.numerics;
        let normed = |rows: &[usize]| self.output_normed(&h, rows, numerics);
        let mut result = Vec::with_capacity(seqs.len());
        if exec.numerics == Numerics::Fast && per_seq.iter().filter(|r| !r.is_empty()).count() > 1 {
            let hn = normed(&keep);
            exec.emit("result_norm", None, &hn, keep.len());
            let logits = self.lm_head_logits(&hn, keep.len(), exec)?;
            exec.emit("result_output", None, &logits, keep.len());
            let mut rest = logits.as_slice();
            for rows in &per_seq {
                let (mine, tail) = rest.split_at(rows.len() * c.n_vocab);
                result.push(mine.to_vec());
                rest = tail;
            }
            return Ok(result);
        }
        for rows in &per_seq {
            if rows.is_empty() {
                result.push(Vec::new());
                continue;
            }
            let hn = normed(rows);
            exec.emit("result_norm", None, &hn, rows.len());
            let logits = self.lm_head_logits(&hn, rows.len(), exec)?;
            exec.emit("result_output", None, &logits, rows.len());
            result.push(logits);
        }
        Ok(result)
    }

    /// Embeddings of several sequences in one pass (as [`Model::forward_seqs`] runs them):
    /// for each, the output-normed hidden states reduced by `pooling` — one `n_embd` vector, or
    /// for [`Pooling::None`] one per position — not yet L2-normalized
    /// ([`numerics::l2_normalized`]). The sequences' `outputs` are not used.
    pub fn embed_seqs(
        &self,
        seqs: &mut [Seq<'_>],
        pooling: Pooling,
        exec: &mut Exec<'_>,
    ) -> Result<Vec<Vec<f32>>> {
        let e = self.config.n_embd;
        let mut per_seq: Vec<Vec<usize>> = Vec::with_capacity(seqs.len());
        let mut first = 0;
        for s in seqs.iter() {
            let len = s.tokens.len();
            per_seq.push(match pooling {
                Pooling::Last => vec![first + len - 1],
                Pooling::Cls => vec![first],
                Pooling::Mean | Pooling::None => (first..first + len).collect(),
            });
            first += len;
        }
        let keep: Vec<usize> = per_seq.iter().flatten().copied().collect();
        let h = self.run_blocks(seqs, Some(&keep), exec)?;
        let norm = numerics::rms_norm_for(exec.numerics);
        let mut out = Vec::with_capacity(seqs.len());
        for (s, rows) in seqs.iter().zip(&per_seq) {
            let len = s.tokens.len();
            let mut hn = vec![0.0f32; rows.len() * e];
            for (dst, &r) in hn.chunks_exact_mut(e).zip(rows) {
                norm(
                    &h[r * e..(r + 1) * e],
                    &self.output_norm,
                    self.config.rms_eps,
                    dst,
                );
            }
            exec.emit("result_norm", None, &hn, rows.len());
            if pooling == Pooling::Mean {
                // llama.cpp's mean: every row times 1/n, summed in order.
                #[allow(clippy::cast_precision_loss)]
                let w = 1.0 / len as f32;
                let mut m = vec![0.0f32; e];
                for row in hn.chunks_exact(e) {
                    m.iter_mut().zip(row).for_each(|(a, &x)| *a += x * w);
                }
                hn = m;
            }
            out.push(hn);
        }
        check_outputs(seqs, out.iter().map(|v| (v.as_slice(), e)), "a value")?;
        Ok(out)
    }

    /// One transformer block, in place on `h` ([n][n_embd]), its intermediates in `sc`. With
    /// `keep` (the last layer), only those rows of `h` are computed past the attention; the
    /// others keep what they held.
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        il: usize,
        l: &Layer<'_>,
        h: &mut [f32],
        ropes: &[RopeRow],
        seqs: &mut [Seq<'_>],
        keep: Option<&[usize]>,
        exec: &mut Exec<'_>,
        sc: &mut Scratch,
    ) -> Result<()> {
        let c = &self.config;
        let n = ropes.len();
        let (e, kv, qd) = (c.n_embd, c.n_embd_kv(), c.n_embd_q());
        let li = Some(il);

        // 1. a = RMS(h, attn_norm)
        // 2. Q, K, V = Lin(Wq, a), Lin(Wk, a), Lin(Wv, a); where each projection has an input
        //    norm of its own, Lin(W, RMS(a, W's norm_in))
        self.norm_project(
            h,
            (
                &l.attn_norm,
                l.norm_in.as_ref().map(|ni| [&ni.q, &ni.k, &ni.v]),
            ),
            [(&l.wq, &mut sc.q), (&l.wk, &mut sc.k), (&l.wv, &mut sc.v)],
            (&mut sc.a, &mut sc.rs, &mut sc.xq, &mut sc.s),
            exec,
            ("attn_norm", li, n),
        )?;
        exec.emit("Qcur", li, &sc.q, n);
        exec.emit("Kcur", li, &sc.k, n);
        exec.emit("Vcur", li, &sc.v, n);
        // 2b. Q, K = RMS(Q, attn_q_norm), RMS(K, attn_k_norm), head by head (qwen3, gemma3)
        let hd = c.head_dim;
        if let (Some(qn), Some(kn)) = (&l.attn_q_norm, &l.attn_k_norm) {
            let (eps, nm) = (c.rms_eps, exec.numerics);
            each_row2(
                exec,
                &mut sc.q[..n * qd],
                qd,
                &mut sc.k[..n * kv],
                kv,
                &|_, qs, ks| {
                    let mut tmp = vec![0.0f32; hd];
                    for (x, w) in [(qs, qn), (ks, kn)] {
                        let mut f = vec![0f32; x.len() / hd.max(1)];
                        numerics::rms_scales(x, hd, eps, nm, &mut f);
                        for (head, &f) in x.chunks_exact_mut(hd).zip(&f) {
                            numerics::scale_row(head, f, w, &mut tmp);
                            head.copy_from_slice(&tmp);
                        }
                    }
                },
            )?;
            exec.emit("Qcur_normed", li, &sc.q, n);
            exec.emit("Kcur_normed", li, &sc.k, n);
        }
        // 3. Q, K = RoPE(Q, pos), RoPE(K, pos) (NEOX, or normal for `llama`); gemma3 then
        //    scales Q by 1/sqrt(head_dim) (and attention K·Q by 1)
        let (n_rot, nm) = (c.n_rot, exec.numerics);
        let rope_head = numerics::rope_for(c.rope_style);
        #[allow(clippy::cast_precision_loss)]
        let q_scale = c.q_prescale.then(|| 1.0 / (hd as f32).sqrt());
        each_row2(
            exec,
            &mut sc.q[..n * qd],
            qd,
            &mut sc.k[..n * kv],
            kv,
            &|r, qs, ks| {
                let rows = qs.chunks_exact_mut(qd).zip(ks.chunks_exact_mut(kv));
                for (rope, (qr, kr)) in ropes[r].iter().zip(rows) {
                    for head in qr.chunks_exact_mut(hd).chain(kr.chunks_exact_mut(hd)) {
                        rope_head(&mut head[..n_rot], rope, nm);
                    }
                    if let Some(f) = q_scale {
                        qr.iter_mut().for_each(|x| *x *= f);
                    }
                }
            },
        )?;
        exec.emit("q_rope", li, &sc.q, n);
        exec.emit("k_rope", li, &sc.k, n);
        // 4. O = Attn(Q, K, V) over each sequence's cache (causal, GQA)
        let o = sized(&mut sc.o, n * qd);
        let mut first = 0;
        for sq in seqs.iter_mut() {
            let (len, pos0) = (sq.tokens.len(), sq.cache.len());
            let rows = first..first + len;
            sq.cache.store(
                il,
                pos0,
                &sc.k[rows.start * kv..rows.end * kv],
                &sc.v[rows.start * kv..rows.end * kv],
            );
            exec.backend.attention(
                c,
                &sc.q[rows.start * qd..rows.end * qd],
                sq.cache,
                il,
                pos0,
                len,
                exec.numerics,
                &mut o[rows.start * qd..rows.end * qd],
            )?;
            first += len;
        }
        exec.emit("kqv_out", li, &sc.o, n);
        let o = std::mem::take(&mut sc.o);
        let tail = match keep {
            // The last layer's rows that no output reads stop here (llama.cpp's `inp_out_ids`).
            // Every later step works row by row, so the kept rows come out with the same bits.
            // A traced pass keeps every row.
            Some(rows) if rows.len() < n && exec.trace.is_none() => {
                let gather = |x: &[f32], w: usize| -> Vec<f32> {
                    rows.iter()
                        .flat_map(|&r| &x[r * w..(r + 1) * w])
                        .copied()
                        .collect()
                };
                let mut hk = gather(h, e);
                let done = if rows.is_empty() {
                    Ok(())
                } else {
                    self.block_tail(il, l, &mut hk, &gather(&o, qd), exec, sc)
                };
                for (&r, src) in rows.iter().zip(hk.chunks_exact(e)) {
                    h[r * e..(r + 1) * e].copy_from_slice(src);
                }
                done
            }
            _ => self.block_tail(il, l, h, &o, exec, sc),
        };
        sc.o = o;
        tail
    }

    /// Steps 5–10 of the block (Wo with its norms, the FFN) on `n` rows: `h` ([n][n_embd]) in
    /// place, `o` ([n][n_head · head_dim]) the attention output.
    fn block_tail(
        &self,
        il: usize,
        l: &Layer<'_>,
        h: &mut [f32],
        o: &[f32],
        exec: &mut Exec<'_>,
        sc: &mut Scratch,
    ) -> Result<()> {
        let c = &self.config;
        let (e, ff, qd) = (c.n_embd, c.n_ff, c.n_embd_q());
        let n = h.len() / e.max(1);
        let li = Some(il);
        // 5. O = RMS(O, attn_sub_norm), where the architecture has it (or Wo's input norm)
        let o_norm = match &l.norm_in {
            Some(ni) => Some(ni.o.as_slice()),
            None => l.attn_sub_norm.as_deref(),
        };
        // 6. h = h + Lin(Wo, O) (gemma3: h + RMS(Lin(Wo, O), post_attention_norm))
        self.lin_residual(
            h,
            o,
            (&l.wo, qd),
            (o_norm, l.post_attn_norm.as_deref()),
            (
                &mut sc.a, &mut sc.b, &mut sc.rs, &mut sc.t, &mut sc.xq, &mut sc.s,
            ),
            exec,
            (["attn_sub_norm", "attn_post_norm", "ffn_inp"], li, n),
        )?;
        // 7. f = RMS(h, ffn_norm)
        // 8. g = act(Lin(Wgate, f)) * Lin(Wup, f) (with their input norms, where they have them)
        self.norm_project(
            h,
            (&l.ffn_norm, l.norm_in.as_ref().map(|ni| [&ni.gate, &ni.up])),
            [(&l.w_gate, &mut sc.g), (&l.w_up, &mut sc.up)],
            (&mut sc.a, &mut sc.rs, &mut sc.xq, &mut sc.s),
            exec,
            ("ffn_norm", li, n),
        )?;
        let (act, up) = (c.activation, &sc.up);
        each_row(exec, &mut sc.g[..n * ff], ff, &|r, gs| {
            let us = &up[r.start * ff..r.end * ff];
            match act {
                Activation::Relu2 => gs.iter_mut().zip(us).for_each(|(g, &u)| {
                    let r = g.max(0.0);
                    *g = (r * r) * u;
                }),
                Activation::Silu | Activation::Gelu => {
                    for (grow, urow) in gs.chunks_exact_mut(ff).zip(us.chunks_exact(ff)) {
                        if act == Activation::Silu {
                            numerics::silu_row(grow);
                        } else {
                            numerics::gelu_row(grow);
                        }
                        grow.iter_mut().zip(urow).for_each(|(g, &u)| *g *= u);
                    }
                }
            }
        })?;
        exec.emit("ffn_act", li, &sc.g, n);
        // 9. g = RMS(g, ffn_sub_norm), where the architecture has it (or Wdown's input norm)
        let g_norm = match &l.norm_in {
            Some(ni) => Some(ni.down.as_slice()),
            None => l.ffn_sub_norm.as_deref(),
        };
        // 10. h = h + Lin(Wdown, g) (gemma3: h + RMS(Lin(Wdown, g), post_ffw_norm))
        self.lin_residual(
            h,
            &sc.g,
            (&l.w_down, ff),
            (g_norm, l.post_ffw_norm.as_deref()),
            (
                &mut sc.a, &mut sc.b, &mut sc.rs, &mut sc.t, &mut sc.xq, &mut sc.s,
            ),
            exec,
            (["ffn_sub_norm", "ffn_post_norm", "l_out"], li, n),
        )?;
        Ok(())
    }

    /// A residual step of the block (attention output, FFN down):
    /// `h += post(Lin(W, pre(x)))` over `n` rows of `x`, `width` wide, where `pre` is the
    /// sub-norm or W's input norm and `post` the post-norm (gemma3), each only where the
    /// architecture has it; `trace` names the pre-norm, post-norm and result outputs.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn lin_residual(
        &self,
        h: &mut [f32],
        x: &[f32],
        (w, width): (&TernaryMatrix<'_>, usize),
        (pre, post): (Option<&[f32]>, Option<&[f32]>),
        (a, b, rs, t, xq, s): (
            &mut Vec<f32>,
            &mut Vec<f32>,
            &mut Vec<f32>,
            &mut Vec<f32>,
            &mut Vec<i8>,
            &mut Vec<f32>,
        ),
        exec: &mut Exec<'_>,
        (names, li, n): ([&'static str; 3], Option<usize>, usize),
    ) -> Result<()> {
        let e = self.config.n_embd;
        match pre {
            Some(pw) => {
                self.norm_quantize(x, pw, width, (a, rs, xq, s), exec, (names[0], li, n))?
            }
            None => quantize_rows(x, width, None, xq, s, exec)?,
        }
        self.lin(w, xq, s, n, exec, t)?;
        let y = self.sub_norm(t, post, e, b, exec, (names[1], li, n))?;
        add_in_place(h, y, e, exec)?;
        exec.emit(names[2], li, h, n);
        Ok(())
    }

    /// A sub-norm step: `x` RMS-normed into `y` (and traced as `trace`) when the block has the
    /// weights `w`, else `x` itself (`llama` blocks have none).
    fn sub_norm<'s>(
        &self,
        x: &'s [f32],
        w: Option<&[f32]>,
        width: usize,
        y: &'s mut Vec<f32>,
        exec: &mut Exec<'_>,
        trace: (&'static str, Option<usize>, usize),
    ) -> Result<&'s [f32]> {
        let Some(w) = w else { return Ok(x) };
        self.norm_rows(x, w, width, y, exec)?;
        exec.emit(trace.0, trace.1, y, trace.2);
        Ok(y)
    }

    /// `xq`, `s` = the int8 codes and scales of `RMS(x, w)` over rows of `width` (traced as
    /// `trace`). Unless the pass is traced, the normed rows are never written out: each is
    /// normed into a per-thread buffer and quantized there ([`quantize_rows`] with the RMS
    /// factors: the same bits as quantizing what [`Self::norm_rows`] writes); traced, they go
    /// through `a`.
    #[allow(clippy::type_complexity)]
    fn norm_quantize(
        &self,
        x: &[f32],
        w: &[f32],
        width: usize,
        (a, rs, xq, s): (&mut Vec<f32>, &mut Vec<f32>, &mut Vec<i8>, &mut Vec<f32>),
        exec: &mut Exec<'_>,
        trace: (&'static str, Option<usize>, usize),
    ) -> Result<()> {
        if exec.trace.is_some() {
            self.norm_rows(x, w, width, a, exec)?;
            exec.emit(trace.0, trace.1, a, trace.2);
            return quantize_rows(a, width, None, xq, s, exec);
        }
        self.row_scales(x, width, rs, exec)?;
        quantize_rows(x, width, Some((rs, w)), xq, s, exec)
    }

    /// `y` = each `width`-row of `x` RMS-normed with weights `w`.
    fn norm_rows(
        &self,
        x: &[f32],
        w: &[f32],
        width: usize,
        y: &mut Vec<f32>,
        exec: &Exec<'_>,
    ) -> Result<()> {
        let y = sized(y, x.len());
        let (eps, nm) = (self.config.rms_eps, exec.numerics);
        each_row(exec, y, width, &|r, ys| {
            let xs = &x[r.start * width..r.end * width];
            let mut f = vec![0f32; r.len()];
            numerics::rms_scales(xs, width, eps, nm, &mut f);
            for ((src, dst), &f) in xs
                .chunks_exact(width)
                .zip(ys.chunks_exact_mut(width))
                .zip(&f)
            {
                numerics::scale_row(src, f, w, dst);
            }
        })
    }

    /// A block's input step: `a = RMS(h, norm)` (traced as `trace`), then `out = Lin(W, a)`
    /// for each projection, or, where the projections have input norms of their own (`own`,
    /// embedding models), `out = Lin(W, RMS(a, W's input norm))`: one RMS factor per row of
    /// `a`, shared, and each row normed and quantized in one pass ([`quantize_rows`]).
    /// Without input norms `a` is only quantized ([`Self::norm_quantize`]).
    #[allow(clippy::type_complexity)]
    fn norm_project<const P: usize>(
        &self,
        h: &[f32],
        (norm, own): (&[f32], Option<[&Vec<f32>; P]>),
        projections: [(&TernaryMatrix<'_>, &mut Vec<f32>); P],
        (a, rs, xq, s): (&mut Vec<f32>, &mut Vec<f32>, &mut Vec<i8>, &mut Vec<f32>),
        exec: &mut Exec<'_>,
        trace: (&'static str, Option<usize>, usize),
    ) -> Result<()> {
        let (e, n) = (self.config.n_embd, trace.2);
        let Some(own) = own else {
            self.norm_quantize(h, norm, e, (a, rs, xq, s), exec, trace)?;
            for (w, out) in projections {
                self.lin(w, xq, s, n, exec, out)?;
            }
            return Ok(());
        };
        self.norm_rows(h, norm, e, a, exec)?;
        exec.emit(trace.0, trace.1, a, n);
        self.row_scales(a, e, rs, exec)?;
        for ((w, out), own) in projections.into_iter().zip(own) {
            quantize_rows(a, e, Some((rs, own)), xq, s, exec)?;
            self.lin(w, xq, s, n, exec, out)?;
        }
        Ok(())
    }

    /// `rs` = the RMS factor of each `width`-row of `x` ([`numerics::rms_scales`]).
    fn row_scales(
        &self,
        x: &[f32],
        width: usize,
        rs: &mut Vec<f32>,
        exec: &Exec<'_>,
    ) -> Result<()> {
        let rs = sized(rs, x.len() / width.max(1));
        let (eps, nm) = (self.config.rms_eps, exec.numerics);
        each_row(exec, rs, 1, &|r, out| {
            numerics::rms_scales(&x[r.start * width..r.end * width], width, eps, nm, out);
        })
    }

    /// `Lin(W, x)`: the ternary matmul over int8 activations (docs/FORMATS.md §1).
    fn lin(
        &self,
        w: &TernaryMatrix<'_>,
        xq: &[i8],
        s: &[f32],
        n: usize,
        exec: &Exec<'_>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let out = sized(out, n * w.n_out());
        exec.backend.ternary_matmul(w, xq, s, out)
    }

    /// Logits for `rows` normed hidden states.
    fn lm_head_logits(&self, hn: &[f32], rows: usize, exec: &Exec<'_>) -> Result<Vec<f32>> {
        let head = self.lm_head();
        let n_vocab = self.config.n_vocab;
        let mut logits = vec![0.0f32; rows * n_vocab];
        match &self.approx_head {
            Some(a) if exec.numerics == Numerics::Fast => {
                a.logits(head, hn, rows, exec.backend, &mut logits)?
            }
            _ => exec
                .backend
                .lm_head(head, hn, rows, exec.numerics, &mut logits)?,
        }
        Ok(logits)
    }
}

/// Refuse `values` (rows of `width`) that hold NaN or infinity: [`ModelError::NonFiniteOutput`]
/// naming `what` and the first such entry.
pub fn check_finite(values: &[f32], width: usize, what: &'static str) -> Result<()> {
    let Some(i) = first_non_finite(values) else {
        return Ok(());
    };
    let w = width.max(1);
    Err(ModelError::NonFiniteOutput {
        what,
        row: i / w,
        index: i % w,
    })
}

/// The batch rows each sequence's `outputs` asks for (row indices of the whole batch), and
/// all of them in order. A sequence has at least one token ([`Model::run_blocks`] refuses an
/// empty one).
fn output_rows(seqs: &[Seq<'_>]) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut per_seq: Vec<Vec<usize>> = Vec::with_capacity(seqs.len());
    let mut first = 0;
    for s in seqs {
        let len = s.tokens.len();
        per_seq.push(match s.outputs {
            Outputs::None => Vec::new(),
            Outputs::Last => vec![first + len.saturating_sub(1)],
            Outputs::All => (first..first + len).collect(),
        });
        first += len;
    }
    let keep = per_seq.iter().flatten().copied().collect();
    (per_seq, keep)
}

/// [`check_finite`] over each sequence's results (`outputs`: its values and their row
/// width), winding every sequence's cache back past the tokens the call added on a refusal.
fn check_outputs<'v>(
    seqs: &mut [Seq<'_>],
    mut outputs: impl Iterator<Item = (&'v [f32], usize)>,
    what: &'static str,
) -> Result<()> {
    outputs
        .try_for_each(|(v, width)| check_finite(v, width, what))
        .inspect_err(|_| {
            for s in seqs.iter_mut() {
                let len = s.cache.len().saturating_sub(s.tokens.len());
                s.cache.truncate(len);
            }
        })
}

/// Per-token int8 quantization of `[n][width]` activations into codes `q` and scales `s`:
/// of the rows of `x` themselves, or, with `norm = (rs, w)`, of `RMS(x, w)` given each row's
/// RMS factor `rs`. A normed row goes through a per-thread buffer ([`numerics::scale_row`],
/// bit for bit as [`Model::norm_rows`] writes it) and is never written out.
fn quantize_rows(
    x: &[f32],
    width: usize,
    norm: Option<(&[f32], &[f32])>,
    q: &mut Vec<i8>,
    s: &mut Vec<f32>,
    exec: &Exec<'_>,
) -> Result<()> {
    let q = sized(q, x.len());
    let s = sized(s, x.len() / width.max(1));
    each_row2(exec, q, width, s, 1, &|r, qs, ss| {
        let mut y = vec![0.0f32; if norm.is_some() { width } else { 0 }];
        let xs = &x[r.start * width..r.end * width];
        let rows = xs.chunks_exact(width).zip(qs.chunks_exact_mut(width));
        for (i, ((row, qr), sv)) in rows.zip(ss.iter_mut()).enumerate() {
            *sv = match norm {
                Some((rs, w)) => {
                    numerics::scale_row(row, rs[r.start + i], w, &mut y);
                    act::quantize_i8(&y, qr)
                }
                None => act::quantize_i8(row, qr),
            };
        }
    })
}

/// `h += d`, element by element, `width` at a time.
fn add_in_place(h: &mut [f32], d: &[f32], width: usize, exec: &Exec<'_>) -> Result<()> {
    each_row(exec, h, width, &|r, hs| {
        for (a, b) in hs.iter_mut().zip(&d[r.start * width..r.end * width]) {
            *a += b;
        }
    })
}
