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
        GemmSplit::F16Planes { high_only } => f16_plane_parts(v, 2f32.powi(exponent(0)), high_only),
        GemmSplit::F16Rows { .. } => f16_row_parts(v, 2f32.powi(exponent(14))),
    }
}

/// What `split` keeps of a weight `v` of a layer whose `f16_split_scale` is `scale`, in a row
/// (an output's weights) whose largest magnitude is `row_top`.
pub fn kept_weight(split: GemmSplit, v: f32, scale: f32, row_top: f32) -> f32 {
    match split {
        GemmSplit::Bf16 => bf16_parts(v),
        GemmSplit::F16Planes { high_only } => f16_plane_parts(v, scale, high_only),
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

/// lib/planes.wgsl's parts of `v` scaled by `scale`: the high part rounded to 10 mantissa bits
/// in f32 by integer arithmetic (its `f16_high`), then each part stored as f16.
fn f16_plane_parts(v: f32, scale: f32, high_only: bool) -> f32 {
    let scaled = v * scale;
    let bits = scaled.to_bits();
    let hi = f32::from_bits((bits + 0xfff + ((bits >> 13) & 1)) & 0xffff_e000);
    let lo = match high_only {
        true => 0.0,
        false => FloatType::F16.round(scaled - hi),
    };
    (FloatType::F16.round(hi) + lo) / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    /// wgpu's planes round the high part to nearest with ties to even (the one-product mode
    /// multiplies it alone: within 2^-11 of each operand, unbiased), and with the residual keep
    /// 22 bits; ties go to the even f16 mantissa.
    #[test]
    fn f16_planes_round_the_high_part_to_nearest() {
        let (one, both) = (
            GemmSplit::F16Planes { high_only: true },
            GemmSplit::F16Planes { high_only: false },
        );
        let mut bias = 0f64;
        for k in 0..2000 {
            let v =
                (1.0 + k as f32 / 2000.0 + 1e-7 * k as f32) * if k % 2 == 0 { 1.0 } else { -1.0 };
            let high = kept_activation(one, v, 1.99);
            assert!((high - v).abs() <= v.abs() * 2f32.powi(-11), "{v}: {high}");
            assert_eq!(high, FloatType::F16.round(v), "{v}");
            let kept = kept_activation(both, v, 1.99);
            assert!((kept - v).abs() <= v.abs() * 2f32.powi(-21), "{v}: {kept}");
            bias += f64::from((high - v) / v);
        }
        assert!(bias.abs() / 2000.0 < 2f64.powi(-16), "{bias}");
        // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: to the even mantissa, 1; 1 + 3 x
        // 2^-11 halfway between 1 + 2^-10 and 1 + 2^-9: to 1 + 2^-9.
        let half = 2f32.powi(-11);
        assert_eq!(kept_activation(one, 1.0 + half, 1.0), 1.0);
        assert_eq!(
            kept_activation(one, 1.0 + 3.0 * half, 1.0),
            1.0 + 4.0 * half
        );
        // A weight scaled by its layer's power of two is rounded the same way.
        assert_eq!(
            kept_weight(one, 0.1, 2f32.powi(13), 1.0),
            FloatType::F16.round(0.1 * 8192.0) / 8192.0
        );
    }

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
