//! Scalar multipliers of muP-trained families: Falcon-H1's on the embeddings, the logits, each
//! branch's input and output, the MLP's gate and down projection, and one per part of the
//! Mamba-2 `in_proj`'s output (transformers' `compute_mup_vector`); Granite's on the
//! embeddings, the logits and every residual update.

use serde_json::Value;

use super::{Keys, MambaConfig};

#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Multipliers {
    /// `embedding_multiplier`: on the token embeddings.
    pub embedding: f32,
    /// `lm_head_multiplier`: on the logits.
    pub lm_head: f32,
    /// `attention_in_multiplier` / `ssm_in_multiplier`: on the normed input of the attention
    /// and of the Mamba-2 mixer.
    pub attention_in: f32,
    pub ssm_in: f32,
    /// `attention_out_multiplier` / `ssm_out_multiplier`: on each branch's output.
    pub attention_out: f32,
    pub ssm_out: f32,
    /// `mlp_multipliers`: on the gate projection's output (before the activation) and on the
    /// down projection's.
    pub mlp_gate: f32,
    pub mlp_down: f32,
    /// `ssm_multipliers`: on `in_proj`'s z, x, B, C and dt.
    pub ssm_parts: [f32; 5],
}

impl Multipliers {
    /// `FalconH1Config`'s keys, each 1 where absent (`key_multiplier` goes into the attention's
    /// scale: `attention::attn_scale`).
    pub(super) fn falcon_h1(j: &Value) -> Result<Self, String> {
        let keys = Keys(j);
        let one = |k: &str| -> Result<f32, String> {
            match keys.f64(k)?.unwrap_or(1.0) {
                v if v.is_finite() => Ok(v as f32),
                v => Err(format!("`{k}` is {v}; it must be finite")),
            }
        };
        let list = |k: &str, n: usize| -> Result<Vec<f32>, String> {
            let v = match j.get(k) {
                None | Some(Value::Null) => return Ok(vec![1.0; n]),
                Some(v) => v,
            };
            v.as_array()
                .filter(|a| a.len() == n)
                .and_then(|a| {
                    a.iter()
                        .map(|x| x.as_f64().filter(|x| x.is_finite()).map(|x| x as f32))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| format!("`{k}` is {v}, not a list of {n} numbers"))
        };
        let mlp = list("mlp_multipliers", 2)?;
        let ssm = list("ssm_multipliers", 5)?;
        Ok(Self {
            embedding: one("embedding_multiplier")?,
            lm_head: one("lm_head_multiplier")?,
            attention_in: one("attention_in_multiplier")?,
            ssm_in: one("ssm_in_multiplier")?,
            attention_out: one("attention_out_multiplier")?,
            ssm_out: one("ssm_out_multiplier")?,
            mlp_gate: mlp[0],
            mlp_down: mlp[1],
            ssm_parts: [ssm[0], ssm[1], ssm[2], ssm[3], ssm[4]],
        })
    }

    /// `GraniteMoeHybridConfig`'s keys: `embedding_multiplier`, `logits_scaling` (the logits
    /// divided by it), `residual_multiplier` on every mixer's and MLP's output
    /// (`attention_multiplier` is the softmax scale: `attention::attn_scale`).
    pub(super) fn granite(j: &Value) -> Result<Self, String> {
        let keys = Keys(j);
        let positive = |k: &str| -> Result<f32, String> {
            match keys.f64(k)?.unwrap_or(1.0) {
                v if v.is_finite() && v > 0.0 => Ok(v as f32),
                v => Err(format!("`{k}` is {v}; it must be positive")),
            }
        };
        let residual = positive("residual_multiplier")?;
        Ok(Self {
            embedding: positive("embedding_multiplier")?,
            lm_head: 1.0 / positive("logits_scaling")?,
            attention_in: 1.0,
            ssm_in: 1.0,
            attention_out: residual,
            ssm_out: residual,
            mlp_gate: 1.0,
            mlp_down: residual,
            ssm_parts: [1.0; 5],
        })
    }

    /// One factor per output of `in_proj` (`mup_vector`): z and x each `inner` wide, B and C
    /// each `groups * state`, dt one per head.
    pub fn in_proj_scales(&self, m: &MambaConfig) -> Vec<f32> {
        let bc = m.groups * m.state;
        let widths = [m.inner(), m.inner(), bc, bc, m.heads];
        widths
            .iter()
            .zip(self.ssm_parts)
            .flat_map(|(&w, s)| std::iter::repeat_n(s, w))
            .collect()
    }
}
