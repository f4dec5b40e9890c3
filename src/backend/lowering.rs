//! One lowering from a checkpoint's linear layer (`QLinear`, as it lies on disk) to what a GPU
//! dequantization kernel reads, shared by the CUDA and wgpu backends: which bytes stay packed,
//! where the scale and zero point of weight `(r, c)` are, the zero points decoded to signed
//! values indexed like the scales, g_idx as group ids. A backend only encodes the result for
//! its kernels (buffers, argument structs); a new format adds a variant here, a decoder on the
//! CPU (`QLinear::dequantize`) and a decode in each backend's kernel.

use std::borrow::Cow;

use safetensors::Dtype;

use crate::checkpoint::gguf::GgmlType;
use crate::checkpoint::gguf::blocks::{
    GridBlock, IQ4_LEVELS, grid_group, grid_levels, iq4_xs_scales, q3_k_scales, scale_min_k4,
    ternary_codes, ternary_scale_at,
};
use crate::checkpoint::qlinear::{float_type, holds_e8m0, scale_values, zero_points};
use crate::checkpoint::scheme::Strategy;
use crate::checkpoint::transposed::TransposedInt;
use crate::checkpoint::{Fp4Scale, Packing, QLinear, TensorRef};
use crate::numerics::FloatType;
use crate::{Error, Result};

/// The scale (and zero point) of weight `(r, c)` is entry
/// `(r / row_div) * row_stride + group(c)` of the row-major scale tensor, where `group(c)` is
/// `g_idx[c]` where the layer has one, else `c / col_div`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScaleIndex {
    pub row_div: usize,
    pub row_stride: usize,
    pub col_div: usize,
}

impl ScaleIndex {
    /// The indexing of `strategy` for rows of `n_in` weights; `what` names the layer in errors.
    pub fn of(strategy: Strategy, n_in: usize, what: &str) -> Result<Self> {
        let (row_div, row_stride, col_div) = match strategy {
            Strategy::Tensor | Strategy::Token => (1, 0, n_in),
            Strategy::Channel => (1, 1, n_in),
            Strategy::Group(g) | Strategy::TensorGroup(g) => (1, n_in.div_ceil(g.max(1)), g),
            Strategy::Block(bh, bw) => {
                if bh == 0 || bw == 0 {
                    return Err(Error::unsupported(
                        what,
                        "block_structure",
                        "a zero block size",
                    ));
                }
                (bh, n_in.div_ceil(bw), bw)
            }
        };
        Ok(ScaleIndex {
            row_div,
            row_stride,
            col_div: col_div.max(1),
        })
    }

    /// One scale for the whole tensor.
    pub fn is_per_tensor(&self) -> bool {
        self.row_stride == 0
    }
}

/// A layer's scales and their zero points.
pub struct Scales<'a> {
    /// The tensor they come from (for messages).
    pub name: String,
    /// Row-major values of `dtype`, as stored or re-laid out by the lowering.
    pub bytes: Cow<'a, [u8]>,
    pub dtype: FloatType,
    pub index: ScaleIndex,
    /// Signed zero points, one per scale entry (one in all for a per-tensor scale); `None`
    /// when symmetric.
    pub zeros: Option<Vec<i32>>,
    /// An f32 minimum per scale entry, subtracted from `code * scale` with the codes read
    /// unsigned, no zero points (GGUF's types with a minimum: `d * q - m` as
    /// `ggml-quants.c` computes it, one rounding since `d * q` is exact); `None` otherwise.
    pub mins: Option<Vec<f32>>,
}

/// What a dequantization kernel reads, by storage format.
pub enum LoweredWeight<'a> {
    /// Plain F32/F16/BF16 `[out, in]` (a transposed layout is re-laid out to it).
    Dense {
        name: &'a str,
        bytes: Cow<'a, [u8]>,
        dtype: FloatType,
    },
    /// `pack-quantized` codes: a dense bitstream of `bits`-bit codes, or with `legacy_per`
    /// that many whole codes per 32-bit word; `words_per_row` words per output row. GPTQ and
    /// AWQ codes are re-laid out to it.
    PackedInt {
        bits: u32,
        packed: Cow<'a, [u8]>,
        words_per_row: usize,
        legacy_per: Option<usize>,
        scales: Scales<'a>,
        /// The group of every input column (act-order GPTQ), validated at load.
        g_idx: Option<Vec<i32>>,
        /// The value of each code where it is not `q - 2^(b-1)`: IQ4's 16 non-linear levels,
        /// times the scale (exact in f32), no zero points or minimums.
        codebook: Option<&'static [i8; 16]>,
    },
    /// E2M1 code pairs per byte, one scale byte per `group` inputs. A weight depends only on
    /// (scale byte, code): `table[256 * 16]` holds every value by the format's reference
    /// arithmetic, rounded to the model dtype; kernels look weights up in it or recompute them
    /// by `scale_kind`.
    Fp4 {
        packed: Cow<'a, [u8]>,
        scales: Cow<'a, [u8]>,
        group: usize,
        scale_kind: Fp4Scale,
        table: Vec<f32>,
    },
    /// One FP8 E4M3 (or INT8, `int8`) code per weight.
    Bytes {
        weight: &'a [u8],
        int8: bool,
        scales: Scales<'a>,
    },
}

