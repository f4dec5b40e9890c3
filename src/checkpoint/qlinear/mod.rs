//! A linear layer exactly as it lies on disk (packed codes, scales, zero points), plus the
//! reference dequantization of docs/formats.md that every backend must reproduce.
//!
//! Reading each format from the store is `read.rs`; the decode here keeps its own scale
//! indexing, independent of the GPU lowering (`backend::lowering`), so the bit-exact checks
//! compare two implementations.

use safetensors::Dtype;

use super::gguf::GgmlType;
use super::scheme::Strategy;
use super::store::TensorRef;
use super::transposed::{Layout, TransposedInt};
use crate::numerics::{ActQuant, FloatType, e2m1_to_f32, e8m0_to_f32, fp8_e4m3_to_f32};
use crate::{Error, Result};

mod read;

/// How the weight of one linear is stored.
#[derive(Clone, Copy)]
pub enum Packing<'a> {
    /// Plain F32/F16/BF16 `[out, in]`; or, `transposed: Some(first)`, `out` columns from
    /// `first` on of a stored `[in, width]` matrix (gpt-oss's dense experts, `x @ W` in its
    /// modeling code: all of them; Qwen3-VL-MoE's experts: a half of the fused gate/up).
    Dense {
        weight: TensorRef<'a>,
        transposed: Option<usize>,
    },
    /// compressed-tensors `pack-quantized`: unsigned codes `q + 2^(b-1)` packed along `in`.
    PackedInt {
        bits: u32,
        packed: TensorRef<'a>,
        /// u32 words per row; `in*b/32` rounded up (dense bitstream).
        words_per_row: usize,
        /// `Some(codes per word)` for the pre-2026 layout of 3/5/6/7-bit codes.
        legacy_codes_per_word: Option<usize>,
        scale: TensorRef<'a>,
        zero_point: Option<ZeroPoint<'a>>,
        strategy: Strategy,
        g_idx: Option<TensorRef<'a>>,
    },
    /// Two E2M1 codes per byte (low nibble first), one scale byte per `group` inputs:
    /// `nvfp4-pack-quantized`, ModelOpt NVFP4, `mxfp4-pack-quantized`.
    Fp4 {
        packed: TensorRef<'a>,
        scale: TensorRef<'a>,
        group: usize,
        scale_kind: Fp4Scale,
    },
    /// GPTQ / AutoAWQ integer codes, stored transposed (`checkpoint::transposed`).
    Transposed(TransposedInt<'a>),
    /// llama.cpp's ggml blocks (a GGUF tensor), each row `in / block` whole blocks.
    Gguf { ty: GgmlType, blocks: TensorRef<'a> },
    /// `float-quantized` / `int-quantized` / `naive-quantized`: one F8 or I8 code per weight.
    Unpacked {
        weight: TensorRef<'a>,
        scale: TensorRef<'a>,
        zero_point: Option<TensorRef<'a>>,
        strategy: Strategy,
    },
}

/// What an FP4 layer's scale byte means, and the arithmetic of each format's reference decode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fp4Scale {
    /// compressed-tensors NVFP4: FP8 E4M3 divided by the global scale (an f32 division, not
    /// a multiply by its reciprocal: formats.md trap 4), the product rounded to bf16.
    Nvfp4 { global_scale: f32 },
    /// ModelOpt NVFP4: `f32(FP8) * weight_scale_2` and the product in f32
    /// (`NVFP4QTensor.dequantize`), rounded only to the model dtype.
    ModelOpt { scale_2: f32 },
    /// MX (OCP E8M0): `2^(e - 127)` as compressed-tensors' `decompress_mx_scale` makes it in
    /// bf16 (e = 255 is infinite), the product rounded to bf16.
    E8m0,
    /// GGUF's MXFP4: E8M0 bytes as ggml reads them, twice the E2M1 value times `2^(e - 128)`
    /// (`kvalues_mxfp4`, `GGML_E8M0_TO_FP32_HALF`: byte 255 is finite), the product in f32.
    GgmlMxfp4,
}

