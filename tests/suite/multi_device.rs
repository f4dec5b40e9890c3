//! Several devices give the same digits as one, for `eval` and `compare`: CPU-backend workers
//! stand in for GPUs, with data-parallel replicas and with the layers split into a pipeline, at
//! different batch sizes.

use crate::common;

use std::process::Command;

fn eval(extra: &[&str]) -> serde_json::Value {
    run("eval", extra)
}

/// `command` (`eval`, or `compare` of the bundled INT4 model with its dense base) on the CPU
/// over 30 exl3 rows of 128 tokens, with `extra` options; its JSON report.
fn run(command: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        command,
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
    ];
    args.extend_from_slice(extra);
    let tag = format!(
        "multi-{command}-{}",
        extra.join("_").replace(['/', ','], "-")
    );
    common::run_json(&args, &tag)
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
    // Each device's time: replicas share the batches out, pipeline stages each see them all
    // (every window is 128 tokens long).
    let windows = one["windows"].as_u64().unwrap();
    for r in &runs {
        let times = r["device_times"].as_array().unwrap();
        assert_eq!(times.len() as u64, r["devices"].as_u64().unwrap());
        let batches = windows.div_ceil(r["batch_tokens"].as_u64().unwrap() / 128);
        let counts: Vec<u64> = times
            .iter()
            .map(|t| t["batches"].as_u64().unwrap())
            .collect();
        if r["parallel"] == "data" {
            assert_eq!(counts.iter().sum::<u64>(), batches);
        } else {
            assert!(
                counts.iter().all(|&c| c == batches),
                "{counts:?} of {batches}"
            );
        }
        for t in times {
            let (all, first) = (
                t["seconds"].as_f64().unwrap(),
                t["first_batch_seconds"].as_f64().unwrap(),
            );
            // A replica that started after the others had taken every batch ran none.
            let ran = t["batches"].as_u64().unwrap() > 0;
            assert!((first > 0.0) == ran && first <= all, "{t}");
        }
    }
}

/// `compare` places its two models as `eval` places one: replicas, or both split across the
/// devices and pipelined side by side, with the same KL divergence digits as one device.
#[test]
fn compare_on_several_devices_matches_one_device_digit_for_digit() {
    let one = run("compare", &["--batch-tokens", "1024"]);
    assert_eq!(one["parallel"], "single");
    let runs = [
        (
            "data",
            3,
            run(
                "compare",
                &[
                    "--devices",
                    "0,1,2",
                    "--parallel",
                    "data",
                    "--batch-tokens",
                    "256",
                ],
            ),
        ),
        (
            "layers",
            3,
            run(
                "compare",
                &[
                    "--devices",
                    "0,1,2",
                    "--parallel",
                    "layers",
                    "--batch-tokens",
                    "384",
                ],
            ),
        ),
        (
            "layers",
            2,
            run(
                "compare",
                &[
                    "--devices",
                    "0,1",
                    "--parallel",
                    "layers",
                    "--batch-tokens",
                    "128",
                ],
            ),
        ),
    ];
    for (parallel, devices, r) in &runs {
        let label = r["parallel"].as_str().unwrap();
        if *parallel == "layers" {
            // One range per device, the first holding the embedding.
            assert!(label.starts_with("layers 0.."), "{label}");
            assert_eq!(label.split(", ").count(), *devices, "{label}");
        } else {
            assert_eq!(label, *parallel);
        }
        for key in ["models", "base_ppl", "scored_tokens", "windows"] {
            assert_eq!(
                r[key], one[key],
                "{key} differs with {devices} devices ({label})"
            );
        }
    }
}

#[test]
fn more_devices_than_layers_is_refused() {
    for command in ["eval", "compare"] {
        let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
            .args([
                command,
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
        assert!(!out.status.success(), "{command} ran on 6 devices");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("6 devices for 5 layers"), "{command}: {err}");
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{command}: one-line error: {err}"
        );
    }
}

mod failure {
    use quantppl::backend::cpu::CpuBackend;
    use quantppl::checkpoint::Checkpoint;
    use quantppl::model::forward::split_layers;
    use quantppl::model::{LoadFor, Model};
    use quantppl::plan::{Method, Plan, Window};
    use quantppl::run::scheduler::{self, Worker};

    /// 30 windows of 64 tokens; window 1 (in the first batch) holds a token id outside the
    /// 512-token vocabulary.
    fn plan_with_a_bad_window() -> Plan {
        let windows = (0..30u32)
            .map(|w| {
                let mut ids: Vec<u32> = (0..64).map(|i| (w * 7 + i * 3) % 512).collect();
                if w == 1 {
                    ids[40] = 100_000;
                }
                let targets = (0..64)
                    .map(|i| if i < 63 { ids[i + 1] as i32 } else { -1 })
                    .collect();
                Window {
                    ids,
                    targets,
                    doc: 0,
                    branches: None,
                }
            })
            .collect();
        Plan {
            method: Method::Exl3,
            windows,
            docs: Vec::new(),
            n_docs: 1,
            n_tokens: 30 * 64,
        }
    }

