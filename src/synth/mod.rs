//! Random-weight checkpoints with the exact shapes of real models, in the compressed-tensors
//! formats quantppl reads, for benchmarks (`quantppl synth`).
//!
//! A synthetic checkpoint is a normal Hugging Face directory (`config.json` with
//! `quantization_config`, `generation_config.json`, sharded safetensors + index) that differs
//! from a real one only in its values. The dense f32 weights depend only on the seed and the
//! tensor name, so every scheme written with one seed quantizes the same dense model.
//! Tensors are generated, quantized and written one at a time (generation one tensor ahead
//! of the disk), so memory stays within about three of the largest tensor (a 128k-vocab
//! embedding is 1-2 GB): 1 GB peak RSS for Llama-3-8B W4A16 (5.7 GB, 41 s on 2 cores).

pub mod linear;
mod quantize;
mod shapes;
mod writer;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use serde_json::{Value, json};

use crate::{Error, Result};
use quantize::{Init, tensor_seed};
use shapes::ModelSpec;
use writer::{CheckpointWriter, DType, TensorSpec};

/// Real model shapes (published `config.json` values) plus a tiny one for tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SynthShape {
    /// meta-llama/Meta-Llama-3-8B.
    #[value(name = "llama3-8b")]
    #[serde(rename = "llama3-8b")]
    Llama3_8b,
    /// meta-llama/Llama-3.1-8B (llama3 rope scaling, 128k context).
    #[value(name = "llama3.1-8b")]
    #[serde(rename = "llama3.1-8b")]
    Llama31_8b,
    /// meta-llama/Meta-Llama-3-70B.
    #[value(name = "llama3-70b")]
    #[serde(rename = "llama3-70b")]
    Llama3_70b,
    /// Qwen/Qwen3-8B (q/k RMS norms, explicit head_dim 128).
    #[value(name = "qwen3-8b")]
    #[serde(rename = "qwen3-8b")]
    Qwen3_8b,
    /// Qwen/Qwen3-0.6B (tied embeddings).
    #[value(name = "qwen3-0.6b")]
    #[serde(rename = "qwen3-0.6b")]
    Qwen3_0_6b,
    /// zai-org/GLM-4.5-Air (128 experts, 8 per token, a shared expert, first layer dense).
    #[value(name = "glm-4.5-air")]
    #[serde(rename = "glm-4.5-air")]
    Glm45Air,
    /// Qwen/Qwen3-30B-A3B (128 experts, 8 per token).
    #[value(name = "qwen3-30b-a3b")]
    #[serde(rename = "qwen3-30b-a3b")]
    Qwen3_30bA3b,
    /// Qwen/Qwen3-235B-A22B (128 experts, 8 per token).
    #[value(name = "qwen3-235b-a22b")]
    #[serde(rename = "qwen3-235b-a22b")]
    Qwen3_235bA22b,
    /// mistralai/Mixtral-8x7B-v0.1 (8 experts, 2 per token).
    #[value(name = "mixtral-8x7b")]
    #[serde(rename = "mixtral-8x7b")]
    Mixtral8x7b,
    /// mistralai/Mistral-Large-Instruct-2407 (123B).
    #[value(name = "mistral-large-123b")]
    #[serde(rename = "mistral-large-123b")]
    MistralLarge123b,
    /// google/gemma-3-27b-it's language model (sliding-window layers, vocab 262k).
    #[value(name = "gemma3-27b")]
    #[serde(rename = "gemma3-27b")]
    Gemma3_27b,
    /// google/gemma-3-12b-it's language model (head_dim 256).
    #[value(name = "gemma3-12b")]
    #[serde(rename = "gemma3-12b")]
    Gemma3_12b,
    /// microsoft/phi-4 (fused qkv_proj and gate_up_proj).
    #[value(name = "phi-4")]
    #[serde(rename = "phi-4")]
    Phi4,
    /// openai/gpt-oss-20b's shapes (32 experts, 4 per token), the experts as per-expert
    /// linears (`experts.E.gate_up_proj` / `down_proj` with biases).
    #[value(name = "gpt-oss-20b")]
    #[serde(rename = "gpt-oss-20b")]
    GptOss20b,
    /// openai/gpt-oss-120b's shapes (128 experts, 4 per token).
    #[value(name = "gpt-oss-120b")]
    #[serde(rename = "gpt-oss-120b")]
    GptOss120b,
    /// deepseek-ai/DeepSeek-V3 (671B: 256 experts, 8 per token, a shared expert, the first 3
    /// layers dense; multi-head latent attention). Write a slice with `--layers`.
    #[value(name = "deepseek-v3")]
    #[serde(rename = "deepseek-v3")]
    DeepseekV3,
    /// DeepSeek-V3's layout at test size (hidden 256, 8 experts of width 128, 2 per token,
    /// layer 0 dense).
    #[value(name = "tiny-deepseek-v3")]
    #[serde(rename = "tiny-deepseek-v3")]
    TinyDeepseekV3,
    /// The synth-llama-mini fixture's layout with 2 layers (hidden 256, vocab 512).
    #[value(name = "tiny")]
    #[serde(rename = "tiny")]
    Tiny,
    /// GLM-4.5's layout at test size (hidden 256, 8 experts, 2 per token, layer 0 dense).
    #[value(name = "tiny-glm")]
    #[serde(rename = "tiny-glm")]
    TinyGlm,
    /// gpt-oss's layout at test size (hidden 256, 8 experts of width 128, 4 per token).
    #[value(name = "tiny-gpt-oss")]
    #[serde(rename = "tiny-gpt-oss")]
    TinyGptOss,
    /// The synth-qwen3moe-mini fixture's layout with 2 layers (8 experts, 2 per token).
    #[value(name = "tiny-moe")]
    #[serde(rename = "tiny-moe")]
    TinyMoe,
}

