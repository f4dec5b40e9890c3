//! A `QLinear` on the GPU, from the shared lowering (`backend::lowering`): the packed bytes
//! exactly as stored (codes, scales, g_idx), plus the little the host encodes once (zero
//! points as one byte `z + 128` per scale, the FP4 value table). A weight too large for one storage binding is split
//! into row blocks.

use std::borrow::Cow;
use std::ops::Range;

use super::device::{Gpu, GpuBuf};
use super::kernels::matmul::{Io, Shape};
use super::kernels::{matmul_dense, matmul_fp4, matmul_packed_int, matmul_unpacked8, split_rows};
use super::pipelines::MatmulSum;
use crate::backend::lowering::{
    LoweredWeight, ScaleIndex, Scales, f16_split_scale, float_code, lower,
};
use crate::checkpoint::QLinear;
use crate::numerics::ActQuant;
use crate::{Error, Result};

/// The format-specific fields of the matmul Params (their `shape` is filled per dispatch).
#[derive(Clone, Copy)]
enum Format {
    Dense(matmul_dense::Params),
    PackedInt(matmul_packed_int::Params),
    Fp4(matmul_fp4::Params),
    Unpacked8(matmul_unpacked8::Params),
}

/// How one buffer of a layer is laid out along the output rows.
enum RowSlicing {
    /// `unit_bytes` per `rows_per_unit` rows, sliced with the row blocks.
    PerRow {
        rows_per_unit: usize,
        unit_bytes: usize,
    },
    /// Read whole by every row block (per-tensor scale, g_idx, the NVFP4 table).
    Shared,
    /// Not used by this layer: the dummy buffer is bound.
    Absent,
}

struct Part<'a> {
    name: String,
    bytes: Cow<'a, [u8]>,
    layout: RowSlicing,
}

enum Slot {
    Own(GpuBuf),
    Shared(GpuBuf),
    Dummy,
}

struct Block {
    rows: Range<usize>,
    /// One slot per weight binding of the format's kernel, in binding order; shared buffers
    /// live in the first block and are referred to by index from the others.
    slots: Vec<Slot>,
}

/// Where a matmul writes: `y` with row stride `ldy`, and whether the layer's bias is added.
pub(crate) struct Dest<'a> {
    pub y: &'a wgpu::Buffer,
    pub ldy: usize,
    pub with_bias: bool,
}

pub struct WgpuLinear {
    pub(crate) name: String,
    pub(crate) out_features: usize,
    pub(crate) in_features: usize,
    pub(crate) act_quant: Option<ActQuant>,
    format: Format,
    blocks: Vec<Block>,
    bias: Option<GpuBuf>,
    /// The power of two the weights are scaled by before their f16 split (`f16_split_scale`;
    /// 1 where the split matmuls are not used).
    split_scale: f32,
    /// Whether the split weights have nonzero residuals (see `Form::WeightResidual`).
    split_residual: bool,
}

/// How a scale tensor indexed by `index` is sliced along the output rows.
fn scale_slicing(index: ScaleIndex, elem_bytes: usize) -> RowSlicing {
    if index.is_per_tensor() {
        RowSlicing::Shared
    } else {
        RowSlicing::PerRow {
            rows_per_unit: index.row_div,
            unit_bytes: index.row_stride * elem_bytes,
        }
    }
}

fn raw<'a>(name: String, bytes: &'a [u8], layout: RowSlicing) -> Part<'a> {
    Part {
        name,
        bytes: Cow::Borrowed(bytes),
        layout,
    }
}

fn absent<'a>() -> Part<'a> {
    Part {
        name: String::new(),
        bytes: Cow::Borrowed(&[]),
        layout: RowSlicing::Absent,
    }
}

/// The scale buffer and the zero points (bytes `z + 128`, sliced like the scales), or in
/// their place GGUF's f32 minimums (`has_zero` 2).
fn scale_parts<'a>(s: Scales<'a>, name: &str) -> Result<[Part<'a>; 2]> {
    let scales = Part {
        name: format!("{name} ({})", s.name),
        bytes: s.bytes,
        layout: scale_slicing(s.index, s.dtype.bytes()),
    };
    let zeros = match (&s.zeros, &s.mins) {
        (None, Some(m)) => Part {
            name: format!("{name} minimums"),
            bytes: Cow::Owned(bytemuck::cast_slice(m).to_vec()),
            layout: scale_slicing(s.index, 4),
        },
        (None, None) => absent(),
        (Some(z), _) => Part {
            name: format!("{name} zero points"),
            bytes: Cow::Owned(
                z.iter()
                    .map(|&z| {
                        u8::try_from(z + 128).map_err(|_| {
                            Error::unsupported(
                                name,
                                "zero point",
                                format!("{z} is outside -128..=127"),
                            )
                        })
                    })
                    .collect::<Result<_>>()?,
            ),
            layout: scale_slicing(s.index, 1),
        },
    };
    Ok([scales, zeros])
}

