//! W8A8 linears on the 8-bit tensor cores: a linear whose weight is one FP8 or INT8 code a
//! value with one scale a channel (or one for the tensor), and whose input is quantized with
//! one scale a token (FP8 per token or static, INT of at most 8 bits per token), multiplies
//! the codes themselves: the input is quantized to codes and row scales (`act_quant.cu`), the
//! codes multiplied exactly (`gemm8`), the scales applied to the f32 (or exact int32) sums once.
//!
//! The reference's weights are `code * scale` rounded to the scale's dtype (bf16). In the f32
//! precisions, an INT8 weight with bf16 scales runs as two INT8 GEMMs whose exact sums give
//! those rounded weights' products exactly (`int8_residual.cu`): 2.2x `f32`'s emulation and
//! 1.5x `f32-grade`'s on an 8B, where in `bf16` the two GEMMs, the residual pass and the int32
//! round trips ran at 0.81x the emulation's bf16 GEMM, which stays (docs/performance.md).
//! `Bf16With8BitCores` multiplies the unrounded `code * scale` in one GEMM (as vLLM's kernels
//! do), FP8 too, and Hopper's FP8 tensor cores sum with about 10 bits (8e-4 of the products'
//! magnitude at 64 inner values, truncated): a speed mode outside the bf16 contract on the
//! fixtures (docs/decisions.md: W8A8 on 8-bit tensor cores).

use std::sync::atomic::Ordering;

use super::gemm8::{self, EightBit, Lt, Product8};
use super::kernels::gemm_epilogue::{self, Factors, Sums};
use super::kernels::{self, Dt};
use super::memory::DevBuf;
use super::weights::{DevWeight, scratch_ptr};
use super::{CudaBackend, CudaLinear, CudaPrecision, CudaTensor};
use crate::backend::Shaped;
use crate::backend::lowering::Scales;
use crate::numerics::{ActQuant, FloatType};
use crate::{Error, Result};

/// A W8A8 linear's weight as the 8-bit GEMMs read it: its codes where they were uploaded
/// (`DevWeight::Unpacked`), the f32 scale of each output channel, and for `Int8Exact` each
/// channel's unit (the power of two that leaves its scale's 8-bit significand).
pub(super) struct EightBitWeight {
    pub kind: EightBit,
    pub col_scale: DevBuf,
    pub unit: Option<DevBuf>,
}

/// The sums of the INT8 GEMMs held at once: rows are taken in slices that keep them under this.
const INT8_SUMS_BYTES: usize = 256 << 20;

/// The unit of a bf16-valued scale `s`: the power of two `u` with `s = M * u`, `M` its 8-bit
/// significand (below 128 for a subnormal; a zero scale, whose weights are all zero, gets the
/// subnormals' unit).
fn bf16_unit(s: f32) -> f32 {
    let biased = ((s.to_bits() >> 23) & 0xff) as i32;
    // A subnormal (biased exponent 0) shares the smallest normals' unit, 2^-133.
    crate::numerics::times_pow2(1.0, biased.max(1) - 127 - 7)
}

/// An input quantized for the 8-bit GEMMs: `rows x cols` codes, then each row's f32 scale.
pub(super) struct Codes {
    buf: DevBuf,
    rows: usize,
    cols: usize,
    act_quant: ActQuant,
}

impl Codes {
    fn codes(&self) -> u64 {
        self.buf.ptr()
    }

    /// The scales' offset: 256-byte aligned, as cuBLASLt wants its scale vectors.
    fn scales(&self) -> u64 {
        self.buf.ptr() + (self.rows * self.cols).next_multiple_of(256) as u64
    }
}

