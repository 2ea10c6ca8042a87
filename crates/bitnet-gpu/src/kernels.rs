//! The compiled kernels and their geometry: the constants the WGSL sources are built with
//! and the dispatches are sized by, shared by the model's pass (model.rs) and the kernel
//! probes (probe.rs); device.rs opens the adapter and compiles them.

use crate::{GpuError, Result};

/// Head size the attention kernel holds (`qs` and `ACC` in attention.wgsl).
pub(crate) const MAX_HEAD_DIM: usize = 256;
/// Tokens the top-k read-back returns (`K` in topk_local.wgsl and topk_merge.wgsl).
pub const TOP_CANDIDATES: usize = 64;
/// Workgroups of the top-k's first pass at most, and logits per workgroup at most (256 threads
/// × `P` in topk_select.wgsl).
pub(crate) const TOPK_GROUPS: usize = 256;
pub(crate) const TOPK_CHUNK: usize = 256 * 64;

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
/// Rows from which a call takes the lane GEMM (gemm_lanes.wgsl) on the lane kernels'
/// adapters: each weight it unpacks serves four rows, where the lane decode kernels unpack
/// it again for every row.
pub(crate) const LANES_GEMM_MIN_TOKENS: usize = 2;
/// Workgroups of the greedy arg-max (`GROUPS` in argmax.wgsl), one (index, value) pair each.
pub(crate) const ARGMAX_GROUPS: usize = 64;
/// LM-head rows per workgroup (`RPW` in head.wgsl; head_lanes.wgsl takes `LANES_ROWS`).
pub(crate) const HEAD_ROWS: usize = 4;
/// Threads a workgroup of the lane decode kernels (`WG` in mv_rows.wgsl), four output rows
/// each.
pub(crate) const LANES_WG: usize = 64;
/// Output rows a workgroup of the lane decode kernels computes.
pub(crate) const LANES_ROWS: usize = 4 * LANES_WG;

/// Rows a call may have for attention to split its positions into chunks over workgroups
/// (attention_split.wgsl): a decode step.
pub(crate) const ATTN_SPLIT_TOKENS: usize = 4;
/// The fewest positions worth a chunk of their own (one block of 64).
pub(crate) const ATTN_CHUNK: usize = 64;
/// The most chunks (one merge thread each).
pub(crate) const ATTN_MAX_SPLIT: usize = 64;

/// Workgroups per (head, row) that attention runs for a call of `n` rows over `n_kv` positions
/// (attention_split.wgsl's `n_split()`) where calls of at most `split_tokens` rows split
/// (ATTN_SPLIT_TOKENS, or 0 for never); more than one needs the merge kernel after it.
pub(crate) fn attn_split(n: usize, n_kv: usize, split_tokens: usize) -> Result<u32> {
    let split = if n <= split_tokens {
        n_kv.div_ceil(ATTN_CHUNK).min(ATTN_MAX_SPLIT)
    } else {
        1
    };
    u32::try_from(split).map_err(|_| GpuError::Overflow("attention chunks"))
}

/// Floats of the chunk states a split attention call writes, for `n_head` heads of `head_dim`.
pub(crate) fn attn_part_len(n_head: usize, head_dim: usize) -> Result<usize> {
    (ATTN_SPLIT_TOKENS * ATTN_MAX_SPLIT)
        .checked_mul(n_head)
        .and_then(|x| x.checked_mul(head_dim + 2))
        .ok_or(GpuError::Overflow("attention chunks"))
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
        k: &Kernels,
    ) -> Option<(&wgpu::ComputePipeline, &wgpu::ComputePipeline, usize)> {
        let (m, g, rows) = match self {
            MvKind::Quant => (&k.mv_q, &k.mv_glu_q, k.mv_rows),
            MvKind::Norm => (&k.mv, &k.mv_glu, k.mv_rows),
            MvKind::Lanes => (&k.mv_lanes, &k.mv_glu_lanes, LANES_ROWS),
        };
        Some((m.as_ref()?, g.as_ref()?, rows))
    }
}