/// Largest magnitude among `values`, NaN skipped (f32::max ignores it).
fn max_abs(values: impl Iterator<Item = f32>) -> f32 {
    values.fold(0.0f32, |m, v| m.max(v.abs()))
}

impl LoweredWeight<'_> {
    /// Whether every weight is a bf16 or f16 value (at most 11 significant bits): a dense
    /// 16-bit tensor, or any format dequantized to a 16-bit `model` dtype.
    pub fn sixteen_bit_values(&self, model: FloatType) -> bool {
        match self {
            LoweredWeight::Dense { dtype, .. } => *dtype != FloatType::F32,
            _ => model != FloatType::F32,
        }
    }

    /// An upper bound of the dequantized weights' magnitudes (before the model-dtype rounding,
    /// which moves it by less than one part in 2^7): from the scales and the code range, the
    /// value table, or every value of a dense tensor. For kernels that must scale the weights
    /// into a narrower type without overflow.
    pub fn magnitude_bound(&self) -> f32 {
        use rayon::prelude::*;
        let scaled = |codes: f32, s: &Scales| {
            let z = s
                .zeros
                .as_ref()
                .map_or(0.0, |z| max_abs(z.iter().map(|&z| z as f32)));
            let m = s.mins.as_ref().map_or(0.0, |m| max_abs(m.iter().copied()));
            (codes + z) * max_abs(s.values_f32().into_iter()) + m
        };
        match self {
            LoweredWeight::Dense { bytes, dtype, .. } => {
                let unit = dtype.bytes() * 16384;
                bytes
                    .par_chunks(unit)
                    .map(|c| max_abs(dtype.widen(c).into_iter()))
                    .reduce(|| 0.0, f32::max)
            }
            // Unsigned codes below a minimum reach 2^bits - 1 scales.
            LoweredWeight::PackedInt { bits, scales, .. } if scales.mins.is_some() => {
                scaled(((1u64 << bits) - 1) as f32, scales)
            }
            LoweredWeight::PackedInt {
                scales,
                codebook: Some(levels),
                ..
            } => scaled(max_abs(levels.iter().map(|&l| l as f32)), scales),
            LoweredWeight::PackedInt { bits, scales, .. } => {
                scaled((1u64 << (bits - 1)) as f32, scales)
            }
            // The table holds every scale byte's values: only those of the bytes present.
            LoweredWeight::Fp4 { table, scales, .. } => {
                let mut present = [false; 256];
                scales.iter().for_each(|&s| present[s as usize] = true);
                max_abs(
                    table
                        .chunks(16)
                        .zip(present)
                        .filter(|(_, p)| *p)
                        .flat_map(|(values, _)| values.iter().copied()),
                )
            }
            LoweredWeight::Bytes { int8, scales, .. } => {
                scaled(if *int8 { 128.0 } else { 448.0 }, scales)
            }
        }
    }

    /// A lower bound of the nonzero dequantized weights' magnitudes (infinite where every
    /// weight is zero): the smallest nonzero scale times the smallest nonzero code (1 for
    /// integers, whose zero points are integers too; 2^-9 for FP8 E4M3's subnormals), the
    /// table's smallest nonzero value, or a dense tensor's smallest nonzero value.
    pub fn magnitude_floor(&self) -> f32 {
        use rayon::prelude::*;
        let smallest = |values: &mut dyn Iterator<Item = f32>| {
            values
                .map(f32::abs)
                .filter(|v| *v > 0.0)
                .fold(f32::INFINITY, f32::min)
        };
        match self {
            LoweredWeight::Dense { bytes, dtype, .. } => bytes
                .par_chunks(dtype.bytes() * 16384)
                .map(|c| smallest(&mut dtype.widen(c).into_iter()))
                .reduce(|| f32::INFINITY, f32::min),
            // A scaled code less its minimum may come as close to zero as f32 allows.
            LoweredWeight::PackedInt { scales, .. } if scales.mins.is_some() => 0.0,
            // Integer codes (and IQ4's levels) are at least 1 where not zero.
            LoweredWeight::PackedInt { scales, .. } => {
                smallest(&mut scales.values_f32().into_iter())
            }
            LoweredWeight::Fp4 { table, scales, .. } => {
                let mut present = [false; 256];
                scales.iter().for_each(|&s| present[s as usize] = true);
                smallest(
                    &mut table
                        .chunks(16)
                        .zip(present)
                        .filter(|(_, p)| *p)
                        .flat_map(|(values, _)| values.iter().copied()),
                )
            }
            LoweredWeight::Bytes { int8, scales, .. } => {
                let code = if *int8 { 1.0 } else { 2f32.powi(-9) };
                smallest(&mut scales.values_f32().into_iter()) * code
            }
        }
    }

    /// `f16_split_scale` of the bound where every nonzero bf16-valued weight is exact in f16
    /// after it: f16 keeps bf16's 8 significant bits down to 2^-17, 2^-30 of the scaled bound's
    /// [2^13, 2^14). `None` for weights that span more (or a bound that is not finite).
    pub fn f16_exact_scale(&self) -> Option<f32> {
        let (bound, floor) = (self.magnitude_bound(), self.magnitude_floor());
        (bound.is_finite() && floor >= bound * 2f32.powi(-30)).then(|| f16_split_scale(bound))
    }
}

