//! ModelConfig::from_json against transformers' own rules, family by family.

use serde_json::json;

use super::rope::parse_rope_scaling;
use super::*;

fn base(arch: &str) -> Value {
    json!({
        "architectures": [arch],
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_hidden_layers": 12,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "vocab_size": 1024,
        "max_position_embeddings": 131072,
    })
}

fn with(mut j: Value, extra: Value) -> Value {
    let (Value::Object(m), Value::Object(e)) = (&mut j, extra) else {
        unreachable!()
    };
    m.extend(e);
    j
}

#[test]
fn gemma3_legacy_config_gets_its_local_layers_and_ropes() {
    let j = with(
        base("Gemma3ForCausalLM"),
        json!({
            "query_pre_attn_scalar": 168,
            "sliding_window": 1024,
            "sliding_window_pattern": 6,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "hidden_activation": "gelu_pytorch_tanh",
        }),
    );
    let c = ModelConfig::from_json(&j).unwrap();
    let sliding: Vec<usize> = (0..12).filter(|&l| c.window_of(l).is_some()).collect();
    assert_eq!(sliding, [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]);
    assert_eq!(c.window_of(0), Some(1024));
    assert_eq!(c.rope_of(5).theta, 1e6);
    assert_eq!(
        c.rope_of(5).scaling,
        Some(RopeScaling::Linear { factor: 8.0 })
    );
    assert_eq!(c.rope_of(0).theta, 1e4);
    assert_eq!(c.rope_of(0).scaling, None);
    assert_eq!(c.attn_scale, 168f64.powf(-0.5));
    assert_eq!(c.mlp_activation, GatedActivation::GeluTanh);
    assert!(c.qk_norm == Some(QkNorm::Heads) && c.sandwich_norms && c.scaled_embeddings);
    assert_eq!(c.norm_offset, 1.0);
    assert!(c.tie_word_embeddings, "Gemma ties by default");
}

#[test]
fn multimodal_gemma3_reads_its_text_config_and_the_outer_dtype() {
    let j = json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "dtype": "bfloat16",
        "text_config": with(base("x"), json!({"dtype": "float32", "sliding_window": 512})),
        "vision_config": {"hidden_size": 1152},
    });
    let c = ModelConfig::from_json(&j).unwrap();
    assert_eq!(c.architecture, Architecture::Gemma3);
    assert_eq!(c.dtype, FloatType::Bf16);
    assert_eq!(c.hidden_size, 5376);
    let no_text = json!({"architectures": ["Gemma3ForConditionalGeneration"]});
    let e = ModelConfig::from_json(&no_text).unwrap_err();
    assert!(e.contains("text_config"), "{e}");
}

/// A multimodal checkpoint's language model is the family its `text_config.model_type`
/// names (Mistral 3 holds Mistral text, Qwen3-VL Qwen3's), the tie where the config is
/// silent the wrapper's; one no text family answers to is refused naming it.
#[test]
fn multimodal_text_model_type_decides_the_family() {
    let outer = |arch: &str, text_type: &str| {
        json!({
            "architectures": [arch],
            "text_config": with(base("x"), json!({"model_type": text_type})),
        })
    };
    for (arch, text_type, family) in [
        (
            "Mistral3ForConditionalGeneration",
            "mistral",
            Architecture::Mistral,
        ),
        (
            "Qwen3VLForConditionalGeneration",
            "qwen3_vl_text",
            Architecture::Qwen3,
        ),
        (
            "Gemma3ForConditionalGeneration",
            "gemma3_text",
            Architecture::Gemma3,
        ),
    ] {
        let c = ModelConfig::from_json(&outer(arch, text_type)).unwrap();
        assert_eq!(c.architecture, family, "{arch}");
        // Without `tie_word_embeddings`, the wrapper class's default: Mistral 3's and Gemma
        // 3's tie, Qwen3-VL's does not.
        assert_eq!(
            c.tie_word_embeddings,
            family != Architecture::Qwen3,
            "{arch}"
        );
    }
    let e =
        ModelConfig::from_json(&outer("Mistral3ForConditionalGeneration", "pixtral")).unwrap_err();
    assert!(
        e.contains("`pixtral`") && e.contains("text_config.model_type"),
        "{e}"
    );
}

/// Ministral 3 scales its queries by `1 + beta * ln(1 + floor(pos / original_max))`: 1 in
/// the first period; both keys required.
#[test]
fn ministral3_reads_its_query_scale() {
    let rope = json!({
        "type": "yarn", "rope_theta": 1e6, "factor": 16.0,
        "original_max_position_embeddings": 16384, "llama_4_scaling_beta": 0.1,
    });
    let j = with(
        base("Ministral3ForCausalLM"),
        json!({"rope_parameters": rope.clone()}),
    );
    let c = ModelConfig::from_json(&j).unwrap();
    let scale = c.query_scale.unwrap();
    assert_eq!((scale.beta, scale.period), (0.1, 16384));
    assert_eq!((scale.at(0), scale.at(16383)), (1.0, 1.0));
    let two_periods = 1.0 + 0.1 * 3.0f32.ln();
    assert!((scale.at(2 * 16384) - two_periods).abs() < 1e-7);
    let mut no_beta = rope;
    no_beta
        .as_object_mut()
        .unwrap()
        .remove("llama_4_scaling_beta");
    let j = with(
        base("Ministral3ForCausalLM"),
        json!({"rope_parameters": no_beta}),
    );
    let e = ModelConfig::from_json(&j).unwrap_err();
    assert!(e.contains("llama_4_scaling_beta"), "{e}");
}

/// Mistral 4: DeepSeek-V3's latent attention and mixture (no layer dense by default) under
/// a grouped softmax router without bias, and the queries scaled by position.
#[test]
fn mistral4_reads_latent_attention_its_router_and_query_scale() {
    let j = with(
        deepseek_v3(),
        json!({
            "architectures": ["Mistral4ForCausalLM"],
            "routed_scaling_factor": 1.5,
            "rope_parameters": {
                "rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0,
                "original_max_position_embeddings": 8192, "llama_4_scaling_beta": 0.1,
                "mscale": 1.0, "mscale_all_dim": 1.0,
            },
        }),
    );
    let mut j = j;
    j.as_object_mut().unwrap().remove("first_k_dense_replace");
    let c = ModelConfig::from_json(&j).unwrap();
    assert_eq!(c.architecture, Architecture::Mistral4);
    assert!(c.mla.is_some());
    let moe = c.moe.unwrap();
    assert!(!moe.selection_bias && moe.is_sparse(0));
    assert!(matches!(
        moe.router,
        Router::GroupedSoftmax { renormalize: true, scale, .. } if scale == 1.5
    ));
    assert_eq!(c.query_scale.map(|q| q.period), Some(8192));
}

