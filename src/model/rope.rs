//! RoPE frequency tables computed the way transformers computes them in float32, so that
//! every backend rotates by the same angles (LlamaRotaryEmbedding and its llama3/linear
//! rope_init functions).

use crate::checkpoint::{ModelConfig, RopeScaling};

/// Inverse frequencies `[rotary_dim / 2]` in f32, with the config's scaling applied.
pub fn inv_freq(cfg: &ModelConfig) -> Vec<f32> {
    let d = cfg.rotary_dim;
    let base = cfg.rope_theta;
    let mut inv: Vec<f32> = (0..d / 2)
        .map(|i| {
            // torch: 1.0 / (base ** (arange(0, d, 2).float() / d)), all in f32.
            let expo = (2 * i) as f32 / d as f32;
            let p = base.powf(expo as f64) as f32;
            1.0 / p
        })
        .collect();
    match cfg.rope_scaling {
        None => {}
        Some(RopeScaling::Linear { factor }) => {
            for v in inv.iter_mut() {
                *v /= factor as f32;
            }
        }
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old_ctx,
        }) => {
            let (factor, low, high, old_ctx) = (
                factor as f32,
                low_freq_factor as f32,
                high_freq_factor as f32,
                old_ctx as f32,
            );
            let low_freq_wavelen = old_ctx / low;
            let high_freq_wavelen = old_ctx / high;
            for v in inv.iter_mut() {
                let wavelen = 2.0 * std::f32::consts::PI / *v;
                let scaled = if wavelen > low_freq_wavelen {
                    *v / factor
                } else {
                    *v
                };
                let medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                *v = if medium {
                    let smooth = (old_ctx / wavelen - low) / (high - low);
                    (1.0 - smooth) * scaled / factor + smooth * scaled
                } else {
                    scaled
                };
            }
        }
    }
    inv
}

/// `cos` and `sin` tables `[positions, rotary_dim / 2]`: angle = f32(pos) * inv_freq in f32.
pub fn tables(cfg: &ModelConfig, positions: usize) -> (Vec<f32>, Vec<f32>) {
    let inv = inv_freq(cfg);
    let mut cos = Vec::with_capacity(positions * inv.len());
    let mut sin = Vec::with_capacity(positions * inv.len());
    for p in 0..positions {
        for &f in &inv {
            let angle = p as f32 * f;
            cos.push((angle as f64).cos() as f32);
            sin.push((angle as f64).sin() as f32);
        }
    }
    (cos, sin)
}
