//! Record files: the per-window results of a run, appended and fsync'ed as windows finish, so
//! that a killed run resumes where it stopped (`--resume`) and a run split over machines
//! (`--shard K/N`) is combined afterwards (`quantppl merge`).
//! (About 580 lines; its tests make it longer.)
//!
//! Format (text, so a person can look into it):
//! ```text
//! quantppl-records/4 {"kind":..,"fingerprint":[[key,value],..],"shard":..,"run":..} <fnv64 hex>\n
//! placement <label> <fnv64 hex>\n                    how the windows after it were computed
//! <section> <window> <count> <payload hex> <fnv64 hex>\n      one line per finished window
//! ```
//! `section` is 0 for `eval` and the quantized model's index for `compare`. The payload holds
//! the exact bits of each value (f32 NLLs, or the f64 fields of `KldTerms`), so a resumed or
//! merged run aggregates exactly the numbers an uninterrupted run would. Every process writes a
//! placement line (`single`, `data`, `layers 0..3, 3..5`: how its devices shared the work)
//! before the first window it records with that placement: the header is written once, by
//! the first process, and a resumed run may be given other devices, so only these lines tell
//! a resumed or merged report how its windows were computed. A placement line with no window
//! after it (a process killed before its first window) computed nothing and is not counted.
//! The checksum covers the line up to it (the header's too: a damaged header would otherwise
//! read as another run's settings or counts): a last line that is incomplete or fails its
//! checksum is a write cut off by a kill and is dropped (and truncated away before
//! appending); a bad line anywhere else means the file was damaged, which is an error.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::backend::{KldTerms, TopAgreement};
use crate::fnv::Fnv;
use crate::plan::Plan;
use crate::run::info::RunInfo;
use crate::{Error, Result};

const MAGIC: &str = "quantppl-records/4";

/// Starts a placement line (window lines start with a section number).
const PLACEMENT: &str = "placement ";

/// Size and content hash of a whole file (data files, tokenizer.json).
pub fn file_fingerprint(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    Ok(format!(
        "{} bytes, fnv {}",
        bytes.len(),
        Fnv::of(&bytes).hex()
    ))
}

/// What identifies a checkpoint's weights without reading all of them: config.json, and for
/// every `*.safetensors` file its name, size and first and last MiB (the first holds the
/// header: names, dtypes, shapes, offsets). Paths are left out, so a copied model directory
/// (another node of a cluster) still matches.
/// A GGUF model (a file, whose first MiB holds its metadata and tensor table) by its parts.
pub fn model_fingerprint(dir: &Path) -> Result<String> {
    const EDGE: u64 = 1 << 20;
    let mut h = Fnv::default();
    let files: Vec<PathBuf> = if dir.is_file() {
        crate::checkpoint::gguf::part_paths(dir)?
    } else {
        let config = dir.join("config.json");
        h.update(&std::fs::read(&config).map_err(|e| Error::io(&config, e))?);
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        files
    };
    let mut total = 0u64;
    for path in &files {
        let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
        total += len;
        h.update(path.file_name().map_or(&[][..], |n| n.as_encoded_bytes()));
        h.update(&len.to_le_bytes());
        let mut buf = Vec::new();
        (&mut f)
            .take(EDGE)
            .read_to_end(&mut buf)
            .map_err(|e| Error::io(path, e))?;
        if len > EDGE {
            f.seek(SeekFrom::Start(len.saturating_sub(EDGE).max(EDGE)))
                .map_err(|e| Error::io(path, e))?;
            f.read_to_end(&mut buf).map_err(|e| Error::io(path, e))?;
        }
        h.update(&buf);
    }
    Ok(format!(
        "{} {} file(s), {total} bytes, fnv {}",
        files.len(),
        if dir.is_file() { "GGUF" } else { "safetensors" },
        h.hex()
    ))
}

/// Hash of every window's ids and targets: catches any difference in tokenization or text
/// that the named settings would not show.
pub fn plan_fingerprint(plan: &Plan) -> String {
    let mut h = Fnv::default();
    for w in &plan.windows {
        h.update(&(w.ids.len() as u64).to_le_bytes());
        h.update(bytemuck::cast_slice(&w.ids));
        h.update(bytemuck::cast_slice(&w.targets));
        if let Some(b) = &w.branches {
            h.update(&(b.prefix as u64).to_le_bytes());
            for &n in &b.lens {
                h.update(&(n as u64).to_le_bytes());
            }
        }
    }
    format!("{} windows, fnv {}", plan.windows.len(), h.hex())
}

