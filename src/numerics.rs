//! Scalar number formats and rounding rules shared by every backend and by the checks:
//! FP8 E4M3FN, FP4 E2M1, BF16/F16 round-to-nearest-even, and the activation fake-quantization
//! that compressed-tensors applies (docs/formats.md §1.4, §1.5).

/// The dtype a value is rounded to (round to nearest, ties to even).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FloatType {
    F32,
    F16,
    Bf16,
}

/// The dtype as transformers names it (`bfloat16`), for human output.
impl std::fmt::Display for FloatType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FloatType::F32 => "float32",
            FloatType::F16 => "float16",
            FloatType::Bf16 => "bfloat16",
        })
    }
}

impl FloatType {
    pub fn round(self, v: f32) -> f32 {
        match self {
            FloatType::F32 => v,
            FloatType::F16 => half::f16::from_f32(v).to_f32(),
            FloatType::Bf16 => half::bf16::from_f32(v).to_f32(),
        }
    }

    /// torch.finfo(dtype).eps: what compressed-tensors substitutes for a zero scale.
    pub fn eps(self) -> f32 {
        match self {
            FloatType::F32 => f32::EPSILON,
            FloatType::F16 => 2f32.powi(-10),
            FloatType::Bf16 => 2f32.powi(-7),
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            FloatType::F32 => 4,
            FloatType::F16 | FloatType::Bf16 => 2,
        }
    }

    /// Little-endian values of this type, widened to f32 (exact).
    pub fn widen(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            FloatType::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            FloatType::Bf16 => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            FloatType::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        }
    }

    pub fn from_safetensors(d: safetensors::Dtype) -> Option<Self> {
        match d {
            safetensors::Dtype::F32 => Some(FloatType::F32),
            safetensors::Dtype::F16 => Some(FloatType::F16),
            safetensors::Dtype::BF16 => Some(FloatType::Bf16),
            _ => None,
        }
    }
}

/// OCP E8M0 (MX scales): `2^(e - 127)`; 0 is 2^-127 (an f32 subnormal), 255 infinite as
/// compressed-tensors' bf16 power makes it (OCP calls it NaN; no quantizer writes it).
pub fn e8m0_to_f32(e: u8) -> f32 {
    match e {
        0 => f32::from_bits(0x0040_0000),
        255 => f32::INFINITY,
        e => f32::from_bits(u32::from(e) << 23),
    }
}

/// FP8 E4M3FN: no infinities, 0x7F/0xFF are NaN, max 448.
pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0xF) as i32;
    let m = (b & 7) as f32;
    if e == 15 && (b & 7) == 7 {
        return f32::NAN;
    }
    let mag = if e == 0 {
        m * 2f32.powi(-9)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    sign * mag
}

/// Round an f32 to the nearest FP8 E4M3FN value (ties to even), as torch's cast does for
/// inputs already clamped to ±448. Returned widened to f32.
pub fn round_fp8_e4m3(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = (x.abs() as f64).min(448.0);
    let q = if a < 2f64.powi(-6) {
        // Subnormal range: a fixed step of 2^-9.
        (a / 2f64.powi(-9)).round_ties_even() * 2f64.powi(-9)
    } else {
        let e = a.log2().floor() as i32;
        // log2 of values just below a power of two can round up; fix the exponent exactly.
        let e = if 2f64.powi(e) > a { e - 1 } else { e };
        let step = 2f64.powi(e - 3);
        (a / step).round_ties_even() * step
    };
    (q.min(448.0) as f32).copysign(x)
}

/// FP4 E2M1 magnitudes by code & 7; bit 3 is the sign.
pub const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

pub fn e2m1_to_f32(code: u8) -> f32 {
    let v = E2M1[(code & 7) as usize];
    if code & 8 != 0 { -v } else { v }
}

/// compressed-tensors' round to the E2M1 grid (round half to even), input already clamped.
pub fn round_e2m1(y: f32) -> f32 {
    let a = y.abs();
    let q: f32 = if a <= 0.25 {
        0.0
    } else if a < 0.75 {
        0.5
    } else if a <= 1.25 {
        1.0
    } else if a < 1.75 {
        1.5
    } else if a <= 2.5 {
        2.0
    } else if a < 3.5 {
        3.0
    } else if a <= 5.0 {
        4.0
    } else {
        6.0
    };
    q.copysign(y)
}