/// On-disk formats, as llm-compressor's presets write them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SynthScheme {
    /// Unquantized BF16 (no `quantization_config`).
    DenseBf16,
    /// W4A16: INT4 symmetric, group 128, `pack-quantized`.
    #[value(name = "w4a16-g128")]
    #[serde(rename = "w4a16-g128")]
    W4a16G128,
    /// W4A16_ASYM: INT4 with packed zero points, group 128.
    #[value(name = "w4a16-g128-asym")]
    #[serde(rename = "w4a16-g128-asym")]
    W4a16G128Asym,
    /// NVFP4 (W4A4): FP4 weights and FP4 input activations (`dynamic: "local"`).
    Nvfp4,
    /// NVFP4A16: FP4 weights only.
    Nvfp4a16,
    /// FP8_DYNAMIC: FP8 E4M3 weights per channel, FP8 per-token dynamic activations.
    #[value(name = "fp8-dynamic")]
    #[serde(rename = "fp8-dynamic")]
    Fp8Dynamic,
    /// FP8_DYNAMIC attention and dense MLPs, NVFP4 (W4A4) routed experts: two config groups
    /// targeting modules by regex, as mixed MoE checkpoints are published.
    #[value(name = "fp8-attn-nvfp4-experts")]
    #[serde(rename = "fp8-attn-nvfp4-experts")]
    Fp8AttnNvfp4Experts,
    /// MXFP4A16: `mxfp4-pack-quantized`, E8M0 scales per 32, weight-only.
    Mxfp4,
    /// MXFP4 (W4A4): the MXFP4A16 weights and dynamic MX input activations (E2M1 values,
    /// power-of-two scales per 32).
    #[value(name = "mxfp4-a4")]
    #[serde(rename = "mxfp4-a4")]
    Mxfp4A4,
    /// MXFP8A16: `mxfp8-quantized`, E4M3 weights with E8M0 scales per 32, weight-only.
    Mxfp8,
    /// MXFP8 (W8A8): the MXFP8A16 weights and dynamic MX input activations (E4M3 values,
    /// power-of-two scales per 32).
    #[value(name = "mxfp8-a8")]
    #[serde(rename = "mxfp8-a8")]
    Mxfp8A8,
    /// GPTQ v1 INT4, symmetric, group 128 (`quant_method: gptq`, AutoGPTQ's layout).
    #[value(name = "gptq-int4")]
    #[serde(rename = "gptq-int4")]
    GptqInt4,
    /// AutoAWQ GEMM INT4 with zero points, group 128 (`quant_method: awq`).
    #[value(name = "awq-int4")]
    #[serde(rename = "awq-int4")]
    AwqInt4,
    /// AutoAWQ GEMV INT4 with zero points, group 128 (`version: gemv`: rows per output).
    #[value(name = "awq-gemv-int4")]
    #[serde(rename = "awq-gemv-int4")]
    AwqGemvInt4,
    /// Native FP8 with 128 x 128 block scales (`quant_method: fp8`, DeepSeek-V3's layout),
    /// dynamic per-token-group FP8 activations.
    #[value(name = "fp8-block")]
    #[serde(rename = "fp8-block")]
    Fp8Block,
    /// ModelOpt NVFP4 (W4A4): `weight`, `weight_scale`, `weight_scale_2`, `input_scale`.
    #[value(name = "modelopt-nvfp4")]
    #[serde(rename = "modelopt-nvfp4")]
    ModeloptNvfp4,
}

/// What was written, for the CLI to print as JSON.
#[derive(Clone, Debug, Serialize)]
pub struct SynthSummary {
    pub shape: SynthShape,
    /// Decoder layers written (the shape's, or the `--layers` slice).
    pub layers: usize,
    pub scheme: SynthScheme,
    pub seed: u64,
    pub out_dir: PathBuf,
    /// Dense-equivalent parameter count (each linear counted as `out x in`).
    pub params: u64,
    /// Number of tensors in the safetensors files.
    pub tensors: usize,
    pub shards: usize,
    /// Sum of tensor bytes (the index's `metadata.total_size`).
    pub tensor_bytes: u64,
    /// Every byte written, JSON files and safetensors headers included.
    pub bytes_written: u64,
    /// Paths of all files written.
    pub files: Vec<PathBuf>,
    pub seconds: f64,
}

/// Reported after every tensor written.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    pub tensor: &'a str,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// transformers' default `max_shard_size` ("5GB", decimal).
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// Standard deviation of embeddings and linear weights, about that of trained checkpoints.
const WEIGHT_STD: f32 = 0.02;

/// The NVFP4 `input_global_scale` written for every linear: `448 * 6 / amax(x)` for an
/// assumed calibration amax of 16 (there is no calibration data; any positive value is a
/// valid checkpoint, and 16 keeps unit-variance activations well inside the FP8 range).
const INPUT_GLOBAL_SCALE: f32 = 448.0 * 6.0 / 16.0;

/// DeepSeek-V3's FP8 block (`weight_block_size`).
const FP8_BLOCK: usize = 128;

/// One linear layer to generate.
struct Linear {
    prefix: String,
    out: usize,
    inp: usize,
}

