//! Whole plans on the CPU backend against every fixture's reference.json: PPL of the exl3,
//! llamacpp and nonoverlap (gptq) plans within the fixture's `suggested_ppl_rtol`, and the
//! scored-token counts exactly. Expected values are read from the fixture files.

use crate::common;

use quantppl::backend::cpu::CpuBackend;
use quantppl::checkpoint::Checkpoint;
use quantppl::data::{TextTokenizer, TextView, load_text};
use quantppl::model::Model;
use quantppl::plan::{self, Plan};
use quantppl::report::eval::aggregate;
use quantppl::run::scheduler::{self, Worker};

fn run(model: &Model<CpuBackend>, b: &CpuBackend, p: &Plan) -> (f64, u64, f64) {
    let worker = Worker { backend: b, model };
    let todo: Vec<usize> = (0..p.windows.len()).collect();
    let batches = scheduler::make_batches(p, &todo, 2048);
    let mut results = vec![Vec::new(); p.windows.len()];
    scheduler::run(&[worker], p, &batches, |w, nll| {
        results[w] = nll;
        Ok(())
    })
    .expect("evaluation");
    let (stats, _) = aggregate(p, &results);
    (stats.ppl(), stats.count, stats.stderr_ppl())
}

#[test]
fn every_fixture_plan_ppl_matches_its_reference() {
    let b = CpuBackend::new();
    let text_path = common::wiki_test_raw();
    let text = load_text(&text_path, TextView::Raw).expect("wiki.test.raw");
    let mut failures = Vec::new();
    for dir in common::reference_dirs() {
        let r = common::reference(&dir);
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let tok = TextTokenizer::from_model_dir(&dir).expect("tokenizer");
        let tokens = tok.encode(&text, true).expect("encode");
        let ckpt = Checkpoint::open(&dir).expect("checkpoint");
        let model = Model::load(&b, &ckpt, 256, &|_, _| {}).expect("load");
        let rtol = common::suggested_ppl_rtol(&r);
        let n = |v: &serde_json::Value| v.as_u64().expect("integer") as usize;
        let e = &r["exl3"];
        let l = &r["llamacpp"];
        let g = &r["nonoverlap"];
        // The repository's own fixtures record the exl3 and non-overlapping plans only.
        let mut plans = vec![(
            "exl3",
            plan::exl3(&tokens, n(&e["L"]), n(&e["S"]), Some(n(&e["max_rows"]))).expect("plan"),
            e,
        )];
        if l.is_object() {
            let bos = if l["bos_replaced"].as_bool().unwrap_or(false) {
                Some(n(&l["bos_id"]) as u32)
            } else {
                None
            };
            plans.push((
                "llamacpp",
                plan::llamacpp(&tokens, n(&l["n_ctx"]), bos, Some(n(&l["n_chunks"])))
                    .expect("plan"),
                l,
            ));
        }
        plans.push((
            "nonoverlap",
            plan::gptq(&tokens, n(&g["L"]), Some(n(&g["rows"]))).expect("plan"),
            g,
        ));
        for (label, p, want) in plans {
            let (ppl, count, stderr) = run(&model, &b, &p);
            let want_ppl = want["ppl"].as_f64().expect("ppl");
            let rel = (ppl / want_ppl - 1.0).abs();
            println!(
                "{name:<42} {label:<10} ppl {ppl:>14.6} ref {want_ppl:>14.6} rel {rel:.2e} scored {count}"
            );
            if rel > rtol {
                failures.push(format!(
                    "{name} {label}: PPL {ppl} vs {want_ppl} (rel {rel:.2e} > {rtol:.0e})"
                ));
            }
            if count != want["scored"].as_u64().expect("scored") {
                failures.push(format!(
                    "{name} {label}: scored {count} vs {}",
                    want["scored"]
                ));
            }
            if let Some(want_se) = want.get("stderr").and_then(|v| v.as_f64())
                && (stderr / want_se - 1.0).abs() > rtol.max(1e-4) * 10.0
            {
                failures.push(format!("{name} {label}: stderr {stderr} vs {want_se}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
