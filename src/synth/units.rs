//! What tensors each architecture's checkpoint holds, in the order they are generated: dense
//! tensors, linears grouped as llm-compressor fuses their global scales, and mixtures'
//! experts.

use super::WEIGHT_STD;
use super::quantize::Init;
use super::shapes::{self, ModelSpec};

/// One linear layer to generate.
pub(super) struct Linear {
    pub(super) prefix: String,
    pub(super) out: usize,
    pub(super) inp: usize,
}

/// Tensors generated together: a dense tensor, or linears that share an NVFP4 global scale
/// (q/k/v and gate/up, as llm-compressor fuses them for vLLM) and hence a shard.
pub(super) enum Unit {
    Dense {
        name: String,
        shape: Vec<usize>,
        init: Init,
    },
    Linears(Vec<Linear>),
    /// gpt-oss's experts of one layer, `prefix` `….mlp.experts`: in MXFP4 the stacks openai
    /// stores (`{name}_blocks` `[E, out, in/32, 16]`, `{name}_scales`), in bf16 the stacks
    /// transformers stores (`{name}` `[E, in, out]`), in the other schemes per-expert linears
    /// `{prefix}.{e}.{name}`; each part is (name, out, in).
    Experts {
        prefix: String,
        experts: usize,
        parts: Vec<(&'static str, usize, usize)>,
    },
}

/// The per-expert linears of an `Unit::Experts`, in expert order.
pub(super) fn expert_linears(
    prefix: &str,
    experts: usize,
    parts: &[(&str, usize, usize)],
) -> Vec<Linear> {
    (0..experts)
        .flat_map(|e| {
            parts.iter().map(move |&(name, out, inp)| Linear {
                prefix: format!("{prefix}.{e}.{name}"),
                out,
                inp,
            })
        })
        .collect()
}

pub(super) const QWEN_MLP: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// The model's units in transformers' module order.
pub(super) fn units(spec: &ModelSpec) -> Vec<Unit> {
    match spec.arch {
        shapes::Arch::Lfm2 { attention } => return lfm2_units(spec, attention),
        shapes::Arch::NemotronH(m) => return nemotron_h_units(spec, m),
        shapes::Arch::Granite(m) => return granite_units(spec, m),
        shapes::Arch::Gemma4 {
            global_head_dim,
            global_kv_heads,
        } => return gemma4_units(spec, (global_head_dim, global_kv_heads)),
        _ => {}
    }
    let linear = |prefix: String, out, inp| Linear { prefix, out, inp };
    let (h, i, hd) = (spec.hidden, spec.intermediate, spec.head_dim);
    let (q, kv) = (spec.heads * hd, spec.kv_heads * hd);
    let mut units = vec![embeddings(spec)];
    if spec.is_mistral_large4() {
        // RoPE's learned frequencies, `exp(alpha)` times transformers' own: about 1.
        units.push(dense(
            "model.rotary_emb.alpha".into(),
            &[hd / 2],
            Init::Normal(0.02),
        ));
    }
    for l in 0..spec.layers {
        let p = format!("model.layers.{l}");
        units.push(dense(
            format!("{p}.input_layernorm.weight"),
            &[h],
            Init::NormGain,
        ));
        // GLM-5.3-Flash's hyper-connections around the mixer and the MLP: `fn` of the streams,
        // its bias and the three outputs' factors (about 1).
        if let shapes::Arch::Glm5Next { streams: n, .. } = spec.arch {
            for block in ["attn", "ffn"] {
                let name = |part: &str| format!("{p}.hc_{block}_{part}");
                let outputs = (2 + n) * n;
                units.push(dense(
                    name("fn"),
                    &[outputs, n * h],
                    Init::Normal(WEIGHT_STD),
                ));
                units.push(dense(name("base"), &[outputs], Init::Normal(WEIGHT_STD)));
                units.push(dense(name("scale"), &[3], Init::NormGain));
            }
        }
        if let (shapes::Arch::Qwen3_5(d), true) = (spec.arch, spec.is_delta_layer(l)) {
            // Gated DeltaNet, dense as llm-compressor's recipe leaves it (`ignored_modules`).
            let la = |n: &str| format!("{p}.linear_attn.{n}");
            let (conv, value, hv) = (d.conv_width(), d.value_width(), d.v_heads);
            let std = Init::Normal(WEIGHT_STD);
            let projections = match d.fused {
                true => vec![
                    ("in_proj_qkvz.weight", vec![conv + value, h]),
                    ("in_proj_ba.weight", vec![2 * hv, h]),
                ],
                false => vec![
                    ("in_proj_qkv.weight", vec![conv, h]),
                    ("in_proj_z.weight", vec![value, h]),
                    ("in_proj_b.weight", vec![hv, h]),
                    ("in_proj_a.weight", vec![hv, h]),
                ],
            };
            for (n, shape) in projections.into_iter().chain([
                ("conv1d.weight", vec![conv, 1, d.conv_kernel]),
                ("dt_bias", vec![hv]),
                ("A_log", vec![hv]),
            ]) {
                units.push(dense(la(n), &shape, std));
            }
            units.push(dense(la("norm.weight"), &[d.v_dim], Init::NormGain));
            units.push(dense(la("out_proj.weight"), &[h, value], std));
            units.push(dense(
                format!("{p}.post_attention_layernorm.weight"),
                &[h],
                Init::NormGain,
            ));
            qwen3_5_mlp(spec, &mut units, &p);
            continue;
        }
        let fused = spec.arch == shapes::Arch::Phi3;
        let gemma = matches!(spec.arch, shapes::Arch::Gemma3 { .. });
        let kimi_delta = match spec.arch {
            shapes::Arch::KimiLinear { delta, .. } | shapes::Arch::Glm5Next { delta, .. }
                if spec.is_delta_layer(l) =>
            {
                Some(delta)
            }
            _ => None,
        };
        let glm = matches!(spec.arch, shapes::Arch::Glm5Next { .. });
        // Latent attention: (the query's rank, or one q_proj; the KV rank; the heads' parts).
        let latent = match spec.arch {
            shapes::Arch::DeepseekV3 {
                q_lora_rank,
                kv_lora_rank,
                nope_dim,
                v_head_dim,
                ..
            } => Some((Some(q_lora_rank), kv_lora_rank, nope_dim, v_head_dim)),
            shapes::Arch::KimiLinear {
                kv_lora_rank,
                nope_dim,
                v_head_dim,
                ..
            } if kimi_delta.is_none() => Some((None, kv_lora_rank, nope_dim, v_head_dim)),
            shapes::Arch::Glm5Next {
                q_lora_rank,
                kv_lora_rank,
                nope_dim,
                v_head_dim,
                ..
            } if kimi_delta.is_none() => {
                Some((Some(q_lora_rank), kv_lora_rank, nope_dim, v_head_dim))
            }
            _ => None,
        };
        let o_in = match (latent, kimi_delta) {
            (_, Some(d)) => {
                // Kimi Delta Attention: q, k, v (quantized as attention's), their
                // convolutions, the dense low-rank decay and gate pairs and b_proj, the
                // decay's vectors, o_norm; o_proj below.
                let attn = |name: &str| format!("{p}.self_attn.{name}");
                let (kw, vw, hv, dk) = (d.k_heads * d.k_dim, d.value_width(), d.v_heads, d.k_dim);
                units.push(Unit::Linears(vec![
                    linear(attn("q_proj"), kw, h),
                    linear(attn("k_proj"), kw, h),
                    linear(attn("v_proj"), vw, h),
                ]));
                let std = Init::Normal(WEIGHT_STD);
                for (n, shape) in [
                    ("q_conv1d.weight", vec![kw, 1, d.conv_kernel]),
                    ("k_conv1d.weight", vec![kw, 1, d.conv_kernel]),
                    ("v_conv1d.weight", vec![vw, 1, d.conv_kernel]),
                    ("f_a_proj.weight", vec![dk, h]),
                    ("f_b_proj.weight", vec![hv * dk, dk]),
                    ("b_proj.weight", vec![hv, h]),
                    ("g_a_proj.weight", vec![dk, h]),
                    ("g_b_proj.weight", vec![vw, dk]),
                    // GLM-5.3-Flash stores A_log a value a head.
                    ("A_log", if glm { vec![hv] } else { vec![1, 1, hv, 1] }),
                    ("dt_bias", vec![hv * dk]),
                ] {
                    units.push(dense(attn(n), &shape, std));
                }
                units.push(dense(attn("o_norm.weight"), &[d.v_dim], Init::NormGain));
                vw
            }
            (Some((ql, kvl, nope, v)), None) => {
                // q_a, its norm, q_b (or one q_proj); kv_a_proj_with_mqa (latent + the shared
                // rotated part), its norm, kv_b (each head's unrotated key part and value).
                // Mistral Large 4: one q_proj, the query heads' scaling, and layers without
                // RoPE whose kv_b gives the rotated part's values too.
                let attn = |name: &str| format!("{p}.self_attn.{name}");
                let heads = spec.heads;
                let ml4 = spec.is_mistral_large4();
                match ql {
                    Some(ql) if !ml4 => {
                        units.push(Unit::Linears(vec![linear(attn("q_a_proj"), ql, h)]));
                        units.push(dense(attn("q_a_layernorm.weight"), &[ql], Init::NormGain));
                        units.push(Unit::Linears(vec![linear(
                            attn("q_b_proj"),
                            heads * (nope + hd),
                            ql,
                        )]));
                    }
                    _ => units.push(Unit::Linears(vec![linear(
                        attn("q_proj"),
                        heads * (nope + hd),
                        h,
                    )])),
                }
                let rope = if spec.rotates(l) { hd } else { 0 };
                units.push(Unit::Linears(vec![linear(
                    attn("kv_a_proj_with_mqa"),
                    kvl + rope,
                    h,
                )]));
                units.push(dense(attn("kv_a_layernorm.weight"), &[kvl], Init::NormGain));
                units.push(Unit::Linears(vec![linear(
                    attn("kv_b_proj"),
                    heads * (nope + hd - rope + v),
                    kvl,
                )]));
                // `scale * ln(pos + 1) + bias` per query head: about 1.
                let scaling = |units: &mut Vec<Unit>, module: String, n: usize| {
                    let scale = format!("{module}.softmax_scaling.scale");
                    units.push(dense(scale, &[n], Init::Normal(0.02)));
                    let bias = format!("{module}.softmax_scaling.bias");
                    units.push(dense(bias, &[n], Init::NormGain));
                };
                if ml4 {
                    scaling(&mut units, format!("{p}.self_attn"), heads);
                }
                let indexer = match spec.arch {
                    shapes::Arch::DeepseekV3 {
                        indexer: Some(ix),
                        q_lora_rank: ql,
                        ..
                    }
                    | shapes::Arch::Glm5Next {
                        indexer: ix,
                        q_lora_rank: ql,
                        ..
                    } => Some((ix, ql)),
                    _ => None,
                };
                if let Some((ix, ql)) = indexer {
                    // The lightning indexer: wq_b of the query latent (Mistral Large 4: of the
                    // LayerNorm-ed input), wk and its LayerNorm, weights_proj.
                    let ix_name = |name: &str| attn(&format!("indexer.{name}"));
                    let query_input = if ml4 { h } else { ql };
                    units.push(Unit::Linears(vec![linear(
                        ix_name("wq_b"),
                        ix.heads * ix.head_dim,
                        query_input,
                    )]));
                    units.push(Unit::Linears(vec![linear(ix_name("wk"), ix.head_dim, h)]));
                    let k_norm = ix_name("k_norm.weight");
                    units.push(dense(k_norm, &[ix.head_dim], Init::NormGain));
                    let bias = ix_name("k_norm.bias");
                    units.push(dense(bias, &[ix.head_dim], Init::Normal(0.02)));
                    units.push(Unit::Linears(vec![linear(
                        ix_name("weights_proj"),
                        ix.heads,
                        h,
                    )]));
                    // GLM-5.3-Flash's pools: their gate of the layer's input and a term a slot.
                    if let shapes::Arch::Glm5Next { pool, .. } = spec.arch {
                        let gate = ix_name("index_kpool_compress_gate");
                        units.push(dense(gate, &[ix.head_dim, h], Init::Normal(WEIGHT_STD)));
                        let ape = ix_name("index_kpool_compress_ape");
                        units.push(dense(ape, &[pool, ix.head_dim], Init::Normal(WEIGHT_STD)));
                    }
                    if ml4 {
                        let norm = ix_name("q_input_norm.weight");
                        units.push(dense(norm, &[h], Init::NormGain));
                        let bias = ix_name("q_input_norm.bias");
                        units.push(dense(bias, &[h], Init::Normal(0.02)));
                        scaling(&mut units, attn("indexer"), ix.heads);
                    }
                }
                heads * v
            }
            (None, None) => q,
        };
        // Qwen3.5's q_proj gives each head's output gate too.
        let q_out = if matches!(spec.arch, shapes::Arch::Qwen3_5(_)) {
            2 * q
        } else {
            q
        };
        if latent.is_none() && kimi_delta.is_none() {
            units.push(Unit::Linears(if fused {
                vec![linear(format!("{p}.self_attn.qkv_proj"), q + 2 * kv, h)]
            } else {
                vec![
                    linear(format!("{p}.self_attn.q_proj"), q_out, h),
                    linear(format!("{p}.self_attn.k_proj"), kv, h),
                    linear(format!("{p}.self_attn.v_proj"), kv, h),
                ]
            }));
        }
        if spec.has_qkv_bias() {
            for (n, out) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                let name = format!("{p}.self_attn.{n}.bias");
                units.push(dense(name, &[out], Init::Normal(WEIGHT_STD)));
            }
        }
        if spec.arch == shapes::Arch::GptOss {
            let name = format!("{p}.self_attn.o_proj.bias");
            units.push(dense(name, &[h], Init::Normal(WEIGHT_STD)));
            let name = format!("{p}.self_attn.sinks");
            units.push(dense(name, &[spec.heads], Init::Normal(1.0)));
        }
        if spec.has_qk_norm() {
            for (n, width) in ["q_norm", "k_norm"].into_iter().zip(spec.qk_norm_widths()) {
                units.push(dense(
                    format!("{p}.self_attn.{n}.weight"),
                    &[width],
                    Init::NormGain,
                ));
            }
        }
        units.push(Unit::Linears(vec![linear(
            format!("{p}.self_attn.o_proj"),
            h,
            o_in,
        )]));
        let norms: &[&str] = if gemma {
            &[
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            ]
        } else {
            &["post_attention_layernorm"]
        };
        for n in norms {
            units.push(dense(format!("{p}.{n}.weight"), &[h], Init::NormGain));
        }
        let mlp = |units: &mut Vec<Unit>, prefix: &str, [gate, up, down]: [&str; 3], i: usize| {
            units.push(Unit::Linears(if fused {
                vec![linear(format!("{prefix}.gate_up_proj"), 2 * i, h)]
            } else {
                vec![
                    linear(format!("{prefix}.{gate}"), i, h),
                    linear(format!("{prefix}.{up}"), i, h),
                ]
            }));
            units.push(Unit::Linears(vec![linear(
                format!("{prefix}.{down}"),
                h,
                i,
            )]));
        };
        match spec.moe {
            _ if matches!(spec.arch, shapes::Arch::Qwen3_5(_)) => {
                qwen3_5_mlp(spec, &mut units, &p);
            }
            Some(m) if spec.arch == shapes::Arch::GptOss => {
                // The router with its bias; the experts' interleaved gate_up and down with
                // their stacked biases.
                let router = format!("{p}.mlp.router");
                units.push(dense(
                    format!("{router}.weight"),
                    &[m.experts, h],
                    Init::Normal(WEIGHT_STD),
                ));
                units.push(dense(
                    format!("{router}.bias"),
                    &[m.experts],
                    Init::Normal(WEIGHT_STD),
                ));
                let ei = m.expert_intermediate;
                let prefix = format!("{p}.mlp.experts");
                let parts = vec![("gate_up_proj", 2 * ei, h), ("down_proj", h, ei)];
                for &(name, out, _) in &parts {
                    let bias = format!("{prefix}.{name}_bias");
                    units.push(dense(bias, &[m.experts, out], Init::Normal(WEIGHT_STD)));
                }
                units.push(Unit::Experts {
                    prefix,
                    experts: m.experts,
                    parts,
                });
            }
            Some(m) if spec.is_sparse(l) => {
                // Each expert a separate 2D linear, as llm-compressor writes them; the router
                // stays dense (ignored).
                let (block, names) = match spec.arch {
                    shapes::Arch::Mixtral
                    | shapes::Arch::MiniMaxM2
                    | shapes::Arch::KimiLinear { .. } => ("block_sparse_moe", ["w1", "w3", "w2"]),
                    shapes::Arch::Llama4 { .. } => ("feed_forward", QWEN_MLP),
                    _ => ("mlp", QWEN_MLP),
                };
                let router = match spec.arch {
                    shapes::Arch::Llama4 { .. } => "router",
                    _ => "gate",
                };
                units.push(dense(
                    format!("{p}.{block}.{router}.weight"),
                    &[m.experts, h],
                    Init::Normal(WEIGHT_STD),
                ));
                if spec.has_selection_bias() {
                    // MiniMax-M2 keeps it on the block, GLM and DeepSeek on the router.
                    let name = match spec.arch {
                        shapes::Arch::MiniMaxM2 => format!("{p}.{block}.e_score_correction_bias"),
                        _ => format!("{p}.{block}.gate.e_score_correction_bias"),
                    };
                    units.push(dense(name, &[m.experts], Init::Normal(WEIGHT_STD)));
                }
                for e in 0..m.experts {
                    let prefix = format!("{p}.{block}.experts.{e}");
                    mlp(&mut units, &prefix, names, m.expert_intermediate);
                }
                if m.shared > 0 {
                    let (shared, names) = match spec.arch {
                        shapes::Arch::Llama4 { .. } => ("shared_expert", names),
                        shapes::Arch::KimiLinear { .. } => ("shared_experts", QWEN_MLP),
                        _ => ("shared_experts", names),
                    };
                    let prefix = format!("{p}.{block}.{shared}");
                    mlp(&mut units, &prefix, names, m.shared * m.expert_intermediate);
                }
            }
            _ if matches!(spec.arch, shapes::Arch::KimiLinear { .. }) => {
                mlp(&mut units, &format!("{p}.block_sparse_moe"), QWEN_MLP, i)
            }
            _ if matches!(spec.arch, shapes::Arch::Llama4 { .. }) => {
                mlp(&mut units, &format!("{p}.feed_forward"), QWEN_MLP, i)
            }
            _ => mlp(&mut units, &format!("{p}.mlp"), QWEN_MLP, i),
        }
    }
    final_norm_and_head(&mut units, spec);
    units
}

