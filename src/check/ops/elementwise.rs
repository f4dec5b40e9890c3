//! Elementwise ops: the gated activations (SiLU, GELU-tanh, gpt-oss's clamped SwiGLU on
//! interleaved gate/up), the residual add and column scales.

use super::super::{CaseReport, Ctx, compare, matrix};
use crate::Result;
use crate::backend::{Backend, Device, OutType, Shaped};
use crate::checkpoint::GatedActivation;
use crate::rng::Rng;

pub(in crate::check) fn cases<B: Backend>(
    c: &Ctx<'_, B>,
    rng: &mut Rng,
    out: &mut Vec<CaseReport>,
) -> Result<()> {
    let (b, cpu, rel) = (c.b, &c.cpu, c.rel);
    let (outs, out_tol) = (c.outs, |ot: OutType| c.out_tol(ot));
    // Elementwise ops.
    let n = 1000;
    let (g, u) = (rng.normal_vec(n, 3.0), rng.normal_vec(n, 1.0));
    let (cg, cu) = (cpu.upload_vector("g", &g)?, cpu.upload_vector("u", &u)?);
    let bu = b.upload_vector("u", &u)?;
    // gpt-oss's clamped SwiGLU reads gate and up interleaved from one [rows, 2n] tensor (its
    // checkpoints) or apart (its GGUF files); gate values of scale 3 cross its limit.
    let swiglu = GatedActivation::ClampedSwiglu {
        alpha: 1.702,
        limit: 7.0,
    };
    let (rows, n2) = (10, n / 10);
    // Sigmoid: Qwen3.5's attention output gate; Product: LFM2's short convolution's gates;
    // Relu2: Nemotron-H's ungated MLP (no up).
    for (act_fn, interleaved) in [
        (GatedActivation::Silu, false),
        (GatedActivation::GeluTanh, false),
        (swiglu, true),
        (swiglu, false),
        (GatedActivation::Sigmoid, false),
        (GatedActivation::Product, false),
        (GatedActivation::Relu2, false),
        // DeepSeek-V4's: a limit both operands cross.
        (GatedActivation::ClampedSilu { limit: 1.5 }, false),
    ] {
        let (cg, bg) = if interleaved {
            (
                cg.clone().reshaped(rows, n2)?,
                matrix(b, "g", &g, rows, n2)?,
            )
        } else {
            (cg.clone(), b.upload_vector("g", &g)?)
        };
        let (cu_arg, bu_arg) = if interleaved || act_fn.ungated() {
            (None, None)
        } else {
            (Some(&cu), Some(&bu))
        };
        let want = cpu.download(&cpu.gated_act(&cg, cu_arg, act_fn, OutType::Activation)?)?;
        for &(ot, ot_name) in outs {
            out.push(compare(
                "gated_act",
                format!(
                    "{act_fn:?}{} n={n}{ot_name}",
                    if interleaved { " interleaved" } else { "" }
                ),
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
    // Falcon-H1's multipliers: each column of a linear's output (in the activation type)
    // times its factor, in place.
    let (rows, cols) = (7, 150);
    let x = rng.normal_vec(rows * cols, 2.0);
    let factors = rng.normal_vec(cols, 1.0);
    let mut cx = matrix(cpu, "x", &x, rows, cols)?;
    cpu.scale_columns(&mut cx, &cpu.upload_vector("factors", &factors)?)?;
    let want = cpu.download(&cx)?;
    let mut bx = b.upload_activation(&x)?.reshaped(rows, cols)?;
    b.scale_columns(&mut bx, &b.upload_vector("factors", &factors)?)?;
    out.push(compare(
        "scale_columns",
        format!("rows={rows} cols={cols}"),
        &b.download(&bx)?,
        &want,
        out_tol(OutType::Activation),
        true,
    ));
    // serve's prefix cache: rows of kept keys and of a batch's own, joined in any order; a
    // copy, so exactly the parts' values (one part: the batch's rows out of the attention's).
    let cols = 136;
    let part_rows = [5, 1, 9];
    let mut parts = Vec::new();
    let mut joined = Vec::new();
    for &n in &part_rows {
        let part = b
            .upload_activation(&rng.normal_vec(n * cols, 1.0))?
            .reshaped(n, cols)?;
        joined.extend(b.download(&part)?);
        parts.push(part);
    }
    let total: usize = part_rows.iter().sum();
    let rows: Vec<u32> = (0..2 * total)
        .map(|i| ((i * 7 + 3) % total) as u32)
        .collect();
    for n in [1, part_rows.len()] {
        let within = part_rows[..n].iter().sum::<usize>() as u32;
        let rows: Vec<u32> = rows.iter().map(|&r| r % within).collect();
        let want: Vec<f32> = rows
            .iter()
            .flat_map(|&r| &joined[r as usize * cols..(r as usize + 1) * cols])
            .copied()
            .collect();
        let refs: Vec<&B::Tensor> = parts[..n].iter().collect();
        out.push(compare(
            "take_rows",
            format!("parts={n} rows={} cols={cols}", rows.len()),
            &b.download(&b.take_rows(&refs, &rows)?)?,
            &want,
            0.0,
            false,
        ));
    }

    Ok(())
}
