//! `quantppl eval`: the perplexity of one model with one method.

use std::path::PathBuf;

use super::{
    BackendArgs, DataArgs, ModelArgs, RecordArgs, check_writable, print_report, report_shard_done,
    write_json,
};
use crate::report::EvalReport;
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
    /// Also write the report as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let m = &args.model;
    check_writable(
        args.json
            .iter()
            .chain(&args.records.resume)
            .map(PathBuf::as_path),
    )?;
    let model = open_model(m.model.as_deref(), m.tokenizer.as_deref(), m.activations)?;
    let run = EvalRun::prepare(model, &args.data.settings(), m.activations)?;
    let options = args.backend.run_options(&args.records, args.quiet);
    match run.run(&args.backend.request(), &options)? {
        Some(f) => {
            let report = EvalReport::new(
                &f.info,
                &f.results[0],
                &f.placements,
                f.timing,
                f.peak_memory,
            );
            print_report(&report.to_text(), args.json.as_deref());
            if let Some(path) = &args.json {
                write_json(path, &report)?;
            }
        }
        None => report_shard_done(&args.records, run.prepared.plan.windows.len()),
    }
    Ok(())
}
