//! The CUDA backend: weights kept packed on the device, activations in one of two precisions
//! chosen per backend (`CudaBackend::with_activation_type`):
//! - bf16 (the fast path): bf16 activations and GEMM operands on the tensor cores, f32
//!   accumulation, attention on the tensor cores (flash_attention_sm90.cu on Hopper, else
//!   flash_attention.cu);
//! - f32 (the exact path, for f32 checkpoints and `--dtype f32`): f32 activations, weights
//!   dequantized to f32 (exactly `QLinear::dequantize`), f32 GEMMs without TF32.
//!
//! In both, the residual stream (embedding output and the sums `add_assign` forms) is f32:
//! it is the accumulator across layers. Activation fake quantization runs in the activation
//! type, as compressed-tensors does in the model's dtype (`ActQuant::apply_row`), on inputs
//! the ops before it hand over in f32 (`Backend::input_type`): quantizing bf16-rounded values
//! moved NVFP4 W4A4 PPL 2-3 % away from the f32 reference, quantizing the f32 values < 0.5 %.
//!
//! A linear dequantizes its packed weight into one reused scratch buffer (the size of the
//! largest layer) and multiplies with cuBLAS; the lm_head runs over vocab tiles folded into an
//! online log-sum-exp, so only one f32 NLL per scored row comes back. Everything is queued on
//! one stream, which orders the reuses of the scratch buffer.

mod gemm;
mod kernels;
mod nvrtc;
mod probe;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaSlice, DevicePtr, DriverError, result, sys};
use safetensors::Dtype;

pub use probe::{DeviceInfo, cuda_available, device_info};

use super::{AttnShape, Backend, KldTerms, OutType, SeqLayout};
use crate::checkpoint::qlinear::zero_points;
use crate::checkpoint::{ModelConfig, Packing, QLinear, TensorRef};
use crate::numerics::{ActQuant, FloatType};
use crate::{Error, Result};
use kernels::dequant::{self, IntArgs, Rows, StrategyArgs, UnpackedArgs, dtype_code};
use kernels::nll::LseState;
use kernels::{Dt, Kernels, Stream};

/// Vocab columns per lm_head tile.
const VOCAB_TILE: usize = 8192;
/// Scored rows per lm_head pass: with VOCAB_TILE, a 256 MiB f32 logits tile.
const ROW_CHUNK: usize = 8192;

/// Device bytes in use and their high-water mark.
#[derive(Default)]
struct Accounting {
    current: AtomicU64,
    peak: AtomicU64,
}

/// A device allocation that keeps `Accounting` up to date.
struct DevBuf {
    slice: CudaSlice<u8>,
    acct: Arc<Accounting>,
}

impl DevBuf {
    /// Device address (for kernel arguments and cuBLAS).
    fn ptr(&self) -> u64 {
        self.slice.device_ptr(self.slice.stream()).0
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        self.acct
            .current
            .fetch_sub(self.slice.len() as u64, Ordering::Relaxed);
    }
}

/// An activation, the f32 residual stream or an f32 parameter vector on the device.
pub struct CudaTensor {
    buf: DevBuf,
    len: usize,
    dtype: Dt,
}

impl CudaTensor {
    fn ptr(&self) -> u64 {
        self.buf.ptr()
    }
}

/// How a linear's weight lies on the device.
enum DevWeight {
    /// `[out, in]` in the activation type, multiplied directly (dense checkpoints, embeddings).
    Dense(DevBuf),
    Int {
        packed: DevBuf,
        scales: DevBuf,
        zeros: Option<DevBuf>,
        g_idx: Option<DevBuf>,
        args: IntArgs,
    },
    Nvfp4 {
        packed: DevBuf,
        scales: DevBuf,
        global_scale: f32,
        model_dt: i32,
    },
    Unpacked {
        weight: DevBuf,
        scales: DevBuf,
        zeros: Option<DevBuf>,
        args: UnpackedArgs,
    },
}

pub struct CudaLinear {
    name: String,
    out_features: usize,
    in_features: usize,
    weight: DevWeight,
    /// f32 bias.
    bias: Option<DevBuf>,
    act_quant: Option<ActQuant>,
}

pub struct CudaLayout {
    /// u32 position of each token.
    positions: DevBuf,
    /// u32 flattened index of the first token of each token's sequence.
    seq_start: DevBuf,
    n_tokens: usize,
    max_position: usize,
}

pub struct CudaBackend {
    info: DeviceInfo,
    ctx: Arc<CudaContext>,
    stream: Stream,
    blas: Mutex<CudaBlas>,
    kernels: Kernels,
    acct: Arc<Accounting>,
    /// Activation type: GEMM operands, dequantized weights and every activation but the
    /// residual stream.
    act: Dt,
    /// The reused dequantization buffer (activation type).
    scratch: Mutex<Option<DevBuf>>,
    /// `gemm_peak_tflops`, once measured.
    gemm_peak: OnceLock<f64>,
    /// Elements of the largest quantized layer uploaded so far (the scratch size to allocate).
    largest_layer: AtomicUsize,
    /// Attention on the mma.sync kernel even where the wgmma one exists (to compare them).
    portable_attention: bool,
}

fn driver_err(what: &str, e: DriverError) -> Error {
    Error::backend("cuda", format!("{what}: {e:?}"))
}

impl CudaBackend {
    /// Opens device `device_ordinal` with bf16 activations (the fast path).
    pub fn new(device_ordinal: usize) -> Result<Self> {
        Self::with_activation_type(device_ordinal, FloatType::Bf16)
    }

