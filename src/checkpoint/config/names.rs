//! The names a family gives a decoder layer's modules, where they are not Llama's.

/// Module names under `{prefix}.layers.N` (and the final norm's under `{prefix}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ModuleNames {
    /// The token embeddings under the prefix.
    pub embed: &'static str,
    /// The attention's block (its projections and norms under it).
    pub attn: &'static str,
    /// A Mamba-2 mixer's block.
    pub mamba: &'static str,
    /// The attention's output projection.
    pub o: &'static str,
    /// The per-head query and key norms.
    pub q_norm: &'static str,
    pub k_norm: &'static str,
    /// The norm before the attention (or its replacement), and the one before the MLP.
    pub attn_norm: &'static str,
    pub mlp_norm: &'static str,
    /// The norm after the last layer.
    pub final_norm: &'static str,
    /// The dense MLP's block, and its gate, up and down projections (an ungated MLP has up
    /// and down).
    pub mlp: &'static str,
    pub mlp_linears: [&'static str; 3],
}

impl ModuleNames {
    pub const LLAMA: Self = Self {
        embed: "embed_tokens",
        attn: "self_attn",
        mamba: "mamba",
        o: "o_proj",
        q_norm: "q_norm",
        k_norm: "k_norm",
        attn_norm: "input_layernorm",
        mlp_norm: "post_attention_layernorm",
        final_norm: "norm",
        mlp: "mlp",
        mlp_linears: ["gate_proj", "up_proj", "down_proj"],
    };

    /// transformers' `Llama4TextDecoderLayer`: Llama's names, the MLP under `feed_forward`.
    pub const LLAMA4: Self = Self {
        mlp: "feed_forward",
        ..Self::LLAMA
    };

    /// Kimi-Linear's checkpoints (`KimiDecoderLayer`): Llama's names, every layer's MLP (dense
    /// or the mixture) under `block_sparse_moe`.
    pub const KIMI_LINEAR: Self = Self {
        mlp: "block_sparse_moe",
        ..Self::LLAMA
    };

    /// transformers' `Lfm2DecoderLayer`: `operator_norm`, `ffn_norm`, `feed_forward.w1/w3/w2`,
    /// `self_attn.out_proj`, `q_layernorm`/`k_layernorm`, and `embedding_norm` last.
    pub const LFM2: Self = Self {
        embed: "embed_tokens",
        attn: "self_attn",
        mamba: "mamba",
        o: "out_proj",
        q_norm: "q_layernorm",
        k_norm: "k_layernorm",
        attn_norm: "operator_norm",
        mlp_norm: "ffn_norm",
        final_norm: "embedding_norm",
        mlp: "feed_forward",
        mlp_linears: ["w1", "w3", "w2"],
    };

    /// transformers' `NemotronHBlock`: one part a block under `mixer` (Mamba-2, attention or
    /// the MLP's `up_proj`/`down_proj`), normed by the block's `norm`; `embeddings`, `norm_f`.
    pub const NEMOTRON_H: Self = Self {
        embed: "embeddings",
        attn: "mixer",
        mamba: "mixer",
        o: "o_proj",
        q_norm: "q_norm",
        k_norm: "k_norm",
        attn_norm: "norm",
        mlp_norm: "norm",
        final_norm: "norm_f",
        mlp: "mixer",
        mlp_linears: ["gate_proj", "up_proj", "down_proj"],
    };

    /// transformers' `FalconH1DecoderLayer`: `input_layernorm` before both the attention and
    /// the Mamba-2 mixer (`mamba`), `pre_ff_layernorm`, `feed_forward`, `final_layernorm`.
    pub const FALCON_H1: Self = Self {
        mlp_norm: "pre_ff_layernorm",
        final_norm: "final_layernorm",
        mlp: "feed_forward",
        ..Self::LLAMA
    };

    /// transformers' `GraniteMoeHybridDecoderLayer`: `mamba` or `self_attn`, the MLP the
    /// layer's `shared_mlp` (`input_linear`: gate and up, read as two views; `output_linear`).
    pub const GRANITE: Self = Self {
        mlp: "shared_mlp",
        mlp_linears: ["gate_proj", "up_proj", "output_linear"],
        ..Self::LLAMA
    };
}