/// Input-activation fake quantization declared by a checkpoint, applied per linear input.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub enum ActQuant {
    /// FP8 E4M3, one scale per token (row) = amax/448, computed at run time.
    Fp8PerToken,
    /// FP8 E4M3 with a static per-tensor scale from the checkpoint.
    Fp8Static { scale: f32 },
    /// INT of `bits` (2..=8), one scale per token = amax / ((2^bits - 1) / 2), half
    /// compressed-tensors' bit range (127.5 for INT8, the `W8A8` preset; 7.5 for INT4, `W4A4`).
    IntPerToken { bits: u32 },
    /// NVFP4: groups of 16 along the row, local FP8 scales, static global scale (a divisor).
    Nvfp4 { global_scale: f32 },
    /// FP8 E4M3 per token and group of `group` inputs, scale `amax / 448` in f32 (native FP8
    /// checkpoints' `activation_scheme: dynamic`, DeepSeek-V3's and transformers' `act_quant`:
    /// `y = fp8(x / s)`, used as `y * s`). An all-zero group stays zero.
    Fp8PerTokenGroup { group: u32 },
    /// FP8 E4M3 per token and group of `group` inputs as compressed-tensors computes it (its
    /// `FP8_BLOCK` preset, groups of 128): `Fp8PerToken` on each group, the scale rounded to
    /// the activation dtype and a zero scale replaced by its epsilon.
    Fp8Group { group: u32 },
    /// FP8 E4M3 per token and group of `group` inputs under a power-of-two scale, as DeepGEMM's
    /// `per_token_cast_to_fp8(use_ue8m0=True)` makes the activations of DeepSeek-V4's FP4
    /// experts (transformers' `expert_dtype: fp4`, groups of 32): amax clamped below at 1e-4,
    /// `amax / 448` rounded up to a power of two ([`pow2_at_least`]), `y = fp8(x / s)` used as
    /// `y * s`.
    Fp8Pow2Group { group: u32 },
    /// compressed-tensors' MX activations (`MXFP4` W4A4 with `bits` 4, `MXFP8` W8A8 with 8):
    /// per group of 32, a power-of-two scale from the group's amax ([`mx_scale_exponent`]),
    /// values rounded to E2M1 or E4M3.
    Mx { bits: u32 },
}

/// compressed-tensors' MX scale of a group with largest magnitude `amax`
/// (`generate_mx_scales`): `amax` rounded to a power of two by its bit pattern (up when the
/// two leading mantissa bits are set, i.e. from 1.75 times its power of two), its log2 less the
/// element format's `floor(log2(max))` (2 for E2M1, 8 for E4M3), biased by 127 and clamped to
/// the E8M0 range; returned unbiased, the scale being `2^e`. The bit trick is the same on
/// bf16 and f32 values (it adds below the bf16 mantissa's 6th bit either way).
pub fn mx_scale_exponent(amax: f32, bits: u32) -> i32 {
    let offset = if bits == 4 { 2 } else { 8 };
    let rounded = amax.to_bits().wrapping_add(1 << 21) & 0x7f80_0000;
    // log2(0) = -inf clamps to the smallest code.
    let code = if rounded == 0 {
        0
    } else {
        ((rounded >> 23) as i32 - offset).clamp(0, 255)
    };
    code - 127
}

/// The smallest power of two at least `x` (a positive normal f32): DeepGEMM's
/// `ceil_to_ue8m0`, `2^ceil(log2(x))`, by the bits rather than through f32's log2, which
/// rounds to the lower integer for an `x` within a few ulps above a power of two.
pub fn pow2_at_least(x: f32) -> f32 {
    let bits = x.to_bits();
    let power = bits & 0x7f80_0000;
    f32::from_bits(if bits & 0x007f_ffff == 0 {
        power
    } else {
        power + (1 << 23)
    })
}

/// The signed range of a `bits`-wide integer: (-2^(bits-1), 2^(bits-1) - 1).
pub fn int_range(bits: u32) -> (f32, f32) {
    let half = (1u32 << (bits - 1)) as f32;
    (-half, half - 1.0)
}

