//! The local Hugging Face hub cache, read offline as `huggingface_hub` lays it out:
//! `{models,datasets}--org--name/refs/<revision>` holds a commit hash, `snapshots/<hash>/` the
//! files (symlinks into `blobs/`). quantppl never downloads; models (`checkpoint::locate`),
//! tokenizers and named data sets (`data::named`) are looked up here.

use std::path::{Path, PathBuf};

/// The hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HF_HUB_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("HF_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("hub");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("huggingface").join("hub")
}

/// What a hub repository holds; its cache folder is `<kind>s--org--name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepoKind {
    Model,
    Dataset,
}

/// A repository id, `org/name` (or a bare `name` for the old canonical data sets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repo {
    pub kind: RepoKind,
    pub id: String,
}

impl Repo {
    pub fn model(id: &str) -> Self {
        Repo {
            kind: RepoKind::Model,
            id: id.to_string(),
        }
    }

    pub fn dataset(id: &str) -> Self {
        Repo {
            kind: RepoKind::Dataset,
            id: id.to_string(),
        }
    }

    /// Its folder in the cache `cache`.
    pub fn folder(&self, cache: &Path) -> PathBuf {
        let kind = match self.kind {
            RepoKind::Model => "models",
            RepoKind::Dataset => "datasets",
        };
        cache.join(format!("{kind}--{}", self.id.replace('/', "--")))
    }

    /// The snapshot of `revision` (a ref such as `main`, or a commit hash) in `cache`, whether
    /// or not it exists.
    pub fn snapshot(&self, cache: &Path, revision: &str) -> PathBuf {
        let folder = self.folder(cache);
        match std::fs::read_to_string(folder.join("refs").join(revision)) {
            Ok(hash) => folder.join("snapshots").join(hash.trim()),
            Err(_) => folder.join("snapshots").join(revision),
        }
    }

    /// Every snapshot of this repository in `cache`, the one `main` points to first (a data
    /// set's parquet conversion lives in another revision, `refs/convert/parquet`).
    pub fn snapshots(&self, cache: &Path) -> Vec<PathBuf> {
        let main = self.snapshot(cache, "main");
        let mut all: Vec<PathBuf> = std::fs::read_dir(self.folder(cache).join("snapshots"))
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        all.sort_by_key(|p| (*p != main, p.clone()));
        all
    }
}

/// `org/name[@revision]` when `arg` has that shape (one slash, no path-like start): the id and
/// the revision (`main` when none is given).
pub fn repo_id(arg: &str) -> Option<(&str, &str)> {
    let (id, revision) = arg.split_once('@').unwrap_or((arg, "main"));
    let (org, name) = id.split_once('/')?;
    let word = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    (word(org) && word(name) && word(revision)).then_some((id, revision))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_ids_are_told_from_paths() {
        assert_eq!(
            repo_id("Qwen/Qwen3-8B-AWQ"),
            Some(("Qwen/Qwen3-8B-AWQ", "main"))
        );
        assert_eq!(repo_id("org/name@v1.0"), Some(("org/name", "v1.0")));
        for path in [
            "/abs/dir",
            "./rel/dir",
            "a/b/c",
            "../x/y",
            "name",
            "org/",
            "a b/c",
        ] {
            assert_eq!(repo_id(path), None, "{path}");
        }
    }

    #[test]
    fn cache_folders_follow_huggingface_hub() {
        let cache = Path::new("/c");
        assert_eq!(
            Repo::dataset("Salesforce/wikitext").folder(cache),
            Path::new("/c/datasets--Salesforce--wikitext")
        );
        assert_eq!(
            Repo::model("Qwen/Qwen3-8B").folder(cache),
            Path::new("/c/models--Qwen--Qwen3-8B")
        );
    }
}