/// A Qwen3.5 layer's MLP: dense, or the router (dense), the experts, the shared expert and
/// its gate (dense).
fn qwen3_5_mlp(spec: &ModelSpec, units: &mut Vec<Unit>, p: &str) {
    let h = spec.hidden;
    let linear = |prefix: String, out, inp| Linear { prefix, out, inp };
    let mlp = |units: &mut Vec<Unit>, prefix: String, i: usize| {
        units.push(Unit::Linears(vec![
            linear(format!("{prefix}.gate_proj"), i, h),
            linear(format!("{prefix}.up_proj"), i, h),
        ]));
        units.push(Unit::Linears(vec![linear(
            format!("{prefix}.down_proj"),
            h,
            i,
        )]));
    };
    let dense = |name: String, shape: &[usize]| Unit::Dense {
        name,
        shape: shape.to_vec(),
        init: Init::Normal(WEIGHT_STD),
    };
    match spec.moe {
        Some(m) => {
            units.push(dense(format!("{p}.mlp.gate.weight"), &[m.experts, h]));
            for e in 0..m.experts {
                mlp(units, format!("{p}.mlp.experts.{e}"), m.expert_intermediate);
            }
            mlp(units, format!("{p}.mlp.shared_expert"), m.gated_shared);
            units.push(dense(format!("{p}.mlp.shared_expert_gate.weight"), &[1, h]));
        }
        None => mlp(units, format!("{p}.mlp"), spec.intermediate),
    }
}

