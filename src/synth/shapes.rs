//! Published model shapes and the HF `config.json` / `generation_config.json` they imply.
//!
//! The numbers are copied from the models' own `config.json` on the Hugging Face hub, so a
//! synthetic checkpoint exercises exactly the tensor sizes (and rope settings) of the real one.
//! Long (about 720 lines) as a table is: one entry a published model.

use serde_json::{Value, json};

use super::SynthShape;

/// DeepSeek sparse attention's indexer of a DeepSeek-V3 layout: `heads` of `head_dim`
/// keeping `top_k` keys a query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IndexerSpec {
    pub(crate) heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) top_k: usize,
    /// GLM-5 (`GlmMoeDsaForCausalLM`, the indexer's RoPE interleaved), else DeepSeek-V3.2.
    pub(crate) glm: bool,
}

/// Whose latent-attention mixture a DeepSeek-V3 layout is: DeepSeek's (a sigmoid router with
/// a selection bias, `DeepseekV3ForCausalLM` and its sparse-attention kin) or Mistral 4's
/// (`Mistral4ForCausalLM`: a grouped softmax router without one, no dense layer first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LatentFamily {
    DeepSeek,
    Mistral4,
    /// Mistral Large 4 (`MistralLarge4TextModel`): Mistral 4's router, one `q_proj` (the query
    /// rank unused), every fourth layer without RoPE, the query heads scaled by position, the
    /// indexer's queries from the layer's input, RoPE's learned `alpha`.
    MistralLarge4,
}

/// Which `*ForCausalLM` family the config declares: it decides `model_type`, the extra
/// config keys each family writes, and whether attention has q/k RMS norms (Qwen3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arch {
    Llama,
    Qwen3,
    Mistral,
    Qwen3Moe,
    Mixtral,
    /// GLM-4.5: q/k/v biases, partial rotary, sigmoid router with a selection bias, shared
    /// experts, the first layers dense.
    Glm4Moe,
    /// Gemma 3: q/k norms, sandwich norms, GELU-tanh, five sliding-window layers (window
    /// 1024, local RoPE base 10k) per global one (linear RoPE scaling 8).
    Gemma3 {
        query_pre_attn_scalar: usize,
    },
    /// Gemma 4: Gemma 3's layers with `w` norms, five sliding layers (window 1024) to one
    /// full-attention layer whose heads are `global_head_dim` wide, `global_kv_heads` of them
    /// holding keys that are also the values; with `moe`, a mixture beside every dense MLP.
    Gemma4 {
        global_head_dim: usize,
        global_kv_heads: usize,
    },
    /// Phi-3 / Phi-4: fused `qkv_proj` and `gate_up_proj`.
    Phi3,
    /// gpt-oss: q/k/v/o biases, attention sinks, alternating sliding (128) and full layers,
    /// YaRN; routed experts with biases, gate and up interleaved in one `gate_up_proj`.
    GptOss,
    /// DeepSeek-V3: multi-head latent attention of these ranks and head parts (`head_dim` is
    /// then the rotated part, as transformers writes it); GLM's router with 8 groups, top 4.
    DeepseekV3 {
        q_lora_rank: usize,
        kv_lora_rank: usize,
        nope_dim: usize,
        v_head_dim: usize,
        /// The router's `n_group` and `topk_group`.
        groups: [usize; 2],
        /// Whose layout: DeepSeek's (a sigmoid router with a selection bias) or Mistral 4's.
        family: LatentFamily,
        /// DeepSeek sparse attention (DeepSeek-V3.2, GLM-5).
        indexer: Option<IndexerSpec>,
    },
    /// Qwen3.5: three gated DeltaNet layers to one gated full-attention layer, partial
    /// rotary 0.25, q/k norms; with `moe`, Qwen3.5-MoE (a sigmoid-gated shared expert).
    Qwen3_5(DeltaSpec),
    /// LFM2: short-convolution layers but at `attention` (`full_attn_idxs`), q/k layernorms,
    /// tied embeddings, its own module names.
    Lfm2 {
        attention: &'static [usize],
    },
    /// Nemotron-H: one part a block as `pattern` (`hybrid_override_pattern`) lists them, Mamba-2
    /// of this geometry, attention without positions, relu^2 MLPs; `backbone.*` names.
    NemotronH(MambaSpec),
    /// MiniMax-M2: q/k RMS norms over the whole projection, half of each head rotated
    /// (`rotary_dim`), Mixtral's expert names with a sigmoid router and its
    /// `e_score_correction_bias`.
    MiniMaxM2,
    /// Llama 4: Llama's attention (no q/k norm weights: they are weightless), chunked
    /// attention with RoPE on all but every fourth layer; a mixture of the spec's experts (top
    /// 1, a shared expert of an expert's width) in every `moe_step`-th layer, the others a
    /// dense MLP of `intermediate`; `feed_forward.*` names.
    Llama4 {
        moe_step: usize,
    },
    /// Kimi-Linear: Kimi Delta Attention (`delta`'s geometry, key and value heads alike) but at
    /// the `full` layers, latent attention without RoPE and without a query LoRA there;
    /// DeepSeek-V3's mixture under `block_sparse_moe` (experts `w1/w3/w2`); transformers' saved
    /// config keys.
    KimiLinear {
        kv_lora_rank: usize,
        nope_dim: usize,
        v_head_dim: usize,
        full: &'static [usize],
        delta: DeltaSpec,
    },
    /// GLM-5.3-Flash: Kimi Delta Attention (`delta`, `A_log` a value a head) under the safe
    /// gate but at every fourth layer, latent attention without RoPE there (a query rank) with
    /// the indexer `indexer` scoring pools of `pool` tokens; `streams` residual streams mixed by
    /// hyper-connections (`hc_attn_*`, `hc_ffn_*` a layer); DeepSeek-V3's mixture under `mlp`.
    Glm5Next {
        q_lora_rank: usize,
        kv_lora_rank: usize,
        nope_dim: usize,
        v_head_dim: usize,
        indexer: IndexerSpec,
        pool: usize,
        streams: usize,
        delta: DeltaSpec,
    },
    /// Granite 4.0-H: Mamba-2 (`M`) or attention without positions (`*`) as `pattern` lists
    /// them, every layer a shared SwiGLU MLP of `intermediate` (`shared_mlp.input_linear`
    /// fused gate and up) plus the spec's mixture; Granite's multipliers.
    Granite(MambaSpec),
}

/// Nemotron-H's Mamba-2 geometry and block pattern (`M` Mamba-2, `*` attention, `-` MLP, `E`
/// the mixture of the spec's `moe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MambaSpec {
    pub heads: usize,
    pub head_dim: usize,
    pub state: usize,
    pub groups: usize,
    pub conv_kernel: usize,
    pub pattern: &'static str,
}

impl MambaSpec {
    /// Block `l`'s kind: `M`, `*`, `-` or `E`.
    pub(crate) fn block(&self, l: usize) -> char {
        self.pattern.chars().nth(l).unwrap_or('-')
    }

    pub(crate) fn inner(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The convolved channels: x, B, C.
    pub(crate) fn conv_width(&self) -> usize {
        self.inner() + 2 * self.groups * self.state
    }
}

/// Gated DeltaNet's geometry (`linear_*` keys of config.json).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeltaSpec {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub conv_kernel: usize,
    /// Qwen3-Next's layout: `in_proj_qkvz` and `in_proj_ba` (grouped by key head) instead of
    /// Qwen3.5's four projections; the config then declares Qwen3-Next.
    pub fused: bool,
}

impl DeltaSpec {
    /// The convolved channels: queries, keys, values.
    pub(crate) fn conv_width(&self) -> usize {
        2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim
    }

    pub(crate) fn value_width(&self) -> usize {
        self.v_heads * self.v_dim
    }
}

/// The mixture of experts of a sparse shape (every layer sparse, as in the published ones).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MoeSpec {
    pub experts: usize,
    pub experts_per_token: usize,
    pub expert_intermediate: usize,
    /// Shared experts fused into one MLP of `shared x expert_intermediate` (GLM; else 0).
    pub shared: usize,
    /// Leading layers with a dense MLP of `intermediate` (GLM's `first_k_dense_replace`).
    pub first_dense: usize,
    /// The width of Qwen's sigmoid-gated `shared_expert` (Qwen3.5-MoE; else 0).
    pub gated_shared: usize,
}

impl MoeSpec {
    /// `experts` routed experts of width `expert_intermediate`, `experts_per_token` per
    /// token, every layer sparse, no shared expert.
    pub(crate) const fn routed(
        experts: usize,
        experts_per_token: usize,
        expert_intermediate: usize,
    ) -> Self {
        Self {
            experts,
            experts_per_token,
            expert_intermediate,
            shared: 0,
            first_dense: 0,
            gated_shared: 0,
        }
    }
}

/// Everything about a model's shape that the tensor list and config.json depend on.
#[derive(Clone, Debug)]
pub(crate) struct ModelSpec {
    pub arch: Arch,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    /// The `rope_scaling` object, `null` for plain rope.
    pub rope_scaling: Value,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    pub bos_token_id: u32,
    pub eos_token_id: u32,
    pub moe: Option<MoeSpec>,
}

/// Kimi Delta Attention's projections a synth checkpoint keeps dense (with the conv taps and
/// the decay's vectors): the low-rank decay and output-gate pairs and `b_proj`, about 2 % of
/// the layer; named in `ignore` as transformers' modules are (the decay's pair under
/// `forget_gate`, which compressed-tensors matches), stored under the checkpoint's names.
pub(crate) const KIMI_DENSE_PROJECTIONS: [&str; 5] = [
    "forget_gate.f_a_proj",
    "forget_gate.f_b_proj",
    "b_proj",
    "g_a_proj",
    "g_b_proj",
];

impl SynthShape {
    /// This Qwen3.5 shape's DeltaNet geometry.
    fn delta(self) -> DeltaSpec {
        match self.spec().arch {
            Arch::Qwen3_5(d) => d,
            other => unreachable!("{self:?} is {other:?}, not a Qwen3.5 shape"),
        }
    }

