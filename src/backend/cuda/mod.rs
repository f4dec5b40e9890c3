//! The CUDA backend: weights kept packed on the device, activations in one of two precisions
//! chosen per backend (`CudaBackend::with_activation_type`):
//! - bf16 (the fast path): bf16 activations and GEMM operands on the tensor cores, f32
//!   accumulation, attention on the tensor cores (flash_attention_sm90.cu on Hopper, else
//!   flash_attention.cu);
//! - f32 (the exact path, for f32 checkpoints and `--dtype f32`): f32 activations, weights
//!   dequantized to f32 (exactly `QLinear::dequantize`), f32 GEMMs without TF32.
//!
//! In both, the residual stream (embedding output and the sums `add_assign` forms) is f32:
//! it is the accumulator across layers. Activation fake quantization runs in f32 as the f32
//! reference runs it (`ActQuant::apply_row`), its result stored in the activation type, on
//! inputs the ops before it hand over in f32 (`Backend::input_type`): quantizing bf16-rounded
//! values moved NVFP4 W4A4 PPL 2-3 % away from the f32 reference, quantizing the f32 values
//! < 0.5 %; rounding the quantizer's scales and quotients to bf16 (as compressed-tensors does
//! in a bf16 model) put an FP8 W8A8 8B at 4.6e-3, f32 quantization at 1.2e-3.
//!
//! A linear dequantizes its packed weight into one reused scratch buffer (the size of the
//! largest layer) and multiplies with cuBLAS; the lm_head runs over vocab tiles folded into an
//! online log-sum-exp, so only one f32 NLL per scored row comes back. Everything is queued on
//! one stream, which orders the reuses of the scratch buffer.

mod gemm;
mod kernels;
mod memory;
mod mixture;
mod nvrtc;
mod probe;
mod vocab;
mod weights;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, DriverError};

pub use memory::CudaTensor;
pub use probe::{DeviceInfo, cuda_available, device_info, nvrtc_available};
pub use weights::CudaLinear;

/// Compiles kernel source `code` (the file `name`.cu) for compute capability `cc` with NVRTC
/// as the backend does at first use, without a GPU (tests/cuda_kernels.rs): a kernel that
/// does not compile shows on any machine with NVRTC, not first on a lent GPU.
pub fn compile_kernel(name: &str, code: &str, cc: (i32, i32)) -> Result<()> {
    kernels::compile(name, code, cc)
}

/// Whether kernel source `code` (the file `name`.cu) is compiled for compute capability `cc`:
/// its `// nvrtc:` lines may name one architecture or the oldest.
pub fn kernel_is_for(name: &str, code: &str, cc: (i32, i32)) -> Result<bool> {
    kernels::is_for(name, code, cc)
}

use memory::{Act, DevBuf, Memory, Planes, keep_freed_memory};
use vocab::{ROW_CHUNK, VOCAB_TILE};
use weights::DevWeight;

use super::options::BackendOptions;
use super::{
    AttnSpec, Backend, ColumnBlocks, Device, GatedMlp, GemmSplit, Head, KldTerms, OutType,
    RotarySpan, RouteRule, RowGroups, SeqLayout, Shaped,
};
use crate::checkpoint::{GatedActivation, ModelConfig, QLinear};
use crate::numerics::FloatType;
use crate::{Error, Result};
use kernels::{Dt, Kernels, Stream};

/// The most inner values one split-bf16 GEMM of a large product sums (`sliced_xwt`). On an
/// H100, 8B W4A16 (`eval --rows 4`, per-token differences to `--dtype f32`; docs/decisions.md:
/// f32-grade GEMMs promote every stage): unsliced 4.9e-4 at most, 4096 (only down's 14,336
/// sliced) 3.7e-4 at 1 % of the speed, 2048 3.2e-4 at 6 %, 1024 3.1e-4 at 17 %.
const SPLIT_SLICE: usize = 4096;

/// A layer's token rows grouped by expert: rows (u32) and weights (f32) on the device, the
/// group offsets on the host.
pub struct CudaGroups {
    rows: DevBuf,
    weights: DevBuf,
    /// `groups + 1` offsets into `rows` / `weights`: where each group starts (device routing
    /// starts each routed group at a multiple of `mixture::GEMM_ROW_MULTIPLE`, the rows
    /// between groups holding row 0 at weight 0), and where the last one's room ends.
    offsets: Vec<usize>,
    /// Each group's rows.
    lens: Vec<usize>,
    /// Every row index is below this.
    rows_below: usize,
    /// Where routing on the device put each token's picks (`[tokens, k]` u32 positions in
    /// `rows`, over the first `routed` groups), and k; `None` for groups made on the host.
    slots: Option<(DevBuf, usize)>,
    /// The groups `slots` covers (the routed experts; a shared expert's group follows).
    routed: usize,
}

impl CudaGroups {
    /// Group `g`'s range, for a tensor of `rows` rows (an error if it has too few).
    fn range(&self, g: usize, rows: usize) -> Result<std::ops::Range<usize>> {
        if g + 1 >= self.offsets.len() || rows < self.rows_below {
            return Err(Error::InvalidArgument(format!(
                "row group {g} of {} (rows below {}) on a tensor of {rows} rows",
                self.offsets.len().saturating_sub(1),
                self.rows_below
            )));
        }
        Ok(self.offsets[g]..self.offsets[g] + self.lens[g])
    }
}

/// A batch's sequences on the device: each token's position and its sequence's first token.
pub struct CudaSequences {
    /// u32 position of each token.
    positions: DevBuf,
    /// u32 flattened index of the first token of each token's sequence.
    seq_start: DevBuf,
    n_tokens: usize,
    max_position: usize,
}

impl CudaSequences {
    /// An error unless `cos` and `sin` are f32 tables of `half` values a position that cover
    /// every token's position (`op` names the caller).
    fn check_rope_tables(
        &self,
        (cos, sin): (&CudaTensor, &CudaTensor),
        half: usize,
        op: &str,
    ) -> Result<()> {
        if cos.len() != sin.len()
            || cos.dtype != Dt::F32
            || (self.max_position + 1) * half > cos.len()
        {
            return Err(Error::InvalidArgument(format!(
                "{op}: tables of {} values do not cover position {} with {half} pairs",
                cos.len(),
                self.max_position
            )));
        }
        Ok(())
    }
}

