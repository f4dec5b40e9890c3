//! DeepSeek-V4's own ops: the hyper-connections' weights (sigmoids, softmaxes, Sinkhorn's
//! passes) and their mix of the residual streams (collapsed into a block's input, mixed with
//! its output spread over them), the compressors' pooling of windows of tokens (one series,
//! and CSA's two overlapping ones) and each query's key list (its window, then the entries it
//! has seen or the indexer picked), over sequences shorter than a window, of whole windows and
//! with a partial last one.

use super::super::{CaseReport, Ctx, compare, matrix};
use crate::Result;
use crate::backend::compressed::{EntryKeys, HyperRule};
use crate::backend::{Backend, Device, OutType, SeqLayout, Shaped};
use crate::checkpoint::config::KeyPools;
use crate::numerics::FloatType;
use crate::rng::Rng;
use crate::synth::linear::{LinearSpec, WeightKind};

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
    // The weights from `fn` over the normed streams. bf16 values: CUDA's bf16 mode holds a
    // dense weight in bf16 (the model's f32 `fn` too, within its contract), so these keep its
    // products exact and the case checks the op's own work.
    let outputs = (2 + n) * n;
    let bf16 = FloatType::Bf16;
    let mix = LinearSpec::new(WeightKind::Dense(bf16), outputs, n * d, bf16).build(rng);
    let (mix_b, mix_c) = (
        b.upload_linear(&mix.qlinear())?,
        cpu.upload_linear(&mix.qlinear())?,
    );
    let base = rng.normal_vec(outputs, 0.5);
    let ones = b.upload_vector("stream norm", &vec![1.0; n * d])?;
    let normed_b = b.rms_norm(&sb, &ones, 1e-6, OutType::F32)?;
    let normed_c = matrix(cpu, "normed", &b.download(&normed_b)?, rows, n * d)?;
    for (iters, eps) in [(20, 1e-6), (1, 1e-2)] {
        let rule = HyperRule {
            streams: n,
            base: &base,
            scale: [0.8, 1.3, 2.5],
            eps,
            iters,
        };
        let got = b.hyper_weights(&normed_b, &mix_b, &rule)?;
        let want = cpu.hyper_weights(&normed_c, &mix_c, &rule)?;
        for ((g, w), what) in got.iter().zip(&want).zip(["pre", "post", "comb"]) {
            out.push(compare(
                "hyper_weights",
                format!("rows={rows} streams={n} hidden={d} Sinkhorn passes={iters} {what}"),
                &b.download(g)?,
                &cpu.download(w)?,
                c.out_tol(OutType::F32),
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
    // Key lists: windows shorter and longer than sequences, every entry seen, and the
    // indexer's picks (ascending entries a query has seen, then -1s).
    for (window, rate) in [(8, 4), (200, 16)] {
        let top_k = 6;
        let mut picks = vec![-1.0f32; t * top_k];
        for (r, row) in picks.chunks_exact_mut(top_k).enumerate() {
            let s = layout.starts.partition_point(|&a| a <= r) - 1;
            let seen = (r - layout.starts[s] + 1) / rate;
            let mut chosen: Vec<usize> = (0..seen).filter(|_| rng.below(2) == 0).collect();
            chosen.truncate(top_k);
            for (slot, e) in row.iter_mut().zip(chosen) {
                *slot = e as f32;
            }
        }
        let (pc, pb) = (
            matrix(cpu, "picks", &picks, t, top_k)?,
            matrix(b, "picks", &picks, t, top_k)?,
        );
        // The same picks as GLM-5.3-Flash's pools of `rate` tokens, with and without the tail.
        let pools = |tail| KeyPools { size: rate, tail };
        let cases = [
            (EntryKeys::Seen { rate }, EntryKeys::Seen { rate }, "seen"),
            (EntryKeys::Picked(&pb), EntryKeys::Picked(&pc), "picked"),
            (
                EntryKeys::Pools {
                    picks: &pb,
                    pools: pools(true),
                },
                EntryKeys::Pools {
                    picks: &pc,
                    pools: pools(true),
                },
                "pools and tail",
            ),
            (
                EntryKeys::Pools {
                    picks: &pb,
                    pools: pools(false),
                },
                EntryKeys::Pools {
                    picks: &pc,
                    pools: pools(false),
                },
                "pools",
            ),
        ];
        for (eb, ec, what) in cases {
            let got = b.compressed_keys((&seqs_b, &layout), window, eb)?;
            let want = cpu.compressed_keys((&seqs_c, &layout), window, ec)?;
            out.push(compare(
                "compressed_keys",
                format!("tokens={t} window={window} rate={rate} {what}"),
                &b.download(&got)?,
                &cpu.download(&want)?,
                0.0,
                false,
            ));
        }
    }
    Ok(())
}
