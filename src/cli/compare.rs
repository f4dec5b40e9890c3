//! `quantppl compare`: quantized models against their base on the same windows.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};

use super::eval::{Layout, OpenedModel, Placement, batch_tokens, max_window, run_info};
use super::runfile::{self, FingerprintModel, Progress, RecordArgs};
use super::{Activations, BackendArgs, DataArgs, OnBackend, Parallel, with_backend, write_json};
use crate::backend::{Backend, KldTerms};
use crate::checkpoint::Checkpoint;
use crate::data::TextTokenizer;
use crate::eval::compare::{CompareReport, PlotMetric, svg_scatter};
use crate::eval::plan::Plan;
use crate::eval::record::RunKind;
use crate::eval::report::ModelSummary;
use crate::eval::scheduler::{self, Batch, BatchInputs};
use crate::eval::setup::{ResolvedSettings, build_plan};

/// `--base bundled`: the bundled dense stories260K.
const BUNDLED: &str = "bundled";

/// `quantppl compare --help`'s long description (set on the subcommand in cli/mod.rs, where
/// the one-line doc comment would otherwise take its place).
pub const LONG_ABOUT: &str = "Perplexity and KL divergence of quantized models against their base, \
    on the same windows (the plan is built once, from the base's tokenizer).\n\n\
    Memory: the base and ONE quantized model are resident on the backend at the same time \
    (the base stays loaded, the quantized models are loaded one after another), plus the \
    activations of both for one batch. On several devices, --parallel places them as for \
    `eval`, chosen for the base and the largest quantized model together: both replicated on \
    every device, or both models' layers split across the devices in the same proportions, \
    their batches pipelined side by side and compared on the last device. No logits are \
    stored anywhere: each batch runs the base and the quantized model, and the backend \
    reduces both logit rows to the KL divergence KL(P_base || Q), the two target NLLs and \
    the top-1 agreement. The KL divergence is exact over the full vocabulary: no 16-nat \
    truncation and no uint16 compression (llama.cpp), no top-k (vLLM).\n\n\
    Statistics: llama.cpp's `--kl-divergence` report (PPL ratio, KLD percentiles, RMS Δp, \
    same top p, each ± one standard error) over the method's scored positions, plus \
    ExLlamaV3's KLD by the base's top-token probability.\n\n\
    With no model arguments, compares the bundled INT4 stories260K with its bundled dense base.";

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Quantized model directories (default with no --base: the bundled INT4 model).
    #[arg(value_name = "QUANT_DIR")]
    pub quants: Vec<PathBuf>,
    /// The base (unquantized) model directory; `bundled` = the bundled dense stories260K.
    /// Its tokenizer builds the windows every model is scored on.
    #[arg(long, value_name = "DIR")]
    pub base: Option<PathBuf>,
    /// tokenizer.json to use instead of the base directory's own.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Activation quantization declared by the checkpoints: emulated, or skipped.
    #[arg(long, value_enum, default_value_t = Activations::Declared)]
    pub activations: Activations,
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub records: RecordArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Where a comparison report goes besides stdout (shared with `merge`).
#[derive(clap::Args, Clone, Debug)]
pub struct OutputArgs {
    /// Also write the report as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write a Markdown table for a model card (model, bits/weight, size, PPL, PPL ratio,
    /// KLD, same top p) to FILE.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// Write an SVG scatter of --plot-metric against bits per weight, one labelled point per
    /// model, to FILE.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// The y axis of --plot.
    #[arg(long, value_enum, default_value_t = PlotMetric::Ppl)]
    pub plot_metric: PlotMetric,
}