/// The per-layer buffers in binding order and the format parameters of `w` lowered as `lowered`.
fn parts<'a>(w: &QLinear<'a>, lowered: LoweredWeight<'a>) -> Result<(Format, Vec<Part<'a>>)> {
    let (n_in, name) = (w.in_features, w.name);
    let md = float_code(w.model_dtype);
    let per_row = |unit_bytes| RowSlicing::PerRow {
        rows_per_unit: 1,
        unit_bytes,
    };
    let index_params = |s: &Scales| {
        (
            s.index.row_div as u32,
            s.index.row_stride as u32,
            s.index.col_div as u32,
        )
    };
    Ok(match lowered {
        LoweredWeight::Dense {
            name: tensor,
            bytes,
            dtype,
        } => {
            let p = matmul_dense::Params {
                dtype: float_code(dtype),
                ..Default::default()
            };
            let part = Part {
                name: format!("{name} ({tensor})"),
                bytes,
                layout: per_row(n_in * dtype.bytes()),
            };
            (Format::Dense(p), vec![part])
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
            let (row_div, row_stride, col_div) = index_params(&scales);
            let p = matmul_packed_int::Params {
                bits,
                words_per_row: words_per_row as u32,
                legacy_per: legacy_per.unwrap_or(0) as u32,
                scale_dtype: float_code(scales.dtype),
                row_div,
                row_stride,
                col_div,
                has_zero: match (&scales.mins, codebook) {
                    (Some(_), _) => 2,
                    (None, Some(_)) => 3,
                    (None, None) => scales.zeros.is_some() as u32,
                },
                has_g_idx: g_idx.is_some() as u32,
                model_dtype: md,
                ..Default::default()
            };
            let g = match g_idx {
                Some(g) => Part {
                    name: format!("{name} g_idx"),
                    bytes: Cow::Owned(bytemuck::cast_slice(&g).to_vec()),
                    layout: RowSlicing::Shared,
                },
                None => absent(),
            };
            let [scale_part, mut zeros] = scale_parts(scales, name)?;
            // IQ4's levels take the zero points' place (has_zero 3), read whole.
            if let Some(levels) = codebook {
                zeros = Part {
                    name: format!("{name} levels"),
                    bytes: Cow::Owned(bytemuck::cast_slice(&levels.map(i32::from)).to_vec()),
                    layout: RowSlicing::Shared,
                };
            }
            let codes = Part {
                name: format!("{name} codes"),
                bytes: packed,
                layout: per_row(words_per_row * 4),
            };
            (Format::PackedInt(p), vec![codes, scale_part, zeros, g])
        }
        LoweredWeight::Fp4 {
            packed,
            scales,
            group,
            table,
            ..
        } => (
            Format::Fp4(matmul_fp4::Params {
                group: group as u32,
                ..Default::default()
            }),
            vec![
                Part {
                    name: format!("{name} codes"),
                    bytes: packed,
                    layout: per_row(n_in / 2),
                },
                Part {
                    name: format!("{name} scales"),
                    bytes: scales,
                    layout: per_row(n_in / group),
                },
                Part {
                    name: format!("{name} fp4 table"),
                    bytes: Cow::Owned(bytemuck::cast_slice(&table).to_vec()),
                    layout: RowSlicing::Shared,
                },
            ],
        ),
        LoweredWeight::Bytes {
            weight,
            int8,
            scales,
        } => {
            let (row_div, row_stride, col_div) = index_params(&scales);
            let p = matmul_unpacked8::Params {
                is_int8: int8 as u32,
                scale_dtype: float_code(scales.dtype),
                row_div,
                row_stride,
                col_div,
                has_zero: scales.zeros.is_some() as u32,
                model_dtype: md,
                ..Default::default()
            };
            let [scale_part, zeros] = scale_parts(scales, name)?;
            let codes = raw(format!("{name} codes"), weight, per_row(n_in));
            (Format::Unpacked8(p), vec![codes, scale_part, zeros])
        }
    })
}

