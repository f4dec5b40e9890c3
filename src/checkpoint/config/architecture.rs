//! Which family a `config.json` describes: its `architectures` (or `model_type`) name, the
//! language model's config inside a multimodal checkpoint, and the options each family fixes.

use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Qwen2Moe,
    Qwen3Moe,
    /// Qwen3-VL-MoE's language model: Qwen3-MoE's layers, the top k always renormalized, the
    /// experts stacked transposed (`gate_up_proj` `[E, hidden, 2I]`, `down_proj` `[E, I,
    /// hidden]`; read as `weight_t` views) or per expert as llm-compressor writes them.
    Qwen3VlMoe,
    Mixtral,
    Glm4Moe,
    Gemma2,
    Gemma3,
    Phi3,
    GptOss,
    /// DeepSeek-V3 / R1, Kimi-K2: latent attention (`MlaConfig`) and GLM's router.
    DeepseekV3,
    /// Qwen3.5: gated DeltaNet layers (`DeltaNetConfig`) between gated full-attention layers,
    /// `1 + w` norms, partial rotary.
    Qwen3_5,
    /// Qwen3.5's mixture of experts: Qwen3.5's layers with Qwen2-MoE's sparse block (a
    /// renormalized softmax router and a sigmoid-gated shared expert), its experts one linear
    /// each or stacked as transformers holds them (`TensorStore` names the stacks' slices).
    Qwen3_5Moe,
    /// Qwen3-Next: Qwen3.5-MoE's layers with the DeltaNet's projections fused by key head,
    /// `norm_topk_prob`, and dense MLPs where `mlp_only_layers` says.
    Qwen3Next,
    /// Liquid's LFM2: short-convolution layers (`conv`, `ShortConvConfig`) between attention
    /// layers with q/k layernorms; its own module names (`ModuleNames::LFM2`).
    Lfm2,
    /// LFM2-MoE (LFM2-8B-A1B): LFM2's layers, the MLPs after `num_dense_layers` mixtures
    /// (a sigmoid router with `expert_bias` for choosing, `feed_forward.experts.E.w1/w3/w2`).
    Lfm2Moe,
    /// NVIDIA's Nemotron-H: blocks of one part each (`layers_block_type` or
    /// `hybrid_override_pattern`): a Mamba-2 mixer (`MambaConfig`), attention without
    /// positions, or a relu^2 MLP; `backbone.*` names (`ModuleNames::NEMOTRON_H`).
    NemotronH,
    /// TII's Falcon-H1: every layer attention and a Mamba-2 mixer side by side on the same
    /// normed input, their outputs summed (`ModelConfig::parallel_mamba`); muP multipliers
    /// (`Multipliers`); its own module names (`ModuleNames::FALCON_H1`).
    FalconH1,
    /// IBM's Granite 4.0-H (`GraniteMoeHybridForCausalLM`): Mamba-2 and attention layers
    /// (`layer_types` `mamba` / `attention`), attention without positions or with RoPE
    /// (`position_embedding_type`), every layer's MLP a shared one plus, where
    /// `num_local_experts`, a top-k softmax mixture (`ExpertNaming::Granite`); the scalar
    /// multipliers of Granite (`Multipliers::granite`).
    GraniteMoeHybrid,
    /// IBM's Bamba (`BambaForCausalLM`): Mamba-2 layers (`mamba_*` keys, the gated norm gate
    /// first) and attention layers at `attn_layer_indices` (RoPE over half of each head), each
    /// with a SwiGLU `feed_forward`; Falcon-H1's module names.
    Bamba,
    /// MiniMax-M2: q/k RMS norms over the whole projection (`QkNorm::Projection`), partial
    /// rotary (`rotary_dim`), a sigmoid router whose `e_score_correction_bias` only chooses,
    /// Mixtral's expert names.
    MiniMaxM2,
    /// Ministral 3 (the text of Mistral 3's 2025-12 models): Mistral's layers, YaRN, and the
    /// queries scaled by position (`ModelConfig::query_scale`).
    Ministral3,
    /// DeepSeek-V3.2: DeepSeek-V3 with sparse attention (`IndexerConfig`): every layer's
    /// lightning indexer keeps each query's top `index_topk` keys, its RoPE over halves.
    DeepseekV32,
    /// GLM-5 (`GlmMoeDsaForCausalLM`): DeepSeek-V3.2's layers, the indexer's RoPE interleaved,
    /// and layers that reuse the last full indexer's selection (`indexer_types` `shared`).
    GlmMoeDsa,
    /// Mistral 4: DeepSeek-V3's latent attention and mixture (shared experts, the first
    /// `first_k_dense_replace` layers dense) with a grouped softmax router
    /// (`Router::GroupedSoftmax`) and Ministral 3's queries scaled by position.
    Mistral4,
    /// Mistral Large 4 (the text of `MistralLarge4ForConditionalGeneration`): Mistral 4's
    /// latent attention without a query rank, GLM-5's sparse attention with the indexer's
    /// queries from the layer's input, and the options of `MistralLarge4Layers`; Mistral's own
    /// tensor names (`checkpoint::mistral_names`).
    MistralLarge4,
    /// Gemma 4 (`Gemma4ForCausalLM`, the text of `Gemma4ForConditionalGeneration`): Gemma 3's
    /// layers with `w` norms, a softmax scale of 1, a weightless norm on each value head, a
    /// `layer_scalar` on each layer's output, and the layer options of `Gemma4Layers`.
    Gemma4,
    /// Llama 4 (`Llama4ForCausalLM`, the text of `Llama4ForConditionalGeneration`): RoPE on
    /// interleaved pairs with weightless q/k norms, chunked attention in those layers, full
    /// attention without positions in the others (`Llama4Layers`), and a mixture whose top-k
    /// sigmoid weights scale each expert's input (`MoeConfig::weights_on_input`) beside an
    /// ungated shared expert, in every `interleave_moe_layer_step`-th layer.
    Llama4,
    /// Moonshot's Kimi-Linear (`KimiLinearForCausalLM`): Kimi Delta Attention layers
    /// (`DeltaNetLayout::Kimi`) between latent-attention layers without RoPE, DeepSeek-V3's
    /// mixture under `block_sparse_moe` (`ExpertNaming::KimiLinear`); its config's own key
    /// names (`kimi_linear::canonical_keys`).
    KimiLinear,
    /// DeepSeek-V4 (`DeepseekV4ForCausalLM`): hyper-connections between `hc_mult` residual
    /// streams, one key/value head read as keys and values over a sliding window plus
    /// compressed entries (`DeepseekV4Layers`), sinks, a grouped output projection, and
    /// experts chosen by `sqrtsoftplus` scores or by the token (`hash_moe`); its own tensor
    /// names (`checkpoint::deepseek_v4_names`).
    DeepseekV4,
    /// GLM-5.3-Flash (the text of `Glm5NextForConditionalGeneration`): Kimi-Linear's layers
    /// (Kimi Delta Attention under a safe gate, latent attention without RoPE) with GLM-5's
    /// sparse attention over pools of tokens (`KeyPools`), DeepSeek-V4's hyper-connections
    /// collapsed by their mean, SwiGLU clamped; its config's keys resolved by
    /// `glm5_next::canonical_keys`.
    Glm5Next,
}

