//! Bad input through the real binary: a non-zero exit and one `error:` line that names the
//! problem — never a panic trace, never a number.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::fails_with;

/// A fresh copy of a fixture model in a temporary directory, to be broken by the test.
fn model_copy(test: &str) -> PathBuf {
    copy_of(&common::fixture("stories260K-w4a16-channel"), test)
}

/// The same for the INT4 Qwen3-MoE fixture.
fn moe_copy(test: &str) -> PathBuf {
    copy_of(
        &common::fixture("synth-qwen3moe-mini-w4a16-g32"),
        &format!("moe-{test}"),
    )
}

fn copy_of(src: &Path, test: &str) -> PathBuf {
    common::writable_copy(src, &format!("cli-{test}"))
}

fn eval_args(dir: &Path) -> Vec<String> {
    vec![
        "eval".into(),
        "--backend".into(),
        "cpu".into(),
        "--model".into(),
        dir.display().to_string(),
        "-q".into(),
        "--rows".into(),
        "2".into(),
    ]
}

fn run_eval(dir: &Path, extra: &[&str], needles: &[&str]) {
    let mut a = eval_args(dir);
    a.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    fails_with(&refs, needles);
}

fn edit(path: &Path, f: impl FnOnce(String) -> String) {
    let s = std::fs::read_to_string(path).unwrap();
    std::fs::write(path, f(s)).unwrap();
}

#[test]
fn truncated_safetensors() {
    let d = model_copy("truncated");
    let p = d.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    run_eval(
        &d,
        &[],
        &["model.safetensors", "not a valid safetensors file"],
    );
}