fn dense(name: String, shape: &[usize], init: Init) -> Unit {
    Unit::Dense {
        name,
        shape: shape.to_vec(),
        init,
    }
}

fn linears(parts: &[(String, usize, usize)]) -> Unit {
    Unit::Linears(
        parts
            .iter()
            .map(|(prefix, out, inp)| Linear {
                prefix: prefix.clone(),
                out: *out,
                inp: *inp,
            })
            .collect(),
    )
}

/// The token embeddings under transformers' usual name.
fn embeddings(spec: &ModelSpec) -> Unit {
    dense(
        "model.embed_tokens.weight".into(),
        &[spec.vocab, spec.hidden],
        Init::Normal(WEIGHT_STD),
    )
}

/// The final norm and, unless the embeddings are tied, `lm_head`, under transformers' usual
/// names.
fn final_norm_and_head(units: &mut Vec<Unit>, spec: &ModelSpec) {
    let h = spec.hidden;
    units.push(dense("model.norm.weight".into(), &[h], Init::NormGain));
    if !spec.tie_word_embeddings {
        let std = Init::Normal(WEIGHT_STD);
        units.push(dense("lm_head.weight".into(), &[spec.vocab, h], std));
    }
}

/// LFM2's tensors under its own names (`Lfm2DecoderLayer`): each layer's `operator_norm`, a
/// short convolution (`conv.in_proj`, the taps, `conv.out_proj`) or attention (`self_attn`
/// with `q_layernorm`/`k_layernorm`, `out_proj`), `ffn_norm` and `feed_forward.w1/w3/w2`;
/// `embedding_norm` last; the embeddings tied.
fn lfm2_units(spec: &ModelSpec, attention: &[usize]) -> Vec<Unit> {
    let (h, i, hd) = (spec.hidden, spec.intermediate, spec.head_dim);
    let (q, kv) = (spec.heads * hd, spec.kv_heads * hd);
    let std = Init::Normal(WEIGHT_STD);
    let mut units = vec![embeddings(spec)];
    for l in 0..spec.layers {
        let p = format!("model.layers.{l}");
        units.push(dense(
            format!("{p}.operator_norm.weight"),
            &[h],
            Init::NormGain,
        ));
        if attention.contains(&l) {
            let a = |n: &str| format!("{p}.self_attn.{n}");
            units.push(linears(&[
                (a("q_proj"), q, h),
                (a("k_proj"), kv, h),
                (a("v_proj"), kv, h),
            ]));
            for n in ["q_layernorm", "k_layernorm"] {
                units.push(dense(a(&format!("{n}.weight")), &[hd], Init::NormGain));
            }
            units.push(linears(&[(a("out_proj"), h, q)]));
        } else {
            let c = |n: &str| format!("{p}.conv.{n}");
            units.push(linears(&[(c("in_proj"), 3 * h, h)]));
            units.push(dense(c("conv.weight"), &[h, 1, 3], std));
            units.push(linears(&[(c("out_proj"), h, h)]));
        }
        units.push(dense(format!("{p}.ffn_norm.weight"), &[h], Init::NormGain));
        let f = |n: &str| format!("{p}.feed_forward.{n}");
        units.push(linears(&[(f("w1"), i, h), (f("w3"), i, h)]));
        units.push(linears(&[(f("w2"), h, i)]));
    }
    units.push(dense(
        "model.embedding_norm.weight".into(),
        &[h],
        Init::NormGain,
    ));
    units
}

