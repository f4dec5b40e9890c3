//! The linears of each decoder layer, by their checkpoint module names and shapes: attention,
//! then a dense MLP or a mixture of experts (router, routed experts, shared expert).

use super::config::{
    Architecture, Compression, DeltaNetLayout, ExpertNaming, LatentSource, MambaConfig, ModelConfig,
};

/// One linear layer as the checkpoint names it, with the shape the config implies.
#[derive(Clone, Debug)]
pub struct Module {
    pub name: String,
    pub out_features: usize,
    pub in_features: usize,
    pub bias: bool,
}

impl Module {
    pub fn new(name: String, out_features: usize, in_features: usize) -> Self {
        Self {
            name,
            out_features,
            in_features,
            bias: false,
        }
    }
}

/// A gated MLP: `down(act(gate(x)) * up(x))`; without `up`, `gate` is gpt-oss's fused
/// projection of gate and up interleaved, or an ungated MLP's one input projection
/// (Nemotron-H's `up_proj`: `down(relu(up(x))^2)`).
#[derive(Clone, Debug)]
pub struct Mlp {
    pub gate: Module,
    pub up: Option<Module>,
    pub down: Module,
}

impl Mlp {
    fn new(prefix: &str, [gate, up, down]: [&str; 3], hidden: usize, inner: usize) -> Self {
        Self {
            gate: Module::new(format!("{prefix}.{gate}"), inner, hidden),
            up: Some(Module::new(format!("{prefix}.{up}"), inner, hidden)),
            down: Module::new(format!("{prefix}.{down}"), hidden, inner),
        }
    }

    /// An ungated MLP, `down(act(up(x)))`: `up` held as the `gate` (Nemotron-H's relu^2).
    fn ungated(prefix: &str, [up, down]: [&str; 2], hidden: usize, inner: usize) -> Self {
        Self {
            gate: Module::new(format!("{prefix}.{up}"), inner, hidden),
            up: None,
            down: Module::new(format!("{prefix}.{down}"), hidden, inner),
        }
    }

    /// gpt-oss's expert, every linear with a bias: as its checkpoints hold it, `gate_up_proj`
    /// (gate and up interleaved) and `down_proj`; as its GGUF files do (`apart`), `gate_proj`,
    /// `up_proj` and `down_proj`.
    fn gpt_oss(prefix: &str, hidden: usize, inner: usize, apart: bool) -> Self {
        let biased = |name: &str, out, inp| Module {
            bias: true,
            ..Module::new(format!("{prefix}.{name}"), out, inp)
        };
        Self {
            gate: match apart {
                true => biased("gate_proj", inner, hidden),
                false => biased("gate_up_proj", 2 * inner, hidden),
            },
            up: apart.then(|| biased("up_proj", inner, hidden)),
            down: biased("down_proj", hidden, inner),
        }
    }

    pub fn linears(&self) -> Vec<&Module> {
        [Some(&self.gate), self.up.as_ref(), Some(&self.down)]
            .into_iter()
            .flatten()
            .collect()
    }
}

/// A mixture of experts: the router's logits pick each token's experts.
#[derive(Clone, Debug)]
pub struct SparseMlp {
    /// `[num_experts, hidden]`, no bias.
    pub router: Module,
    /// The routed experts, in router order.
    pub experts: Vec<Mlp>,
    /// The expert every token goes through, and the `[1, hidden]` linear whose sigmoid
    /// scales it where the family has one.
    pub shared: Option<(Mlp, Option<Module>)>,
    /// The common prefix of the experts' module names (`….mlp.experts`).
    pub experts_prefix: String,
    /// The tensor of the router's selection bias (`[num_experts]`, sigmoid routers).
    pub score_bias: Option<String>,
    /// The tensor naming each token's experts (`[vocab, experts_per_token]`, integers:
    /// DeepSeek-V4's hash-routed layers' `gate.tid2eid`).
    pub token_experts: Option<String>,
}

