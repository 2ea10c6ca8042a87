//! Per-sequence KV cache: for each layer, K and V rows of `head_dim` values per KV head and
//! position.
//!
//! Layout: `k[layer]` is `[n_head_kv][n_ctx][head_dim]` (head-major: each head's history is
//! contiguous, which is what the attention kernel streams), same for `v`.
//! Element type f32, f16 (the default; exact numerics requires it, as bitnet.cpp stores f16) or
//! Q8_0 (`--kv-cache q8_0`, llama.cpp's `-ctk q8_0 -ctv q8_0`: ggml's Q8_0 blocks of 32 values,
//! the codes and the scales in two arrays; 1.125 bytes per value, so a deep decode step streams
//! 0.56 × the bytes of f16) or Q4_0 (`--kv-cache q4_0`, `-ctk q4_0 -ctv q4_0`: ggml's Q4_0
//! nibbles and scales apart, 0.625 bytes per value, 0.31 × f16). The quantized types need a
//! head size that is a multiple of 32.

use bitnet_kernels::aligned::AlignedBuf;
use bitnet_kernels::attn::{KvLayout, KvRows, Q8_BLOCK};
use bitnet_kernels::rows::{quantize_q4_0_split, quantize_q8_0_split};
use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::{Config, KvType, ModelError, Result};

/// One layer's K or V, on a 64-byte boundary (rows of 128 f16 or f32 values then start on a
/// cache line, and the attention kernel's vector loads never straddle two).
#[derive(Debug)]
enum Store {
    F32(AlignedBuf<f32>),
    F16(AlignedBuf<f16>),
    /// Codes (one per value) and scales (one per 32 values, same indexing / 32).
    Q8 {
        q: AlignedBuf<i8>,
        d: AlignedBuf<f32>,
    },
    /// Nibbles (ggml's Q4_0 order, 16 bytes per 32 values) and scales (one per 32 values).
    Q4 {
        q: AlignedBuf<u8>,
        d: AlignedBuf<f32>,
    },
}

impl Store {
    fn new(ty: KvType, n: usize) -> Result<Self> {
        let over = |_| ModelError::OverBudget {
            what: "KV cache",
            needed: u64::try_from(n)
                .ok()
                .and_then(|n| ty.bytes_for(n))
                .unwrap_or(u64::MAX),
            budget: 0,
        };
        Ok(match ty {
            KvType::F32 => Store::F32(AlignedBuf::try_zeroed(n).map_err(over)?),
            KvType::F16 => Store::F16(AlignedBuf::try_zeroed(n).map_err(over)?),
            KvType::Q8_0 => Store::Q8 {
                q: AlignedBuf::try_zeroed(n).map_err(over)?,
                d: AlignedBuf::try_zeroed(n.div_ceil(Q8_BLOCK)).map_err(over)?,
            },
            KvType::Q4_0 => Store::Q4 {
                q: AlignedBuf::try_zeroed(n.div_ceil(2)).map_err(over)?,
                d: AlignedBuf::try_zeroed(n.div_ceil(Q8_BLOCK)).map_err(over)?,
            },
        })
    }