/// Nemotron-H's tensors as its published checkpoints name them (`backbone.*`): each block's
/// `norm` and one `mixer`: Mamba-2 (`in_proj`, the taps and their bias, `A_log`, `dt_bias`,
/// `D`, the gated norm, `out_proj`), attention (`q/k/v/o_proj`) or the relu^2 MLP
/// (`up_proj`, `down_proj`); `norm_f` and `lm_head` last.
fn nemotron_h_units(spec: &ModelSpec, m: shapes::MambaSpec) -> Vec<Unit> {
    let (h, i) = (spec.hidden, spec.intermediate);
    let std = Init::Normal(WEIGHT_STD);
    let mut units = vec![dense(
        "backbone.embeddings.weight".into(),
        &[spec.vocab, h],
        std,
    )];
    for l in 0..spec.layers {
        let p = format!("backbone.layers.{l}");
        units.push(dense(format!("{p}.norm.weight"), &[h], Init::NormGain));
        let x = |n: &str| format!("{p}.mixer.{n}");
        match m.block(l) {
            'M' => mamba_units(&mut units, m, h, &x),
            '*' => attention_units(&mut units, spec, &x),
            'E' => {
                let e = spec
                    .moe
                    .expect("a Nemotron-H shape with mixtures has experts");
                // The router and its selection bias stay dense (ignored); each expert and the
                // shared expert an ungated up/down pair.
                units.push(dense(x("gate.weight"), &[e.experts, h], std));
                units.push(dense(x("gate.e_score_correction_bias"), &[e.experts], std));
                let w = e.expert_intermediate;
                for n in 0..e.experts {
                    let ex = |part: &str| x(&format!("experts.{n}.{part}"));
                    units.push(linears(&[(ex("up_proj"), w, h)]));
                    units.push(linears(&[(ex("down_proj"), h, w)]));
                }
                let s = e.shared * w;
                units.push(linears(&[(x("shared_experts.up_proj"), s, h)]));
                units.push(linears(&[(x("shared_experts.down_proj"), h, s)]));
            }
            _ => {
                units.push(linears(&[(x("up_proj"), i, h)]));
                units.push(linears(&[(x("down_proj"), h, i)]));
            }
        }
    }
    units.push(dense("backbone.norm_f.weight".into(), &[h], Init::NormGain));
    units.push(dense("lm_head.weight".into(), &[spec.vocab, h], std));
    units
}

