//! Device memory: every allocation counted (current and peak bytes), freed buffers kept for
//! reuse, the tensor type with its element type and length, host <-> device transfers, and the
//! conversions of activations between f32 and the activation type.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaSlice, DevicePtr, result, sys};

use super::kernels::{self, Dt};
use super::{CudaBackend, driver_err};
use crate::backend::{OutType, Shaped};
use crate::{Error, Result};

/// A backend's device memory: bytes in use and their high-water mark (the buffers asked for,
/// as `torch.cuda.max_memory_allocated` counts them), and freed buffers of `KEEP_FROM_BYTES`
/// or more kept for the next request of their exact size.
///
/// The driver's stream-ordered pool took 2 to 6 ms for some allocations of a few GB (the
/// experts' buffers, a layer's activations) where it found no free block to hand out, longer
/// than the kernel they were queued behind: 35 to 215 ms of an MoE batch idle
/// (docs/decisions.md: Freed device buffers kept for reuse). Every layer asks for the sizes
/// the one before freed; served from here they cost nothing. All work runs in one stream's
/// order (side streams join it before their buffers are freed), so a buffer freed here is
/// free for whatever is queued next.
#[derive(Default)]
pub(super) struct Memory {
    pub(super) current: AtomicU64,
    pub(super) peak: AtomicU64,
    kept: Mutex<Kept<CudaSlice<u8>>>,
}

/// Buffers smaller than this go back to the driver's pool at once: it serves them in
/// microseconds, and their sizes vary from layer to layer (tables, counts).
const KEEP_FROM_BYTES: usize = 1 << 20;

/// Requests of `KEEP_FROM_BYTES` or more after which a kept buffer none of them took goes
/// back to the driver's pool, at the next request the kept ones cannot serve (a layer makes
/// several, so this spans many batches): buffers of sizes a run no longer asks for
/// (another batch shape, a finished phase) are not held for ever.
const KEEP_FOR_REQUESTS: u64 = 16_384;

/// Freed buffers by exact size, each with the request count when it was freed.
struct Kept<B> {
    by_size: HashMap<usize, Vec<(u64, B)>>,
    requests: u64,
}

impl<B> Default for Kept<B> {
    fn default() -> Self {
        Self {
            by_size: HashMap::new(),
            requests: 0,
        }
    }
}

impl<B> Kept<B> {
    /// A kept buffer of `bytes` for a new request, the last one freed; on a miss, the
    /// buffers kept past `KEEP_FOR_REQUESTS` are handed out of here (dropped) first.
    fn take(&mut self, bytes: usize) -> Option<B> {
        self.requests += 1;
        if let Some((_, b)) = self.by_size.get_mut(&bytes).and_then(Vec::pop) {
            return Some(b);
        }
        let oldest = self.requests.saturating_sub(KEEP_FOR_REQUESTS);
        self.by_size.retain(|_, list| {
            list.retain(|(freed, _)| *freed >= oldest);
            !list.is_empty()
        });
        None
    }

    fn keep(&mut self, bytes: usize, b: B) {
        let at = self.requests;
        self.by_size.entry(bytes).or_default().push((at, b));
    }
}

impl Memory {
    fn lock_kept(&self) -> std::sync::MutexGuard<'_, Kept<CudaSlice<u8>>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands every kept buffer back to the driver's pool (in stream order).
    fn release_kept(&self) {
        self.lock_kept().by_size.clear();
    }
}

/// A device allocation that keeps `Memory` up to date, handed back to it when dropped.
pub(super) struct DevBuf {
    slice: ManuallyDrop<CudaSlice<u8>>,
    memory: Arc<Memory>,
}

impl DevBuf {
    /// Device address (for kernel arguments and cuBLAS).
    pub(super) fn ptr(&self) -> u64 {
        self.slice.device_ptr(self.slice.stream()).0
    }

    pub(super) fn len(&self) -> usize {
        self.slice.len()
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let bytes = self.slice.len();
        self.memory
            .current
            .fetch_sub(bytes as u64, Ordering::Relaxed);
        // SAFETY: `slice` is not used after this.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        if bytes >= KEEP_FROM_BYTES {
            self.memory.lock_kept().keep(bytes, slice);
        }
    }
}

/// An activation, the f32 residual stream or an f32 parameter vector on the device.
pub struct CudaTensor {
    pub(super) buf: DevBuf,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) dtype: Dt,
    /// f32 values held as three bf16 planes that sum to them exactly (`OutType::ExactForRouter`):
    /// `buf` is the first (the values rounded to bf16, so `dtype` is bf16 and every op reads
    /// what it would have read of the f32 values), `Planes` the other two.
    pub(super) planes: Option<Planes>,
}

/// The second and third planes of a tensor held as planes (`CudaTensor::planes`), one after
/// the other, until routing, their one reader, releases them (a mixture's input stays alive
/// through its experts: 4 bytes a value more there otherwise).
pub(super) struct Planes(std::sync::Mutex<Option<DevBuf>>);

impl Planes {
    pub(super) fn new(residuals: DevBuf) -> Self {
        Self(std::sync::Mutex::new(Some(residuals)))
    }

