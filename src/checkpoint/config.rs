//! `config.json` -> a resolved `ModelConfig`, with every default filled in once.

use std::path::Path;

use serde_json::Value;

use crate::numerics::FloatType;
use crate::{Error, Result};

/// Bounds on the counts a config may claim (far above any published model's).
const MAX_LAYERS: usize = 10_000;
const MAX_EXPERTS: usize = 1 << 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Qwen2Moe,
    Qwen3Moe,
    Mixtral,
    Glm4Moe,
    Gemma2,
    Gemma3,
    Phi3,
    GptOss,
    /// DeepSeek-V3 / R1, Kimi-K2: latent attention (`MlaConfig`) and GLM's router.
    DeepseekV3,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum RopeScaling {
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// YaRN: frequencies blended between interpolated and extrapolated by a ramp over the
    /// dimensions, cos/sin scaled by `attention_factor` (resolved from `mscale` and
    /// `mscale_all_dim` as transformers does).
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        truncate: bool,
        attention_factor: f64,
    },
    /// LongRoPE (Phi-3): per-dimension factors, the long ones for sequences longer than
    /// `original_max_position_embeddings`, cos/sin scaled by `attention_factor`.
    Longrope {
        short_factor: Vec<f64>,
        long_factor: Vec<f64>,
        original_max_position_embeddings: usize,
        attention_factor: f64,
    },
}

/// The rotary embedding of a set of layers: its base and scaling.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RopeParams {
    pub theta: f64,
    pub scaling: Option<RopeScaling>,
}

/// Which keys a layer's queries see.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerAttention {
    /// Every earlier position of the sequence.
    Full,
    /// The last `sliding_window` positions (the query's own included).
    Sliding,
}

/// The activation of the gated MLP: `down(act(gate(x)) * up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GatedActivation {
    Silu,
    /// `gelu_pytorch_tanh` (Gemma).
    GeluTanh,
    /// gpt-oss: gate and up interleaved in one projection (gate the even outputs), gate
    /// clamped above at `limit`, up to `[-limit, limit]`, `(up + 1) * gate * sigmoid(alpha *
    /// gate)`.
    ClampedSwiglu {
        alpha: f32,
        limit: f32,
    },
}

impl GatedActivation {
    /// Gate and up come interleaved from one fused projection.
    pub fn interleaved(self) -> bool {
        matches!(self, GatedActivation::ClampedSwiglu { .. })
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Values of each head RoPE rotates (the first ones): `head_dim` unless the model uses
    /// partial rotary (GLM-4.5: half).
    pub rotary_dim: usize,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    /// The rotary embedding of full-attention layers (of every layer unless `local_rope`).
    pub rope: RopeParams,
    /// The rotary embedding of sliding-window layers where it differs (Gemma 3's
    /// `rope_local_base_freq`).
    pub local_rope: Option<RopeParams>,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (Qwen2, or Llama with `attention_bias`).
    pub qkv_bias: bool,
    /// Per-head RMSNorm on q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// o_proj carries a bias (`attention_bias` of Llama, Mistral, Gemma, gpt-oss).
    pub o_bias: bool,
    /// A learned logit per head in every softmax's denominator (gpt-oss's `sinks`).
    pub attention_sinks: bool,
    /// The checkpoint's floating dtype (`torch_dtype` / `dtype`).
    pub dtype: FloatType,
    pub bos_token_id: Option<u32>,
    /// The first of `eos_token_id` (it may be a list).
    pub eos_token_id: Option<u32>,
    /// The window of the layers whose `layer_types` entry is sliding.
    pub sliding_window: Option<usize>,
    /// Each decoder layer's attention span.
    pub layer_types: Vec<LayerAttention>,
    /// Attention scores are multiplied by this (`head_dim^-0.5`, or Gemma's
    /// `query_pre_attn_scalar^-0.5`).
    pub attn_scale: f64,
    /// `cap * tanh(score / cap)` on attention scores (Gemma 2's `attn_logit_softcapping`).
    pub attn_softcap: Option<f32>,
    /// `cap * tanh(logit / cap)` on the output logits (Gemma 2's `final_logit_softcapping`).
    pub final_softcap: Option<f32>,
    /// Norm weights are applied as `1 + w` (Gemma).
    pub norm_offset: f32,
    /// A norm on the attention output and on the MLP output before each joins the residual
    /// stream (Gemma 2/3: `post_attention_layernorm`, `post_feedforward_layernorm`; the MLP's
    /// input norm is then `pre_feedforward_layernorm`).
    pub sandwich_norms: bool,
    /// Token embeddings are multiplied by `sqrt(hidden_size)` (Gemma).
    pub scaled_embeddings: bool,
    pub mlp_activation: GatedActivation,
    /// q, k and v stored as one `qkv_proj`, gate and up as one `gate_up_proj` (Phi-3).
    pub fused_projections: bool,
    /// The prefix of the language model's tensors: `model`, or for a multimodal checkpoint
    /// `model.language_model` / `language_model.model` (`Checkpoint::open` sets it from the
    /// tensors on disk).
    pub prefix: String,
    /// The mixture of experts, for MoE architectures (`intermediate_size` is then the width
    /// of the dense MLPs of the layers that are not sparse).
    pub moe: Option<MoeConfig>,
    /// Multi-head latent attention (DeepSeek-V3): `head_dim` is then the query/key head
    /// (`qk_nope_head_dim + qk_rope_head_dim`), `rotary_dim` its rotated part (the last values
    /// of each head), and `num_kv_heads` equals `num_heads` (keys and values are expanded).
    pub mla: Option<MlaConfig>,
}

/// DeepSeek's multi-head latent attention: queries through `q_proj` or a low-rank
/// `q_a_proj` -> `q_a_layernorm` -> `q_b_proj`; `kv_a_proj_with_mqa` gives a compressed latent
/// (normed by `kv_a_layernorm`, expanded by `kv_b_proj` to each head's unrotated key part
/// and value) and one rotated key part that every head shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MlaConfig {
    /// `None`: one `q_proj` (DeepSeek-V2-Lite).
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    /// `qk_nope_head_dim`: the key/query values without position.
    pub nope_dim: usize,
    /// `qk_rope_head_dim`: the rotated values, after the others in each head.
    pub rope_dim: usize,
    pub v_head_dim: usize,
    /// RoPE pairs are adjacent values (`rope_interleave`, DeepSeek's default) rather than
    /// halves.
    pub rope_interleave: bool,
}

