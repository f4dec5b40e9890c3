//! Comparison runs: quantized models against their base on the same windows, the base resident
//! and the quantized models loaded one after another; per-window KL divergence terms come back
//! in window order for the report.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};

use super::base_states::{States, StatesDtype, StatesHeader, StatesWriter};
use super::devices::{DeviceRequest, OnBackend, progress_bar, with_backend};
use super::info::{ModelSummary, Timing};
use super::open::{Activations, OpenedModel, open_checkpoint};
use super::placement::{Placed, Placement};
use super::record::RunKind;
use super::resume::{self, FingerprintModel};
use super::scheduler::{self, Batch, BatchInputs, WorkerTime};
use super::{Finished, Prepared, RunOptions, prepare, start};
use crate::backend::{Backend, KldTerms};
use crate::checkpoint::Checkpoint;
use crate::fnv::Fnv;
use crate::model::{LoadFor, Model};
use crate::plan::{Plan, PlanSettings, Window};

/// A quantized model: its report name and checkpoint.
pub struct Quant {
    pub name: String,
    pub ckpt: Checkpoint,
}

/// The base, the quantized models and the windows they are all scored on (built with the
/// base's tokenizer), with the run's fingerprint.
pub struct CompareRun {
    pub base: OpenedModel,
    pub quants: Vec<Quant>,
    pub prepared: Prepared,
}

impl CompareRun {
    /// Opens the quantized models `quants` (directory, report name), refusing any whose
    /// vocabulary differs from the base's, and builds the windows from `settings`.
    pub fn prepare(
        base: OpenedModel,
        quants: Vec<(PathBuf, String)>,
        settings: &PlanSettings,
        activations: Activations,
    ) -> anyhow::Result<Self> {
        let quants = open_quants(&base, quants, activations)?;
        let prepared = prepare(
            settings,
            &base.tokenizer,
            &base.ckpt.config,
            activations,
            &fingerprint_models(&base, &quants),
        )?;
        Ok(CompareRun {
            base,
            quants,
            prepared,
        })
    }

    /// Runs every quantized model against the base on the devices of `req`; `None` for a
    /// shard. `results[m]` holds quantized model `m`'s terms.
    pub fn run(
        &self,
        req: &DeviceRequest,
        options: &RunOptions,
        states: Option<&States>,
    ) -> anyhow::Result<Option<Finished<KldTerms>>> {
        with_backend(
            req,
            self.base.ckpt.config.auto_activation_dtype(),
            self.compare_job(options, states),
        )
    }

    /// The comparison as a job for backends already made (`run` makes them from a request).
    pub fn compare_job<'a>(
        &'a self,
        options: &'a RunOptions,
        states: Option<&'a States>,
    ) -> impl OnBackend<Output = Option<Finished<KldTerms>>> + 'a {
        CompareJob {
            run: self,
            options,
            states,
        }
    }

    /// `--save-base` as a job for backends already made, writing through `writer`.
    pub fn save_job<'a>(
        &'a self,
        options: &'a RunOptions,
        writer: &'a mut StatesWriter,
    ) -> impl OnBackend<Output = ()> + 'a {
        SaveJob {
            run: self,
            options,
            writer,
        }
    }

    /// The states file header this run's base gives: what `--save-base` writes and
    /// `--base-states` must find.
    pub fn states_header(&self, dtype: StatesDtype) -> anyhow::Result<StatesHeader> {
        let base = &self.base;
        let mut fingerprint = resume::fingerprint(
            &[FingerprintModel {
                role: "base model".into(),
                dir: &base.ckpt.dir,
            }],
            Activations::Declared,
            &self.prepared.settings,
            base.tokenizer.path(),
            &self.prepared.plan,
        )?;
        // The head the states are read through: lm_head (or the tied embedding) and the norm.
        let store = &base.ckpt.store;
        let embedding = base.ckpt.config.embedding_name();
        let projection = ["lm_head.weight", &embedding]
            .into_iter()
            .find(|n| store.contains(n))
            .unwrap_or("lm_head.weight");
        let mut head = Fnv::default();
        for name in [projection, &base.ckpt.config.final_norm_name()] {
            if let Some(t) = store.try_get(name) {
                head.update(name.as_bytes());
                head.update(t.bytes);
            }
        }
        fingerprint.push(("base head".into(), head.hex()));
        Ok(StatesHeader {
            fingerprint,
            hidden: base.ckpt.config.hidden_size,
            dtype,
            rows: self
                .prepared
                .plan
                .windows
                .iter()
                .map(Window::scored)
                .collect(),
        })
    }

    /// Runs only the base over the windows and writes its final-normed hidden states at every
    /// scored position to `path` (continuing a file an interrupted run left).
    pub fn save_base_states(
        &self,
        req: &DeviceRequest,
        options: &RunOptions,
        path: &Path,
        dtype: StatesDtype,
    ) -> anyhow::Result<SavedStates> {
        let mut writer = StatesWriter::open(path, self.states_header(dtype)?)?;
        let start = Instant::now();
        with_backend(
            req,
            self.base.ckpt.config.auto_activation_dtype(),
            self.save_job(options, &mut writer),
        )?;
        let windows = self.prepared.plan.windows.len();
        Ok(SavedStates {
            bytes: writer.finish()?,
            windows,
            seconds: start.elapsed().as_secs_f64(),
        })
    }
}

