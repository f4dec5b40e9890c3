//! Dequantization of hand-made packed tensors against the formulas of docs/formats.md,
//! written out here independently of the packing code: odd shapes, negative values, zero
//! points, g_idx, NVFP4 and FP8.

use quantppl::backend::lowering::{LoweredWeight, lower};
use quantppl::checkpoint::scheme::Strategy;
use quantppl::checkpoint::transposed::{Layout, TransposedInt};
use quantppl::checkpoint::{Fp4Scale, Packing, QLinear, TensorRef, ZeroPoint};
use quantppl::numerics::FloatType;
use safetensors::Dtype;

/// A case file of tests/fixtures written by the reference libraries (make_format_fixtures.py).
fn cases_of(file: &str) -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(file);
    serde_json::from_str(&std::fs::read_to_string(&path).expect("cases")).expect("JSON")
}

fn bf16(v: f32) -> f32 {
    half::bf16::from_f32(v).to_f32()
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
        .collect()
}

fn words_bytes(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn t<'a>(name: &'a str, dtype: Dtype, shape: &'a [usize], bytes: &'a [u8]) -> TensorRef<'a> {
    TensorRef {
        name,
        dtype,
        shape,
        bytes,
    }
}

/// Packs signed `q` (range -2^(b-1)..2^(b-1)) into u32 words along each row, low bits first.
fn pack_rows(q: &[Vec<i32>], bits: u32) -> (Vec<u32>, usize) {
    let per = (32 / bits) as usize;
    let words = q[0].len().div_ceil(per);
    let mut out = vec![0u32; q.len() * words];
    for (r, row) in q.iter().enumerate() {
        for (c, &v) in row.iter().enumerate() {
            let u = (v + (1 << (bits - 1))) as u32;
            out[r * words + c / per] |= u << (bits as usize * (c % per));
        }
    }
    (out, words)
}

fn linear<'a>(packing: Packing<'a>, out: usize, inp: usize, dt: FloatType) -> QLinear<'a> {
    QLinear {
        name: "test",
        out_features: out,
        in_features: inp,
        packing,
        bias: None,
        act_quant: None,
        model_dtype: dt,
    }
}

fn assert_bits(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "element {i}: got {g}, want {w}");
    }
}

#[test]
fn int4_group_sym_odd_width() {
    // 3 x 10 weights (the last word of each row is half padding), group 4 -> 3 groups.
    let q: Vec<Vec<i32>> = (0..3)
        .map(|r| (0..10).map(|c| (r * 7 + c * 3) % 16 - 8).collect())
        .collect();
    let s: Vec<f32> = vec![0.013, 0.5, -0.031, 0.0071, 1.7, 0.25, 0.1, 0.2, 0.3];
    let (w, words) = pack_rows(&q, 4);
    let (pb, sb) = (words_bytes(&w), bf16_bytes(&s));
    let (ps, ss) = ([3, words], [3, 3]);
    let l = linear(
        Packing::PackedInt {
            bits: 4,
            packed: t("p", Dtype::I32, &ps, &pb),
            words_per_row: words,
            legacy_codes_per_word: None,
            scale: t("s", Dtype::BF16, &ss, &sb),
            zero_point: None,
            strategy: Strategy::Group(4),
            g_idx: None,
        },
        3,
        10,
        FloatType::Bf16,
    );
    let want: Vec<f32> = (0..30)
        .map(|i| {
            let (r, c) = (i / 10, i % 10);
            bf16(q[r][c] as f32 * bf16(s[r * 3 + c / 4]))
        })
        .collect();
    assert_bits(&l.dequantize().unwrap(), &want);
}

