//! What each way of splitting f32 products onto 16-bit tensor cores (`GemmSplit`, a backend's
//! fact) keeps of an operand: the bit-level emulation `check`'s linear cases expect of a
//! product with an exact 1 (an identity), kept here, beside the checks, not in the backends.

use crate::backend::GemmSplit;
use crate::numerics::FloatType;

/// What `split` keeps of an activation `v` in a row whose largest magnitude is `top`.
pub fn kept_activation(split: GemmSplit, v: f32, top: f32) -> f32 {
    let exponent = |target: i32| {
        if top > 0.0 && top.is_finite() {
            (target - top.log2().floor() as i32).clamp(-126, 127)
        } else {
            0
        }
    };
    match split {
        GemmSplit::Bf16 => bf16_parts(v),
        GemmSplit::F16Cut => f16_cut_parts(v, 2f32.powi(exponent(0))),
        GemmSplit::F16Rows { .. } => f16_row_parts(v, 2f32.powi(exponent(14))),
    }
}

/// What `split` keeps of a weight `v` of a layer whose `f16_split_scale` is `scale`, in a row
/// (an output's weights) whose largest magnitude is `row_top`.
pub fn kept_weight(split: GemmSplit, v: f32, scale: f32, row_top: f32) -> f32 {
    match split {
        GemmSplit::Bf16 => bf16_parts(v),
        GemmSplit::F16Cut => f16_cut_parts(v, scale),
        GemmSplit::F16Rows {
            weight_planes: false,
        } => v,
        GemmSplit::F16Rows {
            weight_planes: true,
        } => kept_activation(split, v, row_top),
    }
}

fn bf16_parts(v: f32) -> f32 {
    let hi = FloatType::Bf16.round(v);
    hi + FloatType::Bf16.round(v - hi)
}

/// `split_rows_f16.cu`'s two parts of `v` in a row scaled by `scale`, rounded to nearest.
fn f16_row_parts(v: f32, scale: f32) -> f32 {
    let hi = FloatType::F16.round(v * scale);
    (hi + FloatType::F16.round(v * scale - hi)) / scale
}

fn f16_cut_parts(v: f32, scale: f32) -> f32 {
    let scaled = v * scale;
    let hi = f32::from_bits(scaled.to_bits() & 0xffff_e000);
    (FloatType::F16.round(hi) + FloatType::F16.round(scaled - hi)) / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CUDA's f16 split of an activation row keeps 22 bits of every value down to 2^-17 of the
    /// row's largest (where the residual turns subnormal); bf16's two parts keep 16. A weight
    /// is kept whole (bf16-valued) or split the same way by its own row.
    #[test]
    fn f16_rows_keep_22_bits_down_to_2_to_the_minus_17_of_the_row() {
        let rows = GemmSplit::F16Rows {
            weight_planes: false,
        };
        let top = -1234.567f32;
        let (mut f16_worst, mut bf16_worst) = (0f32, 0f32);
        for k in 0..1650 {
            let v = top * 0.993f32.powi(k) * if k % 2 == 0 { 1.0 } else { -1.0 };
            let kept = kept_activation(rows, v, top.abs());
            assert!((kept - v).abs() <= v.abs() * 2f32.powi(-21), "{v}: {kept}");
            let bf16 = kept_activation(GemmSplit::Bf16, v, top.abs());
            f16_worst = f16_worst.max(((kept - v) / v).abs());
            bf16_worst = bf16_worst.max(((bf16 - v) / v).abs());
        }
        assert!(bf16_worst > 16.0 * f16_worst, "{bf16_worst} vs {f16_worst}");
        assert_eq!(kept_activation(rows, 0.0, 0.0), 0.0);
        assert!(kept_activation(rows, f32::NAN, f32::NAN).is_nan());
        assert_eq!(kept_weight(rows, 0.3, 8.0, 0.5), 0.3);
        let planes = GemmSplit::F16Rows {
            weight_planes: true,
        };
        // w has a bit past the 22nd; at 2^-30 of its row's largest it is past 2^-17, where
        // both parts are subnormal.
        let w = 1.0 + 2f32.powi(-12) + 2f32.powi(-23);
        for (row_top, bits) in [(1.0, -21), (w * 2f32.powi(30), -4)] {
            let kept = kept_weight(planes, w, 8.0, row_top);
            assert_ne!(kept, w);
            assert!(
                (kept - w).abs() <= w * 2f32.powi(bits),
                "{w} of {row_top}: {kept}"
            );
        }
    }
}
