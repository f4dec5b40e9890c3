//! From per-token values to what people read: PPL and its error, lm-eval's word and byte
//! perplexity, KL divergence statistics; as human text, JSON, Markdown and SVG.

pub mod compare;
pub mod eval;
pub mod metrics;
pub mod nll_dump;
pub mod svg;
pub mod table;
pub mod task;

pub use compare::CompareReport;
pub use eval::EvalReport;
pub use metrics::{KldReport, KldStats, LayerDrift, LmEvalReport, NllStats};

/// Writes a file whole or not at all: `fill` writes into a temporary file beside `path`,
/// which is synced and renamed over it, so that a kill or a full disk never leaves half a
/// report that reads as a whole one (a failed write is an error naming `path`). A `path` that
/// exists and is not a regular file (`/dev/stdout`, a pipe) is written directly.
pub fn write_whole(
    path: &std::path::Path,
    fill: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> crate::Result<()> {
    use std::io::Write;
    let io = |e| crate::Error::io(path, e);
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        fill(&mut out).map_err(io)?;
        return out.flush().map_err(io);
    }
    let tmp = temp_beside(path)?;
    let written = (|| {
        let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        fill(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(io)
}

/// A temporary file name beside `path`, unique to this process: `.NAME.PID.tmp`.
pub fn temp_beside(path: &std::path::Path) -> crate::Result<std::path::PathBuf> {
    let name = path.file_name().ok_or_else(|| {
        crate::Error::InvalidArgument(format!("{} names no file", path.display()))
    })?;
    Ok(path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// What `--plot` puts on the y axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlotMetric {
    /// Perplexity of each model.
    Ppl,
    /// Mean KL(base ‖ model) (0 for the base itself; `compare` only).
    Kld,
    /// Mean KL(model ‖ base) (`compare` only).
    ReverseKld,
    /// Percent of positions whose most probable token differs from the base's (`compare`
    /// only).
    FlipRate,
}

impl PlotMetric {
    /// The metric needs a base model.
    pub fn compares(self) -> bool {
        self != PlotMetric::Ppl
    }

    /// The name `--plot-metric` takes.
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self).map_or(String::new(), |v| v.get_name().into())
    }
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
