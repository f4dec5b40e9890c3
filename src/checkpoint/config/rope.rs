//! The rotary embeddings of a config: `rope_parameters` (transformers 5; flat, or per layer
//! type) or the older `rope_theta` / `rope_scaling` / `rope_local_base_freq`, the scaling
//! kinds transformers implements, and the rotated part of each head.

use serde_json::Value;

use super::{Architecture, Keys, MlaConfig};

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum RopeScaling {
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// YaRN: frequencies blended between interpolated and extrapolated by a ramp over the
    /// dimensions, cos/sin scaled by `attention_factor` (resolved from `mscale` and
    /// `mscale_all_dim` as transformers does).
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        truncate: bool,
        attention_factor: f64,
    },
    /// LongRoPE (Phi-3): per-dimension factors, the long ones for sequences longer than
    /// `original_max_position_embeddings`, cos/sin scaled by `attention_factor`.
    Longrope {
        short_factor: Vec<f64>,
        long_factor: Vec<f64>,
        original_max_position_embeddings: usize,
        attention_factor: f64,
    },
    /// Gemma 4's proportional RoPE: over the whole head, the first `int(fraction * head_dim
    /// // 2)` frequencies `base^(-2i / head_dim)` and the rest 0 (those pairs unrotated), all
    /// divided by `factor`.
    Proportional {
        fraction: f64,
        factor: f64,
    },
}

/// How `inspect` says it: the kind and its numbers.
impl std::fmt::Display for RopeScaling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RopeScaling::Linear { factor } => write!(f, "linear scaling x{factor}"),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => write!(
                f,
                "llama3 scaling x{factor} from {original_max_position_embeddings} positions \
                 (low/high frequency factors {low_freq_factor}/{high_freq_factor})"
            ),
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                attention_factor,
                ..
            } => write!(
                f,
                "YaRN scaling x{factor} from {original_max_position_embeddings} positions \
                 (attention factor {attention_factor:.4})"
            ),
            RopeScaling::Longrope {
                original_max_position_embeddings,
                attention_factor,
                ..
            } => write!(
                f,
                "LongRoPE from {original_max_position_embeddings} positions (attention factor \
                 {attention_factor:.4})"
            ),
            RopeScaling::Proportional { fraction, factor } => {
                write!(f, "proportional over {fraction} of each head")?;
                match *factor == 1.0 {
                    true => Ok(()),
                    false => write!(f, ", frequencies divided by {factor}"),
                }
            }
        }
    }
}

/// The rotary embedding of a set of layers: its base and scaling.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RopeParams {
    pub theta: f64,
    pub scaling: Option<RopeScaling>,
}

/// `theta 500000`, then the scaling where there is one.
impl std::fmt::Display for RopeParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "theta {}", self.theta)?;
        match &self.scaling {
            Some(s) => write!(f, ", {s}"),
            None => Ok(()),
        }
    }
}

/// The rotary embeddings: `rope_parameters` (transformers 5; flat, or per layer type as
/// Gemma 3 writes it) or the older `rope_theta` / `rope_scaling` / `rope_local_base_freq`.
/// Returns the full-attention layers' and, where they differ, the sliding layers'.
pub(super) fn parse_rope(
    j: &Value,
    arch: Architecture,
    max_positions: usize,
) -> Result<(RopeParams, Option<RopeParams>), String> {
    let gemma3 = arch == Architecture::Gemma3;
    let params = j.get("rope_parameters").filter(|v| v.is_object());
    let top_original = Keys(j).f64("original_max_position_embeddings")?;
    let read = |p: &Value, default_theta: f64| -> Result<RopeParams, String> {
        Ok(RopeParams {
            theta: Keys(p).f64("rope_theta")?.unwrap_or(default_theta),
            scaling: parse_rope_scaling(p, max_positions, top_original)?,
        })
    };
    let global_theta = if gemma3 || arch.is_lfm2() {
        1_000_000.0
    } else if arch == Architecture::Llama4 {
        500_000.0
    } else {
        10_000.0
    };
    if let Some(per_type) =
        params.filter(|p| p.get("full_attention").is_some() || p.get("sliding_attention").is_some())
    {
        let global = match per_type.get("full_attention") {
            Some(p) => read(p, global_theta)?,
            None => RopeParams {
                theta: global_theta,
                scaling: None,
            },
        };
        let local = per_type
            .get("sliding_attention")
            .map(|p| read(p, 10_000.0))
            .transpose()?;
        return Ok((global, local));
    }
    // transformers' Gemma4TextConfig defaults, where `rope_parameters` is absent.
    if arch == Architecture::Gemma4 && params.is_none() {
        let full = RopeParams {
            theta: 1_000_000.0,
            scaling: Some(RopeScaling::Proportional {
                fraction: 0.25,
                factor: 1.0,
            }),
        };
        let sliding = RopeParams {
            theta: 10_000.0,
            scaling: None,
        };
        return Ok((full, Some(sliding)));
    }
    let theta = match (Keys(j).f64("rope_theta")?, params) {
        (Some(theta), _) => theta,
        (None, Some(p)) => Keys(p).f64("rope_theta")?.unwrap_or(global_theta),
        (None, None) => global_theta,
    };
    let scaling = match j.get("rope_scaling").filter(|v| v.is_object()).or(params) {
        None => None,
        Some(s) => parse_rope_scaling(s, max_positions, top_original)?,
    };
    let local_theta = Keys(j).f64("rope_local_base_freq")?.unwrap_or(10_000.0);
    let local = gemma3.then_some(RopeParams {
        theta: local_theta,
        scaling: None,
    });
    Ok((RopeParams { theta, scaling }, local))
}