/// Mistral Large 4: Mistral 4's latent attention without a query rank, every fourth layer
/// without RoPE by default (its latent heads then unrotated throughout), GLM-5's indexer with
/// its queries from the layer's input; `kv_source_layers` resolved as transformers keeps the
/// latents (one a kind, with RoPE or without, the last layer named a source overwriting it),
/// a source that is not an earlier layer of its own refused by name.
#[test]
fn mistral_large4_reads_its_layers_and_which_latents_they_reuse() {
    let mut j = with(
        deepseek_v3(),
        json!({
            "architectures": ["MistralLarge4TextModel"],
            "model_type": "mistral_large4_text",
            "num_hidden_layers": 8,
            "index_topk": 64, "index_head_dim": 128, "index_n_heads": 4,
        }),
    );
    j.as_object_mut().unwrap().remove("q_lora_rank");
    let c = ModelConfig::from_json(&j).unwrap();
    assert_eq!(c.architecture, Architecture::MistralLarge4);
    let m = c.mla.unwrap();
    assert_eq!(m.q_lora_rank, None);
    assert!(m.rope_interleave);
    assert!(c.indexer.as_ref().unwrap().query_from_input);
    assert_eq!(c.rms_norm_eps, 1e-5);
    let rotating: Vec<bool> = (0..8).map(|l| c.uses_rope(l)).collect();
    assert_eq!(rotating, [true, true, true, false, true, true, true, false]);
    assert_eq!(c.latent_dims(2), Some(m));
    let nope = c.latent_dims(3).unwrap();
    assert_eq!((nope.nope_dim, nope.rope_dim), (m.nope_dim + m.rope_dim, 0));
    assert_eq!(nope.qk_head_dim(), m.qk_head_dim());
    assert!((0..8).all(|l| c.latent_source(l) == LatentSource::Own));
    // Layer 5 names layer 0, but layer 4 (also with RoPE, a source of layer 6) stored its own
    // latent after it: transformers expands layer 4's. Layer 7 (no RoPE) reuses layer 3's.
    j["kv_source_layers"] = json!([0, 0, 2, 3, 4, 0, 4, 3]);
    let c = ModelConfig::from_json(&j).unwrap();
    use LatentSource::{Own, Reuses, Stores};
    let sources: Vec<LatentSource> = (0..8).map(|l| c.latent_source(l)).collect();
    assert_eq!(
        sources,
        [
            Stores,
            Reuses(0),
            Own,
            Stores,
            Stores,
            Reuses(4),
            Reuses(4),
            Reuses(3)
        ]
    );
    // A stage may not begin between a kept latent and a layer that reuses it.
    assert!(c.may_begin_stage(0) && c.may_begin_stage(3));
    assert!(!c.may_begin_stage(1) && !c.may_begin_stage(5) && !c.may_begin_stage(7));
    for bad in [
        json!([0, 0, 2, 3, 5, 5, 6, 7]),
        json!([0, 0, 1, 3, 4, 5, 6, 7]),
    ] {
        j["kv_source_layers"] = bad;
        let e = ModelConfig::from_json(&j).unwrap_err();
        assert!(
            e.contains("kv_source_layers") && (e.contains("layer 4") || e.contains("layer 2")),
            "{e}"
        );
    }
    j["kv_source_layers"] = json!([0, 1, 2, 3, 4, 5, 6, 2]);
    let e = ModelConfig::from_json(&j).unwrap_err();
    assert!(e.contains("layer 7") && e.contains("without RoPE"), "{e}");
}

#[test]
fn each_family_places_its_sliding_layers() {
    let gemma2 = with(base("Gemma2ForCausalLM"), json!({"sliding_window": 4096}));
    let c = ModelConfig::from_json(&gemma2).unwrap();
    assert_eq!(c.window_of(0), Some(4096));
    assert_eq!(c.window_of(1), None);
    let mistral = with(base("MistralForCausalLM"), json!({"sliding_window": 4096}));
    let c = ModelConfig::from_json(&mistral).unwrap();
    assert!((0..12).all(|l| c.window_of(l) == Some(4096)));
    let qwen =
        json!({"sliding_window": 32768, "use_sliding_window": true, "max_window_layers": 10});
    let c = ModelConfig::from_json(&with(base("Qwen2ForCausalLM"), qwen)).unwrap();
    assert_eq!(c.window_of(9), None);
    assert_eq!(c.window_of(10), Some(32768));
    let off = json!({"sliding_window": 0, "use_sliding_window": false});
    let c = ModelConfig::from_json(&with(base("Qwen2MoeForCausalLM"), off));
    assert!(
        c.is_err_and(|e| e.contains("num_experts")),
        "only the MoE keys are missing"
    );
}

#[test]
fn unimplemented_values_are_refused_by_key_and_value() {
    let bad_type = json!({"sliding_window": 64, "layer_types": vec!["chunked_attention"; 12]});
    let e = ModelConfig::from_json(&with(base("Gemma3ForCausalLM"), bad_type)).unwrap_err();
    assert!(
        e.contains("layer_types") && e.contains("chunked_attention"),
        "{e}"
    );
    let short = json!({"sliding_window": 64, "layer_types": ["full_attention"]});
    let e = ModelConfig::from_json(&with(base("Gemma3ForCausalLM"), short)).unwrap_err();
    assert!(e.contains("layer_types has 1 entries for 12 layers"), "{e}");
    let no_window = json!({"layer_types": vec!["sliding_attention"; 12]});
    let e = ModelConfig::from_json(&with(base("LlamaForCausalLM"), no_window)).unwrap_err();
    assert!(e.contains("sliding_window is null"), "{e}");
    let rope = json!({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}});
    let e = ModelConfig::from_json(&with(base("LlamaForCausalLM"), rope)).unwrap_err();
    assert!(e.contains("rope_scaling type `dynamic`"), "{e}");
    let yarn = json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}});
    let e = ModelConfig::from_json(&with(base("Qwen3ForCausalLM"), yarn)).unwrap_err();
    assert!(e.contains("original_max_position_embeddings"), "{e}");
    let act = json!({"hidden_act": "relu"});
    let e = ModelConfig::from_json(&with(base("LlamaForCausalLM"), act)).unwrap_err();
    assert!(e.contains("hidden_act `relu`"), "{e}");
    let cap = json!({"attn_logit_softcapping": -1.0});
    let e = ModelConfig::from_json(&with(base("Gemma2ForCausalLM"), cap)).unwrap_err();
    assert!(e.contains("attn_logit_softcapping"), "{e}");
    let bidi = json!({"use_bidirectional_attention": true});
    let e = ModelConfig::from_json(&with(base("Gemma3ForCausalLM"), bidi)).unwrap_err();
    assert!(e.contains("use_bidirectional_attention"), "{e}");
    let longrope = json!({
        "partial_rotary_factor": 0.75,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]},
    });
    let e = ModelConfig::from_json(&with(base("Phi3ForCausalLM"), longrope)).unwrap_err();
    assert!(
        e.contains("short_factor/long_factor have 1/1 entries"),
        "{e}"
    );
}

