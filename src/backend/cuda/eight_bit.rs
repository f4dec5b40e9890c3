//! W8A8 linears on the 8-bit tensor cores: a linear whose weight is one FP8 or INT8 code a
//! value with one scale a channel (or one for the tensor), and whose input is quantized with
//! one scale a token (FP8 per token or static, INT of at most 8 bits per token), or an FP8
//! weight with a scale per 128x128 block and an input with one per token and 128 inputs
//! (native FP8 checkpoints, compressed-tensors' FP8_BLOCK), multiplies the codes themselves:
//! the input is quantized to codes and scales (`act_quant.cu`), the codes multiplied exactly
//! (`gemm8`), the scales applied to the f32 (or exact int32) sums.
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

use super::gemm8::{self, EightBit, Lt, Product8, Scaling};
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
/// (`DevWeight::Unpacked`), the f32 scale of each output channel (`Fp8Blocks`: of each
/// 128x128 block, in `Scaling::Blocks128`'s layout), and for `Int8Exact` each channel's unit
/// (the power of two that leaves its scale's 8-bit significand).
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

/// An input quantized for the 8-bit GEMMs: `rows x cols` codes, then each row's f32 scale
/// (per group of inputs: `Scaling::Blocks128`'s layout), over `padded_rows`: cuBLASLt's
/// block-scaled kernels take multiples of 4 tokens, the rows past `rows` zero.
pub(super) struct Codes {
    buf: DevBuf,
    rows: usize,
    padded_rows: usize,
    cols: usize,
    act_quant: ActQuant,
}

impl Codes {
    fn codes(&self) -> u64 {
        self.buf.ptr()
    }

    /// The scales' offset: 256-byte aligned, as cuBLASLt wants its scale vectors.
    fn scales(&self) -> u64 {
        self.buf.ptr() + (self.padded_rows * self.cols).next_multiple_of(256) as u64
    }
}

/// A probe's scale of a channel or token (first argument) over an input group (second).
type ScaleAt = fn(usize, usize) -> f32;