struct CompareJob<'a> {
    run: &'a CompareRun,
    options: &'a RunOptions,
    /// The base's saved states: only its head is loaded.
    states: Option<&'a States>,
}

/// The base of a comparison on the devices: the whole model, or its head and saved states.
enum Base<'a, B: Backend> {
    Resident(Placed<B>),
    States {
        heads: Vec<Model<B>>,
        states: &'a States,
    },
}

/// How the devices share a comparison: the base's placement, and the quantized model's where
/// it differs (a model of another depth splits its layers otherwise).
/// Opens the quantized models `quants` (directory, report name), refusing any whose
/// vocabulary differs from the base's.
pub fn open_quants(
    base: &OpenedModel,
    quants: Vec<(PathBuf, String)>,
    activations: Activations,
) -> anyhow::Result<Vec<Quant>> {
    let vocab = base.ckpt.config.vocab_size;
    quants
        .into_iter()
        .map(|(dir, name)| {
            let ckpt = open_checkpoint(&dir, activations)?;
            if ckpt.config.vocab_size != vocab {
                bail!(
                    "{}: vocabulary of {} tokens, but the base {} has {vocab}; KL divergence \
                     needs the same vocabulary",
                    dir.display(),
                    ckpt.config.vocab_size,
                    base.ckpt.dir.display()
                );
            }
            Ok(Quant { name, ckpt })
        })
        .collect()
}

/// The models a comparison's record files are tied to: the base, then each quantized model.
pub fn fingerprint_models<'a>(
    base: &'a OpenedModel,
    quants: &'a [Quant],
) -> Vec<FingerprintModel<'a>> {
    let mut models = vec![FingerprintModel {
        role: "base model".into(),
        dir: &base.ckpt.dir,
    }];
    for (i, q) in quants.iter().enumerate() {
        models.push(FingerprintModel {
            role: format!("quantized model {}", i + 1),
            dir: &q.ckpt.dir,
        });
    }
    models
}

fn pair_label<B: Backend>(base: &Placed<B>, quant: &Placed<B>) -> String {
    let (b, q) = (base.label(), quant.label());
    if b == q {
        b
    } else {
        format!("{b} (base), {q} (quantized)")
    }
}

/// The KL divergence terms of `quant` against `base` over `batches`, both placed in one
/// layout: replicas side by side on every device, or pipelines whose stages share the devices,
/// the two residual streams handed on together and compared on the last device. `sink`
/// receives each window's terms as they arrive.
fn kld_batches<B: Backend>(
    backends: &[B],
    base: &Placed<B>,
    quant: &Placed<B>,
    plan: &Plan,
    batches: &[Batch],
    sink: impl FnMut(usize, Vec<KldTerms>) -> crate::Result<()>,
) -> crate::Result<Vec<WorkerTime>> {
    let by_window = |batch: &Batch, terms| kld_by_window(plan, batch, terms);
    if !base.pipeline {
        return scheduler::run_each(
            backends.len(),
            batches,
            |i| backends[i].enter_thread(),
            |i, batch| {
                let inputs = scheduler::batch_inputs(plan, batch);
                let (ids, targets, layout) = (&inputs.ids, &inputs.targets, &inputs.layout);
                let b = &backends[i];
                let terms =
                    quant.models[i].kld_against(&base.models[i], b, ids, layout, targets)?;
                by_window(batch, terms)
            },
            sink,
        );
    }
    let devices: Vec<&B> = backends.iter().collect();
    let last = backends.len() - 1;
    scheduler::run_pipeline_each(
        &devices,
        batches,
        // The batch's inputs, built at the first stage, travel with both residual streams.
        |si, batch, state: Option<(BatchInputs, B::Tensor, B::Tensor)>| {
            let (inputs, base_in, quant_in) = match state {
                Some((inputs, base_x, quant_x)) => {
                    let from = &backends[si - 1];
                    (inputs, Some((from, base_x)), Some((from, quant_x)))
                }
                None => (scheduler::batch_inputs(plan, batch), None, None),
            };
            let (ids, layout) = (&inputs.ids, &inputs.layout);
            let b = &backends[si];
            let base_x = base.models[si].stage_forward(b, base_in, ids, layout)?;
            let quant_x = quant.models[si].stage_forward(b, quant_in, ids, layout)?;
            Ok((inputs, base_x, quant_x))
        },
        |batch, (inputs, base_x, quant_x)| {
            let terms = quant.models[last].kld_from_residuals(
                &base.models[last],
                &backends[last],
                base_x,
                quant_x,
                &inputs.targets,
            )?;
            by_window(batch, terms)
        },
        sink,
    )
}