pub struct CudaBackend {
    info: DeviceInfo,
    ctx: Arc<CudaContext>,
    stream: Stream,
    blas: Mutex<CudaBlas>,
    /// Streams beside `stream`, each with its cuBLAS handle, on which a mixture's experts'
    /// GEMMs run at once (made at first use by `side_by_side`).
    side: Mutex<Vec<(Stream, CudaBlas)>>,
    kernels: Kernels,
    memory: Arc<Memory>,
    /// Activation type: GEMM operands, dequantized weights and every activation but the
    /// residual stream.
    act: Dt,
    /// The reused dequantization buffer (activation type).
    scratch: Mutex<Option<DevBuf>>,
    /// Elements of the largest quantized layer uploaded so far (the scratch size to allocate).
    largest_layer: AtomicUsize,
    /// Attention on the mma.sync kernel even where the wgmma one exists (to compare them).
    portable_attention: bool,
    /// A mixture's experts one by one (`mixture_by_group`) even where they could run grouped:
    /// `BackendOptions::cuda_experts_loop`, to compare the two or rule the grouped path out.
    experts_one_by_one: bool,
    /// cuBLAS has `cublasGemmGroupedBatchedEx` (12.5 and later); else experts' GEMMs run one
    /// by one.
    grouped_gemm: bool,
    /// GEMMs of f32 operands on bf16 tensor cores, each operand split into a bf16 high part
    /// and residual (`--dtype f32-grade`, `split_bf16.cu`) instead of f32 SGEMM.
    split_gemms: bool,
}

fn driver_err(what: &str, e: DriverError) -> Error {
    Error::backend("cuda", format!("{what}: {e:?}"))
}

impl CudaBackend {
    /// Opens device `device_ordinal` with activations in `act` (`F32` or `Bf16`; bf16 is the
    /// fast path): probes the libraries, creates a context, a stream and a cuBLAS handle, and
    /// compiles (or loads cached) kernels for its architecture, as `options` say.
    pub fn new(device_ordinal: usize, act: FloatType, options: &BackendOptions) -> Result<Self> {
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
        let kernels = Kernels::new(&ctx, info.compute_capability, options.cuda_sources.clone())?;
        Ok(Self {
            info,
            ctx,
            stream,
            blas: Mutex::new(blas),
            side: Mutex::new(Vec::new()),
            kernels,
            memory: Arc::default(),
            act,
            scratch: Mutex::new(None),
            largest_layer: AtomicUsize::new(0),
            portable_attention: options.cuda_portable_attention,
            experts_one_by_one: options.cuda_experts_loop,
            grouped_gemm: probe::cublas_exports("cublasGemmGroupedBatchedEx"),
            split_gemms: false,
        })
    }

    /// Runs the GEMMs of f32 operands (with f32 activations: every one) on 16-bit tensor
    /// cores, each operand split into a high part and its residual (`xwt`: f16 planes on
    /// `split_gemm.cu` on Hopper, bf16 parts through cuBLAS elsewhere), and attention on split
    /// operands too: f32-grade products (`--dtype f32-grade`).
    pub fn with_split_gemms(mut self, split: bool) -> Self {
        self.split_gemms = split;
        self
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.info
    }

