//! What an evaluation reports, as one serde schema for `--json` and the human text.

use serde::Serialize;

use super::metrics::{LmEvalReport, NllStats};
use super::table::{render_table, short_name};
use super::{Plot, PlotMetric, Rendered};
use crate::plan::{DocStats, Plan};
use crate::run::{ModelSummary, RunInfo, Timing, WorkerTime};
use crate::units::{human_bytes, human_count};

/// Per-token NLL statistics of a finished plan, summed in window order (f64).
pub fn aggregate(plan: &Plan, results: &[Vec<f32>]) -> (NllStats, Option<LmEvalReport>) {
    aggregate_with(results, plan.summed_docs())
}

/// [`aggregate`] from per-window results in window order and the summed document counts.
pub fn aggregate_with(
    results: &[Vec<f32>],
    docs: Option<DocStats>,
) -> (NllStats, Option<LmEvalReport>) {
    let mut stats = NllStats::default();
    for r in results {
        for &v in r {
            stats.push(v as f64);
        }
    }
    let lm = docs.map(|d| LmEvalReport::new(&stats, &[d]));
    (stats, lm)
}

/// A report's `parallel`: the distinct `placements` that computed its windows, in the order
/// they first appear, joined by `; `.
pub fn parallel_label(placements: &[String]) -> String {
    let mut distinct: Vec<&str> = Vec::new();
    for p in placements {
        if !distinct.contains(&p.as_str()) {
            distinct.push(p);
        }
    }
    distinct.join("; ")
}

/// The windows a report's numbers come from, as `eval` and `compare` both report them.
#[derive(Clone, Debug, Serialize)]
pub struct PlanSummary {
    pub data: String,
    pub text: String,
    pub method: String,
    pub ctx: usize,
    pub stride: Option<usize>,
    pub rows: Option<usize>,
    pub defaults: Vec<String>,
    pub bos: String,
    pub n_tokens: usize,
    pub windows: usize,
    pub scored_tokens: u64,
}

impl PlanSummary {
    pub fn new(run: &RunInfo, scored_tokens: u64) -> Self {
        let s = &run.settings;
        PlanSummary {
            data: s.data.clone(),
            text: s.text.clone(),
            method: crate::plan::method_name(s.method).to_string(),
            ctx: s.ctx,
            stride: s.stride,
            rows: s.rows,
            defaults: s.defaults.clone(),
            bos: s.bos.clone(),
            n_tokens: s.n_tokens,
            windows: run.windows,
            scored_tokens,
        }
    }

    /// `exl3: ctx 512, stride 128, rows 100`.
    pub fn method_text(&self) -> String {
        let mut m = format!("{}: ctx {}", self.method, self.ctx);
        if let Some(st) = self.stride {
            m += &format!(", stride {st}");
        }
        if let Some(r) = self.rows {
            m += &format!(", rows {r}");
        }
        m
    }

    /// `exl3: ctx 512, ...; 100 windows, 51200 scored tokens; wiki.test.raw (text view raw)`.
    pub fn settings_line(&self) -> String {
        format!(
            "{}; {} windows, {} scored tokens; {} (text view {})",
            self.method_text(),
            self.windows,
            self.scored_tokens,
            self.data,
            self.text
        )
    }
}

/// Where a report's numbers were computed.
#[derive(Clone, Debug, Serialize)]
pub struct DevicesSummary {
    pub backend: String,
    pub devices: usize,
    /// How the devices shared the work: `single`, `data` (replicas) or `layers 0..16, 16..32`;
    /// for a resumed or merged run, every placement that computed some of its windows, joined
    /// by `; ` (`data; layers 0..16, 16..32`), as the record files noted them.
    pub parallel: String,
    pub batch_tokens: usize,
    /// Each device's batches and seconds, in the order of `--devices` (this process's; empty
    /// for a merge).
    pub device_times: Vec<WorkerTime>,
}

impl DevicesSummary {
    pub fn new(run: &RunInfo, placements: &[String], device_times: Vec<WorkerTime>) -> Self {
        DevicesSummary {
            backend: run.backend.clone(),
            devices: run.devices,
            parallel: parallel_label(placements),
            batch_tokens: run.batch_tokens,
            device_times,
        }
    }