#[test]
fn yarn_attention_factor_follows_transformers() {
    let yarn = |extra: Value| {
        let mut s = json!({"rope_type": "yarn", "factor": 40.0,
            "original_max_position_embeddings": 4096});
        if let (Value::Object(m), Value::Object(e)) = (&mut s, extra) {
            m.extend(e);
        }
        match parse_rope_scaling(&s, 163_840, None).unwrap() {
            Some(RopeScaling::Yarn {
                attention_factor, ..
            }) => attention_factor,
            other => panic!("{other:?}"),
        }
    };
    // get_mscale(40) = 0.1 ln 40 + 1; DeepSeek-V3's mscale = mscale_all_dim = 1 gives 1.
    assert!((yarn(json!({})) - (0.1 * 40f64.ln() + 1.0)).abs() < 1e-15);
    assert_eq!(yarn(json!({"mscale": 1.0, "mscale_all_dim": 1.0})), 1.0);
    assert_eq!(yarn(json!({"attention_factor": 0.5})), 0.5);
}

/// DeepSeek-V3's published config (deepseek-ai/DeepSeek-V3 config.json).
fn deepseek_v3() -> Value {
    json!({
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_shared_experts": 1,
        "n_routed_experts": 256,
        "routed_scaling_factor": 2.5,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "qk_nope_head_dim": 128,
        "n_group": 8,
        "topk_group": 4,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "norm_topk_prob": true,
        "max_position_embeddings": 163840,
        "rope_scaling": {
            "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"
        },
        "rope_theta": 10000,
        "vocab_size": 129280,
        "torch_dtype": "bfloat16",
    })
}

#[test]
fn deepseek_v3_reads_latent_attention_and_its_softmax_scale() {
    let c = ModelConfig::from_json(&deepseek_v3()).unwrap();
    let m = c.mla.unwrap();
    assert_eq!(
        (
            m.q_lora_rank,
            m.kv_lora_rank,
            m.nope_dim,
            m.rope_dim,
            m.v_head_dim
        ),
        (Some(1536), 512, 128, 64, 128)
    );
    assert!(m.rope_interleave);
    // Heads of 128 + 64 for queries and keys; RoPE over the 64; keys per head.
    assert_eq!((c.head_dim, c.rotary_dim, c.num_kv_heads), (192, 64, 128));
    // transformers: 192^-0.5 * yarn_get_mscale(40, 1.0)^2.
    let mscale = 0.1 * 40f64.ln() + 1.0;
    assert!((c.attn_scale - 192f64.powf(-0.5) * mscale * mscale).abs() < 1e-15);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(moe.sparse_layers.iter().filter(|&&s| !s).count(), 3);
    assert_eq!(
        moe.router,
        Router::Sigmoid {
            groups: 8,
            top_groups: 4,
            renormalize: true,
            scale: 2.5,
            eps: 1e-20,
        }
    );
    // 671B parameters, 37B activated per token (the DeepSeek-V3 report; norms and the
    // selection biases, below 0.01 %, are not counted here).
    let (all, active) = (c.num_params() as f64, c.active_params() as f64);
    assert!((all / 671e9 - 1.0).abs() < 5e-3, "{all}");
    assert!((active / 37e9 - 1.0).abs() < 2e-2, "{active}");

    // transformers 5's own `head_dim` (its rotated part) does not override the heads; no
    // low-rank query; plain RoPE keeps the plain scale.
    let mut j = deepseek_v3();
    j["head_dim"] = json!(64);
    j["q_lora_rank"] = Value::Null;
    j["rope_scaling"] = Value::Null;
    j["rope_interleave"] = json!(false);
    let c = ModelConfig::from_json(&j).unwrap();
    let m = c.mla.unwrap();
    assert_eq!(
        (m.q_lora_rank, m.rope_interleave, c.head_dim),
        (None, false, 192)
    );
    assert_eq!(c.attn_scale, 192f64.powf(-0.5));

    for (key, bad) in [
        ("kv_lora_rank", json!(0)),
        ("qk_rope_head_dim", json!(63)),
        ("v_head_dim", json!(256)),
        ("qk_nope_head_dim", Value::Null),
    ] {
        let mut j = deepseek_v3();
        j[key] = bad.clone();
        let e = ModelConfig::from_json(&j).unwrap_err();
        assert!(e.contains(key), "{key} = {bad}: {e}");
    }
}

/// LFM2-350M's config as published: the MLP width transformers' `Lfm2MLP` derives (two thirds
/// of `block_ff_dim`, rounded up to 256: 4608), the attention layers from `full_attn_idxs`,
/// `norm_eps`, `tie_embedding`, LFM2's module names.
#[test]
fn lfm2_derives_its_mlp_width_layers_and_names() {
    let j = json!({
        "architectures": ["Lfm2ForCausalLM"],
        "block_auto_adjust_ff_dim": true,
        "block_dim": 1024,
        "block_ff_dim": 6656,
        "block_ffn_dim_multiplier": 1.0,
        "block_multiple_of": 256,
        "conv_L_cache": 3,
        "conv_bias": false,
        "full_attn_idxs": [2, 5, 8, 10, 12, 14],
        "hidden_size": 1024,
        "max_position_embeddings": 128000,
        "model_type": "lfm2",
        "norm_eps": 1e-05,
        "num_attention_heads": 16,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "rope_theta": 1000000.0,
        "tie_embedding": true,
        "vocab_size": 65536,
    });
    let c = ModelConfig::from_json(&j).unwrap();
    assert_eq!(c.intermediate_size, 4608);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert!(c.tie_word_embeddings && c.qk_norm == Some(QkNorm::Heads));
    assert_eq!(c.rope.theta, 1e6);
    let conv: Vec<usize> = (0..16).filter(|&l| !c.is_short_conv(l)).collect();
    assert_eq!(conv, [2, 5, 8, 10, 12, 14]);
    assert_eq!(
        c.short_conv,
        Some(ShortConvConfig {
            taps: 3,
            bias: false
        })
    );
    assert_eq!(c.names, ModuleNames::LFM2);
    assert_eq!(c.final_norm_name(), "model.embedding_norm.weight");
    // Without the multiplier no rounding; without auto-adjust the width as stated.
    let no_multiplier = with(j.clone(), json!({"block_ffn_dim_multiplier": null}));
    assert_eq!(
        ModelConfig::from_json(&no_multiplier)
            .unwrap()
            .intermediate_size,
        4437
    );
    let stated = with(j.clone(), json!({"block_auto_adjust_ff_dim": false}));
    assert_eq!(
        ModelConfig::from_json(&stated).unwrap().intermediate_size,
        6656
    );
    let mut types = vec![json!("conv"); 16];
    types[3] = json!("mamba");
    let bad = with(j, json!({ "layer_types": types }));
    let e = ModelConfig::from_json(&bad).unwrap_err();
    assert!(
        e.contains("\"mamba\"") && e.contains("full_attention, conv"),
        "{e}"
    );
}

