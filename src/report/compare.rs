//! What `compare` reports: each quantized model against its base, with llama.cpp's
//! `--kl-divergence` statistics, ExLlamaV3's KLD by reference confidence, the reverse KLD,
//! top-K agreement and flips (all computed by [`KldStats`]), as human text, JSON, a model-card
//! Markdown table and an SVG plot.

use serde::Serialize;

use super::eval::{DevicesSummary, PlanSummary};
use super::metrics::{
    KldReport, KldStats, LayerDrift, NllStats, Percentile, ValueUnc, layer_drift,
};
use super::table::{render_table, short_name};
use super::{Plot, PlotMetric, Rendered};
use crate::backend::KldTerms;
use crate::run::ModelSummary;
use crate::run::{RunInfo, Timing};
use crate::units::human_bytes;

#[derive(Clone, Debug, Serialize)]
pub struct ComparedModel {
    pub model: ModelSummary,
    pub kld: KldReport,
    /// `--layers`: the residual stream's drift from the base's after each decoder layer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers: Option<Vec<LayerDrift>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CompareReport {
    pub quantppl_version: &'static str,
    pub base: ModelSummary,
    /// The base's own PPL ± llama.cpp stderr, as `eval` reports it.
    pub base_ppl: ValueUnc,
    pub models: Vec<ComparedModel>,
    #[serde(flatten)]
    pub plan: PlanSummary,
    #[serde(flatten)]
    pub devices: DevicesSummary,
    pub wall_seconds: f64,
    /// Tokens through the models per second (base and quantized forwards both counted).
    pub tokens_per_second: f64,
    pub peak_device_memory_bytes: Option<u64>,
    /// The saved base states the base's distributions were read from (`--base-states`), or
    /// `None` when the base ran beside the quantized models.
    pub base_states: Option<BaseStatesUsed>,
}

/// A base-states file a comparison read.
#[derive(Clone, Debug, Serialize)]
pub struct BaseStatesUsed {
    pub file: String,
    pub bytes: u64,
    /// `f32` (exact: the numbers of an in-memory compare) or `bf16`.
    pub dtype: String,
}

/// Sums one model's per-window terms in window order.
pub fn kld_stats(windows: &[Vec<KldTerms>]) -> KldStats {
    let mut s = KldStats::default();
    windows.iter().flatten().for_each(|t| s.push(t));
    s
}

impl CompareReport {
    /// Adds `compare --layers`' sums, `sums[m]` quantized model `m`'s per layer.
    pub fn with_layers(mut self, sums: &[Vec<crate::run::layer_drift::LayerSums>]) -> Self {
        for (m, s) in self.models.iter_mut().zip(sums) {
            m.layers = Some(layer_drift(s));
        }
        self
    }

    /// The SVG of `--layers-plot`: each model's relative distance from the base after each
    /// layer (labelled by layer; by model and layer when there are several).
    pub fn layers_svg(&self) -> Option<String> {
        let several = self.models.len() > 1;
        let points: Vec<(String, f64, f64)> = self
            .models
            .iter()
            .flat_map(|m| {
                let name = short_name(&m.model.name);
                m.layers.iter().flatten().map(move |l| {
                    let label = if several {
                        format!("{name} {}", l.layer)
                    } else {
                        l.layer.to_string()
                    };
                    (label, l.layer as f64, l.rel_l2)
                })
            })
            .collect();
        (!points.is_empty()).then(|| {
            super::svg::svg_scatter(
                &points,
                "decoder layer",
                "mean ||h_Q - h_base|| / ||h_base|| after the layer",
            )
        })
    }

    /// `results[m][w]`: quantized model `m`'s terms of window `w`, every window present,
    /// computed with `placements` (see [`parallel_label`](super::eval::parallel_label)).
    /// `timing` covers this process only (all zero for a merge).
    pub fn new(
        run: &RunInfo,
        results: &[Vec<Vec<KldTerms>>],
        placements: &[String],
        timing: Timing,
        peak_device_memory_bytes: Option<u64>,
    ) -> Self {
        // The base forward is the same for every quantized model; its NLLs come from the first.
        let mut base = NllStats::default();
        if let Some(first) = results.first() {
            first.iter().flatten().for_each(|t| base.push(t.nll_base));
        }
        let models = run.models[1..]
            .iter()
            .zip(results)
            .filter_map(|(m, r)| {
                kld_stats(r).report().map(|kld| ComparedModel {
                    model: m.clone(),
                    kld,
                    layers: None,
                })
            })
            .collect();
        CompareReport {
            quantppl_version: env!("CARGO_PKG_VERSION"),
            base: run.models[0].clone(),
            base_ppl: ValueUnc {
                value: base.ppl(),
                unc: base.stderr_ppl(),
            },
            models,
            plan: PlanSummary::new(run, base.count),
            devices: DevicesSummary::new(run, placements, timing.workers),
            wall_seconds: timing.wall_seconds,
            tokens_per_second: if timing.wall_seconds > 0.0 {
                timing.forwarded as f64 / timing.wall_seconds
            } else {
                0.0
            },
            peak_device_memory_bytes,
            base_states: None,
        }
    }