/// The compiled kernels (one pipeline each, layouts taken from the shaders).
#[derive(Debug)]
pub(crate) struct Kernels {
    pub norm_quant: wgpu::ComputePipeline,
    /// norm_quant.wgsl in workgroups of 32 (the CPU-lane adapters'; `None` elsewhere).
    pub norm_quant_lanes: Option<wgpu::ComputePipeline>,
    pub rmsnorm: wgpu::ComputePipeline,
    /// rmsnorm.wgsl that quantizes each normed row per 32 for a quantized LM head.
    pub rmsnorm_q8: wgpu::ComputePipeline,
    pub ternary: wgpu::ComputePipeline,
    /// RoPE on the new rows' Q and K, and their K and V stored into the cache: for an f16
    /// cache and an f32 one.
    pub rope_f16: wgpu::ComputePipeline,
    pub rope_f32: wgpu::ComputePipeline,
    pub rope_q8: wgpu::ComputePipeline,
    pub attention_f32: wgpu::ComputePipeline,
    pub attention_f16: wgpu::ComputePipeline,
    pub attention_q8: wgpu::ComputePipeline,
    pub attention_merge: wgpu::ComputePipeline,
    pub ternary_glu: wgpu::ComputePipeline,
    /// The prompt GEMM with its tiles in workgroup memory (gemm.wgsl).
    pub gemm: wgpu::ComputePipeline,
    /// The prompt GEMM for adapters that run invocations as SIMD lanes (gemm_lanes.wgsl);
    /// compiled for such adapters only.
    pub gemm_lanes: Option<wgpu::ComputePipeline>,
    /// The lane GEMM is the one the model runs (its bind groups are made for it).
    pub gemm_lanes_default: bool,
    pub head: wgpu::ComputePipeline,
    pub argmax: wgpu::ComputePipeline,
    pub embed: wgpu::ComputePipeline,
    pub topk_local: wgpu::ComputePipeline,
    pub topk_merge: wgpu::ComputePipeline,
    /// The decode kernels, where the adapter's workgroup memory holds them (16 KiB): with
    /// the norm in their prologue, and over rows norm_quant quantized (`_q`).
    pub mv: Option<wgpu::ComputePipeline>,
    pub mv_glu: Option<wgpu::ComputePipeline>,
    pub mv_q: Option<wgpu::ComputePipeline>,
    pub mv_glu_q: Option<wgpu::ComputePipeline>,
    /// Activation words (u32) their workgroup memory holds.
    pub mv_words: usize,
    /// Output rows a workgroup of theirs computes.
    pub mv_rows: usize,
    /// The decode kernels for adapters that run a workgroup's invocations as the lanes of a
    /// CPU's SIMD registers (lavapipe, SwiftShader): four output rows a thread, the norm in
    /// their prologue (mv_rows.wgsl, mv_glu_rows.wgsl); compiled for such adapters only.
    pub mv_lanes: Option<wgpu::ComputePipeline>,
    pub mv_glu_lanes: Option<wgpu::ComputePipeline>,
    /// mv_rows.wgsl over Q, K and V with RoPE and the cache store in its epilogue
    /// (mv_out_rope.wgsl), for an f16 cache and an f32 one.
    pub mv_qkv_lanes_f16: Option<wgpu::ComputePipeline>,
    pub mv_qkv_lanes_f32: Option<wgpu::ComputePipeline>,
    /// head.wgsl in the same manner (head_lanes.wgsl), for the same adapters.
    pub head_lanes: Option<wgpu::ComputePipeline>,
    /// The quantized LM head (head_q.wgsl) for Q8_0 and Q4_0 rows, and its lane form for
    /// the same adapters as head_lanes.
    pub head_q: [wgpu::ComputePipeline; 2],
    pub head_q_lanes: Option<[wgpu::ComputePipeline; 2]>,
}