    /// The tensor-core attention kernel used for bf16 heads of 128 values, if any.
    pub fn attention_kernel(&self) -> Result<Option<&'static str>> {
        kernels::attention::flash_kernel_name(&self.kernels, self.portable_attention, 128)
    }

    /// `x` as `w`'s GEMM reads it: fake-quantized where `w` declares it (from the input's
    /// own type: f32 where `input_type` asked for it), else in the activation type.
    fn gemm_input<'a>(&self, x: &'a CudaTensor, w: &CudaLinear) -> Result<Act<'a>> {
        match w.act_quant {
            None => self.act(x),
            Some(aq) => {
                let q = self.new_tensor(x.shape(), self.act, "quantized activations")?;
                kernels::act_quant::run(&self.kernels, &self.stream, &q, x, aq)?;
                Ok(Act::Converted(q))
            }
        }
    }

    /// `Backend::mixture` grouped where it applies (`grouped_mixture`, given `residual` to add
    /// into), else expert by expert.
    fn mixture_on(
        &self,
        x: &CudaTensor,
        groups: &CudaGroups,
        lens: &[usize],
        mlps: &[GatedMlp<'_, CudaLinear>],
        residual: Option<&mut CudaTensor>,
    ) -> Result<mixture::Mixed> {
        // Planes are read as bf16: right only where no expert quantizes its input (which
        // wants the f32 values; the forward pass asks for planes only then).
        let quantizing = |w: &CudaLinear| self.input_type(w) != OutType::Activation;
        if x.planes.is_some()
            && mlps
                .iter()
                .any(|m| quantizing(m.gate) || m.up.is_some_and(quantizing))
        {
            return Err(Error::backend(
                "cuda",
                "a mixture whose experts quantize their input was given it as bf16 planes",
            ));
        }
        if !self.experts_one_by_one
            && let Some(done) = self.grouped_mixture(x, groups, lens, mlps, residual)?
        {
            return Ok(done);
        }
        let acc = crate::backend::mixture_by_group(self, None, x, groups, lens, mlps, 0)?;
        Ok(mixture::Mixed::Sum(acc))
    }

    /// The router's GEMM with an f32 output on the device (bf16 logits would flip experts at
    /// near-ties). An f32 input, or one held as planes (`OutType::Planes`, what the forward
    /// pass gives a mixture), is f32-exact either way: on the f32 path it meets the weight in
    /// the full-f32 GEMM; on the bf16 path it is three bf16 planes that sum to it exactly
    /// (split here where it came as f32), each multiplied by the bf16 weight on the tensor
    /// cores into one f32 sum, so every product is exact as in the f32 GEMM and only the order
    /// of the additions differs (that f32 GEMM took 2.4 ms a layer of Qwen3-30B-A3B at 204,800
    /// tokens). `None` for a weight that is not dense (the caller falls back to `linear`).
    fn router_logits(&self, x: &CudaTensor, w: &CudaLinear) -> Result<Option<CudaTensor>> {
        let (rows, n_in, n_out) = (x.rows, w.in_features, w.out_features);
        let dense = match &w.weight {
            DevWeight::Dense(buf) if w.act_quant.is_none() => buf,
            _ => return Ok(None),
        };
        self.check_tensor(x, [rows, n_in], x.dtype, &format!("{} input", w.name))?;
        let out = self.new_tensor([rows, n_out], Dt::F32, &format!("{} logits", w.name))?;
        let plane = (rows * n_in * 2) as u64;
        let split;
        let planes = match (x.planes.as_ref().map(Planes::residuals), x.dtype, self.act) {
            (Some(Some(rest)), _, _) => Some([x.ptr(), rest, rest + plane]),
            (Some(None), _, _) => {
                return Err(Error::backend(
                    "cuda",
                    format!("{} input: its planes were released by routing", w.name),
                ));
            }
            (None, Dt::F32, Dt::Bf16) => {
                use kernels::split_bf16::{self, Operand};
                split = self.alloc(3 * rows * n_in * 2, "the router input's planes")?;
                let (hi, residuals) = (split.ptr(), split.ptr() + plane);
                let (shape, exact) = ([rows, n_in], Operand::Exact { residuals });
                split_bf16::run(&self.kernels, &self.stream, hi, x.ptr(), shape, exact)?;
                Some([hi, residuals, residuals + plane])
            }
            _ => None,
        };
        if let Some(planes) = planes {
            let blas = self.blas()?;
            for (i, plane) in planes.into_iter().enumerate() {
                let p = w.product(plane, dense.ptr(), out.ptr(), rows);
                gemm::xwt_strided(&blas, p, (n_in, i > 0), (Dt::Bf16, Dt::F32))?;
            }
        } else {
            let converted = self.act(x)?;
            let p = w.product(converted.get().ptr(), dense.ptr(), out.ptr(), rows);
            self.xwt(p, (self.act, Dt::F32))?;
        }
        // gpt-oss's router has a bias, added in f32.
        if let Some(bias) = &w.bias {
            kernels::bias_add::run(&self.kernels, &self.stream, &out, out.ptr(), bias.ptr())?;
        }
        Ok(Some(out))
    }

    /// Copies all of `src` to device address `dst` (inside a buffer this backend owns), in
    /// stream order.
    fn copy_in(&self, dst: u64, src: &DevBuf) -> Result<()> {
        // SAFETY: `dst` has room for `src` (the caller's allocation); both live on this stream
        // until the copy has run (`src` is freed in stream order after it).
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                dst,
                src.ptr(),
                src.len(),
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| driver_err("copying within the device", e))
    }

    /// `gemm::xwt` on this backend's stream, f32 operands split onto 16-bit tensor cores where
    /// `split_gemms` says so: on `split_gemm.cu` where the weight has an `F16Weight` and the
    /// kernel takes its width (`promoted_xwt`), else through cuBLAS as bf16 parts:
    /// `x_hi · w_hi^T`, then `[x_hi | x_lo] · [w_lo | w_hi]^T` (one GEMM over twice the inner
    /// dimension) added, all in f32. The large product is summed apart
    /// from the small ones, which measured closer to f32 than one GEMM over all three, and over
    /// slices of the inner dimension (`sliced_xwt`) where it is longer than `SPLIT_SLICE`. A
    /// weight whose values are bf16 (dense bf16, or quantized where the reference rounds the
    /// dequantized values to bf16) is held or dequantized as bf16 there (`weight_dt`) and has
    /// no residual: `x_hi · w^T`, then `x_lo · w^T` added.
    fn xwt(&self, p: gemm::Product, (in_dt, out_dt): (Dt, Dt)) -> Result<()> {
        if let Some(gemm::F16Weight::ScaledF16(_)) = p.w_f16
            && !(self.split_gemms && in_dt == Dt::F32)
        {
            // weight_rows dequantizes to f16 only for split GEMMs, whose inputs are f32.
            return Err(Error::backend(
                "cuda",
                "an f16 weight operand for a GEMM that is not split",
            ));
        }
        if !self.split_gemms || in_dt != Dt::F32 || p.rows == 0 {
            return gemm::xwt(&*self.blas()?, p, (in_dt, out_dt));
        }
        use kernels::split_bf16::{self, Operand};
        let (k, s) = (&self.kernels, &self.stream);
        let n = p.n_in;
        if let Some(w16) = p.w_f16
            && kernels::split_gemm::SplitGemm::takes(n, w16)
            && let Some(gemm) = k.optional::<kernels::split_gemm::SplitGemm>()?
        {
            return self.promoted_xwt(&gemm, p, w16);
        }
        let xs = self.alloc(2 * p.rows * n * 2, "split activations")?;
        let bf16 = (Dt::Bf16, out_dt);
        if p.w_bf16_values {
            split_bf16::run(k, s, xs.ptr(), p.x, [p.rows, n], Operand::Planes)?;
            self.sliced_xwt(gemm::Product { x: xs.ptr(), ..p }, n, out_dt)?;
            let lo = gemm::Product {
                x: xs.ptr() + (p.rows * n * 2) as u64,
                ..p
            };
            return gemm::xwt_strided(&*self.blas()?, lo, (n, true), bf16);
        }
        let ws = self.alloc(2 * p.n_out * n * 2, "split weights")?;
        split_bf16::run(k, s, xs.ptr(), p.x, [p.rows, n], Operand::Activations)?;
        split_bf16::run(k, s, ws.ptr(), p.w, [p.n_out, n], Operand::Weights)?;
        // Rows of 2n: x as [hi | lo], w as [lo | hi].
        let hi = gemm::Product {
            x: xs.ptr(),
            w: ws.ptr() + (n * 2) as u64,
            ..p
        };
        self.sliced_xwt(hi, 2 * n, out_dt)?;
        let cross = gemm::Product {
            x: xs.ptr(),
            w: ws.ptr(),
            n_in: 2 * n,
            ..p
        };
        gemm::xwt_strided(&*self.blas()?, cross, (2 * n, true), bf16)
    }

    /// `p` (f32 `x` and `y`) on `split_gemm.cu`: x as two f16 planes with row scales, w as
    /// `w16` says (a bf16-valued one scaled into one f16 plane; another, f32, as two planes
    /// with row scales, the residual plane's products added in a second launch), partial sums
    /// promoted to f32 every 64 inner values.
    fn promoted_xwt(
        &self,
        gemm: &kernels::split_gemm::SplitGemm,
        p: gemm::Product,
        w16: gemm::F16Weight,
    ) -> Result<()> {
        use kernels::split_gemm::{Job, WeightUndo};
        let (k, s) = (&self.kernels, &self.stream);
        let (rows, n) = (p.rows, p.n_in);
        let split;
        let x = match p.x_f16 {
            Some(x) => x,
            None => {
                split = self.split_rows(p.x, [rows, n])?;
                split.1
            }
        };
        let job = |w, w_undo, accumulate| Job {
            y: p.y,
            ldy: p.ldy,
            hi: x.hi,
            lo: x.lo,
            undo: x.undo,
            w,
            w_undo,
            accumulate,
            rows,
            n_in: n,
            n_out: p.n_out,
        };
        match w16 {
            gemm::F16Weight::Scaled(scale) => {
                let plane = self.alloc(p.n_out * n * 2, "f16 weight")?;
                kernels::weight_f16::run(k, s, plane.ptr(), p.w, p.n_out * n, scale)?;
                gemm.run(s, &job(plane.ptr(), WeightUndo::Scale(1.0 / scale), false))
            }
            gemm::F16Weight::ScaledF16(scale) => {
                gemm.run(s, &job(p.w, WeightUndo::Scale(1.0 / scale), false))
            }
            gemm::F16Weight::Planes => {
                let (_buf, w) = self.split_rows(p.w, [p.n_out, n])?;
                gemm.run(s, &job(w.hi, WeightUndo::Rows(w.undo), false))?;
                gemm.run(s, &job(w.lo, WeightUndo::Rows(w.undo), true))
            }
        }
    }

    /// `Backend::linear`, x already split for `split_gemm.cu` where `x_f16` says so.
    fn linear_of(
        &self,
        x: &CudaTensor,
        w: &CudaLinear,
        x_f16: Option<gemm::F16Rows>,
    ) -> Result<CudaTensor> {
        self.check_tensor(
            x,
            [x.rows, w.in_features],
            x.dtype,
            &format!("{} input", w.name),
        )?;
        let input = self.gemm_input(x, w)?;
        self.linear_on(input.get().ptr(), x.rows, w, x_f16)
    }

    /// `linear_of` on the checked (and quantized) input at `xp`, `rows` rows of it; with
    /// `x_f16` only its planes are read.
    fn linear_on(
        &self,
        xp: u64,
        rows: usize,
        w: &CudaLinear,
        x_f16: Option<gemm::F16Rows>,
    ) -> Result<CudaTensor> {
        let (n_out, dt) = (w.out_features, self.act);
        let out = self.new_tensor([rows, n_out], dt, &format!("{} output", w.name))?;
        let weight = self.weight_rows(w, 0, n_out)?;
        let product = |y| gemm::Product {
            x_f16,
            w_f16: weight.f16,
            ..w.product(xp, weight.ptr, y, rows)
        };
        let Some(bias) = &w.bias else {
            self.xwt(product(out.ptr()), (dt, dt))?;
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
        self.xwt(product(y), (dt, Dt::F32))?;
        kernels::bias_add::run(&self.kernels, &self.stream, &out, y, bias.ptr())?;
        Ok(out)
    }

    /// The f32 `[rows, n]` at `x` as two f16 planes with a power of two per row
    /// (`split_rows_f16.cu`), for `split_gemm.cu` and split attention, in a buffer of its own.
    fn split_rows(&self, x: u64, shape: [usize; 2]) -> Result<(DevBuf, gemm::F16Rows)> {
        let (buf, planes) = self.f16_rows(shape)?;
        let to = (planes.hi, planes.lo, planes.undo);
        kernels::split_rows_f16::split_rows(&self.kernels, &self.stream, to, x, shape)?;
        Ok((buf, planes))
    }

    /// Room for `[rows, n]` as `split_rows_f16.cu` writes it.
    fn f16_rows(&self, [rows, n]: [usize; 2]) -> Result<(DevBuf, gemm::F16Rows)> {
        let plane = (rows * kernels::split_gemm::plane_ld(n) * 2) as u64;
        let buf = self.alloc(2 * plane as usize + rows * 4, "split operands (f16)")?;
        let planes = gemm::F16Rows {
            hi: buf.ptr(),
            lo: buf.ptr() + plane,
            undo: buf.ptr() + 2 * plane,
        };
        Ok((buf, planes))
    }

    /// Whether `w`'s GEMM on an input of `x`'s shape and type runs on `split_gemm.cu` and
    /// reads nothing of the input but its f16 planes.
    fn reads_planes(&self, [_, cols]: [usize; 2], dtype: Dt, w: &CudaLinear) -> bool {
        self.split_gemms
            && dtype == Dt::F32
            && w.f16_weight
                .is_some_and(|w16| kernels::split_gemm::SplitGemm::takes(cols, w16))
            && w.act_quant.is_none()
            && w.in_features == cols
    }

    /// `p` on bf16 operands (rows `ld_in` apart) as GEMMs over slices of at most
    /// `SPLIT_SLICE` inner values, each added to `y` in f32 (beta 1, rounded to nearest): the
    /// tensor cores' f32 accumulation truncates, and its error grows with the inner dimension.
    fn sliced_xwt(&self, p: gemm::Product, ld_in: usize, out_dt: Dt) -> Result<()> {
        let n = p.n_in;
        let width = n.div_ceil(n.div_ceil(SPLIT_SLICE)).next_multiple_of(64);
        let mut start = 0;
        while start < n {
            let len = width.min(n - start);
            let off = (start * 2) as u64;
            let slice = gemm::Product {
                x: p.x + off,
                w: p.w + off,
                n_in: len,
                ..p
            };
            gemm::xwt_strided(
                &*self.blas()?,
                slice,
                (ld_in, start > 0),
                (Dt::Bf16, out_dt),
            )?;
            start += len;
        }
        Ok(())
    }

    fn blas(&self) -> Result<MutexGuard<'_, CudaBlas>> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))?;
        self.blas
            .lock()
            .map_err(|_| Error::backend("cuda", "cuBLAS lock poisoned"))
    }

    /// `rms_norm(x)` in the type `out` asks for (planes on the bf16 path where it asks for
    /// them); with `update`, the kernel first adds it to `x` (the f32 residual stream, written
    /// in place) and normalizes the sum.
    fn normalized(
        &self,
        x: &CudaTensor,
        update: Option<&CudaTensor>,
        weight: &CudaTensor,
        eps: f32,
        out: OutType,
    ) -> Result<CudaTensor> {
        self.check_tensor(weight, [1, x.cols], Dt::F32, "rms_norm weight")?;
        let out = match (out, self.act) {
            (OutType::Planes, Dt::Bf16) => {
                let residuals = self.alloc(2 * x.len() * 2, "rms_norm output's residual planes")?;
                CudaTensor {
                    planes: Some(Planes::new(residuals)),
                    ..self.new_tensor(x.shape(), Dt::Bf16, "rms_norm output")?
                }
            }
            _ => self.new_tensor(x.shape(), self.out_dt(out), "rms_norm output")?,
        };
        kernels::rms_norm::run(&self.kernels, &self.stream, &out, x, update, weight, eps)?;
        Ok(out)
    }
}

