//! DeepSeek-V4's own tensor names, which its published checkpoints keep (and transformers'
//! `save_pretrained` writes back, under `model.`), renamed on load by transformers'
//! `conversion_mapping.py` (`deepseek_v4`): read under transformers' names.

/// Renames inside a layer, in the order `conversion_mapping.py` applies them, on the name
/// with a dot at each end (its patterns match between dots).
const IN_LAYER: [(&str, &str); 27] = [
    (".attn.", ".self_attn."),
    (".ffn.", ".mlp."),
    (".indexer.compressor.", ".compressor.indexer."),
    (".attn_norm.", ".input_layernorm."),
    (".ffn_norm.", ".post_attention_layernorm."),
    (".hc_attn_fn.", ".attn_hc.fn."),
    (".hc_attn_base.", ".attn_hc.base."),
    (".hc_attn_scale.", ".attn_hc.scale."),
    (".hc_ffn_fn.", ".ffn_hc.fn."),
    (".hc_ffn_base.", ".ffn_hc.base."),
    (".hc_ffn_scale.", ".ffn_hc.scale."),
    (".attn_sink.", ".sinks."),
    (
        ".indexer.weights_proj.",
        ".compressor.indexer.scorer.weights_proj.",
    ),
    (".indexer.wq_b.", ".compressor.indexer.q_b_proj."),
    (".norm.", ".kv_norm."),
    (".ape.", ".position_bias."),
    (".wq_a.", ".q_a_proj."),
    (".self_attn.wq_b.", ".self_attn.q_b_proj."),
    (".wkv.", ".kv_proj."),
    (".wgate.", ".gate_proj."),
    (".wo_a.", ".o_a_proj."),
    (".wo_b.", ".o_b_proj."),
    (".q_norm.", ".q_a_norm."),
    (".gate.bias.", ".gate.e_score_correction_bias."),
    // Shared and routed experts alike (transformers stacks the routed ones; quantppl reads
    // each expert as linears of its own).
    (".w1.", ".gate_proj."),
    (".w2.", ".down_proj."),
    (".w3.", ".up_proj."),
];

/// The names outside the layers: published, and as `save_pretrained` writes them.
const TOP: [(&str, &str); 9] = [
    ("embed.weight", "model.embed_tokens.weight"),
    ("norm.weight", "model.norm.weight"),
    ("head.weight", "lm_head.weight"),
    ("hc_head_fn", "model.hc_head.hc_fn"),
    ("hc_head_base", "model.hc_head.hc_base"),
    ("hc_head_scale", "model.hc_head.hc_scale"),
    ("model.hc_head_fn", "model.hc_head.hc_fn"),
    ("model.hc_head_base", "model.hc_head.hc_base"),
    ("model.hc_head_scale", "model.hc_head.hc_scale"),
];

/// transformers' name for a tensor of DeepSeek-V4's layout; `None` where it keeps its name
/// (transformers' own names, the multi-token-prediction layers, which are never read).
pub fn transformers_name(name: &str) -> Option<String> {
    if let Some((_, to)) = TOP.iter().find(|(from, _)| *from == name) {
        return Some(to.to_string());
    }
    let rest = name
        .strip_prefix("model.layers.")
        .or_else(|| name.strip_prefix("layers."))?;
    let mut dotted = format!(".{rest}.");
    // A native FP8 checkpoint's block scales (`w1.scale`), renamed by transformers' FP8
    // quantizer before the model's own renames. The hyper-connections' `scale` is `hc_attn_scale`
    // here, `attn_hc.scale` in transformers' names (which stay).
    if let Some(module) = dotted
        .strip_suffix(".scale.")
        .filter(|m| !m.ends_with("_hc"))
    {
        dotted = format!("{module}.weight_scale_inv.");
    }
    for (from, to) in IN_LAYER {
        dotted = dotted.replace(from, to);
    }
    let renamed = format!("model.layers{}", dotted.trim_end_matches('.'));
    (renamed != name).then_some(renamed)
}

/// The published name of a tensor transformers names `name` (where an error names a tensor
/// the checkpoint lacks, what to look for in it).
pub fn deepseek_name(name: &str) -> Option<String> {
    if let Some((from, _)) = TOP.iter().take(6).find(|(_, to)| *to == name) {
        return Some(from.to_string());
    }
    let rest = name.strip_prefix("model.layers.")?;
    let mut dotted = format!(".{rest}.");
    // `gate_proj` is an expert's `w1` under the mixture and a compressor's `wgate` elsewhere.
    let experts = dotted.contains(".mlp.");
    for (from, to) in IN_LAYER.iter().rev() {
        if from.starts_with(".w") && from.len() == 4 && !experts || *from == ".wgate." && experts {
            continue;
        }
        dotted = dotted.replace(to, from);
    }
    if let Some(module) = dotted.strip_suffix(".weight_scale_inv.") {
        dotted = format!("{module}.scale.");
    }
    Some(format!("layers{}", dotted.trim_end_matches('.')))
}

#[cfg(test)]
mod tests {
    use super::{deepseek_name, transformers_name};

