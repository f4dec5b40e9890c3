//! Damaged run files (`--resume`, `--shard`, `merge`) and base-states files (`--save-base`):
//! a real file of each kind cut at every length and with every byte changed, then read back.
//! A read must end in a one-line error, or in exactly what was written (a run file may drop
//! a torn last line, which is then run again): never a value, a count or a setting that the
//! run did not write.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use quantppl::run::base_states::{States, StatesDtype, StatesHeader, StatesWriter};
use quantppl::run::record;

const BIN: &str = env!("CARGO_BIN_EXE_quantppl");

fn work_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hostile-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every way of damaging `original` tried here: each prefix, and each byte set to another
/// value (its low bit flipped, a newline, a space).
fn damaged(original: &[u8]) -> impl Iterator<Item = (String, Vec<u8>)> + '_ {
    let cuts = (0..original.len()).map(|n| (format!("cut at {n}"), original[..n].to_vec()));
    let flips = (0..original.len()).flat_map(move |i| {
        [original[i] ^ 1, b'\n', b' ']
            .into_iter()
            .filter(move |&b| b != original[i])
            .map(move |b| {
                let mut v = original.to_vec();
                v[i] = b;
                (format!("byte {i} set to {b:#04x}"), v)
            })
    });
    cuts.chain(flips)
}

fn one_line(what: &str, e: &impl std::fmt::Display) {
    let e = e.to_string();
    assert!(!e.is_empty() && !e.contains('\n'), "{what}: error `{e}`");
}

#[test]
fn damaged_run_files_are_refused_or_read_as_written() {
    let dir = work_dir("record");
    let file = dir.join("run.qpr");
    common::write_run_file(&file);
    let original = std::fs::read(&file).unwrap();
    let written = record::read::<f32>(&file).unwrap();
    assert_eq!(written.records.len(), 3);
    let header = serde_json::to_value(&written.header).unwrap();
    let damaged_file = dir.join("damaged.qpr");
    let (mut tried, mut refused, mut partial) = (0, 0, 0);
    for (what, bytes) in damaged(&original) {
        std::fs::write(&damaged_file, &bytes).unwrap();
        tried += 1;
        match record::read::<f32>(&damaged_file) {
            Err(e) => {
                one_line(&what, &e);
                refused += 1;
            }
            Ok(c) => {
                assert_eq!(
                    serde_json::to_value(&c.header).unwrap(),
                    header,
                    "{what}: header"
                );
                for (key, values) in &c.records {
                    let want = &written.records[key];
                    let same = values.len() == want.len()
                        && values
                            .iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{what}: window {key:?} read with other values");
                }
                if c.records.len() < written.records.len() {
                    partial += 1;
                }
            }
        }
    }
    common::tally!(
        "{tried} damaged run files ({} bytes): {refused} refused, {partial} read with their \
         torn last windows dropped, the rest read as written",
        original.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn damaged_base_states_files_are_refused_or_read_as_written() {
    let dir = work_dir("states");
    let file = dir.join("base.states");
    let header = StatesHeader {
        fingerprint: vec![("plan".into(), "3 windows".into())],
        hidden: 8,
        dtype: StatesDtype::F32,
        rows: vec![3, 1, 2],
    };
    let windows: Vec<Vec<f32>> = header
        .rows
        .iter()
        .enumerate()
        .map(|(w, &r)| {
            (0..r * 8)
                .map(|i| (w * 100 + i) as f32 * 0.25 - 3.0)
                .collect()
        })
        .collect();
    let mut writer = StatesWriter::open(&file, header.clone()).unwrap();
    for (w, values) in windows.iter().enumerate() {
        writer.push(w, values.clone()).unwrap();
    }
    writer.finish().unwrap();
    let original = std::fs::read(&file).unwrap();
    let damaged_file = dir.join("damaged.states");
    let (mut tried, mut refused) = (0, 0);
    for (what, bytes) in damaged(&original) {
        std::fs::write(&damaged_file, &bytes).unwrap();
        tried += 1;
        let read = States::open(&damaged_file).and_then(|s| {
            let values = (0..s.header.rows.len())
                .map(|w| s.window(w))
                .collect::<quantppl::Result<Vec<_>>>()?;
            Ok((s.header, values))
        });
        match read {
            Err(e) => {
                one_line(&what, &e);
                refused += 1;
            }
            Ok((h, values)) => {
                assert_eq!(
                    (&h.fingerprint, h.hidden, h.dtype, &h.rows),
                    (
                        &header.fingerprint,
                        header.hidden,
                        header.dtype,
                        &header.rows
                    ),
                    "{what}: header"
                );
                assert_eq!(values, windows, "{what}: values");
            }
        }
    }
    // A well-formed header whose sizes overflow is refused before anything is sized by it.
    let huge = dir.join("huge.states");
    let claims = StatesHeader {
        hidden: 1 << 62,
        rows: vec![4, 4],
        ..header.clone()
    };
    drop(StatesWriter::open(&huge, claims).unwrap());
    let e = States::open(&huge)
        .err()
        .expect("an overflowing header is refused");
    one_line("overflowing header", &e);
    assert!(e.to_string().contains("overflow"), "{e}");

    common::tally!(
        "{tried} damaged base-states files ({} bytes): {refused} refused, the rest read as written",
        original.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A report that cannot be written (a full disk: Linux's `/dev/full`) is a one-line error
/// naming the file; one that can is written whole through a temporary file beside it, which
/// does not stay behind, replacing what was there.
#[test]
fn reports_are_written_whole_or_fail_naming_the_file() {
    let dir = work_dir("reports");
    let (json, md) = (dir.join("report.json"), dir.join("report.md"));
    std::fs::write(&json, "an older report").unwrap();
    let eval = |extra: &[&str]| {
        Command::new(BIN)
            .args([
                "-q",
                "eval",
                "--backend",
                "cpu",
                "--ctx",
                "64",
                "--rows",
                "2",
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = eval(&[
        "--json",
        json.to_str().unwrap(),
        "--markdown",
        md.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(report["ppl"].as_f64().unwrap() > 1.0);
    assert!(std::fs::read_to_string(&md).unwrap().contains("PPL"));
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    if Path::new("/dev/full").exists() {
        let out = eval(&["--json", "/dev/full"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains("/dev/full") && err.contains("No space left"),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