impl MlaConfig {
    fn from_json(j: &Value) -> std::result::Result<Self, String> {
        let dim = |k: &str| -> std::result::Result<usize, String> {
            match j.get(k).and_then(Value::as_u64) {
                Some(v) if v > 0 && v <= 1 << 16 => Ok(v as usize),
                _ => Err(format!(
                    "`{k}` must be a positive integer up to 65536, not {}",
                    j.get(k).unwrap_or(&Value::Null)
                )),
            }
        };
        let q_lora_rank = match j.get("q_lora_rank") {
            None | Some(Value::Null) => None,
            Some(_) => Some(dim("q_lora_rank")?),
        };
        let m = Self {
            q_lora_rank,
            kv_lora_rank: dim("kv_lora_rank")?,
            nope_dim: dim("qk_nope_head_dim")?,
            rope_dim: dim("qk_rope_head_dim")?,
            v_head_dim: dim("v_head_dim")?,
            rope_interleave: j
                .get("rope_interleave")
                .and_then(Value::as_bool)
                .unwrap_or(true),
        };
        if !m.rope_dim.is_multiple_of(2) {
            return Err(format!("qk_rope_head_dim {} is odd", m.rope_dim));
        }
        // Values are computed in heads as wide as the query's, zero-padded.
        if m.v_head_dim > m.qk_head_dim() {
            return Err(format!(
                "v_head_dim {} wider than the query/key head {} is not supported",
                m.v_head_dim,
                m.qk_head_dim()
            ));
        }
        Ok(m)
    }

    pub fn qk_head_dim(&self) -> usize {
        self.nope_dim + self.rope_dim
    }
}

/// How a router turns a token's logits into its experts and their weights.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "scoring", rename_all = "lowercase")]
pub enum Router {
    /// Softmax over all experts in f32, the top k, renormalised to sum to 1 when `renormalize`
    /// (Qwen-MoE's `norm_topk_prob`; always for Mixtral, where it equals a softmax over the
    /// top-k logits).
    Softmax { renormalize: bool },
    /// DeepSeek-V3 / GLM-4.5: sigmoid scores; the layer's `e_score_correction_bias` added
    /// for choosing only; experts split in `groups`, the `top_groups` groups with the largest
    /// sum of their two best biased scores kept; the top k of those; weights the unbiased
    /// scores, renormalised when `renormalize`, times `scale`.
    Sigmoid {
        groups: usize,
        top_groups: usize,
        renormalize: bool,
        scale: f32,
    },
    /// gpt-oss: the top k of the raw logits (the router has a bias), weights a softmax over
    /// those k in f32.
    TopKSoftmax,
}

/// An expert every token goes through besides its routed ones.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct SharedExpert {
    pub intermediate_size: usize,
    /// Its output is scaled by `sigmoid(shared_expert_gate · x)` (Qwen2-MoE).
    pub gated: bool,
}