impl CudaBackend {
    /// The 8-bit tensor cores `w` runs on, if any: a weight of FP8 or INT8 codes with a scale
    /// a channel or one in all and no zero points, an input quantizer of one scale a token of
    /// the same kind, widths that cuBLAS's 8-bit kernels take (multiples of 16), a GPU with
    /// those tensor cores; FP8 only in the precision that asks for it, INT8 there and in the
    /// f32 precisions where its two GEMMs give the reference's weights (bf16 scales below 2^119,
    /// whose products with the codes stay finite; a bf16 or f32 model, which leaves those bf16
    /// values as they are).
    pub(super) fn eight_bit_kind(
        &self,
        int8: bool,
        scales: &Scales,
        (act_quant, model): (Option<ActQuant>, FloatType),
        [n_out, n_in]: [usize; 2],
    ) -> Result<Option<EightBit>> {
        let per_channel = scales.index.row_div == 1 && scales.index.col_div >= n_in;
        let fast = self.precision == CudaPrecision::Bf16With8BitCores;
        if !per_channel
            || scales.zeros.is_some()
            || scales.mins.is_some()
            || n_in % 16 != 0
            || n_out % 16 != 0
        {
            return Ok(None);
        }
        let cc = self.info.compute_capability;
        Ok(match (act_quant, int8) {
            (Some(ActQuant::IntPerToken { bits }), true) if bits <= 8 && cc >= (7, 5) => {
                let exact = || {
                    self.precision.act() == Dt::F32
                        && scales.dtype == FloatType::Bf16
                        && model != FloatType::F16
                        && scales.values_f32().iter().all(|s| s.abs() < 2f32.powi(119))
                };
                if fast {
                    Some(EightBit::Int8)
                } else {
                    exact().then_some(EightBit::Int8Exact)
                }
            }
            (Some(ActQuant::Fp8PerToken | ActQuant::Fp8Static { .. }), false)
                if fast && cc >= (8, 9) && self.has_fp8()? =>
            {
                Some(EightBit::Fp8)
            }
            _ => None,
        })
    }

    /// Whether cuBLASLt multiplies FP8 with per-token and per-channel scales on this GPU, and
    /// applies them as `gemm8` orients them: asked once, by running a small product of unit
    /// codes whose every output is `k * w_scale[channel] * x_scale[token]`, each a distinct
    /// power of two. A refusal or a wrong value leaves W8A8 FP8 linears emulated.
    fn has_fp8(&self) -> Result<bool> {
        if let Some(&known) = self.fp8_scaled.get() {
            return Ok(known);
        }
        let (rows, n_in, n_out) = (64, 128, 128);
        let one = 0x38u8; // 1.0 in E4M3
        let w_scale: Vec<f32> = (0..n_out).map(|c| 2f32.powi(c as i32 % 16)).collect();
        let x_scale: Vec<f32> = (0..rows).map(|r| 2f32.powi(-(r as i32 % 16))).collect();
        let x = self.upload_bytes(&vec![one; rows * n_in], "FP8 probe input")?;
        let w = self.upload_bytes(&vec![one; n_out * n_in], "FP8 probe weight")?;
        let (xs, ws) = (
            self.upload_pod(&x_scale, "FP8 probe scales")?,
            self.upload_pod(&w_scale, "FP8 probe scales")?,
        );
        let y = self.alloc(rows * n_out * 4, "FP8 probe output")?;
        let p = Product8 {
            x: x.ptr(),
            x_scale: xs.ptr(),
            w: w.ptr(),
            w_scale: ws.ptr(),
            y: y.ptr(),
            rows,
            n_in,
            n_out,
            out_dt: Dt::F32,
        };
        let stream = self.stream.cu_stream() as _;
        let known = match self.with_lt(|lt| gemm8::fp8_xwt(lt, stream, p)) {
            Ok(()) => {
                let got: Vec<f32> =
                    bytemuck::pod_collect_to_vec(&self.download_bytes(&y, "FP8 probe output")?);
                got.iter()
                    .enumerate()
                    .all(|(i, &v)| v == n_in as f32 * w_scale[i % n_out] * x_scale[i / n_out])
            }
            Err(_) => false,
        };
        Ok(*self.fp8_scaled.get_or_init(|| known))
    }

    /// `f` on the cuBLASLt handle, made (with its workspace) at first use.
    fn with_lt<T>(&self, f: impl FnOnce(&Lt) -> Result<T>) -> Result<T> {
        // Binds the context to this thread.
        drop(self.blas()?);
        let mut guard = self
            .lt
            .lock()
            .map_err(|_| Error::backend("cuda", "cuBLASLt lock poisoned"))?;
        let lt = match guard.take() {
            Some(lt) => lt,
            None => Lt::new(self.alloc(gemm8::LT_WORKSPACE, "cuBLASLt workspace")?)?,
        };
        let result = f(&lt);
        *guard = Some(lt);
        result
    }