/// transformers' `yarn_get_mscale`.
pub(super) fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

pub(super) fn parse_rope_scaling(
    s: &Value,
    max_positions: usize,
    top_original: Option<f64>,
) -> Result<Option<RopeScaling>, String> {
    let keys = Keys(s);
    let kind = match keys.str("rope_type")? {
        Some(kind) => kind,
        None => keys.str("type")?.unwrap_or("default"),
    };
    let opt = |k: &str| keys.f64(k).map_err(|e| format!("rope_scaling: {e}"));
    let num = |k: &str| -> Result<f64, String> {
        opt(k)?.ok_or_else(|| format!("rope_scaling of type {kind} lacks `{k}`"))
    };
    let original = || -> Result<f64, String> {
        opt("original_max_position_embeddings")?
            .or(top_original)
            .filter(|&v| v > 0.0)
            .ok_or_else(|| {
                format!("rope_scaling of type {kind} lacks `original_max_position_embeddings`")
            })
    };
    let factors = |k: &str| -> Result<Vec<f64>, String> {
        s.get(k)
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<_>>>())
            .ok_or_else(|| format!("rope_scaling of type {kind} lacks a numeric list `{k}`"))
    };
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear {
            factor: num("factor")?,
        })),
        "llama3" => Ok(Some(RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")?,
        })),
        "yarn" => {
            let original = original()?;
            let factor = opt("factor")?.unwrap_or(max_positions as f64 / original);
            let attention_factor = match (
                opt("attention_factor")?,
                opt("mscale")?,
                opt("mscale_all_dim")?,
            ) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    yarn_mscale(factor, m) / yarn_mscale(factor, all)
                }
                _ => yarn_mscale(factor, 1.0),
            };
            Ok(Some(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                // `or` in transformers: 0 means the default too.
                beta_fast: opt("beta_fast")?.filter(|&b| b != 0.0).unwrap_or(32.0),
                beta_slow: opt("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0),
                truncate: keys
                    .bool("truncate")
                    .map_err(|e| format!("rope_scaling: {e}"))?
                    .unwrap_or(true),
                attention_factor,
            }))
        }
        "longrope" | "su" => {
            let original = original().unwrap_or(max_positions as f64);
            let factor = opt("factor")?.unwrap_or(max_positions as f64 / original);
            let attention_factor = opt("attention_factor")?.unwrap_or(if factor <= 1.0 {
                1.0
            } else {
                (1.0 + factor.ln() / original.ln()).sqrt()
            });
            Ok(Some(RopeScaling::Longrope {
                short_factor: factors("short_factor")?,
                long_factor: factors("long_factor")?,
                original_max_position_embeddings: original as usize,
                attention_factor,
            }))
        }
        "proportional" => {
            let fraction = opt("partial_rotary_factor")?.unwrap_or(1.0);
            let factor = opt("factor")?.unwrap_or(1.0);
            if !(fraction > 0.0 && fraction <= 1.0 && factor > 0.0 && factor.is_finite()) {
                return Err(format!(
                    "proportional RoPE with partial_rotary_factor {fraction} and factor {factor}"
                ));
            }
            Ok(Some(RopeScaling::Proportional { fraction, factor }))
        }
        other => Err(format!(
            "unsupported rope_scaling type `{other}` (supported: default, linear, llama3, yarn, longrope, proportional)"
        )),
    }
}

