//! The CUDA backend against the CPU reference: every op on random awkward sizes, the
//! dequantization of every packing bit for bit, every fixture's per-token NLL against its
//! reference.json, and (with QUANTPPL_BENCH=1) the speed of a realistic layer. On a machine
//! without NVIDIA each test prints "CUDA not available: ..." and returns.

mod common;

use std::time::Instant;

use quantppl::backend::cpu::CpuBackend;
use quantppl::backend::cuda::{CudaBackend, cuda_available};
use quantppl::backend::{AttnShape, Backend, OutType, SeqLayout};
use quantppl::checkpoint::scheme::Strategy;
use quantppl::checkpoint::{Packing, QLinear, TensorRef, ZeroPoint};
use quantppl::cli::check::check_model;
use quantppl::numerics::{ActQuant, FloatType};
use safetensors::Dtype;

fn backend(act: FloatType) -> Option<CudaBackend> {
    match cuda_available() {
        Err(why) => {
            println!("{why}");
            None
        }
        Ok(info) => {
            println!("device: {info:?}, {act:?} activations");
            Some(CudaBackend::with_activation_type(0, act).expect("CUDA backend"))
        }
    }
}

/// xorshift64*: fixed-seed random inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// bf16-representable values of scale `s` (what the GPU activations hold).
    fn bf16s(&mut self, n: usize, s: f32) -> Vec<f32> {
        (0..n)
            .map(|_| FloatType::Bf16.round(self.unit() * s))
            .collect()
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// ||a - b|| / ||b||.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes())
        .collect()
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes())
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Owned bytes and shapes of one synthetic quantized linear; `qlinear` borrows them.
struct Synth {
    out: usize,
    n_in: usize,
    kind: Kind,
    weight: (Dtype, Vec<usize>, Vec<u8>),
    scale: (Dtype, Vec<usize>, Vec<u8>),
    zero: Option<(Dtype, Vec<usize>, Vec<u8>)>,
    g_idx: Option<Vec<u8>>,
    bias: Option<Vec<u8>>,
    act_quant: Option<ActQuant>,
    model_dtype: FloatType,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Dense,
    Int { bits: u32, strategy: Strategy },
    Nvfp4 { global_scale: f32 },
    Unpacked { strategy: Strategy },
}

fn tref<'a>(name: &'a str, t: &'a (Dtype, Vec<usize>, Vec<u8>)) -> TensorRef<'a> {
    TensorRef {
        name,
        dtype: t.0,
        shape: &t.1,
        bytes: &t.2,
    }
}

impl Synth {
    fn qlinear(&self) -> QLinear<'_> {
        let weight = tref("w.weight", &self.weight);
        let scale = tref("w.weight_scale", &self.scale);
        let packing = match self.kind {
            Kind::Dense => Packing::Dense { weight },
            Kind::Int { bits, strategy } => Packing::PackedInt {
                bits,
                packed: weight,
                words_per_row: self.weight.1[1],
                legacy_codes_per_word: None,
                scale,
                zero_point: self
                    .zero
                    .as_ref()
                    .map(|z| ZeroPoint::PackedAlongOut(tref("w.weight_zero_point", z))),
                strategy,
                g_idx: self.g_idx.as_ref().map(|g| TensorRef {
                    name: "w.weight_g_idx",
                    dtype: Dtype::I32,
                    shape: std::slice::from_ref(&self.n_in),
                    bytes: g,
                }),
            },
            Kind::Nvfp4 { global_scale } => Packing::Nvfp4 {
                packed: weight,
                scale,
                global_scale,
            },
            Kind::Unpacked { strategy } => Packing::Unpacked {
                weight,
                scale,
                zero_point: self.zero.as_ref().map(|z| tref("w.weight_zero_point", z)),
                strategy,
            },
        };
        QLinear {
            name: "w",
            out_features: self.out,
            in_features: self.n_in,
            packing,
            bias: self.bias.as_ref().map(|b| TensorRef {
                name: "w.bias",
                dtype: Dtype::F32,
                shape: std::slice::from_ref(&self.out),
                bytes: b,
            }),
            act_quant: self.act_quant,
            model_dtype: self.model_dtype,
        }
    }
}

fn scales(rng: &mut Rng, n: usize, dt: Dtype) -> Vec<u8> {
    let v: Vec<f32> = (0..n).map(|_| 0.004 + 0.01 * rng.unit().abs()).collect();
    match dt {
        Dtype::BF16 => bf16_bytes(&v),
        Dtype::F16 => f16_bytes(&v),
        _ => f32_bytes(&v),
    }
}

fn scale_count(s: Strategy, out: usize, n_in: usize) -> (Vec<usize>, usize) {
    match s {
        Strategy::Tensor | Strategy::Token => (vec![1], 1),
        Strategy::Channel => (vec![out, 1], out),
        Strategy::Group(g) | Strategy::TensorGroup(g) => {
            (vec![out, n_in.div_ceil(g)], out * n_in.div_ceil(g))
        }
        Strategy::Block(a, b) => (
            vec![out.div_ceil(a), n_in.div_ceil(b)],
            out.div_ceil(a) * n_in.div_ceil(b),
        ),
    }
}

