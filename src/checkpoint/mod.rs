//! Reading a checkpoint as it is on disk: config, tensors, and each linear's quantization.

pub mod config;
pub mod deepseek_v4_names;
pub mod gguf;
pub mod locate;
pub mod mapped;
pub mod mistral_names;
pub mod modules;
pub mod qlinear;
pub mod scheme;
pub mod store;
pub mod transposed;

use std::path::{Path, PathBuf};

pub use config::{
    Architecture, DeltaNetConfig, GatedActivation, IndexerConfig, LayerAttention, ModelConfig,
    MoeConfig, RopeParams, RopeScaling, Router,
};
pub use modules::{
    AttnProjections, DeltaNetProjections, FeedForward, IndexerModules, LayerModules, Mlp, Module,
    SparseMlp,
};
pub use qlinear::{Fp4Scale, Packing, QLinear, ZeroPoint};
pub use scheme::QuantConfig;
pub use store::{TensorRef, TensorStore};

use crate::{Error, Result};

/// gpt-oss's stacked expert tensors and the per-expert names they are read under: MXFP4
/// blocks and scales, biases, and the dense layout's `[in, out]` matrices (`weight_t`).
const GPT_OSS_EXPERT_TENSORS: [(&str, &str); 8] = [
    ("gate_up_proj_blocks", "gate_up_proj.weight_packed"),
    ("gate_up_proj_scales", "gate_up_proj.weight_scale"),
    ("gate_up_proj_bias", "gate_up_proj.bias"),
    ("gate_up_proj", "gate_up_proj.weight_t"),
    ("down_proj_blocks", "down_proj.weight_packed"),
    ("down_proj_scales", "down_proj.weight_scale"),
    ("down_proj_bias", "down_proj.bias"),
    ("down_proj", "down_proj.weight_t"),
];

/// Qwen3-VL-MoE's stacked experts as its checkpoints store them, `x @ W`: `gate_up_proj`
/// `[E, hidden, 2I]` (gate columns first; its linears read their halves) and `down_proj`
/// `[E, I, hidden]`.
const QWEN3_VL_MOE_EXPERT_TENSORS: [(&str, &str); 2] = [
    ("gate_up_proj", "gate_up_proj.weight_t"),
    ("down_proj", "down_proj.weight_t"),
];

/// Whether Qwen3-VL-MoE's stacks lie as its published checkpoints hold them (`gate_up_proj`
/// `[E, hidden, 2I]`) rather than as transformers 5 holds them in memory (`[E, 2I, hidden]`,
/// which the generic split reads); a square one is taken as the latter, as transformers'
/// load-time transpose (`check_dims`) takes it.
fn qwen3_vl_moe_transposed(config: &ModelConfig, store: &TensorStore) -> bool {
    let Some(moe) = &config.moe else {
        return false;
    };
    let (h, i) = (config.hidden_size, moe.expert_intermediate_size);
    (0..config.num_layers).any(|l| {
        let name = format!("{}.layers.{l}.mlp.experts.gate_up_proj", config.prefix);
        store
            .try_get(&name)
            .is_some_and(|t| t.shape.get(1..) == Some(&[h, 2 * i][..]) && h != 2 * i)
    })
}

pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub quant: Option<QuantConfig>,
    pub store: TensorStore,
    /// Drop the activation quantization the checkpoint declares (`--activations weight-only`).
    pub weight_only: bool,
    /// Every decoder layer's linears, by module name and shape.
    pub layers: Vec<LayerModules>,
    lm_head: Module,
    /// The fused linear each part of one was read from (Phi-3's `q_proj` -> `qkv_proj`):
    /// the quantization config names the fused one.
    fused_from: std::collections::HashMap<String, String>,
}

impl Checkpoint {
    /// Opens the model directory `dir`, or `org/name[@revision]` from the local hub cache
    /// (`locate::model_dir`); `Checkpoint::dir` is where it was found.
    pub fn open(dir: &Path) -> Result<Self> {
        let dir = &locate::model_dir(dir)?;
        if let Some(path) = gguf::find(dir)? {
            return Self::open_gguf(&path);
        }
        let config_path = dir.join("config.json");
        let (config, json) = ModelConfig::from_file(&config_path)?;
        let quant = QuantConfig::from_config(&json, &config_path)?;
        let store = TensorStore::open(dir)?;
        Self::assemble(dir, &config_path, config, &json, quant, store)
    }

