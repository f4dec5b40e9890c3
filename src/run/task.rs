//! Multiple-choice tasks on models (`eval --task`, `compare --task`): the task's requests are
//! the windows of an `eval` or a `compare` run (`plan::task`), so they run as any plan runs
//! (batches sized from the device's memory, several devices, record files), and each
//! request's log-likelihood is the sum over its positions: `compare`'s, both models', from the
//! pass that gives the KL divergence.

use std::path::PathBuf;

use super::compare::{CompareRun, fingerprint_models, open_quants};
use super::devices::DeviceRequest;
use super::eval::EvalRun;
use super::open::{Activations, OpenedModel};
use super::resume::FingerprintModel;
use super::{Finished, Prepared, RunInfo, RunOptions, Timing};
use crate::backend::KldTerms;
use crate::checkpoint::ModelConfig;
use crate::data::task::Task;
use crate::plan::task::task_plan;

/// Rows an item's requests may share in every one of `configs` (`None`: not in one of them).
fn branch_rows<'a>(configs: impl IntoIterator<Item = &'a ModelConfig>) -> Option<usize> {
    configs
        .into_iter()
        .map(ModelConfig::branch_rows_limit)
        .try_fold(usize::MAX, |a, l| l.map(|l| a.min(l)))
}

/// What `eval --task` computes: the run's description and timing, and every item's
/// log-likelihoods.
pub struct EvaluatedTask {
    pub info: RunInfo,
    pub timing: Timing,
    pub lls: Vec<Vec<f64>>,
}

/// `model` on `task` (`None` for a shard).
pub fn eval_task(
    model: OpenedModel,
    task: &Task,
    activations: Activations,
    req: &DeviceRequest,
    options: &RunOptions,
) -> anyhow::Result<Option<EvaluatedTask>> {
    let cfg = &model.ckpt.config;
    let (plan, settings, requests) = task_plan(task, &model.tokenizer, cfg, branch_rows([cfg]))?;
    let me = FingerprintModel {
        role: "model".into(),
        dir: &model.ckpt.dir,
    };
    let prepared = Prepared::new(plan, settings, &model.tokenizer, activations, &[me])?;
    let run = EvalRun { model, prepared };
    Ok(run.run(req, options)?.map(|f| EvaluatedTask {
        lls: requests.loglikelihoods(&f.results[0], |&v| f64::from(v)),
        info: f.info,
        timing: f.timing,
    }))
}

/// What `compare --task` computes: the comparison over the task's positions, and every item's
/// log-likelihoods under the base and under each quantized model.
pub struct ComparedTask {
    pub finished: Finished<KldTerms>,
    pub base: Vec<Vec<f64>>,
    pub quants: Vec<(String, Vec<Vec<f64>>)>,
}

/// The quantized models `quants` (directory, report name) against `base` on `task`, read with
/// the base's tokenizer; `None` for a shard.
pub fn compare_task(
    base: OpenedModel,
    quants: Vec<(PathBuf, String)>,
    task: &Task,
    activations: Activations,
    req: &DeviceRequest,
    options: &RunOptions,
) -> anyhow::Result<Option<ComparedTask>> {
    let quants = open_quants(&base, quants, activations)?;
    let configs = std::iter::once(&base.ckpt.config).chain(quants.iter().map(|q| &q.ckpt.config));
    let limit = branch_rows(configs);
    let (plan, settings, requests) = task_plan(task, &base.tokenizer, &base.ckpt.config, limit)?;
    let models = fingerprint_models(&base, &quants);
    let prepared = Prepared::new(plan, settings, &base.tokenizer, activations, &models)?;
    let run = CompareRun {
        base,
        quants,
        prepared,
    };
    let Some(finished) = run.run(req, options, None)? else {
        return Ok(None);
    };
    let lls =
        |terms: &[Vec<KldTerms>], nll: fn(&KldTerms) -> f64| requests.loglikelihoods(terms, nll);
    // The base runs beside every quantized model on the same batches: its values are the
    // first pairing's.
    let base_lls = lls(&finished.results[0], |t| t.nll_base);
    let quants = run
        .quants
        .iter()
        .zip(&finished.results)
        .map(|(q, terms)| (q.name.clone(), lls(terms, |t| t.nll_q)))
        .collect();
    Ok(Some(ComparedTask {
        finished,
        base: base_lls,
        quants,
    }))
}
