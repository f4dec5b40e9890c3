//! What Llama 4 (`Llama4TextConfig`) varies from layer to layer: which layers rotate
//! (`no_rope_layers`; the others attend without positions, their queries tempered by
//! position), which attend only within chunks of `attention_chunk_size` positions, and the
//! weightless q/k norms of the rotating layers.

use serde_json::Value;

use super::Keys;
use super::attention::LayerAttention;
use super::rope::QueryScale;

/// Llama 4's layer options, resolved as transformers' `Llama4TextConfig.__post_init__`
/// resolves them.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Llama4Layers {
    /// Per layer: whether it applies RoPE (`no_rope_layers[l]` is 1; by default every layer
    /// but each `no_rope_layer_interval`-th).
    pub rope_layers: Vec<bool>,
    /// `attention_chunk_size`: a `chunked_attention` layer's query sees only the keys of its
    /// own chunk of this many positions.
    pub chunk: Option<usize>,
    /// `attn_temperature_tuning`: the queries of the layers without RoPE times
    /// `1 + attn_scale * ln(1 + floor((pos + 1) / floor_scale))`.
    pub temperature: Option<QueryScale>,
    /// `use_qk_norm`: each query and key head of the rotating layers RMS-normed without a
    /// weight (`Llama4TextL2Norm`, after RoPE there; a rotation keeps a head's norm, so
    /// norming first is the same).
    pub qk_norm: bool,
}

impl Llama4Layers {
    pub(super) fn from_json(j: &Value, num_layers: usize) -> Result<Self, String> {
        let keys = Keys(j);
        let chunk = match j.get("attention_chunk_size") {
            None => Some(8192),
            Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Some(n as usize),
                _ => {
                    return Err(format!(
                        "`attention_chunk_size` is {v}, not a positive integer"
                    ));
                }
            },
        };
        // Published configs write `attn_temperature_tuning` as a number (4); transformers
        // reads it as a truth value.
        let tuning = match j.get("attn_temperature_tuning") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(v) => match v.as_f64() {
                Some(n) => n != 0.0,
                None => return Err(format!("`attn_temperature_tuning` is {v}, not a bool")),
            },
        };
        let temperature = match tuning {
            false => None,
            true => {
                let period = keys.usize("floor_scale")?.unwrap_or(8192);
                let beta = keys.f64("attn_scale")?.unwrap_or(0.1);
                if period == 0 || !beta.is_finite() {
                    return Err(format!(
                        "floor_scale {period} and attn_scale {beta}: a positive period and a \
                         finite scale wanted"
                    ));
                }
                Some(QueryScale {
                    beta,
                    period,
                    shift: 1,
                })
            }
        };
        Ok(Self {
            rope_layers: rope_layers(j, num_layers)?,
            chunk,
            temperature,
            qk_norm: keys.bool("use_qk_norm")?.unwrap_or(true),
        })
    }
}

/// Per layer, whether it applies RoPE: `no_rope_layers` (1 rotates; at least one entry a
/// layer), or where it is absent or empty every layer but each `no_rope_layer_interval`-th
/// (Llama 4's and Mistral Large 4's rule).
pub(super) fn rope_layers(j: &Value, num_layers: usize) -> Result<Vec<bool>, String> {
    let listed = match j.get("no_rope_layers") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
            .ok_or_else(|| format!("`no_rope_layers` is {v}, not a list of 0s and 1s"))?,
    };
    if listed.is_empty() {
        let interval = Keys(j).usize("no_rope_layer_interval")?.unwrap_or(4);
        if interval == 0 {
            return Err("no_rope_layer_interval 0 is not supported".into());
        }
        return Ok((0..num_layers).map(|l| (l + 1) % interval != 0).collect());
    }
    if listed.len() < num_layers || listed.iter().any(|&v| v > 1) {
        return Err(format!(
            "no_rope_layers has {} entries for {num_layers} layers, each 0 or 1 wanted",
            listed.len()
        ));
    }
    Ok(listed[..num_layers].iter().map(|&v| v == 1).collect())
}

/// Llama 4's layer types where `layer_types` is absent: chunked attention on the layers that
/// rotate, full attention on the others (every layer full without a chunk size).
pub(super) fn default_layer_types(
    j: &Value,
    num_layers: usize,
) -> Result<Vec<LayerAttention>, String> {
    let chunked = !matches!(j.get("attention_chunk_size"), Some(Value::Null));
    Ok(rope_layers(j, num_layers)?
        .into_iter()
        .map(|rope| match rope && chunked {
            true => LayerAttention::Chunked,
            false => LayerAttention::Full,
        })
        .collect())
}
