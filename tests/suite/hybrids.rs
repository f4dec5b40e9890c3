//! Hybrid checkpoints that are wrong (issue 50): an unknown `layer_types` entry, inconsistent
//! DeltaNet or Mamba-2 head counts (Falcon-H1's heads against its Mamba width, its dt limits
//! and multipliers), a missing convolution, decay or skip tensor, a convolution
//! of another width, a block kind not supported: each a one-line error naming the key or
//! tensor, never a panic or a number. And `inspect` says what a hybrid holds and which tensors
//! of a multimodal checkpoint it leaves unread.

use crate::common;

use std::path::PathBuf;

use safetensors::SafeTensors;
use safetensors::tensor::TensorView;
use serde_json::{Value, json};

const FIXTURE: &str = "synth-qwen3_5-mini";
const KIMI: &str = "synth-kimi-linear-mini";

/// A copy of fixture `name` whose config.json `edit` changed and whose tensors `keep` filters.
fn broken(
    name: &str,
    tag: &str,
    edit: impl Fn(&mut Value),
    keep: impl Fn(&str) -> bool,
) -> PathBuf {
    let src = common::fixture(name);
    let dir = common::writable_copy(&src, tag);
    std::fs::copy(src.join("reference.json"), dir.join("reference.json")).unwrap();
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let views: Vec<(String, TensorView)> =
        st.tensors().into_iter().filter(|(n, _)| keep(n)).collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    dir
}

