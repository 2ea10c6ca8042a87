//! Adapters, the device, and the compiled kernels.

use std::sync::{Arc, Mutex};

use crate::{GpuError, Result};

/// One GPU adapter as wgpu reports it (for `bitnet inspect --system` and `--gpu N`).
#[derive(Debug, Clone)]
pub struct AdapterInfo {
    /// Position in [`adapters`]'s list (what `--gpu N` takes).
    pub index: usize,
    pub name: String,
    /// Vulkan, Metal or DX12.
    pub backend: String,
    /// Discrete, integrated, virtual, CPU (software) or other.
    pub device_type: String,
    pub driver: String,
    pub max_buffer_size: u64,
    pub max_storage_binding: u64,
    pub max_workgroup_storage: u32,
    pub max_invocations: u32,
    pub shader_f16: bool,
    pub subgroups: bool,
}

fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

/// Every adapter (natively); in a browser, the one it offers.
async fn list_async(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    #[cfg(target_arch = "wasm32")]
    {
        let opts = wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        };
        instance.request_adapter(&opts).await.into_iter().collect()
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        instance.enumerate_adapters(wgpu::Backends::all()).await
    }
}

fn list(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    block(list_async(instance)).unwrap_or_default()
}

/// Wait for `f` here (native: the calling thread blocks). In a browser nothing may block: a
/// future that is not ready at once is an error there (use the `_async` functions).
pub fn block<F: std::future::Future>(f: F) -> Result<F::Output> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        Ok(pollster::block_on(f))
    }
    #[cfg(target_arch = "wasm32")]
    {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => Ok(v),
            std::task::Poll::Pending => Err(GpuError::NeedsAsync),
        }
    }
}

/// A value that a wgpu callback delivers later, as a future (the read-back's map).
struct Later<T> {
    slot: Arc<Mutex<(Option<T>, Option<std::task::Waker>)>>,
}

