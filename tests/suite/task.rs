//! `eval --task` and `compare --task` against lm-eval's own scores of the bundled dense model
//! (benches/lm_eval/choice_reference.json: lm_eval 0.4.13's `hf` model in float32), item by
//! item: every request's log-likelihood, every item's acc and acc_norm; and task files that
//! are not tasks refused with one line naming the line.

use std::path::{Path, PathBuf};

use crate::common::{self, f64s, fails_with, run_json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn eval_task_matches_lm_eval_item_by_item() {
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("benches/lm_eval/choice_reference.json")).unwrap(),
    )
    .unwrap();
    let model = common::assets_dir().join("stories260K");
    for (task, file) in [
        ("stories_choice", "stories_choice.jsonl"),
        ("stories_winogrande", "stories_winogrande_task.jsonl"),
    ] {
        let path = root().join("benches/lm_eval").join(file);
        let args = [
            "eval",
            "--backend",
            "cpu",
            "--model",
            model.to_str().unwrap(),
            "--task",
            path.to_str().unwrap(),
        ];
        let got = run_json(&args, task);
        let items = got["scores"]["items"].as_array().unwrap();
        let want = reference["samples"][task].as_array().unwrap();
        assert_eq!(items.len(), want.len(), "{task}: items");
        for (i, (g, w)) in items.iter().zip(want).enumerate() {
            let lls = f64s(&g["loglikelihoods"]);
            let want_lls: Vec<f64> = w["loglikelihoods"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v[0].as_f64().unwrap())
                .collect();
            assert_eq!(lls.len(), want_lls.len(), "{task} item {i}: choices");
            // lm-eval sums float32 log-probabilities: 1e-4 of a sum of a few tokens.
            for (a, b) in lls.iter().zip(&want_lls) {
                assert!(
                    (a - b).abs() <= 1e-4,
                    "{task} item {i}: {lls:?} vs {want_lls:?}"
                );
            }
            let right = g["pred"] == g["label"];
            assert_eq!(
                right,
                w["acc"].as_f64() == Some(1.0),
                "{task} item {i}: acc"
            );
            if let Some(norm) = w["acc_norm"].as_f64() {
                let right = g["pred_norm"] == g["label"];
                assert_eq!(right, norm == 1.0, "{task} item {i}: acc_norm");
            }
        }
        let results = &reference["results"][task];
        let acc = got["scores"]["acc"]["value"].as_f64().unwrap();
        assert_eq!(acc, results["acc,none"].as_f64().unwrap(), "{task}: acc");
        let unc = got["scores"]["acc"]["unc"].as_f64().unwrap();
        assert!((unc - results["acc_stderr,none"].as_f64().unwrap()).abs() < 1e-12);
        if let Some(norm) = results["acc_norm,none"].as_f64() {
            assert_eq!(got["scores"]["acc_norm"]["value"].as_f64(), Some(norm));
        }
    }
}

/// The bundled INT4 model against its dense base: flips counted from both models' answers,
/// each model's answers those of `eval --task` on it.
#[test]
fn compare_task_counts_flips_from_both_answers() {
    let task = root().join("benches/lm_eval/stories_choice.jsonl");
    let base = common::assets_dir().join("stories260K");
    let quant = common::assets_dir().join("stories260K-w4a16-channel");
    let task_arg = task.to_str().unwrap();
    let out = run_json(
        &[
            "compare",
            "--backend",
            "cpu",
            "--base",
            base.to_str().unwrap(),
            quant.to_str().unwrap(),
            "--task",
            task_arg,
        ],
        "compare-task",
    );
    let alone = [&base, &quant].map(|dir| {
        let args = [
            "eval",
            "--backend",
            "cpu",
            "--model",
            dir.to_str().unwrap(),
            "--task",
            task_arg,
        ];
        run_json(&args, "eval-task")
    });
    // Both models' log-likelihoods come from the comparison's one pass: each is what
    // `eval --task` gives that model alone (f64 sums there, f32 NLLs summed here).
    for (i, alone) in alone.iter().enumerate() {
        let from_pass = if i == 0 {
            &out["scores"]
        } else {
            &out["compared"][0][0]
        };
        let (a, p) = (&alone["scores"]["items"], &from_pass["items"]);
        for (x, y) in a.as_array().unwrap().iter().zip(p.as_array().unwrap()) {
            for (u, v) in f64s(&x["loglikelihoods"])
                .iter()
                .zip(f64s(&y["loglikelihoods"]))
            {
                assert!((u - v).abs() <= 1e-4 * u.abs().max(1.0), "{u} vs {v}");
            }
        }
    }
    let kld = &out["comparison"]["models"];
    assert!(
        kld.is_array(),
        "the comparison's report: {}",
        out["comparison"]
    );
    let answers = |e: &serde_json::Value| -> Vec<bool> {
        e["scores"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["pred"] == a["label"])
            .collect()
    };
    let (b, q) = (answers(&alone[0]), answers(&alone[1]));
    let rw = b.iter().zip(&q).filter(|(b, q)| **b && !**q).count();
    let wr = b.iter().zip(&q).filter(|(b, q)| !**b && **q).count();
    let flips = &out["compared"][0][1];
    assert_eq!(flips["right_to_wrong"].as_u64(), Some(rw as u64));
    assert_eq!(flips["wrong_to_right"].as_u64(), Some(wr as u64));
    let rate = flips["rate"].as_f64().unwrap();
    assert!((rate - (rw + wr) as f64 / b.len() as f64).abs() < 1e-12);
}