#[derive(Clone, Debug)]
pub enum FeedForward {
    Dense(Mlp),
    Sparse(SparseMlp),
    /// A dense MLP and a mixture beside it, each behind norms of its own (Gemma 4's
    /// `enable_moe_block`).
    DenseAndSparse(Mlp, SparseMlp),
}

impl FeedForward {
    /// The mixture of experts, where there is one.
    pub fn sparse(&self) -> Option<&SparseMlp> {
        match self {
            FeedForward::Sparse(s) | FeedForward::DenseAndSparse(_, s) => Some(s),
            FeedForward::Dense(_) => None,
        }
    }
}

/// A layer's projections into the attention's queries, keys and values.
#[derive(Clone, Debug)]
pub enum AttnProjections {
    /// `q_proj`, `k_proj`, `v_proj`; no `v_proj` where the values are the key projection's
    /// output, neither where the layer reuses an earlier layer's keys and values (Gemma 4).
    Heads {
        q: Module,
        k: Option<Module>,
        v: Option<Module>,
    },
    /// DeepSeek's latent attention (`MlaConfig`): `q_proj`, or `q_a_proj` then (normed)
    /// `q_b_proj` as `q`; `kv_a_proj_with_mqa`; `kv_b_proj`.
    Latent {
        q_a: Option<Module>,
        q: Module,
        /// None where the layer expands an earlier layer's latent (Mistral Large 4).
        kv_a: Option<Module>,
        kv_b: Module,
        /// The layer's own sparse-attention indexer (`IndexerConfig`).
        indexer: Option<IndexerModules>,
    },
    /// A gated DeltaNet (`linear_attn`, `DeltaNetConfig`); the layer's `o` is then `out_proj`
    /// (Kimi Delta Attention's: `self_attn.*`, `o_proj`).
    DeltaNet(DeltaNetProjections),
    /// LFM2's short convolution (`conv`, `ShortConvConfig`): `in_proj` gives B, C and x; the
    /// layer's `o` is `conv.out_proj`.
    ShortConv { in_proj: Module },
    /// Mamba-2 (`MambaConfig`): `in_proj` gives z, x/B/C and dt; the layer's `o` is
    /// `out_proj`.
    Mamba { in_proj: Module },
    /// DeepSeek-V4's attention (`DeepseekV4Layers`): `q_a_proj`, then (normed by `q_a_norm`)
    /// `q_b_proj`; one key/value head `kv_proj` (normed by `kv_norm`); the grouped `o_a_proj`
    /// read as one linear a group (`o_a_proj.groupN`, split by rows); the layer's `o` is
    /// `o_b_proj`.
    Compressed {
        q_a: Module,
        q_b: Module,
        kv: Module,
        o_a: Vec<Module>,
        compressor: Option<CompressorModules>,
    },
}

/// A DeepSeek-V4 compressor (`self_attn.compressor`): `kv_proj` and `gate_proj` of the layer's
/// input pooled by windows (with `position_bias`, then `kv_norm`), and in a sparse layer its
/// indexer (`compressor.indexer`): a compressor of its own, `q_b_proj` of the query latent
/// and `scorer.weights_proj`.
#[derive(Clone, Debug)]
pub struct CompressorModules {
    pub kv: Module,
    pub gate: Module,
    pub indexer: Option<[Module; 4]>,
}

/// DeepSeek sparse attention's lightning indexer (`self_attn.indexer`): `wq_b` of the query
/// latent, `wk` and `weights_proj` of the layer's input; its `k_norm` LayerNorm (weight and
/// bias) is read as vectors.
#[derive(Clone, Debug)]
pub struct IndexerModules {
    pub wq_b: Module,
    pub wk: Module,
    pub weights_proj: Module,
    /// `{prefix}.k_norm`: the LayerNorm's tensors are `.weight` and `.bias` of it.
    pub k_norm: String,
    /// `{prefix}.q_input_norm`, the LayerNorm before `wq_b` where it reads the layer's input
    /// (Mistral Large 4).
    pub q_norm: Option<String>,
}