const COMMON: &str = include_str!("shaders/common.wgsl");
/// The attention kernel's body; a prelude in front of it says how the cache is read.
const ATTENTION: &str = include_str!("shaders/attention.wgsl");
/// How attention splits a call's positions over workgroups, shared with its merge kernel.
const SPLIT: &str = include_str!("shaders/attention_split.wgsl");
/// RMSNorm's bindings and row scale, shared by the two norm kernels.
const NORM: &str = include_str!("shaders/norm_common.wgsl");
const NORM_QUANT: &str = include_str!("shaders/norm_quant.wgsl");
/// RoPE and the cache store; a prelude in front of it says how the cache is written.
const ROPE: &str = include_str!("shaders/rope.wgsl");
/// The prompt GEMMs' shape, bindings and epilogue.
const GEMM: &str = include_str!("shaders/gemm_common.wgsl");
/// The LM head kernels' shape and bindings (the stores after the bindings, which they use).
const HEAD: &str = concat!(
    include_str!("shaders/head_common.wgsl"),
    "\n",
    include_str!("shaders/head_shared.wgsl")
);
/// The quantized LM head kernels' shape and bindings.
const HEAD_Q: &str = concat!(
    include_str!("shaders/head_q_common.wgsl"),
    "\n",
    include_str!("shaders/head_shared.wgsl")
);
/// The top-k kernels' shared selection.
const TOPK: &str = include_str!("shaders/topk_select.wgsl");

const MV_OUT: &str = include_str!("shaders/mv_out.wgsl");
const MV: &str = include_str!("shaders/mv.wgsl");
const MV_GLU: &str = include_str!("shaders/mv_glu.wgsl");
const MV_GLU_OUT: &str = include_str!("shaders/mv_glu_out.wgsl");
const MV_IN_NORM: &str = include_str!("shaders/mv_in_norm.wgsl");
const MV_IN_Q: &str = include_str!("shaders/mv_in_q.wgsl");
const MV_ROWS_COMMON: &str = include_str!("shaders/mv_rows_common.wgsl");
const MV_LANES: &str = include_str!("shaders/mv_rows.wgsl");
const MV_GLU_LANES: &str = include_str!("shaders/mv_glu_rows.wgsl");
const MV_OUT_ROPE: &str = include_str!("shaders/mv_out_rope.wgsl");

/// A decode kernel's source: its constants and shared code, how its input comes in (at
/// bindings `b0` and `b1`), its body.
fn mv_source(prelude: &str, input: &str, body: &str, b0: &str, b1: &str) -> String {
    let input = input.replace("B_IN0", b0).replace("B_IN1", b1);
    format!("{prelude}\n{input}\n{body}")
}

/// Workgroup memory of the decode kernels besides their activations (two 256-entry vec4
/// reduction arrays and the per-token scales and sums).
const MV_FIXED_STORAGE: u32 = 2 * 256 * 16 + 64;
/// Activation words the decode kernels hold at most: one row of 8192 values. More would let a
/// group take more of a call's rows but fit fewer workgroups on a core: a decode step has one.
const MV_WORDS_MAX: u32 = 2048;