/// Files that are not tasks: a one-line error naming the line, never a panic.
#[test]
fn task_files_that_are_not_tasks_are_refused_naming_the_line() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("task-files");
    std::fs::create_dir_all(&dir).unwrap();
    let good = r#"{"context": "Once upon a time", "choices": ["a", "b"], "label": 0}"#;
    let cases = [
        ("empty", String::new(), "no items"),
        ("not json", format!("{good}\n{{nope"), "line 2"),
        (
            "label past the choices",
            r#"{"context": "x", "choices": ["a", "b"], "label": 2}"#.into(),
            "label 2",
        ),
        (
            "one choice",
            r#"{"context": "x", "choices": ["a"], "label": 0}"#.into(),
            "1 choices",
        ),
        (
            "both shapes",
            r#"{"context": "x", "contexts": ["a", "b"], "continuation": "c", "label": 0}"#.into(),
            "an item has",
        ),
        (
            "unknown field",
            r#"{"context": "x", "choices": ["a", "b"], "answer": 0}"#.into(),
            "line 1",
        ),
    ];
    for (name, text, says) in cases {
        let path = dir.join(format!("{}.jsonl", name.replace(' ', "_")));
        std::fs::write(&path, text).unwrap();
        fails_with(
            &["eval", "--backend", "cpu", "--task", path.to_str().unwrap()],
            &[says],
        );
    }
}

/// `eval --task NAME` reads the task's files from the hub cache as lm-eval's task of that
/// name reads its data set: the stand-ins of benches/lm_eval/named_tasks (the hub layouts and
/// schemas) against lm-eval 0.4.13's own scores of them (named_tasks_reference.json), item
/// by item; a task not in the cache names the command that fetches it.
#[test]
fn named_tasks_from_the_hub_cache_match_lm_eval_item_by_item() {
    let here = root().join("benches/lm_eval");
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(here.join("named_tasks_reference.json")).unwrap(),
    )
    .unwrap();
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("task-hub-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let model = common::assets_dir().join("stories260K");
    let run = |cache: &Path, name: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_quantppl"))
            .args([
                "eval",
                "--backend",
                "cpu",
                "-q",
                "--json",
                "-",
                "--task",
                name,
            ])
            .arg("--model")
            .arg(&model)
            .env("HF_HUB_CACHE", cache)
            .output()
            .unwrap()
    };
    let missing = run(&cache, "hellaswag");
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success());
    assert!(
        err.contains("huggingface-cli download Rowan/hellaswag"),
        "{err}"
    );
    // One snapshot a repository (ARC's two sets share one).
    let mut repos: std::collections::BTreeMap<String, Vec<(&str, PathBuf)>> = Default::default();
    for file in reference["hub_files"].as_object().unwrap().values() {
        let (folder, rel) = file.as_str().unwrap().split_once('/').unwrap();
        let path = here.join("named_tasks").join(folder).join(rel);
        repos
            .entry(folder.replace("--", "/"))
            .or_default()
            .push((rel, path));
    }
    for (repo, files) in &repos {
        crate::data_sources::add_to_cache(&cache, repo, "main", files);
    }
    // A file of another schema where HellaSwag's should be: one line naming file and row.
    let wrong = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("task-hub-cache-wrong");
    let _ = std::fs::remove_dir_all(&wrong);
    let wino = here
        .join("named_tasks/allenai--winogrande/winogrande_xl/validation-00000-of-00001.parquet");
    crate::data_sources::add_to_cache(
        &wrong,
        "Rowan/hellaswag",
        "main",
        &[("data/validation-00000-of-00001.parquet", wino)],
    );
    let out = run(&wrong, "hellaswag");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("validation-00000-of-00001.parquet")
            && err.contains("row 1: no field `ctx_a`"),
        "{err}"
    );
    for (name, want) in reference["tasks"].as_object().unwrap() {
        let out = run(&cache, name);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let items = got["scores"]["items"].as_array().unwrap();
        let want = want.as_array().unwrap();
        assert_eq!(items.len(), want.len(), "{name}: items");
        for (i, (g, w)) in items.iter().zip(want).enumerate() {
            let (lls, want_lls) = (f64s(&g["loglikelihoods"]), f64s(&w["loglikelihoods"]));
            assert_eq!(lls.len(), want_lls.len(), "{name} item {i}: choices");
            for (a, b) in lls.iter().zip(&want_lls) {
                assert!(
                    (a - b).abs() <= 1e-4,
                    "{name} item {i}: {lls:?} vs {want_lls:?}"
                );
            }
            // lm-eval's target is the label, but WinoGrande's the continuation.
            if w["target"].is_u64() {
                assert_eq!(g["label"], w["target"], "{name} item {i}: label");
            }
            assert_eq!(
                g["pred"] == g["label"],
                w["acc"].as_f64() == Some(1.0),
                "{name} item {i}: acc"
            );
            if let Some(norm) = w["acc_norm"].as_f64() {
                assert_eq!(
                    g["pred_norm"] == g["label"],
                    norm == 1.0,
                    "{name} item {i}: acc_norm"
                );
            }
        }
    }
}