/// Kimi-Linear as moonshotai publishes it, its dense first layer's MLP under `mlp` (the
/// fixture holds it as transformers saves it, under `block_sparse_moe`): the same model, within
/// the fixture's reference.
#[test]
fn kimi_linear_reads_the_published_dense_layer_names() {
    let src = common::fixture(KIMI);
    let dir = common::writable_copy(&src, "kimi-published-names");
    std::fs::copy(src.join("reference.json"), dir.join("reference.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let dense = "model.layers.0.block_sparse_moe.";
    let views: Vec<(String, TensorView)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| match n.strip_prefix(dense) {
            Some(rest) if !rest.starts_with("experts") && !rest.starts_with("gate.") => {
                (format!("model.layers.0.mlp.{rest}"), v)
            }
            _ => (n, v),
        })
        .collect();
    assert!(
        views
            .iter()
            .any(|(n, _)| n == "model.layers.0.mlp.down_proj.weight")
    );
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let out = common::succeeds(&[
        "check",
        "--backend",
        "cpu",
        "--model",
        dir.to_str().unwrap(),
    ]);
    assert!(out.contains("all 1 checks passed"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn broken_hybrid_checkpoints_are_refused_naming_what_is_wrong() {
    type Edit = Box<dyn Fn(&mut Value)>;
    let all = |_: &str| true;
    const LFM2: &str = "synth-lfm2-mini";
    const NEMOTRON_H: &str = "synth-nemotron-h-mini";
    const FALCON_H1: &str = "synth-falcon-h1-mini";
    const GRANITE: &str = "synth-granite-4.0-h-mini";
    let config_cases: Vec<(&str, &str, Edit, &[&str])> = vec![
        (
            FIXTURE,
            "layer-type",
            Box::new(|c| c["layer_types"][1] = json!("mamba")),
            &["layer_types", "mamba"],
        ),
        (
            FIXTURE,
            "heads",
            Box::new(|c| c["linear_num_value_heads"] = json!(3)),
            &["linear_num_value_heads 3", "linear_num_key_heads 2"],
        ),
        (
            FIXTURE,
            "kernel",
            Box::new(|c| c["linear_conv_kernel_dim"] = json!(0)),
            &["linear_conv_kernel_dim"],
        ),
        (
            LFM2,
            "lfm2-layer-type",
            Box::new(|c| c["layer_types"][2] = json!("linear_attention")),
            &["layer_types", "linear_attention", "full_attention, conv"],
        ),
        (
            NEMOTRON_H,
            "nemotron-groups",
            Box::new(|c| c["n_groups"] = json!(3)),
            &["mamba_num_heads 4", "n_groups 3"],
        ),
        (
            NEMOTRON_H,
            "nemotron-block",
            Box::new(|c| c["layers_block_type"][1] = json!("conv")),
            &["layers_block_type", "conv", "moe/E"],
        ),
        (
            FALCON_H1,
            "falcon-head-dim",
            Box::new(|c| c["mamba_d_head"] = json!(24)),
            &["mamba_n_heads 8", "mamba_d_head 24", "256"],
        ),
        (
            FALCON_H1,
            "falcon-dt-limit",
            Box::new(|c| c["time_step_limit"] = json!([0.1])),
            &["time_step_limit", "[min, max]"],
        ),
        (
            FALCON_H1,
            "falcon-multipliers",
            Box::new(|c| c["ssm_multipliers"] = json!([1.0, 1.0, 1.0])),
            &["ssm_multipliers", "5 numbers"],
        ),
        (
            FALCON_H1,
            "falcon-act",
            Box::new(|c| c["hidden_act"] = json!("gelu_pytorch_tanh")),
            &["hidden_act", "gelu_pytorch_tanh", "Falcon-H1"],
        ),
        (
            GRANITE,
            "granite-layer-type",
            Box::new(|c| c["layer_types"][1] = json!("conv")),
            &["layer_types", "conv", "attention, mamba"],
        ),
        (
            GRANITE,
            "granite-positions",
            Box::new(|c| c["position_embedding_type"] = json!("alibi")),
            &["position_embedding_type", "alibi"],
        ),
        (
            GRANITE,
            "granite-logits",
            Box::new(|c| c["logits_scaling"] = json!(0)),
            &["logits_scaling", "positive"],
        ),
        (
            "synth-bamba-mini",
            "bamba-attention-layer",
            Box::new(|c| c["attn_layer_indices"] = json!([1, 7])),
            &["attn_layer_indices", "layer 7 of 3"],
        ),
        (
            "synth-nemotron-h-moe-mini",
            "nemotron-latent",
            Box::new(|c| c["moe_latent_size"] = json!(128)),
            &["moe_latent_size"],
        ),
        (
            "synth-nemotron-h-moe-mini",
            "nemotron-groups-experts",
            Box::new(|c| c["n_group"] = json!(3)),
            &["n_group 3", "8 experts"],
        ),
    ];
    for (fixture, tag, edit, needles) in config_cases {
        let dir = broken(fixture, tag, edit, all);
        common::fails_with(&["inspect", dir.to_str().unwrap()], needles);
        let _ = std::fs::remove_dir_all(&dir);
    }
    // Found only when the model loads: `check --model` on the CPU.
    let load_cases: Vec<(&str, &str, Edit, &str, &[&str])> = vec![
        (
            FIXTURE,
            "no-conv",
            Box::new(|_| {}),
            "model.layers.1.linear_attn.conv1d.weight",
            &["model.layers.1.linear_attn.conv1d.weight"],
        ),
        (
            FIXTURE,
            "no-decay",
            Box::new(|_| {}),
            "model.layers.2.linear_attn.A_log",
            &["model.layers.2.linear_attn.A_log"],
        ),
        (
            FIXTURE,
            "conv-width",
            Box::new(|c| c["linear_conv_kernel_dim"] = json!(3)),
            "",
            &["model.layers.0.linear_attn.conv1d.weight", "3"],
        ),
        (
            LFM2,
            "lfm2-no-conv",
            Box::new(|_| {}),
            "model.layers.2.conv.conv.weight",
            &["model.layers.2.conv.conv.weight"],
        ),
        (
            NEMOTRON_H,
            "nemotron-no-skip",
            Box::new(|_| {}),
            "backbone.layers.4.mixer.D",
            &["backbone.layers.4.mixer.D"],
        ),
        (
            NEMOTRON_H,
            "nemotron-state",
            Box::new(|c| c["ssm_state_size"] = json!(8)),
            "",
            &["backbone.layers.0.mixer.conv1d.weight"],
        ),
        (
            FALCON_H1,
            "falcon-no-skip",
            Box::new(|_| {}),
            "model.layers.1.mamba.D",
            &["model.layers.1.mamba.D"],
        ),
        (
            "synth-falcon-h1-nonorm-mini",
            "falcon-norm",
            Box::new(|c| c["mamba_rms_norm"] = json!(true)),
            "",
            &["model.layers.0.mamba.norm.weight"],
        ),
        (
            GRANITE,
            "granite-no-shared",
            Box::new(|_| {}),
            "model.layers.2.shared_mlp.input_linear.weight",
            &["model.layers.2.shared_mlp"],
        ),
        (
            GRANITE,
            "granite-no-experts",
            Box::new(|_| {}),
            "model.layers.0.block_sparse_moe.output_linear.weight",
            &["model.layers.0.block_sparse_moe"],
        ),
        // Kimi-Linear: its keys' convolution, its per-channel decay bias of another width.
        (
            KIMI,
            "kimi-no-conv",
            Box::new(|_| {}),
            "model.layers.1.self_attn.k_conv1d.weight",
            &["model.layers.1.self_attn.k_conv1d.weight"],
        ),
        (
            KIMI,
            "kimi-heads",
            Box::new(|c| c["linear_attn_config"]["num_heads"] = json!(2)),
            "",
            &["model.layers.0.self_attn.q_conv1d.weight", "64"],
        ),
    ];
    for (fixture, tag, edit, dropped, needles) in load_cases {
        let dir = broken(fixture, tag, edit, |n| n != dropped);
        let d = dir.to_str().unwrap();
        common::fails_with(
            &["check", "--backend", "cpu", "--op", "add", "--model", d],
            needles,
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn inspect_names_the_recurrent_layers_and_the_unread_vision_tower() {
    let dense = common::fixture(FIXTURE);
    let out = common::succeeds(&["inspect", dense.to_str().unwrap()]);
    assert!(
        out.contains(
            "gated DeltaNet on 3 of 4 layers: 2 key heads x 32, 4 value heads x 32, conv kernel 4"
        ),
        "{out}"
    );
    assert!(!out.contains("not read"), "{out}");
    let lfm2 = common::fixture("synth-lfm2-mini");
    let out = common::succeeds(&["inspect", lfm2.to_str().unwrap()]);
    assert!(
        out.contains("short convolution on 2 of 3 layers: 3 taps"),
        "{out}"
    );
    let nemotron = common::fixture("synth-nemotron-h-mini");
    let out = common::succeeds(&["inspect", nemotron.to_str().unwrap()]);
    for needle in [
        "no positions in attention (NoPE)",
        "Mamba-2 on 2 of 6 layers: 4 heads x 32, state 16 in 2 groups, conv kernel 4 (biased)",
        "one part a block: 3 MLP or mixture blocks, 3 mixer blocks",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    let falcon = common::fixture("synth-falcon-h1-mini");
    let out = common::succeeds(&["inspect", falcon.to_str().unwrap()]);
    for needle in [
        "Mamba-2 beside the attention on every layer: 8 heads x 32, state 16 in 2 groups",
        "gated norm (gate first)",
        "multipliers: embedding 3, logits x0.5, attention in/out 1.25/0.8",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    let granite = common::fixture("synth-granite-4.0-h-mini");
    let out = common::succeeds(&["inspect", granite.to_str().unwrap()]);
    for needle in [
        "no positions in attention (NoPE)",
        "Mamba-2 on 2 of 3 layers: 8 heads x 32, state 16 in 2 groups",
        "experts: 4 per sparse layer (3 of 3 layers), 2 per token, width 64, shared expert of width 128",
        "multipliers: embedding 6, logits x0.4, attention in/out 1/0.4",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    let kimi = common::fixture(KIMI);
    let out = common::succeeds(&["inspect", kimi.to_str().unwrap()]);
    for needle in [
        "Kimi Delta Attention (a decay a key channel, sigmoid-gated norm) on 3 of 4 layers: \
         4 key heads x 32, 4 value heads x 32, conv kernel 4",
        "query/key heads 32 + 16 unrotated",
        "experts: 8 per sparse layer (3 of 4 layers), 2 per token, width 32, shared expert of width 32",
        "model.layers.1.block_sparse_moe.experts.0.w1",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    for vlm in ["synth-qwen3_5-vlm-mini", "synth-lfm2-vl-mini"] {
        let vlm = common::fixture(vlm);
        let out = common::succeeds(&["inspect", vlm.to_str().unwrap()]);
        assert!(
            out.contains("outside the language model `model.language_model`"),
            "{out}"
        );
    }
}
