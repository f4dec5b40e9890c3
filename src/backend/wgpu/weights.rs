//! A `QLinear` on the GPU: the packed bytes exactly as stored (codes, scales, g_idx), plus the
//! little the host decodes once (zero points to one signed byte per scale, the NVFP4 value
//! table). A weight too large for one storage binding is split into row blocks.

use std::borrow::Cow;
use std::ops::Range;

use safetensors::Dtype;

use super::device::{Gpu, GpuBuf};
use super::kernels::matmul::{Io, Shape};
use super::kernels::{dtype_code, matmul_dense, matmul_nvfp4, matmul_packed_int, matmul_unpacked8};
use super::pipelines::MatmulSum;
use crate::checkpoint::qlinear::zero_points;
use crate::checkpoint::scheme::Strategy;
use crate::checkpoint::{Packing, QLinear, TensorRef};
use crate::numerics::{ActQuant, FloatType, e2m1_to_f32, fp8_e4m3_to_f32};
use crate::{Error, Result};

/// The format-specific fields of the matmul Params (their `shape` is filled per dispatch).
#[derive(Clone, Copy)]
enum Format {
    Dense(matmul_dense::Params),
    PackedInt(matmul_packed_int::Params),
    Nvfp4,
    Unpacked8(matmul_unpacked8::Params),
}

/// How one buffer of a layer is laid out along the output rows.
enum Layout {
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
    layout: Layout,
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
}

/// Scale layout of a strategy: (row_div, row_stride, col_div, layout of the scale tensor).
fn scale_indexing(
    s: Strategy,
    n_in: usize,
    elem_bytes: usize,
    what: &str,
) -> Result<(usize, usize, usize, Layout)> {
    Ok(match s {
        Strategy::Tensor | Strategy::Token => (1, 0, n_in.max(1), Layout::Shared),
        Strategy::Channel => (
            1,
            1,
            n_in.max(1),
            Layout::PerRow {
                rows_per_unit: 1,
                unit_bytes: elem_bytes,
            },
        ),
        Strategy::Group(g) | Strategy::TensorGroup(g) => {
            let n_groups = n_in.div_ceil(g);
            (
                1,
                n_groups,
                g,
                Layout::PerRow {
                    rows_per_unit: 1,
                    unit_bytes: n_groups * elem_bytes,
                },
            )
        }
        Strategy::Block(bh, bw) => {
            if bh == 0 || bw == 0 {
                return Err(Error::unsupported(
                    what,
                    "block_structure",
                    "a zero block size",
                ));
            }
            let ncb = n_in.div_ceil(bw);
            (
                bh,
                ncb,
                bw,
                Layout::PerRow {
                    rows_per_unit: bh,
                    unit_bytes: ncb * elem_bytes,
                },
            )
        }
    })
}

fn float_code(t: &TensorRef) -> Result<(u32, usize)> {
    let ft = FloatType::from_safetensors(t.dtype).ok_or_else(|| Error::DtypeMismatch {
        tensor: t.name.to_string(),
        expected: "F32, F16 or BF16".into(),
        found: format!("{:?}", t.dtype),
    })?;
    Ok((dtype_code(ft), ft.bytes()))
}

/// Signed zero points as bytes `z + 128`, indexed like the scales.
fn zero_bytes(values: &[i64], name: &str) -> Result<Vec<u8>> {
    values
        .iter()
        .map(|&z| {
            u8::try_from(z + 128).map_err(|_| {
                Error::unsupported(name, "zero point", format!("{z} is outside -128..=127"))
            })
        })
        .collect()
}

/// The NVFP4 value of every (scale byte, code) pair, by the reference arithmetic.
fn nvfp4_table(global_scale: f32, model: FloatType) -> Vec<u8> {
    let mut t = Vec::with_capacity(256 * 16 * 4);
    for sb in 0..=255u8 {
        // f32 division, not multiply-by-reciprocal (formats.md trap 4).
        let s_eff = fp8_e4m3_to_f32(sb) / global_scale;
        for code in 0..16u8 {
            let w = model.round(FloatType::Bf16.round(e2m1_to_f32(code) * s_eff));
            t.extend_from_slice(&w.to_le_bytes());
        }
    }
    t
}

fn raw<'a>(name: &str, t: &TensorRef<'a>, layout: Layout) -> Part<'a> {
    Part {
        name: format!("{name} ({})", t.name),
        bytes: Cow::Borrowed(t.bytes),
        layout,
    }
}

fn absent<'a>() -> Part<'a> {
    Part {
        name: String::new(),
        bytes: Cow::Borrowed(&[]),
        layout: Layout::Absent,
    }
}

