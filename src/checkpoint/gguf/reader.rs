//! The GGUF container (llama.cpp's `gguf.h`, versions 2 and 3, little-endian): a header, typed
//! key-value metadata, a table of tensors, and their data after a padding to
//! `general.alignment`. Read from the mapped bytes with every count and offset checked
//! against the file's length before anything is allocated by it.

use std::collections::BTreeMap;
use std::path::Path;

use super::blocks::GgmlType;
use crate::{Error, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    /// A non-negative integer, from any integer type.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::UInt(v) => Some(v),
            Value::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Float(v) => Some(v),
            Value::UInt(v) => Some(v as f64),
            Value::Int(v) => Some(v as f64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value as JSON (for messages and for configs built from it).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Int(v) => (*v).into(),
            Value::UInt(v) => (*v).into(),
            Value::Float(v) => {
                serde_json::Number::from_f64(*v).map_or(serde_json::Value::Null, Into::into)
            }
            Value::Bool(v) => (*v).into(),
            Value::Str(s) => s.clone().into(),
            Value::Array(a) => a.iter().map(Value::to_json).collect(),
        }
    }
}

/// One entry of the tensor table.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// ggml's order: `dims[0]` is the innermost (a row's length).
    pub dims: Vec<usize>,
    pub ty: GgmlType,
    /// Byte range in the file.
    pub start: usize,
    pub end: usize,
}

impl TensorInfo {
    /// The shape in row-major order (`[rows, row length]` for a matrix), as safetensors and
    /// transformers write it.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A parsed GGUF file: its metadata and tensor table.
pub struct GgufFile {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
}

struct Cursor<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn fail(&self, what: impl std::fmt::Display) -> Error {
        Error::format(
            self.path,
            format!("not a valid GGUF file: {what} (at byte {})", self.at),
        )
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                self.fail(format!(
                    "{what} of {n} bytes runs past the end of the file ({} bytes)",
                    self.bytes.len()
                ))
            })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().unwrap_or_default(),
        ))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().unwrap_or_default(),
        ))
    }

    /// A count of items of at least `min_bytes` each, bounded by what the file still holds.
    fn count(&mut self, what: &str, min_bytes: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let left = (self.bytes.len() - self.at) / min_bytes.max(1);
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= left)
            .ok_or_else(|| self.fail(format!("{what} {n} is more than the file can hold")))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(what, 1)?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.fail(format!("{what} is not UTF-8")))
    }

    /// A key or tensor name, which messages quote: control characters (a newline would split
    /// an error line) are refused.
    fn name(&mut self, what: &str) -> Result<String> {
        let s = self.string(what)?;
        if s.chars().any(char::is_control) {
            return Err(self.fail(format!("{what} {s:?} holds control characters")));
        }
        Ok(s)
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Value> {
        let mut int = |n: usize, signed: bool| -> Result<Value> {
            let b = self.take(n, key)?;
            let mut raw = [0u8; 8];
            raw[..n].copy_from_slice(b);
            let u = u64::from_le_bytes(raw);
            Ok(if signed {
                let shift = 64 - 8 * n as u32;
                Value::Int(((u << shift) as i64) >> shift)
            } else {
                Value::UInt(u)
            })
        };
        Ok(match ty {
            0 => int(1, false)?,
            1 => int(1, true)?,
            2 => int(2, false)?,
            3 => int(2, true)?,
            4 => int(4, false)?,
            5 => int(4, true)?,
            6 => Value::Float(
                f32::from_le_bytes(self.take(4, key)?.try_into().unwrap_or_default()) as f64,
            ),
            7 => match self.take(1, key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.fail(format!("`{key}`: boolean byte {b}"))),
            },
            8 => Value::Str(self.string(key)?),
            9 if depth == 0 => {
                let elem = self.u32(key)?;
                let n = self.count(key, 1)?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => int(8, false)?,
            11 => int(8, true)?,
            12 => Value::Float(f64::from_le_bytes(
                self.take(8, key)?.try_into().unwrap_or_default(),
            )),
            9 => return Err(self.fail(format!("`{key}`: an array of arrays"))),
            t => return Err(self.fail(format!("`{key}`: value type {t}"))),
        })
    }
}

impl GgufFile {
    /// Parses the header and tables of `bytes`, the whole file at `path`.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self> {
        let mut c = Cursor { path, bytes, at: 0 };
        if c.take(4, "magic")? != MAGIC {
            return Err(c.fail("no `GGUF` magic"));
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(Error::unsupported(
                path.display().to_string(),
                "GGUF version",
                format!("{version} (versions 2 and 3 are read)"),
            ));
        }
        // A tensor entry takes at least 8 + 4 + 8 + 4 + 8 bytes, a key-value 8 + 4 + 1.
        let n_tensors = c.count("tensor count", 32)?;
        let n_kv = c.count("metadata count", 13)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.name("metadata key")?;
            let ty = c.u32(&key)?;
            let value = c.value(ty, &key, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(c.fail(format!("metadata key `{key}` appears twice")));
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => v
                .as_u64()
                .filter(|a| a.is_power_of_two())
                .ok_or_else(|| c.fail(format!("general.alignment {v:?} is not a power of two")))?,
        };
        let mut infos = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = c.name("tensor name")?;
            let n_dims = c.u32(&name)? as usize;
            if !(1..=4).contains(&n_dims) {
                return Err(c.fail(format!("tensor `{name}` has {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                let d = c.u64(&name)?;
                dims.push(
                    usize::try_from(d)
                        .ok()
                        .filter(|&d| d > 0)
                        .ok_or_else(|| c.fail(format!("tensor `{name}` has dimension {d}")))?,
                );
            }
            let ty_id = c.u32(&name)?;
            let ty = GgmlType::from_id(ty_id).ok_or_else(|| {
                Error::unsupported(
                    format!("{}: tensor `{name}`", path.display()),
                    "ggml type",
                    format!("{ty_id} (not a type quantppl reads)"),
                )
            })?;
            let offset = c.u64(&name)?;
            if offset % alignment != 0 {
                return Err(c.fail(format!(
                    "tensor `{name}` at offset {offset}, not a multiple of the alignment {alignment}"
                )));
            }
            infos.push((name, dims, ty, offset));
        }
        let data_start = (c.at as u64).div_ceil(alignment) * alignment;
        let mut tensors = Vec::with_capacity(infos.len());
        let mut names = std::collections::HashSet::new();
        for (name, dims, ty, offset) in infos {
            let bytes_len = ty.bytes_of(&dims).ok_or_else(|| {
                c.fail(format!(
                    "tensor `{name}` of {ty} with rows of {} values, not whole blocks of {}",
                    dims[0],
                    ty.block_values()
                ))
            })?;
            let start = data_start.checked_add(offset);
            let end = start.and_then(|s| s.checked_add(bytes_len as u64));
            let (Some(start), Some(end)) = (start, end.filter(|&e| e <= bytes.len() as u64)) else {
                return Err(c.fail(format!(
                    "tensor `{name}` ({bytes_len} bytes at offset {offset}) runs past the end of the file"
                )));
            };
            if !names.insert(name.clone()) {
                return Err(c.fail(format!("tensor `{name}` appears twice")));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                start: start as usize,
                end: end as usize,
            });
        }
        Ok(GgufFile {
            version,
            metadata,
            tensors,
        })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }
}
