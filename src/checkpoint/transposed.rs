//! GPTQ and AutoAWQ integer weights as they lie on disk (research/formats.md §2-3): stored
//! `W^T`-oriented, `qweight [in*b/32, out]` packed along `in` (GPTQ) or `[in, out/8]` packed
//! along `out` in AWQ's nibble order, zero points packed along `out`, F16 scales
//! `[groups, out]`. The decode here is the formats' definition; the GPU lowering re-lays the
//! same codes out as compressed-tensors' row-major bitstream, so every backend keeps one
//! integer kernel.

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

/// The decoded integers of a layer: unsigned codes `[out, in]`, zero points `[out, groups]`
/// (as the format defines them: v1's stored value plus one), each input column's group.
pub struct Unpacked {
    pub codes: Vec<u32>,
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
            Format::Awq => Layout::Awq,
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
        scales.expect_shape(&[groups, out])?;
        let words_out = (out * bits as usize).div_ceil(32);
        match layout {
            Layout::Gptq { .. } => {
                qweight.expect_shape(&[(n_in * bits as usize).div_ceil(32), out])?;
                qzeros.expect_shape(&[groups, words_out])?;
            }
            Layout::Awq => {
                if !out.is_multiple_of(8) {
                    return Err(Error::unsupported(
                        module,
                        "out_features",
                        format!("{out} is not a multiple of AWQ's 8 codes per word"),
                    ));
                }
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

    pub fn groups(&self) -> usize {
        self.in_features.div_ceil(self.group_size)
    }

    /// Every code, zero point and group of the layer, by the format's definition.
    pub fn unpack(&self) -> Result<Unpacked> {
        let (out, n_in, b) = (self.out_features, self.in_features, self.bits);
        let groups = self.groups();
        let qw = self.qweight.to_u32_words()?;
        let qz = self.qzeros.to_u32_words()?;
        let mut codes = vec![0u32; out * n_in];
        let mut zeros = vec![0i64; out * groups];
        match self.layout {
            Layout::Gptq { v2 } => {
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
                let zwords = self.qzeros.shape[1];
                for g in 0..groups {
                    let row = &qz[g * zwords..(g + 1) * zwords];
                    for n in 0..out {
                        zeros[n * groups + g] = bits_at(row, n, b) as i64 + i64::from(!v2);
                    }
                }
            }
            Layout::Awq => {
                let nibble = |words: &[u32], row: usize, n: usize| {
                    (words[row * (out / 8) + n / 8] >> (4 * AWQ_NIBBLE[n % 8])) & 15
                };
                for k in 0..n_in {
                    for n in 0..out {
                        codes[n * n_in + k] = nibble(&qw, k, n);
                    }
                }
                for g in 0..groups {
                    for n in 0..out {
                        zeros[n * groups + g] = nibble(&qz, g, n) as i64;
                    }
                }
            }
        }
        let group_of = match self.g_idx {
            Some(g) => g.to_i64()?.into_iter().map(|v| v as usize).collect(),
            None => (0..n_in).map(|k| k / self.group_size).collect(),
        };
        Ok(Unpacked {
            codes,
            zeros,
            groups,
            group_of,
        })
    }

    /// Scales transposed to `[out, groups]`, widened to f32.
    pub fn scales_by_row(&self) -> Result<Vec<f32>> {
        let s = self.scales.to_f32()?;
        let (out, groups) = (self.out_features, self.groups());
        Ok((0..out * groups)
            .map(|i| s[(i % groups) * out + i / groups])
            .collect())
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
        let u = self.unpack()?;
        let scale_dt = float_type(&self.scales)?;
        let s = self.scales.to_f32()?;
        for (i, n) in rows.enumerate() {
            for k in 0..n_in {
                let g = u.group_of[k];
                let q = u.codes[n * n_in + k] as i64 - u.zeros[n * u.groups + g];
                let w = scale_dt.round(q as f32 * s[g * self.out_features + n]);
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
