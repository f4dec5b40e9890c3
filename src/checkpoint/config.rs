//! `config.json` -> a resolved `ModelConfig`, with every default filled in once.

use std::path::Path;

use serde_json::Value;

use crate::numerics::FloatType;
use crate::{Error, Result};

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
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (Qwen2, or Llama with `attention_bias`).
    pub qkv_bias: bool,
    /// Per-head RMSNorm on q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// The checkpoint's floating dtype (`torch_dtype` / `dtype`).
    pub dtype: FloatType,
    pub bos_token_id: Option<u32>,
    /// The first of `eos_token_id` (it may be a list).
    pub eos_token_id: Option<u32>,
    /// Window of Mistral-style sliding attention; contexts longer than it are refused.
    pub sliding_window: Option<usize>,
    /// The mixture of experts, for MoE architectures (`intermediate_size` is then the width
    /// of the dense MLPs of the layers that are not sparse).
    pub moe: Option<MoeConfig>,
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
            Architecture::Glm4Moe => (
                need("n_routed_experts")?,
                ExpertNaming::Glm,
                j.get("norm_topk_prob")
                    .and_then(Value::as_bool)
                    .unwrap_or(true),
            ),
            _ => return Ok(None),
        };
        let experts_per_token = need("num_experts_per_tok")?;
        if num_experts == 0 || experts_per_token == 0 || experts_per_token > num_experts {
            return Err(format!(
                "num_experts_per_tok {experts_per_token} must be between 1 and the number of \
                 experts {num_experts}"
            ));
        }
        let expert_intermediate_size = match arch {
            Architecture::Mixtral => need("intermediate_size")?,
            _ => need("moe_intermediate_size")?,
        };
        let sparse_layers = match arch {
            Architecture::Mixtral => vec![true; num_layers],
            Architecture::Glm4Moe => {
                let dense = int("first_k_dense_replace").unwrap_or(1);
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
            (Architecture::Glm4Moe, _) => match int("n_shared_experts").unwrap_or(1) {
                0 => None,
                n => Some(SharedExpert {
                    intermediate_size: n * expert_intermediate_size,
                    gated: false,
                }),
            },
            _ => None,
        };
        let router = match arch {
            Architecture::Glm4Moe => {
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

    pub fn from_json(j: &Value) -> std::result::Result<Self, String> {
        let arch_name = j
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .or_else(|| j.get("model_type").and_then(Value::as_str))
            .ok_or("has neither `architectures` nor `model_type`")?;
        let architecture = match arch_name {
            "LlamaForCausalLM" | "llama" => Architecture::Llama,
            "MistralForCausalLM" | "mistral" => Architecture::Mistral,
            "Qwen2ForCausalLM" | "qwen2" => Architecture::Qwen2,
            "Qwen3ForCausalLM" | "qwen3" => Architecture::Qwen3,
            "Qwen2MoeForCausalLM" | "qwen2_moe" => Architecture::Qwen2Moe,
            "Qwen3MoeForCausalLM" | "qwen3_moe" => Architecture::Qwen3Moe,
            "MixtralForCausalLM" | "mixtral" => Architecture::Mixtral,
            "Glm4MoeForCausalLM" | "glm4_moe" => Architecture::Glm4Moe,
            other => {
                return Err(format!(
                    "unsupported architecture `{other}` (supported: LlamaForCausalLM, \
                     MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, \
                     Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, \
                     Glm4MoeForCausalLM)"
                ));
            }
        };
        let usize_field = |k: &str| -> std::result::Result<usize, String> {
            j.get(k)
                .and_then(Value::as_u64)
                .map(|v| v as usize)
                .ok_or_else(|| format!("missing or non-integer `{k}`"))
        };
        let hidden_size = usize_field("hidden_size")?;
        let num_heads = usize_field("num_attention_heads")?;
        let num_kv_heads = j
            .get("num_key_value_heads")
            .and_then(Value::as_u64)
            .map_or(num_heads, |v| v as usize);
        let head_dim = match j.get("head_dim").and_then(Value::as_u64) {
            Some(d) => d as usize,
            None => {
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
        if let Some(act) = j.get("hidden_act").and_then(Value::as_str)
            && act != "silu"
        {
            return Err(format!("unsupported hidden_act `{act}` (only silu)"));
        }
        // transformers 5 moved rope_theta/rope_scaling into `rope_parameters`.
        let rope_params = j.get("rope_parameters").filter(|v| v.is_object());
        let rope_theta = j
            .get("rope_theta")
            .and_then(Value::as_f64)
            .or_else(|| {
                rope_params
                    .and_then(|p| p.get("rope_theta"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(10000.0);
        let scaling_json = j
            .get("rope_scaling")
            .filter(|v| v.is_object())
            .or(rope_params);
        let rope_scaling = match scaling_json {
            None => None,
            Some(s) => parse_rope_scaling(s)?,
        };
        // GLM-4.5 rotates the first half of each head (transformers 5 may keep the factor in
        // `rope_parameters`; GLM-4-MoE's default is 0.5).
        let partial = j
            .get("partial_rotary_factor")
            .or_else(|| rope_params.and_then(|p| p.get("partial_rotary_factor")))
            .and_then(Value::as_f64)
            .unwrap_or(if architecture == Architecture::Glm4Moe {
                0.5
            } else {
                1.0
            });
        // transformers: int(head_dim * partial_rotary_factor).
        let rotary_dim = (head_dim as f64 * partial) as usize;
        if !(partial > 0.0 && partial <= 1.0) || rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
            return Err(format!(
                "unsupported partial_rotary_factor {partial} (head_dim {head_dim} gives rotary dim {rotary_dim})"
            ));
        }
        let dtype_name = j
            .get("torch_dtype")
            .or_else(|| j.get("dtype"))
            .and_then(Value::as_str)
            .unwrap_or("float32");
        let dtype = match dtype_name {
            "float32" => FloatType::F32,
            "float16" => FloatType::F16,
            "bfloat16" => FloatType::Bf16,
            other => return Err(format!("unsupported torch_dtype `{other}`")),
        };
        let bool_field =
            |k: &str, default: bool| j.get(k).and_then(Value::as_bool).unwrap_or(default);
        let sliding_window = match architecture {
            Architecture::Mistral | Architecture::Mixtral => {
                j.get("sliding_window").and_then(Value::as_u64)
            }
            _ if bool_field("use_sliding_window", false) => {
                j.get("sliding_window").and_then(Value::as_u64)
            }
            _ => None,
        }
        .map(|v| v as usize);
        if bool_field("mlp_bias", false) {
            return Err("unsupported mlp_bias: true".into());
        }
        let num_layers = usize_field("num_hidden_layers")?;
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
            max_position_embeddings: usize_field("max_position_embeddings")?,
            rms_norm_eps: j
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_word_embeddings: bool_field("tie_word_embeddings", false),
            qkv_bias: matches!(architecture, Architecture::Qwen2 | Architecture::Qwen2Moe)
                || bool_field("attention_bias", false),
            qk_norm: matches!(architecture, Architecture::Qwen3 | Architecture::Qwen3Moe)
                || (architecture == Architecture::Glm4Moe && bool_field("use_qk_norm", false)),
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
            moe,
        })
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
        let q = (self.num_heads * self.head_dim) as u64;
        let kv = (self.num_kv_heads * self.head_dim) as u64;
        let attention = h * q * 2 + h * kv * 2;
        let layers: u64 = (0..self.num_layers)
            .map(|l| attention + self.mlp_params(l, active_only))
            .sum();
        let embed = self.vocab_size as u64 * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        layers + embed + head
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

fn parse_rope_scaling(s: &Value) -> std::result::Result<Option<RopeScaling>, String> {
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let num = |k: &str| -> std::result::Result<f64, String> {
        s.get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("rope_scaling of type {kind} lacks `{k}`"))
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
        other => Err(format!(
            "unsupported rope_scaling type `{other}` (supported: default, linear, llama3)"
        )),
    }
}
