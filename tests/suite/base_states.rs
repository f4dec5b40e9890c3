//! `compare --save-base` then `compare --base-states` through the binary (CPU backend): with
//! f32 states every statistic equals the in-memory compare's on every quantized fixture; bf16
//! states stay within a bound; states of another run, cut off or damaged, are refused in one
//! line; an interrupted save continues to the same bytes.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const WINDOWS: [&str; 8] = [
    "--backend",
    "cpu",
    "-q",
    "--ctx",
    "128",
    "--stride",
    "64",
    "--rows",
];

fn temp(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("quantppl-states-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn quantppl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> Value {
    let out = quantppl(&[args, &["--json", "-"]].concat());
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A compare report without what may differ between an in-memory run and a states run.
fn numbers(mut v: Value) -> Value {
    let o = v.as_object_mut().unwrap();
    for k in [
        "wall_seconds",
        "tokens_per_second",
        "device_times",
        "peak_device_memory_bytes",
        "base_states",
        "parallel",
    ] {
        o.remove(k);
    }
    v
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn f32_states_give_the_in_memory_numbers_on_every_quantized_fixture() {
    let dir = temp("f32");
    for (base, quants) in common::QUANTIZED_WITH_BASE {
        let base = common::fixture(base);
        let quants: Vec<String> = quants
            .iter()
            .map(|q| common::fixture(q).display().to_string())
            .collect();
        let states = dir.join(format!(
            "{}.states",
            base.file_name().unwrap().to_str().unwrap()
        ));
        let mut save = WINDOWS.to_vec();
        save.extend(["6", "--base", s(&base), "--save-base", s(&states)]);
        let saved = ok(&[&["compare"], &save[..]].concat());
        assert_eq!(
            saved["bytes"].as_u64().unwrap(),
            std::fs::metadata(&states).unwrap().len()
        );
        let mut common_args = vec!["compare"];
        common_args.extend(WINDOWS);
        common_args.extend(["6", "--base", s(&base)]);
        common_args.extend(quants.iter().map(String::as_str));
        let in_memory = ok(&common_args);
        let from_states = ok(&[&common_args[..], &["--base-states", s(&states)]].concat());
        assert_eq!(from_states["base_states"]["dtype"], "f32");
        assert_eq!(
            numbers(from_states),
            numbers(in_memory),
            "{}",
            base.display()
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bf16_states_stay_close_and_bad_files_are_refused() {
    let dir = temp("bf16");
    let quant = common::fixture("stories260K-w4a16-channel");
    let (f32_states, bf16_states) = (dir.join("f32.states"), dir.join("bf16.states"));
    let mut args = vec!["compare"];
    args.extend(WINDOWS);
    args.push("8");
    ok(&[&args[..], &["--save-base", s(&f32_states)]].concat());
    ok(&[
        &args[..],
        &["--save-base", s(&bf16_states), "--states-dtype", "bf16"],
    ]
    .concat());
    let with = |states: &Path| {
        ok(&[
            &args[..],
            &["--base", "bundled", s(&quant), "--base-states", s(states)],
        ]
        .concat())
    };
    let (exact, rounded) = (with(&f32_states), with(&bf16_states));
    assert!(
        std::fs::metadata(&bf16_states).unwrap().len()
            < std::fs::metadata(&f32_states).unwrap().len() * 6 / 10
    );
    let kld = |v: &Value| v["models"][0]["kld"]["kld"]["value"].as_f64().unwrap();
    let ppl_q = |v: &Value| v["models"][0]["kld"]["ppl_q"]["value"].as_f64().unwrap();
    let base_ppl = |v: &Value| v["base_ppl"]["value"].as_f64().unwrap();
    // The quantized model's own numbers do not depend on the base.
    assert_eq!(ppl_q(&rounded), ppl_q(&exact));
    // bf16 hidden states (8 bits of mantissa): the base's PPL within 0.1 %, the KLD within 2 %.
    assert!(
        (base_ppl(&rounded) / base_ppl(&exact) - 1.0).abs() < 1e-3,
        "{} vs {}",
        base_ppl(&rounded),
        base_ppl(&exact)
    );
    assert!(
        (kld(&rounded) / kld(&exact) - 1.0).abs() < 2e-2,
        "{} vs {}",
        kld(&rounded),
        kld(&exact)
    );

    let fails = |extra: &[&str], needles: &[&str]| {
        let out = quantppl(&[&args[..], extra].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        for n in needles {
            assert!(lines[0].contains(n), "`{n}` in {}", lines[0]);
        }
    };
    let q = s(&quant);
    // Another plan: the difference is named.
    let mut other = args.clone();
    other[9] = "9";
    let out = quantppl(
        &[
            &other[..],
            &["--base", "bundled", q, "--base-states", s(&f32_states)],
        ]
        .concat(),
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("rows differs: `8` there, `9` here"));
    // Cut off, damaged.
    let bytes = std::fs::read(&f32_states).unwrap();
    let cut = dir.join("cut.states");
    std::fs::write(&cut, &bytes[..bytes.len() - 1000]).unwrap();
    fails(
        &["--base", "bundled", q, "--base-states", s(&cut)],
        &["cut.states", "7 of 8 windows", "ends at byte"],
    );
    let mut damaged = bytes.clone();
    damaged[bytes.len() / 2] ^= 1;
    let bad = dir.join("bad.states");
    std::fs::write(&bad, &damaged).unwrap();
    fails(
        &["--base", "bundled", q, "--base-states", s(&bad)],
        &["bad.states", "fails its checksum", "bytes"],
    );
    // An interrupted save continues to the very same file.
    ok(&[&args[..], &["--save-base", s(&cut)]].concat());
    assert_eq!(std::fs::read(&cut).unwrap(), bytes);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn several_devices_save_and_read_the_same_states() {
    // `--devices 0,1` on the CPU backend: two CPU workers (the multi-device stand-in).
    let dir = temp("devices");
    let quant = common::fixture("stories260K-w4a16-channel");
    let mut args = vec!["compare"];
    args.extend(WINDOWS);
    args.push("6");
    let one = dir.join("one.states");
    ok(&[&args[..], &["--save-base", s(&one)]].concat());
    let in_memory = ok(&[&args[..], &["--base", "bundled", s(&quant)]].concat());
    for parallel in ["data", "layers"] {
        let two = dir.join(format!("{parallel}.states"));
        let split = ["--devices", "0,1", "--parallel", parallel];
        ok(&[&args[..], &split, &["--save-base", s(&two)]].concat());
        assert_eq!(
            std::fs::read(&two).unwrap(),
            std::fs::read(&one).unwrap(),
            "{parallel}"
        );
        let from_states = ok(&[
            &args[..],
            &split,
            &["--base", "bundled", s(&quant), "--base-states", s(&two)],
        ]
        .concat());
        // Where devices share the work the default batch is smaller (a batch each); no
        // digit depends on it.
        let mut from_states = numbers(from_states);
        from_states["devices"] = in_memory["devices"].clone();
        from_states["batch_tokens"] = in_memory["batch_tokens"].clone();
        assert_eq!(from_states, numbers(in_memory.clone()), "{parallel}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
