//! `quantppl merge`: the report of a run split with `--shard K/N`, from its N partial files,
//! identical digit for digit to a single run's (same per-window values, same window order).

use std::path::PathBuf;

use anyhow::bail;

use super::compare::{OutputArgs, emit};
use super::write_json;
use crate::backend::KldTerms;
use crate::eval::compare::CompareReport;
use crate::eval::record::{self, Header, RecordValue, RunKind};
use crate::eval::report::{EvalReport, Timing};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// The partial files written by `eval`/`compare --shard K/N --partial FILE`, one per shard.
    #[arg(value_name = "PARTIAL", required = true)]
    pub partials: Vec<PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let first = &args.partials[0];
    let kind = record::read_header(first)?
        .ok_or_else(|| anyhow::anyhow!("{}: no complete header line", first.display()))?
        .kind;
    match kind {
        RunKind::Eval => {
            if args.output.markdown.is_some() || args.output.plot.is_some() {
                bail!(
                    "--markdown and --plot apply to `compare` results; these are `eval` partials"
                );
            }
            let c = combine::<f32>(&args.partials)?;
            let report = EvalReport::new(
                &c.header.run,
                &c.results[0],
                &c.placements,
                Timing::default(),
                None,
            );
            print!("{}", report.to_text());
            if let Some(path) = &args.output.json {
                write_json(path, &report)?;
            }
            Ok(())
        }
        RunKind::Compare => {
            let c = combine::<KldTerms>(&args.partials)?;
            emit(
                &CompareReport::new(&c.header.run, &c.results, &c.placements, 0, 0.0, None),
                &args.output,
            )
        }
    }
}

/// The N shards of one run, combined.
pub struct Combined<T> {
    /// The header of the first file given.
    pub header: Header,
    /// Every section's per-window results in window order.
    pub results: Vec<Vec<Vec<T>>>,
    /// How the windows were computed: shard 1's placements, then shard 2's, ...
    pub placements: Vec<String>,
}

/// Checks that `paths` are the N shards of one run, each complete, and combines them.
pub fn combine<T: RecordValue>(paths: &[PathBuf]) -> anyhow::Result<Combined<T>> {
    let mut files = Vec::with_capacity(paths.len());
    for p in paths {
        files.push((p, record::read::<T>(p)?));
    }
    let (p0, c0) = &files[0];
    let h0 = c0.header.clone();
    let n = h0.shard.n;
    let mut by_shard: Vec<Option<&PathBuf>> = vec![None; n];
    for (p, c) in &files {
        if let Some(d) = h0.difference(&c.header) {
            bail!(
                "{} and {} come from different runs: {d}",
                p0.display(),
                p.display()
            );
        }
        let s = c.header.shard;
        if s.n != n {
            bail!(
                "{} is shard {s} but {} is shard {}: they split the run differently",
                p.display(),
                p0.display(),
                h0.shard
            );
        }
        if let Some(other) = by_shard[s.k - 1] {
            bail!("{} and {} are both shard {s}", other.display(), p.display());
        }
        by_shard[s.k - 1] = Some(p);
    }
    let missing: Vec<String> = (1..=n)
        .filter(|k| by_shard[k - 1].is_none())
        .map(|k| format!("{k}/{n}"))
        .collect();
    if !missing.is_empty() {
        bail!(
            "shard{} {} missing: give all {n} partial files",
            if missing.len() > 1 { "s" } else { "" },
            missing.join(", ")
        );
    }
    let sections = match h0.kind {
        RunKind::Eval => 1,
        RunKind::Compare => h0.run.models.len().saturating_sub(1),
    };
    let windows = h0.run.windows;
    let mut results: Vec<Vec<Option<Vec<T>>>> = vec![vec![None; windows]; sections];
    // In shard order, so the report names the placements alike however the files are listed.
    files.sort_by_key(|(_, c)| c.header.shard.k);
    let placements = files
        .iter()
        .flat_map(|(_, c)| c.placements.iter().cloned())
        .collect();
    for (p, c) in files {
        let shard = c.header.shard;
        for (m, section) in results.iter_mut().enumerate() {
            let mut absent = shard
                .windows(windows)
                .into_iter()
                .filter(|w| !c.records.contains_key(&(m, *w)));
            if let Some(w) = absent.next() {
                bail!(
                    "{} (shard {shard}) is incomplete: window {w} and {} more have no result; \
                     rerun its command to finish it",
                    p.display(),
                    absent.count()
                );
            }
            for w in shard.windows(windows) {
                section[w] = c.records.get(&(m, w)).cloned();
            }
        }
    }
    let results = results
        .into_iter()
        .map(|s| s.into_iter().map(Option::unwrap_or_default).collect())
        .collect();
    Ok(Combined {
        header: h0,
        results,
        placements,
    })
}