#[allow(clippy::too_many_arguments)]
fn synth(
    rng: &mut Rng,
    kind: Kind,
    out: usize,
    n_in: usize,
    scale_dt: Dtype,
    asym: bool,
    g_idx: bool,
    bias: bool,
) -> Synth {
    let (weight, scale, zero) = match kind {
        Kind::Dense => {
            let w = rng.bf16s(out * n_in, 0.05);
            (
                (Dtype::BF16, vec![out, n_in], bf16_bytes(&w)),
                (Dtype::BF16, vec![1], bf16_bytes(&[1.0])),
                None,
            )
        }
        Kind::Int { bits, strategy } => {
            let wpr = (n_in * bits as usize).div_ceil(32);
            let mut words = vec![0u32; out * wpr];
            for r in 0..out {
                for c in 0..n_in {
                    let code = rng.below(1 << bits) as u32;
                    let bit = c * bits as usize;
                    words[r * wpr + bit / 32] |= code << (bit % 32);
                    if bit % 32 + bits as usize > 32 {
                        words[r * wpr + bit / 32 + 1] |= code >> (32 - bit % 32);
                    }
                }
            }
            let (shape, n) = scale_count(strategy, out, n_in);
            let zero = asym.then(|| {
                let groups = shape.get(1).copied().unwrap_or(1);
                let per = (32 / bits) as usize;
                let mut z = vec![0u32; out.div_ceil(per) * groups];
                for r in 0..out {
                    for g in 0..groups {
                        z[(r / per) * groups + g] |=
                            (rng.below(1 << bits) as u32) << (bits as usize * (r % per));
                    }
                }
                (Dtype::I32, vec![out.div_ceil(per), groups], i32_bytes(&z))
            });
            (
                (Dtype::I32, vec![out, wpr], i32_bytes(&words)),
                (scale_dt, shape, scales(rng, n, scale_dt)),
                zero,
            )
        }
        Kind::Nvfp4 { .. } => {
            let packed: Vec<u8> = (0..out * n_in / 2).map(|_| rng.below(256) as u8).collect();
            // FP8 scales between 2^-3 and 2^4, never NaN.
            let sc: Vec<u8> = (0..out * n_in / 16)
                .map(|_| 0x30 + rng.below(0x38) as u8)
                .collect();
            (
                (Dtype::U8, vec![out, n_in / 2], packed),
                (Dtype::F8_E4M3, vec![out, n_in / 16], sc),
                None,
            )
        }
        Kind::Unpacked { strategy } => {
            let (shape, n) = scale_count(strategy, out, n_in);
            let (dt, w): (Dtype, Vec<u8>) = if asym {
                (
                    Dtype::I8,
                    (0..out * n_in).map(|_| rng.below(256) as u8).collect(),
                )
            } else {
                let w = (0..out * n_in)
                    .map(|_| {
                        let b = rng.below(256) as u8;
                        if b & 0x7f == 0x7f { 0x7e } else { b }
                    })
                    .collect();
                (Dtype::F8_E4M3, w)
            };
            let zero = asym.then(|| {
                let z: Vec<u8> = (0..n).map(|_| rng.below(16) as u8).collect();
                (Dtype::I8, shape.clone(), z)
            });
            (
                (dt, vec![out, n_in], w),
                (scale_dt, shape, scales(rng, n, scale_dt)),
                zero,
            )
        }
    };
    let groups = match kind {
        Kind::Int {
            strategy: Strategy::Group(g),
            ..
        } => n_in.div_ceil(g),
        _ => 1,
    };
    Synth {
        out,
        n_in,
        kind,
        weight,
        scale,
        zero,
        g_idx: g_idx.then(|| {
            i32_bytes(
                &(0..n_in)
                    .map(|_| rng.below(groups as u64) as u32)
                    .collect::<Vec<_>>(),
            )
        }),
        bias: bias.then(|| f32_bytes(&rng.bf16s(out, 0.5))),
        act_quant: None,
        model_dtype: FloatType::Bf16,
    }
}

#[test]
fn cuda_ops_match_cpu_bf16() {
    ops_match_cpu(FloatType::Bf16);
}

#[test]
fn cuda_ops_match_cpu_f32() {
    ops_match_cpu(FloatType::F32);
}

