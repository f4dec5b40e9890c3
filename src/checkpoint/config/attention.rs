//! The attention a config describes: head counts and sizes, multi-head latent attention
//! (DeepSeek), each layer's span (full or sliding), the softmax scale and soft-caps.

use serde_json::Value;

use super::rope::yarn_mscale;
use super::{Architecture, Keys};

/// Which keys a layer's queries see.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerAttention {
    /// Every earlier position of the sequence.
    Full,
    /// The last `sliding_window` positions (the query's own included).
    Sliding,
    /// The earlier positions of the query's own chunk of `attention_chunk_size` (Llama 4's
    /// `chunked_attention`).
    Chunked,
    /// No attention: a gated DeltaNet (`linear_attention`, `DeltaNetConfig`) carries the
    /// sequence in its recurrent state.
    Linear,
    /// No attention: LFM2's short convolution (`conv`, `ShortConvConfig`) mixes each token
    /// with the few before it.
    ShortConv,
    /// No token mixer at all: Nemotron-H's MLP blocks (`ModelConfig::one_part_blocks`).
    MlpOnly,
    /// The last `sliding_window` positions, then entries pooled from earlier windows of
    /// tokens (DeepSeek-V4's compressed layers, `DeepseekV4Layers`).
    Compressed,
}

/// What a layer's q/k RMS norms normalize.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNorm {
    /// Each head on its own, one `[head_dim]` weight for all heads (Qwen3, Gemma 3, LFM2).
    Heads,
    /// The whole projection at once, a weight per value (`[heads * head_dim]`; MiniMax-M2).
    Projection,
    /// Each head on its own without a weight, in the layers that rotate (Llama 4's
    /// `Llama4TextL2Norm`).
    Weightless,
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

/// DeepSeek sparse attention's lightning indexer (DeepSeek-V3.2, GLM-5): `wq_b` of the
/// query's low-rank latent gives `heads` query heads of `head_dim`, `wk` of the layer's input
/// one key (LayerNorm-ed, `k_norm`), both rotated over their first `rope_dim` values;
/// `weights_proj` weighs the heads. A query's keys are the `top_k` of its causal keys by
/// `sum_h w_h * relu(q_h . k / sqrt(head_dim)) / sqrt(heads)`, all of them while it has no more.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct IndexerConfig {
    pub heads: usize,
    pub head_dim: usize,
    pub top_k: usize,
    /// The indexer's RoPE pairs adjacent values (GLM-5) rather than halves (DeepSeek-V3.2).
    pub rope_interleave: bool,
    /// Per layer: whether it runs its own indexer; a layer that does not reuses the selection
    /// of the last one that did (GLM-5's `indexer_types` `shared`).
    pub own_selection: Vec<bool>,
    /// Mistral Large 4: `wq_b` reads the layer's input LayerNorm-ed by `q_input_norm` (there
    /// is no query latent), and the query heads are scaled by position (`softmax_scaling`).
    pub query_from_input: bool,
    /// GLM-5.3-Flash: the keys scored and kept in pools of tokens (`top_k` still counts tokens).
    pub pools: Option<super::KeyPools>,
}

impl IndexerConfig {
    pub(super) fn from_json(
        j: &Value,
        arch: Architecture,
        num_layers: usize,
        rope_dim: usize,
    ) -> Result<Self, String> {
        let keys = Keys(j);
        // Mistral Large 4's indexer is GLM-5's but for its queries.
        let mistral = arch == Architecture::MistralLarge4;
        let glm = matches!(arch, Architecture::GlmMoeDsa | Architecture::Glm5Next) || mistral;
        let top_k = keys.positive("index_topk", 2048)?;
        let c = Self {
            heads: keys.positive("index_n_heads", if glm { 32 } else { 64 })?,
            head_dim: keys.positive("index_head_dim", 128)?,
            top_k,
            rope_interleave: glm,
            own_selection: match glm {
                true => own_selection(j, num_layers)?,
                false => vec![true; num_layers],
            },
            query_from_input: mistral,
            pools: match arch {
                Architecture::Glm5Next => Some(super::glm5_next::key_pools(j, top_k)?),
                _ => None,
            },
        };
        if c.head_dim < rope_dim {
            return Err(format!(
                "index_head_dim {} is narrower than its rotated part qk_rope_head_dim {rope_dim}",
                c.head_dim
            ));
        }
        if c.own_selection.first() == Some(&false) {
            return Err("indexer_types: layer 0 is `shared`, with no earlier selection".into());
        }
        Ok(c)
    }
}