/// Nemotron-H-8B's config as published (`hybrid_override_pattern`, `attention_head_dim`, the
/// Mamba-2 keys): its blocks one part each, no positions, relu^2, dt clamped below only.
#[test]
fn nemotron_h_reads_its_pattern_and_mamba_geometry() {
    let pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-";
    let j = json!({
        "architectures": ["NemotronHForCausalLM"],
        "attention_head_dim": 128,
        "chunk_size": 128,
        "conv_kernel": 4,
        "hidden_size": 4096,
        "hybrid_override_pattern": pattern,
        "intermediate_size": 21504,
        "layer_norm_epsilon": 1e-05,
        "mamba_head_dim": 64,
        "mamba_hidden_act": "silu",
        "mamba_num_heads": 128,
        "max_position_embeddings": 8192,
        "mlp_hidden_act": "relu2",
        "model_type": "nemotron_h",
        "n_groups": 8,
        "num_attention_heads": 32,
        "num_hidden_layers": 52,
        "num_key_value_heads": 8,
        "ssm_state_size": 128,
        "time_step_limit": [0.0, "Infinity"],
        "time_step_min": 0.001,
        "use_conv_bias": true,
        "vocab_size": 131072,
    });
    let c = ModelConfig::from_json(&j).unwrap();
    assert_eq!(c.num_layers, 52);
    assert_eq!((c.head_dim, c.rotary_dim, c.rms_norm_eps), (128, 0, 1e-5));
    assert_eq!(c.mlp_activation, GatedActivation::Relu2);
    let count = |ch| pattern.chars().filter(|&p| p == ch).count();
    assert_eq!((0..52).filter(|&l| c.is_mamba(l)).count(), count('M'));
    assert_eq!((0..52).filter(|&l| !c.has_mixer(l)).count(), count('-'));
    assert!((0..52).all(|l| c.has_mixer(l) != c.has_mlp(l)));
    let m = c.mamba.unwrap();
    assert_eq!(m.inner(), 8192);
    // in_proj: z (8192), x/B/C (8192 + 2 x 8 x 128), dt (128), as in the checkpoint.
    assert_eq!(m.in_proj_width(), 8192 + 8192 + 2048 + 128);
    assert_eq!((m.dt_min, m.dt_max), (1e-3, f32::INFINITY));
    assert_eq!(c.names, ModuleNames::NEMOTRON_H);
}

/// Falcon-H1 0.5B's published shape (hidden 1024, 24 Mamba heads of 64 over `mamba_d_ssm` 1536,
/// `head_dim` 64 where hidden / heads is 128), its dt limits as transformers 4 and 5 write them,
/// and the muP vector over `in_proj`'s five parts.
#[test]
fn falcon_h1_reads_its_mamba_width_limits_and_multipliers() {
    let j = json!({
        "architectures": ["FalconH1ForCausalLM"],
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "num_hidden_layers": 36,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 32784,
        "max_position_embeddings": 16384,
        "mamba_d_ssm": 1536,
        "mamba_n_heads": 24,
        "mamba_d_head": 64,
        "mamba_d_state": 128,
        "mamba_n_groups": 1,
        "mamba_rms_norm": false,
        "key_multiplier": 0.390625,
        "ssm_multipliers": [0.35, 0.25, 0.35, 0.5, 0.35],
        "time_step_limit": [0.0, {"__float__": "Infinity"}],
    });
    let c = ModelConfig::from_json(&j).expect("config");
    assert_eq!(c.architecture, Architecture::FalconH1);
    assert!(c.parallel_mamba);
    assert_eq!(c.head_dim, 64);
    assert!((c.attn_scale - 0.390625 / 8.0).abs() < 1e-12);
    let m = c.mamba.expect("mamba");
    assert_eq!((m.heads, m.head_dim, m.state, m.groups), (24, 64, 128, 1));
    assert_eq!(m.norm, MambaNorm::Ungated);
    assert_eq!((m.dt_min, m.dt_max), (0.0, f32::INFINITY));
    let u = c.multipliers.expect("multipliers");
    assert_eq!((u.embedding, u.mlp_gate, u.mlp_down), (1.0, 1.0, 1.0));
    let scales = u.in_proj_scales(&m);
    assert_eq!(scales.len(), m.in_proj_width());
    // z and x 1536 each, B and C 128 each, dt one per head.
    assert_eq!(
        [
            scales[0],
            scales[1536],
            scales[3072],
            scales[3200],
            scales[3328]
        ],
        [0.35, 0.25, 0.35, 0.5, 0.35]
    );
    let limited = with(
        j.clone(),
        json!({"time_step_limit": [0.001, 0.1], "mamba_d_head": "auto", "mamba_rms_norm": true}),
    );
    let c = ModelConfig::from_json(&limited).expect("config");
    let m = c.mamba.expect("mamba");
    assert_eq!((m.dt_min, m.dt_max, m.head_dim), (0.001, 0.1, 64));
    // transformers' default: the norm before the gate.
    assert_eq!(m.norm, MambaNorm::NormFirst);
    let reversed = with(j, json!({"time_step_limit": [1.0, 0.5]}));
    let err = ModelConfig::from_json(&reversed).unwrap_err();
    assert!(err.contains("time_step_limit"), "{err}");
}

/// Granite 4.0-H-Micro's published shape (40 layers, `attention` at 5, 15, 25 and 35, the rest
/// `mamba`; 64 Mamba heads of 64 from `mamba_expand` 2; no experts: its shared MLP of 8192 is
/// every layer's MLP) and -Small's mixture (72 experts, top 10, width 768, shared 1536).
#[test]
fn granite_4_h_reads_its_layers_mixture_and_multipliers() {
    let types: Vec<&str> = (0..40)
        .map(|l| if l % 10 == 5 { "attention" } else { "mamba" })
        .collect();
    let micro = json!({
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "shared_intermediate_size": 8192,
        "num_hidden_layers": 40,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 100352,
        "max_position_embeddings": 131072,
        "layer_types": types,
        "mamba_n_heads": 64,
        "mamba_d_head": 64,
        "mamba_d_state": 128,
        "mamba_expand": 2,
        "num_local_experts": 0,
        "position_embedding_type": "nope",
        "embedding_multiplier": 12,
        "logits_scaling": 8,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.015625,
    });
    let c = ModelConfig::from_json(&micro).expect("config");
    assert_eq!(c.architecture, Architecture::GraniteMoeHybrid);
    assert!(c.moe.is_none());
    assert_eq!(
        (c.intermediate_size, c.rotary_dim, c.attn_scale),
        (8192, 0, 0.015625)
    );
    let attending: Vec<usize> = (0..40).filter(|&l| !c.is_mamba(l)).collect();
    assert_eq!(attending, [5, 15, 25, 35]);
    let m = c.mamba.expect("mamba");
    assert_eq!((m.heads, m.head_dim, m.inner()), (64, 64, 4096));
    assert_eq!(m.norm, MambaNorm::GateFirst);
    let u = c.multipliers.expect("multipliers");
    assert_eq!(
        (u.embedding, u.lm_head, u.attention_out),
        (12.0, 0.125, 0.22)
    );
    assert_eq!((u.ssm_out, u.mlp_down, u.attention_in), (0.22, 0.22, 1.0));
    let small = with(
        micro,
        json!({"hidden_size": 4096, "intermediate_size": 768, "shared_intermediate_size": 1536,
               "num_local_experts": 72, "num_experts_per_tok": 10, "mamba_n_heads": 128,
               "position_embedding_type": "rope", "rope_theta": 10000000}),
    );
    let c = ModelConfig::from_json(&small).expect("config");
    let moe = c.moe.expect("experts");
    assert_eq!((moe.num_experts, moe.experts_per_token), (72, 10));
    assert_eq!(
        (moe.expert_intermediate_size, c.intermediate_size),
        (768, 1536)
    );
    assert_eq!(moe.router, Router::TopKSoftmax);
    assert_eq!(
        moe.shared_expert.map(|s| (s.intermediate_size, s.gated)),
        Some((1536, false))
    );
    // hidden 4096 over 32 heads.
    assert_eq!(c.rotary_dim, 128);
}