/// An attention layer's `q/k/v_proj` (one unit) and `o_proj` under `x(…)`.
fn attention_units(units: &mut Vec<Unit>, spec: &ModelSpec, x: &dyn Fn(&str) -> String) {
    let (h, q, kv) = (
        spec.hidden,
        spec.heads * spec.head_dim,
        spec.kv_heads * spec.head_dim,
    );
    units.push(linears(&[
        (x("q_proj"), q, h),
        (x("k_proj"), kv, h),
        (x("v_proj"), kv, h),
    ]));
    units.push(linears(&[(x("o_proj"), h, q)]));
}

/// A Mamba-2 mixer's tensors under `x(…)`: `in_proj`, the taps and their bias, `A_log`,
/// `dt_bias`, `D`, the gated norm, `out_proj` (Nemotron-H's and Granite's alike).
fn mamba_units(units: &mut Vec<Unit>, m: shapes::MambaSpec, h: usize, x: &dyn Fn(&str) -> String) {
    let std = Init::Normal(WEIGHT_STD);
    let (inner, conv) = (m.inner(), m.conv_width());
    units.push(linears(&[(x("in_proj"), inner + conv + m.heads, h)]));
    units.push(dense(x("conv1d.weight"), &[conv, 1, m.conv_kernel], std));
    units.push(dense(x("conv1d.bias"), &[conv], std));
    for n in ["A_log", "dt_bias", "D"] {
        units.push(dense(x(n), &[m.heads], std));
    }
    units.push(dense(x("norm.weight"), &[inner], Init::NormGain));
    units.push(linears(&[(x("out_proj"), h, inner)]));
}