#[test]
fn int4_asym_zero_points_packed_along_out_with_g_idx() {
    // 9 rows (two zero-point words along out), 6 columns in 2 groups of 3 assigned by g_idx.
    let (out, inp) = (9, 6);
    let q: Vec<Vec<i32>> = (0..out)
        .map(|r| {
            (0..inp)
                .map(|c| ((r * 5 + c * 11) % 16) as i32 - 8)
                .collect()
        })
        .collect();
    let z: Vec<Vec<i32>> = (0..out)
        .map(|r| (0..2).map(|g| ((r * 3 + g * 5) % 16) as i32 - 8).collect())
        .collect();
    let g_idx = [1i32, 0, 1, 1, 0, 0];
    let s: Vec<f32> = (0..out * 2).map(|i| 0.01 * (i as f32 + 1.0)).collect();
    let (w, words) = pack_rows(&q, 4);
    // Zero points: word [r/8, g] holds row r in nibble r%8.
    let mut zw = vec![0u32; 2 * 2];
    for r in 0..out {
        for g in 0..2 {
            zw[(r / 8) * 2 + g] |= ((z[r][g] + 8) as u32) << (4 * (r % 8));
        }
    }
    let (pb, sb, zb) = (words_bytes(&w), bf16_bytes(&s), words_bytes(&zw));
    let gb: Vec<u8> = g_idx.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (ps, ss, zs, gs) = ([out, words], [out, 2], [2, 2], [inp]);
    let l = linear(
        Packing::PackedInt {
            bits: 4,
            packed: t("p", Dtype::I32, &ps, &pb),
            words_per_row: words,
            legacy_codes_per_word: None,
            scale: t("s", Dtype::BF16, &ss, &sb),
            zero_point: Some(ZeroPoint::PackedAlongOut(t("z", Dtype::I32, &zs, &zb))),
            strategy: Strategy::Group(3),
            g_idx: Some(t("g", Dtype::I32, &gs, &gb)),
        },
        out,
        inp,
        FloatType::Bf16,
    );
    let want: Vec<f32> = (0..out * inp)
        .map(|i| {
            let (r, c) = (i / inp, i % inp);
            let g = g_idx[c] as usize;
            bf16((q[r][c] - z[r][g]) as f32 * bf16(s[r * 2 + g]))
        })
        .collect();
    assert_bits(&l.dequantize().unwrap(), &want);
}

#[test]
fn int8_channel_with_f32_scales_rounds_once_in_f32() {
    let q: Vec<Vec<i32>> = vec![vec![-128, 127, 0, -1, 5], vec![3, -77, 100, 64, -2]];
    let s = [0.0123456f32, 3.3e-3];
    let (w, words) = pack_rows(&q, 8);
    let pb = words_bytes(&w);
    let sb: Vec<u8> = s.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (ps, ss) = ([2, words], [2, 1]);
    let l = linear(
        Packing::PackedInt {
            bits: 8,
            packed: t("p", Dtype::I32, &ps, &pb),
            words_per_row: words,
            legacy_codes_per_word: None,
            scale: t("s", Dtype::F32, &ss, &sb),
            zero_point: None,
            strategy: Strategy::Channel,
            g_idx: None,
        },
        2,
        5,
        FloatType::F32,
    );
    let want: Vec<f32> = (0..10).map(|i| q[i / 5][i % 5] as f32 * s[i / 5]).collect();
    assert_bits(&l.dequantize().unwrap(), &want);
}

#[test]
fn nvfp4_divides_the_fp8_scale_by_the_global_scale_then_rounds_to_bf16() {
    // 2 x 32: two groups of 16 per row. Codes cycle through all 16 E2M1 values.
    let e2m1 = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let codes: Vec<u8> = (0..64).map(|i| ((i * 7 + 3) % 16) as u8).collect();
    let packed: Vec<u8> = codes.chunks(2).map(|p| p[0] | (p[1] << 4)).collect();
    // FP8 E4M3 scales: 0x38 = 1.0, 0x41 = 2.25, 0x2c = 0.375, 0x06 = 6 * 2^-9 (subnormal).
    let scale_bytes = [0x38u8, 0x41, 0x2c, 0x06];
    let scale_vals = [1.0f32, 2.25, 0.375, 6.0 / 512.0];
    let gs = 3.0f32;
    let (ps, ss) = ([2, 16], [2, 2]);
    let l = linear(
        Packing::Fp4 {
            packed: t("p", Dtype::U8, &ps, &packed),
            scale: t("s", Dtype::F8_E4M3, &ss, &scale_bytes),
            group: 16,
            scale_kind: Fp4Scale::Nvfp4 { global_scale: gs },
        },
        2,
        32,
        FloatType::Bf16,
    );
    let want: Vec<f32> = (0..64)
        .map(|i| {
            let code = codes[i];
            let v = if code & 8 != 0 {
                -e2m1[(code & 7) as usize]
            } else {
                e2m1[(code & 7) as usize]
            };
            let s_eff = scale_vals[(i / 32) * 2 + (i % 32) / 16] / gs;
            bf16(v * s_eff)
        })
        .collect();
    assert_bits(&l.dequantize().unwrap(), &want);
}

