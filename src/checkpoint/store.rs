//! Memory-mapped safetensors, single-file or sharded through `model.safetensors.index.json`.
//! Tensors are borrowed from the maps; nothing is copied whole into RAM.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use safetensors::{Dtype, SafeTensors};

use super::gguf::{GgmlType, GgufModel};
use super::mapped::{self, MappedFile};
use crate::{Error, Result};

/// One tensor as it lies on disk: dtype, shape and the raw little-endian bytes.
#[derive(Clone, Copy)]
pub struct TensorRef<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

#[derive(Clone)]
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
    /// A view into a stored tensor (one expert of a fused 3D expert tensor), not counted
    /// in the checkpoint's bytes.
    view: bool,
    /// The stored tensor the bytes belong to (its own index unless a view), in `read`.
    stored: usize,
    /// A GGUF tensor's ggml type where it is quantized (its bytes are ggml blocks, `dtype`
    /// U8); None for plain floats and every safetensors tensor.
    ggml: Option<GgmlType>,
    /// A GGUF tensor's own name (`blk.0.attn_q.weight`), which messages give.
    origin: Option<std::sync::Arc<str>>,
}

/// A file's bytes, mapped; or values decoded at open (GGUF's quantized embedding tables,
/// which the embedding gather reads as floats).
enum Shard {
    Mapped(MappedFile),
    Decoded(Vec<u8>),
}

impl Shard {
    fn bytes(&self) -> &[u8] {
        match self {
            Shard::Mapped(m) => m,
            Shard::Decoded(v) => v,
        }
    }
}

/// A shard's bytes that were never written (holes of a sparse file, read as zeros).
pub struct Holes {
    pub file: PathBuf,
    pub bytes: u64,
    /// The first tensor whose data lies in a hole.
    pub first_tensor: Option<String>,
}

pub struct TensorStore {
    dir: PathBuf,
    shards: Vec<Shard>,
    entries: HashMap<String, Entry>,
    /// Whether each stored tensor (or a view into it) was asked for: what the model never
    /// asks for is a checkpoint the config does not describe (`unread`).
    read: Vec<AtomicBool>,
    holes: Vec<Holes>,
    /// The checkpoint's own name of a tensor read under another (`rename`'s inverse), for the
    /// message of one missing.
    stored_name: Option<fn(&str) -> Option<String>>,
}