impl Device for CudaBackend {
    type Tensor = CudaTensor;
    type Linear = CudaLinear;
    type Sequences = CudaSequences;
    type Groups = CudaGroups;

    fn name(&self) -> String {
        let (a, b) = self.info.compute_capability;
        let act = match (self.act, self.split_gemms) {
            (Dt::Bf16, _) => "bf16 activations",
            (Dt::F32, false) => "f32 activations",
            (Dt::F32, true) => "f32 activations, split-bf16 GEMMs",
        };
        format!("cuda ({}, sm_{a}{b}, {act})", self.info.name)
    }

    fn upload_linear(&self, w: &QLinear) -> Result<CudaLinear> {
        self.upload_weight(w)
    }

    fn upload_vector(&self, name: &str, values: &[f32]) -> Result<CudaTensor> {
        Ok(CudaTensor {
            buf: self.upload_pod(values, name)?,
            rows: 1,
            cols: values.len(),
            dtype: Dt::F32,
            planes: None,
        })
    }

    /// Uploads an activation matrix in the activation type (rounded to it where it is bf16),
    /// for checks against the CPU reference.
    fn upload_activation(&self, values: &[f32]) -> Result<CudaTensor> {
        Ok(CudaTensor {
            buf: self.upload_bytes(&self.act_bytes(values), "activation")?,
            rows: 1,
            cols: values.len(),
            dtype: self.act,
            planes: None,
        })
    }

