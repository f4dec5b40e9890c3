//! Data held as rows: one document per JSONL line (plain or gzipped) or per parquet row, each
//! the string in a named field. Every bad row is an error naming the file, the row and the
//! field: a wrong field name or type is never silently skipped.

use std::io::Read;
use std::path::Path;

use parquet::basic::{ConvertedType, LogicalType, Type as PhysicalType};
use parquet::column::reader::ColumnReader;
use parquet::data_type::ByteArray;
use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::{Error, Result};

/// How a data file holds its rows, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowFile {
    Jsonl,
    /// JSONL compressed with gzip (`.jsonl.gz`, `.json.gz`: C4's files).
    JsonlGz,
    Parquet,
}

impl RowFile {
    /// The row format `name` says, or `None` for a text file.
    pub fn of(name: &Path) -> Option<Self> {
        let name = name.file_name()?.to_str()?.to_ascii_lowercase();
        if name.ends_with(".jsonl") {
            Some(RowFile::Jsonl)
        } else if name.ends_with(".jsonl.gz") || name.ends_with(".json.gz") {
            Some(RowFile::JsonlGz)
        } else if name.ends_with(".parquet") {
            Some(RowFile::Parquet)
        } else {
            None
        }
    }

    /// The `field` of every row of `path` (whose bytes are `bytes`).
    pub fn read(self, path: &Path, bytes: &[u8], field: &str) -> Result<Vec<String>> {
        match self {
            RowFile::Jsonl => jsonl_field(path, bytes, field),
            RowFile::JsonlGz => {
                // Text compresses a few times to tens of times; a gzip bomb by thousands:
                // refused before it is all in memory.
                let limit = (bytes.len() as u64).saturating_mul(MAX_GZIP_RATIO) + (64 << 20);
                let mut text = Vec::new();
                flate2::read::MultiGzDecoder::new(bytes)
                    .take(limit + 1)
                    .read_to_end(&mut text)
                    .map_err(|e| Error::format(path, format!("not a readable gzip file: {e}")))?;
                if text.len() as u64 > limit {
                    return Err(Error::format(
                        path,
                        format!(
                            "decompresses to more than {} ({MAX_GZIP_RATIO} times its {} plus 64 MiB): not read (a gzip bomb?); decompress it yourself if it is real data",
                            crate::units::human_bytes(limit),
                            crate::units::human_bytes(bytes.len() as u64)
                        ),
                    ));
                }
                jsonl_field(path, &text, field)
            }
            RowFile::Parquet => parquet_field(path, bytes, field),
        }
    }
}

/// Every row of parquet `bytes` (read from `path`) as a JSON object of its columns, nested
/// lists and structs included: the rows of a data set with several fields (the tasks).
pub fn parquet_records(path: &Path, bytes: &[u8]) -> Result<Vec<serde_json::Value>> {
    let bad = |e: parquet::errors::ParquetError| {
        Error::format(path, format!("not a readable parquet file: {e}"))
    };
    let reader = SerializedFileReader::new(bytes::Bytes::copy_from_slice(bytes)).map_err(bad)?;
    reader
        .get_row_iter(None)
        .map_err(bad)?
        .map(|row| row.map(|r| r.to_json_value()).map_err(bad))
        .collect()
}

/// The most a gzip'd JSONL file may expand, beyond 64 MiB: text gzips to ratios of a few to
/// tens; a gzip bomb's is about a thousand.
const MAX_GZIP_RATIO: u64 = 200;

/// The string `field` of every line of JSONL `bytes` read from `path`. Blank lines are skipped
/// (a trailing newline is usual).
pub fn jsonl_field(path: &Path, bytes: &[u8], field: &str) -> Result<Vec<String>> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        Error::format(
            path,
            format!("not UTF-8 (first bad byte at offset {})", e.valid_up_to()),
        )
    })?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| Error::format(path, format!("line {}: not JSON: {e}", i + 1)))?;
        match value.get(field) {
            Some(serde_json::Value::String(s)) => rows.push(s.clone()),
            Some(other) => {
                return Err(Error::format(
                    path,
                    format!(
                        "line {}: field `{field}` is {}, not a string",
                        i + 1,
                        json_kind(other)
                    ),
                ));
            }
            None => {
                return Err(Error::format(
                    path,
                    format!("line {}: no field `{field}` (see --field)", i + 1),
                ));
            }
        }
    }
    Ok(rows)
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// The string column `field` of every row of the parquet file `bytes` (read from `path`), in
/// row order across its row groups.
pub fn parquet_field(path: &Path, bytes: &[u8], field: &str) -> Result<Vec<String>> {
    let bad = |why: String| Error::format(path, why);
    let reader = SerializedFileReader::new(bytes::Bytes::copy_from_slice(bytes))
        .map_err(|e| bad(format!("not a readable parquet file: {e}")))?;
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    let Some(index) = schema
        .columns()
        .iter()
        .position(|c| c.path().string() == field)
    else {
        let names: Vec<String> = schema.columns().iter().map(|c| c.path().string()).collect();
        return Err(bad(format!(
            "no column `{field}` (columns: {}; see --field)",
            names.join(", ")
        )));
    };
    let column = schema.column(index);
    let is_text = matches!(column.logical_type_ref(), Some(LogicalType::String))
        || column.converted_type() == ConvertedType::UTF8;
    if column.physical_type() != PhysicalType::BYTE_ARRAY || !is_text {
        return Err(bad(format!(
            "column `{field}` holds {} values, not strings",
            column.physical_type()
        )));
    }
    if column.max_rep_level() > 0 {
        return Err(bad(format!(
            "column `{field}` is a list, not one string per row"
        )));
    }
    let mut rows = Vec::with_capacity(reader.metadata().file_metadata().num_rows() as usize);
    for group in 0..reader.num_row_groups() {
        let in_group = |e: parquet::errors::ParquetError| {
            bad(format!("row group {group}, column `{field}`: {e}"))
        };
        let row_group = reader.get_row_group(group).map_err(in_group)?;
        let expected = row_group.metadata().num_rows() as usize;
        let ColumnReader::ByteArrayColumnReader(mut column_reader) =
            row_group.get_column_reader(index).map_err(in_group)?
        else {
            return Err(bad(format!("column `{field}` is not a byte-array column")));
        };
        let mut values: Vec<ByteArray> = Vec::new();
        let mut levels: Vec<i16> = Vec::new();
        let first_row = rows.len();
        loop {
            let (records, _, _) = column_reader
                .read_records(usize::MAX, Some(&mut levels), None, &mut values)
                .map_err(in_group)?;
            if records == 0 {
                break;
            }
        }
        // A nullable column has a definition level per row: 0 marks a null.
        if let Some(null) = levels.iter().position(|&l| l < column.max_def_level()) {
            return Err(bad(format!(
                "row {}: column `{field}` is null",
                first_row + null
            )));
        }
        for (i, value) in values.into_iter().enumerate() {
            let text = String::from_utf8(value.data().to_vec())
                .map_err(|_| bad(format!("row {}: `{field}` is not UTF-8", first_row + i)))?;
            rows.push(text);
        }
        if rows.len() - first_row != expected {
            return Err(bad(format!(
                "row group {group}: {} values of `{field}` for {expected} rows",
                rows.len() - first_row
            )));
        }
    }
    Ok(rows)
}