    /// Store one row at element `at` (for Q8/Q4, `at` and the row's length are multiples of 32,
    /// which `KvCache::new` ensures).
    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Store::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            // Slice conversion uses F16C when the CPU has it (runtime detection in `half`);
            // rounding is to nearest even either way.
            Store::F16(v) => v[at..at + src.len()].convert_from_f32_slice(src),
            Store::Q8 { q, d } => {
                let (b0, nb) = (at / Q8_BLOCK, src.len() / Q8_BLOCK);
                // Lengths agree by construction (whole blocks of a row inside the store).
                let r = quantize_q8_0_split(src, &mut q[at..at + src.len()], &mut d[b0..b0 + nb]);
                debug_assert!(r.is_ok(), "{r:?}");
            }
            Store::Q4 { q, d } => {
                let (b0, nb) = (at / Q8_BLOCK, src.len() / Q8_BLOCK);
                let q = &mut q[at / 2..(at + src.len()) / 2];
                // Lengths agree by construction, as for Q8.
                let r = quantize_q4_0_split(src, q, &mut d[b0..b0 + nb]);
                debug_assert!(r.is_ok(), "{r:?}");
            }
        }
    }

    /// The store as the attention kernels read it.
    fn view(&self) -> KvRows<'_> {
        match self {
            Store::F32(v) => KvRows::F32(v),
            Store::F16(v) => KvRows::F16(v),
            Store::Q8 { q, d } => KvRows::Q8 { q, d },
            Store::Q4 { q, d } => KvRows::Q4 { q, d },
        }
    }

    fn read(&self, at: usize, dst: &mut [f32]) {
        match self {
            Store::F32(v) => dst.copy_from_slice(&v[at..at + dst.len()]),
            Store::F16(v) => {
                let n = dst.len();
                v[at..at + n].convert_to_f32_slice(dst);
            }
            // The codes decoded as the attention kernels decode them.
            Store::Q8 { .. } | Store::Q4 { .. } => self.view().read(at, dst),
        }
    }
}

/// The KV cache of one sequence.
#[derive(Debug)]
pub struct KvCache {
    ty: KvType,
    n_ctx: usize,
    n_embd_kv: usize,
    n_head_kv: usize,
    head_dim: usize,
    len: usize,
    /// per layer: `[n_head_kv][n_ctx][head_dim]`
    k: Vec<Store>,
    /// per layer: `[n_head_kv][n_ctx][head_dim]`
    v: Vec<Store>,
}

impl KvCache {
    /// Allocate a cache for `n_ctx` positions; refuses (before allocating) when it would
    /// exceed `budget_bytes`.
    pub fn new(config: &Config, n_ctx: usize, ty: KvType, budget_bytes: u64) -> Result<Self> {
        if n_ctx == 0 {
            return Err(ModelError::BadHparam {
                key: "n_ctx".into(),
                value: "0".into(),
                why: "must be at least 1",
            });
        }
        if ty.is_quantized() && !config.head_dim.is_multiple_of(Q8_BLOCK) {
            return Err(ModelError::BadHparam {
                key: "head_dim".into(),
                value: config.head_dim.to_string(),
                why: "a Q8_0 or Q4_0 KV cache needs a head size that is a multiple of 32",
            });
        }
        let needed = config.kv_cache_bytes(n_ctx, ty)?;
        if needed > budget_bytes {
            return Err(ModelError::OverBudget {
                what: "KV cache",
                needed,
                budget: budget_bytes,
            });
        }
        let per_layer = n_ctx
            .checked_mul(config.n_embd_kv())
            .ok_or(ModelError::Overflow("KV cache size"))?;
        let mut k = Vec::with_capacity(config.n_layer);
        let mut v = Vec::with_capacity(config.n_layer);
        for _ in 0..config.n_layer {
            k.push(Store::new(ty, per_layer)?);
            v.push(Store::new(ty, per_layer)?);
        }
        Ok(KvCache {
            ty,
            n_ctx,
            n_embd_kv: config.n_embd_kv(),
            n_head_kv: config.n_head_kv,
            head_dim: config.head_dim,
            len: 0,
            k,
            v,
        })
    }

