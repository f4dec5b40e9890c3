//! GPTQ and AutoAWQ integer weights as they lie on disk (docs/formats.md §2-3): stored
//! `W^T`-oriented, `qweight [in*b/32, out]` packed along `in` (GPTQ) or `[in, out/8]` packed
//! along `out` in AWQ's nibble order, zero points packed along `out`, F16 scales
//! `[groups, out]`; or, in AutoAWQ's GEMV layout, per output row: `qweight [out, in/8]` packed
//! along `in` in natural order, `qzeros [out, width]` likewise along the groups and F16
//! `scales [out, width * 8]`, both padded past the groups (`calculate_zeros_width`). The
//! decode here is the formats' definition; the GPU lowering re-lays the same codes out as
//! compressed-tensors' row-major bitstream, so every backend keeps one integer kernel.

use safetensors::Dtype;

use super::qlinear::float_type;
use super::scheme::{Format, QuantArgs, Strategy};
use super::store::{TensorRef, TensorStore};
use crate::{Error, Result};

/// Output column `n` of an AWQ word lives in nibble `AWQ_NIBBLE[n % 8]`
/// (AutoAWQ packs columns in the order 0, 2, 4, 6, 1, 3, 5, 7).
const AWQ_NIBBLE: [u32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `v2: false` (checkpoint_format `gptq`) stores each zero point minus one.
    Gptq {
        v2: bool,
    },
    Awq,
    AwqGemv,
}

#[derive(Clone, Copy)]
pub struct TransposedInt<'a> {
    pub layout: Layout,
    pub bits: u32,
    pub qweight: TensorRef<'a>,
    pub qzeros: TensorRef<'a>,
    pub scales: TensorRef<'a>,
    /// GPTQ's group of every input column (act-order); `None` when it is `k / group`.
    pub g_idx: Option<TensorRef<'a>>,
    pub group_size: usize,
    pub out_features: usize,
    pub in_features: usize,
}

/// Output `n`'s nibble of row `row` of an AWQ tensor packed along `out` (`[rows, out/8]`).
fn awq_nibble(words: &[u32], out: usize, row: usize, n: usize) -> u32 {
    (words[row * (out / 8) + n / 8] >> (4 * AWQ_NIBBLE[n % 8])) & 15
}

/// AWQ packs 8 codes per word along `dim`: its size must fill whole words.
fn whole_words(module: &str, dim: &str, n: usize) -> Result<()> {
    if n.is_multiple_of(8) {
        return Ok(());
    }
    Err(Error::unsupported(
        module,
        dim,
        format!("{n} is not a multiple of AWQ's 8 codes per word"),
    ))
}

/// Codes unpacked from u32 words: element `i` of a dense LSB-first bitstream.
fn bits_at(words: &[u32], i: usize, bits: u32) -> u32 {
    let bit = i * bits as usize;
    let (w, off) = (bit / 32, (bit % 32) as u32);
    let mut v = words[w] >> off;
    if off + bits > 32 {
        v |= words[w + 1] << (32 - off);
    }
    v & ((1u32 << bits) - 1)
}

/// A layer's zero points `[out, groups]` as the format defines them (v1's stored value plus
/// one) and each input column's group.
pub struct ZeroPoints {
    pub zeros: Vec<i64>,
    pub groups: usize,
    pub group_of: Vec<usize>,
}