    /// Opens llama.cpp's GGUF file `path` (the first part of a split model): its metadata as
    /// the config, its tensors under transformers' names.
    fn open_gguf(path: &Path) -> Result<Self> {
        let model = gguf::GgufModel::open(path)?;
        let json = model.config_json()?;
        let mut config =
            ModelConfig::from_json(&json).map_err(|message| Error::format(path, message))?;
        // Adjacent pairs where the converter permuted q and k for them, or where the family
        // rotates them so itself (Llama 4, which the converter leaves as it is).
        config.rope_interleaved |= model.rope_interleaved()?;
        if let Some(net) = config.delta_net.as_mut() {
            net.tiled_values = model.tiled_value_heads()?;
            // The converter stores Qwen3-Next's fused projections as Qwen3.5's split ones
            // (`in_proj_qkvz` regrouped into two; `in_proj_ba` split by the store).
            if net.layout == config::DeltaNetLayout::Fused {
                net.layout = config::DeltaNetLayout::Split;
            }
        }
        config.from_gguf = true;
        let store = TensorStore::from_gguf(model)?;
        Self::assemble(path, path, config, &json, None, store)
    }

    /// The checkpoint of `config` (`json` as read from `config_path`) over `store`, its fused
    /// and stacked tensors named per linear and its layer and expert counts checked.
    fn assemble(
        dir: &Path,
        config_path: &Path,
        mut config: ModelConfig,
        json: &serde_json::Value,
        quant: Option<QuantConfig>,
        mut store: TensorStore,
    ) -> Result<Self> {
        // Mistral Large 4's and DeepSeek-V4's checkpoints keep their own names.
        match config.architecture {
            config::Architecture::MistralLarge4 => store.rename_as_layout(
                mistral_names::transformers_name,
                mistral_names::mistral_name,
            ),
            config::Architecture::DeepseekV4 => store.rename_as_layout(
                deepseek_v4_names::transformers_name,
                deepseek_v4_names::deepseek_name,
            ),
            // GLM-5.3-Flash's hyper-connections (`hc_attn_fn`) as transformers holds them.
            config::Architecture::Glm5Next => store.rename(config::hyper_name),
            _ => {}
        }
        // A multimodal checkpoint keeps its language model under another prefix
        // (transformers 5 writes `model.language_model`, older versions `language_model.model`).
        // Nemotron-H's published checkpoints keep theirs under `backbone`.
        let embed = config.names.embed;
        const PREFIXES: [&str; 4] = [
            "model",
            "model.language_model",
            "language_model.model",
            "backbone",
        ];
        if let Some(p) = PREFIXES
            .into_iter()
            .find(|p| store.contains(&format!("{p}.{embed}.weight")))
        {
            config.prefix = p.to_string();
        } else if !store.names().any(|n| {
            PREFIXES
                .iter()
                .any(|p| n.strip_prefix(p).is_some_and(|r| r.starts_with(".layers.")))
        }) {
            // Neither embeddings nor decoder layers: a tower alone, or not a language model.
            let example = store.names().min().unwrap_or("none").to_string();
            return Err(Error::format(
                dir,
                format!(
                    "holds no language model: no `{embed}.weight` or `layers.N` under {} \
                     (its tensors are e.g. `{example}`)",
                    PREFIXES.join(", ")
                ),
            ));
        }
        let mut fused_from = std::collections::HashMap::new();
        for l in 0..config.num_layers {
            for (fused, parts) in LayerModules::fused_parts(&config, l) {
                store.split_fused_rows(&fused, &parts)?;
                for (part, _) in parts {
                    fused_from.insert(part, fused.clone());
                }
            }
        }
        // gpt-oss and Qwen3-VL-MoE stack their experts' tensors: each expert's part named as a
        // linear of its own (a GGUF file's stacks are split as every family's are).
        let gpt_oss = config.moe.as_ref().map(|m| m.naming) == Some(config::ExpertNaming::GptOss);
        let stacks: &[(&str, &str)] = match config.architecture {
            _ if gpt_oss && !config.from_gguf => &GPT_OSS_EXPERT_TENSORS,
            config::Architecture::Qwen3VlMoe if qwen3_vl_moe_transposed(&config, &store) => {
                &QWEN3_VL_MOE_EXPERT_TENSORS
            }
            // Llama 4 stacks them as Qwen3-VL-MoE's published checkpoints do (its GGUF files
            // as every family's).
            config::Architecture::Llama4 if !config.from_gguf => &QWEN3_VL_MOE_EXPERT_TENSORS,
            _ => &[],
        };
        if let (Some(moe), false) = (&config.moe, stacks.is_empty()) {
            let block = match moe.naming {
                config::ExpertNaming::Llama4 => "feed_forward",
                _ => "mlp",
            };
            for l in 0..config.num_layers {
                let prefix = format!("{}.layers.{l}.{block}.experts", config.prefix);
                store.split_expert_stacks(&prefix, moe.num_experts, stacks)?;
            }
        }
        // Kimi-Linear's published checkpoints keep a dense layer's MLP under `mlp`, as
        // transformers holds it, and only the mixtures under `block_sparse_moe`; transformers
        // saves both under the latter (its key renaming reversed), which the names read.
        if config.architecture == config::Architecture::KimiLinear {
            for l in 0..config.num_layers {
                if !config.moe.as_ref().is_some_and(|m| m.is_sparse(l)) {
                    let layer = format!("{}.layers.{l}.", config.prefix);
                    store.rename_prefix(
                        &format!("{layer}mlp."),
                        &format!("{layer}block_sparse_moe."),
                    );
                }
            }
        }
        let layers: Vec<LayerModules> = (0..config.num_layers)
            .map(|l| LayerModules::new(&config, l))
            .collect();
        check_expert_count(config_path, &config, &layers, &store)?;
        let mtp_layers = config::Keys(json)
            .usize("num_nextn_predict_layers")
            .map_err(|why| Error::format(config_path, why))?;
        check_layer_count(config_path, &config, mtp_layers.unwrap_or(0), &store)?;
        let lm_head = Module {
            name: match config.prefix.strip_suffix(".model") {
                Some(outer) => format!("{outer}.lm_head"),
                None => "lm_head".to_string(),
            },
            out_features: config.vocab_size,
            in_features: config.hidden_size,
            bias: false,
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            quant,
            store,
            weight_only: false,
            layers,
            lm_head,
            fused_from,
        })
    }

    /// Linear `m` as stored, with the scheme its config group gives it (its layout only: no
    /// pass over its values).
    pub fn linear<'a>(&'a self, m: &'a Module) -> Result<QLinear<'a>> {
        let scheme = self.scheme_for(&m.name);
        QLinear::load(&self.store, m, scheme, self.config.dtype, self.weight_only)
    }

    /// [`linear`](Self::linear) for uploading: its stored floats checked for NaN and
    /// infinities first (one pass over its bytes, which the upload reads anyway).
    pub fn linear_checked<'a>(&'a self, m: &'a Module) -> Result<QLinear<'a>> {
        let q = self.linear(m)?;
        q.check_finite()?;
        Ok(q)
    }

    /// The scheme group of linear `module` by the config and the tensors on disk.
    fn scheme_for(&self, module: &str) -> Option<&scheme::SchemeGroup> {
        let quant = self.quant.as_ref()?;
        let module = self.fused_from.get(module).map_or(module, String::as_str);
        // An `ignore` list may name the module as transformers holds it in memory.
        if let Some(alias) = self.config.in_memory_name(module)
            && quant.ignores(&alias)
        {
            return None;
        }
        quant.scheme_for(module, |name| self.store.contains(name))
    }

    /// Whether routed experts quantize their input as this run executes them (a scheme
    /// declares input activations for an expert's gate and `--activations weight-only` is
    /// off): the GPU then holds each routed row gathered in f32 and quantized, which batch
    /// sizing counts. One expert a layer decides it (a layer's experts share a scheme).
    pub fn experts_quantize_input(&self) -> bool {
        !self.weight_only
            && self.layers.iter().any(|layer| {
                let sparse = layer.ffn.as_ref().and_then(modules::FeedForward::sparse);
                sparse.and_then(|s| s.experts.first()).is_some_and(|e| {
                    self.scheme_for(&e.gate.name)
                        .is_some_and(|g| g.input_activations.is_some())
                })
            })
    }

    /// The token embedding table `[vocab, hidden]`, as a dense linear (for gathers and ties).
    pub fn embedding(&self) -> Result<QLinear<'_>> {
        let c = &self.config;
        self.table(&c.embedding_name(), [c.vocab_size, c.hidden_size])
    }

    /// Dense table `name` of `shape` (an embedding), checked for NaN and infinities.
    pub fn table(&self, name: &str, shape: [usize; 2]) -> Result<QLinear<'_>> {
        let t = self.store.get(name)?;
        t.expect_shape(&shape)?;
        t.check_finite(false)?;
        QLinear::dense(t.name, t, self.config.dtype)
    }

    /// The output projection, or `None` when it is tied to the embedding.
    pub fn lm_head(&self) -> Result<Option<QLinear<'_>>> {
        let head = format!("{}.", self.lm_head.name);
        let stored = self.store.names().any(|n| n.starts_with(&head));
        if self.config.tie_word_embeddings && !stored {
            return Ok(None);
        }
        self.linear(&self.lm_head).map(Some)
    }

    /// An integer tensor of shape `shape` (DeepSeek-V4's `tid2eid`).
    pub fn integers(&self, name: &str, shape: &[usize]) -> Result<Vec<i64>> {
        let t = self.store.get(name)?;
        t.expect_shape(shape)?;
        t.to_i64()
    }

    /// A norm weight `[n]` widened to f32.
    pub fn norm(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        self.floats(name, &[n])
    }

    /// The tensors a run never reads, outside the language model and its lm_head (a
    /// multimodal checkpoint's vision tower and projector, Qwen3.5's multi-token-prediction
    /// layers): their count and stored bytes.
    pub fn outside_language_model(&self) -> (usize, u64) {
        self.store
            .names()
            .filter(|n| !self.in_language_model(n))
            .filter_map(|n| self.store.byte_len(n))
            .fold((0, 0), |(k, b), len| (k + 1, b + len as u64))
    }

    /// Whether tensor `name` belongs to the language model or its lm_head.
    fn in_language_model(&self, name: &str) -> bool {
        name.strip_prefix(&self.config.prefix)
            .is_some_and(|rest| rest.starts_with('.'))
            || name.starts_with(&self.lm_head.name)
    }

    /// The language model's tensors that loading it never read (call after every layer is
    /// loaded), sorted: a config that does not describe its checkpoint (biases it does not
    /// declare, a family read as another) would otherwise evaluate another model in silence.
    /// Layers past `num_hidden_layers` (multi-token prediction) are left out.
    pub fn unread_tensors(&self) -> Vec<&str> {
        let layers = format!("{}.layers.", self.config.prefix);
        let past_last_layer = |name: &str| {
            name.strip_prefix(&layers)
                .and_then(|r| r.split('.').next()?.parse::<usize>().ok())
                .is_some_and(|l| l >= self.config.num_layers)
        };
        // Gemma 4's checkpoints may keep the key/value projections of the layers that reuse
        // an earlier layer's (transformers ignores them on load).
        let reused_kv = |name: &str| {
            let Some((layer, rest)) = name.strip_prefix(&layers).and_then(|r| r.split_once('.'))
            else {
                return false;
            };
            layer
                .parse::<usize>()
                .is_ok_and(|l| self.config.kv_source(l).is_some())
                && ["k_proj.", "v_proj.", "k_norm.", "v_norm."]
                    .iter()
                    .any(|m| rest.starts_with(&format!("{}.{m}", self.config.names.attn)))
        };
        self.store
            .unread()
            .into_iter()
            .filter(|n| self.in_language_model(n) && !past_last_layer(n) && !reused_kv(n))
            .collect()
    }

    /// The values of a small dense tensor of shape `shape` as f32 (norm weights, a
    /// convolution's taps, per-head parameters), checked for NaN and infinities.
    pub fn floats(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.store.get(name)?;
        t.expect_shape(shape)?;
        t.check_finite(false)?;
        t.to_f32()
    }
}

