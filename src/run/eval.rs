//! Perplexity runs: one model over a plan's windows, on one device or several, resumable and
//! shardable; the per-window NLLs come back in window order for the report.

use std::time::Instant;

use super::devices::{DeviceRequest, OnBackend, progress_bar, with_backend};
use super::info::{ModelSummary, Timing};
use super::open::{Activations, OpenedModel};
use super::placement::{Placed, place};
use super::record::RunKind;
use super::resume::{self, FingerprintModel};
use super::scheduler::{self, Batch, Worker, WorkerTime};
use super::{Finished, Prepared, RunOptions, prepare, start};
use crate::backend::Backend;
use crate::plan::{Plan, PlanSettings};

/// One model and the windows it is evaluated on.
pub struct EvalRun {
    pub model: OpenedModel,
    pub prepared: Prepared,
}

impl EvalRun {
    /// Builds `model`'s windows from `settings` with its own tokenizer.
    pub fn prepare(
        model: OpenedModel,
        settings: &PlanSettings,
        activations: Activations,
    ) -> anyhow::Result<Self> {
        let me = FingerprintModel {
            role: "model".into(),
            dir: &model.ckpt.dir,
        };
        let prepared = prepare(
            settings,
            &model.tokenizer,
            &model.ckpt.config,
            activations,
            &[me],
        )?;
        Ok(EvalRun { model, prepared })
    }

    /// Runs the plan on the devices of `req`; `None` for a shard (its windows went to the
    /// partial file, the report comes from `merge`).
    pub fn run(
        &self,
        req: &DeviceRequest,
        options: &RunOptions,
    ) -> anyhow::Result<Option<Finished<f32>>> {
        with_backend(
            req,
            self.model.ckpt.config.auto_activation_dtype(),
            EvalJob { run: self, options },
        )
    }
}

struct EvalJob<'a> {
    run: &'a EvalRun,
    options: &'a RunOptions,
}

impl OnBackend for EvalJob<'_> {
    type Output = Option<Finished<f32>>;

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<Self::Output> {
        let (run, opts) = (self.run, self.options);
        let (plan, ckpt) = (&run.prepared.plan, &run.model.ckpt);
        let models = vec![ModelSummary::of(&run.model.name, ckpt)?];
        let mut started = start::<B, f32>(
            backends,
            &run.prepared,
            (
                &ckpt.config,
                ckpt.store.total_bytes(),
                ckpt.experts_quantize_input(),
            ),
            models,
            RunKind::Eval,
            opts,
        )?;
        let (batch_tokens, progress) = (started.batch_tokens, &mut started.progress);
        let n = plan.windows.len();
        let todo = progress.todo(0, n);
        let start = Instant::now();
        let mut load = 0.0;
        let (mut fresh, workers, wall) = if todo.is_empty() {
            (vec![None; n], Vec::new(), start.elapsed().as_secs_f64())
        } else {
            let batches = scheduler::make_batches(plan, &todo, batch_tokens);
            let loaded_for = scheduler::load_for(plan, &batches);
            let placed = place(backends, ckpt, loaded_for, opts.parallel, opts.quiet)?;
            load = start.elapsed().as_secs_f64();
            let label = placed.label();
            let (fresh, workers) =
                run_plan(backends, &placed, plan, &batches, opts.quiet, |w, nll| {
                    progress.record(&label, 0, w, nll)
                })?;
            // The run ends with its last result: freeing the weights afterwards (device by
            // device, about 0.05 s each for a 15 GiB model) is not part of it.
            (fresh, workers, start.elapsed().as_secs_f64())
        };
        if progress.shard.n > 1 {
            return Ok(None);
        }
        let results = resume::collect(0, n, &mut fresh, progress.recorded())?;
        let timing = Timing {
            forwarded: todo.iter().map(|&w| plan.windows[w].ids.len() as u64).sum(),
            wall_seconds: wall,
            load_seconds: load,
            workers,
        };
        Ok(Some(started.finish(backends, vec![results], timing)))
    }
}

/// Each window's NLLs, `None` for the windows a run did not compute.
pub type WindowNlls = Vec<Option<Vec<f32>>>;

/// Runs `batches` of `plan` on the placed models, handing each finished window's NLLs to
/// `record` as it arrives; the results indexed by window (`None` outside the batches), and
/// each device's time.
pub fn run_plan<B: Backend>(
    backends: &[B],
    placed: &Placed<B>,
    plan: &Plan,
    batches: &[Batch],
    quiet: bool,
    mut record: impl FnMut(usize, &[f32]) -> crate::Result<()>,
) -> anyhow::Result<(WindowNlls, Vec<WorkerTime>)> {
    let workers: Vec<Worker<B>> = backends
        .iter()
        .zip(&placed.models)
        .map(|(backend, model)| Worker { backend, model })
        .collect();
    let total: u64 = batches.iter().map(|b| b.tokens(plan) as u64).sum();
    let bar = progress_bar(total, "tokens", quiet);
    let mut results: Vec<Option<Vec<f32>>> = vec![None; plan.windows.len()];
    let sink = |w: usize, nll: Vec<f32>| {
        bar.inc(plan.windows[w].ids.len() as u64);
        record(w, &nll)?;
        results[w] = Some(nll);
        Ok(())
    };
    let times = if placed.pipeline {
        scheduler::run_pipeline(&workers, plan, batches, sink)?
    } else {
        scheduler::run(&workers, plan, batches, sink)?
    };
    bar.finish_and_clear();
    Ok((results, times))
}