#[test]
fn fp8_channel_weights() {
    // E4M3 codes: 0x38 = 1, 0xb8 = -1, 0x7e = 448, 0x01 = 2^-9, 0xc4 = -3.
    let w = [0x38u8, 0xb8, 0x7e, 0x01, 0xc4, 0x00];
    let vals = [1.0f32, -1.0, 448.0, 1.0 / 512.0, -3.0, 0.0];
    let s = [0.0173f32, 2.5];
    let sb = bf16_bytes(&s);
    let (ws, ss) = ([2, 3], [2, 1]);
    let l = linear(
        Packing::Unpacked {
            weight: t("w", Dtype::F8_E4M3, &ws, &w),
            scale: t("s", Dtype::BF16, &ss, &sb),
            zero_point: None,
            strategy: Strategy::Channel,
        },
        2,
        3,
        FloatType::Bf16,
    );
    let want: Vec<f32> = (0..6).map(|i| bf16(vals[i] * bf16(s[i / 3]))).collect();
    assert_bits(&l.dequantize().unwrap(), &want);
}

fn f16(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect()
}

fn transposed<'a>(
    layout: Layout,
    bits: u32,
    tensors: [TensorRef<'a>; 3],
    g_idx: Option<TensorRef<'a>>,
    group_size: usize,
    (out, inp): (usize, usize),
) -> QLinear<'a> {
    let [qweight, qzeros, scales] = tensors;
    linear(
        Packing::Transposed(TransposedInt {
            layout,
            bits,
            qweight,
            qzeros,
            scales,
            g_idx,
            group_size,
            out_features: out,
            in_features: inp,
        }),
        out,
        inp,
        FloatType::Bf16,
    )
}

/// The GPU lowering re-lays GPTQ/AWQ codes out as `pack-quantized`; read back through the
/// compressed-tensors decode, they must give the same weights bit for bit.
fn assert_lowering_keeps_weights(l: &QLinear) {
    let LoweredWeight::PackedInt {
        bits,
        packed,
        words_per_row,
        scales,
        g_idx,
        ..
    } = lower(l).unwrap()
    else {
        panic!("GPTQ/AWQ lower to packed integers");
    };
    let groups = scales.index.row_stride;
    let zeros: Option<Vec<u8>> = scales
        .zeros
        .as_ref()
        .map(|z| z.iter().flat_map(|z| z.to_le_bytes()).collect());
    let g_bytes: Option<Vec<u8>> = g_idx.map(|g| g.iter().flat_map(|v| v.to_le_bytes()).collect());
    let (out, inp) = (l.out_features, l.in_features);
    let (ps, ss, gs) = ([out, words_per_row], [out, groups], [inp]);
    let relaid = linear(
        Packing::PackedInt {
            bits,
            packed: t("p", Dtype::I32, &ps, &packed),
            words_per_row,
            legacy_codes_per_word: None,
            scale: t("s", Dtype::F16, &ss, &scales.bytes),
            zero_point: zeros
                .as_deref()
                .map(|z| ZeroPoint::Unpacked(t("z", Dtype::I32, &ss, z))),
            strategy: Strategy::Group(scales.index.col_div),
            g_idx: g_bytes.as_deref().map(|b| t("g", Dtype::I32, &gs, b)),
        },
        out,
        inp,
        l.model_dtype,
    );
    assert_bits(&relaid.dequantize().unwrap(), &l.dequantize().unwrap());
}

