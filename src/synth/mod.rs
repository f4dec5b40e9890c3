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
mod scheme;
mod shapes;
mod units;
mod writer;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use crate::{Error, Result};
use quantize::{Init, tensor_seed};
use units::{Linear, Unit, expert_linears, units};
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
    /// Qwen/Qwen3.5-35B-A3B's language model (gated DeltaNet hybrid; 256 experts, 8 per
    /// token, a gated shared expert).
    #[value(name = "qwen3.5-35b-a3b")]
    #[serde(rename = "qwen3.5-35b-a3b")]
    Qwen3_5_35bA3b,
    /// Qwen/Qwen3-Next-80B-A3B (gated DeltaNet hybrid with its projections fused; 512 experts,
    /// 10 per token, a gated shared expert).
    #[value(name = "qwen3-next-80b-a3b")]
    #[serde(rename = "qwen3-next-80b-a3b")]
    Qwen3Next80bA3b,
    /// A Qwen3.5 9B-style dense hybrid (transformers' Qwen3_5TextConfig defaults).
    #[value(name = "qwen3.5-9b")]
    #[serde(rename = "qwen3.5-9b")]
    Qwen3_5_9b,
    /// Qwen/Qwen3.5-27B's language model (dense gated DeltaNet hybrid: 48 DeltaNets of 48
    /// value heads, 16 gated attention layers, MLPs of 17,408).
    #[value(name = "qwen3.5-27b")]
    #[serde(rename = "qwen3.5-27b")]
    Qwen3_5_27b,
    /// LiquidAI/LFM2-1.2B (short convolutions and 6 attention layers of 16).
    #[value(name = "lfm2-1.2b")]
    #[serde(rename = "lfm2-1.2b")]
    Lfm2_1_2b,
    /// LiquidAI/LFM2-2.6B (22 short convolutions, 8 attention layers of 32 heads, MLPs of
    /// 10,752).
    #[value(name = "lfm2-2.6b")]
    #[serde(rename = "lfm2-2.6b")]
    Lfm2_2_6b,
    /// nvidia/Nemotron-H-8B-Base-8K (Mamba-2, attention and MLP blocks).
    #[value(name = "nemotron-h-8b")]
    #[serde(rename = "nemotron-h-8b")]
    NemotronH8b,
    /// nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B (Mamba-2, attention and mixtures of 128
    /// ungated experts, 6 per token). Write a slice with `--layers`.
    #[value(name = "nemotron-3-nano-30b-a3b")]
    #[serde(rename = "nemotron-3-nano-30b-a3b")]
    Nemotron3Nano30bA3b,
    /// ibm-granite/granite-4.0-h-small (36 Mamba-2 and 4 attention layers without positions;
    /// every layer a shared MLP of 1536 and 72 experts of 768, 10 per token). Write a slice
    /// with `--layers`.
    #[value(name = "granite-4.0-h-small")]
    #[serde(rename = "granite-4.0-h-small")]
    Granite4HSmall,
    /// moonshotai/Kimi-Linear-48B-A3B (Kimi Delta Attention in 20 of 27 layers, latent
    /// attention without RoPE in 7; 256 experts of 1024, 8 per token, a shared expert). Write a
    /// slice with `--layers`.
    #[value(name = "kimi-linear-48b-a3b")]
    #[serde(rename = "kimi-linear-48b-a3b")]
    KimiLinear48bA3b,
    /// Kimi-Linear's layout at test size (4 layers: KDA, KDA, latent attention, KDA).
    #[value(name = "tiny-kimi-linear")]
    #[serde(rename = "tiny-kimi-linear")]
    TinyKimiLinear,
    /// MiniMaxAI/MiniMax-M2 (229B: 256 experts of 1536, 8 per token, a sigmoid router with a
    /// selection bias; q/k norms over the whole projection, 64 of 128 values rotated). Write
    /// a slice with `--layers`.
    #[value(name = "minimax-m2")]
    #[serde(rename = "minimax-m2")]
    MiniMaxM2,
    /// meta-llama/Llama-4-Scout-17B-16E's language model (109B: 48 layers, each 16 experts of
    /// 8192 with the sigmoid of the top 1 on its input and a shared expert; chunked attention
    /// with RoPE on three layers of four). Write a slice with `--layers`.
    #[value(name = "llama4-scout")]
    #[serde(rename = "llama4-scout")]
    Llama4Scout,
    /// Llama 4's layout at test size (4 layers, mixtures of 8 experts of 128 on every second).
    #[value(name = "tiny-llama4")]
    #[serde(rename = "tiny-llama4")]
    TinyLlama4,
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
    /// google/gemma-4-31B's language model (60 layers, every sixth full attention with heads
    /// of 512 whose values are the key projection's, vocab 262k).
    #[value(name = "gemma4-31b")]
    #[serde(rename = "gemma4-31b")]
    Gemma4_31b,
    /// google/gemma-4-26B-A4B's language model (30 layers, each a dense MLP of 2112 beside 128
    /// experts of 704, 8 per token). Write a slice with `--layers`.
    #[value(name = "gemma4-26b-a4b")]
    #[serde(rename = "gemma4-26b-a4b")]
    Gemma4_26bA4b,
    /// Gemma 4's mixture at test size (6 layers, 8 experts of 128, 2 per token).
    #[value(name = "tiny-gemma4")]
    #[serde(rename = "tiny-gemma4")]
    TinyGemma4,
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
    /// deepseek-ai/DeepSeek-V3.2: DeepSeek-V3 with sparse attention (a 64-head lightning
    /// indexer a layer keeping 2048 keys a query). Write a slice with `--layers`.
    #[value(name = "deepseek-v3.2")]
    #[serde(rename = "deepseek-v3.2")]
    DeepseekV32,
    /// zai-org/GLM-5 (78 layers, 256 experts of 2048, 8 per token; latent attention with
    /// value heads of 256; a 32-head indexer keeping 2048 keys). Write a slice with `--layers`.
    #[value(name = "glm-5")]
    #[serde(rename = "glm-5")]
    Glm5,
    /// zai-org/GLM-5.3-Flash's language model as transformers' `Glm5NextTextConfig` defaults
    /// describe it (45 layers: Kimi Delta Attention of 64 heads of 128 under the safe gate,
    /// every fourth layer latent attention without RoPE with a 32-head indexer over pools of
    /// 16 tokens keeping 2048; 288 experts of 2048, 8 per token, after 3 dense layers; 4
    /// hyper-connected streams). Write a slice with `--layers`.
    #[value(name = "glm5.3-flash")]
    #[serde(rename = "glm5.3-flash")]
    Glm53Flash,
    /// GLM-5.3-Flash's layout at test size (4 layers: KDA, KDA, KDA, latent attention).
    #[value(name = "tiny-glm5-next")]
    #[serde(rename = "tiny-glm5-next")]
    TinyGlm5Next,
    /// mistralai/Mistral-Small-4-119B-2603's language model (`Mistral4ForCausalLM`: 36
    /// layers of latent attention and 128 experts of 2048, 4 per token and a shared one, a
    /// grouped softmax router). Write a slice with `--layers`.
    #[value(name = "mistral-small-4")]
    #[serde(rename = "mistral-small-4")]
    MistralSmall4,
    /// mistralai/Mistral-Large-4-1T-A52B's language model (`MistralLarge4TextModel`: 72
    /// layers of latent attention, every fourth without RoPE, 128 experts of 6144, 4 per token
    /// and a shared one, a 32-head indexer keeping 2048 keys). Write a slice with `--layers`.
    #[value(name = "mistral-large-4")]
    #[serde(rename = "mistral-large-4")]
    MistralLarge4,
    /// Mistral Large 4's layout at test size (4 layers, the last without RoPE, 8 experts of
    /// 128, an 8-head indexer keeping 64 keys).
    #[value(name = "tiny-mistral-large4")]
    #[serde(rename = "tiny-mistral-large4")]
    TinyMistralLarge4,
    /// Mistral 4's layout at test size (hidden 256, 8 experts of width 128, 2 per token in
    /// 2 of 4 groups, layer 0 dense).
    #[value(name = "tiny-mistral4")]
    #[serde(rename = "tiny-mistral4")]
    TinyMistral4,
    /// DeepSeek-V3.2's layout at test size (DeepSeek-V3's, an 8-head indexer keeping 64 keys).
    #[value(name = "tiny-deepseek-v3.2")]
    #[serde(rename = "tiny-deepseek-v3.2")]
    TinyDeepseekV32,
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
    /// Qwen3.5-MoE's layout at the size of the tests' fixtures.
    #[value(name = "tiny-qwen3.5-moe")]
    #[serde(rename = "tiny-qwen3.5-moe")]
    TinyQwen3_5Moe,
    /// Qwen3-Next's layout at the size of the tests' fixtures.
    #[value(name = "tiny-qwen3-next")]
    #[serde(rename = "tiny-qwen3-next")]
    TinyQwen3Next,
    /// LFM2's layout at the size of the tests' fixtures.
    #[value(name = "tiny-lfm2")]
    #[serde(rename = "tiny-lfm2")]
    TinyLfm2,
    /// Nemotron-H's layout at the size of the tests' fixtures.
    #[value(name = "tiny-nemotron-h")]
    #[serde(rename = "tiny-nemotron-h")]
    TinyNemotronH,
    /// Granite 4.0-H's layout at the size of the tests' fixtures.
    #[value(name = "tiny-granite-4.0-h")]
    #[serde(rename = "tiny-granite-4.0-h")]
    TinyGranite4H,
    /// MiniMax-M2's layout at the size of the tests' fixtures (hidden 256, 8 experts of 128,
    /// 2 per token).
    #[value(name = "tiny-minimax-m2")]
    #[serde(rename = "tiny-minimax-m2")]
    TinyMiniMaxM2,
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
    /// W8A8 (INT8): INT8 weights per channel, INT8 per-token dynamic activations
    /// (`int-quantized`).
    #[value(name = "w8a8-int8")]
    #[serde(rename = "w8a8-int8")]
    W8a8Int8,
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
    // The bundled tokenizer, so that `eval` reads the directory without flags (random weights
    // make any text's PPL meaningless; its 512 token IDs are valid in every shape).
    for (name, bytes) in crate::assets::tokenizer_files() {
        let path = out_dir.join(name);
        std::fs::write(&path, bytes)
            .map_err(|e| remove_partial(Error::io(&path, e), Vec::new(), &json_files))?;
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
    })
    .map_err(|e| remove_partial(e, w.shard_paths(), &json_files))?;
    let shards = w.shard_count();
    let shard_paths = w.shard_paths();
    let mut files = w
        .finish(out_dir)
        .map_err(|e| remove_partial(e, shard_paths, &json_files))?;
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

/// `e`, after removing what a failed write left (a shard is sized before it is written: on a
/// full disk it would stay full-length and read back as zeros where the writes failed).
fn remove_partial(e: Error, shards: Vec<PathBuf>, json_files: &[PathBuf]) -> Error {
    for f in shards.iter().chain(json_files) {
        let _ = std::fs::remove_file(f);
    }
    let why = e.to_string();
    Error::InvalidArgument(format!(
        "{why} (the partial checkpoint's files were removed)"
    ))
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
            SynthScheme::Fp8Dynamic | SynthScheme::W8a8Int8 => {
                let int8 = scheme == SynthScheme::W8a8Int8;
                let q = quantize::per_channel8(ts, l.out, l.inp, WEIGHT_STD, int8);
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