/// DeepSeek-V3.2-Exp's published config: DeepSeek-V3's and the indexer's keys.
fn deepseek_v32() -> Value {
    let mut j = deepseek_v3();
    j["architectures"] = json!(["DeepseekV32ForCausalLM"]);
    j["model_type"] = json!("deepseek_v32");
    j["index_topk"] = json!(2048);
    j["index_head_dim"] = json!(128);
    j["index_n_heads"] = json!(64);
    j
}

#[test]
fn deepseek_v32_reads_its_indexer() {
    let c = ModelConfig::from_json(&deepseek_v32()).unwrap();
    assert_eq!(c.architecture, Architecture::DeepseekV32);
    let ix = c.indexer.as_ref().unwrap();
    assert_eq!((ix.heads, ix.head_dim, ix.top_k), (64, 128, 2048));
    // Its RoPE over halves, the attention's interleaved whatever the key says.
    assert!(!ix.rope_interleave);
    assert!(ix.own_selection.iter().all(|&own| own));
    let mut j = deepseek_v32();
    j["rope_interleave"] = json!(false);
    assert!(
        ModelConfig::from_json(&j)
            .unwrap()
            .mla
            .unwrap()
            .rope_interleave
    );
    // The indexers' weights: 61 x (1536 x 8192 + 7168 x (128 + 64)) beyond DeepSeek-V3.
    let v3 = ModelConfig::from_json(&deepseek_v3()).unwrap();
    let per_layer = 1536 * 8192 + 7168 * (128 + 64);
    assert_eq!(c.num_params() - v3.num_params(), 61 * per_layer);
    // transformers' own keys: `indexed_attention` layers, `mlp_layer_types`.
    j["layer_types"] = json!(vec!["indexed_attention"; 61]);
    let mut mlp = vec!["sparse"; 61];
    mlp[..5].fill("dense");
    j["mlp_layer_types"] = json!(mlp);
    let c = ModelConfig::from_json(&j).unwrap();
    assert_eq!(
        c.moe.unwrap().sparse_layers.iter().filter(|&&s| !s).count(),
        5
    );
    for (key, bad, says) in [
        (
            "layer_types",
            json!(vec!["sliding_attention"; 61]),
            "layer_types entry",
        ),
        (
            "mlp_layer_types",
            json!(vec!["moe"; 61]),
            "mlp_layer_types entry",
        ),
        (
            "mlp_layer_types",
            json!(["dense"]),
            "1 entries for 61 layers",
        ),
        ("index_topk", json!(0), "`index_topk` is 0"),
        (
            "index_head_dim",
            json!(32),
            "narrower than its rotated part",
        ),
        ("q_lora_rank", Value::Null, "q_lora_rank is null"),
    ] {
        let mut j = deepseek_v32();
        j[key] = bad;
        let e = ModelConfig::from_json(&j).unwrap_err();
        assert!(e.contains(says), "{key}: {e}");
    }
}

#[test]
fn glm5_reads_which_layers_share_a_selection() {
    let mut j = deepseek_v32();
    j["architectures"] = json!(["GlmMoeDsaForCausalLM"]);
    j["model_type"] = json!("glm_moe_dsa");
    j["num_hidden_layers"] = json!(6);
    let own = |j: &Value| ModelConfig::from_json(j).map(|c| c.indexer.unwrap().own_selection);
    // transformers' default: every layer its own indexer (`index_topk_freq` 1).
    assert_eq!(own(&j).unwrap(), vec![true; 6]);
    let c = ModelConfig::from_json(&j).unwrap();
    assert!(c.indexer.unwrap().rope_interleave);
    // Every 3rd layer from the offset 2: transformers' `max(i - 2 + 1, 0) % 3 == 0`.
    j["index_topk_freq"] = json!(3);
    assert_eq!(own(&j).unwrap(), [true, true, false, false, true, false]);
    j["index_topk_pattern"] = json!("FSSFFS");
    assert_eq!(own(&j).unwrap(), [true, false, false, true, true, false]);
    j["indexer_types"] = json!(["full", "full", "shared", "full", "shared", "shared"]);
    assert_eq!(own(&j).unwrap(), [true, true, false, true, false, false]);
    for (key, bad, says) in [
        (
            "indexer_types",
            json!(vec!["shared"; 6]),
            "layer 0 is `shared`",
        ),
        (
            "indexer_types",
            json!(["full", "sparse", "full", "full", "full", "full"]),
            "\"sparse\"",
        ),
        ("indexer_types", json!(["full"]), "1 entries for 6 layers"),
        ("index_topk_pattern", json!("FSX"), "letter `X`"),
    ] {
        let mut j = j.clone();
        if key != "indexer_types" {
            j.as_object_mut().unwrap().remove("indexer_types");
        }
        j[key] = bad;
        let e = own(&j).unwrap_err();
        assert!(e.contains(says), "{key}: {e}");
    }
}