#[test]
fn gptq_v1_3bit_act_order_adds_one_to_stored_zeros() {
    // 32 inputs x 5 outputs: one AutoGPTQ 3-bit unit (32 codes in 3 words) per column, packed
    // with AutoGPTQ's own word-by-word recipe (10 codes, a split code, 10, a split code, 10).
    let (out, inp, groups) = (5, 32, 4);
    let q: Vec<Vec<u32>> = (0..inp)
        .map(|k| (0..out).map(|n| ((k * 5 + n * 3 + 1) % 8) as u32).collect())
        .collect();
    let mut qw = vec![0u32; 3 * out];
    for n in 0..out {
        let c = |i: usize| q[i][n];
        let mut w = [0u32; 3];
        for j in 0..10 {
            w[0] |= c(j) << (3 * j);
        }
        w[0] |= c(10) << 30;
        w[1] |= (c(10) >> 2) & 1;
        for j in 0..10 {
            w[1] |= c(11 + j) << (3 * j + 1);
        }
        w[1] |= c(21) << 31;
        w[2] |= (c(21) >> 1) & 3;
        for j in 0..10 {
            w[2] |= c(22 + j) << (3 * j + 2);
        }
        for (i, word) in w.iter().enumerate() {
            qw[i * out + n] = *word;
        }
    }
    // Stored zeros (3-bit, 5 per group row: one word), v1 meaning stored + 1.
    let zs: Vec<Vec<u32>> = (0..groups)
        .map(|g| (0..out).map(|n| ((g * 3 + n) % 8) as u32).collect())
        .collect();
    let qz: Vec<u32> = zs
        .iter()
        .map(|row| row.iter().enumerate().map(|(n, &z)| z << (3 * n)).sum())
        .collect();
    // Act order: input k belongs to group g_idx[k] (a permutation of k / 8).
    let g_idx: Vec<i32> = (0..inp).map(|k| ((k * 7) % inp / 8) as i32).collect();
    let s: Vec<f32> = (0..groups * out)
        .map(|i| f16(0.003 * (i as f32 + 1.0) * if i % 3 == 0 { -1.0 } else { 1.0 }))
        .collect();
    let (qb, zb, sb) = (words_bytes(&qw), words_bytes(&qz), f16_bytes(&s));
    let gb: Vec<u8> = g_idx.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (qs, zsh, ss, gs) = ([3, out], [groups, 1], [groups, out], [inp]);
    let l = transposed(
        Layout::Gptq { v2: false },
        3,
        [
            t("qweight", Dtype::I32, &qs, &qb),
            t("qzeros", Dtype::I32, &zsh, &zb),
            t("scales", Dtype::F16, &ss, &sb),
        ],
        Some(t("g_idx", Dtype::I32, &gs, &gb)),
        8,
        (out, inp),
    );
    let want: Vec<f32> = (0..out * inp)
        .map(|i| {
            let (n, k) = (i / inp, i % inp);
            let g = g_idx[k] as usize;
            let z = zs[g][n] as i32 + 1;
            bf16(f16((q[k][n] as i32 - z) as f32 * s[g * out + n]))
        })
        .collect();
    assert_bits(&l.dequantize().unwrap(), &want);
    assert_lowering_keeps_weights(&l);
}

