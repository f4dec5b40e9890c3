//! The recurrent layers' ops (gated DeltaNet, LFM2): the causal convolution, the delta rule, the
//! gated norm of its output, and the chunked form of the delta rule against the step-by-step
//! one on the CPU (the form GPU kernels take for speed).

use super::super::{CaseReport, Ctx, compare, matrix};
use crate::Result;
use crate::backend::cpu::gated_delta_rule_in;
use crate::backend::{Backend, DeltaGates, Device, OutType, SeqLayout, recurrent};
use crate::checkpoint::DeltaNetConfig;
use crate::rng::Rng;

/// Sequences longer and shorter than the convolution's taps and than a 64-token chunk.
const LENGTHS: [usize; 4] = [150, 3, 1, 70];

pub(in crate::check) fn cases<B: Backend>(
    c: &Ctx<'_, B>,
    rng: &mut Rng,
    out: &mut Vec<CaseReport>,
) -> Result<()> {
    let (b, cpu) = (c.b, &c.cpu);
    let layout = SeqLayout::from_lengths(LENGTHS);
    let t = layout.n_tokens();
    let (bl, cl) = (b.upload_sequences(&layout)?, cpu.upload_sequences(&layout)?);
    let seqs = format!("seqs={LENGTHS:?}");

    // Gated DeltaNet's (SiLU, no bias) and LFM2's (neither; here with a bias, Mamba-2's).
    let (channels, taps) = (72, 4);
    let x = rng.normal_vec(t * channels, 1.0);
    let w = rng.normal_vec(channels * taps, 0.5);
    let bias = rng.normal_vec(channels, 0.5);
    let (cx, cw, cbias) = (
        matrix(cpu, "x", &x, t, channels)?,
        matrix(cpu, "w", &w, channels, taps)?,
        matrix(cpu, "bias", &bias, 1, channels)?,
    );
    let (bx, bw, bbias) = (
        matrix(b, "x", &x, t, channels)?,
        matrix(b, "w", &w, channels, taps)?,
        matrix(b, "bias", &bias, 1, channels)?,
    );
    for (silu, biased) in [(true, false), (false, true)] {
        let want = cpu.causal_conv(
            &cx,
            &cw,
            biased.then_some(&cbias),
            silu,
            &cl,
            OutType::Activation,
        )?;
        let form = match silu {
            true => " silu",
            false => " bias",
        };
        for &(ot, ot_name) in c.outs {
            let got = b.causal_conv(&bx, &bw, biased.then_some(&bbias), silu, &bl, ot)?;
            out.push(compare(
                "causal_conv",
                format!("{seqs} channels={channels} taps={taps}{form}{ot_name}"),
                &b.download(&got)?,
                &cpu.download(&want)?,
                c.out_tol(ot),
                true,
            ));
        }
    }

    // Value heads of 80 (two column blocks, the second partial) and of 32; GQA 2 and 1.
    for net in [
        DeltaNetConfig {
            k_heads: 2,
            v_heads: 4,
            k_dim: 32,
            v_dim: 80,
            conv_kernel: taps,
            fused_projections: false,
        },
        DeltaNetConfig {
            k_heads: 3,
            v_heads: 3,
            k_dim: 128,
            v_dim: 32,
            conv_kernel: taps,
            fused_projections: false,
        },
    ] {
        let hv = net.v_heads;
        let qkv = rng.normal_vec(t * net.conv_width(), 1.0);
        let (a, beta) = (rng.normal_vec(t * hv, 1.0), rng.normal_vec(t * hv, 2.0));
        // Decays from about 0.5 a token to nearly none.
        let a_log: Vec<f32> = (0..hv).map(|h| -(h as f32) / hv as f32).collect();
        let dt_bias: Vec<f32> = (0..hv).map(|h| -5.0 + 5.0 * h as f32 / hv as f32).collect();
        let values = [&qkv[..], &a, &beta, &a_log, &dt_bias];
        let [cq, ca, cb, cal, cdt] = delta_inputs(cpu, values, t, net)?;
        let cg = DeltaGates {
            a: &ca,
            b: &cb,
            a_log: &cal,
            dt_bias: &cdt,
        };
        let want =
            cpu.download(&cpu.gated_delta_rule(&cq, cg, &cl, net, OutType::Activation)?)?;
        let [bq, ba, bb, bal, bdt] = delta_inputs(b, values, t, net)?;
        let bg = DeltaGates {
            a: &ba,
            b: &bb,
            a_log: &bal,
            dt_bias: &bdt,
        };
        let vars = format!(
            "{seqs} k_heads={} v_heads={hv} k_dim={} v_dim={}",
            net.k_heads, net.k_dim, net.v_dim
        );
        for &(ot, ot_name) in c.outs {
            out.push(compare(
                "gated_delta_rule",
                format!("{vars}{ot_name}"),
                &b.download(&b.gated_delta_rule(&bq, bg, &bl, net, ot)?)?,
                &want,
                c.out_tol(ot),
                true,
            ));
        }
        let chunked =
            gated_delta_rule_in(&cq, cg, &cl, net, |x| recurrent::delta_rule_chunked(x, 64))?;
        out.push(compare(
            "gated_delta_rule chunked (cpu)",
            format!("{vars} chunk=64"),
            &cpu.download(&chunked)?,
            &want,
            1e-6,
            true,
        ));
    }

    let (rows, heads, d) = (7, 3, 80);
    let (x, gate) = (
        rng.normal_vec(rows * heads * d, 2.0),
        rng.normal_vec(rows * heads * d, 2.0),
    );
    let w: Vec<f32> = rng.normal_vec(d, 0.1).iter().map(|v| 1.0 + v).collect();
    let (cx, cgate, cw) = (
        matrix(cpu, "x", &x, rows, heads * d)?,
        matrix(cpu, "gate", &gate, rows, heads * d)?,
        matrix(cpu, "w", &w, 1, d)?,
    );
    let want = cpu.download(&cpu.gated_rms_norm(&cx, &cgate, &cw, 1e-6, OutType::Activation)?)?;
    let (bx, bgate, bw) = (
        matrix(b, "x", &x, rows, heads * d)?,
        matrix(b, "gate", &gate, rows, heads * d)?,
        matrix(b, "w", &w, 1, d)?,
    );
    for &(ot, ot_name) in c.outs {
        out.push(compare(
            "gated_rms_norm",
            format!("rows={rows} heads={heads} d={d}{ot_name}"),
            &b.download(&b.gated_rms_norm(&bx, &bgate, &bw, 1e-6, ot)?)?,
            &want,
            c.out_tol(ot),
            true,
        ));
    }
    Ok(())
}

/// The delta rule's inputs on `d`: qkv `[t, conv width]`, a and b `[t, v_heads]`, A_log and
/// dt_bias `[1, v_heads]`.
fn delta_inputs<D: Device>(
    d: &D,
    [qkv, a, b, a_log, dt_bias]: [&[f32]; 5],
    t: usize,
    net: DeltaNetConfig,
) -> Result<[D::Tensor; 5]> {
    let hv = net.v_heads;
    Ok([
        matrix(d, "qkv", qkv, t, net.conv_width())?,
        matrix(d, "a", a, t, hv)?,
        matrix(d, "b", b, t, hv)?,
        matrix(d, "A_log", a_log, 1, hv)?,
        matrix(d, "dt_bias", dt_bias, 1, hv)?,
    ])
}
