//! What Mistral Large 4 (`MistralLarge4TextConfig`) varies from layer to layer: which layers
//! rotate (`no_rope_layers`, Llama 4's rule: by default every fourth layer does not). Every
//! layer also scales its query heads by position (`softmax_scaling`) and RoPE's frequencies
//! are learned (`alpha`): tensors of the checkpoint, read by the forward pass.

use serde_json::Value;

/// Mistral Large 4's layer options, resolved as `MistralLarge4TextConfig.__post_init__`
/// resolves them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MistralLarge4Layers {
    /// Per layer: whether it applies RoPE to its queries and keys (and its indexer to its own).
    /// A layer that does not holds all of `qk_nope_head_dim + qk_rope_head_dim` unrotated.
    pub rope_layers: Vec<bool>,
}

impl MistralLarge4Layers {
    pub(super) fn from_json(j: &Value, num_layers: usize) -> Result<Self, String> {
        // `kv_source_layers`: a layer expanding an earlier layer's latent keys and values.
        if let Some(v) = j.get("kv_source_layers").filter(|v| !v.is_null()) {
            let sources = v
                .as_array()
                .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
                .ok_or_else(|| format!("`kv_source_layers` is {v}, not a list of layers"))?;
            if let Some((l, s)) = sources.iter().enumerate().find(|&(l, &s)| s != l as u64) {
                return Err(format!(
                    "kv_source_layers: layer {l} reuses layer {s}'s latent keys and values, \
                     which is not supported"
                ));
            }
        }
        Ok(Self {
            rope_layers: super::llama4::rope_layers(j, num_layers)?,
        })
    }
}
