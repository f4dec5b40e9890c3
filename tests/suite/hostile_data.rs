//! Damaged data files read as `--data`: JSONL, gzip'd JSONL and parquet files cut short and
//! with bytes changed, text that is not UTF-8. Each read ends in rows (or text) or a one-line
//! error naming the file, never a panic.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};

use quantppl::data::Source;
use quantppl::data::source::load;
use quantppl::rng::Rng;

fn work_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hostile-data");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Tally {
    tried: usize,
    refused: usize,
}

impl Tally {
    fn check(&mut self, path: &Path, bytes: &[u8], field: Option<&str>, what: &str) {
        std::fs::write(path, bytes).unwrap();
        self.tried += 1;
        let source = Source::File(path.to_path_buf());
        let result = std::panic::catch_unwind(|| load(&source, field))
            .unwrap_or_else(|_| panic!("{what}: panicked"));
        if let Err(e) = result {
            let e = e.to_string();
            assert!(!e.is_empty() && !e.contains('\n'), "{what}: error `{e}`");
            self.refused += 1;
        }
    }
}

/// Each prefix and each byte changed (low bit flipped, a newline, a quote) of `original`, or
/// `samples` of them at random where the file is large.
fn damaged(original: &[u8], samples: Option<usize>) -> Vec<(String, Vec<u8>)> {
    let mut rng = Rng::new(23);
    let positions: Vec<usize> = match samples {
        None => (0..original.len()).collect(),
        Some(n) => (0..n)
            .map(|_| rng.below(original.len() as u64) as usize)
            .collect(),
    };
    let mut out = Vec::new();
    for &i in &positions {
        out.push((format!("cut at {i}"), original[..i].to_vec()));
        for b in [original[i] ^ 1, b'\n', b'"'] {
            if b != original[i] {
                let mut v = original.to_vec();
                v[i] = b;
                out.push((format!("byte {i} set to {b:#04x}"), v));
            }
        }
    }
    out
}

#[test]
fn damaged_data_files_end_in_rows_or_an_error() {
    let dir = work_dir();
    let mut t = Tally {
        tried: 0,
        refused: 0,
    };

    let jsonl = concat!(
        "{\"text\": \"The tower is 324 metres tall.\", \"id\": 1}\n",
        "{\"text\": \"\\u00e9t\\u00e9 \\n second line\", \"id\": 2}\n",
        "{\"text\": \"\", \"id\": 3}\n",
        "{\"text\": \"last row\", \"meta\": {\"a\": [1, 2]}}\n",
    )
    .as_bytes();
    let path = dir.join("rows.jsonl");
    t.check(&path, jsonl, Some("text"), "the valid JSONL");
    assert_eq!(t.refused, 0);
    for (what, bytes) in damaged(jsonl, None) {
        t.check(&path, &bytes, Some("text"), &format!("JSONL {what}"));
        t.check(
            &path,
            &bytes,
            Some("id"),
            &format!("JSONL --field id, {what}"),
        );
    }

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(jsonl).unwrap();
    let gz = gz.finish().unwrap();
    let path = dir.join("rows.jsonl.gz");
    for (what, bytes) in damaged(&gz, None) {
        t.check(&path, &bytes, Some("text"), &format!("gzip {what}"));
    }

    let parquet = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/data/penn_treebank/test/0000.parquet"),
    )
    .unwrap();
    let path = dir.join("rows.parquet");
    for (what, bytes) in damaged(&parquet, Some(400)) {
        t.check(&path, &bytes, None, &format!("parquet {what}"));
    }

    let path = dir.join("text.txt");
    for bytes in [&b"\xff\xfe not UTF-8"[..], b"ok \xc3", b"\xed\xa0\x80", b""] {
        t.check(&path, bytes, None, &format!("text {bytes:?}"));
    }

    common::tally!(
        "{} damaged data files: {} refused with a one-line error, the rest read",
        t.tried,
        t.refused
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A gzip bomb as `--data` (issue 56, F13): 96 MiB of zeros in a 96 KiB gzip is refused with
/// one line before it is all in memory; real gzip'd text (ratios of a few) reads.
#[test]
fn a_gzip_bomb_is_refused_before_it_fills_memory() {
    // Not work_dir(): the damaged-files test clears that one concurrently.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hostile-gzip-bomb");
    std::fs::create_dir_all(&dir).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![b'0'; 1 << 20];
    gz.write_all(b"{\"text\": \"").unwrap();
    for _ in 0..96 {
        gz.write_all(&zeros).unwrap();
    }
    gz.write_all(b"\"}\n").unwrap();
    let path = dir.join("bomb.jsonl.gz");
    std::fs::write(&path, gz.finish().unwrap()).unwrap();
    let p = path.to_str().unwrap();
    common::fails_with(
        &[
            "eval",
            "--model",
            "bundled",
            "--data",
            p,
            "--field",
            "text",
            "--backend",
            "cpu",
        ],
        &["bomb.jsonl.gz", "gzip bomb"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/dev/zero` as `--data` (issue 56, F13) ends in one line after a gigabyte, not when memory
/// runs out.
#[test]
fn an_endless_stream_is_refused_after_a_gigabyte() {
    if !Path::new("/dev/zero").exists() {
        return;
    }
    common::fails_with(
        &[
            "eval",
            "--model",
            "bundled",
            "--data",
            "/dev/zero",
            "--backend",
            "cpu",
        ],
        &["/dev/zero", "not a regular file"],
    );
}
