//! `quantppl eval`: the perplexity of one model with one method.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;

use super::runfile::{self, FingerprintModel, Progress, RecordArgs};
use super::{
    BackendArgs, DataArgs, ModelArgs, OnBackend, Parallel, progress_bar, with_backend, write_json,
};
use crate::backend::Backend;
use crate::checkpoint::{Checkpoint, ModelConfig};
use crate::data::TextTokenizer;
use crate::eval::plan::Plan;
use crate::eval::record::{RunInfo, RunKind};
use crate::eval::report::human_bytes;
use crate::eval::report::{EvalReport, ModelSummary, Timing, summed_docs};
use crate::eval::scheduler::{self, Worker};
use crate::eval::setup::{ResolvedSettings, build_plan};
use crate::model::Model;
use crate::model::forward::split_layers;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub records: RecordArgs,
    /// Also write the report as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

/// A checkpoint opened for evaluation, with the name reports use.
pub struct OpenedModel {
    pub name: String,
    pub ckpt: Checkpoint,
    pub tokenizer: TextTokenizer,
}

pub fn open_model(args: &ModelArgs) -> anyhow::Result<OpenedModel> {
    let (dir, name) = match &args.model {
        Some(d) => (d.clone(), d.display().to_string()),
        None => (
            crate::assets::default_model_dir()?,
            crate::assets::DEFAULT_MODEL_NAME.to_string(),
        ),
    };
    let mut ckpt = Checkpoint::open(&dir)?;
    ckpt.weight_only = args.activations == super::Activations::WeightOnly;
    let tokenizer = match &args.tokenizer {
        Some(t) => TextTokenizer::from_file(t)?,
        None => TextTokenizer::from_model_dir(&dir)?,
    };
    if tokenizer.vocab_size() > ckpt.config.vocab_size {
        anyhow::bail!(
            "tokenizer {} has {} tokens but the model's vocabulary is {}",
            tokenizer.path().display(),
            tokenizer.vocab_size(),
            ckpt.config.vocab_size
        );
    }
    Ok(OpenedModel {
        name,
        ckpt,
        tokenizer,
    })
}

