//! Checkpoint layouts of the architectures beyond the Llama family that the fixtures do not
//! hold as such: a multimodal Gemma 3 written by older transformers (tensors under
//! `language_model.model.`), fused Phi-3 projections in a layout that cannot be cut by rows,
//! DeepSeek-V3's multi-token-prediction layer, and checkpoints missing what issue 51's
//! families need.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use quantppl::backend::cpu::CpuBackend;
use safetensors::SafeTensors;
use safetensors::tensor::TensorView;

/// Rewrites `dir/model.safetensors` with every tensor name passed through `rename` (`None`
/// drops the tensor) and the tensors `add` added (name, dtype, shape, bytes).
fn rewrite(
    dir: &Path,
    rename: impl Fn(&str) -> Option<String>,
    add: &[(&str, safetensors::Dtype, Vec<usize>, Vec<u8>)],
) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut views: BTreeMap<String, TensorView> = st
        .tensors()
        .into_iter()
        .filter_map(|(name, view)| Some((rename(&name)?, view)))
        .collect();
    for (name, dtype, shape, data) in add {
        let view = TensorView::new(*dtype, shape.clone(), data).unwrap();
        views.insert(name.to_string(), view);
    }
    let out = safetensors::serialize(views, None).unwrap();
    std::fs::write(&path, out).unwrap();
}