/// The per-layer buffers in binding order and the format parameters.
fn parts<'a>(w: &QLinear<'a>) -> Result<(Format, Vec<Part<'a>>)> {
    let (n_in, out, name) = (w.in_features, w.out_features, w.name);
    let md = dtype_code(w.model_dtype);
    Ok(match &w.packing {
        Packing::Dense { weight } => {
            let (dtype, elem) = float_code(weight)?;
            let p = matmul_dense::Params {
                dtype,
                ..Default::default()
            };
            let layout = Layout::PerRow {
                rows_per_unit: 1,
                unit_bytes: n_in * elem,
            };
            (Format::Dense(p), vec![raw(name, weight, layout)])
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
            let (scale_dtype, elem) = float_code(scale)?;
            let (row_div, row_stride, col_div, scale_layout) =
                scale_indexing(*strategy, n_in, elem, name)?;
            let zeros = match zero_points(zero_point, *bits, out)? {
                None => absent(),
                Some(_) if matches!(strategy, Strategy::Block(..)) => {
                    return Err(Error::unsupported(
                        name,
                        "weight_zero_point",
                        "zero points with block scales",
                    ));
                }
                Some(z) => {
                    let values = z.values;
                    let layout = match scale_layout {
                        Layout::PerRow {
                            rows_per_unit,
                            unit_bytes,
                        } => Layout::PerRow {
                            rows_per_unit,
                            unit_bytes: unit_bytes / elem,
                        },
                        _ => Layout::Shared,
                    };
                    // A tensor-strategy zero point is one value for every row.
                    let values = if matches!(layout, Layout::Shared) {
                        values.into_iter().take(1).collect()
                    } else {
                        values
                    };
                    Part {
                        name: format!("{name} zero points"),
                        bytes: Cow::Owned(zero_bytes(&values, name)?),
                        layout,
                    }
                }
            };
            let p = matmul_packed_int::Params {
                bits: *bits,
                words_per_row: *words_per_row as u32,
                legacy_per: legacy_codes_per_word.unwrap_or(0) as u32,
                scale_dtype,
                row_div: row_div as u32,
                row_stride: row_stride as u32,
                col_div: col_div as u32,
                has_zero: zero_point.is_some() as u32,
                has_g_idx: g_idx.is_some() as u32,
                model_dtype: md,
                ..Default::default()
            };
            let codes = Layout::PerRow {
                rows_per_unit: 1,
                unit_bytes: words_per_row * 4,
            };
            let g = match g_idx {
                Some(g) => raw(name, g, Layout::Shared),
                None => absent(),
            };
            (
                Format::PackedInt(p),
                vec![
                    raw(name, packed, codes),
                    raw(name, scale, scale_layout),
                    zeros,
                    g,
                ],
            )
        }
        Packing::Nvfp4 {
            packed,
            scale,
            global_scale,
        } => (
            Format::Nvfp4,
            vec![
                raw(
                    name,
                    packed,
                    Layout::PerRow {
                        rows_per_unit: 1,
                        unit_bytes: n_in / 2,
                    },
                ),
                raw(
                    name,
                    scale,
                    Layout::PerRow {
                        rows_per_unit: 1,
                        unit_bytes: n_in / 16,
                    },
                ),
                Part {
                    name: format!("{name} nvfp4 table"),
                    bytes: Cow::Owned(nvfp4_table(*global_scale, w.model_dtype)),
                    layout: Layout::Shared,
                },
            ],
        ),
        Packing::Unpacked {
            weight,
            scale,
            zero_point,
            strategy,
        } => {
            let (scale_dtype, elem) = float_code(scale)?;
            let (row_div, row_stride, col_div, scale_layout) =
                scale_indexing(*strategy, n_in, elem, name)?;
            let zeros = match zero_point {
                None => absent(),
                Some(z) => Part {
                    name: format!("{name} zero points"),
                    bytes: Cow::Owned(zero_bytes(&z.to_i64()?, name)?),
                    layout: match scale_layout {
                        Layout::PerRow {
                            rows_per_unit,
                            unit_bytes,
                        } => Layout::PerRow {
                            rows_per_unit,
                            unit_bytes: unit_bytes / elem,
                        },
                        _ => Layout::Shared,
                    },
                },
            };
            let p = matmul_unpacked8::Params {
                is_int8: (weight.dtype == Dtype::I8) as u32,
                scale_dtype,
                row_div: row_div as u32,
                row_stride: row_stride as u32,
                col_div: col_div as u32,
                has_zero: zero_point.is_some() as u32,
                model_dtype: md,
                ..Default::default()
            };
            let codes = Layout::PerRow {
                rows_per_unit: 1,
                unit_bytes: n_in,
            };
            (
                Format::Unpacked8(p),
                vec![
                    raw(name, weight, codes),
                    raw(name, scale, scale_layout),
                    zeros,
                ],
            )
        }
    })
}

/// Rows per block so that every per-row buffer of a block fits one binding.
fn rows_per_block(parts: &[Part], out: usize, max_binding: u64, what: &str) -> Result<usize> {
    let mut rows = out.max(1);
    let mut align = 1;
    for p in parts {
        match p.layout {
            Layout::PerRow {
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
            Layout::Shared => {
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
            Layout::Absent => {}
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
        let (format, parts) = parts(w)?;
        let out = w.out_features;
        let step = rows_per_block(&parts, out, gpu.max_binding(), w.name)?;
        let mut blocks: Vec<Block> = Vec::new();
        let mut r0 = 0;
        while r0 < out || blocks.is_empty() {
            let r1 = (r0 + step).min(out);
            let mut slots = Vec::with_capacity(parts.len());
            for p in &parts {
                slots.push(match p.layout {
                    Layout::Absent => Slot::Dummy,
                    Layout::Shared if !blocks.is_empty() => Slot::Dummy,
                    Layout::Shared => Slot::Shared(gpu.upload(&p.name, &p.bytes)?),
                    Layout::PerRow {
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

    /// `out.y[:, 0..rows.len()] = x W[rows]^T (+ bias)` for `m` rows of `x`.
    pub(crate) fn matmul(
        &self,
        gpu: &Gpu,
        x: &wgpu::Buffer,
        m: usize,
        rows: Range<usize>,
        out: Dest,
    ) -> Result<()> {
        let Dest { y, ldy, with_bias } = out;
        let bias = match (&self.bias, with_bias) {
            (Some(b), true) => Some(b),
            _ => None,
        };
        let io = Io {
            x,
            y,
            bias: bias.map_or(&gpu.dummy, |b| &b.buf),
            sum: if self.act_quant.is_some() {
                MatmulSum::PerStep
            } else {
                MatmulSum::Running
            },
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
                Format::Nvfp4 => matmul_nvfp4::matmul_nvfp4(
                    gpu,
                    &matmul_nvfp4::Params { shape },
                    &io,
                    &matmul_nvfp4::Weight {
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
