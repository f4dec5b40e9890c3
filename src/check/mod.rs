//! Every backend op against the CPU reference on fresh random inputs of awkward sizes: the
//! case list behind `quantppl check` and the GPU backends' tests.
//!
//! Inputs come from a seeded generator (the seed is printed), weights are packed exactly as
//! on disk, and the CPU backend's result is the expected value.

mod synth_linear;

use serde::Serialize;

use crate::Result;
use crate::backend::cpu::CpuBackend;
use crate::backend::{AttnShape, Backend, OutType, SeqLayout};
use crate::numerics::FloatType;
pub use synth_linear::Rng;
use synth_linear::{LinearSpec, WeightKind};

#[derive(Clone, Debug, Serialize)]
pub struct CaseReport {
    pub name: String,
    /// Shapes and parameters, e.g. `rows=37 in=96 out=40 group=32`.
    pub vars: String,
    pub max_abs_err: f64,
    /// Largest |reference| value, the scale the error is judged against.
    pub ref_scale: f64,
    /// Tolerance on max_abs_err / ref_scale (relative) or max_abs_err (for NLLs).
    pub tolerance: f64,
    pub passed: bool,
    /// Index of the worst element with the backend's and the reference's values.
    pub worst: (usize, f32, f32),
}

fn compare(
    name: &str,
    vars: String,
    got: &[f32],
    want: &[f32],
    tol: f64,
    relative: bool,
) -> CaseReport {
    let mut worst = (0, 0f32, 0f32);
    let mut max_abs = 0f64;
    let mut scale = 0f64;
    let mut finite = got.len() == want.len();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        scale = scale.max((w as f64).abs());
        let d = (g as f64 - w as f64).abs();
        if !g.is_finite() {
            finite = false;
        }
        if d > max_abs || d.is_nan() {
            max_abs = d;
            worst = (i, g, w);
        }
    }
    let judged = if relative {
        max_abs / scale.max(1e-30)
    } else {
        max_abs
    };
    CaseReport {
        name: name.to_string(),
        vars,
        max_abs_err: max_abs,
        ref_scale: scale,
        tolerance: tol,
        passed: finite && judged <= tol,
        worst,
    }
}

/// Tolerances from DESIGN.md's numerics contract for the backend's activation precision:
/// (relative error of op outputs, absolute error of NLLs).
fn tolerances(t: FloatType) -> (f64, f64) {
    match t {
        FloatType::F32 => (1e-4, 1e-3),
        FloatType::F16 | FloatType::Bf16 => (2e-2, 2e-2),
    }
}