    /// `cuda x2 (data)` (see [`devices_text`]).
    pub fn text(&self) -> String {
        devices_text(&self.backend, self.devices, &self.parallel)
    }

    /// One line per device where several shared the work: its batches and busy seconds, so
    /// an idle or slow device shows (`device 1     12 batches in 2.91 s, the first 0.40 s`).
    pub fn times_text(&self) -> String {
        if self.device_times.len() < 2 {
            return String::new();
        }
        self.device_times
            .iter()
            .enumerate()
            .map(|(i, t)| {
                format!(
                    "{:<13}{} batches in {:.2} s, the first {:.2} s\n",
                    format!("device {i}"),
                    t.batches,
                    t.seconds,
                    t.first_batch_seconds
                )
            })
            .collect()
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct EvalReport {
    pub quantppl_version: &'static str,
    pub model: ModelSummary,
    #[serde(flatten)]
    pub plan: PlanSummary,
    pub ppl: f64,
    pub mean_nll: f64,
    /// llama.cpp's standard error of the PPL: sqrt(var(nll)/(n-1)) * ppl.
    pub ppl_stderr: f64,
    pub nll_stderr: f64,
    pub lm_eval: Option<LmEvalReport>,
    #[serde(flatten)]
    pub devices: DevicesSummary,
    /// Whole run: loading the weights onto the devices plus evaluating.
    pub wall_seconds: f64,
    /// Of `wall_seconds`, the upload of the weights to the devices.
    pub load_seconds: f64,
    /// Tokens through the model per second of evaluation (after loading; window tokens,
    /// overlaps counted each time), over the windows this process computed.
    pub tokens_per_second: f64,
    /// Tokens this process forwarded: all the plan's, or fewer when a resumed run read some
    /// windows from its record file (0 for a merge).
    pub tokens_forwarded_here: u64,
    /// Tokens the whole plan forwards.
    pub tokens_forwarded_total: u64,
    pub peak_device_memory_bytes: Option<u64>,
}

impl EvalReport {
    /// The report of a finished run: `results` holds every window's NLLs in window order,
    /// computed with `placements` (see [`parallel_label`]).
    pub fn new(
        run: &RunInfo,
        results: &[Vec<f32>],
        placements: &[String],
        timing: Timing,
        peak_device_memory_bytes: Option<u64>,
    ) -> Self {
        let eval_seconds = timing.wall_seconds - timing.load_seconds;
        let (stats, lm_eval) = aggregate_with(results, run.docs);
        EvalReport {
            quantppl_version: env!("CARGO_PKG_VERSION"),
            model: run.models[0].clone(),
            plan: PlanSummary::new(run, stats.count),
            ppl: stats.ppl(),
            mean_nll: stats.mean(),
            ppl_stderr: stats.stderr_ppl(),
            nll_stderr: stats.stderr_nll(),
            lm_eval,
            devices: DevicesSummary::new(run, placements, timing.workers),
            wall_seconds: timing.wall_seconds,
            load_seconds: timing.load_seconds,
            tokens_per_second: if eval_seconds > 0.0 {
                timing.forwarded as f64 / eval_seconds
            } else {
                0.0
            },
            tokens_forwarded_here: timing.forwarded,
            tokens_forwarded_total: run.forwarded_tokens,
            peak_device_memory_bytes,
        }
    }
}

impl Rendered for EvalReport {
    /// The human report (stdout).
    fn to_text(&self) -> String {
        let p = &self.plan;
        let m = &self.model.summary;
        let name = &self.model.name;
        let mut s = String::new();
        let mut line = |k: &str, v: String| s.push_str(&format!("{k:<13}{v}\n"));
        line(
            "model",
            format!(
                "{}  ({}, {} layers, hidden {}, vocab {}, {} params)",
                name,
                m.architecture,
                m.layers,
                m.hidden_size,
                m.vocab_size,
                human_count(m.params)
            ),
        );
        line(
            "quantization",
            format!(
                "{}; lm_head {}; {:.3} bits/weight over decoder linears; {} on disk",
                m.quantization,
                m.lm_head,
                m.bits_per_weight,
                human_bytes(m.checkpoint_bytes)
            ),
        );
        line("activations", m.activations.clone());
        line(
            "data",
            format!(
                "{} (text view {}, {} tokens; {})",
                p.data, p.text, p.n_tokens, p.bos
            ),
        );
        let mut method = p.method_text();
        if !p.defaults.is_empty() {
            method += &format!("  (defaults: {})", p.defaults.join(", "));
        }
        line("method", method);
        line(
            "windows",
            format!("{} windows, {} scored tokens", p.windows, p.scored_tokens),
        );
        line(
            "backend",
            format!(
                "{}, batches of up to {} tokens",
                self.devices.text(),
                self.devices.batch_tokens
            ),
        );
        if let Some(lm) = &self.lm_eval {
            line(
                "lm-eval",
                format!(
                    "word_perplexity {:.4}, byte_perplexity {:.4}, bits_per_byte {:.4} ({} words, {} bytes)",
                    lm.word_perplexity, lm.byte_perplexity, lm.bits_per_byte, lm.words, lm.bytes
                ),
            );
        }
        line(
            "PPL",
            format!(
                "{:.4} +/- {:.5}   (mean NLL {:.6} nats)",
                self.ppl, self.ppl_stderr, self.mean_nll
            ),
        );
        // A merge measured nothing; a resumed run that found every window in its run file
        // loaded the weights but forwarded no token.
        let unmeasured = if self.wall_seconds == 0.0 {
            Some("merged from partial results")
        } else if self.tokens_per_second == 0.0 {
            Some("every window was read from the run file")
        } else {
            None
        };
        if let Some(why) = unmeasured {
            line("time", format!("not measured ({why})"));
            return s;
        }
        line(
            "time",
            format!(
                "{:.2} s ({:.2} s loading), {:.0} tokens/s{}{}",
                self.wall_seconds,
                self.load_seconds,
                self.tokens_per_second,
                if self.tokens_forwarded_here < self.tokens_forwarded_total {
                    format!(
                        " over the {} of {} tokens computed here (the rest read from the run file)",
                        self.tokens_forwarded_here, self.tokens_forwarded_total
                    )
                } else {
                    String::new()
                },
                self.peak_device_memory_bytes
                    .map_or(String::new(), |b| format!(
                        ", peak device memory {}",
                        human_bytes(b)
                    ))
            ),
        );
        s + &self.devices.times_text()
    }

    fn to_markdown(&self) -> String {
        let m = &self.model.summary;
        let row = vec![
            short_name(&self.model.name),
            format!("{:.3}", m.bits_per_weight),
            human_bytes(m.checkpoint_bytes),
            format!("{:.4} ± {:.4}", self.ppl, self.ppl_stderr),
        ];
        let mut s = render_table(&["Model", "Bits/weight", "Size", "PPL"], &[row], true);
        s += &format!(
            "\nPerplexity measured with quantppl {}: {}.\n",
            self.quantppl_version,
            self.plan.settings_line()
        );
        s
    }

    fn plot_points(&self, metric: PlotMetric) -> crate::Result<Plot> {
        match metric {
            PlotMetric::Ppl => Ok((
                vec![(
                    short_name(&self.model.name),
                    self.model.summary.bits_per_weight,
                    self.ppl,
                )],
                format!("perplexity ({})", self.plan.method),
            )),
            _ => Err(crate::Error::InvalidArgument(format!(
                "--plot-metric {} needs a base: use `quantppl compare`",
                metric.name()
            ))),
        }
    }
}

/// `cuda x2 (data)`: the backend, the device count when several, and how they shared the
/// work unless that was one device alone. A merged run counts the devices of one shard only,
/// so `(single; data)` may follow a single device.
pub fn devices_text(backend: &str, devices: usize, parallel: &str) -> String {
    let mut s = backend.to_string();
    if devices > 1 {
        s += &format!(" x{devices}");
    }
    if parallel != "single" {
        s += &format!(" ({parallel})");
    }
    s
}
