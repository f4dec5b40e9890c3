//! Base-states files (`compare --save-base FILE`, then `compare --base-states FILE`): the
//! base model's final-normed hidden states at every scored position of a plan, so that the
//! full-vocabulary base distribution is recomputed exactly from them and the base's `lm_head`
//! while only the quantized model and the base's head are on the device. `hidden` numbers
//! per position instead of `vocab` (llama.cpp's logits file).
//!
//! Format:
//! ```text
//! quantppl-base-states/2 {"fingerprint":[[key,value],..],"hidden":4096,"dtype":"f32","rows":[..]} <fnv64 hex>\n
//! window 0: rows[0] x hidden values (f32 or bf16, little-endian), then their fnv64 (8 bytes LE)
//! window 1: ...
//! ```
//! `rows[w]` is window `w`'s number of scored positions, so every window's place in the file
//! follows from the header. Windows are written in order and fsync'ed as they go: a file cut
//! off by a kill holds whole windows up to some point and is continued by running the same
//! `--save-base` again; a damaged window fails its checksum when read.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use half::bf16;
use serde::{Deserialize, Serialize};

use crate::fnv::Fnv;
use crate::{Error, Result};

const MAGIC: &str = "quantppl-base-states/2";

/// How the states are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum StatesDtype {
    /// Exact: the compare numbers equal the in-memory compare's.
    F32,
    /// Half the size; each hidden value rounded to bf16 (on a bf16 CUDA run the values are
    /// bf16 already, so nothing changes there).
    Bf16,
}