/// Tensors generated together: a dense tensor, or linears that share an NVFP4 global scale
/// (q/k/v and gate/up, as llm-compressor fuses them for vLLM) and hence a shard.
enum Unit {
    Dense {
        name: String,
        shape: Vec<usize>,
        init: Init,
    },
    Linears(Vec<Linear>),
    /// gpt-oss's experts of one layer, `prefix` `….mlp.experts`: in MXFP4 the stacks openai
    /// stores (`{name}_blocks` `[E, out, in/32, 16]`, `{name}_scales`), in bf16 the stacks
    /// transformers stores (`{name}` `[E, in, out]`), in the other schemes per-expert linears
    /// `{prefix}.{e}.{name}`; each part is (name, out, in).
    Experts {
        prefix: String,
        experts: usize,
        parts: Vec<(&'static str, usize, usize)>,
    },
}

/// The per-expert linears of an `Unit::Experts`, in expert order.
fn expert_linears(prefix: &str, experts: usize, parts: &[(&str, usize, usize)]) -> Vec<Linear> {
    (0..experts)
        .flat_map(|e| {
            parts.iter().map(move |&(name, out, inp)| Linear {
                prefix: format!("{prefix}.{e}.{name}"),
                out,
                inp,
            })
        })
        .collect()
}

const QWEN_MLP: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// The model's units in transformers' module order.
fn units(spec: &ModelSpec) -> Vec<Unit> {
    let dense = |name: String, shape: &[usize], init| Unit::Dense {
        name,
        shape: shape.to_vec(),
        init,
    };
    let linear = |prefix: String, out, inp| Linear { prefix, out, inp };
    let (h, i, hd) = (spec.hidden, spec.intermediate, spec.head_dim);
    let (q, kv) = (spec.heads * hd, spec.kv_heads * hd);
    let mut units = vec![dense(
        "model.embed_tokens.weight".into(),
        &[spec.vocab, h],
        Init::Normal(WEIGHT_STD),
    )];
    for l in 0..spec.layers {
        let p = format!("model.layers.{l}");
        units.push(dense(
            format!("{p}.input_layernorm.weight"),
            &[h],
            Init::NormGain,
        ));
        let fused = spec.arch == shapes::Arch::Phi3;
        let gemma = matches!(spec.arch, shapes::Arch::Gemma3 { .. });
        let latent = match spec.arch {
            shapes::Arch::DeepseekV3 {
                q_lora_rank,
                kv_lora_rank,
                nope_dim,
                v_head_dim,
            } => Some((q_lora_rank, kv_lora_rank, nope_dim, v_head_dim)),
            _ => None,
        };
        let o_in = match latent {
            Some((ql, kvl, nope, v)) => {
                // q_a, its norm, q_b; kv_a_proj_with_mqa (latent + the shared rotated part),
                // its norm, kv_b (each head's unrotated key part and value).
                let attn = |name: &str| format!("{p}.self_attn.{name}");
                let heads = spec.heads;
                units.push(Unit::Linears(vec![linear(attn("q_a_proj"), ql, h)]));
                units.push(dense(attn("q_a_layernorm.weight"), &[ql], Init::NormGain));
                units.push(Unit::Linears(vec![linear(
                    attn("q_b_proj"),
                    heads * (nope + hd),
                    ql,
                )]));
                units.push(Unit::Linears(vec![linear(
                    attn("kv_a_proj_with_mqa"),
                    kvl + hd,
                    h,
                )]));
                units.push(dense(attn("kv_a_layernorm.weight"), &[kvl], Init::NormGain));
                units.push(Unit::Linears(vec![linear(
                    attn("kv_b_proj"),
                    heads * (nope + v),
                    kvl,
                )]));
                heads * v
            }
            None => q,
        };
        if latent.is_none() {
            units.push(Unit::Linears(if fused {
                vec![linear(format!("{p}.self_attn.qkv_proj"), q + 2 * kv, h)]
            } else {
                vec![
                    linear(format!("{p}.self_attn.q_proj"), q, h),
                    linear(format!("{p}.self_attn.k_proj"), kv, h),
                    linear(format!("{p}.self_attn.v_proj"), kv, h),
                ]
            }));
        }
        if spec.has_qkv_bias() {
            for (n, out) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                let name = format!("{p}.self_attn.{n}.bias");
                units.push(dense(name, &[out], Init::Normal(WEIGHT_STD)));
            }
        }
        if spec.arch == shapes::Arch::GptOss {
            let name = format!("{p}.self_attn.o_proj.bias");
            units.push(dense(name, &[h], Init::Normal(WEIGHT_STD)));
            let name = format!("{p}.self_attn.sinks");
            units.push(dense(name, &[spec.heads], Init::Normal(1.0)));
        }
        if spec.has_qk_norm() {
            for n in ["q_norm", "k_norm"] {
                units.push(dense(
                    format!("{p}.self_attn.{n}.weight"),
                    &[hd],
                    Init::NormGain,
                ));
            }
        }
        units.push(Unit::Linears(vec![linear(
            format!("{p}.self_attn.o_proj"),
            h,
            o_in,
        )]));
        let norms: &[&str] = if gemma {
            &[
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            ]
        } else {
            &["post_attention_layernorm"]
        };
        for n in norms {
            units.push(dense(format!("{p}.{n}.weight"), &[h], Init::NormGain));
        }
        let mlp = |units: &mut Vec<Unit>, prefix: &str, [gate, up, down]: [&str; 3], i: usize| {
            units.push(Unit::Linears(if fused {
                vec![linear(format!("{prefix}.gate_up_proj"), 2 * i, h)]
            } else {
                vec![
                    linear(format!("{prefix}.{gate}"), i, h),
                    linear(format!("{prefix}.{up}"), i, h),
                ]
            }));
            units.push(Unit::Linears(vec![linear(
                format!("{prefix}.{down}"),
                h,
                i,
            )]));
        };
        match spec.moe {
            Some(m) if spec.arch == shapes::Arch::GptOss => {
                // The router with its bias; the experts' interleaved gate_up and down with
                // their stacked biases.
                let router = format!("{p}.mlp.router");
                units.push(dense(
                    format!("{router}.weight"),
                    &[m.experts, h],
                    Init::Normal(WEIGHT_STD),
                ));
                units.push(dense(
                    format!("{router}.bias"),
                    &[m.experts],
                    Init::Normal(WEIGHT_STD),
                ));
                let ei = m.expert_intermediate;
                let prefix = format!("{p}.mlp.experts");
                let parts = vec![("gate_up_proj", 2 * ei, h), ("down_proj", h, ei)];
                for &(name, out, _) in &parts {
                    let bias = format!("{prefix}.{name}_bias");
                    units.push(dense(bias, &[m.experts, out], Init::Normal(WEIGHT_STD)));
                }
                units.push(Unit::Experts {
                    prefix,
                    experts: m.experts,
                    parts,
                });
            }
            Some(m) if l >= m.first_dense => {
                // Each expert a separate 2D linear, as llm-compressor writes them; the router
                // stays dense (ignored).
                let (block, names) = match spec.arch {
                    shapes::Arch::Mixtral => ("block_sparse_moe", ["w1", "w3", "w2"]),
                    _ => ("mlp", QWEN_MLP),
                };
                units.push(dense(
                    format!("{p}.{block}.gate.weight"),
                    &[m.experts, h],
                    Init::Normal(WEIGHT_STD),
                ));
                if matches!(
                    spec.arch,
                    shapes::Arch::Glm4Moe | shapes::Arch::DeepseekV3 { .. }
                ) {
                    let name = format!("{p}.{block}.gate.e_score_correction_bias");
                    units.push(dense(name, &[m.experts], Init::Normal(WEIGHT_STD)));
                }
                for e in 0..m.experts {
                    let prefix = format!("{p}.{block}.experts.{e}");
                    mlp(&mut units, &prefix, names, m.expert_intermediate);
                }
                if m.shared > 0 {
                    let prefix = format!("{p}.{block}.shared_experts");
                    mlp(&mut units, &prefix, names, m.shared * m.expert_intermediate);
                }
            }
            _ => mlp(&mut units, &format!("{p}.mlp"), QWEN_MLP, i),
        }
    }
    units.push(dense("model.norm.weight".into(), &[h], Init::NormGain));
    if !spec.tie_word_embeddings {
        units.push(dense(
            "lm_head.weight".into(),
            &[spec.vocab, h],
            Init::Normal(WEIGHT_STD),
        ));
    }
    units
}

