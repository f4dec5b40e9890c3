//! Mistral's own tensor names (`consolidated` layout), which Mistral Large 4's Hugging Face
//! checkpoints keep and transformers renames on load (`conversion_mapping.py`'s
//! `mistral_large4` and `mistral_large4_text` renames): read under transformers' names.

/// The names outside the layers (Mistral's, transformers'), whole or as prefixes; the layers'
/// last.
const TOP: [(&str, &str); 5] = [
    ("lerope.alpha", "model.language_model.rotary_emb.alpha"),
    ("tok_embeddings.", "model.language_model.embed_tokens."),
    ("norm.", "model.language_model.norm."),
    ("output.", "lm_head."),
    (LAYERS.0, LAYERS.1),
];
const LAYERS: (&str, &str) = ("layers.", "model.language_model.layers.");

/// `name`'s top-level part renamed (Mistral's to transformers', or back where `flip`), and
/// the rest of it.
fn renamed_top(name: &str, flip: bool) -> Option<(&'static str, &str)> {
    TOP.into_iter()
        .map(|(m, t)| if flip { (t, m) } else { (m, t) })
        .find_map(|(from, to)| name.strip_prefix(from).map(|rest| (to, rest)))
}

/// transformers' name for a tensor of Mistral's layout, `None` where it keeps its name (the
/// vision tower's and the projector's, which are never read).
pub fn transformers_name(name: &str) -> Option<String> {
    let (prefix, rest) = renamed_top(name, false)?;
    if prefix != LAYERS.1 {
        return Some(format!("{prefix}{rest}"));
    }
    // A layer's modules, segment by segment: `ssmax_scaling`'s `s` and `b` are its scale and
    // bias; the MLPs' `w1`/`w3`/`w2` their gate, up and down projections.
    let mut out: Vec<&str> = Vec::new();
    let mut scaling = false;
    for segment in rest.split('.') {
        let renamed: &[&str] = match segment {
            "attention" => &["self_attn"],
            "wq" => &["q_proj"],
            "wkv_a_with_mqa" => &["kv_a_proj_with_mqa"],
            "wkv_b" => &["kv_b_proj"],
            "wo" => &["o_proj"],
            "attention_norm" => &["input_layernorm"],
            "ffn_norm" => &["post_attention_layernorm"],
            "kv_a_norm" => &["kv_a_layernorm"],
            "feed_forward" => &["mlp"],
            "gate" => &["mlp", "gate"],
            "experts" => &["mlp", "experts"],
            "shared_experts" => &["mlp", "shared_experts"],
            "ssmax_scaling" => &["softmax_scaling"],
            "s" if scaling => &["scale"],
            "b" if scaling => &["bias"],
            "w1" => &["gate_proj"],
            "w2" => &["down_proj"],
            "w3" => &["up_proj"],
            other => &[other][..],
        };
        scaling = segment == "ssmax_scaling";
        out.extend(
            renamed
                .iter()
                .map(|s| if *s == segment { segment } else { s }),
        );
    }
    Some(format!("{prefix}{}", out.join(".")))
}

/// The name Mistral's layout gives a tensor transformers names `name` (the inverse of
/// `transformers_name`): where an error names a tensor the checkpoint lacks, what to look for
/// in it.
pub fn mistral_name(name: &str) -> Option<String> {
    let (prefix, rest) = renamed_top(name, true)?;
    if prefix != LAYERS.0 {
        return Some(format!("{prefix}{rest}"));
    }
    let segments: Vec<&str> = rest.split('.').collect();
    let mut out: Vec<&str> = Vec::new();
    for (i, &segment) in segments.iter().enumerate() {
        let next = segments.get(i + 1).copied();
        let renamed = match segment {
            // The mixture's parts sit at the layer's top; a dense MLP under `feed_forward`.
            "mlp" if matches!(next, Some("gate" | "experts" | "shared_experts")) => continue,
            "mlp" => "feed_forward",
            "self_attn" => "attention",
            "q_proj" => "wq",
            "kv_a_proj_with_mqa" => "wkv_a_with_mqa",
            "kv_b_proj" => "wkv_b",
            "o_proj" => "wo",
            "input_layernorm" => "attention_norm",
            "post_attention_layernorm" => "ffn_norm",
            "kv_a_layernorm" => "kv_a_norm",
            "softmax_scaling" => "ssmax_scaling",
            "scale" if i > 0 && segments[i - 1] == "softmax_scaling" => "s",
            "bias" if i > 0 && segments[i - 1] == "softmax_scaling" => "b",
            "gate_proj" => "w1",
            "down_proj" => "w2",
            "up_proj" => "w3",
            other => other,
        };
        out.push(renamed);
    }
    Some(format!("{prefix}{}", out.join(".")))
}