#[test]
fn gemma3_multimodal_checkpoint_of_older_transformers_reads_the_same() {
    let src = common::fixture("synth-gemma3-vlm-w4a16");
    let dir = common::writable_copy(&src, "gemma3-legacy-prefix");
    // transformers 4.5x: `language_model.model.layers…`, `vision_tower.…`.
    rewrite(
        &dir,
        |n| {
            Some(match n.strip_prefix("model.language_model.") {
                Some(rest) => format!("language_model.model.{rest}"),
                None => n.strip_prefix("model.").unwrap_or(n).to_string(),
            })
        },
        &[],
    );
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let config = config.replace("model.language_model", "language_model.model");
    std::fs::write(dir.join("config.json"), config).unwrap();
    let r = common::reference(&src);
    let failure = common::rows01_failures_of(&CpuBackend::new(), &dir, &r, 1e-4);
    assert!(failure.is_none(), "{failure:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// DeepSeek-V3's published checkpoints carry a multi-token-prediction layer after the last
/// decoder layer (`model.layers.61`, with `eh_proj`, `enorm`, …), which a forward pass does
/// not use: it is not read, and the numbers stay the reference's.
#[test]
fn deepseek_multi_token_prediction_layer_is_not_read() {
    let src = common::fixture("synth-deepseek-v3-mini");
    let dir = common::writable_copy(&src, "deepseek-mtp");
    let bf16 = |n: usize| vec![0x3c; 2 * n];
    let h = 256;
    rewrite(
        &dir,
        |n| Some(n.to_string()),
        &[
            (
                "model.layers.2.eh_proj.weight",
                safetensors::Dtype::BF16,
                vec![h, 2 * h],
                bf16(2 * h * h),
            ),
            (
                "model.layers.2.enorm.weight",
                safetensors::Dtype::BF16,
                vec![h],
                bf16(h),
            ),
            (
                "model.layers.2.self_attn.q_a_proj.weight",
                safetensors::Dtype::BF16,
                vec![96, h],
                bf16(96 * h),
            ),
        ],
    );
    // The fixture's config says `num_nextn_predict_layers: 1`, as transformers writes it.
    let r = common::reference(&src);
    let failure = common::rows01_failures_of(&CpuBackend::new(), &dir, &r, 1e-4);
    assert!(failure.is_none(), "{failure:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fused_projection_in_a_transposed_layout_is_refused_naming_the_tensor() {
    let src = common::fixture("synth-phi3-longrope");
    let dir = common::writable_copy(&src, "phi3-transposed");
    // A GPTQ-style `qweight [in / 8, out]` beside the fused qkv_proj: not cut along its rows.
    let name = "model.layers.0.self_attn.qkv_proj.qweight";
    rewrite(
        &dir,
        |n| Some(n.to_string()),
        &[(
            name,
            safetensors::Dtype::I32,
            vec![32, 512],
            vec![0; 32 * 512 * 4],
        )],
    );
    let err = quantppl::checkpoint::Checkpoint::open(&dir)
        .err()
        .expect("a transposed fused tensor is refused")
        .to_string();
    assert!(err.contains(name) && err.contains("GPTQ/AWQ"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Qwen3-VL-MoE's experts stacked as transformers 5 holds them (`gate_up_proj` `[E, 2I,
/// hidden]`, `down_proj` `[E, hidden, I]`) read the same as the published layout the fixture
/// holds (`[E, hidden, 2I]`, `[E, I, hidden]`).
#[test]
fn qwen3_vl_moe_stacks_read_the_same_in_either_layout() {
    let src = common::fixture("synth-qwen3-vl-moe-mini");
    let dir = common::writable_copy(&src, "qwen3-vl-moe-native");
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let stacked =
        |n: &str| n.ends_with(".experts.gate_up_proj") || n.ends_with(".experts.down_proj");
    // Each expert's `[rows, cols]` block as `[cols, rows]` (bf16: two bytes a value).
    let native: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| stacked(n))
        .map(|(n, v)| {
            let [e, rows, cols] = v.shape()[..] else {
                panic!("{n}: {:?}", v.shape())
            };
            let mut out = vec![0u8; v.data().len()];
            for x in 0..e {
                for r in 0..rows {
                    for c in 0..cols {
                        let from = 2 * ((x * rows + r) * cols + c);
                        let to = 2 * ((x * cols + c) * rows + r);
                        out[to..to + 2].copy_from_slice(&v.data()[from..from + 2]);
                    }
                }
            }
            (n, vec![e, cols, rows], out)
        })
        .collect();
    assert!(!native.is_empty());
    let add: Vec<_> = native
        .iter()
        .map(|(n, shape, data)| {
            (
                n.as_str(),
                safetensors::Dtype::BF16,
                shape.clone(),
                data.clone(),
            )
        })
        .collect();
    rewrite(&dir, |n| (!stacked(n)).then(|| n.to_string()), &add);
    let r = common::reference(&src);
    let failure = common::rows01_failures_of(&CpuBackend::new(), &dir, &r, 1e-4);
    assert!(failure.is_none(), "{failure:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 51's bad input: a multimodal checkpoint holding its vision tower alone, a MiniMax-M2
/// layer without its router's selection bias, DeepSeek-V4 without a hash router's table, an
/// indexer's compressor tensor, a hyper-connection or an FP4 expert's scales, DeepSeek-V3.2 without an indexer tensor, Llama 4
/// without a router or an expert's linear, Mistral Large 4 without its learned RoPE or a query
/// scaling: one line naming what is missing (under both names where the checkpoint's differ).
#[test]
fn a_tower_alone_or_a_missing_family_tensor_is_refused_naming_it() {
    // (fixture, tag, the tensors kept, what the error names)
    type Case = (
        &'static str,
        &'static str,
        fn(&str) -> bool,
        &'static [&'static str],
    );
    let cases: [Case; 15] = [
        (
            "synth-deepseek-v4-mini",
            "v4-no-tid2eid",
            |n| n != "model.layers.0.ffn.gate.tid2eid",
            &[
                "model.layers.0.mlp.gate.tid2eid",
                "layers.0.ffn.gate.tid2eid",
            ],
        ),
        (
            "synth-deepseek-v4-mini",
            "v4-no-indexer-bias",
            |n| n != "model.layers.3.attn.indexer.compressor.ape",
            &["model.layers.3.self_attn.compressor.indexer.position_bias"],
        ),
        // An FP4 expert without its scales: its int8 codes are no dense weight.
        (
            "synth-deepseek-v4-fp4",
            "v4-fp4-no-scale",
            |n| n != "model.layers.1.ffn.experts.3.w2.scale",
            &["model.layers.1.ffn.experts.3.w2.weight", "I8", "scales"],
        ),
        (
            "synth-deepseek-v4-mini",
            "v4-no-hyper-connection",
            |n| n != "model.layers.2.hc_ffn_fn",
            &["model.layers.2.ffn_hc.fn"],
        ),
        (
            "synth-mistral-large4-mini",
            "mistral-large4-no-alpha",
            |n| n != "lerope.alpha",
            &[
                "model.language_model.rotary_emb.alpha",
                "stored as `lerope.alpha`",
            ],
        ),
        (
            "synth-mistral-large4-w4a16",
            "mistral-large4-no-scaling",
            |n| n != "layers.2.attention.indexer.ssmax_scaling.s",
            &[
                "model.language_model.layers.2.self_attn.indexer.softmax_scaling.scale",
                "`layers.2.attention.indexer.ssmax_scaling.s`",
            ],
        ),
        (
            "synth-llama4-vlm-mini",
            "llama4-no-router",
            |n| n != "language_model.model.layers.1.feed_forward.router.weight",
            &["language_model.model.layers.1.feed_forward.router.weight"],
        ),
        (
            "synth-llama4-w4a16",
            "llama4-no-expert",
            |n| !n.starts_with("language_model.model.layers.3.feed_forward.experts.2.up_proj."),
            &["language_model.model.layers.3.feed_forward.experts.2.up_proj"],
        ),
        (
            "synth-gemma4-mini",
            "gemma4-no-per-layer-table",
            |n| n != "model.embed_tokens_per_layer.weight",
            &["model.embed_tokens_per_layer.weight"],
        ),
        (
            "synth-gemma4-moe-mini",
            "gemma4-no-expert-scale",
            |n| n != "model.layers.1.router.per_expert_scale",
            &["model.layers.1.router.per_expert_scale"],
        ),
        (
            "synth-deepseek-v3.2-mini",
            "dsa-no-wk",
            |n| n != "model.layers.1.self_attn.indexer.wk.weight",
            &["model.layers.1.self_attn.indexer.wk.weight"],
        ),
        (
            "synth-glm5-mini",
            "dsa-no-k-norm-bias",
            |n| n != "model.layers.2.self_attn.indexer.k_norm.bias",
            &["model.layers.2.self_attn.indexer.k_norm.bias"],
        ),
        (
            "synth-glm5-next-mini",
            "glm5-next-no-pool-gate",
            |n| n != "model.language_model.layers.1.self_attn.indexer.index_kpool_compress_gate",
            &["model.language_model.layers.1.self_attn.indexer.index_kpool_compress_gate"],
        ),
        (
            "synth-qwen3-vl-mini",
            "vision-only",
            |n| n.contains("visual"),
            &["holds no language model", "model.visual."],
        ),
        (
            "synth-minimax-m2-mini",
            "minimax-no-bias",
            |n| n != "model.layers.1.block_sparse_moe.e_score_correction_bias",
            &["model.layers.1.block_sparse_moe.e_score_correction_bias"],
        ),
    ];
    for (fixture, tag, keep, needles) in cases {
        let src = common::fixture(fixture);
        let dir = common::writable_copy(&src, tag);
        std::fs::copy(src.join("reference.json"), dir.join("reference.json")).unwrap();
        rewrite(&dir, |n| keep(n).then(|| n.to_string()), &[]);
        let d = dir.to_str().unwrap();
        common::fails_with(
            &["check", "--backend", "cpu", "--op", "add", "--model", d],
            needles,
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Every fixture's config.json with one value replaced by a hostile one (negative, zero, huge,
/// fractional, wrong type, null, a long string) reads as a config or as an error: never a
/// panic.
#[test]
fn hostile_config_values_end_in_a_config_or_an_error() {
    use quantppl::checkpoint::ModelConfig;
    use serde_json::{Value, json};
    let hostile = [
        json!(-1),
        json!(0),
        json!(1u64 << 62),
        json!(2.5),
        json!("x"),
        json!(null),
        json!([]),
        json!({}),
        json!(true),
        json!("a".repeat(10_000)),
    ];
    let mut tried = 0;
    for dir in common::config_dirs() {
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let config: Value = serde_json::from_str(&text).unwrap();
        // Top-level keys and those one level down (text_config, rope_parameters, ...).
        let mut paths: Vec<Vec<String>> = Vec::new();
        for (k, v) in config.as_object().unwrap() {
            paths.push(vec![k.clone()]);
            if let Some(inner) = v.as_object() {
                paths.extend(inner.keys().map(|k2| vec![k.clone(), k2.clone()]));
            }
        }
        for path in paths {
            for bad in &hostile {
                let mut c = config.clone();
                let mut slot = &mut c;
                for key in &path {
                    slot = slot.get_mut(key).unwrap();
                }
                *slot = bad.clone();
                let result = std::panic::catch_unwind(|| ModelConfig::from_json(&c));
                assert!(
                    result.is_ok(),
                    "{}: {path:?} = {bad} panicked",
                    dir.display()
                );
                tried += 1;
            }
        }
    }
    common::tally!("{tried} hostile configs read without a panic");
    assert!(tried > 1000);
}

/// `inspect` says what issue 51's families change in attention, sparse attention and routing.
#[test]
fn inspect_names_the_attention_variants_and_the_routing_rule() {
    let cases: [(&str, &[&str]); 8] = [
        (
            "synth-llama4-vlm-mini",
            &[
                "attention: q/k heads RMS-normed without a weight where RoPE applies, RoPE on 2 of 4 layers, the others without positions, their queries scaled by 1 + 0.5 ln(1 + floor((pos + 1) / 32)), 2 layers attend within chunks of 48 positions",
                "routing: the top k logits, their sigmoids; the weights scale each expert's input",
                "on adjacent pairs",
            ],
        ),
        (
            "synth-gemma4-mini",
            &[
                "attention: q/k norms per head, full-attention heads of 64 (1 key/value), full-attention values from the key projection, value heads RMS-normed, the last 2 layers reuse earlier keys and values (with double-wide MLPs)",
                "per-layer inputs: 16 a layer",
                "proportional over 0.25 of each head",
            ],
        ),
        (
            "synth-gemma4-moe-mini",
            &[
                "routing: softmax, the top k, renormalised; a factor per expert; beside each layer's dense MLP",
            ],
        ),
        (
            "synth-minimax-m2-mini",
            &[
                "attention: q/k norms over the whole projection, RoPE on 32 of 64 values a head",
                "routing: sigmoid scores, the top k, renormalised; a selection bias added for choosing",
            ],
        ),
        (
            "synth-mistral4-mini",
            &[
                "attention: queries scaled by 1 + 0.5 ln(1 + floor(pos / 64)) after RoPE",
                "routing: softmax, the top k within the best 2 of 4 groups, renormalised, times 1.5",
            ],
        ),
        (
            "synth-deepseek-v3.2-mini",
            &[
                "sparse attention: each query's top 32 keys by a 16-head indexer of 32 (RoPE over halves); no more",
                "windows from 256 tokens in the latent space",
            ],
        ),
        (
            "synth-glm5-mini",
            &[
                "sparse attention: each query's top 32 keys by a 16-head indexer of 32 (RoPE interleaved); 1 of 3 layers reuse the last selection",
            ],
        ),
        (
            "synth-glm5-next-mini",
            &[
                "sparse attention: each query's top 16 keys by a 16-head indexer of 16 (no RoPE)",
                "the indexer scores pools of 4 tokens and keeps 4 of them, then the tokens after the last whole pool",
                "hyper-connections: 4 residual streams (Sinkhorn, 20 iterations), collapsed after the last layer by their mean",
                "Kimi Delta Attention (a decay a key channel under a safe gate bounded by -5, sigmoid-gated norm) on 2 of 4 layers",
                "outside the language model `model.language_model`",
            ],
        ),
    ];
    for (fixture, needles) in cases {
        let dir = common::fixture(fixture);
        let out = common::succeeds(&["inspect", dir.to_str().unwrap()]);
        for needle in needles {
            assert!(out.contains(needle), "{fixture}: {needle}\n{out}");
        }
    }
}

/// Sparse attention over the expanded heads (each head's keys, the unselected masked) and in
/// the latent space (each query's selected keys gathered once for all its heads) give the
/// same NLL on the CPU: DeepSeek-V3.2 (also in FP8-block, where `kv_b` quantizes the latent
/// it reads), GLM-5 (a layer reusing the selection) and Mistral Large 4 (layers without RoPE,
/// latents reused, W4A16 `kv_b`), windows of 8 times `index_topk` and two sequences of a
/// batch. The conformance suite holds the latent form, which such windows take, to the
/// references.
#[test]
fn sparse_attention_in_the_latent_space_equals_the_expanded_heads() {
    use quantppl::backend::SeqLayout;
    use quantppl::model::Model;
    use quantppl::run::{Activations, open_model};

    let b = CpuBackend::new();
    let tokenizer = common::assets_dir().join("stories260K/tokenizer.json");
    for name in [
        "synth-deepseek-v3.2-mini",
        "synth-deepseek-v3.2-fp8-block",
        "synth-glm5-mini",
        "synth-glm5-next-mini",
        "synth-mistral-large4-w4a16",
    ] {
        let m = open_model(
            Some(&common::fixture(name)),
            Some(&tokenizer),
            Activations::Declared,
        )
        .unwrap();
        let vocab = m.ckpt.config.vocab_size as u32;
        let mut model = Model::load(&b, &m.ckpt, 256, &|_, _| {}).unwrap();
        let lens = [256, 200];
        let ids: Vec<u32> = (0..456u32).map(|i| (i * 7919 + 11) % vocab).collect();
        let mut targets: Vec<i32> = ids[1..].iter().map(|&t| t as i32).collect();
        targets.push(-1);
        targets[255] = -1;
        let layout = SeqLayout::from_sequences(lens.map(|n| (n, None)));
        let mut nll = |times_top_k| {
            model.set_latent_from(times_top_k);
            model.nll(&b, &ids, &layout, &targets).unwrap()
        };
        let (expanded, latent) = (nll(usize::MAX), nll(1));
        let gaps: Vec<f64> = expanded
            .iter()
            .zip(&latent)
            .filter(|(a, _)| a.is_finite())
            .map(|(a, b)| f64::from((a - b).abs()))
            .collect();
        let worst = gaps.iter().copied().fold(0.0, f64::max);
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        eprintln!("{name}: the two forms' NLLs at most {worst:.2e} apart, {mean:.2e} on average");
        // Summed in another order, a later layer's index scores may cross a near-tie at the
        // top-k boundary and swap one key (FP8-block: 5.3e-4 in one token); the latent form
        // without the FP8 latent `kv_b` reads is 6.8 apart.
        assert!(
            mean <= 2e-5 && worst <= 1e-2,
            "{name}: NLLs {worst} apart, {mean} on average"
        );
    }
}
