//! The mixture of experts a config describes: experts, routing rule, shared expert, which
//! layers are sparse, and the module names of each family.

use serde_json::Value;

use super::{Architecture, Keys};

/// Bound on the experts a config may claim (far above any published model's).
const MAX_EXPERTS: usize = 1 << 16;

/// How a router turns a token's logits into its experts and their weights.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "scoring", rename_all = "lowercase")]
pub enum Router {
    /// Softmax over all experts in f32, the top k, renormalised to sum to 1 when `renormalize`
    /// (Qwen-MoE's `norm_topk_prob`; always for Mixtral, where it equals a softmax over the
    /// top-k logits).
    Softmax { renormalize: bool },
    /// DeepSeek-V3 / GLM-4.5: sigmoid scores; the layer's `e_score_correction_bias` added
    /// for choosing only; experts split in `groups`, the `top_groups` groups with the largest
    /// sum of their two best biased scores kept; the top k of those; weights the unbiased
    /// scores, renormalised when `renormalize` (their sum plus `eps`: DeepSeek's 1e-20,
    /// LFM2-MoE's 1e-6, MiniMax-M2's 0), times `scale`.
    Sigmoid {
        groups: usize,
        top_groups: usize,
        renormalize: bool,
        scale: f32,
        eps: f32,
    },
    /// gpt-oss (whose router has a bias) and Granite: the top k of the raw logits, weights a
    /// softmax over those k in f32.
    TopKSoftmax,
    /// Llama 4: the top k of the raw logits, weights their sigmoids in f32 (not renormalised).
    TopKSigmoid,
    /// Mistral 4: softmax scores, chosen as `Sigmoid` chooses within the best `top_groups` of
    /// `groups` (no bias); weights the scores, renormalised when `renormalize` (their sum plus
    /// 1e-20), times `scale`.
    #[serde(rename = "grouped_softmax")]
    GroupedSoftmax {
        groups: usize,
        top_groups: usize,
        renormalize: bool,
        scale: f32,
    },
    /// DeepSeek-V4: `sqrt(softplus(logit))` scores, the top k of them plus the selection
    /// bias; weights the scores renormalised (their sum plus 1e-20) times `scale`.
    #[serde(rename = "sqrtsoftplus")]
    SqrtSoftplus { scale: f32 },
}

impl std::fmt::Display for Router {
    /// What `inspect` says of the rule, e.g. `sigmoid scores, the top k within the best 4 of
    /// 8 groups, renormalised, times 2.5`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let grouped = |groups: usize, top_groups: usize| match groups {
            1 => String::new(),
            _ => format!(" within the best {top_groups} of {groups} groups"),
        };
        let weights = |renormalize: bool, scale: f32| {
            let renorm = if renormalize { ", renormalised" } else { "" };
            match scale {
                1.0 => renorm.to_string(),
                s => format!("{renorm}, times {s}"),
            }
        };
        match *self {
            Router::Softmax { renormalize } => {
                write!(f, "softmax, the top k{}", weights(renormalize, 1.0))
            }
            Router::TopKSoftmax => write!(f, "the top k logits, a softmax over them"),
            Router::TopKSigmoid => write!(f, "the top k logits, their sigmoids"),
            Router::SqrtSoftplus { scale } => write!(
                f,
                "sqrt(softplus) scores, the top k{}",
                weights(true, scale)
            ),
            Router::Sigmoid {
                groups,
                top_groups,
                renormalize,
                scale,
                ..
            } => write!(
                f,
                "sigmoid scores, the top k{}{}",
                grouped(groups, top_groups),
                weights(renormalize, scale)
            ),
            Router::GroupedSoftmax {
                groups,
                top_groups,
                renormalize,
                scale,
            } => write!(
                f,
                "softmax, the top k{}{}",
                grouped(groups, top_groups),
                weights(renormalize, scale)
            ),
        }
    }
}