impl StatesDtype {
    fn bytes(self) -> usize {
        match self {
            StatesDtype::F32 => 4,
            StatesDtype::Bf16 => 2,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StatesHeader {
    /// What must match: the plan, the tokenizer, the base's weights and head.
    pub fingerprint: Vec<(String, String)>,
    pub hidden: usize,
    pub dtype: StatesDtype,
    /// Scored positions of each window, in window order.
    pub rows: Vec<usize>,
}

impl StatesHeader {
    fn line(&self) -> String {
        super::record::sealed(format!(
            "{MAGIC} {}",
            serde_json::to_string(self).expect("header serializes")
        ))
    }

    /// Bytes of window `w` including its checksum.
    fn window_bytes(&self, w: usize) -> u64 {
        (self.rows[w] * self.hidden * self.dtype.bytes() + 8) as u64
    }

    /// The bytes of all windows, or `None` where the header's counts overflow (a damaged or
    /// hostile header, refused before anything is sized from it).
    fn total_bytes(&self) -> Option<u64> {
        let row = (self.hidden as u64).checked_mul(self.dtype.bytes() as u64)?;
        self.rows.iter().try_fold(0u64, |total, &r| {
            (r as u64)
                .checked_mul(row)?
                .checked_add(8)?
                .checked_add(total)
        })
    }

    /// The first setting in which `other` (this run) differs from this file's.
    pub fn difference(&self, other: &StatesHeader) -> Option<String> {
        super::record::fingerprint_difference(&self.fingerprint, &other.fingerprint).or_else(|| {
            (self.hidden != other.hidden || self.rows != other.rows)
                .then(|| "the windows' shapes differ".to_string())
        })
    }
}

fn encode(values: &[f32], dtype: StatesDtype) -> Vec<u8> {
    match dtype {
        StatesDtype::F32 => bytemuck::cast_slice(values).to_vec(),
        StatesDtype::Bf16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
    }
}

/// Reads the header line of `path`: the header and the byte offset where window 0 starts.
fn read_header(path: &Path, file: &File) -> Result<(StatesHeader, u64)> {
    let mut line = String::new();
    BufReader::new(file)
        .read_line(&mut line)
        .map_err(|e| Error::io(path, e))?;
    let bad = |why: &str| Error::format(path, format!("not a quantppl base-states file: {why}"));
    if line.starts_with("quantppl-base-states/") && !line.starts_with(MAGIC) {
        return Err(bad(&format!(
            "written by an older quantppl (this one reads `{MAGIC}`); save it again"
        )));
    }
    if !line.starts_with(&format!("{MAGIC} ")) {
        return Err(bad(&format!("no `{MAGIC}` header")));
    }
    let Some(sealed) = line.strip_suffix('\n') else {
        return Err(bad("the header line is cut off"));
    };
    let json = super::record::unsealed(sealed)
        .and_then(|body| body.get(MAGIC.len() + 1..))
        .ok_or_else(|| bad("the header line fails its checksum: damaged"))?;
    let header: StatesHeader =
        serde_json::from_str(json).map_err(|e| bad(&format!("header: {e}")))?;
    if header.total_bytes().is_none() {
        return Err(bad("the header's window sizes overflow"));
    }
    Ok((header, line.len() as u64))
}

/// Writes a states file window by window, in window order.
pub struct StatesWriter {
    file: File,
    path: PathBuf,
    header: StatesHeader,
    /// Windows written (all before this one).
    next: usize,
    /// Windows that arrived ahead of `next` (several devices finish out of order).
    waiting: BTreeMap<usize, Vec<f32>>,
}

impl StatesWriter {
    /// Creates `path`, or continues it when it holds the first windows of this same run (the
    /// header equal); a file of another run is refused naming the difference.
    pub fn open(path: &Path, header: StatesHeader) -> Result<Self> {
        let existing = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        let mut next = 0;
        let mut end;
        // Nothing yet, or only the start of a header (a save killed at once): start afresh.
        let fresh =
            existing == 0 || super::record::is_cut_off_header(&unsafe_map(path, &file)?, MAGIC);
        if fresh {
            file.set_len(0).map_err(|e| Error::io(path, e))?;
            file.write_all(header.line().as_bytes())
                .map_err(|e| Error::io(path, e))?;
            end = header.line().len() as u64;
        } else {
            let (there, start) = read_header(path, &file)?;
            if let Some(d) = there.difference(&header) {
                return Err(Error::InvalidArgument(format!(
                    "{} holds the states of another run: {d}; use another file to start afresh",
                    path.display()
                )));
            }
            // Keep the whole windows whose checksums hold; a cut-off write is dropped.
            end = start;
            let map = unsafe_map(path, &file)?;
            while next < header.rows.len() && end + header.window_bytes(next) <= existing {
                let w_end = end + header.window_bytes(next);
                if window_ok(&map[end as usize..w_end as usize]).is_none() {
                    break;
                }
                end = w_end;
                next += 1;
            }
        }
        file.set_len(end).map_err(|e| Error::io(path, e))?;
        file.seek(SeekFrom::Start(end))
            .map_err(|e| Error::io(path, e))?;
        Ok(StatesWriter {
            file,
            path: path.to_path_buf(),
            header,
            next,
            waiting: BTreeMap::new(),
        })
    }

    /// Windows already in the file (a continued run skips them).
    pub fn written(&self) -> usize {
        self.next
    }

    /// Takes window `w`'s states (`rows[w] x hidden` f32 values); writes every window that
    /// can now follow in order.
    pub fn push(&mut self, w: usize, values: Vec<f32>) -> Result<()> {
        let want = self.header.rows[w] * self.header.hidden;
        if values.len() != want {
            return Err(Error::InvalidArgument(format!(
                "window {w}: {} state values for {want}",
                values.len()
            )));
        }
        self.waiting.insert(w, values);
        while let Some(values) = self.waiting.remove(&self.next) {
            let mut bytes = encode(&values, self.header.dtype);
            let sum = Fnv::of(&bytes).value();
            bytes.extend_from_slice(&sum.to_le_bytes());
            self.file
                .write_all(&bytes)
                .and_then(|()| self.file.sync_data())
                .map_err(|e| Error::io(&self.path, e))?;
            self.next += 1;
        }
        Ok(())
    }

    /// The file's size once every window is in; an error when some are missing.
    pub fn finish(self) -> Result<u64> {
        if self.next != self.header.rows.len() {
            return Err(Error::InvalidArgument(format!(
                "{}: {} of {} windows written",
                self.path.display(),
                self.next,
                self.header.rows.len()
            )));
        }
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| Error::io(&self.path, e))
    }
}

fn unsafe_map(path: &Path, file: &File) -> Result<memmap2::Mmap> {
    // SAFETY: the file is only read through the map while this process holds it; a file
    // changed underneath by another process is caught by the per-window checksums.
    unsafe { memmap2::Mmap::map(file) }.map_err(|e| Error::io(path, e))
}

/// The payload of a window's bytes when its checksum holds.
fn window_ok(bytes: &[u8]) -> Option<&[u8]> {
    let (payload, sum) = bytes.split_at(bytes.len() - 8);
    let sum = u64::from_le_bytes(sum.try_into().ok()?);
    (Fnv::of(payload).value() == sum).then_some(payload)
}

/// A complete states file, memory-mapped.
pub struct States {
    path: PathBuf,
    map: memmap2::Mmap,
    pub header: StatesHeader,
    /// Start of each window in the file.
    starts: Vec<u64>,
}

impl States {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let (header, start) = read_header(path, &file)?;
        let mut starts = Vec::with_capacity(header.rows.len());
        let mut at = start;
        for w in 0..header.rows.len() {
            starts.push(at);
            at += header.window_bytes(w);
        }
        let map = unsafe_map(path, &file)?;
        let len = map.len() as u64;
        if len != at {
            let whole = starts
                .iter()
                .zip(0..)
                .take_while(|&(&s, w)| s + header.window_bytes(w) <= len)
                .count();
            return Err(Error::format(
                path,
                format!(
                    "{} bytes where {at} were expected: {whole} of {} windows are whole, the file \
                     ends at byte {len} (an interrupted --save-base continues when run again)",
                    len,
                    header.rows.len()
                ),
            ));
        }
        Ok(States {
            path: path.to_path_buf(),
            map,
            header,
            starts,
        })
    }

    pub fn bytes(&self) -> u64 {
        self.map.len() as u64
    }

    /// Window `w`'s states as f32, `rows[w] x hidden`, after checking its checksum.
    pub fn window(&self, w: usize) -> Result<Vec<f32>> {
        let start = self.starts[w] as usize;
        let end = start + self.header.window_bytes(w) as usize;
        let payload = window_ok(&self.map[start..end]).ok_or_else(|| {
            Error::format(
                &self.path,
                format!(
                    "window {w} (bytes {start}..{end}) fails its checksum: the file is damaged"
                ),
            )
        })?;
        Ok(match self.header.dtype {
            StatesDtype::F32 => payload
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            StatesDtype::Bf16 => payload
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        })
    }
}