impl Kernels {
    /// `lanes`: the adapter runs invocations as SIMD lanes (a CPU device): also compile the
    /// lane decode kernels.
    pub(crate) fn new(device: &wgpu::Device, storage: u32, lanes: bool) -> Self {
        let split = format!(
            "const CHUNK: u32 = {ATTN_CHUNK}u;\n\
             const MAX_SPLIT: u32 = {ATTN_MAX_SPLIT}u;\n{SPLIT}"
        );
        // The decode kernels' constants: their activation words fill what workgroup memory
        // is left, up to MV_WORDS_MAX (no decode kernels below 16 KiB).
        let mv_words = (storage.saturating_sub(MV_FIXED_STORAGE) / 4 / 4 * 4).min(MV_WORDS_MAX);
        // Output rows a workgroup of the decode kernels takes (a team of 256 / rows threads
        // each): MV_ROWS, or for measuring others BITNET_GPU_MV_ROWS (4, 8, 16 or 32).
        let mv_rows = match std::env::var("BITNET_GPU_MV_ROWS").as_deref() {
            Ok("4") => 4,
            Ok("8") => 8,
            Ok("16") => 16,
            Ok("32") => 32,
            _ => MV_ROWS,
        };
        let mv_prelude = (storage >= 16 << 10).then(|| {
            format!(
                "const WG: u32 = 256u;\nconst LANES: u32 = {}u;\nconst RPW: u32 = {}u;\n\
                 const TT: u32 = {}u;\nconst PV: u32 = {}u;\nconst XQ: u32 = {mv_words}u;\n{}",
                256 / mv_rows,
                mv_rows,
                MV_TOKENS,
                MV_MAX_IN / 4 / 256,
                include_str!("shaders/mv_common.wgsl")
            )
        });
        // The lane kernels' constants: LANES_WG threads of four rows, one lane a team (the
        // team sums of mv_common.wgsl are unused there).
        let lanes_prelude = (lanes && storage >= 16 << 10).then(|| {
            format!(
                "const WG: u32 = {LANES_WG}u;\nconst LANES: u32 = 1u;\nconst RPW: u32 = {LANES_WG}u;\n\
                 const TT: u32 = {}u;\nconst PV: u32 = {}u;\nconst XQ: u32 = {mv_words}u;\n{}\n{MV_ROWS_COMMON}",
                MV_TOKENS,
                MV_MAX_IN / 4 / LANES_WG,
                include_str!("shaders/mv_common.wgsl")
            )
        });
        // The matrix bodies with their bindings and output rows in front.
        let (mv_body, mv_lanes_body) = (format!("{MV_OUT}\n{MV}"), format!("{MV_OUT}\n{MV_LANES}"));
        let (glu_body, glu_lanes_body) = (
            format!("{MV_GLU_OUT}\n{MV_GLU}"),
            format!("{MV_GLU_OUT}\n{MV_GLU_LANES}"),
        );
        let make = |name: &str, body: &str| {
            let src = format!("{COMMON}\n{body}");
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            })
        };
        Kernels {
            norm_quant: make(
                "norm_quant",
                &format!("const WG: u32 = 256u;\nconst PV: u32 = 8u;\n{NORM}\n{NORM_QUANT}"),
            ),
            // 32 threads a row holding up to 24 vec4s each (rows of up to 3,072 in registers):
            // on lavapipe a pp32 token's four norms take 0.3 ms against 0.9 with 256.
            norm_quant_lanes: lanes.then(|| {
                make(
                    "norm_quant_lanes",
                    &format!("const WG: u32 = 32u;\nconst PV: u32 = 24u;\n{NORM}\n{NORM_QUANT}"),
                )
            }),
            rmsnorm: make(
                "rmsnorm",
                &format!(
                    "const WG: u32 = 256u;\n{NORM}\n{}",
                    include_str!("shaders/rmsnorm.wgsl")
                ),
            ),
            rmsnorm_q8: make(
                "rmsnorm_q8",
                &format!(
                    "const WG: u32 = 256u;\n{NORM}\n{}",
                    include_str!("shaders/rmsnorm_q8.wgsl")
                ),
            ),
            ternary: make("ternary", include_str!("shaders/ternary.wgsl")),
            rope_f16: make(
                "rope_f16",
                &format!("{}\n{ROPE}", include_str!("shaders/rope_store_f16.wgsl")),
            ),
            rope_f32: make(
                "rope_f32",
                &format!("{}\n{ROPE}", include_str!("shaders/rope_store_f32.wgsl")),
            ),
            rope_q8: make(
                "rope_q8",
                &format!("{}\n{ROPE}", include_str!("shaders/rope_store_q8.wgsl")),
            ),
            attention_q8: make(
                "attention_q8",
                &format!(
                    "{}\n{split}\n{ATTENTION}",
                    include_str!("shaders/attention_q8.wgsl")
                ),
            ),
            attention_f32: make(
                "attention_f32",
                &format!(
                    "{}\n{split}\n{ATTENTION}",
                    include_str!("shaders/attention_f32.wgsl")
                ),
            ),
            attention_f16: make(
                "attention_f16",
                &format!(
                    "{}\n{split}\n{ATTENTION}",
                    include_str!("shaders/attention_f16.wgsl")
                ),
            ),
            attention_merge: make(
                "attention_merge",
                &format!("{split}\n{}", include_str!("shaders/attention_merge.wgsl")),
            ),
            ternary_glu: make("ternary_glu", include_str!("shaders/ternary_glu.wgsl")),
            gemm: make(
                "gemm",
                &format!("{GEMM}\n{}", include_str!("shaders/gemm.wgsl")),
            ),
            gemm_lanes: lanes.then(|| {
                make(
                    "gemm_lanes",
                    &format!("{GEMM}\n{}", include_str!("shaders/gemm_lanes.wgsl")),
                )
            }),
            // BITNET_GPU_GEMM=tiles measures gemm.wgsl on a lane adapter.
            gemm_lanes_default: lanes && std::env::var("BITNET_GPU_GEMM").as_deref() != Ok("tiles"),
            head: make(
                "head",
                &format!("{HEAD}\n{}", include_str!("shaders/head.wgsl")),
            ),
            argmax: make(
                "argmax",
                &format!(
                    "const GROUPS: u32 = {}u;\n{}",
                    ARGMAX_GROUPS,
                    include_str!("shaders/argmax.wgsl")
                ),
            ),
            embed: make("embed", include_str!("shaders/embed.wgsl")),
            topk_local: make(
                "topk_local",
                &format!("{TOPK}\n{}", include_str!("shaders/topk_local.wgsl")),
            ),
            topk_merge: make(
                "topk_merge",
                &format!("{TOPK}\n{}", include_str!("shaders/topk_merge.wgsl")),
            ),
            mv: mv_prelude
                .as_ref()
                .map(|p| make("mv", &mv_source(p, MV_IN_NORM, &mv_body, "4", "5"))),
            mv_glu: mv_prelude
                .as_ref()
                .map(|p| make("mv_glu", &mv_source(p, MV_IN_NORM, &glu_body, "6", "7"))),
            mv_q: mv_prelude
                .as_ref()
                .map(|p| make("mv_q", &mv_source(p, MV_IN_Q, &mv_body, "4", "5"))),
            mv_glu_q: mv_prelude
                .as_ref()
                .map(|p| make("mv_glu_q", &mv_source(p, MV_IN_Q, &glu_body, "6", "7"))),
            mv_lanes: lanes_prelude.as_ref().map(|p| {
                make(
                    "mv_lanes",
                    &mv_source(p, MV_IN_NORM, &mv_lanes_body, "4", "5"),
                )
            }),
            mv_glu_lanes: lanes_prelude.as_ref().map(|p| {
                make(
                    "mv_glu_lanes",
                    &mv_source(p, MV_IN_NORM, &glu_lanes_body, "6", "7"),
                )
            }),
            mv_qkv_lanes_f16: lanes_prelude.as_ref().map(|p| {
                let body = format!(
                    "{}\n{MV_OUT_ROPE}\n{MV_LANES}",
                    include_str!("shaders/mv_store_f16.wgsl")
                );
                make(
                    "mv_qkv_lanes_f16",
                    &mv_source(p, MV_IN_NORM, &body, "4", "5"),
                )
            }),
            mv_qkv_lanes_f32: lanes_prelude.as_ref().map(|p| {
                let body = format!(
                    "{}\n{MV_OUT_ROPE}\n{MV_LANES}",
                    include_str!("shaders/mv_store_f32.wgsl")
                );
                make(
                    "mv_qkv_lanes_f32",
                    &mv_source(p, MV_IN_NORM, &body, "4", "5"),
                )
            }),
            head_lanes: lanes.then(|| {
                make(
                    "head_lanes",
                    &format!("{HEAD}\n{}", include_str!("shaders/head_lanes.wgsl")),
                )
            }),
            head_q: [2, 3].map(|ty| {
                make(
                    "head_q",
                    &format!(
                        "const TY: u32 = {ty}u;\n{HEAD_Q}\n{}",
                        include_str!("shaders/head_q.wgsl")
                    ),
                )
            }),
            head_q_lanes: lanes.then(|| {
                [2, 3].map(|ty| {
                    make(
                        "head_q_lanes",
                        &format!(
                            "const TY: u32 = {ty}u;\n{HEAD_Q}\n{}",
                            include_str!("shaders/head_q_lanes.wgsl")
                        ),
                    )
                })
            }),
            mv_words: usize::try_from(mv_words).unwrap_or(0),
            mv_rows,
        }
    }

    /// The prompt GEMM the model runs on this adapter; `lanes` false asks for gemm.wgsl
    /// where both exist.
    pub(crate) fn gemm(&self, lanes: bool) -> &wgpu::ComputePipeline {
        match (&self.gemm_lanes, lanes) {
            (Some(p), true) => p,
            _ => &self.gemm,
        }
    }

    /// The norm_quant kernel of this adapter (`lanes`: the lane adapters' where it exists),
    /// and the one the model's bind groups are made for.
    pub(crate) fn norm_quant(&self, lanes: bool) -> &wgpu::ComputePipeline {
        match (&self.norm_quant_lanes, lanes) {
            (Some(p), true) => p,
            _ => &self.norm_quant,
        }
    }

    pub(crate) fn model_norm_quant(&self) -> &wgpu::ComputePipeline {
        self.norm_quant(true)
    }

    /// The prompt GEMM the model's bind groups are made for.
    pub(crate) fn model_gemm(&self) -> &wgpu::ComputePipeline {
        self.gemm(self.gemm_lanes_default)
    }

    /// The LM head kernel the model runs on this adapter, the head rows a workgroup of it
    /// computes and the output rows (hidden states) it takes; `lanes` false asks for
    /// head.wgsl where both exist.
    pub(crate) fn head(&self, lanes: bool) -> (&wgpu::ComputePipeline, usize, usize) {
        match (&self.head_lanes, lanes) {
            (Some(p), true) => (p, LANES_ROWS, 4),
            _ => (&self.head, HEAD_ROWS, 1),
        }
    }

    /// RoPE with the cache store, and attention, for a cache of `ty`.
    pub(crate) fn for_cache(
        &self,
        ty: crate::GpuKv,
    ) -> (&wgpu::ComputePipeline, &wgpu::ComputePipeline) {
        match ty {
            crate::GpuKv::F16 => (&self.rope_f16, &self.attention_f16),
            crate::GpuKv::F32 => (&self.rope_f32, &self.attention_f32),
            crate::GpuKv::Q8_0 => (&self.rope_q8, &self.attention_q8),
        }
    }

    /// The lane QKV kernel with RoPE and the store of a cache of `ty`, where there is one
    /// (a Q8_0 block's scale needs its whole head: the separate RoPE kernel stores it).
    pub(crate) fn qkv_rope(&self, ty: crate::GpuKv) -> Option<&wgpu::ComputePipeline> {
        match ty {
            crate::GpuKv::F16 => self.mv_qkv_lanes_f16.as_ref(),
            crate::GpuKv::F32 => self.mv_qkv_lanes_f32.as_ref(),
            crate::GpuKv::Q8_0 => None,
        }
    }

    /// [`Self::head`] for a quantized LM head (head_q.wgsl, head_q_lanes.wgsl) of head code
    /// `ty` (2: Q8_0, else Q4_0).
    pub(crate) fn head_q(&self, lanes: bool, ty: u32) -> (&wgpu::ComputePipeline, usize, usize) {
        let i = usize::from(ty != 2);
        match (&self.head_q_lanes, lanes) {
            (Some(p), true) => (&p[i], LANES_ROWS, 4),
            _ => (&self.head_q[i], HEAD_ROWS, 1),
        }
    }
}

/// The words of common.wgsl's `Step`: rows in the call, the first one's position, the rows
/// whose logits are wanted, and the call's first activation row (a cache's kernels in a
/// batched step).
pub(crate) fn step_words(
    n_tok: u32,
    pos0: u32,
    out_first: u32,
    out_rows: u32,
    row0: u32,
) -> [u32; 8] {
    [n_tok, pos0, out_first, out_rows, row0, 0, 0, 0]
}

/// A size in bytes as the device's u64.
pub(crate) fn bytes_of(n: usize) -> Result<u64> {
    u64::try_from(n).map_err(|_| GpuError::Overflow("buffer size"))
}

/// A count as a kernel's u32 (a dispatch size, a uniform), or the overflow of `what`.
pub(crate) fn u32_of(n: usize, what: &'static str) -> Result<u32> {
    u32::try_from(n).map_err(|_| GpuError::Overflow(what))
}

/// `a · b`, or the overflow of `what`.
pub(crate) fn mul(a: usize, b: usize, what: &'static str) -> Result<usize> {
    a.checked_mul(b).ok_or(GpuError::Overflow(what))
}
