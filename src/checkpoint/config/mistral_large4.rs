//! What Mistral Large 4 (`MistralLarge4TextConfig`) varies from layer to layer: which layers
//! rotate (`no_rope_layers`, Llama 4's rule: by default every fourth layer does not), and
//! which expand an earlier layer's latent keys and values (`kv_source_layers`). Every layer
//! also scales its query heads by position (`softmax_scaling`) and RoPE's frequencies are
//! learned (`alpha`): tensors of the checkpoint, read by the forward pass.

use serde_json::Value;

/// Where a layer's latent keys and values (`kv_a_layernorm`'s output and the unrotated key
/// part) come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LatentSource {
    /// Its own `kv_a_proj_with_mqa`.
    Own,
    /// Its own, kept for later layers that reuse it.
    Stores,
    /// The layer named's (it has no `kv_a_proj_with_mqa` of its own).
    Reuses(usize),
}

/// Mistral Large 4's layer options, resolved as `MistralLarge4TextConfig.__post_init__` and
/// `kv_sharing_modes` resolve them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MistralLarge4Layers {
    /// Per layer: whether it applies RoPE to its queries and keys (and its indexer to its own).
    /// A layer that does not holds all of `qk_nope_head_dim + qk_rope_head_dim` unrotated.
    pub rope_layers: Vec<bool>,
    /// Per layer: where its latent comes from.
    pub latents: Vec<LatentSource>,
}

impl MistralLarge4Layers {
    pub(super) fn from_json(j: &Value, num_layers: usize) -> Result<Self, String> {
        let rope_layers = super::llama4::rope_layers(j, num_layers)?;
        let sources: Vec<usize> = match j.get("kv_source_layers").filter(|v| !v.is_null()) {
            None => (0..num_layers).collect(),
            Some(v) => v
                .as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|s| s.as_u64().map(|s| s as usize))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| format!("`kv_source_layers` is {v}, not a list of layers"))?,
        };
        if sources.len() != num_layers {
            return Err(format!(
                "kv_source_layers has {} entries for {num_layers} layers",
                sources.len()
            ));
        }
        if let Some((l, s)) = sources
            .iter()
            .enumerate()
            .find(|&(l, &s)| s > l || sources[s] != s)
        {
            return Err(format!(
                "kv_source_layers: layer {l} reuses layer {s}, not an earlier layer with its own \
                 latent keys and values"
            ));
        }
        // transformers keeps one latent per kind (with RoPE, without), which each layer that a
        // later one names as its source overwrites; a reusing layer expands the last one kept
        // of its kind.
        let stores: Vec<bool> = (0..num_layers)
            .map(|l| sources[l + 1..].contains(&l))
            .collect();
        let mut latents = Vec::with_capacity(num_layers);
        for l in 0..num_layers {
            latents.push(match (sources[l] == l, stores[l]) {
                (true, false) => LatentSource::Own,
                (true, true) => LatentSource::Stores,
                (false, _) => {
                    let kept = (0..l)
                        .rev()
                        .find(|&p| stores[p] && rope_layers[p] == rope_layers[l])
                        .ok_or_else(|| {
                            format!(
                                "kv_source_layers: layer {l} reuses a latent {} RoPE that no \
                                 earlier layer keeps",
                                if rope_layers[l] { "with" } else { "without" }
                            )
                        })?;
                    LatentSource::Reuses(kept)
                }
            });
        }
        Ok(Self {
            rope_layers,
            latents,
        })
    }
}
