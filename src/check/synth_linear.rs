//! Random linear layers packed exactly as compressed-tensors stores them, for op checks.

use safetensors::Dtype;

use crate::checkpoint::scheme::Strategy;
use crate::checkpoint::{Packing, QLinear, TensorRef, ZeroPoint};
use crate::numerics::{ActQuant, FloatType};

/// splitmix64: small, seedable, and the same on every platform.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    pub fn normal(&mut self) -> f32 {
        let (u, v) = (self.unit(), self.unit());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }

    pub fn normal_vec(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * std).collect()
    }
}

#[derive(Clone, Copy, Debug)]
pub enum WeightKind {
    DenseF32,
    DenseBf16,
    /// pack-quantized; `group: None` is the channel strategy.
    Int {
        bits: u32,
        group: Option<usize>,
        asym: bool,
        g_idx: bool,
    },
    Nvfp4 {
        act: bool,
    },
    Fp8 {
        act: bool,
    },
}

#[derive(Clone, Debug)]
pub struct LinearSpec {
    pub kind: WeightKind,
    pub out_features: usize,
    pub in_features: usize,
    pub model_dtype: FloatType,
    pub bias: bool,
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
    global_scale: f32,
    act_quant: Option<ActQuant>,
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|&x| x.to_le_bytes()).collect()
}

fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|&x| x.to_le_bytes()).collect()
}