/// `x * 2^e`, exact wherever the result is representable (subnormal results included).
pub fn times_pow2(x: f32, e: i32) -> f32 {
    // Two steps keep each factor a normal f32 for every e of an E8M0 scale (-127..=128).
    let half = e / 2;
    let factor = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    x * factor(half) * factor(e - half)
}

impl ActQuant {
    /// The GPU kernels' mode code and parameter (act_quant.cu, act_quant.wgsl).
    pub fn kernel_code(&self) -> (u32, f32) {
        match *self {
            ActQuant::Fp8PerToken => (0, 0.0),
            ActQuant::Fp8Static { scale } => (1, scale),
            ActQuant::IntPerToken { bits } => (2, bits as f32),
            ActQuant::Nvfp4 { global_scale } => (3, global_scale),
            ActQuant::Fp8PerTokenGroup { group } => (4, group as f32),
            ActQuant::Fp8Group { group } => (5, group as f32),
            ActQuant::Mx { bits } => (6, bits as f32),
            ActQuant::Fp8Pow2Group { group } => (7, group as f32),
        }
    }

    /// Fake-quantizes one activation row in place as compressed-tensors' `fake_quantize` does
    /// it op by op (formats.md §1.4/§1.5) in a model of dtype `dt` (shown bit for bit in f32
    /// and bf16 by tests/suite/dequant.rs). The backends quantize as the f32 reference does (`dt`
    /// f32), also with bf16 activations, whose quantizer rounds only its result: rounding
    /// scales and quotients to bf16 moves values by whole steps away from the f32 reference.
    pub fn apply_row(&self, row: &mut [f32], dt: FloatType) {
        match *self {
            ActQuant::Fp8PerToken => {
                let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                fp8_row(row, dt.round(amax / 448.0), dt);
            }
            ActQuant::Fp8Static { scale } => fp8_row(row, dt.round(scale), dt),
            ActQuant::IntPerToken { bits } => {
                let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                let (lo, hi) = int_range(bits);
                let mut s = dt.round(amax / ((hi - lo) / 2.0));
                if s == 0.0 {
                    s = dt.eps();
                }
                for v in row.iter_mut() {
                    let y = dt.round(*v / s).clamp(lo, hi);
                    let q = (y as f64).round_ties_even() as f32;
                    *v = dt.round(q * s);
                }
            }
            ActQuant::Fp8PerTokenGroup { group } => {
                for g in row.chunks_mut(group as usize) {
                    let amax = g.iter().fold(0f32, |m, v| m.max(v.abs()));
                    if amax == 0.0 {
                        continue;
                    }
                    let s = amax / 448.0;
                    for v in g.iter_mut() {
                        *v = dt.round(round_fp8_e4m3((*v / s).clamp(-448.0, 448.0)) * s);
                    }
                }
            }
            ActQuant::Fp8Group { group } => {
                for g in row.chunks_mut(group as usize) {
                    let amax = g.iter().fold(0f32, |m, v| m.max(v.abs()));
                    fp8_row(g, dt.round(amax / 448.0), dt);
                }
            }
            ActQuant::Fp8Pow2Group { group } => {
                for g in row.chunks_mut(group as usize) {
                    let amax = g.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let s = pow2_at_least(amax.max(1e-4) / 448.0);
                    for v in g.iter_mut() {
                        *v = dt.round(round_fp8_e4m3((*v / s).clamp(-448.0, 448.0)) * s);
                    }
                }
            }
            ActQuant::Mx { bits } => {
                let top = if bits == 4 { 6.0 } else { 448.0 };
                for g in row.chunks_mut(32) {
                    let amax = g.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let e = mx_scale_exponent(amax, bits);
                    for v in g.iter_mut() {
                        let y = times_pow2(*v, -e).clamp(-top, top);
                        let q = if bits == 4 {
                            round_e2m1(y)
                        } else {
                            round_fp8_e4m3(y)
                        };
                        *v = dt.round(times_pow2(q, e));
                    }
                }
            }
            ActQuant::Nvfp4 { global_scale } => {
                for group in row.chunks_mut(16) {
                    let amax = group.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let s = dt.round(amax / 6.0);
                    let s = global_scale * s;
                    let mut s = round_fp8_e4m3(s.clamp(-448.0, 448.0));
                    if s == 0.0 {
                        s = 0.125;
                    }
                    let s_eff = s / global_scale;
                    for v in group.iter_mut() {
                        let y = (*v / s_eff).clamp(-6.0, 6.0);
                        *v = dt.round(round_e2m1(y) * s_eff);
                    }
                }
            }
        }
    }
}