impl<'a> TransposedInt<'a> {
    /// Reads the GPTQ or AWQ tensors of `module` (`[out, in]` as the model declares it).
    pub fn load(
        store: &'a TensorStore,
        module: &str,
        format: Format,
        args: &QuantArgs,
        out: usize,
        n_in: usize,
    ) -> Result<Self> {
        let t = |s: &str| store.get(&format!("{module}.{s}"));
        let layout = match format {
            Format::Gptq { v2 } => Layout::Gptq { v2 },
            Format::Awq { gemv: false } => Layout::Awq,
            Format::Awq { gemv: true } => Layout::AwqGemv,
            other => unreachable!("{other:?} is not a transposed integer format"),
        };
        let bits = args.num_bits;
        let group_size = match args.strategy {
            Strategy::Group(g) => g.min(n_in),
            _ => n_in,
        };
        let groups = n_in.div_ceil(group_size);
        let qweight = t("qweight")?;
        qweight.expect_dtype(&[Dtype::I32])?;
        let qzeros = t("qzeros")?;
        qzeros.expect_dtype(&[Dtype::I32])?;
        let scales = t("scales")?;
        float_type(&scales)?;
        let words_out = (out * bits as usize).div_ceil(32);
        if layout != Layout::AwqGemv {
            scales.expect_shape(&[groups, out])?;
        }
        match layout {
            Layout::Gptq { .. } => {
                qweight.expect_shape(&[(n_in * bits as usize).div_ceil(32), out])?;
                qzeros.expect_shape(&[groups, words_out])?;
            }
            Layout::AwqGemv => {
                whole_words(module, "in_features", n_in)?;
                qweight.expect_shape(&[out, n_in / 8])?;
                // Padded widths: any that holds the groups (a narrower or malformed one is
                // reported against the least width), scales 8 per zero-point word.
                let width = match qzeros.shape {
                    [_, w] if w * 8 >= groups => *w,
                    _ => groups.div_ceil(8),
                };
                qzeros.expect_shape(&[out, width])?;
                scales.expect_shape(&[out, width * 8])?;
            }
            Layout::Awq => {
                whole_words(module, "out_features", out)?;
                qweight.expect_shape(&[n_in, out / 8])?;
                qzeros.expect_shape(&[groups, out / 8])?;
            }
        }
        let g_idx = match store.try_get(&format!("{module}.g_idx")) {
            Some(g) if matches!(layout, Layout::Gptq { .. }) => {
                g.expect_shape(&[n_in])?;
                let idx = g.to_i64()?;
                if let Some((k, &v)) = idx
                    .iter()
                    .enumerate()
                    .find(|&(_, &v)| v < 0 || v >= groups as i64)
                {
                    return Err(Error::format(
                        store.dir(),
                        format!(
                            "{}: group index {v} of input {k} out of range 0..{groups}",
                            g.name
                        ),
                    ));
                }
                // The identity grouping needs no table.
                let trivial = idx
                    .iter()
                    .enumerate()
                    .all(|(k, &v)| v as usize == k / group_size);
                (!trivial).then_some(g)
            }
            _ => None,
        };
        Ok(Self {
            layout,
            bits,
            qweight,
            qzeros,
            scales,
            g_idx,
            group_size,
            out_features: out,
            in_features: n_in,
        })
    }

    pub fn group_count(&self) -> usize {
        self.in_features.div_ceil(self.group_size)
    }

    /// Every unsigned code `[out, in]`, extracted one by one by the format's definition (the
    /// CPU reference; the GPU lowering re-lays words out with `row_major_words`).
    pub fn codes(&self) -> Result<Vec<u32>> {
        let (out, n_in, b) = (self.out_features, self.in_features, self.bits);
        let qw = self.qweight.to_u32_words()?;
        let mut codes = vec![0u32; out * n_in];
        match self.layout {
            Layout::Gptq { .. } => {
                // Column n of qweight is the bitstream of input codes for output n.
                let mut column = vec![0u32; self.qweight.shape[0]];
                for n in 0..out {
                    for (w, word) in column.iter_mut().enumerate() {
                        *word = qw[w * out + n];
                    }
                    for k in 0..n_in {
                        codes[n * n_in + k] = bits_at(&column, k, b);
                    }
                }
            }
            Layout::Awq => {
                for k in 0..n_in {
                    for n in 0..out {
                        codes[n * n_in + k] = awq_nibble(&qw, out, k, n);
                    }
                }
            }
            Layout::AwqGemv => {
                for (n, row) in codes.chunks_exact_mut(n_in).enumerate() {
                    for (k, c) in row.iter_mut().enumerate() {
                        *c = bits_at(&qw[n * (n_in / 8)..], k, 4);
                    }
                }
            }
        }
        Ok(codes)
    }

    /// The zero points and groups, by the format's definition.
    pub fn zero_points(&self) -> Result<ZeroPoints> {
        let (out, n_in, b) = (self.out_features, self.in_features, self.bits);
        let groups = self.group_count();
        let qz = self.qzeros.to_u32_words()?;
        let mut zeros = vec![0i64; out * groups];
        for g in 0..groups {
            for n in 0..out {
                zeros[n * groups + g] = match self.layout {
                    Layout::Gptq { v2 } => {
                        let zwords = self.qzeros.shape[1];
                        let row = &qz[g * zwords..(g + 1) * zwords];
                        bits_at(row, n, b) as i64 + i64::from(!v2)
                    }
                    Layout::Awq => awq_nibble(&qz, out, g, n) as i64,
                    Layout::AwqGemv => {
                        let width = self.qzeros.shape[1];
                        bits_at(&qz[n * width..(n + 1) * width], g, 4) as i64
                    }
                };
            }
        }
        let group_of = match self.g_idx {
            Some(g) => g.to_i64()?.into_iter().map(|v| v as usize).collect(),
            None => (0..n_in).map(|k| k / self.group_size).collect(),
        };
        Ok(ZeroPoints {
            zeros,
            groups,
            group_of,
        })
    }