/// Every name a supported family goes by: its `architectures` class names, then its
/// `model_type`s (the first is the one error messages list), and whether the checkpoint is
/// multimodal: its language model described by `text_config` (the dtype and the tie stay the
/// outer config's).
const NAMES: &[(Architecture, &[&str], bool)] = &[
    (Architecture::Llama, &["LlamaForCausalLM", "llama"], false),
    (
        Architecture::Mistral,
        &["MistralForCausalLM", "mistral"],
        false,
    ),
    // Mistral Small 3.x and Pixtral: a Mistral language model behind a vision tower.
    (
        Architecture::Mistral,
        &["Mistral3ForConditionalGeneration", "mistral3"],
        true,
    ),
    (Architecture::Qwen2, &["Qwen2ForCausalLM", "qwen2"], false),
    (
        Architecture::Qwen3,
        &["Qwen3ForCausalLM", "qwen3", "qwen3_vl_text"],
        false,
    ),
    // Qwen3-VL's language model: Qwen3's layers; its interleaved multimodal RoPE on text
    // (the three position ids equal) is plain RoPE.
    (
        Architecture::Qwen3,
        &["Qwen3VLForConditionalGeneration", "qwen3_vl"],
        true,
    ),
    (
        Architecture::Qwen2Moe,
        &["Qwen2MoeForCausalLM", "qwen2_moe"],
        false,
    ),
    (
        Architecture::Qwen3Moe,
        &["Qwen3MoeForCausalLM", "qwen3_moe"],
        false,
    ),
    (
        Architecture::Qwen3VlMoe,
        &["Qwen3VLMoeForConditionalGeneration", "qwen3_vl_moe"],
        true,
    ),
    (
        Architecture::Qwen3VlMoe,
        &["Qwen3VLMoeTextModel", "qwen3_vl_moe_text"],
        false,
    ),
    (
        Architecture::Mixtral,
        &["MixtralForCausalLM", "mixtral"],
        false,
    ),
    (
        Architecture::Glm4Moe,
        &["Glm4MoeForCausalLM", "glm4_moe"],
        false,
    ),
    (
        Architecture::Gemma2,
        &["Gemma2ForCausalLM", "gemma2"],
        false,
    ),
    (
        Architecture::Gemma3,
        &["Gemma3ForCausalLM", "gemma3_text"],
        false,
    ),
    (
        Architecture::Gemma3,
        &["Gemma3ForConditionalGeneration", "gemma3"],
        true,
    ),
    (
        Architecture::Gemma4,
        &["Gemma4ForCausalLM", "gemma4_text"],
        false,
    ),
    (
        Architecture::Gemma4,
        &["Gemma4ForConditionalGeneration", "gemma4"],
        true,
    ),
    (Architecture::Phi3, &["Phi3ForCausalLM", "phi3"], false),
    (
        Architecture::GptOss,
        &["GptOssForCausalLM", "gpt_oss"],
        false,
    ),
    (
        Architecture::DeepseekV3,
        &["DeepseekV3ForCausalLM", "deepseek_v3", "kimi_k2"],
        false,
    ),
    // Kimi-K2.5 / K2.6: a DeepSeek-V3 language model behind a vision tower.
    (
        Architecture::DeepseekV3,
        &["Kimi_K25ForConditionalGeneration", "kimi_k25"],
        true,
    ),
    (
        Architecture::DeepseekV32,
        &["DeepseekV32ForCausalLM", "deepseek_v32"],
        false,
    ),
    (
        Architecture::GlmMoeDsa,
        &["GlmMoeDsaForCausalLM", "glm_moe_dsa"],
        false,
    ),
    (
        Architecture::Qwen3_5,
        &["Qwen3_5ForCausalLM", "qwen3_5_text"],
        false,
    ),
    (
        Architecture::Qwen3_5,
        &["Qwen3_5ForConditionalGeneration", "qwen3_5"],
        true,
    ),
    (
        Architecture::Qwen3_5Moe,
        &["Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"],
        false,
    ),
    (
        Architecture::Qwen3_5Moe,
        &["Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe"],
        true,
    ),
    (
        Architecture::Qwen3Next,
        &["Qwen3NextForCausalLM", "qwen3_next"],
        false,
    ),
    (Architecture::Lfm2, &["Lfm2ForCausalLM", "lfm2"], false),
    (
        Architecture::Lfm2,
        &["Lfm2VlForConditionalGeneration", "lfm2_vl"],
        true,
    ),
    (
        Architecture::Lfm2Moe,
        &["Lfm2MoeForCausalLM", "lfm2_moe"],
        false,
    ),
    (
        Architecture::NemotronH,
        &["NemotronHForCausalLM", "nemotron_h"],
        false,
    ),
    (
        Architecture::FalconH1,
        &["FalconH1ForCausalLM", "falcon_h1"],
        false,
    ),
    (
        Architecture::GraniteMoeHybrid,
        &["GraniteMoeHybridForCausalLM", "granitemoehybrid"],
        false,
    ),
    (
        Architecture::Mistral4,
        &["Mistral4ForCausalLM", "mistral4"],
        false,
    ),
    (
        Architecture::MistralLarge4,
        &["MistralLarge4ForConditionalGeneration", "mistral_large4"],
        true,
    ),
    (
        Architecture::MistralLarge4,
        &["MistralLarge4TextModel", "mistral_large4_text"],
        false,
    ),
    (
        Architecture::Llama4,
        &["Llama4ForCausalLM", "llama4_text"],
        false,
    ),
    (
        Architecture::Llama4,
        &["Llama4ForConditionalGeneration", "llama4"],
        true,
    ),
    (
        Architecture::Ministral3,
        &["Ministral3ForCausalLM", "ministral3"],
        false,
    ),
    (Architecture::Bamba, &["BambaForCausalLM", "bamba"], false),
    (
        Architecture::MiniMaxM2,
        &["MiniMaxM2ForCausalLM", "minimax_m2"],
        false,
    ),
    (
        Architecture::KimiLinear,
        &["KimiLinearForCausalLM", "kimi_linear"],
        false,
    ),
    (
        Architecture::DeepseekV4,
        &["DeepseekV4ForCausalLM", "deepseek_v4"],
        false,
    ),
    (
        Architecture::Glm5Next,
        &["Glm5NextTextModel", "glm5_next_text"],
        false,
    ),
    (
        Architecture::Glm5Next,
        &["Glm5NextForConditionalGeneration", "glm5_next"],
        true,
    ),
];

