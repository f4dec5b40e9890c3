//! Data as users keep it, through the binary: named data sets in a fake Hugging Face hub cache
//! (built here the way `huggingface_hub` lays it out), parquet and JSONL rows with --field,
//! standard input, and --dump-nll. Expected tokens come from the raw WikiText file or from
//! tests/fixtures/data/tokens.json (the GPTQ code's rules run with transformers).

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

fn data_fixtures() -> PathBuf {
    common::fixture("data")
}

fn temp(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("quantppl-data-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A hub cache holding `files` (path in the repository, fixture file) of the data set
/// repository `repo`: blobs, a snapshot of symlinks to them, `refs/<revision>`.
pub(crate) fn add_to_cache(cache: &Path, repo: &str, revision: &str, files: &[(&str, PathBuf)]) {
    let folder = cache.join(format!("datasets--{}", repo.replace('/', "--")));
    let hash = format!("{:040x}", files.len() * 7 + revision.len());
    let snapshot = folder.join("snapshots").join(&hash);
    let refs = folder.join("refs").join(revision);
    std::fs::create_dir_all(folder.join("blobs")).unwrap();
    std::fs::create_dir_all(refs.parent().unwrap()).unwrap();
    std::fs::write(&refs, &hash).unwrap();
    for (i, (rel, src)) in files.iter().enumerate() {
        let blob = folder.join("blobs").join(format!("{hash}-{i}"));
        std::fs::copy(src, &blob).unwrap();
        let link = snapshot.join(rel);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&blob, &link).unwrap();
    }
}

fn fake_cache(tag: &str) -> PathBuf {
    let cache = temp(tag);
    let d = data_fixtures();
    let wiki = "wikitext-2-raw-v1/test-00000-of-00001.parquet";
    add_to_cache(
        &cache,
        "Salesforce/wikitext",
        "main",
        &[(wiki, d.join(wiki))],
    );
    let ptb: Vec<(&str, PathBuf)> = [
        "penn_treebank/validation/0000.parquet",
        "penn_treebank/test/0000.parquet",
    ]
    .into_iter()
    .map(|rel| (rel, d.join(rel)))
    .collect();
    add_to_cache(
        &cache,
        "ptb-text-only/ptb_text_only",
        "convert/parquet",
        &ptb,
    );
    let c4 = "en/c4-validation.00000-of-00008.json.gz";
    add_to_cache(&cache, "allenai/c4", "main", &[(c4, d.join(c4))]);
    cache
}

/// Runs `quantppl eval --backend cpu -q` with `args` (and `stdin`), the cache in
/// HF_HUB_CACHE; the JSON report.
fn eval(cache: &Path, args: &[&str], stdin: Option<&[u8]>) -> Value {
    let mut child = Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args(["eval", "--backend", "cpu", "-q", "--json", "-"])
        .args(args)
        .env("HF_HUB_CACHE", cache)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(bytes) = stdin {
        child.stdin.take().unwrap().write_all(bytes).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

/// The numbers that must agree when two sources give the same tokens.
fn digits(v: &Value) -> (String, String, String, String) {
    let s = |k: &str| v[k].to_string();
    (s("ppl"), s("n_tokens"), s("windows"), s("scored_tokens"))
}

fn wiki_raw() -> String {
    std::fs::read_to_string(common::wiki_test_raw()).unwrap()
}

/// The rows of the `wikitext` builder: each line with its "\n"; a blank line as "".
fn wiki_rows() -> Vec<String> {
    wiki_raw()
        .split_inclusive('\n')
        .map(|l| {
            if l.trim().is_empty() {
                String::new()
            } else {
                l.to_string()
            }
        })
        .collect()
}

const GPTQ_128: [&str; 6] = ["--method", "gptq", "--ctx", "128", "--rows", "12"];

#[test]
fn named_wikitext_is_the_raw_file_in_its_row_view() {
    let cache = fake_cache("wikitext");
    for view in ["hf-rows", "hf-rows-nonempty"] {
        let raw = eval(&cache, &[&GPTQ_128[..], &["--text", view]].concat(), None);
        let named = eval(
            &cache,
            &[
                &GPTQ_128[..],
                &["--data", "wikitext-2-raw-v1", "--text", view],
            ]
            .concat(),
            None,
        );
        assert_eq!(digits(&named), digits(&raw), "{view}");
        assert!(
            named["data"]
                .as_str()
                .unwrap()
                .contains("Salesforce/wikitext@")
        );
    }
    // The parquet file itself, rows joined by default.
    let file = data_fixtures().join("wikitext-2-raw-v1/test-00000-of-00001.parquet");
    let parquet = eval(
        &cache,
        &[&GPTQ_128[..], &["--data", file.to_str().unwrap()]].concat(),
        None,
    );
    let raw = eval(
        &cache,
        &[&GPTQ_128[..], &["--text", "hf-rows"]].concat(),
        None,
    );
    assert_eq!(digits(&parquet), digits(&raw));
    assert_eq!(parquet["text"], "hf-rows");
}

#[test]
fn jsonl_fields_gzip_and_stdin() {
    let dir = temp("jsonl");
    let cache = fake_cache("jsonl-cache");
    let lines: String = wiki_rows()
        .iter()
        .map(|r| serde_json::json!({"id": 1, "body": r}).to_string() + "\n")
        .collect();
    let jsonl = dir.join("rows.jsonl");
    std::fs::write(&jsonl, &lines).unwrap();
    let gz = dir.join("rows.jsonl.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(lines.as_bytes()).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();

    let raw = eval(
        &cache,
        &[&GPTQ_128[..], &["--text", "hf-rows"]].concat(),
        None,
    );
    for file in [&jsonl, &gz] {
        let rows = eval(
            &cache,
            &[
                &GPTQ_128[..],
                &["--data", file.to_str().unwrap(), "--field", "body"],
            ]
            .concat(),
            None,
        );
        assert_eq!(digits(&rows), digits(&raw), "{}", file.display());
    }
    let piped = eval(
        &cache,
        &[&GPTQ_128[..], &["--data", "-", "--field", "body"]].concat(),
        Some(lines.as_bytes()),
    );
    assert_eq!(digits(&piped), digits(&raw));
    // Raw text on stdin is the bundled file's default run.
    let bundled = eval(&cache, &GPTQ_128, None);
    let stdin = eval(
        &cache,
        &[&GPTQ_128[..], &["--data", "-"]].concat(),
        Some(wiki_raw().as_bytes()),
    );
    assert_eq!(digits(&stdin), digits(&bundled));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every window's input ids of a --dump-nll file, in window order, after checking the dump
/// against the report: each scored position predicts the next input token (gptq windows),
/// and the NLLs average to the report's mean NLL.
fn dumped_ids(dump: &Path, report: &Value) -> Vec<u32> {
    let mut ids = Vec::new();
    let (mut sum, mut count) = (0.0f64, 0u64);
    for (w, line) in std::fs::read_to_string(dump).unwrap().lines().enumerate() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["window"], w);
        let window: Vec<u32> = serde_json::from_value(v["ids"].clone()).unwrap();
        let positions: Vec<usize> = serde_json::from_value(v["positions"].clone()).unwrap();
        let targets: Vec<u32> = serde_json::from_value(v["targets"].clone()).unwrap();
        let nll: Vec<f64> = serde_json::from_value(v["nll"].clone()).unwrap();
        assert_eq!(positions.len(), nll.len());
        for (&p, &t) in positions.iter().zip(&targets) {
            assert_eq!(window[p + 1], t, "window {w} position {p}");
        }
        sum += nll.iter().sum::<f64>();
        count += nll.len() as u64;
        ids.extend(window);
    }
    assert_eq!(count, report["scored_tokens"].as_u64().unwrap());
    let mean = report["mean_nll"].as_f64().unwrap();
    assert!(
        (sum / count as f64 - mean).abs() < 1e-9 * mean,
        "{sum} / {count} vs {mean}"
    );
    ids
}

#[test]
fn gptq_evaluation_sets_follow_its_code() {
    let cache = fake_cache("gptq-sets");
    let dir = temp("gptq-dumps");
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(data_fixtures().join("tokens.json")).unwrap(),
    )
    .unwrap();
    let ctx = expected["seqlen"].to_string();
    for (name, key) in [
        ("c4", "c4"),
        ("c4-new", "c4_new"),
        ("ptb", "ptb"),
        ("ptb-new", "ptb_new"),
    ] {
        let dump = dir.join(format!("{name}.jsonl"));
        let report = eval(
            &cache,
            &[
                "--data",
                name,
                "--method",
                "gptq",
                "--ctx",
                &ctx,
                "--dump-nll",
                dump.to_str().unwrap(),
            ],
            None,
        );
        let want = common::u32s(&expected[key]);
        let got = dumped_ids(&dump, &report);
        // gptq scores whole windows: the reference's tokens cut to a multiple of ctx.
        let whole = want.len() - want.len() % expected["seqlen"].as_u64().unwrap() as usize;
        assert_eq!(got, want[..whole], "{name}");
        if name.starts_with("c4") {
            assert_eq!(
                report["windows"], 256,
                "{name}: GPTQ's 256 samples by default"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_data_is_one_line_naming_it() {
    let dir = temp("bad");
    let empty_cache = temp("bad-cache");
    let eval_args = |args: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        v.splice(
            0..0,
            [
                "eval".to_string(),
                "--backend".into(),
                "cpu".into(),
                "-q".into(),
            ],
        );
        v
    };
    let run = |args: &[&str], needles: &[&str]| {
        let args = eval_args(args);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
            .args(&refs)
            .env("HF_HUB_CACHE", &empty_cache)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{refs:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{refs:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        for n in needles {
            assert!(lines[0].contains(n), "{refs:?}: `{n}` in {}", lines[0]);
        }
    };
    // A named set missing from the cache: the folder looked in and the command to fetch it.
    run(
        &["--data", "wikitext-103-raw-v1"],
        &[
            "wikitext-103-raw-v1",
            "datasets--Salesforce--wikitext",
            "huggingface-cli download",
        ],
    );
    run(
        &["--data", "no-such-set"],
        &["no-such-set", "no such file", "wikitext-2-raw-v1"],
    );
    // Parquet: a missing column names the ones there; a cut file is unreadable.
    let parquet = data_fixtures().join("wikitext-2-raw-v1/test-00000-of-00001.parquet");
    let p = parquet.to_str().unwrap();
    run(
        &["--data", p, "--field", "sentence"],
        &[
            "test-00000-of-00001.parquet",
            "no column `sentence`",
            "text",
        ],
    );
    let cut = dir.join("cut.parquet");
    let bytes = std::fs::read(&parquet).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    run(
        &["--data", cut.to_str().unwrap()],
        &["cut.parquet", "parquet"],
    );
    // Damaged pages: the row group and the column are named.
    let mut damaged = bytes.clone();
    for i in (1000..bytes.len() / 2).step_by(997) {
        damaged[i] ^= 0x5a;
    }
    let bad = dir.join("damaged.parquet");
    std::fs::write(&bad, &damaged).unwrap();
    run(
        &["--data", bad.to_str().unwrap()],
        &["damaged.parquet", "row group 0", "`text`"],
    );
    // JSONL: a field that is not a string, a missing field.
    let jsonl = dir.join("docs.jsonl");
    std::fs::write(&jsonl, "{\"text\": \"a b\"}\n{\"text\": 3}\n").unwrap();
    let j = jsonl.to_str().unwrap();
    run(
        &["--data", j],
        &["docs.jsonl", "line 2", "`text`", "a number, not a string"],
    );
    run(
        &["--data", j, "--field", "body"],
        &["docs.jsonl", "line 1", "no field `body`"],
    );
    // Options that do not fit the data.
    run(&["--data", p, "--text", "raw"], &["--text raw", "rows"]);
    let txt = dir.join("a.txt");
    std::fs::write(&txt, "some text\n").unwrap();
    run(
        &["--data", txt.to_str().unwrap(), "--field", "x"],
        &["--field", "a.txt"],
    );
    // A shard holds some windows only: clap refuses the pair (its usage error, exit 2).
    let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args([
            "eval",
            "--shard",
            "1/2",
            "--partial",
            "x.qppl",
            "--dump-nll",
            "d.jsonl",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dump-nll"));
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&empty_cache).unwrap();
}

/// The bundled model and text are unpacked into the cache and checked there by content, not
/// size (issue 56, F9): a cached copy changed in place is written again, and the bundled
/// name keeps its numbers.
#[test]
fn a_bundled_asset_changed_in_the_cache_is_unpacked_again() {
    let cache = temp("bundled-content");
    let run = || {
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
            .env("XDG_CACHE_HOME", &cache)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["ppl"].as_f64().unwrap()
    };
    let ppl = run();
    let assets = cache
        .join("quantppl")
        .join(concat!("assets-", env!("CARGO_PKG_VERSION")));
    let text = assets.join("wikitext-2-raw").join("wiki.test.raw");
    let weights = assets
        .join("stories260K-w4a16-channel")
        .join("model.safetensors");
    for path in [&text, &weights] {
        let mut bytes = std::fs::read(path).unwrap();
        // The same length, other bytes past the header: a size check would not see it.
        let n = bytes.len();
        bytes[n / 2..n / 2 + 64].iter_mut().for_each(|b| *b ^= 0x55);
        std::fs::write(path, &bytes).unwrap();
        assert_eq!(run(), ppl, "{} changed in the cache", path.display());
    }
    let _ = std::fs::remove_dir_all(&cache);
}