    /// Opens device `device_ordinal` with activations in `act` (`F32` or `Bf16`): probes the
    /// libraries, creates a context, a stream and a cuBLAS handle, and compiles (or loads
    /// cached) kernels for its architecture.
    pub fn with_activation_type(device_ordinal: usize, act: FloatType) -> Result<Self> {
        let act = match act {
            FloatType::F32 => Dt::F32,
            FloatType::Bf16 => Dt::Bf16,
            FloatType::F16 => {
                return Err(Error::unsupported(
                    "cuda",
                    "activation type",
                    "f16 (use f32 or bf16)",
                ));
            }
        };
        let info = device_info(device_ordinal).map_err(|m| Error::backend("cuda", m))?;
        let ctx =
            CudaContext::new(device_ordinal).map_err(|e| driver_err("creating context", e))?;
        if ctx.has_async_alloc() {
            keep_freed_memory(&ctx)?;
        }
        // One stream orders all work, so cudarc's per-buffer events are unnecessary overhead.
        // SAFETY: no buffer of this context exists yet and only `stream` is ever used.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| driver_err("creating stream", e))?;
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| Error::backend("cuda", format!("cuBLAS handle: {e:?}")))?;
        let kernels = Kernels::load(&ctx, info.compute_capability)?;
        Ok(Self {
            info,
            ctx,
            stream,
            blas: Mutex::new(blas),
            kernels,
            acct: Arc::default(),
            act,
            scratch: Mutex::new(None),
            gemm_peak: OnceLock::new(),
            largest_layer: AtomicUsize::new(0),
            portable_attention: false,
        })
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.info
    }

    /// The tensor-core attention kernel used for bf16 head_dim 64 and 128, if any.
    pub fn attention_kernel(&self) -> Option<&'static str> {
        kernels::attention::flash_kernel(&self.kernels, self.portable_attention).map(|f| f.name)
    }

    /// Runs attention on the mma.sync kernel even where the wgmma one exists, so tests and
    /// benchmarks can hold the two against each other on a Hopper GPU.
    pub fn set_portable_attention(&mut self, portable: bool) {
        self.portable_attention = portable;
    }

    fn alloc(&self, bytes: usize, what: &str) -> Result<DevBuf> {
        // SAFETY: every buffer is written by a copy or a kernel before it is read.
        let slice = unsafe { self.stream.alloc::<u8>(bytes.max(1)) }.map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                Error::OutOfMemory {
                    backend: "cuda",
                    what: what.to_string(),
                    bytes: bytes as u64,
                }
            } else {
                driver_err(&format!("allocating {what} ({bytes} bytes)"), e)
            }
        })?;
        let now = self
            .acct
            .current
            .fetch_add(slice.len() as u64, Ordering::Relaxed)
            + slice.len() as u64;
        self.acct.peak.fetch_max(now, Ordering::Relaxed);
        Ok(DevBuf {
            slice,
            acct: self.acct.clone(),
        })
    }

    fn upload_bytes(&self, bytes: &[u8], what: &str) -> Result<DevBuf> {
        let mut buf = self.alloc(bytes.len(), what)?;
        self.stream
            .memcpy_htod(bytes, &mut buf.slice)
            .map_err(|e| driver_err(&format!("uploading {what}"), e))?;
        Ok(buf)
    }

    fn upload_pod<T: bytemuck::Pod>(&self, values: &[T], what: &str) -> Result<DevBuf> {
        self.upload_bytes(bytemuck::cast_slice(values), what)
    }

    fn download_bytes(&self, buf: &DevBuf, what: &str) -> Result<Vec<u8>> {
        self.stream
            .clone_dtoh(&buf.slice)
            .map_err(|e| driver_err(&format!("downloading {what}"), e))
    }

    fn new_tensor(&self, len: usize, dtype: Dt, what: &str) -> Result<CudaTensor> {
        Ok(CudaTensor {
            buf: self.alloc(len * dtype.bytes(), what)?,
            len,
            dtype,
        })
    }

    /// `values` in the activation type's device layout (rounded when it is bf16).
    fn act_bytes(&self, values: &[f32]) -> Vec<u8> {
        match self.act {
            Dt::F32 => bytemuck::cast_slice(values).to_vec(),
            Dt::Bf16 => values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
                .collect(),
        }
    }

    /// Uploads an activation matrix in the activation type (rounded to it where it is bf16),
    /// for checks against the CPU reference.
    pub fn upload_activation(&self, values: &[f32]) -> Result<CudaTensor> {
        Ok(CudaTensor {
            buf: self.upload_bytes(&self.act_bytes(values), "activation")?,
            len: values.len(),
            dtype: self.act,
        })
    }

    /// The weight the GEMM of `w` multiplies with, as f32 (for exactness checks of the
    /// dequantization against `QLinear::dequantize`).
    pub fn dequantized(&self, w: &CudaLinear) -> Result<Vec<f32>> {
        let n = w.out_features * w.in_features;
        let scratch = self.weight_rows(w, 0, w.out_features)?;
        let out = self.new_tensor(n, self.act, "dequantized weight")?;
        let src = match &scratch {
            WeightRows::Resident(p) => *p,
            WeightRows::Scratch(g) => scratch_ptr(g)?,
        };
        // SAFETY: both are live device buffers of n values of the activation type.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                out.ptr(),
                src,
                n * self.act.bytes(),
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| driver_err("copying the dequantized weight", e))?;
        drop(scratch);
        self.download(&out)
    }

    /// Queues the dequantization of `w` into the scratch buffer, the step `linear` runs before
    /// its GEMM (for timing it alone; dense weights need none).
    pub fn dequantize_weight(&self, w: &CudaLinear) -> Result<()> {
        self.weight_rows(w, 0, w.out_features).map(drop)
    }

    /// Measures a square GEMM of `n` in the activation type (random operands: zeros run
    /// faster than real data): TFLOP/s over 10 products after 3 warm-ups.
    fn measure_gemm(&self, n: usize) -> Result<f64> {
        let mut state = 0x9E3779B97F4A7C15u64;
        let values: Vec<f32> = (0..n * n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        let bytes = self.act_bytes(&values);
        let (a, b) = (
            self.upload_bytes(&bytes, "GEMM peak operand")?,
            self.upload_bytes(&bytes, "GEMM peak operand")?,
        );
        let c = self.alloc(n * n * self.act.bytes(), "GEMM peak output")?;
        let blas = self.blas()?;
        let run = || {
            gemm::xwt(
                &blas,
                a.ptr(),
                b.ptr(),
                c.ptr(),
                n,
                n,
                n,
                n,
                (self.act, self.act),
            )
        };
        for _ in 0..3 {
            run()?;
        }
        Backend::synchronize(self)?;
        let start = std::time::Instant::now();
        for _ in 0..10 {
            run()?;
        }
        Backend::synchronize(self)?;
        Ok(20.0 * (n as f64).powi(3) / start.elapsed().as_secs_f64() / 1e12)
    }

    /// Scratch buffer of at least `elems` values, grown when a larger layer appears.
    fn scratch(&self, elems: usize) -> Result<MutexGuard<'_, Option<DevBuf>>> {
        let mut guard = self
            .scratch
            .lock()
            .map_err(|_| Error::backend("cuda", "scratch lock poisoned"))?;
        let elem = self.act.bytes();
        let want = elems.max(self.largest_layer.load(Ordering::Relaxed)) * elem;
        if guard.as_ref().is_none_or(|b| b.slice.len() < elems * elem) {
            *guard = None;
            *guard = Some(self.alloc(want, "dequantization scratch")?);
        }
        Ok(guard)
    }

    /// Rows `row0..row0 + nrows` of `w`'s weight in the activation type on the device: the
    /// resident buffer of a dense layer, or the scratch buffer after dequantization.
    fn weight_rows(&self, w: &CudaLinear, row0: usize, nrows: usize) -> Result<WeightRows<'_>> {
        let n_in = w.in_features;
        let rows = Rows { row0, nrows, n_in };
        let (k, s, dt) = (&self.kernels, &self.stream, self.act);
        let guard = match &w.weight {
            DevWeight::Dense(b) => {
                let offset = row0 * n_in * dt.bytes();
                return Ok(WeightRows::Resident(b.ptr() + offset as u64));
            }
            _ => self.scratch(nrows * n_in)?,
        };
        let out = scratch_ptr(&guard)?;
        match &w.weight {
            DevWeight::Dense(_) => {}
            DevWeight::Int {
                packed,
                scales,
                zeros,
                g_idx,
                args,
            } => {
                let a = IntArgs {
                    packed: packed.ptr(),
                    scales: scales.ptr(),
                    zeros: zeros.as_ref().map_or(0, DevBuf::ptr),
                    g_idx: g_idx.as_ref().map_or(0, DevBuf::ptr),
                    ..*args
                };
                dequant::int(k, s, dt, out, &a, rows)?;
            }
            DevWeight::Nvfp4 {
                packed,
                scales,
                global_scale,
                model_dt,
            } => dequant::nvfp4(
                k,
                s,
                dt,
                out,
                packed.ptr(),
                scales.ptr(),
                *global_scale,
                *model_dt,
                rows,
            )?,
            DevWeight::Unpacked {
                weight,
                scales,
                zeros,
                args,
            } => {
                let a = UnpackedArgs {
                    weight: weight.ptr(),
                    scales: scales.ptr(),
                    zeros: zeros.as_ref().map_or(0, DevBuf::ptr),
                    ..*args
                };
                dequant::unpacked(k, s, dt, out, &a, rows)?;
            }
        }
        Ok(WeightRows::Scratch(guard))
    }

    fn blas(&self) -> Result<MutexGuard<'_, CudaBlas>> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))?;
        self.blas
            .lock()
            .map_err(|_| Error::backend("cuda", "cuBLAS lock poisoned"))
    }

    /// `t` in the activation type: itself, or (bf16 path) a bf16 copy of an f32 tensor such as
    /// the vectors the generic checks upload with `upload_vector`.
    fn act<'a>(&self, t: &'a CudaTensor) -> Result<Act<'a>> {
        match (t.dtype, self.act) {
            (a, b) if a == b => Ok(Act::Same(t)),
            (Dt::F32, Dt::Bf16) => {
                let out = self.new_tensor(t.len, Dt::Bf16, "bf16 copy of an f32 activation")?;
                kernels::elementwise::to_bf16(
                    &self.kernels,
                    &self.stream,
                    out.ptr(),
                    t.ptr(),
                    t.len,
                )?;
                Ok(Act::Converted(out))
            }
            _ => Err(Error::backend(
                "cuda",
                "a bf16 tensor on a backend with f32 activations",
            )),
        }
    }

    fn expect(&self, t: &CudaTensor, len: usize, dtype: Dt, what: &str) -> Result<()> {
        if t.len != len || t.dtype != dtype {
            return Err(Error::InvalidArgument(format!(
                "cuda {what}: expected {len} {dtype:?} values, got {} {:?}",
                t.len, t.dtype
            )));
        }
        Ok(())
    }

    /// Logits tile `[rows, cols]` (f32, row stride `cols`) of hidden rows `x` against head
    /// rows `v0..v0 + cols`.
    fn logits_tile(
        &self,
        x: u64,
        head: &CudaLinear,
        rows: usize,
        v0: usize,
        cols: usize,
        out: u64,
    ) -> Result<()> {
        let w = self.weight_rows(head, v0, cols)?;
        let wp = match &w {
            WeightRows::Resident(p) => *p,
            WeightRows::Scratch(g) => scratch_ptr(g)?,
        };
        gemm::xwt(
            &*self.blas()?,
            x,
            wp,
            out,
            rows,
            head.in_features,
            cols,
            cols,
            (self.act, Dt::F32),
        )
    }

    /// The scored rows of `hidden` gathered into one matrix of the activation type, with their
    /// targets.
    fn scored(
        &self,
        hidden: &CudaTensor,
        n_in: usize,
        targets: &[i32],
        vocab: usize,
    ) -> Result<(CudaTensor, DevBuf, usize)> {
        let hidden = self.act(hidden)?;
        let hidden = hidden.get();
        let rows = hidden.len / n_in.max(1);
        self.expect(hidden, rows * n_in, self.act, "lm_head input")?;
        if targets.len() != rows {
            return Err(Error::InvalidArgument(format!(
                "cuda nll: {} targets for {rows} rows",
                targets.len()
            )));
        }
        let mut ids = Vec::new();
        let mut tg = Vec::new();
        for (r, &t) in targets.iter().enumerate() {
            if t >= 0 {
                if t as usize >= vocab {
                    return Err(Error::InvalidArgument(format!(
                        "target {t} is outside the vocabulary of {vocab}"
                    )));
                }
                ids.push(r as u32);
                tg.push(t);
            }
        }
        let n = ids.len();
        let out = self.new_tensor(n * n_in, self.act, "scored hidden rows")?;
        if n > 0 {
            let ids_dev = self.upload_pod(&ids, "scored row ids")?;
            kernels::gather_rows::run(
                &self.kernels,
                &self.stream,
                (self.act, self.act),
                out.ptr(),
                hidden.ptr(),
                ids_dev.ptr(),
                n,
                n_in,
            )?;
        }
        let tg_dev = self.upload_pod(&tg, "targets")?;
        Ok((out, tg_dev, n))
    }

    /// Running log-sum-exp state for `n` rows: (buffer, state addresses).
    fn lse_state(&self, n: usize, what: &str) -> Result<(DevBuf, LseState)> {
        let buf = self.alloc(n * 20, what)?;
        let base = buf.ptr();
        let st = LseState {
            s: base,
            m: base + 8 * n as u64,
            tgt: base + 12 * n as u64,
            arg: base + 16 * n as u64,
        };
        Ok((buf, st))
    }

    /// First pass over the vocab: per-row max, sumexp, target logit and argmax of `x · head^T`.
    fn lse_pass(
        &self,
        x: &CudaTensor,
        head: &CudaLinear,
        n: usize,
        targets: &DevBuf,
        st: LseState,
        tile: &DevBuf,
    ) -> Result<()> {
        let (n_in, vocab) = (head.in_features, head.out_features);
        for r0 in (0..n).step_by(ROW_CHUNK) {
            let rows = ROW_CHUNK.min(n - r0);
            let xr = x.ptr() + (r0 * n_in * self.act.bytes()) as u64;
            for v0 in (0..vocab).step_by(VOCAB_TILE) {
                let cols = VOCAB_TILE.min(vocab - v0);
                self.logits_tile(xr, head, rows, v0, cols, tile.ptr())?;
                kernels::nll::lse_tile(
                    &self.kernels,
                    &self.stream,
                    tile.ptr(),
                    rows,
                    cols,
                    targets.ptr() + 4 * r0 as u64,
                    v0,
                    v0 == 0,
                    st.offset(r0),
                )?;
            }
        }
        Ok(())
    }

    /// The element type of an op's output.
    fn out_dt(&self, out: OutType) -> Dt {
        match out {
            OutType::Activation => self.act,
            OutType::F32 => Dt::F32,
        }
    }

    /// `rms_norm(x)` into `out_dt`; with `update`, the kernel first adds it to `x` (the f32
    /// residual stream, written in place) and normalizes the sum.
    #[allow(clippy::too_many_arguments)]
    fn normalized(
        &self,
        x: &CudaTensor,
        update: Option<&CudaTensor>,
        weight: &CudaTensor,
        rows: usize,
        cols: usize,
        eps: f32,
        out_dt: Dt,
    ) -> Result<CudaTensor> {
        self.expect(weight, cols, Dt::F32, "rms_norm weight")?;
        let in_dt = update.map_or(x.dtype, |y| y.dtype);
        let out = self.new_tensor(rows * cols, out_dt, "rms_norm output")?;
        kernels::rms_norm::run(
            &self.kernels,
            &self.stream,
            (in_dt, out_dt),
            out.ptr(),
            x.ptr(),
            update.map(CudaTensor::ptr),
            weight.ptr(),
            rows,
            cols,
            eps,
        )?;
        Ok(out)
    }

    fn logits_buffer(&self, n: usize, vocab: usize, what: &str) -> Result<DevBuf> {
        self.alloc(ROW_CHUNK.min(n) * VOCAB_TILE.min(vocab) * 4, what)
    }
}