/// The power of two that scales weights bounded by `bound` (`magnitude_bound`) into
/// [2^13, 2^14) before they are split into f16 high parts and residuals: far from f16's
/// largest value (65504) and its subnormals (below 2^-14), so both parts keep 22 of a weight's
/// bits down to 2^-38 of the bound. 1 for a zero or non-finite bound.
pub fn f16_split_scale(bound: f32) -> f32 {
    if !(bound.is_finite() && bound > 0.0) {
        return 1.0;
    }
    let e = 13 - bound.log2().floor() as i32;
    2f32.powi(e.clamp(-126, 127))
}

/// The code of a float type in both backends' kernels (`round_to` in CUDA, `num.wgsl`).
pub fn float_code(t: FloatType) -> u32 {
    match t {
        FloatType::F32 => 0,
        FloatType::F16 => 1,
        FloatType::Bf16 => 2,
    }
}

fn narrow(values: Vec<i64>, what: &str) -> Result<Vec<i32>> {
    values
        .into_iter()
        .map(|v| {
            i32::try_from(v)
                .map_err(|_| Error::unsupported(what, "value", format!("{v} does not fit i32")))
        })
        .collect()
}

impl Scales<'_> {
    /// The scales widened to f32 (exact).
    pub fn values_f32(&self) -> Vec<f32> {
        self.dtype.widen(&self.bytes)
    }
}

fn scales<'a>(
    tensor: TensorRef<'a>,
    strategy: Strategy,
    n_in: usize,
    zeros: Option<Vec<i64>>,
    what: &str,
) -> Result<Scales<'a>> {
    let index = ScaleIndex::of(strategy, n_in, what)?;
    let zeros = match zeros {
        None => None,
        // A per-tensor zero point is one value for every row.
        Some(z) if index.is_per_tensor() => Some(narrow(z.into_iter().take(1).collect(), what)?),
        Some(z) => Some(narrow(z, what)?),
    };
    // MX E8M0 exponents become the bf16 powers of two compressed-tensors makes of them (exact,
    // 2^-127 and infinity included), so kernels read them as any bf16 scale.
    let (dtype, values) = scale_values(&tensor)?;
    let bytes = if holds_e8m0(tensor.dtype) {
        Cow::Owned(
            values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
        )
    } else {
        Cow::Borrowed(tensor.bytes)
    };
    Ok(Scales {
        dtype,
        name: tensor.name.to_string(),
        bytes,
        index,
        zeros,
        mins: None,
    })
}