/// Multimodal classes whose transformers config ties the embeddings when `config.json` does
/// not say (`tie_word_embeddings: bool = True`; Gemma and LFM2 have rules of their own).
const TIED_BY_DEFAULT: &[&str] = &[
    "Mistral3ForConditionalGeneration",
    "mistral3",
    "Kimi_K25ForConditionalGeneration",
    "kimi_k25",
];

impl Architecture {
    /// Whether the checkpoint `outer` describes ties its embeddings where it does not say.
    pub(super) fn ties_by_default(self, outer: &Value) -> bool {
        let named = |k: &str| outer.get(k).and_then(Value::as_str);
        let name = outer
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .or_else(|| named("model_type"));
        self.is_gemma() || name.is_some_and(|n| TIED_BY_DEFAULT.contains(&n))
    }

    /// The family of `outer` and the config of its language model.
    pub(super) fn of_config(outer: &Value) -> Result<(Self, &Value), String> {
        let name = outer
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .or_else(|| outer.get("model_type").and_then(Value::as_str))
            .ok_or("has neither `architectures` nor `model_type`")?;
        let Some(&(arch, _, multimodal)) = NAMES.iter().find(|(_, names, _)| names.contains(&name))
        else {
            let supported: Vec<&str> = NAMES.iter().map(|(_, names, _)| names[0]).collect();
            return Err(format!(
                "unsupported architecture `{name}` (supported: {})",
                supported.join(", ")
            ));
        };
        if !multimodal {
            return Ok((arch, outer));
        }
        let text = match outer.get("text_config").filter(|v| v.is_object()) {
            Some(text) => text,
            // GLM-5.3-Flash's text-only checkpoints keep the text fields at the top level
            // (transformers' `Glm5NextConfig` takes them as its `text_config`).
            None if arch == Architecture::Glm5Next => return Ok((arch, outer)),
            None => return Err(format!("{name} without a `text_config`")),
        };
        // The language model's own `model_type` decides (Mistral 3 holds Mistral or
        // Ministral 3 text models); one no text family answers to is refused.
        let Some(text_type) = text.get("model_type").and_then(Value::as_str) else {
            return Ok((arch, text));
        };
        match NAMES
            .iter()
            .find(|(_, names, multimodal)| !multimodal && names[1..].contains(&text_type))
        {
            Some(&(text_arch, _, _)) => Ok((text_arch, text)),
            None => Err(format!(
                "unsupported language model `{text_type}` (text_config.model_type) in {name}"
            )),
        }
    }

