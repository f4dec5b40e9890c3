//! Random linear layers packed exactly as compressed-tensors (or a GGUF file) stores them, for
//! op checks: every storage format, scale strategy, scale dtype and zero-point layout a
//! checkpoint can hold.

use safetensors::Dtype;

use crate::checkpoint::gguf::GgmlType;
use crate::checkpoint::scheme::Strategy;
use crate::checkpoint::{Fp4Scale, Packing, QLinear, TensorRef, ZeroPoint};
use crate::numerics::{ActQuant, FloatType};
use crate::rng::Rng;

#[derive(Clone, Copy, Debug)]
pub enum WeightKind {
    /// An unquantized `weight` of this dtype.
    Dense(FloatType),
    /// pack-quantized INT codes: a dense bitstream, or with `legacy` the older layout of whole
    /// codes per 32-bit word; zero points packed along the output rows.
    Int {
        bits: u32,
        strategy: Strategy,
        asym: bool,
        g_idx: bool,
        legacy: bool,
    },
    /// E2M1 pairs with one scale byte per 16 (FP8) or 32 (E8M0) inputs.
    Fp4(Fp4Scale),
    /// One byte per weight: FP8 E4M3, or INT8 (`int8`) with optional zero points.
    Byte {
        int8: bool,
        strategy: Strategy,
        asym: bool,
    },
    /// ggml blocks of this type, as a GGUF file stores a linear: random codes, finite scales.
    Gguf(GgmlType),
}

impl WeightKind {
    /// A symmetric INT layer in the dense bitstream without g_idx.
    pub fn int(bits: u32, strategy: Strategy) -> Self {
        WeightKind::Int {
            bits,
            strategy,
            asym: false,
            g_idx: false,
            legacy: false,
        }
    }
}

#[derive(Clone, Debug)]
pub struct LinearSpec {
    pub kind: WeightKind,
    pub out_features: usize,
    pub in_features: usize,
    pub model_dtype: FloatType,
    pub scale_dtype: FloatType,
    pub bias: bool,
    pub act_quant: Option<ActQuant>,
}

struct Owned {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl Owned {
    fn r(&self) -> TensorRef<'_> {
        TensorRef {
            name: &self.name,
            dtype: self.dtype,
            shape: &self.shape,
            bytes: &self.bytes,
        }
    }
}

/// The tensors of one random layer; `qlinear()` borrows them as a checkpoint would.
pub struct OwnedLinear {
    spec: LinearSpec,
    tensors: Vec<Owned>,
    words_per_row: usize,
}

/// `v` stored as `dt`.
pub fn float_bytes(v: &[f32], dt: FloatType) -> (Dtype, Vec<u8>) {
    match dt {
        FloatType::F32 => (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        FloatType::F16 => (
            Dtype::F16,
            v.iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
        ),
        FloatType::Bf16 => (
            Dtype::BF16,
            v.iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect(),
        ),
    }
}

fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|&x| x.to_le_bytes()).collect()
}

/// The scale tensor's shape under `strategy` for a `[out, n_in]` weight.
fn scale_shape(strategy: Strategy, out: usize, n_in: usize) -> Vec<usize> {
    match strategy {
        Strategy::Tensor | Strategy::Token => vec![1],
        Strategy::Channel => vec![out, 1],
        Strategy::Group(g) | Strategy::TensorGroup(g) => vec![out, n_in.div_ceil(g)],
        Strategy::Block(bh, bw) => vec![out.div_ceil(bh), n_in.div_ceil(bw)],
    }
}