    /// The published configuration of this shape.
    pub(crate) fn spec(self) -> ModelSpec {
        let llama3 = |hidden, intermediate, layers, heads| ModelSpec {
            arch: Arch::Llama,
            hidden,
            intermediate,
            layers,
            heads,
            kv_heads: 8,
            head_dim: 128,
            vocab: 128_256,
            max_position_embeddings: 8192,
            rope_theta: 500_000.0,
            rope_scaling: Value::Null,
            rms_norm_eps: 1e-5,
            tie_word_embeddings: false,
            bos_token_id: 128_000,
            eos_token_id: 128_001,
            moe: None,
        };
        match self {
            // meta-llama/Meta-Llama-3-8B
            SynthShape::Llama3_8b => llama3(4096, 14_336, 32, 32),
            // meta-llama/Llama-3.1-8B: Llama 3 8B with 128k context through llama3 rope scaling.
            SynthShape::Llama31_8b => ModelSpec {
                max_position_embeddings: 131_072,
                rope_scaling: json!({
                    "factor": 8.0,
                    "high_freq_factor": 4.0,
                    "low_freq_factor": 1.0,
                    "original_max_position_embeddings": 8192,
                    "rope_type": "llama3"
                }),
                ..llama3(4096, 14_336, 32, 32)
            },
            // meta-llama/Meta-Llama-3-70B
            SynthShape::Llama3_70b => llama3(8192, 28_672, 80, 64),
            // Qwen/Qwen3-8B
            SynthShape::Qwen3_8b => ModelSpec {
                arch: Arch::Qwen3,
                hidden: 4096,
                intermediate: 12_288,
                layers: 36,
                heads: 32,
                kv_heads: 8,
                head_dim: 128,
                vocab: 151_936,
                max_position_embeddings: 40_960,
                rope_theta: 1_000_000.0,
                rope_scaling: Value::Null,
                rms_norm_eps: 1e-6,
                tie_word_embeddings: false,
                bos_token_id: 151_643,
                eos_token_id: 151_645,
                moe: None,
            },
            // Qwen/Qwen3-0.6B: a small real shape with tied embeddings.
            SynthShape::Qwen3_0_6b => ModelSpec {
                hidden: 1024,
                intermediate: 3072,
                layers: 28,
                heads: 16,
                tie_word_embeddings: true,
                ..SynthShape::Qwen3_8b.spec()
            },
            // mistralai/Mistral-Large-Instruct-2407
            SynthShape::MistralLarge123b => ModelSpec {
                arch: Arch::Mistral,
                hidden: 12_288,
                intermediate: 28_672,
                layers: 88,
                heads: 96,
                kv_heads: 8,
                head_dim: 128,
                vocab: 32_768,
                max_position_embeddings: 131_072,
                rope_theta: 1_000_000.0,
                rope_scaling: Value::Null,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: false,
                bos_token_id: 1,
                eos_token_id: 2,
                moe: None,
            },
            // Qwen/Qwen3-30B-A3B
            SynthShape::Qwen3_30bA3b => ModelSpec {
                arch: Arch::Qwen3Moe,
                hidden: 2048,
                intermediate: 6144,
                layers: 48,
                heads: 32,
                kv_heads: 4,
                moe: Some(MoeSpec::routed(128, 8, 768)),
                ..SynthShape::Qwen3_8b.spec()
            },
            // Qwen/Qwen3-235B-A22B
            SynthShape::Qwen3_235bA22b => ModelSpec {
                hidden: 4096,
                intermediate: 12_288,
                layers: 94,
                heads: 64,
                moe: Some(MoeSpec::routed(128, 8, 1536)),
                ..SynthShape::Qwen3_30bA3b.spec()
            },
            // Qwen/Qwen3.5-35B-A3B's language model, as transformers' Qwen3_5MoeTextConfig
            // defaults describe it (256 experts of 512, 8 per token, a shared expert of 512).
            SynthShape::Qwen3_5_35bA3b => ModelSpec {
                arch: Arch::Qwen3_5(DeltaSpec {
                    k_heads: 16,
                    v_heads: 32,
                    k_dim: 128,
                    v_dim: 128,
                    conv_kernel: 4,
                    fused: false,
                }),
                hidden: 2048,
                intermediate: 0,
                layers: 40,
                heads: 16,
                kv_heads: 2,
                head_dim: 256,
                vocab: 248_320,
                max_position_embeddings: 262_144,
                rope_theta: 10_000_000.0,
                rope_scaling: Value::Null,
                rms_norm_eps: 1e-6,
                tie_word_embeddings: false,
                bos_token_id: 248_044,
                eos_token_id: 248_044,
                moe: Some(MoeSpec {
                    gated_shared: 512,
                    ..MoeSpec::routed(256, 8, 512)
                }),
            },
            // Qwen/Qwen3-Next-80B-A3B's geometry as transformers' Qwen3NextConfig defaults
            // describe it (48 layers, 512 experts of 512, 10 per token, a shared expert of
            // 512, the DeltaNets' projections fused); vocabulary, RoPE and tokens as the
            // qwen3.5-35b-a3b shape.
            SynthShape::Qwen3Next80bA3b => ModelSpec {
                arch: Arch::Qwen3_5(DeltaSpec {
                    fused: true,
                    ..SynthShape::Qwen3_5_35bA3b.delta()
                }),
                intermediate: 5632,
                layers: 48,
                vocab: 151_936,
                moe: Some(MoeSpec {
                    gated_shared: 512,
                    ..MoeSpec::routed(512, 10, 512)
                }),
                ..SynthShape::Qwen3_5_35bA3b.spec()
            },
            // Qwen3-Next's layout at the size of the tests' fixtures.
            SynthShape::TinyQwen3Next => ModelSpec {
                arch: Arch::Qwen3_5(DeltaSpec {
                    fused: true,
                    ..SynthShape::TinyQwen3_5Moe.delta()
                }),
                intermediate: 128,
                ..SynthShape::TinyQwen3_5Moe.spec()
            },
            // A Qwen3.5 9B-style dense model, as transformers' Qwen3_5TextConfig defaults
            // describe it.
            SynthShape::Qwen3_5_9b => ModelSpec {
                hidden: 4096,
                intermediate: 12_288,
                layers: 32,
                kv_heads: 4,
                moe: None,
                ..SynthShape::Qwen3_5_35bA3b.spec()
            },
            // Qwen/Qwen3.5-27B's text_config: 64 layers (every fourth gated attention of 24
            // heads of 256, 4 kv heads), DeltaNets of 16 key and 48 value heads of 128, dense
            // MLPs of 17,408.
            SynthShape::Qwen3_5_27b => ModelSpec {
                arch: Arch::Qwen3_5(DeltaSpec {
                    k_heads: 16,
                    v_heads: 48,
                    k_dim: 128,
                    v_dim: 128,
                    conv_kernel: 4,
                    fused: false,
                }),
                hidden: 5120,
                intermediate: 17_408,
                layers: 64,
                heads: 24,
                kv_heads: 4,
                moe: None,
                ..SynthShape::Qwen3_5_35bA3b.spec()
            },
            // Qwen3.5-MoE's layout at the size of the tests' fixtures (layers 4: three
            // DeltaNets, then attention).
            SynthShape::TinyQwen3_5Moe => ModelSpec {
                arch: Arch::Qwen3_5(DeltaSpec {
                    k_heads: 2,
                    v_heads: 4,
                    k_dim: 32,
                    v_dim: 32,
                    conv_kernel: 4,
                    fused: false,
                }),
                hidden: 256,
                layers: 4,
                heads: 4,
                kv_heads: 2,
                head_dim: 64,
                vocab: 512,
                bos_token_id: 1,
                eos_token_id: 2,
                moe: Some(MoeSpec {
                    gated_shared: 128,
                    ..MoeSpec::routed(8, 2, 128)
                }),
                ..SynthShape::Qwen3_5_35bA3b.spec()
            },
            // LiquidAI/LFM2-1.2B: 16 layers, 6 of them attention; the MLP width 8192 as
            // `Lfm2MLP` derives it from `block_ff_dim` 12288 (written here as derived, with
            // `block_auto_adjust_ff_dim` off).
            SynthShape::Lfm2_1_2b => ModelSpec {
                arch: Arch::Lfm2 {
                    attention: &[2, 5, 8, 10, 12, 14],
                },
                hidden: 2048,
                intermediate: 8192,
                layers: 16,
                heads: 32,
                kv_heads: 8,
                head_dim: 64,
                vocab: 65_536,
                max_position_embeddings: 128_000,
                rope_theta: 1_000_000.0,
                rope_scaling: Value::Null,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: true,
                bos_token_id: 1,
                eos_token_id: 7,
                moe: None,
            },
            // LiquidAI/LFM2-2.6B: 30 layers, 8 of them attention, 2,569,272,320 parameters as
            // its card gives them, which with LFM2-1.2B's hidden size and heads leave MLPs of
            // exactly 10,752 (42 x 256, its `block_multiple_of`). Its config's list of attention
            // layers was not at hand: spread here as LFM2-1.2B's are (the count, not the places,
            // sets the cost).
            SynthShape::Lfm2_2_6b => ModelSpec {
                arch: Arch::Lfm2 {
                    attention: &[2, 6, 10, 14, 18, 21, 24, 27],
                },
                intermediate: 10_752,
                layers: 30,
                ..SynthShape::Lfm2_1_2b.spec()
            },
            // nvidia/Nemotron-H-8B-Base-8K: 52 blocks (24 Mamba-2, 4 attention, 24 MLP).
            SynthShape::NemotronH8b => ModelSpec {
                arch: Arch::NemotronH(MambaSpec {
                    heads: 128,
                    head_dim: 64,
                    state: 128,
                    groups: 8,
                    conv_kernel: 4,
                    pattern: "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
                }),
                hidden: 4096,
                intermediate: 21_504,
                layers: 52,
                heads: 32,
                kv_heads: 8,
                head_dim: 128,
                vocab: 131_072,
                max_position_embeddings: 8192,
                rope_theta: 10_000.0,
                rope_scaling: Value::Null,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: false,
                bos_token_id: 1,
                eos_token_id: 2,
                moe: None,
            },
            // nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B: 52 blocks (23 Mamba-2, 23 mixtures of 128
            // ungated experts of 1856, 6 per token, a shared expert of 3712; 6 attention).
            SynthShape::Nemotron3Nano30bA3b => ModelSpec {
                arch: Arch::NemotronH(MambaSpec {
                    heads: 64,
                    head_dim: 64,
                    state: 128,
                    groups: 8,
                    conv_kernel: 4,
                    pattern: "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
                }),
                hidden: 2688,
                intermediate: 1856,
                layers: 52,
                heads: 32,
                kv_heads: 2,
                head_dim: 128,
                max_position_embeddings: 262_144,
                moe: Some(MoeSpec {
                    shared: 2,
                    ..MoeSpec::routed(128, 6, 1856)
                }),
                ..SynthShape::NemotronH8b.spec()
            },
            // ibm-granite/granite-4.0-h-small: 40 layers (attention at 5, 15, 25, 35), Mamba-2
            // of 128 heads of 64 (mamba_expand 2), state 128, one group; 72 experts of 768, 10
            // per token, beside every layer's shared MLP of 1536; tied embeddings.
            SynthShape::Granite4HSmall => ModelSpec {
                arch: Arch::Granite(MambaSpec {
                    heads: 128,
                    head_dim: 64,
                    state: 128,
                    groups: 1,
                    conv_kernel: 4,
                    pattern: "MMMMM*MMMMMMMMM*MMMMMMMMM*MMMMMMMMM*MMMM",
                }),
                hidden: 4096,
                intermediate: 1536,
                layers: 40,
                heads: 32,
                kv_heads: 8,
                head_dim: 128,
                vocab: 100_352,
                max_position_embeddings: 131_072,
                rope_theta: 10_000_000.0,
                rope_scaling: Value::Null,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: true,
                bos_token_id: 100_257,
                eos_token_id: 100_257,
                moe: Some(MoeSpec::routed(72, 10, 768)),
            },
            // Granite 4.0-H's layout at the size of the tests' fixtures.
            SynthShape::TinyGranite4H => ModelSpec {
                arch: Arch::Granite(MambaSpec {
                    heads: 8,
                    head_dim: 32,
                    state: 16,
                    groups: 2,
                    conv_kernel: 4,
                    pattern: "M*M",
                }),
                hidden: 256,
                intermediate: 128,
                layers: 3,
                heads: 4,
                kv_heads: 2,
                head_dim: 64,
                vocab: 512,
                bos_token_id: 1,
                eos_token_id: 2,
                moe: Some(MoeSpec::routed(4, 2, 128)),
                ..SynthShape::Granite4HSmall.spec()
            },
            // Nemotron-H's layout at the size of the tests' fixtures.
            SynthShape::TinyNemotronH => ModelSpec {
                arch: Arch::NemotronH(MambaSpec {
                    heads: 8,
                    head_dim: 32,
                    state: 16,
                    groups: 2,
                    conv_kernel: 4,
                    pattern: "ME*-ME",
                }),
                hidden: 256,
                intermediate: 384,
                layers: 6,
                heads: 4,
                kv_heads: 2,
                head_dim: 64,
                vocab: 512,
                moe: Some(MoeSpec {
                    shared: 2,
                    ..MoeSpec::routed(8, 2, 128)
                }),
                ..SynthShape::NemotronH8b.spec()
            },
            // LFM2's layout at the size of the tests' fixtures.
            SynthShape::TinyLfm2 => ModelSpec {
                arch: Arch::Lfm2 { attention: &[1] },
                hidden: 256,
                intermediate: 384,
                layers: 3,
                heads: 4,
                kv_heads: 2,
                vocab: 512,
                ..SynthShape::Lfm2_1_2b.spec()
            },
            // mistralai/Mixtral-8x7B-v0.1
            SynthShape::Mixtral8x7b => ModelSpec {
                arch: Arch::Mixtral,
                hidden: 4096,
                intermediate: 14_336,
                layers: 32,
                heads: 32,
                vocab: 32_000,
                max_position_embeddings: 32_768,
                moe: Some(MoeSpec::routed(8, 2, 14_336)),
                ..SynthShape::MistralLarge123b.spec()
            },
            // zai-org/GLM-4.5-Air (106B, 12B active)
            SynthShape::Glm45Air => ModelSpec {
                arch: Arch::Glm4Moe,
                hidden: 4096,
                intermediate: 10_944,
                layers: 46,
                heads: 96,
                kv_heads: 8,
                head_dim: 128,
                vocab: 151_552,
                max_position_embeddings: 131_072,
                rope_theta: 1_000_000.0,
                rope_scaling: Value::Null,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: false,
                bos_token_id: 151_329,
                eos_token_id: 151_329,
                moe: Some(MoeSpec {
                    shared: 1,
                    first_dense: 1,
                    ..MoeSpec::routed(128, 8, 1408)
                }),
            },
            // MiniMaxAI/MiniMax-M2
            SynthShape::MiniMaxM2 => ModelSpec {
                arch: Arch::MiniMaxM2,
                hidden: 3072,
                intermediate: 1536,
                layers: 62,
                heads: 48,
                kv_heads: 8,
                head_dim: 128,
                vocab: 200_064,
                max_position_embeddings: 196_608,
                rope_theta: 5_000_000.0,
                rope_scaling: Value::Null,
                rms_norm_eps: 1e-6,
                tie_word_embeddings: false,
                bos_token_id: 200_034,
                eos_token_id: 200_020,
                moe: Some(MoeSpec::routed(256, 8, 1536)),
            },
            SynthShape::TinyMiniMaxM2 => ModelSpec {
                hidden: 256,
                intermediate: 128,
                layers: 2,
                heads: 4,
                kv_heads: 2,
                head_dim: 64,
                vocab: 512,
                bos_token_id: 1,
                eos_token_id: 2,
                moe: Some(MoeSpec::routed(8, 2, 128)),
                ..SynthShape::MiniMaxM2.spec()
            },
            // meta-llama/Llama-4-Scout-17B-16E's language model (`text_config`).
            SynthShape::Llama4Scout => ModelSpec {
                arch: Arch::Llama4 { moe_step: 1 },
                hidden: 5120,
                intermediate: 16_384,
                layers: 48,
                heads: 40,
                kv_heads: 8,
                head_dim: 128,
                vocab: 202_048,
                max_position_embeddings: 10_485_760,
                rope_theta: 500_000.0,
                rope_scaling: json!({
                    "factor": 16.0,
                    "high_freq_factor": 1.0,
                    "low_freq_factor": 1.0,
                    "original_max_position_embeddings": 8192,
                    "rope_type": "llama3"
                }),
                rms_norm_eps: 1e-5,
                tie_word_embeddings: false,
                bos_token_id: 200_000,
                eos_token_id: 200_008,
                moe: Some(MoeSpec {
                    shared: 1,
                    ..MoeSpec::routed(16, 1, 8192)
                }),
            },
            SynthShape::TinyLlama4 => ModelSpec {
                arch: Arch::Llama4 { moe_step: 2 },
                hidden: 256,
                intermediate: 512,
                layers: 4,
                heads: 4,
                kv_heads: 2,
                head_dim: 64,
                vocab: 512,
                max_position_embeddings: 4096,
                bos_token_id: 1,
                eos_token_id: 2,
                moe: Some(MoeSpec {
                    shared: 1,
                    ..MoeSpec::routed(8, 1, 128)
                }),
                ..SynthShape::Llama4Scout.spec()
            },
            // google/gemma-3-27b-it's language model.
            SynthShape::Gemma3_27b => ModelSpec {
                arch: Arch::Gemma3 {
                    query_pre_attn_scalar: 168,
                },
                hidden: 5376,
                intermediate: 21_504,
                layers: 62,
                heads: 32,
                kv_heads: 16,
                head_dim: 128,
                vocab: 262_208,
                max_position_embeddings: 131_072,
                rope_theta: 1_000_000.0,
                rope_scaling: json!({"factor": 8.0, "rope_type": "linear"}),
                rms_norm_eps: 1e-6,
                tie_word_embeddings: true,
                bos_token_id: 2,
                eos_token_id: 1,
                moe: None,
            },
            // google/gemma-3-12b-it's language model (head_dim 256).
            SynthShape::Gemma3_12b => ModelSpec {
                arch: Arch::Gemma3 {
                    query_pre_attn_scalar: 256,
                },
                hidden: 3840,
                intermediate: 15_360,
                layers: 48,
                heads: 16,
                kv_heads: 8,
                head_dim: 256,
                ..SynthShape::Gemma3_27b.spec()
            },
            // google/gemma-4-31B's language model.
            SynthShape::Gemma4_31b => ModelSpec {
                arch: Arch::Gemma4 {
                    global_head_dim: 512,
                    global_kv_heads: 4,
                },
                hidden: 5376,
                intermediate: 21_504,
                layers: 60,
                heads: 32,
                kv_heads: 16,
                head_dim: 256,
                vocab: 262_144,
                max_position_embeddings: 262_144,
                rope_theta: 1_000_000.0,
                rope_scaling: Value::Null,
                rms_norm_eps: 1e-6,
                tie_word_embeddings: true,
                bos_token_id: 2,
                eos_token_id: 1,
                moe: None,
            },
            // google/gemma-4-26B-A4B's language model.
            SynthShape::Gemma4_26bA4b => ModelSpec {
                arch: Arch::Gemma4 {
                    global_head_dim: 512,
                    global_kv_heads: 2,
                },
                hidden: 2816,
                intermediate: 2112,
                layers: 30,
                heads: 16,
                kv_heads: 8,
                moe: Some(MoeSpec::routed(128, 8, 704)),
                ..SynthShape::Gemma4_31b.spec()
            },
            SynthShape::TinyGemma4 => ModelSpec {
                arch: Arch::Gemma4 {
                    global_head_dim: 128,
                    global_kv_heads: 1,
                },
                hidden: 256,
                intermediate: 256,
                layers: 6,
                heads: 4,
                kv_heads: 2,
                head_dim: 64,
                vocab: 512,
                max_position_embeddings: 4096,
                bos_token_id: 1,
                eos_token_id: 2,
                moe: Some(MoeSpec::routed(8, 2, 128)),
                ..SynthShape::Gemma4_31b.spec()
            },
            // microsoft/phi-4
            SynthShape::Phi4 => ModelSpec {
                arch: Arch::Phi3,
                hidden: 5120,
                intermediate: 17_920,
                layers: 40,
                heads: 40,
                kv_heads: 10,
                head_dim: 128,
                vocab: 100_352,
                max_position_embeddings: 16_384,
                rope_theta: 250_000.0,
                rope_scaling: Value::Null,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: false,
                bos_token_id: 100_257,
                eos_token_id: 100_265,
                moe: None,
            },
            // openai/gpt-oss-20b
            SynthShape::GptOss20b => ModelSpec {
                arch: Arch::GptOss,
                hidden: 2880,
                intermediate: 2880,
                layers: 24,
                heads: 64,
                kv_heads: 8,
                head_dim: 64,
                vocab: 201_088,
                max_position_embeddings: 131_072,
                rope_theta: 150_000.0,
                rope_scaling: json!({
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "factor": 32.0,
                    "original_max_position_embeddings": 4096,
                    "rope_type": "yarn",
                    "truncate": false
                }),
                rms_norm_eps: 1e-5,
                tie_word_embeddings: false,
                bos_token_id: 199_998,
                eos_token_id: 200_002,
                moe: Some(MoeSpec::routed(32, 4, 2880)),
            },
            // openai/gpt-oss-120b
            SynthShape::GptOss120b => ModelSpec {
                layers: 36,
                moe: Some(MoeSpec::routed(128, 4, 2880)),
                ..SynthShape::GptOss20b.spec()
            },
            // gpt-oss's layout at the size of the tests' fixtures.
            SynthShape::TinyGptOss => ModelSpec {
                hidden: 256,
                intermediate: 128,
                layers: 2,
                heads: 4,
                kv_heads: 2,
                vocab: 512,
                bos_token_id: 1,
                eos_token_id: 2,
                moe: Some(MoeSpec::routed(8, 4, 128)),
                ..SynthShape::GptOss20b.spec()
            },
            // deepseek-ai/DeepSeek-V3 (671B, 37B active; R1 and Kimi-K2 share the layout).
            SynthShape::DeepseekV3 => ModelSpec {
                arch: Arch::DeepseekV3 {
                    q_lora_rank: 1536,
                    kv_lora_rank: 512,
                    nope_dim: 128,
                    v_head_dim: 128,
                    groups: [8, 4],
                    family: LatentFamily::DeepSeek,
                    indexer: None,
                },
                hidden: 7168,
                intermediate: 18_432,
                layers: 61,
                heads: 128,
                kv_heads: 128,
                head_dim: 64,
                vocab: 129_280,
                max_position_embeddings: 163_840,
                rope_theta: 10_000.0,
                rope_scaling: json!({
                    "beta_fast": 32,
                    "beta_slow": 1,
                    "factor": 40,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                    "original_max_position_embeddings": 4096,
                    "type": "yarn"
                }),
                rms_norm_eps: 1e-6,
                tie_word_embeddings: false,
                bos_token_id: 0,
                eos_token_id: 1,
                moe: Some(MoeSpec {
                    shared: 1,
                    first_dense: 3,
                    ..MoeSpec::routed(256, 8, 2048)
                }),
            },
            // DeepSeek-V3's layout at the size of the tests' fixtures.
            SynthShape::TinyDeepseekV3 => ModelSpec {
                arch: Arch::DeepseekV3 {
                    q_lora_rank: 128,
                    kv_lora_rank: 128,
                    nope_dim: 32,
                    v_head_dim: 32,
                    groups: [8, 4],
                    family: LatentFamily::DeepSeek,
                    indexer: None,
                },
                hidden: 256,
                intermediate: 512,
                layers: 2,
                heads: 4,
                kv_heads: 4,
                head_dim: 16,
                vocab: 512,
                max_position_embeddings: 4096,
                moe: Some(MoeSpec {
                    shared: 1,
                    first_dense: 1,
                    ..MoeSpec::routed(8, 2, 128)
                }),
                ..SynthShape::DeepseekV3.spec()
            },
            // mistralai/Mistral-Small-4-119B-2603's language model as transformers'
            // Mistral4Config defaults describe it (36 layers, 128 experts of 2048, 4 per token
            // and a shared one, none dense; latent heads of 64 + 64 with values of 128; YaRN
            // 128x from 8k and the queries' position scale, beta 0.1).
            SynthShape::MistralSmall4 => ModelSpec {
                arch: Arch::DeepseekV3 {
                    q_lora_rank: 1024,
                    kv_lora_rank: 256,
                    nope_dim: 64,
                    v_head_dim: 128,
                    groups: [1, 1],
                    family: LatentFamily::Mistral4,
                    indexer: None,
                },
                hidden: 4096,
                intermediate: 12_288,
                layers: 36,
                heads: 32,
                kv_heads: 32,
                head_dim: 64,
                vocab: 131_072,
                max_position_embeddings: 1_048_576,
                rope_theta: 10_000.0,
                rope_scaling: json!({
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "factor": 128.0,
                    "llama_4_scaling_beta": 0.1,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                    "original_max_position_embeddings": 8192,
                    "type": "yarn"
                }),
                rms_norm_eps: 1e-6,
                tie_word_embeddings: false,
                bos_token_id: 1,
                eos_token_id: 2,
                moe: Some(MoeSpec {
                    shared: 1,
                    first_dense: 0,
                    ..MoeSpec::routed(128, 4, 2048)
                }),
            },
            // Mistral 4's layout at the size of the tests' fixtures (ranks and expert widths of
            // 128, which INT4 groups of 128 divide).
            SynthShape::TinyMistral4 => ModelSpec {
                arch: Arch::DeepseekV3 {
                    q_lora_rank: 128,
                    kv_lora_rank: 128,
                    nope_dim: 32,
                    v_head_dim: 32,
                    groups: [4, 2],
                    family: LatentFamily::Mistral4,
                    indexer: None,
                },
                hidden: 256,
                intermediate: 256,
                layers: 2,
                heads: 4,
                kv_heads: 4,
                head_dim: 16,
                vocab: 512,
                moe: Some(MoeSpec {
                    shared: 1,
                    first_dense: 1,
                    ..MoeSpec::routed(8, 2, 128)
                }),
                ..SynthShape::MistralSmall4.spec()
            },
            // mistralai/Mistral-Large-4-1T-A52B's language model as transformers'
            // MistralLarge4TextConfig defaults describe it (72 layers, 128 experts of 6144, 4 per
            // token and a shared one, the first dense; latent heads of 64 + 64 with values of
            // 128; a 32-head indexer keeping 2048 keys; YaRN 2048x from 512).
            SynthShape::MistralLarge4 => ModelSpec {
                arch: Arch::DeepseekV3 {
                    q_lora_rank: 0,
                    kv_lora_rank: 512,
                    nope_dim: 64,
                    v_head_dim: 128,
                    groups: [1, 1],
                    family: LatentFamily::MistralLarge4,
                    indexer: Some(IndexerSpec {
                        heads: 32,
                        head_dim: 128,
                        top_k: 2048,
                        glm: true,
                    }),
                },
                hidden: 6144,
                intermediate: 24_576,
                layers: 72,
                heads: 64,
                kv_heads: 64,
                head_dim: 64,
                vocab: 204_800,
                max_position_embeddings: 1_048_576,
                rope_theta: 10_000.0,
                rope_scaling: json!({
                    "attention_factor": 1.0,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "factor": 2048.0,
                    "original_max_position_embeddings": 512,
                    "type": "yarn"
                }),
                rms_norm_eps: 1e-5,
                tie_word_embeddings: false,
                bos_token_id: 1,
                eos_token_id: 2,
                moe: Some(MoeSpec {
                    shared: 1,
                    first_dense: 1,
                    ..MoeSpec::routed(128, 4, 6144)
                }),
            },
            // Mistral Large 4's layout at test size: 4 layers (the last without RoPE), an
            // 8-head indexer keeping 64 keys.
            SynthShape::TinyMistralLarge4 => ModelSpec {
                arch: Arch::DeepseekV3 {
                    q_lora_rank: 0,
                    kv_lora_rank: 128,
                    nope_dim: 32,
                    v_head_dim: 32,
                    groups: [4, 2],
                    family: LatentFamily::MistralLarge4,
                    indexer: Some(IndexerSpec {
                        heads: 8,
                        head_dim: 32,
                        top_k: 64,
                        glm: true,
                    }),
                },
                hidden: 256,
                intermediate: 256,
                layers: 4,
                heads: 4,
                kv_heads: 4,
                head_dim: 16,
                vocab: 512,
                max_position_embeddings: 1024,
                rope_scaling: json!({
                    "attention_factor": 1.0,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "factor": 16.0,
                    "original_max_position_embeddings": 64,
                    "type": "yarn"
                }),
                moe: Some(MoeSpec {
                    shared: 1,
                    first_dense: 1,
                    ..MoeSpec::routed(8, 2, 128)
                }),
                ..SynthShape::MistralLarge4.spec()
            },
            // moonshotai/Kimi-Linear-48B-A3B: KDA 3:1 with latent attention (`full_attn_layers`
            // 4, 8, ..., 24, 27 counted from 1), 256 experts of 1024 after a dense first layer.
            SynthShape::KimiLinear48bA3b => ModelSpec {
                arch: Arch::KimiLinear {
                    kv_lora_rank: 512,
                    nope_dim: 128,
                    v_head_dim: 128,
                    full: &[3, 7, 11, 15, 19, 23, 26],
                    delta: DeltaSpec {
                        k_heads: 32,
                        v_heads: 32,
                        k_dim: 128,
                        v_dim: 128,
                        conv_kernel: 4,
                        fused: false,
                    },
                },
                hidden: 2304,
                intermediate: 9216,
                layers: 27,
                heads: 32,
                kv_heads: 32,
                head_dim: 64,
                vocab: 163_840,
                max_position_embeddings: 1_048_576,
                rope_theta: 10_000.0,
                rope_scaling: Value::Null,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: false,
                bos_token_id: 163_584,
                eos_token_id: 163_586,
                moe: Some(MoeSpec {
                    shared: 1,
                    first_dense: 1,
                    ..MoeSpec::routed(256, 8, 1024)
                }),
            },
            SynthShape::TinyKimiLinear => ModelSpec {
                arch: Arch::KimiLinear {
                    kv_lora_rank: 128,
                    nope_dim: 32,
                    v_head_dim: 32,
                    full: &[2],
                    delta: DeltaSpec {
                        k_heads: 4,
                        v_heads: 4,
                        k_dim: 32,
                        v_dim: 32,
                        conv_kernel: 4,
                        fused: false,
                    },
                },
                hidden: 256,
                intermediate: 512,
                layers: 4,
                heads: 4,
                kv_heads: 4,
                head_dim: 16,
                vocab: 512,
                max_position_embeddings: 4096,
                bos_token_id: 1,
                eos_token_id: 2,
                moe: Some(MoeSpec {
                    shared: 1,
                    first_dense: 1,
                    ..MoeSpec::routed(8, 2, 128)
                }),
                ..SynthShape::KimiLinear48bA3b.spec()
            },
            // transformers' Glm5NextTextConfig defaults (GLM-5.3-Flash).
            SynthShape::Glm53Flash => ModelSpec {
                arch: Arch::Glm5Next {
                    q_lora_rank: 1536,
                    kv_lora_rank: 512,
                    nope_dim: 256,
                    v_head_dim: 256,
                    indexer: IndexerSpec {
                        heads: 32,
                        head_dim: 128,
                        top_k: 2048,
                        glm: true,
                    },
                    pool: 16,
                    streams: 4,
                    delta: DeltaSpec {
                        k_heads: 64,
                        v_heads: 64,
                        k_dim: 128,
                        v_dim: 128,
                        conv_kernel: 4,
                        fused: false,
                    },
                },
                hidden: 4096,
                layers: 45,
                // No rotated part in the latent attention.
                head_dim: 0,
                max_position_embeddings: 1_048_576,
                moe: Some(MoeSpec {
                    shared: 1,
                    first_dense: 3,
                    ..MoeSpec::routed(288, 8, 2048)
                }),
                // GLM-5's vocabulary, ids, norms and head counts.
                ..SynthShape::Glm5.spec()
            },
            // Kimi-Linear's tiny layout and its KDA, GLM-5.3-Flash's parts.
            SynthShape::TinyGlm5Next => {
                let Arch::KimiLinear { delta, .. } = SynthShape::TinyKimiLinear.spec().arch else {
                    unreachable!("the tiny Kimi-Linear shape is Kimi-Linear's")
                };
                ModelSpec {
                    arch: Arch::Glm5Next {
                        q_lora_rank: 128,
                        kv_lora_rank: 128,
                        nope_dim: 32,
                        v_head_dim: 32,
                        indexer: IndexerSpec {
                            heads: 8,
                            head_dim: 32,
                            top_k: 32,
                            glm: true,
                        },
                        pool: 4,
                        streams: 4,
                        delta,
                    },
                    head_dim: 0,
                    ..SynthShape::TinyKimiLinear.spec()
                }
            }
            // deepseek-ai/DeepSeek-V3.2(-Exp): DeepSeek-V3 and a lightning indexer a layer.
            SynthShape::DeepseekV32 => ModelSpec {
                arch: Arch::DeepseekV3 {
                    q_lora_rank: 1536,
                    kv_lora_rank: 512,
                    nope_dim: 128,
                    v_head_dim: 128,
                    groups: [8, 4],
                    family: LatentFamily::DeepSeek,
                    indexer: Some(IndexerSpec {
                        heads: 64,
                        head_dim: 128,
                        top_k: 2048,
                        glm: false,
                    }),
                },
                ..SynthShape::DeepseekV3.spec()
            },
            // DeepSeek-V3.2's layout at the size of the tests' fixtures, 64 keys a query.
            SynthShape::TinyDeepseekV32 => ModelSpec {
                arch: Arch::DeepseekV3 {
                    q_lora_rank: 128,
                    kv_lora_rank: 128,
                    nope_dim: 32,
                    v_head_dim: 32,
                    groups: [8, 4],
                    family: LatentFamily::DeepSeek,
                    indexer: Some(IndexerSpec {
                        heads: 8,
                        head_dim: 32,
                        top_k: 64,
                        glm: false,
                    }),
                },
                ..SynthShape::TinyDeepseekV3.spec()
            },
            // zai-org/GLM-5 as transformers' GlmMoeDsaConfig defaults describe it (78 layers, 256
            // experts of 2048, 8 per token, one group; latent heads of 192 + 64 with values of
            // 256; RoPE base 10k, no scaling).
            SynthShape::Glm5 => ModelSpec {
                arch: Arch::DeepseekV3 {
                    q_lora_rank: 2048,
                    kv_lora_rank: 512,
                    nope_dim: 192,
                    v_head_dim: 256,
                    groups: [1, 1],
                    family: LatentFamily::DeepSeek,
                    indexer: Some(IndexerSpec {
                        heads: 32,
                        head_dim: 128,
                        top_k: 2048,
                        glm: true,
                    }),
                },
                hidden: 6144,
                intermediate: 12_288,
                layers: 78,
                heads: 64,
                kv_heads: 64,
                head_dim: 64,
                vocab: 154_880,
                max_position_embeddings: 202_752,
                rope_theta: 10_000.0,
                rope_scaling: Value::Null,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: false,
                bos_token_id: 0,
                eos_token_id: 1,
                moe: Some(MoeSpec {
                    shared: 1,
                    first_dense: 3,
                    ..MoeSpec::routed(256, 8, 2048)
                }),
            },
            // GLM-4.5's layout at the size of the tests' fixtures.
            SynthShape::TinyGlm => ModelSpec {
                arch: Arch::Glm4Moe,
                heads: 4,
                kv_heads: 2,
                head_dim: 64,
                moe: Some(MoeSpec {
                    shared: 1,
                    first_dense: 1,
                    ..MoeSpec::routed(8, 2, 64)
                }),
                ..SynthShape::Tiny.spec()
            },
            // The layout of the synth-qwen3moe-mini fixture with 2 layers, for tests.
            SynthShape::TinyMoe => ModelSpec {
                arch: Arch::Qwen3Moe,
                rope_theta: 1_000_000.0,
                rms_norm_eps: 1e-6,
                moe: Some(MoeSpec::routed(8, 2, 128)),
                ..SynthShape::Tiny.spec()
            },
            // The layout of the synth-llama-mini fixture with 2 layers, for tests.
            SynthShape::Tiny => ModelSpec {
                arch: Arch::Llama,
                hidden: 256,
                intermediate: 768,
                layers: 2,
                heads: 8,
                kv_heads: 4,
                head_dim: 32,
                vocab: 512,
                max_position_embeddings: 2048,
                rope_theta: 10_000.0,
                rope_scaling: Value::Null,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: false,
                bos_token_id: 1,
                eos_token_id: 2,
                moe: None,
            },
        }
    }
}

