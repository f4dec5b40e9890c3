//! GLM-5.3-Flash (`Glm5NextTextConfig`): its `config.json` under the names the rest of the
//! config reader knows, resolved as transformers' `__post_init__` resolves it, and what its
//! layers add to Kimi-Linear's (Kimi Delta Attention beside latent attention without RoPE):
//! the safe gate, the sparse-attention indexer's pools, hyper-connections.

use serde_json::{Map, Value};

use super::Keys;

/// A config's `hc_mult` residual streams mixed by hyper-connections around each block
/// (DeepSeek-V4, GLM-5.3-Flash): `sinkhorn_iters` Sinkhorn passes, their sums' floor `eps`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct HyperConnections {
    pub streams: usize,
    pub sinkhorn_iters: usize,
    pub eps: f64,
    /// How the streams collapse after the last layer.
    pub head: HyperHead,
}

/// The final collapse of the residual streams before the last norm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HyperHead {
    /// DeepSeek-V4's `hc_head`: `pre` weights from tensors of its own.
    Weighted,
    /// GLM-5.3-Flash's `Glm5NextTextHyperHead`: the streams' mean.
    Mean,
}

impl HyperConnections {
    /// `hc_mult`, `hc_sinkhorn_iters` and `hc_eps`, transformers' defaults where absent.
    pub(super) fn from_json(j: &Value, head: HyperHead) -> Result<Self, String> {
        let keys = Keys(j);
        Ok(Self {
            streams: keys.positive("hc_mult", 4)?,
            sinkhorn_iters: keys.positive("hc_sinkhorn_iters", 20)?,
            eps: keys.f64("hc_eps")?.unwrap_or(1e-6),
            head,
        })
    }
}

/// GLM-5.3-Flash's indexer scores pools of `size` consecutive tokens (the `index_kpool`
/// tokens' keys pooled by a softmax of `index_kpool_compress_gate` of the layer's input plus
/// `index_kpool_compress_ape` a slot) and keeps `index_topk / size` of those a query has seen
/// whole: their tokens, then (`tail`, `index_kpool_always_select_tail`) the tokens after the
/// last whole pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KeyPools {
    pub size: usize,
    pub tail: bool,
}

/// The log decay of GLM-5.3-Flash's Kimi Delta Attention: `linear_lower_bound` (transformers'
/// default -5; `linear_attn_config.gate_lower_bound`, or -5 where it says `safe_gate`), the
/// safe gate's lower bound; `None` (a null bound) keeps Kimi's softplus decay.
pub(super) fn lower_bound(j: &Value) -> Result<Option<f32>, String> {
    let v = match j.get("linear_lower_bound") {
        None => return Ok(Some(-5.0)),
        Some(Value::Null) => return Ok(None),
        Some(v) => v,
    };
    match v.as_f64() {
        Some(b) if b < 0.0 => Ok(Some(b as f32)),
        _ => Err(format!(
            "`linear_lower_bound` is {v}: the safe gate's lower bound must be below 0"
        )),
    }
}

/// The pools of the indexer (`index_kpool`, default 16, dividing `index_topk`).
pub(super) fn key_pools(j: &Value, top_k: usize) -> Result<KeyPools, String> {
    let keys = Keys(j);
    let size = keys.usize("index_kpool")?.unwrap_or(16);
    if size == 0 || !top_k.is_multiple_of(size) {
        return Err(format!(
            "index_kpool {size} does not divide index_topk {top_k}"
        ));
    }
    Ok(KeyPools {
        size,
        tail: keys.bool("index_kpool_always_select_tail")?.unwrap_or(true),
    })
}