impl SynthScheme {
    /// The single scheme linear `prefix` is stored in (a mixed scheme picks one per module).
    fn for_linear(self, prefix: &str) -> SynthScheme {
        match self {
            SynthScheme::Fp8AttnNvfp4Experts if prefix.contains(".experts.") => SynthScheme::Nvfp4,
            SynthScheme::Fp8AttnNvfp4Experts => SynthScheme::Fp8Dynamic,
            s => s,
        }
    }

    /// The tensors one linear is stored as, or why its shape cannot be stored this way.
    fn linear_tensors(self, l: &Linear) -> Result<Vec<TensorSpec>> {
        let (out, inp, p) = (l.out, l.inp, &l.prefix);
        let this = self.for_linear(p);
        if this != self {
            return this.linear_tensors(l);
        }
        let need = |ok: bool, why: &str| {
            if ok {
                Ok(())
            } else {
                Err(Error::unsupported(
                    format!("{p} [{out}, {inp}]"),
                    format!("{self:?}"),
                    why.to_string(),
                ))
            }
        };
        Ok(match self {
            SynthScheme::DenseBf16 => vec![TensorSpec::new(
                format!("{p}.weight"),
                DType::BF16,
                &[out, inp],
            )],
            SynthScheme::W4a16G128 | SynthScheme::W4a16G128Asym => {
                need(
                    inp % 128 == 0 && out % 8 == 0,
                    "INT4 g128 needs in % 128 == 0 and out % 8 == 0",
                )?;
                let mut t = vec![
                    TensorSpec::new(format!("{p}.weight_packed"), DType::I32, &[out, inp / 8]),
                    TensorSpec::new(format!("{p}.weight_scale"), DType::BF16, &[out, inp / 128]),
                    TensorSpec::new(format!("{p}.weight_shape"), DType::I64, &[2]),
                ];
                if self == SynthScheme::W4a16G128Asym {
                    t.push(TensorSpec::new(
                        format!("{p}.weight_zero_point"),
                        DType::I32,
                        &[out / 8, inp / 128],
                    ));
                }
                t
            }
            SynthScheme::Nvfp4 | SynthScheme::Nvfp4a16 => {
                need(inp % 16 == 0, "NVFP4 needs in % 16 == 0")?;
                let mut t = vec![
                    TensorSpec::new(format!("{p}.weight_packed"), DType::U8, &[out, inp / 2]),
                    TensorSpec::new(format!("{p}.weight_scale"), DType::F8E4M3, &[out, inp / 16]),
                    TensorSpec::new(format!("{p}.weight_global_scale"), DType::F32, &[1]),
                ];
                if self == SynthScheme::Nvfp4 {
                    t.push(TensorSpec::new(
                        format!("{p}.input_global_scale"),
                        DType::F32,
                        &[1],
                    ));
                }
                t
            }
            SynthScheme::Fp8Dynamic => vec![
                TensorSpec::new(format!("{p}.weight"), DType::F8E4M3, &[out, inp]),
                TensorSpec::new(format!("{p}.weight_scale"), DType::BF16, &[out, 1]),
            ],
            SynthScheme::Fp8AttnNvfp4Experts => unreachable!("resolved by for_linear"),
            SynthScheme::Mxfp4 | SynthScheme::Mxfp4A4 => {
                need(inp % 32 == 0, "MXFP4 needs in % 32 == 0")?;
                vec![
                    TensorSpec::new(format!("{p}.weight_packed"), DType::U8, &[out, inp / 2]),
                    TensorSpec::new(format!("{p}.weight_scale"), DType::U8, &[out, inp / 32]),
                ]
            }
            SynthScheme::Mxfp8 | SynthScheme::Mxfp8A8 => {
                need(inp % 32 == 0, "MXFP8 needs in % 32 == 0")?;
                vec![
                    TensorSpec::new(format!("{p}.weight"), DType::F8E4M3, &[out, inp]),
                    TensorSpec::new(format!("{p}.weight_scale"), DType::U8, &[out, inp / 32]),
                ]
            }
            SynthScheme::AwqGemvInt4 => {
                need(
                    inp % 128 == 0 && out % 8 == 0,
                    "INT4 g128 needs in % 128 == 0 and out % 8 == 0",
                )?;
                let width = quantize::awq_gemv_width(inp / 128);
                vec![
                    TensorSpec::new(format!("{p}.qweight"), DType::I32, &[out, inp / 8]),
                    TensorSpec::new(format!("{p}.qzeros"), DType::I32, &[out, width]),
                    TensorSpec::new(format!("{p}.scales"), DType::F16, &[out, width * 8]),
                ]
            }
            SynthScheme::GptqInt4 | SynthScheme::AwqInt4 => {
                need(
                    inp % 128 == 0 && out % 8 == 0,
                    "INT4 g128 needs in % 128 == 0 and out % 8 == 0",
                )?;
                let groups = inp / 128;
                let mut t = if self == SynthScheme::GptqInt4 {
                    vec![
                        TensorSpec::new(format!("{p}.qweight"), DType::I32, &[inp / 8, out]),
                        TensorSpec::new(format!("{p}.qzeros"), DType::I32, &[groups, out / 8]),
                    ]
                } else {
                    vec![
                        TensorSpec::new(format!("{p}.qweight"), DType::I32, &[inp, out / 8]),
                        TensorSpec::new(format!("{p}.qzeros"), DType::I32, &[groups, out / 8]),
                    ]
                };
                t.push(TensorSpec::new(
                    format!("{p}.scales"),
                    DType::F16,
                    &[groups, out],
                ));
                if self == SynthScheme::GptqInt4 {
                    t.push(TensorSpec::new(format!("{p}.g_idx"), DType::I32, &[inp]));
                }
                t
            }
            SynthScheme::Fp8Block => vec![
                TensorSpec::new(format!("{p}.weight"), DType::F8E4M3, &[out, inp]),
                TensorSpec::new(
                    format!("{p}.weight_scale_inv"),
                    DType::F32,
                    &[out.div_ceil(FP8_BLOCK), inp.div_ceil(FP8_BLOCK)],
                ),
            ],
            SynthScheme::ModeloptNvfp4 => {
                need(inp % 16 == 0, "NVFP4 needs in % 16 == 0")?;
                vec![
                    TensorSpec::new(format!("{p}.weight"), DType::U8, &[out, inp / 2]),
                    TensorSpec::new(format!("{p}.weight_scale"), DType::F8E4M3, &[out, inp / 16]),
                    TensorSpec::new(format!("{p}.weight_scale_2"), DType::F32, &[]),
                    TensorSpec::new(format!("{p}.input_scale"), DType::F32, &[]),
                ]
            }
        })
    }