/// Buffers are freed into the device's stream-ordered memory pool, which by default hands
/// its memory back to the driver at every synchronization (the end of each batch) for the next
/// batch to map again. A release threshold of "never" keeps it for reuse, as the allocators of
/// the deep-learning frameworks do.
fn keep_freed_memory(ctx: &CudaContext) -> Result<()> {
    let keep: u64 = u64::MAX;
    // SAFETY: the device belongs to a live context, and the release threshold attribute takes
    // a cuuint64_t.
    unsafe {
        let pool = result::device::get_default_mem_pool(ctx.cu_device())
            .map_err(|e| driver_err("getting the default memory pool", e))?;
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &keep as *const u64 as *mut std::ffi::c_void,
        )
        .map_err(|e| driver_err("setting the memory pool's release threshold", e))
    }
}

/// A tensor in the activation type: itself, or a converted copy.
enum Act<'a> {
    Same(&'a CudaTensor),
    Converted(CudaTensor),
}

impl Act<'_> {
    fn get(&self) -> &CudaTensor {
        match self {
            Act::Same(t) => t,
            Act::Converted(t) => t,
        }
    }
}

/// A downloaded `LseState` buffer (layout of `CudaBackend::lse_state`).
struct HostLse {
    s: Vec<f64>,
    m: Vec<f32>,
    tgt: Vec<f32>,
    arg: Vec<i32>,
}