    /// Gemma 2/3/4: sandwich norms, scaled embeddings, GELU-tanh, tied embeddings by
    /// default; 2 and 3 also `1 + w` norms and `query_pre_attn_scalar`.
    pub(super) fn is_gemma(self) -> bool {
        matches!(
            self,
            Architecture::Gemma2 | Architecture::Gemma3 | Architecture::Gemma4
        )
    }

    /// q/k/v carry a bias whatever `attention_bias` says.
    pub(super) fn always_qkv_bias(self) -> bool {
        matches!(self, Architecture::Qwen2 | Architecture::Qwen2Moe)
    }

    /// o_proj never carries a bias, whatever `attention_bias` says.
    pub(super) fn never_o_bias(self) -> bool {
        matches!(
            self,
            Architecture::Qwen2
                | Architecture::Qwen2Moe
                | Architecture::Qwen3
                | Architecture::Qwen3Moe
                | Architecture::Qwen3VlMoe
                | Architecture::Glm4Moe
        )
    }

    /// Per-head q/k norms whatever the config says (GLM-4.5 reads `use_qk_norm`).
    pub(super) fn always_qk_norm(self) -> bool {
        matches!(
            self,
            Architecture::Qwen3
                | Architecture::Qwen3Moe
                | Architecture::Qwen3VlMoe
                | Architecture::Gemma3
                | Architecture::Gemma4
                | Architecture::Lfm2
                | Architecture::Lfm2Moe
        ) || self.has_delta_net()
    }