#[test]
fn gptq_v2_8bit_single_group_keeps_stored_zeros() {
    // group_size -1: one group over 6 inputs; 8-bit codes 4 per word along in, zeros along out.
    let (out, inp) = (3, 6);
    let q: Vec<Vec<u32>> = (0..inp)
        .map(|k| (0..out).map(|n| ((k * 97 + n * 41) % 256) as u32).collect())
        .collect();
    let mut qw = vec![0u32; 2 * out];
    for (k, row) in q.iter().enumerate() {
        for (n, &v) in row.iter().enumerate() {
            qw[(k / 4) * out + n] |= v << (8 * (k % 4));
        }
    }
    let z = [255u32, 0, 128];
    let qz = [z[0] | z[1] << 8 | z[2] << 16];
    let s: Vec<f32> = [0.5, -0.0071, 3.0].iter().map(|&v| f16(v)).collect();
    let (qb, zb, sb) = (words_bytes(&qw), words_bytes(&qz), f16_bytes(&s));
    let (qs, zsh, ss) = ([2, out], [1, 1], [1, out]);
    let l = transposed(
        Layout::Gptq { v2: true },
        8,
        [
            t("qweight", Dtype::I32, &qs, &qb),
            t("qzeros", Dtype::I32, &zsh, &zb),
            t("scales", Dtype::F16, &ss, &sb),
        ],
        None,
        inp,
        (out, inp),
    );
    let want: Vec<f32> = (0..out * inp)
        .map(|i| {
            let (n, k) = (i / inp, i % inp);
            bf16(f16((q[k][n] as i32 - z[n] as i32) as f32 * s[n]))
        })
        .collect();
    assert_bits(&l.dequantize().unwrap(), &want);
    assert_lowering_keeps_weights(&l);
}

#[test]
fn awq_gemm_interleaved_nibbles() {
    // 16 outputs (two words per input row) x 6 inputs in groups of 3; AutoAWQ packs output
    // 8c + ORDER[i] into nibble i of word c.
    const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
    let (out, inp, gsz) = (16, 6, 3);
    let groups = inp / gsz;
    let q: Vec<Vec<u32>> = (0..inp)
        .map(|k| (0..out).map(|n| ((k * 7 + n * 5) % 16) as u32).collect())
        .collect();
    let zs: Vec<Vec<u32>> = (0..groups)
        .map(|g| (0..out).map(|n| ((g * 11 + n * 3) % 16) as u32).collect())
        .collect();
    let pack = |rows: &[Vec<u32>]| -> Vec<u32> {
        let mut words = vec![0u32; rows.len() * out / 8];
        for (r, row) in rows.iter().enumerate() {
            for c in 0..out / 8 {
                for (i, &o) in ORDER.iter().enumerate() {
                    words[r * out / 8 + c] |= row[8 * c + o] << (4 * i);
                }
            }
        }
        words
    };
    let s: Vec<f32> = (0..groups * out)
        .map(|i| f16(0.0123 * (i as f32 - 9.5)))
        .collect();
    let (qb, zb, sb) = (
        words_bytes(&pack(&q)),
        words_bytes(&pack(&zs)),
        f16_bytes(&s),
    );
    let (qs, zsh, ss) = ([inp, out / 8], [groups, out / 8], [groups, out]);
    let l = transposed(
        Layout::Awq,
        4,
        [
            t("qweight", Dtype::I32, &qs, &qb),
            t("qzeros", Dtype::I32, &zsh, &zb),
            t("scales", Dtype::F16, &ss, &sb),
        ],
        None,
        gsz,
        (out, inp),
    );
    let want: Vec<f32> = (0..out * inp)
        .map(|i| {
            let (n, k) = (i / inp, i % inp);
            let g = k / gsz;
            bf16(f16(
                (q[k][n] as i32 - zs[g][n] as i32) as f32 * s[g * out + n]
            ))
        })
        .collect();
    assert_bits(&l.dequantize().unwrap(), &want);
    assert_lowering_keeps_weights(&l);
}

