//! `config.json` -> a resolved `ModelConfig`, with every default filled in once. One file a
//! concern: the family and its fixed options (`architecture.rs`), attention (`attention.rs`),
//! rotary embeddings (`rope.rs`), the mixture of experts (`moe.rs`).

mod architecture;
mod attention;
mod deepseek_v4;
mod gemma4;
mod glm5_next;
mod keys;
mod kimi_linear;
mod llama4;
mod mistral_large4;
mod moe;
mod multipliers;
mod names;
mod recurrent;
mod rope;
#[cfg(test)]
mod tests;

use std::path::Path;

use serde_json::Value;

pub use architecture::Architecture;
pub use attention::{IndexerConfig, LayerAttention, MlaConfig, QkNorm};
pub use deepseek_v4::{Compression, DeepseekV4Layers};
pub use gemma4::{Gemma4Layers, HeadShape, PerLayerInputs};
pub use glm5_next::{HyperConnections, HyperHead, KeyPools, hyper_name};
pub(crate) use keys::Keys;
pub use llama4::Llama4Layers;
pub use mistral_large4::{LatentSource, MistralLarge4Layers};
pub use moe::{ExpertNaming, MoeConfig, Router, SharedExpert};
pub use multipliers::Multipliers;
pub use names::ModuleNames;
pub use recurrent::{DeltaNetConfig, DeltaNetLayout, MambaConfig, MambaNorm, ShortConvConfig};
pub use rope::{QueryScale, RopeParams, RopeScaling};

use crate::numerics::FloatType;
use crate::{Error, Result};

/// Bound on the layers a config may claim (far above any published model's): per-layer
/// tables are built from it before any tensor is read.
const MAX_LAYERS: usize = 10_000;

/// `num_hidden_layers`, refused past `MAX_LAYERS`.
fn num_hidden_layers(j: &Value) -> std::result::Result<usize, String> {
    let layers = Keys(j)
        .usize("num_hidden_layers")?
        .ok_or("missing `num_hidden_layers`")?;
    if layers > MAX_LAYERS {
        return Err(format!("num_hidden_layers {layers} exceeds {MAX_LAYERS}"));
    }
    Ok(layers)
}

/// The activation of the gated MLP: `down(act(gate(x)) * up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GatedActivation {
    Silu,
    /// `gelu_pytorch_tanh` (Gemma).
    GeluTanh,
    /// gpt-oss: gate clamped above at `limit`, up to `[-limit, limit]`, `(up + 1) * gate *
    /// sigmoid(alpha * gate)`; gate and up interleaved in one projection (gate the even
    /// outputs) as its checkpoints hold them, or apart (its GGUF files).
    ClampedSwiglu {
        alpha: f32,
        limit: f32,
    },
    /// DeepSeek-V4: `silu(min(gate, limit)) * clamp(up, -limit, limit)`.
    ClampedSilu {
        limit: f32,
    },
    /// `sigmoid(gate) * up`: Qwen3.5's gate on the attention output (never an MLP's).
    Sigmoid,
    /// `gate * up`: LFM2's short convolution's gates (never an MLP's).
    Product,
    /// `relu(x)^2` of one input, no up (Nemotron-H's ungated MLP: `down(relu(up(x))^2)`).
    Relu2,
}

impl GatedActivation {
    /// Gate and up may come interleaved from one fused projection (where no up is given).
    pub fn interleaves(self) -> bool {
        matches!(self, GatedActivation::ClampedSwiglu { .. })
    }

    /// One input, no up: the MLP's single input projection is its `gate`.
    pub fn ungated(self) -> bool {
        matches!(self, GatedActivation::Relu2)
    }

    /// The activation `j` names: Gemma reads `hidden_activation`, the others `hidden_act`;
    /// transformers' GptOssExperts ignore it.
    fn from_json(j: &Value, arch: Architecture) -> std::result::Result<Self, String> {
        let key = if arch.is_gemma() && j.get("hidden_activation").is_some() {
            "hidden_activation"
        } else if arch == Architecture::NemotronH {
            "mlp_hidden_act"
        } else {
            "hidden_act"
        };
        let keys = Keys(j);
        match keys.str(key)? {
            _ if arch == Architecture::GptOss => Ok(GatedActivation::ClampedSwiglu {
                alpha: keys.f64("swiglu_alpha")?.unwrap_or(1.702) as f32,
                limit: keys.positive_f64("swiglu_limit", 7.0)? as f32,
            }),
            None | Some("silu")
                if matches!(arch, Architecture::DeepseekV4 | Architecture::Glm5Next) =>
            {
                Ok(GatedActivation::ClampedSilu {
                    limit: keys.positive_f64("swiglu_limit", 10.0)? as f32,
                })
            }
            None if arch == Architecture::NemotronH => Ok(GatedActivation::Relu2),
            // transformers' Gemma configs default to `gelu_pytorch_tanh`.
            None if arch.is_gemma() => Ok(GatedActivation::GeluTanh),
            None | Some("silu") => Ok(GatedActivation::Silu),
            Some("gelu_pytorch_tanh" | "gelu_tanh") => Ok(GatedActivation::GeluTanh),
            Some("relu2") if arch == Architecture::NemotronH => Ok(GatedActivation::Relu2),
            Some(other) => Err(format!(
                "unsupported {key} `{other}` (supported: silu, gelu_pytorch_tanh; Nemotron-H: relu2)"
            )),
        }
    }
}

