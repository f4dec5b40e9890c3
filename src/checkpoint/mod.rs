//! Reading a checkpoint as it is on disk: config, tensors, and each linear's quantization.

pub mod config;
pub mod qlinear;
pub mod scheme;
pub mod store;

use std::path::{Path, PathBuf};

pub use config::{Architecture, ModelConfig, RopeScaling};
pub use qlinear::{Packing, QLinear, ZeroPoint};
pub use scheme::QuantConfig;
pub use store::{TensorRef, TensorStore};

use crate::{Error, Result};

/// The seven linears of a decoder layer, by HF module suffix.
pub const LAYER_LINEARS: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub quant: Option<QuantConfig>,
    pub store: TensorStore,
    /// Drop the activation quantization the checkpoint declares (`--activations weight-only`).
    pub weight_only: bool,
    /// Module names of every linear, layer by layer, then `lm_head`, kept for borrowing.
    module_names: Vec<String>,
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            return Err(Error::io(
                dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "model directory not found"),
            ));
        }
        let config_path = dir.join("config.json");
        let (config, json) = ModelConfig::from_file(&config_path)?;
        let quant = QuantConfig::from_config(&json, &config_path)?;
        let store = TensorStore::open(dir)?;
        let mut module_names = Vec::new();
        for l in 0..config.num_layers {
            for s in LAYER_LINEARS {
                module_names.push(format!("model.layers.{l}.{s}"));
            }
        }
        module_names.push("lm_head".to_string());
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            quant,
            store,
            weight_only: false,
            module_names,
        })
    }

    /// Linear `index` of layer `layer` (index into LAYER_LINEARS).
    pub fn layer_linear(&self, layer: usize, index: usize) -> Result<QLinear<'_>> {
        let c = &self.config;
        let q = c.num_heads * c.head_dim;
        let kv = c.num_kv_heads * c.head_dim;
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let (out, inp) = match index {
            0 => (q, h),
            1 | 2 => (kv, h),
            3 => (h, q),
            4 | 5 => (i, h),
            _ => (h, i),
        };
        let name = &self.module_names[layer * LAYER_LINEARS.len() + index];
        let bias = c.qkv_bias && index < 3;
        self.linear(name, out, inp, bias)
    }

    fn linear<'a>(
        &'a self,
        name: &'a str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<QLinear<'a>> {
        let scheme = self.quant.as_ref().and_then(|q| q.scheme_for(name));
        let mut l = QLinear::load(&self.store, name, scheme, out, inp, self.config.dtype, bias)?;
        if self.weight_only {
            l.act_quant = None;
        }
        Ok(l)
    }

    /// The token embedding table `[vocab, hidden]`, as a dense linear (for gathers and ties).
    pub fn embedding(&self) -> Result<QLinear<'_>> {
        let t = self.store.get("model.embed_tokens.weight")?;
        t.expect_shape(&[self.config.vocab_size, self.config.hidden_size])?;
        QLinear::dense(t.name, t, self.config.dtype)
    }

    /// The output projection, or `None` when it is tied to the embedding.
    pub fn lm_head(&self) -> Result<Option<QLinear<'_>>> {
        let name = self
            .module_names
            .last()
            .map(String::as_str)
            .unwrap_or("lm_head");
        let stored = self.store.names().any(|n| n.starts_with("lm_head."));
        if self.config.tie_word_embeddings && !stored {
            return Ok(None);
        }
        let c = &self.config;
        self.linear(name, c.vocab_size, c.hidden_size, false)
            .map(Some)
    }

    /// A norm weight `[n]` widened to f32.
    pub fn norm(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        let t = self.store.get(name)?;
        t.expect_shape(&[n])?;
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
}

impl Checkpoint {
    pub fn summary(&self) -> Result<Summary> {
        let c = &self.config;
        let mut counts: Vec<(String, usize)> = Vec::new();
        let (mut bits, mut weights) = (0f64, 0f64);
        let mut declared_act = None;
        for l in 0..c.num_layers {
            for i in 0..LAYER_LINEARS.len() {
                let q = self.layer_linear(l, i)?;
                let n = (q.out_features * q.in_features) as f64;
                bits += q.bits_per_weight() * n;
                weights += n;
                let label = q.scheme_label();
                match counts.iter_mut().find(|(s, _)| *s == label) {
                    Some((_, k)) => *k += 1,
                    None => counts.push((label, 1)),
                }
                if declared_act.is_none() {
                    let scheme = self.quant.as_ref().and_then(|qc| qc.scheme_for(q.name));
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
                "{:?} {}-bit {:?} fake-quantized as compressed-tensors does (declared)",
                a.num_type, a.num_bits, a.strategy
            ),
            (Some(a), true) => format!(
                "unquantized: --activations weight-only (the checkpoint declares {:?} {}-bit {:?})",
                a.num_type, a.num_bits, a.strategy
            ),
        };
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
            bits_per_weight: if weights > 0.0 { bits / weights } else { 0.0 },
            checkpoint_bytes: self.store.total_bytes(),
            activations,
        })
    }
}