    /// The codes re-laid out as compressed-tensors' `pack-quantized` words: row `n` the dense
    /// LSB-first bitstream of output `n`'s codes, `ceil(in * bits / 32)` words. GPTQ's column
    /// `n` already is that bitstream (its 3-bit word interleave included), so its words are
    /// only transposed; AWQ's 8 x 8 nibble tiles are transposed. Parallel over rows: this runs
    /// once per layer at load (a whole model's weights).
    pub fn row_major_words(&self) -> Result<Vec<u32>> {
        use rayon::prelude::*;
        let (out, n_in) = (self.out_features, self.in_features);
        let qw = self.qweight.to_u32_words()?;
        Ok(match self.layout {
            // Already one dense bitstream per output row.
            Layout::AwqGemv => qw,
            Layout::Gptq { .. } => {
                let words = self.qweight.shape[0];
                let mut rows = vec![0u32; out * words];
                rows.par_chunks_mut(words).enumerate().for_each(|(n, row)| {
                    for (w, word) in row.iter_mut().enumerate() {
                        *word = qw[w * out + n];
                    }
                });
                rows
            }
            Layout::Awq => {
                // Word (k, c) of qweight holds outputs 8c..8c+8 of input k; word (n, k/8) of
                // the result holds inputs k..k+8 of output n.
                let (per_row, cols) = (n_in.div_ceil(8), out / 8);
                let mut rows = vec![0u32; out * per_row];
                rows.par_chunks_mut(8 * per_row)
                    .enumerate()
                    .for_each(|(c, block)| {
                        for k in 0..n_in {
                            let word = qw[k * cols + c];
                            for (j, &nib) in AWQ_NIBBLE.iter().enumerate() {
                                let code = (word >> (4 * nib)) & 15;
                                block[j * per_row + k / 8] |= code << (4 * (k % 8));
                            }
                        }
                    });
                rows
            }
        })
    }

    /// The scales as `[out, groups]` row-major bytes of the scale dtype: transposed from
    /// `[groups, out]`, or the GEMV layout's rows without their padding.
    pub fn scale_bytes_by_row(&self) -> Result<Vec<u8>> {
        let (out, groups) = (self.out_features, self.group_count());
        let elem = float_type(&self.scales)?.bytes();
        let bytes = self.scales.bytes;
        let mut by_row = Vec::with_capacity(out * groups * elem);
        for n in 0..out {
            for g in 0..groups {
                let at = match self.layout {
                    Layout::AwqGemv => n * self.scales.shape[1] + g,
                    _ => g * out + n,
                } * elem;
                by_row.extend_from_slice(&bytes[at..at + elem]);
            }
        }
        Ok(by_row)
    }

    /// Rows `rows` of `W = RN_scale((q - z) * s)` (formats.md §2-3), widened to f32 through
    /// the model dtype.
    pub fn dequantize_rows(
        &self,
        rows: std::ops::Range<usize>,
        model: crate::numerics::FloatType,
        out: &mut [f32],
    ) -> Result<()> {
        let n_in = self.in_features;
        let (codes, z) = (self.codes()?, self.zero_points()?);
        let scale_dt = float_type(&self.scales)?;
        let by_row = self.scale_bytes_by_row()?;
        let s = TensorRef {
            shape: &[self.out_features, z.groups],
            bytes: &by_row,
            ..self.scales
        }
        .to_f32()?;
        for (i, n) in rows.enumerate() {
            for k in 0..n_in {
                let g = z.group_of[k];
                let q = codes[n * n_in + k] as i64 - z.zeros[n * z.groups + g];
                let w = scale_dt.round(q as f32 * s[n * z.groups + g]);
                out[i * n_in + k] = model.round(w);
            }
        }
        Ok(())
    }

    /// Storage bytes of codes, zero points, scales and g_idx.
    pub fn stored_bytes(&self) -> usize {
        self.qweight.bytes.len()
            + self.qzeros.bytes.len()
            + self.scales.bytes.len()
            + self.g_idx.map_or(0, |g| g.bytes.len())
    }
}