impl<T> Later<T> {
    /// The future and the function that fulfils it.
    fn new() -> (Later<T>, impl FnOnce(T) + Send + 'static)
    where
        T: Send + 'static,
    {
        let slot: Arc<Mutex<(Option<T>, Option<std::task::Waker>)>> =
            Arc::new(Mutex::new((None, None)));
        let s = Arc::clone(&slot);
        let give = move |v: T| {
            if let Ok(mut g) = s.lock() {
                g.0 = Some(v);
                if let Some(w) = g.1.take() {
                    w.wake();
                }
            }
        };
        (Later { slot }, give)
    }
}

impl<T> std::future::Future for Later<T> {
    type Output = Option<T>;
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<T>> {
        let Ok(mut g) = self.slot.lock() else {
            return std::task::Poll::Ready(None);
        };
        match g.0.take() {
            Some(v) => std::task::Poll::Ready(Some(v)),
            None => {
                g.1 = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}

fn describe(index: usize, a: &wgpu::Adapter) -> AdapterInfo {
    let i = a.get_info();
    let l = a.limits();
    let f = a.features();
    AdapterInfo {
        index,
        name: i.name,
        backend: i.backend.to_str().to_string(),
        device_type: format!("{:?}", i.device_type),
        driver: format!("{} {}", i.driver, i.driver_info).trim().to_string(),
        max_buffer_size: l.max_buffer_size,
        max_storage_binding: l.max_storage_buffer_binding_size,
        max_workgroup_storage: l.max_compute_workgroup_storage_size,
        max_invocations: l.max_compute_invocations_per_workgroup,
        shader_f16: f.contains(wgpu::Features::SHADER_F16),
        subgroups: f.contains(wgpu::Features::SUBGROUP),
    }
}

/// The GPU adapters wgpu finds (empty when there is none; no device is opened).
pub fn adapters() -> Vec<AdapterInfo> {
    list(&instance())
        .iter()
        .enumerate()
        .map(|(i, a)| describe(i, a))
        .collect()
}

/// Errors the device reports outside a call (validation, out of memory), and its loss.
#[derive(Debug, Default)]
struct Faults {
    errors: Mutex<Vec<String>>,
    lost: Mutex<Option<String>>,
}

/// An opened GPU: device, queue, compiled kernels. Errors wgpu raises asynchronously are
/// collected (never a panic) and returned by the next [`Gpu::check`].
#[derive(Debug)]
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: AdapterInfo,
    pub(crate) limits: wgpu::Limits,
    pub(crate) k: Kernels,
    faults: Arc<Faults>,
    /// Bytes written with `write_buffer` since the queue last went idle: their staging
    /// copies stay in memory until then.
    staged: std::sync::atomic::AtomicU64,
}

/// Workgroup storage the kernels need (gemm.wgsl: 11.5 KiB; WebGPU's default limit).
const WORKGROUP_STORAGE: u32 = 16384;
/// Rows a call may have for attention to split its positions into chunks over workgroups
/// (attention_split.wgsl): a decode step.
pub(crate) const ATTN_SPLIT_TOKENS: usize = 4;
/// The fewest positions worth a chunk of their own (one block of 64).
pub(crate) const ATTN_CHUNK: usize = 64;
/// The most chunks (one merge thread each).
pub(crate) const ATTN_MAX_SPLIT: usize = 64;

/// Workgroups per (head, row) that attention runs for a call of `n` rows over `n_kv` positions
/// (attention_split.wgsl's `n_split()`); more than one needs the merge kernel after it.
pub(crate) fn attn_split(n: usize, n_kv: usize) -> Result<u32> {
    let split = if n <= ATTN_SPLIT_TOKENS {
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
/// Whether an adapter runs a workgroup's invocations as the lanes of a CPU's SIMD registers:
/// a CPU device (lavapipe natively; a browser's fallback adapter), or SwiftShader, which a
/// browser without a GPU may offer as its ordinary adapter.
fn runs_on_cpu(info: &wgpu::AdapterInfo) -> bool {
    let name = info.name.to_ascii_lowercase();
    info.device_type == wgpu::DeviceType::Cpu
        || name.contains("swiftshader")
        || name.contains("llvmpipe")
}

/// Staged upload bytes after which [`Gpu::upload`] waits for the queue.
const STAGING_FLUSH: u64 = 64 << 20;
/// Invocations per workgroup the kernels use at most.
const INVOCATIONS: u32 = 256;

impl Gpu {
    /// Open adapter `index` of [`adapters`] (or the first one, preferring a discrete or
    /// integrated GPU over a software one, when `None`).
    pub fn open(index: Option<usize>) -> Result<Self> {
        block(Self::open_async(index))?
    }

    /// [`Gpu::open`], for callers that must not block (a browser's WebGPU).
    pub async fn open_async(index: Option<usize>) -> Result<Self> {
        let inst = instance();
        let all = list_async(&inst).await;
        let adapter = match index {
            Some(i) => all.get(i).ok_or(GpuError::NoSuchAdapter {
                index: i,
                count: all.len(),
            })?,
            None => {
                let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
                    wgpu::DeviceType::DiscreteGpu => 0,
                    wgpu::DeviceType::IntegratedGpu => 1,
                    wgpu::DeviceType::VirtualGpu => 2,
                    wgpu::DeviceType::Other => 3,
                    wgpu::DeviceType::Cpu => 4,
                };
                all.iter()
                    .min_by_key(|a| rank(a))
                    .ok_or(GpuError::NoAdapter)?
            }
        };
        let pos = all
            .iter()
            .position(|a| std::ptr::eq(a, adapter))
            .unwrap_or(0);
        let info = describe(pos, adapter);
        let have = adapter.limits();
        let need = |what: &'static str, need: u64, have: u64| {
            if have < need {
                Err(GpuError::Limit {
                    adapter: info.name.clone(),
                    what,
                    need,
                    have,
                })
            } else {
                Ok(())
            }
        };
        need(
            "workgroup storage (bytes)",
            u64::from(WORKGROUP_STORAGE),
            u64::from(have.max_compute_workgroup_storage_size),
        )?;
        need(
            "invocations per workgroup",
            u64::from(INVOCATIONS),
            u64::from(have.max_compute_invocations_per_workgroup),
        )?;
        need(
            "workgroup size x",
            u64::from(INVOCATIONS),
            u64::from(have.max_compute_workgroup_size_x),
        )?;
        need(
            "storage buffers per kernel",
            8,
            u64::from(have.max_storage_buffers_per_shader_stage),
        )?;
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("bitnet"),
                // Timestamps, where the adapter has them, for `GpuModel::set_profile`.
                required_features: adapter.features() & wgpu::Features::TIMESTAMP_QUERY,
                required_limits: have.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError::RequestDevice(e.to_string()))?;
        let faults = Arc::new(Faults::default());
        let f = Arc::clone(&faults);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = f.errors.lock() {
                v.push(e.to_string());
            }
        }));
        let f = Arc::clone(&faults);
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut l) = f.lost.lock() {
                *l = Some(format!("{reason:?}: {msg}"));
            }
        });
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let lanes = runs_on_cpu(&adapter.get_info());
        let k = Kernels::new(&device, have.max_compute_workgroup_storage_size, lanes);
        if let Some(e) = scope.pop().await {
            return Err(GpuError::Validation(e.to_string()));
        }
        let gpu = Gpu {
            device,
            queue,
            info,
            limits: have,
            k,
            faults,
            staged: std::sync::atomic::AtomicU64::new(0),
        };
        gpu.check()?;
        Ok(gpu)
    }

    /// Whether this adapter has the lane kernels (it runs invocations as a CPU's SIMD lanes:
    /// the model's decode matrices and LM head then run on them by default).
    pub fn lane_kernels(&self) -> bool {
        self.k.mv_lanes.is_some() && self.k.head_lanes.is_some()
    }

    /// The adapter this device runs on.
    pub fn info(&self) -> &AdapterInfo {
        &self.info
    }

    /// The first error the device reported since the last check, or its loss.
    pub fn check(&self) -> Result<()> {
        if let Some(msg) = self.faults.lost.lock().ok().and_then(|l| l.clone()) {
            return Err(GpuError::DeviceLost(msg));
        }
        if let Ok(mut v) = self.faults.errors.lock() {
            if !v.is_empty() {
                let first = v.remove(0);
                v.clear();
                return Err(GpuError::Validation(first));
            }
        }
        Ok(())
    }

    /// Block until the queue is idle, then report any error.
    pub(crate) fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::DeviceLost(e.to_string()))?;
        self.check()
    }

    /// A storage buffer of `size` bytes (at least 4), checked against the adapter's limits.
    pub(crate) fn storage(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        let size = size.max(4).next_multiple_of(4);
        let limit = self
            .limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size);
        if size > limit {
            return Err(GpuError::Limit {
                adapter: self.info.name.clone(),
                what: "one storage buffer (bytes)",
                need: size,
                have: limit,
            });
        }
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE | usage,
            mapped_at_creation: false,
        }))
    }

    /// A storage buffer holding `data` (padded to a multiple of 4 bytes).
    pub(crate) fn upload(&self, label: &str, data: &[u8]) -> Result<wgpu::Buffer> {
        let b = self.storage(
            label,
            u64::try_from(data.len()).map_err(|_| GpuError::Overflow("buffer size"))?,
            wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
        )?;
        let whole = data.len() / 4 * 4;
        self.write(&b, 0, &data[..whole])?;
        if whole < data.len() {
            let mut tail = [0u8; 4];
            tail[..data.len() - whole].copy_from_slice(&data[whole..]);
            self.write(&b, whole as u64, &tail)?;
        }
        Ok(b)
    }

    /// Write `data` (whole 4-byte words) into `b` at byte `at` (a multiple of 4).
    pub(crate) fn write(&self, b: &wgpu::Buffer, at: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.queue.write_buffer(b, at, data);
        // Uploading a model stages each write in memory until the queue runs; let it run
        // every 64 MiB, so the staging copies never add up to the model's size.
        let n = u64::try_from(data.len()).map_err(|_| GpuError::Overflow("buffer size"))?;
        let staged = self
            .staged
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        if staged + n >= STAGING_FLUSH {
            self.staged.store(0, std::sync::atomic::Ordering::Relaxed);
            self.queue.submit(std::iter::empty());
            self.wait()?;
        }
        Ok(())
    }

    /// A uniform buffer holding `words`.
    pub(crate) fn uniform(&self, label: &str, words: &[u32]) -> wgpu::Buffer {
        let b = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (words.len() * 4).next_multiple_of(16) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.queue.write_buffer(&b, 0, bytemuck::cast_slice(words));
        b
    }

    /// A bind group of `pipeline`'s layout 0 over `buffers` at bindings 0, 1, ...
    pub(crate) fn bind(
        &self,
        pipeline: &wgpu::ComputePipeline,
        buffers: &[&wgpu::Buffer],
    ) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry<'_>> = (0u32..)
            .zip(buffers)
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i,
                resource: b.as_entire_binding(),
            })
            .collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        })
    }

    /// A bind group of `pipeline`'s layout 0 over `(buffer, offset, size)` parts at bindings
    /// 0, 1, ... (size `None`: the rest of the buffer).
    pub(crate) fn bind_parts(
        &self,
        pipeline: &wgpu::ComputePipeline,
        parts: &[(&wgpu::Buffer, u64, Option<u64>)],
    ) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry<'_>> = (0u32..)
            .zip(parts)
            .map(|(i, &(buffer, offset, size))| wgpu::BindGroupEntry {
                binding: i,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset,
                    size: size.and_then(wgpu::BufferSize::new),
                }),
            })
            .collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        })
    }

    /// Copy `bytes` bytes of `src` into memory (one blocking read-back).
    pub(crate) fn read(&self, src: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: bytes.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(src, 0, &staging, 0, bytes);
        self.queue.submit([enc.finish()]);
        self.map_read(&staging, bytes)
    }

    /// Map `staging` (already filled by a submitted copy) and copy its first `bytes` out,
    /// blocking ([`Gpu::map_read_async`]).
    pub(crate) fn map_read(&self, staging: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
        block(self.map_read_async(staging, bytes))?
    }

    /// Map `staging` (already filled by a submitted copy) and copy its first `bytes` out:
    /// the one read-back. Natively the queue is waited for first, so the map is done when
    /// the future is first polled; in a browser the future waits for the page's event loop.
    pub(crate) async fn map_read_async(
        &self,
        staging: &wgpu::Buffer,
        bytes: u64,
    ) -> Result<Vec<u8>> {
        let (mapped, give) = Later::new();
        staging.map_async(wgpu::MapMode::Read, ..bytes, give);
        self.wait()?;
        mapped
            .await
            .ok_or_else(|| GpuError::Readback("the map callback was dropped".into()))?
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        self.check()?;
        let out = {
            let view = staging
                .get_mapped_range(..bytes)
                .map_err(|e| GpuError::Readback(e.to_string()))?;
            view.to_vec()
        };
        staging.unmap();
        Ok(out)
    }
}