impl Fp4Scale {
    /// Whether the scale bytes are E8M0 exponents (no scalar beside them).
    pub fn is_e8m0(self) -> bool {
        matches!(self, Fp4Scale::E8m0 | Fp4Scale::GgmlMxfp4)
    }

    /// The weight of E2M1 `code` under scale byte `scale`, before the model-dtype rounding.
    pub fn weight(self, scale: u8, code: u8) -> f32 {
        let e = e2m1_to_f32(code);
        match self {
            Fp4Scale::Nvfp4 { global_scale } => {
                FloatType::Bf16.round(e * (fp8_e4m3_to_f32(scale) / global_scale))
            }
            Fp4Scale::ModelOpt { scale_2 } => e * (fp8_e4m3_to_f32(scale) * scale_2),
            Fp4Scale::E8m0 => FloatType::Bf16.round(e * e8m0_to_f32(scale)),
            Fp4Scale::GgmlMxfp4 => crate::checkpoint::gguf::blocks::mxfp4_value(scale, code),
        }
    }
}

/// Asymmetric zero points: I32 packed along `out` (current), or unpacked I8 (pre-2025-04).
#[derive(Clone, Copy)]
pub enum ZeroPoint<'a> {
    PackedAlongOut(TensorRef<'a>),
    Unpacked(TensorRef<'a>),
}

#[derive(Clone, Copy)]
pub struct QLinear<'a> {
    pub name: &'a str,
    pub out_features: usize,
    pub in_features: usize,
    pub packing: Packing<'a>,
    pub bias: Option<TensorRef<'a>>,
    pub act_quant: Option<ActQuant>,
    /// The model dtype: quantized weights are rounded to it before being widened.
    pub model_dtype: FloatType,
}

impl<'a> QLinear<'a> {
    /// An error naming the first NaN or infinity among this linear's stored floats (dense
    /// weights, FP8 codes, scales, global scales, bias, static activation scales): such a
    /// checkpoint is damaged, and would otherwise print a number or fail far from the cause.
    pub fn check_finite(&self) -> Result<()> {
        let scalar = |what: &str, v: f32| {
            if v.is_finite() && v != 0.0 {
                Ok(())
            } else {
                Err(Error::NonFiniteWeight {
                    tensor: format!("{}.{what}", self.name),
                    index: 0,
                    value: v.to_string(),
                })
            }
        };
        let mut floats: Vec<(TensorRef, bool)> = self.bias.iter().map(|b| (*b, false)).collect();
        match &self.packing {
            Packing::Dense { weight, .. } => floats.push((*weight, false)),
            Packing::PackedInt { scale, .. } => floats.push((*scale, false)),
            Packing::Fp4 {
                scale, scale_kind, ..
            } => {
                floats.push((*scale, scale_kind.is_e8m0()));
                match *scale_kind {
                    Fp4Scale::Nvfp4 { global_scale } => {
                        scalar("weight_global_scale", global_scale)?
                    }
                    Fp4Scale::ModelOpt { scale_2 } => scalar("weight_scale_2", scale_2)?,
                    Fp4Scale::E8m0 | Fp4Scale::GgmlMxfp4 => {}
                }
            }
            Packing::Transposed(t) => floats.push((t.scales, false)),
            // The blocks' f16 scales are checked where they are decoded (`dequantize_rows`).
            Packing::Gguf { .. } => {}
            Packing::Unpacked { weight, scale, .. } => {
                floats.push((*weight, false));
                // MXFP8 keeps E8M0 scale bytes.
                floats.push((*scale, true));
            }
        }
        for (t, e8m0) in floats {
            t.check_finite(e8m0)?;
        }
        match self.act_quant {
            Some(ActQuant::Fp8Static { scale }) => scalar("input_scale", scale),
            Some(ActQuant::Nvfp4 { global_scale }) => scalar("input_global_scale", global_scale),
            _ => Ok(()),
        }
    }

