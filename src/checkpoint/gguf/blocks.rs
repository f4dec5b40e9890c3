//! ggml's tensor types: each type's block (values and bytes, `ggml.c`'s type traits) and the
//! reference decode of the types quantppl evaluates, written from `ggml-quants.c`'s
//! `dequantize_row_*` with its f32 arithmetic in the same order (a scale times a code, then a
//! minimum subtracted or added), which is also gguf-py's (`gguf.quants`) that transformers
//! dequantizes GGUF files with.

use half::{bf16, f16};

/// A ggml tensor type by its id in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Iq4Nl,
    Iq4Xs,
    Mxfp4,
    Iq2Xxs,
    Iq2Xs,
    Iq2S,
    Iq3Xxs,
    Iq3S,
    Iq1S,
    Iq1M,
    Tq1_0,
    Tq2_0,
    /// A type whose layout is known but which quantppl does not decode (Q8_1,
    /// Q8_K, integers, F64): its id, name, and block (values, bytes).
    Other(u32, &'static str, usize, usize),
}

/// Values of a k-quant super-block.
const QK_K: usize = 256;

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            10 => Q2K,
            11 => Q3K,
            12 => Q4K,
            13 => Q5K,
            14 => Q6K,
            30 => Bf16,
            9 => Other(9, "Q8_1", 32, 36),
            15 => Other(15, "Q8_K", 256, 292),
            16 => Iq2Xxs,
            17 => Iq2Xs,
            18 => Iq3Xxs,
            19 => Iq1S,
            20 => Iq4Nl,
            21 => Iq3S,
            22 => Iq2S,
            23 => Iq4Xs,
            24 => Other(24, "I8", 1, 1),
            25 => Other(25, "I16", 1, 2),
            26 => Other(26, "I32", 1, 4),
            27 => Other(27, "I64", 1, 8),
            28 => Other(28, "F64", 1, 8),
            29 => Iq1M,
            34 => Tq1_0,
            35 => Tq2_0,
            39 => Mxfp4,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Bf16 => "BF16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q2K => "Q2_K",
            Q3K => "Q3_K",
            Q4K => "Q4_K",
            Q5K => "Q5_K",
            Q6K => "Q6_K",
            Iq4Nl => "IQ4_NL",
            Iq4Xs => "IQ4_XS",
            Mxfp4 => "MXFP4",
            Iq2Xxs => "IQ2_XXS",
            Iq2Xs => "IQ2_XS",
            Iq2S => "IQ2_S",
            Iq3Xxs => "IQ3_XXS",
            Iq3S => "IQ3_S",
            Iq1S => "IQ1_S",
            Iq1M => "IQ1_M",
            Tq1_0 => "TQ1_0",
            Tq2_0 => "TQ2_0",
            Other(_, name, ..) => name,
        }
    }

    /// Values and bytes of one block.
    pub fn block(self) -> (usize, usize) {
        use GgmlType::*;
        match self {
            F32 => (1, 4),
            F16 | Bf16 => (1, 2),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q2K => (QK_K, 84),
            Q3K => (QK_K, 110),
            Q4K => (QK_K, 144),
            Q5K => (QK_K, 176),
            Q6K => (QK_K, 210),
            Iq4Nl => (32, 18),
            Iq4Xs => (QK_K, 136),
            Mxfp4 => (32, 17),
            Iq2Xxs => (QK_K, 66),
            Iq2Xs => (QK_K, 74),
            Iq2S => (QK_K, 82),
            Iq3Xxs => (QK_K, 98),
            Iq3S => (QK_K, 110),
            Iq1S => (QK_K, 50),
            Iq1M => (QK_K, 56),
            Tq1_0 => (QK_K, 54),
            Tq2_0 => (QK_K, 66),
            Other(_, _, values, bytes) => (values, bytes),
        }
    }

    pub fn block_values(self) -> usize {
        self.block().0
    }

    /// Bytes of a tensor of `dims` (ggml order, rows of `dims[0]` values); None when a row is
    /// not whole blocks or the size overflows.
    pub fn bytes_of(self, dims: &[usize]) -> Option<usize> {
        let (values, bytes) = self.block();
        let (&row, rest) = dims.split_first()?;
        if row % values != 0 {
            return None;
        }
        rest.iter()
            .try_fold((row / values).checked_mul(bytes)?, |n, &d| n.checked_mul(d))
    }

    /// Whether the values are stored as plain floats (safetensors' F32, F16, BF16).
    pub fn is_float(self) -> bool {
        matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16)
    }

    /// Decodes whole blocks `bytes` into `out` (as many values as the blocks hold); false for
    /// a type quantppl does not decode.
    pub fn decode(self, bytes: &[u8], out: &mut [f32]) -> bool {
        let (values, size) = self.block();
        debug_assert_eq!(bytes.len() / size * values, out.len());
        let decode: fn(&[u8], &mut [f32]) = match self {
            GgmlType::F32 => |b, y| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            GgmlType::F16 => |b, y| y[0] = half_at(b, 0),
            GgmlType::Bf16 => |b, y| y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
            GgmlType::Q4_0 => q4_0,
            GgmlType::Q4_1 => q4_1,
            GgmlType::Q5_0 => q5_0,
            GgmlType::Q5_1 => q5_1,
            GgmlType::Q8_0 => q8_0,
            GgmlType::Q2K => q2_k,
            GgmlType::Q3K => q3_k,
            GgmlType::Q4K => q4_k,
            GgmlType::Q5K => q5_k,
            GgmlType::Q6K => q6_k,
            GgmlType::Iq4Nl => iq4_nl,
            GgmlType::Iq4Xs => iq4_xs,
            GgmlType::Mxfp4 => mxfp4,
            GgmlType::Tq1_0 => |b, y| ternary(GgmlType::Tq1_0, b, y),
            GgmlType::Tq2_0 => |b, y| ternary(GgmlType::Tq2_0, b, y),
            GgmlType::Iq2Xxs
            | GgmlType::Iq2Xs
            | GgmlType::Iq2S
            | GgmlType::Iq3Xxs
            | GgmlType::Iq3S
            | GgmlType::Iq1S
            | GgmlType::Iq1M => {
                let mut block = GridBlock::default();
                for (b, y) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(values)) {
                    block.split(self, b);
                    block.decode(self, y);
                }
                return true;
            }
            GgmlType::Other(..) => return false,
        };
        for (b, y) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(values)) {
            decode(b, y);
        }
        true
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The f16 at byte `at`, widened.
fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Low nibbles are values 0..16 of a 32-value block, high nibbles 16..32.
fn nibbles(qs: &[u8], y: &mut [f32], value: impl Fn(usize, u8) -> f32) {
    for j in 0..16 {
        y[j] = value(j, qs[j] & 0xF);
        y[j + 16] = value(j + 16, qs[j] >> 4);
    }
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    nibbles(&b[2..18], y, |_, q| (q as i32 - 8) as f32 * d);
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    nibbles(&b[4..20], y, |_, q| q as f32 * d + m);
}

