//! Several devices give the same digits as one: CPU-backend workers stand in for GPUs, with
//! data-parallel replicas and with the layers split into a pipeline, at different batch sizes.

use std::process::Command;

fn eval(extra: &[&str]) -> serde_json::Value {
    let json = std::env::temp_dir().join(format!(
        "quantppl-multi-{}-{}.json",
        std::process::id(),
        extra.join("_").replace(['/', ','], "-")
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args([
            "eval",
            "-q",
            "--backend",
            "cpu",
            "--method",
            "exl3",
            "--ctx",
            "128",
            "--stride",
            "64",
            "--rows",
            "30",
        ])
        .args(extra)
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

#[test]
fn data_and_layer_parallel_runs_match_one_device_digit_for_digit() {
    let one = eval(&["--batch-tokens", "1024"]);
    let runs = [
        eval(&[
            "--devices",
            "0,1,2",
            "--parallel",
            "data",
            "--batch-tokens",
            "256",
        ]),
        eval(&[
            "--devices",
            "0,1,2",
            "--parallel",
            "layers",
            "--batch-tokens",
            "384",
        ]),
        eval(&[
            "--devices",
            "0,1",
            "--parallel",
            "layers",
            "--batch-tokens",
            "128",
        ]),
    ];
    for r in &runs {
        assert!(r["devices"].as_u64().unwrap() > 1);
        for key in [
            "ppl",
            "mean_nll",
            "ppl_stderr",
            "nll_stderr",
            "scored_tokens",
            "windows",
        ] {
            assert_eq!(
                r[key], one[key],
                "{key} differs with {} ({})",
                r["devices"], r["parallel"]
            );
        }
    }
    assert!(
        runs[1]["parallel"]
            .as_str()
            .unwrap()
            .starts_with("layers 0..")
    );
}

#[test]
fn more_devices_than_layers_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args([
            "eval",
            "-q",
            "--backend",
            "cpu",
            "--devices",
            "0,1,2,3,4,5",
            "--parallel",
            "layers",
            "--rows",
            "2",
        ])
        .output()
        .expect("run quantppl");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("6 devices for 5 layers"), "{err}");
}
