//! Seeded random weights and their quantization into the compressed-tensors byte layouts.
//!
//! Every row of every tensor has its own generator, seeded from (checkpoint seed, tensor
//! name, row), so the bytes do not depend on the thread count or on the order tensors are
//! written in. Weights are quantized honestly from the f32 values with min-max observers
//! (the formulas of compressed-tensors' `calculate_qparams`), which puts the extreme of
//! every group on the edge of the code range, so every code value is used.

use half::bf16;
use rayon::prelude::*;

use crate::fnv::Fnv;
use crate::rng::{Rng, mix};

/// A per-tensor seed: FNV-1a of the name mixed with the checkpoint seed.
pub(crate) fn tensor_seed(seed: u64, name: &str) -> u64 {
    mix(seed ^ mix(Fnv::of(name.as_bytes()).value()))
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Init {
    /// Zero-mean, this standard deviation.
    Normal(f32),
    /// RMS-norm gains: `1 + 0.1 N(0,1)`, like the fixtures.
    NormGain,
}

/// Fills `out` with row `row` of a tensor whose generator seed is `tseed`.
pub(crate) fn gen_row(tseed: u64, row: usize, init: Init, out: &mut [f32]) {
    let mut rng = Rng::for_row(tseed, row as u64);
    match init {
        Init::Normal(std) => out.iter_mut().for_each(|v| *v = std * rng.approx_normal()),
        Init::NormGain => out
            .iter_mut()
            .for_each(|v| *v = 1.0 + 0.1 * rng.approx_normal()),
    }
}

/// Round half to even for |x| < 2^22: adding 1.5 * 2^23 leaves no fraction bits, so the FPU
/// rounds (RNE) for us. `f32::round_ties_even` is a libm call without SSE4.1, and was half
/// the run time of INT4 quantization.
fn rne(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// Rows per rayon task: enough work to amortise scheduling, small enough to balance.
fn rows_per_task(cols: usize) -> usize {
    (65_536 / cols.max(1)).max(1)
}

/// A dense BF16 tensor `[rows, cols]`, little-endian bytes.
pub(crate) fn dense_bf16(tseed: u64, rows: usize, cols: usize, init: Init) -> Vec<u8> {
    let mut out = vec![0u8; rows * cols * 2];
    let per = rows_per_task(cols);
    out.par_chunks_mut(per * cols * 2)
        .enumerate()
        .for_each(|(t, chunk)| {
            let mut row = vec![0f32; cols];
            for (i, dst) in chunk.chunks_mut(cols * 2).enumerate() {
                gen_row(tseed, t * per + i, init, &mut row);
                for (d, v) in dst.chunks_exact_mut(2).zip(&row) {
                    d.copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
                }
            }
        });
    out
}

/// Largest |w| of a `[rows, cols]` tensor, generated on the fly (NVFP4's global scale
/// needs it before any group is quantized; regenerating is cheaper than holding f32).
pub(crate) fn absmax(tseed: u64, rows: usize, cols: usize, init: Init) -> f32 {
    let per = rows_per_task(cols);
    (0..rows.div_ceil(per))
        .into_par_iter()
        .map(|t| {
            let mut row = vec![0f32; cols];
            let mut m = 0f32;
            for r in t * per..((t + 1) * per).min(rows) {
                gen_row(tseed, r, init, &mut row);
                m = row.iter().fold(m, |m, v| m.max(v.abs()));
            }
            m
        })
        .reduce(|| 0.0, f32::max)
}

/// pack-quantized INT4 with groups of `group` along `in`, the output of one linear.
pub(crate) struct Int4 {
    /// `weight_packed` I32 `[out, in/8]`: codes `q + 8`, element `c` in bits `4*(c%8)`.
    pub packed: Vec<u8>,
    /// `weight_scale` BF16 `[out, in/group]`.
    pub scale: Vec<u8>,
    /// `weight_zero_point` I32 `[out/8, in/group]` packed along `out`, `zp + 8`; `None` if symmetric.
    pub zero_point: Option<Vec<u8>>,
}

/// The smallest positive BF16 normal stands in for a zero scale (an all-zero group), as
/// compressed-tensors replaces zero scales with the dtype's eps.
const BF16_EPS: f32 = 0.0078125;

/// Quantizes an `[out, in]` linear to INT4 with min-max observers. `out % 8 == 0` and
/// `in % group == 0`, `group % 8 == 0` are the caller's to check.
pub(crate) fn int4(
    tseed: u64,
    out: usize,
    inp: usize,
    group: usize,
    std: f32,
    symmetric: bool,
) -> Int4 {
    let ng = inp / group;
    let mut packed = vec![0u8; out * inp / 2];
    let mut scale = vec![0u8; out * ng * 2];
    let mut zp = vec![0u8; if symmetric { 0 } else { out / 8 * ng * 4 }];
    // Eight rows per task: one word of the out-packed zero point covers eight rows.
    let block = |b: usize, packed: &mut [u8], scale: &mut [u8], zp: Option<&mut [u8]>| {
        let mut row = vec![0f32; inp];
        let mut zwords = vec![0u32; ng];
        for i in 0..8 {
            gen_row(tseed, b * 8 + i, Init::Normal(std), &mut row);
            let prow = &mut packed[i * inp / 2..(i + 1) * inp / 2];
            let srow = &mut scale[i * ng * 2..(i + 1) * ng * 2];
            for (g, vals) in row.chunks_exact(group).enumerate() {
                let (s, z) = if symmetric {
                    // scale = absmax / ((qmax - qmin) / 2) = absmax / 7.5
                    let amax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
                    (bf16::from_f32(amax / 7.5), 0i32)
                } else {
                    // Range widened to include 0; zp = round(qmin - min / scale).
                    let lo = vals.iter().fold(0f32, |m, v| m.min(*v));
                    let hi = vals.iter().fold(0f32, |m, v| m.max(*v));
                    let s = bf16::from_f32((hi - lo) / 15.0);
                    let sf = if s.to_f32() > 0.0 {
                        s.to_f32()
                    } else {
                        BF16_EPS
                    };
                    (s, rne((-8.0 - lo / sf).clamp(-8.0, 7.0)) as i32)
                };
                let s = if s.to_f32() > 0.0 {
                    s
                } else {
                    bf16::from_f32(BF16_EPS)
                };
                srow[g * 2..g * 2 + 2].copy_from_slice(&s.to_bits().to_le_bytes());
                zwords[g] |= ((z + 8) as u32) << (4 * i);
                let sf = s.to_f32();
                for (w, eight) in vals.chunks_exact(8).enumerate() {
                    let mut word = 0u32;
                    for (k, v) in eight.iter().enumerate() {
                        // Clamping to integer bounds first gives the same code as rounding first.
                        let q = rne((v / sf + z as f32).clamp(-8.0, 7.0)) as i32;
                        word |= ((q + 8) as u32) << (4 * k);
                    }
                    let at = (g * group / 8 + w) * 4;
                    prow[at..at + 4].copy_from_slice(&word.to_le_bytes());
                }
            }
        }
        if let Some(zp) = zp {
            for (d, w) in zp.chunks_exact_mut(4).zip(&zwords) {
                d.copy_from_slice(&w.to_le_bytes());
            }
        }
    };
    let tasks = packed
        .par_chunks_mut(8 * inp / 2)
        .zip(scale.par_chunks_mut(8 * ng * 2));
    if symmetric {
        tasks
            .enumerate()
            .for_each(|(b, (p, s))| block(b, p, s, None));
    } else {
        tasks
            .zip(zp.par_chunks_mut(ng * 4))
            .enumerate()
            .for_each(|(b, ((p, s), z))| block(b, p, s, Some(z)));
    }
    Int4 {
        packed,
        scale,
        zero_point: (!symmetric).then_some(zp),
    }
}

/// f32 -> FP8 E4M3FN, round to nearest even, saturating at ±448 (never NaN).
pub(crate) fn f32_to_e4m3(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a.is_nan() {
        return 0x7F;
    }
    let code = if a < 1.0 / 64.0 {
        // Subnormal: value = m * 2^-9, m in 0..=8 (8 rounds up into the first normal, 0x08).
        rne(a * 512.0) as u32
    } else {
        // Round the f32 mantissa to 3 bits (RNE); a carry bumps the exponent, as it should.
        let bits = a.to_bits();
        let rounded = bits + 0x7_FFFF + ((bits >> 20) & 1);
        let exp = (rounded >> 23) as i32 - 127 + 7;
        let man = (rounded >> 20) & 7;
        if exp > 15 {
            0x7E
        } else {
            ((exp as u32) << 3) | man
        }
    };
    sign | code.min(0x7E) as u8
}

/// FP8 E4M3FN -> f32 (formats.md §1.4).
pub(crate) fn e4m3_to_f32(b: u8) -> f32 {
    let e = i32::from((b >> 3) & 15);
    let m = f32::from(b & 7);
    let mag = if e == 0 {
        m / 512.0
    } else {
        // 2^(e-7) built from its bits (powi is a libm call).
        (1.0 + m / 8.0) * f32::from_bits(((e + 120) as u32) << 23)
    };
    if b & 0x80 != 0 { -mag } else { mag }
}

/// f32 -> E2M1 code (sign in bit 3), round half to even on the grid, saturating at ±6.
/// The magnitude index counts the rounding thresholds passed (`<` or `<=` per the tie
/// direction); branch-free because random weights defeat a branch predictor.
pub(crate) fn f32_to_e2m1(y: f32) -> u8 {
    let a = y.abs();
    let mag = u8::from(a > 0.25)
        + u8::from(a >= 0.75)
        + u8::from(a > 1.25)
        + u8::from(a >= 1.75)
        + u8::from(a > 2.5)
        + u8::from(a >= 3.5)
        + u8::from(a > 5.0);
    let neg = u8::from(y.is_sign_negative() && mag != 0);
    (neg << 3) | mag
}

/// NVFP4 weights of one linear (`nvfp4-pack-quantized`).
pub(crate) struct Nvfp4 {
    /// `weight_packed` U8 `[out, in/2]`, element `2j` in the low nibble of byte `j`.
    pub packed: Vec<u8>,
    /// `weight_scale` F8_E4M3 `[out, in/16]`.
    pub scale: Vec<u8>,
}

/// The NVFP4 global scale, a divisor: `448 * 6 / amax` (compressed-tensors `generate_gparam`).
pub(crate) fn nvfp4_global_scale(amax: f32) -> f32 {
    if amax > 0.0 { 448.0 * 6.0 / amax } else { 1.0 }
}

/// Quantizes an `[out, in]` linear to NVFP4 (groups of 16) under the global scale `gs`.
pub(crate) fn nvfp4(tseed: u64, out: usize, inp: usize, std: f32, gs: f32) -> Nvfp4 {
    let mut packed = vec![0u8; out * inp / 2];
    let mut scale = vec![0u8; out * inp / 16];
    packed
        .par_chunks_mut(inp / 2)
        .zip(scale.par_chunks_mut(inp / 16))
        .enumerate()
        .for_each(|(r, (prow, srow))| {
            let mut row = vec![0f32; inp];
            gen_row(tseed, r, Init::Normal(std), &mut row);
            for ((vals, pbytes), s) in row.chunks_exact(16).zip(prow.chunks_exact_mut(8)).zip(srow)
            {
                let amax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
                let mut code = f32_to_e4m3((amax / 6.0) * gs);
                if code == 0 {
                    code = 1; // the smallest subnormal, in place of a zero scale
                }
                *s = code;
                let s_eff = e4m3_to_f32(code) / gs;
                // Fixed-size arrays so the divisions and compares vectorize.
                let mut codes = [0u8; 16];
                for (c, v) in codes.iter_mut().zip(vals) {
                    *c = f32_to_e2m1((v / s_eff).clamp(-6.0, 6.0));
                }
                for (byte, pair) in pbytes.iter_mut().zip(codes.chunks_exact(2)) {
                    *byte = pair[0] | (pair[1] << 4);
                }
            }
        });
    Nvfp4 { packed, scale }
}

/// 8-bit weights with one BF16 scale per output channel: FP8 E4M3 (`float-quantized`,
/// FP8_DYNAMIC) or INT8 (`int-quantized`, W8A8).
pub(crate) struct PerChannel8 {
    /// `weight` F8_E4M3 or I8 `[out, in]`.
    pub weight: Vec<u8>,
    /// `weight_scale` BF16 `[out, 1]`.
    pub scale: Vec<u8>,
}

/// Quantizes an `[out, in]` linear to 8 bits per channel, symmetric min-max as
/// compressed-tensors' observers do it: `scale = absmax / 448` for FP8 E4M3; for INT8
/// `absmax / 127.5` (half the integer range) and codes rounded half to even into [-128, 127].
pub(crate) fn per_channel8(
    tseed: u64,
    out: usize,
    inp: usize,
    std: f32,
    int8: bool,
) -> PerChannel8 {
    let mut weight = vec![0u8; out * inp];
    let mut scale = vec![0u8; out * 2];
    weight
        .par_chunks_mut(inp)
        .zip(scale.par_chunks_mut(2))
        .enumerate()
        .for_each(|(r, (wrow, s))| {
            let mut row = vec![0f32; inp];
            gen_row(tseed, r, Init::Normal(std), &mut row);
            let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let mut sb = bf16::from_f32(amax / if int8 { 127.5 } else { 448.0 });
            if sb.to_f32() <= 0.0 {
                sb = bf16::from_f32(BF16_EPS);
            }
            s.copy_from_slice(&sb.to_bits().to_le_bytes());
            let sf = sb.to_f32();
            for (d, v) in wrow.iter_mut().zip(&row) {
                *d = if int8 {
                    (v / sf).clamp(-128.0, 127.0).round_ties_even() as i8 as u8
                } else {
                    f32_to_e4m3((v / sf).clamp(-448.0, 448.0))
                };
            }
        });
    PerChannel8 { weight, scale }
}

/// `mxfp4-pack-quantized` weights: E2M1 pairs as NVFP4 packs them, E8M0 exponents per 32.
pub(crate) struct Mxfp4 {
    /// `weight_packed` U8 `[out, in/2]`.
    pub packed: Vec<u8>,
    /// `weight_scale` U8 `[out, in/32]`: `127 + ceil(log2(amax / 6))`.
    pub scale: Vec<u8>,
}

/// Quantizes an `[out, in]` linear to MXFP4: each group of 32 gets the smallest power of two
/// that brings its absmax within E2M1's 6.
pub(crate) fn mxfp4(tseed: u64, out: usize, inp: usize, std: f32) -> Mxfp4 {
    let mut packed = vec![0u8; out * inp / 2];
    let mut scale = vec![0u8; out * inp / 32];
    packed
        .par_chunks_mut(inp / 2)
        .zip(scale.par_chunks_mut(inp / 32))
        .enumerate()
        .for_each(|(r, (prow, srow))| {
            let mut row = vec![0f32; inp];
            gen_row(tseed, r, Init::Normal(std), &mut row);
            for ((vals, pbytes), s) in row
                .chunks_exact(32)
                .zip(prow.chunks_exact_mut(16))
                .zip(srow)
            {
                let e = mx_exponent(vals, 6.0);
                *s = (e + 127) as u8;
                let inv = (-e as f32).exp2();
                for (byte, pair) in pbytes.iter_mut().zip(vals.chunks_exact(2)) {
                    *byte = f32_to_e2m1(pair[0] * inv) | (f32_to_e2m1(pair[1] * inv) << 4);
                }
            }
        });
    Mxfp4 { packed, scale }
}

/// The E8M0 exponent of a group of 32: the smallest power of two that brings its absmax
/// within `top` (6 for E2M1, 448 for E4M3).
fn mx_exponent(vals: &[f32], top: f32) -> i32 {
    let amax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax > 0.0 {
        (amax / top).log2().ceil().clamp(-127.0, 127.0) as i32
    } else {
        -127
    }
}

/// `mxfp8-quantized` weights.
pub(crate) struct Mxfp8 {
    /// `weight` F8_E4M3 `[out, in]`.
    pub weight: Vec<u8>,
    /// `weight_scale` U8 `[out, in/32]`: `127 + ceil(log2(amax / 448))`.
    pub scale: Vec<u8>,
}

/// Quantizes an `[out, in]` linear to MXFP8: E4M3 values, a power of two per 32.
pub(crate) fn mxfp8(tseed: u64, out: usize, inp: usize, std: f32) -> Mxfp8 {
    let mut weight = vec![0u8; out * inp];
    let mut scale = vec![0u8; out * inp / 32];
    weight
        .par_chunks_mut(inp)
        .zip(scale.par_chunks_mut(inp / 32))
        .enumerate()
        .for_each(|(r, (wrow, srow))| {
            let mut row = vec![0f32; inp];
            gen_row(tseed, r, Init::Normal(std), &mut row);
            for ((vals, codes), s) in row
                .chunks_exact(32)
                .zip(wrow.chunks_exact_mut(32))
                .zip(srow)
            {
                let e = mx_exponent(vals, 448.0);
                *s = (e + 127) as u8;
                let inv = (-e as f32).exp2();
                for (c, v) in codes.iter_mut().zip(vals) {
                    *c = f32_to_e4m3((v * inv).clamp(-448.0, 448.0));
                }
            }
        });
    Mxfp8 { weight, scale }
}

/// Native FP8 with block scales (`quant_method: fp8`, DeepSeek-V3's layout).
pub(crate) struct Fp8Block {
    /// `weight` F8_E4M3 `[out, in]`.
    pub weight: Vec<u8>,
    /// `weight_scale_inv` F32 `[ceil(out/b), ceil(in/b)]`: `absmax / 448` per block.
    pub scale_inv: Vec<u8>,
}

/// Quantizes an `[out, in]` linear to FP8 E4M3 in `b x b` blocks.
pub(crate) fn fp8_block(tseed: u64, out: usize, inp: usize, std: f32, b: usize) -> Fp8Block {
    let cols = inp.div_ceil(b);
    let mut weight = vec![0u8; out * inp];
    let mut scale_inv = vec![0u8; out.div_ceil(b) * cols * 4];
    weight
        .par_chunks_mut(b * inp)
        .zip(scale_inv.par_chunks_mut(cols * 4))
        .enumerate()
        .for_each(|(br, (wblock, sblock))| {
            let rows = wblock.len() / inp;
            let mut vals = vec![0f32; rows * inp];
            for (i, row) in vals.chunks_exact_mut(inp).enumerate() {
                gen_row(tseed, br * b + i, Init::Normal(std), row);
            }
            for (bc, s) in sblock.chunks_exact_mut(4).enumerate() {
                let cs = bc * b..((bc + 1) * b).min(inp);
                let amax = vals
                    .chunks_exact(inp)
                    .flat_map(|row| &row[cs.clone()])
                    .fold(0f32, |m, v| m.max(v.abs()));
                let sf = if amax > 0.0 { amax / 448.0 } else { 1.0 };
                s.copy_from_slice(&sf.to_le_bytes());
                for (i, row) in vals.chunks_exact(inp).enumerate() {
                    for c in cs.clone() {
                        wblock[i * inp + c] = f32_to_e4m3((row[c] / sf).clamp(-448.0, 448.0));
                    }
                }
            }
        });
    Fp8Block { weight, scale_inv }
}

/// GPTQ / AutoAWQ tensors of one linear, re-laid out from a pack-quantized INT4 one.
pub(crate) struct Transposed {
    pub qweight: Vec<u8>,
    pub qzeros: Vec<u8>,
    /// F16 `[groups, out]` (`[out, width * 8]` in AWQ's GEMV layout).
    pub scales: Vec<u8>,
}

/// AutoAWQ GEMV's padded zero-point width for groups of at least 128 (`calculate_zeros_width`):
/// the groups rounded up to whole 8-nibble words.
pub(crate) fn awq_gemv_width(groups: usize) -> usize {
    groups.div_ceil(8)
}

/// AutoAWQ GEMV: per output row, codes packed along `in` and zero points along the groups in
/// natural nibble order (the pack-quantized row words as they are), F16 scales `[out, width * 8]`,
/// zero points and scales zero-padded to `width` words.
pub(crate) fn awq_gemv_from_int4(q: &Int4, out: usize, inp: usize, group: usize) -> Transposed {
    let groups = inp / group;
    let width = awq_gemv_width(groups);
    let zp = q.zero_point.as_ref().expect("asymmetric INT4");
    let mut qzeros = vec![0u32; out * width];
    for r in 0..out {
        for g in 0..groups {
            qzeros[r * width + g / 8] |= zero_nibble(zp, groups, r, g) << (4 * (g % 8));
        }
    }
    Transposed {
        qweight: q.packed.clone(),
        qzeros: bytemuck::cast_slice(&qzeros).to_vec(),
        scales: scales_f16(&q.scale, (out, groups), out * width * 8, |r, g| {
            r * width * 8 + g
        }),
    }
}

/// BF16 `[out, groups]` scales as `len` F16 values, scale (r, g) at `at(r, g)`, zero
/// elsewhere (padding).
fn scales_f16(
    scale: &[u8],
    (out, groups): (usize, usize),
    len: usize,
    at: impl Fn(usize, usize) -> usize,
) -> Vec<u8> {
    let mut t = vec![0u8; len * 2];
    for r in 0..out {
        for g in 0..groups {
            let i = (r * groups + g) * 2;
            let v = bf16::from_le_bytes([scale[i], scale[i + 1]]).to_f32();
            let j = at(r, g) * 2;
            t[j..j + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    t
}

/// Row `r`'s zero point of group `g` in a pack-quantized INT4 `weight_zero_point` (packed
/// along the output rows, 8 per word).
fn zero_nibble(zp: &[u8], groups: usize, r: usize, g: usize) -> u32 {
    (word(zp, (r / 8) * groups + g) >> (4 * (r % 8))) & 15
}

fn word(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// GPTQ v1 (symmetric): the pack-quantized words transposed (both pack 8 inputs per word, low
/// nibble first), zero points stored minus one (nibble 7), F16 scales `[groups, out]`.
pub(crate) fn gptq_from_int4(q: &Int4, out: usize, inp: usize, group: usize) -> Transposed {
    let (words, groups) = (inp / 8, inp / group);
    let mut qweight = vec![0u8; words * out * 4];
    for r in 0..out {
        for w in 0..words {
            let j = (w * out + r) * 4;
            qweight[j..j + 4].copy_from_slice(&word(&q.packed, r * words + w).to_le_bytes());
        }
    }
    Transposed {
        qweight,
        qzeros: 0x7777_7777u32.to_le_bytes().repeat(groups * out / 8),
        scales: scales_f16(&q.scale, (out, groups), out * groups, |r, g| g * out + r),
    }
}

/// AutoAWQ GEMM: codes and zero points packed along `out` in AWQ's nibble order (output
/// `8c + ORDER[i]` in nibble `i` of word `c`), from an asymmetric pack-quantized INT4 linear.
pub(crate) fn awq_from_int4(q: &Int4, out: usize, inp: usize, group: usize) -> Transposed {
    const NIBBLE_OF: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
    let (words, groups) = (inp / 8, inp / group);
    let zp = q.zero_point.as_ref().expect("asymmetric INT4");
    let mut qweight = vec![0u32; inp * out / 8];
    let mut qzeros = vec![0u32; groups * out / 8];
    for r in 0..out {
        let shift = 4 * NIBBLE_OF[r % 8];
        for c in 0..inp {
            let code = (word(&q.packed, r * words + c / 8) >> (4 * (c % 8))) & 15;
            qweight[c * out / 8 + r / 8] |= code << shift;
        }
        for g in 0..groups {
            qzeros[g * out / 8 + r / 8] |= zero_nibble(zp, groups, r, g) << shift;
        }
    }
    Transposed {
        qweight: bytemuck::cast_slice(&qweight).to_vec(),
        qzeros: bytemuck::cast_slice(&qzeros).to_vec(),
        scales: scales_f16(&q.scale, (out, groups), out * groups, |r, g| g * out + r),
    }
}
