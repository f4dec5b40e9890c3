//! Linear layers on the device, from the shared lowering (`backend::lowering`): uploaded as
//! stored (codes, scales, zero points and g_idx stay packed), dequantized on demand into one
//! reused scratch buffer in the activation type (the size of the largest layer) right before
//! their GEMM.

use std::sync::MutexGuard;
use std::sync::atomic::Ordering;

use super::eight_bit::EightBitWeight;
use super::kernels::dequant::{
    self, ExpertRow, Fp4Args, IntArgs, Rows, ScaleArgs, Target, UnpackedArgs,
};
use super::kernels::split_gemm::SplitGemm;
use super::kernels::{Dt, copy_columns};
use super::memory::DevBuf;
use super::{CudaBackend, CudaTensor, gemm};
use crate::backend::ColumnBlocks;
use crate::backend::lowering::{LoweredWeight, Scales, float_code, lower};
use crate::checkpoint::{Fp4Scale, QLinear};
use crate::numerics::{ActQuant, FloatType};
use crate::{Error, Result};

/// How a linear's weight lies on the device.
pub(super) enum DevWeight {
    /// `[out, in]` in the activation type, multiplied directly (dense checkpoints, embeddings).
    Dense(DevBuf),
    Int {
        packed: DevBuf,
        scales: DevBuf,
        zeros: Option<DevBuf>,
        g_idx: Option<DevBuf>,
        args: IntArgs,
    },
    Fp4 {
        packed: DevBuf,
        scales: DevBuf,
        args: Fp4Args,
    },
    Unpacked {
        weight: DevBuf,
        scales: DevBuf,
        zeros: Option<DevBuf>,
        args: UnpackedArgs,
    },
}

pub struct CudaLinear {
    pub(super) name: String,
    pub(super) out_features: usize,
    pub(super) in_features: usize,
    pub(super) weight: DevWeight,
    /// f32 bias.
    pub(super) bias: Option<DevBuf>,
    pub(super) act_quant: Option<ActQuant>,
    /// The weight's form for the 8-bit tensor cores, where the linear runs on them
    /// (`eight_bit`).
    pub(super) eight_bit: Option<EightBitWeight>,
    /// Every value of the weight is a bf16 (a dense bf16 weight, or a quantized one whose
    /// reference dequantization rounds to bf16): split-bf16 GEMMs need no residual of it and
    /// read it in bf16, as stored or dequantized (see [`CudaBackend::weight_dt`]).
    pub(super) bf16_values: bool,
    /// How split-bf16's GEMMs read the weight where they run on `split_gemm.cu` (Hopper):
    /// scaled into one f16 plane (bf16 values of a span f16 holds,
    /// `LoweredWeight::f16_exact_scale`), or split into two (values held in f32).
    pub(super) f16_weight: Option<gemm::F16Weight>,
}

impl CudaLinear {
    /// `y = x · w^T` over every row of this linear (`w`: its weight's address, resident or
    /// dequantized), `y` rows `out_features` apart.
    pub(super) fn product(&self, x: u64, w: u64, y: u64, rows: usize) -> gemm::Product {
        gemm::Product {
            x,
            w,
            y,
            rows,
            n_in: self.in_features,
            n_out: self.out_features,
            ldy: self.out_features,
            w_bf16_values: self.bf16_values,
            w_f16: self.f16_weight,
            x_f16: None,
        }
    }
}

/// A weight row range ready for the GEMM: where it lies, and how `split_gemm.cu` reads it.
pub(super) struct WeightRows<'a> {
    pub ptr: u64,
    pub f16: Option<gemm::F16Weight>,
    /// The scratch buffer it was dequantized into (none for a resident dense weight), held
    /// until the GEMM is queued.
    _scratch: Option<MutexGuard<'a, Option<DevBuf>>>,
}

pub(super) fn scratch_ptr(g: &MutexGuard<'_, Option<DevBuf>>) -> Result<u64> {
    g.as_ref()
        .map(DevBuf::ptr)
        .ok_or_else(|| Error::backend("cuda", "scratch buffer missing"))
}

impl CudaBackend {
    /// The type a weight is held in (dense) or dequantized to (quantized) on the device: bf16
    /// where its values are bf16 and either the activations are bf16 or GEMMs are split (which
    /// read it as it is), else the activation type.
    pub(super) fn weight_dt(&self, bf16_values: bool) -> Dt {
        if bf16_values && self.precision.splits() {
            Dt::Bf16
        } else {
            self.precision.act()
        }
    }