/// GLM-5's per-layer indexer modes as transformers' `GlmMoeDsaConfig` derives them:
/// `indexer_types` (`full` / `shared`), else `index_topk_pattern` (`F` / `S` a layer), else
/// every `index_topk_freq`-th layer from `index_skip_topk_offset` full.
fn own_selection(j: &Value, num_layers: usize) -> Result<Vec<bool>, String> {
    let keys = Keys(j);
    let named: Option<Vec<String>> = match (j.get("indexer_types"), j.get("index_topk_pattern")) {
        (Some(Value::Array(list)), _) | (None | Some(Value::Null), Some(Value::Array(list))) => {
            Some(
                list.iter()
                    .map(|v| v.as_str().map(str::to_string).ok_or(format!("{v}")))
                    .collect::<Result<_, _>>()
                    .map_err(|v| format!("unsupported indexer_types entry {v}"))?,
            )
        }
        (None | Some(Value::Null), Some(Value::String(p))) => Some(
            p.chars()
                .map(|c| match c {
                    'F' => Ok("full".to_string()),
                    'S' => Ok("shared".to_string()),
                    other => Err(format!("index_topk_pattern letter `{other}` (F or S)")),
                })
                .collect::<Result<_, _>>()?,
        ),
        (None | Some(Value::Null), None | Some(Value::Null)) => None,
        (Some(v), _) => return Err(format!("`indexer_types` is {v}, not a list")),
        (_, Some(v)) => return Err(format!("`index_topk_pattern` is {v}, not a string")),
    };
    match named {
        Some(list) => {
            if list.len() != num_layers {
                return Err(format!(
                    "indexer_types has {} entries for {num_layers} layers",
                    list.len()
                ));
            }
            list.iter()
                .map(|t| match t.as_str() {
                    "full" => Ok(true),
                    "shared" => Ok(false),
                    other => Err(format!(
                        "unsupported indexer_types entry \"{other}\" (supported: full, shared)"
                    )),
                })
                .collect()
        }
        None => {
            let freq = keys.usize("index_topk_freq")?.unwrap_or(1).max(1);
            let offset = keys.usize("index_skip_topk_offset")?.unwrap_or(2);
            Ok((0..num_layers)
                .map(|l| (l + 1).saturating_sub(offset).is_multiple_of(freq))
                .collect())
        }
    }
}

