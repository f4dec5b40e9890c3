//! What Gemma 4 (`Gemma4TextConfig`) varies from layer to layer and adds to each: the
//! full-attention layers' own head size and key/value heads, values taken from the key
//! projection, layers reusing an earlier layer's keys and values, wider MLPs there, and the
//! per-layer input embeddings.

use serde_json::Value;

use super::Keys;
use super::attention::LayerAttention;

/// A layer's query/key head size and key/value head count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct HeadShape {
    pub head_dim: usize,
    pub kv_heads: usize,
}

/// Gemma 4's per-layer inputs (PLE): a second embedding table
/// (`embed_tokens_per_layer`, `[vocab, layers * width]`) and a projection of the token
/// embeddings give each layer a `width`-wide input that gates a residual update after its MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PerLayerInputs {
    pub width: usize,
    pub vocab: usize,
}

/// Gemma 4's layer options, resolved as transformers' `Gemma4TextConfig.__post_init__` and
/// `kv_sharing_modes` resolve them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Gemma4Layers {
    /// The full-attention layers' head shape where it differs from the sliding layers'
    /// (`global_head_dim`, and `num_global_key_value_heads` under `attention_k_eq_v`; or a
    /// `per_layer_config` as transformers writes it).
    pub full_heads: Option<HeadShape>,
    /// `attention_k_eq_v`: full-attention layers have no `v_proj`; their values are the key
    /// projection's output (value-normed, not key-normed or rotated).
    pub values_from_keys: bool,
    /// Per layer: the layer whose keys and values it attends to instead of its own (the
    /// last `num_kv_shared_layers` layers reuse the last earlier layer of their kind's).
    pub kv_source: Vec<Option<usize>>,
    /// `use_double_wide_mlp`: the layers that reuse keys and values have MLPs twice
    /// `intermediate_size` wide.
    pub double_wide_shared_mlp: bool,
    pub per_layer_inputs: Option<PerLayerInputs>,
}

impl Gemma4Layers {
    pub(super) fn from_json(
        j: &Value,
        layer_types: &[LayerAttention],
        base: HeadShape,
    ) -> Result<Self, String> {
        let keys = Keys(j);
        let num_layers = layer_types.len();
        match j.get("use_bidirectional_attention") {
            None | Some(Value::Null) => {}
            // Vision tokens see each other both ways; text stays causal.
            Some(Value::String(s)) if s == "vision" => {}
            Some(v) => {
                return Err(format!(
                    "unsupported use_bidirectional_attention {v} (supported: null, \"vision\")"
                ));
            }
        }
        let values_from_keys = keys.bool("attention_k_eq_v")?.unwrap_or(false);
        let full_heads = match j.get("per_layer_config").filter(|v| !v.is_null()) {
            Some(per_layer) => per_layer_heads(per_layer, layer_types, base)?,
            None => {
                let head_dim = keys.usize("global_head_dim")?.unwrap_or(512);
                let kv_heads = match values_from_keys {
                    true => keys.usize("num_global_key_value_heads")?,
                    false => None,
                };
                Some(HeadShape {
                    head_dim,
                    kv_heads: kv_heads.unwrap_or(base.kv_heads),
                })
            }
        };
        if let Some(h) = full_heads
            && (h.head_dim == 0 || h.head_dim % 2 != 0 || h.kv_heads == 0)
        {
            return Err(format!(
                "the full-attention layers' head_dim {} and key/value heads {} must be even and \
                 positive",
                h.head_dim, h.kv_heads
            ));
        }
        let shared = keys.usize("num_kv_shared_layers")?.unwrap_or(0);
        if shared >= num_layers && shared > 0 {
            return Err(format!(
                "num_kv_shared_layers {shared} leaves no layer of the {num_layers} to compute \
                 keys and values"
            ));
        }
        let first_shared = num_layers - shared;
        let kv_source = (0..num_layers)
            .map(|l| {
                if l < first_shared {
                    return Ok(None);
                }
                let kind = layer_types[l];
                (0..first_shared)
                    .rev()
                    .find(|&s| layer_types[s] == kind)
                    .map(Some)
                    .ok_or_else(|| {
                        format!(
                            "layer {l} reuses keys and values (num_kv_shared_layers {shared}) \
                             but no earlier layer is of its kind ({kind:?})"
                        )
                    })
            })
            .collect::<Result<_, String>>()?;
        let width = keys.usize("hidden_size_per_layer_input")?.unwrap_or(256);
        Ok(Self {
            full_heads: full_heads.filter(|&h| h != base),
            values_from_keys,
            kv_source,
            double_wide_shared_mlp: keys.bool("use_double_wide_mlp")?.unwrap_or(false),
            per_layer_inputs: (width > 0)
                .then(|| {
                    Ok::<_, String>(PerLayerInputs {
                        width,
                        vocab: keys.usize("vocab_size_per_layer_input")?.unwrap_or(262_144),
                    })
                })
                .transpose()?,
        })
    }

    /// Whether layer `layer` reads another layer's keys and values.
    pub fn reuses_kv(&self, layer: usize) -> bool {
        self.kv_source.get(layer).is_some_and(Option::is_some)
    }

    /// Whether a later layer reads layer `layer`'s keys and values.
    pub fn keeps_kv(&self, layer: usize) -> bool {
        self.kv_source.contains(&Some(layer))
    }
}

/// The full-attention layers' head shape from transformers' `per_layer_config` (`{"2":
/// {"head_dim": 512, "num_key_value_heads": 2}, ...}`): every full layer's the same, the
/// sliding layers' the base's.
fn per_layer_heads(
    per_layer: &Value,
    layer_types: &[LayerAttention],
    base: HeadShape,
) -> Result<Option<HeadShape>, String> {
    let entries = per_layer
        .as_object()
        .ok_or_else(|| format!("`per_layer_config` is {per_layer}, not an object"))?;
    let mut full: Option<HeadShape> = None;
    let mut full_entries = 0;
    for (k, v) in entries {
        let layer: usize = k
            .parse()
            .ok()
            .filter(|&l| l < layer_types.len())
            .ok_or_else(|| format!("per_layer_config names layer `{k}`, not one of the layers"))?;
        let keys = Keys(v);
        if let Some(other) = v.as_object().and_then(|o| {
            o.keys()
                .find(|k| !matches!(k.as_str(), "head_dim" | "num_key_value_heads"))
        }) {
            return Err(format!(
                "per_layer_config.{k}.{other} is not supported (supported: head_dim, \
                 num_key_value_heads)"
            ));
        }
        let shape = HeadShape {
            head_dim: keys.usize("head_dim")?.unwrap_or(base.head_dim),
            kv_heads: keys.usize("num_key_value_heads")?.unwrap_or(base.kv_heads),
        };
        match layer_types[layer] {
            LayerAttention::Full => full_entries += 1,
            _ if shape == base => continue,
            _ => {
                return Err(format!(
                    "per_layer_config.{k}: a sliding layer with its own head shape is not \
                     supported"
                ));
            }
        }
        match full {
            Some(f) if f != shape => {
                return Err(format!(
                    "per_layer_config: full-attention layers of different head shapes \
                     ({f:?} and {shape:?} at layer {k})"
                ));
            }
            _ => full = Some(shape),
        }
    }
    let full_layers = layer_types
        .iter()
        .filter(|&&t| t == LayerAttention::Full)
        .count();
    if full.is_some() && full_entries < full_layers {
        return Err(format!(
            "per_layer_config gives {full_entries} of the {full_layers} full-attention layers \
             their own head shape"
        ));
    }
    Ok(full)
}