    /// Uploads `w` as stored: codes, scales and zero points stay packed; a dense weight is
    /// converted to the type `weight_dt` says once.
    pub(super) fn upload_weight(&self, w: &QLinear) -> Result<CudaLinear> {
        let name = w.name;
        let (out, n_in) = (w.out_features, w.in_features);
        let model_dt = float_code(w.model_dtype) as i32;
        let what = |s: &str| format!("{name}.{s}");
        // Scales widened to f32 (exact); zero points and g_idx as i32, indexed as lowered.
        // GGUF's minimums take the zero points' place (`IntArgs::code_kind`).
        let scale_buffers = |s: &Scales| -> Result<(DevBuf, Option<DevBuf>, ScaleArgs)> {
            let zeros = match (&s.zeros, &s.mins) {
                (Some(z), _) => Some(self.upload_pod(z, &what("weight_zero_point"))?),
                (None, Some(m)) => Some(self.upload_pod(m, &what("minimums"))?),
                (None, None) => None,
            };
            let scales = self.upload_pod(&s.values_f32(), &what("weight_scale"))?;
            Ok((scales, zeros, ScaleArgs::new(s.index)?))
        };
        let bf16_values;
        let mut eight_bit = None;
        let lowered = lower(w)?;
        // Split GEMMs on f16 planes scale a bf16-valued weight by a power of two that keeps
        // it exact in f16 (asked only of 16-bit values: the pass over a dense f32 weight would
        // be wasted).
        let on_split_gemm =
            self.precision.splits() && self.kernels.optional::<SplitGemm>()?.is_some();
        let f16_scale = (on_split_gemm && lowered.sixteen_bit_values(w.model_dtype))
            .then(|| lowered.f16_exact_scale())
            .flatten();
        let weight = match lowered {
            LoweredWeight::Dense { bytes, dtype, .. } => {
                bf16_values = dtype == FloatType::Bf16;
                let buf = match (bf16_values, self.weight_dt(bf16_values)) {
                    (true, Dt::Bf16) => self.upload_bytes(&bytes, &what("weight"))?,
                    // Widened on the device: half the bytes cross the bus and the host makes
                    // no pass over them (a dense bf16 8B loaded in 3 s, 42 s widened on the
                    // host; docs/decisions.md: Weights widened on the device).
                    (true, Dt::F32) => {
                        let stored = CudaTensor {
                            buf: self.upload_bytes(&bytes, &what("weight (bf16)"))?,
                            rows: out,
                            cols: n_in,
                            dtype: Dt::Bf16,
                            planes: None,
                        };
                        let wide = self.new_tensor([out, n_in], Dt::F32, &what("weight"))?;
                        let all = ColumnBlocks::single(n_in, 0, 0);
                        copy_columns::run(&self.kernels, &self.stream, &wide, &stored, all)?;
                        wide.buf
                    }
                    (false, _) => {
                        self.upload_bytes(&self.act_bytes(&dtype.widen(&bytes)), &what("weight"))?
                    }
                };
                DevWeight::Dense(buf)
            }
            LoweredWeight::PackedInt {
                bits,
                packed,
                words_per_row,
                legacy_per,
                scales,
                g_idx,
                codebook,
            } => {
                let (scales_dev, zeros, index) = scale_buffers(&scales)?;
                // IQ4's levels take the zero points' place (`IntArgs::code_kind` 2).
                let zeros = match codebook {
                    Some(levels) => Some(self.upload_pod(&levels.map(i32::from), &what("levels"))?),
                    None => zeros,
                };
                bf16_values = rounds_to_bf16(scales.dtype == FloatType::Bf16, w.model_dtype);
                let g_idx = match g_idx {
                    None => None,
                    Some(g) => Some(self.upload_pod(&g, &what("weight_g_idx"))?),
                };
                DevWeight::Int {
                    packed: self.upload_bytes(&packed, &what("weight_packed"))?,
                    scales: scales_dev,
                    zeros,
                    g_idx,
                    args: IntArgs {
                        packed: 0,
                        scales: 0,
                        zeros: 0,
                        g_idx: 0,
                        words_per_row: words_per_row as i32,
                        bits: bits as i32,
                        legacy_per: legacy_per.unwrap_or(0) as i32,
                        index,
                        scale_dt: float_code(scales.dtype) as i32,
                        model_dt,
                        code_kind: match (&scales.mins, codebook) {
                            (Some(_), _) => 1,
                            (None, Some(_)) => 2,
                            (None, None) => 0,
                        },
                    },
                }
            }
            LoweredWeight::Fp4 {
                packed,
                scales,
                group,
                scale_kind,
                ..
            } => {
                bf16_values = rounds_to_bf16(
                    !matches!(scale_kind, Fp4Scale::ModelOpt { .. } | Fp4Scale::GgmlMxfp4),
                    w.model_dtype,
                );
                DevWeight::Fp4 {
                    packed: self.upload_bytes(&packed, &what("weight_packed"))?,
                    scales: self.upload_bytes(&scales, &what("weight_scale"))?,
                    args: Fp4Args::new(scale_kind, group, model_dt),
                }
            }
            LoweredWeight::Bytes {
                weight,
                int8,
                scales,
            } => {
                let (scales_dev, zeros, index) = scale_buffers(&scales)?;
                bf16_values = rounds_to_bf16(scales.dtype == FloatType::Bf16, w.model_dtype);
                let quantizers = (w.act_quant, w.model_dtype);
                eight_bit = match self.eight_bit_kind(int8, &scales, quantizers, [out, n_in])? {
                    Some(kind) => Some(self.eight_bit_weight(
                        kind,
                        &scales,
                        out,
                        &what("weight_scale (8-bit GEMM)"),
                    )?),
                    None => None,
                };
                DevWeight::Unpacked {
                    weight: self.upload_bytes(weight, &what("weight"))?,
                    scales: scales_dev,
                    zeros,
                    args: UnpackedArgs {
                        weight: 0,
                        is_int8: int8 as i32,
                        scales: 0,
                        zeros: 0,
                        index,
                        scale_dt: float_code(scales.dtype) as i32,
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
            eight_bit,
            bf16_values,
            // A bf16-valued weight f16 cannot hold exactly (E8M0 scales) keeps the bf16-part
            // GEMMs: it is held in bf16, which split_rows_f16.cu does not read.
            f16_weight: match (on_split_gemm, bf16_values) {
                (false, _) => None,
                (true, true) => f16_scale.map(gemm::F16Weight::Scaled),
                (true, false) => Some(gemm::F16Weight::Planes),
            },
        })
    }

    /// Queues the dequantization of `w` into the scratch buffer, the step `linear` runs before
    /// its GEMM (for timing it alone; dense weights need none).
    pub fn dequantize_weight(&self, w: &CudaLinear) -> Result<()> {
        self.weight_rows(w, 0, w.out_features).map(drop)
    }

    /// Scratch buffer of at least `elems` values, grown when a larger layer appears.
    pub(super) fn scratch(&self, elems: usize) -> Result<MutexGuard<'_, Option<DevBuf>>> {
        let mut guard = self
            .scratch
            .lock()
            .map_err(|_| Error::backend("cuda", "scratch lock poisoned"))?;
        let elem = self.precision.act().bytes();
        let want = elems.max(self.largest_layer.load(Ordering::Relaxed)) * elem;
        if guard.as_ref().is_none_or(|b| b.len() < elems * elem) {
            *guard = None;
            *guard = Some(self.alloc(want, "dequantization scratch")?);
        }
        Ok(guard)
    }

    /// Rows `row0..row0 + nrows` of `w`'s weight in `weight_dt`'s type on the device: the
    /// resident buffer of a dense layer, or the scratch buffer after dequantization, straight
    /// to the f16 operand where `split_gemm.cu` takes a bf16-valued weight (`weight_f16.cu`'s
    /// pass saved).
    pub(super) fn weight_rows(
        &self,
        w: &CudaLinear,
        row0: usize,
        nrows: usize,
    ) -> Result<WeightRows<'_>> {
        let n_in = w.in_features;
        if let DevWeight::Dense(b) = &w.weight {
            let offset = row0 * n_in * self.weight_dt(w.bf16_values).bytes();
            return Ok(WeightRows {
                ptr: b.ptr() + offset as u64,
                f16: w.f16_weight,
                _scratch: None,
            });
        }
        let guard = self.scratch(nrows * n_in)?;
        let ptr = scratch_ptr(&guard)?;
        let rows = Rows { row0, nrows, n_in };
        let f16 = match w.f16_weight {
            Some(w16 @ gemm::F16Weight::Scaled(scale)) if SplitGemm::takes(n_in, w16) => {
                self.dequantize_into(w, rows, Target::f16(ptr, scale))?;
                Some(gemm::F16Weight::ScaledF16(scale))
            }
            other => {
                self.dequantize_into(w, rows, Target::one(ptr))?;
                other
            }
        };
        Ok(WeightRows {
            ptr,
            f16,
            _scratch: Some(guard),
        })
    }