/// Gemma 4 as its published configs say it (transformers' `Gemma4TextConfig.__post_init__`):
/// `global_head_dim` and `num_global_key_value_heads` (under `attention_k_eq_v`) for the
/// full-attention layers, the last layer full whatever the pattern, a window of 512, a
/// softmax scale of 1, `w` norms, per-layer inputs of 256 unless 0.
#[test]
fn gemma4_resolves_its_layers_as_transformers_does() {
    let large = with(
        base("Gemma4ForCausalLM"),
        json!({
            "global_head_dim": 512,
            "num_global_key_value_heads": 4,
            "attention_k_eq_v": true,
            "hidden_size_per_layer_input": 0,
            "layer_types": vec!["sliding_attention"; 12],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1000000.0},
            },
        }),
    );
    let c = ModelConfig::from_json(&large).unwrap();
    assert_eq!(c.layer_types[11], LayerAttention::Full);
    assert_eq!(c.sliding_window, Some(512));
    assert_eq!((c.attn_scale, c.norm_offset), (1.0, 0.0));
    // `hidden_activation` unsaid: Gemma4TextConfig's default.
    assert_eq!(c.mlp_activation, GatedActivation::GeluTanh);
    let full = HeadShape {
        head_dim: 512,
        kv_heads: 4,
    };
    assert_eq!(c.heads_of(11), full);
    assert_eq!(
        c.heads_of(0),
        HeadShape {
            head_dim: 128,
            kv_heads: 16
        }
    );
    assert!(c.values_from_keys(11) && !c.values_from_keys(0));
    assert_eq!(c.rotary_dims(), [512, 128]);
    assert_eq!(
        c.rope.scaling,
        Some(RopeScaling::Proportional {
            fraction: 0.25,
            factor: 1.0
        })
    );
    let g = c.gemma4.as_ref().unwrap();
    assert!(g.per_layer_inputs.is_none() && g.kv_source.iter().all(Option::is_none));
    // Without `attention_k_eq_v` the full layers keep the sliding layers' key/value heads.
    let mut own_values = large.clone();
    own_values["attention_k_eq_v"] = json!(false);
    let c = ModelConfig::from_json(&own_values).unwrap();
    assert_eq!(c.heads_of(11).kv_heads, 16);
    assert!(!c.values_from_keys(11));

    // E models: the default pattern (every sixth layer full), the last 4 layers reusing the
    // last earlier layer of their kind, double-wide there, per-layer inputs of 256.
    let e = with(
        base("Gemma4ForCausalLM"),
        json!({"num_kv_shared_layers": 4, "use_double_wide_mlp": true}),
    );
    let c = ModelConfig::from_json(&e).unwrap();
    let full: Vec<usize> = (0..12).filter(|&l| c.window_of(l).is_none()).collect();
    assert_eq!(full, [5, 11]);
    let sources: Vec<Option<usize>> = (0..12).map(|l| c.kv_source(l)).collect();
    let mut want = vec![None; 8];
    want.extend([Some(7), Some(7), Some(7), Some(5)]);
    assert_eq!(sources, want);
    assert_eq!((c.mlp_width(7), c.mlp_width(8)), (21504, 43008));
    let p = c.gemma4.as_ref().unwrap().per_layer_inputs.unwrap();
    assert_eq!((p.width, p.vocab), (256, 262_144));

    for (edit, says) in [
        (
            json!({"use_bidirectional_attention": "all"}),
            "use_bidirectional_attention",
        ),
        (
            json!({"num_kv_shared_layers": 12}),
            "num_kv_shared_layers 12",
        ),
        (
            json!({"per_layer_config": {"99": {"head_dim": 512}}}),
            "per_layer_config names layer `99`",
        ),
        (
            json!({"per_layer_config": {"0": {"head_dim": 512}}}),
            "a sliding layer",
        ),
        (
            json!({"per_layer_config": {"5": {"head_dim": 512}}}),
            "1 of the 2 full-attention layers",
        ),
        (
            json!({"per_layer_config": {"5": {"sliding_window": 4}}}),
            "per_layer_config.5.sliding_window",
        ),
    ] {
        let e = ModelConfig::from_json(&with(base("Gemma4ForCausalLM"), edit.clone())).unwrap_err();
        assert!(e.contains(says), "{edit}: {e}");
    }
}

/// Llama4TextConfig's `__post_init__`: RoPE on all but every `no_rope_layer_interval`-th
/// layer (an empty `no_rope_layers` as published), chunked attention there, the temperature
/// of the others from (pos + 1) / floor_scale, mixtures every `interleave_moe_layer_step`-th
/// layer beside an expert-wide shared expert; the text behind `Llama4ForConditionalGeneration`.
#[test]
fn llama4_resolves_its_layers_as_transformers_does() {
    let text = with(
        base("Llama4ForCausalLM"),
        json!({
            "model_type": "llama4_text",
            "intermediate_size": 8192,
            "intermediate_size_mlp": 16384,
            "num_local_experts": 16,
            "num_experts_per_tok": 1,
            "no_rope_layers": [],
            "attn_temperature_tuning": 4,
            "rope_scaling": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 1.0, "original_max_position_embeddings": 8192},
        }),
    );
    let scout = json!({
        "architectures": ["Llama4ForConditionalGeneration"],
        "text_config": text,
        "vision_config": {"hidden_size": 1408},
    });
    let c = ModelConfig::from_json(&scout).unwrap();
    assert_eq!(c.architecture, Architecture::Llama4);
    let rotating: Vec<usize> = (0..12).filter(|&l| c.uses_rope(l)).collect();
    assert_eq!(rotating, [0, 1, 2, 4, 5, 6, 8, 9, 10]);
    let chunked: Vec<usize> = (0..12).filter(|&l| c.chunk_of(l) == Some(8192)).collect();
    assert_eq!(chunked, rotating);
    assert_eq!(c.layer_types[3], LayerAttention::Full);
    assert!(c.rope_interleaved && c.qk_norm == Some(QkNorm::Weightless));
    assert_eq!((c.rope.theta, c.rms_norm_eps), (500_000.0, 1e-5));
    let t = c.llama4.as_ref().unwrap().temperature.unwrap();
    assert_eq!((t.at(8190), t.at(8191)), (1.0, 1.0 + 0.1 * 2f32.ln()));
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(c.intermediate_size, 16384);
    assert_eq!(
        (moe.expert_intermediate_size, moe.router),
        (8192, Router::TopKSigmoid)
    );
    assert!(moe.weights_on_input && moe.sparse_layers.iter().all(|&s| s));
    assert_eq!(
        moe.shared_expert,
        Some(SharedExpert {
            intermediate_size: 8192,
            gated: false
        })
    );
    // A branch may not pass a chunk boundary.
    assert_eq!(c.branch_rows_limit(), Some(8192));

    // Maverick's: mixtures every second layer, no q/k norms, no temperature.
    let maverick = with(
        scout["text_config"].clone(),
        json!({"interleave_moe_layer_step": 2, "use_qk_norm": false,
               "attn_temperature_tuning": false}),
    );
    let c = ModelConfig::from_json(&maverick).unwrap();
    let sparse: Vec<usize> = (0..12)
        .filter(|&l| c.moe.as_ref().unwrap().is_sparse(l))
        .collect();
    assert_eq!(sparse, [1, 3, 5, 7, 9, 11]);
    let l4 = c.llama4.as_ref().unwrap();
    assert!(c.qk_norm.is_none() && l4.temperature.is_none());

    for (edit, says) in [
        (
            json!({"no_rope_layers": [1, 0]}),
            "no_rope_layers has 2 entries",
        ),
        (json!({"no_rope_layers": vec![2; 12]}), "each 0 or 1"),
        (json!({"moe_layers": [12]}), "moe_layers lists layer 12"),
        (
            json!({"interleave_moe_layer_step": 0}),
            "interleave_moe_layer_step 0",
        ),
        (
            json!({"attention_chunk_size": null, "layer_types": vec!["chunked_attention"; 12]}),
            "attention_chunk_size is null",
        ),
        (
            json!({"layer_types": vec!["sliding_attention"; 12]}),
            "chunked_attention, full_attention",
        ),
    ] {
        let e =
            ModelConfig::from_json(&with(scout["text_config"].clone(), edit.clone())).unwrap_err();
        assert!(e.contains(says), "{edit}: {e}");
    }
}

/// Kimi-Linear-48B-A3B's config as moonshotai publishes it: the layer kinds in
/// `linear_attn_config` (counted from 1), transformers' `attribute_map` names.
fn kimi_linear() -> Value {
    let full = [4, 8, 12, 16, 20, 24, 27];
    let kda: Vec<u64> = (1..=27).filter(|l| !full.contains(l)).collect();
    json!({
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "moe_intermediate_size": 1024,
        "num_hidden_layers": 27,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": 72,
        "kv_lora_rank": 512,
        "q_lora_rank": null,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "mla_use_nope": true,
        "linear_attn_config": {
            "full_attn_layers": full,
            "kda_layers": kda,
            "num_heads": 32,
            "head_dim": 128,
            "short_conv_kernel_size": 4,
        },
        "num_experts": 256,
        "num_experts_per_token": 8,
        "num_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_renormalize": true,
        "moe_router_activation_func": "sigmoid",
        "num_expert_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 2.446,
        "model_max_length": 1048576,
        "vocab_size": 163840,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false,
    })
}