    /// `f` of their buffer, `None` once released.
    pub(super) fn held<R>(&self, f: impl FnOnce(&DevBuf) -> R) -> Option<R> {
        let held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        held.as_ref().map(f)
    }

    /// Where they lie, `None` once released.
    pub(super) fn residuals(&self) -> Option<u64> {
        self.held(DevBuf::ptr)
    }

    /// Frees them, in stream order (after the work queued on them).
    pub(super) fn release(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

impl Shaped for CudaTensor {
    fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    fn reshaped(self, rows: usize, cols: usize) -> Result<Self> {
        if rows * cols != self.len() {
            return Err(crate::backend::reshape_error(self.len(), rows, cols));
        }
        Ok(Self { rows, cols, ..self })
    }
}

impl CudaTensor {
    pub(super) fn ptr(&self) -> u64 {
        self.buf.ptr()
    }

    /// The rows its buffer has room for: `rows`, plus any slack it was made with.
    pub(super) fn row_capacity(&self) -> usize {
        self.buf.len() / (self.cols * self.dtype.bytes()).max(1)
    }
}

impl CudaBackend {
    pub(super) fn alloc(&self, bytes: usize, what: &str) -> Result<DevBuf> {
        let bytes = bytes.max(1);
        let kept = (bytes >= KEEP_FROM_BYTES)
            .then(|| self.memory.lock_kept().take(bytes))
            .flatten();
        let slice = match kept {
            Some(slice) => Ok(slice),
            None => self.alloc_new(bytes).or_else(|e| {
                // Out of memory: hand the kept buffers and the pool's free memory back to the
                // driver and try once more.
                if e != sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                    return Err(e);
                }
                self.release_freed();
                self.alloc_new(bytes)
            }),
        }
        .map_err(|e| {
            if e == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                Error::OutOfMemory {
                    backend: "cuda",
                    what: what.to_string(),
                    bytes: bytes as u64,
                }
            } else {
                let e = cudarc::driver::DriverError(e);
                driver_err(&format!("allocating {what} ({bytes} bytes)"), e)
            }
        })?;
        let now = self
            .memory
            .current
            .fetch_add(bytes as u64, Ordering::Relaxed)
            + bytes as u64;
        self.memory.peak.fetch_max(now, Ordering::Relaxed);
        Ok(DevBuf {
            slice: ManuallyDrop::new(slice),
            memory: self.memory.clone(),
        })
    }

    /// Hands the buffers kept for reuse and the memory the pool keeps back to the driver
    /// (after the work queued on them); best effort: a failure leaves them where they were.
    pub(super) fn release_freed(&self) {
        self.memory.release_kept();
        if self.stream.synchronize().is_ok() && self.ctx.has_async_alloc() {
            let _ = trim_pool(&self.ctx);
        }
    }

    /// A new buffer of `bytes` from the driver.
    fn alloc_new(&self, bytes: usize) -> std::result::Result<CudaSlice<u8>, sys::CUresult> {
        // SAFETY: every buffer is written by a copy or a kernel before it is read.
        unsafe { self.stream.alloc::<u8>(bytes) }.map_err(|e| e.0)
    }

    pub(super) fn upload_bytes(&self, bytes: &[u8], what: &str) -> Result<DevBuf> {
        let mut buf = self.alloc(bytes.len(), what)?;
        self.stream
            .memcpy_htod(bytes, &mut *buf.slice)
            .map_err(|e| driver_err(&format!("uploading {what}"), e))?;
        Ok(buf)
    }

    pub(super) fn upload_pod<T: bytemuck::Pod>(&self, values: &[T], what: &str) -> Result<DevBuf> {
        self.upload_bytes(bytemuck::cast_slice(values), what)
    }

    pub(super) fn download_bytes(&self, buf: &DevBuf, what: &str) -> Result<Vec<u8>> {
        self.stream
            .clone_dtoh(&*buf.slice)
            .map_err(|e| driver_err(&format!("downloading {what}"), e))
    }

    pub(super) fn new_tensor(
        &self,
        [rows, cols]: [usize; 2],
        dtype: Dt,
        what: &str,
    ) -> Result<CudaTensor> {
        Ok(CudaTensor {
            buf: self.alloc(rows * cols * dtype.bytes(), what)?,
            rows,
            cols,
            dtype,
            planes: None,
        })
    }

    /// A `[rows, cols]` tensor whose buffer has room for `slack` rows more, which GEMMs
    /// padded to a multiple of rows may read and write past its last row.
    pub(super) fn new_tensor_with_slack(
        &self,
        [rows, cols]: [usize; 2],
        slack: usize,
        dtype: Dt,
        what: &str,
    ) -> Result<CudaTensor> {
        Ok(CudaTensor {
            buf: self.alloc((rows + slack) * cols * dtype.bytes(), what)?,
            rows,
            cols,
            dtype,
            planes: None,
        })
    }

