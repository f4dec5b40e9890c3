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
    obj.remove("tokens_forwarded_here");
    obj.remove("device_times");
    v
}

/// Completed window records in a record file (lines after the header, placement lines aside).
fn records(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|text| {
            text.split_inclusive('\n')
                .skip(1)
                .filter(|l| l.ends_with('\n') && !l.starts_with("placement "))
                .count()
        })
        .unwrap_or(0)
}

/// Ctrl-C stops a run after the window it is recording, with one line saying how many
/// windows the run file kept and that the same command goes on (exit status 130); the same
/// command then finishes the run as an uninterrupted one would. Without a run file the line
/// says nothing was kept.
#[test]
fn ctrl_c_says_what_the_run_file_kept() {
    let dir = work_dir("ctrl-c");
    let file = dir.join("run.qppl");
    // Without a file nothing shows the run's progress: its run is made long enough (20,000
    // windows) that Ctrl-C after a moment's run always lands inside it.
    let long: Vec<&str> = WORKLOAD
        .iter()
        .map(|&a| if a == "300" { "20000" } else { a })
        .collect();
    let interrupt = |resume: Option<&Path>| {
        let child = Command::new(BIN)
            .args(if resume.is_some() {
                &WORKLOAD[..]
            } else {
                &long
            })
            .args(
                resume
                    .map(|f| ["--resume", f.to_str().unwrap()])
                    .into_iter()
                    .flatten(),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn quantppl");
        // Once windows are being recorded (or, without a file, after a moment's run).
        let deadline = Instant::now() + Duration::from_secs(60);
        match resume {
            Some(f) => {
                while records(f) < 3 {
                    assert!(Instant::now() < deadline, "no progress in the record file");
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            None => std::thread::sleep(Duration::from_millis(1500)),
        }
        // SAFETY: signalling the child this test spawned and has not reaped.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
        let out = child.wait_with_output().expect("wait");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = interrupt(Some(&file));
    assert_eq!(code, Some(130), "{stderr}");
    let kept = records(&file);
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
    for needle in [
        "interrupted by Ctrl-C",
        &format!("{kept} finished windows"),
        file.to_str().unwrap(),
        "same command",
    ] {
        assert!(last.contains(needle), "`{needle}` in: {stderr}");
    }
    assert!(kept < 300, "the run finished before Ctrl-C");
    let mut args = WORKLOAD.to_vec();
    args.extend(["--resume", file.to_str().unwrap()]);
    ok(&args);
    assert_eq!(records(&file), 300);

    let (code, stderr) = interrupt(None);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        stderr.contains("nothing was kept") && stderr.contains("--resume"),
        "{stderr}"
    );
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
    let mut rng = quantppl::rng::Rng::new(0x5eed_2026_1121);
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
    let done_before = records(&file);
    let mut args = WORKLOAD.to_vec();
    args.extend(["--resume", file.to_str().unwrap()]);
    args.extend(["--json", out.to_str().unwrap()]);
    ok(&args);
    assert_eq!(records(&file), 300);
    assert_eq!(without_timings(&out), without_timings(&reference));
    // Its speed counts only the windows it computed (each 128 tokens long).
    let resumed: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(
        resumed["tokens_forwarded_here"],
        (300 - done_before) as u64 * 128
    );
    assert_eq!(resumed["tokens_forwarded_total"], 300 * 128);
    let eval_seconds =
        resumed["wall_seconds"].as_f64().unwrap() - resumed["load_seconds"].as_f64().unwrap();
    let speed = resumed["tokens_per_second"].as_f64().unwrap();
    assert!((speed * eval_seconds - ((300 - done_before) * 128) as f64).abs() < 1.0);

    // The same file with other settings is refused, naming the difference.
    let mut args = WORKLOAD.to_vec();
    args[6] = "64";
    args.extend(["--resume", file.to_str().unwrap()]);
    fails_with(&args, "ctx differs: `128` there, `64` here");

    // A file another process holds is refused before it is read (issue 56, F15): read first,
    // it was named another run's above, and a run finishing between the read and the lock
    // lost the records it appended to the cut that followed.
    use std::os::fd::AsRawFd;
    let held = std::fs::File::open(&file).unwrap();
    // SAFETY: flock on a descriptor this test owns; released when it is dropped.
    let rc = unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(rc, 0);
    fails_with(&args, "in use by another quantppl process");
    drop(held);
    fails_with(&args, "ctx differs");
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

/// The bundled model's decoder layer count, from its config.json.
fn bundled_layers() -> usize {
    let dir = quantppl::assets::default_model_dir().expect("bundled model");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).expect("config"))
            .expect("config.json");
    config["num_hidden_layers"]
        .as_u64()
        .expect("num_hidden_layers") as usize
}

/// Asserts that `label` is `layers a..b, b..c, ...`: `devices` contiguous non-empty ranges
/// covering every layer of the bundled model.
fn assert_layer_split(label: &str, devices: usize) {
    let ranges: Vec<(usize, usize)> = label
        .strip_prefix("layers ")
        .unwrap_or_else(|| panic!("`{label}` is not a layer split"))
        .split(", ")
        .map(|r| {
            let (a, b) = r.split_once("..").expect("a..b");
            (a.parse().expect("start"), b.parse().expect("end"))
        })
        .collect();
    assert_eq!(ranges.len(), devices, "{label}");
    assert_eq!(ranges[0].0, 0, "{label}");
    assert_eq!(ranges[devices - 1].1, bundled_layers(), "{label}");
    assert!(
        ranges.windows(2).all(|p| p[0].1 == p[1].0) && ranges.iter().all(|r| r.0 < r.1),
        "{label}"
    );
}

fn parallel_of(path: &Path) -> String {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("json written")).expect("json");
    v["parallel"].as_str().expect("parallel").to_string()
}

/// `parallel` names the placements that computed the windows, whichever process reports
/// them: a resumed run that had nothing left to do, a run resumed on other devices, and a
/// merge of shards run with different placements.
#[test]
fn resumed_and_merged_reports_name_the_placements_that_computed_the_windows() {
    let dir = work_dir("placement");
    let s = |p: &Path| p.display().to_string();
    let base = [
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
    let data = ["--devices", "0,1", "--parallel", "data"];
    let layers = ["--devices", "0,1,2", "--parallel", "layers"];
    let run = |placement: &[&str], extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend(placement);
        args.extend(extra);
        ok(&args);
    };

    let file = dir.join("run.qppl");
    let first = dir.join("first.json");
    run(&data, &["--resume", &s(&file), "--json", &s(&first)]);
    assert_eq!(parallel_of(&first), "data");
    // Everything is recorded: these runs compute nothing, whatever devices they are given.
    for (i, placement) in [data, layers].iter().enumerate() {
        let again = dir.join(format!("again-{i}.json"));
        run(placement, &["--resume", &s(&file), "--json", &s(&again)]);
        assert_eq!(parallel_of(&again), "data", "resumed with {placement:?}");
    }
    // Such a run forwarded no token: its speed is not reported as 0 tokens/s.
    let file_arg = s(&file);
    let mut args = base.to_vec();
    args.extend(["--resume", &file_arg]);
    let out = quantppl(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("not measured (every window was read from the run file)"),
        "{text}"
    );

    // The header, the placement line and 5 of the 12 windows: a run cut off early, resumed
    // with the layers split over three devices.
    let text = std::fs::read_to_string(&file).expect("record file");
    let kept: String = text.split_inclusive('\n').take(2 + 5).collect();
    std::fs::write(&file, kept).expect("cut the record file");
    let mixed = dir.join("mixed.json");
    run(&layers, &["--resume", &s(&file), "--json", &s(&mixed)]);
    let label = parallel_of(&mixed);
    let (before, after) = label.split_once("; ").expect("two placements");
    assert_eq!(before, "data");
    assert_layer_split(after, 3);

    let parts: Vec<String> = (1..=2)
        .map(|k| s(&dir.join(format!("part-{k}.qppl"))))
        .collect();
    run(&data, &["--shard", "1/2", "--partial", &parts[0]]);
    run(&layers, &["--shard", "2/2", "--partial", &parts[1]]);
    for order in [[&parts[0], &parts[1]], [&parts[1], &parts[0]]] {
        let merged = dir.join("merged.json");
        ok(&["merge", order[0], order[1], "--json", &s(&merged)]);
        let label = parallel_of(&merged);
        let (shard1, shard2) = label.split_once("; ").expect("two placements");
        assert_eq!(shard1, "data", "merge {order:?}");
        assert_layer_split(shard2, 3);
    }
}

/// `--shard auto` in a simulated Slurm array (ids 4..6) and a Kubernetes Indexed Job (0..2):
/// each merges to the single process's digits.
#[test]
fn scheduler_arrays_merged_equal_one_run() {
    let dir = work_dir("arrays");
    let base = [
        "eval",
        "--backend",
        "cpu",
        "--method",
        "llamacpp",
        "--ctx",
        "128",
        "--rows",
        "30",
        "-q",
    ];
    let reference = dir.join("reference.json");
    let mut args = base.to_vec();
    args.extend(["--json", reference.to_str().unwrap()]);
    ok(&args);
    let slurm = |i: usize| {
        vec![
            ("SLURM_ARRAY_TASK_ID", (4 + i).to_string()),
            ("SLURM_ARRAY_TASK_MIN", "4".to_string()),
            ("SLURM_ARRAY_TASK_COUNT", "3".to_string()),
        ]
    };
    let kubernetes = |i: usize| {
        vec![
            ("JOB_COMPLETION_INDEX", i.to_string()),
            ("JOB_COMPLETIONS", "3".to_string()),
        ]
    };
    for (name, env) in [
        (
            "slurm",
            &slurm as &dyn Fn(usize) -> Vec<(&'static str, String)>,
        ),
        ("k8s", &kubernetes),
    ] {
        let parts: Vec<String> = (0..3)
            .map(|i| dir.join(format!("{name}-{i}.qppl")).display().to_string())
            .collect();
        for (i, p) in parts.iter().enumerate() {
            let mut args = base.to_vec();
            args.extend(["--shard", "auto", "--partial", p]);
            let out = Command::new(BIN)
                .args(&args)
                .env_remove("SLURM_ARRAY_TASK_ID")
                .env_remove("JOB_COMPLETION_INDEX")
                .envs(env(i))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let merged = dir.join(format!("{name}.json"));
        let mut args = vec!["merge"];
        args.extend(parts.iter().map(String::as_str));
        args.extend(["--json", merged.to_str().unwrap()]);
        ok(&args);
        assert_eq!(
            without_timings(&merged),
            without_timings(&reference),
            "{name}"
        );
    }
    let mut args = base.to_vec();
    let p = dir.join("none.qppl").display().to_string();
    args.extend(["--shard", "auto", "--partial", &p]);
    let out = Command::new(BIN)
        .args(&args)
        .env_remove("SLURM_ARRAY_TASK_ID")
        .env_remove("JOB_COMPLETION_INDEX")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("SLURM_ARRAY_TASK_ID"),
        "{stderr}"
    );
}

/// A run file of the other command is named as such, not called damaged (issue 56's
/// newcomer list: an eval run file given to `compare` was "corrupt").
#[test]
fn a_run_file_of_the_other_kind_is_named_so() {
    let dir = std::env::temp_dir().join(format!("quantppl-kinds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("eval.qppl");
    let f = file.to_str().unwrap();
    let run = |cmd: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_quantppl"))
            .args([cmd, "--backend", "cpu", "-q", "--rows", "2", "--resume", f])
            .output()
            .unwrap()
    };
    assert!(run("eval").status.success());
    crate::common::fails_with(
        &[
            "compare",
            "--backend",
            "cpu",
            "-q",
            "--rows",
            "2",
            "--resume",
            f,
        ],
        &["run file of `quantppl eval`", "not of `quantppl compare`"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}