/// Sets the scale fields of ggml block `b` of type `ty` (random bytes otherwise: every code
/// and sub-block scale) to finite values of a weight's magnitude: f16 `d` (and `dmin`) where
/// `ggml-common.h`'s block structs put them, an MXFP4 exponent near 1, IQ1_M's f16 scale
/// spread over the top nibbles of its four sub-block scale words.
fn finite_ggml_scales(ty: GgmlType, b: &mut [u8], rng: &mut Rng) {
    use GgmlType::*;
    let half = |rng: &mut Rng| {
        let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
        half::f16::from_f32(sign * (0.001 + 0.01 * rng.unit() as f32))
    };
    let offsets: &[usize] = match ty {
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
        Tq1_0 => &[52],
        Tq2_0 => &[64],
        Mxfp4 => {
            b[0] = 120 + (rng.below(8) as u8);
            return;
        }
        Iq1M => {
            let d = half(rng).to_bits();
            for k in 0..4 {
                let top = ((d >> (4 * k)) & 0xf) as u8;
                b[48 + 2 * k + 1] = (b[48 + 2 * k + 1] & 0x0f) | (top << 4);
            }
            return;
        }
        F32 | F16 | Bf16 | Other(..) => unreachable!("{ty} is not a block type"),
        _ => &[0],
    };
    for &o in offsets {
        b[o..o + 2].copy_from_slice(&half(rng).to_le_bytes());
    }
}

/// An FP8 E4M3 byte that is not NaN.
fn fp8_byte(rng: &mut Rng) -> u8 {
    let b = rng.below(256) as u8;
    if b & 0x7f == 0x7f { b - 1 } else { b }
}

impl LinearSpec {
    /// Scales in the model's dtype where it is a 16-bit type, f32 for f32 models.
    pub fn new(
        kind: WeightKind,
        out_features: usize,
        in_features: usize,
        model_dtype: FloatType,
    ) -> Self {
        Self {
            kind,
            out_features,
            in_features,
            model_dtype,
            scale_dtype: model_dtype,
            bias: false,
            act_quant: None,
        }
    }

    pub fn with_bias(mut self) -> Self {
        self.bias = true;
        self
    }

    pub fn with_scales(mut self, dtype: FloatType) -> Self {
        self.scale_dtype = dtype;
        self
    }

    /// The layer fake-quantizes its input as `aq` declares.
    pub fn with_act_quant(mut self, aq: ActQuant) -> Self {
        self.act_quant = Some(aq);
        self
    }

    pub fn describe(&self) -> String {
        let kind = match self.kind {
            WeightKind::Dense(dt) => format!("dense {dt:?}"),
            WeightKind::Int {
                bits,
                strategy,
                asym,
                g_idx,
                legacy,
            } => format!(
                "int{bits} {strategy:?}{}{}{}",
                if asym { " asym" } else { "" },
                if g_idx { " g_idx" } else { "" },
                if legacy { " legacy" } else { "" }
            ),
            WeightKind::Fp4(kind) => format!("fp4 {kind:?}"),
            WeightKind::Gguf(ty) => format!("gguf {ty}"),
            WeightKind::Byte {
                int8,
                strategy,
                asym,
            } => format!(
                "{} {strategy:?}{}",
                if int8 { "int8" } else { "fp8" },
                if asym { " asym" } else { "" }
            ),
        };
        let mut s = format!(
            "{kind} {}x{} model={:?}",
            self.out_features, self.in_features, self.model_dtype
        );
        if !matches!(
            self.kind,
            WeightKind::Dense(_) | WeightKind::Fp4(_) | WeightKind::Gguf(_)
        ) {
            s += &format!(" scales={:?}", self.scale_dtype);
        }
        if self.bias {
            s += " bias";
        }
        if let Some(aq) = self.act_quant {
            s += &format!(" act={aq:?}");
        }
        s
    }