    /// Positions filled so far (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn kv_type(&self) -> KvType {
        self.ty
    }

    /// Forget every position (reuse the allocation).
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// Drop positions `n..` (keep a common prefix).
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }

    /// Context shift: drop positions `keep..keep + discard` and move the later ones down by
    /// `discard`, turning their keys back by `discard` positions of RoPE so that they read as
    /// if written at their new positions (llama.cpp's K-shift). Positions `0..keep` (the
    /// attention sinks) stay. Values are moved as they are; keys are rotated in f32 and
    /// stored again in the cache's type. Fast numerics only: the rotation is not bitnet.cpp's.
    pub fn shift(&mut self, config: &Config, keep: usize, discard: usize) -> Result<()> {
        let from = keep
            .checked_add(discard)
            .filter(|&f| f <= self.len && discard > 0)
            .ok_or(ModelError::BadHparam {
                key: "context shift".into(),
                value: format!("keep {keep}, discard {discard} of {} positions", self.len),
                why: "must drop at least one filled position after the kept ones",
            })?;
        let d = self.head_dim;
        let rope = crate::numerics::rope_row(discard, config.n_rot, config.rope_freq_base);
        let back = crate::numerics::rope_back_for(config.rope_style);
        let mut row = vec![0.0f32; d];
        for layer in 0..self.k.len() {
            for g in 0..self.n_head_kv {
                for p in from..self.len {
                    let src = (g * self.n_ctx + p) * d;
                    let dst = (g * self.n_ctx + p - discard) * d;
                    self.k[layer].read(src, &mut row);
                    back(&mut row, &rope);
                    self.k[layer].write(dst, &row);
                    self.v[layer].read(src, &mut row);
                    self.v[layer].write(dst, &row);
                }
            }
        }
        self.len -= discard;
        Ok(())
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        let values = 2 * self.k.len() * self.n_ctx * self.n_embd_kv;
        u64::try_from(values)
            .ok()
            .and_then(|n| self.ty.bytes_for(n))
            .and_then(|b| usize::try_from(b).ok())
            .unwrap_or(usize::MAX)
    }

    pub(crate) fn check_room(&self, n_new: usize) -> Result<()> {
        let needed = self
            .len
            .checked_add(n_new)
            .ok_or(ModelError::Overflow("positions"))?;
        if needed > self.n_ctx {
            return Err(ModelError::ContextFull {
                needed,
                n_ctx: self.n_ctx,
            });
        }
        Ok(())
    }

    /// Store K and V rows (`rows * n_embd_kv` values each, position-major) at positions
    /// `pos..`.
    pub(crate) fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let d = self.head_dim;
        for (r, (kr, vr)) in k
            .chunks_exact(self.n_embd_kv)
            .zip(v.chunks_exact(self.n_embd_kv))
            .enumerate()
        {
            for g in 0..self.n_head_kv {
                let at = (g * self.n_ctx + pos + r) * d;
                self.k[layer].write(at, &kr[g * d..(g + 1) * d]);
                self.v[layer].write(at, &vr[g * d..(g + 1) * d]);
            }
        }
    }

    /// Read K and V for positions `0..n` of one layer as f32, position-major
    /// (`[n][n_embd_kv]`).
    pub(crate) fn read(&self, layer: usize, n: usize, k: &mut Vec<f32>, v: &mut Vec<f32>) {
        let (d, kvw) = (self.head_dim, self.n_embd_kv);
        k.resize(n * kvw, 0.0);
        v.resize(n * kvw, 0.0);
        for g in 0..self.n_head_kv {
            for j in 0..n {
                let at = (g * self.n_ctx + j) * d;
                self.k[layer].read(at, &mut k[j * kvw + g * d..j * kvw + (g + 1) * d]);
                self.v[layer].read(at, &mut v[j * kvw + g * d..j * kvw + (g + 1) * d]);
            }
        }
    }

    /// K and V of one layer in place, in the cache's element type, with their layout (every
    /// position up to `n_ctx`; the caller reads only the filled ones).
    pub(crate) fn rows(&self, layer: usize) -> (KvRows<'_>, KvRows<'_>, KvLayout) {
        let layout = KvLayout {
            pos_stride: self.head_dim,
            head_stride: self.n_ctx * self.head_dim,
        };
        (self.k[layer].view(), self.v[layer].view(), layout)
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::cast_precision_loss)]
mod tests {
    use super::*;
    use crate::numerics::{rope_for, rope_row, Numerics};

