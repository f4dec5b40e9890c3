//! `quantppl compare`: quantized models against their base on the same windows.

use std::path::PathBuf;

use anyhow::bail;

use super::{
    BackendArgs, DataArgs, OutputArgs, RecordArgs, check_writable, emit, print_output,
    report_shard_done,
};
use crate::assets::BUNDLED;
use crate::data::task::Task;
use crate::report::CompareReport;
use crate::report::compare::BaseStatesUsed;
use crate::report::task::{TaskReport, TaskRun, TaskScores};
use crate::run::base_states::{States, StatesDtype};
use crate::run::task::compare_task as run_compare_task;
use crate::run::{Activations, CompareRun, OpenedModel, open_model};

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
    reduces both logit rows to the KL divergences KL(P_base || Q) and KL(Q || P_base), the two \
    target NLLs and both models' 10 most probable tokens. The KL divergence is exact over the full vocabulary: no 16-nat \
    truncation and no uint16 compression (llama.cpp), no top-k (vLLM).\n\n\
    Statistics: llama.cpp's `--kl-divergence` report (PPL ratio, KLD percentiles, RMS Δp, \
    same top p, each ± one standard error) over the method's scored positions, plus \
    ExLlamaV3's KLD by the base's top-token probability, the reverse KLD with its \
    percentiles, top-K agreement for K = 1, 5, 10 and the flips (positions whose most \
    probable token changed); with --layers, the residual stream's drift after each layer.\n\n\
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
    /// tokenizer.json to use instead of the base directory's own (a file, a directory, or a
    /// hub repository id `org/name[@revision]` in the local cache).
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
    /// Run only the base over the windows and save its final-normed hidden states at every
    /// scored position to FILE (hidden-size numbers per position: a tenth to a thirtieth of
    /// a logits file), for `--base-states`. No quantized model is given. An interrupted save
    /// continues when run again with the same FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "base_states")]
    pub save_base: Option<PathBuf>,
    /// How --save-base stores the states: f32 (exact: --base-states then gives the numbers
    /// of an in-memory compare) or bf16 (half the size; the difference is in the report).
    #[arg(long, value_enum, default_value_t = StatesDtype::F32, requires = "save_base")]
    pub states_dtype: StatesDtype,
    /// Compare the quantized models against the base states saved in FILE by --save-base
    /// (same --base, data and window options): only the base's head is loaded, so the base
    /// need not fit beside the quantized model. States of another plan, tokenizer or base
    /// are refused, naming what differs.
    #[arg(long, value_name = "FILE")]
    pub base_states: Option<PathBuf>,
    /// Also measure, after each decoder layer, how far each quantized model's residual stream
    /// is from the base's at the scored positions (mean relative L2 distance and cosine
    /// similarity), the layers ranked: where to spend bits. A second pass over the windows,
    /// one at a time on the first device, each layer's stream of both models copied to the
    /// host.
    #[arg(long, conflicts_with_all = ["base_states", "save_base", "shard"])]
    pub layers: bool,
    /// With --layers: an SVG of the relative distance after each layer, to FILE.
    #[arg(long, value_name = "FILE.svg", requires = "layers")]
    pub layers_plot: Option<PathBuf>,
    /// Compare on a multiple-choice task (a FILE or NAME as `eval --task` takes) instead of a
    /// text: the accuracies of the base and every quantized model, each model's flips against
    /// the base (items the base answers right and the model wrong, and the reverse), and the
    /// KL divergence over the choices' tokens, all from one pass (the base's tokenizer reads
    /// the task for every model).
    #[arg(long, value_name = "FILE|NAME", conflicts_with_all = ["base_states", "save_base", "layers", "shard"])]
    pub task: Option<PathBuf>,
}