#[cfg(test)]
mod tests {
    use super::{mistral_name, transformers_name};

    /// transformers' renames of Mistral Large 4 (`conversion_mapping.py`), as a
    /// `MistralLarge4ForConditionalGeneration` state dict names what each tensor loads into,
    /// and back.
    #[test]
    fn mistral_names_load_as_transformers_names_them() {
        let l = "model.language_model.layers.3";
        for (mistral, hf) in [
            (
                "tok_embeddings.weight",
                "model.language_model.embed_tokens.weight".to_string(),
            ),
            ("norm.weight", "model.language_model.norm.weight".into()),
            ("output.weight", "lm_head.weight".into()),
            (
                "lerope.alpha",
                "model.language_model.rotary_emb.alpha".into(),
            ),
            (
                "layers.3.attention.wq.weight",
                format!("{l}.self_attn.q_proj.weight"),
            ),
            (
                "layers.3.attention.wkv_a_with_mqa.weight",
                format!("{l}.self_attn.kv_a_proj_with_mqa.weight"),
            ),
            (
                "layers.3.attention.kv_a_norm.weight",
                format!("{l}.self_attn.kv_a_layernorm.weight"),
            ),
            (
                "layers.3.attention.wkv_b.weight",
                format!("{l}.self_attn.kv_b_proj.weight"),
            ),
            (
                "layers.3.attention.wo.weight",
                format!("{l}.self_attn.o_proj.weight"),
            ),
            (
                "layers.3.attention.ssmax_scaling.s",
                format!("{l}.self_attn.softmax_scaling.scale"),
            ),
            (
                "layers.3.attention.indexer.ssmax_scaling.b",
                format!("{l}.self_attn.indexer.softmax_scaling.bias"),
            ),
            (
                "layers.3.attention.indexer.wq_b.weight",
                format!("{l}.self_attn.indexer.wq_b.weight"),
            ),
            (
                "layers.3.attention.indexer.wk.weight",
                format!("{l}.self_attn.indexer.wk.weight"),
            ),
            (
                "layers.3.attention_norm.weight",
                format!("{l}.input_layernorm.weight"),
            ),
            (
                "layers.3.ffn_norm.weight",
                format!("{l}.post_attention_layernorm.weight"),
            ),
            (
                "layers.3.feed_forward.w1.weight",
                format!("{l}.mlp.gate_proj.weight"),
            ),
            ("layers.3.gate.weight", format!("{l}.mlp.gate.weight")),
            (
                "layers.3.experts.7.w3.weight",
                format!("{l}.mlp.experts.7.up_proj.weight"),
            ),
            (
                "layers.3.shared_experts.w2.weight",
                format!("{l}.mlp.shared_experts.down_proj.weight"),
            ),
        ] {
            assert_eq!(
                transformers_name(mistral).as_deref(),
                Some(hf.as_str()),
                "{mistral}"
            );
            assert_eq!(mistral_name(&hf).as_deref(), Some(mistral), "{hf}");
        }
        assert_eq!(transformers_name("vision_encoder.ln_pre.weight"), None);
        assert_eq!(transformers_name("patch_merger.merging_layer.weight"), None);
    }
}