    /// Queues the dequantization of `rows` of `w` to `to` (a device buffer of
    /// `rows.nrows * rows.n_in` values of `weight_dt`'s type, or f16); nothing for a dense
    /// weight.
    pub(super) fn dequantize_into(&self, w: &CudaLinear, rows: Rows, to: Target) -> Result<()> {
        let (k, s, dt) = (&self.kernels, &self.stream, self.weight_dt(w.bf16_values));
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
                dequant::int(k, s, dt, to, &a, rows)?;
            }
            DevWeight::Fp4 {
                packed,
                scales,
                args,
            } => {
                let addrs = (packed.ptr(), scales.ptr());
                dequant::fp4(k, s, dt, to, addrs, args, rows)?
            }
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
                dequant::unpacked(k, s, dt, to, &a, rows)?;
            }
        }
        Ok(())
    }

    /// Queues the dequantization of the whole of every `(weight, out)`, all of `n_out` rows of
    /// `n_in`: one launch where they share a layout (a layer's experts), else one each.
    /// Dense weights need none and are skipped.
    pub(super) fn dequantize_all(
        &self,
        ws: &[(&CudaLinear, u64)],
        n_out: usize,
        n_in: usize,
    ) -> Result<()> {
        let rows = Rows {
            row0: 0,
            nrows: n_out,
            n_in,
        };
        let ws: Vec<_> = ws
            .iter()
            .filter(|(w, _)| !matches!(w.weight, DevWeight::Dense(_)))
            .collect();
        let Some(((first, _), rest)) = ws.split_first().map(|(f, r)| (*f, r)) else {
            return Ok(());
        };
        let shared = rest.iter().all(|(w, _)| match (&first.weight, &w.weight) {
            (
                DevWeight::Int {
                    args: a,
                    zeros: za,
                    g_idx: ga,
                    ..
                },
                DevWeight::Int {
                    args: b,
                    zeros: zb,
                    g_idx: gb,
                    ..
                },
            ) => a == b && za.is_some() == zb.is_some() && ga.is_some() == gb.is_some(),
            (DevWeight::Fp4 { args: a, .. }, DevWeight::Fp4 { args: b, .. }) => {
                (a.kind, a.group, a.model_dt) == (b.kind, b.group, b.model_dt)
            }
            (
                DevWeight::Unpacked {
                    args: a, zeros: za, ..
                },
                DevWeight::Unpacked {
                    args: b, zeros: zb, ..
                },
            ) => a == b && za.is_some() == zb.is_some(),
            _ => false,
        });
        if !shared || ws.len() == 1 {
            for (w, out) in ws {
                self.dequantize_into(w, rows, Target::one(*out))?;
            }
            return Ok(());
        }
        let ptr = |b: &Option<DevBuf>| b.as_ref().map_or(0, DevBuf::ptr);
        let table: Vec<ExpertRow> = ws
            .iter()
            .map(|(w, out)| match &w.weight {
                DevWeight::Int {
                    packed,
                    scales,
                    zeros,
                    g_idx,
                    ..
                } => ExpertRow {
                    out: *out,
                    packed: packed.ptr(),
                    scales: scales.ptr(),
                    zeros: ptr(zeros),
                    g_idx: ptr(g_idx),
                    scalar: 0,
                },
                DevWeight::Fp4 {
                    packed,
                    scales,
                    args,
                } => ExpertRow {
                    out: *out,
                    packed: packed.ptr(),
                    scales: scales.ptr(),
                    scalar: u64::from(args.scalar.to_bits()),
                    ..ExpertRow::default()
                },
                DevWeight::Unpacked {
                    weight,
                    scales,
                    zeros,
                    ..
                } => ExpertRow {
                    out: *out,
                    packed: weight.ptr(),
                    scales: scales.ptr(),
                    zeros: ptr(zeros),
                    ..ExpertRow::default()
                },
                DevWeight::Dense(_) => ExpertRow::default(),
            })
            .collect();
        let dev = self.upload_pod(&table, "expert dequantization table")?;
        let to = Target::Experts {
            table: dev.ptr(),
            count: table.len(),
        };
        let (k, s, dt) = (&self.kernels, &self.stream, self.precision.act());
        match &first.weight {
            DevWeight::Dense(_) => Ok(()),
            // The layout arguments carry no addresses here (they are 0 as stored): the
            // table's are used; only the presence of zero points and g_idx matters, and it
            // is the same for all.
            DevWeight::Int {
                args, zeros, g_idx, ..
            } => {
                let a = IntArgs {
                    zeros: u64::from(zeros.is_some()),
                    g_idx: u64::from(g_idx.is_some()),
                    ..*args
                };
                dequant::int(k, s, dt, to, &a, rows)
            }
            DevWeight::Fp4 { args, .. } => dequant::fp4(k, s, dt, to, (0, 0), args, rows),
            DevWeight::Unpacked { args, .. } => dequant::unpacked(k, s, dt, to, args, rows),
        }
    }
}

/// Whether a dequantization that rounds to bf16 inside (`inner_bf16`: a bf16 scale, or a
/// format whose reference rounds its products to bf16) and then to the model dtype gives
/// only bf16 values. An f16 model's rounding could leave the bf16 grid at its range's ends.
fn rounds_to_bf16(inner_bf16: bool, model: FloatType) -> bool {
    model == FloatType::Bf16 || (inner_bf16 && model == FloatType::F32)
}
