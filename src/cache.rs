//! quantppl's own caches on disk (unpacked assets, compiled kernels, tokenized texts): where
//! they live and how an entry is written. A cache only saves time: failing to write one is
//! never an error, and a reader checks what it reads.

use std::path::{Path, PathBuf};

/// `$XDG_CACHE_HOME/quantppl`, else `~/.cache/quantppl`, else the temp directory.
pub fn dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("quantppl");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h).join(".cache").join("quantppl");
    }
    std::env::temp_dir().join("quantppl")
}

/// Writes `bytes` to `path` through a temporary file and a rename, so that a concurrent
/// reader never sees half an entry; errors are dropped.
pub fn store(path: &Path, bytes: &[u8]) {
    let Some(parent) = path.parent() else { return };
    if std::fs::create_dir_all(parent).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}
