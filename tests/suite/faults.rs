//! Faults while quantppl writes, through the real binary on the CPU backend:
//! - a write the kernel refuses part-way: the child runs under a file-size limit
//!   (`RLIMIT_FSIZE`, with `SIGXFSZ` ignored) so that every write past the chosen byte fails
//!   with EFBIG, as on a full disk, at any byte of a run file, a shard's partial file, a
//!   base-states file or a report;
//! - SIGKILL at random moments of `--save-base` and of `merge`.
//!
//! Each fault ends in a one-line error naming the file (or in death, for SIGKILL); what was
//! written is then either whole or refused on read, and running again finishes to exactly the
//! digits (or bytes) of a run that met no fault.
#![cfg(unix)]

use crate::common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use quantppl::rng::Rng;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_quantppl");

fn work_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("faults-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Runs quantppl with every file it writes limited to `limit` bytes, when given.
fn quantppl(args: &[&str], limit: Option<u64>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    if let Some(limit) = limit {
        // SAFETY: only async-signal-safe calls between fork and exec. An ignored SIGXFSZ stays
        // ignored across exec, so a write past the limit fails with EFBIG instead of killing.
        unsafe {
            cmd.pre_exec(move || {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let rl = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &rl) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.output().expect("run quantppl")
}

fn ok(args: &[&str]) {
    let out = quantppl(args, None);
    assert!(
        out.status.success(),
        "quantppl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `args` under a write limit of `limit` bytes; when it fails, the error is one line
/// naming one of `files`. Returns whether it failed.
fn faulted(args: &[&str], limit: u64, files: &[&Path]) -> bool {
    let out = quantppl(args, Some(limit));
    if out.status.success() {
        return false;
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "limit {limit}: one-line error expected: {err}"
    );
    assert!(
        files.iter().any(|f| lines[0].contains(s(f))),
        "limit {limit}: the error names none of {files:?}: {}",
        lines[0]
    );
    true
}

/// A report without the fields that measure time or say how much this process computed.
fn numbers(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("report written");
    let mut v: Value = serde_json::from_str(&text).expect("whole JSON");
    let o = v.as_object_mut().expect("object");
    for k in [
        "wall_seconds",
        "load_seconds",
        "tokens_per_second",
        "tokens_forwarded_here",
        "device_times",
        "peak_device_memory_bytes",
        "base_states",
    ] {
        o.remove(k);
    }
    v
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Limits spread over `0..len`: 0, inside and just after the header line (`head` bytes), then
/// `n` random ones.
fn limits(len: u64, head: u64, n: usize, rng: &mut Rng) -> Vec<u64> {
    let mut v = vec![0, 1, head / 2, head - 1, head, head + 1];
    v.extend((0..n).map(|_| rng.below(len)));
    v
}

const EVAL: [&str; 12] = [
    "eval",
    "--backend",
    "cpu",
    "--method",
    "llamacpp",
    "--ctx",
    "128",
    "--rows",
    "12",
    "--batch-tokens",
    "256",
    "-q",
];

#[test]
fn a_run_file_write_failing_at_any_byte_resumes_to_the_same_digits() {
    let dir = work_dir("run-file");
    let reference = dir.join("reference.json");
    let full = dir.join("full.qppl");
    ok(&[&EVAL[..], &["--resume", s(&full), "--json", s(&reference)]].concat());
    let len = size(&full);
    let head = std::fs::read(&full)
        .unwrap()
        .iter()
        .position(|&b| b == b'\n')
        .unwrap() as u64;

    let (file, out) = (dir.join("run.qppl"), dir.join("out.json"));
    let args = [&EVAL[..], &["--resume", s(&file), "--json", s(&out)]].concat();
    let mut rng = Rng::new(0xfa17_2026_1125);
    let mut failed = 0;
    for limit in limits(len, head + 1, 24, &mut rng) {
        let _ = std::fs::remove_file(&file);
        let _ = std::fs::remove_file(&out);
        assert!(faulted(&args, limit, &[&file]), "limit {limit} of {len}");
        assert!(size(&file) <= limit);
        assert!(!out.exists(), "a report after a failed run");
        failed += 1;
        ok(&args);
        assert_eq!(numbers(&out), numbers(&reference), "limit {limit}");
    }
    // Faults one after another, each run resuming where the last one failed.
    let _ = std::fs::remove_file(&file);
    let mut limit = 0;
    while limit < len {
        limit += rng.range(1, len / 6);
        if faulted(&args, limit, &[&file]) {
            failed += 1;
        }
    }
    ok(&args);
    assert_eq!(numbers(&out), numbers(&reference));
    common::tally!("run file: {failed} writes failed part-way, each resumed to the same digits");
}

#[test]
fn a_failed_report_write_names_the_file_and_leaves_the_previous_report_whole() {
    let dir = work_dir("report");
    let (file, out, md) = (
        dir.join("run.qppl"),
        dir.join("out.json"),
        dir.join("out.md"),
    );
    let args = [
        &EVAL[..],
        &[
            "--resume",
            s(&file),
            "--json",
            s(&out),
            "--markdown",
            s(&md),
        ],
    ]
    .concat();
    ok(&args);
    let (json, markdown) = (std::fs::read(&out).unwrap(), std::fs::read(&md).unwrap());
    // Every window is recorded: only the reports are written, and fail at every 50th byte.
    let smallest = json.len().min(markdown.len()) as u64;
    for limit in (0..smallest).step_by(50) {
        assert!(faulted(&args, limit, &[&out, &md]), "limit {limit}");
        assert_eq!(std::fs::read(&out).unwrap(), json, "limit {limit}");
        assert_eq!(std::fs::read(&md).unwrap(), markdown, "limit {limit}");
    }
    let strays: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(strays.is_empty(), "temporary files left: {strays:?}");
}

#[test]
fn a_partial_file_write_failing_part_way_merges_to_the_same_digits() {
    let dir = work_dir("partial");
    let reference = dir.join("reference.json");
    ok(&[&EVAL[..], &["--json", s(&reference)]].concat());
    let parts: Vec<PathBuf> = (1..=2).map(|k| dir.join(format!("part-{k}"))).collect();
    ok(&[&EVAL[..], &["--shard", "1/2", "--partial", s(&parts[0])]].concat());
    let second = [&EVAL[..], &["--shard", "2/2", "--partial", s(&parts[1])]].concat();
    let mut rng = Rng::new(0x9a27);
    let (mut limit, mut failed) = (0, 0);
    while faulted(&second, limit, &[&parts[1]]) {
        failed += 1;
        // A partial cut off part-way is refused by merge, naming it.
        let out = quantppl(&["merge", s(&parts[0]), s(&parts[1])], None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(s(&parts[1])), "{err}");
        limit += rng.range(1, 400);
    }
    assert!(
        failed >= 5,
        "only {failed} faults before the shard finished"
    );
    let merged = dir.join("merged.json");
    ok(&["merge", s(&parts[0]), s(&parts[1]), "--json", s(&merged)]);
    assert_eq!(numbers(&merged), numbers(&reference));
    common::tally!("partial file: {failed} writes failed part-way, merged to the same digits");
}

const SAVE: [&str; 10] = [
    "compare",
    "--backend",
    "cpu",
    "-q",
    "--ctx",
    "128",
    "--stride",
    "64",
    "--rows",
    "6",
];

#[test]
fn a_base_states_write_failing_at_any_byte_continues_to_the_same_bytes() {
    let dir = work_dir("states-fault");
    let full = dir.join("full.states");
    ok(&[&SAVE[..], &["--save-base", s(&full)]].concat());
    let bytes = std::fs::read(&full).unwrap();
    let head = bytes.iter().position(|&b| b == b'\n').unwrap() as u64;
    let file = dir.join("run.states");
    let args = [&SAVE[..], &["--save-base", s(&file)]].concat();
    let mut rng = Rng::new(0xba5e);
    let mut failed = 0;
    for limit in limits(bytes.len() as u64, head + 1, 12, &mut rng) {
        let _ = std::fs::remove_file(&file);
        assert!(faulted(&args, limit, &[&file]), "limit {limit}");
        failed += 1;
        ok(&args);
        assert_eq!(std::fs::read(&file).unwrap(), bytes, "limit {limit}");
    }
    common::tally!(
        "base states: {failed} writes failed part-way, each continued to the same bytes"
    );
}

/// Kills `args` after a random delay below `span`; returns whether it was still running.
fn kill_at_random(args: &[&str], span: Duration, rng: &mut Rng) -> bool {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn quantppl");
    let at = Instant::now() + span.mul_f64(rng.unit());
    while Instant::now() < at {
        if child.try_wait().expect("try_wait").is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let running = child.try_wait().expect("try_wait").is_none();
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    running
}

#[test]
fn a_base_states_save_killed_anywhere_is_refused_or_whole_and_continues() {
    let dir = work_dir("states-kill");
    let quant = quantppl::assets::default_model_dir().expect("bundled model");
    let full = dir.join("full.states");
    let t = Instant::now();
    ok(&[&SAVE[..], &["--save-base", s(&full)]].concat());
    let span = t.elapsed();
    let bytes = std::fs::read(&full).unwrap();
    let scored = dir.join("scored.json");
    let read_back = |states: &Path| {
        let _ = std::fs::remove_file(&scored);
        quantppl(
            &[
                &SAVE[..],
                &["--base", "bundled", s(&quant), "--base-states", s(states)],
                &["--json", s(&scored)],
            ]
            .concat(),
            None,
        )
    };
    assert!(read_back(&full).status.success());
    let expected = numbers(&scored);

    let file = dir.join("run.states");
    let args = [&SAVE[..], &["--save-base", s(&file)]].concat();
    let mut rng = Rng::new(0x6111);
    let (mut kills, mut refused) = (0, 0);
    // Attempts run until enough kills land: a loaded machine makes the measured span a poor
    // guide to a later run's, and a run that finished before its kill proves nothing.
    for _ in 0..40 {
        if kills == 6 {
            break;
        }
        let _ = std::fs::remove_file(&file);
        if !kill_at_random(&args, span, &mut rng) {
            continue;
        }
        kills += 1;
        let out = read_back(&file);
        if out.status.success() {
            assert_eq!(numbers(&scored), expected);
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(err.trim().lines().count(), 1, "{err}");
            assert!(err.contains(s(&file)), "{err}");
            refused += 1;
        }
        ok(&args);
        assert_eq!(std::fs::read(&file).unwrap(), bytes);
    }
    assert!(kills == 6, "only {kills} of 40 kills landed");
    common::tally!("base states: {kills} saves killed, {refused} refused on read, all continued");
}

#[test]
fn a_merge_killed_anywhere_leaves_no_half_report() {
    let dir = work_dir("merge-kill");
    let parts: Vec<PathBuf> = (1..=3).map(|k| dir.join(format!("part-{k}"))).collect();
    for (k, p) in parts.iter().enumerate() {
        let spec = format!("{}/3", k + 1);
        ok(&[&EVAL[..], &["--shard", &spec, "--partial", s(p)]].concat());
    }
    let (json, md) = (dir.join("merged.json"), dir.join("merged.md"));
    let args = [
        "merge",
        s(&parts[0]),
        s(&parts[1]),
        s(&parts[2]),
        "--json",
        s(&json),
        "--markdown",
        s(&md),
    ];
    let t = Instant::now();
    ok(&args);
    let span = t.elapsed();
    let (whole_json, whole_md) = (std::fs::read(&json).unwrap(), std::fs::read(&md).unwrap());
    let mut rng = Rng::new(0x3e76e);
    let mut kills = 0;
    // As above: attempt until enough kills land rather than counting on the span holding.
    for _ in 0..200 {
        if kills == 12 {
            break;
        }
        let _ = std::fs::remove_file(&json);
        let _ = std::fs::remove_file(&md);
        if kill_at_random(&args, span, &mut rng) {
            kills += 1;
        }
        for (path, whole) in [(&json, &whole_json), (&md, &whole_md)] {
            if let Ok(got) = std::fs::read(path) {
                assert_eq!(&got, whole, "{}", path.display());
            }
        }
    }
    assert!(kills == 12, "only {kills} of 200 kills landed");
    common::tally!("merge: {kills} runs killed, no half report left");
}
