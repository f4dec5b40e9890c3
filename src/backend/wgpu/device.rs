//! Adapter choice, device limits and features, buffer allocation with memory accounting, and
//! the one place that records and submits a dispatch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

use super::pipelines::{Kernel, Pipelines, TileConfig, Variant};
use crate::backend::options::BackendOptions;
use crate::{Error, Result};

const BACKEND: &str = "wgpu";

/// One adapter as `list_adapters` reports it; `index` is what `WgpuBackend::new` takes.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AdapterInfo {
    pub index: usize,
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
    /// Optional features: f16 and subgroups as offered; whether the matmuls run on
    /// cooperative matrices (tensor cores) here (`coop_offered`).
    pub shader_f16: bool,
    pub subgroups: bool,
    pub cooperative_matrix: bool,
}

fn instance() -> wgpu::Instance {
    // Vulkan, Metal and DX12 only: GL has no storage-buffer compute worth using here, and its
    // EGL probe prints noise on headless machines. WGPU_BACKEND still overrides.
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::PRIMARY;
    wgpu::Instance::new(desc.with_env())
}

/// Adapters able to run compute shaders, best first (discrete, integrated, virtual, other, cpu).
fn compute_adapters(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    let mut adapters: Vec<wgpu::Adapter> =
        pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY))
            .into_iter()
            .filter(|a| {
                a.get_downlevel_capabilities()
                    .flags
                    .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS)
            })
            .collect();
    let rank = |t: wgpu::DeviceType| match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    adapters.sort_by_key(|a| rank(a.get_info().device_type));
    adapters
}

/// Every adapter that can run quantppl's kernels, in the order `WgpuBackend::new` indexes them.
pub fn list_adapters() -> Vec<AdapterInfo> {
    compute_adapters(&instance())
        .iter()
        .enumerate()
        .map(|(index, a)| {
            let i = a.get_info();
            let l = a.limits();
            let f = a.features();
            AdapterInfo {
                index,
                name: i.name,
                backend: format!("{:?}", i.backend),
                device_type: format!("{:?}", i.device_type),
                driver: format!("{} {}", i.driver, i.driver_info).trim().to_string(),
                max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
                max_buffer_size: l.max_buffer_size,
                max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
                max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
                shader_f16: f.contains(wgpu::Features::SHADER_F16),
                subgroups: f.contains(wgpu::Features::SUBGROUP),
                cooperative_matrix: coop_offered(a),
            }
        })
        .collect()
}

/// The features the cooperative-matrix matmuls (`MatmulSum::Split`) need.
const COOP_FEATURES: wgpu::Features =
    wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX.union(wgpu::Features::SHADER_F16);

/// Whether the matmuls can run on `adapter`'s cooperative matrices: 16x16x16 f16 products
/// into f32, f16 packing in f32 shaders, subgroups of exactly 32 invocations (split_gemm.wgsl
/// splits its workgroup into 8 of them) and the kernels' workgroup memory
/// (`BackendOptions::wgpu_no_coop` keeps the shader-core kernels all the same).
fn coop_offered(adapter: &wgpu::Adapter) -> bool {
    let info = adapter.get_info();
    let limits = adapter.limits();
    adapter.features().contains(COOP_FEATURES)
        && adapter
            .get_downlevel_capabilities()
            .flags
            .contains(wgpu::DownlevelFlags::SHADER_F16_IN_F32)
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        })
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && limits.max_compute_invocations_per_workgroup >= 256
        && limits.max_compute_workgroup_storage_size >= super::pipelines::SPLIT_GEMM_WORKGROUP_BYTES
}

/// Bytes of device memory held by the backend's storage buffers, now and at most, and the
/// activation buffers their owners dropped, kept by size for the next request of that size:
/// creating and freeing device memory for every activation (hundreds of MB per layer) cost
/// more than the kernels that fill them (docs/decisions.md: Freed device buffers kept for
/// reuse). Kept buffers still count as held.
#[derive(Default)]
pub(crate) struct MemCounter {
    live: AtomicU64,
    peak: AtomicU64,
    free: Mutex<HashMap<u64, Vec<wgpu::Buffer>>>,
}