    /// Storage bits per weight (codes, scales, zero points, g_idx), the way quantizers quote it.
    pub fn bits_per_weight(&self) -> f64 {
        let bytes: usize = match &self.packing {
            // A transposed linear may take some of its matrix's columns.
            Packing::Dense {
                weight,
                transposed: Some(_),
            } => weight.bytes.len() / weight.shape[1].max(1) * self.out_features,
            Packing::Dense { weight, .. } => weight.bytes.len(),
            Packing::PackedInt {
                packed,
                scale,
                zero_point,
                g_idx,
                ..
            } => {
                packed.bytes.len()
                    + scale.bytes.len()
                    + zero_point.map_or(0, |z| match z {
                        ZeroPoint::PackedAlongOut(t) | ZeroPoint::Unpacked(t) => t.bytes.len(),
                    })
                    + g_idx.map_or(0, |g| g.bytes.len())
            }
            Packing::Fp4 {
                packed,
                scale,
                scale_kind,
                ..
            } => packed.bytes.len() + scale.bytes.len() + if scale_kind.is_e8m0() { 0 } else { 4 },
            Packing::Transposed(t) => t.stored_bytes(),
            Packing::Gguf { blocks, .. } => blocks.bytes.len(),
            Packing::Unpacked {
                weight,
                scale,
                zero_point,
                ..
            } => weight.bytes.len() + scale.bytes.len() + zero_point.map_or(0, |z| z.bytes.len()),
        };
        bytes as f64 * 8.0 / (self.out_features * self.in_features) as f64
    }

    /// Bytes this layer occupies as stored (what a backend keeps resident).
    pub fn stored_bytes(&self) -> u64 {
        (self.bits_per_weight() * (self.out_features * self.in_features) as f64 / 8.0) as u64
            + self.bias.map_or(0, |b| b.bytes.len() as u64)
    }

    /// A short description, e.g. `int4 group128 sym` or `nvfp4`.
    pub fn scheme_label(&self) -> String {
        let weights = match &self.packing {
            Packing::Dense { weight, .. } => format!("dense {:?}", weight.dtype).to_lowercase(),
            Packing::PackedInt {
                bits,
                strategy,
                zero_point,
                g_idx,
                ..
            } => format!(
                "int{bits} {}{}{}",
                strategy_label(strategy),
                if zero_point.is_some() {
                    " asym"
                } else {
                    " sym"
                },
                if g_idx.is_some() { " g_idx" } else { "" }
            ),
            Packing::Fp4 { scale_kind, .. } => match scale_kind {
                Fp4Scale::Nvfp4 { .. } => "nvfp4",
                Fp4Scale::ModelOpt { .. } => "modelopt nvfp4",
                Fp4Scale::E8m0 => "mxfp4",
                Fp4Scale::GgmlMxfp4 => "gguf MXFP4",
            }
            .to_string(),
            Packing::Transposed(t) => format!(
                "{} int{} group{}{}",
                match t.layout {
                    Layout::Gptq { v2: false } => "gptq",
                    Layout::Gptq { v2: true } => "gptq_v2",
                    Layout::Awq => "awq",
                    Layout::AwqGemv => "awq-gemv",
                },
                t.bits,
                t.group_size,
                if t.g_idx.is_some() { " g_idx" } else { "" }
            ),
            Packing::Gguf { ty, .. } => format!("gguf {ty}"),
            Packing::Unpacked {
                weight,
                scale,
                strategy,
                ..
            } => format!(
                "{} {}",
                match (weight.dtype, scale.dtype) {
                    (Dtype::I8, _) => "int8",
                    (_, Dtype::U8) => "mxfp8",
                    (_, Dtype::F8_E8M0) => "fp8-e4m3 (e8m0 scales)",
                    _ => "fp8-e4m3",
                },
                strategy_label(strategy)
            ),
        };
        let act = match self.act_quant {
            None => "",
            Some(ActQuant::Fp8PerToken) => " + fp8 act/token",
            Some(ActQuant::Fp8Static { .. }) => " + fp8 act/static",
            Some(ActQuant::IntPerToken { bits: 8 }) => " + int8 act/token",
            Some(ActQuant::IntPerToken { .. }) => " + int act/token",
            Some(ActQuant::Nvfp4 { .. }) => " + nvfp4 act",
            Some(ActQuant::Fp8PerTokenGroup { .. }) => " + fp8 act/token-group",
            Some(ActQuant::Fp8Group { .. }) => " + fp8 act/group",
            Some(ActQuant::Fp8Pow2Group { .. }) => " + fp8 act/group, power-of-two scales",
            Some(ActQuant::Mx { bits: 4 }) => " + mxfp4 act",
            Some(ActQuant::Mx { .. }) => " + mxfp8 act",
        };
        weights + act
    }

