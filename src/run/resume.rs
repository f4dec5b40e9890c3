//! Resuming and sharding, shared by `eval` and `compare`: what identifies a run (its
//! fingerprint), which windows are left to do, and every window's result in window order.

use std::path::{Path, PathBuf};

use anyhow::bail;

use super::info::RunInfo;
use super::open::Activations;
use super::record::{self, Header, RecordFile, RecordValue, Records, RunKind, Shard};
use crate::plan::{Plan, ResolvedSettings, method_name};

/// Where a run records its finished windows, and which share of the windows it computes.
#[derive(Clone, Debug, Default)]
pub struct RecordOptions {
    /// The record file: resumed when it exists (with a shard, the partial file `merge` reads).
    pub resume: Option<PathBuf>,
    pub shard: Option<Shard>,
}

impl RecordOptions {
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
        ("data file".into(), settings.data_fingerprint.clone()),
        (
            "tokenizer".into(),
            record::file_fingerprint(tokenizer_path)?,
        ),
        ("windows".into(), record::plan_fingerprint(plan)),
    ]);
    Ok(f)
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
        args: &RecordOptions,
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
        if let Some(f) = &mut self.file {
            f.append(section, window, values)?;
        }
        if super::interrupt::requested() {
            return Err(crate::Error::Interrupted(match &self.file {
                Some(f) => format!(
                    "{} finished windows are kept in {}; the same command goes on from there",
                    f.records().len(),
                    f.path().display()
                ),
                None => "nothing was kept (with --resume FILE finished windows outlast an \
                         interruption)"
                    .into(),
            }));
        }
        Ok(())
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
