//! A session's cache on the device: K and V per block (f16, f32 or Q8_0), its RoPE table and the
//! bindings of the kernels that read and write it (`GpuModel::new_cache` makes one).

use crate::{GpuError, Result};

/// The element type of a [`GpuCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuKv {
    /// Half the memory; values rounded to f16 as the CPU's default cache rounds them.
    F16,
    F32,
    /// About a quarter of f32's memory: each head's rows quantized per 32 as the CPU's Q8_0
    /// cache quantizes them (needs a head size that is a multiple of 32).
    Q8_0,
}

impl GpuKv {
    /// Bytes of one position's `kv` elements: for Q8_0 its codes then its blocks' f32
    /// scales (attention_q8.wgsl's layout).
    pub(crate) fn row_bytes(self, kv: usize) -> usize {
        match self {
            GpuKv::F16 => 2 * kv,
            GpuKv::F32 => 4 * kv,
            GpuKv::Q8_0 => kv + kv / 32 * 4,
        }
    }

    /// Positions of `kv` elements as the cache stores them.
    pub(crate) fn encode(self, x: &[f32], kv: usize) -> Result<Vec<u8>> {
        Ok(match self {
            GpuKv::F16 => x
                .iter()
                .flat_map(|&e| half::f16::from_f32(e).to_le_bytes())
                .collect(),
            GpuKv::F32 => x.iter().flat_map(|e| e.to_le_bytes()).collect(),
            GpuKv::Q8_0 => {
                let mut out = Vec::with_capacity(x.len() / kv.max(1) * self.row_bytes(kv));
                let (mut q, mut d) = (vec![0i8; kv], vec![0f32; kv / 32]);
                for row in x.chunks_exact(kv.max(1)) {
                    bitnet_kernels::rows::quantize_q8_0_split(row, &mut q, &mut d).map_err(
                        |_| GpuError::Shape {
                            what: "Q8_0 cache row (a multiple of 32)",
                            expected: kv.next_multiple_of(32),
                            got: kv,
                        },
                    )?;
                    out.extend(q.iter().map(|c| c.to_le_bytes()[0]));
                    out.extend(d.iter().flat_map(|s| s.to_le_bytes()));
                }
                out
            }
        })
    }

    /// The values of positions stored as [`GpuKv::encode`] stores them.
    pub(crate) fn decode(self, b: &[u8], kv: usize) -> Vec<f32> {
        let le = |w: &[u8]| f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        match self {
            GpuKv::F16 => b
                .chunks_exact(2)
                .map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f32())
                .collect(),
            GpuKv::F32 => b.chunks_exact(4).map(le).collect(),
            GpuKv::Q8_0 => {
                let mut out = Vec::with_capacity(b.len() / self.row_bytes(kv).max(1) * kv);
                for row in b.chunks_exact(self.row_bytes(kv).max(1)) {
                    let (codes, scales) = row.split_at(kv);
                    for (blk, s) in codes.chunks_exact(32).zip(scales.chunks_exact(4)) {
                        let s = le(s);
                        out.extend(blk.iter().map(|&c| f32::from(i8::from_le_bytes([c])) * s));
                    }
                }
                out
            }
        }
    }
}

/// A sequence's KV cache on the device (f16, f32 or Q8_0), with its RoPE table.
#[derive(Debug)]
pub struct GpuCache {
    pub(crate) ty: GpuKv,
    pub(crate) k: Vec<wgpu::Buffer>,
    pub(crate) v: Vec<wgpu::Buffer>,
    pub(crate) attn: Vec<wgpu::BindGroup>,
    /// The merge of a split attention call's chunk states (one for every layer).
    pub(crate) merge: wgpu::BindGroup,
    /// Per block: RoPE on the new rows' Q and K, and their K and V into the cache.
    pub(crate) rope: Vec<wgpu::BindGroup>,
    /// Per block: the lane QKV kernel with RoPE and the store in its epilogue
    /// (mv_out_rope.wgsl), where the model's blocks have it; else empty.
    pub(crate) qkv_rope: Vec<wgpu::BindGroup>,
    /// The call parameters its kernels read (common.wgsl's `Step`): the model's for a call
    /// into this cache alone; its one row, position and activation row in a batched step.
    pub(crate) step: wgpu::Buffer,
    pub(crate) len: usize,
    pub(crate) n_ctx: usize,
    pub(crate) bytes: u64,
}

impl GpuCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Positions it can hold.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    /// Forget every position.
    pub fn reset(&mut self) {
        self.len = 0;
    }
    /// Keep the first `n` positions (no-op when it holds fewer).
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }
    /// Device bytes of K and V (and the RoPE table).
    pub fn nbytes(&self) -> u64 {
        self.bytes
    }
    /// Its element type.
    pub fn kv_type(&self) -> GpuKv {
        self.ty
    }
}