    /// A failing device stops every worker (no hang) and its error names the problem.
    #[test]
    fn a_failing_batch_stops_every_device_with_its_error() {
        let dir = quantppl::assets::default_model_dir().expect("bundled model");
        let ckpt = Checkpoint::open(&dir).expect("checkpoint");
        let plan = plan_with_a_bad_window();
        let todo: Vec<usize> = (0..plan.windows.len()).collect();
        let batches = scheduler::make_batches(&plan, &todo, 128);
        let backends: Vec<CpuBackend> = (0..3).map(|_| CpuBackend::new()).collect();

        let replicas: Vec<Model<CpuBackend>> = backends
            .iter()
            .map(|b| Model::load(b, &ckpt, 64, &|_, _| {}).expect("load"))
            .collect();
        let workers: Vec<Worker<CpuBackend>> = backends
            .iter()
            .zip(&replicas)
            .map(|(backend, model)| Worker { backend, model })
            .collect();
        let mut done = 0;
        let err = scheduler::run(&workers, &plan, &batches, |_, _| {
            done += 1;
            Ok(())
        })
        .expect_err("the bad window must fail the run");
        assert!(err.to_string().contains("token id 100000"), "{err}");
        // The first batch fails at once: the two other workers finish the batch they hold and
        // take no more (a scheduler that kept going would deliver the 28 other windows). Up
        // to 3 batches each leaves room for thread timing.
        let per_batch = 128 / 64;
        assert!(
            done <= 2 * 3 * per_batch,
            "{done} windows after the failure"
        );

        let stages: Vec<Model<CpuBackend>> = backends
            .iter()
            .zip(split_layers(ckpt.config.num_layers, &[1, 1, 1], |_| true))
            .map(|(b, r)| {
                Model::load_stage(b, &ckpt, r, LoadFor::positions(64), &|_, _| {})
                    .expect("load stage")
            })
            .collect();
        let workers: Vec<Worker<CpuBackend>> = backends
            .iter()
            .zip(&stages)
            .map(|(backend, model)| Worker { backend, model })
            .collect();
        let err = scheduler::run_pipeline(&workers, &plan, &batches, |_, _| Ok(()))
            .expect_err("the bad window must fail the pipeline");
        assert!(err.to_string().contains("token id 100000"), "{err}");
    }
}

/// A mixture of experts splits and replicates as a dense model does (each layer's experts stay
/// with it): the INT4 Qwen3-MoE fixture's 3 layers on 3 devices, and 2 replicas, give one
/// device's digits.
#[test]
fn mixture_of_experts_on_several_devices_matches_one_device() {
    split_and_replicated_match_one_device("synth-qwen3moe-mini-w4a16-g32", ("0,1,2", 256), 1024);
}

/// `fixture`'s eval on `devices` split into a pipeline (at `layer_tokens` a batch) and on two
/// replicas gives one device's digits (at `one_tokens`).
fn split_and_replicated_match_one_device(
    fixture: &str,
    (devices, layer_tokens): (&str, usize),
    one_tokens: usize,
) {
    let model = common::fixture(fixture);
    let model = model.to_str().expect("UTF-8 path");
    let with = |extra: &[&str]| {
        let mut args = vec!["--model", model];
        args.extend_from_slice(extra);
        eval(&args)
    };
    let one = with(&["--batch-tokens", &one_tokens.to_string()]);
    let layer_tokens = layer_tokens.to_string();
    for extra in [
        &[
            "--devices",
            devices,
            "--parallel",
            "layers",
            "--batch-tokens",
            &layer_tokens,
        ][..],
        &[
            "--devices",
            "0,1",
            "--parallel",
            "data",
            "--batch-tokens",
            "384",
        ],
    ] {
        let r = with(extra);
        for key in ["ppl", "mean_nll", "ppl_stderr", "scored_tokens"] {
            assert_eq!(r[key], one[key], "{fixture}: {key} differs with {extra:?}");
        }
    }
}

/// GLM-5's sparse attention splits and replicates as a dense model does, windows of 128 tokens
/// past its 32 keys a query: 2 replicas and 2 pipeline stages give one device's digits (layer
/// 1 reuses layer 0's selection in the same stage). 3 stages would start one at that layer,
/// which has no selection of its own: refused, naming it.
#[test]
fn sparse_attention_on_several_devices_matches_one_device() {
    split_and_replicated_match_one_device("synth-glm5-mini", ("0,1", 256), 512);
    let model = common::fixture("synth-glm5-mini");
    common::fails_with(
        &[
            "eval",
            "-q",
            "--backend",
            "cpu",
            "--model",
            model.to_str().expect("UTF-8 path"),
            "--method",
            "exl3",
            "--ctx",
            "128",
            "--stride",
            "64",
            "--rows",
            "4",
            "--devices",
            "0,1,2",
            "--parallel",
            "layers",
        ],
        &["reusing an earlier layer's sparse-attention selection"],
    );
}

/// DeepSeek-V4 split by layers hands its residual streams (`hc_mult` times the hidden width)
/// from one device to the next: the same digits as one device, and as replicas.
#[test]
fn deepseek_v4_split_by_layers_matches_one_device() {
    split_and_replicated_match_one_device("synth-deepseek-v4-mini", ("0,1,2", 256), 512);
}

/// GLM-5.3-Flash split by layers: KDA and pooled sparse attention on different devices, the
/// residual streams handed on as DeepSeek-V4's: the same digits as one device, and as replicas.
#[test]
fn glm5_next_split_by_layers_matches_one_device() {
    split_and_replicated_match_one_device("synth-glm5-next-mini", ("0,1,2", 256), 512);
}

/// A Gemma 4 model whose layers read the embedding's per-layer inputs and reuse earlier
/// layers' keys and values is not split across devices: refused in one line.
#[test]
fn gemma4_layers_are_not_split_across_devices() {
    let dir = common::fixture("synth-gemma4-mini");
    common::fails_with(
        &[
            "eval",
            "--model",
            dir.to_str().unwrap(),
            "--backend",
            "cpu",
            "--devices",
            "0,1",
            "--parallel",
            "layers",
            "--ctx",
            "128",
            "--rows",
            "2",
        ],
        &["Gemma 4", "run it on one device"],
    );
}