/// Queries multiplied, after RoPE, by `1 + beta * ln(1 + floor((pos + shift) / period))`
/// (Ministral 3's and Mistral 4's `llama_4_scaling_beta` over their
/// `original_max_position_embeddings`, shift 0; Llama 4's temperature tuning of its layers
/// without RoPE, `attn_scale` over `floor_scale`, shift 1): 1 within the first period, growing
/// past it.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct QueryScale {
    pub beta: f64,
    pub period: usize,
    pub shift: usize,
}

impl QueryScale {
    /// Ministral 3's and Mistral 4's, from `rope_parameters` (both keys required, as
    /// transformers reads them).
    pub(super) fn from_rope_parameters(j: &Value) -> Result<Self, String> {
        let p = j
            .get("rope_parameters")
            .or_else(|| j.get("rope_scaling"))
            .filter(|v| v.is_object())
            .ok_or("queries scaled by position without `rope_parameters`")?;
        let keys = Keys(p);
        let beta = keys
            .f64("llama_4_scaling_beta")?
            .ok_or("missing `rope_parameters.llama_4_scaling_beta`")?;
        let period = keys
            .usize("original_max_position_embeddings")?
            .filter(|&n| n > 0)
            .ok_or("missing `rope_parameters.original_max_position_embeddings`")?;
        if !beta.is_finite() {
            return Err(format!(
                "`llama_4_scaling_beta` is {beta}; it must be finite"
            ));
        }
        Ok(Self {
            beta,
            period,
            shift: 0,
        })
    }

    /// The factor at position `pos`, in f32 as torch computes it.
    pub fn at(&self, pos: usize) -> f32 {
        let periods = ((pos + self.shift) as f32 / self.period as f32).floor();
        1.0 + self.beta as f32 * (1.0 + periods).ln()
    }
}

/// Values of each head RoPE rotates: `int(head_dim * partial_rotary_factor)` as transformers
/// computes it (GLM-4.5's default factor is 0.5), or latent attention's decoupled dimensions;
/// LongRoPE's factor lists must cover its pairs.
pub(super) fn rotary_dim(
    j: &Value,
    arch: Architecture,
    head_dim: usize,
    mla: Option<&MlaConfig>,
    rope: &RopeParams,
) -> Result<usize, String> {
    // transformers 5 may keep the factor in `rope_parameters`.
    let rope_params = j.get("rope_parameters").filter(|v| v.is_object());
    let partial = match (Keys(j).f64("partial_rotary_factor")?, rope_params) {
        (Some(p), _) => Some(p),
        (None, Some(p)) => Keys(p).f64("partial_rotary_factor")?,
        (None, None) => None,
    };
    // MiniMax-M2's published configs say `rotary_dim` (transformers derives the factor).
    let stated_dim = match arch {
        Architecture::MiniMaxM2 => Keys(j).usize("rotary_dim")?,
        _ => None,
    };
    let partial = partial
        .or(stated_dim.map(|d| d as f64 / head_dim as f64))
        .unwrap_or(match arch {
            // transformers' BambaConfig fixes 0.5.
            Architecture::Glm4Moe | Architecture::Bamba => 0.5,
            // transformers' Qwen3.5 and Qwen3-Next configs set 0.25 where the config has none.
            Architecture::Qwen3_5 | Architecture::Qwen3_5Moe | Architecture::Qwen3Next => 0.25,
            _ => 1.0,
        });
    let rotary_dim = match mla {
        Some(m) => m.rope_dim,
        None => (head_dim as f64 * partial) as usize,
    };
    if !(partial > 0.0 && partial <= 1.0) || rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
        return Err(format!(
            "unsupported partial_rotary_factor {partial} (head_dim {head_dim} gives rotary dim {rotary_dim})"
        ));
    }
    if let Some(RopeScaling::Longrope {
        short_factor,
        long_factor,
        ..
    }) = &rope.scaling
        && (short_factor.len() != rotary_dim / 2 || long_factor.len() != rotary_dim / 2)
    {
        return Err(format!(
            "rope_scaling short_factor/long_factor have {}/{} entries; the rotary dim {rotary_dim} needs {}",
            short_factor.len(),
            long_factor.len(),
            rotary_dim / 2
        ));
    }
    Ok(rotary_dim)
}