/// `j` with `linear_attn_config`'s keys under the names the reader knows (as transformers
/// reads them), `indexed_attention` layers read as `full_attention`, and transformers'
/// defaults of `layer_types` (every fourth layer attends) and `mlp_layer_types` (the first
/// three dense) where absent.
pub(super) fn canonical_keys(j: &Value) -> Result<Value, String> {
    let mut out: Map<String, Value> = j.as_object().cloned().unwrap_or_default();
    match j.get("linear_attn_config") {
        None | Some(Value::Null) => {}
        Some(Value::Object(o)) => {
            for (name, key) in [
                ("linear_num_heads", "num_heads"),
                ("linear_head_dim", "head_dim"),
                ("linear_conv_kernel_dim", "short_conv_kernel_size"),
                ("linear_lower_bound", "gate_lower_bound"),
            ] {
                if let Some(v) = o.get(key) {
                    out.insert(name.into(), v.clone());
                }
            }
            let safe = o.get("safe_gate").and_then(Value::as_bool).unwrap_or(true);
            if safe && out.get("linear_lower_bound").is_none_or(Value::is_null) {
                out.insert("linear_lower_bound".into(), (-5.0).into());
            }
        }
        Some(v) => return Err(format!("`linear_attn_config` is {v}, not an object")),
    }
    let layers = super::num_hidden_layers(j)?;
    let types: Vec<Value> = match j.get("layer_types") {
        None | Some(Value::Null) => (0..layers)
            .map(|i| match i % 4 == 3 {
                true => "full_attention".into(),
                false => "linear_attention".into(),
            })
            .collect(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|t| match t.as_str() {
                Some("indexed_attention" | "full_attention") => Ok("full_attention".into()),
                Some("linear_attention") => Ok(t.clone()),
                _ => Err(format!(
                    "unsupported layer_types entry {t} (GLM-5.3-Flash: linear_attention, \
                     indexed_attention)"
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(format!("`layer_types` is {v}, not a list")),
    };
    // A layer reusing a selection takes the previous layer's (transformers raises where that
    // layer selected none).
    if let Some(Value::Array(modes)) = j.get("indexer_types") {
        for (l, mode) in modes.iter().enumerate().take(types.len()) {
            let attends = types[l] == "full_attention";
            let after_own =
                l > 0 && types[l - 1] == "full_attention" && modes[l - 1].as_str() == Some("full");
            if attends && mode.as_str() == Some("shared") && !after_own {
                return Err(format!(
                    "indexer_types: layer {l} reuses the previous layer's selection, which \
                     layer {} does not make (it is not a `full` indexed_attention layer)",
                    l.saturating_sub(1)
                ));
            }
        }
    }
    out.insert("layer_types".into(), types.into());
    if j.get("mlp_layer_types").is_none_or(Value::is_null) {
        let types: Vec<&str> = (0..layers)
            .map(|i| if i < 3 { "dense" } else { "sparse" })
            .collect();
        out.insert("mlp_layer_types".into(), types.into());
    }
    Ok(Value::Object(out))
}

/// transformers' in-memory names of GLM-5.3-Flash's hyper-connection tensors, which its
/// checkpoints keep as `hc_attn_fn` (`conversion_mapping.py`'s renames), for the stored name.
pub fn hyper_name(name: &str) -> Option<String> {
    let (layer, tensor) = name.rsplit_once(".hc_")?;
    let (block, part) = tensor.split_once('_')?;
    matches!(block, "attn" | "ffn")
        .then_some(())
        .filter(|_| matches!(part, "fn" | "base" | "scale"))
        .map(|_| format!("{layer}.{block}_hc.{part}"))
}

#[cfg(test)]
mod tests {
    use super::hyper_name;

    #[test]
    fn hyper_connection_names_load_as_transformers_names_them() {
        let l = "model.language_model.layers.3";
        assert_eq!(
            hyper_name(&format!("{l}.hc_attn_fn")),
            Some(format!("{l}.attn_hc.fn"))
        );
        assert_eq!(
            hyper_name(&format!("{l}.hc_ffn_scale")),
            Some(format!("{l}.ffn_hc.scale"))
        );
        assert_eq!(hyper_name(&format!("{l}.self_attn.q_proj.weight")), None);
        assert_eq!(hyper_name(&format!("{l}.hc_head_fn")), None);
    }
}