impl OnBackend for CompareJob<'_> {
    type Output = Option<Finished<KldTerms>>;

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<Self::Output> {
        let (run, opts) = (self.run, self.options);
        let plan = &run.prepared.plan;
        let mut models = vec![ModelSummary::of(&run.base.name, &run.base.ckpt)?];
        for q in &run.quants {
            models.push(ModelSummary::of(&q.name, &q.ckpt)?);
        }
        // Resident at once: the base (or only its head, from saved states) beside the largest
        // quantized model.
        let largest = run.quants.iter().map(|q| q.ckpt.store.total_bytes()).max();
        let base_bytes = match self.states {
            Some(_) => 0,
            None => run.base.ckpt.store.total_bytes(),
        };
        let mut started = start::<B, KldTerms>(
            backends,
            &run.prepared,
            (
                &run.base.ckpt.config,
                base_bytes + largest.unwrap_or(0),
                run.quants.iter().any(|q| q.ckpt.experts_quantize_input()),
            ),
            models,
            RunKind::Compare,
            opts,
        )?;
        let (batch_tokens, progress) = (started.batch_tokens, &mut started.progress);
        let n = plan.windows.len();
        let todos: Vec<Vec<usize>> = (0..run.quants.len()).map(|m| progress.todo(m, n)).collect();
        let start = Instant::now();
        let mut forwarded = 0u64;
        let mut workers = Vec::new();
        let mut fresh: Vec<Vec<Option<Vec<KldTerms>>>> = vec![vec![None; n]; run.quants.len()];
        if todos.iter().any(|t| !t.is_empty()) {
            let bytes = |q: &Quant| q.ckpt.store.total_bytes();
            let largest = run.quants.iter().max_by_key(|q| bytes(q));
            let (placement, base) = match self.states {
                // Only the base's head, on every device, beside one quantized model at a time.
                Some(states) => {
                    let what = "the largest quantized model and the base's head".to_string();
                    let weights = largest.map_or(0, bytes);
                    let placement = Placement::choose(backends, weights, &what, opts.parallel)?;
                    let layers = run.base.ckpt.config.num_layers;
                    let heads = backends
                        .iter()
                        .map(|b| {
                            Model::load_stage(
                                b,
                                &run.base.ckpt,
                                layers..layers,
                                LoadFor::positions(plan.max_window()),
                                &|_, _| {},
                            )
                        })
                        .collect::<crate::Result<Vec<_>>>()?;
                    (placement, Base::States { heads, states })
                }
                // The whole base beside one quantized model at a time: memory = base + the
                // largest of them.
                None => {
                    let resident = run.base.ckpt.store.total_bytes() + largest.map_or(0, bytes);
                    let mut what = run.base.ckpt.dir.display().to_string();
                    if let Some(q) = largest {
                        what += &format!(" and {} (resident together)", q.ckpt.dir.display());
                    }
                    let placement = Placement::choose(backends, resident, &what, opts.parallel)?;
                    // The base runs beside each quantized model on its batches.
                    let first = todos.iter().find(|t| !t.is_empty()).map_or(&[][..], |t| t);
                    let batches = scheduler::make_batches(plan, first, batch_tokens);
                    let loaded_for = scheduler::load_for(plan, &batches);
                    let base = placement.load(backends, &run.base.ckpt, loaded_for, opts.quiet)?;
                    (placement, Base::Resident(base))
                }
            };
            for (m, q) in run.quants.iter().enumerate() {
                let todo = &todos[m];
                if todo.is_empty() {
                    continue;
                }
                let batches = scheduler::make_batches(plan, todo, batch_tokens);
                let loaded_for = scheduler::load_for(plan, &batches);
                let quant = placement.load(backends, &q.ckpt, loaded_for, opts.quiet)?;
                let tokens: u64 = todo.iter().map(|&w| plan.windows[w].ids.len() as u64).sum();
                let bar = progress_bar(tokens, "tokens", opts.quiet);
                let out = &mut fresh[m];
                let (label, passes) = match &base {
                    Base::Resident(b) => (pair_label(b, &quant), 2),
                    Base::States { .. } => (format!("{} (base states)", quant.label()), 1),
                };
                forwarded += passes * tokens;
                let sink = |w: usize, terms: Vec<KldTerms>| {
                    bar.inc(plan.windows[w].ids.len() as u64);
                    progress.record(&label, m, w, &terms)?;
                    out[w] = Some(terms);
                    Ok(())
                };
                let times = match &base {
                    Base::Resident(b) => kld_batches(backends, b, &quant, plan, &batches, sink),
                    Base::States { heads, states } => kld_batches_from_states(
                        backends, heads, &quant, plan, &batches, states, sink,
                    ),
                }
                .with_context(|| format!("comparing {} with the base", q.name))?;
                WorkerTime::add_runs(&mut workers, times);
                bar.finish_and_clear();
            }
        }
        let wall = start.elapsed().as_secs_f64();
        if progress.shard.n > 1 {
            return Ok(None);
        }
        let results = (0..run.quants.len())
            .map(|m| resume::collect(m, n, &mut fresh[m], progress.recorded()))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let timing = Timing {
            forwarded,
            wall_seconds: wall,
            load_seconds: 0.0,
            workers,
        };
        Ok(Some(started.finish(backends, results, timing)))
    }
}