impl LinearSpec {
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
            bias: false,
        }
    }

    pub fn with_bias(mut self) -> Self {
        self.bias = true;
        self
    }

    pub fn has_act_quant(&self) -> bool {
        matches!(
            self.kind,
            WeightKind::Nvfp4 { act: true } | WeightKind::Fp8 { act: true }
        )
    }

    pub fn describe(&self) -> String {
        format!(
            "{:?} out={} in={}{}",
            self.kind,
            self.out_features,
            self.in_features,
            if self.bias { " bias" } else { "" }
        )
    }

    pub fn build(&self, rng: &mut Rng) -> OwnedLinear {
        let (out, n_in) = (self.out_features, self.in_features);
        let scale_bytes = |rng: &mut Rng, n: usize| -> (Dtype, Vec<u8>) {
            let s: Vec<f32> = (0..n).map(|_| 0.002 + 0.02 * rng.unit() as f32).collect();
            match self.model_dtype {
                FloatType::F32 => (Dtype::F32, f32_bytes(&s)),
                _ => (Dtype::BF16, bf16_bytes(&s)),
            }
        };
        let t = |name: &str, dtype, shape: Vec<usize>, bytes| Owned {
            name: format!("check.{name}"),
            dtype,
            shape,
            bytes,
        };
        let mut tensors = Vec::new();
        let mut words_per_row = 0;
        let mut global_scale = 1.0;
        let mut act_quant = None;
        match self.kind {
            WeightKind::DenseF32 => {
                tensors.push(t(
                    "weight",
                    Dtype::F32,
                    vec![out, n_in],
                    f32_bytes(&rng.normal_vec(out * n_in, 0.1)),
                ));
            }
            WeightKind::DenseBf16 => {
                tensors.push(t(
                    "weight",
                    Dtype::BF16,
                    vec![out, n_in],
                    bf16_bytes(&rng.normal_vec(out * n_in, 0.1)),
                ));
            }
            WeightKind::Int {
                bits,
                group,
                asym,
                g_idx,
            } => {
                words_per_row = (n_in * bits as usize).div_ceil(32);
                let mut words = vec![0u32; out * words_per_row];
                for r in 0..out {
                    for c in 0..n_in {
                        let code = rng.below(1 << bits) as u32;
                        let bit = c * bits as usize;
                        words[r * words_per_row + bit / 32] |= code << (bit % 32);
                    }
                }
                tensors.push(t(
                    "weight_packed",
                    Dtype::I32,
                    vec![out, words_per_row],
                    u32_bytes(&words),
                ));
                let n_groups = group.map_or(1, |g| n_in.div_ceil(g));
                let (sd, sb) = scale_bytes(rng, out * n_groups);
                tensors.push(t("weight_scale", sd, vec![out, n_groups], sb));
                if asym {
                    let per = (32 / bits) as usize;
                    let mut zw = vec![0u32; out.div_ceil(per) * n_groups];
                    for r in 0..out {
                        for g in 0..n_groups {
                            let zu = rng.below(1 << bits) as u32;
                            zw[(r / per) * n_groups + g] |= zu << (bits as usize * (r % per));
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
                    let g = group.unwrap_or(n_in);
                    // A random permutation's group ids, like act-order GPTQ writes.
                    let mut perm: Vec<usize> = (0..n_in).collect();
                    for i in (1..n_in).rev() {
                        perm.swap(i, rng.below(i as u64 + 1) as usize);
                    }
                    let idx: Vec<u32> = perm.iter().map(|&p| (p / g) as u32).collect();
                    tensors.push(t("weight_g_idx", Dtype::I32, vec![n_in], u32_bytes(&idx)));
                }
            }
            WeightKind::Nvfp4 { act } => {
                let codes: Vec<u8> = (0..out * n_in / 2).map(|_| rng.below(256) as u8).collect();
                tensors.push(t("weight_packed", Dtype::U8, vec![out, n_in / 2], codes));
                // Positive FP8 scales with exponents 4..9 (about 2^-3 .. 2^2).
                let scales: Vec<u8> = (0..out * n_in / 16)
                    .map(|_| ((4 + rng.below(6) as u8) << 3) | rng.below(8) as u8)
                    .collect();
                tensors.push(t(
                    "weight_scale",
                    Dtype::F8_E4M3,
                    vec![out, n_in / 16],
                    scales,
                ));
                global_scale = 3.7;
                if act {
                    act_quant = Some(ActQuant::Nvfp4 {
                        global_scale: 448.0 * 6.0 / 4.5,
                    });
                }
            }
            WeightKind::Fp8 { act } => {
                let w: Vec<u8> = (0..out * n_in)
                    .map(|_| {
                        let b = rng.below(256) as u8;
                        if b & 0x7f == 0x7f { b - 1 } else { b }
                    })
                    .collect();
                tensors.push(t("weight", Dtype::F8_E4M3, vec![out, n_in], w));
                let (sd, sb) = scale_bytes(rng, out);
                tensors.push(t("weight_scale", sd, vec![out, 1], sb));
                if act {
                    act_quant = Some(ActQuant::Fp8PerToken);
                }
            }
        }
        if self.bias {
            tensors.push(t(
                "bias",
                Dtype::BF16,
                vec![out],
                bf16_bytes(&rng.normal_vec(out, 0.5)),
            ));
        }
        OwnedLinear {
            spec: self.clone(),
            tensors,
            words_per_row,
            global_scale,
            act_quant,
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

    pub fn qlinear(&self) -> QLinear<'_> {
        let s = &self.spec;
        let packing = match s.kind {
            WeightKind::DenseF32 | WeightKind::DenseBf16 => Packing::Dense {
                weight: self.must("weight"),
            },
            WeightKind::Int { bits, group, .. } => Packing::PackedInt {
                bits,
                packed: self.must("weight_packed"),
                words_per_row: self.words_per_row,
                legacy_codes_per_word: None,
                scale: self.must("weight_scale"),
                zero_point: self.get("weight_zero_point").map(ZeroPoint::PackedAlongOut),
                strategy: group.map_or(Strategy::Channel, Strategy::Group),
                g_idx: self.get("weight_g_idx"),
            },
            WeightKind::Nvfp4 { .. } => Packing::Nvfp4 {
                packed: self.must("weight_packed"),
                scale: self.must("weight_scale"),
                global_scale: self.global_scale,
            },
            WeightKind::Fp8 { .. } => Packing::Unpacked {
                weight: self.must("weight"),
                scale: self.must("weight_scale"),
                zero_point: None,
                strategy: Strategy::Channel,
            },
        };
        QLinear {
            name: "check.linear",
            out_features: s.out_features,
            in_features: s.in_features,
            packing,
            bias: self.get("bias"),
            act_quant: self.act_quant,
            model_dtype: s.model_dtype,
        }
    }
}