    /// Sets every value of `t` to zero (on the stream).
    pub(super) fn zero_fill(&self, t: &CudaTensor, what: &str) -> Result<()> {
        // SAFETY: the buffer holds at least the tensor's values and lives on this stream.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                t.ptr(),
                0,
                t.len() * t.dtype.bytes(),
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| driver_err(&format!("zeroing {what}"), e))
    }

    /// `values` in the activation type's device layout (rounded when it is bf16).
    pub(super) fn act_bytes(&self, values: &[f32]) -> Vec<u8> {
        match self.precision.act() {
            Dt::F32 => bytemuck::cast_slice(values).to_vec(),
            Dt::Bf16 => values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
                .collect(),
        }
    }

    /// `t` in the activation type: itself, or (bf16 path) a bf16 copy of an f32 tensor such as
    /// the vectors the generic checks upload with `upload_vector`.
    pub(super) fn act<'a>(&self, t: &'a CudaTensor) -> Result<Act<'a>> {
        match (t.dtype, self.precision.act()) {
            (a, b) if a == b => Ok(Act::Same(t)),
            (Dt::F32, Dt::Bf16) => {
                let out = self.new_tensor(t.shape(), Dt::Bf16, "bf16 copy of an f32 activation")?;
                kernels::elementwise::to_bf16(
                    &self.kernels,
                    &self.stream,
                    out.ptr(),
                    t.ptr(),
                    t.len(),
                )?;
                Ok(Act::Converted(out))
            }
            _ => Err(Error::backend(
                "cuda",
                "a bf16 tensor on a backend with f32 activations",
            )),
        }
    }

    /// An error unless `t` is `[rows, cols]` of `dtype`.
    pub(super) fn check_tensor(
        &self,
        t: &CudaTensor,
        [rows, cols]: [usize; 2],
        dtype: Dt,
        what: &str,
    ) -> Result<()> {
        if t.shape() != [rows, cols] || t.dtype != dtype {
            return Err(Error::InvalidArgument(format!(
                "cuda {what}: expected [{rows}, {cols}] {dtype:?}, got {:?} {:?}",
                t.shape(),
                t.dtype
            )));
        }
        Ok(())
    }

    /// The element type of an op's output.
    pub(super) fn out_dt(&self, out: OutType) -> Dt {
        match out {
            OutType::Activation => self.precision.act(),
            // Planes where an op makes them (the norms), else f32.
            OutType::F32 | OutType::ExactForRouter => Dt::F32,
        }
    }
}

/// Buffers are freed into the device's stream-ordered memory pool, which by default hands
/// its memory back to the driver at every synchronization (the end of each batch) for the next
/// batch to map again. A release threshold of "never" keeps it for reuse, as the allocators of
/// the deep-learning frameworks do.
pub(super) fn keep_freed_memory(ctx: &CudaContext) -> Result<()> {
    let keep: u64 = u64::MAX;
    // SAFETY: the pool belongs to a live context, and the release threshold attribute takes a
    // cuuint64_t.
    unsafe {
        result::mem_pool::set_attribute(
            default_pool(ctx)?,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &keep as *const u64 as *mut std::ffi::c_void,
        )
    }
    .map_err(|e| driver_err("setting the memory pool's release threshold", e))
}

/// Hands the memory the device's pool keeps (`keep_freed_memory`) back to the driver.
fn trim_pool(ctx: &CudaContext) -> Result<()> {
    // SAFETY: the pool belongs to a live context; trimming frees only unused pool memory.
    unsafe { result::mem_pool::trim_to(default_pool(ctx)?, 0) }
        .map_err(|e| driver_err("trimming the memory pool", e))
}

/// The stream-ordered memory pool of `ctx`'s device.
fn default_pool(ctx: &CudaContext) -> Result<sys::CUmemoryPool> {
    // SAFETY: the device belongs to a live context.
    unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }
        .map_err(|e| driver_err("getting the default memory pool", e))
}

/// A tensor in the activation type: itself, or a converted copy.
pub(super) enum Act<'a> {
    Same(&'a CudaTensor),
    Converted(CudaTensor),
}

impl Act<'_> {
    pub(super) fn get(&self) -> &CudaTensor {
        match self {
            Act::Same(t) => t,
            Act::Converted(t) => t,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KEEP_FOR_REQUESTS, Kept};

    #[test]
    fn kept_buffers_serve_their_size_until_they_go_stale() {
        let mut kept = Kept::<&str>::default();
        assert_eq!(kept.take(100), None);
        kept.keep(100, "a");
        kept.keep(100, "b");
        kept.keep(200, "c");
        // The last freed of the size asked for; none of another size.
        assert_eq!(kept.take(100), Some("b"));
        assert_eq!(kept.take(150), None);
        assert_eq!(kept.take(100), Some("a"));
        assert_eq!(kept.take(100), None);
        // Left untaken for KEEP_FOR_REQUESTS requests, "c" is dropped at the next miss.
        for _ in 0..KEEP_FOR_REQUESTS {
            kept.keep(300, "d");
            assert_eq!(kept.take(300), Some("d"));
        }
        assert_eq!(kept.take(400), None);
        assert_eq!(kept.take(200), None);
        kept.keep(200, "e");
        assert_eq!(kept.take(200), Some("e"));
    }
}
