//! What identifies a run's reports apart from its per-window results: the models, the
//! resolved settings and the devices, as record files store them and reports print them.

use serde::{Deserialize, Serialize};

use super::scheduler::WorkerTime;
use crate::plan::{DocStats, Plan, ResolvedSettings};

/// The model line of a report: its name and the checkpoint summary.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelSummary {
    pub name: String,
    pub dir: String,
    #[serde(flatten)]
    pub summary: crate::checkpoint::Summary,
}

impl ModelSummary {
    /// `name` for reports and the checkpoint's own summary.
    pub fn of(name: &str, ckpt: &crate::checkpoint::Checkpoint) -> crate::Result<Self> {
        Ok(ModelSummary {
            name: name.to_string(),
            dir: ckpt.dir.display().to_string(),
            summary: ckpt.summary()?,
        })
    }
}

/// Everything a report needs besides the per-window results, so `merge` can write the final
/// report without the models or the text at hand.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunInfo {
    /// `eval`: the model; `compare`: the base, then each quantized model.
    pub models: Vec<ModelSummary>,
    pub settings: ResolvedSettings,
    pub windows: usize,
    /// Tokens through each model (window lengths summed).
    pub forwarded_tokens: u64,
    pub scored_tokens: u64,
    /// lm-eval's word and byte counts summed over documents (exact integers).
    pub docs: Option<DocStats>,
    pub backend: String,
    pub devices: usize,
    pub batch_tokens: usize,
}

impl RunInfo {
    /// What every report of `plan` shares, whatever process computes its windows.
    pub fn new(
        models: Vec<ModelSummary>,
        settings: &ResolvedSettings,
        plan: &Plan,
        backend: String,
        devices: usize,
        batch_tokens: usize,
    ) -> Self {
        RunInfo {
            models,
            settings: settings.clone(),
            windows: plan.windows.len(),
            forwarded_tokens: plan.forwarded(),
            scored_tokens: plan.scored() as u64,
            docs: plan.summed_docs(),
            backend,
            devices,
            batch_tokens,
        }
    }
}

/// What a run's process measured of itself (all zero for a merge of partial results).
#[derive(Clone, Debug, Default)]
pub struct Timing {
    /// Tokens this process pushed through the model (less than the plan's when resumed).
    pub forwarded: u64,
    pub wall_seconds: f64,
    /// Of `wall_seconds`, loading the weights onto the devices.
    pub load_seconds: f64,
    /// Each device's share of the evaluation (replicas or pipeline stages, in device order).
    pub workers: Vec<WorkerTime>,
}
