//! From per-token values to what people read: PPL and its error, lm-eval's word and byte
//! perplexity, KL divergence statistics; as human text, JSON, Markdown and SVG.

pub mod compare;
pub mod eval;
pub mod metrics;
pub mod svg;

pub use compare::CompareReport;
pub use eval::EvalReport;
pub use metrics::{KldReport, KldStats, KldToken, LmEvalReport, NllStats};