/// Q5's fifth bits: bit `j` of the little-endian word for value `j`.
fn fifth_bits(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let qh = fifth_bits(&b[2..6]);
    nibbles(&b[6..22], y, |j, q| {
        ((q as u32 | ((qh >> j) & 1) << 4) as i32 - 16) as f32 * d
    });
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qh = fifth_bits(&b[4..8]);
    nibbles(&b[8..24], y, |j, q| {
        (q as u32 | ((qh >> j) & 1) << 4) as f32 * d + m
    });
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[2..34]) {
        *v = q as i8 as f32 * d;
    }
}

fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (half_at(b, 80), half_at(b, 82));
    let mut is = 0;
    for n in 0..2 {
        let q = &qs[32 * n..32 * n + 32];
        for j in 0..4 {
            let shift = 2 * j;
            for half in 0..2 {
                let sc = scales[is];
                is += 1;
                let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
                let base = 128 * n + 32 * j + 16 * half;
                for l in 0..16 {
                    y[base + l] = dl * ((q[16 * half + l] >> shift) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// Q3_K's 16 signed scales from their 12 bytes: six bits each, the low nibbles in bytes 0..8,
/// the top two bits in bytes 8..12, less 32.
pub fn q3_k_scales(packed: &[u8]) -> [i32; 16] {
    std::array::from_fn(|i| {
        let low = if i < 8 {
            packed[i] & 0xF
        } else {
            packed[i - 8] >> 4
        };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        (low | high << 4) as i32 - 32
    })
}

fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs) = (&b[0..32], &b[32..96]);
    let d = half_at(b, 108);
    let scales = q3_k_scales(&b[96..108]);
    let mut is = 0;
    let mut bit = 0;
    for n in 0..2 {
        let q = &qs[32 * n..32 * n + 32];
        for j in 0..4 {
            let shift = 2 * j;
            for half in 0..2 {
                let dl = d * scales[is] as f32;
                is += 1;
                let base = 128 * n + 32 * j + 16 * half;
                for l in 0..16 {
                    let low = ((q[16 * half + l] >> shift) & 3) as i32;
                    let high = if (hmask[16 * half + l] >> bit) & 1 == 1 {
                        0
                    } else {
                        4
                    };
                    y[base + l] = dl * (low - high) as f32;
                }
            }
            bit += 1;
        }
    }
}

/// Scale and minimum `j` (of 8) of a Q4_K / Q5_K super-block: six bits each in 12 bytes.
pub fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    };
    (sc as f32, m as f32)
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for c in 0..4 {
        let q = &qs[32 * c..32 * c + 32];
        for (part, shift) in [(0, 0), (1, 4)] {
            let (sc, m) = scale_min_k4(2 * c + part, scales);
            let (d1, m1) = (d * sc, dmin * m);
            for l in 0..32 {
                y[64 * c + 32 * part + l] = d1 * ((q[l] >> shift) & 0xF) as f32 - m1;
            }
        }
    }
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for c in 0..4 {
        let q = &qs[32 * c..32 * c + 32];
        for (part, shift) in [(0, 0), (1, 4)] {
            let (sc, m) = scale_min_k4(2 * c + part, scales);
            let (d1, m1) = (d * sc, dmin * m);
            let bit = 2 * c + part;
            for l in 0..32 {
                let q5 = ((q[l] >> shift) & 0xF) | ((qh[l] >> bit) & 1) << 4;
                y[64 * c + 32 * part + l] = d1 * q5 as f32 - m1;
            }
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half_at(b, 208);
    for n in 0..2 {
        let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &scales[8 * n..]);
        for l in 0..32 {
            let is = l / 16;
            let q = [
                (ql[l] & 0xF) | (qh[l] & 3) << 4,
                (ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4,
                (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4,
                (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4,
            ];
            for (k, q) in q.into_iter().enumerate() {
                let s = d * sc[is + 2 * k] as i8 as f32;
                y[128 * n + 32 * k + l] = s * (q as i32 - 32) as f32;
            }
        }
    }
}

/// IQ4_NL's and IQ4_XS's 16 levels (`kvalues_iq4nl`), indexed by the 4-bit code.
pub const IQ4_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

fn iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    nibbles(&b[2..18], y, |_, q| d * IQ4_LEVELS[q as usize] as f32);
}

/// IQ4_XS's eight 6-bit sub-block scales, less 32: low nibbles in 4 bytes, top bits in a
/// 16-bit word.
pub fn iq4_xs_scales(b: &[u8]) -> [i32; 8] {
    let high = u16::from_le_bytes([b[2], b[3]]);
    std::array::from_fn(|i| {
        let low = (b[4 + i / 2] >> (4 * (i % 2))) & 0xF;
        (low as i32 | (((high >> (2 * i)) & 3) as i32) << 4) - 32
    })
}

fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (i, ls) in iq4_xs_scales(b).into_iter().enumerate() {
        let dl = d * ls as f32;
        let qs = &b[8 + 16 * i..24 + 16 * i];
        nibbles(qs, &mut y[32 * i..32 * i + 32], |_, q| {
            dl * IQ4_LEVELS[q as usize] as f32
        });
    }
}

/// Half of E8M0 byte `e`'s power of two, `2^(e - 128)` (`GGML_E8M0_TO_FP32_HALF`): finite for
/// every byte, 255 included, and subnormal below 2.
fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits((e as u32 - 1) << 23)
    }
}

/// MXFP4's levels, twice E2M1's values (`kvalues_mxfp4`), indexed by the 4-bit code.
const MXFP4_LEVELS: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// MXFP4's value of `code` under E8M0 byte `e`, in f32 as ggml computes it.
pub fn mxfp4_value(e: u8, code: u8) -> f32 {
    MXFP4_LEVELS[code as usize] as f32 * e8m0_half(e)
}

fn mxfp4(b: &[u8], y: &mut [f32]) {
    nibbles(&b[1..17], y, |_, q| mxfp4_value(b[0], q));
}

/// The ternary types' weights less their scale: TQ1_0's base-3 digits (-1..=1), five a byte
/// (digit k of byte b is the top of `3 * (b * 3^k mod 256)`, as ggml extracts them: 32 bytes
/// for weights 0..160, 16 for 160..240, 4 for 240..256, four digits each), TQ2_0's 2-bit
/// codes less one (-1..=2).
pub fn ternary_codes(ty: GgmlType, b: &[u8], out: &mut [i8; QK_K]) {
    let digit = |byte: u8, k: u32| ((byte.wrapping_mul(3u8.pow(k)) as u16 * 3) >> 8) as i8 - 1;
    if ty == GgmlType::Tq2_0 {
        for (e, q) in out.iter_mut().enumerate() {
            let (c, k, j) = (e / 128, e % 128 / 32, e % 32);
            *q = ((b[32 * c + j] >> (2 * k)) & 3) as i8 - 1;
        }
        return;
    }
    // (first weight, first byte, bytes, digits a byte)
    for (start, at, n, digits) in [(0, 0, 32, 5), (160, 32, 16, 5), (240, 48, 4, 4)] {
        for k in 0..digits {
            for j in 0..n {
                out[start + n * k + j] = digit(b[at + j], k as u32);
            }
        }
    }
}

/// Byte offset of a ternary type's f16 scale, after its codes.
pub fn ternary_scale_at(ty: GgmlType) -> usize {
    if ty == GgmlType::Tq1_0 { 52 } else { 64 }
}

fn ternary(ty: GgmlType, b: &[u8], y: &mut [f32]) {
    let d = half_at(b, ternary_scale_at(ty));
    let mut codes = [0i8; QK_K];
    ternary_codes(ty, b, &mut codes);
    for (v, &q) in y.iter_mut().zip(&codes) {
        *v = d * q as f32;
    }
}

/// The signs of eight weights from 7 bits: the eighth makes their number even
/// (`ksigns_iq2xs`); bit j set negates weight j.
fn even_signs(seven: u32) -> u8 {
    let s = (seven & 0x7F) as u8;
    s | (((s.count_ones() & 1) as u8) << 7)
}

/// Each grid type's levels as signed codes: IQ2's magnitudes 8, 25, 43 and IQ3's eight, each
/// negated below them (code `n - 1 - m` for magnitude `m` negative, `n + m` positive, `n`
/// magnitudes); IQ1's -1, 0, 1 (codes 0..3) with no sign.
pub fn grid_levels(ty: GgmlType) -> &'static [i8; 16] {
    const IQ2: [i8; 16] = [-43, -25, -8, 8, 25, 43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    const IQ3_XXS: [i8; 16] = [
        -62, -52, -44, -36, -28, -20, -12, -4, 4, 12, 20, 28, 36, 44, 52, 62,
    ];
    const IQ3_S: [i8; 16] = [-15, -13, -11, -9, -7, -5, -3, -1, 1, 3, 5, 7, 9, 11, 13, 15];
    const IQ1: [i8; 16] = [-1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    match ty {
        GgmlType::Iq3Xxs => &IQ3_XXS,
        GgmlType::Iq3S => &IQ3_S,
        GgmlType::Iq1S | GgmlType::Iq1M => &IQ1,
        _ => &IQ2,
    }
}

/// Weights sharing one scale (and, for IQ1, one shift of the levels) in a grid type's block.
pub fn grid_group(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Iq2Xs | GgmlType::Iq2S => 16,
        GgmlType::Iq1M => 8,
        _ => 32,
    }
}

/// A block of a grid type (IQ1, IQ2, IQ3) as `ggml-quants.c` lays it out: weight `e` is
/// `scales[g] * levels[codes[e]]` (IQ2, IQ3: `db * grid * sign`, the product exact), or
/// `scales[g] * (levels[codes[e]] + deltas[g])` (IQ1: `dl * (grid + delta)`), `g = e / group`.
pub struct GridBlock {
    pub codes: [u8; QK_K],
    pub scales: [f32; 32],
    pub deltas: [f32; 32],
}

impl Default for GridBlock {
    fn default() -> Self {
        Self {
            codes: [0; QK_K],
            scales: [0.0; 32],
            deltas: [0.0; 32],
        }
    }
}

impl GridBlock {
    /// Reads block `b` of `ty` (one of the grid types).
    pub fn split(&mut self, ty: GgmlType, b: &[u8]) {
        use super::iq_grids::*;
        let u16_at = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as u32;
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let codes = &mut self.codes;
        // Grid entry `index` of `grid` (`width` level indices a row) at weights `at..`, the
        // weights whose bit is set in `signs` negated (IQ2, IQ3: `n` magnitudes).
        let mut entry = |grid: &[u8], width: usize, index: u32, at: usize, signs: u8, n: u8| {
            let row = &grid[width * index as usize..width * (index as usize + 1)];
            for (j, &c) in row.iter().enumerate() {
                let m = c - b'0';
                let negative = signs >> ((at + j) % 8) & 1 == 1;
                codes[at + j] = if n == 0 {
                    m
                } else if negative {
                    n - 1 - m
                } else {
                    n + m
                };
            }
        };
        let d = half_at(b, 0);
        match ty {
            GgmlType::Iq2Xxs | GgmlType::Iq3Xxs => {
                // Per 32 weights a u32 of four 7-bit sign groups and a 4-bit scale; IQ2 keeps
                // four 8-weight grid indices in the u32 before, IQ3 eight 4-weight indices in
                // the grid bytes ahead of all the sign words.
                let iq2 = ty == GgmlType::Iq2Xxs;
                for ib in 0..8 {
                    let aux = if iq2 {
                        u32_at(2 + 8 * ib + 4)
                    } else {
                        u32_at(66 + 4 * ib)
                    };
                    let ls = (aux >> 28) as f32;
                    self.scales[ib] = if iq2 {
                        d * (0.5 + ls) * 0.25
                    } else {
                        d * (0.5 + ls) * 0.5
                    };
                    for l in 0..4 {
                        let signs = even_signs(aux >> (7 * l));
                        let at = 32 * ib + 8 * l;
                        if iq2 {
                            entry(IQ2XXS, 8, b[2 + 8 * ib + l] as u32, at, signs, 3);
                        } else {
                            let q = 2 + 8 * ib + 2 * l;
                            entry(IQ3XXS, 4, b[q] as u32, at, signs, 8);
                            entry(IQ3XXS, 4, b[q + 1] as u32, at + 4, signs, 8);
                        }
                    }
                }
            }
            GgmlType::Iq2Xs => {
                // 32 u16s: a 9-bit grid index and 7 sign bits for 8 weights; 4-bit scales
                // per 16 weights after them.
                for i in 0..32 {
                    let q = u16_at(2 + 2 * i);
                    entry(IQ2XS, 8, q & 511, 8 * i, even_signs(q >> 9), 3);
                }
                for g in 0..16 {
                    let ls = ((b[66 + g / 2] >> (4 * (g % 2))) & 0xF) as f32;
                    self.scales[g] = d * (0.5 + ls) * 0.25;
                }
            }
            GgmlType::Iq2S => {
                // 32 low index bytes, 32 sign bytes, the indices' top 2 bits four a byte,
                // 4-bit scales per 16 weights.
                for i in 0..32 {
                    let high = (b[66 + i / 4] as u32 >> (2 * (i % 4))) & 3;
                    entry(IQ2S, 8, b[2 + i] as u32 | high << 8, 8 * i, b[34 + i], 3);
                }
                for g in 0..16 {
                    let ls = ((b[74 + g / 2] >> (4 * (g % 2))) & 0xF) as f32;
                    self.scales[g] = d * (0.5 + ls) * 0.25;
                }
            }
            GgmlType::Iq3S => {
                // 64 low index bytes (4 weights each), their top bits eight a byte, 32 sign
                // bytes (8 weights each), 4-bit scales per 32 weights (`d * (1 + 2 s)`).
                for k in 0..64 {
                    let high = (b[66 + k / 8] as u32 >> (k % 8)) & 1;
                    let signs = b[74 + k / 2];
                    entry(IQ3S, 4, b[2 + k] as u32 | high << 8, 4 * k, signs, 8);
                }
                for g in 0..8 {
                    let s = ((b[106 + g / 2] >> (4 * (g % 2))) & 0xF) as f32;
                    self.scales[g] = d * (1.0 + 2.0 * s);
                }
            }
            GgmlType::Iq1S => {
                // 32 low index bytes; per 32 weights a u16 of four 3-bit index tops, a 3-bit
                // scale (`d * (2 s + 1)`) and the shift's sign.
                for ib in 0..8 {
                    let qh = u16_at(34 + 2 * ib);
                    self.scales[ib] = d * (2 * ((qh >> 12) & 7) + 1) as f32;
                    self.deltas[ib] = if qh & 0x8000 == 0 { 0.125 } else { -0.125 };
                    for l in 0..4 {
                        let index = b[2 + 4 * ib + l] as u32 | ((qh >> (3 * l)) & 7) << 8;
                        entry(IQ1S, 8, index, 32 * ib + 8 * l, 0, 0);
                    }
                }
            }
            GgmlType::Iq1M => {
                // 32 low index bytes; a nibble per 8 weights (3 index bits, the shift's sign);
                // four u16s of 3-bit scales per 16 weights, the f16 scale in their top nibbles.
                let words: [u32; 4] = std::array::from_fn(|k| u16_at(48 + 2 * k));
                let bits = words
                    .iter()
                    .enumerate()
                    .fold(0u16, |a, (k, w)| a | ((w >> 12) << (4 * k)) as u16);
                let d = f16::from_bits(bits).to_f32();
                for i in 0..32 {
                    let nibble = (b[32 + i / 2] as u32 >> (4 * (i % 2))) & 0xF;
                    entry(IQ1S, 8, b[i] as u32 | (nibble & 7) << 8, 8 * i, 0, 0);
                    let c = i / 2;
                    let s = (words[c / 4] >> (3 * (c % 4))) & 7;
                    self.scales[i] = d * (2 * s + 1) as f32;
                    self.deltas[i] = if nibble & 8 == 0 { 0.125 } else { -0.125 };
                }
            }
            _ => unreachable!("{ty} is not a grid type"),
        }
    }

    /// The block's weights, in ggml's arithmetic.
    fn decode(&self, ty: GgmlType, y: &mut [f32]) {
        let (levels, group) = (grid_levels(ty), grid_group(ty));
        let shifted = matches!(ty, GgmlType::Iq1S | GgmlType::Iq1M);
        for (e, v) in y.iter_mut().enumerate() {
            let (s, level) = (
                self.scales[e / group],
                levels[self.codes[e] as usize] as f32,
            );
            *v = if shifted {
                s * (level + self.deltas[e / group])
            } else {
                s * level
            };
        }
    }
}

/// The cases of `tests/fixtures/gguf_blocks.json` (gguf-py's `dequantize` of blocks with
/// hard values): `(type, block bytes, the expected values)` for each type.
#[cfg(test)]
pub(crate) fn reference_blocks() -> Vec<(GgmlType, Vec<u8>, Vec<f32>)> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf_blocks.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    };
    json["types"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, case)| {
            let ty = (0..64)
                .filter_map(GgmlType::from_id)
                .find(|t| t.name() == name)
                .unwrap_or_else(|| panic!("type {name}"));
            let values = hex(case["values_f32_le"].as_str().unwrap())
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (ty, hex(case["blocks"].as_str().unwrap()), values)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every decoded type against gguf-py's `dequantize` of the same blocks, bit for bit:
    /// zero, the largest and subnormal f16 scales, every code.
    #[test]
    fn decodes_as_gguf_py_bit_for_bit() {
        let cases = reference_blocks();
        assert_eq!(cases.len(), 24);
        for (ty, blocks, want) in cases {
            let mut got = vec![f32::NAN; want.len()];
            assert!(ty.decode(&blocks, &mut got), "{ty}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{ty} value {i}: {g} against {w}");
            }
        }
    }

    #[test]
    fn sizes_follow_ggml() {
        assert_eq!(
            GgmlType::Q4K.bytes_of(&[4096, 11008]),
            Some(4096 / 256 * 144 * 11008)
        );
        assert_eq!(GgmlType::Q8_0.bytes_of(&[33]), None);
        assert_eq!(GgmlType::F32.bytes_of(&[usize::MAX, 2]), None);
        assert!(GgmlType::from_id(99).is_none());
        assert!(
            !GgmlType::from_id(15)
                .unwrap()
                .decode(&[0; 292], &mut [0.0; 256])
        );
    }
}