/// A gated DeltaNet's input projections as the checkpoint stores them.
#[derive(Clone, Debug)]
pub enum DeltaNetProjections {
    /// Qwen3.5: `in_proj_qkv` (queries, keys and values for the convolution), `in_proj_z`
    /// (the output gate), `in_proj_b` and `in_proj_a` (one value per value head: beta's and
    /// the decay's inputs).
    Split {
        qkv: Module,
        z: Module,
        b: Module,
        a: Module,
    },
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, their outputs grouped by key head (each
    /// key head's query, key, values and gates `z`; its `b`s, then its `a`s).
    Fused { qkvz: Module, ba: Module },
    /// Kimi Delta Attention: `q_proj`, `k_proj`, `v_proj`; the decay's input `f_b_proj` of
    /// `f_a_proj`, the output gate `g_b_proj` of `g_a_proj` (low rank), `b_proj`.
    Kimi {
        q: Module,
        k: Module,
        v: Module,
        f_a: Module,
        f_b: Module,
        b: Module,
        g_a: Module,
        g_b: Module,
    },
}

impl DeltaNetProjections {
    pub fn linears(&self) -> Vec<&Module> {
        match self {
            Self::Split { qkv, z, b, a } => vec![qkv, z, b, a],
            Self::Fused { qkvz, ba } => vec![qkvz, ba],
            Self::Kimi {
                q,
                k,
                v,
                f_a,
                f_b,
                b,
                g_a,
                g_b,
            } => vec![q, k, v, f_a, f_b, b, g_a, g_b],
        }
    }
}

/// A layer's token mixer: its input projections and its output projection.
#[derive(Clone, Debug)]
pub struct Mixer {
    pub attn: AttnProjections,
    pub o: Module,
}

/// Every linear of one decoder layer.
#[derive(Clone, Debug)]
pub struct LayerModules {
    /// `None` in Nemotron-H's MLP blocks.
    pub mixer: Option<Mixer>,
    /// A second mixer beside the first, reading the same norm (Falcon-H1's Mamba-2).
    pub parallel: Option<Mixer>,
    /// `None` in Nemotron-H's mixer blocks.
    pub ffn: Option<FeedForward>,
    /// Gemma 4's per-layer input: `per_layer_input_gate` `[width, hidden]` and
    /// `per_layer_projection` `[hidden, width]`.
    pub per_layer_input: Option<[Module; 2]>,
}

impl LayerModules {
    /// The fused linears of a layer and the separate ones they hold, with their rows: Phi-3's
    /// `qkv_proj` (q, k, v) and `gate_up_proj` (gate, up); Granite's
    /// `shared_mlp.input_linear` (gate, up).
    pub fn fused_parts(c: &ModelConfig, layer: usize) -> Vec<(String, Vec<(String, usize)>)> {
        let p = format!("{}.layers.{layer}", c.prefix);
        if let Some(v4) = &c.deepseek_v4 {
            let o_a = format!("{p}.self_attn.o_a_proj");
            let groups = (0..v4.o_groups)
                .map(|g| (format!("{o_a}.group{g}"), v4.o_lora_rank))
                .collect();
            return vec![(o_a, groups)];
        }
        let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let part = |name: &str, rows| (format!("{p}.{name}"), rows);
        if c.architecture == Architecture::GraniteMoeHybrid {
            let shared = c.intermediate_size;
            return vec![(
                format!("{p}.shared_mlp.input_linear"),
                vec![
                    part("shared_mlp.gate_proj", shared),
                    part("shared_mlp.up_proj", shared),
                ],
            )];
        }
        if !c.fused_projections {
            return Vec::new();
        }
        vec![
            (
                format!("{p}.self_attn.qkv_proj"),
                vec![
                    part("self_attn.q_proj", q),
                    part("self_attn.k_proj", kv),
                    part("self_attn.v_proj", kv),
                ],
            ),
            (
                format!("{p}.mlp.gate_up_proj"),
                vec![
                    part("mlp.gate_proj", c.intermediate_size),
                    part("mlp.up_proj", c.intermediate_size),
                ],
            ),
        ]
    }

