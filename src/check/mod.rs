//! Every backend op against the CPU reference on fresh random inputs of awkward sizes: the
//! case list behind `quantppl check` and the GPU backends' tests.
//!
//! Inputs come from a seeded generator (the seed is printed), weights are packed exactly as
//! on disk, and the CPU backend's result is the expected value.

mod linears;
mod mixture;
mod model;

pub use model::{ModelCheck, check_model};

use serde::Serialize;

use crate::Result;
use crate::backend::cpu::CpuBackend;
use crate::backend::{
    AttnSpec, Backend, ColumnBlocks, Device, Head, OutType, RotarySpan, SeqLayout, Shaped,
};
use crate::checkpoint::GatedActivation;
use crate::checkpoint::scheme::Strategy;
use crate::numerics::FloatType;
use crate::rng::Rng;
use crate::synth::linear::{LinearSpec, WeightKind};

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

pub(crate) fn compare(
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

/// `values` as a `[rows, cols]` tensor of `d`.
pub fn matrix<D: Device>(
    d: &D,
    name: &str,
    values: &[f32],
    rows: usize,
    cols: usize,
) -> Result<D::Tensor> {
    d.upload_vector(name, values)?.reshaped(rows, cols)
}

/// Tolerances from docs/DESIGN.md's numerics contract for the backend's activation precision:
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

    linears::check_linears(b, &mut rng, rel, &mut out)?;

    // The ops whose output may feed a linear, in both output types where they differ. An f32
    // output of f32 inputs is held to the f32 tolerance, which a path that still rounded to
    // the activation type would fail; attention keeps `rel` (its P is bf16 on tensor cores).
    let outs: &[(OutType, &str)] = match b.activation_type() {
        FloatType::F32 => &[(OutType::Activation, "")],
        _ => &[(OutType::Activation, ""), (OutType::F32, " out=f32")],
    };
    // The norms also as the planes a mixture reads (f32 values, however a backend holds them).
    let norm_outs: &[(OutType, &str)] = match b.activation_type() {
        FloatType::F32 => outs,
        _ => &[
            (OutType::Activation, ""),
            (OutType::F32, " out=f32"),
            (OutType::Planes, " out=planes"),
        ],
    };
    let out_tol = |ot: OutType| match ot {
        OutType::F32 | OutType::Planes => tolerances(FloatType::F32).0,
        OutType::Activation => rel,
    };

    // RMSNorm, with a row length that no workgroup size divides, and rows of a head (a warp
    // each on CUDA) in a count no block's rows divide.
    for ((rows, cols), (ot, ot_name)) in [
        (7, 200),
        (1, 64),
        (300, 33),
        (37, 128),
        (5, 2048),
        (6, 1024),
    ]
    .into_iter()
    .zip(norm_outs.iter().cycle())
    {
        let x = rng.normal_vec(rows * cols, 2.0);
        let w = rng.normal_vec(cols, 1.0);
        let want = cpu.download(&cpu.rms_norm(
            &matrix(&cpu, "x", &x, rows, cols)?,
            &cpu.upload_vector("w", &w)?,
            1e-5,
            OutType::Activation,
        )?)?;
        let got = b.rms_norm(
            &matrix(b, "x", &x, rows, cols)?,
            &b.upload_vector("w", &w)?,
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

    // Column assembly as latent attention uses it: per-head key parts (an activation source)
    // beside a shared rotated part repeated into every head (an f32 source, stride 0), then
    // the values' cut back out of wider heads.
    let (t, heads, latent, rot, nope, vd) = (37, 3, 24, 8, 16, 12);
    let d = nope + rot;
    let kv: Vec<f32> = rng
        .normal_vec(t * heads * (nope + vd), 1.0)
        .into_iter()
        .map(|v| b.activation_type().round(v))
        .collect();
    let ckv = rng.normal_vec(t * (latent + rot), 1.0);
    let keys = [
        ColumnBlocks {
            blocks: heads,
            width: nope,
            from: 0,
            from_stride: nope + vd,
            to: 0,
            to_stride: d,
        },
        ColumnBlocks {
            blocks: heads,
            width: rot,
            from: latent,
            from_stride: 0,
            to: nope,
            to_stride: d,
        },
    ];
    let values = ColumnBlocks {
        blocks: heads,
        width: vd,
        from: nope,
        from_stride: nope + vd,
        to: 0,
        to_stride: vd,
    };
    for (ot, ot_name) in outs {
        let cpu_kv = cpu
            .upload_activation(&kv)?
            .reshaped(t, heads * (nope + vd))?;
        let cpu_ckv = matrix(&cpu, "ckv", &ckv, t, latent + rot)?;
        let b_kv = b.upload_activation(&kv)?.reshaped(t, heads * (nope + vd))?;
        let b_ckv = matrix(b, "ckv", &ckv, t, latent + rot)?;
        for (what, parts, cols) in [
            ("keys", &[(0, keys[0]), (1, keys[1])][..], heads * d),
            ("values", &[(0, values)][..], heads * vd),
        ] {
            let pick_cpu = [&cpu_kv, &cpu_ckv];
            let pick_b = [&b_kv, &b_ckv];
            let cpu_parts: Vec<_> = parts.iter().map(|&(i, at)| (pick_cpu[i], at)).collect();
            let b_parts: Vec<_> = parts.iter().map(|&(i, at)| (pick_b[i], at)).collect();
            let want = cpu.download(&cpu.assemble_columns(t, cols, &cpu_parts, *ot)?)?;
            let got = b.download(&b.assemble_columns(t, cols, &b_parts, *ot)?)?;
            out.push(compare(
                "assemble_columns",
                format!("{what} heads={heads} nope={nope} rope={rot} v={vd}{ot_name}"),
                &got,
                &want,
                out_tol(*ot),
                true,
            ));
        }
    }

    // RoPE, attention: sequences of very different lengths laid end to end (one token;
    // several key tiles; sequence starts inside a tile), grouped-query and plain heads, the
    // head sizes of the tensor-core kernels (64, 128) and others.
    let act = b.activation_type();
    for (lens, heads, kv_heads, d) in [
        (&[1, 17, 70][..], 4, 2, 16),
        (&[1, 17, 70], 3, 3, 8),
        (&[1, 17, 70], 8, 1, 64),
        (&[1, 17, 70], 2, 1, 128),
        (&[1, 17, 70], 2, 2, 96),
        (&[13, 29], 3, 3, 40),
        (&[100, 37], 8, 2, 128),
        (&[33], 4, 1, 112),
        (&[1, 150, 70, 200], 4, 2, 64),
        (&[300, 5], 4, 4, 128),
        // DeepSeek's query/key heads (its values padded to them) and Gemma's widest.
        (&[1, 150, 70, 200], 4, 4, 192),
        (&[33, 100], 4, 2, 256),
    ] {
        if d > b.max_head_dim() {
            continue;
        }
        let layout = SeqLayout::from_lengths(lens.iter().copied());
        let t = layout.n_tokens();
        // Partial rotary (GLM-4.5 rotates half of each head) on two of the shapes: per pair,
        // and 8 pairs at a time on CUDA; latent attention's rotated tail of each head,
        // interleaved (DeepSeek) and in halves at an offset (8 pairs at a time on CUDA).
        let span = match (d, heads) {
            (96, _) => RotarySpan::leading(d, 48),
            (128, 2) => RotarySpan::leading(d, 64),
            (40, _) => RotarySpan {
                head_dim: d,
                start: 24,
                dims: 16,
                interleaved: true,
            },
            (112, _) => RotarySpan {
                head_dim: d,
                start: 48,
                dims: 64,
                interleaved: false,
            },
            _ => RotarySpan::leading(d, d),
        };
        let (half, max_pos) = (span.dims / 2, layout.max_len());
        let cos: Vec<f32> = (0..max_pos * half)
            .map(|i| ((i as f32) * 0.37).cos())
            .collect();
        let sin: Vec<f32> = (0..max_pos * half)
            .map(|i| ((i as f32) * 0.37).sin())
            .collect();
        let x = rng.normal_vec(t * heads * d, 1.0);
        let mut xg = matrix(b, "x", &x, t, heads * d)?;
        let mut xc = matrix(&cpu, "x", &x, t, heads * d)?;
        let (cc, cs) = (
            cpu.upload_vector("cos", &cos)?,
            cpu.upload_vector("sin", &sin)?,
        );
        cpu.rope(&mut xc, &layout, &cc, &cs, span)?;
        let x = cpu.download(&xc)?;
        let (bc, bs) = (b.upload_vector("cos", &cos)?, b.upload_vector("sin", &sin)?);
        let bl = b.upload_sequences(&layout)?;
        b.rope(&mut xg, &bl, &bc, &bs, span)?;
        let vars = format!(
            "seqs={lens:?} heads={heads} kv_heads={kv_heads} head_dim={d} rotary={}+{}{}",
            span.start,
            span.dims,
            if span.interleaved { " interleaved" } else { "" }
        );
        out.push(compare(
            "rope",
            vars.clone(),
            &b.download(&xg)?,
            &x,
            rel,
            true,
        ));
        // Qwen3's per-head q/k norms and the RoPE after them (one pass on CUDA where the
        // rotation covers whole heads of 16, 64, 128 or 256 values).
        let (w, xn) = (rng.normal_vec(d, 1.0), rng.normal_vec(t * heads * d, 2.0));
        let want = cpu.norm_rope(
            matrix(&cpu, "x", &xn, t, heads * d)?,
            &cpu.upload_vector("w", &w)?,
            1e-6,
            &layout,
            &cc,
            &cs,
            span,
        )?;
        let got = b.norm_rope(
            matrix(b, "x", &xn, t, heads * d)?,
            &b.upload_vector("w", &w)?,
            1e-6,
            &bl,
            &bc,
            &bs,
            span,
        )?;
        out.push(compare(
            "rms_norm + rope",
            vars.clone(),
            &b.download(&got)?,
            &cpu.download(&want)?,
            rel,
            true,
        ));

        let mut qkv = |n: usize| -> Vec<f32> {
            rng.normal_vec(t * n * d, 1.0)
                .into_iter()
                .map(|v| act.round(v))
                .collect()
        };
        let (q, k, v) = (qkv(heads), qkv(kv_heads), qkv(kv_heads));
        let (qw, kw) = (heads * d, kv_heads * d);
        let (cq, ck, cv) = (
            matrix(&cpu, "q", &q, t, qw)?,
            matrix(&cpu, "k", &k, t, kw)?,
            matrix(&cpu, "v", &v, t, kw)?,
        );
        let (bq, bk, bv) = (
            matrix(b, "q", &q, t, qw)?,
            matrix(b, "k", &k, t, kw)?,
            matrix(b, "v", &v, t, kw)?,
        );
        // Plain causal attention, then Gemma's variants: another scale, soft-capped scores
        // (a cap the scores of unit q and k cross) and a sliding window shorter than the longer
        // sequences (and one longer than a tile of every kernel).
        let causal = AttnSpec::causal(heads, kv_heads, d);
        let variants = [
            (causal, String::new()),
            (
                AttnSpec {
                    scale: 0.3,
                    softcap: Some(2.5),
                    window: Some(9),
                    ..causal
                },
                " scale=0.3 softcap=2.5 window=9".to_string(),
            ),
            (
                AttnSpec {
                    window: Some(77),
                    ..causal
                },
                " window=77".to_string(),
            ),
        ];
        // gpt-oss's per-head sinks (around the scores' size) with a window of 13.
        let sink_values = rng.normal_vec(heads, 2.0);
        let (sinks_c, sinks_b) = (
            cpu.upload_vector("sinks", &sink_values)?,
            b.upload_vector("sinks", &sink_values)?,
        );
        let with_sinks = (
            AttnSpec {
                window: Some(13),
                ..causal
            },
            " window=13 sinks".to_string(),
        );
        let last = variants.len();
        for (i, (spec, spec_name)) in variants.into_iter().chain([with_sinks]).enumerate() {
            let (sc, sb) = if i == last {
                (Some(&sinks_c), Some(&sinks_b))
            } else {
                (None, None)
            };
            let want = cpu.attention(&cq, &ck, &cv, &layout, spec, sc, OutType::Activation)?;
            let want = cpu.download(&want)?;
            for &(ot, ot_name) in outs {
                let got = b.attention(&bq, &bk, &bv, &bl, spec, sb, ot)?;
                out.push(compare(
                    "attention",
                    format!("{vars}{spec_name}{ot_name}"),
                    &b.download(&got)?,
                    &want,
                    rel,
                    true,
                ));
            }
        }
    }

    // Elementwise ops.
    let n = 1000;
    let (g, u) = (rng.normal_vec(n, 3.0), rng.normal_vec(n, 1.0));
    let (cg, cu) = (cpu.upload_vector("g", &g)?, cpu.upload_vector("u", &u)?);
    let bu = b.upload_vector("u", &u)?;
    // gpt-oss's clamped SwiGLU reads gate and up interleaved from one [rows, 2n] tensor;
    // gate values of scale 3 cross its limit.
    let swiglu = GatedActivation::ClampedSwiglu {
        alpha: 1.702,
        limit: 7.0,
    };
    let (rows, n2) = (10, n / 10);
    for act_fn in [GatedActivation::Silu, GatedActivation::GeluTanh, swiglu] {
        let interleaved = act_fn.interleaved();
        let (cg, bg) = if interleaved {
            (
                cg.clone().reshaped(rows, n2)?,
                matrix(b, "g", &g, rows, n2)?,
            )
        } else {
            (cg.clone(), b.upload_vector("g", &g)?)
        };
        let (cu_arg, bu_arg) = if interleaved {
            (None, None)
        } else {
            (Some(&cu), Some(&bu))
        };
        let want = cpu.download(&cpu.gated_act(&cg, cu_arg, act_fn, OutType::Activation)?)?;
        for &(ot, ot_name) in outs {
            out.push(compare(
                "gated_act",
                format!("{act_fn:?} n={n}{ot_name}"),
                &b.download(&b.gated_act(&bg, bu_arg, act_fn, ot)?)?,
                &want,
                out_tol(ot),
                true,
            ));
        }
    }
    let mut cg = cg;
    cpu.add_assign(&mut cg, &cu)?;
    let want = cpu.download(&cg)?;
    let mut xg = b.upload_vector("g", &g)?;
    b.add_assign(&mut xg, &b.upload_vector("u", &u)?)?;
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
    for ((rows, cols), (ot, ot_name)) in [
        (5, 4096),
        (2, 40000),
        (9, 33),
        (3, 4096),
        (4, 2048),
        (6, 4096),
    ]
    .into_iter()
    .zip(norm_outs.iter().cycle())
    {
        let (x, y) = (
            rng.normal_vec(rows * cols, 2.0),
            rng.normal_vec(rows * cols, 1.0),
        );
        let w = rng.normal_vec(cols, 1.0);
        let mut xc = matrix(&cpu, "x", &x, rows, cols)?;
        cpu.add_assign(&mut xc, &matrix(&cpu, "y", &y, rows, cols)?)?;
        let cw = cpu.upload_vector("w", &w)?;
        let want = cpu.download(&cpu.rms_norm(&xc, &cw, 1e-5, OutType::Activation)?)?;
        let want_x = cpu.download(&xc)?;
        let mut xg = matrix(b, "x", &x, rows, cols)?;
        let got = b.add_rms_norm(
            &mut xg,
            &matrix(b, "y", &y, rows, cols)?,
            &b.upload_vector("w", &w)?,
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
    // The test model's head is dense or INT4 (the KLD's two heads differ in kind then).
    for (vocab, hidden, rows, int4_head) in [
        (1000, 48, 9, false),
        (32003, 64, 5, false),
        (512, 256, 40, false),
        (20011, 96, 50, true),
        // More rows than a launch of CUDA's fused head takes (8,192), in more row tiles than
        // it groups (16 of 128).
        (300, 128, 8200, false),
    ] {
        let dense = WeightKind::Dense(FloatType::Bf16);
        let head = LinearSpec::new(dense, vocab, hidden, FloatType::Bf16).build(&mut rng);
        let test_kind = if int4_head {
            WeightKind::int(4, Strategy::Group(32))
        } else {
            dense
        };
        let test_head = LinearSpec::new(test_kind, vocab, hidden, FloatType::Bf16).build(&mut rng);
        let hq = head.qlinear();
        let (ch, bh) = (cpu.upload_linear(&hq)?, b.upload_linear(&hq)?);
        let tq = test_head.qlinear();
        let (ct, bt) = (cpu.upload_linear(&tq)?, b.upload_linear(&tq)?);
        let vars = format!("vocab={vocab} hidden={hidden} rows={rows}");
        let ids: Vec<u32> = (0..rows).map(|_| rng.below(vocab as u64) as u32).collect();
        for scale in [1.0, b.activation_type().round(59.866_5)] {
            let want = cpu.download(&cpu.embed(&ch, &ids, scale)?)?;
            let got = b.download(&b.embed(&bh, &ids, scale)?)?;
            let vars = format!("{vars} scale={scale}");
            out.push(compare("embed", vars, &got, &want, rel, true));
        }

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
        let hb = matrix(b, "h", &h, rows, hidden)?;
        let hc = matrix(&cpu, "h", &h, rows, hidden)?;
        // Gemma 2 soft-caps the logits (a cap the logits of unit hidden rows cross).
        let heads = [
            ("", &ch, &bh, None),
            (" softcap=6", &ch, &bh, Some(6.0)),
            (" int4 head", &ct, &bt, None),
        ];
        for (head_name, c, g, softcap) in heads {
            if head_name != " int4 head" || int4_head {
                let want = cpu.nll(&hc, Head { linear: c, softcap }, &targets)?;
                let got = b.nll(&hb, Head { linear: g, softcap }, &targets)?;
                let vars = format!("{vars}{head_name}");
                out.push(compare("nll", vars, &got, &want, nll_tol, false));
            }
        }

        let h2: Vec<f32> = h.iter().map(|v| v + 0.1 * rng.normal()).collect();
        // The base soft-capped, the test not: each head's own logits.
        let (capped, plain) = (Some(6.0), None);
        let want = cpu.kld(
            &hc,
            Head {
                linear: &ch,
                softcap: capped,
            },
            &matrix(&cpu, "h2", &h2, rows, hidden)?,
            Head {
                linear: &ct,
                softcap: plain,
            },
            &targets,
        )?;
        let got = b.kld(
            &hb,
            Head {
                linear: &bh,
                softcap: capped,
            },
            &matrix(b, "h2", &h2, rows, hidden)?,
            Head {
                linear: &bt,
                softcap: plain,
            },
            &targets,
        )?;
        // The top-1 agreement flag joins the values as 0/1: a flip is an error of 1.
        let flat = |k: &[crate::backend::KldTerms]| -> Vec<f32> {
            k.iter()
                .flat_map(|t| {
                    [
                        t.kld as f32,
                        t.nll_q as f32,
                        t.nll_base as f32,
                        t.base_top_p as f32,
                        f32::from(u8::from(t.same_top)),
                    ]
                })
                .collect()
        };
        out.push(compare(
            "kld",
            vars,
            &flat(&got),
            &flat(&want),
            nll_tol,
            false,
        ));
    }
    mixture::check_mixture(b, &cpu, &mut rng, norm_outs, &mut out)?;
    Ok(out)
}