/// The compiled kernels (one pipeline each, layouts taken from the shaders).
#[derive(Debug)]
pub(crate) struct Kernels {
    pub norm_quant: wgpu::ComputePipeline,
    pub rmsnorm: wgpu::ComputePipeline,
    pub ternary: wgpu::ComputePipeline,
    /// RoPE on the new rows' Q and K, and their K and V stored into the cache: for an f16
    /// cache and an f32 one.
    pub rope_f16: wgpu::ComputePipeline,
    pub rope_f32: wgpu::ComputePipeline,
    pub attention_f32: wgpu::ComputePipeline,
    pub attention_f16: wgpu::ComputePipeline,
    pub attention_merge: wgpu::ComputePipeline,
    pub ternary_glu: wgpu::ComputePipeline,
    pub gemm: wgpu::ComputePipeline,
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
    /// head.wgsl in the same manner (head_lanes.wgsl), for the same adapters.
    pub head_lanes: Option<wgpu::ComputePipeline>,
}

impl Kernels {
    /// The LM head kernel the model runs on this adapter, and the head rows a workgroup of
    /// it computes; `lanes` false asks for head.wgsl where both exist.
    pub(crate) fn head(&self, lanes: bool) -> (&wgpu::ComputePipeline, usize) {
        match (&self.head_lanes, lanes) {
            (Some(p), true) => (p, LANES_ROWS),
            _ => (&self.head, crate::model::HEAD_ROWS),
        }
    }
}