    /// `w`'s 8-bit form where `kind` says it has one: each output channel's f32 scale.
    pub(super) fn eight_bit_weight(
        &self,
        kind: EightBit,
        scales: &Scales,
        n_out: usize,
        what: &str,
    ) -> Result<EightBitWeight> {
        let values = scales.values_f32();
        let stride = scales.index.row_stride;
        let per_channel: Vec<f32> = (0..n_out).map(|r| values[r * stride]).collect();
        let unit = match kind {
            EightBit::Int8Exact => {
                let units: Vec<f32> = per_channel.iter().map(|&s| bf16_unit(s)).collect();
                Some(self.upload_pod(&units, what)?)
            }
            _ => None,
        };
        self.eight_bit_linears.fetch_add(1, Ordering::Relaxed);
        Ok(EightBitWeight {
            kind,
            col_scale: self.upload_pod(&per_channel, what)?,
            unit,
        })
    }

    /// `x` quantized by `aq` as codes and row scales.
    pub(super) fn quantize_codes(&self, x: &CudaTensor, aq: ActQuant) -> Result<Codes> {
        let [rows, cols] = x.shape();
        let bytes = (rows * cols).next_multiple_of(256) + rows * 4;
        let codes = Codes {
            buf: self.alloc(bytes, "8-bit activation codes")?,
            rows,
            cols,
            act_quant: aq,
        };
        let to = (codes.codes(), codes.scales());
        kernels::act_quant::codes(&self.kernels, &self.stream, to, x, aq)?;
        Ok(codes)
    }

    /// `w` on input codes made by its own quantizer.
    pub(super) fn linear_from_codes(&self, x: &Codes, w: &CudaLinear) -> Result<CudaTensor> {
        match &w.eight_bit {
            Some(e) if w.act_quant == Some(x.act_quant) && w.in_features == x.cols => {
                self.eight_bit_product(x, w, e)
            }
            _ => Err(Error::backend(
                "cuda",
                format!("{}: input codes of another quantizer or width", w.name),
            )),
        }
    }

    /// `y = x · w^T` (+ bias) of `w`'s 8-bit form `e` on `x`'s codes, in the activation type.
    fn eight_bit_product(
        &self,
        x: &Codes,
        w: &CudaLinear,
        e: &EightBitWeight,
    ) -> Result<CudaTensor> {
        let (rows, n_in, n_out) = (x.rows, w.in_features, w.out_features);
        let DevWeight::Unpacked { weight, .. } = &w.weight else {
            return Err(Error::backend(
                "cuda",
                format!(
                    "{}: an 8-bit GEMM on a weight that is not one code a value",
                    w.name
                ),
            ));
        };
        let dt = self.precision.act();
        let out = self.new_tensor([rows, n_out], dt, &format!("{} output", w.name))?;
        let bias = w.bias.as_ref().map(DevBuf::ptr);
        match e.kind {
            EightBit::Fp8 => {
                // With a bias, the f32 product is rounded once after it is added.
                let f32_sums;
                let (y, y_dt) = match (bias, dt) {
                    (Some(_), Dt::Bf16) => {
                        f32_sums = self.alloc(rows * n_out * 4, "FP8 GEMM sums")?;
                        (f32_sums.ptr(), Dt::F32)
                    }
                    _ => (out.ptr(), dt),
                };
                let p = Product8 {
                    x: x.codes(),
                    x_scale: x.scales(),
                    w: weight.ptr(),
                    w_scale: e.col_scale.ptr(),
                    y,
                    rows,
                    n_in,
                    n_out,
                    out_dt: y_dt,
                };
                let stream = self.stream.cu_stream() as _;
                self.with_lt(|lt| gemm8::fp8_xwt(lt, stream, p))?;
                if let Some(bias) = bias {
                    gemm_epilogue::add_bias(&self.kernels, &self.stream, &out, y, bias)?;
                }
            }
            EightBit::Int8 | EightBit::Int8Exact => {
                self.int8_products(x, (weight.ptr(), e), &out, bias)?;
            }
        }
        Ok(out)
    }