fn fp8_row(row: &mut [f32], scale: f32, dt: FloatType) {
    let s = if scale == 0.0 { dt.eps() } else { scale };
    for v in row.iter_mut() {
        let y = dt.round(*v / s).clamp(-448.0, 448.0);
        *v = dt.round(round_fp8_e4m3(y) * s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_decode_matches_the_e4m3fn_table() {
        // Every code decodes to the formula of formats.md §1.4, and re-encodes to itself.
        for b in 0u8..=255 {
            let v = fp8_e4m3_to_f32(b);
            if b & 0x7f == 0x7f {
                assert!(v.is_nan());
                continue;
            }
            let e = ((b >> 3) & 15) as i32;
            let m = (b & 7) as f64;
            let mag = if e == 0 {
                m / 512.0
            } else {
                (1.0 + m / 8.0) * 2f64.powi(e - 7)
            };
            let want = if b & 0x80 != 0 { -mag } else { mag };
            assert_eq!(v as f64, want, "code {b:#x}");
            assert_eq!(round_fp8_e4m3(v).to_bits(), v.to_bits(), "code {b:#x}");
        }
        assert_eq!(fp8_e4m3_to_f32(0x7e), 448.0);
    }

    #[test]
    fn mx_scale_exponents_follow_compressed_tensors_formula() {
        // generate_mx_scales: 127 + floor(log2(round_to_power_2(amax))) - offset, clamped to
        // 0..=255 as uint8; round_to_power_2 rounds up from 1.75 times the power of two.
        let reference = |amax: f64, offset: i32| -> i32 {
            if amax == 0.0 {
                return -127;
            }
            let mut e = amax.log2().floor() as i32;
            if amax / 2f64.powi(e) >= 1.75 {
                e += 1;
            }
            (127 + e - offset).clamp(0, 255) - 127
        };
        let mut rng = crate::rng::Rng::new(32);
        let mut cases = vec![
            0.0f32, 1.0, 1.74, 1.75, 1.7499999, 6.0, 7.0, 448.0, 3.5e-38, 3e38,
        ];
        cases.extend(
            (0..2000).map(|_| (rng.normal() * 2f32.powi(rng.range(0, 60) as i32 - 30)).abs()),
        );
        for amax in cases {
            for (bits, offset) in [(4, 2), (8, 8)] {
                assert_eq!(
                    mx_scale_exponent(amax, bits),
                    reference(amax as f64, offset),
                    "{amax}"
                );
            }
        }
        // A group of bf16 values: amax 5.0 -> scale 2^0 for E2M1, 2^-6 for E4M3.
        assert_eq!(mx_scale_exponent(5.0, 4), 0);
        assert_eq!(mx_scale_exponent(5.0, 8), -6);
    }

    #[test]
    fn mx_activations_round_each_group_to_its_power_of_two_grid() {
        let mut row: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.3).collect();
        row[40..].iter_mut().for_each(|v| *v = 0.0);
        let orig = row.clone();
        ActQuant::Mx { bits: 4 }.apply_row(&mut row, FloatType::F32);
        // Group 0: amax 6 = 1.5 * 2^2 rounds to the power 2^2 (below 1.75 * 2^2), scale 2^(2-2).
        for (v, o) in row[..32].iter().zip(&orig) {
            assert_eq!(*v, round_e2m1(o.clamp(-6.0, 6.0)), "{o}");
        }
        // Its zeros stay zero.
        assert!(row[40..].iter().all(|&v| v == 0.0));
        // amax 7.4 = 1.85 * 2^2 rounds up to 2^3: scale 2.
        let mut wide = vec![7.4f32, -3.7, 1.1, 0.4];
        ActQuant::Mx { bits: 4 }.apply_row(&mut wide, FloatType::F32);
        assert_eq!(wide, [8.0, -4.0, 1.0, 0.0]);
        let mut row8 = orig.clone();
        ActQuant::Mx { bits: 8 }.apply_row(&mut row8, FloatType::F32);
        // Scale 2^(2-8): values on the E4M3 grid times 1/64.
        for (v, o) in row8[..32].iter().zip(&orig) {
            assert_eq!(*v, round_fp8_e4m3(o * 64.0) / 64.0, "{o}");
        }
    }

    #[test]
    fn pow2_activations_scale_each_group_by_the_next_power_of_two() {
        assert_eq!(pow2_at_least(1.0), 1.0);
        assert_eq!(pow2_at_least(f32::from_bits(1f32.to_bits() + 1)), 2.0);
        assert_eq!(pow2_at_least(0.75), 1.0);
        assert_eq!(pow2_at_least(2f32.powi(-22) * 0.9), 2f32.powi(-22));
        // amax 448: scale 1, values on the E4M3 grid; amax 449: scale 2.
        let mut row = vec![448.0, 1.0625, -3.3, 0.0, 449.0, 3.0, -1.0, 0.5];
        ActQuant::Fp8Pow2Group { group: 4 }.apply_row(&mut row, FloatType::F32);
        assert_eq!(row, vec![448.0, 1.0, -3.25, 0.0, 448.0, 3.0, -1.0, 0.5]);
        // A group below 1e-4 takes the scale of amax 1e-4: 2^-22 (1e-4 / 448 = 1.86 * 2^-23).
        let mut small = vec![1e-5f32, 0.0];
        ActQuant::Fp8Pow2Group { group: 2 }.apply_row(&mut small, FloatType::F32);
        assert_eq!(small[0], 40.0 * 2f32.powi(-22)); // 41.9 on steps of 4
    }

    #[test]
    fn fp8_rounding_is_nearest_even() {
        // 1.0 and 1.125 are neighbours; the midpoint goes to the even mantissa (1.0).
        assert_eq!(round_fp8_e4m3(1.0625), 1.0);
        // 1.125 and 1.25: midpoint 1.1875 goes to 1.25 (mantissa 2 is even).
        assert_eq!(round_fp8_e4m3(1.1875), 1.25);
        assert_eq!(round_fp8_e4m3(-1.19), -1.25);
        // Subnormals: step 2^-9; half a step rounds to zero (even).
        assert_eq!(round_fp8_e4m3(2f32.powi(-10)), 0.0);
        assert_eq!(round_fp8_e4m3(3.0 * 2f32.powi(-10)), 2.0 * 2f32.powi(-9));
        assert_eq!(round_fp8_e4m3(460.0), 448.0);
    }

    #[test]
    fn e2m1_grid_and_ties() {
        assert_eq!(e2m1_to_f32(0x7), 6.0);
        assert_eq!(e2m1_to_f32(0xB), -1.5);
        let ties = [
            (0.25, 0.0),
            (0.75, 1.0),
            (1.25, 1.0),
            (1.75, 2.0),
            (2.5, 2.0),
            (3.5, 4.0),
            (5.0, 4.0),
        ];
        for (y, q) in ties {
            assert_eq!(round_e2m1(y), q, "{y}");
            assert_eq!(round_e2m1(-y), -q, "-{y}");
        }
    }

    #[test]
    fn fp8_per_token_fake_quant_in_f32() {
        // amax 448 gives scale 1, so values become their own FP8 roundings.
        let mut row = vec![448.0, 1.0625, -3.3, 0.0];
        ActQuant::Fp8PerToken.apply_row(&mut row, FloatType::F32);
        assert_eq!(row, vec![448.0, 1.0, -3.25, 0.0]);
    }

    #[test]
    fn nvfp4_fake_quant_of_one_group() {
        // global scale 1: s = fp8(amax/6) = fp8(1.0) = 1, so values snap to the E2M1 grid.
        let mut row: Vec<f32> = vec![
            6.0, 0.3, -2.6, 1.2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1,
        ];
        ActQuant::Nvfp4 { global_scale: 1.0 }.apply_row(&mut row, FloatType::F32);
        assert_eq!(&row[..4], &[6.0, 0.5, -3.0, 1.0]);
        assert_eq!(row[15], 0.0);
    }
}