/// What a report says about a checkpoint: shape, schemes, bits per weight, size.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub architecture: String,
    pub layers: usize,
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub params: u64,
    /// Distinct schemes of the decoder linears with their counts, e.g. `35 x int4 channel sym`.
    pub quantization: String,
    pub lm_head: String,
    /// Storage bits per weight over the decoder linears.
    pub bits_per_weight: f64,
    /// Bytes of every tensor as stored.
    pub checkpoint_bytes: u64,
    /// How activations are treated.
    pub activations: String,
    /// The mixture of experts, for MoE checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<ExpertSummary>,
}

/// What a report says about a checkpoint's experts.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ExpertSummary {
    /// Routed experts per sparse layer.
    pub experts: usize,
    pub experts_per_token: usize,
    pub sparse_layers: usize,
    /// Parameters one token goes through (its routed experts, shared ones, attention,
    /// embeddings and lm_head).
    pub active_params: u64,
    /// Storage bits per weight over the routed experts' linears, and over every other decoder
    /// linear.
    pub expert_bits_per_weight: f64,
    pub other_bits_per_weight: f64,
}

impl Checkpoint {
    pub fn summary(&self) -> Result<Summary> {
        let c = &self.config;
        let mut counts: Vec<(String, usize)> = Vec::new();
        // (bits, weights) of the routed experts' linears and of the others.
        let mut expert_bits = [(0f64, 0f64); 2];
        let mut declared_act = None;
        for layer in &self.layers {
            for m in layer.linears() {
                let q = self.linear(m)?;
                let n = (q.out_features * q.in_features) as f64;
                let sum = &mut expert_bits[usize::from(!layer.is_routed_expert(m))];
                sum.0 += q.bits_per_weight() * n;
                sum.1 += n;
                let label = q.scheme_label();
                match counts.iter_mut().find(|(s, _)| *s == label) {
                    Some((_, k)) => *k += 1,
                    None => counts.push((label, 1)),
                }
                if declared_act.is_none() {
                    let scheme = self.scheme_for(q.name);
                    declared_act = scheme.and_then(|s| s.input_activations.clone());
                }
            }
        }
        let lm_head = match self.lm_head()? {
            None => "tied to the embedding (dense)".to_string(),
            Some(h) => h.scheme_label(),
        };
        let activations = match (&declared_act, self.weight_only) {
            (None, _) => "not quantized (weight-only checkpoint)".to_string(),
            (Some(a), false) => format!(
                "{:?} {}-bit {:?} fake-quantized as the quantizer runs them (declared)",
                a.num_type, a.num_bits, a.strategy
            ),
            (Some(a), true) => format!(
                "unquantized: --activations weight-only (the checkpoint declares {:?} {}-bit {:?})",
                a.num_type, a.num_bits, a.strategy
            ),
        };
        let ratio = |(bits, weights): (f64, f64)| if weights > 0.0 { bits / weights } else { 0.0 };
        let [routed, other] = expert_bits;
        let experts = c.moe.as_ref().map(|m| ExpertSummary {
            experts: m.num_experts,
            experts_per_token: m.experts_per_token,
            sparse_layers: m.sparse_layers.iter().filter(|&&s| s).count(),
            active_params: c.active_params(),
            expert_bits_per_weight: ratio(routed),
            other_bits_per_weight: ratio(other),
        });
        Ok(Summary {
            architecture: format!("{:?}", c.architecture),
            layers: c.num_layers,
            hidden_size: c.hidden_size,
            vocab_size: c.vocab_size,
            params: c.num_params(),
            quantization: counts
                .iter()
                .map(|(s, k)| format!("{k} x {s}"))
                .collect::<Vec<_>>()
                .join(", "),
            lm_head,
            bits_per_weight: ratio((routed.0 + other.0, routed.1 + other.1)),
            checkpoint_bytes: self.store.total_bytes(),
            activations,
            experts,
        })
    }
}