/// GPTQ / AWQ codes re-laid out as `pack-quantized`: each output row a dense bitstream of
/// the unsigned codes (read as `q + 2^(b-1)`), zero points shifted by the same offset, scales
/// transposed to `[out, groups]`; g_idx kept where it is not the identity.
fn transposed<'a>(t: &TransposedInt<'a>, what: &str) -> Result<LoweredWeight<'a>> {
    let (out, n_in, b) = (t.out_features, t.in_features, t.bits);
    let u = t.zero_points()?;
    let words = t.row_major_words()?;
    let words_per_row = words.len() / out;
    let offset = 1i64 << (b - 1);
    let scale_dt = float_type(&t.scales)?;
    let by_row = t.scale_bytes_by_row()?;
    let g_idx = t
        .g_idx
        .map(|_| narrow(u.group_of.iter().map(|&g| g as i64).collect(), what))
        .transpose()?;
    Ok(LoweredWeight::PackedInt {
        bits: b,
        packed: Cow::Owned(bytemuck::cast_slice(&words).to_vec()),
        words_per_row,
        legacy_per: None,
        scales: Scales {
            name: t.scales.name.to_string(),
            bytes: Cow::Owned(by_row),
            dtype: scale_dt,
            index: ScaleIndex::of(Strategy::Group(t.group_size), n_in, what)?,
            // Symmetric GPTQ still stores zero points, all 2^(b-1): the symmetric kernel path.
            zeros: Some(narrow(
                u.zeros.into_iter().map(|z| z - offset).collect(),
                what,
            )?)
            .filter(|z| z.iter().any(|&z| z != 0)),
            mins: None,
        },
        g_idx,
        codebook: None,
    })
}

/// A GGUF linear as `pack-quantized` codes with an f32 scale per group of 16 or 32: ggml's
/// f16 scale times the sub-block's integer scale, exact in f32, so each weight is the
/// reference's product. The symmetric types (Q4_0, Q5_0, Q8_0, Q3_K, Q6_K) as signed codes
/// (`q + 2^(b-1)`); the types with a minimum (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) as unsigned
/// codes with the f32 minimum of each group (`Scales::mins`: `d * q - m`, or `d * q + m` as
/// `- (-m)`); IQ4_NL and IQ4_XS as unsigned codes that index their levels (`codebook`), and
/// so the IQ2 and IQ3 grid types, a signed level a weight (`blocks::grid_levels`); IQ1_S and
/// IQ1_M as 2-bit codes `grid + 1` with the minimum `dl * (1 - delta)` of each group; TQ1_0
/// (-1..=1) and TQ2_0 (-1..=2) as signed 2- and 3-bit codes under one scale per block.
fn gguf_codes<'a>(
    ty: GgmlType,
    blocks: &TensorRef<'a>,
    out: usize,
    n_in: usize,
) -> Result<LoweredWeight<'a>> {
    use GgmlType::*;
    let name = blocks.name;
    let (bits, group) = match ty {
        Q4_0 | Q4_1 | Q4K | Iq4Nl | Iq4Xs => (4, 32),
        Q5_0 | Q5_1 | Q5K => (5, 32),
        Q8_0 => (8, 32),
        Q3K => (3, 16),
        Q6K => (6, 16),
        Q2K => (2, 16),
        Iq2Xxs | Iq2Xs | Iq2S | Iq3Xxs | Iq3S => (4, grid_group(ty)),
        Iq1S | Iq1M => (2, grid_group(ty)),
        Tq1_0 => (2, 256),
        Tq2_0 => (3, 256),
        other => {
            return Err(Error::unsupported(
                name,
                "ggml type",
                format!("{other} on the GPU backends (--backend cpu reads it)"),
            ));
        }
    };
    let with_mins = matches!(ty, Q4_1 | Q5_1 | Q2K | Q4K | Q5K | Iq1S | Iq1M);
    let codebook = match ty {
        Iq4Nl | Iq4Xs => Some(&IQ4_LEVELS),
        Iq2Xxs | Iq2Xs | Iq2S | Iq3Xxs | Iq3S => Some(grid_levels(ty)),
        _ => None,
    };
    let (values, size) = ty.block();
    let per_block = values / group;
    let words_per_row = (n_in * bits as usize).div_ceil(32);
    let row_bytes = blocks.bytes.len() / out.max(1);
    use rayon::prelude::*;
    // Rows in parallel (an 8B model's linears re-lay in seconds): each row's codes, and its
    // scales and minimums, `groups` a row.
    let groups = n_in / group;
    let mut words = vec![0u32; out * words_per_row];
    let mut scales = vec![0f32; out * groups];
    // Zeros where the type has no minimum: dropped below.
    let mut mins = vec![0f32; out * groups];
    words
        .par_chunks_mut(words_per_row.max(1))
        .zip(scales.par_chunks_mut(groups.max(1)))
        .zip(mins.par_chunks_mut(groups.max(1)))
        .enumerate()
        .for_each(|(r, ((row, row_scales), row_mins))| {
            let mut block = GgufBlock {
                codes: [0; 256],
                scales: [0.0; 32],
                mins: [0.0; 32],
                grid: GridBlock::default(),
            };
            let row_blocks = &blocks.bytes[r * row_bytes..(r + 1) * row_bytes];
            for (k, bytes) in row_blocks.chunks_exact(size).enumerate() {
                block.split(ty, bytes);
                for (j, &code) in block.codes[..values].iter().enumerate() {
                    let bit = (k * values + j) * bits as usize;
                    let (w, off) = (bit / 32, (bit % 32) as u32);
                    row[w] |= (code as u32) << off;
                    if off + bits > 32 {
                        row[w + 1] |= (code as u32) >> (32 - off);
                    }
                }
                let at = k * per_block..(k + 1) * per_block;
                row_scales[at.clone()].copy_from_slice(&block.scales[..per_block]);
                row_mins[at].copy_from_slice(&block.mins[..per_block]);
            }
        });
    if let Some(i) = scales.iter().chain(&mins).position(|s| !s.is_finite()) {
        let v = scales
            .iter()
            .chain(&mins)
            .nth(i)
            .copied()
            .unwrap_or_default();
        return Err(Error::NonFiniteWeight {
            tensor: name.to_string(),
            index: i % scales.len() * group,
            value: v.to_string(),
        });
    }
    Ok(LoweredWeight::PackedInt {
        bits,
        packed: Cow::Owned(bytemuck::cast_slice(&words).to_vec()),
        words_per_row,
        legacy_per: None,
        scales: Scales {
            name: name.to_string(),
            bytes: Cow::Owned(bytemuck::cast_slice(&scales).to_vec()),
            dtype: FloatType::F32,
            index: ScaleIndex::of(Strategy::Group(group), n_in, name)?,
            zeros: None,
            mins: with_mins.then_some(mins),
        },
        g_idx: None,
        codebook,
    })
}

