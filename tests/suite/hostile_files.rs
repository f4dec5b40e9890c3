//! Hostile safetensors files: the bundled INT4 checkpoint's header and tensor table changed
//! field by field, its header bytes flipped at random, its length prefix and its file cut
//! short; each result is opened, loaded and run on the CPU. Every one must end in numbers or a
//! one-line error, never a panic, and within a bounded time: a header that claims a tensor
//! larger than the file is refused before anything that size is allocated. A NaN or an
//! infinity stored in a weight, a scale or a norm is an error naming the tensor.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use quantppl::backend::SeqLayout;
use quantppl::backend::cpu::CpuBackend;
use quantppl::checkpoint::Checkpoint;
use quantppl::model::Model;
use quantppl::rng::Rng;
use serde_json::{Value, json};

const MODEL: &str = "assets/stories260K-w4a16-channel";

/// Opens, loads and runs 16 tokens of the checkpoint in `dir`.
fn run(dir: &Path) -> Result<(), String> {
    let ckpt = Checkpoint::open(dir).map_err(|e| e.to_string())?;
    let b = CpuBackend::new();
    let model = Model::load(&b, &ckpt, 16, &|_, _| {}).map_err(|e| e.to_string())?;
    let vocab = ckpt.config.vocab_size as u32;
    let ids: Vec<u32> = (0..16).map(|i| (i * 37 + 1) % vocab).collect();
    let targets: Vec<i32> = ids.iter().skip(1).map(|&i| i as i32).chain([-1]).collect();
    let layout = SeqLayout::from_lengths([16]);
    model
        .nll(&b, &ids, &layout, &targets)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The file's JSON header and the bytes after it.
fn split(file: &[u8]) -> (Value, Vec<u8>) {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&file[8..8 + n]).unwrap();
    (header, file[8 + n..].to_vec())
}

fn join(header: &Value, data: &[u8]) -> Vec<u8> {
    let h = serde_json::to_vec(header).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

/// The ways one tensor's entry is broken: its dtype, shape and offsets replaced, or the
/// entry removed (`None`).
fn entry_mutations(entry: &Value, data_len: u64) -> Vec<Option<Value>> {
    let [start, end] = [0, 1].map(|i| entry["data_offsets"][i].as_u64().unwrap());
    let shape = entry["shape"].clone();
    let with = |key: &str, v: Value| {
        let mut e = entry.clone();
        e[key] = v;
        Some(e)
    };
    let mut out = vec![None];
    for dtype in [
        json!("F8_E5M2"),
        json!("BOOL"),
        json!("U64"),
        json!("X"),
        json!(7),
    ] {
        out.push(with("dtype", dtype));
    }
    let mut extra_dim = shape.as_array().unwrap().clone();
    extra_dim.push(json!(1));
    let mut reversed = shape.as_array().unwrap().clone();
    reversed.reverse();
    for s in [
        json!([]),
        json!([0]),
        json!([1u64 << 40, 1u64 << 40]),
        json!([u64::MAX]),
        json!([-1]),
        json!("x"),
        json!(extra_dim),
        json!(reversed),
    ] {
        out.push(with("shape", s));
    }
    for offsets in [
        json!([0, 0]),
        json!([end, start]),
        json!([start, 1u64 << 50]),
        json!([start, end + 1]),
        json!([start + 1, end + 1]),
        json!([data_len, data_len + end - start]),
        json!([start]),
        json!("x"),
    ] {
        out.push(with("data_offsets", offsets));
    }
    out
}

struct Tally {
    tried: usize,
    errors: usize,
    slowest: Duration,
}

impl Tally {
    /// Writes `bytes` as the checkpoint's weights in `dir` and runs it; panics (the test's
    /// failure) on a panic, a multi-line error or a run longer than 20 s.
    fn check(&mut self, dir: &Path, bytes: &[u8], what: &str) {
        std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
        let start = Instant::now();
        let result = std::panic::catch_unwind(|| run(dir));
        let took = start.elapsed();
        let result = result.unwrap_or_else(|_| panic!("{what}: panicked"));
        if let Err(e) = &result {
            assert!(!e.is_empty() && !e.contains('\n'), "{what}: error `{e}`");
            self.errors += 1;
        }
        assert!(took < Duration::from_secs(20), "{what}: {took:?}");
        self.slowest = self.slowest.max(took);
        self.tried += 1;
    }
}

/// The bundled checkpoint's safetensors file.
fn model_file() -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(MODEL)
            .join("model.safetensors"),
    )
    .unwrap()
}

