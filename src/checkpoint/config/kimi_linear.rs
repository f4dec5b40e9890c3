//! Kimi-Linear's `config.json` under the names the rest of the config reader knows: the
//! keys transformers' `KimiLinearConfig.attribute_map` aliases, the published checkpoints'
//! `linear_attn_config`, and the layer lists its `__post_init__` derives.

use serde_json::{Map, Value};

use super::Keys;

/// transformers' `KimiLinearConfig.attribute_map`: (the name the reader knows, Kimi's).
const ALIASES: &[(&str, &str)] = &[
    ("max_position_embeddings", "model_max_length"),
    ("norm_topk_prob", "moe_renormalize"),
    ("n_group", "num_expert_group"),
    ("n_routed_experts", "num_experts"),
    ("num_experts_per_tok", "num_experts_per_token"),
    ("n_shared_experts", "num_shared_experts"),
];

/// `j` with each alias under the name the reader knows (where that name is not there), the
/// DeltaNet's geometry from `linear_attn_config` (which wins, as in transformers),
/// `layer_types` from its `full_attn_layers` / `kda_layers` (counted from 1) or transformers'
/// default (layer `i` attends where `i > 0 && i % 4 == 0`), and
/// `mlp_layer_types` from `first_k_dense_replace` (default 1). A router other than the sigmoid
/// or attention with RoPE, which transformers does not implement, is refused.
pub(super) fn canonical_keys(j: &Value) -> Result<Value, String> {
    let keys = Keys(j);
    match keys.str("moe_router_activation_func")? {
        None | Some("sigmoid") => {}
        Some(other) => {
            return Err(format!(
                "unsupported moe_router_activation_func `{other}` (supported: sigmoid)"
            ));
        }
    }
    if keys.bool("mla_use_nope")? == Some(false) {
        return Err("unsupported mla_use_nope: false (Kimi-Linear's attention has no RoPE)".into());
    }
    let mut out: Map<String, Value> = j.as_object().cloned().unwrap_or_default();
    for (name, alias) in ALIASES {
        if !out.contains_key(*name)
            && let Some(v) = j.get(*alias)
        {
            out.insert(name.to_string(), v.clone());
        }
    }
    let linear = match j.get("linear_attn_config") {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => Some(o),
        Some(v) => return Err(format!("`linear_attn_config` is {v}, not an object")),
    };
    if let Some(o) = linear {
        for (name, key) in [
            ("linear_num_heads", "num_heads"),
            ("linear_head_dim", "head_dim"),
            ("linear_conv_kernel_dim", "short_conv_kernel_size"),
        ] {
            if let Some(v) = o.get(key) {
                out.insert(name.into(), v.clone());
            }
        }
    }
    let layers = super::num_hidden_layers(j)?;
    if j.get("layer_types").is_none_or(Value::is_null) {
        let types = match linear.filter(|o| o.contains_key("full_attn_layers")) {
            Some(o) => listed_layer_types(o, layers)?,
            None => (0..layers)
                .map(|i| match i > 0 && i % 4 == 0 {
                    true => "full_attention",
                    false => "linear_attention",
                })
                .collect(),
        };
        out.insert("layer_types".into(), types.into());
    }
    if j.get("mlp_layer_types").is_none_or(Value::is_null) {
        let dense = keys.usize("first_k_dense_replace")?.unwrap_or(1);
        let types: Vec<&str> = (0..layers)
            .map(|i| if i < dense { "dense" } else { "sparse" })
            .collect();
        out.insert("mlp_layer_types".into(), types.into());
    }
    Ok(Value::Object(out))
}

/// Each layer's type from `full_attn_layers` and `kda_layers` (layers counted from 1); a layer
/// in neither list, or past the last, is refused.
fn listed_layer_types(o: &Map<String, Value>, layers: usize) -> Result<Vec<&'static str>, String> {
    let mut types: Vec<Option<&'static str>> = vec![None; layers];
    for (key, kind) in [
        ("full_attn_layers", "full_attention"),
        ("kda_layers", "linear_attention"),
    ] {
        let v = o.get(key).unwrap_or(&Value::Null);
        let list = v
            .as_array()
            .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
            .ok_or_else(|| format!("`linear_attn_config.{key}` is {v}, not a list of layers"))?;
        for l in list {
            match (l as usize).checked_sub(1).and_then(|i| types.get_mut(i)) {
                Some(t) => *t = Some(kind),
                None => {
                    return Err(format!(
                        "linear_attn_config.{key} lists layer {l} of {layers} (counted from 1)"
                    ));
                }
            }
        }
    }
    types
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.ok_or_else(|| {
                format!(
                    "layer {} is in neither linear_attn_config.full_attn_layers nor kda_layers",
                    i + 1
                )
            })
        })
        .collect()
}
