//! Named data sets, read from the local Hugging Face hub cache as `datasets` or
//! `huggingface-cli download` left them there (never downloaded): the evaluation splits the
//! GPTQ papers and the perplexity tables use, each with the rows and joins its reference code
//! applies (`docs/data-sets.md`).

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use regex::Regex;

use super::rows::RowFile;
use crate::hub::{self, Repo};
use crate::{Error, Result};

/// How a data set's rows become the evaluated tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assembly {
    /// The rows joined with `join` into one text (`"\n\n".join(rows)`).
    Joined { join: &'static str },
    /// The first `docs` rows joined with `join` (GPTQ's `c4-new`: `' '.join(valdata[:1100])`).
    Prefix { docs: usize, join: &'static str },
    /// GPTQ's `get_c4` windows: documents drawn with Python's `random.seed(0)`
    /// (`gptq_sample::c4_windows`).
    GptqC4Sample,
}

/// A data set quantppl finds by name.
#[derive(Debug)]
pub struct NamedData {
    pub name: &'static str,
    pub hub: HubFiles,
    pub field: &'static str,
    pub assembly: Assembly,
    /// Windows the reference evaluates (GPTQ's 256 C4 samples), when it fixes a number.
    pub windows: Option<usize>,
}

/// Where a data set's files lie in the hub cache.
#[derive(Debug)]
pub struct HubFiles {
    /// Hub data set repositories that hold it (current id first, old canonical id after).
    pub repos: &'static [&'static str],
    /// Its files' paths inside a snapshot.
    pub files: &'static str,
    /// The `huggingface-cli` arguments that put it in the cache.
    pub download: &'static str,
}

pub const NAMED: &[NamedData] = &[
    NamedData {
        name: "wikitext-2-raw-v1",
        hub: HubFiles {
            repos: &["Salesforce/wikitext", "wikitext"],
            files: r"^wikitext-2-raw-v1/test-\d+-of-\d+\.parquet$",
            download: "Salesforce/wikitext --repo-type dataset --include 'wikitext-2-raw-v1/test-*'",
        },
        field: "text",
        assembly: Assembly::Joined { join: "\n\n" },
        windows: None,
    },
    NamedData {
        name: "wikitext-103-raw-v1",
        hub: HubFiles {
            repos: &["Salesforce/wikitext", "wikitext"],
            files: r"^wikitext-103-raw-v1/test-\d+-of-\d+\.parquet$",
            download: "Salesforce/wikitext --repo-type dataset --include 'wikitext-103-raw-v1/test-*'",
        },
        field: "text",
        assembly: Assembly::Joined { join: "\n\n" },
        windows: None,
    },
    NamedData {
        name: "ptb",
        hub: HubFiles {
            repos: &["ptb-text-only/ptb_text_only", "ptb_text_only"],
            files: r"^penn_treebank/validation/\d+\.parquet$",
            download: "ptb-text-only/ptb_text_only --repo-type dataset --revision refs/convert/parquet \
                   --include 'penn_treebank/validation/*'",
        },
        field: "sentence",
        assembly: Assembly::Joined { join: "\n\n" },
        windows: None,
    },
    NamedData {
        name: "ptb-new",
        hub: HubFiles {
            repos: &["ptb-text-only/ptb_text_only", "ptb_text_only"],
            files: r"^penn_treebank/test/\d+\.parquet$",
            download: "ptb-text-only/ptb_text_only --repo-type dataset --revision refs/convert/parquet \
                   --include 'penn_treebank/test/*'",
        },
        field: "sentence",
        assembly: Assembly::Joined { join: " " },
        windows: None,
    },
    NamedData {
        name: "c4",
        hub: HubFiles {
            repos: &["allenai/c4"],
            files: r"^en/c4-validation\.00000-of-00008\.json\.gz$",
            download: "allenai/c4 --repo-type dataset --include 'en/c4-validation.00000-of-00008.json.gz'",
        },
        field: "text",
        assembly: Assembly::GptqC4Sample,
        windows: Some(256),
    },
    NamedData {
        name: "c4-new",
        hub: HubFiles {
            repos: &["allenai/c4"],
            files: r"^en/c4-validation\.00000-of-00008\.json\.gz$",
            download: "allenai/c4 --repo-type dataset --include 'en/c4-validation.00000-of-00008.json.gz'",
        },
        field: "text",
        assembly: Assembly::Prefix {
            docs: 1100,
            join: " ",
        },
        windows: Some(256),
    },
];

/// The names, for help and errors.
pub fn names() -> String {
    NAMED.iter().map(|d| d.name).collect::<Vec<_>>().join(", ")
}

impl NamedData {
    pub fn by_name(name: &str) -> Option<&'static NamedData> {
        NAMED.iter().find(|d| d.name == name)
    }

    /// Its rows, read from `files`, with the bytes read (for the run's fingerprint).
    pub fn read(&self, files: &[PathBuf]) -> Result<(Vec<String>, Vec<u8>)> {
        let mut rows = Vec::new();
        let mut all = Vec::new();
        for path in files {
            let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
            let format = RowFile::of(path).expect("named files are row files");
            rows.extend(format.read(path, &bytes, self.field)?);
            all.extend_from_slice(&bytes);
        }
        Ok((rows, all))
    }
}

impl HubFiles {
    /// Its files in the hub cache (in name order) and the repository they were found in, or
    /// one error naming the folders looked in and the command that fetches them.
    pub fn locate(&self, name: &str) -> Result<(String, Vec<PathBuf>)> {
        let cache = hub::cache_dir();
        let pattern = Regex::new(self.files).expect("constant pattern");
        for id in self.repos {
            for snapshot in Repo::dataset(id).snapshots(&cache) {
                let mut files = Vec::new();
                collect_files(&snapshot, &snapshot, &pattern, &mut files);
                if files.is_empty() {
                    continue;
                }
                files.sort();
                check_complete(&files)?;
                let hash = snapshot.file_name().map_or_else(String::new, |h| {
                    h.to_string_lossy().chars().take(12).collect()
                });
                return Ok((format!("{id}@{hash}"), files));
            }
        }
        let looked: Vec<String> = self
            .repos
            .iter()
            .map(|id| Repo::dataset(id).folder(&cache).display().to_string())
            .collect();
        Err(Error::Dataset {
            path: PathBuf::from(name),
            why: format!(
                "not in the Hugging Face cache (looked for files matching {} in {}); quantppl \
                 never downloads: `huggingface-cli download {}` fetches it",
                self.files,
                looked.join(", "),
                self.download
            ),
        })
    }
}

/// Files under `dir` (following the cache's symlinks) whose path relative to `root` matches.
fn collect_files(root: &Path, dir: &Path, pattern: &Regex, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_files(root, &path, pattern, out);
        } else if let Some(rel) = path.strip_prefix(root).ok().and_then(|r| r.to_str())
            && pattern.is_match(&rel.replace('\\', "/"))
        {
            out.push(path);
        }
    }
}

/// Shards named `*-NNNNN-of-MMMMM.*` must all be there: a partial download would change the
/// text silently.
fn check_complete(files: &[PathBuf]) -> Result<()> {
    static SHARD: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"-\d+-of-(\d+)\.").expect("constant pattern"));
    for path in files {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(total) = SHARD
            .captures(name)
            .and_then(|c| c[1].parse::<usize>().ok())
        {
            let same_set = files.iter().filter(|f| f.parent() == path.parent()).count();
            if same_set != total {
                return Err(Error::Dataset {
                    path: path.clone(),
                    why: format!("is one of {total} shards, but {same_set} are in the cache"),
                });
            }
        }
    }
    Ok(())
}