/// Granite 4.0-H's tensors as transformers names them: each layer's `input_layernorm`, its
/// `mamba` or `self_attn`, `post_attention_layernorm`, the mixture (`block_sparse_moe`: the
/// router `router.layer`, kept dense, and per-expert linears, as llm-compressor writes
/// them) and the `shared_mlp` (`input_linear`: gate and up fused, `output_linear`).
fn granite_units(spec: &ModelSpec, m: shapes::MambaSpec) -> Vec<Unit> {
    let (h, s) = (spec.hidden, spec.intermediate);
    let std = Init::Normal(WEIGHT_STD);
    let mut units = vec![embeddings(spec)];
    for l in 0..spec.layers {
        let p = format!("model.layers.{l}");
        let x = |n: &str| format!("{p}.{n}");
        units.push(dense(x("input_layernorm.weight"), &[h], Init::NormGain));
        match m.block(l) {
            'M' => mamba_units(&mut units, m, h, &|n| x(&format!("mamba.{n}"))),
            _ => attention_units(&mut units, spec, &|n| x(&format!("self_attn.{n}"))),
        }
        units.push(dense(
            x("post_attention_layernorm.weight"),
            &[h],
            Init::NormGain,
        ));
        if let Some(e) = spec.moe {
            units.push(dense(
                x("block_sparse_moe.router.layer.weight"),
                &[e.experts, h],
                std,
            ));
            let w = e.expert_intermediate;
            for n in 0..e.experts {
                let ex = |part: &str| x(&format!("block_sparse_moe.experts.{n}.{part}"));
                units.push(linears(&[(ex("gate_proj"), w, h), (ex("up_proj"), w, h)]));
                units.push(linears(&[(ex("down_proj"), h, w)]));
            }
        }
        units.push(linears(&[(x("shared_mlp.input_linear"), 2 * s, h)]));
        units.push(linears(&[(x("shared_mlp.output_linear"), h, s)]));
    }
    final_norm_and_head(&mut units, spec);
    units
}