/// A token id (`bos_token_id`, `eos_token_id`): an id, or a list of ids whose first counts.
fn token_id(keys: Keys, k: &str) -> std::result::Result<Option<u32>, String> {
    let first = match keys.0.get(k) {
        Some(Value::Array(ids)) => ids.first(),
        other => other,
    };
    match first {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .map(Some)
            .ok_or_else(|| format!("`{k}` is {v}, not a token id")),
    }
}

/// The checkpoint's floating dtype (`torch_dtype`, or transformers 5's `dtype`).
fn checkpoint_dtype(outer: &Value) -> std::result::Result<FloatType, String> {
    let keys = Keys(outer);
    let name = match keys.str("torch_dtype")? {
        Some(name) => name,
        None => keys.str("dtype")?.unwrap_or("float32"),
    };
    match name {
        "float32" => Ok(FloatType::F32),
        "float16" => Ok(FloatType::F16),
        "bfloat16" => Ok(FloatType::Bf16),
        other => Err(format!("unsupported torch_dtype `{other}`")),
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
    /// RMSNorm on q and k before RoPE: per head (Qwen3) or over the whole projection
    /// (MiniMax-M2).
    pub qk_norm: Option<QkNorm>,
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
    /// DeepSeek sparse attention's indexer (DeepSeek-V3.2, GLM-5), beside `mla`.
    pub indexer: Option<IndexerConfig>,
    /// Gated DeltaNet, the layers whose `layer_types` entry is `linear_attention` (Qwen3.5).
    pub delta_net: Option<DeltaNetConfig>,
    /// `q_proj` gives each head's queries and then as many gate values, whose sigmoid scales
    /// the attention output before `o_proj` (Qwen3.5's full-attention layers).
    pub attn_output_gate: bool,
    /// LFM2's short convolution, the layers whose `layer_types` entry is `conv`.
    pub short_conv: Option<ShortConvConfig>,
    /// Mamba-2: the `linear_attention` layers of Nemotron-H, or Falcon-H1's mixer beside
    /// every attention (`parallel_mamba`).
    pub mamba: Option<MambaConfig>,
    /// Every layer has a Mamba-2 mixer (`mamba`) beside its attention, reading the same norm,
    /// the two outputs summed into the residual stream (Falcon-H1).
    pub parallel_mamba: bool,
    /// Scalar multipliers (Falcon-H1's muP, Granite's).
    pub multipliers: Option<Multipliers>,
    /// Queries scaled by their position after RoPE (Ministral 3).
    pub query_scale: Option<QueryScale>,
    /// Each layer is one part, a token mixer or an MLP, behind one norm (Nemotron-H's blocks;
    /// `LayerAttention::MlpOnly` marks the MLPs).
    pub one_part_blocks: bool,
    /// Each head's rotated values paired as neighbours (`2j`, `2j + 1`) rather than halves:
    /// llama.cpp's Llama-family GGUF files, whose converter permuted the q and k rows to suit
    /// (transformers undoes the permutation; rotating the pairs where they lie is the same).
    pub rope_interleaved: bool,
    /// Read from a GGUF file's metadata (the default windows are then llama-perplexity's).
    pub from_gguf: bool,
    /// What the family calls its modules.
    pub names: ModuleNames,
    /// Gemma 4's layer options: the full-attention layers' own heads, values from the key
    /// projection, keys and values reused by the last layers, per-layer inputs.
    pub gemma4: Option<Gemma4Layers>,
    /// Llama 4's layer options: which layers rotate, chunked attention, the temperature of
    /// the layers without RoPE.
    pub llama4: Option<Llama4Layers>,
    /// Mistral Large 4's layer options: which layers rotate, which reuse an earlier latent.
    pub mistral_large4: Option<MistralLarge4Layers>,
    /// DeepSeek-V4's: compressed attention, hash routing.
    pub deepseek_v4: Option<DeepseekV4Layers>,
    /// Residual streams mixed by hyper-connections (DeepSeek-V4, GLM-5.3-Flash).
    pub hyper: Option<HyperConnections>,
    /// GLM-5.3-Flash's Kimi Delta Attention: its safe gate's lower bound
    /// (`Recurrence::Delta::lower_bound`).
    pub kda_lower_bound: Option<f32>,
}

impl ModelConfig {
    /// The dtype `--dtype auto` takes the activations' from: the checkpoint's (f32 only for
    /// float32 checkpoints), bf16 for a GGUF model, whose f32 `dtype` only keeps its decoded
    /// weights unrounded (llama.cpp runs them with 16-bit activations on GPUs).
    pub fn auto_activation_dtype(&self) -> FloatType {
        if self.from_gguf {
            FloatType::Bf16
        } else {
            self.dtype
        }
    }

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
        let (architecture, j) = Architecture::of_config(outer)?;
        let canonical;
        let j = match architecture {
            Architecture::KimiLinear => {
                canonical = kimi_linear::canonical_keys(j)?;
                &canonical
            }
            Architecture::Glm5Next => {
                canonical = glm5_next::canonical_keys(j)?;
                &canonical
            }
            _ => j,
        };
        let gemma = architecture.is_gemma();
        let keys = Keys(j);
        let usize_field = |k: &str| -> std::result::Result<usize, String> {
            keys.usize(k)?.ok_or_else(|| format!("missing `{k}`"))
        };
        let bool_field = |k: &str, default: bool| -> std::result::Result<bool, String> {
            Ok(keys.bool(k)?.unwrap_or(default))
        };
        let hidden_size = match usize_field("hidden_size")? {
            0 => return Err("`hidden_size` is 0".into()),
            h => h,
        };
        let mla = match architecture {
            a if a.is_deepseek() => {
                let mut m = MlaConfig::from_json(j)?;
                // DeepSeek-V3.2's and GLM-5's attention rotates interleaved, whatever the key.
                m.rope_interleave |= a.has_indexer();
                Some(m)
            }
            _ => None,
        };
        let heads = attention::Heads::from_json(j, hidden_size, mla.as_ref())?;
        // Nemotron-H counts its layers by its block list (`num_hidden_layers` deprecated).
        let nemotron_blocks = match architecture {
            Architecture::NemotronH => Some(attention::nemotron_blocks(j)?),
            _ => None,
        };
        let num_layers = match &nemotron_blocks {
            Some(blocks) => blocks.len(),
            None => num_hidden_layers(j)?,
        };
        if num_layers > MAX_LAYERS {
            return Err(format!("{num_layers} blocks exceed {MAX_LAYERS} layers"));
        }
        let max_position_embeddings = usize_field("max_position_embeddings")?;
        let v4 = match architecture {
            Architecture::DeepseekV4 => {
                let v4 = DeepseekV4Layers::from_json(j, num_layers)?;
                v4.check(heads.num_heads, max_position_embeddings)?;
                Some(v4)
            }
            _ => None,
        };
        let (rope, local_rope) = match architecture {
            Architecture::DeepseekV4 => {
                let (compress, main) = deepseek_v4::ropes(j, max_position_embeddings)?;
                (compress, Some(main))
            }
            _ => rope::parse_rope(j, architecture, max_position_embeddings)?,
        };
        // Nemotron-H's attention has no positions, Granite's unless `position_embedding_type`
        // is `rope`.
        let granite_nope = architecture == Architecture::GraniteMoeHybrid
            && match keys.str("position_embedding_type")? {
                Some("rope") => false,
                None | Some("nope") => true,
                Some(other) => {
                    return Err(format!(
                        "unsupported position_embedding_type `{other}` (supported: rope, nope)"
                    ));
                }
            };
        let rotary_dim = match architecture {
            // Kimi-Linear's latent attention leaves its "rotated" key part unrotated;
            // GLM-5.3-Flash's has none.
            Architecture::NemotronH | Architecture::KimiLinear | Architecture::Glm5Next => 0,
            _ if granite_nope => 0,
            // DeepSeek-V4: `partial_rotary_factor`, or its legacy `qk_rope_head_dim`.
            Architecture::DeepseekV4 if keys.f64("partial_rotary_factor")?.is_none() => keys
                .usize("qk_rope_head_dim")?
                .unwrap_or(heads.head_dim / 8),
            _ => rope::rotary_dim(j, architecture, heads.head_dim, mla.as_ref(), &rope)?,
        };
        let (sliding_window, layer_types) = match (&nemotron_blocks, &v4) {
            (Some(blocks), _) => (None, blocks.iter().map(|b| b.0).collect()),
            (None, Some(v4)) => match keys.usize("sliding_window")?.unwrap_or(128) {
                0 => return Err("`sliding_window` is 0".into()),
                w => (Some(w), v4.layer_types()),
            },
            (None, None) => attention::parse_layer_types(j, architecture, num_layers)?,
        };
        if bool_field("mlp_bias", false)? {
            return Err("unsupported mlp_bias: true".into());
        }
        if architecture != Architecture::Gemma4 && bool_field("use_bidirectional_attention", false)?
        {
            return Err("unsupported use_bidirectional_attention: true".into());
        }
        let attention_bias = bool_field("attention_bias", architecture == Architecture::GptOss)?;
        let lfm2 = architecture.is_lfm2();
        let falcon = architecture == Architecture::FalconH1;
        let gemma4 = match architecture {
            Architecture::Gemma4 => {
                let base = HeadShape {
                    head_dim: heads.head_dim,
                    kv_heads: heads.num_kv_heads,
                };
                let g = Gemma4Layers::from_json(j, &layer_types, base)?;
                if g.full_heads.is_some()
                    && local_rope.is_none()
                    && layer_types.contains(&LayerAttention::Sliding)
                {
                    return Err("full-attention layers with their own head size need the \
                                sliding layers' RoPE in `rope_parameters.sliding_attention`"
                        .into());
                }
                Some(g)
            }
            _ => None,
        };
        let mistral_large4 = match architecture {
            Architecture::MistralLarge4 => Some(MistralLarge4Layers::from_json(j, num_layers)?),
            _ => None,
        };
        let llama4 = match architecture {
            Architecture::Llama4 => {
                let l = Llama4Layers::from_json(j, num_layers)?;
                if l.chunk.is_none() && layer_types.contains(&LayerAttention::Chunked) {
                    return Err(
                        "layer_types has chunked_attention layers but attention_chunk_size \
                         is null"
                            .into(),
                    );
                }
                Some(l)
            }
            _ => None,
        };
        let delta_net = match architecture {
            Architecture::Qwen3Next => Some(DeltaNetLayout::Fused),
            Architecture::KimiLinear | Architecture::Glm5Next => Some(DeltaNetLayout::Kimi),
            a if a.has_delta_net() => Some(DeltaNetLayout::Split),
            _ => None,
        }
        .map(|layout| DeltaNetConfig::from_json(j, layout))
        .transpose()?;
        Ok(Self {
            architecture,
            hidden_size,
            // Qwen3.5-MoE has no dense MLP and no `intermediate_size`.
            intermediate_size: match architecture {
                Architecture::Qwen3_5Moe => keys.usize("intermediate_size")?.unwrap_or(0),
                Architecture::Lfm2 => recurrent::lfm2_mlp_width(j)?,
                // Granite: every layer's dense MLP is its `shared_mlp` (`intermediate_size` is
                // the experts').
                Architecture::GraniteMoeHybrid => {
                    keys.usize("shared_intermediate_size")?.unwrap_or(1024)
                }
                // Llama 4's dense layers: `intermediate_size_mlp` (`intermediate_size` is the
                // experts').
                Architecture::Llama4 => keys.usize("intermediate_size_mlp")?.unwrap_or(16384),
                // DeepSeek-V4 has no dense MLP.
                Architecture::DeepseekV4 => usize_field("moe_intermediate_size")?,
                _ => usize_field("intermediate_size")?,
            },
            num_layers,
            num_heads: heads.num_heads,
            num_kv_heads: heads.num_kv_heads,
            head_dim: heads.head_dim,
            rotary_dim,
            vocab_size: usize_field("vocab_size")?,
            max_position_embeddings,
            rms_norm_eps: match architecture {
                _ if lfm2 => keys.f64("norm_eps")?.unwrap_or(1e-5),
                Architecture::NemotronH => keys.f64("layer_norm_epsilon")?.unwrap_or(1e-5),
                Architecture::FalconH1
                | Architecture::Bamba
                | Architecture::GlmMoeDsa
                | Architecture::MistralLarge4
                | Architecture::Llama4
                | Architecture::KimiLinear
                | Architecture::Glm5Next => keys.f64("rms_norm_eps")?.unwrap_or(1e-5),
                _ => keys.f64("rms_norm_eps")?.unwrap_or(1e-6),
            },
            rope,
            local_rope,
            // LFM2 ties by default and may say so as `tie_embedding`.
            tie_word_embeddings: match Keys(outer).bool("tie_word_embeddings")? {
                Some(tie) => tie,
                None if lfm2 => Keys(outer).bool("tie_embedding")?.unwrap_or(true),
                None => architecture.ties_by_default(outer),
            },
            // DeepSeek: the bias of q_a_proj and kv_a_proj_with_mqa.
            qkv_bias: architecture.always_qkv_bias() || attention_bias,
            qk_norm: if architecture == Architecture::MiniMaxM2 {
                Some(QkNorm::Projection)
            } else if llama4.as_ref().is_some_and(|l| l.qk_norm) {
                Some(QkNorm::Weightless)
            } else if architecture.always_qk_norm()
                || (architecture == Architecture::Glm4Moe && bool_field("use_qk_norm", false)?)
            {
                Some(QkNorm::Heads)
            } else {
                None
            },
            o_bias: !architecture.never_o_bias() && attention_bias,
            attention_sinks: matches!(
                architecture,
                Architecture::GptOss | Architecture::DeepseekV4
            ),
            dtype: checkpoint_dtype(outer)?,
            bos_token_id: token_id(keys, "bos_token_id")?,
            eos_token_id: token_id(keys, "eos_token_id")?,
            sliding_window,
            layer_types,
            attn_scale: attention::attn_scale(j, architecture, mla.as_ref(), heads.head_dim)?,
            attn_softcap: attention::softcap(j, "attn_logit_softcapping")?,
            final_softcap: attention::softcap(j, "final_logit_softcapping")?,
            norm_offset: if architecture.offset_norms() {
                1.0
            } else {
                0.0
            },
            sandwich_norms: gemma,
            scaled_embeddings: gemma,
            mlp_activation: GatedActivation::from_json(j, architecture)?,
            fused_projections: architecture == Architecture::Phi3,
            prefix: "model".into(),
            moe: match &nemotron_blocks {
                Some(blocks) => {
                    let sparse: Vec<bool> = blocks.iter().map(|b| b.1).collect();
                    MoeConfig::nemotron_h(j, sparse)?
                }
                None => MoeConfig::from_json(j, architecture, num_layers)?,
            },
            indexer: match &mla {
                Some(m) if architecture.has_indexer() => {
                    if m.q_lora_rank.is_none() && architecture != Architecture::MistralLarge4 {
                        return Err("sparse attention's indexer reads the query latent: \
                                    q_lora_rank is null"
                            .into());
                    }
                    Some(IndexerConfig::from_json(
                        j,
                        architecture,
                        num_layers,
                        m.rope_dim,
                    )?)
                }
                _ => None,
            },
            mla,
            delta_net,
            kda_lower_bound: match architecture {
                Architecture::Glm5Next => glm5_next::lower_bound(j)?,
                _ => None,
            },
            hyper: match architecture {
                Architecture::DeepseekV4 => {
                    Some(HyperConnections::from_json(j, HyperHead::Weighted)?)
                }
                Architecture::Glm5Next => Some(HyperConnections::from_json(j, HyperHead::Mean)?),
                _ => None,
            },
            attn_output_gate: architecture.has_delta_net(),
            short_conv: lfm2.then(|| ShortConvConfig::from_json(j)).transpose()?,
            mamba: match architecture {
                Architecture::NemotronH => Some(MambaConfig::from_json(j)?),
                Architecture::FalconH1 | Architecture::GraniteMoeHybrid | Architecture::Bamba => {
                    Some(MambaConfig::mamba_keyed(j, hidden_size, architecture)?)
                }
                _ => None,
            },
            parallel_mamba: falcon,
            multipliers: match architecture {
                Architecture::FalconH1 => Some(Multipliers::falcon_h1(j)?),
                Architecture::GraniteMoeHybrid => Some(Multipliers::granite(j)?),
                _ => None,
            },
            query_scale: match architecture {
                // A beta of 0 (a GGUF file that states none) scales nothing.
                Architecture::Ministral3 | Architecture::Mistral4 => {
                    Some(QueryScale::from_rope_parameters(j)?).filter(|q| q.beta != 0.0)
                }
                _ => None,
            },
            one_part_blocks: architecture == Architecture::NemotronH,
            // Llama 4 rotates each head's values as complex pairs (`view_as_complex`).
            // DeepSeek-V4's too (`rotate_half` of GLM).
            rope_interleaved: matches!(
                architecture,
                Architecture::Llama4 | Architecture::DeepseekV4
            ),
            from_gguf: false,
            names: match architecture {
                _ if lfm2 => ModuleNames::LFM2,
                Architecture::NemotronH => ModuleNames::NEMOTRON_H,
                Architecture::FalconH1 | Architecture::Bamba => ModuleNames::FALCON_H1,
                Architecture::GraniteMoeHybrid => ModuleNames::GRANITE,
                Architecture::Llama4 => ModuleNames::LLAMA4,
                Architecture::KimiLinear => ModuleNames::KIMI_LINEAR,
                _ => ModuleNames::LLAMA,
            },
            gemma4,
            llama4,
            mistral_large4,
            deepseek_v4: v4,
        })
    }

    /// The epsilon of latent attention's `q_a_layernorm` and `kv_a_layernorm`: transformers
    /// builds DeepSeek's with its RMSNorm's default, 1e-6, whatever `rms_norm_eps` says
    /// (GLM-5's is 1e-5); Mistral Large 4's and GLM-5.3-Flash's take `rms_norm_eps`.
    pub fn latent_norm_eps(&self) -> f64 {
        match self.mistral_large4.is_some() || self.architecture == Architecture::Glm5Next {
            true => self.rms_norm_eps,
            false => 1e-6,
        }
    }

    /// How Kimi Delta Attention's `A_log` of `heads` values is stored: Kimi-Linear's
    /// `[1, 1, heads, 1]`, GLM-5.3-Flash's `[heads]`.
    pub fn kda_a_log_shape(&self, heads: usize) -> Vec<usize> {
        match self.architecture {
            Architecture::Glm5Next => vec![heads],
            _ => vec![1, 1, heads, 1],
        }
    }

    /// Whether layer `layer`'s experts are chosen by the token (DeepSeek-V4's `hash_moe`).
    pub fn hash_routed(&self, layer: usize) -> bool {
        self.deepseek_v4
            .as_ref()
            .is_some_and(|v| v.hash_routed.get(layer) == Some(&true))
    }

    /// The rotary embedding of layer `layer`.
    pub fn rope_of(&self, layer: usize) -> &RopeParams {
        match (self.layer_types.get(layer), &self.local_rope) {
            (Some(LayerAttention::Sliding), Some(local)) => local,
            _ => &self.rope,
        }
    }

    /// Layer `layer`'s query/key head size and key/value heads (Gemma 4's full-attention
    /// layers have their own).
    pub fn heads_of(&self, layer: usize) -> HeadShape {
        let full = self.layer_types.get(layer) == Some(&LayerAttention::Full);
        match self.gemma4.as_ref().and_then(|g| g.full_heads) {
            Some(shape) if full => shape,
            _ => HeadShape {
                head_dim: self.head_dim,
                kv_heads: self.num_kv_heads,
            },
        }
    }

    /// Whether layer `layer` takes its values from its key projection (Gemma 4's
    /// `attention_k_eq_v`, full-attention layers).
    pub fn values_from_keys(&self, layer: usize) -> bool {
        self.gemma4.as_ref().is_some_and(|g| g.values_from_keys)
            && self.layer_types.get(layer) == Some(&LayerAttention::Full)
    }

    /// The layer whose keys and values layer `layer` attends to instead of its own (Gemma 4's
    /// `num_kv_shared_layers`).
    pub fn kv_source(&self, layer: usize) -> Option<usize> {
        self.gemma4
            .as_ref()?
            .kv_source
            .get(layer)
            .copied()
            .flatten()
    }

    /// The width of layer `layer`'s dense MLP (Gemma 4's double-wide MLPs in the layers that
    /// reuse keys and values).
    pub fn mlp_width(&self, layer: usize) -> usize {
        let doubled = self
            .gemma4
            .as_ref()
            .is_some_and(|g| g.double_wide_shared_mlp && g.reuses_kv(layer));
        self.intermediate_size * if doubled { 2 } else { 1 }
    }

    /// The values of each head that each RoPE table (`rope`, then `local_rope`) rotates: the
    /// full-attention layers' own heads where they have them.
    pub fn rotary_dims(&self) -> [usize; 2] {
        let full = self.gemma4.as_ref().and_then(|g| g.full_heads);
        // Gemma 4's RoPE (proportional or default) spans the whole head.
        [
            full.map_or(self.rotary_dim, |h| h.head_dim),
            self.rotary_dim,
        ]
    }

    /// Whether layer `layer` rotates its queries and keys (all but Llama 4's layers without
    /// RoPE, and models without positions).
    pub fn uses_rope(&self, layer: usize) -> bool {
        let listed = |rope_layers: &[bool]| rope_layers.get(layer) == Some(&true);
        self.rotary_dim > 0
            && self.llama4.as_ref().is_none_or(|l| listed(&l.rope_layers))
            && self
                .mistral_large4
                .as_ref()
                .is_none_or(|m| listed(&m.rope_layers))
    }

    /// Layer `layer`'s latent attention dims: a layer without RoPE (Mistral Large 4) holds the
    /// rotated part's values unrotated, after the others.
    pub fn latent_dims(&self, layer: usize) -> Option<MlaConfig> {
        let m = self.mla?;
        Some(
            match self.uses_rope(layer) || self.mistral_large4.is_none() {
                true => m,
                false => MlaConfig {
                    nope_dim: m.nope_dim + m.rope_dim,
                    rope_dim: 0,
                    ..m
                },
            },
        )
    }

    /// The chunk of positions layer `layer` attends within (Llama 4's chunked layers).
    pub fn chunk_of(&self, layer: usize) -> Option<usize> {
        match self.layer_types.get(layer) {
            Some(LayerAttention::Chunked) => self.llama4.as_ref().and_then(|l| l.chunk),
            _ => None,
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
        let layers: u64 = (0..self.num_layers)
            .map(|l| self.attention_params(l) + self.mlp_params(l, active_only))
            .sum();
        let embed = self.vocab_size as u64 * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        layers + embed + head + self.per_layer_input_params()
    }

    /// Parameters of Gemma 4's per-layer inputs: the second embedding table and the
    /// projection of the token embeddings (whole model), each layer's gate and projection.
    fn per_layer_input_params(&self) -> u64 {
        let Some(p) = self.gemma4.as_ref().and_then(|g| g.per_layer_inputs) else {
            return 0;
        };
        let (h, w, l) = (
            self.hidden_size as u64,
            p.width as u64,
            self.num_layers as u64,
        );
        p.vocab as u64 * l * w + h * l * w + l * 2 * h * w
    }

    /// Whether a pipeline stage may begin at layer `layer`: all but the layers that reuse the
    /// sparse-attention selection of the layer before (GLM-5's `shared`), and those with a
    /// later layer reusing a latent kept before them (Mistral Large 4), which a stage beginning
    /// there would not have.
    pub fn may_begin_stage(&self, layer: usize) -> bool {
        let own_selection = self
            .indexer
            .as_ref()
            .is_none_or(|ix| ix.own_selection.get(layer) != Some(&false));
        own_selection
            && (layer..self.num_layers)
                .all(|l| !matches!(self.latent_source(l), LatentSource::Reuses(p) if p < layer))
    }

    /// Where layer `layer`'s latent keys and values come from (Mistral Large 4's
    /// `kv_source_layers`; every other model's are its own).
    pub fn latent_source(&self, layer: usize) -> LatentSource {
        self.mistral_large4
            .as_ref()
            .and_then(|m| m.latents.get(layer).copied())
            .unwrap_or(LatentSource::Own)
    }

    /// The most rows a sequence split into branches (`backend::Branches`: continuations of
    /// one context sharing its rows) may have for every token to be computed exactly as if
    /// its branch followed the prefix alone. `None` where no length allows it: recurrent
    /// layers carry a state along the rows and the sparse-attention indexer ranks every
    /// earlier row, as DeepSeek-V4's compressors pool runs of rows. Otherwise a sliding window
    /// (counted in rows) must not bind, nor may LongRoPE switch to its long factors (decided
    /// by a sequence's rows).
    pub fn branch_rows_limit(&self) -> Option<usize> {
        if self.delta_net.is_some()
            || self.mamba.is_some()
            || self.short_conv.is_some()
            || self.indexer.is_some()
            || self.deepseek_v4.is_some()
        {
            return None;
        }
        let windowed = self.layer_types.contains(&LayerAttention::Sliding);
        let window = self.sliding_window.filter(|_| windowed);
        // A chunk boundary counts rows from the sequence's start, as a window does.
        let chunk = (0..self.num_layers).find_map(|l| self.chunk_of(l));
        let long_rope = match &self.rope.scaling {
            Some(RopeScaling::Longrope {
                original_max_position_embeddings,
                ..
            }) => Some(*original_max_position_embeddings),
            _ => None,
        };
        Some(
            [window, long_rope, chunk]
                .into_iter()
                .flatten()
                .fold(usize::MAX, usize::min),
        )
    }

    /// Whether layer `layer` is a gated DeltaNet.
    pub fn is_delta_net(&self, layer: usize) -> bool {
        self.delta_net.is_some() && self.layer_types.get(layer) == Some(&LayerAttention::Linear)
    }

    /// transformers' in-memory name of linear `module` where its conversion mapping renames
    /// the checkpoint's (Kimi-Linear's decay pair `self_attn.f_a_proj` / `f_b_proj` sits under
    /// `self_attn.forget_gate`): what a quantizer's `ignore` list may call it.
    pub fn in_memory_name(&self, module: &str) -> Option<String> {
        if !matches!(
            self.architecture,
            Architecture::KimiLinear | Architecture::Glm5Next
        ) {
            return None;
        }
        let (layer, linear) = module.rsplit_once(".self_attn.")?;
        matches!(linear, "f_a_proj" | "f_b_proj")
            .then(|| format!("{layer}.self_attn.forget_gate.{linear}"))
    }

    /// Whether layer `layer` is a Mamba-2 mixer.
    pub fn is_mamba(&self, layer: usize) -> bool {
        self.mamba.is_some() && self.layer_types.get(layer) == Some(&LayerAttention::Linear)
    }

    /// Whether layer `layer` has a token mixer (all but Nemotron-H's MLP blocks).
    pub fn has_mixer(&self, layer: usize) -> bool {
        self.layer_types.get(layer) != Some(&LayerAttention::MlpOnly)
    }

    /// Whether layer `layer` has an MLP (all but Nemotron-H's mixer blocks).
    pub fn has_mlp(&self, layer: usize) -> bool {
        !self.one_part_blocks || !self.has_mixer(layer)
    }

    /// Whether layer `layer` is LFM2's short convolution.
    pub fn is_short_conv(&self, layer: usize) -> bool {
        self.layer_types.get(layer) == Some(&LayerAttention::ShortConv)
    }

    /// The token embeddings' tensor.
    pub fn embedding_name(&self) -> String {
        format!("{}.{}.weight", self.prefix, self.names.embed)
    }

    /// The final norm's tensor.
    pub fn final_norm_name(&self) -> String {
        format!("{}.{}.weight", self.prefix, self.names.final_norm)
    }

    /// Parameters of layer `layer`'s attention projections (or its DeltaNet's).
    fn attention_params(&self, layer: usize) -> u64 {
        let (h, heads) = (self.hidden_size as u64, self.num_heads as u64);
        if !self.has_mixer(layer) {
            return 0;
        }
        let mamba = |m: MambaConfig| {
            let conv = m.as_recurrence().conv_width() as u64;
            let norm = match m.norm {
                MambaNorm::Ungated => 0,
                _ => m.inner() as u64,
            };
            // in_proj, out_proj, the taps; A_log, dt_bias, D and the gated norm.
            h * m.in_proj_width() as u64
                + m.inner() as u64 * h
                + conv * m.conv_kernel as u64
                + 3 * m.heads as u64
                + norm
        };
        if let Some(m) = self.mamba.filter(|_| self.is_mamba(layer)) {
            return mamba(m);
        }
        let beside = self.mamba.filter(|_| self.parallel_mamba).map_or(0, mamba);
        if let Some(d) = self.delta_net.filter(|_| self.is_delta_net(layer)) {
            let (conv, value) = (d.conv_width() as u64, d.value_width() as u64);
            let (hv, dk, taps) = (
                d.v_heads as u64,
                d.k_dim as u64,
                conv * d.conv_kernel as u64,
            );
            return match d.layout {
                // q, k, v, o_proj, b_proj; f_a then f_b (a decay a key channel), g_a then g_b.
                DeltaNetLayout::Kimi => {
                    h * (conv + value + hv + 2 * dk) + dk * (hv * dk + value) + taps
                }
                // in_proj_qkv, in_proj_z, in_proj_b and _a, out_proj.
                _ => h * (conv + 2 * value + 2 * hv) + taps,
            };
        }
        if let Some(sc) = self.short_conv.filter(|_| self.is_short_conv(layer)) {
            // in_proj (B, C, x), out_proj, the taps.
            return 4 * h * h + h * sc.taps as u64;
        }
        let gate = if self.attn_output_gate { 2 } else { 1 };
        match &self.mla {
            Some(m) => {
                let qk = heads * m.qk_head_dim() as u64;
                let q = match m.q_lora_rank {
                    Some(r) => h * r as u64 + r as u64 * qk,
                    None => h * qk,
                };
                let kv_a = h * (m.kv_lora_rank + m.rope_dim) as u64;
                let kv_b = m.kv_lora_rank as u64 * heads * (m.nope_dim + m.v_head_dim) as u64;
                // A sparse-attention indexer of the layer's own: wq_b, wk, weights_proj.
                let indexer = match (&self.indexer, m.q_lora_rank) {
                    (Some(ix), Some(r)) if ix.own_selection.get(layer) == Some(&true) => {
                        let width = (ix.heads * ix.head_dim) as u64;
                        r as u64 * width + h * (ix.head_dim + ix.heads) as u64
                    }
                    _ => 0,
                };
                q + kv_a + kv_b + heads * m.v_head_dim as u64 * h + indexer
            }
            None => {
                let shape = self.heads_of(layer);
                let q = heads * shape.head_dim as u64;
                let kv = (shape.kv_heads * shape.head_dim) as u64;
                let kv_projections = match (self.kv_source(layer), self.values_from_keys(layer)) {
                    (Some(_), _) => 0,
                    (None, true) => 1,
                    (None, false) => 2,
                };
                h * q * (1 + gate) + h * kv * kv_projections + beside
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
            None => {
                let gate = if self.attn_output_gate { heads } else { 0 };
                let heads = (0..self.num_layers.max(1))
                    .map(|l| {
                        let shape = self.heads_of(l);
                        (heads + gate + 2 * shape.kv_heads) * shape.head_dim
                    })
                    .max()
                    .unwrap_or(0);
                // A DeltaNet holds its projections (convolved channels, z, b, a) and output;
                // a short convolution its projection (B, C, x), their parts and products.
                let delta = self.delta_net.map_or(0, |d| {
                    2 * d.conv_width() + 2 * d.value_width() + 2 * d.v_heads
                });
                let short_conv = self.short_conv.map_or(0, |_| 7 * self.hidden_size);
                // A Mamba-2 mixer holds in_proj's output, its parts and the scan's output.
                let mamba = self
                    .mamba
                    .map_or(0, |m| 2 * m.in_proj_width() + 2 * m.inner());
                // Falcon-H1: the attention's output waits while the Mamba-2 mixer runs.
                match self.parallel_mamba {
                    true => self.hidden_size + heads.max(mamba),
                    false => heads.max(delta).max(short_conv).max(mamba),
                }
            }
        }
    }

    /// Parameters of layer `layer`'s MLP (router and shared expert included).
    fn mlp_params(&self, layer: usize, active_only: bool) -> u64 {
        let h = self.hidden_size as u64;
        if !self.has_mlp(layer) {
            return 0;
        }
        let projections: u64 = if self.mlp_activation.ungated() { 2 } else { 3 };
        match &self.moe {
            Some(m) if m.is_sparse(layer) => {
                let experts = if active_only {
                    m.experts_per_token
                } else {
                    m.num_experts
                } as u64;
                let shared = m.shared_expert.map_or(0, |s| {
                    projections * h * s.intermediate_size as u64 + if s.gated { h } else { 0 }
                });
                // Gemma 4's dense MLP beside the mixture.
                let dense = match m.beside_dense {
                    true => projections * h * self.mlp_width(layer) as u64,
                    false => 0,
                };
                experts * projections * h * m.expert_intermediate_size as u64
                    + m.num_experts as u64 * h
                    + shared
                    + dense
            }
            _ => projections * h * self.mlp_width(layer) as u64,
        }
    }

    /// Parameters that take part in the matmuls of one token (no embedding gather; routed
    /// experts counted as many times as a token uses them).
    pub fn matmul_params(&self) -> u64 {
        let embed = self.vocab_size as u64 * self.hidden_size as u64;
        let head_extra = if self.tie_word_embeddings { embed } else { 0 };
        // Gemma 4's per-layer embedding table is gathered too.
        let per_layer_table = self
            .gemma4
            .as_ref()
            .and_then(|g| g.per_layer_inputs)
            .map_or(0, |p| (p.vocab * p.width * self.num_layers) as u64);
        self.active_params() - embed - per_layer_table + head_extra
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
            .is_none_or(|m| m.beside_dense || m.sparse_layers.iter().any(|&s| !s));
        let dense = (0..self.num_layers).map(|l| self.mlp_width(l)).max();
        moe.max(if dense_layers {
            dense.unwrap_or(self.intermediate_size)
        } else {
            0
        })
    }
}
