//! Where the evaluation text comes from (`--data`): the bundled WikiText-2 test file, a text,
//! JSONL or parquet file, standard input, or a named data set in the hub cache; read once,
//! with a fingerprint of the bytes read so that resumed runs know it is the same data.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::named::{Assembly, NamedData};
use super::rows::RowFile;
use crate::fnv::Fnv;
use crate::{Error, Result};

/// `--data -`.
pub const STDIN: &str = "-";

/// The field rows are read from when `--field` is not given.
pub const DEFAULT_FIELD: &str = "text";

#[derive(Debug)]
pub enum Source {
    Bundled,
    Stdin,
    File(PathBuf),
    Named(&'static NamedData),
}

impl Source {
    /// What `--data` names: `-`, an existing file, else a named data set.
    pub fn parse(arg: Option<&Path>) -> Result<Self> {
        let Some(arg) = arg else {
            return Ok(Source::Bundled);
        };
        if arg.as_os_str() == STDIN {
            return Ok(Source::Stdin);
        }
        if arg.exists() {
            return Ok(Source::File(arg.to_path_buf()));
        }
        if let Some(named) = arg.to_str().and_then(NamedData::by_name) {
            return Ok(Source::Named(named));
        }
        Err(Error::Dataset {
            path: arg.to_path_buf(),
            why: format!(
                "no such file, nor a named data set ({})",
                super::named::names()
            ),
        })
    }
}

/// The data as read, before a text view or a window rule turns it into tokens.
#[derive(Debug)]
pub enum Body {
    /// One text (a text file, stdin): the text views apply.
    Text(String),
    /// Documents (JSONL lines, parquet rows, a data set's rows), joined with `join` into the
    /// evaluated text (lm-eval scores each on its own).
    Rows {
        rows: Vec<String>,
        join: &'static str,
    },
    /// GPTQ's C4 documents, drawn into windows once the tokenizer and the window length are
    /// known (`gptq_sample::c4_windows`).
    GptqC4(Vec<String>),
}

#[derive(Debug)]
pub struct Data {
    /// How reports name it.
    pub name: String,
    /// Size and hash of the bytes read.
    pub fingerprint: String,
    pub body: Body,
    /// The named data set it is, if any.
    pub named: Option<&'static NamedData>,
}

pub(crate) fn fingerprint(bytes: &[u8]) -> String {
    format!("{} bytes, fnv {}", bytes.len(), Fnv::of(bytes).hex())
}

fn utf8(path: &Path, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| Error::Dataset {
        path: path.to_path_buf(),
        why: format!(
            "is not valid UTF-8 (first bad byte at offset {})",
            e.utf8_error().valid_up_to()
        ),
    })
}

/// The most `--data` read from a stream (stdin, a device, a pipe) may hold: a gigabyte of text
/// is some 250M tokens, far past any evaluation; `/dev/zero` would otherwise be read until
/// memory runs out.
const MAX_STREAM_BYTES: u64 = 1 << 30;

/// `reader` whole, or an error naming `path` past `MAX_STREAM_BYTES`.
fn read_stream(path: &Path, reader: impl Read) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader
        .take(MAX_STREAM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > MAX_STREAM_BYTES {
        return Err(Error::InvalidArgument(format!(
            "{}: more than {} read from a stream (not a regular file): not evaluated; write the data to a file",
            path.display(),
            crate::units::human_bytes(MAX_STREAM_BYTES)
        )));
    }
    Ok(bytes)
}

/// A regular file whole (its size is the user's choice), anything else as a stream.
fn read_file(path: &Path) -> Result<Vec<u8>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if meta.is_file() {
        return std::fs::read(path).map_err(|e| Error::io(path, e));
    }
    read_stream(
        path,
        std::fs::File::open(path).map_err(|e| Error::io(path, e))?,
    )
}

/// Reads `source`; rows come from `field` (default `text`; a named data set knows its own).
pub fn load(source: &Source, field: Option<&str>) -> Result<Data> {
    let rows_field = field.unwrap_or(DEFAULT_FIELD);
    // Each arm hashes the bytes it read, then hands them to the body without a copy.
    let (name, fingerprint, body) = match source {
        Source::Bundled => {
            let path = crate::assets::wikitext_path()?;
            let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
            let fp = fingerprint(&bytes);
            let text = utf8(&path, bytes)?;
            (
                crate::assets::WIKITEXT_NAME.to_string(),
                fp,
                Body::Text(text),
            )
        }
        Source::Stdin => {
            let path = Path::new("stdin");
            let bytes = read_stream(path, std::io::stdin())?;
            let fp = fingerprint(&bytes);
            let body = match field {
                Some(f) => Body::Rows {
                    rows: RowFile::Jsonl.read(path, &bytes, f)?,
                    join: "\n\n",
                },
                None => Body::Text(utf8(path, bytes)?),
            };
            ("stdin".to_string(), fp, body)
        }
        Source::File(path) => {
            let bytes = read_file(path)?;
            let fp = fingerprint(&bytes);
            let body = match RowFile::of(path) {
                Some(format) => Body::Rows {
                    rows: format.read(path, &bytes, rows_field)?,
                    join: "\n\n",
                },
                None if field.is_some() => {
                    return Err(Error::InvalidArgument(format!(
                        "--field applies to JSONL (.jsonl, .jsonl.gz) and parquet data; {} is \
                         read as text",
                        path.display()
                    )));
                }
                None => Body::Text(utf8(path, bytes)?),
            };
            (path.display().to_string(), fp, body)
        }
        Source::Named(named) => {
            if field.is_some() {
                return Err(Error::InvalidArgument(format!(
                    "--field does not apply to the named data set {}: it reads `{}`",
                    named.name, named.field
                )));
            }
            let (origin, files) = named.hub.locate(named.name)?;
            let (mut rows, bytes) = named.read(&files)?;
            let body = match named.assembly {
                Assembly::Joined { join } => Body::Rows { rows, join },
                Assembly::Prefix { docs, join } => {
                    rows.truncate(docs);
                    Body::Rows { rows, join }
                }
                Assembly::GptqC4Sample => Body::GptqC4(rows),
            };
            (
                format!("{} ({origin})", named.name),
                fingerprint(&bytes),
                body,
            )
        }
    };
    let empty = match &body {
        Body::Text(t) => t.trim().is_empty(),
        Body::Rows { rows, .. } | Body::GptqC4(rows) => rows.iter().all(|r| r.trim().is_empty()),
    };
    if empty {
        return Err(Error::Dataset {
            path: PathBuf::from(&name),
            why: "is empty".into(),
        });
    }
    Ok(Data {
        name,
        fingerprint,
        body,
        named: match source {
            Source::Named(n) => Some(n),
            _ => None,
        },
    })
}