/// Which of `n` disjoint window sets a run evaluates: windows `i` with `i % n == k - 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// 1-based, as Slurm array task ids.
    pub k: usize,
    pub n: usize,
}

impl Shard {
    pub const WHOLE: Shard = Shard { k: 1, n: 1 };

    pub fn contains(&self, window: usize) -> bool {
        window % self.n == self.k - 1
    }

    /// The windows of this shard among `total`, in order.
    pub fn windows(&self, total: usize) -> Vec<usize> {
        (self.k - 1..total).step_by(self.n).collect()
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.k, self.n)
    }
}

impl Shard {
    /// This process's shard from the cluster scheduler's array variables: Slurm's
    /// `SLURM_ARRAY_TASK_ID` (counted from `SLURM_ARRAY_TASK_MIN`, 0 where unset) of
    /// `SLURM_ARRAY_TASK_COUNT`, or a Kubernetes Indexed Job's `JOB_COMPLETION_INDEX` (from 0)
    /// of `JOB_COMPLETIONS` (the Job's `completions`, set in its env).
    pub fn from_scheduler(
        var: impl Fn(&str) -> Option<String>,
    ) -> std::result::Result<Self, String> {
        let num = |name: &str| -> std::result::Result<Option<usize>, String> {
            var(name)
                .map(|v| {
                    v.trim()
                        .parse()
                        .map_err(|_| format!("--shard auto: {name}=`{v}` is not a number"))
                })
                .transpose()
        };
        let (index, count) = match (num("SLURM_ARRAY_TASK_ID")?, num("SLURM_ARRAY_TASK_COUNT")?) {
            (Some(id), Some(n)) => {
                let min = num("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
                (id.checked_sub(min), n)
            }
            _ => match (num("JOB_COMPLETION_INDEX")?, num("JOB_COMPLETIONS")?) {
                (Some(i), Some(n)) => (Some(i), n),
                _ => {
                    return Err("--shard auto: neither SLURM_ARRAY_TASK_ID with \
                                SLURM_ARRAY_TASK_COUNT nor JOB_COMPLETION_INDEX with \
                                JOB_COMPLETIONS is set"
                        .to_string());
                }
            },
        };
        match index {
            Some(i) if i < count => Ok(Shard { k: i + 1, n: count }),
            _ => Err(format!(
                "--shard auto: task index {index:?} is outside the array of {count}"
            )),
        }
    }
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "auto" {
            return Shard::from_scheduler(|name| std::env::var(name).ok());
        }
        let bad = || format!("`{s}` is not K/N with 1 <= K <= N (e.g. 3/8), or auto");
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let k: usize = k.trim().parse().map_err(|_| bad())?;
        let n: usize = n.trim().parse().map_err(|_| bad())?;
        if k == 0 || n == 0 || k > n {
            return Err(bad());
        }
        Ok(Shard { k, n })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunKind {
    Eval,
    Compare,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Header {
    pub kind: RunKind,
    /// Settings that must match for records to be combined, in the order they are compared.
    pub fingerprint: Vec<(String, String)>,
    pub shard: Shard,
    pub run: RunInfo,
}

impl Header {
    /// The first setting in which `other` (this run) differs from `self` (a file), as
    /// `key: file value vs this value`.
    pub fn difference(&self, other: &Header) -> Option<String> {
        if self.kind != other.kind {
            return Some(format!(
                "it was written by `{}`, not `{}`",
                kind_name(self.kind),
                kind_name(other.kind)
            ));
        }
        fingerprint_difference(&self.fingerprint, &other.fingerprint)
    }
}

/// The first setting in which `here` (this run's fingerprint) differs from `there` (a file's),
/// as `key differs: file value there, this value here`.
pub fn fingerprint_difference(
    there: &[(String, String)],
    here: &[(String, String)],
) -> Option<String> {
    for i in 0..there.len().max(here.len()) {
        match (there.get(i), here.get(i)) {
            (Some((_, a)), Some((_, b))) if a == b => {}
            (Some((k, a)), Some((_, b))) => {
                return Some(format!("{k} differs: `{a}` there, `{b}` here"));
            }
            (Some((k, a)), None) => return Some(format!("it has an extra {k} `{a}`")),
            (None, Some((k, b))) => return Some(format!("it lacks {k} `{b}`")),
            (None, None) => {}
        }
    }
    None
}

fn kind_name(k: RunKind) -> &'static str {
    match k {
        RunKind::Eval => "quantppl eval",
        RunKind::Compare => "quantppl compare",
    }
}

/// A per-position result stored with its exact bits.
pub trait RecordValue: Sized + Clone {
    /// The run whose files hold values of this type.
    const KIND: RunKind;
    /// Hex characters per value.
    const WIDTH: usize;
    fn encode(&self, out: &mut String);
    fn decode(hex: &str) -> Option<Self>;
}

fn hex_u64(s: &str) -> Option<u64> {
    u64::from_str_radix(s, 16).ok()
}

impl RecordValue for f32 {
    const KIND: RunKind = RunKind::Eval;
    const WIDTH: usize = 8;
    fn encode(&self, out: &mut String) {
        out.push_str(&format!("{:08x}", self.to_bits()));
    }
    fn decode(hex: &str) -> Option<Self> {
        u32::from_str_radix(hex, 16).ok().map(f32::from_bits)
    }
}

impl RecordValue for KldTerms {
    const KIND: RunKind = RunKind::Compare;
    const WIDTH: usize = 90;
    fn encode(&self, out: &mut String) {
        let f = [
            self.kld,
            self.kld_reverse,
            self.nll_q,
            self.nll_base,
            self.base_top_p,
        ];
        for v in f {
            out.push_str(&format!("{:016x}", v.to_bits()));
        }
        let t = &self.top;
        for b in [t.same_ranking, t.base_top_rank].iter().chain(&t.shared) {
            out.push_str(&format!("{b:02x}"));
        }
    }
    fn decode(hex: &str) -> Option<Self> {
        let f = |i: usize| {
            hex.get(i * 16..(i + 1) * 16)
                .and_then(hex_u64)
                .map(f64::from_bits)
        };
        let b = |i: usize| {
            let at = 80 + 2 * i;
            hex.get(at..at + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        };
        Some(KldTerms {
            kld: f(0)?,
            kld_reverse: f(1)?,
            nll_q: f(2)?,
            nll_base: f(3)?,
            base_top_p: f(4)?,
            top: TopAgreement {
                same_ranking: b(0)?,
                base_top_rank: b(1)?,
                shared: [b(2)?, b(3)?, b(4)?],
            },
        })
    }
}

/// Finished windows keyed by (section, window).
pub type Records<T> = BTreeMap<(usize, usize), Vec<T>>;

/// `line` completed: its checksum appended, then the newline.
pub(crate) fn sealed(mut line: String) -> String {
    let sum = Fnv::of(line.as_bytes()).hex();
    line.push(' ');
    line.push_str(&sum);
    line.push('\n');
    line
}

fn encode_line<T: RecordValue>(section: usize, window: usize, values: &[T]) -> String {
    let mut line = format!("{section} {window} {} ", values.len());
    line.reserve(values.len() * T::WIDTH + 18);
    for v in values {
        v.encode(&mut line);
    }
    sealed(line)
}

fn encode_placement(label: &str) -> String {
    sealed(format!("{PLACEMENT}{label}"))
}

/// One line after the header.
#[derive(Debug, PartialEq)]
enum Line<T> {
    Window(usize, usize, Vec<T>),
    Placement(String),
}

/// The part of a sealed `line` (without its newline) that its checksum covers, if it holds.
pub(crate) fn unsealed(line: &str) -> Option<&str> {
    let (body, sum) = line.rsplit_once(' ')?;
    (Fnv::of(body.as_bytes()).hex() == sum).then_some(body)
}

fn decode_line<T: RecordValue>(line: &str) -> Option<Line<T>> {
    let body = unsealed(line)?;
    if let Some(label) = body.strip_prefix(PLACEMENT) {
        return Some(Line::Placement(label.to_string()));
    }
    let mut parts = body.split(' ');
    let section = parts.next()?.parse().ok()?;
    let window = parts.next()?.parse().ok()?;
    let count: usize = parts.next()?.parse().ok()?;
    let payload = parts.next().unwrap_or("");
    if parts.next().is_some() || payload.len() != count * T::WIDTH {
        return None;
    }
    let values = (0..count)
        .map(|i| T::decode(&payload[i * T::WIDTH..(i + 1) * T::WIDTH]))
        .collect::<Option<Vec<T>>>()?;
    Some(Line::Window(section, window, values))
}

/// A record file's parsed content, and the byte length of its valid part.
pub struct Contents<T> {
    pub header: Header,
    pub records: Records<T>,
    /// The labels of the placement lines that have a window line after them, in file order.
    pub placements: Vec<String>,
    valid_len: u64,
}

/// Whether `bytes`, a file's whole content, is the start of a header line beginning with
/// `magic` and nothing more: what a run killed while creating its file leaves (an empty file
/// included). Such a file is started afresh; any other file without a first line is refused
/// rather than overwritten.
pub(crate) fn is_cut_off_header(bytes: &[u8], magic: &str) -> bool {
    let lead = format!("{magic} ");
    !bytes.contains(&b'\n')
        && (bytes.starts_with(lead.as_bytes()) || lead.as_bytes().starts_with(bytes))
}

/// The header of a record file, or `None` when the file holds only the start of a header
/// line (a run killed while creating it).
pub fn read_header(path: &Path) -> Result<Option<Header>> {
    let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let Some(end) = text.iter().position(|&b| b == b'\n') else {
        if is_cut_off_header(&text, MAGIC) {
            return Ok(None);
        }
        return Err(Error::format(
            path,
            format!("not a quantppl record file (no `{MAGIC}` header line)"),
        ));
    };
    parse_header(path, &text[..end]).map(Some)
}

fn parse_header(path: &Path, line: &[u8]) -> Result<Header> {
    let line =
        std::str::from_utf8(line).map_err(|_| Error::format(path, "not a quantppl record file"))?;
    if line.starts_with("quantppl-records/") && !line.starts_with(MAGIC) {
        return Err(Error::format(
            path,
            format!("a record file of an older quantppl (this one writes `{MAGIC}`); start afresh"),
        ));
    }
    if !line.starts_with(&format!("{MAGIC} ")) {
        return Err(Error::format(
            path,
            format!("not a quantppl record file (first line does not start with `{MAGIC}`)"),
        ));
    }
    let json = unsealed(line)
        .and_then(|body| body.get(MAGIC.len() + 1..))
        .ok_or_else(|| Error::format(path, "the header line fails its checksum: damaged"))?;
    serde_json::from_str(json).map_err(|e| Error::format(path, format!("bad header: {e}")))
}

/// Reads a whole record file, dropping a torn last line.
pub fn read<T: RecordValue>(path: &Path) -> Result<Contents<T>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let Some(end) = bytes.iter().position(|&b| b == b'\n') else {
        return Err(Error::format(
            path,
            "no complete header line (the run that created it was cut off at once)",
        ));
    };
    let header = parse_header(path, &bytes[..end])?;
    // Another kind's lines do not decode as this kind's: say what the file is, not "damaged".
    if header.kind != T::KIND {
        return Err(Error::InvalidArgument(format!(
            "{} is a run file of `{}`, not of `{}`: give this run another file",
            path.display(),
            kind_name(header.kind),
            kind_name(T::KIND)
        )));
    }
    let mut records = Records::new();
    let mut placements = Vec::new();
    // The last placement line, until a window line follows it.
    let mut placement = None;
    let mut pos = end + 1;
    let mut line_no = 1;
    while pos < bytes.len() {
        line_no += 1;
        let (line, next, complete) = match bytes[pos..].iter().position(|&b| b == b'\n') {
            Some(i) => (&bytes[pos..pos + i], pos + i + 1, true),
            None => (&bytes[pos..], bytes.len(), false),
        };
        let parsed = std::str::from_utf8(line).ok().and_then(decode_line::<T>);
        match parsed {
            Some(Line::Placement(label)) if complete => placement = Some(label),
            Some(Line::Window(s, w, values)) if complete => {
                placements.extend(placement.take());
                if let Some(old) = records.get(&(s, w)) {
                    let same = old.len() == values.len()
                        && encode_line(s, w, old) == encode_line(s, w, &values);
                    if !same {
                        return Err(Error::format(
                            path,
                            format!(
                                "line {line_no}: window {w} recorded twice with different values"
                            ),
                        ));
                    }
                }
                records.insert((s, w), values);
            }
            // The last line: a write cut off by a kill. Anything after it is never valid.
            _ if next >= bytes.len() => break,
            _ => {
                return Err(Error::format(
                    path,
                    format!("line {line_no} is damaged (checksum or layout); the file is corrupt"),
                ));
            }
        }
        pos = next;
    }
    Ok(Contents {
        header,
        records,
        placements,
        valid_len: pos as u64,
    })
}

/// An open record file that finished windows are appended to.
pub struct RecordFile<T> {
    path: PathBuf,
    file: File,
    records: Records<T>,
    placements_at_open: Vec<String>,
}

impl<T: RecordValue> RecordFile<T> {
    /// Opens `path` to continue a run with `header`, or creates it. An existing file must have
    /// been written with the same settings, else the error says what differs.
    pub fn open(path: &Path, header: &Header) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        // Locked before it is read: a run that finished between a read and the lock would
        // have appended records the read missed, and the cut below would drop them.
        lock(&file, path)?;
        let existing = read_header(path)?.map(|_| read::<T>(path)).transpose()?;
        let (records, placements_at_open) = match existing {
            Some(c) => {
                if let Some(d) = c.header.difference(header) {
                    return Err(Error::InvalidArgument(format!(
                        "{} belongs to another run: {d}; use another file to start afresh",
                        path.display()
                    )));
                }
                if c.header.shard != header.shard {
                    return Err(Error::InvalidArgument(format!(
                        "{} holds shard {}, this run is shard {}",
                        path.display(),
                        c.header.shard,
                        header.shard
                    )));
                }
                // Cut a torn last record away so the next append starts on a fresh line.
                file.set_len(c.valid_len).map_err(|e| Error::io(path, e))?;
                (c.records, c.placements)
            }
            None => {
                file.set_len(0).map_err(|e| Error::io(path, e))?;
                let json = serde_json::to_string(header)
                    .map_err(|e| Error::format(path, format!("header: {e}")))?;
                (&file)
                    .write_all(sealed(format!("{MAGIC} {json}")).as_bytes())
                    .map_err(|e| Error::io(path, e))?;
                file.sync_all().map_err(|e| Error::io(path, e))?;
                (Records::new(), Vec::new())
            }
        };
        let mut file = file;
        file.seek(SeekFrom::End(0))
            .map_err(|e| Error::io(path, e))?;
        Ok(RecordFile {
            path: path.to_path_buf(),
            file,
            records,
            placements_at_open,
        })
    }

    pub fn records(&self) -> &Records<T> {
        &self.records
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The placements of the windows the file held when it was opened (see [`Contents`]).
    pub fn placements_at_open(&self) -> &[String] {
        &self.placements_at_open
    }

    pub fn is_done(&self, section: usize, window: usize) -> bool {
        self.records.contains_key(&(section, window))
    }

    /// Appends one finished window and waits until it is on disk.
    pub fn append(&mut self, section: usize, window: usize, values: &[T]) -> Result<()> {
        self.write_synced(&encode_line(section, window, values))?;
        self.records.insert((section, window), values.to_vec());
        Ok(())
    }

    /// Appends a placement line: the windows appended after it were computed with `label`.
    pub fn append_placement(&mut self, label: &str) -> Result<()> {
        self.write_synced(&encode_placement(label))
    }

    fn write_synced(&mut self, line: &str) -> Result<()> {
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.sync_data())
            .map_err(|e| Error::io(&self.path, e))
    }
}

/// One writer per file: a second run on the same file would interleave records.
fn lock(file: &File, path: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own; released when the file is closed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(Error::InvalidArgument(format!(
            "{} is in use by another quantppl process",
            path.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::ResolvedSettings;

    fn header() -> Header {
        Header {
            kind: RunKind::Eval,
            fingerprint: vec![("ctx".into(), "128".into())],
            shard: Shard::WHOLE,
            run: RunInfo {
                models: Vec::new(),
                settings: ResolvedSettings {
                    data: "d".into(),
                    data_fingerprint: "0 bytes".into(),
                    text: "raw".into(),
                    method: crate::plan::Method::Exl3,
                    ctx: 128,
                    stride: Some(32),
                    rows: Some(3),
                    defaults: Vec::new(),
                    n_tokens: 1000,
                    n_docs: 1,
                    bos: "b".into(),
                },
                windows: 3,
                forwarded_tokens: 384,
                scored_tokens: 381,
                docs: None,
                backend: "cpu".into(),
                devices: 1,
                batch_tokens: 256,
            },
        }
    }

    fn tmp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("qppl-rec-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn values_round_trip_bit_exactly() {
        let t = KldTerms {
            kld: 1e-300,
            kld_reverse: f64::MIN_POSITIVE,
            nll_q: -0.0,
            nll_base: f64::MAX,
            base_top_p: 0.5,
            top: TopAgreement {
                same_ranking: 10,
                base_top_rank: 255,
                shared: [1, 0, 7],
            },
        };
        let line = encode_line(2, 7, &[t, KldTerms::default()]);
        let Some(Line::Window(s, w, v)) = decode_line::<KldTerms>(line.trim_end()) else {
            panic!("{line} is a window line");
        };
        assert_eq!((s, w), (2, 7));
        assert_eq!(v[0].nll_q.to_bits(), (-0.0f64).to_bits());
        assert_eq!(v, [t, KldTerms::default()]);
        let line = encode_line(0, 1, &[1.5f32, f32::MIN_POSITIVE]);
        assert_eq!(
            decode_line::<f32>(line.trim_end()),
            Some(Line::Window(0, 1, vec![1.5, f32::MIN_POSITIVE]))
        );
    }

    #[test]
    fn placements_are_read_back_in_file_order() {
        let p = tmp("placements");
        {
            let mut f = RecordFile::<f32>::open(&p, &header()).unwrap();
            f.append_placement("data").unwrap();
            f.append(0, 0, &[1.0]).unwrap();
            f.append_placement("layers 0..3, 3..5").unwrap();
            f.append(0, 1, &[2.0]).unwrap();
            f.append(0, 2, &[3.0]).unwrap();
            // A process that placed its models and was killed before its first window.
            f.append_placement("single").unwrap();
        }
        let c = read::<f32>(&p).unwrap();
        assert_eq!(c.placements, ["data", "layers 0..3, 3..5"]);
        assert_eq!(c.records.len(), 3);
        // A placement line cut off by a kill is dropped like a torn window line.
        let full = std::fs::read(&p).unwrap();
        let mut torn = full.clone();
        torn.extend_from_slice(b"placement sing");
        std::fs::write(&p, &torn).unwrap();
        let f = RecordFile::<f32>::open(&p, &header()).unwrap();
        assert_eq!(f.placements_at_open(), ["data", "layers 0..3, 3..5"]);
        drop(f);
        assert_eq!(std::fs::read(&p).unwrap(), full);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn torn_last_record_is_dropped_and_truncated() {
        let p = tmp("torn");
        {
            let mut f = RecordFile::<f32>::open(&p, &header()).unwrap();
            f.append(0, 0, &[1.0, 2.0]).unwrap();
            f.append(0, 1, &[3.0]).unwrap();
        }
        let full = std::fs::read(&p).unwrap();
        // Cut the last record in the middle, as a SIGKILL during write would.
        std::fs::write(&p, &full[..full.len() - 7]).unwrap();
        let mut f = RecordFile::<f32>::open(&p, &header()).unwrap();
        assert!(f.is_done(0, 0) && !f.is_done(0, 1));
        f.append(0, 1, &[3.0]).unwrap();
        drop(f);
        assert_eq!(std::fs::read(&p).unwrap(), full);
        // A damaged line that is not the last is corruption, not a torn write.
        let mut bad = full.clone();
        let second = full.iter().position(|&b| b == b'\n').unwrap() + 3;
        bad[second] = b'f';
        std::fs::write(&p, &bad).unwrap();
        let e = read::<f32>(&p).err().unwrap().to_string();
        assert!(e.contains("line 2 is damaged"), "{e}");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn other_settings_are_refused_naming_the_difference() {
        let p = tmp("settings");
        drop(RecordFile::<f32>::open(&p, &header()).unwrap());
        let mut h = header();
        h.fingerprint[0].1 = "256".into();
        let e = RecordFile::<f32>::open(&p, &h).err().unwrap().to_string();
        assert!(e.contains("ctx differs: `128` there, `256` here"), "{e}");
        let mut h = header();
        h.kind = RunKind::Compare;
        let e = RecordFile::<f32>::open(&p, &h).err().unwrap().to_string();
        assert!(e.contains("written by `quantppl eval`"), "{e}");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn shards_partition_the_windows() {
        let s: Shard = "2/3".parse().unwrap();
        assert_eq!(s.windows(8), [1, 4, 7]);
        assert!(s.contains(4) && !s.contains(5));
        assert!("0/3".parse::<Shard>().is_err());
        assert!("4/3".parse::<Shard>().is_err());
        assert!("x".parse::<Shard>().is_err());
        let all: usize = (1..=3).map(|k| Shard { k, n: 3 }.windows(10).len()).sum();
        assert_eq!(all, 10);
    }
}