/// Every op against the CPU on the same inputs. bf16: relative L2 error within a few bf16
/// ulps; f32: within f32 accumulation-order noise.
fn ops_match_cpu(act: FloatType) {
    let Some(mut gpu) = backend(act) else { return };
    let tol = match act {
        FloatType::F32 => 1e-5,
        _ => 4e-3,
    };
    let cpu = CpuBackend::new();
    let mut rng = Rng(0x9E3779B97F4A7C15);
    let mut failures = Vec::new();
    let mut check = |what: &str, ok: bool, detail: String| {
        println!("{:<44} {} {detail}", what, if ok { "ok  " } else { "FAIL" });
        if !ok {
            failures.push(format!("{what}: {detail}"));
        }
    };

    // Elementwise ops and norms on awkward sizes.
    let (rows, cols) = (37, 333);
    let x = rng.bf16s(rows * cols, 3.0);
    let w: Vec<f32> = (0..cols).map(|_| rng.unit() + 1.0).collect();
    let gx = gpu.upload_activation(&x).unwrap();
    let gw = gpu.upload_vector("norm", &w).unwrap();
    let got = gpu
        .download(
            &gpu.rms_norm(&gx, &gw, rows, cols, 1e-5, OutType::Activation)
                .unwrap(),
        )
        .unwrap();
    let want = cpu
        .rms_norm(&x, &w, rows, cols, 1e-5, OutType::Activation)
        .unwrap();
    let e = rel_err(&got, &want);
    check("rms_norm 37x333", e < tol, format!("rel err {e:.2e}"));

    let n = 1001;
    let (a, b) = (rng.bf16s(n, 4.0), rng.bf16s(n, 4.0));
    let (ga, gb) = (
        gpu.upload_activation(&a).unwrap(),
        gpu.upload_activation(&b).unwrap(),
    );
    let got = gpu
        .download(&gpu.silu_mul(&ga, &gb, n, OutType::Activation).unwrap())
        .unwrap();
    let want = cpu.silu_mul(&a, &b, n, OutType::Activation).unwrap();
    let e = rel_err(&got, &want);
    check("silu_mul 1001", e < tol, format!("rel err {e:.2e}"));
    // The residual stream is f32 on either path.
    let mut ga2 = gpu.upload_vector("residual", &a).unwrap();
    gpu.add_assign(&mut ga2, &gb, n).unwrap();
    let mut want = a.clone();
    cpu.add_assign(&mut want, &b, n).unwrap();
    let e = rel_err(&gpu.download(&ga2).unwrap(), &want);
    check("add_assign 1001", e < tol, format!("rel err {e:.2e}"));
    // The residual add fused with the norm after it: an activation update (the forward
    // pass's case) on rows that fit the registers (4096), that do not (40000), and an odd
    // length walked value by value.
    for (rows, cols) in [(5, 4096), (2, 40000), (9, 333)] {
        let x = rng.bf16s(rows * cols, 3.0);
        let y = rng.bf16s(rows * cols, 2.0);
        let w: Vec<f32> = (0..cols).map(|_| rng.unit() + 1.0).collect();
        let mut gx = gpu.upload_vector("residual", &x).unwrap();
        let normed = gpu
            .add_rms_norm(
                &mut gx,
                &gpu.upload_activation(&y).unwrap(),
                &gpu.upload_vector("norm", &w).unwrap(),
                rows,
                cols,
                1e-5,
                OutType::Activation,
            )
            .unwrap();
        let mut want_x = x.clone();
        cpu.add_assign(&mut want_x, &y, rows * cols).unwrap();
        let want = cpu
            .rms_norm(&want_x, &w, rows, cols, 1e-5, OutType::Activation)
            .unwrap();
        let e = rel_err(&gpu.download(&normed).unwrap(), &want);
        let ex = rel_err(&gpu.download(&gx).unwrap(), &want_x);
        check(
            &format!("add_rms_norm {rows}x{cols}"),
            e < tol && ex < 1e-6,
            format!("rel err {e:.2e}, residual {ex:.2e}"),
        );
    }

    // RoPE and attention over varlen sequences, several head shapes.
    // head_dim 64 and 128 run on the tensor cores in bf16 (several key tiles, sequence starts
    // inside a tile); the others on the CUDA-core kernel.
    for (lens, heads, kv_heads, d) in [
        (vec![13usize, 29], 3usize, 3usize, 40usize),
        (vec![1, 45, 70], 6, 2, 8),
        (vec![100, 37], 8, 2, 128),
        (vec![33], 4, 1, 256),
        (vec![1, 150, 70, 200], 4, 2, 64),
        (vec![300, 5], 4, 4, 128),
    ] {
        let layout = SeqLayout::from_lengths(lens.clone());
        let t = layout.n_tokens();
        let half = d / 2;
        let max_pos = 320;
        let ang: Vec<f32> = (0..max_pos * half)
            .map(|i| (i / half) as f32 * 0.1 / (1 + i % half) as f32)
            .collect();
        let (cos, sin): (Vec<f32>, Vec<f32>) = ang.iter().map(|a| (a.cos(), a.sin())).unzip();
        let q = rng.bf16s(t * heads * d, 2.0);
        let k = rng.bf16s(t * kv_heads * d, 2.0);
        let v = rng.bf16s(t * kv_heads * d, 1.0);
        let gl = gpu.upload_layout(&layout).unwrap();
        let (gc, gs) = (
            gpu.upload_vector("cos", &cos).unwrap(),
            gpu.upload_vector("sin", &sin).unwrap(),
        );
        let mut gq = gpu.upload_activation(&q).unwrap();
        gpu.rope(&mut gq, &gl, &gc, &gs, heads, d).unwrap();
        let mut cq = q.clone();
        cpu.rope(&mut cq, &layout, &cos, &sin, heads, d).unwrap();
        let got_q = gpu.download(&gq).unwrap();
        let e = rel_err(&got_q, &cq);
        check(
            &format!("rope {lens:?} h{heads} d{d}"),
            e < tol,
            format!("rel err {e:.2e}"),
        );
        // Attention on the GPU's own rotated q so only attention is compared.
        let (gk, gv) = (
            gpu.upload_activation(&k).unwrap(),
            gpu.upload_activation(&v).unwrap(),
        );
        let shape = AttnShape {
            heads,
            kv_heads,
            head_dim: d,
        };
        let want = cpu
            .attention(&got_q, &k, &v, &layout, shape, OutType::Activation)
            .unwrap();
        // On Hopper both tensor-core kernels: the wgmma one (the default) and mma.sync.
        let tensor_cores = act == FloatType::Bf16 && matches!(d, 64 | 128);
        let default_kernel = gpu.attention_kernel();
        for portable in [false, true] {
            gpu.set_portable_attention(portable);
            if portable && (!tensor_cores || gpu.attention_kernel() == default_kernel) {
                continue;
            }
            let got = gpu
                .download(
                    &gpu.attention(&gq, &gk, &gv, &gl, shape, OutType::Activation)
                        .unwrap(),
                )
                .unwrap();
            let e = rel_err(&got, &want);
            let kernel = match gpu.attention_kernel() {
                Some(name) if tensor_cores => name,
                _ => "cuda cores",
            };
            check(
                &format!("attention {lens:?} h{heads}/{kv_heads} d{d} {kernel}"),
                e < tol,
                format!("rel err {e:.2e}"),
            );
        }
        gpu.set_portable_attention(false);
    }

    // Linears: dequantization bit for bit, then the GEMM against the CPU.
    let cases: Vec<(&str, Synth)> = vec![
        (
            "dense bf16 + bias 77x131",
            synth(
                &mut rng,
                Kind::Dense,
                77,
                131,
                Dtype::BF16,
                false,
                false,
                true,
            ),
        ),
        (
            "int4 group32 sym bf16 96x160",
            synth(
                &mut rng,
                Kind::Int {
                    bits: 4,
                    strategy: Strategy::Group(32),
                },
                96,
                160,
                Dtype::BF16,
                false,
                false,
                false,
            ),
        ),
        (
            "int4 group8 asym bf16 37x72",
            synth(
                &mut rng,
                Kind::Int {
                    bits: 4,
                    strategy: Strategy::Group(8),
                },
                37,
                72,
                Dtype::BF16,
                true,
                false,
                false,
            ),
        ),
        (
            "int4 group32 asym g_idx 83x192",
            synth(
                &mut rng,
                Kind::Int {
                    bits: 4,
                    strategy: Strategy::Group(32),
                },
                83,
                192,
                Dtype::BF16,
                true,
                true,
                false,
            ),
        ),
        (
            "int8 channel asym f16 scale 45x100",
            synth(
                &mut rng,
                Kind::Int {
                    bits: 8,
                    strategy: Strategy::Channel,
                },
                45,
                100,
                Dtype::F16,
                true,
                false,
                false,
            ),
        ),
        (
            "int3 group 7 (straddling) f32 50x77",
            synth(
                &mut rng,
                Kind::Int {
                    bits: 3,
                    strategy: Strategy::Group(7),
                },
                50,
                77,
                Dtype::F32,
                false,
                false,
                false,
            ),
        ),
        (
            "int4 tensor 64x64",
            synth(
                &mut rng,
                Kind::Int {
                    bits: 4,
                    strategy: Strategy::Tensor,
                },
                64,
                64,
                Dtype::BF16,
                false,
                false,
                false,
            ),
        ),
        (
            "nvfp4 70x128",
            synth(
                &mut rng,
                Kind::Nvfp4 { global_scale: 37.5 },
                70,
                128,
                Dtype::F8_E4M3,
                false,
                false,
                false,
            ),
        ),
        (
            "fp8 channel 65x96",
            synth(
                &mut rng,
                Kind::Unpacked {
                    strategy: Strategy::Channel,
                },
                65,
                96,
                Dtype::BF16,
                false,
                false,
                false,
            ),
        ),
        (
            "fp8 block 16x32 40x100",
            synth(
                &mut rng,
                Kind::Unpacked {
                    strategy: Strategy::Block(16, 32),
                },
                40,
                100,
                Dtype::BF16,
                false,
                false,
                false,
            ),
        ),
        (
            "int8 unpacked asym channel 33x70",
            synth(
                &mut rng,
                Kind::Unpacked {
                    strategy: Strategy::Channel,
                },
                33,
                70,
                Dtype::BF16,
                true,
                false,
                false,
            ),
        ),
    ];
    let mut cases = cases;
    // The bf16x2 path of the INT4 fast kernel with zero points (bf16 scales, bf16 model).
    cases.push((
        "int4 group64 asym bf16 70x256",
        synth(
            &mut rng,
            Kind::Int {
                bits: 4,
                strategy: Strategy::Group(64),
            },
            70,
            256,
            Dtype::BF16,
            true,
            false,
            false,
        ),
    ));
    // f32 model dtype (the stories260K fixtures) and activation fake-quant variants.
    let mut f32_model = synth(
        &mut rng,
        Kind::Int {
            bits: 4,
            strategy: Strategy::Group(16),
        },
        40,
        64,
        Dtype::F32,
        true,
        false,
        false,
    );
    f32_model.model_dtype = FloatType::F32;
    cases.push(("int4 group16 asym, f32 model 40x64", f32_model));
    let mut w4a4 = synth(
        &mut rng,
        Kind::Nvfp4 { global_scale: 52.0 },
        64,
        256,
        Dtype::F8_E4M3,
        false,
        false,
        false,
    );
    w4a4.act_quant = Some(ActQuant::Nvfp4 {
        global_scale: 411.0,
    });
    cases.push(("nvfp4 W4A4 64x256", w4a4));
    let mut w8a8 = synth(
        &mut rng,
        Kind::Unpacked {
            strategy: Strategy::Channel,
        },
        48,
        160,
        Dtype::BF16,
        false,
        false,
        false,
    );
    w8a8.act_quant = Some(ActQuant::Fp8PerToken);
    cases.push(("fp8 W8A8 per token 48x160", w8a8));
    let mut i8a8 = synth(
        &mut rng,
        Kind::Unpacked {
            strategy: Strategy::Channel,
        },
        48,
        160,
        Dtype::BF16,
        true,
        false,
        false,
    );
    i8a8.act_quant = Some(ActQuant::Int8PerToken);
    cases.push(("int8 W8A8 per token 48x160", i8a8));
    for (label, s) in &cases {
        let q = s.qlinear();
        let gl = gpu.upload_linear(&q).unwrap();
        // The declared activation quantization runs in the activation type: the reference
        // quantizes the same input with apply_row(act) and multiplies without it.
        let plain = QLinear {
            act_quant: None,
            ..q
        };
        let cl = cpu.upload_linear(&plain).unwrap();
        let want_w: Vec<f32> = q
            .dequantize()
            .unwrap()
            .iter()
            .map(|&v| act.round(v))
            .collect();
        let got_w = gpu.dequantized(&gl).unwrap();
        let mismatches = got_w
            .iter()
            .zip(&want_w)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        check(
            &format!("dequant {label}"),
            mismatches == 0,
            format!("{mismatches} of {} values differ", want_w.len()),
        );
        let rows = 19;
        let x = rng.bf16s(rows * s.n_in, 2.0);
        let got = gpu
            .download(
                &gpu.linear(&gpu.upload_activation(&x).unwrap(), &gl, rows)
                    .unwrap(),
            )
            .unwrap();
        // The GPU weight equals the CPU's rounded to the activation type, so only the GEMM
        // rounding differs, except that an f32 model's weight loses bits to bf16 on the bf16
        // path (a looser bound).
        let mut xq = x.clone();
        if let Some(aq) = s.act_quant {
            xq.chunks_mut(s.n_in).for_each(|r| aq.apply_row(r, act));
        }
        let want = cpu.linear(&xq, &cl, rows).unwrap();
        let e = rel_err(&got, &want);
        let tol = if s.model_dtype == FloatType::F32 && act == FloatType::Bf16 {
            1e-2
        } else {
            tol
        };
        check(
            &format!("linear {label}"),
            e < tol,
            format!("rel err {e:.2e}"),
        );
    }

    // Activation fake quantization bit for bit: through an identity weight the linear returns
    // its quantized input exactly (one nonzero product per output, exactly representable).
    let n = 96;
    let mut ident = synth(
        &mut rng,
        Kind::Dense,
        n,
        n,
        Dtype::BF16,
        false,
        false,
        false,
    );
    let eye: Vec<f32> = (0..n * n)
        .map(|i| if i / n == i % n { 1.0 } else { 0.0 })
        .collect();
    ident.weight.2 = bf16_bytes(&eye);
    for (label, aq) in [
        ("fp8 per token", ActQuant::Fp8PerToken),
        ("fp8 static", ActQuant::Fp8Static { scale: 0.0123 }),
        ("int8 per token", ActQuant::Int8PerToken),
        (
            "nvfp4",
            ActQuant::Nvfp4 {
                global_scale: 597.3,
            },
        ),
    ] {
        ident.act_quant = Some(aq);
        let gw = gpu.upload_linear(&ident.qlinear()).unwrap();
        let rows = 23;
        let mut x = rng.bf16s(rows * n, 3.0);
        x[5] = 0.0; // a zero and a whole zero row (zero scales)
        x[n..2 * n].iter_mut().for_each(|v| *v = 0.0);
        // The same values in the activation type, and unrounded f32 values as the forward
        // pass hands them to a quantizing linear (`Backend::input_type`).
        let x32: Vec<f32> = x.iter().map(|v| v * (1.0 + 1e-3 * rng.unit())).collect();
        for (input, xs, gx) in [
            ("", &x, gpu.upload_activation(&x).unwrap()),
            (", f32 input", &x32, gpu.upload_vector("x", &x32).unwrap()),
        ] {
            let got = gpu.download(&gpu.linear(&gx, &gw, rows).unwrap()).unwrap();
            let mut want = xs.clone();
            want.chunks_mut(n).for_each(|r| aq.apply_row(r, act));
            // Equal as numbers: the GEMM's sum turns a -0 into +0.
            let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            check(
                &format!("act quant {label}{input} (exact)"),
                differ == 0,
                format!("{differ} of {} values differ", want.len()),
            );
        }
    }

    // Embedding, fused NLL and KLD over several vocab tiles.
    let (vocab, hidden, rows) = (20011, 96, 50);
    let mut emb = synth(
        &mut rng,
        Kind::Dense,
        vocab,
        hidden,
        Dtype::BF16,
        false,
        false,
        false,
    );
    emb.weight.2 = bf16_bytes(&rng.bf16s(vocab * hidden, 0.3));
    let head2 = synth(
        &mut rng,
        Kind::Int {
            bits: 4,
            strategy: Strategy::Group(32),
        },
        vocab,
        hidden,
        Dtype::BF16,
        false,
        false,
        false,
    );
    let (q1, q2) = (emb.qlinear(), head2.qlinear());
    let (g1, g2) = (
        gpu.upload_linear(&q1).unwrap(),
        gpu.upload_linear(&q2).unwrap(),
    );
    let (c1, c2) = (
        cpu.upload_linear(&q1).unwrap(),
        cpu.upload_linear(&q2).unwrap(),
    );
    let ids: Vec<u32> = (0..rows).map(|_| rng.below(vocab as u64) as u32).collect();
    let e_got = gpu.download(&gpu.embed(&g1, &ids).unwrap()).unwrap();
    let e_want = cpu.embed(&c1, &ids).unwrap();
    check("embed", max_abs_diff(&e_got, &e_want) == 0.0, String::new());
    let h1 = rng.bf16s(rows * hidden, 1.0);
    let h2 = rng.bf16s(rows * hidden, 1.0);
    let targets: Vec<i32> = (0..rows)
        .map(|r| {
            if r % 7 == 3 {
                -1
            } else {
                rng.below(vocab as u64) as i32
            }
        })
        .collect();
    let (gh1, gh2) = (
        gpu.upload_activation(&h1).unwrap(),
        gpu.upload_activation(&h2).unwrap(),
    );
    for (label, g, c) in [("nll dense head", &g1, &c1), ("nll int4 head", &g2, &c2)] {
        let got = gpu.nll(&gh1, g, &targets).unwrap();
        let want = cpu.nll(&h1, c, &targets).unwrap();
        let e = max_abs_diff(&got, &want);
        check(
            &format!("{label} vocab {vocab}"),
            e < 1e-3,
            format!("max |dNLL| {e:.2e}"),
        );
    }
    let got = gpu.kld(&gh1, &g1, &gh2, &g2, &targets).unwrap();
    let want = cpu.kld(&h1, &c1, &h2, &c2, &targets).unwrap();
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| {
            (a.kld - b.kld)
                .abs()
                .max((a.nll_q - b.nll_q).abs())
                .max((a.nll_base - b.nll_base).abs())
                .max((a.base_top_p - b.base_top_p).abs())
        })
        .fold(0f64, f64::max);
    let same = got
        .iter()
        .zip(&want)
        .filter(|(a, b)| a.same_top == b.same_top)
        .count();
    check(
        "kld terms",
        worst < 1e-3 && same == want.len(),
        format!("max diff {worst:.2e}, same_top agree {same}/{}", want.len()),
    );
    println!("peak device memory: {:?} bytes", gpu.peak_memory_bytes());
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn cuda_fixtures_f32_match_reference() {
    fixtures_match_reference(FloatType::F32);
}

