//! Causal grouped-query attention over the KV cache.
//!
//! Shapes: `q` is `[n][n_head * head_dim]` (roped), the cache holds `[pos][n_head_kv * head_dim]`
//! for positions `0..pos0 + n`; query head `h` reads KV head `h / (n_head / n_head_kv)`
//! (consecutive query heads share a KV head; `h % n_head_kv` would be wrong).

use bitnet_kernels::attn::{self, AttnShape};
use bitnet_kernels::exact;
use bitnet_kernels::Pool;

use crate::kv_cache::KvCache;
use crate::numerics::Numerics;
use crate::{Config, Result};

/// Attention output `[n][n_head * head_dim]` for `n` queries at positions `pos0..pos0 + n`.
///
/// Fast numerics: the threaded kernel over the cache in place
/// ([`bitnet_kernels::attn::attend`]). Exact numerics: bitnet.cpp's float path
/// ([`bitnet_kernels::exact::attend`]) over the cache widened to f32.
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
            attn::attend(&shape, q, k, v, layout, pos0, n, c.kq_scale(), out, pool)?;
        }
        Numerics::Exact => {
            let (mut k, mut v) = (Vec::new(), Vec::new());
            cache.read(layer, n_kv_pos, &mut k, &mut v);
            let shape = exact::ExactShape {
                kq_scale: c.kq_scale(),
                ..exact::ExactShape::new(c.n_head, c.n_head_kv, c.head_dim)
            };
            exact::attend(&shape, q, &k, &v, pos0, n, out, pool)?;
        }
    }
    Ok(())
}