    /// `out = x · w^T (+ bias)` of INT8 codes: the codes' GEMM, and for `Int8Exact` the
    /// residual codes' (made into the dequantization scratch), into exact int32 sums that
    /// `gemm_epilogue.cu` scales; rows in slices whose sums fit `INT8_SUMS_BYTES`.
    fn int8_products(
        &self,
        x: &Codes,
        (w_codes, e): (u64, &EightBitWeight),
        out: &CudaTensor,
        bias: Option<u64>,
    ) -> Result<()> {
        let (rows, n_in, n_out) = (x.rows, x.cols, out.cols);
        let (k, s) = (&self.kernels, &self.stream);
        let residual = match &e.unit {
            Some(unit) => {
                let guard = self.scratch(n_out * n_in)?;
                let at = scratch_ptr(&guard)?;
                let from = (w_codes, e.col_scale.ptr(), unit.ptr());
                kernels::int8_residual::run(k, s, at, from, [n_out, n_in])?;
                Some((guard, at, unit.ptr()))
            }
            None => None,
        };
        let gemms = 1 + residual.is_some() as usize;
        let slice = (INT8_SUMS_BYTES / (n_out * 4 * gemms))
            .max(64)
            .min(rows.max(1));
        let sums = self.alloc(slice * n_out * 4 * gemms, "INT8 GEMM sums")?;
        let sums2 = sums.ptr() + (slice * n_out * 4) as u64;
        let mut r0 = 0;
        while r0 < rows {
            let n = slice.min(rows - r0);
            let xs = x.codes() + (r0 * n_in) as u64;
            gemm8::int8_xwt(&*self.blas()?, (xs, w_codes, sums.ptr()), n, n_in, n_out)?;
            if let Some((_, at, _)) = &residual {
                gemm8::int8_xwt(&*self.blas()?, (xs, *at, sums2), n, n_in, n_out)?;
            }
            let f = Factors {
                row_scale: Some(x.scales() + (r0 * 4) as u64),
                col_scale: Some(e.col_scale.ptr()),
                residual: residual.as_ref().map(|(_, _, unit)| (sums2, *unit)),
                bias,
            };
            let to = (
                out.ptr() + (r0 * n_out * out.dtype.bytes()) as u64,
                out.dtype,
            );
            gemm_epilogue::run(k, s, to, (sums.ptr(), Sums::I32), [n, n_out], f)?;
            r0 += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::bf16_unit;

    /// What `int8_residual.cu` relies on, over every code and a spread of bf16 scales
    /// (subnormal, tiny, ordinary, huge, every significand): the scale is an integer `M` of at
    /// most 8 bits times its unit, and `bf16(code * s) - code * s` is the unit times an integer
    /// of at most 64 in magnitude, every step exact in f32.
    #[test]
    fn int8_weights_rounded_to_bf16_are_two_int8_codes() {
        let mut scales: Vec<f32> = (1..=0x7f).map(|b| bf16::from_bits(b).to_f32()).collect();
        for e in [-120, -40, -7, -1, 0, 3, 20, 100, 118] {
            scales.extend((0..128).map(|m| (1.0 + m as f32 / 128.0) * 2f32.powi(e)));
        }
        for s in scales.into_iter().map(|s| bf16::from_f32(s).to_f32()) {
            let u = bf16_unit(s);
            let m = s / u;
            assert!(
                m.fract() == 0.0 && (1.0..256.0).contains(&m),
                "scale {s}: M {m}"
            );
            for code in -128i32..=127 {
                let v = code as f32 * s;
                assert_eq!(
                    v as f64,
                    code as f64 * s as f64,
                    "code {code} x {s} not exact"
                );
                let r = (bf16::from_f32(v).to_f32() - v) / u;
                assert!(
                    r.fract() == 0.0 && r.abs() <= 64.0,
                    "code {code} x {s}: R {r}"
                );
                assert_eq!((m * code as f32 + r) * u, bf16::from_f32(v).to_f32());
            }
        }
    }
}
