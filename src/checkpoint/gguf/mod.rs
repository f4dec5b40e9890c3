//! llama.cpp's GGUF files read as a checkpoint: the model's hyper-parameters from the
//! `{arch}.*` metadata as a transformers-style config (so one parser validates every
//! checkpoint), the tensors under transformers' names, and each ggml type's blocks decoded by
//! the reference (`blocks`) and lowered for the GPUs (`backend::lowering`).

pub mod blocks;
mod iq_grids;
pub mod reader;
pub mod tokenizer;

use std::path::{Path, PathBuf};

use serde_json::{Value as Json, json};

pub use blocks::GgmlType;
pub use reader::{GgufFile, TensorInfo, Value};

use super::mapped::MappedFile;
use crate::{Error, Result};

/// A tensor the converter wrote as a function of transformers' values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StoredAs {
    /// `1 + w` (Gemma's norms).
    PlusOne,
    /// `-exp(w)` (Kimi-Linear's `A_log`).
    NegExp,
}

impl StoredAs {
    /// transformers' value of stored value `v`.
    pub fn undo(self, v: f32) -> f32 {
        match self {
            StoredAs::PlusOne => v - 1.0,
            StoredAs::NegExp => (-v).ln(),
        }
    }
}

/// A family read from GGUF.
struct Family {
    /// llama.cpp's `general.architecture`.
    gguf: &'static str,
    /// The transformers class whose config the metadata becomes.
    class: &'static str,
    /// Whether the converter permuted q and k for adjacent-pair RoPE (llama.cpp's
    /// `LLAMA_ROPE_TYPE_NORM`).
    permuted_qk: bool,
    /// Norms stored as `1 + w` (the converter adds the one that Gemma's and Qwen3.5's RMSNorm
    /// adds; not to Qwen3.5's gated norm, which scales by `w`).
    norms_plus_one: bool,
    /// The family's own names of layer modules (GGUF, transformers), table by table, before the
    /// common ones.
    renames: &'static [&'static [(&'static str, &'static str)]],
}

/// Gemma's sandwich: `ffn_norm` is the norm before the feed-forward.
const GEMMA_RENAMES: &[(&str, &str)] = &[("ffn_norm", "pre_feedforward_layernorm")];

/// Gemma 4's per-layer inputs (their table, the projection of the embeddings and its norm; a
/// layer's gate, projection and norm), each layer's output scalar, and its mixture beside the
/// dense MLP (26B-A4B): the router with its input scale and per-expert scales, the stacks
/// (gate and up in one), the norms around it.
const GEMMA4_RENAMES: &[(&str, &str)] = &[
    ("ffn_gate_inp.scale", "router.scale"),
    ("ffn_down_exps.scale", "router.per_expert_scale"),
    ("ffn_gate_inp", "router.proj"),
    ("ffn_gate_up_exps", "experts.gate_up_proj"),
    ("ffn_down_exps", "experts.down_proj"),
    ("pre_ffw_norm_2", "pre_feedforward_layernorm_2"),
    ("post_ffw_norm_1", "post_feedforward_layernorm_1"),
    ("post_ffw_norm_2", "post_feedforward_layernorm_2"),
    ("per_layer_token_embd", "model.embed_tokens_per_layer"),
    ("per_layer_model_proj", "model.per_layer_model_projection"),
    ("per_layer_proj_norm", "model.per_layer_projection_norm"),
    ("inp_gate", "per_layer_input_gate"),
    ("proj", "per_layer_projection"),
    ("post_norm", "post_per_layer_input_norm"),
    ("layer_output_scale", "layer_scalar"),
];

/// Llama 4's MLPs under `feed_forward`: the dense ones, and the mixtures' router, expert
/// stacks and shared expert.
const LLAMA4_RENAMES: &[(&str, &str)] = &[
    ("ffn_gate_inp", "feed_forward.router"),
    ("ffn_gate_exps", "feed_forward.experts.gate_proj"),
    ("ffn_up_exps", "feed_forward.experts.up_proj"),
    ("ffn_down_exps", "feed_forward.experts.down_proj"),
    ("ffn_gate_shexp", "feed_forward.shared_expert.gate_proj"),
    ("ffn_up_shexp", "feed_forward.shared_expert.up_proj"),
    ("ffn_down_shexp", "feed_forward.shared_expert.down_proj"),
    ("ffn_gate", "feed_forward.gate_proj"),
    ("ffn_up", "feed_forward.up_proj"),
    ("ffn_down", "feed_forward.down_proj"),
];

/// MiniMax-M2's mixture keeps Mixtral's names (`block_sparse_moe`), its selection bias beside
/// the router.
const MINIMAX_M2_RENAMES: &[(&str, &str)] = &[
    ("ffn_gate_inp", "block_sparse_moe.gate"),
    ("exp_probs_b", "block_sparse_moe.e_score_correction_bias"),
];

/// LFM2's own module names (`ModuleNames::LFM2`) and its short convolutions.
const LFM2_RENAMES: &[(&str, &str)] = &[
    ("attn_norm", "operator_norm"),
    ("ffn_norm", "ffn_norm"),
    ("ffn_gate", "feed_forward.w1"),
    ("ffn_up", "feed_forward.w3"),
    ("ffn_down", "feed_forward.w2"),
    ("attn_output", "self_attn.out_proj"),
    ("attn_q_norm", "self_attn.q_layernorm"),
    ("attn_k_norm", "self_attn.k_layernorm"),
    ("shortconv.conv", "conv.conv"),
    ("shortconv.in_proj", "conv.in_proj"),
    ("shortconv.out_proj", "conv.out_proj"),
];

/// Qwen2-MoE's shared expert and its gate.
const QWEN2MOE_RENAMES: &[(&str, &str)] = &[
    ("ffn_gate_inp_shexp", "mlp.shared_expert_gate"),
    ("ffn_gate_shexp", "mlp.shared_expert.gate_proj"),
    ("ffn_up_shexp", "mlp.shared_expert.up_proj"),
    ("ffn_down_shexp", "mlp.shared_expert.down_proj"),
];

/// DeepSeek-style mixtures' shared experts and their router's selection bias (GLM-4.5,
/// DeepSeek-V3).
const SHARED_EXPERTS_RENAMES: &[(&str, &str)] = &[
    ("ffn_gate_shexp", "mlp.shared_experts.gate_proj"),
    ("ffn_up_shexp", "mlp.shared_experts.up_proj"),
    ("ffn_down_shexp", "mlp.shared_experts.down_proj"),
    ("exp_probs_b", "mlp.gate.e_score_correction_bias"),
];

/// DeepSeek's latent attention as the converter stores it: the query through its low rank
/// (`attn_q_a`, its norm, `attn_q_b`; or one `attn_q`), the shared latent and rotated key
/// (`attn_kv_a_mqa`, its norm) and, in older files, `kv_b_proj` whole (`attn_kv_b`; newer
/// files split it per head into `attn_k_b` and `attn_v_b`, put back together by the store).
const DEEPSEEK2_RENAMES: &[(&str, &str)] = &[
    ("attn_q_a", "self_attn.q_a_proj"),
    ("attn_q_a_norm", "self_attn.q_a_layernorm"),
    ("attn_q_b", "self_attn.q_b_proj"),
    ("attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"),
    ("attn_kv_a_norm", "self_attn.kv_a_layernorm"),
    ("attn_kv_b", "self_attn.kv_b_proj"),
];

/// DeepSeek-V3.2's and GLM-5's lightning indexer: its query from the query's low rank, its
/// one key head with a LayerNorm (weight and bias), the per-head weights.
const INDEXER_RENAMES: &[(&str, &str)] = &[
    ("indexer.attn_q_b", "self_attn.indexer.wq_b"),
    ("indexer.attn_k", "self_attn.indexer.wk"),
    ("indexer.k_norm", "self_attn.indexer.k_norm"),
    ("indexer.proj", "self_attn.indexer.weights_proj"),
];

/// Kimi-Linear: Kimi Delta Attention's tensors (`ssm_*`, under transformers' `self_attn`), and
/// every MLP under `block_sparse_moe` (the dense ones as transformers saves them).
const KIMI_LINEAR_RENAMES: &[(&str, &str)] = &[
    ("ssm_conv1d_q", "self_attn.q_conv1d"),
    ("ssm_conv1d_k", "self_attn.k_conv1d"),
    ("ssm_conv1d_v", "self_attn.v_conv1d"),
    ("ssm_a", "self_attn.A_log"),
    ("ssm_dt", "self_attn.dt_bias"),
    ("ssm_f_a", "self_attn.f_a_proj"),
    ("ssm_f_b", "self_attn.f_b_proj"),
    ("ssm_g_a", "self_attn.g_a_proj"),
    ("ssm_g_b", "self_attn.g_b_proj"),
    ("ssm_beta", "self_attn.b_proj"),
    ("ssm_norm", "self_attn.o_norm"),
    ("ffn_gate", "block_sparse_moe.gate_proj"),
    ("ffn_up", "block_sparse_moe.up_proj"),
    ("ffn_down", "block_sparse_moe.down_proj"),
    ("ffn_gate_inp", "block_sparse_moe.gate"),
    (
        "exp_probs_b",
        "block_sparse_moe.gate.e_score_correction_bias",
    ),
    (
        "ffn_gate_shexp",
        "block_sparse_moe.shared_experts.gate_proj",
    ),
    ("ffn_up_shexp", "block_sparse_moe.shared_experts.up_proj"),
    (
        "ffn_down_shexp",
        "block_sparse_moe.shared_experts.down_proj",
    ),
    ("ffn_gate_exps", "block_sparse_moe.experts.gate_proj"),
    ("ffn_up_exps", "block_sparse_moe.experts.up_proj"),
    ("ffn_down_exps", "block_sparse_moe.experts.down_proj"),
];

/// Qwen3.5's gated DeltaNet (`ssm_*`, `attn_qkv` and `attn_gate`, under transformers'
/// `linear_attn`; its gated attention keeps the common names).
const QWEN35_RENAMES: &[(&str, &str)] = &[
    ("attn_qkv", "linear_attn.in_proj_qkv"),
    ("attn_gate", "linear_attn.in_proj_z"),
    ("ssm_beta", "linear_attn.in_proj_b"),
    ("ssm_alpha", "linear_attn.in_proj_a"),
    ("ssm_conv1d", "linear_attn.conv1d"),
    ("ssm_a", "linear_attn.A_log"),
    ("ssm_dt", "linear_attn.dt_bias"),
    ("ssm_norm", "linear_attn.norm"),
    ("ssm_out", "linear_attn.out_proj"),
    ("ssm_ba", "linear_attn.in_proj_ba"),
];

/// Nemotron-H: one mixer a block (Mamba-2's `ssm_*`, the attention, the relu^2 MLP or the
/// mixture of relu^2 experts) under `mixer`, normed by the block's `norm`; the embeddings and
/// final norm as transformers names them.
const NEMOTRON_H_RENAMES: &[(&str, &str)] = &[
    ("token_embd", "model.embeddings"),
    ("output_norm", "model.norm_f"),
    ("attn_norm", "norm"),
    ("ssm_in", "mixer.in_proj"),
    ("ssm_conv1d", "mixer.conv1d"),
    ("ssm_dt", "mixer.dt_bias"),
    ("ssm_a", "mixer.A_log"),
    ("ssm_d", "mixer.D"),
    ("ssm_norm", "mixer.norm"),
    ("ssm_out", "mixer.out_proj"),
    ("attn_q", "mixer.q_proj"),
    ("attn_k", "mixer.k_proj"),
    ("attn_v", "mixer.v_proj"),
    ("attn_output", "mixer.o_proj"),
    ("ffn_up", "mixer.up_proj"),
    ("ffn_down", "mixer.down_proj"),
    ("ffn_gate_inp", "mixer.gate"),
    ("exp_probs_b", "mixer.gate.e_score_correction_bias"),
    ("ffn_up_exps", "mixer.experts.up_proj"),
    ("ffn_down_exps", "mixer.experts.down_proj"),
    ("ffn_up_shexp", "mixer.shared_experts.up_proj"),
    ("ffn_down_shexp", "mixer.shared_experts.down_proj"),
];