    fn upload_sequences(&self, layout: &SeqLayout) -> Result<CudaSequences> {
        let n = layout.n_tokens();
        let seq_start = layout.token_seq_starts()?;
        Ok(CudaSequences {
            positions: self.upload_pod(&layout.positions, "positions")?,
            seq_start: self.upload_pod(&seq_start, "sequence starts")?,
            n_tokens: n,
            max_position: layout.positions.iter().copied().max().unwrap_or(0) as usize,
        })
    }

    fn upload_groups(&self, groups: &RowGroups) -> Result<CudaGroups> {
        Ok(CudaGroups {
            rows: self.upload_pod(&groups.rows, "expert rows")?,
            weights: self.upload_pod(&groups.weights, "expert weights")?,
            offsets: groups.offsets.clone(),
            lens: groups.offsets.windows(2).map(|w| w[1] - w[0]).collect(),
            rows_below: groups.rows.iter().max().map_or(0, |&r| r as usize + 1),
            slots: None,
            routed: 0,
        })
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        let t = self.new_tensor([rows, cols], Dt::F32, "accumulator")?;
        self.zero_fill(&t, "the accumulator")?;
        Ok(t)
    }

    /// The values, f32 exactly where the tensor holds them as planes (summed here).
    fn download(&self, t: &CudaTensor) -> Result<Vec<f32>> {
        let bytes = self.download_bytes(&t.buf, "tensor")?;
        let bf16 = |bytes: &[u8]| -> Vec<f32> {
            let bits: Vec<u16> = bytemuck::pod_collect_to_vec(bytes);
            bits.iter()
                .map(|&b| half::bf16::from_bits(b).to_f32())
                .collect()
        };
        let n = t.len();
        let mut values = match t.dtype {
            Dt::F32 => bytemuck::pod_collect_to_vec(&bytes[..n * 4]),
            Dt::Bf16 => bf16(&bytes[..n * 2]),
        };
        // Planes whose residuals routing released read as what every op reads: bf16.
        let residuals = t
            .planes
            .as_ref()
            .and_then(|p| p.held(|buf| self.download_bytes(buf, "residual planes")));
        if let Some(residuals) = residuals {
            let rest = bf16(&residuals?[..4 * n]);
            for (i, v) in values.iter_mut().enumerate() {
                *v += rest[i] + rest[n + i];
            }
        }
        Ok(values)
    }

    fn activation_type(&self) -> FloatType {
        match self.act {
            Dt::Bf16 => FloatType::Bf16,
            Dt::F32 => FloatType::F32,
        }
    }

    /// The dequantization scratch (the largest quantized layer, at least the lm_head's, or the
    /// experts' arena of a mixture), the two f32 logits tiles of `kld`, and where GEMMs split
    /// their operands the largest weight's split (an MLP weight's, or an lm_head tile's).
    fn workspace_bytes(&self, cfg: &ModelConfig) -> u64 {
        let arena = cfg.moe.as_ref().map_or(0, |m| {
            self.expert_arena_bytes(m.num_experts, m.expert_intermediate_size, cfg.hidden_size)
        });
        let scratch = (self
            .largest_layer
            .load(Ordering::Relaxed)
            .max(cfg.vocab_size * cfg.hidden_size)
            * self.act.bytes())
        .max(arena);
        let widest = cfg.hidden_size * cfg.widest_mlp().max(VOCAB_TILE);
        let split = if self.split_gemms { 4 * widest } else { 0 };
        (2 * ROW_CHUNK * VOCAB_TILE * 4 + scratch + split) as u64
    }

    fn gemm_split(&self) -> Option<GemmSplit> {
        self.split_gemms.then_some(GemmSplit::Bf16)
    }

    fn peak_memory_bytes(&self) -> Option<u64> {
        Some(self.memory.peak.load(Ordering::Relaxed))
    }

