//! A streaming safetensors writer for sharded checkpoints.
//!
//! The `safetensors` crate serializes from tensors held in memory; a 123B checkpoint does not
//! fit. Every tensor's dtype and shape is known before any value is generated, so each shard's
//! header (and hence every tensor's file offset) is computed first, the file is sized, and
//! each tensor is then written at its offset as soon as it exists.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The safetensors dtypes a synthetic checkpoint uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DType {
    BF16,
    F16,
    F32,
    I32,
    I64,
    U8,
    I8,
    F8E4M3,
}

impl DType {
    pub(crate) fn name(self) -> &'static str {
        match self {
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::F32 => "F32",
            DType::I32 => "I32",
            DType::I64 => "I64",
            DType::U8 => "U8",
            DType::I8 => "I8",
            DType::F8E4M3 => "F8_E4M3",
        }
    }

    pub(crate) fn size(self) -> u64 {
        match self {
            DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::U8 | DType::I8 | DType::F8E4M3 => 1,
        }
    }
}

/// One tensor as it will appear in a safetensors header.
#[derive(Clone, Debug)]
pub(crate) struct TensorSpec {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    pub(crate) fn new(name: impl Into<String>, dtype: DType, shape: &[usize]) -> Self {
        TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    pub(crate) fn nbytes(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64 * self.dtype.size()
    }
}

/// Where a tensor goes: its shard, absolute file offset and length.
struct Slot {
    shard: usize,
    offset: u64,
    len: u64,
    written: bool,
}

struct Shard {
    path: PathBuf,
    /// The 8-byte length prefix and the padded JSON header.
    header: Vec<u8>,
    file_len: u64,
    tensors: usize,
}

/// Writes a checkpoint whose tensor list is fixed up front, tensor by tensor, in any order
/// within the current shard; shards are opened one after another.
pub(crate) struct CheckpointWriter {
    shards: Vec<Shard>,
    slots: HashMap<String, Slot>,
    /// tensor name -> shard file name, for `model.safetensors.index.json`.
    weight_map: BTreeMap<String, String>,
    total_size: u64,
    current: Option<(usize, File, usize)>,
    bytes_done: u64,
}

impl CheckpointWriter {
    /// Plans the shards: `groups` are tensors that must share a shard (one generation unit),
    /// in file order; a new shard starts when the next group would push the current one past
    /// `max_shard_bytes` (transformers' `max_shard_size` rule). A single shard is named
    /// `model.safetensors`, several `model-0000i-of-0000n.safetensors`, as transformers does.
    pub(crate) fn plan(
        dir: &Path,
        groups: &[Vec<TensorSpec>],
        max_shard_bytes: u64,
    ) -> Result<Self> {
        let mut shard_groups: Vec<Vec<&TensorSpec>> = vec![Vec::new()];
        let mut size = 0u64;
        for group in groups {
            let bytes: u64 = group.iter().map(TensorSpec::nbytes).sum();
            let open = shard_groups.last_mut().expect("starts with one shard");
            if !open.is_empty() && size + bytes > max_shard_bytes {
                shard_groups.push(Vec::new());
                size = 0;
            }
            size += bytes;
            shard_groups.last_mut().expect("non-empty").extend(group);
        }
        let n = shard_groups.len();
        let mut shards = Vec::with_capacity(n);
        let mut slots = HashMap::new();
        let mut weight_map = BTreeMap::new();
        let mut total_size = 0;
        for (i, mut tensors) in shard_groups.into_iter().enumerate() {
            let file_name = if n == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
            };
            // Largest alignment first, then by name, like the safetensors crate: with the
            // header padded to 8 bytes every tensor then starts aligned to its element size.
            tensors.sort_by(|a, b| {
                b.dtype
                    .size()
                    .cmp(&a.dtype.size())
                    .then(a.name.cmp(&b.name))
            });
            let mut json = String::from(r#"{"__metadata__":{"format":"pt"}"#);
            let mut offset = 0u64;
            let mut entries = Vec::with_capacity(tensors.len());
            for t in &tensors {
                let end = offset + t.nbytes();
                let name = serde_json::to_string(&t.name)
                    .map_err(|e| Error::format(dir.join(&file_name), e))?;
                json.push_str(&format!(
                    r#",{name}:{{"dtype":"{}","shape":{:?},"data_offsets":[{offset},{end}]}}"#,
                    t.dtype.name(),
                    t.shape
                ));
                entries.push((t.name.clone(), offset, t.nbytes()));
                offset = end;
            }
            json.push('}');
            while json.len() % 8 != 0 {
                json.push(' ');
            }
            let mut header = (json.len() as u64).to_le_bytes().to_vec();
            header.extend_from_slice(json.as_bytes());
            let data_start = header.len() as u64;
            for (name, off, len) in entries {
                let dup = slots.insert(
                    name.clone(),
                    Slot {
                        shard: i,
                        offset: data_start + off,
                        len,
                        written: false,
                    },
                );
                if dup.is_some() {
                    return Err(Error::InvalidArgument(format!(
                        "tensor `{name}` planned twice"
                    )));
                }
                weight_map.insert(name, file_name.clone());
            }
            total_size += offset;
            shards.push(Shard {
                path: dir.join(&file_name),
                header,
                file_len: data_start + offset,
                tensors: tensors.len(),
            });
        }
        Ok(CheckpointWriter {
            shards,
            slots,
            weight_map,
            total_size,
            current: None,
            bytes_done: 0,
        })
    }

