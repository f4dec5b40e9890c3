//! How a linear runs on the CUDA backend: its input as the GEMM reads it (fake-quantized
//! where the layer declares it), the weight dequantized into the scratch buffer or read where
//! it lies, and the product on cuBLAS, or under `CudaPrecision::F32Grade` split onto 16-bit
//! tensor cores (`split_gemm.cu` on f16 planes on Hopper, `split_bf16.cu`'s bf16 parts
//! elsewhere, long products in slices); the router's f32-exact logits.

use super::kernels::{self, Dt};
use super::memory::{Act, DevBuf, Planes};
use super::weights::DevWeight;
use super::{CudaBackend, CudaLinear, CudaTensor, driver_err, gemm};
use crate::backend::Shaped;
use crate::{Error, Result};

/// The most inner values one split-bf16 GEMM of a large product sums (`sliced_xwt`). On an
/// H100, 8B W4A16 (`eval --rows 4`, per-token differences to `--dtype f32`; docs/decisions.md:
/// f32-grade GEMMs promote every stage): unsliced 4.9e-4 at most, 4096 (only down's 14,336
/// sliced) 3.7e-4 at 1 % of the speed, 2048 3.2e-4 at 6 %, 1024 3.1e-4 at 17 %.
const SPLIT_SLICE: usize = 4096;

impl CudaBackend {
    /// `x` as `w`'s GEMM reads it: fake-quantized where `w` declares it (from the input's
    /// own type: f32 where `input_type` asked for it), else in the activation type.
    pub(super) fn gemm_input<'a>(&self, x: &'a CudaTensor, w: &CudaLinear) -> Result<Act<'a>> {
        match w.act_quant {
            None => self.act(x),
            Some(aq) => {
                let q =
                    self.new_tensor(x.shape(), self.precision.act(), "quantized activations")?;
                kernels::act_quant::run(&self.kernels, &self.stream, &q, x, aq)?;
                Ok(Act::Converted(q))
            }
        }
    }

    /// The router's GEMM with an f32 output on the device (bf16 logits would flip experts at
    /// near-ties). An f32 input, or one held as planes (`OutType::ExactForRouter`, what the forward
    /// pass gives a mixture), is f32-exact either way: on the f32 path it meets the weight in
    /// the full-f32 GEMM; on the bf16 path it is three bf16 planes that sum to it exactly
    /// (split here where it came as f32), each multiplied by the bf16 weight on the tensor
    /// cores into one f32 sum, so every product is exact as in the f32 GEMM and only the order
    /// of the additions differs (that f32 GEMM took 2.4 ms a layer of Qwen3-30B-A3B at 204,800
    /// tokens). `None` for a weight that is not dense (the caller falls back to `linear`).
    pub(super) fn router_logits(
        &self,
        x: &CudaTensor,
        w: &CudaLinear,
    ) -> Result<Option<CudaTensor>> {
        let (rows, n_in, n_out) = (x.rows, w.in_features, w.out_features);
        let dense = match &w.weight {
            DevWeight::Dense(buf) if w.act_quant.is_none() => buf,
            _ => return Ok(None),
        };
        self.check_tensor(x, [rows, n_in], x.dtype, &format!("{} input", w.name))?;
        let out = self.new_tensor([rows, n_out], Dt::F32, &format!("{} logits", w.name))?;
        let plane = (rows * n_in * 2) as u64;
        let split;
        let planes = match (
            x.planes.as_ref().map(Planes::residuals),
            x.dtype,
            self.precision.act(),
        ) {
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
            self.xwt(p, (self.precision.act(), Dt::F32))?;
        }
        // gpt-oss's router has a bias, added in f32.
        if let Some(bias) = &w.bias {
            let (k, s) = (&self.kernels, &self.stream);
            kernels::gemm_epilogue::add_bias(k, s, &out, out.ptr(), bias.ptr())?;
        }
        Ok(Some(out))
    }

    /// Copies all of `src` to device address `dst` (inside a buffer this backend owns), in
    /// stream order.
    pub(super) fn copy_in(&self, dst: u64, src: &DevBuf) -> Result<()> {
        self.copy_bytes(dst, src.ptr(), src.len())
    }

    /// Copies `bytes` from device address `src` to `dst` (both inside buffers this backend
    /// owns), in stream order.
    pub(super) fn copy_bytes(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: `dst` has room for `bytes` and `src` holds them (the callers' allocations);
        // both live on this stream until the copy has run (buffers are freed in stream order).
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream())
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
    pub(super) fn xwt(&self, p: gemm::Product, (in_dt, out_dt): (Dt, Dt)) -> Result<()> {
        if let Some(gemm::F16Weight::ScaledF16(_)) = p.w_f16
            && !(self.precision.splits() && in_dt == Dt::F32)
        {
            // weight_rows dequantizes to f16 only for split GEMMs, whose inputs are f32.
            return Err(Error::backend(
                "cuda",
                "an f16 weight operand for a GEMM that is not split",
            ));
        }
        if !self.precision.splits() || in_dt != Dt::F32 || p.rows == 0 {
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
    pub(super) fn promoted_xwt(
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
    pub(super) fn linear_of(
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
        if let (Some(_), Some(aq)) = (&w.eight_bit, w.act_quant) {
            return self.linear_from_codes(&self.quantize_codes(x, aq)?, w);
        }
        let input = self.gemm_input(x, w)?;
        self.linear_on(input.get().ptr(), x.rows, w, x_f16)
    }

    /// `linear_of` on the checked (and quantized) input at `xp`, `rows` rows of it; with
    /// `x_f16` only its planes are read.
    pub(super) fn linear_on(
        &self,
        xp: u64,
        rows: usize,
        w: &CudaLinear,
        x_f16: Option<gemm::F16Rows>,
    ) -> Result<CudaTensor> {
        let (n_out, dt) = (w.out_features, self.precision.act());
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
        kernels::gemm_epilogue::add_bias(&self.kernels, &self.stream, &out, y, bias.ptr())?;
        Ok(out)
    }

    /// The f32 `[rows, n]` at `x` as two f16 planes with a power of two per row
    /// (`split_rows_f16.cu`), for `split_gemm.cu` and split attention, in a buffer of its own.
    pub(super) fn split_rows(&self, x: u64, shape: [usize; 2]) -> Result<(DevBuf, gemm::F16Rows)> {
        let (buf, planes) = self.f16_rows(shape)?;
        let to = (planes.hi, planes.lo, planes.undo);
        kernels::split_rows_f16::split_rows(&self.kernels, &self.stream, to, x, shape)?;
        Ok((buf, planes))
    }

    /// Room for `[rows, n]` as `split_rows_f16.cu` writes it.
    pub(super) fn f16_rows(&self, [rows, n]: [usize; 2]) -> Result<(DevBuf, gemm::F16Rows)> {
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
    pub(super) fn reads_planes(&self, [_, cols]: [usize; 2], dtype: Dt, w: &CudaLinear) -> bool {
        self.precision.splits()
            && dtype == Dt::F32
            && w.f16_weight
                .is_some_and(|w16| kernels::split_gemm::SplitGemm::takes(cols, w16))
            && w.act_quant.is_none()
            && w.in_features == cols
    }

    /// `p` on bf16 operands (rows `ld_in` apart) as GEMMs over slices of at most
    /// `SPLIT_SLICE` inner values, each added to `y` in f32 (beta 1, rounded to nearest): the
    /// tensor cores' f32 accumulation truncates, and its error grows with the inner dimension.
    pub(super) fn sliced_xwt(&self, p: gemm::Product, ld_in: usize, out_dt: Dt) -> Result<()> {
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
}
