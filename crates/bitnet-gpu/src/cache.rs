//! A session's cache on the device: K and V per block (f16 or f32), its RoPE table and the
//! bindings of the kernels that read and write it (`GpuModel::new_cache` makes one).

/// The element type of a [`GpuCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuKv {
    /// Half the memory; values rounded to f16 as the CPU's default cache rounds them.
    F16,
    F32,
}

/// A sequence's KV cache on the device (f16 or f32), with its RoPE table.
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
