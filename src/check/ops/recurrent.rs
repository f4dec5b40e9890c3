//! The recurrent layers' ops (gated DeltaNet, Kimi Delta Attention, Mamba-2, LFM2): the causal
//! convolution, the delta rule (a decay a value head, or a key channel) and Mamba-2's scan, the
//! gated norms of their output, and the chunked form of each recurrence against the
//! step-by-step one on the CPU (the form GPU kernels take for speed).

use super::super::{CaseReport, Ctx, compare, matrix};
use crate::Result;
use crate::backend::cpu::linear_recurrence_in;
use crate::backend::{
    Backend, Device, NormGate, OutType, Recurrence, RecurrenceGates, SeqLayout, recurrent,
};
use crate::checkpoint::config::{DeltaNetConfig, DeltaNetLayout};
use crate::rng::Rng;

/// Sequences longer and shorter than the convolution's taps and than a 64-token chunk.
const LENGTHS: [usize; 4] = [150, 3, 1, 70];
/// The same, the longest of 10 chunks: wgpu's chunk scan walks them in two dispatches on a CPU
/// Vulkan driver (its loop limit) for 160-wide keys.
const LONG_LENGTHS: [usize; 4] = [600, 3, 1, 70];

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

    // Value heads of 80 (two column blocks, the second partial), of 32 and of 48; GQA 2, 1 and
    // 2; each net under the delta rule, under Kimi's (a decay a key channel) and under
    // Mamba-2's scan (dt clamped below, and on the later nets above too).
    let nets = [
        DeltaNetConfig {
            k_heads: 2,
            v_heads: 4,
            k_dim: 32,
            v_dim: 80,
            conv_kernel: taps,
            layout: DeltaNetLayout::Split,
            tiled_values: false,
        },
        DeltaNetConfig {
            k_heads: 3,
            v_heads: 3,
            k_dim: 128,
            v_dim: 32,
            conv_kernel: taps,
            layout: DeltaNetLayout::Split,
            tiled_values: false,
        },
        // Wider keys than CUDA's chunked kernels hold: its step-by-step kernel; on a CPU Vulkan
        // driver wgpu's chunk scan in several dispatches.
        DeltaNetConfig {
            k_heads: 1,
            v_heads: 2,
            k_dim: 160,
            v_dim: 48,
            conv_kernel: taps,
            layout: DeltaNetLayout::Split,
            tiled_values: false,
        },
    ];
    // Each net on its sequences; the first again on many short ones (many chunk lists, a
    // chunk boundary in each), its value heads tiled (llama.cpp's Qwen3.5 files).
    let lengths = [&LENGTHS[..], &LENGTHS, &LONG_LENGTHS, &[66; 40]];
    let tiled = DeltaNetConfig {
        tiled_values: true,
        ..nets[0]
    };
    for (n, (net, lengths)) in nets.into_iter().chain([tiled]).zip(lengths).enumerate() {
        let layout = SeqLayout::from_lengths(lengths.iter().copied());
        let t = layout.n_tokens();
        let (bl, cl) = (b.upload_sequences(&layout)?, cpu.upload_sequences(&layout)?);
        let (bl, cl) = (&bl, &cl);
        let seqs = match lengths.len() {
            ..=4 => format!("seqs={lengths:?}"),
            many => format!("seqs={many}x{}", lengths[0]),
        };
        // The delta rule, Kimi's, Kimi's under GLM-5.3-Flash's safe gate, Mamba-2's scan.
        let rules = [
            (false, false, None),
            (false, true, None),
            (false, true, Some(-5.0)),
            (true, false, None),
        ];
        for (ssd, per_key, lower_bound) in rules {
            let kind = (ssd, per_key, lower_bound);
            let hv = net.v_heads;
            // Decay inputs a value head, or a value head and key channel.
            let dw = if per_key { hv * net.k_dim } else { hv };
            let qkv = rng.normal_vec(t * net.conv_width(), 1.0);
            let (a, beta) = (rng.normal_vec(t * dw, 1.0), rng.normal_vec(t * hv, 2.0));
            // Decays from about 0.5 a token to nearly none.
            let a_log: Vec<f32> = (0..hv).map(|h| -(h as f32) / hv as f32).collect();
            let dt_bias: Vec<f32> = (0..dw).map(|h| -5.0 + 5.0 * h as f32 / dw as f32).collect();
            let skip = rng.normal_vec(hv, 1.0);
            let values = [&qkv[..], &a, &beta, &skip, &a_log, &dt_bias];
            let (dt_min, dt_max) = (1e-3, if n == 0 { f32::INFINITY } else { 0.5 });
            let cpu_in = recurrence_inputs(cpu, values, t, net, dw)?;
            let cpu_rule = rule_of(kind, &cpu_in, dt_min, dt_max);
            let [cq, ca, _, _, cal, cdt] = &cpu_in;
            let cg = RecurrenceGates {
                a: ca,
                a_log: cal,
                dt_bias: cdt,
                rule: cpu_rule,
            };
            let want =
                cpu.download(&cpu.linear_recurrence(cq, cg, cl, net, OutType::Activation)?)?;
            let b_in = recurrence_inputs(b, values, t, net, dw)?;
            let [bq, ba, _, _, bal, bdt] = &b_in;
            let bg = RecurrenceGates {
                a: ba,
                a_log: bal,
                dt_bias: bdt,
                rule: rule_of(kind, &b_in, dt_min, dt_max),
            };
            let vars = format!(
                "{} {seqs} k_heads={} v_heads={hv}{} k_dim={} v_dim={}",
                match kind {
                    (true, _, _) => "ssd",
                    (false, true, None) => "kimi-delta",
                    (false, true, Some(_)) => "kimi-delta safe-gate",
                    (false, false, _) => "delta",
                },
                net.k_heads,
                if net.tiled_values { " tiled" } else { "" },
                net.k_dim,
                net.v_dim
            );
            for &(ot, ot_name) in c.outs {
                out.push(compare(
                    "linear_recurrence",
                    format!("{vars}{ot_name}"),
                    &b.download(&b.linear_recurrence(bq, bg, bl, net, ot)?)?,
                    &want,
                    c.out_tol(ot),
                    true,
                ));
            }
            let chunked = linear_recurrence_in(cq, cg, cl, net, |x| {
                recurrent::delta_rule_chunked(x, recurrent::CHUNK)
            })?;
            out.push(compare(
                "linear_recurrence chunked (cpu)",
                format!("{vars} chunk={}", recurrent::CHUNK),
                &cpu.download(&chunked)?,
                &want,
                1e-6,
                true,
            ));
        }
    }

    // Gated DeltaNet's norm (a group a head, normed then gated) and Mamba-2's (two groups
    // over the row's three heads, the weight the row's width, gated then normed), Kimi's
    // (a group a head, normed then gated by a sigmoid).
    let (rows, heads, d) = (7, 3, 80);
    let (x, gate) = (
        rng.normal_vec(rows * heads * d, 2.0),
        rng.normal_vec(rows * heads * d, 2.0),
    );
    for (group, width, how) in [
        (d, d, NormGate::SiluAfter),
        (heads * d / 2, heads * d, NormGate::SiluBefore),
        (d, d, NormGate::SigmoidAfter),
    ] {
        let w: Vec<f32> = rng.normal_vec(width, 0.1).iter().map(|v| 1.0 + v).collect();
        let (cx, cgate, cw) = (
            matrix(cpu, "x", &x, rows, heads * d)?,
            matrix(cpu, "gate", &gate, rows, heads * d)?,
            matrix(cpu, "w", &w, 1, width)?,
        );
        let want = cpu.gated_rms_norm(&cx, &cgate, &cw, group, how, 1e-6, OutType::Activation)?;
        let want = cpu.download(&want)?;
        let (bx, bgate, bw) = (
            matrix(b, "x", &x, rows, heads * d)?,
            matrix(b, "gate", &gate, rows, heads * d)?,
            matrix(b, "w", &w, 1, width)?,
        );
        for &(ot, ot_name) in c.outs {
            let got = b.gated_rms_norm(&bx, &bgate, &bw, group, how, 1e-6, ot)?;
            out.push(compare(
                "gated_rms_norm",
                format!(
                    "rows={rows} cols={} group={group} gate={how:?}{ot_name}",
                    heads * d
                ),
                &b.download(&got)?,
                &want,
                c.out_tol(ot),
                true,
            ));
        }
    }
    Ok(())
}