/// Rows per block so that every per-row buffer of a block fits one binding.
fn rows_per_block(parts: &[Part], out: usize, max_binding: u64, what: &str) -> Result<usize> {
    let mut rows = out.max(1);
    let mut align = 1;
    for p in parts {
        match p.layout {
            RowSlicing::PerRow {
                rows_per_unit,
                unit_bytes,
            } => {
                let units = if unit_bytes == 0 {
                    usize::MAX
                } else {
                    (max_binding / unit_bytes as u64) as usize
                };
                rows = rows.min(units.saturating_mul(rows_per_unit));
                align = align.max(rows_per_unit);
            }
            RowSlicing::Shared => {
                if p.bytes.len() as u64 > max_binding {
                    return Err(Error::backend(
                        "wgpu",
                        format!(
                            "{}: {} bytes do not fit one storage binding ({max_binding} bytes)",
                            p.name,
                            p.bytes.len()
                        ),
                    ));
                }
            }
            RowSlicing::Absent => {}
        }
    }
    let rows = if rows >= out {
        out
    } else {
        rows / align * align
    };
    if rows == 0 {
        return Err(Error::backend(
            "wgpu",
            format!("{what}: one row block does not fit a storage binding of {max_binding} bytes"),
        ));
    }
    Ok(rows)
}

impl WgpuLinear {
    pub(crate) fn upload(gpu: &Gpu, w: &QLinear) -> Result<Self> {
        let lowered = lower(w)?;
        let split_scale = if gpu.coop {
            f16_split_scale(lowered.magnitude_bound())
        } else {
            1.0
        };
        // A bf16 or f16 value scaled by a power of two is its own f16 high part.
        let split_residual = !lowered.sixteen_bit_values(w.model_dtype);
        let (format, parts) = parts(w, lowered)?;
        let out = w.out_features;
        let step = rows_per_block(&parts, out, gpu.max_binding(), w.name)?;
        let mut blocks: Vec<Block> = Vec::new();
        let mut r0 = 0;
        while r0 < out || blocks.is_empty() {
            let r1 = (r0 + step).min(out);
            let mut slots = Vec::with_capacity(parts.len());
            for p in &parts {
                slots.push(match p.layout {
                    RowSlicing::Absent => Slot::Dummy,
                    RowSlicing::Shared if !blocks.is_empty() => Slot::Dummy,
                    RowSlicing::Shared => Slot::Shared(gpu.upload(&p.name, &p.bytes)?),
                    RowSlicing::PerRow {
                        rows_per_unit,
                        unit_bytes,
                    } => {
                        let a = (r0 / rows_per_unit * unit_bytes).min(p.bytes.len());
                        let b = (r1.div_ceil(rows_per_unit) * unit_bytes).min(p.bytes.len());
                        Slot::Own(gpu.upload(&p.name, &p.bytes[a..b])?)
                    }
                });
            }
            blocks.push(Block {
                rows: r0..r1,
                slots,
            });
            r0 = r1;
        }
        let bias = match w.bias_f32()? {
            Some(b) => Some(gpu.upload(&format!("{}.bias", w.name), bytemuck::cast_slice(&b))?),
            None => None,
        };
        Ok(Self {
            name: w.name.to_string(),
            out_features: out,
            in_features: w.in_features,
            act_quant: w.act_quant,
            format,
            blocks,
            bias,
            split_scale,
            split_residual,
        })
    }

    /// The buffer bound at weight binding `i` of `block` (shared ones live in block 0).
    fn buffer<'s>(&'s self, gpu: &'s Gpu, block: usize, i: usize) -> &'s wgpu::Buffer {
        match &self.blocks[block].slots[i] {
            Slot::Own(b) | Slot::Shared(b) => &b.buf,
            Slot::Dummy => match &self.blocks[0].slots[i] {
                Slot::Shared(b) => &b.buf,
                _ => &gpu.dummy,
            },
        }
    }

    /// Whether this is a plain dense table (an embedding can be gathered from it).
    pub(crate) fn dense_dtype(&self) -> Option<u32> {
        match self.format {
            Format::Dense(p) => Some(p.dtype),
            _ => None,
        }
    }

