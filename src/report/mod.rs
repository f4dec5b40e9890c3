//! From per-token values to what people read: PPL and its error, lm-eval's word and byte
//! perplexity, KL divergence statistics; as human text, JSON, Markdown and SVG.

pub mod compare;
pub mod eval;
pub mod metrics;
pub mod nll_dump;
pub mod svg;
pub mod table;

pub use compare::CompareReport;
pub use eval::EvalReport;
pub use metrics::{KldReport, KldStats, KldToken, LmEvalReport, NllStats};

/// What `--plot` puts on the y axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlotMetric {
    /// Perplexity of each model.
    Ppl,
    /// Mean KL divergence from the base (0 for the base itself; `compare` only).
    Kld,
}

/// The points of a `--plot` (label, bits per weight, y) and its y axis label.
pub type Plot = (Vec<(String, f64, f64)>, String);

/// A finished report in every form the CLI writes it.
pub trait Rendered: serde::Serialize {
    /// The human report.
    fn to_text(&self) -> String;
    /// A Markdown table ready for a model card.
    fn to_markdown(&self) -> String;
    /// The points of `--plot` (label, bits per weight, y) and the y axis label; an error
    /// where this report has no such metric.
    fn plot_points(&self, metric: PlotMetric) -> crate::Result<Plot>;
}
