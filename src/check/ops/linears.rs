//! Linear layers of every storage format: the dequantized weight bit for bit (through an
//! identity input, which returns `W^T` exactly: one nonzero product per output), the GEMM
//! against the CPU, and the declared activation fake quantization bit for bit.

use super::super::{CaseReport, compare, matrix};
use crate::Result;
use crate::backend::cpu::CpuBackend;
use crate::backend::lowering::{f16_split_scale, lower};
use crate::backend::{Backend, Device, GemmSplit, OutType};
use crate::check::gemm_split::{kept_activation, kept_weight};
use crate::checkpoint::gguf::GgmlType;
use crate::checkpoint::scheme::Strategy;
use crate::checkpoint::{Fp4Scale, GatedActivation, QLinear};
use crate::numerics::{ActQuant, FloatType};
use crate::rng::Rng;
use crate::synth::linear::{LinearSpec, WeightKind};

/// Every storage format, scale strategy and scale dtype, at sizes that are not multiples of
/// any tile (odd widths, groups that straddle words, a group as wide as the row), and every
/// ggml block type.
fn specs() -> Vec<LinearSpec> {
    use FloatType::{Bf16, F16, F32};
    let int = |bits, strategy, asym, g_idx| WeightKind::Int {
        bits,
        strategy,
        asym,
        g_idx,
        legacy: false,
    };
    let byte = |int8, strategy, asym| WeightKind::Byte {
        int8,
        strategy,
        asym,
    };
    let nvfp4 = |global_scale| WeightKind::Fp4(Fp4Scale::Nvfp4 { global_scale });
    // Every ggml block type the GPU backends read, in f32 models as GGUF files are read and in
    // bf16: the legacy 32-value blocks at odd widths, the 256-value super-blocks two a row.
    let model = |i: usize| if i.is_multiple_of(2) { F32 } else { Bf16 };
    let gguf =
        {
            use GgmlType::*;
            let legacy = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Iq4Nl, Mxfp4];
            let super_blocks = [
                Q2K, Q3K, Q4K, Q5K, Q6K, Iq4Xs, Iq2Xxs, Iq2Xs, Iq2S, Iq3Xxs, Iq3S, Iq1S, Iq1M,
                Tq1_0, Tq2_0,
            ];
            let legacy = legacy.into_iter().enumerate().map(move |(i, ty)| {
                LinearSpec::new(WeightKind::Gguf(ty), 19 + 2 * i, 96, model(i))
            });
            let super_blocks = super_blocks.into_iter().enumerate().map(move |(i, ty)| {
                LinearSpec::new(WeightKind::Gguf(ty), 13 + 2 * i, 512, model(i))
            });
            legacy.chain(super_blocks)
        };
    let mut specs = vec![
        LinearSpec::new(WeightKind::Dense(F32), 45, 72, F32),
        LinearSpec::new(WeightKind::Dense(Bf16), 130, 200, Bf16),
        LinearSpec::new(WeightKind::Dense(F16), 37, 53, Bf16),
        LinearSpec::new(WeightKind::Dense(Bf16), 77, 131, Bf16).with_bias(),
        LinearSpec::new(int(4, Strategy::Group(32), false, false), 40, 96, Bf16),
        LinearSpec::new(int(4, Strategy::Group(32), true, true), 24, 160, Bf16),
        LinearSpec::new(int(4, Strategy::Group(128), false, false), 72, 384, Bf16),
        LinearSpec::new(int(4, Strategy::Group(128), true, true), 33, 200, Bf16),
        LinearSpec::new(int(4, Strategy::Group(8), true, false), 37, 72, Bf16),
        LinearSpec::new(int(4, Strategy::Group(64), true, false), 70, 256, Bf16),
        LinearSpec::new(int(4, Strategy::Group(16), true, false), 40, 64, F32),
        LinearSpec::new(int(4, Strategy::Channel, false, false), 33, 172, F32),
        LinearSpec::new(int(4, Strategy::Channel, true, false), 9, 72, Bf16).with_scales(F16),
        LinearSpec::new(int(4, Strategy::Tensor, false, false), 5, 40, Bf16),
        LinearSpec::new(int(8, Strategy::Channel, false, false), 31, 100, Bf16),
        LinearSpec::new(int(8, Strategy::Channel, true, false), 45, 100, Bf16).with_scales(F16),
        LinearSpec::new(int(8, Strategy::Group(96), true, false), 17, 96, Bf16).with_scales(F32),
        LinearSpec::new(int(3, Strategy::Group(32), false, false), 21, 77, Bf16),
        LinearSpec::new(int(3, Strategy::Group(7), false, false), 50, 77, Bf16).with_scales(F32),
        LinearSpec::new(
            WeightKind::Int {
                bits: 3,
                strategy: Strategy::Channel,
                asym: false,
                g_idx: false,
                legacy: true,
            },
            13,
            45,
            F16,
        )
        .with_scales(Bf16),
        LinearSpec::new(nvfp4(3.7), 33, 64, Bf16),
        LinearSpec::new(nvfp4(1234.567), 67, 208, F16),
        LinearSpec::new(nvfp4(0.3), 20, 48, F32),
        LinearSpec::new(WeightKind::Fp4(Fp4Scale::E8m0), 24, 96, Bf16),
        LinearSpec::new(WeightKind::Fp4(Fp4Scale::E8m0), 40, 256, F32),
        LinearSpec::new(
            WeightKind::Fp4(Fp4Scale::ModelOpt { scale_2: 0.0123 }),
            33,
            64,
            Bf16,
        ),
        LinearSpec::new(nvfp4(3.7), 40, 96, Bf16).with_act_quant(ActQuant::Nvfp4 {
            global_scale: 448.0 * 6.0 / 4.5,
        }),
        LinearSpec::new(nvfp4(52.0), 64, 256, Bf16).with_act_quant(ActQuant::Nvfp4 {
            global_scale: 411.0,
        }),
        LinearSpec::new(byte(false, Strategy::Channel, false), 29, 80, Bf16),
        LinearSpec::new(byte(false, Strategy::Block(16, 32), false), 40, 100, Bf16)
            .with_scales(F32),
        LinearSpec::new(byte(false, Strategy::Channel, false), 50, 64, Bf16)
            .with_act_quant(ActQuant::Fp8PerToken),
        LinearSpec::new(byte(false, Strategy::Block(16, 32), false), 40, 100, Bf16)
            .with_scales(F32)
            .with_act_quant(ActQuant::Fp8PerTokenGroup { group: 32 }),
        LinearSpec::new(byte(false, Strategy::Group(32), false), 40, 128, Bf16)
            .with_act_quant(ActQuant::Mx { bits: 8 }),
        LinearSpec::new(WeightKind::Fp4(Fp4Scale::E8m0), 24, 96, Bf16)
            .with_act_quant(ActQuant::Mx { bits: 4 }),
        // DeepSeek-V4's FP4 experts: E2M1 under E8M0 scales, FP8 inputs per 32 under powers of two.
        LinearSpec::new(WeightKind::Fp4(Fp4Scale::E8m0), 24, 96, Bf16)
            .with_act_quant(ActQuant::Fp8Pow2Group { group: 32 }),
        LinearSpec::new(byte(true, Strategy::Tensor, true), 70, 99, Bf16).with_scales(F16),
        LinearSpec::new(byte(true, Strategy::Channel, true), 33, 70, Bf16),
        LinearSpec::new(byte(true, Strategy::Channel, true), 48, 160, Bf16)
            .with_act_quant(ActQuant::IntPerToken { bits: 8 }),
        LinearSpec::new(int(4, Strategy::Group(32), false, false), 40, 96, Bf16)
            .with_act_quant(ActQuant::IntPerToken { bits: 4 }),
        // W8A8 of widths the 8-bit tensor cores take (multiples of 16; bf16 precision runs
        // them there where the GPU has them): FP8 per channel and per tensor (static input
        // scale, a bias), INT8 per channel with 8- and 4-bit inputs.
        LinearSpec::new(byte(false, Strategy::Channel, false), 64, 128, Bf16)
            .with_act_quant(ActQuant::Fp8PerToken),
        LinearSpec::new(byte(false, Strategy::Tensor, false), 48, 96, Bf16)
            .with_act_quant(ActQuant::Fp8Static { scale: 0.0123 })
            .with_bias(),
        LinearSpec::new(byte(true, Strategy::Channel, false), 64, 160, Bf16)
            .with_act_quant(ActQuant::IntPerToken { bits: 8 }),
        LinearSpec::new(byte(true, Strategy::Channel, false), 32, 64, Bf16)
            .with_act_quant(ActQuant::IntPerToken { bits: 4 })
            .with_bias(),
        // FP8 with 128x128 weight blocks and 1x128 input groups (native FP8 checkpoints and
        // compressed-tensors' FP8_BLOCK): block-scaled FP8 tensor cores where the GPU has them.
        LinearSpec::new(
            byte(false, Strategy::Block(128, 128), false),
            256,
            384,
            Bf16,
        )
        .with_scales(F32)
        .with_act_quant(ActQuant::Fp8PerTokenGroup { group: 128 }),
        LinearSpec::new(
            byte(false, Strategy::Block(128, 128), false),
            128,
            256,
            Bf16,
        )
        .with_act_quant(ActQuant::Fp8Group { group: 128 })
        .with_bias(),
        // Inner dimensions past split-bf16's GEMM slice (4,096 values, cuda::SPLIT_SLICE):
        // sums over slices, the last one shorter, for bf16-valued and split weights.
        LinearSpec::new(WeightKind::Dense(Bf16), 24, 4200, Bf16),
        LinearSpec::new(int(4, Strategy::Group(32), false, false), 20, 4192, F32).with_scales(F32),
    ];
    specs.extend(gguf);
    specs
}