/// Branches only where they are exact. A model with a sliding window (Gemma 2, soft caps
/// and sandwich norms too) or LongRoPE (Phi-3) scores a task's shared windows as it scores
/// each request alone (the same plan with every request its own window, on the CPU); hybrid
/// and sparse-attention models share nothing (their limit is none, and their forward pass
/// refuses a branched batch with one line saying why).
#[test]
fn shared_windows_score_as_requests_alone_where_the_model_allows() {
    use quantppl::backend::cpu::CpuBackend;
    use quantppl::backend::{Branches, SeqLayout};
    use quantppl::data::task::Task;
    use quantppl::model::Model;
    use quantppl::plan::task::task_plan;
    use quantppl::run::{Activations, open_model};

    let tokenizer = common::assets_dir().join("stories260K/tokenizer.json");
    let task = Task::open(&root().join("benches/lm_eval/stories_choice.jsonl")).unwrap();
    let open = |name: &str| {
        open_model(
            Some(&common::fixture(name)),
            Some(&tokenizer),
            Activations::Declared,
        )
        .unwrap()
    };
    let b = CpuBackend::new();
    for (name, limit) in [("synth-gemma2-mini", 64), ("synth-phi3-longrope", 128)] {
        let m = open(name);
        let cfg = &m.ckpt.config;
        assert_eq!(cfg.branch_rows_limit(), Some(limit), "{name}");
        let lls = |share: Option<usize>| {
            let (plan, _, requests) = task_plan(&task, &m.tokenizer, cfg, share).unwrap();
            let model = Model::load(&b, &m.ckpt, plan.max_window(), &|_, _| {}).unwrap();
            let nlls: Vec<Vec<f32>> = plan
                .windows
                .iter()
                .map(|w| {
                    let layout = SeqLayout::from_sequences([(w.ids.len(), w.branches.as_ref())]);
                    model.nll(&b, &w.ids, &layout, &w.targets).unwrap()
                })
                .collect();
            let shared = plan.windows.iter().filter(|w| w.branches.is_some()).count();
            (requests.loglikelihoods(&nlls, |&v| f64::from(v)), shared)
        };
        let ((alone, none), (shared, some)) = (lls(None), lls(Some(limit)));
        assert_eq!(none, 0);
        assert_eq!(
            some,
            task.items.len(),
            "{name}: every item shares its context"
        );
        for (a, s) in alone.iter().flatten().zip(shared.iter().flatten()) {
            assert!(
                (a - s).abs() <= 1e-5 * a.abs().max(1.0),
                "{name}: {a} vs {s}"
            );
        }
    }
    for name in [
        "synth-qwen3_5-mini",
        "synth-nemotron-h-mini",
        "synth-lfm2-mini",
        "synth-deepseek-v3.2-mini",
    ] {
        let m = open(name);
        assert_eq!(m.ckpt.config.branch_rows_limit(), None, "{name}");
        let model = Model::load(&b, &m.ckpt, 16, &|_, _| {}).unwrap();
        let branches = Branches {
            prefix: 4,
            lens: vec![3, 3],
        };
        let layout = SeqLayout::from_sequences([(10, Some(&branches))]);
        let ids: Vec<u32> = (1..11).collect();
        let err = model.hidden(&b, &ids, &layout).unwrap_err().to_string();
        assert!(err.contains("read every earlier row"), "{name}: {err}");
    }
}
