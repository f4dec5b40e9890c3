//! Running a plan on devices: which backends (`devices`), where the models live (`placement`),
//! the batches and workers (`scheduler`), record files for resume and shards (`record`,
//! `resume`), and the two kinds of run, `eval` and `compare`. Used by the CLI and by any
//! other front end alike; it prints nothing but progress bars.

pub mod compare;
pub mod devices;
pub mod eval;
pub mod info;
pub mod open;
pub mod placement;
pub mod record;
pub mod resume;
pub mod scheduler;

use anyhow::Context;

pub use compare::CompareRun;
pub use devices::{ActDtype, BackendKind, DeviceRequest, OnBackend, with_backend};
pub use eval::EvalRun;
pub use info::{ModelSummary, RunInfo, Timing};
pub use open::{Activations, OpenedModel, open_model};
pub use placement::Parallel;
pub use resume::RecordOptions;

use crate::checkpoint::ModelConfig;
use crate::data::TextTokenizer;
use crate::plan::{Plan, PlanSettings, ResolvedSettings, build_plan, method_name};

/// How a run uses its devices and where it records its windows.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub records: RecordOptions,
    /// Tokens per forward batch (`None`: sized from the device's memory).
    pub batch_tokens: Option<usize>,
    pub parallel: Parallel,
    /// No progress bars.
    pub quiet: bool,
}

/// A finished run's results, for its report.
pub struct Finished<T> {
    pub info: RunInfo,
    /// Per section (the model of `eval`; each quantized model of `compare`), every window's
    /// values in window order.
    pub results: Vec<Vec<Vec<T>>>,
    /// How the windows were computed, one entry per stretch of windows.
    pub placements: Vec<String>,
    /// What this process measured (a resumed run computed only some windows).
    pub timing: Timing,
    pub peak_memory: Option<u64>,
}

/// The plan of `settings` for a model of `cfg` read with `tokenizer`.
fn prepare_plan(
    settings: &PlanSettings,
    tokenizer: &TextTokenizer,
    cfg: &ModelConfig,
) -> anyhow::Result<(Plan, ResolvedSettings)> {
    build_plan(settings, tokenizer, cfg)
        .with_context(|| format!("preparing the {} windows", method_name(settings.method)))
}