    /// `config.json["quantization_config"]` as compressed-tensors 0.20.0 writes it for the
    /// llm-compressor preset (the form of the fixtures), `None` for dense.
    fn quantization_config(self, spec: &ModelSpec) -> Option<Value> {
        // The quantizers' own configs name no modules: those holding their tensors are quantized.
        match self {
            SynthScheme::GptqInt4 => {
                return Some(json!({
                    "bits": 4, "checkpoint_format": "gptq", "desc_act": false, "group_size": 128,
                    "lm_head": false, "pack_dtype": "int32", "quant_method": "gptq", "sym": true,
                }));
            }
            SynthScheme::AwqInt4 | SynthScheme::AwqGemvInt4 => {
                let version = if self == SynthScheme::AwqInt4 {
                    "gemm"
                } else {
                    "gemv"
                };
                return Some(json!({
                    "bits": 4, "group_size": 128, "modules_to_not_convert": null,
                    "quant_method": "awq", "version": version, "zero_point": true,
                }));
            }
            SynthScheme::Fp8Block => {
                return Some(json!({
                    "activation_scheme": "dynamic", "quant_method": "fp8",
                    "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
                }));
            }
            SynthScheme::Mxfp4 if spec.arch == shapes::Arch::GptOss => {
                return Some(json!({
                    "modules_to_not_convert": [
                        "model.layers.*.self_attn", "model.layers.*.mlp.router",
                        "model.embed_tokens", "lm_head",
                    ],
                    "quant_method": "mxfp4",
                }));
            }
            SynthScheme::ModeloptNvfp4 => {
                return Some(json!({
                    "exclude_modules": spec.ignored_modules(), "group_size": 16,
                    "kv_cache_quant_algo": null, "quant_algo": "NVFP4", "quant_method": "modelopt",
                }));
            }
            _ => {}
        }
        let group = |s: SynthScheme, targets: Value| {
            let (format, weights, input) = s.group_args()?;
            Some(json!({
                "format": format,
                "input_activations": input,
                "output_activations": null,
                "targets": targets,
                "weights": weights,
            }))
        };
        let (groups, format) = match self {
            SynthScheme::Fp8AttnNvfp4Experts => (
                json!({
                    "group_0": group(SynthScheme::Fp8Dynamic, json!(["re:.*self_attn\\..*", "re:.*mlp\\.(gate|up|down)_proj$", "re:.*shared_experts?\\.(gate|up|down)_proj$"]))?,
                    "group_1": group(SynthScheme::Nvfp4, json!(["re:.*\\.experts\\..*"]))?,
                }),
                "mixed-precision",
            ),
            s => (
                json!({"group_0": group(s, json!(["Linear"]))?}),
                s.group_args()?.0,
            ),
        };
        Some(json!({
            "config_groups": groups,
            "format": format,
            "global_compression_ratio": null,
            "ignore": spec.ignored_modules(),
            "kv_cache_scheme": null,
            "moe_sparsity_config": null,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
            "sparsity_config": {},
            "transform_config": {},
            "version": "0.20.0",
        }))
    }

