//! Shared by the integration tests: where the fixtures are and how to read reference.json.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The repository's fixtures (made by the scripts in `tests/fixtures`):
/// `$QUANTPPL_FIXTURES` where set (a copy shipped to another machine), else `tests/fixtures`.
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os("QUANTPPL_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"),
    }
}

/// The bundled assets (the default model, its dense base and wiki.test.raw), which the
/// fixtures use rather than keep a second copy of.
pub fn assets_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets")
}

/// The fixture model directory `name`: under the fixtures, else under the assets.
pub fn fixture(name: &str) -> PathBuf {
    let own = fixtures_dir().join(name);
    if own.is_dir() {
        own
    } else {
        assets_dir().join(name)
    }
}

/// The text every reference.json was computed on: WikiText-2's raw test split.
pub fn wiki_test_raw() -> PathBuf {
    assets_dir().join("wikitext-2-raw/wiki.test.raw")
}

/// Every fixture model directory that has a reference.json (the fixtures, then the bundled
/// models), each sorted by name.
pub fn reference_dirs() -> Vec<PathBuf> {
    let mut all = Vec::new();
    for root in [fixtures_dir(), assets_dir()] {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
            .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("reference.json").exists())
            .collect();
        assert!(
            !dirs.is_empty(),
            "no fixture with reference.json in {}",
            root.display()
        );
        dirs.sort();
        all.extend(dirs);
    }
    all
}

/// The fixtures of [`reference_dirs`] that are Hugging Face directories (a `config.json`):
/// what the config parsers' hostile and fuzz tests edit (GGUF models hold their config in
/// the file).
pub fn config_dirs() -> Vec<PathBuf> {
    reference_dirs()
        .into_iter()
        .filter(|d| d.join("config.json").exists())
        .collect()
}

/// The GGUF fixtures (`model.gguf`).
pub fn gguf_dirs() -> Vec<PathBuf> {
    reference_dirs()
        .into_iter()
        .filter(|d| d.join("model.gguf").exists())
        .collect()
}

/// A fresh, writable copy of a fixture model (config, weights, tokenizer files) in a temporary
/// directory named after `tag`, for a test to break or rewrite.
pub fn writable_copy(src: &Path, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("quantppl-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
        let mut perm = std::fs::metadata(dir.join(f)).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perm.set_readonly(false);
        std::fs::set_permissions(dir.join(f), perm).unwrap();
    }
    dir
}

pub fn reference(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("reference.json")).expect("reference.json");
    serde_json::from_str(&text).expect("reference.json is JSON")
}

/// Whether the reference fake-quantizes activations (tolerances differ, see fixtures README).
pub fn activations_quantized(r: &Value) -> bool {
    r["activation_quantization_applied"]
        .as_bool()
        .unwrap_or(false)
}

pub fn suggested_ppl_rtol(r: &Value) -> f64 {
    r["f32_rounding_sensitivity"]["suggested_ppl_rtol"]
        .as_f64()
        .expect("suggested_ppl_rtol")
}

pub fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

/// exl3 rows 0 and 1 of a reference.json, laid end to end: their token ids, each position's
/// next token within its row as target (-1 at each row's last position), and the reference
/// per-position NLLs (255 per row).
pub fn rows01(r: &Value) -> (Vec<u32>, Vec<i32>, Vec<f64>) {
    let rows = [&r["exl3"]["row0"], &r["exl3"]["row1"]];
    let ids: Vec<u32> = rows
        .iter()
        .flat_map(|row| u32s(&row["token_ids"]))
        .collect();
    let want: Vec<f64> = rows.iter().flat_map(|row| f64s(&row["nll"])).collect();
    let n = ids.len() / 2;
    let targets = (0..ids.len())
        .map(|i| {
            if i % n == n - 1 {
                -1
            } else {
                ids[i + 1] as i32
            }
        })
        .collect();
    (ids, targets, want)
}