    /// Reference dequantization of rows `rows` into `out` (row-major, `in_features` wide):
    /// the exact values compressed-tensors' `decompress` produces, widened to f32.
    pub fn dequantize_rows(&self, rows: std::ops::Range<usize>, out: &mut [f32]) -> Result<()> {
        let n_in = self.in_features;
        debug_assert_eq!(out.len(), rows.len() * n_in);
        let md = self.model_dtype;
        match &self.packing {
            Packing::Dense {
                weight,
                transposed: Some(first),
            } => {
                let all = weight.to_f32()?;
                let width = weight.shape[1];
                for (row, r) in out.chunks_exact_mut(n_in).zip(rows) {
                    for (c, v) in row.iter_mut().enumerate() {
                        *v = all[c * width + first + r];
                    }
                }
            }
            Packing::Dense { weight, .. } => {
                let elem = weight.bytes.len() / (self.out_features * n_in);
                let slice = TensorRef {
                    bytes: &weight.bytes[rows.start * n_in * elem..rows.end * n_in * elem],
                    ..*weight
                };
                out.copy_from_slice(&slice.to_f32()?);
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
                let b = *bits;
                let offset = 1i64 << (b - 1);
                let scale_dt = float_type(scale)?;
                let scales = scale.to_f32()?;
                let zeros = zero_points(zero_point, b, self.out_features)?;
                let g_idx = g_idx.map(|g| g.to_i64()).transpose()?;
                let words = packed.to_u32_words()?;
                for (i, r) in rows.clone().enumerate() {
                    let row_words = &words[r * words_per_row..(r + 1) * words_per_row];
                    for c in 0..n_in {
                        let code = extract_code(row_words, c, b, *legacy_codes_per_word) as i64;
                        let q = code - offset;
                        let (si, zi) = scale_index(*strategy, r, c, n_in, g_idx.as_deref());
                        let z = zeros.as_ref().map_or(0, |z| z.get(r, zi));
                        let w = scale_dt.round(((q - z) as f32) * scales[si]);
                        out[i * n_in + c] = md.round(w);
                    }
                }
            }
            Packing::Fp4 {
                packed,
                scale,
                group,
                scale_kind,
            } => {
                let codes = packed.bytes;
                let half_in = n_in / 2;
                let groups = n_in / group;
                for (i, r) in rows.clone().enumerate() {
                    for c in 0..n_in {
                        let byte = codes[r * half_in + c / 2];
                        let code = if c % 2 == 0 { byte & 0xF } else { byte >> 4 };
                        let s = scale.bytes[r * groups + c / group];
                        out[i * n_in + c] = md.round(scale_kind.weight(s, code));
                    }
                }
            }
            Packing::Transposed(t) => t.dequantize_rows(rows, md, out)?,
            Packing::Gguf { ty, blocks } => {
                let row_bytes = blocks.bytes.len() / self.out_features;
                let bytes = &blocks.bytes[rows.start * row_bytes..rows.end * row_bytes];
                if !ty.decode(bytes, out) {
                    return Err(Error::unsupported(
                        blocks.name,
                        "ggml type",
                        format!("{ty} (not decoded by quantppl yet)"),
                    ));
                }
                if let Some(i) = out.iter().position(|v| !v.is_finite()) {
                    return Err(Error::NonFiniteWeight {
                        tensor: blocks.name.to_string(),
                        index: rows.start * n_in + i,
                        value: out[i].to_string(),
                    });
                }
                for v in out.iter_mut() {
                    *v = md.round(*v);
                }
            }
            Packing::Unpacked {
                weight,
                scale,
                zero_point,
                strategy,
            } => {
                let (scale_dt, scales) = scale_values(scale)?;
                let zeros = zero_point.map(|z| z.to_i64()).transpose()?;
                for (i, r) in rows.clone().enumerate() {
                    for c in 0..n_in {
                        let raw = weight.bytes[r * n_in + c];
                        let v = if weight.dtype == Dtype::I8 {
                            raw as i8 as f32
                        } else {
                            fp8_e4m3_to_f32(raw)
                        };
                        let (si, _) = scale_index(*strategy, r, c, n_in, None);
                        let z = zeros.as_ref().map_or(0.0, |z| z[si] as f32);
                        out[i * n_in + c] = md.round(scale_dt.round((v - z) * scales[si]));
                    }
                }
            }
        }
        Ok(())
    }