impl TensorStore {
    /// Opens `dir/model.safetensors.index.json` when present, else `dir/model.safetensors`.
    pub fn open(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| Error::format(&index, format!("not valid JSON: {e}")))?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| Error::format(&index, "has no `weight_map` object"))?;
            let mut names: Vec<String> = map
                .values()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            names.sort();
            names.dedup();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            let single = dir.join("model.safetensors");
            if !single.exists() {
                return Err(Error::format(
                    dir,
                    "no model.safetensors or model.safetensors.index.json in this directory",
                ));
            }
            vec![single]
        };
        let mut shards = Vec::with_capacity(files.len());
        let mut entries = HashMap::new();
        let mut read = Vec::new();
        let mut holes = Vec::new();
        for (i, path) in files.iter().enumerate() {
            let (map, file) = map_file(path)?;
            let st = SafeTensors::deserialize(&map)
                .map_err(|e| Error::format(path, format!("not a valid safetensors file: {e}")))?;
            let base = map.as_ptr() as usize;
            let data_start = st
                .tensors()
                .iter()
                .map(|(_, v)| v.data().as_ptr() as usize - base)
                .min()
                .unwrap_or(map.len());
            if let (bytes @ 1.., Some(first)) =
                mapped::holes(&file, data_start as u64, map.len() as u64)
            {
                let first = first as usize;
                let first_tensor = st
                    .tensors()
                    .into_iter()
                    .filter(|(_, v)| {
                        let start = v.data().as_ptr() as usize - base;
                        start + v.data().len() > first
                    })
                    .min_by_key(|(_, v)| v.data().as_ptr() as usize)
                    .map(|(n, _)| n);
                holes.push(Holes {
                    file: path.clone(),
                    bytes,
                    first_tensor,
                });
            }
            for (name, view) in st.tensors() {
                let start = view.data().as_ptr() as usize - base;
                let entry = Entry {
                    shard: i,
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    start,
                    end: start + view.data().len(),
                    view: false,
                    stored: read.len(),
                    ggml: None,
                    origin: None,
                };
                read.push(AtomicBool::new(false));
                entries.insert(name, entry);
            }
            drop(st);
            shards.push(Shard::Mapped(map));
        }
        split_fused_experts(&mut entries);
        Ok(Self {
            dir: dir.to_path_buf(),
            shards,
            entries,
            read,
            holes,
            stored_name: None,
        })
    }

    /// The tensors of GGUF `model` under transformers' names: plain floats as safetensors
    /// dtypes, quantized ones as their ggml blocks (`ggml_type`); a quantized token embedding
    /// (and Gemma 4's per-layer input table) is decoded to f32 here, since the embedding gather
    /// reads floats, and so is a tensor stored as a function of its values (Gemma's norms as
    /// `1 + w`, Kimi-Linear's `A_log` as `-exp(A_log)`), undone as transformers reads it.
    pub fn from_gguf(model: GgufModel) -> Result<Self> {
        let n_files = model.files.len();
        // (transformers' name, how it is stored) of every tensor, file by file.
        let naming = model
            .files
            .iter()
            .map(|(.., file)| {
                file.tensors
                    .iter()
                    .map(|t| Ok((model.hf_name(&t.name)?, model.stored_as(&t.name)?)))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let mut shards = Vec::with_capacity(n_files + 1);
        // Decoded tables follow the files' shards.
        let mut decoded = Vec::new();
        let mut entries = HashMap::new();
        let mut read = Vec::new();
        let mut latent_halves = LatentHalves::default();
        let beta_alpha = model.fused_beta_alpha()?;
        for (i, ((path, map, file), naming)) in model.files.into_iter().zip(naming).enumerate() {
            for (t, (name, stored_as)) in file.tensors.iter().zip(naming) {
                if latent_halves.take(&path, &map, t)? {
                    continue;
                }
                let dtype = match t.ty {
                    GgmlType::F32 => Dtype::F32,
                    GgmlType::F16 => Dtype::F16,
                    GgmlType::Bf16 => Dtype::BF16,
                    _ => Dtype::U8,
                };
                // LFM2's, the DeltaNets' and Mamba-2's convolution taps, squeezed to
                // `[channels, L]` by the converter, as transformers holds them (`[channels, 1, L]`).
                let mut shape = t.shape();
                if (name.ends_with(".conv.conv.weight") || name.ends_with(".conv1d.weight"))
                    && shape.len() == 2
                {
                    shape.insert(1, 1);
                }
                // Mamba-2's `A_log` and `D` (`[heads, 1]`) and its gated norm's weight
                // (`[groups, width / groups]`), shaped by the converter for ggml's broadcasts, as
                // transformers' vectors.
                let mamba_norm =
                    name.ends_with("mixer.norm.weight") || name.ends_with("mamba.norm.weight");
                if (name.ends_with(".A_log") || name.ends_with(".D"))
                    && shape.len() == 2
                    && shape[1] == 1
                    || mamba_norm && shape.len() == 2
                {
                    shape = vec![shape.iter().product()];
                }
                // Kimi-Linear's q/k/v convolution taps, `[1, channels, 1, L]` as the converter
                // writes them for llama.cpp, as transformers holds them (`[channels, 1, L]`).
                if name.ends_with("_conv1d.weight") && shape.len() == 4 && shape[0] == 1 {
                    shape.remove(0);
                }
                let mut entry = Entry {
                    shard: i,
                    dtype,
                    shape,
                    start: t.start,
                    end: t.end,
                    view: false,
                    stored: read.len(),
                    ggml: (dtype == Dtype::U8).then_some(t.ty),
                    origin: Some(t.name.as_str().into()),
                };
                // Qwen3-Next's `in_proj_ba`, its rows split into transformers' `in_proj_b` and
                // `in_proj_a` (whole rows of the stored blocks).
                if let Some((key_heads, per)) =
                    beta_alpha.filter(|_| name.ends_with(".in_proj_ba.weight"))
                {
                    let rows = entry.shape.first().copied().unwrap_or(0);
                    if rows != 2 * key_heads * per || entry.shape.len() != 2 {
                        return Err(Error::format(
                            &path,
                            format!(
                                "tensor `{}` is {:?}; {key_heads} key heads of {per} value heads \
                                 need {} rows",
                                t.name,
                                entry.shape,
                                2 * key_heads * per
                            ),
                        ));
                    }
                    let row = (t.end - t.start) / rows;
                    for (half, suffix) in
                        ["in_proj_b.weight", "in_proj_a.weight"].iter().enumerate()
                    {
                        let bytes: Vec<u8> = (0..key_heads)
                            .flat_map(|g| (0..per).map(move |j| (2 * g + half) * per + j))
                            .flat_map(|r| &map[t.start + r * row..t.start + (r + 1) * row])
                            .copied()
                            .collect();
                        let mut half_entry =
                            stored_entry(entry.clone(), bytes, &mut decoded, n_files);
                        half_entry.shape[0] = key_heads * per;
                        half_entry.stored = read.len();
                        read.push(AtomicBool::new(false));
                        let half_name = name.replace("in_proj_ba.weight", suffix);
                        if entries.insert(half_name.clone(), half_entry).is_some() {
                            return Err(Error::format(
                                &path,
                                format!(
                                    "two GGUF tensors map to `{half_name}` (e.g. `{}`)",
                                    t.name
                                ),
                            ));
                        }
                    }
                    continue;
                }
                // Gemma 4's per-layer input table too is gathered as floats.
                let table = name.ends_with("embed_tokens.weight")
                    || name.ends_with("embed_tokens_per_layer.weight");
                if (table && entry.ggml.is_some()) || stored_as.is_some() {
                    let mut values = vec![0f32; t.shape().iter().product()];
                    if !t.ty.decode(&map[t.start..t.end], &mut values) {
                        return Err(Error::unsupported(
                            format!("{}: tensor `{}`", path.display(), t.name),
                            "ggml type",
                            format!("{} (not decoded by quantppl yet)", t.ty),
                        ));
                    }
                    if let Some(how) = stored_as {
                        values.iter_mut().for_each(|v| *v = how.undo(*v));
                    }
                    entry = decoded_entry(entry, &values, &mut decoded, n_files);
                }
                read.push(AtomicBool::new(false));
                if entries.insert(name.clone(), entry).is_some() {
                    return Err(Error::format(
                        &path,
                        format!("two GGUF tensors map to `{name}` (e.g. `{}`)", t.name),
                    ));
                }
            }
            shards.push(Shard::Mapped(map));
        }
        for (name, origin, (shape, values)) in latent_halves.joined(&model.path)? {
            let entry = Entry {
                shard: 0,
                dtype: Dtype::F32,
                shape,
                start: 0,
                end: 0,
                view: false,
                stored: read.len(),
                ggml: None,
                origin: Some(origin.as_str().into()),
            };
            let entry = decoded_entry(entry, &values, &mut decoded, n_files);
            read.push(AtomicBool::new(false));
            if entries.insert(name.clone(), entry).is_some() {
                return Err(Error::format(
                    &model.path,
                    format!("two GGUF tensors map to `{name}` (e.g. {origin})"),
                ));
            }
        }
        shards.extend(decoded.into_iter().map(Shard::Decoded));
        split_fused_experts(&mut entries);
        Ok(Self {
            dir: model.path,
            shards,
            entries,
            read,
            holes: Vec::new(),
            stored_name: None,
        })
    }

    /// A GGUF tensor's ggml type where it is stored quantized.
    pub fn ggml_type(&self, name: &str) -> Option<GgmlType> {
        self.entries.get(name).and_then(|e| e.ggml)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    pub fn get(&self, name: &str) -> Result<TensorRef<'_>> {
        self.try_get(name).ok_or_else(|| Error::MissingTensor {
            dir: self.dir.clone(),
            name: name.to_string(),
            stored_as: match self.stored_name.and_then(|stored| stored(name)) {
                Some(stored) => format!(" (stored as `{stored}`)"),
                None => String::new(),
            },
        })
    }

    pub fn try_get(&self, name: &str) -> Option<TensorRef<'_>> {
        let (key, e) = self.entries.get_key_value(name)?;
        self.read[e.stored].store(true, Ordering::Relaxed);
        Some(TensorRef {
            name: e.origin.as_deref().unwrap_or(key),
            dtype: e.dtype,
            shape: &e.shape,
            bytes: &self.shards[e.shard].bytes()[e.start..e.end],
        })
    }

    /// The shards' regions never written (sparse files: an interrupted download or write),
    /// which read as zeros.
    pub fn holes(&self) -> &[Holes] {
        &self.holes
    }

    /// The stored size of tensor `name` (not counted as reading it).
    pub fn byte_len(&self, name: &str) -> Option<usize> {
        self.entries.get(name).map(|e| e.end - e.start)
    }

    /// Names the tensors under `from` (a name prefix) under `to` instead, each where no tensor
    /// holds its new name; messages still give the stored name.
    pub fn rename_prefix(&mut self, from: &str, to: &str) {
        self.rename(|n| n.strip_prefix(from).map(|rest| format!("{to}{rest}")));
    }

    /// Names each tensor `new(name)` gives a name (where no tensor holds that name);
    /// messages still give the stored name, and `stored(name)` a missing one's.
    pub fn rename_as_layout(
        &mut self,
        new: impl Fn(&str) -> Option<String>,
        stored: fn(&str) -> Option<String>,
    ) {
        self.rename(new);
        self.stored_name = Some(stored);
    }

    /// Names each tensor `new(name)` gives a name (where no tensor holds that name);
    /// messages still give the stored name.
    pub fn rename(&mut self, new: impl Fn(&str) -> Option<String>) {
        let moving: Vec<(String, String)> = self
            .entries
            .keys()
            .filter_map(|n| new(n).map(|to| (n.clone(), to)))
            .filter(|(_, to)| !self.entries.contains_key(to))
            .collect();
        for (name, to) in moving {
            let mut e = self.entries.remove(&name).expect("listed above");
            e.origin.get_or_insert_with(|| name.as_str().into());
            self.entries.insert(to, e);
        }
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// One past the largest `N` of the tensors named `{prefix}N.…` (decoder layers, experts),
    /// 0 where there is none.
    pub fn numbered_under(&self, prefix: &str) -> usize {
        self.names()
            .filter_map(|n| {
                n.strip_prefix(prefix)?
                    .split('.')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .max()
            .map_or(0, |n| n + 1)
    }

    /// Names the row blocks of a fused linear's tensors (`module`, e.g. Phi-3's
    /// `….self_attn.qkv_proj`) as the tensors of the separate linears `parts` (name, rows):
    /// views, no copies. A tensor of the fused output rows is cut along them; one whose
    /// first dimension packs or blocks several rows (zero points packed along the output,
    /// FP8 block scales) at whole units; a single value (a global scale) or a per-input
    /// vector (`g_idx`) is shared; `weight_shape` is left out (the parts' shapes differ).
    pub fn split_fused_rows(&mut self, module: &str, parts: &[(String, usize)]) -> Result<()> {
        let total: usize = parts.iter().map(|p| p.1).sum();
        let prefix = format!("{module}.");
        let fused: Vec<(String, Entry)> = self
            .entries
            .iter()
            .filter(|(n, _)| n.starts_with(&prefix))
            .map(|(n, e)| (n.clone(), e.clone()))
            .collect();
        for (name, e) in fused {
            let suffix = &name[prefix.len()..];
            if suffix == "weight_shape" {
                // Consumed here: each part's shape is its rows.
                self.read[e.stored].store(true, Ordering::Relaxed);
                continue;
            }
            let numel: usize = e.shape.iter().product();
            let shared = numel == 1 || suffix.ends_with("g_idx");
            // Scales and zero points may cover several rows each (blocks, packing along out);
            // any other tensor holds one row per output.
            let grouped = matches!(
                suffix,
                "weight_zero_point" | "weight_scale" | "weight_scale_inv"
            );
            let unit = match e.shape.first() {
                _ if shared => None,
                Some(&rows) if rows == total => Some(1),
                Some(&rows) if grouped && rows > 0 && total.is_multiple_of(rows) => {
                    Some(total / rows)
                }
                _ => {
                    return Err(Error::unsupported(
                        name,
                        "fused projection",
                        format!(
                            "shape {:?} is not split along the {total} output rows of its parts                              (a transposed GPTQ/AWQ layout is not supported for fused linears)",
                            e.shape
                        ),
                    ));
                }
            };
            let mut row0 = 0usize;
            for (part, rows) in parts {
                let view = match unit {
                    None => Entry {
                        view: true,
                        ..e.clone()
                    },
                    Some(unit) => {
                        if !row0.is_multiple_of(unit) || !rows.is_multiple_of(unit) {
                            return Err(Error::unsupported(
                                name,
                                "fused projection",
                                format!(
                                    "rows of {part} ({row0}..{}) do not fall on whole units of {unit} rows",
                                    row0 + rows
                                ),
                            ));
                        }
                        let row_bytes = (e.end - e.start) / e.shape[0];
                        let start = e.start + row0 / unit * row_bytes;
                        let mut shape = e.shape.clone();
                        shape[0] = rows / unit;
                        Entry {
                            shape,
                            start,
                            end: start + rows / unit * row_bytes,
                            view: true,
                            ..e.clone()
                        }
                    }
                };
                self.entries.insert(format!("{part}.{suffix}"), view);
                row0 += rows;
            }
        }
        Ok(())
    }

    /// Names each expert's slice of the tensors `{prefix}.{stored}` that stack `experts`
    /// experts along their first dimension (gpt-oss) as `{prefix}.{e}.{name}` for each
    /// `(stored, name)` of `names`: views, no copies, the dimensions after the second merged
    /// into one (MXFP4 blocks `[E, out, groups, 16]` -> `[out, groups * 16]`). Names missing
    /// on disk are skipped.
    pub fn split_expert_stacks(
        &mut self,
        prefix: &str,
        experts: usize,
        names: &[(&str, &str)],
    ) -> Result<()> {
        for (stored, name) in names {
            let key = format!("{prefix}.{stored}");
            let Some(e) = self.entries.get(&key).cloned() else {
                continue;
            };
            if e.shape.len() < 2 || e.shape[0] != experts {
                return Err(Error::ShapeMismatch {
                    tensor: key,
                    expected: vec![experts, 0],
                    found: e.shape.clone(),
                });
            }
            let per = (e.end - e.start) / experts;
            let shape = match &e.shape[1..] {
                [n] => vec![*n],
                [rows, rest @ ..] => vec![*rows, rest.iter().product()],
                [] => unreachable!("two or more dimensions"),
            };
            for x in 0..experts {
                let start = e.start + x * per;
                let view = Entry {
                    shape: shape.clone(),
                    start,
                    end: start + per,
                    view: true,
                    ..e.clone()
                };
                self.entries.insert(format!("{prefix}.{x}.{name}"), view);
            }
        }
        Ok(())
    }

    /// The stored tensors nothing has asked for (through `get`/`try_get`, or a view of
    /// them), sorted.
    pub fn unread(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .entries
            .iter()
            .filter(|(_, e)| !e.view && !self.read[e.stored].load(Ordering::Relaxed))
            .map(|(n, _)| n.as_str())
            .collect();
        names.sort_unstable();
        names
    }

    /// Bytes of all tensors, as stored.
    pub fn total_bytes(&self) -> u64 {
        self.entries
            .values()
            .filter(|e| !e.view)
            .map(|e| (e.end - e.start) as u64)
            .sum()
    }
}

/// `entry` made to hold `values` (f32) in a decoded shard appended to `decoded`, whose shards
/// follow the model's `n_files` files.
fn decoded_entry(
    entry: Entry,
    values: &[f32],
    decoded: &mut Vec<Vec<u8>>,
    n_files: usize,
) -> Entry {
    let entry = Entry {
        dtype: Dtype::F32,
        ggml: None,
        ..entry
    };
    stored_entry(
        entry,
        bytemuck::cast_slice(values).to_vec(),
        decoded,
        n_files,
    )
}

/// `entry` (its type kept) over `bytes`, a new shard after the files' `n_files`.
fn stored_entry(entry: Entry, bytes: Vec<u8>, decoded: &mut Vec<Vec<u8>>, n_files: usize) -> Entry {
    let entry = Entry {
        shard: n_files + decoded.len(),
        start: 0,
        end: bytes.len(),
        ..entry
    };
    decoded.push(bytes);
    entry
}

/// DeepSeek's `kv_b_proj` as llama.cpp's converter splits it a head at a time: `attn_k_b`
/// `[heads, kv_lora, nope]` (transposed, its rows along the key's no-RoPE values, so that
/// llama.cpp can multiply queries into the latent) and `attn_v_b` `[heads, v, kv_lora]`. Both
/// are decoded here and joined into transformers' `[heads * (nope + v), kv_lora]` in f32: a
/// linear over the latent reads rows along `kv_lora`, which `attn_k_b`'s blocks are not.
#[derive(Default)]
struct LatentHalves {
    /// By layer: the decoded halves, key then value.
    layers: std::collections::BTreeMap<usize, [Option<DecodedTensor>; 2]>,
}

/// A tensor's shape and its values, decoded.
type DecodedTensor = (Vec<usize>, Vec<f32>);

impl LatentHalves {
    /// Decodes `t` where it is one of the halves (and returns true).
    fn take(&mut self, path: &Path, map: &[u8], t: &super::gguf::TensorInfo) -> Result<bool> {
        let Some((layer, half)) = t.name.strip_prefix("blk.").and_then(|rest| {
            let (layer, module) = rest.split_once('.')?;
            let half = match module {
                "attn_k_b.weight" => 0,
                "attn_v_b.weight" => 1,
                _ => return None,
            };
            Some((layer.parse::<usize>().ok()?, half))
        }) else {
            return Ok(false);
        };
        let shape = t.shape();
        let mut values = vec![0f32; shape.iter().product()];
        if shape.len() != 3 || !t.ty.decode(&map[t.start..t.end], &mut values) {
            return Err(Error::format(
                path,
                format!(
                    "tensor `{}` is {} of shape {shape:?}, not a decodable [heads, rows, row] stack",
                    t.name, t.ty
                ),
            ));
        }
        self.layers.entry(layer).or_default()[half] = Some((shape, values));
        Ok(true)
    }

    /// Each layer's `kv_b_proj`: its name, the GGUF names it came from, the tensor.
    fn joined(self, path: &Path) -> Result<Vec<(String, String, DecodedTensor)>> {
        self.layers
            .into_iter()
            .map(|(layer, halves)| {
                let origin = format!("blk.{layer}.attn_k_b.weight + blk.{layer}.attn_v_b.weight");
                let [Some((ks, k)), Some((vs, v))] = halves else {
                    return Err(Error::format(
                        path,
                        format!("{origin}: one of the two is missing"),
                    ));
                };
                let (heads, latent, nope, v_dim) = (ks[0], ks[1], ks[2], vs[1]);
                if vs[0] != heads || vs[2] != latent {
                    return Err(Error::format(
                        path,
                        format!("{origin}: shapes {ks:?} and {vs:?} do not fit together"),
                    ));
                }
                let mut rows = Vec::with_capacity(heads * (nope + v_dim) * latent);
                for h in 0..heads {
                    let key = &k[h * latent * nope..(h + 1) * latent * nope];
                    rows.extend(
                        (0..nope).flat_map(|n| (0..latent).map(move |l| key[l * nope + n])),
                    );
                    rows.extend_from_slice(&v[h * v_dim * latent..(h + 1) * v_dim * latent]);
                }
                let name = format!("model.layers.{layer}.self_attn.kv_b_proj.weight");
                Ok((name, origin, (vec![heads * (nope + v_dim), latent], rows)))
            })
            .collect()
    }
}

/// Names every expert's projections inside transformers 5's fused 3D expert tensors
/// (`….mlp.experts.gate_up_proj` `[E, 2I, H]`: rows `0..I` of each expert the gate, `I..2I`
/// the up projection; Nemotron-H's ungated `….mixer.experts.up_proj` `[E, I, H]`;
/// `….experts.down_proj` `[E, H, I]`; GGUF's separate `….experts.gate_proj` and its biases
/// `….experts.gate_proj_bias` `[E, I]`; Granite's
/// `….block_sparse_moe.input_linear.weight` and
/// `output_linear.weight` the same) as the per-expert 2D tensors
/// the checkpoints of llm-compressor hold (`….mlp.experts.{e}.gate_proj.weight`, and
/// Mixtral's `….block_sparse_moe.experts.{e}.w1/w3/w2.weight`): views, no copies.
fn split_fused_experts(entries: &mut HashMap<String, Entry>) {
    let mut views = Vec::new();
    for (name, e) in entries.iter() {
        // Granite's stacks keep their checkpoint names: `….block_sparse_moe.input_linear.weight`
        // (gate and up) and `output_linear.weight` (down).
        let granite = |suffix: &str| {
            name.strip_suffix(suffix)
                .filter(|p| p.ends_with(".block_sparse_moe"))
        };
        // GGUF's stacks of expert biases (gpt-oss: `….experts.gate_proj_bias` `[E, rows]`).
        let bias_stack = ["gate_proj", "up_proj", "down_proj"]
            .into_iter()
            .find_map(|proj| {
                let prefix = name.strip_suffix(&format!(".experts.{proj}_bias"))?;
                Some((prefix, proj))
            });
        if let (Some((prefix, proj)), [experts, rows]) = (bias_stack, &e.shape[..]) {
            let per_expert = (e.end - e.start) / (*experts).max(1);
            for x in 0..*experts {
                let start = e.start + x * per_expert;
                let entry = Entry {
                    shape: vec![*rows],
                    start,
                    end: start + per_expert,
                    view: true,
                    ..e.clone()
                };
                views.push((format!("{prefix}.experts.{x}.{proj}.bias"), entry));
            }
            continue;
        }
        let Some(prefix) = name
            .strip_suffix(".experts.gate_up_proj")
            .or_else(|| name.strip_suffix(".experts.gate_proj"))
            .or_else(|| name.strip_suffix(".experts.up_proj"))
            .or_else(|| name.strip_suffix(".experts.down_proj"))
            .or_else(|| granite(".input_linear.weight"))
            .or_else(|| granite(".output_linear.weight"))
        else {
            continue;
        };
        let gate_up = name.ends_with("gate_up_proj") || name.ends_with(".input_linear.weight");
        let [experts, rows, cols] = e.shape[..] else {
            continue;
        };
        let per_expert = (e.end - e.start) / experts.max(1);
        let row_bytes = per_expert / rows.max(1);
        // (projection names, Mixtral's names, first row, rows) of each expert's part.
        let parts: &[(&str, &str, usize, usize)] = if gate_up {
            if rows % 2 != 0 {
                continue;
            }
            &[
                ("gate_proj", "w1", 0, rows / 2),
                ("up_proj", "w3", rows / 2, rows / 2),
            ]
        } else if name.ends_with(".experts.gate_proj") {
            // GGUF's gate stack (`ffn_gate_exps`).
            &[("gate_proj", "w1", 0, rows)]
        } else if name.ends_with(".experts.up_proj") {
            // Nemotron-H's ungated experts.
            &[("up_proj", "w3", 0, rows)]
        } else {
            &[("down_proj", "w2", 0, rows)]
        };
        // Mixtral's names under `block_sparse_moe` (also where a GGUF file's stacks are named so:
        // Kimi-Linear), LFM2's (`w1`/`w3`/`w2`) under its own
        // `feed_forward`.
        let mixtral = match prefix.strip_suffix(".mlp") {
            Some(p) => Some(format!("{p}.block_sparse_moe")),
            None => (prefix.ends_with(".feed_forward") || prefix.ends_with(".block_sparse_moe"))
                .then(|| prefix.to_string()),
        };
        for x in 0..experts {
            for &(proj, w, row0, n) in parts {
                let start = e.start + x * per_expert + row0 * row_bytes;
                let entry = Entry {
                    shape: vec![n, cols],
                    start,
                    end: start + n * row_bytes,
                    view: true,
                    ..e.clone()
                };
                views.push((format!("{prefix}.experts.{x}.{proj}.weight"), entry.clone()));
                if let Some(m) = &mixtral {
                    views.push((format!("{m}.experts.{x}.{w}.weight"), entry));
                }
            }
        }
    }
    for (name, entry) in views {
        entries.entry(name).or_insert(entry);
    }
}

fn map_file(path: &Path) -> Result<(MappedFile, File)> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len < 8 {
        return Err(Error::format(
            path,
            format!("not a valid safetensors file: only {len} bytes (truncated?)"),
        ));
    }
    Ok((MappedFile::new(path, &file)?, file))
}

impl TensorRef<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn expect_shape(&self, expected: &[usize]) -> Result<()> {
        if self.shape != expected {
            return Err(Error::ShapeMismatch {
                tensor: self.name.to_string(),
                expected: expected.to_vec(),
                found: self.shape.to_vec(),
            });
        }
        Ok(())
    }

    pub fn expect_dtype(&self, allowed: &[Dtype]) -> Result<()> {
        if !allowed.contains(&self.dtype) {
            let names: Vec<String> = allowed.iter().map(|d| format!("{d:?}")).collect();
            return Err(Error::DtypeMismatch {
                tensor: self.name.to_string(),
                expected: names.join(" or "),
                found: format!("{:?}", self.dtype),
            });
        }
        Ok(())
    }

    /// Floating tensor (F32/F16/BF16/F8_E4M3) widened to f32, exactly.
    /// An error naming the first NaN or infinity of a floating tensor, or an E8M0 byte 255
    /// (NaN) where `e8m0` says the U8 tensor holds MX scales. Integer codes hold none.
    pub fn check_finite(&self, e8m0: bool) -> Result<()> {
        use rayon::prelude::*;
        let (width, bad): (usize, fn(&[u8]) -> bool) = match self.dtype {
            Dtype::F32 => (4, |c| {
                u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x7f80_0000 == 0x7f80_0000
            }),
            Dtype::F16 => (2, |c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00),
            Dtype::BF16 => (2, |c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80),
            Dtype::F8_E4M3 => (1, |c| c[0] & 0x7f == 0x7f),
            Dtype::U8 if e8m0 => (1, |c| c[0] == 0xff),
            Dtype::F8_E8M0 => (1, |c| c[0] == 0xff),
            _ => return Ok(()),
        };
        const CHUNK: usize = 1 << 20;
        let first = self
            .bytes
            .par_chunks(CHUNK)
            .enumerate()
            .find_map_first(|(k, c)| {
                c.chunks_exact(width)
                    .position(bad)
                    .map(|i| k * CHUNK / width + i)
            });
        let Some(index) = first else {
            return Ok(());
        };
        let value = match self.dtype {
            Dtype::U8 | Dtype::F8_E8M0 => "E8M0 NaN (255)".to_string(),
            _ => {
                let one = TensorRef {
                    bytes: &self.bytes[index * width..(index + 1) * width],
                    ..*self
                };
                format!("{}", one.to_f32()?[0])
            }
        };
        Err(Error::NonFiniteWeight {
            tensor: self.name.to_string(),
            index,
            value,
        })
    }

    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let b = self.bytes;
        if let Some(t) = crate::numerics::FloatType::from_safetensors(self.dtype) {
            return Ok(t.widen(b));
        }
        Ok(match self.dtype {
            Dtype::F8_E4M3 => b
                .iter()
                .map(|&v| crate::numerics::fp8_e4m3_to_f32(v))
                .collect(),
            Dtype::F8_E8M0 => b.iter().map(|&v| crate::numerics::e8m0_to_f32(v)).collect(),
            other => {
                return Err(Error::DtypeMismatch {
                    tensor: self.name.to_string(),
                    expected: "a floating dtype".into(),
                    found: format!("{other:?}"),
                });
            }
        })
    }

    /// Integer tensor (I32/I64/I8/U8) as i64.
    pub fn to_i64(&self) -> Result<Vec<i64>> {
        let b = self.bytes;
        Ok(match self.dtype {
            Dtype::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            Dtype::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
            Dtype::I8 => b.iter().map(|&v| v as i8 as i64).collect(),
            Dtype::U8 => b.iter().map(|&v| v as i64).collect(),
            other => {
                return Err(Error::DtypeMismatch {
                    tensor: self.name.to_string(),
                    expected: "an integer dtype".into(),
                    found: format!("{other:?}"),
                });
            }
        })
    }

    /// I32 words reinterpreted as u32, so shifts never sign-extend (formats.md trap 1).
    pub fn to_u32_words(&self) -> Result<Vec<u32>> {
        self.expect_dtype(&[Dtype::I32, Dtype::U32])?;
        Ok(self
            .bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}