/// An expert every token goes through besides its routed ones.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct SharedExpert {
    pub intermediate_size: usize,
    /// Its output is scaled by `sigmoid(shared_expert_gate · x)` (Qwen2-MoE).
    pub gated: bool,
}

/// Module names of a sparse MLP, which differ between families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ExpertNaming {
    /// `mlp.gate`, `mlp.experts.E.{gate,up,down}_proj`, `mlp.shared_expert(_gate)`.
    Qwen,
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.E.{w1,w3,w2}` (gate, up, down);
    /// MiniMax-M2's selection bias `block_sparse_moe.e_score_correction_bias`.
    Mixtral,
    /// As Qwen, the shared experts fused as `mlp.shared_experts`, and the router's
    /// `mlp.gate.e_score_correction_bias`.
    Glm,
    /// gpt-oss: `mlp.router` (with a bias), each expert's fused `gate_up_proj` and `down_proj`
    /// with biases, stored as 3D tensors across the experts (`Checkpoint::open` names each
    /// expert's part).
    GptOss,
    /// LFM2-MoE: `feed_forward.gate`, `feed_forward.expert_bias` (where `use_expert_bias`),
    /// `feed_forward.experts.E.{w1,w3,w2}`.
    Lfm2,
    /// Granite: `block_sparse_moe.router.layer`, the experts stacked as
    /// `block_sparse_moe.input_linear` / `output_linear` (`Checkpoint::open` names each
    /// expert's part), the layer's `shared_mlp` as the shared expert.
    Granite,
    /// Nemotron-H: `mixer.gate` (with `e_score_correction_bias`), ungated experts
    /// `mixer.experts.E.{up,down}_proj` (or stacked `mixer.experts.{up,down}_proj`), an
    /// ungated `mixer.shared_experts`.
    NemotronH,
    /// Gemma 4: `layers.N.experts.gate_up_proj` / `down_proj` stacks (or per expert) and
    /// `layers.N.router.proj`, beside the layer's dense `mlp`.
    Gemma4,
    /// Kimi-Linear: `block_sparse_moe.gate` (with `e_score_correction_bias`),
    /// `block_sparse_moe.experts.E.{w1,w3,w2}`, `block_sparse_moe.shared_experts`.
    KimiLinear,
    /// Llama 4: `feed_forward.router`, the experts stacked as `feed_forward.experts.gate_up_proj`
    /// `[E, hidden, 2I]` / `down_proj` `[E, I, hidden]` (or per expert, as llm-compressor
    /// writes them), `feed_forward.shared_expert`.
    Llama4,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub experts_per_token: usize,
    /// Width of each routed expert's MLP.
    pub expert_intermediate_size: usize,
    pub router: Router,
    pub shared_expert: Option<SharedExpert>,
    /// For each decoder layer, whether its MLP is the mixture (else a dense MLP of
    /// `intermediate_size`).
    pub sparse_layers: Vec<bool>,
    pub naming: ExpertNaming,
    /// The router has a selection bias tensor (`e_score_correction_bias`, LFM2-MoE's
    /// `expert_bias`).
    pub selection_bias: bool,
    /// Every sparse layer keeps its dense MLP beside the mixture (Gemma 4).
    pub beside_dense: bool,
    /// The routing weights scale each expert's input, and its output joins the sum unweighted
    /// (Llama 4: `routed_in = hidden * router_scores`).
    pub weights_on_input: bool,
}

impl MoeConfig {
    pub(super) fn from_json(
        j: &Value,
        arch: Architecture,
        num_layers: usize,
    ) -> Result<Option<Self>, String> {
        let keys = Keys(j);
        let int = |k: &str| keys.usize(k);
        let need = |k: &str| int(k)?.ok_or_else(|| format!("missing `{k}`"));
        // transformers 5 may write Qwen's `num_experts` under its alias `num_local_experts`.
        let qwen_experts = || match int("num_experts")? {
            Some(n) => Ok(n),
            None => need("num_local_experts").map_err(|_| "missing `num_experts`".to_string()),
        };
        let (num_experts, naming, renormalize) = match arch {
            // transformers' Qwen3NextConfig defaults norm_topk_prob to true.
            Architecture::Qwen3Next => (
                need("num_experts")?,
                ExpertNaming::Qwen,
                keys.bool("norm_topk_prob")?.unwrap_or(true),
            ),
            // Qwen3VLMoeTextTopKRouter always renormalizes its top-k.
            Architecture::Qwen3VlMoe => (qwen_experts()?, ExpertNaming::Qwen, true),
            Architecture::Qwen2Moe | Architecture::Qwen3Moe => (
                qwen_experts()?,
                ExpertNaming::Qwen,
                keys.bool("norm_topk_prob")?.unwrap_or(false),
            ),
            // Qwen3_5MoeTopKRouter always renormalizes its top-k.
            Architecture::Qwen3_5Moe => (need("num_experts")?, ExpertNaming::Qwen, true),
            Architecture::Mixtral | Architecture::MiniMaxM2 => {
                (need("num_local_experts")?, ExpertNaming::Mixtral, true)
            }
            Architecture::GptOss => (need("num_local_experts")?, ExpertNaming::GptOss, true),
            Architecture::KimiLinear => (
                need("n_routed_experts")?,
                ExpertNaming::KimiLinear,
                keys.bool("norm_topk_prob")?.unwrap_or(true),
            ),
            _ if arch == Architecture::Glm4Moe || arch.is_deepseek() => (
                need("n_routed_experts")?,
                ExpertNaming::Glm,
                keys.bool("norm_topk_prob")?.unwrap_or(true),
            ),
            Architecture::Lfm2Moe => (
                need("num_experts")?,
                ExpertNaming::Lfm2,
                keys.bool("norm_topk_prob")?.unwrap_or(true),
            ),
            // Granite 4.0-H without experts (H-Micro) is dense: its shared MLP alone.
            Architecture::Gemma4 => match keys.bool("enable_moe_block")?.unwrap_or(false) {
                false => return Ok(None),
                true => (need("num_experts")?, ExpertNaming::Gemma4, true),
            },
            Architecture::Llama4 => (need("num_local_experts")?, ExpertNaming::Llama4, false),
            // DeepseekV4TopKRouter always renormalizes.
            Architecture::DeepseekV4 => (need("n_routed_experts")?, ExpertNaming::Glm, true),
            Architecture::GraniteMoeHybrid => match int("num_local_experts")?.unwrap_or(8) {
                0 => return Ok(None),
                n => (n, ExpertNaming::Granite, true),
            },
            _ => return Ok(None),
        };
        let experts_per_token = match arch {
            Architecture::Gemma4 => need("top_k_experts")?,
            _ => need("num_experts_per_tok")?,
        };
        check_counts(num_experts, experts_per_token)?;
        let every_layer_sparse = matches!(
            arch,
            Architecture::Mixtral
                | Architecture::GptOss
                | Architecture::GraniteMoeHybrid
                | Architecture::MiniMaxM2
        );
        let v4 = arch == Architecture::DeepseekV4;
        let expert_intermediate_size = match every_layer_sparse || arch == Architecture::Llama4 {
            true => need("intermediate_size")?,
            false => need("moe_intermediate_size")?,
        };
        let sparse_layers = match arch {
            _ if every_layer_sparse || arch == Architecture::Gemma4 || v4 => {
                vec![true; num_layers]
            }
            _ if arch == Architecture::Glm4Moe || arch.is_deepseek() => {
                match mlp_layer_types(j, num_layers)? {
                    Some(sparse) => sparse,
                    None => {
                        let default = match arch {
                            Architecture::Glm4Moe => 1,
                            Architecture::Mistral4 => 0,
                            Architecture::MistralLarge4 => 1,
                            _ => 3,
                        };
                        let dense = int("first_k_dense_replace")?.unwrap_or(default);
                        (0..num_layers).map(|l| l >= dense).collect()
                    }
                }
            }
            Architecture::Lfm2Moe => {
                let dense = int("num_dense_layers")?.unwrap_or(2);
                (0..num_layers).map(|l| l >= dense).collect()
            }
            Architecture::Llama4 => llama4_moe_layers(j, num_layers)?,
            _ => {
                // Qwen-MoE: layer l is sparse unless listed in `mlp_only_layers`, every
                // `decoder_sparse_step`-th layer counting from 1.
                let step = int("decoder_sparse_step")?.unwrap_or(1);
                if step == 0 {
                    return Err("decoder_sparse_step 0 is not supported".into());
                }
                let dense: Vec<u64> = j
                    .get("mlp_only_layers")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_u64).collect())
                    .unwrap_or_default();
                (0..num_layers)
                    .map(|l| !dense.contains(&(l as u64)) && (l + 1) % step == 0)
                    .collect()
            }
        };
        let shared_expert = match (arch, int("shared_expert_intermediate_size")?) {
            (
                Architecture::Qwen2Moe | Architecture::Qwen3_5Moe | Architecture::Qwen3Next,
                Some(n),
            ) if n > 0 => Some(SharedExpert {
                intermediate_size: n,
                gated: true,
            }),
            // Llama4TextMoe's `shared_expert`: an expert's width, ungated.
            (Architecture::Llama4, _) => Some(SharedExpert {
                intermediate_size: expert_intermediate_size,
                gated: false,
            }),
            // Granite: the layer's `shared_mlp`, ungated.
            (Architecture::GraniteMoeHybrid, _) => Some(SharedExpert {
                intermediate_size: int("shared_intermediate_size")?.unwrap_or(1024),
                gated: false,
            }),
            // n_shared_experts fused into one MLP, ungated.
            (a, _) if a == Architecture::Glm4Moe || a.is_deepseek() || v4 => {
                match int("n_shared_experts")?.unwrap_or(1) {
                    0 => None,
                    n => Some(SharedExpert {
                        intermediate_size: n * expert_intermediate_size,
                        gated: false,
                    }),
                }
            }
            _ => None,
        };
        let router = match arch {
            Architecture::Glm4Moe
            | Architecture::DeepseekV3
            | Architecture::DeepseekV32
            | Architecture::GlmMoeDsa
            | Architecture::KimiLinear
            | Architecture::Glm5Next => {
                grouped_sigmoid(keys, num_experts, experts_per_token, renormalize)?
            }
            // Mistral4TopkRouter: DeepSeek's grouped choice over softmax scores, no bias
            // (Mistral Large 4's renormalizes always).
            Architecture::Mistral4 | Architecture::MistralLarge4 => {
                let (groups, top_groups, scale) =
                    grouped_choice(keys, num_experts, experts_per_token)?;
                Router::GroupedSoftmax {
                    groups,
                    top_groups,
                    renormalize,
                    scale,
                }
            }
            // Granite: the top k of the logits, a softmax over those k (no bias).
            Architecture::GptOss | Architecture::GraniteMoeHybrid => Router::TopKSoftmax,
            Architecture::DeepseekV4 => {
                let scale = keys.f64("routed_scaling_factor")?.unwrap_or(1.5) as f32;
                match keys.str("scoring_func")?.unwrap_or("sqrtsoftplus") {
                    "sqrtsoftplus" => Router::SqrtSoftplus { scale },
                    "sigmoid" => Router::Sigmoid {
                        groups: 1,
                        top_groups: 1,
                        renormalize: true,
                        scale,
                        eps: 1e-20,
                    },
                    other => {
                        return Err(format!(
                            "unsupported scoring_func `{other}` (DeepSeek-V4: sqrtsoftplus, \
                             sigmoid)"
                        ));
                    }
                }
            }
            // Llama4Router: the top k of the logits, their sigmoids.
            Architecture::Llama4 => Router::TopKSigmoid,
            // Lfm2MoeTopKRouter: sigmoid scores, the top k of them plus `expert_bias`, their sum
            // plus 1e-6 renormalizing.
            Architecture::Lfm2Moe => Router::Sigmoid {
                groups: 1,
                top_groups: 1,
                renormalize,
                scale: keys.f64("routed_scaling_factor")?.unwrap_or(1.0) as f32,
                eps: 1e-6,
            },
            // MiniMaxM2TopKRouter: sigmoid scores, the top k of them plus the bias, their sum
            // renormalizing.
            Architecture::MiniMaxM2 => Router::Sigmoid {
                groups: 1,
                top_groups: 1,
                renormalize: true,
                scale: 1.0,
                eps: 0.0,
            },
            _ => Router::Softmax { renormalize },
        };
        Ok(Some(Self {
            num_experts,
            experts_per_token,
            expert_intermediate_size,
            router,
            shared_expert,
            sparse_layers,
            naming,
            selection_bias: match arch {
                Architecture::Glm4Moe
                | Architecture::DeepseekV3
                | Architecture::DeepseekV32
                | Architecture::GlmMoeDsa
                | Architecture::MiniMaxM2
                | Architecture::KimiLinear
                | Architecture::Glm5Next
                | Architecture::DeepseekV4 => true,
                Architecture::Lfm2Moe => keys.bool("use_expert_bias")?.unwrap_or(true),
                _ => false,
            },
            beside_dense: arch == Architecture::Gemma4,
            weights_on_input: arch == Architecture::Llama4,
        }))
    }

    /// Nemotron-H's mixture (`NemotronHMoE`) for the blocks `sparse` marks (`moe` / `E`), or
    /// `None` where there are none (its configs carry the MoE keys' defaults regardless).
    pub(super) fn nemotron_h(j: &Value, sparse: Vec<bool>) -> Result<Option<Self>, String> {
        if !sparse.contains(&true) {
            return Ok(None);
        }
        let keys = Keys(j);
        if keys.usize("moe_latent_size")?.is_some() {
            return Err("unsupported moe_latent_size (Nemotron-H's latent mixtures)".into());
        }
        let need = |k: &str| keys.usize(k)?.ok_or_else(|| format!("missing `{k}`"));
        let num_experts = need("n_routed_experts")?;
        let experts_per_token = need("num_experts_per_tok")?;
        check_counts(num_experts, experts_per_token)?;
        let renormalize = keys.bool("norm_topk_prob")?.unwrap_or(true);
        Ok(Some(Self {
            num_experts,
            experts_per_token,
            expert_intermediate_size: need("moe_intermediate_size")?,
            router: grouped_sigmoid(keys, num_experts, experts_per_token, renormalize)?,
            shared_expert: match keys.usize("moe_shared_expert_intermediate_size")? {
                Some(0) | None => None,
                Some(n) => Some(SharedExpert {
                    intermediate_size: n,
                    gated: false,
                }),
            },
            sparse_layers: sparse,
            naming: ExpertNaming::NemotronH,
            selection_bias: true,
            beside_dense: false,
            weights_on_input: false,
        }))
    }

    pub fn is_sparse(&self, layer: usize) -> bool {
        self.sparse_layers.get(layer).copied().unwrap_or(false)
    }
}

/// Llama 4's sparse layers: `moe_layers` where given, else every
/// `interleave_moe_layer_step`-th layer (counting from 1).
fn llama4_moe_layers(j: &Value, num_layers: usize) -> Result<Vec<bool>, String> {
    match j.get("moe_layers") {
        None | Some(Value::Null) => {
            let step = Keys(j).usize("interleave_moe_layer_step")?.unwrap_or(1);
            if step == 0 {
                return Err("interleave_moe_layer_step 0 is not supported".into());
            }
            Ok((0..num_layers).map(|l| (l + 1) % step == 0).collect())
        }
        Some(v) => {
            let listed = v
                .as_array()
                .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
                .ok_or_else(|| format!("`moe_layers` is {v}, not a list of layers"))?;
            if let Some(l) = listed.iter().find(|&&l| l as usize >= num_layers) {
                return Err(format!("moe_layers lists layer {l} of {num_layers}"));
            }
            Ok((0..num_layers)
                .map(|l| listed.contains(&(l as u64)))
                .collect())
        }
    }
}

/// An error unless there are 1 to `MAX_EXPERTS` experts and 1 to that many a token.
fn check_counts(num_experts: usize, experts_per_token: usize) -> Result<(), String> {
    if num_experts > MAX_EXPERTS {
        return Err(format!("{num_experts} experts exceed {MAX_EXPERTS}"));
    }
    if num_experts == 0 || experts_per_token == 0 || experts_per_token > num_experts {
        return Err(format!(
            "num_experts_per_tok {experts_per_token} must be between 1 and the number of \
             experts {num_experts}"
        ));
    }
    Ok(())
}

/// DeepSeek's router (GLM-4.5, DeepSeek-V3, Nemotron-H): sigmoid scores chosen as
/// [`grouped_choice`] says; its renormalizing epsilon 1e-20.
fn grouped_sigmoid(
    keys: Keys,
    num_experts: usize,
    experts_per_token: usize,
    renormalize: bool,
) -> Result<Router, String> {
    let (groups, top_groups, scale) = grouped_choice(keys, num_experts, experts_per_token)?;
    Ok(Router::Sigmoid {
        groups,
        top_groups,
        renormalize,
        scale,
        eps: 1e-20,
    })
}

/// DeepSeek's grouped choice (its sigmoid routers, Mistral 4's softmax): the experts chosen
/// within the best `topk_group` of `n_group` groups, weighted times `routed_scaling_factor`.
fn grouped_choice(
    keys: Keys,
    num_experts: usize,
    experts_per_token: usize,
) -> Result<(usize, usize, f32), String> {
    let groups = keys.usize("n_group")?.unwrap_or(1);
    let top_groups = keys.usize("topk_group")?.unwrap_or(1);
    if groups == 0 || !num_experts.is_multiple_of(groups) || top_groups == 0 || top_groups > groups
    {
        return Err(format!(
            "n_group {groups} / topk_group {top_groups} do not divide {num_experts} experts"
        ));
    }
    if experts_per_token > top_groups * (num_experts / groups) {
        return Err(format!(
            "num_experts_per_tok {experts_per_token} exceeds the {} experts of topk_group {top_groups} groups",
            top_groups * (num_experts / groups)
        ));
    }
    let scale = keys.f64("routed_scaling_factor")?.unwrap_or(1.0) as f32;
    Ok((groups, top_groups, scale))
}

/// transformers 5's `mlp_layer_types` (`dense` / `sparse` a layer), where the config lists
/// them: which layers are mixtures.
fn mlp_layer_types(j: &Value, num_layers: usize) -> Result<Option<Vec<bool>>, String> {
    let list = match j.get("mlp_layer_types") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(v) => return Err(format!("`mlp_layer_types` is {v}, not a list")),
    };
    if list.len() != num_layers {
        return Err(format!(
            "mlp_layer_types has {} entries for {num_layers} layers",
            list.len()
        ));
    }
    list.iter()
        .map(|v| match v.as_str() {
            Some("sparse") => Ok(true),
            Some("dense") => Ok(false),
            _ => Err(format!(
                "unsupported mlp_layer_types entry {v} (supported: dense, sparse)"
            )),
        })
        .collect::<Result<_, _>>()
        .map(Some)
}
