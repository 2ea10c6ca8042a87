//! Adapters, the device, and the compiled kernels.

use std::sync::{Arc, Mutex};

use crate::kernels::Kernels;
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
