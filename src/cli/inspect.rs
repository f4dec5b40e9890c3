//! `quantppl inspect DIR`: what is in a checkpoint and what a GPU run would need.

use std::path::PathBuf;

use serde::Serialize;

use std::fmt::Write as _;

use super::print_output;
use crate::checkpoint::config::{Compression, DeltaNetLayout, LatentSource, MambaNorm, QkNorm};
use crate::checkpoint::{Checkpoint, LayerAttention, Summary};
use crate::numerics::FloatType;
use crate::units::human_bytes;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Model directory (`bundled`: the bundled default model).
    pub dir: PathBuf,
    /// Context length to size the activation memory for (default: min(2048, max_position_embeddings)).
    #[arg(long, value_name = "N")]
    pub ctx: Option<usize>,
    /// Also write the inspection as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(Serialize)]
struct LinearRow {
    name: String,
    out_features: usize,
    in_features: usize,
    scheme: String,
    bits_per_weight: f64,
    bytes: u64,
}

#[derive(Serialize)]
struct Inspection {
    dir: String,
    config: crate::checkpoint::ModelConfig,
    summary: Summary,
    linears: Vec<LinearRow>,
    /// Weights kept packed on the device: every tensor the language model reads, as stored.
    gpu_weight_bytes: u64,
    /// Tensors outside the language model (a vision tower's), never read, and their bytes.
    unread_tensors: usize,
    unread_bytes: u64,
    /// Activations of one window of `ctx` tokens as the batch sizer reserves them on a GPU
    /// with bf16 activations (`run::placement::activation_bytes_per_token`).
    gpu_activation_bytes_per_window: u64,
    gpu_scratch_bytes: u64,
    ctx: usize,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (dir, _) = crate::assets::model_dir_or_bundled(Some(&args.dir))?;
    let ckpt = Checkpoint::open(&dir)?;
    let c = &ckpt.config;
    let mut linears = Vec::new();
    let mut largest = 0u64;
    for layer in &ckpt.layers {
        for m in layer.linears() {
            let q = ckpt.linear(m)?;
            largest = largest.max((q.out_features * q.in_features) as u64 * 2);
            linears.push(LinearRow {
                name: q.name.to_string(),
                out_features: q.out_features,
                in_features: q.in_features,
                scheme: q.scheme_label(),
                bits_per_weight: q.bits_per_weight(),
                bytes: q.stored_bytes(),
            });
        }
    }
    let ctx = args.ctx.unwrap_or(2048.min(c.max_position_embeddings));
    // What the batch sizer reserves per token on a GPU running bf16 activations (the
    // default), the same function.
    let per_token = crate::run::placement::activation_bytes_per_token(
        (c, ckpt.experts_quantize_input()),
        FloatType::Bf16,
        false,
    );
    let summary = ckpt.summary()?;
    let (unread_tensors, unread_bytes) = ckpt.outside_language_model();
    let ins = Inspection {
        dir: ckpt.dir.display().to_string(),
        config: c.clone(),
        gpu_weight_bytes: summary.checkpoint_bytes - unread_bytes,
        unread_tensors,
        unread_bytes,
        gpu_activation_bytes_per_window: per_token * ctx as u64,
        gpu_scratch_bytes: largest,
        ctx,
        summary,
        linears,
    };
    let s = &ins.summary;
    let mut out = String::new();
    writeln!(out, "{}", ins.dir)?;
    writeln!(
        out,
        "  {} {} layers, hidden {}, intermediate {}, heads {}/{} kv, head_dim {}, vocab {}, max positions {}",
        s.architecture,
        c.num_layers,
        c.hidden_size,
        c.intermediate_size,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.vocab_size,
        c.max_position_embeddings
    )?;
    writeln!(
        out,
        "  dtype {}, {}, {} embeddings",
        if c.from_gguf {
            "GGUF (weights decoded to float32, activations as --dtype says)".to_string()
        } else {
            c.dtype.to_string()
        },
        match c.rotary_dim {
            0 => "no positions in attention (NoPE)".to_string(),
            _ if c.rope_interleaved => format!("rope {} on adjacent pairs", c.rope),
            _ => format!("rope {}", c.rope),
        },
        if c.tie_word_embeddings {
            "tied"
        } else {
            "untied"
        }
    )?;
    if let Some(m) = &c.mla {
        let q = m
            .q_lora_rank
            .map_or("one q_proj".to_string(), |r| format!("query rank {r}"));
        // Kimi-Linear's shared key part is not rotated (no RoPE).
        let shared = match (c.rotary_dim > 0, m.rope_interleave) {
            (false, _) => "unrotated",
            (true, true) => "rotated (interleaved)",
            (true, false) => "rotated",
        };
        writeln!(
            out,
            "  latent attention: {q}, kv rank {}, query/key heads {} + {} {shared}, value heads {}; softmax scale {:.6}",
            m.kv_lora_rank, m.nope_dim, m.rope_dim, m.v_head_dim, c.attn_scale
        )?;
    }
    // The attention's variants beyond heads and RoPE: which q/k norms, how much of each head
    // RoPE rotates, and queries scaled by position.
    let mut variants = Vec::new();
    match c.qk_norm {
        Some(QkNorm::Heads) => variants.push("q/k norms per head".to_string()),
        Some(QkNorm::Projection) => {
            variants.push("q/k norms over the whole projection".to_string())
        }
        Some(QkNorm::Weightless) => {
            variants.push("q/k heads RMS-normed without a weight where RoPE applies".to_string())
        }
        None => {}
    }
    if c.mla.is_none() && c.rotary_dim > 0 && c.rotary_dim < c.head_dim {
        variants.push(format!(
            "RoPE on {} of {} values a head",
            c.rotary_dim, c.head_dim
        ));
    }
    if let Some(q) = &c.query_scale {
        variants.push(format!(
            "queries scaled by 1 + {} ln(1 + floor(pos / {})) after RoPE",
            q.beta, q.period
        ));
    }
    if let Some(g) = &c.gemma4 {
        if let Some(h) = g.full_heads {
            variants.push(format!(
                "full-attention heads of {} ({} key/value)",
                h.head_dim, h.kv_heads
            ));
        }
        if g.values_from_keys {
            variants.push("full-attention values from the key projection".into());
        }
        variants.push("value heads RMS-normed".into());
        let reusing = g.kv_source.iter().flatten().count();
        if reusing > 0 {
            variants.push(format!(
                "the last {reusing} layers reuse earlier keys and values{}",
                match g.double_wide_shared_mlp {
                    true => " (with double-wide MLPs)",
                    false => "",
                }
            ));
        }
    }
    if let Some(l) = &c.llama4 {
        let rotating = l.rope_layers.iter().filter(|&&r| r).count();
        variants.push(format!(
            "RoPE on {rotating} of {} layers, the others without positions",
            c.num_layers
        ));
        if let Some(q) = &l.temperature {
            variants.push(format!(
                "their queries scaled by 1 + {} ln(1 + floor((pos + 1) / {}))",
                q.beta, q.period
            ));
        }
        let chunked = (0..c.num_layers)
            .filter(|&i| c.chunk_of(i).is_some())
            .count();
        if let (Some(n), true) = (l.chunk, chunked > 0) {
            variants.push(format!(
                "{chunked} layers attend within chunks of {n} positions"
            ));
        }
    }
    if let Some(m) = &c.mistral_large4 {
        let rotating = m.rope_layers.iter().filter(|&&r| r).count();
        variants.push(format!(
            "RoPE on {rotating} of {} layers (its frequencies times a learned exp(alpha))",
            c.num_layers
        ));
        let reusing: Vec<String> = (0..c.num_layers)
            .filter_map(|l| match c.latent_source(l) {
                LatentSource::Reuses(p) => Some(format!("{l} of {p}")),
                _ => None,
            })
            .collect();
        if !reusing.is_empty() {
            variants.push(format!(
                "layers expanding an earlier layer's latent: {}",
                reusing.join(", ")
            ));
        }
        variants.push("each query head scaled by scale * ln(pos + 1) + bias".into());
    }
    if !variants.is_empty() {
        writeln!(out, "  attention: {}", variants.join(", "))?;
    }
    if let Some(p) = c.gemma4.as_ref().and_then(|g| g.per_layer_inputs) {
        writeln!(
            out,
            "  per-layer inputs: {} a layer, from a {}-token table and the embeddings",
            p.width, p.vocab
        )?;
    }
    if let Some(ix) = &c.indexer {
        let own = ix.own_selection.iter().filter(|&&o| o).count();
        let shared = match c.num_layers - own {
            0 => String::new(),
            n => format!("; {n} of {} layers reuse the last selection", c.num_layers),
        };
        writeln!(
            out,
            "  sparse attention: each query's top {} keys by a {}-head indexer of {} ({}){shared}; \
             no more keys than that: dense; windows from {} tokens in the latent space (one key \
             head of the latent, its keys gathered)",
            ix.top_k,
            ix.heads,
            ix.head_dim,
            match (c.mla.is_some_and(|m| m.rope_dim == 0), ix.rope_interleave) {
                (true, _) => "no RoPE",
                (false, true) => "RoPE interleaved",
                (false, false) => "RoPE over halves",
            },
            crate::model::forward::LATENT_FROM_TOP_K * ix.top_k,
        )?;
        if let Some(p) = ix.pools {
            writeln!(
                out,
                "  the indexer scores pools of {} tokens and keeps {} of them{}",
                p.size,
                ix.top_k / p.size,
                if p.tail {
                    ", then the tokens after the last whole pool"
                } else {
                    ""
                }
            )?;
        }
    }
    if let Some(h) = &c.hyper {
        writeln!(
            out,
            "  hyper-connections: {} residual streams (Sinkhorn, {} iterations), collapsed after \
             the last layer by {}",
            h.streams,
            h.sinkhorn_iters,
            match h.head {
                crate::checkpoint::config::HyperHead::Weighted => "hc_head's weights",
                crate::checkpoint::config::HyperHead::Mean => "their mean",
            }
        )?;
    }
    if let Some(local) = &c.local_rope {
        writeln!(out, "  sliding layers' rope {local}")?;
    }
    // DeepSeek-V4's compressed layers slide their window too.
    let sliding = c
        .layer_types
        .iter()
        .filter(|&&t| matches!(t, LayerAttention::Sliding | LayerAttention::Compressed))
        .count();
    if let Some(v4) = &c.deepseek_v4 {
        let layers = |want: fn(&Compression) -> bool| -> String {
            let ls: Vec<String> = (v4.compression.iter().enumerate())
                .filter(|(_, c)| want(c))
                .map(|(l, _)| l.to_string())
                .collect();
            match ls.is_empty() {
                true => "none".into(),
                false => ls.join(", "),
            }
        };
        let heavy = v4.compression.iter().find_map(|c| match c {
            Compression::Heavy { rate } => Some(*rate),
            _ => None,
        });
        let sparse = v4.compression.iter().find_map(|c| match c {
            Compression::Sparse { rate } => Some(*rate),
            _ => None,
        });
        writeln!(
            out,
            "  compressed attention: entries of {} tokens, all seen (layers {}); of {} tokens \
             in overlapping windows, the indexer's top {} ({} heads x {}) (layers {})",
            heavy.map_or("-".into(), |r| r.to_string()),
            layers(|c| matches!(c, Compression::Heavy { .. })),
            sparse.map_or("-".into(), |r| r.to_string()),
            v4.index_top_k,
            v4.index_heads,
            v4.index_head_dim,
            layers(|c| matches!(c, Compression::Sparse { .. })),
        )?;
        writeln!(
            out,
            "  output in {} groups of rank {}; experts chosen by the token in layers {}",
            v4.o_groups,
            v4.o_lora_rank,
            (0..c.num_layers)
                .filter(|&l| c.hash_routed(l))
                .map(|l| l.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        )?;
    }
    if let (Some(w), true) = (c.sliding_window, sliding > 0) {
        writeln!(
            out,
            "  sliding window {w} on {sliding} of {} layers",
            c.num_layers
        )?;
    }
    if let Some(d) = &c.delta_net {
        let linear = c
            .layer_types
            .iter()
            .filter(|&&t| t == LayerAttention::Linear)
            .count();
        let rule = match (d.layout, c.kda_lower_bound) {
            (DeltaNetLayout::Kimi, None) => {
                "Kimi Delta Attention (a decay a key channel, sigmoid-gated norm)".to_string()
            }
            (DeltaNetLayout::Kimi, Some(lb)) => format!(
                "Kimi Delta Attention (a decay a key channel under a safe gate bounded by {lb}, \
                 sigmoid-gated norm)"
            ),
            _ => "gated DeltaNet".to_string(),
        };
        writeln!(
            out,
            "  {rule} on {linear} of {} layers: {} key heads x {}, {} value heads x {}{}, conv kernel {}",
            c.num_layers,
            d.k_heads,
            d.k_dim,
            d.v_heads,
            d.v_dim,
            if d.tiled_values {
                " (tiled by llama.cpp's converter)"
            } else {
                ""
            },
            d.conv_kernel
        )?;
    }
    if let Some(m) = &c.mamba {
        let place = match c.parallel_mamba {
            true => "beside the attention on every layer".to_string(),
            false => {
                let mamba = (0..c.num_layers).filter(|&l| c.is_mamba(l)).count();
                format!("on {mamba} of {} layers", c.num_layers)
            }
        };
        let norm = match m.norm {
            MambaNorm::GateFirst => "gated norm (gate first)",
            MambaNorm::NormFirst => "gated norm (norm first)",
            MambaNorm::Ungated => "no norm",
        };
        writeln!(
            out,
            "  Mamba-2 {place}: {} heads x {}, state {} in {} groups, conv kernel {}{}, dt in [{}, {}], {norm}",
            m.heads,
            m.head_dim,
            m.state,
            m.groups,
            m.conv_kernel,
            if m.conv_bias { " (biased)" } else { "" },
            m.dt_min,
            m.dt_max
        )?;
    }
    if let Some(u) = &c.multipliers {
        writeln!(
            out,
            "  multipliers: embedding {}, logits x{}, attention in/out {}/{}, Mamba in/out {}/{}, MLP gate/down {}/{}, in_proj parts {:?}",
            u.embedding,
            u.lm_head,
            u.attention_in,
            u.attention_out,
            u.ssm_in,
            u.ssm_out,
            u.mlp_gate,
            u.mlp_down,
            u.ssm_parts
        )?;
    }
    if c.one_part_blocks {
        let mlps = (0..c.num_layers).filter(|&l| !c.has_mixer(l)).count();
        writeln!(
            out,
            "  one part a block: {mlps} MLP or mixture blocks, {} mixer blocks",
            c.num_layers - mlps
        )?;
    }
    if let Some(sc) = &c.short_conv {
        let conv = (0..c.num_layers).filter(|&l| c.is_short_conv(l)).count();
        writeln!(
            out,
            "  short convolution on {conv} of {} layers: {} taps{}",
            c.num_layers,
            sc.taps,
            if sc.bias { ", biased" } else { "" }
        )?;
    }
    if c.attn_output_gate {
        writeln!(out, "  attention output gated by q_proj's second half")?;
    }
    if ins.unread_tensors > 0 {
        writeln!(
            out,
            "  not read: {} tensors ({}) outside the language model `{}` (a vision tower, MTP layers)",
            ins.unread_tensors,
            human_bytes(ins.unread_bytes),
            c.prefix
        )?;
    }
    if let Some(cap) = c.attn_softcap {
        writeln!(out, "  attention scores soft-capped at {cap}")?;
    }
    if let Some(cap) = c.final_softcap {
        writeln!(out, "  logits soft-capped at {cap}")?;
    }
    if let (Some(m), Some(e)) = (&c.moe, &s.experts) {
        writeln!(
            out,
            "  experts: {} per sparse layer ({} of {} layers), {} per token, width {}{}; {} active params per token",
            e.experts,
            e.sparse_layers,
            c.num_layers,
            e.experts_per_token,
            m.expert_intermediate_size,
            m.shared_expert
                .map(|s| format!(", shared expert of width {}", s.intermediate_size))
                .unwrap_or_default(),
            crate::units::human_count(e.active_params)
        )?;
        let bias = match m.selection_bias {
            true => "; a selection bias added for choosing",
            false => "",
        };
        let beside = match m.beside_dense {
            true => "; a factor per expert; beside each layer's dense MLP",
            false => "",
        };
        let on_input = match m.weights_on_input {
            true => "; the weights scale each expert's input",
            false => "",
        };
        writeln!(out, "  routing: {}{bias}{beside}{on_input}", m.router)?;
        writeln!(
            out,
            "  bits/weight: {:.3} routed experts, {:.3} other decoder linears",
            e.expert_bits_per_weight, e.other_bits_per_weight
        )?;
    }
    writeln!(out, "  quantization: {}", s.quantization)?;
    writeln!(out, "  lm_head: {}", s.lm_head)?;
    writeln!(out, "  activations: {}", s.activations)?;
    writeln!(
        out,
        "  {:.3} bits/weight over decoder linears; {} params; {} on disk",
        s.bits_per_weight,
        crate::units::human_count(s.params),
        human_bytes(s.checkpoint_bytes)
    )?;
    writeln!(
        out,
        "  GPU memory: {} packed weights + {} dequant scratch + {} activations per window of {} tokens",
        human_bytes(ins.gpu_weight_bytes),
        human_bytes(ins.gpu_scratch_bytes),
        human_bytes(ins.gpu_activation_bytes_per_window),
        ctx
    )?;
    writeln!(
        out,
        "  {:<44} {:>7} {:>7}  {:<28} {:>6}",
        "linear", "out", "in", "scheme", "bpw"
    )?;
    for r in &ins.linears {
        writeln!(
            out,
            "  {:<44} {:>7} {:>7}  {:<28} {:>6.3}",
            r.name, r.out_features, r.in_features, r.scheme, r.bits_per_weight
        )?;
    }
    print_output(&out, args.json.as_deref(), &ins)
}