impl CudaBackend {
    /// The 8-bit tensor cores `w` runs on, if any: a weight of FP8 or INT8 codes with a scale
    /// a channel or one in all and no zero points, an input quantizer of one scale a token of
    /// the same kind, widths that cuBLAS's 8-bit kernels take (multiples of 16), a GPU with
    /// those tensor cores; or FP8 128x128 weight blocks and 1x128 input groups, widths of
    /// whole blocks; FP8 only in the precision that asks for it, INT8 there and in the
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
        let blocks128 = scales.index.row_div == 128
            && scales.index.col_div == 128
            && n_in % 128 == 0
            && n_out % 128 == 0;
        let fast = self.precision == CudaPrecision::Bf16With8BitCores;
        if scales.zeros.is_some() || scales.mins.is_some() || n_in % 16 != 0 || n_out % 16 != 0 {
            return Ok(None);
        }
        let cc = self.info.compute_capability;
        Ok(match (act_quant, int8) {
            (
                Some(ActQuant::Fp8PerTokenGroup { group: 128 } | ActQuant::Fp8Group { group: 128 }),
                false,
            ) if blocks128 && fast && cc >= (9, 0) && self.has_fp8(Scaling::Blocks128)? => {
                Some(EightBit::Fp8Blocks)
            }
            _ if !per_channel => None,
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
                if fast && cc >= (8, 9) && self.has_fp8(Scaling::Outer)? =>
            {
                Some(EightBit::Fp8)
            }
            _ => None,
        })
    }

    /// Whether cuBLASLt multiplies FP8 with `scaling`'s scales on this GPU, and applies them
    /// as `gemm8` lays them out: asked once each, by running a small product of unit codes
    /// whose scales are powers of two that differ along every axis, each output a sum of one
    /// or two exact terms. A refusal or a wrong value leaves those FP8 linears emulated.
    fn has_fp8(&self, scaling: Scaling) -> Result<bool> {
        let cell = match scaling {
            Scaling::Outer => &self.fp8_scaled,
            Scaling::Blocks128 => &self.fp8_block_scaled,
        };
        if let Some(&known) = cell.get() {
            return Ok(known);
        }
        let (rows, n_in, n_out) = (64, 256, 256);
        let one = 0x38u8; // 1.0 in E4M3
        // The scale of channel c and token t over input group g (of n_in / groups inputs).
        let (groups, w_at, x_at): (usize, ScaleAt, ScaleAt) = match scaling {
            Scaling::Outer => (
                1,
                |c, _| 2f32.powi(c as i32 % 16),
                |t, _| 2f32.powi(-(t as i32 % 16)),
            ),
            Scaling::Blocks128 => (
                2,
                |c, g| 2f32.powi((c / 128 + 3 * g) as i32),
                |t, g| 2f32.powi(-(t as i32 % 8) - 5 * g as i32),
            ),
        };
        let (w_scale, x_scale): (Vec<f32>, Vec<f32>) = match scaling {
            Scaling::Outer => (
                (0..n_out).map(|c| w_at(c, 0)).collect(),
                (0..rows).map(|t| x_at(t, 0)).collect(),
            ),
            // Block rows of `ld` = 4 entries (2 block columns rounded up), groups' vectors of
            // `rows` entries.
            Scaling::Blocks128 => (
                (0..n_out / 128 * 4)
                    .map(|i| {
                        if i % 4 < groups {
                            w_at(i / 4 * 128, i % 4)
                        } else {
                            0.0
                        }
                    })
                    .collect(),
                (0..groups * rows)
                    .map(|i| x_at(i % rows, i / rows))
                    .collect(),
            ),
        };
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
            scaling,
        };
        let stream = self.stream.cu_stream() as _;
        let known = match self.with_lt(|lt| gemm8::fp8_xwt(lt, stream, p)) {
            Ok(()) => {
                let got: Vec<f32> =
                    bytemuck::pod_collect_to_vec(&self.download_bytes(&y, "FP8 probe output")?);
                let per_group = (n_in / groups) as f32;
                got.iter().enumerate().all(|(i, &v)| {
                    let (t, c) = (i / n_out, i % n_out);
                    v == (0..groups)
                        .map(|g| per_group * w_at(c, g) * x_at(t, g))
                        .sum::<f32>()
                })
            }
            Err(_) => false,
        };
        Ok(*cell.get_or_init(|| known))
    }

    /// `f` on the cuBLASLt handle, made (with its workspace) at first use.
    fn with_lt<T>(&self, f: impl FnOnce(&mut Lt) -> Result<T>) -> Result<T> {
        // Binds the context to this thread.
        drop(self.blas()?);
        let mut guard = self
            .lt
            .lock()
            .map_err(|_| Error::backend("cuda", "cuBLASLt lock poisoned"))?;
        let mut lt = match guard.take() {
            Some(lt) => lt,
            None => Lt::new(self.alloc(gemm8::LT_WORKSPACE, "cuBLASLt workspace")?)?,
        };
        let result = f(&mut lt);
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
        let per_channel: Vec<f32> = match kind {
            // Each block row's `stride` block columns, padded to a multiple of 4.
            EightBit::Fp8Blocks => (0..n_out.div_ceil(128))
                .flat_map(|b| {
                    let row = &values[b * stride..(b + 1) * stride];
                    let pad = stride.next_multiple_of(4) - stride;
                    row.iter().copied().chain(std::iter::repeat_n(0.0, pad))
                })
                .collect(),
            _ => (0..n_out).map(|r| values[r * stride]).collect(),
        };
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

    /// `x` quantized by `aq` as codes and row (or row and group) scales.
    pub(super) fn quantize_codes(&self, x: &CudaTensor, aq: ActQuant) -> Result<Codes> {
        let [rows, cols] = x.shape();
        let (groups, padded_rows) = match aq {
            ActQuant::Fp8PerTokenGroup { group } | ActQuant::Fp8Group { group } => (
                cols.div_ceil(group.max(1) as usize),
                rows.next_multiple_of(4),
            ),
            _ => (1, rows),
        };
        let bytes = (padded_rows * cols).next_multiple_of(256) + padded_rows * groups * 4;
        let codes = Codes {
            buf: self.alloc(bytes, "8-bit activation codes")?,
            rows,
            padded_rows,
            cols,
            act_quant: aq,
        };
        let to = (codes.codes(), codes.scales());
        kernels::act_quant::codes(&self.kernels, &self.stream, to, (x, padded_rows), aq)?;
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
            EightBit::Fp8 | EightBit::Fp8Blocks => {
                // With a bias, the f32 product is rounded once after it is added; padded rows
                // go to sums of their own, whose first `rows` are the output's.
                let f32_sums;
                let padded = x.padded_rows != rows;
                let (y, y_dt) = if padded || bias.is_some() && dt == Dt::Bf16 {
                    f32_sums = self.alloc(x.padded_rows * n_out * 4, "FP8 GEMM sums")?;
                    (f32_sums.ptr(), Dt::F32)
                } else {
                    (out.ptr(), dt)
                };
                let p = Product8 {
                    x: x.codes(),
                    x_scale: x.scales(),
                    w: weight.ptr(),
                    w_scale: e.col_scale.ptr(),
                    y,
                    rows: x.padded_rows,
                    n_in,
                    n_out,
                    out_dt: y_dt,
                    scaling: match e.kind {
                        EightBit::Fp8Blocks => Scaling::Blocks128,
                        _ => Scaling::Outer,
                    },
                };
                let stream = self.stream.cu_stream() as _;
                self.with_lt(|lt| gemm8::fp8_xwt(lt, stream, p))?;
                if y != out.ptr() || bias.is_some() {
                    let f = Factors {
                        bias,
                        ..Factors::default()
                    };
                    let to = (out.ptr(), out.dtype);
                    let (k, s) = (&self.kernels, &self.stream);
                    gemm_epilogue::run(k, s, to, (y, Sums::F32), [rows, n_out], f)?;
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