    /// The summary table; `markdown` gives the pipe table for a model card.
    fn table(&self, markdown: bool) -> String {
        let header = [
            "Model",
            "Bits/weight",
            "Size",
            "PPL",
            "PPL ratio",
            "KLD",
            "Reverse KLD",
            "Same top p",
            "Flips",
        ];
        let mut rows = vec![vec![
            format!("{} (base)", short_name(&self.base.name)),
            format!("{:.3}", self.base.summary.bits_per_weight),
            human_bytes(self.base.summary.checkpoint_bytes),
            format!("{:.4} ± {:.4}", self.base_ppl.value, self.base_ppl.unc),
            "1.0000".to_string(),
            "0".to_string(),
            "0".to_string(),
            "100 %".to_string(),
            "0".to_string(),
        ]];
        for m in &self.models {
            let k = &m.kld;
            rows.push(vec![
                short_name(&m.model.name),
                format!("{:.3}", m.model.summary.bits_per_weight),
                human_bytes(m.model.summary.checkpoint_bytes),
                format!("{:.4} ± {:.4}", k.ppl_q.value, k.ppl_q.unc),
                format!("{:.4}", k.ppl_ratio.value),
                format!("{:.5}", k.kld.value),
                format!("{:.5}", k.kld_reverse.value),
                format!("{:.2} %", 100.0 * k.same_top.value),
                k.flips.count.to_string(),
            ]);
        }
        let mut s = render_table(&header, &rows, markdown);
        if markdown {
            s += &format!(
                "\nPerplexity and KL divergence against the base over the full vocabulary \
                 (KLD: KL(base ‖ model); reverse: KL(model ‖ base); flips: positions whose most \
                 probable token differs from the base's), measured with quantppl {}: {}.\n",
                self.quantppl_version,
                self.plan.settings_line()
            );
        }
        s
    }
}