#[test]
fn awq_gemv_rows_in_natural_order_with_padded_zeros_and_scales() {
    // 3 outputs x 24 inputs in groups of 8 (3 groups); AutoAWQ's GEMV packs input 8c + i of
    // output n into nibble i of word (n, c), zero point of group g into nibble g % 8 of word
    // (n, g / 8), and pads zero points and scales to calculate_zeros_width (here 2 words,
    // 16 slots, for 3 groups).
    let (out, inp, gsz, width) = (3, 24, 8, 2);
    let groups = inp / gsz;
    let q: Vec<Vec<u32>> = (0..out)
        .map(|n| (0..inp).map(|k| ((k * 7 + n * 5) % 16) as u32).collect())
        .collect();
    let zs: Vec<Vec<u32>> = (0..out)
        .map(|n| {
            (0..groups)
                .map(|g| ((g * 11 + n * 3) % 16) as u32)
                .collect()
        })
        .collect();
    let pack = |row: &[u32], words: usize| -> Vec<u32> {
        let mut w = vec![0u32; words];
        for (i, &c) in row.iter().enumerate() {
            w[i / 8] |= c << (4 * (i % 8));
        }
        w
    };
    let qw: Vec<u32> = q.iter().flat_map(|r| pack(r, inp / 8)).collect();
    // Padding nibbles and padding scales hold garbage that must be ignored.
    let zw: Vec<u32> = zs
        .iter()
        .flat_map(|r| {
            let mut w = pack(r, width);
            w[1] = 0xdead_beef;
            w
        })
        .collect();
    let s: Vec<f32> = (0..out * width * 8)
        .map(|i| f16(0.0123 * (i as f32 - 9.5)))
        .collect();
    let (qb, zb, sb) = (words_bytes(&qw), words_bytes(&zw), f16_bytes(&s));
    let (qs, zsh, ss) = ([out, inp / 8], [out, width], [out, width * 8]);
    let l = transposed(
        Layout::AwqGemv,
        4,
        [
            t("qweight", Dtype::I32, &qs, &qb),
            t("qzeros", Dtype::I32, &zsh, &zb),
            t("scales", Dtype::F16, &ss, &sb),
        ],
        None,
        gsz,
        (out, inp),
    );
    let want: Vec<f32> = (0..out * inp)
        .map(|i| {
            let (n, k) = (i / inp, i % inp);
            let g = k / gsz;
            bf16(f16(
                (q[n][k] as i32 - zs[n][g] as i32) as f32 * s[n * width * 8 + g]
            ))
        })
        .collect();
    assert_bits(&l.dequantize().unwrap(), &want);
    assert_lowering_keeps_weights(&l);
}

/// E2M1 value of a code, from the OCP table written out: sign bit 3, magnitudes 0..6.
fn e2m1(code: u8) -> f32 {
    let m = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][(code & 7) as usize];
    if code & 8 != 0 { -m } else { m }
}

fn fp4_linear<'a>(
    packed: &'a [u8],
    scales: &'a [u8],
    shapes: &'a [[usize; 2]; 2],
    group: usize,
    scale_kind: Fp4Scale,
    model: FloatType,
) -> QLinear<'a> {
    let scale_dtype = if scale_kind == Fp4Scale::E8m0 {
        Dtype::U8
    } else {
        Dtype::F8_E4M3
    };
    linear(
        Packing::Fp4 {
            packed: t("p", Dtype::U8, &shapes[0], packed),
            scale: t("s", scale_dtype, &shapes[1], scales),
            group,
            scale_kind,
        },
        shapes[0][0],
        shapes[0][1] * 2,
        model,
    )
}

#[test]
fn mxfp4_e8m0_scales_are_powers_of_two_rounded_to_bf16() {
    // 3 rows x 64: two groups of 32 per row. Exponents: 127 (1), 0 (2^-127, an f32
    // subnormal), 254 (2^127: 2^127 * 2 overflows to inf), 120, 130, 1.
    let codes: Vec<u8> = (0..192).map(|i| ((i * 5 + 1) % 16) as u8).collect();
    let packed: Vec<u8> = codes.chunks(2).map(|p| p[0] | (p[1] << 4)).collect();
    let exps = [127u8, 0, 254, 120, 130, 1];
    let shapes = [[3, 32], [3, 2]];
    let l = fp4_linear(&packed, &exps, &shapes, 32, Fp4Scale::E8m0, FloatType::F16);
    let want: Vec<f32> = (0..192)
        .map(|i| {
            let scale = 2f64.powi(exps[i / 32] as i32 - 127);
            // The product, rounded to bf16 (exact here but for overflow), then to the f16 model.
            let w = bf16((e2m1(codes[i]) as f64 * scale) as f32);
            half::f16::from_f32(w).to_f32()
        })
        .collect();
    let got = l.dequantize().unwrap();
    assert!(got.iter().any(|v| v.is_infinite()), "2^127 * 6 overflows");
    assert_bits(&got, &want);
}