    fn config() -> Config {
        config_of("tiny/bitnet-tiny-i2_s.gguf")
    }

    fn config_of(rel: &str) -> Config {
        let f = bitnet_gguf::GgufFile::open(
            &bitnet_testdata::golden(rel),
            &bitnet_gguf::Limits::default(),
        )
        .unwrap();
        Config::from_metadata(f.metadata(), None).unwrap()
    }

    /// A deterministic raw (un-roped) K or V row for position `p`, head `g`.
    fn raw(p: usize, g: usize, d: usize, salt: f32) -> Vec<f32> {
        (0..d)
            .map(|i| ((p * 31 + g * 7 + i) as f32 * 0.37 + salt).sin())
            .collect()
    }

    /// NEOX RoPE (`tiny`) and normal RoPE (`llama-tiny`).
    #[test]
    fn a_shift_moves_values_and_turns_keys_to_their_new_positions() {
        for rel in [
            "tiny/bitnet-tiny-i2_s.gguf",
            "llama-tiny/llama-tiny-i2_s.gguf",
        ] {
            shift_on(&config_of(rel));
        }
    }

    fn shift_on(c: &Config) {
        let rope = rope_for(c.rope_style);
        let (d, hk, n_ctx) = (c.head_dim, c.n_head_kv, 48);
        for (ty, tol) in [
            (KvType::F32, 1e-5),
            (KvType::F16, 4e-3),
            (KvType::Q8_0, 2e-2),
            // A step is 1/8 of the block's largest |x| ≤ 1, up to a whole step at the clamped
            // end; the shift stores the keys again (a second rounding).
            (KvType::Q4_0, 0.26),
        ] {
            let mut cache = KvCache::new(c, n_ctx, ty, u64::MAX).unwrap();
            let n = 40;
            for layer in 0..c.n_layer {
                for p in 0..n {
                    let mut k = Vec::new();
                    let mut v = Vec::new();
                    for g in 0..hk {
                        let mut kr = raw(p, g, d, layer as f32);
                        rope(
                            &mut kr,
                            &rope_row(p, c.n_rot, c.rope_freq_base),
                            Numerics::Fast,
                        );
                        k.extend(kr);
                        v.extend(raw(p, g, d, 10.0 + layer as f32));
                    }
                    cache.store(layer, p, &k, &v);
                }
            }
            cache.len = n;
            let (keep, discard) = (4, 18);
            cache.shift(c, keep, discard).unwrap();
            assert_eq!(cache.len(), n - discard);
            for layer in 0..c.n_layer {
                let (mut k, mut v) = (Vec::new(), Vec::new());
                cache.read(layer, cache.len(), &mut k, &mut v);
                for q in 0..cache.len() {
                    // The token now at q was at p.
                    let p = if q < keep { q } else { q + discard };
                    for g in 0..hk {
                        let mut want_k = raw(p, g, d, layer as f32);
                        rope(
                            &mut want_k,
                            &rope_row(q, c.n_rot, c.rope_freq_base),
                            Numerics::Fast,
                        );
                        let want_v = raw(p, g, d, 10.0 + layer as f32);
                        let at = q * hk * d + g * d;
                        for i in 0..d {
                            assert!(
                                (k[at + i] - want_k[i]).abs() < tol,
                                "{} {ty:?} k q{q} i{i}",
                                c.arch
                            );
                            assert!((v[at + i] - want_v[i]).abs() < tol, "{ty:?} v q{q} i{i}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_shift_must_drop_filled_positions() {
        let c = config();
        let mut cache = KvCache::new(&c, 16, KvType::F16, u64::MAX).unwrap();
        cache.len = 10;
        assert!(cache.shift(&c, 4, 0).is_err());
        assert!(cache.shift(&c, 4, 7).is_err());
        assert!(cache.shift(&c, 4, 6).is_ok());
        assert_eq!(cache.len(), 4);
    }
}