/// Prints `report` and writes the files `out` asks for.
pub fn emit(report: &CompareReport, out: &OutputArgs) -> anyhow::Result<()> {
    print!("{}", report.to_text());
    if let Some(path) = &out.json {
        write_json(path, report)?;
    }
    if let Some(path) = &out.markdown {
        std::fs::write(path, report.to_markdown())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &out.plot {
        let y = match out.plot_metric {
            PlotMetric::Ppl => format!("perplexity ({})", report.method),
            PlotMetric::Kld => "mean KL divergence from the base (nats)".to_string(),
        };
        let svg = svg_scatter(
            &report.plot_points(out.plot_metric),
            "bits per weight (decoder linears)",
            &y,
        );
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn open_checkpoint(dir: &Path, activations: Activations) -> anyhow::Result<Checkpoint> {
    let mut ckpt = Checkpoint::open(dir)?;
    ckpt.weight_only = activations == Activations::WeightOnly;
    Ok(ckpt)
}

/// A quantized model: its report name and checkpoint.
pub struct Quant {
    pub name: String,
    pub ckpt: Checkpoint,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (base_dir, base_name, quants) = match (&args.base, args.quants.is_empty()) {
        (None, true) => (
            crate::assets::dense_model_dir()?,
            crate::assets::DENSE_MODEL_NAME.to_string(),
            vec![(
                crate::assets::default_model_dir()?,
                crate::assets::DEFAULT_MODEL_NAME.to_string(),
            )],
        ),
        (None, false) => bail!("--base DIR is required to compare quantized models"),
        (Some(_), true) => bail!("give at least one quantized model directory after --base DIR"),
        (Some(b), false) => {
            let (dir, name) = if b.as_os_str() == BUNDLED {
                (
                    crate::assets::dense_model_dir()?,
                    crate::assets::DENSE_MODEL_NAME.to_string(),
                )
            } else {
                (b.clone(), b.display().to_string())
            };
            let quants = args
                .quants
                .iter()
                .map(|q| (q.clone(), q.display().to_string()))
                .collect();
            (dir, name, quants)
        }
    };
    let base_ckpt = open_checkpoint(&base_dir, args.activations)?;
    let tokenizer = match &args.tokenizer {
        Some(t) => TextTokenizer::from_file(t)?,
        None => TextTokenizer::from_model_dir(&base_dir)?,
    };
    let vocab = base_ckpt.config.vocab_size;
    if tokenizer.vocab_size() > vocab {
        bail!(
            "tokenizer {} has {} tokens but the base's vocabulary is {vocab}",
            tokenizer.path().display(),
            tokenizer.vocab_size()
        );
    }
    let quants = quants
        .into_iter()
        .map(|(dir, name)| {
            let ckpt = open_checkpoint(&dir, args.activations)?;
            if ckpt.config.vocab_size != vocab {
                bail!(
                    "{}: vocabulary of {} tokens, but the base {} has {vocab}; KL divergence \
                     needs the same vocabulary",
                    dir.display(),
                    ckpt.config.vocab_size,
                    base_dir.display()
                );
            }
            Ok(Quant { name, ckpt })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let base = OpenedModel {
        name: base_name,
        ckpt: base_ckpt,
        tokenizer,
    };
    let (plan, settings) = build_plan(&args.data.settings(), &base.tokenizer, &base.ckpt.config)
        .with_context(|| {
            format!(
                "preparing the {} windows",
                crate::eval::setup::method_name(args.data.method)
            )
        })?;
    let mut fp_models = vec![FingerprintModel {
        role: "base model".into(),
        dir: &base.ckpt.dir,
    }];
    for (i, q) in quants.iter().enumerate() {
        fp_models.push(FingerprintModel {
            role: format!("quantized model {}", i + 1),
            dir: &q.ckpt.dir,
        });
    }
    let fingerprint = runfile::fingerprint(
        &fp_models,
        args.activations,
        &settings,
        &runfile::data_path(&args.data.data)?,
        base.tokenizer.path(),
        &plan,
    )?;
    let job = CompareJob {
        base: &base,
        quants: &quants,
        plan: &plan,
        settings: &settings,
        fingerprint,
        records: &args.records,
        batch_tokens: args.backend.batch_tokens,
        parallel: args.backend.parallel,
        quiet: args.quiet,
    };
    match with_backend(&args.backend, base.ckpt.config.dtype, job)? {
        Some(report) => emit(&report, &args.output),
        None => {
            runfile::report_shard_done(&args.records, plan.windows.len());
            Ok(())
        }
    }
}

struct CompareJob<'a> {
    base: &'a OpenedModel,
    quants: &'a [Quant],
    plan: &'a Plan,
    settings: &'a ResolvedSettings,
    fingerprint: Vec<(String, String)>,
    records: &'a RecordArgs,
    batch_tokens: Option<usize>,
    parallel: Parallel,
    quiet: bool,
}

/// How the devices share a comparison: the base's placement, and the quantized model's where
/// it differs (a model of another depth splits its layers otherwise).
fn pair_label<B: Backend>(base: &Placement<B>, quant: &Placement<B>) -> String {
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
    base: &Placement<B>,
    quant: &Placement<B>,
    plan: &Plan,
    batches: &[Batch],
    sink: impl FnMut(usize, Vec<KldTerms>) -> crate::Result<()>,
) -> crate::Result<()> {
    let by_window = |batch: &Batch, terms: Vec<KldTerms>| {
        scheduler::split_by_window(plan, batch, terms, "KL divergence", |t| {
            t.kld.is_finite() && t.nll_q.is_finite() && t.nll_base.is_finite()
        })
    };
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

fn summary(name: &str, ckpt: &Checkpoint) -> anyhow::Result<ModelSummary> {
    Ok(ModelSummary {
        name: name.to_string(),
        dir: ckpt.dir.display().to_string(),
        summary: ckpt.summary()?,
    })
}

impl OnBackend for CompareJob<'_> {
    /// `None` for a shard: its windows went to the partial file, the report comes from `merge`.
    type Output = Option<CompareReport>;

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<Option<CompareReport>> {
        let plan = self.plan;
        let max_len = max_window(plan);
        let batch_tokens = batch_tokens(
            self.batch_tokens,
            &backends[0],
            &self.base.ckpt.config,
            plan,
        );
        let mut models = vec![summary(&self.base.name, &self.base.ckpt)?];
        for q in self.quants {
            models.push(summary(&q.name, &q.ckpt)?);
        }
        let info = run_info(
            models,
            self.settings,
            plan,
            backends[0].name(),
            backends.len(),
            batch_tokens,
        );
        let mut progress = Progress::<KldTerms>::open(
            self.records,
            RunKind::Compare,
            self.fingerprint,
            info.clone(),
        )?;
        let n = plan.windows.len();
        let todos: Vec<Vec<usize>> = (0..self.quants.len())
            .map(|m| progress.todo(m, n))
            .collect();
        let start = Instant::now();
        let mut forwarded = 0u64;
        let mut fresh: Vec<Vec<Option<Vec<KldTerms>>>> = vec![vec![None; n]; self.quants.len()];
        if todos.iter().any(|t| !t.is_empty()) {
            // One quantized model at a time next to the base: memory = base + one model, so
            // the layout is chosen for the base and the largest of them.
            let bytes = |q: &Quant| q.ckpt.store.total_bytes();
            let largest = self.quants.iter().max_by_key(|q| bytes(q));
            let resident = self.base.ckpt.store.total_bytes() + largest.map_or(0, bytes);
            let mut what = self.base.ckpt.dir.display().to_string();
            if let Some(q) = largest {
                what += &format!(" and {} (resident together)", q.ckpt.dir.display());
            }
            let layout = Layout::choose(backends, resident, &what, self.parallel)?;
            let base = layout.load(backends, &self.base.ckpt, max_len, self.quiet)?;
            for (m, q) in self.quants.iter().enumerate() {
                let todo = &todos[m];
                if todo.is_empty() {
                    continue;
                }
                let quant = layout.load(backends, &q.ckpt, max_len, self.quiet)?;
                let label = pair_label(&base, &quant);
                let batches = scheduler::make_batches(plan, todo, batch_tokens);
                let tokens: u64 = todo.iter().map(|&w| plan.windows[w].ids.len() as u64).sum();
                forwarded += 2 * tokens;
                let bar = super::progress_bar(tokens, "tokens", self.quiet);
                let out = &mut fresh[m];
                kld_batches(backends, &base, &quant, plan, &batches, |w, terms| {
                    bar.inc(plan.windows[w].ids.len() as u64);
                    progress.record(&label, m, w, &terms)?;
                    out[w] = Some(terms);
                    Ok(())
                })
                .with_context(|| format!("comparing {} with the base", q.name))?;
                bar.finish_and_clear();
            }
        }
        let wall = start.elapsed().as_secs_f64();
        if progress.shard.n > 1 {
            return Ok(None);
        }
        let results = (0..self.quants.len())
            .map(|m| runfile::collect(m, n, &mut fresh[m], progress.recorded()))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let peak = backends.iter().filter_map(Backend::peak_memory_bytes).max();
        Ok(Some(CompareReport::new(
            &info,
            &results,
            progress.placements(),
            forwarded,
            wall,
            peak,
        )))
    }
}
