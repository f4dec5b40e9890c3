//! `--resume`, `--partial` and `--shard`, shared by `eval` and `compare`: what identifies a
//! run (its fingerprint) and which windows are left to do.

use std::path::{Path, PathBuf};

use super::Activations;
use crate::eval::plan::Plan;
use crate::eval::record::{
    self, Header, RecordFile, RecordValue, Records, RunInfo, RunKind, Shard,
};
use crate::eval::setup::{ResolvedSettings, method_name};

#[derive(clap::Args, Clone, Debug)]
pub struct RecordArgs {
    /// Record every finished window in FILE (appended and fsync'ed as the run goes) and, when
    /// FILE exists, continue the run it belongs to: only the missing windows are evaluated
    /// and the report's numbers are identical to an uninterrupted run's. A file written with
    /// other settings or another model is refused. With --shard this is the partial result
    /// file that `quantppl merge` combines (`--partial` is the same option).
    #[arg(long, visible_alias = "partial", value_name = "FILE")]
    pub resume: Option<PathBuf>,
    /// Evaluate only the K-th of N disjoint window sets (windows i with i % N == K-1) and
    /// record them in --partial FILE; `quantppl merge` combines the N files into the report
    /// a single run would give, digit for digit.
    #[arg(long, value_name = "K/N", requires = "resume")]
    pub shard: Option<Shard>,
}

impl RecordArgs {
    pub fn shard(&self) -> Shard {
        self.shard.unwrap_or(Shard::WHOLE)
    }
}

/// One model of the run for its fingerprint: its role in messages and its directory.
pub struct FingerprintModel<'a> {
    pub role: String,
    pub dir: &'a Path,
}

/// The settings that must agree before records can be combined, in the order they are
/// compared (the first difference is the one reported).
pub fn fingerprint(
    models: &[FingerprintModel],
    activations: Activations,
    settings: &ResolvedSettings,
    data_path: &Path,
    tokenizer_path: &Path,
    plan: &Plan,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut f = vec![(
        "quantppl version".to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
    )];
    for m in models {
        f.push((m.role.clone(), record::model_fingerprint(m.dir)?));
    }
    let opt = |v: Option<usize>| v.map_or("none".to_string(), |v| v.to_string());
    f.extend([
        (
            "activations".to_string(),
            match activations {
                Activations::Declared => "declared",
                Activations::WeightOnly => "weight-only",
            }
            .to_string(),
        ),
        ("method".into(), method_name(settings.method).to_string()),
        ("ctx".into(), settings.ctx.to_string()),
        ("stride".into(), opt(settings.stride)),
        ("rows".into(), opt(settings.rows)),
        ("text view".into(), settings.text.clone()),
        ("data file".into(), record::file_fingerprint(data_path)?),
        (
            "tokenizer".into(),
            record::file_fingerprint(tokenizer_path)?,
        ),
        ("windows".into(), record::plan_fingerprint(plan)),
    ]);
    Ok(f)
}

/// The data file a plan was built from (the bundled WikiText-2 when none was given).
pub fn data_path(data: &Option<PathBuf>) -> anyhow::Result<PathBuf> {
    Ok(match data {
        Some(p) => p.clone(),
        None => crate::assets::wikitext_path()?,
    })
}

/// The run's record file (when `--resume` is given) and the windows of `sections` still to do.
pub struct Progress<T> {
    pub file: Option<RecordFile<T>>,
    pub shard: Shard,
    /// How the recorded windows were computed, one entry per stretch of windows: the record
    /// file's placements, then this process's.
    placements: Vec<String>,
    /// The placement this process last noted: each of its stretches of windows starts with a
    /// placement line, whatever an earlier process left last in the file.
    noted: Option<String>,
}

impl<T: RecordValue> Progress<T> {
    pub fn open(
        args: &RecordArgs,
        kind: RunKind,
        fingerprint: Vec<(String, String)>,
        run: RunInfo,
    ) -> anyhow::Result<Self> {
        let shard = args.shard();
        let header = Header {
            kind,
            fingerprint,
            shard,
            run,
        };
        let file = args
            .resume
            .as_deref()
            .map(|p| RecordFile::open(p, &header))
            .transpose()?;
        let placements = file
            .as_ref()
            .map_or_else(Vec::new, |f| f.placements_at_open().to_vec());
        Ok(Progress {
            file,
            shard,
            placements,
            noted: None,
        })
    }

    /// This shard's windows of `section` that have no record yet, in order.
    pub fn todo(&self, section: usize, windows: usize) -> Vec<usize> {
        self.shard
            .windows(windows)
            .into_iter()
            .filter(|&w| self.file.as_ref().is_none_or(|f| !f.is_done(section, w)))
            .collect()
    }

    /// Records one finished window, computed with `placement` (how this process's devices
    /// share the work, as [`placements`](Self::placements) names it); only in memory without
    /// `--resume`.
    pub fn record(
        &mut self,
        placement: &str,
        section: usize,
        window: usize,
        values: &[T],
    ) -> crate::Result<()> {
        if self.noted.as_deref() != Some(placement) {
            if let Some(f) = &mut self.file {
                f.append_placement(placement)?;
            }
            self.placements.push(placement.to_string());
            self.noted = Some(placement.to_string());
        }
        match &mut self.file {
            Some(f) => f.append(section, window, values),
            None => Ok(()),
        }
    }

    /// How the recorded windows were computed: `single`, `data` or `layers 0..3, 3..5` per
    /// stretch of windows, by this process or the earlier ones of a resumed run.
    pub fn placements(&self) -> &[String] {
        &self.placements
    }

    /// The recorded windows (empty without `--resume`).
    pub fn recorded(&self) -> Option<&Records<T>> {
        self.file.as_ref().map(RecordFile::records)
    }
}

/// Every window's result of `section` in window order, from this run's fresh results and
/// the record file; an error if one is missing (it cannot be, after a complete run).
pub fn collect<T: RecordValue>(
    section: usize,
    windows: usize,
    fresh: &mut [Option<Vec<T>>],
    recorded: Option<&Records<T>>,
) -> anyhow::Result<Vec<Vec<T>>> {
    (0..windows)
        .map(|w| {
            fresh
                .get_mut(w)
                .and_then(Option::take)
                .or_else(|| recorded.and_then(|r| r.get(&(section, w)).cloned()))
                .ok_or_else(|| anyhow::anyhow!("window {w} has no result"))
        })
        .collect()
}

/// Tells, on stderr, that a `--shard K/N` run finished its windows and how to combine them.
pub fn report_shard_done(records: &RecordArgs, n_windows: usize) {
    let shard = records.shard();
    let path = records.resume.as_deref().unwrap_or(Path::new("-"));
    eprintln!(
        "shard {shard}: {} windows recorded in {}; combine all {} shards with `quantppl merge`",
        shard.windows(n_windows).len(),
        path.display(),
        shard.n
    );
}
