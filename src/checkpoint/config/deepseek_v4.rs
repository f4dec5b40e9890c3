//! DeepSeek-V4 (`DeepseekV4Config`): what its layers add to the one forward pass, resolved as
//! transformers' `DeepseekV4Config.__post_init__` resolves the config (its legacy keys
//! included: `compress_ratios`, `num_hash_layers`, `compress_rate_csa`/`_hca`,
//! `qk_rope_head_dim`, a flat `rope_scaling`).

use serde_json::Value;

use super::Keys;
use super::attention::LayerAttention;
use super::rope::{RopeParams, RopeScaling, parse_rope_scaling};

/// How a layer attends beyond its sliding window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    /// `sliding_attention`: its window alone.
    None,
    /// `heavily_compressed_attention`: every entry pooled from `rate` tokens that a query
    /// has seen whole.
    Heavy { rate: usize },
    /// `compressed_sparse_attention`: entries pooled from overlapping windows of `2 * rate`
    /// tokens (stride `rate`), each query keeping the indexer's top `index_topk` of them.
    Sparse { rate: usize },
}

impl Compression {
    /// The tokens an entry closes on, where the layer compresses.
    pub fn rate(self) -> Option<usize> {
        match self {
            Compression::None => None,
            Compression::Heavy { rate } | Compression::Sparse { rate } => Some(rate),
        }
    }
}

/// DeepSeek-V4's options beside the common ones (one key/value head of `head_dim`, read as
/// keys and values; `ModelConfig::rope` is the compressed layers' RoPE, `local_rope` the
/// sliding layers').
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DeepseekV4Layers {
    /// Per layer.
    pub compression: Vec<Compression>,
    pub q_lora_rank: usize,
    /// The grouped output projection: `o_groups` groups of heads, each to `o_lora_rank`.
    pub o_groups: usize,
    pub o_lora_rank: usize,
    /// The indexer of the sparse layers over their compressed entries.
    pub index_heads: usize,
    pub index_head_dim: usize,
    pub index_top_k: usize,
    /// Per layer: experts chosen by `tid2eid[token]` (`hash_moe`) rather than by score.
    pub hash_routed: Vec<bool>,
}