    /// Row blocks and their first weight buffer (for gathers from a dense table).
    pub(crate) fn dense_blocks<'s>(
        &'s self,
        gpu: &'s Gpu,
    ) -> impl Iterator<Item = (Range<usize>, &'s wgpu::Buffer)> + 's {
        (0..self.blocks.len()).map(move |b| (self.blocks[b].rows.clone(), self.buffer(gpu, b, 0)))
    }

    /// Whether a split matmul of this linear multiplies the high planes alone (the
    /// one-product mode); fake-quantized inputs keep the f32-grade sum: the next layer's
    /// quantizer amplifies any difference in them.
    pub(crate) fn one_product(&self, gpu: &Gpu) -> bool {
        gpu.one_product && self.act_quant.is_none()
    }

    /// `out.y[:, 0..rows.len()] = x W[rows]^T (+ bias)` for `m` rows of `x`; `f32_grade`
    /// keeps f32-grade products in the one-product mode (routers' logits, which pick experts).
    pub(crate) fn matmul(
        &self,
        gpu: &Gpu,
        x: &wgpu::Buffer,
        m: usize,
        rows: Range<usize>,
        out: Dest,
        f32_grade: bool,
    ) -> Result<()> {
        let Dest { y, ldy, with_bias } = out;
        let bias = match (&self.bias, with_bias) {
            (Some(b), true) => Some(b),
            _ => None,
        };
        // On the shader cores, fake-quantized inputs take the per-step sum: the next layer's
        // quantizer amplifies any difference in them (MatmulSum::PerStep).
        let sum = match (self.act_quant, gpu.coop) {
            (_, true) => MatmulSum::Split,
            (Some(_), false) => MatmulSum::PerStep,
            (None, false) => MatmulSum::Running,
        };
        let one_product = !f32_grade && self.one_product(gpu);
        let planes = if sum == MatmulSum::Split {
            let k = self.in_features;
            let planes = gpu.scratch(
                &format!("{} split activations", self.name),
                split_rows::planes_bytes(m, k),
            )?;
            let p = split_rows::Params {
                rows: m as u32,
                cols: k as u32,
                source_rows: m as u32,
                high_only: u32::from(one_product),
            };
            split_rows::split_rows(gpu, &p, x, &planes.buf)?;
            Some(planes)
        } else {
            None
        };
        let io = Io {
            x: planes.as_ref().map_or(x, |p| &p.buf),
            y,
            bias: bias.map_or(&gpu.dummy, |b| &b.buf),
            sum,
            weight_residual: self.split_residual,
            one_product,
        };
        for (bi, block) in self.blocks.iter().enumerate() {
            let lo = rows.start.max(block.rows.start);
            let hi = rows.end.min(block.rows.end);
            if lo >= hi {
                continue;
            }
            let shape = Shape {
                m: m as u32,
                n: (hi - lo) as u32,
                k: self.in_features as u32,
                ldy: ldy as u32,
                y_col0: (lo - rows.start) as u32,
                w_row0: (lo - block.rows.start) as u32,
                bias_row0: lo as u32,
                has_bias: bias.is_some() as u32,
                w_scale: self.split_scale,
            };
            let b = |i| self.buffer(gpu, bi, i);
            match self.format {
                Format::Dense(p) => matmul_dense::matmul_dense(
                    gpu,
                    &matmul_dense::Params { shape, ..p },
                    &io,
                    b(0),
                )?,
                Format::PackedInt(p) => matmul_packed_int::matmul_packed_int(
                    gpu,
                    &matmul_packed_int::Params { shape, ..p },
                    &io,
                    &matmul_packed_int::Weight {
                        codes: b(0),
                        scales: b(1),
                        zeros: b(2),
                        g_idx: b(3),
                    },
                )?,
                Format::Fp4(p) => matmul_fp4::matmul_fp4(
                    gpu,
                    &matmul_fp4::Params { shape, ..p },
                    &io,
                    &matmul_fp4::Weight {
                        codes: b(0),
                        scales: b(1),
                        table: b(2),
                    },
                )?,
                Format::Unpacked8(p) => matmul_unpacked8::matmul_unpacked8(
                    gpu,
                    &matmul_unpacked8::Params { shape, ..p },
                    &io,
                    &matmul_unpacked8::Weight {
                        codes: b(0),
                        scales: b(1),
                        zeros: b(2),
                    },
                )?,
            }
        }
        Ok(())
    }
}