    /// Norm weights applied as `1 + w` (Gemma; Qwen3.5's zero-centred `Qwen3_5RMSNorm`).
    pub(super) fn offset_norms(self) -> bool {
        (self.is_gemma() && self != Architecture::Gemma4) || self.has_delta_net()
    }

    /// Hybrid: `linear_attention` layers are gated DeltaNets; the full-attention layers'
    /// `q_proj` also gives a sigmoid gate on their output.
    pub(super) fn has_delta_net(self) -> bool {
        matches!(
            self,
            Architecture::Qwen3_5 | Architecture::Qwen3_5Moe | Architecture::Qwen3Next
        )
    }

    /// `layer_types` holds `linear_attention` (a delta rule) and `full_attention` layers.
    pub(super) fn has_linear_attention(self) -> bool {
        self.has_delta_net() || matches!(self, Architecture::KimiLinear | Architecture::Glm5Next)
    }

    /// DeepSeek's latent attention (`MlaConfig`) and mixture: shared experts, the first
    /// `first_k_dense_replace` layers dense, experts `n_routed_experts`.
    pub(super) fn is_deepseek(self) -> bool {
        matches!(
            self,
            Architecture::DeepseekV3
                | Architecture::Mistral4
                | Architecture::MistralLarge4
                | Architecture::DeepseekV32
                | Architecture::GlmMoeDsa
                | Architecture::KimiLinear
                | Architecture::Glm5Next
        )
    }

    /// DeepSeek sparse attention: a lightning indexer selects each query's keys.
    pub(super) fn has_indexer(self) -> bool {
        matches!(
            self,
            Architecture::DeepseekV32
                | Architecture::GlmMoeDsa
                | Architecture::MistralLarge4
                | Architecture::Glm5Next
        )
    }

    /// LFM2's layers (short convolutions and attention, its names), dense or with mixtures.
    pub(super) fn is_lfm2(self) -> bool {
        matches!(self, Architecture::Lfm2 | Architecture::Lfm2Moe)
    }
}