fn copy_of_model(tag: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(MODEL);
    let dir = std::env::temp_dir().join(format!("quantppl-hostile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    dir
}

#[test]
fn hostile_safetensors_files_end_in_numbers_or_an_error() {
    let original = model_file();
    let dir = copy_of_model("safetensors");
    let mut t = Tally {
        tried: 0,
        errors: 0,
        slowest: Duration::ZERO,
    };
    t.check(&dir, &original, "the file as shipped");
    assert_eq!(t.errors, 0, "the unmodified checkpoint must run");

    // Every entry of the tensor table, each field broken in turn.
    let (header, data) = split(&original);
    let names: Vec<String> = header
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    for name in &names {
        for m in entry_mutations(&header[name], data.len() as u64) {
            let mut h = header.clone();
            match &m {
                Some(e) => h[name] = e.clone(),
                None => {
                    h.as_object_mut().unwrap().remove(name);
                }
            }
            t.check(&dir, &join(&h, &data), &format!("{name} -> {m:?}"));
        }
    }

    // The length prefix, and the file cut short.
    let n = u64::from_le_bytes(original[..8].try_into().unwrap());
    for claimed in [0, 1, n - 1, n + 1, original.len() as u64, 1 << 40, u64::MAX] {
        let mut bytes = original.clone();
        bytes[..8].copy_from_slice(&claimed.to_le_bytes());
        t.check(&dir, &bytes, &format!("header length {claimed}"));
    }
    for cut in [
        0,
        4,
        8,
        9,
        n as usize,
        n as usize + 8,
        original.len() / 2,
        original.len() - 1,
    ] {
        t.check(&dir, &original[..cut], &format!("cut at {cut} bytes"));
    }

    // Random bytes of the header flipped (seeded).
    let mut rng = Rng::new(23);
    for i in 0..300 {
        let mut bytes = original.clone();
        for _ in 0..1 + i % 4 {
            let at = 8 + rng.below(n) as usize;
            bytes[at] = rng.next_u64() as u8;
        }
        t.check(&dir, &bytes, &format!("header bytes flipped, trial {i}"));
    }

    common::tally!(
        "{} hostile safetensors files: {} refused with a one-line error, {} ran; slowest {:?}",
        t.tried,
        t.errors,
        t.tried - t.errors,
        t.slowest
    );
    assert!(t.tried > 2000 && t.errors > t.tried / 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// NaN and infinity planted in a quantized linear's scale, the embedding (in a row the
/// evaluated tokens never use, so no NLL would show it) and a norm: each is refused at load,
/// naming the tensor and the element.
#[test]
fn non_finite_weights_are_refused_naming_the_tensor() {
    let original = model_file();
    let (header, _) = split(&original);
    let n = u64::from_le_bytes(original[..8].try_into().unwrap()) as usize;
    let dir = copy_of_model("non-finite");
    for (tensor, element) in [
        ("model.layers.1.self_attn.o_proj.weight_scale", 5),
        ("model.embed_tokens.weight", 511 * 64 + 3),
        ("model.layers.1.post_attention_layernorm.weight", 0),
    ] {
        let entry = &header[tensor];
        assert_eq!(entry["dtype"], "F32", "{tensor}");
        let start = 8 + n + entry["data_offsets"][0].as_u64().unwrap() as usize + 4 * element;
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut bytes = original.clone();
            bytes[start..start + 4].copy_from_slice(&bad.to_le_bytes());
            std::fs::write(dir.join("model.safetensors"), &bytes).unwrap();
            let e = run(&dir).expect_err("a non-finite weight is refused");
            assert!(
                e.contains(&format!("`{tensor}`"))
                    && e.contains(&format!("{bad} at element {element}")),
                "{e}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `quantppl eval` on the CPU in windows of 32, quiet (the model and data to add).
const EVAL_CPU: [&str; 6] = ["eval", "--backend", "cpu", "--ctx", "32", "-q"];

/// Runs `quantppl eval` on the checkpoint in `dir` (the CPU, 2 windows of 32) and returns
/// its stderr, asserting that it succeeded.
fn eval_stderr(dir: &Path) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args(EVAL_CPU)
        .args(["--rows", "2"])
        .arg("--model")
        .arg(dir)
        .output()
        .expect("run quantppl");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// A checkpoint holding tensors its config does not declare (issue 56, F14's class: q/k/v
/// biases under a Llama config, which has none, are a Qwen2 checkpoint read as Llama) runs
/// the model without them; the run says which tensors it never read. The unchanged copy
/// runs without a warning.
#[test]
fn tensors_the_config_never_reads_are_named() {
    let original = model_file();
    let dir = copy_of_model("unread");
    std::fs::write(dir.join("model.safetensors"), &original).unwrap();
    let quiet = eval_stderr(&dir);
    assert!(!quiet.contains("warning"), "{quiet}");

    let (mut header, mut data) = split(&original);
    let extra = ["q_proj", "k_proj"].map(|p| format!("model.layers.1.self_attn.{p}.bias"));
    for name in &extra {
        let start = data.len() as u64;
        data.extend(std::iter::repeat_n(0u8, 4 * 64));
        header[name.as_str()] = json!({
            "dtype": "F32", "shape": [64], "data_offsets": [start, start + 4 * 64]
        });
    }
    std::fs::write(dir.join("model.safetensors"), join(&header, &data)).unwrap();
    let warned = eval_stderr(&dir);
    let line = warned
        .lines()
        .find(|l| l.starts_with("warning:"))
        .unwrap_or_else(|| panic!("no warning: {warned}"));
    assert!(extra.iter().all(|n| line.contains(n.as_str())), "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A weights file sized first and then written only in part (issue 56, F8: an interrupted
/// download or write, a full disk) holds holes that read as zeros: the run says where,
/// naming the file and the first tensor inside.
#[test]
fn a_sparse_weights_file_is_named() {
    let original = model_file();
    let dir = copy_of_model("sparse");
    let path = dir.join("model.safetensors");
    let written = 64 << 10;
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(&original[..written]).unwrap();
        file.set_len(original.len() as u64).unwrap();
    }
    // A filesystem that allocates every block keeps no holes: nothing to report there.
    use std::os::unix::fs::MetadataExt;
    if path.metadata().unwrap().blocks() * 512 >= original.len() as u64 {
        eprintln!("skipped: {} keeps no holes", dir.display());
        return;
    }
    let (header, _) = split(&original);
    let data_start = 8 + u64::from_le_bytes(original[..8].try_into().unwrap()) as usize;
    let first_cut = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(n, _)| *n != "__metadata__")
        .filter(|(_, e)| data_start + e["data_offsets"][1].as_u64().unwrap() as usize > written)
        .min_by_key(|(_, e)| e["data_offsets"][0].as_u64().unwrap())
        .map(|(n, _)| n.clone())
        .unwrap();
    let stderr = eval_stderr(&dir);
    let line = stderr
        .lines()
        .find(|l| l.contains("never written"))
        .unwrap_or_else(|| panic!("no warning: {stderr}"));
    assert!(
        line.contains(&path.display().to_string()) && line.contains(&first_cut),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A weights file cut short while a run has it mapped (issue 56, F8: another process rewriting
/// the checkpoint; reads of the lost pages raise SIGBUS, which killed the run without a word)
/// ends in one line naming the file and the byte. The run maps the checkpoint before it reads
/// its text from stdin: the file is cut while the run waits there.
#[cfg(target_os = "linux")]
#[test]
fn a_weights_file_cut_while_mapped_is_one_line() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let original = model_file();
    let dir = copy_of_model("cut");
    let path = dir.join("model.safetensors");
    std::fs::write(&path, &original).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args(EVAL_CPU)
        .args(["--data", "-"])
        .arg("--model")
        .arg(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run quantppl");
    let mapped = path.canonicalize().unwrap().display().to_string();
    let maps = format!("/proc/{}/maps", child.id());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&maps)
        .unwrap_or_default()
        .contains(&mapped)
    {
        assert!(
            child.try_wait().unwrap().is_none(),
            "quantppl ended before it mapped the weights"
        );
        assert!(Instant::now() < deadline, "the weights were never mapped");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The header stays, every tensor's bytes go.
    let data_start = 8 + u64::from_le_bytes(original[..8].try_into().unwrap());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(data_start)
        .unwrap();
    let text = "Once upon a time there was a little girl who liked to play. ".repeat(40);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(text.as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with("error: ")
            && stderr.contains(&path.display().to_string())
            && stderr.contains(" is gone)"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