    /// The whole weight `[out, in]`, dequantized.
    pub fn dequantize(&self) -> Result<Vec<f32>> {
        let mut w = vec![0f32; self.out_features * self.in_features];
        self.dequantize_rows(0..self.out_features, &mut w)?;
        Ok(w)
    }

    pub fn bias_f32(&self) -> Result<Option<Vec<f32>>> {
        self.bias.map(|b| b.to_f32()).transpose()
    }
}

fn strategy_label(s: &Strategy) -> String {
    match s {
        Strategy::Tensor => "tensor".into(),
        Strategy::Channel => "channel".into(),
        Strategy::Group(g) | Strategy::TensorGroup(g) => format!("group{g}"),
        Strategy::Block(a, b) => format!("block{a}x{b}"),
        Strategy::Token => "token".into(),
    }
}

/// A scale tensor's values and the type its products are rounded to: float scales as stored;
/// U8 scales are MX E8M0 exponents, which compressed-tensors widens to bf16.
pub(crate) fn scale_values(t: &TensorRef) -> Result<(FloatType, Vec<f32>)> {
    if holds_e8m0(t.dtype) {
        return Ok((
            FloatType::Bf16,
            t.bytes.iter().map(|&e| e8m0_to_f32(e)).collect(),
        ));
    }
    Ok((float_type(t)?, t.to_f32()?))
}

/// Whether a scale tensor's bytes are E8M0 exponents: safetensors' `F8_E8M0` (DeepSeek-V4's
/// scales), or the `U8` compressed-tensors keeps MX scales in.
pub(crate) fn holds_e8m0(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::U8 | Dtype::F8_E8M0)
}

/// The float type of a scale or weight tensor, or an error naming it.
pub(crate) fn float_type(t: &TensorRef) -> Result<FloatType> {
    FloatType::from_safetensors(t.dtype).ok_or_else(|| Error::DtypeMismatch {
        tensor: t.name.to_string(),
        expected: "F32, F16 or BF16".into(),
        found: format!("{:?}", t.dtype),
    })
}

/// Code `c` of a row: a dense LSB-first bitstream, or `per` codes per word (legacy 3/5/6/7-bit).
pub(crate) fn extract_code(row: &[u32], c: usize, bits: u32, legacy_per: Option<usize>) -> u32 {
    let mask = (1u32 << bits) - 1;
    if let Some(per) = legacy_per {
        return (row[c / per] >> (bits as usize * (c % per))) & mask;
    }
    let bit = c * bits as usize;
    let (w, off) = (bit / 32, (bit % 32) as u32);
    let mut v = row[w] >> off;
    if off + bits > 32 {
        v |= row[w + 1] << (32 - off);
    }
    v & mask
}