    pub fn build(&self, rng: &mut Rng) -> OwnedLinear {
        let (out, n_in) = (self.out_features, self.in_features);
        let t = |name: &str, dtype, shape: Vec<usize>, bytes| Owned {
            name: format!("check.{name}"),
            dtype,
            shape,
            bytes,
        };
        let scales = |rng: &mut Rng, shape: Vec<usize>| {
            let n = shape.iter().product();
            let s: Vec<f32> = (0..n).map(|_| 0.002 + 0.02 * rng.unit() as f32).collect();
            let (dtype, bytes) = float_bytes(&s, self.scale_dtype);
            t("weight_scale", dtype, shape, bytes)
        };
        let mut tensors = Vec::new();
        let mut words_per_row = 0;
        match self.kind {
            WeightKind::Dense(dt) => {
                let (dtype, bytes) = float_bytes(&rng.normal_vec(out * n_in, 0.1), dt);
                tensors.push(t("weight", dtype, vec![out, n_in], bytes));
            }
            WeightKind::Int {
                bits,
                strategy,
                asym,
                g_idx,
                legacy,
            } => {
                let bits_us = bits as usize;
                // Legacy: `32 / bits` whole codes per word; else a dense bitstream.
                let per = legacy.then_some(32 / bits_us);
                words_per_row = match per {
                    Some(per) => n_in.div_ceil(per),
                    None => (n_in * bits_us).div_ceil(32),
                };
                let mut words = vec![0u32; out * words_per_row];
                for r in 0..out {
                    for c in 0..n_in {
                        let code = rng.below(1 << bits);
                        let (word, shift) = match per {
                            Some(per) => (c / per, bits_us * (c % per)),
                            None => ((c * bits_us) / 32, (c * bits_us) % 32),
                        };
                        let v = code << shift;
                        words[r * words_per_row + word] |= v as u32;
                        if shift + bits_us > 32 {
                            words[r * words_per_row + word + 1] |= (v >> 32) as u32;
                        }
                    }
                }
                tensors.push(t(
                    "weight_packed",
                    Dtype::I32,
                    vec![out, words_per_row],
                    u32_bytes(&words),
                ));
                tensors.push(scales(rng, scale_shape(strategy, out, n_in)));
                let n_groups = match strategy {
                    Strategy::Group(g) => n_in.div_ceil(g),
                    _ => 1,
                };
                if asym {
                    let per = (32 / bits) as usize;
                    let mut zw = vec![0u32; out.div_ceil(per) * n_groups];
                    for r in 0..out {
                        for g in 0..n_groups {
                            let zu = rng.below(1 << bits) as u32;
                            zw[(r / per) * n_groups + g] |= zu << (bits_us * (r % per));
                        }
                    }
                    tensors.push(t(
                        "weight_zero_point",
                        Dtype::I32,
                        vec![out.div_ceil(per), n_groups],
                        u32_bytes(&zw),
                    ));
                }
                if g_idx {
                    let g = match strategy {
                        Strategy::Group(g) => g,
                        _ => n_in,
                    };
                    // A random permutation's group ids, like act-order GPTQ writes.
                    let mut perm: Vec<usize> = (0..n_in).collect();
                    for i in (1..n_in).rev() {
                        perm.swap(i, rng.below(i as u64 + 1) as usize);
                    }
                    let idx: Vec<u32> = perm.iter().map(|&p| (p / g) as u32).collect();
                    tensors.push(t("weight_g_idx", Dtype::I32, vec![n_in], u32_bytes(&idx)));
                }
            }
            WeightKind::Fp4(kind) => {
                let codes = rng.bytes(out * n_in / 2);
                tensors.push(t("weight_packed", Dtype::U8, vec![out, n_in / 2], codes));
                if kind == Fp4Scale::E8m0 {
                    // Powers of two around 1 (2^-27 .. 2^32), without the infinite 255.
                    let sb = (0..out * n_in / 32)
                        .map(|_| 100 + rng.below(60) as u8)
                        .collect();
                    tensors.push(t("weight_scale", Dtype::U8, vec![out, n_in / 32], sb));
                } else {
                    // Every FP8 byte but the NaNs, signs included.
                    let sb = (0..out * n_in / 16).map(|_| fp8_byte(rng)).collect();
                    tensors.push(t("weight_scale", Dtype::F8_E4M3, vec![out, n_in / 16], sb));
                }
            }
            WeightKind::Byte {
                int8,
                strategy,
                asym,
            } => {
                let (dtype, w) = if int8 {
                    (Dtype::I8, rng.bytes(out * n_in))
                } else {
                    (
                        Dtype::F8_E4M3,
                        (0..out * n_in).map(|_| fp8_byte(rng)).collect(),
                    )
                };
                tensors.push(t("weight", dtype, vec![out, n_in], w));
                let shape = scale_shape(strategy, out, n_in);
                if asym {
                    let n = shape.iter().product();
                    let z = (0..n).map(|_| (rng.range(0, 16) as i8 - 8) as u8).collect();
                    tensors.push(t("weight_zero_point", Dtype::I8, shape.clone(), z));
                }
                tensors.push(scales(rng, shape));
            }
            WeightKind::Gguf(ty) => {
                let (values, size) = ty.block();
                let mut blocks = rng.bytes(out * n_in / values * size);
                blocks
                    .chunks_exact_mut(size)
                    .for_each(|b| finite_ggml_scales(ty, b, rng));
                tensors.push(t("weight", Dtype::U8, vec![out, n_in], blocks));
            }
        }
        if self.bias {
            let (dtype, bytes) = float_bytes(&rng.normal_vec(out, 0.5), FloatType::Bf16);
            tensors.push(t("bias", dtype, vec![out], bytes));
        }
        OwnedLinear {
            spec: self.clone(),
            tensors,
            words_per_row,
        }
    }
}

