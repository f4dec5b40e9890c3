//! DeepSeek-V4's own ops: the hyper-connections' mix of the residual streams (collapsed into a
//! block's input, mixed with its output spread over them) and the compressors' pooling of
//! windows of tokens (one series, and CSA's two overlapping ones), over sequences shorter than
//! a window, of whole windows and with a partial last one.

use super::super::{CaseReport, Ctx, compare, matrix};
use crate::Result;
use crate::backend::{Backend, Device, OutType, SeqLayout, Shaped};
use crate::rng::Rng;

pub(in crate::check) fn cases<B: Backend>(
    c: &Ctx<'_, B>,
    rng: &mut Rng,
    out: &mut Vec<CaseReport>,
) -> Result<()> {
    let (b, cpu) = (c.b, &c.cpu);
    let (rows, n, d) = (37, 4, 96);
    let streams = rng.normal_vec(rows * n * d, 1.0);
    let (sc, sb) = (
        matrix(cpu, "streams", &streams, rows, n * d)?,
        matrix(b, "streams", &streams, rows, n * d)?,
    );
    for m in [1, n] {
        let weights = rng.normal_vec(rows * n * m, 0.5);
        let (x, scales) = (rng.normal_vec(rows * d, 1.0), rng.normal_vec(rows * m, 1.0));
        let (wc, wb) = (
            matrix(cpu, "weights", &weights, rows, n * m)?,
            matrix(b, "weights", &weights, rows, n * m)?,
        );
        // The block's output as the backend holds activations (bf16-rounded on CUDA's bf16).
        let xb = b.upload_activation(&x)?.reshaped(rows, d)?;
        let xc = matrix(cpu, "x", &b.download(&xb)?, rows, d)?;
        let (scc, scb) = (
            matrix(cpu, "scales", &scales, rows, m)?,
            matrix(b, "scales", &scales, rows, m)?,
        );
        let added = [(None, None, ""), (Some(&xc), Some(&xb), " + output")];
        for (xc, xb, what) in added {
            let want = cpu.mix_streams(&sc, &wc, xc.map(|x| (x, &scc)), m)?;
            let got = b.mix_streams(&sb, &wb, xb.map(|x| (x, &scb)), m)?;
            out.push(compare(
                "mix_streams",
                format!("rows={rows} streams={n} outputs={m} hidden={d}{what}"),
                &b.download(&got)?,
                &cpu.download(&want)?,
                c.rel,
                true,
            ));
        }
    }
    let layout = SeqLayout::from_lengths([3, 16, 130, 9]);
    let t = layout.n_tokens();
    let (seqs_c, seqs_b) = (cpu.upload_sequences(&layout)?, b.upload_sequences(&layout)?);
    for (rate, overlap, w) in [(4, true, 64), (128, false, 48), (4, false, 16)] {
        let cols = w * if overlap { 2 } else { 1 };
        let (kv, gate) = (rng.normal_vec(t * cols, 1.0), rng.normal_vec(t * cols, 2.0));
        let bias = rng.normal_vec(rate * cols, 0.5);
        let (kb, gb) = (
            b.upload_activation(&kv)?.reshaped(t, cols)?,
            b.upload_activation(&gate)?.reshaped(t, cols)?,
        );
        let want = cpu.pool_windows(
            &matrix(cpu, "kv", &b.download(&kb)?, t, cols)?,
            &matrix(cpu, "gate", &b.download(&gb)?, t, cols)?,
            &matrix(cpu, "bias", &bias, rate, cols)?,
            &seqs_c,
            (rate, overlap),
        )?;
        let bias_b = matrix(b, "bias", &bias, rate, cols)?;
        let got = b.pool_windows(&kb, &gb, &bias_b, &seqs_b, (rate, overlap))?;
        out.push(compare(
            "pool_windows",
            format!(
                "tokens={t} rate={rate} width={w}{}",
                if overlap { " overlapping" } else { "" }
            ),
            &b.download(&got)?,
            &cpu.download(&want)?,
            c.out_tol(OutType::F32),
            true,
        ));
    }
    Ok(())
}