/// Granite 4.0-H: the Mamba-2 tensors under `mamba`, the shared MLP's gate, up
/// (`input_linear`'s halves, split by the converter) and `output_linear` (named as a shared
/// expert's where the layer has a mixture), the mixture's router and stacks.
const GRANITE_HYBRID_RENAMES: &[(&str, &str)] = &[
    ("ssm_in", "mamba.in_proj"),
    ("ssm_conv1d", "mamba.conv1d"),
    ("ssm_dt", "mamba.dt_bias"),
    ("ssm_a", "mamba.A_log"),
    ("ssm_d", "mamba.D"),
    ("ssm_norm", "mamba.norm"),
    ("ssm_out", "mamba.out_proj"),
    ("ffn_gate", "shared_mlp.gate_proj"),
    ("ffn_up", "shared_mlp.up_proj"),
    ("ffn_down", "shared_mlp.output_linear"),
    ("ffn_gate_inp", "block_sparse_moe.router.layer"),
    ("ffn_gate_exps", "block_sparse_moe.experts.gate_proj"),
    ("ffn_up_exps", "block_sparse_moe.experts.up_proj"),
    ("ffn_down_exps", "block_sparse_moe.experts.down_proj"),
    ("ffn_gate_shexp", "shared_mlp.gate_proj"),
    ("ffn_up_shexp", "shared_mlp.up_proj"),
    ("ffn_down_shexp", "shared_mlp.output_linear"),
];

/// Falcon-H1: Granite's Mamba-2 names beside Llama's attention, the MLP under
/// `feed_forward` after `pre_ff_layernorm` (which the converter writes without `.weight`), the
/// final norm `final_layernorm`.
const FALCON_H1_RENAMES: &[(&str, &str)] = &[
    ("output_norm", "model.final_layernorm"),
    ("ffn_norm", "pre_ff_layernorm"),
    ("ffn_gate", "feed_forward.gate_proj"),
    ("ffn_up", "feed_forward.up_proj"),
    ("ffn_down", "feed_forward.down_proj"),
];

/// gpt-oss's router (with its bias) and each head's attention sink.
const GPT_OSS_RENAMES: &[(&str, &str)] = &[
    ("ffn_gate_inp", "mlp.router"),
    ("attn_sinks", "self_attn.sinks"),
];

/// LFM2-MoE beyond LFM2's names: its router and expert bias under `feed_forward`, the expert
/// stacks named so that each expert's views take LFM2's `w1`/`w3`/`w2`.
const LFM2MOE_RENAMES: &[(&str, &str)] = &[
    ("ffn_gate_inp", "feed_forward.gate"),
    ("exp_probs_b", "feed_forward.expert_bias"),
    ("ffn_gate_exps", "feed_forward.experts.gate_proj"),
    ("ffn_up_exps", "feed_forward.experts.up_proj"),
    ("ffn_down_exps", "feed_forward.experts.down_proj"),
];

const FAMILIES: [Family; 30] = [
    Family::new("llama", "LlamaForCausalLM", true, false, &[]),
    Family::new("qwen2", "Qwen2ForCausalLM", false, false, &[]),
    // Llama 4: RoPE on adjacent pairs in transformers too (not permuted), its layers'
    // options as llama.cpp assumes them (`llama4_config`).
    Family::new(
        "llama4",
        "Llama4ForCausalLM",
        false,
        false,
        &[LLAMA4_RENAMES],
    ),
    // Mistral 3 (Mistral Small 3.x's and Ministral 3's language models): Llama's layers and
    // permutation; Ministral 3's YaRN and position-scaled queries (`config_json`).
    Family::new("mistral3", "MistralForCausalLM", true, false, &[]),
    Family::new("qwen3", "Qwen3ForCausalLM", false, false, &[]),
    Family::new(
        "qwen2moe",
        "Qwen2MoeForCausalLM",
        false,
        false,
        &[QWEN2MOE_RENAMES],
    ),
    Family::new("qwen3moe", "Qwen3MoeForCausalLM", false, false, &[]),
    // Qwen3-VL's language models: Qwen3's and Qwen3-MoE's layers under the multimodal RoPE
    // (`rope.dimension_sections`), whose sections all take a text token's one position: on
    // text, Qwen3's RoPE. The deepstack inputs come from images only.
    Family::new("qwen3vl", "Qwen3ForCausalLM", false, false, &[]),
    Family::new("qwen3vlmoe", "Qwen3MoeForCausalLM", false, false, &[]),
    Family::new("gemma2", "Gemma2ForCausalLM", false, true, &[GEMMA_RENAMES]),
    Family::new("gemma3", "Gemma3ForCausalLM", false, true, &[GEMMA_RENAMES]),
    // Gemma 4: its norms stored as they are (they scale by `w`).
    Family::new(
        "gemma4",
        "Gemma4ForCausalLM",
        false,
        false,
        &[GEMMA4_RENAMES, GEMMA_RENAMES],
    ),
    // Phi-3 and Phi-4: q, k, v fused in `attn_qkv`, gate and up in `ffn_up` (gate first), as
    // transformers fuses them.
    Family::new(
        "phi3",
        "Phi3ForCausalLM",
        false,
        false,
        &[&[("ffn_up", "mlp.gate_up_proj")]],
    ),
    // GLM-4.5 (and 4.6, 4.7): leading dense layers, then mixtures with shared experts and
    // sigmoid routing; a multi-token-prediction layer, where the file keeps one, not read.
    Family::new(
        "glm4moe",
        "Glm4MoeForCausalLM",
        false,
        false,
        &[SHARED_EXPERTS_RENAMES],
    ),
    // LFM2: short-convolution layers where the per-layer key-value head count is 0.
    Family::new("lfm2", "Lfm2ForCausalLM", false, false, &[LFM2_RENAMES]),
    Family::new(
        "lfm2moe",
        "Lfm2MoeForCausalLM",
        false,
        false,
        &[LFM2MOE_RENAMES, LFM2_RENAMES],
    ),
    // DeepSeek-V3 and Kimi-K2 (llama.cpp's `deepseek2`): latent attention, leading dense
    // layers, then grouped sigmoid routing with shared experts.
    Family::new(
        "deepseek2",
        "DeepseekV3ForCausalLM",
        false,
        false,
        &[DEEPSEEK2_RENAMES, SHARED_EXPERTS_RENAMES],
    ),
    // DeepSeek-V3.2 and GLM-5 (GLM-5.x's `glm-dsa`): DeepSeek-V3's layers and a lightning
    // indexer that keeps each query's top keys (`dsa_config`).
    Family::new(
        "deepseek32",
        "DeepseekV32ForCausalLM",
        false,
        false,
        &[INDEXER_RENAMES, DEEPSEEK2_RENAMES, SHARED_EXPERTS_RENAMES],
    ),
    Family::new(
        "glm-dsa",
        "GlmMoeDsaForCausalLM",
        false,
        false,
        &[INDEXER_RENAMES, DEEPSEEK2_RENAMES, SHARED_EXPERTS_RENAMES],
    ),
    // Mistral 4 (Mistral Small 4's language model): DeepSeek-V3's latent attention and
    // shared experts, grouped softmax routing, gate and up in one stack.
    Family::new(
        "mistral4",
        "Mistral4ForCausalLM",
        false,
        false,
        &[
            &[("ffn_gate_up_exps", "mlp.experts.gate_up_proj")],
            DEEPSEEK2_RENAMES,
            SHARED_EXPERTS_RENAMES,
        ],
    ),
    // Kimi-Linear: Kimi Delta Attention where the per-layer key-value head count is 0,
    // DeepSeek's latent attention without RoPE elsewhere.
    Family::new(
        "kimi-linear",
        "KimiLinearForCausalLM",
        false,
        false,
        &[KIMI_LINEAR_RENAMES, DEEPSEEK2_RENAMES],
    ),
    // Qwen3.5 and Qwen3.5-MoE: gated DeltaNets (their value heads tiled), gated attention
    // every few layers, every norm but the DeltaNet's gated one stored as `1 + w`; the
    // mixture's shared expert as Qwen2-MoE's.
    Family::new(
        "qwen35",
        "Qwen3_5ForCausalLM",
        false,
        true,
        &[QWEN35_RENAMES],
    ),
    Family::new(
        "qwen35moe",
        "Qwen3_5MoeForCausalLM",
        false,
        true,
        &[QWEN35_RENAMES, QWEN2MOE_RENAMES],
    ),
    // Qwen3-Next: Qwen3.5-MoE's layers with the value heads in transformers' order, its
    // `in_proj_qkvz` regrouped by the converter into `attn_qkv` and `attn_gate` and its
    // `in_proj_ba` kept whole (`ssm_ba`, split by the store).
    Family::new(
        "qwen3next",
        "Qwen3NextForCausalLM",
        false,
        true,
        &[QWEN35_RENAMES, QWEN2MOE_RENAMES],
    ),
    // Nemotron-H: Mamba-2, attention (no RoPE) and relu^2 MLP blocks, told apart by the
    // per-layer key-value heads and MLP widths.
    Family::new(
        "nemotron_h",
        "NemotronHForCausalLM",
        false,
        false,
        &[NEMOTRON_H_RENAMES],
    ),
    // Nemotron-H with mixtures (Nemotron 3 Nano): grouped sigmoid routing with a selection
    // bias, a shared expert.
    Family::new(
        "nemotron_h_moe",
        "NemotronHForCausalLM",
        false,
        false,
        &[NEMOTRON_H_RENAMES],
    ),
    // Granite 4.0-H: Mamba-2 and attention layers told apart by the per-layer key-value
    // heads, every layer's shared MLP, Granite's multipliers; q and k permuted as Llama's.
    Family::new(
        "granitehybrid",
        "GraniteMoeHybridForCausalLM",
        true,
        false,
        &[GRANITE_HYBRID_RENAMES],
    ),
    // Falcon-H1: every layer's attention beside a Mamba-2 mixer; the converter folds the muP
    // multipliers into the weights, so the file's model has none.
    Family::new(
        "falcon-h1",
        "FalconH1ForCausalLM",
        false,
        false,
        &[FALCON_H1_RENAMES, GRANITE_HYBRID_RENAMES],
    ),
    // gpt-oss: biased attention with sinks, sliding windows on every other layer, experts with
    // biases (gate and up stored apart, each stack's biases beside it), YaRN RoPE.
    Family::new(
        "gpt-oss",
        "GptOssForCausalLM",
        false,
        false,
        &[GPT_OSS_RENAMES],
    ),
    // MiniMax-M2: q/k norms over the whole projection, partial RoPE, sigmoid routing with a
    // selection bias (`exp_probs_b`), each projection's experts stacked.
    Family::new(
        "minimax-m2",
        "MiniMaxM2ForCausalLM",
        false,
        false,
        &[MINIMAX_M2_RENAMES],
    ),
];

/// Mixtral: Llama's layers (q and k permuted) with a softmax router under Mixtral's name; the
/// expert stacks `ffn_*_exps` read as Mixtral's `w1`/`w3`/`w2` views.
static MIXTRAL: Family = Family::new(
    "llama",
    "MixtralForCausalLM",
    true,
    false,
    &[&[("ffn_gate_inp", "block_sparse_moe.gate")]],
);

/// The families whose llama.cpp graph renormalizes the top k only where
/// `{arch}.expert_weights_norm` is true (`llama-hparams.h`'s default false).
const READS_WEIGHTS_NORM: [&str; 6] = [
    "glm4moe",
    "deepseek2",
    "deepseek32",
    "glm-dsa",
    "mistral4",
    "nemotron_h_moe",
];

impl Family {
    const fn new(
        gguf: &'static str,
        class: &'static str,
        permuted_qk: bool,
        norms_plus_one: bool,
        renames: &'static [&'static [(&'static str, &'static str)]],
    ) -> Self {
        Family {
            gguf,
            class,
            permuted_qk,
            norms_plus_one,
            renames,
        }
    }
}