/// Runs every case on `b` and on the CPU reference. Errors only when the backend itself fails.
pub fn check_ops<B: Backend>(b: &B, seed: u64) -> Result<Vec<CaseReport>> {
    let cpu = CpuBackend::new();
    let (rel, nll_tol) = tolerances(b.activation_type());
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();

    // Linear layers of every storage format, sizes that are not multiples of any tile.
    let bf16 = FloatType::Bf16;
    let specs = [
        LinearSpec::new(WeightKind::DenseF32, 45, 72, FloatType::F32),
        LinearSpec::new(WeightKind::DenseBf16, 130, 200, bf16),
        LinearSpec::new(
            WeightKind::Int {
                bits: 4,
                group: Some(32),
                asym: false,
                g_idx: false,
            },
            40,
            96,
            bf16,
        ),
        LinearSpec::new(
            WeightKind::Int {
                bits: 4,
                group: Some(32),
                asym: true,
                g_idx: true,
            },
            24,
            160,
            bf16,
        ),
        LinearSpec::new(
            WeightKind::Int {
                bits: 4,
                group: Some(128),
                asym: false,
                g_idx: false,
            },
            72,
            384,
            bf16,
        ),
        LinearSpec::new(
            WeightKind::Int {
                bits: 4,
                group: None,
                asym: false,
                g_idx: false,
            },
            33,
            172,
            FloatType::F32,
        ),
        LinearSpec::new(
            WeightKind::Int {
                bits: 8,
                group: None,
                asym: false,
                g_idx: false,
            },
            31,
            100,
            bf16,
        ),
        LinearSpec::new(WeightKind::Nvfp4 { act: false }, 33, 64, bf16),
        LinearSpec::new(WeightKind::Nvfp4 { act: true }, 40, 96, bf16),
        LinearSpec::new(WeightKind::Fp8 { act: false }, 29, 80, bf16),
        LinearSpec::new(WeightKind::Fp8 { act: true }, 50, 64, bf16),
        LinearSpec::new(WeightKind::DenseBf16, 64, 48, bf16).with_bias(),
    ];
    for (i, spec) in specs.iter().enumerate() {
        let rows = [1, 37, 130][i % 3];
        let owned = spec.build(&mut rng);
        let q = owned.qlinear();
        // Inputs representable in the backend's activation type (what a GEMM multiplies); a
        // layer that quantizes its input gets it unrounded, as the forward pass hands it over
        // (`Backend::input_type`).
        let act = b.activation_type();
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
        // The declared activation fake quantization runs in the activation dtype (as
        // compressed-tensors runs it in the model's): the expected value quantizes the input
        // with `apply_row` in the backend's activation type, then multiplies in f64. In bf16
        // that differs from the f32 quantization by whole quantization steps wherever a scale
        // or a value rounds differently, so the CPU's own (f32) fake quant is no reference.
        let want = match q.act_quant {
            None => cpu.linear(&x, &cpu.upload_linear(&q)?, rows)?,
            Some(aq) => {
                let mut xq = x.clone();
                xq.chunks_mut(spec.in_features)
                    .for_each(|row| aq.apply_row(row, act));
                let plain = crate::checkpoint::QLinear {
                    act_quant: None,
                    ..q
                };
                cpu.linear(&xq, &cpu.upload_linear(&plain)?, rows)?
            }
        };
        let xb = b.upload_vector("x", &x)?;
        let got = b.download(&b.linear(&xb, &b.upload_linear(&q)?, rows)?)?;
        out.push(compare(
            "linear",
            format!("{} rows={rows}", spec.describe()),
            &got,
            &want,
            rel,
            true,
        ));
    }

    // The ops whose output may feed a linear, in both output types where they differ. An f32
    // output of f32 inputs is held to the f32 tolerance, which a path that still rounded to
    // the activation type would fail; attention keeps `rel` (its P is bf16 on tensor cores).
    let outs: &[(OutType, &str)] = match b.activation_type() {
        FloatType::F32 => &[(OutType::Activation, "")],
        _ => &[(OutType::Activation, ""), (OutType::F32, " out=f32")],
    };
    let out_tol = |ot: OutType| match ot {
        OutType::F32 => tolerances(FloatType::F32).0,
        OutType::Activation => rel,
    };

    // RMSNorm, with a row length that no workgroup size divides.
    for ((rows, cols), (ot, ot_name)) in [(7, 200), (1, 64), (300, 33)]
        .into_iter()
        .zip(outs.iter().cycle())
    {
        let x = rng.normal_vec(rows * cols, 2.0);
        let w = rng.normal_vec(cols, 1.0);
        let want = cpu.rms_norm(&x, &w, rows, cols, 1e-5, OutType::Activation)?;
        let got = b.rms_norm(
            &b.upload_vector("x", &x)?,
            &b.upload_vector("w", &w)?,
            rows,
            cols,
            1e-5,
            *ot,
        )?;
        out.push(compare(
            "rms_norm",
            format!("rows={rows} cols={cols}{ot_name}"),
            &b.download(&got)?,
            &want,
            out_tol(*ot),
            true,
        ));
    }

    // RoPE, attention: three sequences of very different lengths laid end to end.
    let layout = SeqLayout::from_lengths([1, 17, 70]);
    let t = layout.n_tokens();
    for (heads, kv_heads, d) in [(4, 2, 16), (3, 3, 8), (8, 1, 64), (2, 1, 128), (2, 2, 96)] {
        let half = d / 2;
        let cos: Vec<f32> = (0..80 * half).map(|i| ((i as f32) * 0.37).cos()).collect();
        let sin: Vec<f32> = (0..80 * half).map(|i| ((i as f32) * 0.37).sin()).collect();
        let mut x = rng.normal_vec(t * heads * d, 1.0);
        let mut xg = b.upload_vector("x", &x)?;
        cpu.rope(&mut x, &layout, &cos, &sin, heads, d)?;
        let (bc, bs) = (b.upload_vector("cos", &cos)?, b.upload_vector("sin", &sin)?);
        let bl = b.upload_layout(&layout)?;
        b.rope(&mut xg, &bl, &bc, &bs, heads, d)?;
        out.push(compare(
            "rope",
            format!("tokens={t} heads={heads} head_dim={d}"),
            &b.download(&xg)?,
            &x,
            rel,
            true,
        ));

        let shape = AttnShape {
            heads,
            kv_heads,
            head_dim: d,
        };
        let q = rng.normal_vec(t * heads * d, 1.0);
        let k = rng.normal_vec(t * kv_heads * d, 1.0);
        let v = rng.normal_vec(t * kv_heads * d, 1.0);
        let want = cpu.attention(&q, &k, &v, &layout, shape, OutType::Activation)?;
        let (bq, bk, bv) = (
            b.upload_vector("q", &q)?,
            b.upload_vector("k", &k)?,
            b.upload_vector("v", &v)?,
        );
        for &(ot, ot_name) in outs {
            let got = b.attention(&bq, &bk, &bv, &bl, shape, ot)?;
            out.push(compare(
                "attention",
                format!("seqs=[1,17,70] heads={heads} kv_heads={kv_heads} head_dim={d}{ot_name}"),
                &b.download(&got)?,
                &want,
                rel,
                true,
            ));
        }
    }

    // Elementwise ops.
    let n = 1000;
    let (g, u) = (rng.normal_vec(n, 3.0), rng.normal_vec(n, 1.0));
    let want = cpu.silu_mul(&g, &u, n, OutType::Activation)?;
    let (bg, bu) = (b.upload_vector("g", &g)?, b.upload_vector("u", &u)?);
    for &(ot, ot_name) in outs {
        out.push(compare(
            "silu_mul",
            format!("n={n}{ot_name}"),
            &b.download(&b.silu_mul(&bg, &bu, n, ot)?)?,
            &want,
            out_tol(ot),
            true,
        ));
    }
    let mut want = g.clone();
    cpu.add_assign(&mut want, &u, n)?;
    let mut xg = b.upload_vector("g", &g)?;
    b.add_assign(&mut xg, &b.upload_vector("u", &u)?, n)?;
    out.push(compare(
        "add",
        format!("n={n}"),
        &b.download(&xg)?,
        &want,
        rel,
        true,
    ));

    // The residual add fused with the norm that reads it next: rows that fit a block's
    // registers, rows that do not, and an odd length.
    for ((rows, cols), (ot, ot_name)) in [(5, 4096), (2, 40000), (9, 33), (3, 4096)]
        .into_iter()
        .zip(outs.iter().cycle())
    {
        let (x, y) = (
            rng.normal_vec(rows * cols, 2.0),
            rng.normal_vec(rows * cols, 1.0),
        );
        let w = rng.normal_vec(cols, 1.0);
        let mut want_x = x.clone();
        cpu.add_assign(&mut want_x, &y, rows * cols)?;
        let want = cpu.rms_norm(&want_x, &w, rows, cols, 1e-5, OutType::Activation)?;
        let mut xg = b.upload_vector("x", &x)?;
        let got = b.add_rms_norm(
            &mut xg,
            &b.upload_vector("y", &y)?,
            &b.upload_vector("w", &w)?,
            rows,
            cols,
            1e-5,
            *ot,
        )?;
        let shape = format!("rows={rows} cols={cols}{ot_name}");
        out.push(compare(
            "add_rms_norm",
            shape.clone(),
            &b.download(&got)?,
            &want,
            out_tol(*ot),
            true,
        ));
        out.push(compare(
            "add_rms_norm residual",
            shape,
            &b.download(&xg)?,
            &want_x,
            rel,
            true,
        ));
    }

    // Embedding gather, and the fused lm_head + log-softmax-gather / KLD over vocabularies
    // that are not multiples of a tile.
    for (vocab, hidden, rows) in [(1000, 48, 9), (32003, 64, 5), (512, 256, 40)] {
        let head_spec = LinearSpec::new(WeightKind::DenseBf16, vocab, hidden, FloatType::Bf16);
        let head = head_spec.build(&mut rng);
        let hq = head.qlinear();
        let (ch, bh) = (cpu.upload_linear(&hq)?, b.upload_linear(&hq)?);
        let ids: Vec<u32> = (0..rows).map(|_| rng.below(vocab as u64) as u32).collect();
        let want = cpu.embed(&ch, &ids)?;
        let got = b.download(&b.embed(&bh, &ids)?)?;
        out.push(compare(
            "embed",
            format!("vocab={vocab} hidden={hidden} rows={rows}"),
            &got,
            &want,
            rel,
            true,
        ));

        let h = rng.normal_vec(rows * hidden, 1.0);
        let targets: Vec<i32> = (0..rows)
            .map(|r| {
                if r % 4 == 3 {
                    -1
                } else {
                    rng.below(vocab as u64) as i32
                }
            })
            .collect();
        let want = cpu.nll(&h, &ch, &targets)?;
        let hb = b.upload_vector("h", &h)?;
        let got = b.nll(&hb, &bh, &targets)?;
        out.push(compare(
            "nll",
            format!("vocab={vocab} hidden={hidden} rows={rows}"),
            &got,
            &want,
            nll_tol,
            false,
        ));

        let h2: Vec<f32> = h.iter().map(|v| v + 0.1 * rng.normal()).collect();
        let want = cpu.kld(&h, &ch, &h2, &ch, &targets)?;
        let got = b.kld(&hb, &bh, &b.upload_vector("h2", &h2)?, &bh, &targets)?;
        let flat = |k: &[crate::backend::KldTerms]| -> Vec<f32> {
            k.iter()
                .flat_map(|t| {
                    [
                        t.kld as f32,
                        t.nll_q as f32,
                        t.nll_base as f32,
                        t.base_top_p as f32,
                    ]
                })
                .collect()
        };
        out.push(compare(
            "kld",
            format!("vocab={vocab} hidden={hidden} rows={rows}"),
            &flat(&got),
            &flat(&want),
            nll_tol,
            false,
        ));
    }
    Ok(out)
}