impl ModelSpec {
    /// `config.json` in the classic transformers layout of the fixtures (`rope_theta`,
    /// `rope_scaling`, `torch_dtype`), keys sorted as `json.dumps(sort_keys=True)` writes them.
    pub(crate) fn config_json(&self, quantization_config: Option<Value>) -> Value {
        let (architecture, model_type) = match self.arch {
            Arch::Llama => ("LlamaForCausalLM", "llama"),
            Arch::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
            Arch::Mistral => ("MistralForCausalLM", "mistral"),
            Arch::Qwen3Moe => ("Qwen3MoeForCausalLM", "qwen3_moe"),
            Arch::Mixtral => ("MixtralForCausalLM", "mixtral"),
            Arch::Glm4Moe => ("Glm4MoeForCausalLM", "glm4_moe"),
            Arch::Gemma3 { .. } => ("Gemma3ForCausalLM", "gemma3_text"),
            Arch::Phi3 => ("Phi3ForCausalLM", "phi3"),
            Arch::Gemma4 { .. } => ("Gemma4ForCausalLM", "gemma4_text"),
            Arch::GptOss => ("GptOssForCausalLM", "gpt_oss"),
            Arch::DeepseekV3 {
                family: LatentFamily::Mistral4,
                ..
            } => ("Mistral4ForCausalLM", "mistral4"),
            Arch::DeepseekV3 {
                family: LatentFamily::MistralLarge4,
                ..
            } => ("MistralLarge4TextModel", "mistral_large4_text"),
            Arch::DeepseekV3 {
                indexer: Some(IndexerSpec { glm: true, .. }),
                ..
            } => ("GlmMoeDsaForCausalLM", "glm_moe_dsa"),
            Arch::DeepseekV3 {
                indexer: Some(_), ..
            } => ("DeepseekV32ForCausalLM", "deepseek_v32"),
            Arch::DeepseekV3 { .. } => ("DeepseekV3ForCausalLM", "deepseek_v3"),
            Arch::Qwen3_5(d) if d.fused => ("Qwen3NextForCausalLM", "qwen3_next"),
            Arch::Qwen3_5(_) if self.moe.is_some() => ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
            Arch::Qwen3_5(_) => ("Qwen3_5ForCausalLM", "qwen3_5_text"),
            Arch::Lfm2 { .. } => ("Lfm2ForCausalLM", "lfm2"),
            Arch::NemotronH(_) => ("NemotronHForCausalLM", "nemotron_h"),
            Arch::Granite(_) => ("GraniteMoeHybridForCausalLM", "granitemoehybrid"),
            Arch::MiniMaxM2 => ("MiniMaxM2ForCausalLM", "minimax_m2"),
            Arch::Llama4 { .. } => ("Llama4ForCausalLM", "llama4_text"),
            Arch::KimiLinear { .. } => ("KimiLinearForCausalLM", "kimi_linear"),
            // Its text fields flat, as GLM-5.3-Flash's text-only checkpoints keep them.
            Arch::Glm5Next { .. } => ("Glm5NextForConditionalGeneration", "glm5_next"),
        };
        let mut config = json!({
            "architectures": [architecture],
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "head_dim": self.head_dim,
            "hidden_act": if matches!(self.arch, Arch::Gemma3 { .. } | Arch::Gemma4 { .. }) {
                "gelu_pytorch_tanh"
            } else {
                "silu"
            },
            "hidden_size": self.hidden,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate,
            "max_position_embeddings": self.max_position_embeddings,
            "model_type": model_type,
            "num_attention_heads": self.heads,
            "num_hidden_layers": self.layers,
            "num_key_value_heads": self.kv_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": self.rope_scaling,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": "bfloat16",
            "transformers_version": "5.23.0",
            "use_cache": true,
            "vocab_size": self.vocab,
        });
        let extra = match self.arch {
            Arch::Llama => json!({"attention_bias": false, "mlp_bias": false, "pretraining_tp": 1}),
            Arch::Qwen3 => json!({
                "attention_bias": false,
                "max_window_layers": self.layers,
                "sliding_window": null,
                "use_sliding_window": false,
            }),
            Arch::Mistral => json!({"sliding_window": null}),
            Arch::Qwen3Moe => {
                let m = self.moe.expect("a Qwen3-MoE shape has experts");
                json!({
                    "attention_bias": false,
                    "decoder_sparse_step": 1,
                    "max_window_layers": self.layers,
                    "mlp_only_layers": [],
                    "moe_intermediate_size": m.expert_intermediate,
                    "norm_topk_prob": true,
                    "num_experts": m.experts,
                    "num_experts_per_tok": m.experts_per_token,
                    "output_router_logits": false,
                    "router_aux_loss_coef": 0.001,
                    "sliding_window": null,
                    "use_sliding_window": false,
                })
            }
            Arch::Glm4Moe => {
                let m = self.moe.expect("a GLM-4.5 shape has experts");
                json!({
                    "attention_bias": true,
                    "first_k_dense_replace": m.first_dense,
                    "moe_intermediate_size": m.expert_intermediate,
                    "n_group": 1,
                    "n_routed_experts": m.experts,
                    "n_shared_experts": m.shared,
                    "norm_topk_prob": true,
                    "num_experts_per_tok": m.experts_per_token,
                    "partial_rotary_factor": 0.5,
                    "routed_scaling_factor": 1.0,
                    "topk_group": 1,
                    "use_qk_norm": false,
                })
            }
            Arch::Gemma3 {
                query_pre_attn_scalar,
            } => json!({
                "attention_bias": false,
                "attn_logit_softcapping": null,
                "final_logit_softcapping": null,
                "hidden_activation": "gelu_pytorch_tanh",
                "query_pre_attn_scalar": query_pre_attn_scalar,
                "rope_local_base_freq": 10_000.0,
                "sliding_window": 1024,
                "sliding_window_pattern": 6,
            }),
            Arch::GptOss => {
                let m = self.moe.expect("a gpt-oss shape has experts");
                let layer_types: Vec<&str> = (0..self.layers)
                    .map(|l| {
                        if l % 2 == 0 {
                            "sliding_attention"
                        } else {
                            "full_attention"
                        }
                    })
                    .collect();
                json!({
                    "attention_bias": true,
                    "layer_types": layer_types,
                    "num_experts_per_tok": m.experts_per_token,
                    "num_local_experts": m.experts,
                    "sliding_window": 128,
                    "swiglu_limit": 7.0,
                })
            }
            Arch::DeepseekV3 {
                q_lora_rank,
                kv_lora_rank,
                nope_dim,
                v_head_dim,
                groups: [n_group, topk_group],
                indexer,
                family,
            } => {
                let m = self.moe.expect("a DeepSeek-V3 shape has experts");
                let mut extra = json!({
                    "attention_bias": false,
                    "first_k_dense_replace": m.first_dense,
                    "kv_lora_rank": kv_lora_rank,
                    "moe_intermediate_size": m.expert_intermediate,
                    "n_group": n_group,
                    "n_routed_experts": m.experts,
                    "n_shared_experts": m.shared,
                    "norm_topk_prob": true,
                    "num_experts_per_tok": m.experts_per_token,
                    "num_nextn_predict_layers": 0,
                    "q_lora_rank": q_lora_rank,
                    "qk_nope_head_dim": nope_dim,
                    "qk_rope_head_dim": self.head_dim,
                    "rope_interleave": true,
                    "routed_scaling_factor": 2.5,
                    "scoring_func": "sigmoid",
                    "topk_group": topk_group,
                    "topk_method": "noaux_tc",
                    "v_head_dim": v_head_dim,
                });
                if family != LatentFamily::DeepSeek {
                    // Mistral4Config: a softmax router (no scoring function, no bias), no
                    // multi-token prediction, no routed scaling.
                    let keys = extra.as_object_mut().expect("an object");
                    for key in ["scoring_func", "topk_method", "num_nextn_predict_layers"] {
                        keys.remove(key);
                    }
                    extra["routed_scaling_factor"] = json!(1.0);
                }
                if family == LatentFamily::MistralLarge4 {
                    // No query rank; every fourth layer without RoPE and every indexer its own
                    // by the config's defaults; final logits capped.
                    let keys = extra.as_object_mut().expect("an object");
                    keys.remove("q_lora_rank");
                    extra["final_logit_softcapping"] = json!(30.0);
                }
                if let Some(ix) = indexer {
                    extra["index_n_heads"] = json!(ix.heads);
                    extra["index_head_dim"] = json!(ix.head_dim);
                    extra["index_topk"] = json!(ix.top_k);
                }
                extra
            }
            Arch::Qwen3_5(d) => {
                let mut extra = json!({
                    "attention_bias": false,
                    "layer_types": (0..self.layers)
                        .map(|l| if self.is_delta_layer(l) { "linear_attention" } else { "full_attention" })
                        .collect::<Vec<_>>(),
                    "linear_conv_kernel_dim": d.conv_kernel,
                    "linear_key_head_dim": d.k_dim,
                    "linear_num_key_heads": d.k_heads,
                    "linear_num_value_heads": d.v_heads,
                    "linear_value_head_dim": d.v_dim,
                    "partial_rotary_factor": 0.25,
                });
                if let (Some(m), Value::Object(e)) = (self.moe, &mut extra) {
                    e.extend(
                        json!({
                            "decoder_sparse_step": 1,
                            "mlp_only_layers": [],
                            "moe_intermediate_size": m.expert_intermediate,
                            "norm_topk_prob": true,
                            "num_experts": m.experts,
                            "num_experts_per_tok": m.experts_per_token,
                            "shared_expert_intermediate_size": m.gated_shared,
                        })
                        .as_object()
                        .expect("json! object literal")
                        .clone(),
                    );
                }
                extra
            }
            Arch::Lfm2 { attention } => json!({
                "block_auto_adjust_ff_dim": false,
                "block_ff_dim": self.intermediate,
                "conv_L_cache": 3,
                "conv_bias": false,
                "full_attn_idxs": attention.iter().filter(|&&l| l < self.layers).collect::<Vec<_>>(),
                "norm_eps": self.rms_norm_eps,
            }),
            Arch::NemotronH(m) => json!({
                "moe_intermediate_size": self.moe.map_or(0, |e| e.expert_intermediate),
                "moe_shared_expert_intermediate_size": self.moe.map_or(0, |e| e.shared * e.expert_intermediate),
                "n_group": 1,
                "n_routed_experts": self.moe.map_or(0, |e| e.experts),
                "norm_topk_prob": true,
                "num_experts_per_tok": self.moe.map_or(0, |e| e.experts_per_token),
                "routed_scaling_factor": 2.5,
                "topk_group": 1,
                "attention_bias": false,
                "chunk_size": 128,
                "conv_kernel": m.conv_kernel,
                "hybrid_override_pattern": (0..self.layers).map(|l| m.block(l)).collect::<String>(),
                "layer_norm_epsilon": self.rms_norm_eps,
                "mamba_head_dim": m.head_dim,
                "mamba_hidden_act": "silu",
                "mamba_num_heads": m.heads,
                "mlp_hidden_act": "relu2",
                "n_groups": m.groups,
                "ssm_state_size": m.state,
                "time_step_min": 0.001,
                "use_conv_bias": true,
            }),
            // Granite 4.0-H-Small's multipliers; `intermediate_size` is the experts' width.
            Arch::Granite(m) => json!({
                "attention_bias": false,
                "attention_multiplier": 0.0078125,
                "embedding_multiplier": 12.0,
                "intermediate_size": self.moe.map_or(self.intermediate, |e| e.expert_intermediate),
                "layer_types": (0..self.layers)
                    .map(|l| if m.block(l) == '*' { "attention" } else { "mamba" })
                    .collect::<Vec<_>>(),
                "logits_scaling": 8.0,
                "mamba_chunk_size": 256,
                "mamba_conv_bias": true,
                "mamba_d_conv": m.conv_kernel,
                "mamba_d_head": m.head_dim,
                "mamba_d_state": m.state,
                "mamba_expand": m.inner() / self.hidden,
                "mamba_n_groups": m.groups,
                "mamba_n_heads": m.heads,
                "mamba_proj_bias": false,
                "num_experts_per_tok": self.moe.map_or(0, |e| e.experts_per_token),
                "num_local_experts": self.moe.map_or(0, |e| e.experts),
                "position_embedding_type": "nope",
                "residual_multiplier": 0.22,
                "shared_intermediate_size": self.intermediate,
            }),
            Arch::Gemma4 {
                global_head_dim,
                global_kv_heads,
            } => {
                let layer_types: Vec<&str> = (0..self.layers)
                    .map(|l| match self.is_full_gemma4(l) {
                        true => "full_attention",
                        false => "sliding_attention",
                    })
                    .collect();
                let m = self.moe;
                json!({
                    "attention_bias": false,
                    "attention_k_eq_v": true,
                    "enable_moe_block": m.is_some(),
                    "final_logit_softcapping": 30.0,
                    "global_head_dim": global_head_dim,
                    "hidden_activation": "gelu_pytorch_tanh",
                    "hidden_size_per_layer_input": 0,
                    "layer_types": layer_types,
                    "moe_intermediate_size": m.map(|m| m.expert_intermediate),
                    "num_experts": m.map(|m| m.experts),
                    "num_global_key_value_heads": global_kv_heads,
                    "num_kv_shared_layers": 0,
                    "rope_parameters": {
                        "full_attention": {
                            "partial_rotary_factor": 0.25,
                            "rope_theta": 1_000_000.0,
                            "rope_type": "proportional"
                        },
                        "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"}
                    },
                    "sliding_window": 1024,
                    "top_k_experts": m.map(|m| m.experts_per_token),
                    "use_double_wide_mlp": false,
                })
            }
            Arch::Phi3 => json!({
                "attention_bias": false,
                "original_max_position_embeddings": self.max_position_embeddings,
                "resid_pdrop": 0.0,
                "sliding_window": null,
            }),
            Arch::MiniMaxM2 => {
                let m = self.moe.expect("a MiniMax-M2 shape has experts");
                json!({
                    "num_experts_per_tok": m.experts_per_token,
                    "num_local_experts": m.experts,
                    "qk_norm_type": "per_layer",
                    "rotary_dim": self.head_dim / 2,
                    "scoring_func": "sigmoid",
                    "use_qk_norm": true,
                    "use_routing_bias": true,
                })
            }
            // Llama-4-Scout's keys (`no_rope_layers` empty: every fourth layer without RoPE);
            // `intermediate_size` is the experts' width.
            Arch::Llama4 { moe_step } => {
                let m = self.moe.expect("a Llama 4 shape has experts");
                json!({
                    "attention_bias": false,
                    "attention_chunk_size": 8192,
                    "attn_scale": 0.1,
                    "attn_temperature_tuning": true,
                    "floor_scale": 8192,
                    "interleave_moe_layer_step": moe_step,
                    "intermediate_size": m.expert_intermediate,
                    "intermediate_size_mlp": self.intermediate,
                    "no_rope_layers": [],
                    "num_experts_per_tok": m.experts_per_token,
                    "num_local_experts": m.experts,
                    "use_qk_norm": true,
                })
            }
            Arch::Glm5Next {
                q_lora_rank,
                kv_lora_rank,
                nope_dim,
                v_head_dim,
                indexer: ix,
                pool,
                streams,
                delta: d,
            } => {
                let m = self.moe.expect("a GLM-5.3-Flash shape has experts");
                json!({
                    "hc_eps": 1e-6,
                    "hc_mult": streams,
                    "hc_sinkhorn_iters": 20,
                    "index_head_dim": ix.head_dim,
                    "index_kpool": pool,
                    "index_kpool_always_select_tail": true,
                    "index_n_heads": ix.heads,
                    "index_topk": ix.top_k,
                    "indexer_types": vec!["full"; self.layers],
                    "kv_lora_rank": kv_lora_rank,
                    "layer_types": (0..self.layers)
                        .map(|l| if self.is_delta_layer(l) { "linear_attention" } else { "indexed_attention" })
                        .collect::<Vec<_>>(),
                    "linear_conv_kernel_dim": d.conv_kernel,
                    "linear_head_dim": d.k_dim,
                    "linear_lower_bound": -5.0,
                    "linear_num_heads": d.k_heads,
                    "mlp_layer_types": (0..self.layers)
                        .map(|l| if self.is_sparse(l) { "sparse" } else { "dense" })
                        .collect::<Vec<_>>(),
                    "moe_intermediate_size": m.expert_intermediate,
                    "n_group": 1,
                    "n_routed_experts": m.experts,
                    "n_shared_experts": m.shared,
                    "norm_topk_prob": true,
                    "num_experts_per_tok": m.experts_per_token,
                    "pad_token_id": self.vocab - 60,
                    "q_lora_rank": q_lora_rank,
                    "qk_nope_head_dim": nope_dim,
                    "qk_rope_head_dim": 0,
                    "routed_scaling_factor": 2.5,
                    "swiglu_limit": 10.0,
                    "topk_group": 1,
                    "v_head_dim": v_head_dim,
                })
            }
            // The names transformers' KimiLinearConfig saves (its `attribute_map`'s).
            Arch::KimiLinear {
                kv_lora_rank,
                nope_dim,
                v_head_dim,
                delta: d,
                ..
            } => {
                let m = self.moe.expect("a Kimi-Linear shape has experts");
                json!({
                    "kv_lora_rank": kv_lora_rank,
                    "layer_types": (0..self.layers)
                        .map(|l| if self.is_delta_layer(l) { "linear_attention" } else { "full_attention" })
                        .collect::<Vec<_>>(),
                    "linear_conv_kernel_dim": d.conv_kernel,
                    "linear_head_dim": d.k_dim,
                    "linear_num_heads": d.k_heads,
                    "mlp_layer_types": (0..self.layers)
                        .map(|l| if self.is_sparse(l) { "sparse" } else { "dense" })
                        .collect::<Vec<_>>(),
                    "model_max_length": self.max_position_embeddings,
                    "moe_intermediate_size": m.expert_intermediate,
                    "moe_renormalize": true,
                    "num_expert_group": 1,
                    "num_experts": m.experts,
                    "num_experts_per_token": m.experts_per_token,
                    "num_shared_experts": m.shared,
                    // The published 163839: the vocabulary's last id.
                    "pad_token_id": self.vocab - 1,
                    "q_lora_rank": null,
                    "qk_nope_head_dim": nope_dim,
                    "qk_rope_head_dim": self.head_dim,
                    "routed_scaling_factor": 2.446,
                    "topk_group": 1,
                    "v_head_dim": v_head_dim,
                })
            }
            Arch::Mixtral => {
                let m = self.moe.expect("a Mixtral shape has experts");
                json!({
                    "num_experts_per_tok": m.experts_per_token,
                    "num_local_experts": m.experts,
                    "output_router_logits": false,
                    "router_aux_loss_coef": 0.02,
                    "router_jitter_noise": 0.0,
                    "sliding_window": null,
                })
            }
        };
        let map = config.as_object_mut().expect("json! object literal");
        if let Value::Object(extra) = extra {
            map.extend(extra);
        }
        // Gemma 4 says its RoPE per layer type only: transformers takes a `rope_scaling` key
        // (even null) over `rope_parameters`.
        if matches!(self.arch, Arch::Gemma4 { .. }) {
            map.remove("rope_scaling");
            map.remove("rope_theta");
        }
        // Qwen3.5-MoE's MLPs are all mixtures: its config has no intermediate_size (Qwen3-Next's
        // has one, for `mlp_only_layers`).
        if matches!(self.arch, Arch::Qwen3_5(d) if !d.fused) && self.moe.is_some() {
            map.remove("intermediate_size");
        }
        if let Some(q) = quantization_config {
            map.insert("quantization_config".into(), q);
        }
        // Sort the keys whatever serde_json's map type is (it keeps insertion order when
        // another crate enables `preserve_order`).
        let mut entries: Vec<(String, Value)> = std::mem::take(map).into_iter().collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Value::Object(entries.into_iter().collect())
    }

    /// `quantization_config.ignore`: the routers by name (llm-compressor's MoE recipes leave
    /// them dense), then `lm_head`.
    /// Qwen3.5 adds, as its llm-compressor recipe does, the DeltaNets' linears and the shared
    /// experts' gates.
    pub(crate) fn ignored_modules(&self) -> Vec<String> {
        // Granite: every layer's router, then lm_head.
        if let (Arch::Granite(_), Some(_)) = (self.arch, self.moe) {
            let mut ignored: Vec<String> = (0..self.layers)
                .map(|l| format!("model.layers.{l}.block_sparse_moe.router.layer"))
                .collect();
            ignored.push("lm_head".to_string());
            return ignored;
        }
        // Nemotron-H: the mixture blocks' routers, then lm_head.
        if let Arch::NemotronH(m) = self.arch {
            let mut ignored: Vec<String> = (0..self.layers)
                .filter(|&l| m.block(l) == 'E')
                .map(|l| format!("backbone.layers.{l}.mixer.gate"))
                .collect();
            ignored.push("lm_head".to_string());
            return ignored;
        }
        let router = match self.arch {
            Arch::Mixtral | Arch::MiniMaxM2 | Arch::KimiLinear { .. } => "block_sparse_moe.gate",
            Arch::GptOss => "mlp.router",
            Arch::Gemma4 { .. } => "router.proj",
            Arch::Llama4 { .. } => "feed_forward.router",
            _ => "mlp.gate",
        };
        let mut ignored: Vec<String> = (0..self.layers)
            .filter(|&l| self.is_sparse(l))
            .map(|l| format!("model.layers.{l}.{router}"))
            .collect();
        for l in 0..self.layers {
            if let (true, Arch::Qwen3_5(d)) = (self.is_delta_layer(l), self.arch) {
                let names: &[&str] = match d.fused {
                    true => &["in_proj_qkvz", "in_proj_ba", "out_proj"],
                    false => &[
                        "in_proj_qkv",
                        "in_proj_z",
                        "in_proj_b",
                        "in_proj_a",
                        "out_proj",
                    ],
                };
                ignored.extend(
                    names
                        .iter()
                        .map(|n| format!("model.layers.{l}.linear_attn.{n}")),
                );
            }
            // Kimi's small low-rank decay and gate projections and b_proj stay dense.
            let kda = matches!(self.arch, Arch::KimiLinear { .. } | Arch::Glm5Next { .. });
            if kda && self.is_delta_layer(l) {
                ignored.extend(
                    KIMI_DENSE_PROJECTIONS
                        .iter()
                        .map(|n| format!("model.layers.{l}.self_attn.{n}")),
                );
            }
            if self.moe.is_some_and(|m| m.gated_shared > 0) {
                ignored.push(format!("model.layers.{l}.mlp.shared_expert_gate"));
            }
        }
        ignored.push("lm_head".to_string());
        ignored
    }

    /// Whether Gemma 4's layer `l` is a full-attention layer: every sixth, and the last,
    /// which transformers' `Gemma4TextConfig` makes full whatever `layer_types` says (so that
    /// a `--layers` slice is read as written).
    pub(crate) fn is_full_gemma4(&self, l: usize) -> bool {
        (l + 1).is_multiple_of(6) || l + 1 == self.layers
    }

    /// Whether layer `l`'s MLP is the mixture: past the leading dense layers, every
    /// `moe_step`-th layer of Llama 4.
    pub(crate) fn is_sparse(&self, l: usize) -> bool {
        let step = match self.arch {
            Arch::Llama4 { moe_step } => moe_step.max(1),
            _ => 1,
        };
        self.moe.is_some_and(|m| l >= m.first_dense) && (l + 1).is_multiple_of(step)
    }

    /// Whether layer `l` is a gated DeltaNet (Qwen3.5: all but every fourth) or Kimi Delta
    /// Attention (all but the `full` layers).
    /// Mistral Large 4's layout (`LatentFamily::MistralLarge4`).
    pub(crate) fn is_mistral_large4(&self) -> bool {
        matches!(
            self.arch,
            Arch::DeepseekV3 {
                family: LatentFamily::MistralLarge4,
                ..
            }
        )
    }

    /// Whether layer `l` rotates its queries and keys (Mistral Large 4's every fourth does
    /// not).
    pub(crate) fn rotates(&self, l: usize) -> bool {
        match self.arch {
            Arch::Glm5Next { .. } => false,
            _ => !self.is_mistral_large4() || !(l + 1).is_multiple_of(4),
        }
    }

    pub(crate) fn is_delta_layer(&self, l: usize) -> bool {
        match self.arch {
            Arch::Qwen3_5(_) => !(l + 1).is_multiple_of(4),
            Arch::KimiLinear { full, .. } => !full.contains(&l),
            Arch::Glm5Next { .. } => !(l + 1).is_multiple_of(4),
            _ => false,
        }
    }

    pub(crate) fn has_qkv_bias(&self) -> bool {
        matches!(self.arch, Arch::Glm4Moe | Arch::GptOss)
    }

    pub(crate) fn has_qk_norm(&self) -> bool {
        matches!(
            self.arch,
            Arch::Qwen3
                | Arch::Qwen3Moe
                | Arch::Gemma3 { .. }
                | Arch::Gemma4 { .. }
                | Arch::Qwen3_5(_)
                | Arch::Lfm2 { .. }
                | Arch::MiniMaxM2
        )
    }

    /// The widths of the q and k norms' weights: one head's, or the whole projections'
    /// (MiniMax-M2).
    pub(crate) fn qk_norm_widths(&self) -> [usize; 2] {
        match self.arch {
            Arch::MiniMaxM2 => [self.heads * self.head_dim, self.kv_heads * self.head_dim],
            _ => [self.head_dim; 2],
        }
    }

    /// The router has a selection bias (`e_score_correction_bias`).
    pub(crate) fn has_selection_bias(&self) -> bool {
        matches!(
            self.arch,
            Arch::Glm4Moe
                | Arch::DeepseekV3 {
                    family: LatentFamily::DeepSeek,
                    ..
                }
                | Arch::MiniMaxM2
                | Arch::KimiLinear { .. }
                | Arch::Glm5Next { .. }
        )
    }

    /// `generation_config.json` as transformers writes it for a base model.
    pub(crate) fn generation_config_json(&self) -> Value {
        json!({
            "_from_model_config": true,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "output_attentions": false,
            "output_hidden_states": false,
            "transformers_version": "5.23.0",
            "use_cache": true
        })
    }

    /// The parameter count (every linear counted as `out x in`, every expert included).
    pub(crate) fn params(&self) -> u64 {
        let (h, i, hd) = (
            self.hidden as u64,
            self.intermediate as u64,
            self.head_dim as u64,
        );
        let q = self.heads as u64 * hd;
        let kv = self.kv_heads as u64 * hd;
        let embed = self.vocab as u64 * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        let attention = 2 * h * q + 2 * h * kv;
        match self.arch {
            Arch::Lfm2 { attention: at } => {
                // Each layer two norms and the MLP; an attention layer its projections and
                // q/k norms, a convolution layer in_proj (B, C, x), out_proj and the taps.
                let layers: u64 = (0..self.layers)
                    .map(|l| {
                        let mixer = match at.contains(&l) {
                            true => attention + 2 * hd,
                            false => 4 * h * h + 3 * h,
                        };
                        mixer + 3 * h * i + 2 * h
                    })
                    .sum();
                return embed + head + layers + h;
            }
            Arch::Granite(m) => {
                let (inner, conv) = (m.inner() as u64, m.conv_width() as u64);
                let in_proj = inner + conv + m.heads as u64;
                let moe = self.moe.map_or(0, |e| {
                    let (n, w) = (e.experts as u64, e.expert_intermediate as u64);
                    n * h + n * 3 * h * w
                });
                // Two norms, Mamba-2 or attention, the shared MLP and the mixture.
                let layers: u64 = (0..self.layers)
                    .map(|l| {
                        let mixer = match m.block(l) {
                            'M' => {
                                h * in_proj
                                    + inner * h
                                    + conv * (m.conv_kernel as u64 + 1)
                                    + 3 * m.heads as u64
                                    + inner
                            }
                            _ => attention,
                        };
                        2 * h + mixer + 3 * h * i + moe
                    })
                    .sum();
                return embed + head + layers + h;
            }
            Arch::Gemma4 {
                global_head_dim,
                global_kv_heads,
            } => {
                // Sliding layers: q, k, v, o and the q/k norms; full layers: q, k (the values),
                // o and their norms. Six norms and the layer scalar; the dense MLP; the
                // mixture (router, its two scale vectors, experts) and its three norms.
                let (g, gkv) = (global_head_dim as u64, global_kv_heads as u64);
                let heads = self.heads as u64;
                let moe = self.moe.map_or(0, |m| {
                    let (n, w) = (m.experts as u64, m.expert_intermediate as u64);
                    n * h + h + n + n * 3 * h * w + 3 * h
                });
                let layers: u64 = (0..self.layers)
                    .map(|l| {
                        let attention = match self.is_full_gemma4(l) {
                            true => 2 * h * heads * g + h * gkv * g + 2 * g,
                            false => attention + 2 * hd,
                        };
                        attention + 4 * h + 1 + 3 * h * i + moe
                    })
                    .sum();
                return embed + head + layers + h;
            }
            Arch::NemotronH(m) => {
                let (inner, conv) = (m.inner() as u64, m.conv_width() as u64);
                let in_proj = inner + conv + m.heads as u64;
                // One norm a block: Mamba-2 (in_proj, out_proj, taps and bias, A_log, dt_bias,
                // D, the gated norm), attention, or the relu^2 MLP.
                let layers: u64 = (0..self.layers)
                    .map(|l| {
                        h + match m.block(l) {
                            'M' => {
                                h * in_proj
                                    + inner * h
                                    + conv * (m.conv_kernel as u64 + 1)
                                    + 3 * m.heads as u64
                                    + inner
                            }
                            '*' => attention,
                            // The router and its bias, the experts, the shared expert.
                            'E' => self.moe.map_or(0, |e| {
                                let (n, w) = (e.experts as u64, e.expert_intermediate as u64);
                                n * (h + 1) + n * 2 * h * w + 2 * h * w * e.shared as u64
                            }),
                            _ => 2 * h * i,
                        }
                    })
                    .sum();
                return embed + head + layers + h;
            }
            _ => {}
        }
        let ml4 = self.is_mistral_large4();
        let attn_of = |l: usize| match self.arch {
            // q_a, q_b (or one q_proj), kv_a_proj_with_mqa, kv_b, o, and the latent norms;
            // Mistral Large 4's query scalings, and layers without RoPE holding the rotated
            // part's values in kv_b instead.
            Arch::DeepseekV3 {
                q_lora_rank,
                kv_lora_rank,
                nope_dim,
                v_head_dim,
                indexer,
                ..
            } => {
                let (ql, kvl, heads) = (q_lora_rank as u64, kv_lora_rank as u64, self.heads as u64);
                let (n, v) = (nope_dim as u64, v_head_dim as u64);
                let query_input = if ml4 { h } else { ql };
                // The indexer's wq_b, wk, weights_proj and k_norm's weight and bias (Mistral
                // Large 4's: its q_input_norm and query scaling too).
                let indexer = indexer.map_or(0, |ix| {
                    let (ih, id) = (ix.heads as u64, ix.head_dim as u64);
                    let own = if ml4 { 2 * h + 2 * ih } else { 0 };
                    query_input * ih * id + h * (id + ih) + 2 * id + own
                });
                let query = match ml4 {
                    true => h * heads * (n + hd) + 2 * heads,
                    false => h * ql + ql * heads * (n + hd) + ql,
                };
                let rope = if self.rotates(l) { hd } else { 0 };
                query
                    + h * (kvl + rope)
                    + kvl * heads * (n + hd - rope + v)
                    + heads * v * h
                    + kvl
                    + indexer
            }
            // q_proj, kv_a_proj_with_mqa, kv_b, o, and the latent's norm.
            Arch::KimiLinear {
                kv_lora_rank,
                nope_dim,
                v_head_dim,
                ..
            } => {
                let (kvl, heads) = (kv_lora_rank as u64, self.heads as u64);
                let (n, v) = (nope_dim as u64, v_head_dim as u64);
                h * heads * (n + hd) + h * (kvl + hd) + kvl * heads * (n + v) + heads * v * h + kvl
            }
            // q_a, q_b, kv_a_proj_with_mqa (no rotated part), kv_b, o, the latent norms; the
            // indexer's wq_b, wk, weights_proj, k_norm and its pools' gate and slot terms.
            Arch::Glm5Next {
                q_lora_rank,
                kv_lora_rank,
                nope_dim,
                v_head_dim,
                indexer: ix,
                pool,
                ..
            } => {
                let (ql, kvl, heads) = (q_lora_rank as u64, kv_lora_rank as u64, self.heads as u64);
                let (n, v) = (nope_dim as u64, v_head_dim as u64);
                let (ih, id) = (ix.heads as u64, ix.head_dim as u64);
                let indexer = ql * ih * id + h * (id + ih) + 2 * id + id * h + pool as u64 * id;
                h * ql
                    + ql * heads * n
                    + ql
                    + h * kvl
                    + kvl * heads * (n + v)
                    + heads * v * h
                    + kvl
                    + indexer
            }
            // q_proj gives the output gate too.
            Arch::Qwen3_5(_) => 2 * h * q + 2 * h * kv + q * h,
            _ => h * q + 2 * h * kv + q * h,
        };
        // Mistral Large 4's learned RoPE frequencies.
        let alpha = if ml4 { hd / 2 } else { 0 };
        // A DeltaNet layer instead: its projections, the convolution's taps, A_log, dt_bias
        // and the gated norm.
        let delta = match self.arch {
            Arch::Qwen3_5(d) => {
                let (conv, value, hv) = (
                    d.conv_width() as u64,
                    d.value_width() as u64,
                    d.v_heads as u64,
                );
                h * (conv + value + 2 * hv)
                    + value * h
                    + conv * d.conv_kernel as u64
                    + 2 * hv
                    + d.v_dim as u64
            }
            // q, k, v, o, b_proj; f_a/f_b, g_a/g_b; the taps, A_log, a decay bias a key
            // channel, o_norm.
            Arch::KimiLinear { delta: d, .. } | Arch::Glm5Next { delta: d, .. } => {
                let (conv, value, hv, dk) = (
                    d.conv_width() as u64,
                    d.value_width() as u64,
                    d.v_heads as u64,
                    d.k_dim as u64,
                );
                h * (conv + value + hv + 2 * dk)
                    + dk * (hv * dk + value)
                    + conv * d.conv_kernel as u64
                    + hv * (1 + dk)
                    + d.v_dim as u64
            }
            _ => 0,
        };
        let qk_norm = match self.has_qk_norm() {
            true => self.qk_norm_widths().iter().sum::<usize>() as u64,
            false => 0,
        };
        let bias = if self.has_qkv_bias() { q + 2 * kv } else { 0 };
        let dense_mlp = 3 * h * i;
        let mlp = |l: usize| match self.moe {
            Some(m) if self.is_sparse(l) => {
                let e = m.expert_intermediate as u64;
                // Experts, the router and (GLM) its selection bias, the shared experts.
                m.experts as u64 * (3 * h * e + h)
                    + if self.has_selection_bias() {
                        m.experts as u64
                    } else {
                        0
                    }
                    + 3 * h * e * m.shared as u64
                    + if m.gated_shared > 0 {
                        3 * h * m.gated_shared as u64 + h
                    } else {
                        0
                    }
            }
            _ => dense_mlp,
        };
        // Gemma's sandwich norms are four per layer; gpt-oss adds o_proj's bias, the sinks,
        // the router's bias and every expert's biases.
        let norms = match (self.arch, self.moe) {
            (Arch::Gemma3 { .. }, _) => 4 * h,
            (Arch::GptOss, Some(m)) => {
                let e = m.experts as u64;
                2 * h + h + self.heads as u64 + e + e * (2 * m.expert_intermediate as u64 + h)
            }
            _ => 2 * h,
        };
        // Hyper-connections: two a layer, each `fn`, its bias and three factors.
        let hyper = match self.arch {
            Arch::Glm5Next { streams, .. } => {
                let (n, outputs) = (streams as u64, ((2 + streams) * streams) as u64);
                2 * (outputs * n * h + outputs + 3)
            }
            _ => 0,
        };
        let layers: u64 = (0..self.layers)
            .map(|l| match self.is_delta_layer(l) {
                true => delta + mlp(l) + norms + hyper,
                false => attn_of(l) + bias + mlp(l) + norms + qk_norm + hyper,
            })
            .sum();
        embed + head + layers + h + alpha
    }
}
