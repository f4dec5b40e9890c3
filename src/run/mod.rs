//! Running a plan on devices: which backends (`devices`), where the models live (`placement`),
//! the batches and workers (`scheduler`), record files for resume and shards (`record`,
//! `resume`), and the two kinds of run, `eval` and `compare`. Used by the CLI and by any
//! other front end alike; it prints nothing but progress bars.

pub mod base_states;
pub mod bench;
pub mod compare;
pub mod devices;
pub mod eval;
pub mod info;
pub mod interrupt;
pub mod layer_drift;
pub mod open;
pub mod placement;
pub mod record;
pub mod resume;
pub mod scheduler;
pub mod task;

use anyhow::Context;

pub use compare::CompareRun;
pub use devices::{ActDtype, BackendKind, DeviceRequest, OnBackend, with_backend};
pub use eval::EvalRun;
pub use info::{ModelSummary, RunInfo, Timing};
pub use open::{Activations, OpenedModel, open_model};
pub use placement::Parallel;
pub use resume::RecordOptions;
pub use scheduler::WorkerTime;

use crate::backend::{Backend, Device};
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

/// A run's windows and what identifies it in record files.
pub struct Prepared {
    pub plan: Plan,
    pub settings: ResolvedSettings,
    /// The settings that must agree before records are combined (`resume::fingerprint`).
    pub fingerprint: Vec<(String, String)>,
}

/// Builds the windows of `settings` for a model of `cfg` read with `tokenizer`, and the
/// fingerprint of a run of `models`.
fn prepare(
    settings: &PlanSettings,
    tokenizer: &TextTokenizer,
    cfg: &ModelConfig,
    activations: Activations,
    models: &[resume::FingerprintModel],
) -> anyhow::Result<Prepared> {
    let (plan, resolved) =
        build_plan(settings, tokenizer, cfg).with_context(|| match settings.method {
            Some(m) => format!("preparing the {} windows", method_name(m)),
            None => "preparing the windows".to_string(),
        })?;
    Prepared::new(plan, resolved, tokenizer, activations, models)
}

impl Prepared {
    /// `plan` (built with `tokenizer` as `settings` say) with the fingerprint of a run of
    /// `models` over it.
    pub fn new(
        plan: Plan,
        settings: ResolvedSettings,
        tokenizer: &TextTokenizer,
        activations: Activations,
        models: &[resume::FingerprintModel],
    ) -> anyhow::Result<Self> {
        let fingerprint =
            resume::fingerprint(models, activations, &settings, tokenizer.path(), &plan)?;
        Ok(Prepared {
            plan,
            settings,
            fingerprint,
        })
    }
}

/// What a run sets up on its devices before any model is loaded.
struct Started<T> {
    batch_tokens: usize,
    info: RunInfo,
    progress: resume::Progress<T>,
}

/// Sizes the batches of `prepared` for `cfg` on `backends`, which are about to hold `weights`
/// bytes of models at once (`experts_quantize_input`: where any of them has routed experts
/// that quantize their input), and opens the run's record file.
fn start<B: Backend, T: record::RecordValue>(
    backends: &[B],
    prepared: &Prepared,
    (cfg, weights, experts_quantize_input): (&ModelConfig, u64, bool),
    models: Vec<ModelSummary>,
    kind: record::RunKind,
    opts: &RunOptions,
) -> anyhow::Result<Started<T>> {
    let plan = &prepared.plan;
    placement::check_window_fits(&backends[0], cfg, plan.max_window())?;
    let share = placement::DeviceShare::before_loading(backends, weights, opts.parallel);
    let model = (cfg, experts_quantize_input);
    let batch_tokens = placement::batch_tokens(opts.batch_tokens, &backends[0], model, plan, share);
    let info = RunInfo::new(
        models,
        &prepared.settings,
        plan,
        backends[0].name(),
        backends.len(),
        batch_tokens,
    );
    let progress = resume::Progress::open(
        &opts.records,
        kind,
        prepared.fingerprint.clone(),
        info.clone(),
    )?;
    Ok(Started {
        batch_tokens,
        info,
        progress,
    })
}

impl<T: record::RecordValue> Started<T> {
    /// The finished run: `results` per section, this process's `timing`, the devices' peak
    /// memory.
    fn finish<B: Backend>(
        self,
        backends: &[B],
        results: Vec<Vec<Vec<T>>>,
        timing: Timing,
    ) -> Finished<T> {
        Finished {
            info: self.info,
            results,
            placements: self.progress.placements().to_vec(),
            timing,
            peak_memory: backends.iter().filter_map(Device::peak_memory_bytes).max(),
        }
    }
}
