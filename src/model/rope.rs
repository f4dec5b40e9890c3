//! RoPE frequency tables computed the way transformers computes them in float32, so that
//! every backend rotates by the same angles (the rope_init functions of
//! `modeling_rope_utils`: default, linear, llama3, yarn, longrope).

use crate::checkpoint::config::QueryScale;
use crate::checkpoint::{RopeParams, RopeScaling};

/// `base ** (2i / d)` for each of the `d / 2` frequencies, in f32 as torch computes it.
fn powers(theta: f64, d: usize) -> Vec<f32> {
    (0..d / 2)
        .map(|i| {
            let expo = (2 * i) as f32 / d as f32;
            theta.powf(expo as f64) as f32
        })
        .collect()
}

/// Inverse frequencies `[rotary_dim / 2]` in f32, with the scaling applied; `long` picks
/// LongRoPE's long factors.
pub fn inv_freq(rope: &RopeParams, rotary_dim: usize, long: bool) -> Vec<f32> {
    let d = rotary_dim;
    let pos = powers(rope.theta, d);
    let plain = || pos.iter().map(|&p| 1.0 / p).collect::<Vec<f32>>();
    match &rope.scaling {
        None => plain(),
        Some(RopeScaling::Linear { factor }) => {
            plain().into_iter().map(|v| v / *factor as f32).collect()
        }
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old_ctx,
        }) => {
            let (factor, low, high, old_ctx) = (
                *factor as f32,
                *low_freq_factor as f32,
                *high_freq_factor as f32,
                *old_ctx as f32,
            );
            let low_freq_wavelen = old_ctx / low;
            let high_freq_wavelen = old_ctx / high;
            plain()
                .into_iter()
                .map(|v| {
                    let wavelen = 2.0 * std::f32::consts::PI / v;
                    let scaled = if wavelen > low_freq_wavelen {
                        v / factor
                    } else {
                        v
                    };
                    let medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                    if medium {
                        let smooth = (old_ctx / wavelen - low) / (high - low);
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    } else {
                        scaled
                    }
                })
                .collect()
        }
        Some(RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: original,
            beta_fast,
            beta_slow,
            truncate,
            ..
        }) => {
            // find_correction_range in f64 (Python floats), the ramp in f32.
            let dim = d as f64;
            let correction = |rotations: f64| {
                dim * (original / (rotations * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * rope.theta.ln())
            };
            let (mut low, mut high) = (correction(*beta_fast), correction(*beta_slow));
            if *truncate {
                low = low.floor();
                high = high.ceil();
            }
            let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
            if low == high {
                high += 0.001;
            }
            let factor = *factor as f32;
            pos.iter()
                .enumerate()
                .map(|(i, &p)| {
                    let ramp = ((i as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
                    let extrapolation = 1.0 - ramp;
                    let interpolated = 1.0 / (factor * p);
                    interpolated * (1.0 - extrapolation) + (1.0 / p) * extrapolation
                })
                .collect()
        }
        Some(RopeScaling::Longrope {
            short_factor,
            long_factor,
            ..
        }) => {
            let ext = if long { long_factor } else { short_factor };
            pos.iter()
                .zip(ext)
                .map(|(&p, &e)| 1.0 / (e as f32 * p))
                .collect()
        }
        Some(RopeScaling::Proportional { fraction, factor }) => {
            // `int(fraction * head_dim // 2)` in Python floats.
            let rotated = (fraction * d as f64 / 2.0).floor() as usize;
            let factor = *factor as f32;
            plain()
                .into_iter()
                .enumerate()
                .map(|(i, v)| if i < rotated { v / factor } else { 0.0 })
                .collect()
        }
    }
}

/// The factor transformers multiplies cos and sin by (YaRN's and LongRoPE's attention factor).
fn attention_factor(rope: &RopeParams) -> f32 {
    match &rope.scaling {
        Some(
            RopeScaling::Yarn {
                attention_factor, ..
            }
            | RopeScaling::Longrope {
                attention_factor, ..
            },
        ) => *attention_factor as f32,
        _ => 1.0,
    }
}

/// The length from which a sequence takes LongRoPE's long factors (`None`: one table).
pub fn long_from(rope: &RopeParams) -> Option<usize> {
    match &rope.scaling {
        Some(RopeScaling::Longrope {
            original_max_position_embeddings,
            ..
        }) => Some(original_max_position_embeddings + 1),
        _ => None,
    }
}

/// `cos` and `sin` tables `[positions, rotary_dim / 2]`: angle = f32(pos) * inv_freq in f32,
/// times the attention factor. LongRoPE has a second block of `positions` rows after the
/// first, of the long factors (a sequence of `long_from` or more tokens reads it).
pub fn tables(rope: &RopeParams, rotary_dim: usize, positions: usize) -> (Vec<f32>, Vec<f32>) {
    frequency_tables(rope, rotary_dim, positions, None, 1)
}

/// `tables` whose row `i` is position `i * stride`: DeepSeek-V4's compressed entries, entry
/// `i` of a sequence rotated at the first position of its window of `stride` tokens.
pub fn strided_tables(
    rope: &RopeParams,
    rotary_dim: usize,
    positions: usize,
    stride: usize,
) -> (Vec<f32>, Vec<f32>) {
    frequency_tables(rope, rotary_dim, positions, None, stride)
}

/// `tables` of Mistral Large 4's LeRoPE: each frequency times `exp(alpha)` (in f32, as
/// `MistralLarge4TextRotaryEmbedding`), `alpha` one learned value a pair.
pub fn learned_tables(rope: &RopeParams, alpha: &[f32], positions: usize) -> (Vec<f32>, Vec<f32>) {
    frequency_tables(rope, 2 * alpha.len(), positions, Some(alpha), 1)
}

fn frequency_tables(
    rope: &RopeParams,
    rotary_dim: usize,
    positions: usize,
    alpha: Option<&[f32]>,
    stride: usize,
) -> (Vec<f32>, Vec<f32>) {
    let scale = attention_factor(rope);
    let sets: &[bool] = if long_from(rope).is_some() {
        &[false, true]
    } else {
        &[false]
    };
    let mut cos = Vec::with_capacity(sets.len() * positions * rotary_dim / 2);
    let mut sin = Vec::with_capacity(cos.capacity());
    for &long in sets {
        let mut inv = inv_freq(rope, rotary_dim, long);
        if let Some(alpha) = alpha {
            inv.iter_mut().zip(alpha).for_each(|(f, a)| *f *= a.exp());
        }
        for p in 0..positions {
            for &f in &inv {
                let angle = (p * stride) as f32 * f;
                cos.push(((angle as f64).cos() as f32) * scale);
                sin.push(((angle as f64).sin() as f32) * scale);
            }
        }
    }
    (cos, sin)
}

/// `tables` for the queries of a model that scales them by position after RoPE: each
/// position's row times `scale.at(pos)`, so that one rotation does both.
pub fn query_tables(
    (mut cos, mut sin): (Vec<f32>, Vec<f32>),
    rotary_dim: usize,
    positions: usize,
    scale: QueryScale,
) -> (Vec<f32>, Vec<f32>) {
    let pairs = rotary_dim / 2;
    for (row, (c, s)) in cos
        .chunks_exact_mut(pairs)
        .zip(sin.chunks_exact_mut(pairs))
        .enumerate()
    {
        let factor = scale.at(row % positions);
        c.iter_mut().chain(s.iter_mut()).for_each(|v| *v *= factor);
    }
    (cos, sin)
}

/// Tables `[rows, pairs]` of a rotation by angle 0 scaled by `scale.at(pos)` (cos the factor,
/// sin 0): the values of a query head that RoPE leaves (latent attention's unrotated part,
/// partial rotary's tail) scaled by position through the same op. Rows past `positions`
/// repeat them (LongRoPE's second block).
pub fn scale_tables(
    rows: usize,
    pairs: usize,
    positions: usize,
    scale: QueryScale,
) -> (Vec<f32>, Vec<f32>) {
    let cos = (0..rows)
        .flat_map(|row| std::iter::repeat_n(scale.at(row % positions), pairs))
        .collect();
    (cos, vec![0.0; rows * pairs])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 4's proportional RoPE: `int(fraction * head_dim // 2)` frequencies
    /// `theta^(-2i / head_dim)` over the whole head, the rest 0, all over `factor`.
    #[test]
    fn proportional_rope_rotates_the_first_pairs_at_the_whole_heads_frequencies() {
        let rope = RopeParams {
            theta: 1_000_000.0,
            scaling: Some(RopeScaling::Proportional {
                fraction: 0.25,
                factor: 2.0,
            }),
        };
        let inv = inv_freq(&rope, 64, false);
        assert_eq!(inv.len(), 32);
        for (i, &f) in inv.iter().enumerate() {
            let want = match i < 8 {
                true => (1.0 / 1_000_000f64.powf(2.0 * i as f64 / 64.0)) / 2.0,
                false => 0.0,
            };
            assert!((f as f64 - want).abs() <= 1e-6 * want, "{i}: {f} vs {want}");
        }
    }
}