/// Which side of a product a value is: the weight (`f16_scale`: its layer's
/// `f16_split_scale`; `row_top`: the largest magnitude of its row), or an activation of a row
/// whose largest magnitude is `top`.
#[derive(Clone, Copy)]
enum Operand {
    Weight { f16_scale: f32, row_top: f32 },
    Activation { top: f32 },
}

/// What a GEMM against an identity returns for `v`, a value of the activation type: `v`, or
/// where the linear's f32 GEMM is split onto tensor cores (`Backend::linear_split`) what the
/// split keeps of it (the identity's parts are exact).
fn through_identity<B: Backend>(b: &B, split: Option<GemmSplit>, v: f32, of: Operand) -> f32 {
    match split.filter(|_| b.activation_type() == FloatType::F32) {
        None => v,
        Some(split) => match of {
            Operand::Weight { f16_scale, row_top } => kept_weight(split, v, f16_scale, row_top),
            Operand::Activation { top } => kept_activation(split, v, top),
        },
    }
}

/// The backend's dequantized weight, read through an identity input: `linear(I)` is `W^T`
/// rounded to the activation type (and split, see [`through_identity`]); and how it splits.
fn dequantized<B: Backend>(b: &B, w: &QLinear) -> Result<(Vec<f32>, Option<GemmSplit>)> {
    let n_in = w.in_features;
    let mut eye = vec![0f32; n_in * n_in];
    for i in 0..n_in {
        eye[i * n_in + i] = 1.0;
    }
    let plain = QLinear {
        bias: None,
        act_quant: None,
        ..*w
    };
    let eye = matrix(b, "identity", &eye, n_in, n_in)?;
    let linear = b.upload_linear(&plain)?;
    let yt = b.download(&b.linear(&eye, &linear)?)?;
    let out = w.out_features;
    let values = (0..out * n_in)
        .map(|i| yt[(i % n_in) * out + i / n_in])
        .collect();
    Ok((values, b.linear_split(&linear)))
}