pub fn model_summary(m: &OpenedModel) -> anyhow::Result<ModelSummary> {
    Ok(ModelSummary {
        name: m.name.clone(),
        dir: m.ckpt.dir.display().to_string(),
        summary: m.ckpt.summary()?,
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let model = open_model(&args.model)?;
    let (plan, settings) = build_plan(&args.data.settings(), &model.tokenizer, &model.ckpt.config)
        .with_context(|| {
            format!(
                "preparing the {} windows",
                crate::eval::setup::method_name(args.data.method)
            )
        })?;
    let fingerprint = runfile::fingerprint(
        &[FingerprintModel {
            role: "model".into(),
            dir: &model.ckpt.dir,
        }],
        args.model.activations,
        &settings,
        &runfile::data_path(&args.data.data)?,
        model.tokenizer.path(),
        &plan,
    )?;
    let job = EvalJob {
        model: &model,
        plan: &plan,
        settings: &settings,
        fingerprint,
        records: &args.records,
        batch_tokens: args.backend.batch_tokens,
        parallel: args.backend.parallel,
        quiet: args.quiet,
    };
    match with_backend(&args.backend, model.ckpt.config.dtype, job)? {
        Some(report) => {
            print!("{}", report.to_text());
            if let Some(path) = &args.json {
                write_json(path, &report)?;
            }
        }
        None => {
            runfile::report_shard_done(&args.records, plan.windows.len());
        }
    }
    Ok(())
}

struct EvalJob<'a> {
    model: &'a OpenedModel,
    plan: &'a Plan,
    settings: &'a ResolvedSettings,
    fingerprint: Vec<(String, String)>,
    records: &'a RecordArgs,
    batch_tokens: Option<usize>,
    parallel: Parallel,
    quiet: bool,
}

/// Models placed on the devices: full replicas (data parallel), or pipeline stages.
pub struct Placement<B: Backend> {
    pub models: Vec<Model<B>>,
    pub pipeline: bool,
}

impl<B: Backend> Placement<B> {
    /// How the devices share the work, as reports and record files name it: `single`, `data`
    /// (a replica on each device) or `layers 0..16, 16..32` (each device's layers).
    pub fn label(&self) -> String {
        if self.pipeline {
            let ranges: Vec<String> = self
                .models
                .iter()
                .map(|m| format!("{}..{}", m.layers_range.start, m.layers_range.end))
                .collect();
            format!("layers {}", ranges.join(", "))
        } else if self.models.len() > 1 {
            "data".to_string()
        } else {
            "single".to_string()
        }
    }
}

/// How a run's models are laid out on its devices, decided once, before any is loaded.
pub enum Layout {
    /// A full replica of each model on every device.
    Replicas,
    /// Each model's layers split across the devices in proportion to `capacity` (their free
    /// memory before loading; equal where unknown), so models of one depth split alike.
    Layers { capacity: Vec<u64> },
}

impl Layout {
    /// The layout `parallel` asks for `weights` bytes resident on `backends` at once (`auto`:
    /// replicas when they fit every device); an error naming `what` when they fit neither way.
    pub fn choose<B: Backend>(
        backends: &[B],
        weights: u64,
        what: &str,
        parallel: Parallel,
    ) -> anyhow::Result<Layout> {
        let free: Option<Vec<u64>> = backends.iter().map(Backend::free_memory_bytes).collect();
        let pipeline = split_across_devices(weights, free.as_deref(), backends.len(), parallel)
            .map_err(|why| anyhow::anyhow!("{what}: {why}"))?;
        Ok(if pipeline {
            Layout::Layers {
                capacity: free.unwrap_or_else(|| vec![1; backends.len()]),
            }
        } else {
            Layout::Replicas
        })
    }

    /// Loads `ckpt` onto `backends` in this layout.
    pub fn load<B: Backend>(
        &self,
        backends: &[B],
        ckpt: &Checkpoint,
        max_positions: usize,
        quiet: bool,
    ) -> anyhow::Result<Placement<B>> {
        match self {
            Layout::Replicas => Ok(Placement {
                models: load_replicas(backends, ckpt, max_positions, quiet)?,
                pipeline: false,
            }),
            Layout::Layers { capacity } => {
                let n_layers = ckpt.config.num_layers;
                if backends.len() > n_layers {
                    anyhow::bail!(
                        "{}: {} devices for {n_layers} layers: use at most {n_layers} devices",
                        ckpt.dir.display(),
                        backends.len()
                    );
                }
                let ranges = split_layers(n_layers, capacity);
                let models =
                    load_each(backends, ckpt, max_positions, quiet, |i| ranges[i].clone())?;
                Ok(Placement {
                    models,
                    pipeline: true,
                })
            }
        }
    }
}

/// Loads `ckpt` onto `backends` as `parallel` asks: replicas, or a layer split in proportion to
/// each device's free memory. `auto` takes replicas when one fits every device.
pub fn place<B: Backend>(
    backends: &[B],
    ckpt: &Checkpoint,
    max_positions: usize,
    parallel: Parallel,
    quiet: bool,
) -> anyhow::Result<Placement<B>> {
    let what = ckpt.dir.display().to_string();
    Layout::choose(backends, ckpt.store.total_bytes(), &what, parallel)?.load(
        backends,
        ckpt,
        max_positions,
        quiet,
    )
}

/// Whether the layers are split across the devices (`true`) or each holds a replica, for
/// a checkpoint of `weights` bytes and the devices' free memory (where known); an error that
/// says how much is needed and how much is free when the model fits neither way asked.
pub fn split_across_devices(
    weights: u64,
    free: Option<&[u64]>,
    devices: usize,
    parallel: Parallel,
) -> Result<bool, String> {
    let pipeline = match parallel {
        _ if devices < 2 => false,
        Parallel::Data => false,
        Parallel::Layers => true,
        // A replica needs its weights plus room for activations (a tenth more, at least 2 GiB).
        Parallel::Auto => {
            free.is_some_and(|f| f.iter().any(|&b| b < weights + (weights / 10).max(2 << 30)))
        }
    };
    if let Some(f) = free {
        let available: u64 = if pipeline {
            f.iter().sum()
        } else {
            f.iter().copied().min().unwrap_or(0)
        };
        if weights > available {
            return Err(format!(
                "needs {} for the weights, but {} {} free{}",
                human_bytes(weights),
                if pipeline {
                    "the devices together have"
                } else {
                    "each device has only"
                },
                human_bytes(available),
                if pipeline || devices < 2 {
                    ""
                } else {
                    " (try --parallel layers)"
                }
            ));
        }
    }
    Ok(pipeline)
}

/// Loads layers `range(i)` of `ckpt` onto every backend `i` at once, one thread per device
/// (the uploads are independent); the progress bar follows the first device.
fn load_each<B: Backend>(
    backends: &[B],
    ckpt: &Checkpoint,
    max_positions: usize,
    quiet: bool,
    range: impl Fn(usize) -> std::ops::Range<usize> + Sync,
) -> anyhow::Result<Vec<Model<B>>> {
    let bar = progress_bar(0, "loading", quiet);
    let models = std::thread::scope(|scope| {
        let handles: Vec<_> = backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let (bar, range) = (&bar, &range);
                scope.spawn(move || -> anyhow::Result<Model<B>> {
                    b.enter_thread()?;
                    let r = range(i);
                    let progress = |done: usize, total: usize| {
                        if i == 0 {
                            bar.set_length(total as u64);
                            bar.set_position(done as u64);
                        }
                    };
                    let whole = r.start == 0 && r.end == ckpt.config.num_layers;
                    Model::load_stage(b, ckpt, r.clone(), max_positions, &progress).with_context(
                        || {
                            if whole {
                                format!("loading {} onto {}", ckpt.dir.display(), b.name())
                            } else {
                                format!("loading layers {}..{} onto {}", r.start, r.end, b.name())
                            }
                        },
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a loading thread panicked")))
            })
            .collect::<anyhow::Result<Vec<_>>>()
    });
    bar.finish_and_clear();
    models
}

/// Uploads one model replica per backend, showing progress.
pub fn load_replicas<B: Backend>(
    backends: &[B],
    ckpt: &Checkpoint,
    max_positions: usize,
    quiet: bool,
) -> anyhow::Result<Vec<Model<B>>> {
    load_each(backends, ckpt, max_positions, quiet, |_| {
        0..ckpt.config.num_layers
    })
}

/// Runs the windows `todo` of `plan` on the placed models, handing each finished window's
/// NLLs to `record` as it arrives; the results indexed by window (`None` outside `todo`).
pub fn run_plan<B: Backend>(
    backends: &[B],
    placement: &Placement<B>,
    plan: &Plan,
    todo: &[usize],
    batch_tokens: usize,
    quiet: bool,
    mut record: impl FnMut(usize, &[f32]) -> crate::Result<()>,
) -> anyhow::Result<Vec<Option<Vec<f32>>>> {
    let workers: Vec<Worker<B>> = backends
        .iter()
        .zip(&placement.models)
        .map(|(backend, model)| Worker { backend, model })
        .collect();
    let batches = scheduler::make_batches(plan, todo, batch_tokens);
    let total: u64 = todo.iter().map(|&w| plan.windows[w].ids.len() as u64).sum();
    let bar = progress_bar(total, "tokens", quiet);
    let mut results: Vec<Option<Vec<f32>>> = vec![None; plan.windows.len()];
    let sink = |w: usize, nll: Vec<f32>| {
        bar.inc(plan.windows[w].ids.len() as u64);
        record(w, &nll)?;
        results[w] = Some(nll);
        Ok(())
    };
    if placement.pipeline {
        scheduler::run_pipeline(&workers, plan, &batches, sink)?;
    } else {
        scheduler::run(&workers, plan, &batches, sink)?;
    }
    bar.finish_and_clear();
    Ok(results)
}

/// The longest window of a plan: the context the models are loaded for.
pub fn max_window(plan: &Plan) -> usize {
    plan.windows.iter().map(|w| w.ids.len()).max().unwrap_or(1)
}

/// Tokens per forward batch: `--batch-tokens`, else what the backend's memory allows for
/// `cfg` but no more than the whole plan (so the report's "batches of up to" is one that can
/// occur); never fewer than the longest window.
pub fn batch_tokens<B: Backend>(
    requested: Option<usize>,
    backend: &B,
    cfg: &ModelConfig,
    plan: &Plan,
) -> usize {
    let max_len = max_window(plan);
    let all = plan.windows.iter().map(|w| w.ids.len()).sum();
    requested
        .unwrap_or_else(|| backend.batch_tokens(cfg, max_len).min(all))
        .max(max_len)
}

/// What every report of `plan` shares, whatever process computes its windows.
pub fn run_info(
    models: Vec<ModelSummary>,
    settings: &ResolvedSettings,
    plan: &Plan,
    backend: String,
    devices: usize,
    batch_tokens: usize,
) -> RunInfo {
    RunInfo {
        models,
        settings: settings.clone(),
        windows: plan.windows.len(),
        forwarded_tokens: plan.windows.iter().map(|w| w.ids.len() as u64).sum(),
        scored_tokens: plan.scored() as u64,
        docs: summed_docs(plan),
        backend,
        devices,
        batch_tokens,
    }
}

impl OnBackend for EvalJob<'_> {
    /// `None` for a shard: its windows went to the partial file, the report comes from `merge`.
    type Output = Option<EvalReport>;

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<Option<EvalReport>> {
        let cfg = &self.model.ckpt.config;
        let max_len = max_window(self.plan);
        let batch_tokens = batch_tokens(self.batch_tokens, &backends[0], cfg, self.plan);
        let info = run_info(
            vec![model_summary(self.model)?],
            self.settings,
            self.plan,
            backends[0].name(),
            backends.len(),
            batch_tokens,
        );
        let mut progress =
            Progress::<f32>::open(self.records, RunKind::Eval, self.fingerprint, info.clone())?;
        let n = self.plan.windows.len();
        let todo = progress.todo(0, n);
        let start = Instant::now();
        let mut load = 0.0;
        let mut fresh = if todo.is_empty() {
            vec![None; n]
        } else {
            let placement = place(
                backends,
                &self.model.ckpt,
                max_len,
                self.parallel,
                self.quiet,
            )?;
            load = start.elapsed().as_secs_f64();
            let label = placement.label();
            run_plan(
                backends,
                &placement,
                self.plan,
                &todo,
                batch_tokens,
                self.quiet,
                |w, nll| progress.record(&label, 0, w, nll),
            )?
        };
        let wall = start.elapsed().as_secs_f64();
        if progress.shard.n > 1 {
            return Ok(None);
        }
        let results = runfile::collect(0, n, &mut fresh, progress.recorded())?;
        let forwarded = todo
            .iter()
            .map(|&w| self.plan.windows[w].ids.len() as u64)
            .sum();
        let peak = backends.iter().filter_map(Backend::peak_memory_bytes).max();
        let timing = Timing {
            forwarded,
            wall_seconds: wall,
            load_seconds: load,
        };
        Ok(Some(EvalReport::new(
            &info,
            &results,
            progress.placements(),
            timing,
            peak,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::{Parallel, split_across_devices};

    const GIB: u64 = 1 << 30;

    #[test]
    fn replicas_when_they_fit_layers_otherwise_and_a_clear_error_when_nothing_fits() {
        let two_h200 = [139 * GIB, 139 * GIB];
        // An 8B W4A16 (5.3 GiB) gets a replica per GPU; a 123B W4A16 (60 GiB) too.
        assert_eq!(
            split_across_devices(5 * GIB, Some(&two_h200), 2, Parallel::Auto),
            Ok(false)
        );
        // 200 GiB of weights fit only split.
        assert_eq!(
            split_across_devices(200 * GIB, Some(&two_h200), 2, Parallel::Auto),
            Ok(true)
        );
        // One device never splits; unknown free memory (the CPU) keeps replicas.
        assert_eq!(
            split_across_devices(200 * GIB, None, 1, Parallel::Layers),
            Ok(false)
        );
        assert_eq!(
            split_across_devices(200 * GIB, None, 3, Parallel::Auto),
            Ok(false)
        );
        let err = split_across_devices(300 * GIB, Some(&two_h200), 2, Parallel::Auto).unwrap_err();
        assert!(
            err.contains("300.00 GiB") && err.contains("278.00 GiB"),
            "{err}"
        );
        let err = split_across_devices(200 * GIB, Some(&two_h200), 2, Parallel::Data).unwrap_err();
        assert!(
            err.contains("each device has only 139.00 GiB") && err.contains("--parallel layers"),
            "{err}"
        );
    }
}