/// A batch's KL divergence terms split by window, any non-finite one refused.
fn kld_by_window(
    plan: &Plan,
    batch: &Batch,
    terms: Vec<KldTerms>,
) -> crate::Result<Vec<(usize, Vec<KldTerms>)>> {
    scheduler::split_by_window(plan, batch, terms, "KL divergence", |t| {
        t.kld.is_finite() && t.nll_q.is_finite() && t.nll_base.is_finite()
    })
}

/// One pipeline stage of `placed` on device `si`: the batch's inputs (built at the first
/// stage) and the residual stream after this stage's layers, handed on from the previous one.
fn advance_stage<B: Backend>(
    backends: &[B],
    placed: &Placed<B>,
    plan: &Plan,
    si: usize,
    batch: &Batch,
    state: Option<(BatchInputs, B::Tensor)>,
) -> crate::Result<(BatchInputs, B::Tensor)> {
    let (inputs, handed_on) = match state {
        Some((inputs, x)) => (inputs, Some((&backends[si - 1], x))),
        None => (scheduler::batch_inputs(plan, batch), None),
    };
    let x =
        placed.models[si].stage_forward(&backends[si], handed_on, &inputs.ids, &inputs.layout)?;
    Ok((inputs, x))
}

/// What `--save-base` wrote.
#[derive(Clone, Copy, Debug)]
pub struct SavedStates {
    pub windows: usize,
    pub bytes: u64,
    pub seconds: f64,
}

/// Window by window, the base's final-normed hidden rows at its scored positions.
fn states_by_window(
    plan: &Plan,
    batch: &Batch,
    hidden: &[f32],
    width: usize,
) -> Vec<(usize, Vec<f32>)> {
    let mut at = 0;
    batch
        .windows
        .iter()
        .map(|&w| {
            let window = &plan.windows[w];
            let mut rows = Vec::with_capacity(window.scored() * width);
            for (p, &t) in window.targets.iter().enumerate() {
                if t >= 0 {
                    rows.extend_from_slice(&hidden[(at + p) * width..(at + p + 1) * width]);
                }
            }
            at += window.ids.len();
            (w, rows)
        })
        .collect()
}

struct SaveJob<'a> {
    run: &'a CompareRun,
    options: &'a RunOptions,
    writer: &'a mut StatesWriter,
}