/// The linear cases: per spec, the dequantized weight bit for bit and the GEMM against the
/// CPU; then the activation quantizers bit for bit.
pub(super) fn cases<B: Backend>(
    b: &B,
    rng: &mut Rng,
    rel: f64,
    out: &mut Vec<CaseReport>,
) -> Result<()> {
    let cpu = CpuBackend::new();
    let act = b.activation_type();
    for (i, spec) in specs().iter().enumerate() {
        let owned = spec.build(rng);
        let q = owned.qlinear();
        // The backend holds the weight in its activation type (GPU dequant into the GEMM's
        // operand type); the reference is the CPU's exact decode rounded the same way.
        let f16_scale = f16_split_scale(lower(&q)?.magnitude_bound());
        let (got_w, split) = dequantized(b, &q)?;
        let want_w: Vec<f32> = q
            .dequantize()?
            .chunks(q.in_features)
            .flat_map(|row| {
                let row: Vec<f32> = row.iter().map(|&v| act.round(v)).collect();
                let row_top = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                let of = Operand::Weight { f16_scale, row_top };
                row.into_iter()
                    .map(move |v| through_identity(b, split, v, of))
                    .collect::<Vec<_>>()
            })
            .collect();
        out.push(compare(
            "dequant",
            spec.describe(),
            &got_w,
            &want_w,
            0.0,
            false,
        ));

        let rows = [1, 37, 130][i % 3];
        // Inputs representable in the backend's activation type (what a GEMM multiplies); a
        // layer that quantizes its input gets it unrounded, as the forward pass hands it over
        // (`Backend::input_type`).
        let x: Vec<f32> = rng
            .normal_vec(rows * spec.in_features, 1.0)
            .into_iter()
            .map(|v| {
                if q.act_quant.is_some() {
                    v
                } else {
                    act.round(v)
                }
            })
            .collect();
        // The declared activation fake quantization runs in f32 as in the f32 reference, its
        // result rounded to the activation type: the expected value quantizes the input with
        // `apply_row`, rounds to the activation type, then multiplies in f32.
        let mut xq = x.clone();
        if let Some(aq) = q.act_quant {
            xq.chunks_mut(spec.in_features).for_each(|row| {
                aq.apply_row(row, FloatType::F32);
                row.iter_mut().for_each(|v| *v = act.round(*v));
            });
        }
        let plain = QLinear {
            act_quant: None,
            ..q
        };
        let n_in = spec.in_features;
        let xc = matrix(&cpu, "x", &xq, rows, n_in)?;
        let wc = cpu.upload_linear(&plain)?;
        let want = cpu.download(&cpu.linear(&xc, &wc)?)?;
        let xb = matrix(b, "x", &x, rows, n_in)?;
        let wb = b.upload_linear(&q)?;
        let got = b.download(&b.linear(&xb, &wb)?)?;
        // An f32 model's weight loses bits to bf16 on a bf16 path: the GEMM tolerance of
        // the activation type, no tighter.
        out.push(compare(
            "linear",
            format!("{} rows={rows}", spec.describe()),
            &got,
            &want,
            rel,
            true,
        ));

        // A gated MLP's activation and its down projection, which a backend may fuse (CUDA
        // under split GEMMs: the activation written straight as the GEMM's planes).
        if q.act_quant.is_none() {
            let operand = |rng: &mut Rng, scale| -> Vec<f32> {
                let v = rng.normal_vec(rows * n_in, scale);
                v.into_iter().map(|v| act.round(v)).collect()
            };
            let (gate, up) = (operand(rng, 2.0), operand(rng, 1.0));
            let (gc, uc) = (
                matrix(&cpu, "gate", &gate, rows, n_in)?,
                matrix(&cpu, "up", &up, rows, n_in)?,
            );
            let h = cpu.gated_act(&gc, Some(&uc), GatedActivation::Silu, OutType::F32)?;
            let h: Vec<f32> = cpu
                .download(&h)?
                .into_iter()
                .map(|v| act.round(v))
                .collect();
            let hc = matrix(&cpu, "h", &h, rows, n_in)?;
            let want = cpu.download(&cpu.linear(&hc, &wc)?)?;
            let (gb, ub) = (
                matrix(b, "gate", &gate, rows, n_in)?,
                matrix(b, "up", &up, rows, n_in)?,
            );
            let got = b.gated_linear(gb, Some(ub), GatedActivation::Silu, &wb)?;
            out.push(compare(
                "gated_linear",
                format!("{} rows={rows}", spec.describe()),
                &b.download(&got)?,
                &want,
                rel,
                true,
            ));
        }
    }
    check_act_quant(b, rng, out)
}

