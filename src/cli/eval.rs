//! `quantppl eval`: the perplexity of one model with one method.

use std::path::PathBuf;

use super::{
    BackendArgs, DataArgs, ModelArgs, OutputArgs, RecordArgs, check_writable, emit,
    report_shard_done,
};
use crate::data::task::Task;
use crate::report::EvalReport;
use crate::report::nll_dump::write_nll_dump;
use crate::report::task::{TaskReport, TaskRun, TaskScores};
use crate::run::task::eval_task;
use crate::run::{EvalRun, open_model};

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
    #[command(flatten)]
    pub output: OutputArgs,
    /// Write every window's per-position NLLs to FILE as JSON Lines, one object per window:
    /// {"window", "doc", "ids" (input tokens), "positions" (the scored ones), "targets" (the
    /// token each predicts), "nll" (nats, f32)}. Not with --shard (a shard holds some windows).
    #[arg(long, value_name = "FILE", conflicts_with = "shard")]
    pub dump_nll: Option<PathBuf>,
    /// Score a multiple-choice task instead of the perplexity, as lm-eval scores it (acc,
    /// acc_norm; README "Multiple-choice tasks"): a FILE of one item a line, `{"context",
    /// "choices", "label"}` (ARC, HellaSwag, MMLU) or `{"contexts", "continuation", "label"}`
    /// (WinoGrande); or a NAME read from the local Hugging Face cache as lm-eval's task of
    /// that name reads it (never downloaded): hellaswag, arc_easy, arc_challenge, mmlu,
    /// winogrande.
    #[arg(long, value_name = "FILE|NAME", conflicts_with_all = ["dump_nll", "shard"])]
    pub task: Option<PathBuf>,
}

pub fn run(args: Args, quiet: bool) -> anyhow::Result<()> {
    let m = &args.model;
    let metric = args.output.plot_metric;
    if args.output.plot.is_some() && metric.compares() {
        let name = metric.name();
        anyhow::bail!("--plot-metric {name} needs a base: use `quantppl compare`");
    }
    check_writable(
        args.output
            .paths()
            .chain(args.dump_nll.as_deref())
            .chain(args.records.resume.as_deref()),
        args.data
            .data
            .as_deref()
            .into_iter()
            .chain(m.tokenizer.as_deref()),
    )?;
    crate::run::interrupt::catch()?;
    let model = open_model(m.model.as_deref(), m.tokenizer.as_deref(), m.activations)?;
    if let Some(path) = &args.task {
        let started = std::time::Instant::now();
        let task = Task::open(path)?;
        let options = args.backend.run_options(&args.records, quiet)?;
        let req = args.backend.request()?;
        let name = model.name.clone();
        let Some(done) = eval_task(model, &task, m.activations, &req, &options)? else {
            anyhow::bail!("--task runs whole: --shard does not apply");
        };
        let scores = TaskScores::new(name, &task.items, &done.lls);
        let secs = started.elapsed().as_secs_f64();
        let report = TaskReport::new(task.name, scores, Vec::new(), secs)
            .with_run(TaskRun::of(&done.info, &done.timing));
        return emit(&report, &args.output);
    }
    let run = EvalRun::prepare(model, &args.data.settings(), m.activations)?;
    let options = args.backend.run_options(&args.records, quiet)?;
    match run.run(&args.backend.request()?, &options)? {
        Some(f) => {
            let report = EvalReport::new(
                &f.info,
                &f.results[0],
                &f.placements,
                f.timing,
                f.peak_memory,
            );
            emit(&report, &args.output)?;
            if let Some(path) = &args.dump_nll {
                write_nll_dump(path, &run.prepared.plan, &f.results[0])?;
            }
        }
        None => report_shard_done(&args.records, run.prepared.plan.windows.len(), quiet),
    }
    Ok(())
}
