//! Causal grouped-query attention over the KV cache.
//!
//! Shapes: `q` is `[n][n_head * head_dim]` (roped), the cache holds `[pos][n_head_kv * head_dim]`
//! for positions `0..pos0 + n`; query head `h` reads KV head `h / (n_head / n_head_kv)`
//! (consecutive query heads share a KV head; `h % n_head_kv` would be wrong).

use bitnet_kernels::attn::{self, AttnShape};
use bitnet_kernels::Pool;

use crate::kv_cache::KvCache;
use crate::numerics::{self, Numerics};
use crate::{Config, Result};

/// Attention output `[n][n_head * head_dim]` for `n` queries at positions `pos0..pos0 + n`.
///
/// Fast numerics: the threaded kernel over the cache in place
/// ([`bitnet_kernels::attn::attend`]). Exact numerics: bitnet.cpp's float path below.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    c: &Config,
    q: &[f32],
    cache: &KvCache,
    layer: usize,
    pos0: usize,
    n: usize,
    numerics: Numerics,
    pool: &Pool,
    out: &mut [f32],
) -> Result<()> {
    let n_kv_pos = pos0 + n;
    match numerics {
        Numerics::Fast => {
            let (k, v, layout) = cache.rows(layer);
            let shape = AttnShape {
                n_head: c.n_head,
                n_head_kv: c.n_head_kv,
                head_dim: c.head_dim,
            };
            #[allow(clippy::cast_precision_loss)]
            let scale = 1.0 / (c.head_dim as f32).sqrt();
            attn::attend(&shape, q, k, v, layout, pos0, n, scale, out, pool)?;
        }
        Numerics::Exact => {
            let (mut k, mut v) = (Vec::new(), Vec::new());
            cache.read(layer, n_kv_pos, &mut k, &mut v);
            out.fill(0.0);
            attend_exact(c, q, &k, &v, pos0, n, out);
        }
    }
    Ok(())
}

/// bitnet.cpp's path: Q rounded to f16; `kq = ggml_vec_dot_f16(q, k)`; the KV length padded
/// to a multiple of 32 with a `-inf` mask; `w = kq * (1/sqrtf(head_dim)) + mask`; exact softmax;
/// then for a one-token batch P is rounded to f16 and `ggml_vec_dot_f16(p, v_col)`, for a
/// larger batch P stays f32 and tinyBLAS computes `v_col · p`.
fn attend_exact(
    c: &Config,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    pos0: usize,
    n: usize,
    out: &mut [f32],
) {
    let (d, kv_w, gqa) = (c.head_dim, c.n_embd_kv(), c.n_gqa());
    let n_kv_pos = pos0 + n;
    let n_pad = n_kv_pos.div_ceil(32) * 32;
    #[allow(clippy::cast_precision_loss)]
    let scale = 1.0f32 / (d as f32).sqrt();
    let mut qh = vec![0.0f32; d];
    let mut w = vec![0.0f32; n_pad];
    let mut vcol = vec![0.0f32; n_pad];
    for t in 0..n {
        let qpos = pos0 + t;
        for h in 0..c.n_head {
            let g = h / gqa;
            let qsrc = &q[t * c.n_embd + h * d..t * c.n_embd + (h + 1) * d];
            for (dst, &x) in qh.iter_mut().zip(qsrc) {
                *dst = numerics::round_f16(x);
            }
            for (j, wj) in w.iter_mut().enumerate() {
                *wj = if j <= qpos {
                    let kj = &k[j * kv_w + g * d..j * kv_w + (g + 1) * d];
                    numerics::dot_f16_ggml(&qh, kj) * scale + 0.0
                } else {
                    f32::NEG_INFINITY
                };
            }
            numerics::softmax_exact(&mut w);
            if n == 1 {
                for p in w.iter_mut() {
                    *p = numerics::round_f16(*p);
                }
            }
            let o = &mut out[t * c.n_embd + h * d..t * c.n_embd + (h + 1) * d];
            for (i, oi) in o.iter_mut().enumerate() {
                for (j, vj) in vcol.iter_mut().enumerate().take(n_kv_pos) {
                    *vj = v[j * kv_w + g * d + i];
                }
                *oi = if n == 1 {
                    numerics::dot_f16_ggml(&w, &vcol)
                } else {
                    numerics::dot_tinyblas(&vcol, &w)
                };
            }
        }
    }
}