impl OnBackend for SaveJob<'_> {
    type Output = ();

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<()> {
        let (run, opts, writer) = (self.run, self.options, self.writer);
        let plan = &run.prepared.plan;
        let todo: Vec<usize> = (writer.written()..plan.windows.len()).collect();
        if todo.is_empty() {
            return Ok(());
        }
        let cfg = &run.base.ckpt.config;
        super::placement::check_window_fits(&backends[0], cfg, plan.max_window())?;
        // The batch size depends on the memory left once the base is loaded.
        let batches = LoadFor::positions(plan.max_window());
        let base =
            super::placement::place(backends, &run.base.ckpt, batches, opts.parallel, opts.quiet)?;
        // The base is loaded: only the activations remain to fit.
        let share = super::placement::DeviceShare::loaded(base.models.len(), base.pipeline);
        let model = (cfg, run.base.ckpt.experts_quantize_input());
        let batch_tokens =
            super::placement::batch_tokens(opts.batch_tokens, &backends[0], model, plan, share);
        let batches = scheduler::make_batches(plan, &todo, batch_tokens);
        let tokens: u64 = todo.iter().map(|&w| plan.windows[w].ids.len() as u64).sum();
        let bar = progress_bar(tokens, "tokens", opts.quiet);
        let width = cfg.hidden_size;
        let sink = |w: usize, rows: Vec<f32>| {
            bar.inc(plan.windows[w].ids.len() as u64);
            writer.push(w, rows)
        };
        if base.pipeline {
            let devices: Vec<&B> = backends.iter().collect();
            let last = backends.len() - 1;
            scheduler::run_pipeline_each(
                &devices,
                &batches,
                |si, batch, state| advance_stage(backends, &base, plan, si, batch, state),
                |batch, (_, x)| {
                    let b = &backends[last];
                    let hidden = b.download(&base.models[last].final_norm(b, &x)?)?;
                    Ok(states_by_window(plan, batch, &hidden, width))
                },
                sink,
            )?;
        } else {
            scheduler::run_each(
                backends.len(),
                &batches,
                |i| backends[i].enter_thread(),
                |i, batch| {
                    let inputs = scheduler::batch_inputs(plan, batch);
                    let b = &backends[i];
                    let hidden =
                        b.download(&base.models[i].hidden(b, &inputs.ids, &inputs.layout)?)?;
                    Ok(states_by_window(plan, batch, &hidden, width))
                },
                sink,
            )?;
        }
        bar.finish_and_clear();
        Ok(())
    }
}

/// [`kld_batches`] against saved base states: the base's hidden rows of each batch come from
/// `states` (zeros at unscored positions, which the KL divergence skips) and are read through
/// the base's head on the device that computes the quantized model's last layer.
fn kld_batches_from_states<B: Backend>(
    backends: &[B],
    heads: &[Model<B>],
    quant: &Placed<B>,
    plan: &Plan,
    batches: &[Batch],
    states: &States,
    sink: impl FnMut(usize, Vec<KldTerms>) -> crate::Result<()>,
) -> crate::Result<Vec<WorkerTime>> {
    let width = states.header.hidden;
    let base_rows = |batch: &Batch| -> crate::Result<Vec<f32>> {
        let tokens: usize = batch
            .windows
            .iter()
            .map(|&w| plan.windows[w].ids.len())
            .sum();
        let mut rows = vec![0.0f32; tokens * width];
        let mut at = 0;
        for &w in &batch.windows {
            let saved = states.window(w)?;
            let window = &plan.windows[w];
            let mut next = saved.chunks_exact(width);
            for (p, &t) in window.targets.iter().enumerate() {
                if t >= 0 {
                    let row = next.next().ok_or_else(|| {
                        crate::Error::InvalidArgument(format!("window {w}: too few saved states"))
                    })?;
                    rows[(at + p) * width..(at + p + 1) * width].copy_from_slice(row);
                }
            }
            at += window.ids.len();
        }
        Ok(rows)
    };
    let by_window = |batch: &Batch, terms| kld_by_window(plan, batch, terms);
    let compare_on = |i: usize, batch: &Batch, inputs: &BatchInputs, x: B::Tensor| {
        let b = &backends[i];
        let base_hidden = heads[i].upload_head_input(b, &base_rows(batch)?, inputs.ids.len())?;
        let terms =
            quant.models[i].kld_from_base_states(&heads[i], b, &base_hidden, x, &inputs.targets)?;
        by_window(batch, terms)
    };
    if !quant.pipeline {
        return scheduler::run_each(
            backends.len(),
            batches,
            |i| backends[i].enter_thread(),
            |i, batch| {
                let inputs = scheduler::batch_inputs(plan, batch);
                let b = &backends[i];
                let x = quant.models[i].stage_forward(b, None, &inputs.ids, &inputs.layout)?;
                compare_on(i, batch, &inputs, x)
            },
            sink,
        );
    }
    let devices: Vec<&B> = backends.iter().collect();
    let last = backends.len() - 1;
    scheduler::run_pipeline_each(
        &devices,
        batches,
        |si, batch, state| advance_stage(backends, quant, plan, si, batch, state),
        |batch, (inputs, x)| compare_on(last, batch, &inputs, x),
        sink,
    )
}