pub fn run(args: Args, quiet: bool) -> anyhow::Result<()> {
    check_writable(
        args.output
            .paths()
            .chain(args.records.resume.as_deref())
            .chain(args.layers_plot.as_deref()),
        args.data
            .data
            .as_deref()
            .into_iter()
            .chain(args.tokenizer.as_deref())
            .chain(args.base_states.as_deref()),
    )?;
    if args.save_base.is_some() {
        return save_base(&args, quiet);
    }
    crate::run::interrupt::catch()?;
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
    let base =
        open_model(Some(&base_dir), args.tokenizer.as_deref(), args.activations).map(|m| {
            OpenedModel {
                name: base_name,
                ..m
            }
        })?;
    if let Some(task) = &args.task {
        return compare_task(task, base, quants, &args, quiet);
    }
    let run = CompareRun::prepare(base, quants, &args.data.settings(), args.activations)?;
    let options = args.backend.run_options(&args.records, quiet)?;
    let states = match &args.base_states {
        Some(path) => {
            let states = States::open(path)?;
            let expected = run.states_header(states.header.dtype)?;
            if let Some(d) = states.header.difference(&expected) {
                bail!(
                    "{} holds the base states of another run: {d}",
                    path.display()
                );
            }
            Some((path, states))
        }
        None => None,
    };
    match run.run(
        &args.backend.request()?,
        &options,
        states.as_ref().map(|(_, s)| s),
    )? {
        Some(f) => {
            let mut report =
                CompareReport::new(&f.info, &f.results, &f.placements, f.timing, f.peak_memory);
            report.base_states = states.as_ref().map(|(path, s)| BaseStatesUsed {
                file: path.display().to_string(),
                bytes: s.bytes(),
                dtype: format!("{:?}", s.header.dtype).to_lowercase(),
            });
            if args.layers {
                let sums = run.layer_drift(&args.backend.request()?, quiet)?;
                report = report.with_layers(&sums);
            }
            emit(&report, &args.output)?;
            if let Some((path, svg)) = args.layers_plot.as_ref().zip(report.layers_svg()) {
                crate::report::write_whole(path, |w| w.write_all(svg.as_bytes()))?;
            }
            Ok(())
        }
        None => {
            report_shard_done(&args.records, run.prepared.plan.windows.len(), quiet);
            Ok(())
        }
    }
}

/// `--task`: the base and every quantized model on a multiple-choice task, in one comparison
/// over the task's requests.
fn compare_task(
    path: &std::path::Path,
    base: OpenedModel,
    quants: Vec<(PathBuf, String)>,
    args: &Args,
    quiet: bool,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let task = Task::open(path)?;
    let options = args.backend.run_options(&args.records, quiet)?;
    let req = args.backend.request()?;
    let base_name = base.name.clone();
    let Some(c) = run_compare_task(base, quants, &task, args.activations, &req, &options)? else {
        bail!("--task runs whole: --shard does not apply");
    };
    let f = &c.finished;
    let kld = CompareReport::new(
        &f.info,
        &f.results,
        &f.placements,
        f.timing.clone(),
        f.peak_memory,
    );
    let scores = |name: String, lls: &[Vec<f64>]| TaskScores::new(name, &task.items, lls);
    let compared = c
        .quants
        .iter()
        .map(|(n, lls)| scores(n.clone(), lls))
        .collect();
    let secs = started.elapsed().as_secs_f64();
    let report = TaskReport::new(
        task.name.clone(),
        scores(base_name, &c.base),
        compared,
        secs,
    )
    .with_run(TaskRun::of(&f.info, &f.timing))
    .with_comparison(kld);
    emit(&report, &args.output)
}

/// `--save-base`: the base alone over the windows, its states written to the file.
fn save_base(args: &Args, quiet: bool) -> anyhow::Result<()> {
    let path = args.save_base.as_deref().expect("--save-base given");
    if !args.quants.is_empty() {
        bail!(
            "--save-base runs the base alone: give no quantized model (compare them later with --base-states)"
        );
    }
    check_writable(
        [path].into_iter().chain(args.output.json.as_deref()),
        args.data
            .data
            .as_deref()
            .into_iter()
            .chain(args.tokenizer.as_deref()),
    )?;
    let (dir, name) = match &args.base {
        Some(b) if b.as_os_str() != BUNDLED => (b.clone(), b.display().to_string()),
        _ => (
            crate::assets::dense_model_dir()?,
            crate::assets::DENSE_MODEL_NAME.to_string(),
        ),
    };
    let base = open_model(Some(&dir), args.tokenizer.as_deref(), args.activations)
        .map(|m| OpenedModel { name, ..m })?;
    let run = CompareRun::prepare(base, Vec::new(), &args.data.settings(), args.activations)?;
    let options = args.backend.run_options(&args.records, quiet)?;
    let saved =
        run.save_base_states(&args.backend.request()?, &options, path, args.states_dtype)?;
    let summary = serde_json::json!({
        "base_states": path.display().to_string(),
        "base": run.base.name,
        "windows": saved.windows,
        "positions": run.prepared.plan.windows.iter().map(|w| w.scored()).sum::<usize>(),
        "hidden": run.base.ckpt.config.hidden_size,
        "dtype": format!("{:?}", args.states_dtype).to_lowercase(),
        "bytes": saved.bytes,
        "seconds": saved.seconds,
    });
    let text = format!(
        "base states of {} over {} windows ({} positions x hidden {}, {}) in {}: {} in {:.2} s\n",
        summary["base"].as_str().unwrap_or(""),
        saved.windows,
        summary["positions"],
        summary["hidden"],
        summary["dtype"].as_str().unwrap_or(""),
        path.display(),
        crate::units::human_bytes(saved.bytes),
        saved.seconds
    );
    print_output(&text, args.output.json.as_deref(), &summary)
}
