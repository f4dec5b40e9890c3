//! RMSNorm alone and fused with the residual add before it: rows no workgroup size divides,
//! rows that do not fit a block's registers, and every output type a linear may read.

use super::super::{CaseReport, Ctx, compare, matrix};
use crate::Result;
use crate::backend::{Backend, Device, OutType};
use crate::rng::Rng;

pub(in crate::check) fn cases<B: Backend>(
    c: &Ctx<'_, B>,
    rng: &mut Rng,
    out: &mut Vec<CaseReport>,
) -> Result<()> {
    let (b, cpu, rel) = (c.b, &c.cpu, c.rel);
    let (norm_outs, out_tol) = (c.norm_outs, |ot: OutType| c.out_tol(ot));
    // RMSNorm, with a row length that no workgroup size divides, rows of a head (a warp each
    // on CUDA) in a count no block's rows divide, and rows of 3 values (a segment of one
    // invocation each on wgpu, 256 rows a workgroup, the last workgroup part full).
    for ((rows, cols), (ot, ot_name)) in [
        (7, 200),
        (1, 64),
        (300, 33),
        (37, 128),
        (5, 2048),
        (6, 1024),
        (1000, 3),
    ]
    .into_iter()
    .zip(norm_outs.iter().cycle())
    {
        let x = rng.normal_vec(rows * cols, 2.0);
        let w = rng.normal_vec(cols, 1.0);
        let want = cpu.download(&cpu.rms_norm(
            &matrix(cpu, "x", &x, rows, cols)?,
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
        let mut xc = matrix(cpu, "x", &x, rows, cols)?;
        cpu.add_assign(&mut xc, &matrix(cpu, "y", &y, rows, cols)?)?;
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

    Ok(())
}