/// Activation fake quantization bit for bit: through an identity weight the linear returns
/// its quantized input exactly (split, see [`through_identity`]).
fn check_act_quant<B: Backend>(b: &B, rng: &mut Rng, out: &mut Vec<CaseReport>) -> Result<()> {
    let act = b.activation_type();
    let n = 96;
    let mut ident =
        LinearSpec::new(WeightKind::Dense(FloatType::Bf16), n, n, FloatType::Bf16).build(rng);
    let eye: Vec<f32> = (0..n * n)
        .map(|i| if i / n == i % n { 1.0 } else { 0.0 })
        .collect();
    ident.set_dense_weight(&eye);
    for aq in [
        ActQuant::Fp8PerToken,
        ActQuant::Fp8Static { scale: 0.0123 },
        ActQuant::IntPerToken { bits: 8 },
        ActQuant::IntPerToken { bits: 4 },
        ActQuant::Nvfp4 {
            global_scale: 597.3,
        },
        ActQuant::Fp8PerTokenGroup { group: 32 },
        ActQuant::Fp8PerTokenGroup { group: 128 },
        ActQuant::Fp8Group { group: 32 },
        ActQuant::Mx { bits: 4 },
        ActQuant::Mx { bits: 8 },
        ActQuant::Fp8Pow2Group { group: 32 },
    ] {
        let q = QLinear {
            act_quant: Some(aq),
            ..ident.qlinear()
        };
        let gw = b.upload_linear(&q)?;
        let split = b.linear_split(&gw);
        let rows = 23;
        let mut x: Vec<f32> = rng
            .normal_vec(rows * n, 3.0)
            .into_iter()
            .map(|v| act.round(v))
            .collect();
        // A zero and a whole zero row (zero scales).
        x[5] = 0.0;
        x[n..2 * n].iter_mut().for_each(|v| *v = 0.0);
        // The same values in the activation type, and unrounded f32 values as the forward
        // pass hands them to a quantizing linear (`Backend::input_type`).
        let x32: Vec<f32> = x
            .iter()
            .map(|v| v * (1.0 + 1e-3 * rng.symmetric()))
            .collect();
        for (input, xs) in [("", &x), (" f32 input", &x32)] {
            let got = b.download(&b.linear(&matrix(b, "x", xs, rows, n)?, &gw)?)?;
            let mut want = xs.clone();
            want.chunks_mut(n).for_each(|r| {
                aq.apply_row(r, FloatType::F32);
                let top = r.iter().fold(0f32, |m, v| m.max(v.abs()));
                let of = Operand::Activation { top };
                r.iter_mut()
                    .for_each(|v| *v = through_identity(b, split, act.round(*v), of));
            });
            out.push(compare(
                "act_quant",
                format!("{aq:?}{input} rows={rows} n={n}"),
                &got,
                &want,
                0.0,
                false,
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f16 split of wgpu's cooperative-matrix matmuls rests on two facts about every
    /// format: the lowering's magnitude bound holds every dequantized weight (scaled by
    /// `f16_split_scale` it stays far below f16's 65504), and where the lowering says the
    /// values are bf16 or f16 ones, each keeps at most f16's 11 significant bits (its residual
    /// is zero, so the split GEMM skips that product).
    #[test]
    fn magnitude_bounds_and_sixteen_bit_values_hold_for_every_format() {
        let mut rng = Rng::new(11);
        for spec in specs() {
            let owned = spec.build(&mut rng);
            let q = owned.qlinear();
            let lowered = lower(&q).unwrap();
            let bound = lowered.magnitude_bound();
            let values = q.dequantize().unwrap();
            let top = values.iter().fold(0f32, |m, v| m.max(v.abs()));
            // The model-dtype rounding may lift the largest weight by less than 2^-7.
            assert!(
                top <= bound * (1.0 + 1.0 / 128.0),
                "{}: largest weight {top} above the bound {bound}",
                spec.describe()
            );
            assert!(
                top * f16_split_scale(bound) < 32768.0,
                "{}",
                spec.describe()
            );
            if lowered.sixteen_bit_values(q.model_dtype) {
                let wide = values
                    .iter()
                    .find(|v| f32::from_bits(v.to_bits() & 0xffff_e000) != **v);
                assert!(wide.is_none(), "{}: {wide:?}", spec.describe());
            }
            // The floor holds every nonzero weight (the model-dtype rounding may lower one by
            // less than 2^-7), and CUDA's split_gemm.cu takes a bf16-valued weight as f16 only
            // where every value survives its scale exactly.
            let floor = lowered.magnitude_floor();
            let below = values
                .iter()
                .find(|v| **v != 0.0 && v.abs() < floor * (1.0 - 1.0 / 128.0));
            assert!(
                below.is_none(),
                "{}: {below:?} under {floor}",
                spec.describe()
            );
            if let Some(scale) = lowered.f16_exact_scale()
                && lowered.sixteen_bit_values(q.model_dtype)
            {
                let inexact = values
                    .iter()
                    .find(|v| FloatType::F16.round(**v * scale) != **v * scale);
                assert!(inexact.is_none(), "{}: {inexact:?}", spec.describe());
            }
        }
        // The guard is exercised: the MX spec's E8M0 scales span more than f16 holds.
        assert!(specs().iter().any(|spec| {
            let owned = spec.build(&mut rng);
            lower(&owned.qlinear()).unwrap().f16_exact_scale().is_none()
        }));
    }
}