impl MemCounter {
    fn add(&self, bytes: u64) {
        let now = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    fn take_free(&self, bytes: u64) -> Option<wgpu::Buffer> {
        self.free.lock().ok()?.get_mut(&bytes)?.pop()
    }

    /// Frees every kept buffer; returns whether there was any.
    fn release_free(&self) -> bool {
        let Ok(mut free) = self.free.lock() else {
            return false;
        };
        let mut released = false;
        for (bytes, bufs) in free.drain() {
            self.live
                .fetch_sub(bytes * bufs.len() as u64, Ordering::Relaxed);
            released |= !bufs.is_empty();
        }
        released
    }
}

/// A storage buffer counted in `MemCounter` for as long as it lives; an activation buffer
/// (`reuse`) goes back to the counter's free list when dropped.
pub(crate) struct GpuBuf {
    pub(crate) buf: wgpu::Buffer,
    bytes: u64,
    mem: Arc<MemCounter>,
    reuse: bool,
}

impl Drop for GpuBuf {
    fn drop(&mut self) {
        if self.reuse
            && let Ok(mut free) = self.mem.free.lock()
        {
            // Dispatches already recorded that use it still run first: the queue orders
            // them before any later dispatch that writes it again.
            free.entry(self.bytes).or_default().push(self.buf.clone());
            return;
        }
        self.mem.live.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

pub(crate) struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) limits: wgpu::Limits,
    pipelines: Pipelines,
    /// Tile shapes the matmul and attention kernels were compiled with.
    pub(crate) tiles: TileConfig,
    /// Whether the matmuls run on cooperative matrices (`coop_offered`).
    pub(crate) coop: bool,
    /// Whether those multiply one f16 product of each activation and weight (`--dtype f16`)
    /// rather than f32-grade ones.
    pub(crate) one_product: bool,
    /// Whether that mode was asked for by name (and, without cooperative matrices, not given).
    pub(crate) one_product_asked: bool,
    pub(crate) mem: Arc<MemCounter>,
    /// The first error wgpu reported outside an error scope (e.g. a failed dispatch).
    uncaptured: Arc<Mutex<Option<String>>>,
    /// Bound to bindings a layer does not use (no bias, no zero points, no g_idx).
    pub(crate) dummy: wgpu::Buffer,
    /// Dispatches recorded but not yet submitted (see `run`).
    pending: Mutex<Pending>,
}

/// One command encoder collecting consecutive dispatches, submitted as one command buffer
/// every `SUBMIT_EVERY` dispatches and before any wait or readback.
#[derive(Default)]
struct Pending {
    encoder: Option<wgpu::CommandEncoder>,
    dispatches: usize,
}

/// Dispatches per submitted command buffer: large enough that submission costs nothing next to
/// the kernels, small enough that the GPU starts on a batch while the host records the next.
const SUBMIT_EVERY: usize = 16;

impl Gpu {
    /// Opens adapter `adapter_index` (or the best one) with the tiles of `options`, or the
    /// tile shapes chosen for the adapter.
    /// The adapter of `adapter_index` (the best one where `None`); `products`: how the split
    /// matmuls multiply where the adapter has cooperative matrices.
    pub(crate) fn open(
        adapter_index: Option<usize>,
        options: &BackendOptions,
        products: super::ProductMode,
    ) -> Result<Self> {
        let instance = instance();
        let adapters = compute_adapters(&instance);
        let n = adapters.len();
        let adapter = match adapter_index {
            None => adapters.into_iter().next(),
            Some(i) => adapters.into_iter().nth(i),
        }
        .ok_or_else(|| match adapter_index {
            Some(i) if n > 0 => Error::InvalidArgument(format!(
                "wgpu adapter {i} does not exist ({n} found; see `list_adapters`)"
            )),
            _ => Error::backend(
                BACKEND,
                "no GPU adapter with compute shaders found (install a Vulkan, Metal or DX12 driver)",
            ),
        })?;
        let info = adapter.get_info();
        // The adapter's own limits: downlevel defaults cap storage bindings at 128 MiB.
        let mut limits = adapter.limits();
        if let Some(bytes) = options.wgpu_max_binding {
            let max = &mut limits.max_storage_buffer_binding_size;
            *max = (*max).min(bytes);
        }
        let coop = !options.wgpu_no_coop && coop_offered(&adapter);
        // Every other kernel is plain WGSL with f32 arithmetic and needs no optional feature.
        let (required_features, experimental_features) = if coop {
            // SAFETY: wgpu's cooperative matrices are experimental API, not unsound by design;
            // every layout the kernels use was checked exact on NVIDIA's driver
            // (examples/wgpu_coop_probe.rs), and `check` compares them with the CPU.
            (COOP_FEATURES, unsafe {
                wgpu::ExperimentalFeatures::enabled()
            })
        } else {
            (
                wgpu::Features::empty(),
                wgpu::ExperimentalFeatures::disabled(),
            )
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("quantppl"),
            required_features,
            required_limits: limits.clone(),
            experimental_features,
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| {
            Error::backend(
                BACKEND,
                format!("requesting a device on {}: {e}", info.name),
            )
        })?;
        let uncaptured = Arc::new(Mutex::new(None::<String>));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut slot) = sink.lock() {
                slot.get_or_insert_with(|| e.to_string());
            }
        }));
        let tiles = match options.wgpu_tiles {
            Some(t) => {
                t.check(&limits)
                    .map_err(|e| Error::backend(BACKEND, format!("tile shape {t:?}: {e}")))?;
                t
            }
            None => TileConfig::for_adapter(&info, &limits)
                .map_err(|e| Error::backend(BACKEND, format!("{}: {e}", info.name)))?,
        };
        let pipelines = Pipelines::new(
            tiles,
            coop,
            options.wgpu_checks,
            options.wgpu_sources.clone(),
        );
        let dummy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("unused binding"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Ok(Self {
            device,
            queue,
            info,
            limits,
            pipelines,
            tiles,
            coop,
            one_product: coop && products != super::ProductMode::F32Grade,
            one_product_asked: products == super::ProductMode::OneProduct { named: true },
            mem: Arc::new(MemCounter::default()),
            uncaptured,
            dummy,
            pending: Mutex::new(Pending::default()),
        })
    }

    /// Largest buffer one binding may see.
    pub(crate) fn max_binding(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
    }

    /// Blocks until every submitted command has finished (for timing).
    pub fn wait_idle(&self) -> Result<()> {
        self.flush()?;
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::backend(BACKEND, format!("waiting for the GPU: {e}")))?;
        self.check()
    }

    /// Returns the first error wgpu reported asynchronously, if any.
    pub(crate) fn check(&self) -> Result<()> {
        let slot = self
            .uncaptured
            .lock()
            .map_err(|_| Error::backend(BACKEND, "error slot poisoned"))?;
        match slot.as_ref() {
            Some(e) => Err(Error::backend(BACKEND, e)),
            None => Ok(()),
        }
    }

    fn checked_alloc(
        &self,
        what: &str,
        bytes: u64,
        reuse: bool,
        make: impl FnOnce() -> wgpu::Buffer,
    ) -> Result<GpuBuf> {
        if bytes > self.max_binding() {
            return Err(Error::backend(
                BACKEND,
                format!(
                    "{what}: {bytes} bytes exceed the largest storage binding of {} ({} bytes)",
                    self.info.name,
                    self.max_binding()
                ),
            ));
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buf = make();
        if pollster::block_on(scope.pop()).is_some() {
            return Err(Error::OutOfMemory {
                backend: BACKEND,
                what: what.to_string(),
                bytes,
            });
        }
        self.mem.add(bytes);
        Ok(GpuBuf {
            buf,
            bytes,
            mem: self.mem.clone(),
            reuse,
        })
    }

    /// A zero-filled storage buffer of at least `bytes`: one of the right size dropped
    /// earlier, cleared on the queue, or a new one (which wgpu zero-initializes).
    pub(crate) fn storage(&self, what: &str, bytes: u64) -> Result<GpuBuf> {
        self.activation(what, bytes, true)
    }

    /// As `storage`, but a reused buffer keeps what it held: for outputs the next dispatch
    /// writes whole.
    pub(crate) fn scratch(&self, what: &str, bytes: u64) -> Result<GpuBuf> {
        self.activation(what, bytes, false)
    }

    fn activation(&self, what: &str, bytes: u64, zeroed: bool) -> Result<GpuBuf> {
        let size = bytes.max(4).next_multiple_of(4);
        if let Some(buf) = self.mem.take_free(size) {
            if zeroed {
                self.record(|encoder| encoder.clear_buffer(&buf, 0, None))?;
            }
            return Ok(GpuBuf {
                buf,
                bytes: size,
                mem: self.mem.clone(),
                reuse: true,
            });
        }
        let make = || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(what),
                size,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        match self.checked_alloc(what, size, true, make) {
            // Kept buffers of other sizes may be what is missing.
            Err(Error::OutOfMemory { .. }) if self.mem.release_free() => {
                self.checked_alloc(what, size, true, make)
            }
            r => r,
        }
    }

    /// A storage buffer holding `data`, padded with zeros to whole words.
    pub(crate) fn upload(&self, what: &str, data: &[u8]) -> Result<GpuBuf> {
        let padded;
        let contents = if data.len().is_multiple_of(4) && !data.is_empty() {
            data
        } else {
            let mut v = data.to_vec();
            v.resize(data.len().max(4).next_multiple_of(4), 0);
            padded = v;
            &padded
        };
        self.checked_alloc(what, contents.len() as u64, false, || {
            self.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(what),
                    contents,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                })
        })
    }

    fn pending(&self) -> Result<std::sync::MutexGuard<'_, Pending>> {
        self.pending
            .lock()
            .map_err(|_| Error::backend(BACKEND, "command encoder lock poisoned"))
    }

    /// Submits the dispatches recorded so far.
    pub(crate) fn flush(&self) -> Result<()> {
        let mut pending = self.pending()?;
        if let Some(encoder) = pending.encoder.take() {
            pending.dispatches = 0;
            self.queue.submit([encoder.finish()]);
        }
        Ok(())
    }

    /// Records one dispatch of `kernel` (binding 0 is its uniform `params`, bindings 1.. are
    /// `buffers` in order) into the pending command encoder, compiling it at its first use.
    /// Dispatches run in recording order; every buffer they use stays alive until they have
    /// run, whoever drops it.
    pub(crate) fn run(
        &self,
        kernel: &'static Kernel,
        params: &[u8],
        buffers: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) -> Result<()> {
        self.run_variant(kernel, Variant::Only, params, buffers, groups)
    }

    /// `run` of one of a kernel's modules (a matmul's way of summing, ...).
    pub(crate) fn run_variant(
        &self,
        kernel: &'static Kernel,
        variant: Variant,
        params: &[u8],
        buffers: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let name = kernel.name;
        let max = self.limits.max_compute_workgroups_per_dimension;
        if groups.iter().any(|&g| g > max) {
            return Err(Error::backend(
                BACKEND,
                format!("{name}: dispatch {groups:?} exceeds {max} workgroups per dimension"),
            ));
        }
        let (pipeline, layout) = self.pipelines.get(&self.device, kernel, variant)?;
        let uniform = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(name),
                contents: params,
                usage: wgpu::BufferUsages::UNIFORM,
            });
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: uniform.as_entire_binding(),
        }];
        entries.extend(
            buffers
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry {
                    binding: i as u32 + 1,
                    resource: b.as_entire_binding(),
                }),
        );
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(name),
            layout: &layout,
            entries: &entries,
        });
        self.record(|encoder| {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(name),
                timestamp_writes: None,
            });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        })?;
        let dispatches = {
            let mut pending = self.pending()?;
            pending.dispatches += 1;
            pending.dispatches
        };
        if dispatches >= SUBMIT_EVERY {
            self.flush()?;
        }
        Ok(())
    }

    /// Records commands into the pending command encoder, which runs them in recording order.
    fn record<R>(&self, commands: impl FnOnce(&mut wgpu::CommandEncoder) -> R) -> Result<R> {
        let mut pending = self.pending()?;
        let encoder = pending.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("quantppl"),
                })
        });
        Ok(commands(encoder))
    }

    /// Workgroups for `n` independent items (rows or blocks of 256 elements), folded into two
    /// dimensions when one would exceed the per-dimension limit; shaders index
    /// `wid.y * num_workgroups.x + wid.x`.
    pub(crate) fn grid(&self, n: u64) -> [u32; 3] {
        let max = self.limits.max_compute_workgroups_per_dimension.max(1) as u64;
        if n <= max {
            [n as u32, 1, 1]
        } else {
            [max as u32, n.div_ceil(max) as u32, 1]
        }
    }

    /// Copies the first `n` f32 values of `src` back to the host.
    pub(crate) fn read_f32(&self, src: &wgpu::Buffer, n: usize) -> Result<Vec<f32>> {
        let bytes = (n as u64 * 4).max(4);
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.record(|encoder| encoder.copy_buffer_to_buffer(src, 0, &staging, 0, bytes))?;
        self.flush()?;
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::backend(BACKEND, format!("waiting for the GPU: {e}")))?;
        self.check()?;
        rx.recv()
            .map_err(|_| Error::backend(BACKEND, "readback callback never ran"))?
            .map_err(|e| Error::backend(BACKEND, format!("mapping a readback buffer: {e}")))?;
        let out = {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| Error::backend(BACKEND, format!("reading back: {e}")))?;
            bytemuck::pod_collect_to_vec::<u8, f32>(&view[..n * 4])
        };
        staging.unmap();
        Ok(out)
    }
}