/// The GGUF file `arg` names, or the one a directory without `config.json` holds (the first
/// part of a split model); None when it is neither.
pub fn find(arg: &Path) -> Result<Option<PathBuf>> {
    let is_gguf = |p: &Path| {
        p.extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    };
    if arg.is_file() {
        return Ok(is_gguf(arg).then(|| arg.to_path_buf()));
    }
    if !arg.is_dir() || arg.join("config.json").exists() {
        return Ok(None);
    }
    let entries = std::fs::read_dir(arg).map_err(|e| Error::io(arg, e))?;
    let mut models: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| is_gguf(p) && split_part(p).is_none_or(|(k, _)| k == 1))
        .collect();
    models.sort();
    match models.len() {
        0 => Ok(None),
        1 => Ok(models.pop()),
        _ => Err(Error::format(
            arg,
            format!(
                "holds {} GGUF models ({}): give --model the one to read",
                models.len(),
                models
                    .iter()
                    .filter_map(|p| p.file_name()?.to_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// `(k, n)` of a split file named `…-0000k-of-0000n.gguf`.
fn split_part(path: &Path) -> Option<(usize, usize)> {
    let stem = path.file_stem()?.to_str()?;
    let (rest, n) = stem.rsplit_once("-of-")?;
    let (_, k) = rest.rsplit_once('-')?;
    Some((k.parse().ok()?, n.parse().ok()?))
}

/// The files of the model whose first file is `path`: every part of a split model
/// (`…-00001-of-00003.gguf`), in order.
pub fn part_paths(path: &Path) -> Result<Vec<PathBuf>> {
    Ok(match split_part(path) {
        Some((1, n)) if n >= 1 => {
            let name = path
                .file_name()
                .and_then(|f| f.to_str())
                .unwrap_or_default();
            let first = format!("-00001-of-{n:05}.gguf");
            let base = name.strip_suffix(&first).ok_or_else(|| {
                Error::format(path, format!("a split GGUF file not named `…{first}`"))
            })?;
            (1..=n)
                .map(|k| path.with_file_name(format!("{base}-{k:05}-of-{n:05}.gguf")))
                .collect()
        }
        Some((k, n)) => {
            return Err(Error::format(
                path,
                format!("part {k} of {n} of a split model: give the first part"),
            ));
        }
        None => vec![path.to_path_buf()],
    })
}

/// A GGUF model's files, mapped and parsed, the first holding the metadata.
pub struct GgufModel {
    pub path: PathBuf,
    pub files: Vec<(PathBuf, MappedFile, GgufFile)>,
}

impl GgufModel {
    /// Opens the model whose (first) file is `path`, with every part of a split model.
    pub fn open(path: &Path) -> Result<Self> {
        let paths = part_paths(path)?;
        let mut files = Vec::with_capacity(paths.len());
        for p in paths {
            let file = std::fs::File::open(&p).map_err(|e| Error::io(&p, e))?;
            let map = MappedFile::new(&p, &file)?;
            let parsed = GgufFile::parse(&p, &map)?;
            files.push((p, map, parsed));
        }
        Ok(Self {
            path: path.to_path_buf(),
            files,
        })
    }

    fn meta(&self) -> &GgufFile {
        &self.files[0].2
    }

    fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.files
            .iter()
            .flat_map(|f| &f.2.tensors)
            .find(|t| t.name == name)
    }

    /// The model's family (llama.cpp's architecture name).
    fn family(&self) -> Result<&'static Family> {
        let arch = self
            .meta()
            .get("general.architecture")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::format(&self.path, "no `general.architecture` string"))?;
        let family = FAMILIES.iter().find(|f| f.gguf == arch).ok_or_else(|| {
            let known: Vec<&str> = FAMILIES.iter().map(|f| f.gguf).collect();
            Error::unsupported(
                self.path.display().to_string(),
                "GGUF architecture",
                format!("`{arch}` (read so far: {})", known.join(", ")),
            )
        })?;
        // llama.cpp writes Mixtral as `llama` with experts.
        let experts = self
            .meta()
            .get("llama.expert_count")
            .and_then(Value::as_u64);
        Ok(match (arch, experts) {
            ("llama", Some(e)) if e > 0 => &MIXTRAL,
            _ => family,
        })
    }

    /// The number at metadata key `key` where there is one; an error naming the key where
    /// its value is not a number.
    fn number(&self, key: &str) -> Result<Option<f64>> {
        self.meta()
            .get(key)
            .map(|v| {
                v.as_f64().ok_or_else(|| {
                    Error::format(
                        &self.path,
                        format!("metadata `{key}` is {}, not a number", v.to_json()),
                    )
                })
            })
            .transpose()
    }

    /// The count at metadata key `key` where there is one; an error naming the key where its
    /// value is not a count.
    fn count(&self, key: &str) -> Result<Option<u64>> {
        self.meta()
            .get(key)
            .map(|v| {
                v.as_u64().ok_or_else(|| {
                    Error::format(
                        &self.path,
                        format!("metadata `{key}` is {}, not a count", v.to_json()),
                    )
                })
            })
            .transpose()
    }

    /// The count at metadata key `key`; an error naming the key where there is none.
    fn required_count(&self, key: &str) -> Result<u64> {
        self.count(key)?
            .ok_or_else(|| Error::format(&self.path, format!("no `{key}` in the metadata")))
    }

    /// The count of each of `layers` layers at metadata key `key`: one for all, or a list of
    /// one a layer (a list may go on over blocks past the scored layers, a multi-token
    /// prediction block's); an error naming the key otherwise.
    fn layer_counts(&self, key: &str, layers: usize) -> Result<Vec<u64>> {
        match self.meta().get(key) {
            Some(Value::Array(list)) if list.len() >= layers => list[..layers]
                .iter()
                .map(Value::as_u64)
                .collect::<Option<Vec<u64>>>(),
            Some(v) => v.as_u64().map(|n| vec![n; layers]),
            None => None,
        }
        .ok_or_else(|| {
            Error::format(
                &self.path,
                format!("metadata `{key}` is not one count for each of {layers} layers"),
            )
        })
    }

    /// The flags at metadata key `key`, one a layer (as [`layer_counts`](Self::layer_counts)),
    /// where the key is a list; an error naming the key where the list is not one flag for
    /// each of `layers` layers.
    fn layer_flags(&self, key: &str, layers: usize) -> Result<Option<Vec<bool>>> {
        let Some(Value::Array(list)) = self.meta().get(key) else {
            return Ok(None);
        };
        let flags: Option<Vec<bool>> = list
            .iter()
            .take(layers)
            .map(|f| match f {
                Value::Bool(b) => Some(*b),
                _ => None,
            })
            .collect();
        match flags {
            Some(f) if f.len() == layers => Ok(Some(f)),
            _ => Err(Error::format(
                &self.path,
                format!("metadata `{key}` is not one flag for each of {layers} layers"),
            )),
        }
    }

    /// Whether the q and k rows were permuted for adjacent-pair RoPE.
    pub fn rope_interleaved(&self) -> Result<bool> {
        Ok(self.family()?.permuted_qk)
    }

    /// Whether the converter reordered the DeltaNets' value heads from transformers' grouped
    /// order to ggml's tiled one (Qwen3.5's `_LinearAttentionVReorderBase`).
    pub fn tiled_value_heads(&self) -> Result<bool> {
        Ok(matches!(self.family()?.gguf, "qwen35" | "qwen35moe"))
    }

    /// Qwen3-Next's `ssm_ba` rows as the converter keeps them, grouped by key head (each key
    /// head's `b`s, then its `a`s): `(key heads, value heads a key head)`; None for other
    /// families.
    pub fn fused_beta_alpha(&self) -> Result<Option<(usize, usize)>> {
        if self.family()?.gguf != "qwen3next" {
            return Ok(None);
        }
        let (heads_key, groups_key) = ("qwen3next.ssm.time_step_rank", "qwen3next.ssm.group_count");
        let key_heads = self.required_count(groups_key)?;
        let value_heads = self.required_count(heads_key)?;
        let per_key_head = self.quotient((heads_key, value_heads), (groups_key, key_heads))?;
        Ok(Some((key_heads as usize, per_key_head as usize)))
    }

    /// transformers' name of tensor `name` in this model's family (see [`hf_name`]).
    pub fn hf_name(&self, name: &str) -> Result<String> {
        Ok(hf_name(name, self.family()?.renames))
    }

    /// How the file stores tensor `name` where not as transformers holds it: Gemma's and
    /// Qwen3.5's norms as `1 + w`, the state-space and delta-rule layers' `A_log` as
    /// `-exp(A_log)`.
    pub fn stored_as(&self, name: &str) -> Result<Option<StoredAs>> {
        let family = self.family()?;
        Ok(
            if family.norms_plus_one
                && name.ends_with("norm.weight")
                && !name.ends_with(".ssm_norm.weight")
            {
                Some(StoredAs::PlusOne)
            } else if name.ends_with(".ssm_a") {
                // Every converter of a state-space or delta-rule layer writes `-exp(A_log)`.
                Some(StoredAs::NegExp)
            } else {
                None
            },
        )
    }

    /// The values of RoPE factor tensor `name` (one divisor a frequency, as llama.cpp's
    /// converter writes them), where the model has it; an error where it is not a vector of
    /// positive floats.
    fn rope_vector(&self, name: &str) -> Result<Option<Vec<f32>>> {
        for (path, map, file) in &self.files {
            let Some(t) = file.tensors.iter().find(|t| t.name == name) else {
                continue;
            };
            let mut values = vec![0f32; t.dims.iter().product()];
            if t.dims.len() != 1 || !t.ty.decode(&map[t.start..t.end], &mut values) {
                return Err(Error::format(
                    path,
                    format!(
                        "tensor `{name}` is {:?} of shape {:?}, not a vector of floats",
                        t.ty,
                        t.shape()
                    ),
                ));
            }
            if let Some(v) = values.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
                return Err(Error::format(
                    path,
                    format!("tensor `{name}` holds {v}, not a positive divisor"),
                ));
            }
            return Ok(Some(values));
        }
        Ok(None)
    }

    /// The model's hyper-parameters as transformers' config for its family would hold them.
    pub fn config_json(&self) -> Result<Json> {
        let family = self.family()?;
        let (arch, class) = (family.gguf, family.class);
        let meta = self.meta();
        let key = |k: &str| format!("{arch}.{k}");
        let get = |k: &str| meta.get(&key(k));
        let wrong = |k: &str, v: &Value, want: &str| {
            Error::format(
                &self.path,
                format!("metadata `{}` is {}, not {want}", key(k), v.to_json()),
            )
        };
        let count = |k: &str| self.count(&key(k));
        let required = |k: &str| self.required_count(&key(k));
        let float = |k: &str| self.number(&key(k));
        let heads = required("attention.head_count")?;
        // A per-layer list of key-value heads (llama.cpp writes one for some families) must
        // hold one value here, or for LFM2, Kimi-Linear and Nemotron-H one value and zeros
        // (their convolution, delta-rule, Mamba-2 and MLP layers).
        let zeros_mark_recurrent = arch.starts_with("lfm2")
            || arch == "kimi-linear"
            || arch.starts_with("nemotron_h")
            || arch == "granitehybrid";
        let mut recurrent_layers = None;
        let kv_heads = match get("attention.head_count_kv") {
            None => heads,
            // Gemma 4 states its sliding and full layers' counts a layer (`gemma4_config`).
            Some(Value::Array(_)) if arch == "gemma4" => heads,
            Some(Value::Array(list)) => {
                let counts: Vec<Option<u64>> = list.iter().map(Value::as_u64).collect();
                let attending = counts
                    .iter()
                    .find(|c| **c != Some(0) || !zeros_mark_recurrent)
                    .copied();
                match attending {
                    Some(Some(n))
                        if counts
                            .iter()
                            .all(|c| *c == Some(n) || zeros_mark_recurrent && *c == Some(0)) =>
                    {
                        if zeros_mark_recurrent {
                            recurrent_layers = Some(counts.iter().map(|c| *c == Some(0)).collect());
                        }
                        n
                    }
                    _ => {
                        return Err(wrong(
                            "attention.head_count_kv",
                            &Value::Array(list.clone()),
                            if zeros_mark_recurrent {
                                "one count for the attention layers and 0 for the others"
                            } else {
                                "one count for every layer"
                            },
                        ));
                    }
                }
            }
            Some(v) => v
                .as_u64()
                .ok_or_else(|| wrong("attention.head_count_kv", v, "a count"))?,
        };
        let hidden = required("embedding_length")?;
        let embed = self
            .tensor("token_embd.weight")
            .ok_or_else(|| Error::format(&self.path, "no tensor `token_embd.weight`"))?;
        let vocab = embed.dims.get(1).copied().unwrap_or(0);
        let token = |k: &str| {
            meta.get(&format!("tokenizer.ggml.{k}"))
                .and_then(Value::as_u64)
        };
        // A multi-token-prediction layer (GLM-4.5's converter keeps it by default) is the last
        // block: scoring does not read it.
        let blocks = required("block_count")?;
        let nextn = count("nextn_predict_layers")?.unwrap_or(0);
        let layers = blocks
            .checked_sub(nextn)
            .filter(|&l| l > 0)
            .ok_or_else(|| {
                Error::format(
                    &self.path,
                    format!(
                        "metadata `{}` is {nextn}, but the file has {blocks} blocks",
                        key("nextn_predict_layers")
                    ),
                )
            })?;
        let mut config = json!({
            "architectures": [class],
            "model_type": arch,
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "rms_norm_eps": float("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6),
            "rope_theta": float("rope.freq_base")?.unwrap_or(10000.0),
            "max_position_embeddings": required("context_length")?,
            "vocab_size": vocab,
            "tie_word_embeddings": self.tensor("output.weight").is_none(),
            "torch_dtype": "float32",
            "bos_token_id": token("bos_token_id"),
            "eos_token_id": token("eos_token_id"),
        });
        // Qwen3.5-MoE has no dense MLP, and no width for one; Nemotron-H states one a block.
        if arch.starts_with("nemotron_h") {
            self.nemotron_h_config(&mut config, arch)?;
        } else if arch == "gemma4" {
            // A width a layer: `gemma4_config`.
        } else if arch != "qwen35moe" {
            config["intermediate_size"] = required("feed_forward_length")?.into();
        } else if let Some(width) = count("feed_forward_length")? {
            config["intermediate_size"] = width.into();
        }
        // A count of 0 (Granite 4.0-H's dense models) is no mixture.
        if let Some(experts) = count("expert_count")?.filter(|&e| e > 0) {
            // Every layer a mixture (the count under Qwen's key and Mixtral's, which MiniMax-M2
            // reads); llama.cpp's qwen3moe graph renormalizes the top k, its qwen2moe graph
            // does not.
            config["num_experts"] = experts.into();
            config["num_local_experts"] = experts.into();
            config["num_experts_per_tok"] = required("expert_used_count")?.into();
            config["moe_intermediate_size"] = match count("expert_feed_forward_length")? {
                Some(width) => width,
                // Granite's experts' and Mixtral's width is `feed_forward_length`.
                None if arch == "granitehybrid" || arch == "llama" => {
                    required("feed_forward_length")?
                }
                None => required("expert_feed_forward_length")?,
            }
            .into();
            // llama.cpp's graph renormalizes the top k where `expert_weights_norm` says so in
            // the families that read that key (the converter writes it only when true), in
            // qwen3moe's always, in qwen2moe's never.
            config["norm_topk_prob"] =
                (!(arch == "qwen2moe" || READS_WEIGHTS_NORM.contains(&arch))).into();
            if let Some(shared) = count("expert_shared_feed_forward_length")? {
                config["shared_expert_intermediate_size"] = shared.into();
            }
            // DeepSeek-style keys (GLM-4.5): the routed count, shared experts of the routed
            // width, leading dense layers, the routed scale and renormalization, the groups.
            config["n_routed_experts"] = experts.into();
            for (gguf_key, hf) in [
                ("expert_shared_count", "n_shared_experts"),
                ("leading_dense_block_count", "first_k_dense_replace"),
                // LFM2-MoE's name for it.
                ("leading_dense_block_count", "num_dense_layers"),
                ("expert_group_count", "n_group"),
                ("expert_group_used_count", "topk_group"),
            ] {
                if let Some(n) = count(gguf_key)? {
                    config[hf] = n.into();
                }
            }
            if let Some(scale) = float("expert_weights_scale")? {
                config["routed_scaling_factor"] = scale.into();
            }
            if let Some(Value::Bool(norm)) = get("expert_weights_norm") {
                config["norm_topk_prob"] = (*norm).into();
            }
            let biased =
                (0..blocks).any(|l| self.tensor(&format!("blk.{l}.exp_probs_b.bias")).is_some());
            config["use_expert_bias"] = biased.into();
        }
        // Sliding windows (gpt-oss: every other layer, as its config's default layer types
        // say; Gemma's own rules below).
        if let Some(window) = count("attention.sliding_window")? {
            config["sliding_window"] = window.into();
        }
        // q/k/v biases (GLM-4.5) where the file has them.
        config["attention_bias"] = self.tensor("blk.0.attn_q.bias").is_some().into();
        if arch == "kimi-linear" {
            let recurrent: Vec<bool> = recurrent_layers.unwrap_or_default();
            self.kimi_linear_config(&mut config, &recurrent)?;
        } else if arch == "falcon-h1" {
            self.falcon_h1_config(&mut config)?;
        } else if arch == "granitehybrid" {
            let recurrent: Vec<bool> = recurrent_layers.unwrap_or_default();
            self.granite_hybrid_config(&mut config, &recurrent)?;
        } else if arch.starts_with("lfm2") {
            // The converter writes the MLP width it uses (already adjusted) and marks the
            // convolution layers by their 0 key-value heads.
            let convolutions: Vec<bool> = recurrent_layers.unwrap_or_default();
            config["layer_types"] = convolutions
                .iter()
                .map(|&c| if c { "conv" } else { "full_attention" })
                .collect();
            config["block_auto_adjust_ff_dim"] = false.into();
            config["conv_L_cache"] = required("shortconv.l_cache")?.into();
            config["norm_eps"] = config["rms_norm_eps"].clone();
        }
        if let Some(head_dim) = count("attention.key_length")? {
            config["head_dim"] = head_dim.into();
        }
        if arch == "gemma4" {
            // Its RoPE is its own (proportional on the full layers, through `rope_freqs`).
            self.gemma4_config(&mut config)?;
            return Ok(config);
        }
        if arch.starts_with("gemma") {
            self.gemma_config(&mut config, arch)?;
        }
        if arch.starts_with("qwen35") || arch == "qwen3next" {
            self.qwen35_config(&mut config, arch)?;
        }
        // Per-frequency RoPE divisors as llama.cpp's converter stores them (`ggml_rope_ext`'s
        // freq_factors): Llama 3.1's scaling, one table (`rope_freqs`), which is LongRoPE with
        // one table for every length and no attention factor; Phi-3's LongRoPE, a short and a
        // long table and the attention factor. llama.cpp takes the long table where the context
        // it is given exceeds `rope.scaling.original_context_length`, transformers (and so
        // quantppl) where a sequence does: the same for windows of one length.
        let names = [
            "rope_freqs.weight",
            "rope_factors_short.weight",
            "rope_factors_long.weight",
        ];
        let head_dim = config["head_dim"].as_u64().unwrap_or(hidden / heads.max(1));
        let rotary = count("rope.dimension_count")?.unwrap_or(head_dim);
        let mut tables = [None, None, None];
        for (table, name) in tables.iter_mut().zip(names) {
            *table = self.rope_vector(name)?;
            if let Some(t) = table.as_ref().filter(|t| t.len() as u64 != rotary / 2) {
                return Err(Error::format(
                    &self.path,
                    format!(
                        "tensor `{name}` holds {} values; {rotary} rotated dimensions need {}",
                        t.len(),
                        rotary / 2
                    ),
                ));
            }
        }
        let (short, long, original, attention) = match tables {
            [None, None, None] => (None, None, None, None),
            [Some(f), None, None] => (Some(f.clone()), Some(f), None, Some(1.0)),
            [None, Some(short), Some(long)] => (
                Some(short),
                Some(long),
                count("rope.scaling.original_context_length")?,
                float("rope.scaling.attn_factor")?,
            ),
            _ => {
                return Err(Error::format(
                    &self.path,
                    "RoPE factor tensors `rope_freqs.weight` alone, or `rope_factors_short.weight` \
                     and `rope_factors_long.weight` together, expected",
                ));
            }
        };
        if let (Some(short), Some(long)) = (short, long) {
            let mut scaling = json!({
                "rope_type": "longrope",
                "short_factor": short,
                "long_factor": long,
                "original_max_position_embeddings":
                    original.unwrap_or(required("context_length")?),
            });
            if let Some(a) = attention {
                scaling["attention_factor"] = a.into();
            }
            config["rope_scaling"] = scaling;
        }
        if let Some(rotary) = count("rope.dimension_count")? {
            let head_dim = config["head_dim"].as_u64().unwrap_or(hidden / heads.max(1));
            if rotary != head_dim {
                config["partial_rotary_factor"] = (rotary as f64 / head_dim as f64).into();
            }
        }
        match get("rope.scaling.type").map(|v| (v, v.as_str())) {
            None | Some((_, Some("none"))) => {}
            Some((_, Some("linear"))) => {
                config["rope_scaling"] = json!({
                    "rope_type": "linear",
                    "factor": float("rope.scaling.factor")?.unwrap_or(1.0),
                });
            }
            Some((_, Some("yarn"))) => {
                let mut yarn = json!({
                    "rope_type": "yarn",
                    "factor": float("rope.scaling.factor")?.unwrap_or(1.0),
                    "original_max_position_embeddings": count("rope.scaling.original_context_length")?,
                });
                for (gguf_key, hf) in [
                    ("rope.scaling.yarn_beta_fast", "beta_fast"),
                    ("rope.scaling.yarn_beta_slow", "beta_slow"),
                    ("rope.scaling.yarn_attn_factor", "attention_factor"),
                ] {
                    if let Some(v) = float(gguf_key)? {
                        yarn[hf] = v.into();
                    }
                }
                // gpt-oss's published config keeps the YaRN band's edges unrounded
                // (`truncate: false`), which no GGUF key records.
                if arch == "gpt-oss" {
                    yarn["truncate"] = false.into();
                }
                config["rope_scaling"] = yarn;
            }
            Some((v, _)) => {
                return Err(Error::unsupported(
                    self.path.display().to_string(),
                    key("rope.scaling.type"),
                    v.to_json().to_string(),
                ));
            }
        }
        if matches!(arch, "deepseek2" | "deepseek32" | "glm-dsa" | "mistral4") {
            self.deepseek2_config(&mut config, arch)?;
        }
        if matches!(arch, "deepseek32" | "glm-dsa") {
            self.dsa_config(&mut config, arch, layers as usize)?;
        }
        if arch == "llama4" {
            self.llama4_config(&mut config)?;
        }
        // Ministral 3: the queries scaled by position over YaRN's original context
        // (`attention.temperature_scale`, its config's `llama_4_scaling_beta`), YaRN's `mscale`
        // and `mscale_all_dim` both the file's `yarn_log_multiplier` (the converter writes the
        // latter; the published configs have them equal).
        if let Some(beta) = float("attention.temperature_scale")?.filter(|_| arch == "mistral3") {
            let multiplier = float("rope.scaling.yarn_log_multiplier")?.unwrap_or(1.0);
            let Some(yarn) = config
                .get_mut("rope_scaling")
                .filter(|s| s["rope_type"] == "yarn")
            else {
                return Err(Error::format(
                    &self.path,
                    format!(
                        "metadata `{}` scales queries over YaRN's original context, but `{}` is \
                         not yarn",
                        key("attention.temperature_scale"),
                        key("rope.scaling.type")
                    ),
                ));
            };
            yarn["llama_4_scaling_beta"] = beta.into();
            yarn["mscale"] = multiplier.into();
            yarn["mscale_all_dim"] = multiplier.into();
            config["architectures"] = json!(["Ministral3ForCausalLM"]);
            config["model_type"] = "ministral3".into();
        }
        Ok(config)
    }

    /// DeepSeek-V3's keys from `deepseek2.*` (and DeepSeek-V3.2's, GLM-5's and Mistral 4's
    /// under their own names) as llama.cpp reads them (`llama-model.cpp`): the latent
    /// attention's ranks and head widths (`key_length_mla`/`value_length_mla`; files without
    /// them keep `kv_b_proj` whole and state the widths in `key_length`/`value_length`), the
    /// rotated part `rope.dimension_count`, YaRN's softmax scale from `yarn_log_multiplier`
    /// (`0.1 * mscale_all_dim`; llama.cpp takes `mscale` equal to it, as the published configs
    /// have it), the routing: sigmoid, but Mistral 4's softmax. DeepSeek-V2's softmax routing
    /// (`expert_gating_func` 1, or none: llama.cpp's default but for GLM-5's, sigmoid) is
    /// refused.
    fn deepseek2_config(&self, config: &mut Json, arch: &str) -> Result<()> {
        let key = |k: &str| format!("{arch}.{k}");
        let gating = self.number(&key("expert_gating_func"))?;
        match arch {
            // Mistral 4's router is a softmax (llama.cpp's default where no key says).
            "mistral4" if gating.is_none_or(|g| g == 1.0) => {}
            "mistral4" => {
                return Err(Error::unsupported(
                    self.path.display().to_string(),
                    key("expert_gating_func"),
                    format!("{} (Mistral 4 routes by softmax, 1)", gating.unwrap_or(0.0)),
                ));
            }
            "glm-dsa" if gating.is_none() => {}
            _ => self.sigmoid_routing(arch, "DeepSeek-V2")?,
        }
        self.latent_attention_config(config, arch)?;
        let c = config.as_object_mut().expect("a config is an object");
        // Mistral 4's router is its architecture's own (transformers reads no such keys); its
        // query scale is set below.
        if arch != "mistral4" {
            c.insert("scoring_func".into(), "sigmoid".into());
            c.insert("topk_method".into(), "noaux_tc".into());
        }
        if let Some(log_mul) = self.number(&key("rope.scaling.yarn_log_multiplier"))? {
            // In f32, as written: 0.1 * 1.0 read back is 1.0.
            let mscale = f64::from(log_mul as f32 / 0.1f32);
            if let Some(yarn) = c.get_mut("rope_scaling").and_then(Json::as_object_mut) {
                yarn.insert("mscale".into(), mscale.into());
                yarn.insert("mscale_all_dim".into(), mscale.into());
            }
        }
        if arch == "mistral4" {
            self.mistral4_query_scale(config)?;
        }
        Ok(())
    }

    /// Mistral 4's queries scaled by `1 + beta * ln(1 + floor(pos / length))` where the file
    /// says so (`attention.temperature_scale` and `temperature_length`, which llama.cpp's
    /// converter writes from Mistral's own checkpoint format); files converted from
    /// transformers' layout have neither key, and llama.cpp scales nothing: beta 0. The
    /// length must be YaRN's original context, where transformers takes both from one key.
    fn mistral4_query_scale(&self, config: &mut Json) -> Result<()> {
        let (scale_key, length_key) = (
            "mistral4.attention.temperature_scale",
            "mistral4.attention.temperature_length",
        );
        let beta = self.number(scale_key)?.unwrap_or(0.0);
        let length = self.count(length_key)?;
        let context = config["max_position_embeddings"].clone();
        let rope = config
            .as_object_mut()
            .expect("a config is an object")
            .entry("rope_scaling")
            .or_insert_with(|| json!({"rope_type": "default"}));
        let original = rope
            .get("original_max_position_embeddings")
            .and_then(Json::as_u64);
        match (length, original) {
            (Some(l), Some(o)) if beta != 0.0 && l != o => {
                return Err(Error::format(
                    &self.path,
                    format!(
                        "metadata `{length_key}` is {l}, but YaRN's original context is {o}: \
                         transformers' Mistral 4 scales queries over that context"
                    ),
                ));
            }
            (Some(l), None) => rope["original_max_position_embeddings"] = l.into(),
            (None, None) => rope["original_max_position_embeddings"] = context,
            _ => {}
        }
        rope["llama_4_scaling_beta"] = beta.into();
        Ok(())
    }

    /// The lightning indexer's keys (`attention.indexer.*`: heads, head width, top k) and,
    /// for GLM-5, which layers select their own keys (`attention.indexer.types`, true for
    /// `full`; without it llama.cpp's defaults: every layer for GLM-5 and 5.1, GLM-5.2's
    /// pattern where the trained context is 1M) and which reuse the last selection
    /// (`shared`). DeepSeek-V3.2's every layer selects its own.
    fn dsa_config(&self, config: &mut Json, arch: &str, layers: usize) -> Result<()> {
        let key = |k: &str| format!("{arch}.attention.indexer.{k}");
        let required = |k: &str| self.required_count(&key(k));
        config["index_n_heads"] = required("head_count")?.into();
        config["index_head_dim"] = required("key_length")?.into();
        config["index_topk"] = required("top_k")?.into();
        let full: Vec<bool> = match self.layer_flags(&key("types"), layers)? {
            Some(flags) => flags,
            None if arch == "glm-dsa"
                && config["max_position_embeddings"].as_u64() >= Some(1 << 20) =>
            {
                glm52_full_indexers(layers)
            }
            None => vec![true; layers],
        };
        if arch == "glm-dsa" {
            config["indexer_types"] = full
                .iter()
                .map(|&f| if f { "full" } else { "shared" })
                .collect();
        } else if full.iter().any(|f| !f) {
            return Err(Error::unsupported(
                self.path.display().to_string(),
                key("types"),
                "layers that reuse another's selection (DeepSeek-V3.2 has none)",
            ));
        }
        Ok(())
    }

    /// Kimi-Linear's keys from `kimi-linear.*` as llama.cpp reads them: the Kimi Delta
    /// Attention layers (`recurrent`, marked by 0 key-value heads) with the model's head count,
    /// `kda.head_dim` and `ssm.conv_kernel`; the latent attention elsewhere (no RoPE); the
    /// mixture's top k renormalized, as llama.cpp's graph does.
    fn kimi_linear_config(&self, config: &mut Json, recurrent: &[bool]) -> Result<()> {
        let required = |k: &str| self.required_count(&format!("kimi-linear.{k}"));
        self.sigmoid_routing("kimi-linear", "no Kimi-Linear")?;
        self.latent_attention_config(config, "kimi-linear")?;
        let c = config.as_object_mut().expect("a config is an object");
        let types: Vec<&str> = recurrent
            .iter()
            .map(|&r| {
                if r {
                    "linear_attention"
                } else {
                    "full_attention"
                }
            })
            .collect();
        c.insert("layer_types".into(), types.into());
        c.insert("linear_num_heads".into(), c["num_attention_heads"].clone());
        c.insert("linear_head_dim".into(), required("kda.head_dim")?.into());
        c.insert(
            "linear_conv_kernel_dim".into(),
            required("ssm.conv_kernel")?.into(),
        );
        c.insert("mla_use_nope".into(), true.into());
        c.insert("norm_topk_prob".into(), true.into());
        Ok(())
    }

    /// The state-space or delta-rule layers' value heads (`{arch}.ssm.time_step_rank`) and
    /// the width of each (`ssm.inner_size` shared among them).
    fn ssm_heads(&self, arch: &str) -> Result<(u64, u64)> {
        let key = |k: &str| format!("{arch}.{k}");
        let heads = self.required_count(&key("ssm.time_step_rank"))?;
        let inner = self.required_count(&key("ssm.inner_size"))?;
        let width = self.quotient(
            (&key("ssm.inner_size"), inner),
            (&key("ssm.time_step_rank"), heads),
        )?;
        Ok((heads, width))
    }

    /// `n / d` of the counts at metadata keys `n_key` and `d_key`; an error naming both where
    /// `d` does not divide `n`.
    fn quotient(&self, (n_key, n): (&str, u64), (d_key, d): (&str, u64)) -> Result<u64> {
        if d == 0 || n % d != 0 {
            return Err(Error::format(
                &self.path,
                format!("metadata `{n_key}` {n} is not a multiple of `{d_key}` {d}"),
            ));
        }
        Ok(n / d)
    }

    /// Qwen3.5's (and Qwen3-Next's) keys from `{arch}.*` as llama.cpp reads them: the DeltaNet
    /// layers (`attention.recurrent_layers`), their key heads (`ssm.group_count`) of
    /// `ssm.state_size`, value heads (`ssm.time_step_rank`) sharing `ssm.inner_size`,
    /// `ssm.conv_kernel` taps. The multimodal RoPE's sections (`rope.dimension_sections`) rotate
    /// text positions as plain RoPE of `rope.dimension_count` dimensions.
    fn qwen35_config(&self, config: &mut Json, arch: &str) -> Result<()> {
        let key = |k: &str| format!("{arch}.{k}");
        let required = |k: &str| self.required_count(&key(k));
        let layers = config["num_hidden_layers"].as_u64().unwrap_or(0) as usize;
        let flags_key = key("attention.recurrent_layers");
        let recurrent = self.layer_flags(&flags_key, layers)?.ok_or_else(|| {
            Error::format(
                &self.path,
                format!("metadata `{flags_key}` is not one flag for each of {layers} layers"),
            )
        })?;
        let (value_heads, value_dim) = self.ssm_heads(arch)?;
        let key_heads = required("ssm.group_count")?;
        self.quotient(
            (&key("ssm.time_step_rank"), value_heads),
            (&key("ssm.group_count"), key_heads),
        )?;
        let c = config.as_object_mut().expect("a config is an object");
        let types: Vec<&str> = recurrent
            .iter()
            .map(|&r| match r {
                true => "linear_attention",
                false => "full_attention",
            })
            .collect();
        c.insert("layer_types".into(), types.into());
        c.insert("linear_num_key_heads".into(), key_heads.into());
        c.insert("linear_num_value_heads".into(), value_heads.into());
        c.insert(
            "linear_key_head_dim".into(),
            required("ssm.state_size")?.into(),
        );
        c.insert("linear_value_head_dim".into(), value_dim.into());
        c.insert(
            "linear_conv_kernel_dim".into(),
            required("ssm.conv_kernel")?.into(),
        );
        Ok(())
    }

    /// Nemotron-H's keys from `{arch}.*` as llama.cpp reads them: each block's mixer from the
    /// per-layer key-value heads (attention where not 0) and MLP widths (the relu^2 MLP, or in
    /// `nemotron_h_moe` the mixture, where not 0; Mamba-2 where both are 0), the Mamba-2 heads (`ssm.time_step_rank`)
    /// sharing `ssm.inner_size`, their groups, state and taps, the convolution's bias where the
    /// file has it, the norms' `attention.layer_norm_epsilon`. No RoPE. `dt` is clamped below at
    /// transformers' `time_step_min` (1e-3, the published configs'), which no key records.
    fn nemotron_h_config(&self, config: &mut Json, arch: &str) -> Result<()> {
        let key = |k: &str| format!("{arch}.{k}");
        let mixtures = arch == "nemotron_h_moe";
        let required = |k: &str| self.required_count(&key(k));
        let layers = config["num_hidden_layers"].as_u64().unwrap_or(0) as usize;
        let (kv, ff) = (
            self.layer_counts(&key("attention.head_count_kv"), layers)?,
            self.layer_counts(&key("feed_forward_length"), layers)?,
        );
        let blocks: Vec<&str> = kv
            .iter()
            .zip(&ff)
            .map(|(&kv, &ff)| match (kv, ff) {
                (0, 0) => "linear_attention",
                (_, 0) => "full_attention",
                _ if mixtures => "moe",
                _ => "mlp",
            })
            .collect();
        let width = ff.iter().copied().find(|&w| w > 0).unwrap_or(0);
        let heads_kv = kv.iter().copied().find(|&h| h > 0).unwrap_or(0);
        if ff.iter().any(|&w| w != 0 && w != width) || kv.iter().any(|&h| h != 0 && h != heads_kv) {
            return Err(Error::format(
                &self.path,
                format!(
                    "metadata `{}` {ff:?} and `{}` {kv:?}: one MLP width and one key-value head \
                     count expected",
                    key("feed_forward_length"),
                    key("attention.head_count_kv")
                ),
            ));
        }
        let (heads, head_dim) = self.ssm_heads(arch)?;
        let eps = self
            .number(&key("attention.layer_norm_epsilon"))?
            .unwrap_or(1e-5);
        let mamba = (0..layers).find(|&l| blocks[l] == "linear_attention");
        let has = |t: &str| mamba.is_some_and(|l| self.tensor(&format!("blk.{l}.{t}")).is_some());
        let c = config.as_object_mut().expect("a config is an object");
        if mixtures {
            // The mixtures' keys are read above (`expert_*`); the shared expert's width under
            // Nemotron-H's name, the routing sigmoid (llama.cpp's graph assumes it).
            let shared = self.count(&key("expert_shared_feed_forward_length"))?;
            c.insert("moe_shared_expert_intermediate_size".into(), shared.into());
        }
        c.insert("layers_block_type".into(), blocks.into());
        c.insert("intermediate_size".into(), width.into());
        c.insert("num_key_value_heads".into(), heads_kv.into());
        c.insert("mlp_hidden_act".into(), "relu2".into());
        c.insert("mamba_num_heads".into(), heads.into());
        c.insert("mamba_head_dim".into(), head_dim.into());
        c.insert("ssm_state_size".into(), required("ssm.state_size")?.into());
        c.insert("n_groups".into(), required("ssm.group_count")?.into());
        c.insert("conv_kernel".into(), required("ssm.conv_kernel")?.into());
        c.insert("use_conv_bias".into(), has("ssm_conv1d.bias").into());
        c.insert("use_bias".into(), has("ssm_in.bias").into());
        c.insert("layer_norm_epsilon".into(), eps.into());
        c.insert("rms_norm_eps".into(), eps.into());
        Ok(())
    }

    /// Granite 4.0-H's keys from `granitehybrid.*` as llama.cpp reads them: the Mamba-2 layers
    /// (`recurrent`, marked by 0 key-value heads) with their heads (`ssm.time_step_rank`)
    /// sharing `ssm.inner_size`, groups, state and taps, the convolution's bias where the file
    /// has it; the shared MLP's width (`expert_shared_feed_forward_length`); RoPE only where
    /// `rope.scaling.finetuned` (llama.cpp's switch for it: its converter sets it for Bamba
    /// alone); the multipliers (`embedding_scale`, `residual_scale`, `attention.scale`,
    /// `logit_scale`; without `attention.scale`, llama.cpp's 1/sqrt(head width)). Bamba's
    /// files (RoPE over half of each head) are refused.
    fn granite_hybrid_config(&self, config: &mut Json, recurrent: &[bool]) -> Result<()> {
        let key = |k: &str| format!("granitehybrid.{k}");
        let required = |k: &str| self.required_count(&key(k));
        let (heads, head_dim) = self.ssm_heads("granitehybrid")?;
        let inner = heads * head_dim;
        let mamba = recurrent.iter().position(|&r| r);
        let has = |t: &str| mamba.is_some_and(|l| self.tensor(&format!("blk.{l}.{t}")).is_some());
        let rope = matches!(
            self.meta().get(&key("rope.scaling.finetuned")),
            None | Some(Value::Bool(true))
        );
        let hidden = config["hidden_size"].as_u64().unwrap_or(0);
        let attention_heads = config["num_attention_heads"].as_u64().unwrap_or(1).max(1);
        let attention_head_dim = self
            .count(&key("attention.key_length"))?
            .unwrap_or(hidden / attention_heads);
        // Bamba's RoPE covers half of each head, whose rows the converter permuted whole (as
        // Llama's): llama.cpp then rotates pairs that transformers' Bamba does not (on a test
        // model 1.3 % off transformers' perplexity). Neither reading is the model's.
        let rotary = self.count(&key("rope.dimension_count"))?;
        if let Some(r) = rotary.filter(|&r| rope && r < attention_head_dim) {
            return Err(Error::unsupported(
                self.path.display().to_string(),
                key("rope.dimension_count"),
                format!(
                    "{r} of {attention_head_dim} (Bamba: RoPE over part of heads whose q/k rows the \
                     converter permuted whole, which llama.cpp rotates otherwise than \
                     transformers; read its safetensors checkpoint)"
                ),
            ));
        }
        let mut scalars = Vec::new();
        for (gguf_key, hf) in [
            ("embedding_scale", "embedding_multiplier"),
            ("residual_scale", "residual_multiplier"),
            ("attention.scale", "attention_multiplier"),
            ("logit_scale", "logits_scaling"),
        ] {
            if let Some(v) = self.number(&key(gguf_key))? {
                scalars.push((hf, v));
            }
        }
        // Without a shared width (the converter writes none for a dense MLP given as
        // `intermediate_size`) llama.cpp's dense layers take `feed_forward_length`.
        let shared = match self.count(&key("expert_shared_feed_forward_length"))? {
            Some(width) => Some(width),
            None => self.count(&key("feed_forward_length"))?,
        };
        // The dense models' `expert_count` 0 (the mixtures' keys are read above).
        let experts = self.count(&key("expert_count"))?.unwrap_or(0);
        let used = self.count(&key("expert_used_count"))?.unwrap_or(0);
        let c = config.as_object_mut().expect("a config is an object");
        c.insert("num_local_experts".into(), experts.into());
        c.insert("num_experts_per_tok".into(), used.into());
        let types: Vec<&str> = recurrent
            .iter()
            .map(|&r| if r { "mamba" } else { "attention" })
            .collect();
        c.insert("layer_types".into(), types.into());
        c.insert("mamba_n_heads".into(), heads.into());
        c.insert("mamba_d_head".into(), head_dim.into());
        c.insert("mamba_d_state".into(), required("ssm.state_size")?.into());
        c.insert("mamba_n_groups".into(), required("ssm.group_count")?.into());
        c.insert("mamba_d_conv".into(), required("ssm.conv_kernel")?.into());
        // transformers' Granite reads the Mamba width as `mamba_expand` times the hidden size.
        if hidden == 0 || inner % hidden != 0 {
            return Err(Error::format(
                &self.path,
                format!(
                    "metadata `{}` {inner} is not a multiple of the hidden size {hidden}",
                    key("ssm.inner_size")
                ),
            ));
        }
        c.insert("mamba_expand".into(), (inner / hidden).into());
        c.insert("mamba_conv_bias".into(), has("ssm_conv1d.bias").into());
        c.insert("mamba_proj_bias".into(), has("ssm_in.bias").into());
        c.insert("shared_intermediate_size".into(), shared.into());
        c.insert(
            "position_embedding_type".into(),
            if rope { "rope" } else { "nope" }.into(),
        );
        // Without `attention.scale` llama.cpp scales scores by 1/sqrt(head width), where
        // Granite's default multiplier is 1.
        if !scalars.iter().any(|(hf, _)| *hf == "attention_multiplier") {
            scalars.push((
                "attention_multiplier",
                1.0 / (attention_head_dim as f64).sqrt(),
            ));
        }
        for (hf, v) in scalars {
            c.insert(hf.into(), v.into());
        }
        Ok(())
    }

    /// Falcon-H1's keys from `falcon-h1.*` as llama.cpp reads them: the Mamba-2 mixer's heads
    /// (`ssm.time_step_rank`) sharing `ssm.inner_size`, groups, state and taps, the
    /// convolution's bias and the gated norm (gate first, as the published configs have it)
    /// where the file has them; no multipliers (the converter folded them into the weights).
    fn falcon_h1_config(&self, config: &mut Json) -> Result<()> {
        let key = |k: &str| format!("falcon-h1.{k}");
        let required = |k: &str| self.required_count(&key(k));
        let (heads, head_dim) = self.ssm_heads("falcon-h1")?;
        let has = |t: &str| self.tensor(&format!("blk.0.{t}")).is_some();
        let c = config.as_object_mut().expect("a config is an object");
        c.insert("mamba_n_heads".into(), heads.into());
        c.insert("mamba_d_head".into(), head_dim.into());
        c.insert("mamba_d_ssm".into(), (heads * head_dim).into());
        c.insert("mamba_d_state".into(), required("ssm.state_size")?.into());
        c.insert("mamba_n_groups".into(), required("ssm.group_count")?.into());
        c.insert("mamba_d_conv".into(), required("ssm.conv_kernel")?.into());
        c.insert("mamba_conv_bias".into(), has("ssm_conv1d.bias").into());
        c.insert("mamba_proj_bias".into(), has("ssm_in.bias").into());
        c.insert("mamba_rms_norm".into(), has("ssm_norm.weight").into());
        c.insert("mamba_norm_before_gate".into(), false.into());
        Ok(())
    }

    /// An error unless `{arch}.expert_gating_func` is 2, the sigmoid routing quantppl reads
    /// (1 or none is softmax routing, llama.cpp's default: `softmax_family`'s).
    fn sigmoid_routing(&self, arch: &str, softmax_family: &str) -> Result<()> {
        let key = format!("{arch}.expert_gating_func");
        match self.number(&key)? {
            Some(2.0) => Ok(()),
            other => Err(Error::unsupported(
                self.path.display().to_string(),
                key,
                format!(
                    "{} (softmax routing: {softmax_family}; quantppl reads sigmoid routing, 2)",
                    other.map_or("none".to_string(), |g| g.to_string())
                ),
            )),
        }
    }

    /// DeepSeek's latent attention as llama.cpp's `{arch}.*` keys describe it: the ranks and
    /// head widths (`key_length_mla`/`value_length_mla`; files without them keep `kv_b_proj`
    /// whole and state the widths in `key_length`/`value_length`), the rotated part
    /// `rope.dimension_count`; every head its own key and value (the converter's one shared
    /// head is the latent).
    fn latent_attention_config(&self, config: &mut Json, arch: &str) -> Result<()> {
        let key = |k: &str| format!("{arch}.{k}");
        let count = |k: &str| self.count(&key(k));
        let required = |k: &str| self.required_count(&key(k));
        let rope = required("rope.dimension_count")?;
        let (qk, v) = match count("attention.key_length_mla")? {
            Some(qk) => (qk, required("attention.value_length_mla")?),
            None => (
                required("attention.key_length")?,
                required("attention.value_length")?,
            ),
        };
        let nope = qk.checked_sub(rope).filter(|&n| n > 0).ok_or_else(|| {
            Error::format(
                &self.path,
                format!("key heads of {qk} values hold no more than the {rope} rotated ones"),
            )
        })?;
        let c = config.as_object_mut().expect("a config is an object");
        // The heads' widths are the latent attention's, not llama.cpp's one shared head's.
        c.remove("head_dim");
        c.remove("partial_rotary_factor");
        c.insert(
            "num_key_value_heads".into(),
            c["num_attention_heads"].clone(),
        );
        c.insert(
            "kv_lora_rank".into(),
            required("attention.kv_lora_rank")?.into(),
        );
        c.insert("q_lora_rank".into(), count("attention.q_lora_rank")?.into());
        c.insert("qk_rope_head_dim".into(), rope.into());
        c.insert("qk_nope_head_dim".into(), nope.into());
        c.insert("v_head_dim".into(), v.into());
        c.insert("rope_interleave".into(), true.into());
        Ok(())
    }

    /// Gemma 2 and 3 as llama.cpp reads them (`src/models/gemma2.cpp`, `gemma3.cpp`): scores
    /// scaled by `1/sqrt(head_dim)` (the 27B shapes' by `1/sqrt(hidden / heads)`: 46 layers of
    /// Gemma 2, 62 of Gemma 3), the sliding layers of `attention.sliding_window_pattern` (a
    /// period or one flag a layer; by default every other layer of Gemma 2, five of six of
    /// Gemma 3, none where a Gemma 3 file has no window), Gemma 2's soft caps (50 and 30 where
    /// absent), the sliding layers' RoPE base `rope.freq_base_swa` unscaled (Gemma 2: the
    /// global base, Gemma 3: 10,000 where absent).
    fn gemma_config(&self, config: &mut Json, arch: &str) -> Result<()> {
        let meta = self.meta();
        let key = |k: &str| format!("{arch}.{k}");
        let float = |k: &str| self.number(&key(k));
        let gemma2 = arch == "gemma2";
        let n = |k: &str| config[k].as_u64().unwrap_or(0);
        let (layers, hidden, heads) = (
            n("num_hidden_layers"),
            n("hidden_size"),
            n("num_attention_heads").max(1),
        );
        let head_dim = config["head_dim"].as_u64().unwrap_or(hidden / heads);
        let wide = layers == if gemma2 { 46 } else { 62 };
        config["query_pre_attn_scalar"] = (if wide { hidden / heads } else { head_dim }).into();
        config["hidden_activation"] = "gelu_pytorch_tanh".into();
        let window = match float("attention.sliding_window")? {
            Some(w) if w > 0.0 => Some(w as u64),
            Some(_) => None,
            None => gemma2.then_some(4096),
        };
        let pattern_key = key("attention.sliding_window_pattern");
        let flags = self.layer_flags(&pattern_key, layers as usize)?;
        let sliding: Vec<bool> = match (window, meta.get(&pattern_key)) {
            (None, _) => vec![false; layers as usize],
            (Some(_), Some(Value::Array(_))) => flags.unwrap_or_default(),
            (Some(_), other) => {
                let period = match other {
                    None => {
                        if gemma2 {
                            2
                        } else {
                            6
                        }
                    }
                    Some(v) => v.as_u64().ok_or_else(|| {
                        Error::format(
                            &self.path,
                            format!("metadata `{pattern_key}` is {}, not a count", v.to_json()),
                        )
                    })?,
                };
                (0..layers)
                    .map(|l| period == 0 || l % period < period - 1)
                    .collect()
            }
        };
        config["sliding_window"] = window.into();
        config["layer_types"] = attention_kinds(&sliding);
        if gemma2 {
            config["attn_logit_softcapping"] =
                float("attn_logit_softcapping")?.unwrap_or(50.0).into();
            config["final_logit_softcapping"] =
                float("final_logit_softcapping")?.unwrap_or(30.0).into();
        } else {
            config["final_logit_softcapping"] = float("final_logit_softcapping")?
                .filter(|&c| c > 0.0)
                .into();
        }
        let theta = config["rope_theta"].clone();
        let sliding_theta = match float("rope.freq_base_swa")? {
            Some(t) => t.into(),
            None if gemma2 => theta.clone(),
            None => 10_000.0.into(),
        };
        let mut full = json!({"rope_type": "default", "rope_theta": theta});
        if let Some(scaling) = config
            .as_object_mut()
            .and_then(|c| c.remove("rope_scaling"))
        {
            full = scaling;
            full["rope_theta"] = theta;
        }
        config["rope_parameters"] = json!({
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": sliding_theta},
        });
        Ok(())
    }

    /// Llama 4 as llama.cpp reads it (`src/models/llama4.cpp`), which states in the file only
    /// the mixtures' interleave (`interleave_moe_layer_step`) and width
    /// (`expert_feed_forward_length`; `feed_forward_length` is the dense layers'): every layer
    /// of `attention.sliding_window_pattern` (by default three of four) rotates and attends
    /// within chunks of 8,192 positions, the others attend without positions, their queries
    /// tempered from 8,192 positions by 0.1 (transformers' defaults too); q/k norms but in the
    /// 128-expert model (llama.cpp tells it by its expert count); a sliding window of 0 (Meta's
    /// MobileLLM) rotates every layer and attends to all keys.
    fn llama4_config(&self, config: &mut Json) -> Result<()> {
        let key = |k: &str| format!("llama4.{k}");
        let layers = config["num_hidden_layers"].as_u64().unwrap_or(0) as usize;
        let experts = self.count(&key("expert_count"))?.unwrap_or(0);
        let whole = self.count(&key("attention.sliding_window"))? == Some(0);
        let rotating = match (
            whole,
            self.layer_flags(&key("attention.sliding_window_pattern"), layers)?,
        ) {
            (true, _) => vec![true; layers],
            (false, Some(flags)) => flags,
            (false, None) => (0..layers).map(|l| (l + 1) % 4 != 0).collect(),
        };
        let c = config.as_object_mut().expect("a config is an object");
        let dense = c.get("intermediate_size").cloned().unwrap_or_default();
        c.insert("intermediate_size_mlp".into(), dense);
        c.insert(
            "intermediate_size".into(),
            self.count(&key("expert_feed_forward_length"))?.into(),
        );
        c.insert(
            "interleave_moe_layer_step".into(),
            self.required_count(&key("interleave_moe_layer_step"))?
                .into(),
        );
        c.insert(
            "no_rope_layers".into(),
            rotating
                .iter()
                .map(|&r| u64::from(r))
                .collect::<Vec<_>>()
                .into(),
        );
        c.insert(
            "layer_types".into(),
            rotating
                .iter()
                .map(|&r| match r && !whole {
                    true => "chunked_attention",
                    false => "full_attention",
                })
                .collect::<Vec<_>>()
                .into(),
        );
        let chunk = (!whole).then_some(8192);
        c.insert("attention_chunk_size".into(), chunk.into());
        c.insert("use_qk_norm".into(), (experts != 128).into());
        // Its chunks are not a sliding window (llama.cpp's key for both).
        c.remove("sliding_window");
        Ok(())
    }

    /// Gemma 4 as its converter writes it (`Gemma4Model`) and llama.cpp reads it: the sliding
    /// layers of `attention.sliding_window_pattern` (one flag a layer) with heads of
    /// `attention.key_length_swa` and RoPE of base `rope.freq_base_swa` over whole heads, the
    /// full layers' heads of `attention.key_length`, the key-value heads a layer, the last
    /// `attention.shared_kv_layers` layers reusing an earlier layer's keys and values (their
    /// MLPs twice as wide where `feed_forward_length` says so), the full layers' values from
    /// their keys where they have no `attn_v`, per-layer inputs of
    /// `embedding_length_per_layer_input`, and the full layers' proportional RoPE: the
    /// converter rotates whole heads and divides the frequencies of the pairs it leaves
    /// unrotated by 1e30 (`rope_freqs`: 1 for each rotated pair, then 1e30); the mixture beside
    /// the MLP where the file has experts.
    fn gemma4_config(&self, config: &mut Json) -> Result<()> {
        let key = |k: &str| format!("gemma4.{k}");
        let bad = |k: &str, what: String| {
            Error::format(&self.path, format!("metadata `{}` {what}", key(k)))
        };
        let layers = config["num_hidden_layers"].as_u64().unwrap_or(0) as usize;
        let pattern = "attention.sliding_window_pattern";
        let sliding = self
            .layer_flags(&key(pattern), layers)?
            .ok_or_else(|| bad(pattern, "is missing: Gemma 4 states it a layer".into()))?;
        let kv = self.layer_counts(&key("attention.head_count_kv"), layers)?;
        let ff = self.layer_counts(&key("feed_forward_length"), layers)?;
        let full_dim = self.required_count(&key("attention.key_length"))?;
        let swa_dim = self.required_count(&key("attention.key_length_swa"))?;
        for (k, width) in [
            ("attention.value_length", full_dim),
            ("attention.value_length_swa", swa_dim),
            ("rope.dimension_count", full_dim),
            ("rope.dimension_count_swa", swa_dim),
        ] {
            if let Some(v) = self.count(&key(k))?.filter(|&v| v != width) {
                return Err(bad(
                    k,
                    format!("is {v}; Gemma 4's are its heads' width {width}"),
                ));
            }
        }
        // One key-value head count for each kind of layer.
        let of_kind = |slides: bool| -> Result<u64> {
            let mut counts = (0..layers).filter(|&l| sliding[l] == slides).map(|l| kv[l]);
            let first = counts.next().unwrap_or(0);
            match counts.all(|c| c == first) {
                true => Ok(first),
                false => Err(bad(
                    "attention.head_count_kv",
                    format!("is {kv:?}: one count for the sliding layers and one for the full"),
                )),
            }
        };
        let (swa_kv, full_kv) = (of_kind(true)?, of_kind(false)?);
        let shared = self.count(&key("attention.shared_kv_layers"))?.unwrap_or(0) as usize;
        let first_shared = layers.saturating_sub(shared);
        let width = ff.first().copied().unwrap_or(0);
        let wide = |double: bool| {
            (0..layers).all(|l| {
                ff[l]
                    == if double && l >= first_shared {
                        2 * width
                    } else {
                        width
                    }
            })
        };
        let double_wide = match (wide(false), wide(true)) {
            (true, _) => false,
            (false, true) => true,
            (false, false) => {
                return Err(bad(
                    "feed_forward_length",
                    format!(
                        "is {ff:?}: one width, twice that in the {shared} layers that reuse keys \
                         and values, expected"
                    ),
                ));
            }
        };
        let first_full = (0..first_shared).find(|&l| !sliding[l]);
        let values_from_keys =
            first_full.is_some_and(|l| self.tensor(&format!("blk.{l}.attn_v.weight")).is_none());
        let fraction = match self.rope_vector("rope_freqs.weight")? {
            None => 1.0,
            Some(divisors) => {
                let rotated = divisors.iter().take_while(|&&d| d == 1.0).count();
                if divisors.len() as u64 != full_dim / 2
                    || divisors[rotated..].iter().any(|&d| d < 1e29)
                {
                    return Err(Error::format(
                        &self.path,
                        format!(
                            "tensor `rope_freqs.weight` is not {} divisors of 1 for the rotated \
                             pairs, then 1e30 (Gemma 4's proportional RoPE)",
                            full_dim / 2
                        ),
                    ));
                }
                2.0 * rotated as f64 / full_dim as f64
            }
        };
        let per_layer_width = self
            .count(&key("embedding_length_per_layer_input"))?
            .unwrap_or(0);
        let per_layer_vocab = self
            .tensor("per_layer_token_embd.weight")
            .and_then(|t| t.dims.get(1).copied());
        let full_heads: serde_json::Map<String, Json> = (0..layers)
            .filter(|&l| !sliding[l])
            .map(|l| {
                let shape = json!({"head_dim": full_dim, "num_key_value_heads": full_kv});
                (l.to_string(), shape)
            })
            .collect();
        let theta =
            |k: &str, default: f64| -> Result<f64> { Ok(self.number(&key(k))?.unwrap_or(default)) };
        // The mixture beside each layer's MLP (26B-A4B), read above as every family's.
        let top_k = config.get("num_experts_per_tok").cloned();
        let c = config.as_object_mut().expect("a config is an object");
        c.insert("model_type".into(), "gemma4_text".into());
        c.insert("enable_moe_block".into(), top_k.is_some().into());
        c.insert("top_k_experts".into(), top_k.unwrap_or_default());
        c.insert("layer_types".into(), attention_kinds(&sliding));
        c.insert("head_dim".into(), swa_dim.into());
        c.insert("num_key_value_heads".into(), swa_kv.into());
        c.insert("per_layer_config".into(), full_heads.into());
        c.insert("attention_k_eq_v".into(), values_from_keys.into());
        c.insert("num_kv_shared_layers".into(), shared.into());
        c.insert("intermediate_size".into(), width.into());
        c.insert("use_double_wide_mlp".into(), double_wide.into());
        c.insert("hidden_size_per_layer_input".into(), per_layer_width.into());
        c.insert("vocab_size_per_layer_input".into(), per_layer_vocab.into());
        c.insert("hidden_activation".into(), "gelu_pytorch_tanh".into());
        c.insert(
            "final_logit_softcapping".into(),
            self.number(&key("final_logit_softcapping"))?
                .filter(|&c| c > 0.0)
                .into(),
        );
        c.insert(
            "rope_parameters".into(),
            json!({
                "full_attention": {
                    "rope_type": "proportional",
                    "partial_rotary_factor": fraction,
                    "rope_theta": theta("rope.freq_base", 1e6)?,
                },
                "sliding_attention": {
                    "rope_type": "default",
                    "rope_theta": theta("rope.freq_base_swa", 1e4)?,
                },
            }),
        );
        Ok(())
    }
}

/// transformers' `layer_types` of layers that slide where `sliding`.
fn attention_kinds(sliding: &[bool]) -> Json {
    sliding
        .iter()
        .map(|&s| match s {
            true => "sliding_attention",
            false => "full_attention",
        })
        .collect::<Vec<_>>()
        .into()
}

/// transformers' name of GGUF tensor `name` (`blk.3.attn_q.weight` ->
/// `model.layers.3.self_attn.q_proj.weight`, the Llama/Qwen families' layout, a family's
/// `renames`' tables first, in order); a name no rule knows keeps a place under its layer
/// (`model.layers.3.gguf.…`) or the model (`model.gguf.…`), so that a run names what it never
/// read.
fn hf_name(name: &str, renames: &[&[(&str, &str)]]) -> String {
    const LAYER: [(&str, &str); 18] = [
        ("ffn_gate_inp", "mlp.gate"),
        // Stacks of every expert's linear, `[experts, rows, row]`, named as transformers 5
        // names its stacks (no `.weight`): the store reads each expert's rows as a view.
        ("ffn_gate_exps", "mlp.experts.gate_proj"),
        ("ffn_up_exps", "mlp.experts.up_proj"),
        ("ffn_down_exps", "mlp.experts.down_proj"),
        ("attn_norm", "input_layernorm"),
        ("attn_q", "self_attn.q_proj"),
        ("attn_k", "self_attn.k_proj"),
        ("attn_v", "self_attn.v_proj"),
        ("attn_output", "self_attn.o_proj"),
        ("attn_qkv", "self_attn.qkv_proj"),
        ("attn_q_norm", "self_attn.q_norm"),
        ("attn_k_norm", "self_attn.k_norm"),
        ("ffn_norm", "post_attention_layernorm"),
        ("ffn_gate", "mlp.gate_proj"),
        ("ffn_up", "mlp.up_proj"),
        ("ffn_down", "mlp.down_proj"),
        ("post_attention_norm", "post_attention_layernorm"),
        ("post_ffw_norm", "post_feedforward_layernorm"),
    ];
    const MODEL: [(&str, &str); 4] = [
        ("token_embd", "model.embed_tokens"),
        // LFM2's final norm, which its converter names after the embedding.
        ("token_embd_norm", "model.embedding_norm"),
        ("output_norm", "model.norm"),
        ("output", "lm_head"),
    ];
    // A layer's tensor without a `.weight` or `.bias` (Kimi-Linear's `blk.N.ssm_a`).
    let bare = name
        .strip_prefix("blk.")
        .and_then(|r| r.split_once('.'))
        .is_some_and(|(_, module)| !module.contains('.'));
    let (stem, suffix) = match bare {
        true => (name, ""),
        false => name.rsplit_once('.').unwrap_or((name, "")),
    };
    // A family's name for a layer tensor as a whole (Gemma 4's `ffn_gate_inp.scale`) is a
    // parameter of its own.
    let whole = name.strip_prefix("blk.").and_then(|r| r.split_once('.'));
    if let Some((layer, rest)) = whole.filter(|(_, rest)| rest.contains('.'))
        && let Some((_, mapped)) = renames
            .iter()
            .flat_map(|table| table.iter())
            .find(|(g, _)| *g == rest)
    {
        return format!("model.layers.{layer}.{mapped}");
    }
    if let Some((layer, module)) = stem.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
        let Some((_, mapped)) = renames
            .iter()
            .flat_map(|table| table.iter())
            .chain(&LAYER)
            .find(|(g, _)| *g == module)
        else {
            let tail = if suffix.is_empty() {
                String::new()
            } else {
                format!(".{suffix}")
            };
            return format!("model.layers.{layer}.gguf.{module}{tail}");
        };
        // Stacks, the selection bias, the sinks, Kimi's `A_log` and `dt_bias` and Gemma 4's
        // layer scalar are parameters of their own in transformers (no `.weight` or `.bias` of
        // a module); a stack's biases
        // (gpt-oss) sit beside it.
        if module.ends_with("_exps") && suffix == "bias" {
            return format!("model.layers.{layer}.{mapped}_bias");
        }
        const OWN: [&str; 6] = [
            "exp_probs_b",
            "attn_sinks",
            "ssm_a",
            "ssm_d",
            "ssm_dt",
            "layer_output_scale",
        ];
        if module.ends_with("_exps") || OWN.contains(&module) {
            return format!("model.layers.{layer}.{mapped}");
        }
        // A bare norm (Falcon-H1's `ffn_norm`) is the module's weight.
        let suffix = if suffix.is_empty() { "weight" } else { suffix };
        return format!("model.layers.{layer}.{mapped}.{suffix}");
    }
    // A family's own names of the model's tensors (Nemotron-H's embeddings) come first.
    let family_model = renames.iter().flat_map(|table| table.iter());
    match family_model.chain(&MODEL).find(|(g, _)| *g == stem) {
        Some((_, hf)) => format!("{hf}.{suffix}"),
        None => format!("model.gguf.{name}"),
    }
}

/// GLM-5.2's layers with an indexer of their own, as llama.cpp assumes them for a file that
/// names none (`glm-dsa.cpp`'s `GLM_5_2_DEFAULT_INDEXER_TYPES`): the first two layers, then
/// the first of every four.
fn glm52_full_indexers(layers: usize) -> Vec<bool> {
    (0..layers).map(|l| l < 2 || (l - 2) % 4 == 0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glm52_default_indexers_are_llama_cpps_table() {
        // The start of llama.cpp's GLM_5_2_DEFAULT_INDEXER_TYPES (glm-dsa.cpp), and its 78th
        // layer's entry (the table is 2 + 19 x 4 entries long for GLM-5.2's 78 layers).
        let table = [1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0];
        let full = glm52_full_indexers(78);
        for (l, &t) in table.iter().enumerate() {
            assert_eq!(full[l], t == 1, "layer {l}");
        }
        assert!(!full[77] && full[74]);
        assert_eq!(full.iter().filter(|&&f| f).count(), 2 + 19);
    }

    fn hf_name_llama(name: &str) -> String {
        hf_name(name, &[])
    }

    #[test]
    fn names_follow_transformers() {
        assert_eq!(
            hf_name_llama("blk.3.attn_q.weight"),
            "model.layers.3.self_attn.q_proj.weight"
        );
        assert_eq!(
            hf_name_llama("blk.0.attn_k.bias"),
            "model.layers.0.self_attn.k_proj.bias"
        );
        assert_eq!(
            hf_name_llama("blk.12.ffn_down.weight"),
            "model.layers.12.mlp.down_proj.weight"
        );
        assert_eq!(
            hf_name_llama("token_embd.weight"),
            "model.embed_tokens.weight"
        );
        assert_eq!(hf_name_llama("output.weight"), "lm_head.weight");
        assert_eq!(
            hf_name_llama("blk.1.ffn_up_exps.weight"),
            "model.layers.1.mlp.experts.up_proj"
        );
        assert_eq!(
            hf_name_llama("blk.2.ssm_a.weight"),
            "model.layers.2.gguf.ssm_a.weight"
        );
        // MiniMax-M2's router and its selection bias, a parameter without `.bias`.
        assert_eq!(
            hf_name("blk.1.exp_probs_b.bias", &[MINIMAX_M2_RENAMES]),
            "model.layers.1.block_sparse_moe.e_score_correction_bias"
        );
        assert_eq!(
            hf_name("blk.1.ffn_gate_inp.weight", &[MINIMAX_M2_RENAMES]),
            "model.layers.1.block_sparse_moe.gate.weight"
        );
        // DeepSeek's latent attention and shared experts.
        let deepseek = [DEEPSEEK2_RENAMES, SHARED_EXPERTS_RENAMES];
        assert_eq!(
            hf_name("blk.2.attn_kv_a_mqa.weight", &deepseek),
            "model.layers.2.self_attn.kv_a_proj_with_mqa.weight"
        );
        assert_eq!(
            hf_name("blk.2.ffn_down_shexp.weight", &deepseek),
            "model.layers.2.mlp.shared_experts.down_proj.weight"
        );
        // Kimi-Linear's delta-rule tensors, one without a suffix.
        let kimi = [KIMI_LINEAR_RENAMES, DEEPSEEK2_RENAMES];
        assert_eq!(
            hf_name("blk.1.ssm_a", &kimi),
            "model.layers.1.self_attn.A_log"
        );
        assert_eq!(
            hf_name("blk.1.ssm_dt.bias", &kimi),
            "model.layers.1.self_attn.dt_bias"
        );
        assert_eq!(
            hf_name("blk.1.ssm_conv1d_v.weight", &kimi),
            "model.layers.1.self_attn.v_conv1d.weight"
        );
        assert_eq!(
            hf_name("blk.1.ffn_down_exps.weight", &kimi),
            "model.layers.1.block_sparse_moe.experts.down_proj"
        );
        // Qwen3.5's DeltaNet, its own parameters without `.weight` or `.bias`.
        assert_eq!(
            hf_name("blk.2.attn_qkv.weight", &[QWEN35_RENAMES]),
            "model.layers.2.linear_attn.in_proj_qkv.weight"
        );
        assert_eq!(
            hf_name("blk.2.ssm_a", &[QWEN35_RENAMES]),
            "model.layers.2.linear_attn.A_log"
        );
        assert_eq!(
            hf_name("blk.2.ssm_dt.bias", &[QWEN35_RENAMES]),
            "model.layers.2.linear_attn.dt_bias"
        );
        assert_eq!(
            hf_name("blk.2.post_attention_norm.weight", &[QWEN35_RENAMES]),
            "model.layers.2.post_attention_layernorm.weight"
        );
        // Falcon-H1's bare `ffn_norm`.
        assert_eq!(
            hf_name("blk.1.ffn_norm", &[FALCON_H1_RENAMES]),
            "model.layers.1.pre_ff_layernorm.weight"
        );
        // Nemotron-H's block norm, mixers and model-level names.
        assert_eq!(
            hf_name("blk.0.attn_norm.weight", &[NEMOTRON_H_RENAMES]),
            "model.layers.0.norm.weight"
        );
        assert_eq!(
            hf_name("blk.0.ssm_d", &[NEMOTRON_H_RENAMES]),
            "model.layers.0.mixer.D"
        );
        assert_eq!(
            hf_name("token_embd.weight", &[NEMOTRON_H_RENAMES]),
            "model.embeddings.weight"
        );
        assert_eq!(
            hf_name("output_norm.weight", &[NEMOTRON_H_RENAMES]),
            "model.norm_f.weight"
        );
        // Granite 4.0-H's Mamba-2 under `mamba`, its shared MLP's halves.
        assert_eq!(
            hf_name("blk.0.ssm_in.weight", &[GRANITE_HYBRID_RENAMES]),
            "model.layers.0.mamba.in_proj.weight"
        );
        assert_eq!(
            hf_name("blk.0.ffn_gate.weight", &[GRANITE_HYBRID_RENAMES]),
            "model.layers.0.shared_mlp.gate_proj.weight"
        );
        // gpt-oss's stacks' biases, sinks and router.
        assert_eq!(
            hf_name("blk.0.ffn_up_exps.bias", &[GPT_OSS_RENAMES]),
            "model.layers.0.mlp.experts.up_proj_bias"
        );
        assert_eq!(
            hf_name("blk.0.attn_sinks.weight", &[GPT_OSS_RENAMES]),
            "model.layers.0.self_attn.sinks"
        );
        assert_eq!(
            hf_name("blk.0.ffn_gate_inp.bias", &[GPT_OSS_RENAMES]),
            "model.layers.0.mlp.router.bias"
        );
        assert_eq!(
            hf_name_llama("rope_freqs.weight"),
            "model.gguf.rope_freqs.weight"
        );
        assert_eq!(
            hf_name("blk.4.ffn_norm.weight", &[GEMMA_RENAMES]),
            "model.layers.4.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            hf_name("blk.4.post_ffw_norm.weight", &[GEMMA_RENAMES]),
            "model.layers.4.post_feedforward_layernorm.weight"
        );
        let gemma4 = |name| hf_name(name, &[GEMMA4_RENAMES, GEMMA_RENAMES]);
        for (gguf, hf) in [
            ("blk.2.ffn_gate_inp.scale", "model.layers.2.router.scale"),
            (
                "blk.2.ffn_gate_inp.weight",
                "model.layers.2.router.proj.weight",
            ),
            (
                "blk.2.ffn_down_exps.scale",
                "model.layers.2.router.per_expert_scale",
            ),
            (
                "blk.2.ffn_gate_up_exps.weight",
                "model.layers.2.experts.gate_up_proj",
            ),
            (
                "blk.5.layer_output_scale.weight",
                "model.layers.5.layer_scalar",
            ),
            (
                "blk.5.proj.weight",
                "model.layers.5.per_layer_projection.weight",
            ),
            (
                "per_layer_token_embd.weight",
                "model.embed_tokens_per_layer.weight",
            ),
            (
                "blk.5.ffn_norm.weight",
                "model.layers.5.pre_feedforward_layernorm.weight",
            ),
        ] {
            assert_eq!(gemma4(gguf), hf, "{gguf}");
        }
    }

    /// The Llama fixture's metadata as a config: its weights decoded unrounded (f32), its
    /// activations bf16 under `--dtype auto`, the permuted q/k rotated as adjacent pairs, and
    /// llama-perplexity's windows by default.
    #[test]
    fn the_llama_fixture_reads_as_its_family() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/synth-gguf-llama/model.gguf");
        let c = crate::checkpoint::Checkpoint::open(&dir).unwrap().config;
        assert_eq!(c.architecture, crate::checkpoint::Architecture::Llama);
        assert_eq!(
            (
                c.num_layers,
                c.hidden_size,
                c.num_heads,
                c.num_kv_heads,
                c.head_dim
            ),
            (2, 256, 4, 2, 64)
        );
        assert_eq!(c.dtype, crate::numerics::FloatType::F32);
        assert_eq!(c.auto_activation_dtype(), crate::numerics::FloatType::Bf16);
        assert!(c.rope_interleaved && c.from_gguf && !c.tie_word_embeddings);
    }

    #[test]
    fn split_names() {
        assert_eq!(split_part(Path::new("m-00002-of-00004.gguf")), Some((2, 4)));
        assert_eq!(split_part(Path::new("model-q4_k_m.gguf")), None);
    }
}