    fn enter_thread(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))
    }

    /// What the device has free once this backend's freed buffers are handed back: the ones
    /// it keeps for reuse, and the pool's (kept from one batch to the next otherwise).
    fn free_memory_bytes(&self) -> Option<u64> {
        self.release_freed();
        self.ctx.mem_get_info().ok().map(|(free, _)| free as u64)
    }

    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| driver_err("synchronizing", e))
    }

    /// cuBLAS loads the kernel libraries of a GEMM shape at its first call: 92 and 35 ms of
    /// host time before a Qwen3-30B-A3B eval's first q projection and router GEMM
    /// (docs/decisions.md: The first layer runs while the rest loads).
    fn warms_up_while_loading(&self) -> bool {
        true
    }

    /// A peer copy between GPUs (NVLink or PCIe), never through the host. The caller has
    /// synchronized `src`; this waits for the copy so `t` may be freed afterwards.
    fn copy_from(&self, src: &Self, t: &CudaTensor) -> Result<CudaTensor> {
        let out = self.new_tensor(t.shape(), t.dtype, "residual from the previous GPU")?;
        let bytes = t.len() * t.dtype.bytes();
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
}

impl Backend for CudaBackend {
    fn embed(&self, table: &CudaLinear, ids: &[u32], scale: f32) -> Result<CudaTensor> {
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
        let out = self.new_tensor([ids.len(), h], Dt::F32, "embeddings")?;
        if !ids.is_empty() {
            let ids_dev = self.upload_pod(ids, "token ids")?;
            let table = (buf.ptr(), self.weight_dt(table.bf16_values));
            kernels::gather_rows::run(
                &self.kernels,
                &self.stream,
                &out,
                table,
                ids_dev.ptr(),
                scale,
            )?;
        }
        Ok(out)
    }

    fn rms_norm(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        out: OutType,
    ) -> Result<CudaTensor> {
        // The f32 residual stream or an activation in, of either type.
        self.normalized(x, None, weight, eps, out)
    }

    fn linear_split(&self, w: &CudaLinear) -> Option<GemmSplit> {
        let split = self.gemm_split()?;
        Some(match w.f16_weight {
            Some(w16) if kernels::split_gemm::SplitGemm::takes(w.in_features, w16) => {
                GemmSplit::F16Rows {
                    weight_planes: w16 == gemm::F16Weight::Planes,
                }
            }
            _ => split,
        })
    }

    fn input_type(&self, w: &CudaLinear) -> OutType {
        if w.act_quant.is_some() && self.act != Dt::F32 {
            OutType::F32
        } else {
            OutType::Activation
        }
    }

    fn linear(&self, x: &CudaTensor, w: &CudaLinear) -> Result<CudaTensor> {
        self.linear_of(x, w, None)
    }

    /// Under split GEMMs on `split_gemm.cu`, the input is split once for all of `ws`.
    fn linears(&self, x: &CudaTensor, ws: &[&CudaLinear]) -> Result<Vec<CudaTensor>> {
        let shared = ws.len() > 1 && ws.iter().all(|w| self.reads_planes(x.shape(), x.dtype, w));
        if !shared {
            return ws.iter().map(|w| self.linear(x, w)).collect();
        }
        let (_buf, planes) = self.split_rows(x.ptr(), [x.rows, x.cols])?;
        ws.iter()
            .map(|w| self.linear_of(x, w, Some(planes)))
            .collect()
    }

