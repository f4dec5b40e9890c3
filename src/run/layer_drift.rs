//! `compare --layers`: how far each quantized model's residual stream is from the base's after
//! every decoder layer, at the same positions: the sums per layer the report turns into means
//! and a ranking.

use anyhow::{Context, bail};
use rayon::prelude::*;

use super::compare::CompareRun;
use super::devices::{DeviceRequest, OnBackend, progress_bar, with_backend};
use crate::backend::{Backend, SeqLayout};
use crate::checkpoint::Checkpoint;
use crate::model::Model;

/// One layer's sums over the positions compared.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerSums {
    /// Of `||h_Q - h_base|| / ||h_base||`, in f64.
    pub rel_l2: f64,
    /// Of the cosine similarity of `h_Q` and `h_base`.
    pub cosine: f64,
    pub positions: u64,
}

/// Adds the positions of one layer to `sums[layer]`: `base` and `q` hold `hidden` values a
/// position, in the same order.
pub fn add_positions(
    sums: &mut Vec<LayerSums>,
    layer: usize,
    (base, q): (&[f32], &[f32]),
    hidden: usize,
) {
    if sums.len() <= layer {
        sums.resize(layer + 1, LayerSums::default());
    }
    // Each position on its own core, summed in position order.
    let terms: Vec<(f64, f64)> = base
        .par_chunks_exact(hidden)
        .zip(q.par_chunks_exact(hidden))
        .map(|(p, q)| {
            let (mut pp, mut qq, mut pq, mut dd) = (0f64, 0f64, 0f64, 0f64);
            for (&a, &b) in p.iter().zip(q) {
                let (a, b) = (f64::from(a), f64::from(b));
                pp += a * a;
                qq += b * b;
                pq += a * b;
                dd += (b - a) * (b - a);
            }
            ((dd / pp).sqrt(), pq / (pp.sqrt() * qq.sqrt()))
        })
        .collect();
    let s = &mut sums[layer];
    for (rel, cos) in terms {
        s.rel_l2 += rel;
        s.cosine += cos;
        s.positions += 1;
    }
}

impl CompareRun {
    /// `compare --layers`: each quantized model's residual stream after every decoder layer
    /// against the base's, at the scored positions of every window: a pass of its own after
    /// the comparison, on one device, a window at a time (each layer's stream of both models
    /// comes to the host). `result[m]` holds quantized model `m`'s sums per layer.
    pub fn layer_drift(
        &self,
        req: &DeviceRequest,
        quiet: bool,
    ) -> anyhow::Result<Vec<Vec<LayerSums>>> {
        let job = LayerDriftJob { run: self, quiet };
        with_backend(req, self.base.ckpt.config.auto_activation_dtype(), job)
    }
}

struct LayerDriftJob<'a> {
    run: &'a CompareRun,
    quiet: bool,
}

impl OnBackend for LayerDriftJob<'_> {
    type Output = Vec<Vec<LayerSums>>;
    const ONE_DEVICE: bool = true;

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<Self::Output> {
        let (run, b) = (self.run, &backends[0]);
        let plan = &run.prepared.plan;
        let base_cfg = &run.base.ckpt.config;
        for q in &run.quants {
            let c = &q.ckpt.config;
            if (c.num_layers, c.hidden_size) != (base_cfg.num_layers, base_cfg.hidden_size) {
                bail!(
                    "--layers: {} has {} layers of width {}, the base {} has {} of width {}: \
                     their residual streams cannot be compared layer by layer",
                    q.name,
                    c.num_layers,
                    c.hidden_size,
                    run.base.name,
                    base_cfg.num_layers,
                    base_cfg.hidden_size
                );
            }
        }
        let load = |ckpt: &Checkpoint| Model::load(b, ckpt, plan.max_window(), &|_, _| {});
        let base = load(&run.base.ckpt).context("--layers: loading the base")?;
        let bar = progress_bar(
            (plan.windows.len() * run.quants.len()) as u64,
            "windows (layers)",
            self.quiet,
        );
        let mut out = Vec::with_capacity(run.quants.len());
        for q in &run.quants {
            let quant = load(&q.ckpt).with_context(|| format!("--layers: loading {}", q.name))?;
            let mut sums = Vec::new();
            for w in &plan.windows {
                let rows: Vec<usize> = (0..w.targets.len())
                    .filter(|&r| w.targets[r] >= 0)
                    .collect();
                let layout = SeqLayout::from_sequences([(w.ids.len(), w.branches.as_ref())]);
                let p = base.layer_states(b, &w.ids, &layout, &rows)?;
                let qs = quant.layer_states(b, &w.ids, &layout, &rows)?;
                for (layer, (p, q)) in p.iter().zip(&qs).enumerate() {
                    // The hidden size, or DeepSeek-V4's streams side by side.
                    let width = p.len() / rows.len().max(1);
                    add_positions(&mut sums, layer, (p, q), width);
                }
                bar.inc(1);
            }
            out.push(sums);
        }
        bar.finish_and_clear();
        Ok(out)
    }
}