    /// (format, weights, input_activations) of a single-scheme config group; `None` for dense.
    fn group_args(self) -> Option<(&'static str, Value, Value)> {
        let weights_int = |symmetric: bool| {
            json!({"dynamic": false, "group_size": 128, "num_bits": 4, "observer": "memoryless_minmax",
                   "strategy": "group", "symmetric": symmetric, "type": "int"})
        };
        let nvfp4_weights = json!({"dynamic": false, "group_size": 16, "num_bits": 4,
            "observer": "memoryless_minmax", "scale_dtype": "torch.float8_e4m3fn",
            "strategy": "tensor_group", "symmetric": true, "type": "float"});
        Some(match self {
            SynthScheme::DenseBf16
            | SynthScheme::Fp8AttnNvfp4Experts
            | SynthScheme::GptqInt4
            | SynthScheme::AwqInt4
            | SynthScheme::AwqGemvInt4
            | SynthScheme::Fp8Block
            | SynthScheme::ModeloptNvfp4 => return None,
            SynthScheme::Mxfp4
            | SynthScheme::Mxfp4A4
            | SynthScheme::Mxfp8
            | SynthScheme::Mxfp8A8 => {
                let bits = if matches!(self, SynthScheme::Mxfp4 | SynthScheme::Mxfp4A4) {
                    4
                } else {
                    8
                };
                let args = |dynamic: bool| {
                    json!({"dynamic": dynamic, "group_size": 32,
                    "num_bits": bits, "scale_dtype": "torch.uint8", "strategy": "group",
                    "symmetric": true, "type": "float"})
                };
                (
                    if bits == 4 {
                        "mxfp4-pack-quantized"
                    } else {
                        "mxfp8-quantized"
                    },
                    args(false),
                    if matches!(self, SynthScheme::Mxfp4A4 | SynthScheme::Mxfp8A8) {
                        args(true)
                    } else {
                        Value::Null
                    },
                )
            }
            SynthScheme::W4a16G128 => ("pack-quantized", weights_int(true), Value::Null),
            SynthScheme::W4a16G128Asym => ("pack-quantized", weights_int(false), Value::Null),
            SynthScheme::Nvfp4a16 => ("nvfp4-pack-quantized", nvfp4_weights, Value::Null),
            SynthScheme::Nvfp4 => (
                "nvfp4-pack-quantized",
                nvfp4_weights,
                json!({"dynamic": "local", "group_size": 16, "num_bits": 4, "observer": "static_minmax",
                       "scale_dtype": "torch.float8_e4m3fn", "strategy": "tensor_group",
                       "symmetric": true, "type": "float"}),
            ),
            SynthScheme::Fp8Dynamic => (
                "float-quantized",
                json!({"dynamic": false, "group_size": null, "num_bits": 8, "observer": "memoryless_minmax",
                       "strategy": "channel", "symmetric": true, "type": "float"}),
                json!({"dynamic": true, "group_size": null, "num_bits": 8, "strategy": "token",
                       "symmetric": true, "type": "float"}),
            ),
        })
    }
}

/// Writes pretty JSON with a trailing newline (transformers' `to_json_file` layout).
fn write_json(path: &Path, value: &Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| Error::format(path, e))?;
    text.push('\n');
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}