impl MlaConfig {
    pub(super) fn from_json(j: &Value) -> Result<Self, String> {
        let dim = |k: &str| -> Result<usize, String> {
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
            // GLM-5.3-Flash's latent attention has no rotated part.
            rope_dim: match j.get("qk_rope_head_dim").and_then(Value::as_u64) {
                Some(0) => 0,
                _ => dim("qk_rope_head_dim")?,
            },
            v_head_dim: dim("v_head_dim")?,
            rope_interleave: Keys(j).bool("rope_interleave")?.unwrap_or(true),
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

/// Query heads, key/value heads and the query/key head size.
pub(super) struct Heads {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl Heads {
    pub(super) fn from_json(
        j: &Value,
        hidden_size: usize,
        mla: Option<&MlaConfig>,
    ) -> Result<Self, String> {
        let keys = Keys(j);
        let num_heads = keys
            .usize("num_attention_heads")?
            .ok_or("missing `num_attention_heads`")?;
        // Nemotron-H's published configs write `attention_head_dim`.
        let stated_head_dim = match keys.usize("head_dim")? {
            Some(d) => Some(d),
            None => keys.usize("attention_head_dim")?,
        };
        // Latent attention expands its keys and values to every head.
        let num_kv_heads = match mla {
            Some(_) => num_heads,
            None => keys.usize("num_key_value_heads")?.unwrap_or(num_heads),
        };
        // DeepSeek's `head_dim` is its rotated part; the attention's is the query/key head.
        let head_dim = match (mla, stated_head_dim) {
            (Some(m), _) => m.qk_head_dim(),
            (None, Some(d)) => d,
            (None, None) => {
                if num_heads == 0 || !hidden_size.is_multiple_of(num_heads) {
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
        Ok(Self {
            num_heads,
            num_kv_heads,
            head_dim,
        })
    }
}

/// The factor on attention scores: `head_dim^-0.5`, Gemma's `query_pre_attn_scalar^-0.5`,
/// latent attention's YaRN-adjusted scale, Falcon-H1's times its `key_multiplier`, or
/// Granite's `attention_multiplier`.
pub(super) fn attn_scale(
    j: &Value,
    arch: Architecture,
    mla: Option<&MlaConfig>,
    head_dim: usize,
) -> Result<f64, String> {
    if arch == Architecture::Gemma4 {
        // The q/k norms set the scores' scale.
        Ok(1.0)
    } else if arch.is_gemma() {
        let s = Keys(j).f64("query_pre_attn_scalar")?.unwrap_or(256.0);
        if s <= 0.0 {
            return Err(format!("query_pre_attn_scalar {s} must be positive"));
        }
        Ok(s.powf(-0.5))
    } else if mla.is_some() {
        latent_attn_scale(j, head_dim)
    } else if arch == Architecture::GraniteMoeHybrid {
        // Granite's softmax scale is its `attention_multiplier`.
        match Keys(j).f64("attention_multiplier")?.unwrap_or(1.0) {
            m if m.is_finite() && m > 0.0 => Ok(m),
            m => Err(format!(
                "`attention_multiplier` is {m}; it must be positive"
            )),
        }
    } else if arch == Architecture::FalconH1 {
        // Falcon-H1 multiplies its keys by `key_multiplier`: a factor on every score.
        match Keys(j).f64("key_multiplier")?.unwrap_or(1.0) {
            m if m.is_finite() => Ok(m * (head_dim as f64).powf(-0.5)),
            m => Err(format!("`key_multiplier` is {m}; it must be finite")),
        }
    } else {
        Ok((head_dim as f64).powf(-0.5))
    }
}

/// The cap of `cap * tanh(x / cap)` under key `k` (Gemma 2's soft-capping), if any.
pub(super) fn softcap(j: &Value, k: &str) -> Result<Option<f32>, String> {
    match j.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(c) if c > 0.0 => Ok(Some(c as f32)),
            _ => Err(format!("`{k}` must be a positive number or null, not {v}")),
        },
    }
}

/// DeepSeek's softmax scale: `qk_head_dim^-0.5`, times `yarn_get_mscale(factor,
/// mscale_all_dim)^2` where the RoPE is scaled and says `mscale_all_dim` (transformers'
/// `yarn_apply_mscale`).
fn latent_attn_scale(j: &Value, qk_head_dim: usize) -> Result<f64, String> {
    let base = (qk_head_dim as f64).powf(-0.5);
    let Some(p) = j
        .get("rope_parameters")
        .or_else(|| j.get("rope_scaling"))
        .filter(|v| v.is_object())
    else {
        return Ok(base);
    };
    let keys = Keys(p);
    let kind = match keys.str("rope_type")? {
        Some(kind) => Some(kind),
        None => keys.str("type")?,
    };
    Ok(
        match (kind, keys.f64("mscale_all_dim")?, keys.f64("factor")?) {
            (Some(k), Some(m), Some(factor)) if k != "default" && m != 0.0 => {
                base * yarn_mscale(factor, m).powi(2)
            }
            _ => base,
        },
    )
}

/// Nemotron-H's blocks: `layers_block_type` (`layer_types`) as transformers 5 writes it, or
/// the published configs' `hybrid_override_pattern` (`M` Mamba-2, `*` attention, `-` MLP, `E`
/// a mixture of experts), as `LayerAttention`s (Mamba-2 is `Linear`, both MLP kinds
/// `MlpOnly`) and whether each is a mixture.
pub(super) fn nemotron_blocks(j: &Value) -> Result<Vec<(LayerAttention, bool)>, String> {
    let named = |k: &'static str| j.get(k).filter(|v| !v.is_null()).map(|v| (k, v));
    let (key, v) = named("layers_block_type")
        .or_else(|| named("layer_types"))
        .or_else(|| named("hybrid_override_pattern"))
        .ok_or("has neither `layers_block_type` nor `hybrid_override_pattern`")?;
    let entries: Vec<String> = match v {
        Value::String(pattern) => pattern.chars().map(String::from).collect(),
        Value::Array(list) => list
            .iter()
            .map(|e| e.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("`{key}` is {v}, not a list of block types"))?,
        _ => return Err(format!("`{key}` is {v}, not a list of block types")),
    };
    if entries.is_empty() || entries.len() > super::MAX_LAYERS {
        return Err(format!("`{key}` lists {} blocks", entries.len()));
    }
    entries
        .iter()
        .map(|e| match e.as_str() {
            "linear_attention" | "mamba" | "M" => Ok((LayerAttention::Linear, false)),
            "full_attention" | "attention" | "*" => Ok((LayerAttention::Full, false)),
            "mlp" | "-" => Ok((LayerAttention::MlpOnly, false)),
            "moe" | "E" => Ok((LayerAttention::MlpOnly, true)),
            _ => Err(format!(
                "unsupported `{key}` entry `{e}` (supported: linear_attention/M, \
                 full_attention/*, mlp/-, moe/E)"
            )),
        })
        .collect()
}

/// The sliding window and each layer's attention span: `layer_types` where the config lists
/// them, else each family's rule as transformers derives it.
pub(super) fn parse_layer_types(
    j: &Value,
    arch: Architecture,
    num_layers: usize,
) -> Result<(Option<usize>, Vec<LayerAttention>), String> {
    // 0 or null: no window (Qwen2-MoE writes 0 when `use_sliding_window` is off).
    let window = match j.get("sliding_window") {
        // transformers' Gemma 2/3 configs default to 4096, gpt-oss's to 128.
        None if matches!(arch, Architecture::Gemma2 | Architecture::Gemma3) => Some(4096),
        None if arch == Architecture::Gemma4 => Some(512),
        None if arch == Architecture::GptOss => Some(128),
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(0) => None,
            Some(w) => Some(w as usize),
            None => return Err(format!("`sliding_window` must be an integer, not {v}")),
        },
    };
    let keys = Keys(j);
    let pattern = match keys.usize("sliding_window_pattern")? {
        Some(p) => Some(p),
        None => keys.usize("_sliding_window_pattern")?,
    };
    let qwen_sliding = keys.bool("use_sliding_window")? == Some(true);
    let max_window_layers = keys.usize("max_window_layers")?.unwrap_or(0);
    // Bamba: attention at `attn_layer_indices`, Mamba-2 elsewhere.
    if arch == Architecture::Bamba {
        let listed = match j.get("attn_layer_indices") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
                .ok_or_else(|| format!("`attn_layer_indices` is {v}, not a list of layers"))?,
        };
        if let Some(l) = listed.iter().find(|&&l| l as usize >= num_layers) {
            return Err(format!(
                "attn_layer_indices lists layer {l} of {num_layers}"
            ));
        }
        let types = (0..num_layers)
            .map(|l| match listed.contains(&(l as u64)) {
                true => LayerAttention::Full,
                false => LayerAttention::Linear,
            })
            .collect();
        return Ok((window, types));
    }
    let types: Vec<LayerAttention> = match j.get("layer_types").and_then(Value::as_array) {
        Some(list) => {
            if list.len() != num_layers {
                return Err(format!(
                    "layer_types has {} entries for {num_layers} layers",
                    list.len()
                ));
            }
            let lfm2 = arch.is_lfm2();
            let granite = arch == Architecture::GraniteMoeHybrid;
            let supported = if arch.has_linear_attention() {
                "full_attention, linear_attention"
            } else if granite {
                "attention, mamba (full_attention, linear_attention)"
            } else if lfm2 {
                "full_attention, conv"
            } else if arch.has_indexer() {
                "indexed_attention, full_attention"
            } else if arch == Architecture::Llama4 {
                "chunked_attention, full_attention"
            } else {
                "full_attention, sliding_attention"
            };
            list.iter()
                .map(|v| match v.as_str() {
                    Some("full_attention") => Ok(LayerAttention::Full),
                    // Sparse attention's selection is the indexer's (`IndexerConfig`).
                    Some("indexed_attention") if arch.has_indexer() => Ok(LayerAttention::Full),
                    Some("attention") if granite => Ok(LayerAttention::Full),
                    Some("chunked_attention") if arch == Architecture::Llama4 => {
                        Ok(LayerAttention::Chunked)
                    }
                    Some("sliding_attention")
                        if !arch.has_linear_attention()
                            && !lfm2
                            && !granite
                            && !arch.has_indexer()
                            && arch != Architecture::Llama4 =>
                    {
                        Ok(LayerAttention::Sliding)
                    }
                    Some("linear_attention") if arch.has_linear_attention() || granite => {
                        Ok(LayerAttention::Linear)
                    }
                    Some("mamba") if granite => Ok(LayerAttention::Linear),
                    Some("conv") if lfm2 => Ok(LayerAttention::ShortConv),
                    _ => Err(format!(
                        "unsupported layer_types entry {v} (supported: {supported})"
                    )),
                })
                .collect::<Result<_, _>>()?
        }
        None if arch == Architecture::Llama4 => super::llama4::default_layer_types(j, num_layers)?,
        // transformers' Granite 4.0-H default: every layer Mamba-2.
        None if arch == Architecture::GraniteMoeHybrid => vec![LayerAttention::Linear; num_layers],
        // transformers' Qwen3.5 default: every `full_attention_interval`-th layer attends.
        None if arch.has_delta_net() => {
            let interval = keys.usize("full_attention_interval")?.unwrap_or(4).max(1);
            (0..num_layers)
                .map(|l| match (l + 1) % interval {
                    0 => LayerAttention::Full,
                    _ => LayerAttention::Linear,
                })
                .collect()
        }
        // transformers' LFM2 default: the layers `full_attn_idxs` lists attend (every one
        // without the list), the others convolve.
        None if arch.is_lfm2() => {
            let attending: Option<Vec<usize>> = match j.get("full_attn_idxs") {
                None | Some(Value::Null) => None,
                Some(v) => Some(
                    v.as_array()
                        .and_then(|a| {
                            a.iter()
                                .map(|i| i.as_u64().map(|i| i as usize))
                                .collect::<Option<Vec<_>>>()
                        })
                        .ok_or_else(|| format!("`full_attn_idxs` is {v}, not a list of layers"))?,
                ),
            };
            (0..num_layers)
                .map(|l| match &attending {
                    Some(list) if !list.contains(&l) => LayerAttention::ShortConv,
                    _ => LayerAttention::Full,
                })
                .collect()
        }
        None => (0..num_layers)
            .map(|l| {
                let sliding = match arch {
                    Architecture::Gemma2 | Architecture::GptOss => (l + 1) % 2 != 0,
                    Architecture::Gemma3 | Architecture::Gemma4 => {
                        (l + 1) % pattern.unwrap_or(6).max(1) != 0
                    }
                    Architecture::Mistral
                    | Architecture::Ministral3
                    | Architecture::Mixtral
                    | Architecture::Phi3 => window.is_some(),
                    Architecture::Qwen2
                    | Architecture::Qwen3
                    | Architecture::Qwen2Moe
                    | Architecture::Qwen3Moe
                    | Architecture::Qwen3VlMoe => qwen_sliding && l >= max_window_layers,
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
    let mut types = types;
    // transformers' Gemma4TextConfig makes the last layer full whatever the list says.
    if arch == Architecture::Gemma4
        && let Some(last) = types.last_mut()
    {
        *last = LayerAttention::Full;
    }
    if window.is_none() && types.contains(&LayerAttention::Sliding) {
        return Err("layer_types has sliding_attention layers but sliding_window is null".into());
    }
    Ok((window, types))
}