    /// Sum of all tensor bytes (the index's `metadata.total_size`).
    pub(crate) fn total_size(&self) -> u64 {
        self.total_size
    }

    pub(crate) fn bytes_done(&self) -> u64 {
        self.bytes_done
    }

    /// The shard files, written or to be written.
    pub(crate) fn shard_paths(&self) -> Vec<PathBuf> {
        self.shards.iter().map(|s| s.path.clone()).collect()
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Writes tensor `name`'s bytes at its planned offset. The tensor's shard must be the
    /// current one or a later one (an earlier shard has already been checked and closed).
    pub(crate) fn write(&mut self, name: &str, data: &[u8]) -> Result<()> {
        let slot = self
            .slots
            .get_mut(name)
            .ok_or_else(|| Error::InvalidArgument(format!("tensor `{name}` was not planned")))?;
        let shard = &self.shards[slot.shard];
        if slot.written || data.len() as u64 != slot.len {
            return Err(Error::format(
                &shard.path,
                format!(
                    "tensor `{name}`: {} bytes (written before: {}), planned {}",
                    data.len(),
                    slot.written,
                    slot.len
                ),
            ));
        }
        slot.written = true;
        let (shard_idx, offset) = (slot.shard, slot.offset);
        if self.current.as_ref().map(|c| c.0) != Some(shard_idx) {
            self.close_current()?;
            let shard = &self.shards[shard_idx];
            let io = |e| Error::io(&shard.path, e);
            let mut file = File::create(&shard.path).map_err(io)?;
            file.set_len(shard.file_len).map_err(io)?;
            file.write_all(&shard.header).map_err(io)?;
            self.current = Some((shard_idx, file, 0));
        }
        let path = &self.shards[shard_idx].path;
        let (_, file, count) = self.current.as_mut().expect("opened above");
        file.seek(SeekFrom::Start(offset))
            .and_then(|_| file.write_all(data))
            .map_err(|e| Error::io(path, e))?;
        *count += 1;
        self.bytes_done += data.len() as u64;
        Ok(())
    }

    /// Closes the open shard after checking that every one of its tensors was written
    /// (an unwritten one would silently read as zeros).
    fn close_current(&mut self) -> Result<()> {
        if let Some((idx, file, count)) = self.current.take() {
            let shard = &self.shards[idx];
            if count != shard.tensors {
                return Err(Error::format(
                    &shard.path,
                    format!("{count} of {} tensors written", shard.tensors),
                ));
            }
            file.sync_all().map_err(|e| Error::io(&shard.path, e))?;
        }
        Ok(())
    }

    /// Closes the last shard and writes `model.safetensors.index.json` when there are
    /// several shards. Returns the paths of all files written.
    pub(crate) fn finish(mut self, dir: &Path) -> Result<Vec<PathBuf>> {
        self.close_current()?;
        if let Some(name) = self
            .slots
            .iter()
            .find_map(|(n, s)| (!s.written).then_some(n))
        {
            return Err(Error::InvalidArgument(format!(
                "tensor `{name}` was never written"
            )));
        }
        let mut files: Vec<PathBuf> = self.shards.iter().map(|s| s.path.clone()).collect();
        if self.shards.len() > 1 {
            let index = serde_json::json!({
                "metadata": {"total_size": self.total_size},
                "weight_map": self.weight_map,
            });
            let path = dir.join("model.safetensors.index.json");
            super::write_json(&path, &index)?;
            files.push(path);
        }
        Ok(files)
    }
}