#[test]
fn garbage_safetensors_header() {
    let d = model_copy("garbage");
    let p = d.join("model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[8..40].copy_from_slice(b"this is not a JSON header at all");
    std::fs::write(&p, &bytes).unwrap();
    run_eval(
        &d,
        &[],
        &["model.safetensors", "not a valid safetensors file"],
    );
}

#[test]
fn missing_tensor() {
    let d = model_copy("missing");
    let p = d.join("model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    // Rename one tensor in the header, keeping its length: `up_proj` -> `up_prox`.
    let key = b"model.layers.3.mlp.up_proj.weight_packed";
    let pos = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("tensor in header");
    bytes[pos + key.len() - 15] = b'x';
    std::fs::write(&p, &bytes).unwrap();
    run_eval(
        &d,
        &[],
        &["model.layers.3.mlp.up_proj.weight_packed", "not found"],
    );
}

#[test]
fn wrong_tensor_shape() {
    let d = model_copy("shape");
    edit(&d.join("config.json"), |s| {
        s.replace("\"intermediate_size\": 172", "\"intermediate_size\": 176")
    });
    run_eval(&d, &[], &["gate_proj", "expected shape", "172"]);
}

#[test]
fn unsupported_quantization_format() {
    let d = model_copy("format");
    edit(&d.join("config.json"), |s| {
        s.replace(
            "\"format\": \"pack-quantized\"",
            "\"format\": \"marlin-24\"",
        )
    });
    run_eval(&d, &[], &["marlin-24", "format"]);
}

#[test]
fn transform_config_is_refused() {
    let d = model_copy("transform");
    edit(&d.join("config.json"), |s| {
        s.replace(
            "\"transform_config\": {}",
            "\"transform_config\": {\"config_groups\": {}}",
        )
    });
    run_eval(&d, &[], &["transform_config"]);
}

#[test]
fn config_not_json() {
    let d = model_copy("config");
    std::fs::write(d.join("config.json"), "{ this is not json").unwrap();
    run_eval(&d, &[], &["config.json", "not valid JSON"]);
}

#[test]
fn missing_tokenizer() {
    let d = model_copy("tokenizer");
    std::fs::remove_file(d.join("tokenizer.json")).unwrap();
    run_eval(&d, &[], &["tokenizer.json", "not found"]);
}

#[test]
fn missing_model_directory() {
    fails_with(
        &["eval", "--model", "/nonexistent/model/dir"],
        &["/nonexistent/model/dir", "model directory not found"],
    );
}

#[test]
fn empty_dataset() {
    let d = model_copy("empty");
    let data = d.join("empty.txt");
    std::fs::write(&data, "").unwrap();
    run_eval(
        &d,
        &["--data", data.to_str().unwrap()],
        &["empty.txt", "empty"],
    );
}

#[test]
fn context_longer_than_the_model_allows() {
    let d = model_copy("ctx");
    run_eval(
        &d,
        &["--ctx", "4096"],
        &["4096", "max_position_embeddings = 512"],
    );
}

#[test]
fn zero_batch_tokens() {
    let d = model_copy("batch-tokens");
    run_eval(
        &d,
        &["--batch-tokens", "0"],
        &["--batch-tokens", "at least 1"],
    );
}

#[test]
fn a_device_listed_twice() {
    let d = model_copy("devices-twice");
    run_eval(
        &d,
        &["--devices", "0,1,0"],
        &["--devices", "device 0 is listed twice"],
    );
}

/// `--dtype f16` is wgpu's one-product mode: on CUDA it is refused, naming CUDA's own 16-bit
/// mode, before any GPU is opened (so on any machine).
#[test]
fn one_product_mode_is_refused_on_cuda() {
    let d = model_copy("f16-cuda");
    let mut a = eval_args(&d);
    a[2] = "cuda".into();
    a.extend(["--dtype".into(), "f16".into()]);
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    fails_with(&refs, &["--dtype f16", "wgpu", "--dtype bf16"]);
}

#[test]
fn zero_stride() {
    let d = model_copy("stride");
    run_eval(&d, &["--stride", "0"], &["--stride"]);
}

/// The reported batch size is one that can occur: with a single window of 128 tokens it is
/// 128, not the CPU backend's default of four windows' worth.
#[test]
fn reported_batch_size_is_capped_by_the_plan() {
    let args = [
        "eval",
        "--backend",
        "cpu",
        "--rows",
        "1",
        "--ctx",
        "128",
        "-q",
    ];
    let report = common::run_json(&args, "batch");
    assert_eq!(report["windows"], 1);
    assert_eq!(report["ctx"], 128);
    assert_eq!(report["batch_tokens"], 128);
}

/// `compare --help` shows the command's long description (memory, placement, statistics), not
/// only the one-line summary `-h` and the command list show.
#[test]
fn compare_long_help_is_shown() {
    let help = |flag: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
            .args(["compare", flag])
            .output()
            .expect("run quantppl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let long = help("--help");
    assert!(
        long.contains("Memory: the base and ONE quantized model"),
        "{long}"
    );
    assert!(!help("-h").contains("Memory:"));
}

/// Every long-running command takes `-q`: `synth` too (scripts pass it to all of them).
#[test]
fn synth_takes_quiet() {
    let out_dir = std::env::temp_dir().join(format!("quantppl-synth-q-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args([
            "synth",
            "--shape",
            "tiny",
            "--scheme",
            "dense-bf16",
            "-q",
            "--out",
        ])
        .arg(&out_dir)
        .output()
        .expect("run quantppl");
    std::fs::remove_dir_all(&out_dir).ok();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A newcomer's path: `synth` then `eval` on its directory, no other flag (issue 56): the
/// synthetic checkpoint carries the bundled tokenizer, and a directory without one names
/// `--tokenizer` in its one-line error.
#[test]
fn synth_then_eval_needs_no_tokenizer_flag() {
    let q = env!("CARGO_BIN_EXE_quantppl");
    let dir = std::env::temp_dir().join(format!("quantppl-synth-eval-{}", std::process::id()));
    let run = |args: &[&str]| Command::new(q).args(args).arg(&dir).output().unwrap();
    let synth = run(&[
        "synth",
        "--shape",
        "tiny",
        "--scheme",
        "w4a16-g128",
        "-q",
        "--out",
    ]);
    assert!(
        synth.status.success(),
        "{}",
        String::from_utf8_lossy(&synth.stderr)
    );
    let eval = run(&["eval", "--backend", "cpu", "--rows", "1", "-q", "--model"]);
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let without = run(&["eval", "--backend", "cpu", "--rows", "1", "-q", "--model"]);
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        eval.status.success(),
        "{}",
        String::from_utf8_lossy(&eval.stderr)
    );
    let report = String::from_utf8_lossy(&eval.stdout);
    assert!(report.contains("PPL"), "{report}");
    let stderr = String::from_utf8_lossy(&without.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!without.status.success());
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("tokenizer.json") && lines[0].contains("--tokenizer"),
        "{stderr}"
    );
}

#[test]
fn fewer_experts_in_config_than_in_the_tensors() {
    let d = moe_copy("fewer");
    edit(&d.join("config.json"), |s| {
        s.replace("\"num_experts\": 8", "\"num_experts\": 7")
    });
    run_eval(&d, &[], &["config.json", "num_experts is 7", "experts.7"]);
}

#[test]
fn more_experts_in_config_than_in_the_tensors() {
    let d = moe_copy("more");
    edit(&d.join("config.json"), |s| {
        s.replace("\"num_experts\": 8", "\"num_experts\": 9")
    });
    // The router has 8 rows where the config promises 9.
    run_eval(&d, &[], &["model.layers.0.mlp.gate.weight", "[9, 256]"]);
}

#[test]
fn more_experts_per_token_than_experts() {
    let d = moe_copy("topk");
    edit(&d.join("config.json"), |s| {
        s.replace("\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9")
    });
    run_eval(&d, &[], &["config.json", "num_experts_per_tok 9", "8"]);
}

#[test]
fn an_expert_outside_its_config_group() {
    let d = moe_copy("scheme");
    // The config leaves one expert dense while its tensors on disk are packed.
    edit(&d.join("config.json"), |s| {
        s.replace(
            "\"ignore\": [",
            "\"ignore\": [\n      \"model.layers.1.mlp.experts.3.up_proj\",",
        )
    });
    run_eval(
        &d,
        &[],
        &[
            "model.layers.1.mlp.experts.3.up_proj",
            "quantized tensors on disk",
        ],
    );
}

#[test]
fn missing_expert_tensor() {
    let d = moe_copy("missing");
    let p = d.join("model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    let key = b"model.layers.2.mlp.experts.5.down_proj.weight_scale";
    let pos = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("tensor in header");
    bytes[pos + key.len() - 1] = b'x';
    std::fs::write(&p, &bytes).unwrap();
    run_eval(
        &d,
        &[],
        &[
            "model.layers.2.mlp.experts.5.down_proj.weight_scale",
            "not found",
        ],
    );
}

/// A copy of one of this repository's native-format fixtures (GPTQ, AWQ).
fn repo_copy(fixture: &str, test: &str) -> PathBuf {
    copy_of(&common::fixture(fixture), &format!("{fixture}-{test}"))
}

/// Rewrites the bytes of tensor `name` in a single-file safetensors checkpoint.
fn patch_tensor(path: &Path, name: &str, f: impl FnOnce(&mut [u8])) {
    let mut bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let offsets = &header[name]["data_offsets"];
    let (a, b) = (
        offsets[0].as_u64().unwrap() as usize,
        offsets[1].as_u64().unwrap() as usize,
    );
    f(&mut bytes[8 + n + a..8 + n + b]);
    std::fs::write(path, &bytes).unwrap();
}

#[test]
fn unknown_quant_method() {
    let d = repo_copy("synth-gptq-v1-act-order", "method");
    edit(&d.join("config.json"), |s| {
        s.replace("\"quant_method\": \"gptq\"", "\"quant_method\": \"hqq\"")
    });
    run_eval(&d, &[], &["quant_method", "`hqq`", "gptq"]);
}

#[test]
fn gptq_bits_outside_its_packing() {
    let d = repo_copy("synth-gptq-v1-act-order", "bits");
    edit(&d.join("config.json"), |s| {
        s.replace("\"bits\": 4,", "\"bits\": 5,")
    });
    run_eval(&d, &[], &["bits", "5"]);
}

#[test]
fn gptq_marlin_checkpoint_format() {
    let d = repo_copy("synth-gptq-v1-act-order", "marlin");
    edit(&d.join("config.json"), |s| {
        s.replace(
            "\"checkpoint_format\": \"gptq\"",
            "\"checkpoint_format\": \"marlin\"",
        )
    });
    run_eval(&d, &[], &["checkpoint_format", "`marlin`"]);
}

#[test]
fn gptq_qweight_inconsistent_with_bits() {
    let d = repo_copy("synth-gptq-v1-act-order", "qweight");
    // 2-bit codes would fill half the words the 4-bit tensors hold.
    edit(&d.join("config.json"), |s| {
        s.replace("\"bits\": 4,", "\"bits\": 2,")
    });
    run_eval(
        &d,
        &[],
        &["model.layers.0.mlp.gate_proj.qweight", "expected shape"],
    );
}

#[test]
fn gptq_group_index_out_of_range() {
    let d = repo_copy("synth-gptq-v1-act-order", "g_idx");
    patch_tensor(
        &d.join("model.safetensors"),
        "model.layers.1.mlp.up_proj.g_idx",
        |b| b[8..12].copy_from_slice(&99i32.to_le_bytes()),
    );
    run_eval(
        &d,
        &[],
        &["model.layers.1.mlp.up_proj.g_idx", "group index 99", "0..4"],
    );
}

#[test]
fn awq_other_version() {
    let d = repo_copy("synth-awq-gemm", "version");
    edit(&d.join("config.json"), |s| {
        s.replace("\"version\": \"gemm\"", "\"version\": \"gemv_fast\"")
    });
    run_eval(&d, &[], &["version", "`gemv_fast`"]);
}

/// A fake Hugging Face hub cache holding the INT4 stories fixture as `org/stories` the way
/// `huggingface_hub` lays it out: files as blobs, a snapshot of symlinks, `refs/main`.
fn fake_hub_cache(test: &str) -> PathBuf {
    let src = common::fixture("stories260K-w4a16-channel");
    let cache = std::env::temp_dir().join(format!("quantppl-hub-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let repo = cache.join("models--org--stories");
    let hash = "0123456789abcdef0123456789abcdef01234567";
    let snapshot = repo.join("snapshots").join(hash);
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), hash).unwrap();
    for (i, entry) in std::fs::read_dir(&src).unwrap().enumerate() {
        let path = entry.unwrap().path();
        let blob = repo.join("blobs").join(format!("blob{i}"));
        std::fs::copy(&path, &blob).unwrap();
        std::os::unix::fs::symlink(&blob, snapshot.join(path.file_name().unwrap())).unwrap();
    }
    cache
}

#[test]
fn model_from_the_hub_cache() {
    let cache = fake_hub_cache("found");
    let hash = "0123456789abcdef0123456789abcdef01234567";
    for id in ["org/stories".to_string(), format!("org/stories@{hash}")] {
        let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
            .args(["inspect", &id])
            .env("HF_HUB_CACHE", &cache)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(hash),
            "{id}: the snapshot is named: {stdout}"
        );
        assert!(stdout.contains("int4 channel"), "{stdout}");
    }
}

#[test]
fn tokenizer_from_the_hub_cache() {
    let cache = fake_hub_cache("tokenizer");
    let model = common::fixture("stories260K-w4a16-channel");
    let mut reports = Vec::new();
    for tokenizer in [
        "org/stories".to_string(),
        model.join("tokenizer.json").display().to_string(),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
            .args([
                "eval",
                "--backend",
                "cpu",
                "-q",
                "--rows",
                "2",
                "--json",
                "-",
            ])
            .args([
                "--model",
                model.to_str().unwrap(),
                "--tokenizer",
                &tokenizer,
            ])
            .env("HF_HUB_CACHE", &cache)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{tokenizer}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        reports.push((v["ppl"].clone(), v["n_tokens"].clone()));
    }
    assert_eq!(reports[0], reports[1]);
    let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args(["eval", "--backend", "cpu", "-q", "--tokenizer", "org/none"])
        .env("HF_HUB_CACHE", &cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("org/none") && stderr.contains("models--org--none"),
        "{stderr}"
    );
}

#[test]
fn model_missing_from_the_hub_cache() {
    let cache = fake_hub_cache("missing");
    let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args(["eval", "--backend", "cpu", "-q", "--model", "org/other@v2"])
        .env("HF_HUB_CACHE", &cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let line = stderr.lines().find(|l| !l.trim().is_empty()).unwrap();
    assert_eq!(
        stderr.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "{stderr}"
    );
    for needle in ["org/other", "`v2`", "models--org--other", "never downloads"] {
        assert!(line.contains(needle), "`{needle}` in: {line}");
    }
}

#[test]
fn a_bad_development_switch_is_one_line_naming_it() {
    // The old per-backend variable names are not settings: each names the one it misread.
    for (value, needle) in [
        ("wgpu-unchecked=all", "wgpu-unchecked=all"),
        ("cuda-experts=both", "cuda-experts=grouped|loop"),
        ("wgpu-tiles=8:8", "TX:TY:BK:BK_PER_STEP:QB"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
            .args(["eval", "--backend", "cpu", "-q", "--rows", "1"])
            .env("QUANTPPL_DEV", value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(!out.status.success(), "{value}");
        assert_eq!(lines.len(), 1, "{value}: {stderr}");
        for n in ["QUANTPPL_DEV", needle] {
            assert!(lines[0].contains(n), "`{n}` in: {}", lines[0]);
        }
    }
}

#[test]
fn model_given_a_file() {
    let d = model_copy("file");
    let file = d.join("config.json");
    fails_with(
        &["eval", "--model", file.to_str().unwrap()],
        &["config.json", "is a file", "directory"],
    );
}

/// Runs quantppl with `args`, asserting success; (stdout, stderr).
fn run_ok(args: &[&str]) -> (Vec<u8>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{args:?}: {stderr}");
    (out.stdout, stderr)
}

#[test]
fn json_on_stdout_is_the_only_thing_there() {
    let dir = std::env::temp_dir().join(format!("quantppl-json-stdout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let partial = |k: usize| dir.join(format!("part{k}.qppl")).display().to_string();
    for k in 1..=2 {
        let shard = format!("{k}/2");
        run_ok(&[
            "eval",
            "--backend",
            "cpu",
            "-q",
            "--rows",
            "3",
            "--shard",
            &shard,
            "--partial",
            &partial(k),
        ]);
    }
    let (p1, p2) = (partial(1), partial(2));
    let model = common::fixture("stories260K-w4a16-channel");
    let model = model.to_str().unwrap();
    // Each subcommand with a word its human report always has.
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["eval", "--backend", "cpu", "--rows", "2"], "PPL"),
        (vec!["compare", "--backend", "cpu", "--rows", "2"], "KLD"),
        (vec!["merge", &p1, &p2], "PPL"),
        (vec!["inspect", model], "bits/weight"),
        (vec!["devices"], "cuda"),
        (vec!["check", "--backend", "cpu"], "checks passed"),
        (
            vec![
                "bench",
                "--backend",
                "cpu",
                "--model",
                model,
                "--ctx",
                "32",
                "--batch",
                "1",
                "--iters",
                "1",
            ],
            "tokens/s",
        ),
    ];
    for (args, word) in cases {
        let with_json = [&args[..], &["--json", "-"]].concat();
        let (stdout, stderr) = run_ok(&with_json);
        let v: serde_json::Value = serde_json::from_slice(&stdout)
            .unwrap_or_else(|e| panic!("{args:?}: stdout is not one JSON document: {e}"));
        assert!(v.is_object(), "{args:?}");
        assert!(
            stderr.contains(word),
            "{args:?}: the human report goes to stderr: {stderr}"
        );
        // -q is taken by every subcommand and leaves the JSON alone.
        let quiet = [&with_json[..], &["-q"]].concat();
        let (stdout, _) = run_ok(&quiet);
        serde_json::from_slice::<serde_json::Value>(&stdout).expect("JSON with -q");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `bench --iters 0` measures one batch, the profiled warm-up (a window too long to run three
/// times): its time is the median and its ops are the profile.
#[test]
fn bench_of_one_batch_reports_the_profiled_warm_up() {
    let model = common::fixture("stories260K-w4a16-channel");
    let model = model.to_str().unwrap();
    let bench = |batch: &'static str, iters: &'static str| -> Vec<&str> {
        let sizes = ["--ctx", "32", "--batch", batch, "--iters", iters];
        [
            &["bench", "--backend", "cpu"][..],
            &sizes,
            &["--model", model],
        ]
        .concat()
    };
    let v = common::run_json(&bench("1", "0"), "bench-once");
    let first = v["first_batch_seconds"].as_f64().unwrap();
    assert_eq!(v["batch_seconds"], serde_json::json!([first]), "{v}");
    assert_eq!(v["median_batch_seconds"].as_f64(), Some(first));
    assert_eq!(v["ops"], v["first_batch_ops"]);
    assert!(!v["ops"].as_array().unwrap().is_empty());
    common::fails_with(&bench("0", "1"), &["--batch"]);
}

#[test]
fn unwritable_outputs_fail_before_the_model_loads() {
    for extra in [
        ["--json", "/nonexistent-dir/report.json"],
        ["--resume", "/nonexistent-dir/run.qppl"],
        ["--markdown", "/nonexistent-dir/card.md"],
        ["--plot", "/nonexistent-dir/ppl.svg"],
        ["--dump-nll", "/nonexistent-dir/nll.jsonl"],
    ] {
        let start = std::time::Instant::now();
        let mut args = vec![
            "eval",
            "--backend",
            "cpu",
            "-q",
            "--model",
            "/nonexistent/model",
        ];
        args.extend(extra);
        fails_with(&args, &["/nonexistent-dir/", "cannot be written"]);
        assert!(
            start.elapsed().as_secs_f64() < 1.0,
            "the issue asks for under a second"
        );
    }
    fails_with(
        &[
            "compare",
            "--backend",
            "cpu",
            "-q",
            "--markdown",
            "/nonexistent-dir/card.md",
        ],
        &["/nonexistent-dir/card.md", "cannot be written"],
    );
}

/// An output naming an input, or two outputs naming one file, is refused before anything is
/// read or written (issue 56, F12: `--json` equal to `--data` overwrote the text).
#[test]
fn an_output_that_names_an_input_or_another_output_is_refused() {
    let dir = std::env::temp_dir().join(format!("quantppl-same-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("text.txt");
    std::fs::write(&data, "the same words again and again\n".repeat(50)).unwrap();
    let (d, report) = (data.to_str().unwrap(), dir.join("report.json"));
    let r = report.to_str().unwrap();
    // The input named another way: through `..`.
    let dotted = dir
        .join("..")
        .join(dir.file_name().unwrap())
        .join("text.txt");
    let base = ["eval", "--backend", "cpu", "-q", "--data", d];
    for (extra, needle) in [
        (vec!["--json", d], "is the input"),
        (vec!["--dump-nll", dotted.to_str().unwrap()], "is the input"),
        (vec!["--markdown", d], "is the input"),
        (vec!["--json", r, "--markdown", r], "two outputs"),
        (vec!["--resume", r, "--json", r], "two outputs"),
    ] {
        let args: Vec<&str> = base.iter().copied().chain(extra).collect();
        fails_with(&args, &[needle]);
    }
    let words = std::fs::read_to_string(&data).unwrap();
    assert!(
        words.starts_with("the same words"),
        "the input was written over"
    );
    assert!(!report.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `inspect`'s human text names things as a person reads them (issue 56: it printed Rust
/// debug text, "rope theta 10000 None", "dtype Bf16").
#[test]
fn inspect_prints_no_debug_text() {
    for dir in [
        "assets/stories260K-w4a16-channel",
        "tests/fixtures/synth-phi3-longrope",
    ] {
        let text = common::succeeds(&["inspect", dir]);
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{dir}/config.json")).unwrap())
                .unwrap();
        let dtype = config["torch_dtype"]
            .as_str()
            .or(config["dtype"].as_str())
            .unwrap();
        assert!(text.contains(&format!("dtype {dtype},")), "{text}");
        for debug in ["None", "Some(", "Bf16", " F32", "{ ", "true", "false"] {
            assert!(!text.contains(debug), "{dir}: {debug:?} in\n{text}");
        }
    }
}

/// `bundled` names the bundled model wherever a model or tokenizer is asked for (issue 56's
/// newcomer list: it worked for `compare --base` only).
#[test]
fn bundled_is_accepted_for_a_model_and_a_tokenizer() {
    let ppl = |extra: &[&str]| {
        let mut args = vec!["eval", "--backend", "cpu", "-q", "--rows", "2"];
        args.extend(extra);
        common::run_json(&args, &format!("bundled-{}", extra.len()))["ppl"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(
        ppl(&["--model", "bundled", "--tokenizer", "bundled"]),
        ppl(&[])
    );
    common::succeeds(&["inspect", "bundled"]);
}
