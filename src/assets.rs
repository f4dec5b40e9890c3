//! The bundled default model and text, compiled into the binary and unpacked once into the
//! user's cache directory, so that `quantppl eval` with no arguments works anywhere.

use std::path::PathBuf;

use crate::{Error, Result};

macro_rules! model_files {
    ($dir:literal) => {
        &[
            (
                "config.json",
                include_bytes!(concat!("../assets/", $dir, "/config.json")),
            ),
            (
                "model.safetensors",
                include_bytes!(concat!("../assets/", $dir, "/model.safetensors")),
            ),
            (
                "tokenizer.json",
                include_bytes!(concat!("../assets/", $dir, "/tokenizer.json")),
            ),
            (
                "tokenizer_config.json",
                include_bytes!(concat!("../assets/", $dir, "/tokenizer_config.json")),
            ),
            (
                "special_tokens_map.json",
                include_bytes!(concat!("../assets/", $dir, "/special_tokens_map.json")),
            ),
            (
                "generation_config.json",
                include_bytes!(concat!("../assets/", $dir, "/generation_config.json")),
            ),
            (
                "reference.json",
                include_bytes!(concat!("../assets/", $dir, "/reference.json")),
            ),
        ]
    };
}

type Files = &'static [(&'static str, &'static [u8])];

const DEFAULT_MODEL: (&str, Files) = (
    "stories260K-w4a16-channel",
    model_files!("stories260K-w4a16-channel"),
);
const DENSE_MODEL: (&str, Files) = ("stories260K", model_files!("stories260K"));
const WIKITEXT: (&str, Files) = (
    "wikitext-2-raw",
    &[(
        "wiki.test.raw",
        include_bytes!("../assets/wikitext-2-raw/wiki.test.raw"),
    )],
);

/// Name shown in reports for the bundled default model.
pub const DEFAULT_MODEL_NAME: &str = "stories260K-w4a16-channel (bundled)";
/// Name shown in reports for the bundled dense base of the default model.
pub const DENSE_MODEL_NAME: &str = "stories260K (bundled)";
pub const WIKITEXT_NAME: &str = "wikitext-2-raw wiki.test.raw (bundled)";

fn unpack((name, files): (&str, Files)) -> Result<PathBuf> {
    let dir = crate::cache::dir()
        .join(concat!("assets-", env!("CARGO_PKG_VERSION")))
        .join(name);
    for (file, bytes) in files {
        let path = dir.join(file);
        // The whole content, not its size: a cached copy changed in place (same length) must
        // not be evaluated under the bundled name.
        if std::fs::read(&path).is_ok_and(|cached| cached == *bytes) {
            continue;
        }
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        // Write then rename, so a concurrent or interrupted run never sees half a file; the
        // temporary name is unique per call, so threads of one process do not share it.
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".{file}.{}.{call}", std::process::id()));
        std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    }
    Ok(dir)
}

/// The word that names the bundled model wherever a model directory or a tokenizer file is
/// asked for (`--model bundled`, `inspect bundled`, `--tokenizer bundled`; `compare --base
/// bundled` is its dense base).
pub const BUNDLED: &str = "bundled";

/// `path`, or the bundled default model's directory where it is absent or `bundled`, with
/// the name reports give it.
pub fn model_dir_or_bundled(path: Option<&std::path::Path>) -> Result<(PathBuf, String)> {
    match path {
        Some(p) if p.as_os_str() != BUNDLED => Ok((p.to_path_buf(), p.display().to_string())),
        _ => Ok((default_model_dir()?, DEFAULT_MODEL_NAME.to_string())),
    }
}

/// Directory of the bundled default model (INT4 stories260K).
pub fn default_model_dir() -> Result<PathBuf> {
    unpack(DEFAULT_MODEL)
}

/// Directory of the bundled default model's dense base.
pub fn dense_model_dir() -> Result<PathBuf> {
    unpack(DENSE_MODEL)
}

/// The bundled model's tokenizer files (`tokenizer.json` and the two beside it that name its
/// special tokens): 512 tokens, whose IDs lie in every `synth` shape's vocabulary.
pub fn tokenizer_files() -> impl Iterator<Item = (&'static str, &'static [u8])> {
    DENSE_MODEL
        .1
        .iter()
        .copied()
        .filter(|(name, _)| name.starts_with("tokenizer") || name.starts_with("special_tokens"))
}

/// The bundled WikiText-2 raw test file.
pub fn wikitext_path() -> Result<PathBuf> {
    Ok(unpack(WIKITEXT)?.join("wiki.test.raw"))
}