#[test]
fn cuda_fixtures_bf16_match_reference() {
    fixtures_match_reference(FloatType::Bf16);
}

/// Every fixture through `quantppl check`'s model check: PPL over the whole exl3 plan of its
/// reference.json and the largest per-token |dNLL| over rows 0 and 1. f32 activations: the
/// DESIGN bounds (1e-3 per token where activations are not quantized; PPL within the
/// fixture's rtol, at least 1e-2 where they are). bf16: PPL within 0.2 % or the fixture's rtol
/// (1e-2 where activations are fake-quantized: they reach the quantizer in f32).
fn fixtures_match_reference(act: FloatType) {
    let Some(gpu) = backend(act) else { return };
    let mut failures = Vec::new();
    println!(
        "{:<42} {:>11} {:>11} {:>9}",
        "fixture", "max|dNLL|", "PPL rel", "PPL tol"
    );
    for dir in common::reference_dirs() {
        let r = common::reference(&dir);
        let m = check_model(&gpu, &dir).expect("model check");
        let quantized_act = common::activations_quantized(&r);
        let rtol = common::suggested_ppl_rtol(&r);
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let (tol, per_token, note) = match (act, quantized_act) {
            (FloatType::F32, false) => (rtol, Some(1e-3), "per token <= 1e-3"),
            (FloatType::F32, true) => (rtol.max(1e-2), None, "activations quantized"),
            (_, false) => (rtol.max(2e-3), None, ""),
            (_, true) => (rtol.max(2e-3), None, "activations quantized"),
        };
        let ok = m.ppl.is_finite()
            && m.ppl_rel_diff <= tol
            && per_token.is_none_or(|bound| m.max_token_diff <= bound);
        println!(
            "{name:<42} {:>11.3e} {:>11.3e} {tol:>9.1e}  {} {note}",
            m.max_token_diff,
            m.ppl_rel_diff,
            if ok { "ok" } else { "FAIL" },
        );
        if !ok {
            failures.push(format!(
                "{name}: max |dNLL| {:.3e}, PPL rel {:.3e}",
                m.max_token_diff, m.ppl_rel_diff
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Mean time of `f` in ms over `reps` runs queued back to back (one synchronization at the
/// end, after one synchronized warm-up), so launch latency overlaps as in a real forward.
fn time_ms(gpu: &CudaBackend, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    gpu.synchronize().unwrap();
    let start = Instant::now();
    for _ in 0..reps {
        f();
    }
    gpu.synchronize().unwrap();
    start.elapsed().as_secs_f64() * 1e3 / reps as f64
}

/// A dense bf16 linear of random weights.
fn dense(rng: &mut Rng, out: usize, n_in: usize, scale: f32) -> Synth {
    let mut d = synth(rng, Kind::Dense, 1, 1, Dtype::BF16, false, false, false);
    d.out = out;
    d.n_in = n_in;
    d.weight = (
        Dtype::BF16,
        vec![out, n_in],
        bf16_bytes(&rng.bf16s(out * n_in, scale)),
    );
    d
}

/// One Llama-3-8B-shaped layer (hidden 4096, inter 14336, 32 heads / 8 kv, head_dim 128,
/// INT4 group-128 weights) on 4 sequences x 2048 tokens, op class by op class, the lm_head
/// NLL over vocab 128256, and the bf16 cuBLAS GEMM peak on 8192^3 (QUANTPPL_BENCH=1).
#[test]
fn cuda_layer_speed() {
    if std::env::var_os("QUANTPPL_BENCH").is_none() {
        println!("set QUANTPPL_BENCH=1 to time a realistic layer");
        return;
    }
    let Some(mut gpu) = backend(FloatType::Bf16) else {
        return;
    };
    let mut rng = Rng(7);
    let (seqs, ctx) = (4usize, 2048usize);
    let t = seqs * ctx;
    let (h, inter, heads, kv_heads, d, vocab) = (4096usize, 14336usize, 32, 8, 128, 128256);
    let shape = AttnShape {
        heads,
        kv_heads,
        head_dim: d,
    };
    let tflops = |flop: f64, ms: f64| flop / ms / 1e9;

    // bf16 GEMM peak: 8192 x 8192 x 8192 through the same cuBLAS call as every linear.
    let peak = gpu.gemm_peak_tflops().unwrap().unwrap_or(f64::NAN);
    println!("bf16 cuBLAS GEMM 8192^3: {peak:.1} TFLOP/s");

    // The layer: INT4 g128 weights and dense bf16 twins of the same shapes (GEMM alone).
    let names = ["q", "k", "v", "o", "gate", "up", "down"];
    let shapes = [
        (heads * d, h),
        (kv_heads * d, h),
        (kv_heads * d, h),
        (h, heads * d),
        (inter, h),
        (inter, h),
        (h, inter),
    ];
    let int4 = |rng: &mut Rng, out, n_in| {
        let s = synth(
            rng,
            Kind::Int {
                bits: 4,
                strategy: Strategy::Group(128),
            },
            out,
            n_in,
            Dtype::BF16,
            false,
            false,
            false,
        );
        gpu.upload_linear(&s.qlinear()).unwrap()
    };
    let qw: Vec<_> = shapes.iter().map(|&(o, i)| int4(&mut rng, o, i)).collect();
    let dw: Vec<_> = shapes
        .iter()
        .map(|&(o, i)| {
            gpu.upload_linear(&dense(&mut rng, o, i, 0.02).qlinear())
                .unwrap()
        })
        .collect();
    let params: usize = shapes.iter().map(|&(o, i)| o * i).sum();
    let layout = gpu
        .upload_layout(&SeqLayout::from_lengths(vec![ctx; seqs]))
        .unwrap();
    let half = d / 2;
    let ang: Vec<f32> = (0..ctx * half)
        .map(|i| (i / half) as f32 * (10000f32).powf(-((i % half) as f32) / half as f32))
        .collect();
    let cos = gpu
        .upload_vector("cos", &ang.iter().map(|a| a.cos()).collect::<Vec<_>>())
        .unwrap();
    let sin = gpu
        .upload_vector("sin", &ang.iter().map(|a| a.sin()).collect::<Vec<_>>())
        .unwrap();
    let norm_w = gpu.upload_vector("norm", &vec![1.0; h]).unwrap();
    let mut resid = gpu
        .upload_vector("residual", &rng.bf16s(t * h, 1.0))
        .unwrap();
    let mut down = gpu.upload_activation(&rng.bf16s(t * h, 0.1)).unwrap();

    // One forward of the layer as model/forward.rs runs it: each residual update is added by
    // the norm after it (the previous layer's MLP output by this layer's first norm).
    let mut forward = |w: &[quantppl::backend::cuda::CudaLinear]| {
        let xn = gpu
            .add_rms_norm(&mut resid, &down, &norm_w, t, h, 1e-5, OutType::Activation)
            .unwrap();
        let mut q = gpu.linear(&xn, &w[0], t).unwrap();
        let mut k = gpu.linear(&xn, &w[1], t).unwrap();
        let v = gpu.linear(&xn, &w[2], t).unwrap();
        gpu.rope(&mut q, &layout, &cos, &sin, heads, d).unwrap();
        gpu.rope(&mut k, &layout, &cos, &sin, kv_heads, d).unwrap();
        let a = gpu
            .attention(&q, &k, &v, &layout, shape, OutType::Activation)
            .unwrap();
        let o = gpu.linear(&a, &w[3], t).unwrap();
        let xn = gpu
            .add_rms_norm(&mut resid, &o, &norm_w, t, h, 1e-5, OutType::Activation)
            .unwrap();
        let g = gpu.linear(&xn, &w[4], t).unwrap();
        let u = gpu.linear(&xn, &w[5], t).unwrap();
        let gu = gpu
            .silu_mul(&g, &u, t * inter, OutType::Activation)
            .unwrap();
        down = gpu.linear(&gu, &w[6], t).unwrap();
    };
    let t_layer = time_ms(&gpu, 5, || forward(&qw));
    let t_layer_dense = time_ms(&gpu, 5, || forward(&dw));

    // Op classes, each timed alone.
    println!(
        "{:<6} {:>12} {:>9} {:>11} {:>9} {:>9}",
        "linear", "out x in", "GEMM ms", "dequant ms", "dequant", "TFLOP/s"
    );
    let (mut t_gemm, mut t_dequant) = (0.0, 0.0);
    for (j, name) in names.iter().enumerate() {
        let (o, i) = shapes[j];
        let x = gpu.upload_activation(&rng.bf16s(t * i, 1.0)).unwrap();
        let tg = time_ms(&gpu, 10, || drop(gpu.linear(&x, &dw[j], t).unwrap()));
        let tq = time_ms(&gpu, 10, || gpu.dequantize_weight(&qw[j]).unwrap());
        t_gemm += tg;
        t_dequant += tq;
        println!(
            "{name:<6} {:>12} {tg:>9.3} {tq:>11.3} {:>8.1}% {:>9.1}",
            format!("{o}x{i}"),
            100.0 * tq / tg,
            tflops(2.0 * (o * i * t) as f64, tg)
        );
    }
    let mut q = gpu
        .upload_activation(&rng.bf16s(t * heads * d, 1.0))
        .unwrap();
    let mut k = gpu
        .upload_activation(&rng.bf16s(t * kv_heads * d, 1.0))
        .unwrap();
    let v = gpu
        .upload_activation(&rng.bf16s(t * kv_heads * d, 1.0))
        .unwrap();
    let attention_ms = |gpu: &CudaBackend| {
        time_ms(gpu, 10, || {
            drop(
                gpu.attention(&q, &k, &v, &layout, shape, OutType::Activation)
                    .unwrap(),
            )
        })
    };
    let t_attn = attention_ms(&gpu);
    let attn_kernel = gpu.attention_kernel().unwrap_or("cuda cores");
    // Where a wgmma kernel exists, the mma.sync one alone too, for comparison.
    gpu.set_portable_attention(true);
    let portable_attn = (gpu.attention_kernel() != Some(attn_kernel)).then(|| {
        (
            gpu.attention_kernel().unwrap_or("cuda cores"),
            attention_ms(&gpu),
        )
    });
    gpu.set_portable_attention(false);
    let attn_flop = 4.0 * (heads * d) as f64 * seqs as f64 * (ctx * (ctx + 1) / 2) as f64;
    let t_rope = time_ms(&gpu, 10, || {
        gpu.rope(&mut q, &layout, &cos, &sin, heads, d).unwrap();
        gpu.rope(&mut k, &layout, &cos, &sin, kv_heads, d).unwrap();
    });
    let gate = gpu.upload_activation(&rng.bf16s(t * inter, 2.0)).unwrap();
    let up = gpu.upload_activation(&rng.bf16s(t * inter, 2.0)).unwrap();
    let t_silu = time_ms(&gpu, 10, || {
        drop(
            gpu.silu_mul(&gate, &up, t * inter, OutType::Activation)
                .unwrap(),
        )
    });
    drop((gate, up));
    let o = gpu.upload_activation(&rng.bf16s(t * h, 1.0)).unwrap();
    let t_add_norm = time_ms(&gpu, 10, || {
        drop(
            gpu.add_rms_norm(&mut resid, &o, &norm_w, t, h, 1e-5, OutType::Activation)
                .unwrap(),
        )
    });
    let t_small = 2.0 * t_add_norm + t_rope + t_silu;
    println!(
        "small ops (ms): add + rms_norm {t_add_norm:.3} x2, rope q+k {t_rope:.3}, \
         silu_mul {t_silu:.3}"
    );

    // The fused lm_head + log-softmax-gather over every token of the batch.
    let head = gpu
        .upload_linear(&dense(&mut rng, vocab, h, 0.02).qlinear())
        .unwrap();
    let hidden = gpu.upload_activation(&rng.bf16s(t * h, 1.0)).unwrap();
    let targets: Vec<i32> = (0..t).map(|_| rng.below(vocab as u64) as i32).collect();
    let t_nll = time_ms(&gpu, 3, || drop(gpu.nll(&hidden, &head, &targets).unwrap()));

    let layer_flop = 2.0 * params as f64 * t as f64;
    let pct = |x: f64| 100.0 * x / t_layer;
    println!("\n8B-shaped layer, {seqs} x {ctx} tokens, INT4 g128 weights ({params} params)");
    println!(
        "{:<34} {:>9} {:>8} {:>9}",
        "op class", "ms", "% layer", "TFLOP/s"
    );
    println!(
        "{:<34} {t_dequant:>9.3} {:>7.1}%",
        "dequant (7 linears)",
        pct(t_dequant)
    );
    println!(
        "{:<34} {t_gemm:>9.3} {:>7.1}% {:>9.1}",
        "GEMM (7 linears, bf16 cuBLAS)",
        pct(t_gemm),
        tflops(layer_flop, t_gemm)
    );
    println!(
        "{:<34} {t_attn:>9.3} {:>7.1}% {:>9.1}",
        format!("attention, {attn_kernel}"),
        pct(t_attn),
        tflops(attn_flop, t_attn)
    );
    println!(
        "{:<34} {t_small:>9.3} {:>7.1}%",
        "add+norm x2, rope, silu_mul",
        pct(t_small)
    );
    println!(
        "{:<34} {:>9.3} {:>7.1}%",
        "sum of the parts",
        t_dequant + t_gemm + t_attn + t_small,
        pct(t_dequant + t_gemm + t_attn + t_small)
    );
    println!(
        "{:<34} {t_layer:>9.3} {:>7.1}% {:>9.1}",
        "full layer forward (INT4)",
        100.0,
        tflops(layer_flop, t_layer)
    );
    println!(
        "{:<34} {t_layer_dense:>9.3} {:>8} {:>9.1}",
        "full layer forward (dense bf16)",
        "",
        tflops(layer_flop, t_layer_dense)
    );
    println!(
        "{:<34} {t_nll:>9.3} {:>8} {:>9.1}",
        format!("lm_head NLL, vocab {vocab}"),
        "",
        tflops(2.0 * (vocab * h * t) as f64, t_nll)
    );
    if let Some((kernel, ms)) = portable_attn {
        println!(
            "{:<34} {ms:>9.3} {:>8} {:>9.1}",
            format!("attention, {kernel} (not used)"),
            "",
            tflops(attn_flop, ms)
        );
    }
    println!("(attention TFLOP/s count the causal half's FLOPs)");
    println!("bf16 GEMM peak (8192^3)            {peak:>28.1}");
    println!(
        "peak device memory: {:.2} GiB",
        gpu.peak_memory_bytes().unwrap_or(0) as f64 / (1u64 << 30) as f64
    );
}