/// Judges a backend's rows-0/1 NLLs against the reference: weight-only fixtures per token
/// within `per_token_tol`; activation-quantized ones only in PPL (rounding flips at
/// quantization boundaries move single tokens), within the fixture's suggested tolerance.
/// Prints one line and returns a failure message, if any.
pub fn judge_rows01(
    name: &str,
    r: &Value,
    got: &[f32],
    want: &[f64],
    per_token_tol: f64,
) -> Option<String> {
    assert_eq!(got.len(), want.len(), "{name}: NLL count");
    let max_diff = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0f64, f64::max);
    if activations_quantized(r) {
        let mean_g = got.iter().map(|&v| v as f64).sum::<f64>() / got.len() as f64;
        let mean_w = want.iter().sum::<f64>() / want.len() as f64;
        let rel = ((mean_g - mean_w).exp() - 1.0).abs();
        println!(
            "{name}: max |dNLL| {max_diff:.2e}, PPL rel diff {rel:.2e} (activations quantized)"
        );
        (rel > suggested_ppl_rtol(r)).then(|| format!("{name}: rows01 PPL rel diff {rel:.3e}"))
    } else {
        println!("{name}: max |dNLL| {max_diff:.2e}");
        (max_diff > per_token_tol)
            .then(|| format!("{name}: max per-token |dNLL| {max_diff:.3e} > {per_token_tol:.0e}"))
    }
}

/// A fixture's exl3 rows 0 and 1 (two sequences of the plan's length) through `backend`,
/// judged by [`judge_rows01`] with `per_token_tol`: the failure message, if any.
pub fn rows01_failures_of<B: quantppl::backend::Backend>(
    backend: &B,
    dir: &Path,
    r: &Value,
    per_token_tol: f64,
) -> Option<String> {
    let ckpt = quantppl::checkpoint::Checkpoint::open(dir).expect("open fixture");
    let (ids, targets, want) = rows01(r);
    let n = ids.len() / 2;
    let model = quantppl::model::Model::load(backend, &ckpt, n, &|_, _| {}).expect("load");
    let layout = quantppl::backend::SeqLayout::from_lengths([n, n]);
    let got = model
        .nll(backend, &ids, &layout, &targets)
        .expect("forward");
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    judge_rows01(&name, r, &got, &want, per_token_tol)
}