    pub fn new(c: &ModelConfig, layer: usize) -> Self {
        Self {
            mixer: c.has_mixer(layer).then(|| Self::mixer(c, layer)),
            parallel: c
                .mamba
                .filter(|_| c.parallel_mamba)
                .map(|m| Self::mamba(c, layer, c.names.mamba, m)),
            ffn: c.has_mlp(layer).then(|| Self::ffn(c, layer)),
            per_layer_input: c.gemma4.as_ref().and_then(|g| g.per_layer_inputs).map(|p| {
                let (h, w) = (c.hidden_size, p.width);
                let name = |n: &str| format!("{}.layers.{layer}.{n}", c.prefix);
                [
                    Module::new(name("per_layer_input_gate"), w, h),
                    Module::new(name("per_layer_projection"), h, w),
                ]
            }),
        }
    }

    fn ffn(c: &ModelConfig, layer: usize) -> FeedForward {
        let p = format!("{}.layers.{layer}", c.prefix);
        let h = c.hidden_size;
        const QWEN_MLP: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];
        let names = &c.names;
        let dense = || match c.mlp_activation.ungated() {
            true => {
                let [_, up, down] = names.mlp_linears;
                let block = format!("{p}.{}", names.mlp);
                Mlp::ungated(&block, [up, down], h, c.intermediate_size)
            }
            false => Mlp::new(
                &format!("{p}.{}", names.mlp),
                names.mlp_linears,
                h,
                c.mlp_width(layer),
            ),
        };
        match &c.moe {
            Some(m) if m.is_sparse(layer) => {
                let (block, names) = match m.naming {
                    ExpertNaming::Qwen | ExpertNaming::Glm | ExpertNaming::GptOss => {
                        ("mlp", QWEN_MLP)
                    }
                    ExpertNaming::Mixtral | ExpertNaming::KimiLinear => {
                        ("block_sparse_moe", ["w1", "w3", "w2"])
                    }
                    ExpertNaming::NemotronH => ("mixer", QWEN_MLP),
                    ExpertNaming::Lfm2 => ("feed_forward", ["w1", "w3", "w2"]),
                    ExpertNaming::Granite => ("block_sparse_moe", QWEN_MLP),
                    ExpertNaming::Gemma4 => ("", QWEN_MLP),
                    ExpertNaming::Llama4 => ("feed_forward", QWEN_MLP),
                };
                // Gemma 4's experts and router sit in the layer itself.
                let block_prefix = match block {
                    "" => p.clone(),
                    _ => format!("{p}.{block}"),
                };
                let gpt_oss = m.naming == ExpertNaming::GptOss;
                let ungated = c.mlp_activation.ungated();
                let mlp = |prefix: &str, names: [&str; 3], inner| match ungated {
                    true => Mlp::ungated(prefix, [names[1], names[2]], h, inner),
                    false => Mlp::new(prefix, names, h, inner),
                };
                let shared_name = match m.naming {
                    ExpertNaming::Glm | ExpertNaming::NemotronH | ExpertNaming::KimiLinear => {
                        "shared_experts"
                    }
                    _ => "shared_expert",
                };
                let experts_prefix = format!("{block_prefix}.experts");
                let experts = (0..m.num_experts)
                    .map(|e| {
                        let prefix = format!("{experts_prefix}.{e}");
                        if gpt_oss {
                            Mlp::gpt_oss(&prefix, h, m.expert_intermediate_size, c.from_gguf)
                        } else {
                            mlp(&prefix, names, m.expert_intermediate_size)
                        }
                    })
                    .collect();
                // Granite's shared MLP is the layer's own `shared_mlp`.
                let (shared_prefix, shared_names) = match m.naming {
                    ExpertNaming::Granite => (format!("{p}.{}", c.names.mlp), c.names.mlp_linears),
                    _ => (format!("{p}.{block}.{shared_name}"), QWEN_MLP),
                };
                let shared = m.shared_expert.map(|s| {
                    let mlp = mlp(&shared_prefix, shared_names, s.intermediate_size);
                    let gate = s
                        .gated
                        .then(|| Module::new(format!("{p}.{block}.shared_expert_gate"), 1, h));
                    (mlp, gate)
                });
                let sparse = SparseMlp {
                    router: if gpt_oss {
                        Module {
                            bias: true,
                            ..Module::new(format!("{p}.mlp.router"), m.num_experts, h)
                        }
                    } else if m.naming == ExpertNaming::Granite {
                        Module::new(format!("{p}.{block}.router.layer"), m.num_experts, h)
                    } else if m.naming == ExpertNaming::Gemma4 {
                        Module::new(format!("{p}.router.proj"), m.num_experts, h)
                    } else if m.naming == ExpertNaming::Llama4 {
                        Module::new(format!("{p}.{block}.router"), m.num_experts, h)
                    } else {
                        Module::new(format!("{p}.{block}.gate"), m.num_experts, h)
                    },
                    // DeepSeek-V4's hash-routed layers choose by the token: no bias.
                    score_bias: (m.selection_bias && !c.hash_routed(layer)).then(|| {
                        match m.naming {
                            ExpertNaming::Lfm2 => format!("{p}.{block}.expert_bias"),
                            ExpertNaming::Mixtral => format!("{p}.{block}.e_score_correction_bias"),
                            _ => format!("{p}.{block}.gate.e_score_correction_bias"),
                        }
                    }),
                    token_experts: c
                        .hash_routed(layer)
                        .then(|| format!("{p}.{block}.gate.tid2eid")),
                    experts,
                    shared,
                    experts_prefix,
                };
                match m.beside_dense {
                    true => FeedForward::DenseAndSparse(dense(), sparse),
                    false => FeedForward::Sparse(sparse),
                }
            }
            _ => FeedForward::Dense(dense()),
        }
    }