/// (scale index, group index) of weight `(r, c)` for a strategy.
fn scale_index(
    s: Strategy,
    r: usize,
    c: usize,
    n_in: usize,
    g_idx: Option<&[i64]>,
) -> (usize, usize) {
    match s {
        Strategy::Tensor | Strategy::Token => (0, 0),
        Strategy::Channel => (r, 0),
        Strategy::Group(g) | Strategy::TensorGroup(g) => {
            let n_groups = n_in.div_ceil(g);
            let gi = g_idx.map_or(c / g, |idx| idx[c] as usize);
            (r * n_groups + gi, gi)
        }
        Strategy::Block(bh, bw) => {
            let ncb = n_in.div_ceil(bw);
            let i = (r / bh) * ncb + c / bw;
            (i, i)
        }
    }
}

pub(crate) struct Zeros {
    /// Signed zero points, `[out, n_groups]` row-major (or a single value).
    pub(crate) values: Vec<i64>,
    pub(crate) n_groups: usize,
}

impl Zeros {
    fn get(&self, r: usize, g: usize) -> i64 {
        if self.values.len() == 1 {
            self.values[0]
        } else {
            self.values[r * self.n_groups + g]
        }
    }
}

/// Unpacks the zero points of a packed-int layer (GPU backends upload the result).
pub(crate) fn zero_points(
    zp: &Option<ZeroPoint>,
    bits: u32,
    n_out: usize,
) -> Result<Option<Zeros>> {
    let Some(zp) = zp else { return Ok(None) };
    Ok(Some(match zp {
        ZeroPoint::Unpacked(t) => {
            let values = t.to_i64()?;
            let n_groups = if values.len() == 1 {
                1
            } else {
                values.len() / n_out
            };
            Zeros { values, n_groups }
        }
        ZeroPoint::PackedAlongOut(t) => {
            let words = t.to_u32_words()?;
            let n_groups = t.shape[1];
            let per = (32 / bits) as usize;
            let mask = (1u32 << bits) - 1;
            let offset = 1i64 << (bits - 1);
            let mut values = vec![0i64; n_out * n_groups];
            for r in 0..n_out {
                for g in 0..n_groups {
                    let w = words[(r / per) * n_groups + g];
                    let zu = (w >> (bits as usize * (r % per))) & mask;
                    values[r * n_groups + g] = zu as i64 - offset;
                }
            }
            Zeros { values, n_groups }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_bitstream_codes_straddle_words() {
        // 3-bit codes 0..=7 repeated; code 10 occupies bits 30..33 and straddles two words.
        let codes: Vec<u32> = (0..21).map(|i| i % 8).collect();
        let mut words = vec![0u32; 2];
        for (c, &v) in codes.iter().enumerate() {
            let bit = c * 3;
            words[bit / 32] |= v << (bit % 32);
            if bit % 32 + 3 > 32 {
                words[bit / 32 + 1] |= v >> (32 - bit % 32);
            }
        }
        for (c, &v) in codes.iter().enumerate() {
            assert_eq!(extract_code(&words, c, 3, None), v, "code {c}");
        }
        // The legacy layout puts floor(32/3)=10 codes in each word.
        let legacy = [
            0b111_110_101_100_011_010_001_000u32 | (1 << 24) | (2 << 27),
            5,
        ];
        assert_eq!(extract_code(&legacy, 8, 3, Some(10)), 1);
        assert_eq!(extract_code(&legacy, 9, 3, Some(10)), 2);
        assert_eq!(extract_code(&legacy, 10, 3, Some(10)), 5);
    }

    #[test]
    fn group_scale_index_follows_g_idx() {
        let g_idx = [1i64, 0, 1, 0];
        assert_eq!(
            scale_index(Strategy::Group(2), 3, 0, 4, Some(&g_idx)),
            (7, 1)
        );
        assert_eq!(scale_index(Strategy::Group(2), 3, 1, 4, None), (6, 0));
        assert_eq!(scale_index(Strategy::Block(2, 2), 3, 3, 5, None), (4, 4));
    }
}