impl Rendered for CompareReport {
    /// The human report: llama.cpp's final `--kl-divergence` block per model, ExLlamaV3's
    /// confidence buckets, then a summary table.
    fn to_text(&self) -> String {
        let mut s = String::new();
        let b = &self.base.summary;
        s += &format!(
            "base         {}  ({:.3} bits/weight, {} on disk)\n",
            self.base.name,
            b.bits_per_weight,
            human_bytes(b.checkpoint_bytes)
        );
        if let Some(st) = &self.base_states {
            s += &format!(
                "base states  {} ({}, {}): only the base's head was loaded\n",
                st.file,
                st.dtype,
                human_bytes(st.bytes)
            );
        }
        s += &format!("method       {}\n", self.plan.settings_line());
        s += &format!(
            "PPL(base)    {:.4} +/- {:.5}\n",
            self.base_ppl.value, self.base_ppl.unc
        );
        for m in &self.models {
            let q = &m.model.summary;
            let k = &m.kld;
            s += &format!(
                "\n====== {} ======\n{}; {:.3} bits/weight; {} on disk; activations: {}\n",
                m.model.name,
                q.quantization,
                q.bits_per_weight,
                human_bytes(q.checkpoint_bytes),
                q.activations
            );
            let vu = |v: &ValueUnc| format!("{:10.6} ± {:10.6}", v.value, v.unc);
            s += &format!("Mean PPL(Q)                   : {}\n", vu(&k.ppl_q));
            s += &format!("Mean PPL(base)                : {}\n", vu(&k.ppl_base));
            if let Some(c) = k.cor_ln_ppl {
                s += &format!("Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%\n", 100.0 * c);
            }
            s += &format!("Mean ln(PPL(Q)/PPL(base))     : {}\n", vu(&k.ln_ppl_ratio));
            s += &format!("Mean PPL(Q)/PPL(base)         : {}\n", vu(&k.ppl_ratio));
            s += &format!("Mean PPL(Q)-PPL(base)         : {}\n\n", vu(&k.ppl_diff));
            s += &format!("Mean    KLD: {}\n", vu(&k.kld));
            for p in &k.kld_percentiles {
                s += &format!("{} KLD: {:10.6}\n", percentile_label(p), p.value);
            }
            s += &format!(
                "\nMean    Δp: {:6.3} ± {:5.3} %\n",
                100.0 * k.dp.value,
                100.0 * k.dp.unc
            );
            s += &format!(
                "RMS Δp    : {:6.3} ± {:5.3} %\n",
                100.0 * k.rms_dp.value,
                100.0 * k.rms_dp.unc
            );
            s += &format!(
                "Same top p: {:6.3} ± {:5.3} %\n",
                100.0 * k.same_top.value,
                100.0 * k.same_top.unc
            );
            s += &format!(
                "Flips     : {} of {} positions ({:.3} %): the most probable token changed\n",
                k.flips.count,
                k.count,
                100.0 * k.flips.rate
            );
            s += &format!("\nReverse KLD, KL(Q ‖ base): {}\n", vu(&k.kld_reverse));
            for p in &k.kld_reverse_percentiles {
                s += &format!("{} reverse KLD: {:10.6}\n", percentile_label(p), p.value);
            }
            s += "\nTop-K agreement              ";
            for t in &k.top_k {
                s += &format!("{:>9}", format!("K = {}", t.k));
            }
            let rows = [
                (
                    "same K tokens, same order  ",
                    k.top_k.map(|t| t.same_ranking),
                ),
                ("base's K among Q's K (mean)", k.top_k.map(|t| t.shared)),
                (
                    "base's top-1 among Q's K   ",
                    k.top_k.map(|t| t.base_top_in_q),
                ),
            ];
            for (label, values) in rows {
                s += &format!("\n  {label}");
                for v in values {
                    s += &format!("{:>8.3}%", 100.0 * v);
                }
            }
            s += "\n";
            if let Some(layers) = &m.layers {
                s += "\nDrift from the base after each layer (residual streams at the scored \
                      positions; rank 1: farthest)\n  layer   rel. L2      cosine  rank\n";
                for l in layers {
                    s += &format!(
                        "  {:5}  {:8.6}  {:10.8}  {:4}\n",
                        l.layer, l.rel_l2, l.cosine, l.rank
                    );
                }
            }
            s += "\nKLD by base confidence (ExLlamaV3 buckets of the base's top-token probability)\n";
            for bk in &k.kld_by_confidence {
                let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.6}"));
                s += &format!(
                    "  [{:.2}, {:.2})  share {:6.2}%  mean {:>10}  median {:>10}\n",
                    bk.lo,
                    bk.hi.min(1.0),
                    100.0 * bk.share,
                    f(bk.mean),
                    f(bk.median)
                );
            }
        }
        s += "\n";
        s += &self.table(false);
        if self.wall_seconds > 0.0 {
            s += &format!(
                "\n{} on {}, batches of up to {} tokens: {:.2} s, {:.0} tokens/s\n",
                if self.models.len() == 1 {
                    "1 model".to_string()
                } else {
                    format!("{} models", self.models.len())
                },
                self.devices.text(),
                self.devices.batch_tokens,
                self.wall_seconds,
                self.tokens_per_second
            );
            s += &self.devices.times_text();
        }
        s
    }

    fn to_markdown(&self) -> String {
        self.table(true)
    }

    /// Base first.
    fn plot_points(&self, metric: PlotMetric) -> crate::Result<Plot> {
        let base = match metric {
            PlotMetric::Ppl => self.base_ppl.value,
            PlotMetric::Kld | PlotMetric::ReverseKld | PlotMetric::FlipRate => 0.0,
        };
        let mut pts = vec![(
            format!("{} (base)", short_name(&self.base.name)),
            self.base.summary.bits_per_weight,
            base,
        )];
        for m in &self.models {
            let y = match metric {
                PlotMetric::Ppl => m.kld.ppl_q.value,
                PlotMetric::Kld => m.kld.kld.value,
                PlotMetric::ReverseKld => m.kld.kld_reverse.value,
                PlotMetric::FlipRate => 100.0 * m.kld.flips.rate,
            };
            pts.push((
                short_name(&m.model.name),
                m.model.summary.bits_per_weight,
                y,
            ));
        }
        let y = match metric {
            PlotMetric::Ppl => format!("perplexity ({})", self.plan.method),
            PlotMetric::Kld => "mean KL divergence from the base (nats)".to_string(),
            PlotMetric::ReverseKld => "mean KL divergence to the base (nats)".to_string(),
            PlotMetric::FlipRate => "positions whose top token changed (%)".to_string(),
        };
        Ok((pts, y))
    }
}

/// llama.cpp's row labels: `Maximum`, `99.9%  `, ..., `Median `, ..., `Minimum`.
fn percentile_label(p: &Percentile) -> String {
    match p.q {
        q if q >= 1.0 => "Maximum".into(),
        q if q <= 0.0 => "Minimum".into(),
        0.5 => "Median ".into(),
        q => format!("{:<7}", format!("{:.1}%", 100.0 * q)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_labels_follow_llama_cpp() {
        let l = |q| percentile_label(&Percentile { q, value: 0.0 });
        assert_eq!(l(1.0), "Maximum");
        assert_eq!(l(0.999), "99.9%  ");
        assert_eq!(l(0.5), "Median ");
        assert_eq!(l(0.01), "1.0%   ");
        assert_eq!(l(0.0), "Minimum");
        assert_eq!(short_name("/a/b/model-w4/"), "model-w4");
    }
}