#[test]
fn kimi_linear_reads_its_published_keys_as_transformers_does() {
    let c = ModelConfig::from_json(&kimi_linear()).unwrap();
    // transformers' KimiLinearConfig: `layer_types[l - 1]` for each listed layer.
    let attending: Vec<usize> = (0..27).filter(|&l| !c.is_delta_net(l)).collect();
    assert_eq!(attending, [3, 7, 11, 15, 19, 23, 26]);
    let d = c.delta_net.unwrap();
    assert_eq!(d.layout, DeltaNetLayout::Kimi);
    assert_eq!((d.k_heads, d.v_heads, d.k_dim, d.v_dim), (32, 32, 128, 128));
    assert_eq!(d.conv_kernel, 4);
    // Latent attention without RoPE, scaled by the whole query/key head.
    let m = c.mla.unwrap();
    assert_eq!((m.nope_dim, m.rope_dim, m.v_head_dim), (128, 64, 128));
    assert_eq!((c.head_dim, c.rotary_dim), (192, 0));
    assert!((0..27).all(|l| !c.uses_rope(l)));
    assert_eq!(c.attn_scale, 192f64.powf(-0.5));
    assert!(c.qk_norm.is_none() && !c.attn_output_gate && c.norm_offset == 0.0);
    assert_eq!(c.max_position_embeddings, 1048576);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.experts_per_token), (256, 8));
    assert_eq!(moe.naming, ExpertNaming::KimiLinear);
    assert_eq!(
        moe.router,
        Router::Sigmoid {
            groups: 1,
            top_groups: 1,
            renormalize: true,
            scale: 2.446,
            eps: 1e-20,
        }
    );
    assert!(moe.selection_bias);
    assert_eq!(moe.shared_expert.map(|s| s.intermediate_size), Some(1024));
    assert!(!moe.is_sparse(0) && (1..27).all(|l| moe.is_sparse(l)));
    assert_eq!(c.names.mlp, "block_sparse_moe");

    // transformers' own names (what `save_pretrained` writes) read the same.
    let types: Vec<&str> = (0..27)
        .map(|l| match attending.contains(&l) {
            true => "full_attention",
            false => "linear_attention",
        })
        .collect();
    let mlp_types: Vec<&str> = (0..27)
        .map(|l| if l == 0 { "dense" } else { "sparse" })
        .collect();
    let saved = with(
        kimi_linear(),
        json!({
            "layer_types": types,
            "mlp_layer_types": mlp_types,
            "linear_attn_config": null,
            "linear_num_heads": 32,
            "linear_head_dim": 128,
        }),
    );
    let s = ModelConfig::from_json(&saved).unwrap();
    assert_eq!(s.layer_types, c.layer_types);
    assert_eq!(s.moe, c.moe);
    // Without any list, transformers' default: layer i attends where i > 0 and i % 4 == 0.
    let mut bare = kimi_linear();
    bare.as_object_mut().unwrap().remove("linear_attn_config");
    let b = ModelConfig::from_json(&bare).unwrap();
    let attending: Vec<usize> = (0..27).filter(|&l| !b.is_delta_net(l)).collect();
    assert_eq!(attending, [4, 8, 12, 16, 20, 24]);

    for (edit, needles) in [
        (
            json!({"moe_router_activation_func": "softmax"}),
            &["moe_router_activation_func", "softmax"][..],
        ),
        (json!({"mla_use_nope": false}), &["mla_use_nope"]),
        (
            json!({"linear_attn_config": {"full_attn_layers": [4, 28], "kda_layers": [1]}}),
            &["full_attn_layers", "layer 28 of 27"],
        ),
        (
            json!({"linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3]}}),
            &["layer 5", "neither"],
        ),
    ] {
        let err = ModelConfig::from_json(&with(kimi_linear(), edit)).unwrap_err();
        for n in needles {
            assert!(err.contains(n), "{err}: no {n}");
        }
    }
}

/// DeepSeek-V4-Flash's published config (legacy keys: `compress_ratios`, `num_hash_layers`,
/// `qk_rope_head_dim`, a flat YaRN `rope_scaling`) read as `DeepseekV4Config.__post_init__`
/// resolves it, and transformers' nested form of the same.
#[test]
fn deepseek_v4_resolves_its_layers_as_transformers_does() {
    let flash = json!({
        "architectures": ["DeepseekV4ForCausalLM"],
        "hidden_size": 4096,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 4,
        "num_attention_heads": 64,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 1024,
        "vocab_size": 129280,
        "max_position_embeddings": 1048576,
        "n_routed_experts": 256,
        "num_experts_per_tok": 6,
        "n_shared_experts": 1,
        "compress_ratios": [0, 0, 4, 128],
        "num_hash_layers": 3,
        "compress_rope_theta": 160000.0,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "o_groups": 8,
        "o_lora_rank": 1024,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": 512,
        "swiglu_limit": 10.0,
    });
    for (key, bad, says) in [
        ("o_groups", json!(7), "`o_groups` 7 does not divide"),
        (
            "index_topk",
            json!(1u64 << 30),
            "exceeds max_position_embeddings",
        ),
        ("hidden_size", json!(0), "`hidden_size` is 0"),
        ("swiglu_limit", json!(-1.0), "`swiglu_limit` is -1"),
    ] {
        let mut j = flash.clone();
        j[key] = bad;
        let e = ModelConfig::from_json(&j).unwrap_err();
        assert!(e.contains(says), "{key}: {e}");
    }
    let c = ModelConfig::from_json(&flash).unwrap();
    let v4 = c.deepseek_v4.as_ref().unwrap();
    assert_eq!(
        v4.compression,
        vec![
            Compression::None,
            Compression::None,
            Compression::Sparse { rate: 4 },
            Compression::Heavy { rate: 128 }
        ]
    );
    assert_eq!(v4.hash_routed, vec![true, true, true, false]);
    assert_eq!(v4.o_groups, 8);
    let hyper = c.hyper.unwrap();
    assert_eq!((hyper.streams, hyper.sinkhorn_iters), (4, 20));
    assert_eq!(hyper.head, HyperHead::Weighted);
    assert_eq!(
        (c.rotary_dim, c.sliding_window, c.num_kv_heads),
        (64, Some(128), 1)
    );
    assert_eq!(
        c.layer_types,
        [
            LayerAttention::Sliding,
            LayerAttention::Sliding,
            LayerAttention::Compressed,
            LayerAttention::Compressed
        ]
    );
    // The compressed layers' YaRN, its attention factor 1 where the config states none; the
    // sliding layers' plain RoPE.
    assert_eq!(c.rope.theta, 160000.0);
    assert!(matches!(
        c.rope.scaling,
        Some(RopeScaling::Yarn {
            factor: 16.0,
            attention_factor: 1.0,
            ..
        })
    ));
    assert_eq!(c.local_rope.as_ref().map(|r| r.theta), Some(10000.0));
    assert_eq!(
        c.mlp_activation,
        GatedActivation::ClampedSilu { limit: 10.0 }
    );
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(moe.router, Router::SqrtSoftplus { scale: 1.5 });
    assert_eq!(moe.shared_expert.map(|s| s.intermediate_size), Some(2048));
    assert!(c.attention_sinks && c.rope_interleaved);
    // Its compressors pool runs of rows: no sequence splits into branches.
    assert_eq!(c.branch_rows_limit(), None);
    // transformers' own form: layer_types, mlp_layer_types and nested rope_parameters.
    let nested = with(
        flash.clone(),
        json!({
            "layer_types": ["sliding_attention", "compressed_sparse_attention",
                            "heavily_compressed_attention", "compressed_sparse_attention"],
            "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
            "rope_parameters": {
                "main": {"rope_type": "default", "rope_theta": 10000.0},
                "compress": {"rope_type": "default", "rope_theta": 160000.0},
            },
        }),
    );
    let c = ModelConfig::from_json(&nested).unwrap();
    let v4 = c.deepseek_v4.as_ref().unwrap();
    assert_eq!(v4.hash_routed, vec![true, false, false, false]);
    assert_eq!(v4.compression[2], Compression::Heavy { rate: 128 });
    assert_eq!(c.rope.scaling, None);
    // Bad input: one line naming the entry.
    let bad = with(
        flash.clone(),
        json!({"layer_types": ["sliding_attention", "dense", "x", "y"]}),
    );
    let e = ModelConfig::from_json(&bad).unwrap_err();
    assert!(e.contains("layer_types") && e.contains("\"dense\""), "{e}");
    let bad = with(flash, json!({"scoring_func": "softmax"}));
    assert!(
        ModelConfig::from_json(&bad)
            .unwrap_err()
            .contains("scoring_func")
    );
}

/// GLM-5.3-Flash as a flat text config with `linear_attn_config` (the keys transformers'
/// `Glm5NextTextConfig` forwards), its layer and MLP kinds left to transformers' defaults.
fn glm5_next() -> Value {
    json!({
        "architectures": ["Glm5NextForConditionalGeneration"],
        "model_type": "glm5_next",
        "text_config": {
            "model_type": "glm5_next_text",
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "moe_intermediate_size": 2048,
            "num_hidden_layers": 8,
            "num_attention_heads": 64,
            "num_key_value_heads": 64,
            "kv_lora_rank": 512,
            "q_lora_rank": 1536,
            "qk_nope_head_dim": 256,
            "qk_rope_head_dim": 0,
            "v_head_dim": 256,
            "n_routed_experts": 288,
            "n_shared_experts": 1,
            "num_experts_per_tok": 8,
            "routed_scaling_factor": 2.5,
            "index_topk": 2048,
            "index_kpool": 16,
            "linear_attn_config": {"num_heads": 64, "head_dim": 128, "short_conv_kernel_size": 4},
            "max_position_embeddings": 1048576,
            "vocab_size": 154880,
            "rms_norm_eps": 1e-5,
        },
        "vision_config": {"model_type": "glm5_next_vision"},
        "tie_word_embeddings": false,
    })
}

#[test]
fn glm5_next_reads_its_config_as_transformers_does() {
    let c = ModelConfig::from_json(&glm5_next()).unwrap();
    assert_eq!(c.architecture, Architecture::Glm5Next);
    // Every fourth layer attends; the first three MLPs dense.
    let attending: Vec<usize> = (0..8).filter(|&l| !c.is_delta_net(l)).collect();
    assert_eq!(attending, [3, 7]);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(
        (0..8).map(|l| moe.is_sparse(l)).collect::<Vec<_>>(),
        [false, false, false, true, true, true, true, true]
    );
    let d = c.delta_net.unwrap();
    assert_eq!(d.layout, DeltaNetLayout::Kimi);
    assert_eq!((d.v_heads, d.k_dim), (64, 128));
    assert_eq!(c.kda_lower_bound, Some(-5.0));
    let m = c.mla.unwrap();
    assert_eq!((m.nope_dim, m.rope_dim, c.rotary_dim), (256, 0, 0));
    assert_eq!(c.attn_scale, 256f64.powf(-0.5));
    let ix = c.indexer.as_ref().unwrap();
    assert_eq!(ix.top_k, 2048);
    assert_eq!(
        ix.pools,
        Some(KeyPools {
            size: 16,
            tail: true
        })
    );
    assert!(ix.own_selection.iter().all(|&own| own));
    let hyper = c.hyper.unwrap();
    assert_eq!((hyper.streams, hyper.head), (4, HyperHead::Mean));
    assert_eq!(
        c.mlp_activation,
        GatedActivation::ClampedSilu { limit: 10.0 }
    );
}

#[test]
fn glm5_next_reads_a_flat_text_config_as_its_text_config() {
    let mut flat = glm5_next()["text_config"].clone();
    flat["architectures"] = json!(["Glm5NextForConditionalGeneration"]);
    flat["model_type"] = json!("glm5_next");
    let c = ModelConfig::from_json(&flat).unwrap();
    let nested = ModelConfig::from_json(&glm5_next()).unwrap();
    assert_eq!(c.architecture, Architecture::Glm5Next);
    assert_eq!(
        (c.num_layers, c.indexer, c.hyper, c.kda_lower_bound),
        (
            nested.num_layers,
            nested.indexer,
            nested.hyper,
            nested.kda_lower_bound
        )
    );
}

#[test]
fn glm5_next_refuses_what_transformers_cannot_run() {
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut j = glm5_next();
        edit(&mut j["text_config"]);
        ModelConfig::from_json(&j).unwrap_err()
    };
    // A shared selection after a KDA layer: transformers raises.
    let e = with(&|t| {
        t["layer_types"] = json!([
            "linear_attention",
            "indexed_attention",
            "linear_attention",
            "indexed_attention",
            "linear_attention",
            "linear_attention",
            "linear_attention",
            "indexed_attention"
        ]);
        t["indexer_types"] = json!([
            "full", "full", "full", "shared", "full", "full", "full", "full"
        ]);
    });
    assert!(e.contains("indexer_types: layer 3"), "{e}");
    let e = with(&|t| t["layer_types"] = json!(vec!["mamba"; 8]));
    assert!(e.contains("unsupported layer_types entry \"mamba\""), "{e}");
    let e = with(&|t| t["index_kpool"] = json!(24));
    assert!(
        e.contains("index_kpool 24 does not divide index_topk 2048"),
        "{e}"
    );
    let e = with(&|t| t["linear_lower_bound"] = json!(2.0));
    assert!(e.contains("linear_lower_bound"), "{e}");
    // A null bound keeps Kimi's softplus decay, unless `linear_attn_config` asks for the
    // safe gate (its default), as transformers resolves it.
    let mut j = glm5_next();
    j["text_config"]["linear_lower_bound"] = Value::Null;
    assert_eq!(
        ModelConfig::from_json(&j).unwrap().kda_lower_bound,
        Some(-5.0)
    );
    j["text_config"]["linear_attn_config"]["safe_gate"] = json!(false);
    assert_eq!(ModelConfig::from_json(&j).unwrap().kda_lower_bound, None);
}