/// The delta rule reading `b` (`per_key`: Kimi's; with its safe gate's `lower_bound`), or
/// Mamba-2's scan reading `D`, of `recurrence_inputs`.
fn rule_of<T>(
    (ssd, per_key, lower_bound): (bool, bool, Option<f32>),
    [_, _, b, d, _, _]: &[T; 6],
    dt_min: f32,
    dt_max: f32,
) -> Recurrence<'_, T> {
    match ssd {
        false => Recurrence::Delta {
            b,
            per_key,
            lower_bound,
        },
        true => Recurrence::Ssd { d, dt_min, dt_max },
    }
}

/// A recurrence's inputs on `d`: qkv `[t, conv width]`, a `[t, dw]`, b `[t, v_heads]`, D and
/// A_log `[1, v_heads]`, dt_bias `[1, dw]` (`dw` the decay inputs a token).
fn recurrence_inputs<D: Device>(
    d: &D,
    [qkv, a, b, skip, a_log, dt_bias]: [&[f32]; 6],
    t: usize,
    net: DeltaNetConfig,
    dw: usize,
) -> Result<[D::Tensor; 6]> {
    let hv = net.v_heads;
    Ok([
        matrix(d, "qkv", qkv, t, net.conv_width())?,
        matrix(d, "a", a, t, dw)?,
        matrix(d, "b", b, t, hv)?,
        matrix(d, "D", skip, 1, hv)?,
        matrix(d, "A_log", a_log, 1, hv)?,
        matrix(d, "dt_bias", dt_bias, 1, dw)?,
    ])
}