/// Writes a synthetic checkpoint of `shape` in `scheme` into `out_dir` (created if missing;
/// existing files of the same names are overwritten). `progress` is called after every tensor.
pub fn write_checkpoint(
    shape: SynthShape,
    scheme: SynthScheme,
    out_dir: &Path,
    seed: u64,
    progress: impl FnMut(Progress<'_>),
) -> Result<SynthSummary> {
    write_checkpoint_sharded(
        shape,
        None,
        scheme,
        out_dir,
        seed,
        DEFAULT_MAX_SHARD_BYTES,
        progress,
    )
}

/// [`write_checkpoint`] with an explicit shard size limit (tests force several shards).
/// With `layers`, only the first that many decoder layers (a slice of a model too large to
/// write whole; the embedding, final norm and lm_head are kept).
pub(crate) fn write_checkpoint_sharded(
    shape: SynthShape,
    layers: Option<usize>,
    scheme: SynthScheme,
    out_dir: &Path,
    seed: u64,
    max_shard_bytes: u64,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<SynthSummary> {
    let start = Instant::now();
    let mut spec = shape.spec();
    if let Some(n) = layers {
        if n == 0 || n > spec.layers {
            return Err(Error::InvalidArgument(format!(
                "--layers {n}: {shape:?} has {} decoder layers",
                spec.layers
            )));
        }
        spec.layers = n;
    }
    let units = units(&spec);
    let groups = units
        .iter()
        .map(|u| match u {
            Unit::Dense { name, shape, .. } => {
                Ok(vec![TensorSpec::new(name.clone(), DType::BF16, shape)])
            }
            Unit::Linears(ls) => Ok(ls
                .iter()
                .map(|l| scheme.linear_tensors(l))
                .collect::<Result<Vec<_>>>()?
                .concat()),
            Unit::Experts {
                prefix,
                experts,
                parts,
            } => match scheme {
                SynthScheme::Mxfp4 => Ok(parts
                    .iter()
                    .flat_map(|&(name, out, inp)| {
                        [
                            TensorSpec::new(
                                format!("{prefix}.{name}_blocks"),
                                DType::U8,
                                &[*experts, out, inp / 32, 16],
                            ),
                            TensorSpec::new(
                                format!("{prefix}.{name}_scales"),
                                DType::U8,
                                &[*experts, out, inp / 32],
                            ),
                        ]
                    })
                    .collect()),
                SynthScheme::DenseBf16 => Ok(parts
                    .iter()
                    .map(|&(name, out, inp)| {
                        let name = format!("{prefix}.{name}");
                        TensorSpec::new(name, DType::BF16, &[*experts, inp, out])
                    })
                    .collect()),
                _ => Ok(expert_linears(prefix, *experts, parts)
                    .iter()
                    .map(|l| scheme.linear_tensors(l))
                    .collect::<Result<Vec<_>>>()?
                    .concat()),
            },
        })
        .collect::<Result<Vec<_>>>()?;
    let tensors = groups.iter().map(Vec::len).sum();

    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let config = spec.config_json(scheme.quantization_config(&spec));
    let mut json_files = Vec::new();
    for (name, value) in [
        ("config.json", config),
        ("generation_config.json", spec.generation_config_json()),
    ] {
        let path = out_dir.join(name);
        write_json(&path, &value)?;
        json_files.push(path);
    }

    let mut w = CheckpointWriter::plan(out_dir, &groups, max_shard_bytes)?;
    let total = w.total_size();
    // Generation (rayon) runs one tensor ahead of the disk writes on this thread; the
    // channel's bound keeps at most three tensors in memory. Dropping the receiver on a
    // write error stops the generator at its next send.
    let (tx, rx) = std::sync::mpsc::sync_channel::<(String, Vec<u8>)>(1);
    std::thread::scope(|s| -> Result<()> {
        s.spawn(move || {
            for unit in &units {
                if generate_unit(scheme, seed, unit, |n, d| tx.send((n.to_string(), d))).is_err() {
                    break;
                }
            }
        });
        for (name, data) in rx {
            w.write(&name, &data)?;
            progress(Progress {
                tensor: &name,
                bytes_done: w.bytes_done(),
                bytes_total: total,
            });
        }
        Ok(())
    })?;
    let shards = w.shard_count();
    let mut files = w.finish(out_dir)?;
    files.extend(json_files);
    let mut bytes_written = 0;
    for f in &files {
        bytes_written += std::fs::metadata(f).map_err(|e| Error::io(f, e))?.len();
    }
    Ok(SynthSummary {
        shape,
        layers: spec.layers,
        scheme,
        seed,
        out_dir: out_dir.to_path_buf(),
        params: spec.params(),
        tensors,
        shards,
        tensor_bytes: total,
        bytes_written,
        files,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Generates (and quantizes) the tensors of one unit, handing each to `put` as soon as it
/// exists; stops at the first error of `put`.
fn generate_unit<E>(
    scheme: SynthScheme,
    seed: u64,
    unit: &Unit,
    mut put: impl FnMut(&str, Vec<u8>) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let linears = match unit {
        Unit::Dense { name, shape, init } => {
            let (rows, cols) = match shape[..] {
                [r, c] => (r, c),
                _ => (1, shape.iter().product()),
            };
            return put(
                name,
                quantize::dense_bf16(tensor_seed(seed, name), rows, cols, *init),
            );
        }
        Unit::Linears(ls) => ls,
        Unit::Experts {
            prefix,
            experts,
            parts,
        } => {
            return match scheme {
                SynthScheme::Mxfp4 => {
                    for &(name, out, inp) in parts {
                        let (mut blocks, mut scales) = (Vec::new(), Vec::new());
                        for e in 0..*experts {
                            let ts = tensor_seed(seed, &format!("{prefix}.{e}.{name}.weight"));
                            let q = quantize::mxfp4(ts, out, inp, WEIGHT_STD);
                            blocks.extend(q.packed);
                            scales.extend(q.scale);
                        }
                        put(&format!("{prefix}.{name}_blocks"), blocks)?;
                        put(&format!("{prefix}.{name}_scales"), scales)?;
                    }
                    Ok(())
                }
                SynthScheme::DenseBf16 => {
                    for &(name, out, inp) in parts {
                        let name = format!("{prefix}.{name}");
                        let init = Init::Normal(WEIGHT_STD);
                        let data = quantize::dense_bf16(
                            tensor_seed(seed, &name),
                            experts * inp,
                            out,
                            init,
                        );
                        put(&name, data)?;
                    }
                    Ok(())
                }
                _ => {
                    let unit = Unit::Linears(expert_linears(prefix, *experts, parts));
                    generate_unit(scheme, seed, &unit, put)
                }
            };
        }
    };
    let init = Init::Normal(WEIGHT_STD);
    let seed_of = |l: &Linear| tensor_seed(seed, &format!("{}.weight", l.prefix));
    // A unit's linears share one scheme (q/k/v, gate/up of one MLP or expert).
    let scheme = linears
        .first()
        .map_or(scheme, |l| scheme.for_linear(&l.prefix));
    // One NVFP4 global scale for the whole unit (fused q/k/v, gate/up).
    let global_scale = match scheme {
        SynthScheme::Nvfp4 | SynthScheme::Nvfp4a16 | SynthScheme::ModeloptNvfp4 => {
            let amax = linears
                .iter()
                .map(|l| quantize::absmax(seed_of(l), l.out, l.inp, init))
                .fold(0f32, f32::max);
            quantize::nvfp4_global_scale(amax)
        }
        _ => 1.0,
    };
    for l in linears {
        let (p, ts) = (&l.prefix, seed_of(l));
        match scheme {
            SynthScheme::DenseBf16 => {
                put(
                    &format!("{p}.weight"),
                    quantize::dense_bf16(ts, l.out, l.inp, init),
                )?;
            }
            SynthScheme::W4a16G128 | SynthScheme::W4a16G128Asym => {
                let symmetric = scheme == SynthScheme::W4a16G128;
                let q = quantize::int4(ts, l.out, l.inp, 128, WEIGHT_STD, symmetric);
                put(&format!("{p}.weight_packed"), q.packed)?;
                put(&format!("{p}.weight_scale"), q.scale)?;
                let shape: Vec<u8> = [l.out as i64, l.inp as i64]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                put(&format!("{p}.weight_shape"), shape)?;
                if let Some(zp) = q.zero_point {
                    put(&format!("{p}.weight_zero_point"), zp)?;
                }
            }
            SynthScheme::Nvfp4 | SynthScheme::Nvfp4a16 => {
                let q = quantize::nvfp4(ts, l.out, l.inp, WEIGHT_STD, global_scale);
                put(&format!("{p}.weight_packed"), q.packed)?;
                put(&format!("{p}.weight_scale"), q.scale)?;
                put(
                    &format!("{p}.weight_global_scale"),
                    global_scale.to_le_bytes().to_vec(),
                )?;
                if scheme == SynthScheme::Nvfp4 {
                    put(
                        &format!("{p}.input_global_scale"),
                        INPUT_GLOBAL_SCALE.to_le_bytes().to_vec(),
                    )?;
                }
            }
            SynthScheme::Fp8Dynamic => {
                let q = quantize::fp8(ts, l.out, l.inp, WEIGHT_STD);
                put(&format!("{p}.weight"), q.weight)?;
                put(&format!("{p}.weight_scale"), q.scale)?;
            }
            SynthScheme::Fp8AttnNvfp4Experts => unreachable!("resolved by for_linear"),
            SynthScheme::Mxfp4 | SynthScheme::Mxfp4A4 => {
                let q = quantize::mxfp4(ts, l.out, l.inp, WEIGHT_STD);
                put(&format!("{p}.weight_packed"), q.packed)?;
                put(&format!("{p}.weight_scale"), q.scale)?;
            }
            SynthScheme::Mxfp8 | SynthScheme::Mxfp8A8 => {
                let q = quantize::mxfp8(ts, l.out, l.inp, WEIGHT_STD);
                put(&format!("{p}.weight"), q.weight)?;
                put(&format!("{p}.weight_scale"), q.scale)?;
            }
            SynthScheme::GptqInt4 | SynthScheme::AwqInt4 | SynthScheme::AwqGemvInt4 => {
                let gptq = scheme == SynthScheme::GptqInt4;
                let q = quantize::int4(ts, l.out, l.inp, 128, WEIGHT_STD, gptq);
                let t = match scheme {
                    SynthScheme::GptqInt4 => quantize::gptq_from_int4(&q, l.out, l.inp, 128),
                    SynthScheme::AwqInt4 => quantize::awq_from_int4(&q, l.out, l.inp, 128),
                    _ => quantize::awq_gemv_from_int4(&q, l.out, l.inp, 128),
                };
                put(&format!("{p}.qweight"), t.qweight)?;
                put(&format!("{p}.qzeros"), t.qzeros)?;
                put(&format!("{p}.scales"), t.scales)?;
                if gptq {
                    let g_idx: Vec<u8> = (0..l.inp)
                        .flat_map(|k| ((k / 128) as i32).to_le_bytes())
                        .collect();
                    put(&format!("{p}.g_idx"), g_idx)?;
                }
            }
            SynthScheme::Fp8Block => {
                let q = quantize::fp8_block(ts, l.out, l.inp, WEIGHT_STD, FP8_BLOCK);
                put(&format!("{p}.weight"), q.weight)?;
                put(&format!("{p}.weight_scale_inv"), q.scale_inv)?;
            }
            SynthScheme::ModeloptNvfp4 => {
                // The same codes as NVFP4; ModelOpt stores the reciprocals of the global scales.
                let q = quantize::nvfp4(ts, l.out, l.inp, WEIGHT_STD, global_scale);
                put(&format!("{p}.weight"), q.packed)?;
                put(&format!("{p}.weight_scale"), q.scale)?;
                put(
                    &format!("{p}.weight_scale_2"),
                    (1.0 / global_scale).to_le_bytes().to_vec(),
                )?;
                put(
                    &format!("{p}.input_scale"),
                    (1.0 / INPUT_GLOBAL_SCALE).to_le_bytes().to_vec(),
                )?;
            }
        }
    }
    Ok(())
}

/// Refuses a non-empty `out` (a synthetic checkpoint must never mix with or overwrite a real
/// one), then writes the checkpoint, calling `progress` after every tensor.
pub fn run(
    shape: SynthShape,
    layers: Option<usize>,
    scheme: SynthScheme,
    out: &Path,
    seed: u64,
    progress: impl FnMut(Progress<'_>),
) -> Result<SynthSummary> {
    if out.exists() {
        let mut entries = std::fs::read_dir(out).map_err(|e| Error::io(out, e))?;
        if entries.next().is_some() {
            return Err(Error::InvalidArgument(format!(
                "{} exists and is not empty; refusing to write a synthetic checkpoint there",
                out.display()
            )));
        }
    }
    write_checkpoint_sharded(
        shape,
        layers,
        scheme,
        out,
        seed,
        DEFAULT_MAX_SHARD_BYTES,
        progress,
    )
}

#[cfg(test)]
mod tests;