/// Module names of a sparse MLP, which differ between families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ExpertNaming {
    /// `mlp.gate`, `mlp.experts.E.{gate,up,down}_proj`, `mlp.shared_expert(_gate)`.
    Qwen,
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.E.{w1,w3,w2}` (gate, up, down).
    Mixtral,
    /// As Qwen, the shared experts fused as `mlp.shared_experts`, and the router's
    /// `mlp.gate.e_score_correction_bias`.
    Glm,
    /// gpt-oss: `mlp.router` (with a bias), each expert's fused `gate_up_proj` and `down_proj`
    /// with biases, stored as 3D tensors across the experts (`Checkpoint::open` names each
    /// expert's part).
    GptOss,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub experts_per_token: usize,
    /// Width of each routed expert's MLP.
    pub expert_intermediate_size: usize,
    pub router: Router,
    pub shared_expert: Option<SharedExpert>,
    /// For each decoder layer, whether its MLP is the mixture (else a dense MLP of
    /// `intermediate_size`).
    pub sparse_layers: Vec<bool>,
    pub naming: ExpertNaming,
}

impl MoeConfig {
    fn from_json(
        j: &Value,
        arch: Architecture,
        num_layers: usize,
    ) -> std::result::Result<Option<Self>, String> {
        let int = |k: &str| j.get(k).and_then(Value::as_u64).map(|v| v as usize);
        let need = |k: &str| int(k).ok_or_else(|| format!("missing or non-integer `{k}`"));
        let (num_experts, naming, renormalize) = match arch {
            Architecture::Qwen2Moe | Architecture::Qwen3Moe => (
                need("num_experts")?,
                ExpertNaming::Qwen,
                j.get("norm_topk_prob")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            ),
            Architecture::Mixtral => (need("num_local_experts")?, ExpertNaming::Mixtral, true),
            Architecture::GptOss => (need("num_local_experts")?, ExpertNaming::GptOss, true),
            Architecture::Glm4Moe | Architecture::DeepseekV3 => (
                need("n_routed_experts")?,
                ExpertNaming::Glm,
                j.get("norm_topk_prob")
                    .and_then(Value::as_bool)
                    .unwrap_or(true),
            ),
            _ => return Ok(None),
        };
        if num_experts > MAX_EXPERTS {
            return Err(format!("{num_experts} experts exceed {MAX_EXPERTS}"));
        }
        let experts_per_token = need("num_experts_per_tok")?;
        if num_experts == 0 || experts_per_token == 0 || experts_per_token > num_experts {
            return Err(format!(
                "num_experts_per_tok {experts_per_token} must be between 1 and the number of \
                 experts {num_experts}"
            ));
        }
        let expert_intermediate_size = match arch {
            Architecture::Mixtral | Architecture::GptOss => need("intermediate_size")?,
            _ => need("moe_intermediate_size")?,
        };
        let sparse_layers = match arch {
            Architecture::Mixtral | Architecture::GptOss => vec![true; num_layers],
            Architecture::Glm4Moe | Architecture::DeepseekV3 => {
                let default = if arch == Architecture::Glm4Moe { 1 } else { 3 };
                let dense = int("first_k_dense_replace").unwrap_or(default);
                (0..num_layers).map(|l| l >= dense).collect()
            }
            _ => {
                // Qwen-MoE: layer l is sparse unless listed in `mlp_only_layers`, every
                // `decoder_sparse_step`-th layer counting from 1.
                let step = int("decoder_sparse_step").unwrap_or(1);
                if step == 0 {
                    return Err("decoder_sparse_step 0 is not supported".into());
                }
                let dense: Vec<u64> = j
                    .get("mlp_only_layers")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_u64).collect())
                    .unwrap_or_default();
                (0..num_layers)
                    .map(|l| !dense.contains(&(l as u64)) && (l + 1) % step == 0)
                    .collect()
            }
        };
        let shared_expert = match (arch, int("shared_expert_intermediate_size")) {
            (Architecture::Qwen2Moe, Some(n)) if n > 0 => Some(SharedExpert {
                intermediate_size: n,
                gated: true,
            }),
            // n_shared_experts fused into one MLP, ungated.
            (Architecture::Glm4Moe | Architecture::DeepseekV3, _) => {
                match int("n_shared_experts").unwrap_or(1) {
                    0 => None,
                    n => Some(SharedExpert {
                        intermediate_size: n * expert_intermediate_size,
                        gated: false,
                    }),
                }
            }
            _ => None,
        };
        let router = match arch {
            Architecture::Glm4Moe | Architecture::DeepseekV3 => {
                let groups = int("n_group").unwrap_or(1);
                let top_groups = int("topk_group").unwrap_or(1);
                if groups == 0
                    || num_experts % groups != 0
                    || top_groups == 0
                    || top_groups > groups
                {
                    return Err(format!(
                        "n_group {groups} / topk_group {top_groups} do not divide {num_experts} experts"
                    ));
                }
                if experts_per_token > top_groups * (num_experts / groups) {
                    return Err(format!(
                        "num_experts_per_tok {experts_per_token} exceeds the {} experts of topk_group {top_groups} groups",
                        top_groups * (num_experts / groups)
                    ));
                }
                Router::Sigmoid {
                    groups,
                    top_groups,
                    renormalize,
                    scale: j
                        .get("routed_scaling_factor")
                        .and_then(Value::as_f64)
                        .unwrap_or(1.0) as f32,
                }
            }
            Architecture::GptOss => Router::TopKSoftmax,
            _ => Router::Softmax { renormalize },
        };
        Ok(Some(Self {
            num_experts,
            experts_per_token,
            expert_intermediate_size,
            router,
            shared_expert,
            sparse_layers,
            naming,
        }))
    }

    pub fn is_sparse(&self, layer: usize) -> bool {
        self.sparse_layers.get(layer).copied().unwrap_or(false)
    }
}

impl ModelConfig {
    pub fn from_file(path: &Path) -> Result<(Self, Value)> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| Error::format(path, format!("not valid JSON: {e}")))?;
        let cfg = Self::from_json(&json).map_err(|message| Error::Format {
            file: path.to_path_buf(),
            message,
        })?;
        Ok((cfg, json))
    }

    pub fn from_json(outer: &Value) -> std::result::Result<Self, String> {
        let arch_name = outer
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .or_else(|| outer.get("model_type").and_then(Value::as_str))
            .ok_or("has neither `architectures` nor `model_type`")?;
        // A multimodal checkpoint's language model is described by its `text_config`; the
        // dtype and the tie are the checkpoint's.
        let multimodal = matches!(arch_name, "Gemma3ForConditionalGeneration" | "gemma3");
        let j = if multimodal {
            outer
                .get("text_config")
                .filter(|v| v.is_object())
                .ok_or("Gemma3ForConditionalGeneration without a `text_config`")?
        } else {
            outer
        };
        let architecture = match arch_name {
            "LlamaForCausalLM" | "llama" => Architecture::Llama,
            "MistralForCausalLM" | "mistral" => Architecture::Mistral,
            "Qwen2ForCausalLM" | "qwen2" => Architecture::Qwen2,
            "Qwen3ForCausalLM" | "qwen3" => Architecture::Qwen3,
            "Qwen2MoeForCausalLM" | "qwen2_moe" => Architecture::Qwen2Moe,
            "Qwen3MoeForCausalLM" | "qwen3_moe" => Architecture::Qwen3Moe,
            "MixtralForCausalLM" | "mixtral" => Architecture::Mixtral,
            "Glm4MoeForCausalLM" | "glm4_moe" => Architecture::Glm4Moe,
            "Gemma2ForCausalLM" | "gemma2" => Architecture::Gemma2,
            "Gemma3ForCausalLM" | "gemma3_text" | "Gemma3ForConditionalGeneration" | "gemma3" => {
                Architecture::Gemma3
            }
            "Phi3ForCausalLM" | "phi3" => Architecture::Phi3,
            "GptOssForCausalLM" | "gpt_oss" => Architecture::GptOss,
            "DeepseekV3ForCausalLM" | "deepseek_v3" | "kimi_k2" => Architecture::DeepseekV3,
            other => {
                return Err(format!(
                    "unsupported architecture `{other}` (supported: LlamaForCausalLM, \
                     MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, \
                     Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, \
                     Glm4MoeForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, \
                     Gemma3ForConditionalGeneration, Phi3ForCausalLM, GptOssForCausalLM, \
                     DeepseekV3ForCausalLM)"
                ));
            }
        };
        let gemma = matches!(architecture, Architecture::Gemma2 | Architecture::Gemma3);
        let usize_field = |k: &str| -> std::result::Result<usize, String> {
            j.get(k)
                .and_then(Value::as_u64)
                .map(|v| v as usize)
                .ok_or_else(|| format!("missing or non-integer `{k}`"))
        };
        let float_field = |k: &str| j.get(k).and_then(Value::as_f64);
        let bool_field =
            |k: &str, default: bool| j.get(k).and_then(Value::as_bool).unwrap_or(default);
        let hidden_size = usize_field("hidden_size")?;
        let num_heads = usize_field("num_attention_heads")?;
        let mla = match architecture {
            Architecture::DeepseekV3 => Some(MlaConfig::from_json(j)?),
            _ => None,
        };
        // Latent attention expands its keys and values to every head.
        let num_kv_heads = match mla {
            Some(_) => num_heads,
            None => j
                .get("num_key_value_heads")
                .and_then(Value::as_u64)
                .map_or(num_heads, |v| v as usize),
        };
        // DeepSeek's `head_dim` is its rotated part; the attention's is the query/key head.
        let head_dim = match (&mla, j.get("head_dim").and_then(Value::as_u64)) {
            (Some(m), _) => m.qk_head_dim(),
            (None, Some(d)) => d as usize,
            (None, None) => {
                if num_heads == 0 || hidden_size % num_heads != 0 {
                    return Err(format!(
                        "hidden_size {hidden_size} is not divisible by num_attention_heads {num_heads}"
                    ));
                }
                hidden_size / num_heads
            }
        };
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(format!(
                "num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}"
            ));
        }
        if head_dim % 2 != 0 {
            return Err(format!(
                "head_dim {head_dim} is odd; RoPE needs an even head_dim"
            ));
        }
        // Gemma reads `hidden_activation`; the others `hidden_act`.
        let act_key = if gemma && j.get("hidden_activation").is_some() {
            "hidden_activation"
        } else {
            "hidden_act"
        };
        let mlp_activation = match j.get(act_key).and_then(Value::as_str) {
            // transformers' GptOssExperts ignore `hidden_act`.
            _ if architecture == Architecture::GptOss => GatedActivation::ClampedSwiglu {
                alpha: float_field("swiglu_alpha").unwrap_or(1.702) as f32,
                limit: float_field("swiglu_limit").unwrap_or(7.0) as f32,
            },
            None | Some("silu") => GatedActivation::Silu,
            Some("gelu_pytorch_tanh" | "gelu_tanh") => GatedActivation::GeluTanh,
            Some(other) => {
                return Err(format!(
                    "unsupported {act_key} `{other}` (supported: silu, gelu_pytorch_tanh)"
                ));
            }
        };
        // Per-layer tables are built from these counts before any tensor is read: a config
        // claiming billions of layers or experts is refused rather than allocated.
        let num_layers = usize_field("num_hidden_layers")?;
        if num_layers > MAX_LAYERS {
            return Err(format!(
                "num_hidden_layers {num_layers} exceeds {MAX_LAYERS}"
            ));
        }
        let max_position_embeddings = usize_field("max_position_embeddings")?;
        let (rope, local_rope) = parse_rope(j, architecture, max_position_embeddings)?;
        // GLM-4.5 rotates the first half of each head (transformers 5 may keep the factor in
        // `rope_parameters`; GLM-4-MoE's default is 0.5).
        let rope_params = j.get("rope_parameters").filter(|v| v.is_object());
        let partial = j
            .get("partial_rotary_factor")
            .or_else(|| rope_params.and_then(|p| p.get("partial_rotary_factor")))
            .and_then(Value::as_f64)
            .unwrap_or(if architecture == Architecture::Glm4Moe {
                0.5
            } else {
                1.0
            });
        // transformers: int(head_dim * partial_rotary_factor); latent attention rotates its
        // decoupled dimensions.
        let rotary_dim = match &mla {
            Some(m) => m.rope_dim,
            None => (head_dim as f64 * partial) as usize,
        };
        if !(partial > 0.0 && partial <= 1.0) || rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
            return Err(format!(
                "unsupported partial_rotary_factor {partial} (head_dim {head_dim} gives rotary dim {rotary_dim})"
            ));
        }
        if let Some(RopeScaling::Longrope {
            short_factor,
            long_factor,
            ..
        }) = &rope.scaling
            && (short_factor.len() != rotary_dim / 2 || long_factor.len() != rotary_dim / 2)
        {
            return Err(format!(
                "rope_scaling short_factor/long_factor have {}/{} entries; the rotary dim {rotary_dim} needs {}",
                short_factor.len(),
                long_factor.len(),
                rotary_dim / 2
            ));
        }
        let dtype_name = outer
            .get("torch_dtype")
            .or_else(|| outer.get("dtype"))
            .and_then(Value::as_str)
            .unwrap_or("float32");
        let dtype = match dtype_name {
            "float32" => FloatType::F32,
            "float16" => FloatType::F16,
            "bfloat16" => FloatType::Bf16,
            other => return Err(format!("unsupported torch_dtype `{other}`")),
        };
        let (sliding_window, layer_types) = parse_layer_types(j, architecture, num_layers)?;
        if bool_field("mlp_bias", false) {
            return Err("unsupported mlp_bias: true".into());
        }
        if bool_field("use_bidirectional_attention", false) {
            return Err("unsupported use_bidirectional_attention: true".into());
        }
        let softcap = |k: &str| -> std::result::Result<Option<f32>, String> {
            match j.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => match v.as_f64() {
                    Some(c) if c > 0.0 => Ok(Some(c as f32)),
                    _ => Err(format!("`{k}` must be a positive number or null, not {v}")),
                },
            }
        };
        let attn_scale = if gemma {
            let s = float_field("query_pre_attn_scalar").unwrap_or(256.0);
            if s <= 0.0 {
                return Err(format!("query_pre_attn_scalar {s} must be positive"));
            }
            s.powf(-0.5)
        } else if mla.is_some() {
            latent_attn_scale(j, head_dim)
        } else {
            (head_dim as f64).powf(-0.5)
        };
        let moe = MoeConfig::from_json(j, architecture, num_layers)?;
        Ok(Self {
            architecture,
            hidden_size,
            intermediate_size: usize_field("intermediate_size")?,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rotary_dim,
            vocab_size: usize_field("vocab_size")?,
            max_position_embeddings,
            rms_norm_eps: float_field("rms_norm_eps").unwrap_or(1e-6),
            rope,
            local_rope,
            tie_word_embeddings: outer
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(gemma),
            // DeepSeek: the bias of q_a_proj and kv_a_proj_with_mqa.
            qkv_bias: matches!(architecture, Architecture::Qwen2 | Architecture::Qwen2Moe)
                || bool_field("attention_bias", architecture == Architecture::GptOss),
            qk_norm: matches!(
                architecture,
                Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3
            ) || (architecture == Architecture::Glm4Moe
                && bool_field("use_qk_norm", false)),
            o_bias: !matches!(
                architecture,
                Architecture::Qwen2
                    | Architecture::Qwen2Moe
                    | Architecture::Qwen3
                    | Architecture::Qwen3Moe
                    | Architecture::Glm4Moe
            ) && bool_field("attention_bias", architecture == Architecture::GptOss),
            attention_sinks: architecture == Architecture::GptOss,
            dtype,
            bos_token_id: j
                .get("bos_token_id")
                .and_then(Value::as_u64)
                .map(|v| v as u32),
            eos_token_id: j
                .get("eos_token_id")
                .and_then(|v| v.as_u64().or_else(|| v.get(0).and_then(Value::as_u64)))
                .map(|v| v as u32),
            sliding_window,
            layer_types,
            attn_scale,
            attn_softcap: softcap("attn_logit_softcapping")?,
            final_softcap: softcap("final_logit_softcapping")?,
            norm_offset: if gemma { 1.0 } else { 0.0 },
            sandwich_norms: gemma,
            scaled_embeddings: gemma,
            mlp_activation,
            fused_projections: architecture == Architecture::Phi3,
            prefix: "model".into(),
            moe,
            mla,
        })
    }

    /// The rotary embedding of layer `layer`.
    pub fn rope_of(&self, layer: usize) -> &RopeParams {
        match (self.layer_types.get(layer), &self.local_rope) {
            (Some(LayerAttention::Sliding), Some(local)) => local,
            _ => &self.rope,
        }
    }

    /// The attention window of layer `layer` (`None`: full).
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        match self.layer_types.get(layer) {
            Some(LayerAttention::Sliding) => self.sliding_window,
            _ => None,
        }
    }

    /// Parameters of the decoder (embeddings and lm_head included once each; every expert).
    pub fn num_params(&self) -> u64 {
        self.params(false)
    }

    /// Parameters one token goes through: the routed experts counted `experts_per_token`
    /// times instead of `num_experts` (embeddings and lm_head included once each).
    pub fn active_params(&self) -> u64 {
        self.params(true)
    }

    fn params(&self, active_only: bool) -> u64 {
        let h = self.hidden_size as u64;
        let attention = self.attention_params();
        let layers: u64 = (0..self.num_layers)
            .map(|l| attention + self.mlp_params(l, active_only))
            .sum();
        let embed = self.vocab_size as u64 * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        layers + embed + head
    }

    /// Parameters of one layer's attention projections.
    fn attention_params(&self) -> u64 {
        let (h, heads) = (self.hidden_size as u64, self.num_heads as u64);
        match &self.mla {
            Some(m) => {
                let qk = heads * m.qk_head_dim() as u64;
                let q = match m.q_lora_rank {
                    Some(r) => h * r as u64 + r as u64 * qk,
                    None => h * qk,
                };
                let kv_a = h * (m.kv_lora_rank + m.rope_dim) as u64;
                let kv_b = m.kv_lora_rank as u64 * heads * (m.nope_dim + m.v_head_dim) as u64;
                q + kv_a + kv_b + heads * m.v_head_dim as u64 * h
            }
            None => {
                let q = heads * self.head_dim as u64;
                let kv = (self.num_kv_heads * self.head_dim) as u64;
                h * q * 2 + h * kv * 2
            }
        }
    }

    /// Values per token that a layer's attention holds at once (q, k, v; for latent attention
    /// also the latent and the expanded keys/values), for sizing batches.
    pub fn attention_width(&self) -> usize {
        let heads = self.num_heads;
        match &self.mla {
            Some(m) => {
                3 * heads * self.head_dim
                    + heads * (m.nope_dim + m.v_head_dim)
                    + m.kv_lora_rank
                    + m.rope_dim
                    + m.q_lora_rank.unwrap_or(0)
            }
            None => (heads + 2 * self.num_kv_heads) * self.head_dim,
        }
    }

    /// Parameters of layer `layer`'s MLP (router and shared expert included).
    fn mlp_params(&self, layer: usize, active_only: bool) -> u64 {
        let h = self.hidden_size as u64;
        match &self.moe {
            Some(m) if m.is_sparse(layer) => {
                let experts = if active_only {
                    m.experts_per_token
                } else {
                    m.num_experts
                } as u64;
                let shared = m.shared_expert.map_or(0, |s| {
                    3 * h * s.intermediate_size as u64 + if s.gated { h } else { 0 }
                });
                experts * 3 * h * m.expert_intermediate_size as u64
                    + m.num_experts as u64 * h
                    + shared
            }
            _ => 3 * h * self.intermediate_size as u64,
        }
    }

    /// Parameters that take part in the matmuls of one token (no embedding gather; routed
    /// experts counted as many times as a token uses them).
    pub fn matmul_params(&self) -> u64 {
        let embed = self.vocab_size as u64 * self.hidden_size as u64;
        let head_extra = if self.tie_word_embeddings { embed } else { 0 };
        self.active_params() - embed + head_extra
    }

    /// The widest MLP activation a token has in any layer (dense MLP, one expert's, or the
    /// shared expert's), for sizing batches.
    pub fn widest_mlp(&self) -> usize {
        let moe = self.moe.as_ref().map_or(0, |m| {
            m.expert_intermediate_size
                .max(m.shared_expert.map_or(0, |s| s.intermediate_size))
        });
        let dense_layers = self
            .moe
            .as_ref()
            .is_none_or(|m| m.sparse_layers.iter().any(|&s| !s));
        moe.max(if dense_layers {
            self.intermediate_size
        } else {
            0
        })
    }
}

/// The rotary embeddings: `rope_parameters` (transformers 5; flat, or per layer type as
/// Gemma 3 writes it) or the older `rope_theta` / `rope_scaling` / `rope_local_base_freq`.
/// Returns the full-attention layers' and, where they differ, the sliding layers'.
fn parse_rope(
    j: &Value,
    arch: Architecture,
    max_positions: usize,
) -> std::result::Result<(RopeParams, Option<RopeParams>), String> {
    let gemma3 = arch == Architecture::Gemma3;
    let params = j.get("rope_parameters").filter(|v| v.is_object());
    let top_original = j
        .get("original_max_position_embeddings")
        .and_then(Value::as_f64);
    let read = |p: &Value, default_theta: f64| -> std::result::Result<RopeParams, String> {
        Ok(RopeParams {
            theta: p
                .get("rope_theta")
                .and_then(Value::as_f64)
                .unwrap_or(default_theta),
            scaling: parse_rope_scaling(p, max_positions, top_original)?,
        })
    };
    let global_theta = if gemma3 { 1_000_000.0 } else { 10_000.0 };
    if let Some(per_type) =
        params.filter(|p| p.get("full_attention").is_some() || p.get("sliding_attention").is_some())
    {
        let global = match per_type.get("full_attention") {
            Some(p) => read(p, global_theta)?,
            None => RopeParams {
                theta: global_theta,
                scaling: None,
            },
        };
        let local = per_type
            .get("sliding_attention")
            .map(|p| read(p, 10_000.0))
            .transpose()?;
        return Ok((global, local));
    }
    let theta = j
        .get("rope_theta")
        .and_then(Value::as_f64)
        .or_else(|| {
            params
                .and_then(|p| p.get("rope_theta"))
                .and_then(Value::as_f64)
        })
        .unwrap_or(global_theta);
    let scaling = match j.get("rope_scaling").filter(|v| v.is_object()).or(params) {
        None => None,
        Some(s) => parse_rope_scaling(s, max_positions, top_original)?,
    };
    let local = gemma3.then(|| RopeParams {
        theta: j
            .get("rope_local_base_freq")
            .and_then(Value::as_f64)
            .unwrap_or(10_000.0),
        scaling: None,
    });
    Ok((RopeParams { theta, scaling }, local))
}

/// transformers' `yarn_get_mscale`.
fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

/// DeepSeek's softmax scale: `qk_head_dim^-0.5`, times `yarn_get_mscale(factor,
/// mscale_all_dim)^2` where the RoPE is scaled and says `mscale_all_dim` (transformers'
/// `yarn_apply_mscale`).
fn latent_attn_scale(j: &Value, qk_head_dim: usize) -> f64 {
    let base = (qk_head_dim as f64).powf(-0.5);
    let Some(p) = j
        .get("rope_parameters")
        .or_else(|| j.get("rope_scaling"))
        .filter(|v| v.is_object())
    else {
        return base;
    };
    let kind = p.get("rope_type").or_else(|| p.get("type"));
    let all_dim = p.get("mscale_all_dim").and_then(Value::as_f64);
    match (
        kind.and_then(Value::as_str),
        all_dim,
        p.get("factor").and_then(Value::as_f64),
    ) {
        (Some(k), Some(m), Some(factor)) if k != "default" && m != 0.0 => {
            base * yarn_mscale(factor, m).powi(2)
        }
        _ => base,
    }
}

fn parse_rope_scaling(
    s: &Value,
    max_positions: usize,
    top_original: Option<f64>,
) -> std::result::Result<Option<RopeScaling>, String> {
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let opt = |k: &str| s.get(k).and_then(Value::as_f64);
    let num = |k: &str| -> std::result::Result<f64, String> {
        opt(k).ok_or_else(|| format!("rope_scaling of type {kind} lacks `{k}`"))
    };
    let original = || -> std::result::Result<f64, String> {
        opt("original_max_position_embeddings")
            .or(top_original)
            .filter(|&v| v > 0.0)
            .ok_or_else(|| {
                format!("rope_scaling of type {kind} lacks `original_max_position_embeddings`")
            })
    };
    let factors = |k: &str| -> std::result::Result<Vec<f64>, String> {
        s.get(k)
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<_>>>())
            .ok_or_else(|| format!("rope_scaling of type {kind} lacks a numeric list `{k}`"))
    };
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear {
            factor: num("factor")?,
        })),
        "llama3" => Ok(Some(RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")?,
        })),
        "yarn" => {
            let original = original()?;
            let factor = opt("factor").unwrap_or(max_positions as f64 / original);
            let attention_factor = match (
                opt("attention_factor"),
                opt("mscale"),
                opt("mscale_all_dim"),
            ) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    yarn_mscale(factor, m) / yarn_mscale(factor, all)
                }
                _ => yarn_mscale(factor, 1.0),
            };
            Ok(Some(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                // `or` in transformers: 0 means the default too.
                beta_fast: opt("beta_fast").filter(|&b| b != 0.0).unwrap_or(32.0),
                beta_slow: opt("beta_slow").filter(|&b| b != 0.0).unwrap_or(1.0),
                truncate: s.get("truncate").and_then(Value::as_bool).unwrap_or(true),
                attention_factor,
            }))
        }
        "longrope" | "su" => {
            let original = original().unwrap_or(max_positions as f64);
            let factor = opt("factor").unwrap_or(max_positions as f64 / original);
            let attention_factor = opt("attention_factor").unwrap_or(if factor <= 1.0 {
                1.0
            } else {
                (1.0 + factor.ln() / original.ln()).sqrt()
            });
            Ok(Some(RopeScaling::Longrope {
                short_factor: factors("short_factor")?,
                long_factor: factors("long_factor")?,
                original_max_position_embeddings: original as usize,
                attention_factor,
            }))
        }
        other => Err(format!(
            "unsupported rope_scaling type `{other}` (supported: default, linear, llama3, yarn, longrope)"
        )),
    }
}