#[test]
fn modelopt_nvfp4_multiplies_fp8_scale_by_scale_2_in_f32() {
    // 2 x 32; weight_scale_2 is the multiplier (not compressed-tensors' divisor), the products
    // stay f32 until the model dtype.
    let codes: Vec<u8> = (0..64).map(|i| ((i * 3 + 2) % 16) as u8).collect();
    let packed: Vec<u8> = codes.chunks(2).map(|p| p[0] | (p[1] << 4)).collect();
    let scale_bytes = [0x38u8, 0x41, 0x2c, 0x06];
    let scale_vals = [1.0f32, 2.25, 0.375, 6.0 / 512.0];
    let s2 = 0.0123f32;
    let shapes = [[2, 16], [2, 2]];
    let kind = Fp4Scale::ModelOpt { scale_2: s2 };
    let l = fp4_linear(&packed, &scale_bytes, &shapes, 16, kind, FloatType::Bf16);
    let want: Vec<f32> = (0..64)
        .map(|i| bf16(e2m1(codes[i]) * (scale_vals[(i / 32) * 2 + (i % 32) / 16] * s2)))
        .collect();
    assert_bits(&l.dequantize().unwrap(), &want);
}

#[test]
fn mxfp8_codes_with_e8m0_group_scales() {
    // 2 x 64 FP8 codes (E4M3 0x01 = 2^-9 subnormal, 0x7E = 448, 0xB8 = -1), groups of 32.
    let codes: Vec<u8> = (0..128)
        .map(|i| [0x01u8, 0x7E, 0xB8, 0x3C, 0x45][i % 5])
        .collect();
    let values = |c: u8| match c {
        0x01 => 2f32.powi(-9),
        0x7E => 448.0,
        0xB8 => -1.0,
        0x3C => 1.5,
        _ => 3.25,
    };
    let exps = [127u8, 100, 140, 3];
    let (ws, ss) = ([2, 64], [2, 2]);
    let l = linear(
        Packing::Unpacked {
            weight: t("w", Dtype::F8_E4M3, &ws, &codes),
            scale: t("s", Dtype::U8, &ss, &exps),
            zero_point: None,
            strategy: Strategy::Group(32),
        },
        2,
        64,
        FloatType::Bf16,
    );
    let want: Vec<f32> = (0..128)
        .map(|i| {
            let e = exps[(i / 64) * 2 + (i % 64) / 32] as i32 - 127;
            bf16((values(codes[i]) as f64 * 2f64.powi(e)) as f32)
        })
        .collect();
    assert_bits(&l.dequantize().unwrap(), &want);
}

#[test]
fn native_fp8_block_scales_multiply_in_f32() {
    // 5 x 6 FP8 weights in blocks of 2 x 4 (partial blocks at the edges): 3 x 2 f32 scales
    // (`weight_scale_inv`, a multiplier).
    let codes: Vec<u8> = (0..30).map(|i| [0x3Cu8, 0xC5, 0x2A, 0x01][i % 4]).collect();
    let values = |c: u8| match c {
        0x3C => 1.5f32,
        0xC5 => -3.25,
        0x2A => 0.3125,
        _ => 2f32.powi(-9),
    };
    let s: Vec<f32> = vec![0.0173, 1.3, -0.25, 3.0e-3, 7.77, 0.5];
    let sb: Vec<u8> = s.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (ws, ss) = ([5, 6], [3, 2]);
    let l = linear(
        Packing::Unpacked {
            weight: t("w", Dtype::F8_E4M3, &ws, &codes),
            scale: t("s", Dtype::F32, &ss, &sb),
            zero_point: None,
            strategy: Strategy::Block(2, 4),
        },
        5,
        6,
        FloatType::Bf16,
    );
    let want: Vec<f32> = (0..30)
        .map(|i| {
            let (r, c) = (i / 6, i % 6);
            bf16(values(codes[i]) * s[(r / 2) * 2 + c / 4])
        })
        .collect();
    assert_bits(&l.dequantize().unwrap(), &want);
}

