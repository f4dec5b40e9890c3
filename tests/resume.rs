//! `--resume` and `--shard`/`merge` through the real binary: a run killed with SIGKILL at
//! random points and restarted, and a run split into shards and merged, must report exactly
//! what an uninterrupted run reports (every JSON field but the timings).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_quantppl");

fn work_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("resume-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Small xorshift generator: reproducible kill points without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

fn quantppl(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().expect("run quantppl")
}

fn ok(args: &[&str]) {
    let out = quantppl(args);
    assert!(
        out.status.success(),
        "quantppl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn fails_with(args: &[&str], needle: &str) {
    let out = quantppl(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "quantppl {args:?} should fail");
    assert!(err.contains(needle), "expected `{needle}` in: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one-line error: {err}");
}

/// The report without the fields that measure time.
fn without_timings(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("json written");
    let mut v: Value = serde_json::from_str(&text).expect("json");
    let obj = v.as_object_mut().expect("object");
    obj.remove("wall_seconds");
    obj.remove("load_seconds");
    obj.remove("tokens_per_second");
    v
}

/// Completed records in a record file (lines after the header).
fn records(path: &Path) -> usize {
    std::fs::read(path)
        .map(|b| b.iter().filter(|&&c| c == b'\n').count().saturating_sub(1))
        .unwrap_or(0)
}

const WORKLOAD: [&str; 14] = [
    "eval",
    "--backend",
    "cpu",
    "--method",
    "exl3",
    "--ctx",
    "128",
    "--stride",
    "32",
    "--rows",
    "300",
    "--batch-tokens",
    "256",
    "-q",
];

#[test]
fn killed_and_resumed_run_equals_an_uninterrupted_one() {
    let dir = work_dir("kill");
    let reference = dir.join("reference.json");
    let mut args = WORKLOAD.to_vec();
    args.extend(["--json", reference.to_str().unwrap()]);
    ok(&args);

    let file = dir.join("run.qppl");
    let out = dir.join("resumed.json");
    let mut rng = Rng(0x5eed_2026_1121);
    let mut kills = 0;
    for _ in 0..5 {
        let before = records(&file);
        let mut child = Command::new(BIN)
            .args(WORKLOAD)
            .args(["--resume", file.to_str().unwrap()])
            .args(["--json", out.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn quantppl");
        // Let it write a few more records, then kill it wherever it is.
        let wait_for = rng.range(2, 25) as usize;
        let extra = Duration::from_millis(rng.range(0, 40));
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut finished = false;
        while records(&file) < before + wait_for {
            if child.try_wait().expect("try_wait").is_some() {
                finished = true;
                break;
            }
            assert!(Instant::now() < deadline, "no progress in the record file");
            std::thread::sleep(Duration::from_millis(5));
        }
        if finished {
            break;
        }
        std::thread::sleep(extra);
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        kills += 1;
    }
    assert!(
        kills >= 3,
        "only {kills} kills landed before the run finished"
    );
    let _ = std::fs::remove_file(&out);
    let mut args = WORKLOAD.to_vec();
    args.extend(["--resume", file.to_str().unwrap()]);
    args.extend(["--json", out.to_str().unwrap()]);
    ok(&args);
    assert_eq!(records(&file), 300);
    assert_eq!(without_timings(&out), without_timings(&reference));

    // The same file with other settings is refused, naming the difference.
    let mut args = WORKLOAD.to_vec();
    args[6] = "64";
    args.extend(["--resume", file.to_str().unwrap()]);
    fails_with(&args, "ctx differs: `128` there, `64` here");
}

#[test]
fn three_shards_merged_equal_one_run() {
    let dir = work_dir("shards");
    let base = [
        "eval",
        "--backend",
        "cpu",
        "--method",
        "llamacpp",
        "--ctx",
        "128",
        "--rows",
        "40",
        "--batch-tokens",
        "256",
        "-q",
    ];
    let reference = dir.join("reference.json");
    let mut args = base.to_vec();
    args.extend(["--json", reference.to_str().unwrap()]);
    ok(&args);
    let parts: Vec<String> = (1..=3)
        .map(|k| dir.join(format!("part-{k}.qppl")).display().to_string())
        .collect();
    for (k, p) in parts.iter().enumerate() {
        let shard = format!("{}/3", k + 1);
        let mut args = base.to_vec();
        args.extend(["--shard", &shard, "--partial", p]);
        ok(&args);
    }
    let merged = dir.join("merged.json");
    ok(&[
        "merge",
        &parts[2],
        &parts[0],
        &parts[1],
        "--json",
        merged.to_str().unwrap(),
    ]);
    assert_eq!(without_timings(&merged), without_timings(&reference));

    fails_with(&["merge", &parts[0], &parts[2]], "shard 2/3 missing");
    fails_with(
        &["merge", &parts[0], &parts[0], &parts[1]],
        "are both shard 1/3",
    );
    let other = dir.join("other-2.qppl").display().to_string();
    let mut args = base.to_vec();
    args[6] = "96";
    args.extend(["--shard", "2/3", "--partial", &other]);
    ok(&args);
    fails_with(
        &["merge", &parts[0], &other, &parts[2]],
        "come from different runs: ctx differs: `128` there, `96` here",
    );
}
