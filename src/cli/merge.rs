//! `quantppl merge`: the report of a run split with `--shard K/N`, from its N partial files,
//! identical digit for digit to a single run's (same per-window values, same window order).

use std::path::PathBuf;

use super::{OutputArgs, check_writable, emit};
use crate::backend::KldTerms;
use crate::report::{CompareReport, EvalReport};
use crate::run::Timing;
use crate::run::record::{self, RunKind};
use crate::run::resume::combine;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// The partial files written by `eval`/`compare --shard K/N --partial FILE`, one per shard.
    #[arg(value_name = "PARTIAL", required = true)]
    pub partials: Vec<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    check_writable(
        args.output.paths(),
        args.partials.iter().map(|p| p.as_path()),
    )?;
    let first = &args.partials[0];
    let kind = record::read_header(first)?
        .ok_or_else(|| anyhow::anyhow!("{}: no complete header line", first.display()))?
        .kind;
    match kind {
        RunKind::Eval => {
            let c = combine::<f32>(&args.partials)?;
            let report = EvalReport::new(
                &c.header.run,
                &c.results[0],
                &c.placements,
                Timing::default(),
                None,
            );
            emit(&report, &args.output)
        }
        RunKind::Compare => {
            let c = combine::<KldTerms>(&args.partials)?;
            emit(
                &CompareReport::new(
                    &c.header.run,
                    &c.results,
                    &c.placements,
                    Timing::default(),
                    None,
                ),
                &args.output,
            )
        }
    }
}
