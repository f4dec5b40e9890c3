//! The library's error type: every variant names the file, tensor or value that is wrong.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cause is part of the message and deliberately not a `source`, so that printing the
    /// chain (`{:#}`) does not say it twice.
    #[error("{}: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// A file that exists but cannot be read as what it should be (JSON, safetensors, JSONL).
    #[error("{}: {message}", file.display())]
    Format { file: PathBuf, message: String },
    #[error("{}: tensor `{name}` not found{stored_as}", dir.display())]
    MissingTensor {
        dir: PathBuf,
        name: String,
        /// ` (stored as `...`)` where the checkpoint's own layout names it otherwise.
        stored_as: String,
    },
    #[error("tensor `{tensor}`: expected shape {expected:?}, found {found:?}")]
    ShapeMismatch {
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor `{tensor}`: expected dtype {expected}, found {found}")]
    DtypeMismatch {
        tensor: String,
        expected: String,
        found: String,
    },
    /// Something quantppl cannot compute exactly, so it refuses rather than guess.
    #[error("{what}: unsupported {field}: {why}")]
    Unsupported {
        what: String,
        field: String,
        why: String,
    },
    #[error(
        "context length {ctx} is longer than the model allows (max_position_embeddings = {max})"
    )]
    ContextTooLong { ctx: usize, max: usize },
    #[error("{0}")]
    InvalidArgument(String),
    /// Ctrl-C stopped a run (`run::interrupt`): what its run file kept.
    #[error("interrupted by Ctrl-C: {0}")]
    Interrupted(String),
    #[error("dataset {}: {why}", path.display())]
    Dataset { path: PathBuf, why: String },
    #[error("tokenizer {}: {message}", path.display())]
    Tokenizer { path: PathBuf, message: String },
    /// A NaN or an infinity stored in a weight, scale, bias or norm.
    #[error("tensor `{tensor}`: {value} at element {index}: the checkpoint is damaged")]
    NonFiniteWeight {
        tensor: String,
        index: usize,
        value: String,
    },
    #[error("non-finite {what} in window {window} at position {position}")]
    NonFinite {
        what: &'static str,
        window: usize,
        position: usize,
    },
    #[error("{backend}: out of memory allocating {what} ({bytes} bytes)")]
    OutOfMemory {
        backend: &'static str,
        what: String,
        bytes: u64,
    },
    #[error("{backend}: {message}")]
    Backend {
        backend: &'static str,
        message: String,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            cause: source,
        }
    }

    pub fn format(file: impl Into<PathBuf>, message: impl std::fmt::Display) -> Self {
        Error::Format {
            file: file.into(),
            message: message.to_string(),
        }
    }

    pub fn unsupported(
        what: impl Into<String>,
        field: impl Into<String>,
        why: impl Into<String>,
    ) -> Self {
        Error::Unsupported {
            what: what.into(),
            field: field.into(),
            why: why.into(),
        }
    }

    pub fn backend(backend: &'static str, message: impl std::fmt::Display) -> Self {
        Error::Backend {
            backend,
            message: message.to_string(),
        }
    }
}