impl HostLse {
    fn new(bytes: &[u8], n: usize) -> Self {
        Self {
            s: bytemuck::pod_collect_to_vec(&bytes[..8 * n]),
            m: bytemuck::pod_collect_to_vec(&bytes[8 * n..12 * n]),
            tgt: bytemuck::pod_collect_to_vec(&bytes[12 * n..16 * n]),
            arg: bytemuck::pod_collect_to_vec(&bytes[16 * n..20 * n]),
        }
    }

    fn lse(&self, r: usize) -> f64 {
        self.m[r] as f64 + self.s[r].ln()
    }
}

/// A weight row range ready for the GEMM.
enum WeightRows<'a> {
    Resident(u64),
    Scratch(MutexGuard<'a, Option<DevBuf>>),
}

fn scratch_ptr(g: &MutexGuard<'_, Option<DevBuf>>) -> Result<u64> {
    g.as_ref()
        .map(DevBuf::ptr)
        .ok_or_else(|| Error::backend("cuda", "scratch buffer missing"))
}

/// A float tensor widened to f32 on the host (exact), for scales and biases.
fn f32_values(t: &TensorRef) -> Result<Vec<f32>> {
    t.to_f32()
}

fn float_code(t: &TensorRef) -> Result<i32> {
    crate::numerics::FloatType::from_safetensors(t.dtype)
        .map(dtype_code)
        .ok_or_else(|| Error::DtypeMismatch {
            tensor: t.name.to_string(),
            expected: "F32, F16 or BF16".into(),
            found: format!("{:?}", t.dtype),
        })
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Linear = CudaLinear;
    type Layout = CudaLayout;

    fn name(&self) -> String {
        let (a, b) = self.info.compute_capability;
        let act = match self.act {
            Dt::Bf16 => "bf16",
            Dt::F32 => "f32",
        };
        format!("cuda ({}, sm_{a}{b}, {act} activations)", self.info.name)
    }

    fn upload_linear(&self, w: &QLinear) -> Result<CudaLinear> {
        let name = w.name;
        let (out, n_in) = (w.out_features, w.in_features);
        let model_dt = dtype_code(w.model_dtype);
        let what = |s: &str| format!("{name}.{s}");
        let weight = match &w.packing {
            Packing::Dense { weight } => {
                let bytes = if weight.dtype == Dtype::BF16 && self.act == Dt::Bf16 {
                    weight.bytes.to_vec()
                } else {
                    self.act_bytes(&weight.to_f32()?)
                };
                DevWeight::Dense(self.upload_bytes(&bytes, &what("weight"))?)
            }
            Packing::PackedInt {
                bits,
                packed,
                words_per_row,
                legacy_codes_per_word,
                scale,
                zero_point,
                strategy,
                g_idx,
            } => {
                let zeros = zero_points(zero_point, *bits, out)?;
                let (zeros_dev, zeros_len, zero_cols) = match zeros {
                    None => (None, 0, 0),
                    Some(z) => {
                        let v: Vec<i32> = z.values.iter().map(|&x| x as i32).collect();
                        (
                            Some(self.upload_pod(&v, &what("weight_zero_point"))?),
                            v.len(),
                            z.n_groups,
                        )
                    }
                };
                let g_idx_dev = match g_idx {
                    None => None,
                    Some(g) => {
                        let v: Vec<i32> = g.to_i64()?.iter().map(|&x| x as i32).collect();
                        Some(self.upload_pod(&v, &what("weight_g_idx"))?)
                    }
                };
                DevWeight::Int {
                    packed: self.upload_bytes(packed.bytes, &what("weight_packed"))?,
                    scales: self.upload_pod(&f32_values(scale)?, &what("weight_scale"))?,
                    zeros: zeros_dev,
                    g_idx: g_idx_dev,
                    args: IntArgs {
                        packed: 0,
                        scales: 0,
                        zeros: 0,
                        zeros_len: zeros_len as i64,
                        zero_cols: zero_cols as i32,
                        g_idx: 0,
                        words_per_row: *words_per_row as i32,
                        bits: *bits as i32,
                        legacy_per: legacy_codes_per_word.unwrap_or(0) as i32,
                        strategy: StrategyArgs::new(*strategy)?,
                        scale_dt: float_code(scale)?,
                        model_dt,
                    },
                }
            }
            Packing::Nvfp4 {
                packed,
                scale,
                global_scale,
            } => DevWeight::Nvfp4 {
                packed: self.upload_bytes(packed.bytes, &what("weight_packed"))?,
                scales: self.upload_bytes(scale.bytes, &what("weight_scale"))?,
                global_scale: *global_scale,
                model_dt,
            },
            Packing::Unpacked {
                weight,
                scale,
                zero_point,
                strategy,
            } => {
                let zeros = match zero_point {
                    None => None,
                    Some(z) => {
                        let v: Vec<f32> = z.to_i64()?.iter().map(|&x| x as f32).collect();
                        Some(self.upload_pod(&v, &what("weight_zero_point"))?)
                    }
                };
                DevWeight::Unpacked {
                    weight: self.upload_bytes(weight.bytes, &what("weight"))?,
                    scales: self.upload_pod(&f32_values(scale)?, &what("weight_scale"))?,
                    zeros,
                    args: UnpackedArgs {
                        weight: 0,
                        is_int8: (weight.dtype == Dtype::I8) as i32,
                        scales: 0,
                        zeros: 0,
                        strategy: StrategyArgs::new(*strategy)?,
                        scale_dt: float_code(scale)?,
                        model_dt,
                    },
                }
            }
        };
        if !matches!(weight, DevWeight::Dense(_)) {
            self.largest_layer.fetch_max(out * n_in, Ordering::Relaxed);
        }
        let bias = match w.bias_f32()? {
            None => None,
            Some(b) => Some(self.upload_pod(&b, &what("bias"))?),
        };
        Ok(CudaLinear {
            name: name.to_string(),
            out_features: out,
            in_features: n_in,
            weight,
            bias,
            act_quant: w.act_quant,
        })
    }

    fn upload_vector(&self, name: &str, values: &[f32]) -> Result<CudaTensor> {
        Ok(CudaTensor {
            buf: self.upload_pod(values, name)?,
            len: values.len(),
            dtype: Dt::F32,
        })
    }

    fn upload_layout(&self, layout: &SeqLayout) -> Result<CudaLayout> {
        let n = layout.n_tokens();
        let seq_start = layout.token_seq_starts()?;
        Ok(CudaLayout {
            positions: self.upload_pod(&layout.positions, "positions")?,
            seq_start: self.upload_pod(&seq_start, "sequence starts")?,
            n_tokens: n,
            max_position: layout.positions.iter().copied().max().unwrap_or(0) as usize,
        })
    }

    fn download(&self, t: &CudaTensor) -> Result<Vec<f32>> {
        let bytes = self.download_bytes(&t.buf, "tensor")?;
        Ok(match t.dtype {
            Dt::F32 => bytemuck::pod_collect_to_vec(&bytes[..t.len * 4]),
            Dt::Bf16 => {
                let bits: Vec<u16> = bytemuck::pod_collect_to_vec(&bytes[..t.len * 2]);
                bits.iter()
                    .map(|&b| half::bf16::from_bits(b).to_f32())
                    .collect()
            }
        })
    }

    fn batch_tokens(&self, cfg: &ModelConfig, ctx: usize) -> usize {
        let Ok((free, _)) = self.ctx.mem_get_info() else {
            return ctx;
        };
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim;
        let e = self.act.bytes();
        // Live activations of one layer at their peak (f32 residual; normed input, q/k/v and
        // attention output, gate/up/product, an act-quant copy), with 25 % slack.
        let per_token = (4 * h + e * (2 * h + qkv + 4 * i)) * 5 / 4;
        let fixed = 2 * ROW_CHUNK * VOCAB_TILE * 4
            + self
                .largest_layer
                .load(Ordering::Relaxed)
                .max(cfg.vocab_size * h)
                * e;
        let budget = (free * 9 / 10).saturating_sub(fixed);
        let tokens = budget / per_token.max(1);
        (tokens / ctx.max(1) * ctx).max(ctx)
    }

    fn activation_type(&self) -> FloatType {
        match self.act {
            Dt::Bf16 => FloatType::Bf16,
            Dt::F32 => FloatType::F32,
        }
    }

    fn peak_memory_bytes(&self) -> Option<u64> {
        Some(self.acct.peak.load(Ordering::Relaxed))
    }

    fn enter_thread(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))
    }

    fn free_memory_bytes(&self) -> Option<u64> {
        self.ctx.mem_get_info().ok().map(|(free, _)| free as u64)
    }

    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| driver_err("synchronizing", e))
    }

    /// A peer copy between GPUs (NVLink or PCIe), never through the host. The caller has
    /// synchronized `src`; this waits for the copy so `t` may be freed afterwards.
    fn copy_from(&self, src: &Self, t: &CudaTensor) -> Result<CudaTensor> {
        let out = self.new_tensor(t.len, t.dtype, "residual from the previous GPU")?;
        let bytes = t.len * t.dtype.bytes();
        // SAFETY: both buffers hold `bytes` bytes and stay alive until the synchronize below.
        unsafe {
            cudarc::driver::result::memcpy_peer_async(
                self.ctx.cu_ctx(),
                out.ptr(),
                src.ctx.cu_ctx(),
                t.ptr(),
                bytes,
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| driver_err("copying the residual between GPUs", e))?;
        self.synchronize()?;
        Ok(out)
    }

    /// An 8192^3 GEMM in the activation type through the same cuBLAS call as every linear,
    /// measured once per backend.
    fn gemm_peak_tflops(&self) -> Result<Option<f64>> {
        if let Some(&t) = self.gemm_peak.get() {
            return Ok(Some(t));
        }
        let t = self.measure_gemm(8192)?;
        Ok(Some(*self.gemm_peak.get_or_init(|| t)))
    }

    fn embed(&self, table: &CudaLinear, ids: &[u32]) -> Result<CudaTensor> {
        let DevWeight::Dense(buf) = &table.weight else {
            return Err(Error::unsupported(
                &table.name,
                "embedding",
                "a quantized embedding table",
            ));
        };
        crate::backend::check_token_ids(ids, table.out_features)?;
        let h = table.in_features;
        // The embedding starts the residual stream, which stays f32 (see the module docs).
        let out = self.new_tensor(ids.len() * h, Dt::F32, "embeddings")?;
        if !ids.is_empty() {
            let ids_dev = self.upload_pod(ids, "token ids")?;
            kernels::gather_rows::run(
                &self.kernels,
                &self.stream,
                (self.act, Dt::F32),
                out.ptr(),
                buf.ptr(),
                ids_dev.ptr(),
                ids.len(),
                h,
            )?;
        }
        Ok(out)
    }

    fn rms_norm(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        rows: usize,
        cols: usize,
        eps: f32,
        out: OutType,
    ) -> Result<CudaTensor> {
        // The f32 residual stream or an activation in, of either type.
        self.expect(x, rows * cols, x.dtype, "rms_norm input")?;
        self.normalized(x, None, weight, rows, cols, eps, self.out_dt(out))
    }

    fn input_type(&self, w: &CudaLinear) -> OutType {
        if w.act_quant.is_some() && self.act != Dt::F32 {
            OutType::F32
        } else {
            OutType::Activation
        }
    }

    fn linear(&self, x: &CudaTensor, w: &CudaLinear, rows: usize) -> Result<CudaTensor> {
        let (n_in, n_out, dt) = (w.in_features, w.out_features, self.act);
        self.expect(x, rows * n_in, x.dtype, &format!("{} input", w.name))?;
        let (converted, quantized_input);
        let xp = match w.act_quant {
            None => {
                converted = self.act(x)?;
                converted.get().ptr()
            }
            // Quantized from the input's own type (f32 where `input_type` asked for it).
            Some(aq) => {
                quantized_input = self.new_tensor(rows * n_in, dt, "quantized activations")?;
                kernels::act_quant::run(
                    &self.kernels,
                    &self.stream,
                    (x.dtype, dt),
                    quantized_input.ptr(),
                    x.ptr(),
                    rows,
                    n_in,
                    aq,
                )?;
                quantized_input.ptr()
            }
        };
        let out = self.new_tensor(rows * n_out, dt, &format!("{} output", w.name))?;
        let weight = self.weight_rows(w, 0, n_out)?;
        let wp = match &weight {
            WeightRows::Resident(p) => *p,
            WeightRows::Scratch(g) => scratch_ptr(g)?,
        };
        let Some(bias) = &w.bias else {
            gemm::xwt(
                &*self.blas()?,
                xp,
                wp,
                out.ptr(),
                rows,
                n_in,
                n_out,
                n_out,
                (dt, dt),
            )?;
            return Ok(out);
        };
        // With a bias the GEMM writes f32 and the sum is rounded once (in place for f32).
        let f32_out;
        let y = match dt {
            Dt::F32 => out.ptr(),
            Dt::Bf16 => {
                f32_out = self.alloc(rows * n_out * 4, "f32 GEMM output before bias")?;
                f32_out.ptr()
            }
        };
        gemm::xwt(
            &*self.blas()?,
            xp,
            wp,
            y,
            rows,
            n_in,
            n_out,
            n_out,
            (dt, Dt::F32),
        )?;
        kernels::bias_add::run(
            &self.kernels,
            &self.stream,
            dt,
            out.ptr(),
            y,
            bias.ptr(),
            rows,
            n_out,
        )?;
        Ok(out)
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        layout: &CudaLayout,
        cos: &CudaTensor,
        sin: &CudaTensor,
        heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let t = layout.n_tokens;
        if let Act::Converted(c) = self.act(x)? {
            *x = c;
        }
        self.expect(x, t * heads * head_dim, self.act, "rope input")?;
        let half = head_dim / 2;
        if cos.len != sin.len || cos.dtype != Dt::F32 || (layout.max_position + 1) * half > cos.len
        {
            return Err(Error::InvalidArgument(format!(
                "cuda rope: tables of {} values do not cover position {} with head_dim {head_dim}",
                cos.len, layout.max_position
            )));
        }
        kernels::rope::run(
            &self.kernels,
            &self.stream,
            self.act,
            x.ptr(),
            layout.positions.ptr(),
            cos.ptr(),
            sin.ptr(),
            t,
            heads,
            head_dim,
        )
    }

    fn attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        layout: &CudaLayout,
        shape: AttnShape,
        out: OutType,
    ) -> Result<CudaTensor> {
        let (t, dt) = (layout.n_tokens, self.act);
        let (qw, kw) = (
            shape.heads * shape.head_dim,
            shape.kv_heads * shape.head_dim,
        );
        let (q, k, v) = (self.act(q)?, self.act(k)?, self.act(v)?);
        let (q, k, v) = (q.get(), k.get(), v.get());
        self.expect(q, t * qw, dt, "attention q")?;
        self.expect(k, t * kw, dt, "attention k")?;
        self.expect(v, t * kw, dt, "attention v")?;
        let out = self.new_tensor(t * qw, self.out_dt(out), "attention output")?;
        if t > 0 {
            kernels::attention::run(
                &self.kernels,
                self.portable_attention,
                &self.stream,
                (dt, out.dtype),
                out.ptr(),
                (q.ptr(), k.ptr(), v.ptr()),
                layout.seq_start.ptr(),
                t,
                shape,
            )?;
        }
        Ok(out)
    }

    fn silu_mul(
        &self,
        gate: &CudaTensor,
        up: &CudaTensor,
        n: usize,
        out: OutType,
    ) -> Result<CudaTensor> {
        let dt = gate.dtype;
        self.expect(gate, n, dt, "silu_mul gate")?;
        self.expect(up, n, dt, "silu_mul up")?;
        let out = self.new_tensor(n, self.out_dt(out), "silu_mul output")?;
        kernels::elementwise::silu_mul(
            &self.kernels,
            &self.stream,
            (dt, out.dtype),
            out.ptr(),
            gate.ptr(),
            up.ptr(),
            n,
        )?;
        Ok(out)
    }

    fn add_assign(&self, x: &mut CudaTensor, y: &CudaTensor, n: usize) -> Result<()> {
        // x is the f32 residual stream; y an activation (or an f32 vector from the checks).
        self.expect(x, n, Dt::F32, "residual")?;
        self.expect(y, n, y.dtype, "residual update")?;
        kernels::elementwise::add_assign(&self.kernels, &self.stream, y.dtype, x.ptr(), y.ptr(), n)
    }

    fn add_rms_norm(
        &self,
        x: &mut CudaTensor,
        y: &CudaTensor,
        weight: &CudaTensor,
        rows: usize,
        cols: usize,
        eps: f32,
        out: OutType,
    ) -> Result<CudaTensor> {
        // x is the f32 residual stream; y an activation (or an f32 vector from the checks).
        self.expect(x, rows * cols, Dt::F32, "residual stream")?;
        self.expect(y, rows * cols, y.dtype, "residual update")?;
        self.normalized(x, Some(y), weight, rows, cols, eps, self.out_dt(out))
    }

    fn nll(&self, hidden: &CudaTensor, head: &CudaLinear, targets: &[i32]) -> Result<Vec<f32>> {
        let (n_in, vocab) = (head.in_features, head.out_features);
        let (x, tg, n) = self.scored(hidden, n_in, targets, vocab)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let (_state, st) = self.lse_state(n, "log-sum-exp state")?;
        let tile = self.logits_buffer(n, vocab, "logits tile")?;
        self.lse_pass(&x, head, n, &tg, st, &tile)?;
        let out = self.new_tensor(n, Dt::F32, "nll")?;
        kernels::nll::nll_finish(&self.kernels, &self.stream, out.ptr(), st, n)?;
        self.download(&out)
    }

    fn kld(
        &self,
        base_hidden: &CudaTensor,
        base_head: &CudaLinear,
        hidden: &CudaTensor,
        head: &CudaLinear,
        targets: &[i32],
    ) -> Result<Vec<KldTerms>> {
        let vocab = head.out_features;
        let (xp, tg, n) = self.scored(base_hidden, base_head.in_features, targets, vocab)?;
        let (xq, _, _) = self.scored(hidden, head.in_features, targets, vocab)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let (p_buf, p) = self.lse_state(n, "base log-sum-exp state")?;
        let (q_buf, q) = self.lse_state(n, "log-sum-exp state")?;
        let tile_p = self.logits_buffer(n, vocab, "base logits tile")?;
        let tile_q = self.logits_buffer(n, vocab, "logits tile")?;
        self.lse_pass(&xp, base_head, n, &tg, p, &tile_p)?;
        self.lse_pass(&xq, head, n, &tg, q, &tile_q)?;
        let acc = self.upload_pod(&vec![0f64; n], "KL sums")?;
        let n_in = (head.in_features, base_head.in_features);
        for r0 in (0..n).step_by(ROW_CHUNK) {
            let rows = ROW_CHUNK.min(n - r0);
            let (xpr, xqr) = (
                xp.ptr() + (r0 * n_in.1 * self.act.bytes()) as u64,
                xq.ptr() + (r0 * n_in.0 * self.act.bytes()) as u64,
            );
            for v0 in (0..vocab).step_by(VOCAB_TILE) {
                let cols = VOCAB_TILE.min(vocab - v0);
                self.logits_tile(xpr, base_head, rows, v0, cols, tile_p.ptr())?;
                self.logits_tile(xqr, head, rows, v0, cols, tile_q.ptr())?;
                kernels::nll::kld_tile(
                    &self.kernels,
                    &self.stream,
                    tile_p.ptr(),
                    tile_q.ptr(),
                    rows,
                    cols,
                    p.offset(r0),
                    q.offset(r0),
                    acc.ptr() + 8 * r0 as u64,
                )?;
            }
        }
        let p_state = self.download_bytes(&p_buf, "base log-sum-exp state")?;
        let q_state = self.download_bytes(&q_buf, "log-sum-exp state")?;
        let kl: Vec<f64> = bytemuck::pod_collect_to_vec(&self.download_bytes(&acc, "KL sums")?);
        let (ps, qs) = (HostLse::new(&p_state, n), HostLse::new(&q_state, n));
        Ok((0..n)
            .map(|r| {
                let (lse_p, lse_q) = (ps.lse(r), qs.lse(r));
                KldTerms {
                    kld: kl[r],
                    nll_q: lse_q - qs.tgt[r] as f64,
                    nll_base: lse_p - ps.tgt[r] as f64,
                    same_top: ps.arg[r] == qs.arg[r],
                    base_top_p: (ps.m[r] as f64 - lse_p).exp(),
                }
            })
            .collect())
    }
}
