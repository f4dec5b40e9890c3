//! Where a `--model` or `--tokenizer` argument points: a directory or file, or
//! `org/name[@revision]` in the local Hugging Face hub cache (`crate::hub`).

use std::path::{Path, PathBuf};

use crate::hub::{self, Repo};
use crate::{Error, Result};

fn not_found(arg: &Path, why: &str) -> Error {
    Error::io(
        arg,
        std::io::Error::new(std::io::ErrorKind::NotFound, why.to_string()),
    )
}

/// The snapshot directory of the hub repository id `arg`, or `None` when `arg` is no id;
/// an error naming the cache folder looked in when the id is not in the cache.
fn hub_snapshot(arg: &Path, what: &str) -> Result<Option<PathBuf>> {
    let Some((id, revision)) = arg.to_str().and_then(hub::repo_id) else {
        return Ok(None);
    };
    let cache = hub::cache_dir();
    let snapshot = Repo::model(id).snapshot(&cache, revision);
    if snapshot.is_dir() {
        return Ok(Some(snapshot));
    }
    Err(not_found(
        arg,
        &format!(
            "{what} not found, nor revision `{revision}` of `{id}` in the Hugging Face cache {} \
             (looked for {}); quantppl never downloads: `huggingface-cli download {id}` fetches it",
            cache.display(),
            snapshot.display()
        ),
    ))
}

/// The model directory `arg` names: itself when it is a directory (or a GGUF file), else the
/// snapshot of a hub repository id in the local cache; one error naming what was looked for
/// otherwise.
pub fn model_dir(arg: &Path) -> Result<PathBuf> {
    if arg.is_dir() {
        return Ok(arg.to_path_buf());
    }
    if arg
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        && arg.is_file()
    {
        return Ok(arg.to_path_buf());
    }
    if arg.exists() {
        return Err(not_found(
            arg,
            "is a file; --model takes the model's directory (config.json, *.safetensors) or a .gguf file",
        ));
    }
    hub_snapshot(arg, "model directory")?.ok_or_else(|| not_found(arg, "model directory not found"))
}

/// The `tokenizer.json` `arg` names: the file itself, the one in a directory, or the one in the
/// snapshot of a hub repository id.
pub fn tokenizer_file(arg: &Path) -> Result<PathBuf> {
    if arg.is_file() {
        return Ok(arg.to_path_buf());
    }
    if arg.is_dir() {
        return Ok(arg.join("tokenizer.json"));
    }
    Ok(hub_snapshot(arg, "tokenizer")?
        .ok_or_else(|| not_found(arg, "tokenizer file not found"))?
        .join("tokenizer.json"))
}
