//! The backend seam: the heavy operations of the forward pass.
//!
//! [`crate::Model::forward_seqs`] keeps the numbered steps of docs/MODEL.md (norms, RoPE,
//! residual adds, the activation) and calls the operations that carry the cost through
//! [`Backend`]: the ternary projections, the LM head, attention over the KV cache, and a hook
//! at the start of every block. The CPU backend is the kernel [`Pool`] itself; docs/BACKENDS.md
//! says how a layer-streaming backend and a GPU backend plug in.

use bitnet_kernels::{Pool, RowMatrix, TernaryMatrix};

use crate::kv_cache::KvCache;
use crate::{Config, Numerics, Result};

/// The heavy operations of one forward pass.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// A short name for reports (`cpu`, ...).
    fn name(&self) -> &'static str;

    /// Threads (or lanes of work) the backend computes with, for reports.
    fn n_threads(&self) -> usize;

    /// The CPU threads the forward pass may run its row-by-row steps on (norms, quantization
    /// of activations, RoPE, the activation, residual adds). Each row is computed alone, so
    /// the results do not depend on them. `None` (the default): those steps run on the
    /// calling thread.
    fn row_pool(&self) -> Option<&Pool> {
        None
    }

    /// Called before block `il` runs, in order, once per forward call: a backend that streams
    /// weights makes layer `il` resident here (and may start reading `il + 1`).
    fn begin_layer(&self, il: usize) -> Result<()> {
        let _ = il;
        Ok(())
    }

    /// Row `r` of the token embedding `embd`, dequantized into `out` (`n_embd` values).
    fn embedding_row(&self, embd: &RowMatrix<'_>, r: usize, out: &mut [f32]) -> Result<()> {
        embd.dequantize_row(r, out)?;
        Ok(())
    }

    /// `out[t][r] = Lin(W, x_t)[r]`: the ternary matmul of `n` int8 activation rows `xq`
    /// (`n × w.n_in()`) with per-row scales `scales` (docs/FORMATS.md §1); `out` is
    /// `n × w.n_out()`.
    fn ternary_matmul(
        &self,
        w: &TernaryMatrix<'_>,
        xq: &[i8],
        scales: &[f32],
        out: &mut [f32],
    ) -> Result<()>;

    /// Logits `out` (`rows × n_vocab`) of `rows` normed hidden states `hn` through `head`, in
    /// the float order `numerics` asks for.
    fn lm_head(
        &self,
        head: &RowMatrix<'_>,
        hn: &[f32],
        rows: usize,
        numerics: Numerics,
        out: &mut [f32],
    ) -> Result<()>;

    /// One normed hidden state `h` (`n_embd`) dotted with the selected rows `ids` of `head`:
    /// `out[i]` is exactly the fast-numerics logit [`Backend::lm_head`] gives for token
    /// `ids[i]` (the approximate head's candidates).
    fn lm_head_rows(
        &self,
        head: &RowMatrix<'_>,
        ids: &[u32],
        h: &[f32],
        out: &mut [f32],
    ) -> Result<()>;

    /// Causal GQA attention of `n` roped query rows `q` (`n × n_embd`) at positions
    /// `pos0..pos0 + n` over layer `il` of `cache` (which already holds their K and V), into
    /// `out` (`n × n_embd`).
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        c: &Config,
        q: &[f32],
        cache: &KvCache,
        il: usize,
        pos0: usize,
        n: usize,
        numerics: Numerics,
        out: &mut [f32],
    ) -> Result<()>;
}

/// The CPU backend: the kernels on this pool's threads, weights read where they are bound
/// (mapped or in memory).
impl Backend for Pool {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn n_threads(&self) -> usize {
        Pool::n_threads(self)
    }

    fn row_pool(&self) -> Option<&Pool> {
        Some(self)
    }

    fn ternary_matmul(
        &self,
        w: &TernaryMatrix<'_>,
        xq: &[i8],
        scales: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        w.matmul(xq, scales, out, self)?;
        Ok(())
    }

    fn lm_head(
        &self,
        head: &RowMatrix<'_>,
        hn: &[f32],
        rows: usize,
        numerics: Numerics,
        out: &mut [f32],
    ) -> Result<()> {
        match numerics {
            // Q8_0 / Q4_0 heads (built at load by `--lm-head`) dot Q8_0-quantized
            // activations in integers; the F16 head is unaffected (f32 activations).
            Numerics::Fast => head.matmul_q8(hn, out, self)?,
            Numerics::Exact => crate::exact::lm_head(head, hn, rows, out, self)?,
        }
        Ok(())
    }

    fn lm_head_rows(
        &self,
        head: &RowMatrix<'_>,
        ids: &[u32],
        h: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        head.matmul_q8_rows(ids, h, out, self)?;
        Ok(())
    }

    fn attention(
        &self,
        c: &Config,
        q: &[f32],
        cache: &KvCache,
        il: usize,
        pos0: usize,
        n: usize,
        numerics: Numerics,
        out: &mut [f32],
    ) -> Result<()> {
        crate::attention::attend(c, q, cache, il, pos0, n, numerics, self, out)
    }
}