/// GGUF's MXFP4 as the FP4 layout: E2M1 codes two to a byte in value order (ggml keeps a
/// block's first 16 values in the low nibbles, the next 16 in the high ones), one E8M0 byte
/// per 32 values, ggml's arithmetic (`Fp4Scale::GgmlMxfp4`).
fn gguf_mxfp4<'a>(
    blocks: &TensorRef<'a>,
    out: usize,
    n_in: usize,
    model: FloatType,
) -> Result<LoweredWeight<'a>> {
    let table = fp4_table(Fp4Scale::GgmlMxfp4, model);
    let mut packed = vec![0u8; out * n_in / 2];
    let mut scales = vec![0u8; out * n_in / 32];
    for (i, ((b, codes), e)) in blocks
        .bytes
        .chunks_exact(17)
        .zip(packed.chunks_exact_mut(16))
        .zip(scales.iter_mut())
        .enumerate()
    {
        *e = b[0];
        let value = |v: usize| {
            let q = b[1 + v % 16];
            if v < 16 { q & 0xF } else { q >> 4 }
        };
        // A large exponent overflows the larger codes: refused as the CPU decode refuses it.
        if let Some(v) =
            (0..32).find(|&v| !table[16 * b[0] as usize + value(v) as usize].is_finite())
        {
            return Err(Error::NonFiniteWeight {
                tensor: blocks.name.to_string(),
                index: 32 * i + v,
                value: table[16 * b[0] as usize + value(v) as usize].to_string(),
            });
        }
        for (k, c) in codes.iter_mut().enumerate() {
            *c = value(2 * k) | value(2 * k + 1) << 4;
        }
    }
    Ok(LoweredWeight::Fp4 {
        packed: Cow::Owned(packed),
        scales: Cow::Owned(scales),
        group: 32,
        scale_kind: Fp4Scale::GgmlMxfp4,
        table,
    })
}

/// Every (scale byte, code) weight of an FP4 format, rounded to the model dtype.
fn fp4_table(kind: Fp4Scale, model: FloatType) -> Vec<f32> {
    (0..=255u8)
        .flat_map(|s| (0..16u8).map(move |code| model.round(kind.weight(s, code))))
        .collect()
}

/// One ggml block as codes in value order (signed types: `q + 2^(b-1)`; types with a
/// minimum: `q`; types with levels: the level's index) and its groups' scales and minimums
/// (`ggml-quants.c`'s layouts).
struct GgufBlock {
    codes: [u8; 256],
    scales: [f32; 32],
    mins: [f32; 32],
    /// The grid types' reading of the block (`blocks::GridBlock`).
    grid: GridBlock,
}