impl DeepseekV4Layers {
    pub(super) fn from_json(j: &Value, num_layers: usize) -> Result<Self, String> {
        let keys = Keys(j);
        let rates = j.get("compress_rates").filter(|v| !v.is_null());
        let rate = |name: &str, legacy: &str, default: usize| -> Result<usize, String> {
            let v = match rates {
                Some(r) => Keys(r).usize(name)?,
                None => None,
            };
            match v.or(keys.usize(legacy)?).unwrap_or(default) {
                0 => Err(format!("compress rate of {name} is 0")),
                v => Ok(v),
            }
        };
        let (csa, hca) = (
            rate("compressed_sparse_attention", "compress_rate_csa", 4)?,
            rate("heavily_compressed_attention", "compress_rate_hca", 128)?,
        );
        let compression = match (j.get("layer_types"), j.get("compress_ratios")) {
            (Some(Value::Array(types)), _) => types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(Compression::None),
                    Some("compressed_sparse_attention") => Ok(Compression::Sparse { rate: csa }),
                    Some("heavily_compressed_attention") => Ok(Compression::Heavy { rate: hca }),
                    _ => Err(format!(
                        "unsupported layer_types entry {t} (DeepSeek-V4: sliding_attention, \
                         compressed_sparse_attention, heavily_compressed_attention)"
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
            (_, Some(Value::Array(ratios))) => ratios
                .iter()
                .map(|r| match r.as_u64() {
                    Some(0) => Ok(Compression::None),
                    Some(4) => Ok(Compression::Sparse { rate: csa }),
                    Some(128) => Ok(Compression::Heavy { rate: hca }),
                    _ => Err(format!(
                        "unsupported compress_ratios entry {r} (DeepSeek-V4: 0, 4, 128)"
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => (0..num_layers)
                // Two heavily compressed layers, then sparse and heavy by turns.
                .map(|l| match l {
                    l if l >= 2 && l % 2 == 1 => Compression::Sparse { rate: csa },
                    _ => Compression::Heavy { rate: hca },
                })
                .collect(),
        };
        // transformers keeps the first `num_hidden_layers` entries.
        if compression.len() < num_layers {
            return Err(format!(
                "layer_types has {} entries for {num_layers} layers",
                compression.len()
            ));
        }
        let hash_routed = match j.get("mlp_layer_types") {
            Some(Value::Array(types)) => {
                if types.len() < num_layers {
                    return Err(format!(
                        "mlp_layer_types has {} entries for {num_layers} layers",
                        types.len()
                    ));
                }
                types
                    .iter()
                    .take(num_layers)
                    .map(|t| match t.as_str() {
                        Some("hash_moe") => Ok(true),
                        Some("moe") => Ok(false),
                        _ => Err(format!(
                            "unsupported mlp_layer_types entry {t} (DeepSeek-V4: hash_moe, moe)"
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
            _ => {
                let hashed = keys.usize("num_hash_layers")?.unwrap_or(3);
                (0..num_layers).map(|l| l < hashed).collect()
            }
        };
        Ok(Self {
            compression: compression.into_iter().take(num_layers).collect(),
            q_lora_rank: keys.positive("q_lora_rank", 1024)?,
            o_groups: keys.positive("o_groups", 8)?,
            o_lora_rank: keys.positive("o_lora_rank", 1024)?,
            index_heads: keys.positive("index_n_heads", 64)?,
            index_head_dim: keys.positive("index_head_dim", 128)?,
            index_top_k: keys.positive("index_topk", 512)?,
            hash_routed,
        })
    }

    /// The grouped output projection's groups divide the heads, and the indexer selects no more
    /// entries than a window of `max_positions` holds.
    pub(super) fn check(&self, heads: usize, max_positions: usize) -> Result<(), String> {
        if !heads.is_multiple_of(self.o_groups) {
            return Err(format!(
                "`o_groups` {} does not divide num_attention_heads {heads}",
                self.o_groups
            ));
        }
        if self.index_top_k > max_positions {
            return Err(format!(
                "`index_topk` {} exceeds max_position_embeddings {max_positions}",
                self.index_top_k
            ));
        }
        Ok(())
    }

    /// Each layer's attention as the rest of quantppl reads `layer_types`: a window (and, in
    /// the compressed layers, entries beyond it).
    pub(super) fn layer_types(&self) -> Vec<LayerAttention> {
        self.compression
            .iter()
            .map(|c| match c {
                Compression::None => LayerAttention::Sliding,
                _ => LayerAttention::Compressed,
            })
            .collect()
    }
}

/// DeepSeek-V4's two RoPEs: the compressed layers' (`compress`: `compress_rope_theta`, with
/// the YaRN of a flat `rope_scaling`, whose attention factor defaults to 1) and the sliding
/// layers' (`main`), from `rope_parameters` keyed by them or the flat keys.
pub(super) fn ropes(j: &Value, max_positions: usize) -> Result<(RopeParams, RopeParams), String> {
    let keys = Keys(j);
    let params = j.get("rope_parameters").filter(|v| v.is_object());
    let read = |p: &Value, theta: f64| -> Result<RopeParams, String> {
        Ok(RopeParams {
            theta: Keys(p).f64("rope_theta")?.unwrap_or(theta),
            scaling: parse_rope_scaling(p, max_positions, None)?,
        })
    };
    let main_theta = keys.f64("rope_theta")?.unwrap_or(10_000.0);
    let compress_theta = keys.f64("compress_rope_theta")?.unwrap_or(160_000.0);
    if let Some(p) = params.filter(|p| p.get("main").is_some() || p.get("compress").is_some()) {
        let part = |k: &str, theta: f64| match p.get(k).filter(|v| v.is_object()) {
            Some(v) => read(v, theta),
            None => Err(format!("rope_parameters has no `{k}` entry")),
        };
        return Ok((part("compress", compress_theta)?, part("main", main_theta)?));
    }
    let flat = j.get("rope_scaling").filter(|v| v.is_object()).or(params);
    let mut scaling = match flat {
        Some(s) => parse_rope_scaling(s, max_positions, None)?,
        None => None,
    };
    // transformers sets the compressed layers' YaRN attention factor to 1 where the config
    // does not say.
    if let (
        Some(RopeScaling::Yarn {
            attention_factor, ..
        }),
        Some(s),
    ) = (&mut scaling, flat)
        && Keys(s).f64("attention_factor")?.is_none()
    {
        *attention_factor = 1.0;
    }
    let main = RopeParams {
        theta: main_theta,
        scaling: None,
    };
    let compress = RopeParams {
        theta: compress_theta,
        scaling,
    };
    Ok((compress, main))
}