    fn mixture(
        &self,
        x: &CudaTensor,
        groups: &CudaGroups,
        lens: &[usize],
        mlps: &[GatedMlp<'_, CudaLinear>],
    ) -> Result<CudaTensor> {
        match self.mixture_on(x, groups, lens, mlps, None)? {
            mixture::Mixed::Sum(acc) => Ok(acc),
            mixture::Mixed::Added => {
                Err(Error::backend("cuda", "a mixture added with no residual"))
            }
        }
    }

    fn mixture_into(
        &self,
        residual: &mut CudaTensor,
        x: &CudaTensor,
        groups: &CudaGroups,
        lens: &[usize],
        mlps: &[GatedMlp<'_, CudaLinear>],
    ) -> Result<Option<CudaTensor>> {
        Ok(
            match self.mixture_on(x, groups, lens, mlps, Some(residual))? {
                mixture::Mixed::Sum(acc) => Some(acc),
                mixture::Mixed::Added => None,
            },
        )
    }

    fn logits(&self, x: &CudaTensor, w: &CudaLinear) -> Result<Vec<f32>> {
        match self.router_logits(x, w)? {
            Some(t) => self.download(&t),
            None => self.download(&self.linear(x, w)?),
        }
    }

    /// Routing in kernels (`route.cu`): top-k per token on the device, the tokens grouped by
    /// expert there; only the per-expert counts come back to the host (the f32 logits of every
    /// token crossed at about 1 GB/s on the virtualised H200s: 40 % of a batch).
    fn route(
        &self,
        x: &CudaTensor,
        router: &CudaLinear,
        rule: &RouteRule,
        all_rows: Option<&[f32]>,
    ) -> Result<(CudaGroups, Vec<usize>)> {
        let groups = match rule.router {
            crate::checkpoint::Router::Softmax { .. } | crate::checkpoint::Router::TopKSoftmax => 1,
            crate::checkpoint::Router::Sigmoid { groups, .. } => groups,
        };
        let (t, e, k) = (x.rows, rule.experts, rule.experts_per_token);
        let fits = k <= kernels::route::MAX_K
            && groups <= kernels::route::MAX_GROUPS
            && e <= kernels::route::MAX_EXPERTS;
        let logits = match self.router_logits(x, router)? {
            Some(l) if fits && l.shape() == [t, e] && rule.bias.len() == e => l,
            _ => return crate::backend::routing::route_on_host(self, x, router, rule, all_rows),
        };
        // The router was the planes' last reader (its GEMMs are queued before the free).
        if let Some(planes) = &x.planes {
            planes.release();
        }
        crate::backend::routing::check_rule(e, k, rule)?;
        let picks = t * k;
        let bias = self.upload_pod(rule.bias, "router bias")?;
        let ids = self.alloc(picks * 4, "routed experts")?;
        let weights = self.alloc(picks * 4, "routing weights")?;
        let counts = self.zeros(1, e)?;
        let tk = kernels::route::TopK {
            logits: logits.ptr(),
            bias: bias.ptr(),
            ids: ids.ptr(),
            weights: weights.ptr(),
            counts: counts.ptr(),
        };
        kernels::route::top_k(&self.kernels, &self.stream, &tk, (t, e, k), rule.router)?;
        let counts: Vec<u32> = bytemuck::pod_collect_to_vec(
            &self.download_bytes(&counts.buf, "expert counts")?[..e * 4],
        );
        // Each group starts at a multiple of GEMM_ROW_MULTIPLE rows: an expert's GEMM may run
        // on its rows rounded up without touching another expert's (they may run at once).
        let mut lens: Vec<usize> = counts.iter().map(|&c| c as usize).collect();
        let mut offsets = vec![0usize];
        for &n in &lens {
            let end = offsets.last().copied().unwrap_or(0);
            offsets.push(end + n.next_multiple_of(mixture::GEMM_ROW_MULTIPLE));
        }
        let routed_rows = offsets[e];
        let extra = all_rows.map_or(0, |w| w.len());
        let sum: usize = lens.iter().sum();
        if all_rows.is_some_and(|w| w.len() != t) || sum != picks {
            return Err(Error::backend(
                "cuda",
                format!("routing {t} tokens gave {sum} picks of {picks}"),
            ));
        }
        let cursor: Vec<u32> = offsets[..e].iter().map(|&o| o as u32).collect();
        let cursor = self.upload_pod(&cursor, "group cursors")?;
        // Rows between groups: row 0 at weight 0 (gathered and computed, never added).
        let rows = self.zeros(1, routed_rows + extra)?.buf;
        let row_weights = self.zeros(1, routed_rows + extra)?.buf;
        let slots = self.alloc(picks * 4, "expert slots")?;
        kernels::route::fill(
            &self.kernels,
            &self.stream,
            (ids.ptr(), weights.ptr(), cursor.ptr()),
            (rows.ptr(), row_weights.ptr(), slots.ptr()),
            (t, k, e),
        )?;
        if let Some(w) = all_rows {
            // The shared expert's group: every row, in order, after the routed ones.
            let all: Vec<u32> = (0..t as u32).collect();
            let tail = 4 * routed_rows as u64;
            self.copy_in(
                rows.ptr() + tail,
                &self.upload_pod(&all, "shared expert rows")?,
            )?;
            self.copy_in(
                row_weights.ptr() + tail,
                &self.upload_pod(w, "shared expert weights")?,
            )?;
            offsets.push(routed_rows + t);
            lens.push(t);
        }
        Ok((
            CudaGroups {
                rows,
                weights: row_weights,
                offsets,
                lens: lens.clone(),
                rows_below: t,
                slots: Some((slots, k)),
                routed: e,
            },
            lens,
        ))
    }

    fn gather_group(
        &self,
        x: &CudaTensor,
        groups: &CudaGroups,
        g: usize,
        out: OutType,
    ) -> Result<CudaTensor> {
        let range = groups.range(g, x.rows)?;
        let out = self.new_tensor([range.len(), x.cols], self.out_dt(out), "expert rows")?;
        if !range.is_empty() {
            let ids = groups.rows.ptr() + 4 * range.start as u64;
            kernels::gather_rows::run(
                &self.kernels,
                &self.stream,
                &out,
                (x.ptr(), x.dtype),
                ids,
                1.0,
            )?;
        }
        Ok(out)
    }

    fn scatter_add_group(
        &self,
        acc: &mut CudaTensor,
        y: &CudaTensor,
        groups: &CudaGroups,
        g: usize,
    ) -> Result<()> {
        let range = groups.range(g, acc.rows)?;
        self.check_tensor(acc, acc.shape(), Dt::F32, "expert accumulator")?;
        self.check_tensor(y, [range.len(), acc.cols], y.dtype, "expert output rows")?;
        if range.is_empty() {
            return Ok(());
        }
        let offset = 4 * range.start as u64;
        kernels::scatter_add::run(
            &self.kernels,
            &self.stream,
            acc,
            y,
            groups.rows.ptr() + offset,
            groups.weights.ptr() + offset,
        )
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        layout: &CudaSequences,
        cos: &CudaTensor,
        sin: &CudaTensor,
        span: RotarySpan,
    ) -> Result<()> {
        let t = layout.n_tokens;
        if let Act::Converted(c) = self.act(x)? {
            *x = c;
        }
        span.check(x.cols, "cuda rope")?;
        self.check_tensor(x, [t, x.cols], self.act, "rope input")?;
        layout.check_rope_tables((cos, sin), span.dims / 2, "cuda rope")?;
        let positions = layout.positions.ptr();
        kernels::rope::run(&self.kernels, &self.stream, x, positions, (cos, sin), span)
    }

    fn norm_rope(
        &self,
        x: CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        layout: &CudaSequences,
        cos: &CudaTensor,
        sin: &CudaTensor,
        span: RotarySpan,
    ) -> Result<CudaTensor> {
        let d = span.head_dim;
        let (t, cols) = (layout.n_tokens, x.cols);
        let fused = span == RotarySpan::leading(d, d)
            && kernels::qk_norm_rope::fits(d)
            && cols.is_multiple_of(d)
            && weight.len() == d
            && weight.dtype == Dt::F32;
        if !fused {
            return crate::backend::norm_then_rope(self, x, weight, eps, layout, cos, sin, span);
        }
        let mut x = x;
        if let Act::Converted(c) = self.act(&x)? {
            x = c;
        }
        self.check_tensor(&x, [t, cols], self.act, "norm_rope input")?;
        layout.check_rope_tables((cos, sin), d / 2, "cuda norm_rope")?;
        kernels::qk_norm_rope::run(
            &self.kernels,
            &self.stream,
            &x,
            (weight.ptr(), eps),
            layout.positions.ptr(),
            (cos.ptr(), sin.ptr()),
            d,
        )?;
        Ok(x)
    }

    fn assemble_columns(
        &self,
        rows: usize,
        cols: usize,
        parts: &[(&CudaTensor, ColumnBlocks)],
        out: OutType,
    ) -> Result<CudaTensor> {
        let t = self.new_tensor([rows, cols], self.out_dt(out), "assembled columns")?;
        self.zero_fill(&t, "assembled columns")?;
        for (src, at) in parts {
            self.check_tensor(src, [rows, src.cols], src.dtype, "assemble_columns source")?;
            at.check(src.cols, cols)?;
            if rows > 0 && at.blocks * at.width > 0 {
                kernels::copy_columns::run(&self.kernels, &self.stream, &t, src, *at)?;
            }
        }
        Ok(t)
    }

    fn attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        layout: &CudaSequences,
        spec: AttnSpec,
        sinks: Option<&CudaTensor>,
        out: OutType,
    ) -> Result<CudaTensor> {
        if let Some(s) = sinks {
            self.check_tensor(s, [1, spec.heads], Dt::F32, "attention sinks")?;
        }
        let (t, dt) = (layout.n_tokens, self.act);
        let (qw, kw) = (spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim);
        let (q, k, v) = (self.act(q)?, self.act(k)?, self.act(v)?);
        let (q, k, v) = (q.get(), k.get(), v.get());
        self.check_tensor(q, [t, qw], dt, "attention q")?;
        self.check_tensor(k, [t, kw], dt, "attention k")?;
        self.check_tensor(v, [t, kw], dt, "attention v")?;
        let out = self.new_tensor([t, qw], self.out_dt(out), "attention output")?;
        if t > 0 {
            use kernels::attention::{self as attn, Inputs};
            let (ks, st) = (&self.kernels, &self.stream);
            let d = spec.head_dim;
            // f32 operands as f16 planes for the tensor cores where GEMMs are split too: q and
            // k row by row of each head, v column by column.
            let planes = if self.split_gemms && dt == Dt::F32 && attn::splits(ks, d)? {
                let (sq, sk) = (
                    self.split_rows(q.ptr(), [t * spec.heads, d])?,
                    self.split_rows(k.ptr(), [t * spec.kv_heads, d])?,
                );
                let plane = (t * kw * 2) as u64;
                let sv = self.alloc(2 * plane as usize + kw * 4, "split v")?;
                let to = (sv.ptr(), sv.ptr() + plane, sv.ptr() + 2 * plane);
                kernels::split_columns_f16::run(ks, st, to, v.ptr(), [t, kw])?;
                Some((sq, sk, sv, to.2))
            } else {
                None
            };
            let (inputs, qkv) = match &planes {
                Some(((_, q), (_, k), v, v_top)) => (
                    Inputs::SplitPlanes {
                        q_undo: q.undo,
                        k_undo: k.undo,
                        v_top: *v_top,
                    },
                    (q.hi, k.hi, v.ptr()),
                ),
                None => (Inputs::Act(dt), (q.ptr(), k.ptr(), v.ptr())),
            };
            attn::run(
                ks,
                self.portable_attention,
                st,
                (inputs, out.dtype),
                out.ptr(),
                qkv,
                layout.seq_start.ptr(),
                t,
                spec,
                sinks.map(|s| s.ptr()),
            )?;
        }
        Ok(out)
    }

    fn gated_act(
        &self,
        gate: &CudaTensor,
        up: Option<&CudaTensor>,
        act: GatedActivation,
        out: OutType,
    ) -> Result<CudaTensor> {
        let dt = gate.dtype;
        let shape = crate::backend::gated_shape(gate.shape(), up.map(Shaped::shape), act)?;
        if let Some(up) = up {
            self.check_tensor(up, gate.shape(), dt, "gated activation up")?;
        }
        let out = self.new_tensor(shape, self.out_dt(out), "gated activation output")?;
        kernels::elementwise::gated_act(
            &self.kernels,
            &self.stream,
            (dt, out.dtype),
            out.ptr(),
            gate.ptr(),
            up.map_or(kernels::elementwise::GateUp::Interleaved, |u| {
                kernels::elementwise::GateUp::Apart(u.ptr())
            }),
            out.len(),
            act,
        )?;
        Ok(out)
    }

    /// Under split GEMMs on `split_gemm.cu`, the activation is written straight as the down
    /// projection's f16 planes (`split_gated_rows_f16`): never as an f32 tensor.
    fn gated_linear(
        &self,
        gate: CudaTensor,
        up: Option<CudaTensor>,
        act: GatedActivation,
        w: &CudaLinear,
    ) -> Result<CudaTensor> {
        use kernels::split_rows_f16::{GATED_ROW_MAX, split_gated_rows};
        let fused = up.as_ref().filter(|u| {
            u.shape() == gate.shape()
                && u.dtype == gate.dtype
                && gate.cols <= GATED_ROW_MAX
                && gate.rows > 0
                && self.reads_planes(gate.shape(), gate.dtype, w)
        });
        let Some(up) = fused else {
            let h = self.gated_act(&gate, up.as_ref(), act, self.input_type(w))?;
            drop((gate, up));
            return self.linear(&h, w);
        };
        let (_buf, planes) = self.f16_rows(gate.shape())?;
        let to = (planes.hi, planes.lo, planes.undo);
        let (k, s) = (&self.kernels, &self.stream);
        split_gated_rows(k, s, to, (gate.ptr(), up.ptr()), gate.shape(), act)?;
        // The input's address is not read: split_gemm takes the planes.
        self.linear_on(0, gate.rows, w, Some(planes))
    }

    fn add_assign(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        // x is the f32 residual stream; y an activation (or an f32 vector from the checks).
        self.check_tensor(x, x.shape(), Dt::F32, "residual")?;
        self.check_tensor(y, x.shape(), y.dtype, "residual update")?;
        let n = x.len();
        kernels::elementwise::add_assign(&self.kernels, &self.stream, y.dtype, x.ptr(), y.ptr(), n)
    }

    fn add_rms_norm(
        &self,
        x: &mut CudaTensor,
        y: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        out: OutType,
    ) -> Result<CudaTensor> {
        // x is the f32 residual stream; y an activation (or an f32 vector from the checks).
        self.check_tensor(x, x.shape(), Dt::F32, "residual stream")?;
        self.check_tensor(y, x.shape(), y.dtype, "residual update")?;
        self.normalized(x, Some(y), weight, eps, out)
    }

    fn nll(
        &self,
        hidden: &CudaTensor,
        head: Head<'_, CudaLinear>,
        targets: &[i32],
    ) -> Result<Vec<f32>> {
        self.vocab_nll(hidden, head, targets)
    }

    fn kld(
        &self,
        base_hidden: &CudaTensor,
        base_head: Head<'_, CudaLinear>,
        hidden: &CudaTensor,
        head: Head<'_, CudaLinear>,
        targets: &[i32],
    ) -> Result<Vec<KldTerms>> {
        self.vocab_kld(base_hidden, base_head, hidden, head, targets)
    }
}