/// The sliding window and each layer's attention span: `layer_types` where the config lists
/// them, else each family's rule as transformers derives it.
fn parse_layer_types(
    j: &Value,
    arch: Architecture,
    num_layers: usize,
) -> std::result::Result<(Option<usize>, Vec<LayerAttention>), String> {
    // 0 or null: no window (Qwen2-MoE writes 0 when `use_sliding_window` is off).
    let window = match j.get("sliding_window") {
        // transformers' Gemma 2/3 configs default to 4096, gpt-oss's to 128.
        None if matches!(arch, Architecture::Gemma2 | Architecture::Gemma3) => Some(4096),
        None if arch == Architecture::GptOss => Some(128),
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(0) => None,
            Some(w) => Some(w as usize),
            None => return Err(format!("`sliding_window` must be an integer, not {v}")),
        },
    };
    let int = |k: &str| j.get(k).and_then(Value::as_u64).map(|v| v as usize);
    let types: Vec<LayerAttention> = match j.get("layer_types").and_then(Value::as_array) {
        Some(list) => {
            if list.len() != num_layers {
                return Err(format!(
                    "layer_types has {} entries for {num_layers} layers",
                    list.len()
                ));
            }
            list.iter()
                .map(|v| match v.as_str() {
                    Some("full_attention") => Ok(LayerAttention::Full),
                    Some("sliding_attention") => Ok(LayerAttention::Sliding),
                    _ => Err(format!(
                        "unsupported layer_types entry {v} (supported: full_attention, sliding_attention)"
                    )),
                })
                .collect::<std::result::Result<_, _>>()?
        }
        None => (0..num_layers)
            .map(|l| {
                let sliding = match arch {
                    Architecture::Gemma2 | Architecture::GptOss => (l + 1) % 2 != 0,
                    Architecture::Gemma3 => {
                        let pattern = int("sliding_window_pattern")
                            .or_else(|| int("_sliding_window_pattern"))
                            .unwrap_or(6)
                            .max(1);
                        (l + 1) % pattern != 0
                    }
                    Architecture::Mistral | Architecture::Mixtral | Architecture::Phi3 => {
                        window.is_some()
                    }
                    Architecture::Qwen2
                    | Architecture::Qwen3
                    | Architecture::Qwen2Moe
                    | Architecture::Qwen3Moe => {
                        j.get("use_sliding_window").and_then(Value::as_bool) == Some(true)
                            && l >= int("max_window_layers").unwrap_or(0)
                    }
                    _ => false,
                };
                if sliding {
                    LayerAttention::Sliding
                } else {
                    LayerAttention::Full
                }
            })
            .collect(),
    };
    if window.is_none() && types.contains(&LayerAttention::Sliding) {
        return Err("layer_types has sliding_attention layers but sliding_window is null".into());
    }
    Ok((window, types))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn base(arch: &str) -> Value {
        json!({
            "architectures": [arch],
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "num_hidden_layers": 12,
            "num_attention_heads": 32,
            "num_key_value_heads": 16,
            "head_dim": 128,
            "vocab_size": 1024,
            "max_position_embeddings": 131072,
        })
    }

    fn with(mut j: Value, extra: Value) -> Value {
        let (Value::Object(m), Value::Object(e)) = (&mut j, extra) else {
            unreachable!()
        };
        m.extend(e);
        j
    }

    #[test]
    fn gemma3_legacy_config_gets_its_local_layers_and_ropes() {
        let j = with(
            base("Gemma3ForCausalLM"),
            json!({
                "query_pre_attn_scalar": 168,
                "sliding_window": 1024,
                "sliding_window_pattern": 6,
                "rope_theta": 1000000.0,
                "rope_local_base_freq": 10000.0,
                "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                "hidden_activation": "gelu_pytorch_tanh",
            }),
        );
        let c = ModelConfig::from_json(&j).unwrap();
        let sliding: Vec<usize> = (0..12).filter(|&l| c.window_of(l).is_some()).collect();
        assert_eq!(sliding, [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]);
        assert_eq!(c.window_of(0), Some(1024));
        assert_eq!(c.rope_of(5).theta, 1e6);
        assert_eq!(
            c.rope_of(5).scaling,
            Some(RopeScaling::Linear { factor: 8.0 })
        );
        assert_eq!(c.rope_of(0).theta, 1e4);
        assert_eq!(c.rope_of(0).scaling, None);
        assert_eq!(c.attn_scale, 168f64.powf(-0.5));
        assert_eq!(c.mlp_activation, GatedActivation::GeluTanh);
        assert!(c.qk_norm && c.sandwich_norms && c.scaled_embeddings);
        assert_eq!(c.norm_offset, 1.0);
        assert!(c.tie_word_embeddings, "Gemma ties by default");
    }

    #[test]
    fn multimodal_gemma3_reads_its_text_config_and_the_outer_dtype() {
        let j = json!({
            "architectures": ["Gemma3ForConditionalGeneration"],
            "dtype": "bfloat16",
            "text_config": with(base("x"), json!({"dtype": "float32", "sliding_window": 512})),
            "vision_config": {"hidden_size": 1152},
        });
        let c = ModelConfig::from_json(&j).unwrap();
        assert_eq!(c.architecture, Architecture::Gemma3);
        assert_eq!(c.dtype, FloatType::Bf16);
        assert_eq!(c.hidden_size, 5376);
        let no_text = json!({"architectures": ["Gemma3ForConditionalGeneration"]});
        let e = ModelConfig::from_json(&no_text).unwrap_err();
        assert!(e.contains("text_config"), "{e}");
    }

    #[test]
    fn each_family_places_its_sliding_layers() {
        let gemma2 = with(base("Gemma2ForCausalLM"), json!({"sliding_window": 4096}));
        let c = ModelConfig::from_json(&gemma2).unwrap();
        assert_eq!(c.window_of(0), Some(4096));
        assert_eq!(c.window_of(1), None);
        let mistral = with(base("MistralForCausalLM"), json!({"sliding_window": 4096}));
        let c = ModelConfig::from_json(&mistral).unwrap();
        assert!((0..12).all(|l| c.window_of(l) == Some(4096)));
        let qwen =
            json!({"sliding_window": 32768, "use_sliding_window": true, "max_window_layers": 10});
        let c = ModelConfig::from_json(&with(base("Qwen2ForCausalLM"), qwen)).unwrap();
        assert_eq!(c.window_of(9), None);
        assert_eq!(c.window_of(10), Some(32768));
        let off = json!({"sliding_window": 0, "use_sliding_window": false});
        let c = ModelConfig::from_json(&with(base("Qwen2MoeForCausalLM"), off));
        assert!(
            c.is_err_and(|e| e.contains("num_experts")),
            "only the MoE keys are missing"
        );
    }

    #[test]
    fn unimplemented_values_are_refused_by_key_and_value() {
        let bad_type = json!({"sliding_window": 64, "layer_types": vec!["chunked_attention"; 12]});
        let e = ModelConfig::from_json(&with(base("Gemma3ForCausalLM"), bad_type)).unwrap_err();
        assert!(
            e.contains("layer_types") && e.contains("chunked_attention"),
            "{e}"
        );
        let short = json!({"sliding_window": 64, "layer_types": ["full_attention"]});
        let e = ModelConfig::from_json(&with(base("Gemma3ForCausalLM"), short)).unwrap_err();
        assert!(e.contains("layer_types has 1 entries for 12 layers"), "{e}");
        let no_window = json!({"layer_types": vec!["sliding_attention"; 12]});
        let e = ModelConfig::from_json(&with(base("LlamaForCausalLM"), no_window)).unwrap_err();
        assert!(e.contains("sliding_window is null"), "{e}");
        let rope = json!({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}});
        let e = ModelConfig::from_json(&with(base("LlamaForCausalLM"), rope)).unwrap_err();
        assert!(e.contains("rope_scaling type `dynamic`"), "{e}");
        let yarn = json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}});
        let e = ModelConfig::from_json(&with(base("Qwen3ForCausalLM"), yarn)).unwrap_err();
        assert!(e.contains("original_max_position_embeddings"), "{e}");
        let act = json!({"hidden_act": "relu"});
        let e = ModelConfig::from_json(&with(base("LlamaForCausalLM"), act)).unwrap_err();
        assert!(e.contains("hidden_act `relu`"), "{e}");
        let cap = json!({"attn_logit_softcapping": -1.0});
        let e = ModelConfig::from_json(&with(base("Gemma2ForCausalLM"), cap)).unwrap_err();
        assert!(e.contains("attn_logit_softcapping"), "{e}");
        let bidi = json!({"use_bidirectional_attention": true});
        let e = ModelConfig::from_json(&with(base("Gemma3ForCausalLM"), bidi)).unwrap_err();
        assert!(e.contains("use_bidirectional_attention"), "{e}");
        let longrope = json!({
            "partial_rotary_factor": 0.75,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]},
        });
        let e = ModelConfig::from_json(&with(base("Phi3ForCausalLM"), longrope)).unwrap_err();
        assert!(
            e.contains("short_factor/long_factor have 1/1 entries"),
            "{e}"
        );
    }

    #[test]
    fn yarn_attention_factor_follows_transformers() {
        let yarn = |extra: Value| {
            let mut s = json!({"rope_type": "yarn", "factor": 40.0,
                "original_max_position_embeddings": 4096});
            if let (Value::Object(m), Value::Object(e)) = (&mut s, extra) {
                m.extend(e);
            }
            match parse_rope_scaling(&s, 163_840, None).unwrap() {
                Some(RopeScaling::Yarn {
                    attention_factor, ..
                }) => attention_factor,
                other => panic!("{other:?}"),
            }
        };
        // get_mscale(40) = 0.1 ln 40 + 1; DeepSeek-V3's mscale = mscale_all_dim = 1 gives 1.
        assert!((yarn(json!({})) - (0.1 * 40f64.ln() + 1.0)).abs() < 1e-15);
        assert_eq!(yarn(json!({"mscale": 1.0, "mscale_all_dim": 1.0})), 1.0);
        assert_eq!(yarn(json!({"attention_factor": 0.5})), 0.5);
    }

    /// DeepSeek-V3's published config (deepseek-ai/DeepSeek-V3 config.json).
    fn deepseek_v3() -> Value {
        json!({
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "hidden_size": 7168,
            "intermediate_size": 18432,
            "moe_intermediate_size": 2048,
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "n_shared_experts": 1,
            "n_routed_experts": 256,
            "routed_scaling_factor": 2.5,
            "kv_lora_rank": 512,
            "q_lora_rank": 1536,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "qk_nope_head_dim": 128,
            "n_group": 8,
            "topk_group": 4,
            "num_experts_per_tok": 8,
            "first_k_dense_replace": 3,
            "norm_topk_prob": true,
            "max_position_embeddings": 163840,
            "rope_scaling": {
                "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"
            },
            "rope_theta": 10000,
            "vocab_size": 129280,
            "torch_dtype": "bfloat16",
        })
    }

    #[test]
    fn deepseek_v3_reads_latent_attention_and_its_softmax_scale() {
        let c = ModelConfig::from_json(&deepseek_v3()).unwrap();
        let m = c.mla.unwrap();
        assert_eq!(
            (
                m.q_lora_rank,
                m.kv_lora_rank,
                m.nope_dim,
                m.rope_dim,
                m.v_head_dim
            ),
            (Some(1536), 512, 128, 64, 128)
        );
        assert!(m.rope_interleave);
        // Heads of 128 + 64 for queries and keys; RoPE over the 64; keys per head.
        assert_eq!((c.head_dim, c.rotary_dim, c.num_kv_heads), (192, 64, 128));
        // transformers: 192^-0.5 * yarn_get_mscale(40, 1.0)^2.
        let mscale = 0.1 * 40f64.ln() + 1.0;
        assert!((c.attn_scale - 192f64.powf(-0.5) * mscale * mscale).abs() < 1e-15);
        let moe = c.moe.as_ref().unwrap();
        assert_eq!(moe.sparse_layers.iter().filter(|&&s| !s).count(), 3);
        assert_eq!(
            moe.router,
            Router::Sigmoid {
                groups: 8,
                top_groups: 4,
                renormalize: true,
                scale: 2.5
            }
        );
        // 671B parameters, 37B activated per token (the DeepSeek-V3 report; norms and the
        // selection biases, below 0.01 %, are not counted here).
        let (all, active) = (c.num_params() as f64, c.active_params() as f64);
        assert!((all / 671e9 - 1.0).abs() < 5e-3, "{all}");
        assert!((active / 37e9 - 1.0).abs() < 2e-2, "{active}");

        // transformers 5's own `head_dim` (its rotated part) does not override the heads; no
        // low-rank query; plain RoPE keeps the plain scale.
        let mut j = deepseek_v3();
        j["head_dim"] = json!(64);
        j["q_lora_rank"] = Value::Null;
        j["rope_scaling"] = Value::Null;
        j["rope_interleave"] = json!(false);
        let c = ModelConfig::from_json(&j).unwrap();
        let m = c.mla.unwrap();
        assert_eq!(
            (m.q_lora_rank, m.rope_interleave, c.head_dim),
            (None, false, 192)
        );
        assert_eq!(c.attn_scale, 192f64.powf(-0.5));

        for (key, bad) in [
            ("kv_lora_rank", json!(0)),
            ("qk_rope_head_dim", json!(63)),
            ("v_head_dim", json!(256)),
            ("qk_nope_head_dim", Value::Null),
        ] {
            let mut j = deepseek_v3();
            j[key] = bad.clone();
            let e = ModelConfig::from_json(&j).unwrap_err();
            assert!(e.contains(key), "{key} = {bad}: {e}");
        }
    }
}