    fn mixer(c: &ModelConfig, layer: usize) -> Mixer {
        let p = format!("{}.layers.{layer}", c.prefix);
        let shape = c.heads_of(layer);
        let (h, q, kv) = (
            c.hidden_size,
            c.num_heads * shape.head_dim,
            shape.kv_heads * shape.head_dim,
        );
        let names = &c.names;
        let attn = |name: &str, out, inp, bias| Module {
            bias,
            ..Module::new(format!("{p}.{}.{name}", names.attn), out, inp)
        };
        if let Some(sc) = c.short_conv.filter(|_| c.is_short_conv(layer)) {
            let lin = |name: &str, out| Module {
                bias: sc.bias,
                ..Module::new(format!("{p}.conv.{name}"), out, h)
            };
            return Mixer {
                attn: AttnProjections::ShortConv {
                    in_proj: lin("in_proj", 3 * h),
                },
                o: lin("out_proj", h),
            };
        }
        if let Some(m) = c.mamba.filter(|_| c.is_mamba(layer)) {
            return Self::mamba(c, layer, names.mamba, m);
        }
        if let Some(v4) = &c.deepseek_v4 {
            let (heads, d) = (c.num_heads, c.head_dim);
            let group_in = heads * d / v4.o_groups;
            let compressor = v4.compression[layer].rate().map(|_| {
                let at = format!("{p}.self_attn.compressor");
                let lin = |name: &str, out, inp| Module::new(format!("{at}.{name}"), out, inp);
                let sparse = matches!(v4.compression[layer], Compression::Sparse { .. });
                let series = if sparse { 2 } else { 1 };
                let (ih, id) = (v4.index_heads, v4.index_head_dim);
                CompressorModules {
                    kv: lin("kv_proj", series * d, h),
                    gate: lin("gate_proj", series * d, h),
                    indexer: sparse.then(|| {
                        [
                            lin("indexer.kv_proj", 2 * id, h),
                            lin("indexer.gate_proj", 2 * id, h),
                            lin("indexer.q_b_proj", ih * id, v4.q_lora_rank),
                            lin("indexer.scorer.weights_proj", ih, h),
                        ]
                    }),
                }
            });
            return Mixer {
                attn: AttnProjections::Compressed {
                    q_a: attn("q_a_proj", v4.q_lora_rank, h, false),
                    q_b: attn("q_b_proj", heads * d, v4.q_lora_rank, false),
                    kv: attn("kv_proj", d, h, false),
                    o_a: (0..v4.o_groups)
                        .map(|g| {
                            attn(
                                &format!("o_a_proj.group{g}"),
                                v4.o_lora_rank,
                                group_in,
                                false,
                            )
                        })
                        .collect(),
                    compressor,
                },
                o: attn("o_b_proj", h, v4.o_groups * v4.o_lora_rank, false),
            };
        }
        if let Some(d) = c.delta_net.filter(|_| c.is_delta_net(layer)) {
            let lin =
                |name: &str, out, inp| Module::new(format!("{p}.linear_attn.{name}"), out, inp);
            let (value, key) = (d.value_width(), d.key_width());
            let projections = match d.layout {
                DeltaNetLayout::Fused => DeltaNetProjections::Fused {
                    qkvz: lin("in_proj_qkvz", d.conv_width() + value, h),
                    ba: lin("in_proj_ba", 2 * d.v_heads, h),
                },
                DeltaNetLayout::Split => DeltaNetProjections::Split {
                    qkv: lin("in_proj_qkv", d.conv_width(), h),
                    z: lin("in_proj_z", value, h),
                    b: lin("in_proj_b", d.v_heads, h),
                    a: lin("in_proj_a", d.v_heads, h),
                },
                DeltaNetLayout::Kimi => {
                    let rank = d.k_dim;
                    let projections = DeltaNetProjections::Kimi {
                        q: attn("q_proj", key, h, false),
                        k: attn("k_proj", key, h, false),
                        v: attn("v_proj", value, h, false),
                        f_a: attn("f_a_proj", rank, h, false),
                        f_b: attn("f_b_proj", d.v_heads * d.k_dim, rank, false),
                        b: attn("b_proj", d.v_heads, h, false),
                        g_a: attn("g_a_proj", rank, h, false),
                        g_b: attn("g_b_proj", value, rank, false),
                    };
                    return Mixer {
                        attn: AttnProjections::DeltaNet(projections),
                        o: attn(names.o, h, value, false),
                    };
                }
            };
            return Mixer {
                attn: AttnProjections::DeltaNet(projections),
                o: lin("out_proj", h, value),
            };
        }
        // A gated attention's q_proj gives each head's queries, then as many gate values.
        let q_out = if c.attn_output_gate { 2 * q } else { q };
        let (projections, o_in) = match &c.latent_dims(layer) {
            Some(m) => {
                let heads = c.num_heads;
                let q_out = heads * m.qk_head_dim();
                let (q_a, q) = match m.q_lora_rank {
                    Some(r) => (
                        Some(attn("q_a_proj", r, h, c.qkv_bias)),
                        attn("q_b_proj", q_out, r, false),
                    ),
                    None => (None, attn("q_proj", q_out, h, false)),
                };
                // The indexer's queries come from the query latent, or from the layer's input.
                let query_input = match &c.indexer {
                    Some(ix) if ix.query_from_input => Some(h),
                    _ => m.q_lora_rank,
                };
                let indexer = match (&c.indexer, query_input) {
                    (Some(ix), Some(input)) if ix.own_selection[layer] => {
                        let at = format!("{p}.{}.indexer", names.attn);
                        let lin =
                            |name: &str, out, inp| Module::new(format!("{at}.{name}"), out, inp);
                        Some(IndexerModules {
                            wq_b: lin("wq_b", ix.heads * ix.head_dim, input),
                            wk: lin("wk", ix.head_dim, h),
                            weights_proj: lin("weights_proj", ix.heads, h),
                            k_norm: format!("{at}.k_norm"),
                            q_norm: ix.query_from_input.then(|| format!("{at}.q_input_norm")),
                        })
                    }
                    _ => None,
                };
                let latent = AttnProjections::Latent {
                    indexer,
                    q_a,
                    q,
                    kv_a: match c.latent_source(layer) {
                        LatentSource::Reuses(_) => None,
                        LatentSource::Own | LatentSource::Stores => Some(attn(
                            "kv_a_proj_with_mqa",
                            m.kv_lora_rank + m.rope_dim,
                            h,
                            c.qkv_bias,
                        )),
                    },
                    kv_b: attn(
                        "kv_b_proj",
                        heads * (m.nope_dim + m.v_head_dim),
                        m.kv_lora_rank,
                        false,
                    ),
                };
                (latent, heads * m.v_head_dim)
            }
            None => {
                let own = c.kv_source(layer).is_none();
                let k = own.then(|| attn("k_proj", kv, h, c.qkv_bias));
                let v =
                    (own && !c.values_from_keys(layer)).then(|| attn("v_proj", kv, h, c.qkv_bias));
                let queries = attn("q_proj", q_out, h, c.qkv_bias);
                (AttnProjections::Heads { q: queries, k, v }, q)
            }
        };
        Mixer {
            attn: projections,
            o: attn(names.o, h, o_in, c.o_bias),
        }
    }