/// Refuses a checkpoint whose tensors hold decoder layers past `num_hidden_layers` and the
/// `mtp_layers` multi-token-prediction layers DeepSeek-V3 and GLM-4.5 append after them: a
/// config with fewer layers would evaluate a truncated model in silence (fewer show up as a
/// missing tensor when the layer loads).
fn check_layer_count(
    config_path: &Path,
    config: &ModelConfig,
    mtp_layers: usize,
    store: &TensorStore,
) -> Result<()> {
    let prefix = format!("{}.layers.", config.prefix);
    let stored = store.numbered_under(&prefix);
    if stored > config.num_layers + mtp_layers {
        return Err(Error::format(
            config_path,
            format!(
                "num_hidden_layers is {} but the checkpoint holds layers up to {prefix}{} ({stored} layers{})",
                config.num_layers,
                stored - 1,
                match mtp_layers {
                    0 => String::new(),
                    n => format!(", {n} of them multi-token prediction"),
                }
            ),
        ));
    }
    Ok(())
}

/// Refuses a mixture whose tensors hold more experts than `num_experts` says (fewer show up
/// as a missing tensor when the layer loads).
fn check_expert_count(
    config_path: &Path,
    config: &ModelConfig,
    layers: &[LayerModules],
    store: &TensorStore,
) -> Result<()> {
    let Some(moe) = &config.moe else {
        return Ok(());
    };
    for layer in layers {
        let Some(s) = layer.ffn.as_ref().and_then(FeedForward::sparse) else {
            continue;
        };
        let prefix = format!("{}.", s.experts_prefix);
        let stored = store.numbered_under(&prefix);
        if stored > moe.num_experts {
            return Err(Error::format(
                config_path,
                format!(
                    "num_experts is {} but the checkpoint holds experts up to {}{} ({stored} experts)",
                    moe.num_experts,
                    prefix,
                    stored - 1
                ),
            ));
        }
    }
    Ok(())
}