/// Gemma 4's tensors as `Gemma4ForCausalLM` holds them (no per-layer inputs, no reused keys
/// and values, as its large models): every sixth layer full attention with heads of
/// `global` (width, key/value heads) and no `v_proj`; four sandwich norms and the
/// `layer_scalar`; with a mixture, the router (`proj` dense, `scale`, `per_expert_scale`), each
/// expert's linears as llm-compressor writes them and the mixture's three norms.
fn gemma4_units(spec: &ModelSpec, (global_dim, global_kv): (usize, usize)) -> Vec<Unit> {
    let (h, i) = (spec.hidden, spec.intermediate);
    let std = Init::Normal(WEIGHT_STD);
    let mut units = vec![embeddings(spec)];
    for l in 0..spec.layers {
        let p = format!("model.layers.{l}");
        let n = |name: &str| format!("{p}.{name}");
        units.push(dense(n("input_layernorm.weight"), &[h], Init::NormGain));
        let full = spec.is_full_gemma4(l);
        let (hd, kv_heads) = match full {
            true => (global_dim, global_kv),
            false => (spec.head_dim, spec.kv_heads),
        };
        let (q, kv) = (spec.heads * hd, kv_heads * hd);
        let a = |name: &str| n(&format!("self_attn.{name}"));
        let mut projections = vec![(a("q_proj"), q, h), (a("k_proj"), kv, h)];
        if !full {
            projections.push((a("v_proj"), kv, h));
        }
        units.push(linears(&projections));
        for norm in ["q_norm", "k_norm"] {
            units.push(dense(a(&format!("{norm}.weight")), &[hd], Init::NormGain));
        }
        units.push(linears(&[(a("o_proj"), h, q)]));
        let mut norms = vec![
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ];
        if spec.moe.is_some() {
            norms.extend([
                "post_feedforward_layernorm_1",
                "pre_feedforward_layernorm_2",
                "post_feedforward_layernorm_2",
            ]);
        }
        for norm in norms {
            units.push(dense(n(&format!("{norm}.weight")), &[h], Init::NormGain));
        }
        units.push(dense(n("layer_scalar"), &[1], Init::NormGain));
        let m = |name: &str| n(&format!("mlp.{name}"));
        units.push(linears(&[(m("gate_proj"), i, h), (m("up_proj"), i, h)]));
        units.push(linears(&[(m("down_proj"), h, i)]));
        if let Some(moe) = spec.moe {
            let (e, w) = (moe.experts, moe.expert_intermediate);
            units.push(dense(n("router.proj.weight"), &[e, h], std));
            units.push(dense(n("router.scale"), &[h], Init::NormGain));
            units.push(dense(n("router.per_expert_scale"), &[e], Init::NormGain));
            for x in 0..e {
                let ex = |name: &str| n(&format!("experts.{x}.{name}"));
                units.push(linears(&[(ex("gate_proj"), w, h), (ex("up_proj"), w, h)]));
                units.push(linears(&[(ex("down_proj"), h, w)]));
            }
        }
    }
    final_norm_and_head(&mut units, spec);
    units
}