    /// transformers' renames (`conversion_mapping.py`'s `deepseek_v4`) as a
    /// `DeepseekV4ForCausalLM` state dict names what each published tensor loads into (the
    /// routed experts per expert, where transformers stacks them), and back.
    #[test]
    fn deepseek_v4_names_load_as_transformers_names_them() {
        let l = "model.layers.3";
        for (published, hf) in [
            ("embed.weight", "model.embed_tokens.weight".to_string()),
            ("norm.weight", "model.norm.weight".into()),
            ("head.weight", "lm_head.weight".into()),
            ("hc_head_fn", "model.hc_head.hc_fn".into()),
            (
                "layers.3.attn.wq_a.weight",
                format!("{l}.self_attn.q_a_proj.weight"),
            ),
            (
                "layers.3.attn.wq_b.weight",
                format!("{l}.self_attn.q_b_proj.weight"),
            ),
            (
                "layers.3.attn.q_norm.weight",
                format!("{l}.self_attn.q_a_norm.weight"),
            ),
            (
                "layers.3.attn.wkv.weight",
                format!("{l}.self_attn.kv_proj.weight"),
            ),
            (
                "layers.3.attn.norm.weight",
                format!("{l}.self_attn.kv_norm.weight"),
            ),
            (
                "layers.3.attn.wo_a.weight",
                format!("{l}.self_attn.o_a_proj.weight"),
            ),
            (
                "layers.3.attn.wo_b.weight",
                format!("{l}.self_attn.o_b_proj.weight"),
            ),
            ("layers.3.attn.attn_sink", format!("{l}.self_attn.sinks")),
            (
                "layers.3.attn.compressor.wkv.weight",
                format!("{l}.self_attn.compressor.kv_proj.weight"),
            ),
            (
                "layers.3.attn.compressor.ape",
                format!("{l}.self_attn.compressor.position_bias"),
            ),
            (
                "layers.3.attn.compressor.wgate.weight",
                format!("{l}.self_attn.compressor.gate_proj.weight"),
            ),
            (
                "layers.3.attn.compressor.norm.weight",
                format!("{l}.self_attn.compressor.kv_norm.weight"),
            ),
            (
                "layers.3.attn.indexer.compressor.wkv.weight",
                format!("{l}.self_attn.compressor.indexer.kv_proj.weight"),
            ),
            (
                "layers.3.attn.indexer.compressor.norm.weight",
                format!("{l}.self_attn.compressor.indexer.kv_norm.weight"),
            ),
            (
                "layers.3.attn.indexer.wq_b.weight",
                format!("{l}.self_attn.compressor.indexer.q_b_proj.weight"),
            ),
            (
                "layers.3.attn.indexer.weights_proj.weight",
                format!("{l}.self_attn.compressor.indexer.scorer.weights_proj.weight"),
            ),
            (
                "layers.3.attn_norm.weight",
                format!("{l}.input_layernorm.weight"),
            ),
            (
                "layers.3.ffn_norm.weight",
                format!("{l}.post_attention_layernorm.weight"),
            ),
            ("layers.3.hc_attn_fn", format!("{l}.attn_hc.fn")),
            ("layers.3.hc_ffn_scale", format!("{l}.ffn_hc.scale")),
            ("layers.3.ffn.gate.weight", format!("{l}.mlp.gate.weight")),
            (
                "layers.3.ffn.gate.bias",
                format!("{l}.mlp.gate.e_score_correction_bias"),
            ),
            ("layers.3.ffn.gate.tid2eid", format!("{l}.mlp.gate.tid2eid")),
            (
                "layers.3.ffn.experts.7.w3.weight",
                format!("{l}.mlp.experts.7.up_proj.weight"),
            ),
            (
                "layers.3.ffn.shared_experts.w2.weight",
                format!("{l}.mlp.shared_experts.down_proj.weight"),
            ),
            // A native FP8 checkpoint's block scales (V4-Flash's FP4 experts' too).
            (
                "layers.3.ffn.experts.7.w1.scale",
                format!("{l}.mlp.experts.7.gate_proj.weight_scale_inv"),
            ),
            (
                "layers.3.attn.wo_a.scale",
                format!("{l}.self_attn.o_a_proj.weight_scale_inv"),
            ),
        ] {
            assert_eq!(
                transformers_name(published).as_deref(),
                Some(hf.as_str()),
                "{published}"
            );
            // save_pretrained's form: the published layer names under `model.`.
            if published.starts_with("layers.") {
                let saved = format!("model.{published}");
                assert_eq!(transformers_name(&saved).as_deref(), Some(hf.as_str()));
            }
            assert_eq!(deepseek_name(&hf).as_deref(), Some(published), "{hf}");
        }
        assert_eq!(
            transformers_name("model.hc_head.hc_fn"),
            None,
            "transformers' own names stay"
        );
        assert_eq!(transformers_name("mtp.0.emb.weight"), None);
        assert_eq!(
            transformers_name("model.layers.3.attn_hc.scale"),
            None,
            "the hyper-connections' scale is no block scale"
        );
    }
}