    /// A Mamba-2 mixer under `{layer}.{block}`.
    fn mamba(c: &ModelConfig, layer: usize, block: &str, m: MambaConfig) -> Mixer {
        let lin = |name: &str, out, inp, bias| Module {
            bias,
            ..Module::new(
                format!("{}.layers.{layer}.{block}.{name}", c.prefix),
                out,
                inp,
            )
        };
        let h = c.hidden_size;
        Mixer {
            attn: AttnProjections::Mamba {
                in_proj: lin("in_proj", m.in_proj_width(), h, m.in_bias),
            },
            o: lin("out_proj", h, m.inner(), m.out_bias),
        }
    }

    /// Every linear of the layer: attention (and the mixer beside it), then the MLP's (router, experts in order, shared
    /// expert and its gate).
    pub fn linears(&self) -> Vec<&Module> {
        let mut v = Vec::new();
        for m in self.mixer.iter().chain(&self.parallel) {
            match &m.attn {
                AttnProjections::Heads { q, k, v: vp } => {
                    v.extend(std::iter::once(q).chain(k).chain(vp))
                }
                AttnProjections::Latent {
                    q_a,
                    q,
                    kv_a,
                    kv_b,
                    indexer,
                } => {
                    v.extend(q_a.iter().chain([q]).chain(kv_a).chain([kv_b]));
                    if let Some(ix) = indexer {
                        v.extend([&ix.wq_b, &ix.wk, &ix.weights_proj]);
                    }
                }
                AttnProjections::DeltaNet(p) => v.extend(p.linears()),
                AttnProjections::Compressed {
                    q_a,
                    q_b,
                    kv,
                    o_a,
                    compressor,
                } => {
                    v.extend([q_a, q_b, kv]);
                    v.extend(o_a);
                    if let Some(c) = compressor {
                        v.extend([&c.kv, &c.gate]);
                        v.extend(c.indexer.iter().flatten());
                    }
                }
                AttnProjections::ShortConv { in_proj } | AttnProjections::Mamba { in_proj } => {
                    v.push(in_proj)
                }
            }
            v.push(&m.o);
        }
        if let Some(FeedForward::Dense(mlp) | FeedForward::DenseAndSparse(mlp, _)) = &self.ffn {
            v.extend(mlp.linears());
        }
        if let Some(s) = self.ffn.as_ref().and_then(FeedForward::sparse) {
            v.push(&s.router);
            v.extend(s.experts.iter().flat_map(Mlp::linears));
            if let Some((mlp, gate)) = &s.shared {
                v.extend(mlp.linears());
                v.extend(gate);
            }
        }
        v.extend(self.per_layer_input.iter().flatten());
        v
    }

    /// Whether `m` is one of the routed experts' linears (for per-token accounting).
    pub fn is_routed_expert(&self, m: &Module) -> bool {
        match self.ffn.as_ref().and_then(FeedForward::sparse) {
            Some(s) => m.name.starts_with(&format!("{}.", s.experts_prefix)),
            None => false,
        }
    }
}