/// Activation quantizers against compressed-tensors' own dynamic quantization
/// (`compute_dynamic_scales_and_zp` + `fake_quantize`) on rows from 1e-30 to 1e30, zero
/// groups, spikes and MX scale boundaries: MXFP4, MXFP8, the FP8_BLOCK preset's groups of
/// 128 and INT8 / INT4 per token, in float32 and bfloat16 (tests/fixtures/act_quant_cases.json);
/// and against DeepGEMM's cast of DeepSeek-V4's expert inputs (power-of-two scales per 32, as
/// torch computes `2^ceil(log2(amax / 448))`), on the same rows and ones at and around 448
/// times a power of two.
#[test]
fn activation_quantizers_match_compressed_tensors_bit_for_bit() {
    use quantppl::numerics::ActQuant;
    let cases = cases_of("act_quant_cases.json");
    let floats = |v: &serde_json::Value| -> Vec<Vec<f32>> {
        v.as_array()
            .expect("rows")
            .iter()
            .map(|r| {
                r.as_array()
                    .expect("row")
                    .iter()
                    .map(|x| x.as_f64().expect("number") as f32)
                    .collect()
            })
            .collect()
    };
    let mut checked = 0;
    for case in cases["cases"].as_array().expect("cases") {
        let aq = match case["scheme"].as_str().expect("scheme") {
            "mxfp4" => ActQuant::Mx { bits: 4 },
            "mxfp8" => ActQuant::Mx { bits: 8 },
            "fp8_group128" => ActQuant::Fp8Group { group: 128 },
            "int8_token" => ActQuant::IntPerToken { bits: 8 },
            "int4_token" => ActQuant::IntPerToken { bits: 4 },
            "fp8_pow2_group32" => ActQuant::Fp8Pow2Group { group: 32 },
            other => panic!("unknown scheme {other}"),
        };
        let dt = match case["dtype"].as_str().expect("dtype") {
            "float32" => FloatType::F32,
            "bfloat16" => FloatType::Bf16,
            other => panic!("unknown dtype {other}"),
        };
        for (row, (x, want)) in floats(&case["input"])
            .into_iter()
            .zip(floats(&case["output"]))
            .enumerate()
        {
            let mut got = x.clone();
            aq.apply_row(&mut got, dt);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g == w,
                    "{aq:?} {dt:?} row {row} col {i}: input {} -> {g}, compressed-tensors {w}",
                    x[i]
                );
            }
            checked += got.len();
        }
    }
    assert_eq!(checked, 6 * 2 * 9 * 256);
}

/// A native FP8 checkpoint's `modules_to_not_convert` read as transformers 5.23's
/// `should_convert_module` reads it, on every (pattern, name) pair of
/// tests/fixtures/modules_to_not_convert_cases.json (full names, suffixes such as `mlp.gate`
/// that must leave `mlp.gate_proj` alone, prefixes, regexes).
#[test]
fn native_fp8_modules_to_not_convert_follow_transformers() {
    use quantppl::checkpoint::scheme::QuantConfig;
    let cases = cases_of("modules_to_not_convert_cases.json");
    let mut wrong = Vec::new();
    let mut checked = 0;
    for case in cases["cases"].as_array().expect("cases") {
        let (pattern, name) = (
            case["pattern"].as_str().unwrap(),
            case["name"].as_str().unwrap(),
        );
        let config = serde_json::json!({"quantization_config": {
            "quant_method": "fp8", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128], "modules_to_not_convert": [pattern]}});
        let q = QuantConfig::from_config(&config, std::path::Path::new("config.json"))
            .expect("config")
            .expect("quantized");
        if q.ignores(name) == case["convert"].as_bool().unwrap() {
            wrong.push(format!("{pattern:?} on {name:?}"));
        }
        checked += 1;
    }
    assert!(checked > 300, "{checked} cases");
    assert!(
        wrong.is_empty(),
        "read otherwise than transformers: {wrong:#?}"
    );
}
