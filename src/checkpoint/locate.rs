//! Where a `--model` argument points: a model directory, or `org/name[@revision]` in the
//! local Hugging Face hub cache (resolved offline, as `huggingface_hub` lays the cache out:
//! `models--org--name/refs/<revision>` holds a commit hash, `snapshots/<hash>/` the files).
//! quantppl never downloads.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
pub fn hub_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HF_HUB_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("HF_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("hub");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("huggingface").join("hub")
}

/// `org/name[@revision]` when `arg` has that shape (one slash, no path-like start).
fn repo_id(arg: &str) -> Option<(&str, &str, &str)> {
    let (id, revision) = arg.split_once('@').unwrap_or((arg, "main"));
    let (org, name) = id.split_once('/')?;
    let word = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    (word(org) && word(name) && word(revision)).then_some((org, name, revision))
}

/// The model directory `arg` names: itself when it is a directory, else the snapshot of a hub
/// repository id in the local cache; one error naming what was looked for otherwise.
pub fn model_dir(arg: &Path) -> Result<PathBuf> {
    if arg.is_dir() {
        return Ok(arg.to_path_buf());
    }
    let not_found = |why: &str| {
        Error::io(
            arg,
            std::io::Error::new(std::io::ErrorKind::NotFound, why.to_string()),
        )
    };
    if arg.exists() {
        return Err(not_found(
            "is a file; --model takes the model's directory (config.json, *.safetensors)",
        ));
    }
    let Some((org, name, revision)) = arg.to_str().and_then(repo_id) else {
        return Err(not_found("model directory not found"));
    };
    let cache = hub_cache_dir();
    let repo = cache.join(format!("models--{org}--{name}"));
    let snapshot = match std::fs::read_to_string(repo.join("refs").join(revision)) {
        Ok(hash) => repo.join("snapshots").join(hash.trim()),
        // A commit hash given as the revision names its snapshot directly.
        Err(_) => repo.join("snapshots").join(revision),
    };
    if snapshot.is_dir() {
        return Ok(snapshot);
    }
    Err(not_found(&format!(
        "model directory not found, nor revision `{revision}` of `{org}/{name}` in the Hugging Face \
         cache {} (looked for {}); quantppl never downloads: `huggingface-cli download \
         {org}/{name}` fetches it",
        cache.display(),
        snapshot.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_ids_are_told_from_paths() {
        assert_eq!(
            repo_id("Qwen/Qwen3-8B-AWQ"),
            Some(("Qwen", "Qwen3-8B-AWQ", "main"))
        );
        assert_eq!(repo_id("org/name@v1.0"), Some(("org", "name", "v1.0")));
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
}