impl GgufBlock {
    fn split(&mut self, ty: GgmlType, b: &[u8]) {
        use GgmlType::*;
        let half = |at: usize| half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
        let (codes, scales, mins) = (&mut self.codes, &mut self.scales, &mut self.mins);
        match ty {
            Q4_0 | Q4_1 | Q5_0 | Q5_1 => {
                // Codes after the f16 scale (and the f16 minimum of the _1 types) and, for
                // Q5, the 32 fifth bits.
                let start = if matches!(ty, Q4_0 | Q5_0) { 2 } else { 4 };
                let (qh, qs) = match ty {
                    Q5_0 | Q5_1 => (
                        u32::from_le_bytes([b[start], b[start + 1], b[start + 2], b[start + 3]]),
                        &b[start + 4..start + 20],
                    ),
                    _ => (0, &b[start..start + 16]),
                };
                for j in 0..16 {
                    codes[j] = (qs[j] & 0xF) | (((qh >> j) & 1) << 4) as u8;
                    codes[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
                }
                scales[0] = half(0);
                if start == 4 {
                    mins[0] = -half(2);
                }
            }
            Iq4Nl | Iq4Xs => {
                // 32 values a group, the first 16 in the low nibbles: IQ4_NL's one group after
                // its f16 scale, IQ4_XS's eight (each with a six-bit scale) after the scales.
                let mut group = |g: usize, qs: &[u8], scale: f32| {
                    for (j, &q) in qs.iter().enumerate() {
                        codes[32 * g + j] = q & 0xF;
                        codes[32 * g + j + 16] = q >> 4;
                    }
                    scales[g] = scale;
                };
                if ty == Iq4Nl {
                    group(0, &b[2..18], half(0));
                } else {
                    for (g, ls) in iq4_xs_scales(b).into_iter().enumerate() {
                        group(g, &b[8 + 16 * g..24 + 16 * g], half(0) * ls as f32);
                    }
                }
            }
            Q8_0 => {
                for (c, &q) in codes.iter_mut().zip(&b[2..34]) {
                    *c = q ^ 0x80;
                }
                scales[0] = half(0);
            }
            Q6K => {
                let (ql, qh, sc, d) = (&b[0..128], &b[128..192], &b[192..208], half(208));
                for (e, code) in codes.iter_mut().enumerate() {
                    // Value e = 128 n + 32 k + l: nibble k / 2 of ql[64 n + l + 32 (k % 2)],
                    // bits 2k..2k+2 of qh[32 n + l].
                    let (n, k, l) = (e / 128, e % 128 / 32, e % 32);
                    let low = (ql[64 * n + l + 32 * (k % 2)] >> (4 * (k / 2))) & 0xF;
                    let high = (qh[32 * n + l] >> (2 * k)) & 3;
                    *code = low | high << 4;
                }
                for (s, &sc) in scales.iter_mut().zip(sc) {
                    *s = d * sc as i8 as f32;
                }
            }
            Q3K => {
                let (hmask, qs, packed, d) = (&b[0..32], &b[32..96], &b[96..108], half(108));
                for (e, code) in codes.iter_mut().enumerate() {
                    // Value e = 128 n + 32 j + l: bits 2j..2j+2 of qs[32 n + l]; its high bit
                    // (set: no -4) bit 4 n + j of hmask[l].
                    let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
                    let low = (qs[32 * n + l] >> (2 * j)) & 3;
                    let high = (hmask[l] >> (4 * n + j)) & 1;
                    *code = low | high << 2;
                }
                for (s, sc) in scales.iter_mut().zip(q3_k_scales(packed)) {
                    *s = d * sc as f32;
                }
            }
            Q2K => {
                let (sc, qs, d, dmin) = (&b[0..16], &b[16..80], half(80), half(82));
                for (e, code) in codes.iter_mut().enumerate() {
                    // Value e = 128 n + 32 j + l: bits 2j..2j+2 of qs[32 n + l].
                    let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
                    *code = (qs[32 * n + l] >> (2 * j)) & 3;
                }
                for g in 0..16 {
                    scales[g] = d * (sc[g] & 0xF) as f32;
                    mins[g] = dmin * (sc[g] >> 4) as f32;
                }
            }
            Q4K | Q5K => {
                let (d, dmin, packed) = (half(0), half(2), &b[4..16]);
                let (qh, qs) = if ty == Q5K {
                    (&b[16..48], &b[48..176])
                } else {
                    (&b[0..0], &b[16..144])
                };
                for (e, code) in codes.iter_mut().enumerate() {
                    // Value e = 64 c + 32 part + l: nibble `part` of qs[32 c + l]; for Q5_K
                    // its fifth bit is bit 2c + part of qh[l].
                    let (g, l) = (e / 32, e % 32);
                    let low = (qs[32 * (g / 2) + l] >> (4 * (g % 2))) & 0xF;
                    let high = if qh.is_empty() { 0 } else { (qh[l] >> g) & 1 };
                    *code = low | high << 4;
                }
                for g in 0..8 {
                    let (sc, m) = scale_min_k4(g, packed);
                    scales[g] = d * sc;
                    mins[g] = dmin * m;
                }
            }
            Tq1_0 | Tq2_0 => {
                let mut q = [0i8; 256];
                ternary_codes(ty, b, &mut q);
                // Signed codes `q + 2^(bits - 1)` for the 2 and 3 bits chosen above.
                let bias = if ty == Tq1_0 { 2 } else { 4 };
                for (c, q) in codes.iter_mut().zip(q) {
                    *c = (q + bias) as u8;
                }
                scales[0] = half(ternary_scale_at(ty));
            }
            Iq2Xxs | Iq2Xs | Iq2S | Iq3Xxs | Iq3S | Iq1S | Iq1M => {
                let grid = &mut self.grid;
                grid.split(ty, b);
                codes.copy_from_slice(&grid.codes);
                scales.copy_from_slice(&grid.scales);
                if matches!(ty, Iq1S | Iq1M) {
                    // dl * (grid + delta) = dl * (grid + 1) - dl * (1 - delta), every term
                    // exact in f32 (dl has at most 15 significant bits, 1 - delta 4).
                    for ((m, s), delta) in mins.iter_mut().zip(&grid.scales).zip(&grid.deltas) {
                        *m = s * (1.0 - delta);
                    }
                }
            }
            _ => unreachable!("gguf_codes lowers these types only"),
        }
    }
}

/// Columns `first..first + cols` of `rows x width` elements of `elem` bytes, row-major, as
/// `cols x rows`.
fn transpose(
    bytes: &[u8],
    rows: usize,
    (first, cols, width): (usize, usize, usize),
    elem: usize,
) -> Vec<u8> {
    let mut out = vec![0u8; rows * cols * elem];
    for r in 0..rows {
        for c in 0..cols {
            let (from, to) = ((r * width + first + c) * elem, (c * rows + r) * elem);
            out[to..to + elem].copy_from_slice(&bytes[from..from + elem]);
        }
    }
    out
}

/// Lowers `w`'s weight for a GPU kernel.
pub fn lower<'a>(w: &QLinear<'a>) -> Result<LoweredWeight<'a>> {
    let (n_in, out, name) = (w.in_features, w.out_features, w.name);
    Ok(match &w.packing {
        Packing::Dense { weight, transposed } => {
            let dtype = float_type(weight)?;
            let bytes = match *transposed {
                Some(first) => {
                    let columns = (first, out, weight.shape[1]);
                    Cow::Owned(transpose(weight.bytes, n_in, columns, dtype.bytes()))
                }
                None => Cow::Borrowed(weight.bytes),
            };
            LoweredWeight::Dense {
                name: weight.name,
                bytes,
                dtype,
            }
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
            let zeros = zero_points(zero_point, *bits, out)?.map(|z| z.values);
            if zeros.is_some() && matches!(strategy, Strategy::Block(..)) {
                return Err(Error::unsupported(
                    name,
                    "weight_zero_point",
                    "zero points with block scales",
                ));
            }
            LoweredWeight::PackedInt {
                bits: *bits,
                packed: Cow::Borrowed(packed.bytes),
                words_per_row: *words_per_row,
                legacy_per: *legacy_codes_per_word,
                scales: scales(*scale, *strategy, n_in, zeros, name)?,
                g_idx: g_idx.map(|g| narrow(g.to_i64()?, g.name)).transpose()?,
                codebook: None,
            }
        }
        Packing::Fp4 {
            packed,
            scale,
            group,
            scale_kind,
        } => LoweredWeight::Fp4 {
            packed: Cow::Borrowed(packed.bytes),
            scales: Cow::Borrowed(scale.bytes),
            group: *group,
            scale_kind: *scale_kind,
            table: fp4_table(*scale_kind, w.model_dtype),
        },
        Packing::Transposed(t) => transposed(t, name)?,
        Packing::Gguf {
            ty: GgmlType::Mxfp4,
            blocks,
        } => gguf_mxfp4(blocks, out, n_in, w.model_dtype)?,
        Packing::Gguf { ty, blocks } => gguf_codes(*ty, blocks, out, n_in)?,
        Packing::Unpacked {
            weight,
            scale,
            zero_point,
            strategy,
        } => LoweredWeight::Bytes {
            weight: weight.bytes,
            int8: weight.dtype == Dtype::I8,
            scales: scales(
                *scale,
                *strategy,
                n_in,
                zero_point.map(|z| z.to_i64()).transpose()?,
                name,
            )?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_index_matches_each_strategy_layout() {
        let at = |s, r: usize, c: usize| {
            let i = ScaleIndex::of(s, 100, "t").unwrap();
            (r / i.row_div) * i.row_stride + c / i.col_div
        };
        assert_eq!(at(Strategy::Tensor, 7, 99), 0);
        assert_eq!(at(Strategy::Channel, 7, 99), 7);
        // Groups of 32 over 100 inputs: 4 per row, the last one short.
        assert_eq!(at(Strategy::Group(32), 2, 99), 2 * 4 + 3);
        // Blocks of 16 x 32: row 37 is in block row 2, column 70 in block column 2 of 4.
        assert_eq!(at(Strategy::Block(16, 32), 37, 70), 2 * 4 + 2);
        assert!(ScaleIndex::of(Strategy::Block(0, 32), 100, "t").is_err());
    }

    /// GGUF's types lowered to codes, group scales and minimums (or IQ4's and the grid types'
    /// levels), decoded as the kernels do (`dequant.cu`, `matmul_packed_int.wgsl`), equal gguf-py's `dequantize`
    /// bit for bit.
    #[test]
    fn gguf_lowering_decodes_as_gguf_py() {
        use crate::checkpoint::gguf::blocks::reference_blocks;
        for (ty, blocks, want) in reference_blocks() {
            if ty.is_float() || ty == GgmlType::Mxfp4 {
                continue;
            }
            let shape = [1, want.len()];
            let t = TensorRef {
                name: "t",
                dtype: Dtype::U8,
                shape: &shape,
                bytes: &blocks,
            };
            let lowered = gguf_codes(ty, &t, 1, want.len()).unwrap();
            let LoweredWeight::PackedInt {
                bits,
                packed,
                scales,
                codebook,
                ..
            } = lowered
            else {
                panic!("{ty}: not packed codes");
            };
            let words: Vec<u32> = packed
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let s = scales.values_f32();
            for (c, w) in want.iter().enumerate() {
                let code = crate::checkpoint::qlinear::extract_code(&words, c, bits, None);
                let si = c / scales.index.col_div;
                let got = match (&scales.mins, codebook) {
                    (Some(m), _) => code as f32 * s[si] - m[si],
                    (None, Some(levels)) => levels[code as usize] as f32 * s[si],
                    (None, None) => (code as i32 - (1 << (bits - 1))) as f32 * s[si],
                };
                // IQ1 under a zero scale: `0 * (u + 1) - 0` is +0 where `0 * (grid + delta)`
                // is -0 for a negative level; the same zero in any sum.
                let iq1_zero = matches!(ty, GgmlType::Iq1S | GgmlType::Iq1M) && got == 0.0;
                assert!(
                    got.to_bits() == w.to_bits() || (iq1_zero && *w == 0.0),
                    "{ty} value {c}: {got} against {w}"
                );
            }
        }
    }

    /// GGUF's MXFP4 re-laid out as FP4 codes and E8M0 bytes, looked up in the value table as
    /// the kernels do, equals gguf-py's `dequantize` bit for bit where its values are finite;
    /// a block whose exponent overflows a code is refused, as on the CPU.
    #[test]
    fn gguf_mxfp4_lowers_as_gguf_py() {
        use crate::checkpoint::gguf::blocks::reference_blocks;
        let (_, blocks, want) = reference_blocks()
            .into_iter()
            .find(|(ty, ..)| *ty == GgmlType::Mxfp4)
            .unwrap();
        let lowered = |bytes: &[u8]| {
            let shape = [1, bytes.len() / 17 * 32];
            let t = TensorRef {
                name: "t",
                dtype: Dtype::U8,
                shape: &shape,
                bytes,
            };
            gguf_mxfp4(&t, 1, shape[1], FloatType::F32).map(|w| match w {
                LoweredWeight::Fp4 {
                    packed,
                    scales,
                    table,
                    ..
                } => (packed.into_owned(), scales.into_owned(), table),
                _ => panic!("MXFP4 lowered to another layout"),
            })
        };
        let mut overflowing = 0;
        for (b, want) in blocks.chunks_exact(17).zip(want.chunks_exact(32)) {
            if want.iter().any(|v| !v.is_finite()) {
                assert!(lowered(b).is_err());
                overflowing += 1;
                continue;
            }
            let (packed, scales, table) = lowered(b).unwrap();
            for (c, w) in want.iter().enumerate() {
                let code = (packed[c / 2] >> (4 * (c % 2))) & 0xF;
                let got = table[16 * scales[0] as usize + code as usize];
                assert_eq!(got.to_bits(), w.to_bits(), "value {c}: {got} against {w}");
            }
        }
        assert!(
            overflowing > 0,
            "the hard blocks hold an overflowing exponent"
        );
    }
}
