//! Evaluation: window plans (which tokens each forward pass reads and scores) and the
//! statistics computed from the per-token NLLs they produce.

pub mod compare;
pub mod metrics;
pub mod plan;
pub mod record;
pub mod report;
pub mod scheduler;
pub mod setup;

pub use metrics::{KldReport, KldStats, KldToken, LmEvalReport, NllStats};
pub use plan::{DocStats, Method, Plan, Window};