/// Runs the quantppl binary with `args` plus `--json` into a temporary file named after `tag`,
/// asserts that it succeeded (showing its stderr otherwise) and returns the JSON report.
pub fn run_json(args: &[&str], tag: &str) -> Value {
    let json = std::env::temp_dir().join(format!("quantppl-{}-{tag}.json", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run quantppl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json report")).expect("JSON");
    let _ = std::fs::remove_file(&json);
    v
}

/// A 3-window run file of the bundled model at `file` (`eval --ctx 64 --stride 32 --rows 3
/// --resume FILE` on the CPU): what the run-file readers' hostile tests damage.
pub fn write_run_file(file: &Path) {
    succeeds(&[
        "eval",
        "--backend",
        "cpu",
        "--ctx",
        "64",
        "--stride",
        "32",
        "--rows",
        "3",
        "-q",
        "--resume",
        file.to_str().unwrap(),
    ]);
}

/// Runs quantppl with `args`, asserts that it succeeded (showing its stderr otherwise) and
/// returns its stdout.
pub fn succeeds(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args(args)
        .output()
        .expect("run quantppl");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs quantppl with `args` and checks for a one-line error containing every `needles` item.
pub fn fails_with(args: &[&str], needles: &[&str]) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args(args)
        .output()
        .expect("run quantppl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "expected failure for {args:?}; stdout:\n{stdout}"
    );
    assert!(
        !stderr.contains("panicked"),
        "panic for {args:?}:\n{stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one error line for {args:?}, got:\n{stderr}"
    );
    assert!(lines[0].starts_with("error: "), "{}", lines[0]);
    let parts: Vec<&str> = lines[0].split(": ").collect();
    assert!(
        parts.windows(2).all(|w| w[0] != w[1]),
        "a cause is printed twice: {}",
        lines[0]
    );
    for n in needles {
        assert!(
            lines[0].contains(n),
            "error for {args:?} should mention `{n}`: {}",
            lines[0]
        );
    }
    assert!(!stdout.contains("PPL"), "a number was printed for {args:?}");
}

/// Each quantized fixture with its dense base (llm-compressor's, and one model in three formats).
pub const QUANTIZED_WITH_BASE: [(&str, &[&str]); 4] = [
    (
        "stories260K",
        &[
            "stories260K-w4a16-channel",
            "stories260K-w4a16-g4-asym",
            "stories260K-w8a16-channel",
            "stories260K-fp8-dynamic",
        ],
    ),
    (
        "synth-llama-mini",
        &[
            "synth-llama-mini-fp8-dynamic",
            "synth-llama-mini-nvfp4",
            "synth-llama-mini-nvfp4a16",
            "synth-llama-mini-w4a16-g128",
            "synth-llama-mini-w4a16-g32-asym-actorder",
        ],
    ),
    ("synth-vocab32k", &["synth-vocab32k-w4a16-g128"]),
    // One model in three formats: a GGUF Q4_K_M and a compressed-tensors W4A16 of a bf16 base.
    (
        "synth-gguf-q4km-base",
        &["synth-gguf-q4km", "synth-gguf-q4km-w4a16"],
    ),
];

/// Prints a test's tally (inputs tried, faults injected) straight to the process's stderr:
/// libtest captures `println!` of passing tests, and CI's log is where these figures belong.
#[allow(unused_macros)]
macro_rules! tally {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
#[allow(unused_imports)]
pub(crate) use tally;

/// A GGUF writer for tests that rewrite a file's metadata or tensor table.
pub mod gguf {
    use quantppl::checkpoint::gguf::Value;

    /// Metadata and tensor entries (name, ggml dims, type id, data) to write as a GGUF file.
    pub type Meta = Vec<(String, Value)>;
    pub type Tensors = Vec<(String, Vec<usize>, u32, Vec<u8>)>;

    fn gguf_string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    fn gguf_value(out: &mut Vec<u8>, v: &Value, typed: bool) {
        let ty: u32 = match v {
            Value::Int(_) => 11,
            Value::UInt(_) => 10,
            Value::Float(_) => 12,
            Value::Bool(_) => 7,
            Value::Str(_) => 8,
            Value::Array(_) => 9,
        };
        if typed {
            out.extend(ty.to_le_bytes());
        }
        match v {
            Value::Int(i) => out.extend(i.to_le_bytes()),
            Value::UInt(u) => out.extend(u.to_le_bytes()),
            Value::Float(f) => out.extend(f.to_le_bytes()),
            Value::Bool(b) => out.push(*b as u8),
            Value::Str(s) => gguf_string(out, s),
            Value::Array(items) => {
                let elem = items.first().map_or(Value::UInt(0), Clone::clone);
                let mut head = Vec::new();
                gguf_value(&mut head, &elem, true);
                out.extend(&head[..4]);
                out.extend((items.len() as u64).to_le_bytes());
                for item in items {
                    gguf_value(out, item, false);
                }
            }
        }
    }

    /// A GGUF v3 file of `meta` and `tensors` (name, ggml dims, type id, data), 32-aligned.
    pub fn write_gguf(version: u32, meta: &[(String, Value)], tensors: &Tensors) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(version.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend((meta.len() as u64).to_le_bytes());
        for (k, v) in meta {
            gguf_string(&mut out, k);
            gguf_value(&mut out, v, true);
        }
        let mut offset = 0u64;
        for (name, dims, ty, data) in tensors {
            gguf_string(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend((*d as u64).to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        out.resize(out.len().div_ceil(32) * 32, 0);
        for (_, _, _, data) in tensors {
            out.extend(data);
            out.resize(out.len().div_ceil(32) * 32, 0);
        }
        out
    }
}
