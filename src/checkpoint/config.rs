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
            other => {
                return Err(format!(
                    "unsupported architecture `{other}` (supported: LlamaForCausalLM, \
                     MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)"
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
        if let Some(f) = j.get("partial_rotary_factor").and_then(Value::as_f64)
            && f != 1.0
        {
            return Err(format!("unsupported partial_rotary_factor {f}"));
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
            Architecture::Mistral => j.get("sliding_window").and_then(Value::as_u64),
            _ if bool_field("use_sliding_window", false) => {
                j.get("sliding_window").and_then(Value::as_u64)
            }
            _ => None,
        }
        .map(|v| v as usize);
        if bool_field("mlp_bias", false) {
            return Err("unsupported mlp_bias: true".into());
        }
        Ok(Self {
            architecture,
            hidden_size,
            intermediate_size: usize_field("intermediate_size")?,
            num_layers: usize_field("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: usize_field("vocab_size")?,
            max_position_embeddings: usize_field("max_position_embeddings")?,
            rms_norm_eps: j
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_word_embeddings: bool_field("tie_word_embeddings", false),
            qkv_bias: architecture == Architecture::Qwen2 || bool_field("attention_bias", false),
            qk_norm: architecture == Architecture::Qwen3,
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
        })
    }

    /// Parameters of the decoder (embeddings and lm_head included once each).
    pub fn num_params(&self) -> u64 {
        let h = self.hidden_size as u64;
        let q = (self.num_heads * self.head_dim) as u64;
        let kv = (self.num_kv_heads * self.head_dim) as u64;
        let i = self.intermediate_size as u64;
        let per_layer = h * q * 2 + h * kv * 2 + 3 * h * i;
        let embed = self.vocab_size as u64 * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        self.num_layers as u64 * per_layer + embed + head
    }

    /// Parameters that take part in the matmuls of one token (no embedding gather).
    pub fn matmul_params(&self) -> u64 {
        let embed = self.vocab_size as u64 * self.hidden_size as u64;
        let head_extra = if self.tie_word_embeddings { embed } else { 0 };
        self.num_params() - embed + head_extra
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