impl OwnedLinear {
    fn get(&self, name: &str) -> Option<TensorRef<'_>> {
        self.tensors
            .iter()
            .find(|t| t.name.strip_prefix("check.") == Some(name))
            .map(Owned::r)
    }

    fn must(&self, name: &str) -> TensorRef<'_> {
        self.get(name)
            .unwrap_or_else(|| unreachable!("built with {name}"))
    }

    /// Replaces the weight of a dense layer by `values` (e.g. the identity).
    pub fn set_dense_weight(&mut self, values: &[f32]) {
        if let WeightKind::Dense(dt) = self.spec.kind
            && let Some(w) = self.tensors.iter_mut().find(|t| t.name == "check.weight")
        {
            w.bytes = float_bytes(values, dt).1;
        }
    }

    pub fn qlinear(&self) -> QLinear<'_> {
        let s = &self.spec;
        let packing = match s.kind {
            WeightKind::Dense(_) => Packing::Dense {
                weight: self.must("weight"),
                transposed: None,
            },
            WeightKind::Int {
                bits,
                strategy,
                legacy,
                ..
            } => Packing::PackedInt {
                bits,
                packed: self.must("weight_packed"),
                words_per_row: self.words_per_row,
                legacy_codes_per_word: legacy.then_some((32 / bits) as usize),
                scale: self.must("weight_scale"),
                zero_point: self.get("weight_zero_point").map(ZeroPoint::PackedAlongOut),
                strategy,
                g_idx: self.get("weight_g_idx"),
            },
            WeightKind::Fp4(scale_kind) => Packing::Fp4 {
                packed: self.must("weight_packed"),
                scale: self.must("weight_scale"),
                group: if scale_kind == Fp4Scale::E8m0 { 32 } else { 16 },
                scale_kind,
            },
            WeightKind::Gguf(ty) => Packing::Gguf {
                ty,
                blocks: self.must("weight"),
            },
            WeightKind::Byte { strategy, .. } => Packing::Unpacked {
                weight: self.must("weight"),
                scale: self.must("weight_scale"),
                zero_point: self.get("weight_zero_point"),
                strategy,
            },
        };
        QLinear {
            name: "check.linear",
            out_features: s.out_features,
            in_features: s.in_features,
            packing,
            bias: self.get("bias"),
            act_quant: s.act_quant,
            model_dtype: s.model_dtype,
        }
    }
}