/// Threads a workgroup of the lane decode kernels (`WG` in mv_rows.wgsl), four output rows
/// each.
pub(crate) const LANES_WG: usize = 64;
/// Output rows a workgroup of the lane decode kernels computes.
pub(crate) const LANES_ROWS: usize = 4 * LANES_WG;

const COMMON: &str = include_str!("shaders/common.wgsl");
/// The attention kernel's body; a prelude in front of it says how the cache is read.
const ATTENTION: &str = include_str!("shaders/attention.wgsl");
/// How attention splits a call's positions over workgroups, shared with its merge kernel.
const SPLIT: &str = include_str!("shaders/attention_split.wgsl");
/// RMSNorm's bindings and row scale, shared by the two norm kernels.
const NORM: &str = include_str!("shaders/norm_common.wgsl");
/// RoPE and the cache store; a prelude in front of it says how the cache is written.
const ROPE: &str = include_str!("shaders/rope.wgsl");
/// The top-k kernels' shared selection.
const TOPK: &str = include_str!("shaders/topk_select.wgsl");

const MV: &str = include_str!("shaders/mv.wgsl");
const MV_GLU: &str = include_str!("shaders/mv_glu.wgsl");
const MV_IN_NORM: &str = include_str!("shaders/mv_in_norm.wgsl");
const MV_IN_Q: &str = include_str!("shaders/mv_in_q.wgsl");
const MV_ROWS_COMMON: &str = include_str!("shaders/mv_rows_common.wgsl");
const MV_LANES: &str = include_str!("shaders/mv_rows.wgsl");
const MV_GLU_LANES: &str = include_str!("shaders/mv_glu_rows.wgsl");

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
    fn new(device: &wgpu::Device, storage: u32, lanes: bool) -> Self {
        let split = format!(
            "const SPLIT_TOKENS: u32 = {ATTN_SPLIT_TOKENS}u;\nconst CHUNK: u32 = {ATTN_CHUNK}u;\n\
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
            _ => crate::model::MV_ROWS,
        };
        let mv_prelude = (storage >= 16 << 10).then(|| {
            format!(
                "const WG: u32 = 256u;\nconst LANES: u32 = {}u;\nconst RPW: u32 = {}u;\n\
                 const TT: u32 = {}u;\nconst PV: u32 = {}u;\nconst XQ: u32 = {mv_words}u;\n{}",
                256 / mv_rows,
                mv_rows,
                crate::model::MV_TOKENS,
                crate::model::MV_MAX_IN / 4 / 256,
                include_str!("shaders/mv_common.wgsl")
            )
        });
        // The lane kernels' constants: LANES_WG threads of four rows, one lane a team (the
        // team sums of mv_common.wgsl are unused there).
        let lanes_prelude = (lanes && storage >= 16 << 10).then(|| {
            format!(
                "const WG: u32 = {LANES_WG}u;\nconst LANES: u32 = 1u;\nconst RPW: u32 = {LANES_WG}u;\n\
                 const TT: u32 = {}u;\nconst PV: u32 = {}u;\nconst XQ: u32 = {mv_words}u;\n{}\n{MV_ROWS_COMMON}",
                crate::model::MV_TOKENS,
                crate::model::MV_MAX_IN / 4 / LANES_WG,
                include_str!("shaders/mv_common.wgsl")
            )
        });
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
                &format!("{NORM}\n{}", include_str!("shaders/norm_quant.wgsl")),
            ),
            rmsnorm: make(
                "rmsnorm",
                &format!("{NORM}\n{}", include_str!("shaders/rmsnorm.wgsl")),
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
            gemm: make("gemm", include_str!("shaders/gemm.wgsl")),
            head: make("head", include_str!("shaders/head.wgsl")),
            argmax: make(
                "argmax",
                &format!(
                    "const GROUPS: u32 = {}u;\n{}",
                    crate::model::ARGMAX_GROUPS,
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
                .map(|p| make("mv", &mv_source(p, MV_IN_NORM, MV, "4", "5"))),
            mv_glu: mv_prelude
                .as_ref()
                .map(|p| make("mv_glu", &mv_source(p, MV_IN_NORM, MV_GLU, "6", "7"))),
            mv_q: mv_prelude
                .as_ref()
                .map(|p| make("mv_q", &mv_source(p, MV_IN_Q, MV, "4", "5"))),
            mv_glu_q: mv_prelude
                .as_ref()
                .map(|p| make("mv_glu_q", &mv_source(p, MV_IN_Q, MV_GLU, "6", "7"))),
            mv_lanes: lanes_prelude
                .as_ref()
                .map(|p| make("mv_lanes", &mv_source(p, MV_IN_NORM, MV_LANES, "4", "5"))),
            mv_glu_lanes: lanes_prelude.as_ref().map(|p| {
                make(
                    "mv_glu_lanes",
                    &mv_source(p, MV_IN_NORM, MV_GLU_LANES, "6", "7"),
                )
            }),
            head_lanes: lanes.then(|| make("head_lanes", include_str!("shaders/head_lanes.wgsl"))),
            mv_words: usize::try_from(mv_words).unwrap_or(0),
            mv_rows,
        }
    }
}
