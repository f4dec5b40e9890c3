//! Whole plans on the CPU backend against fixtures' reference.json: PPL of the exl3,
//! llamacpp and nonoverlap (gptq) plans within the fixture's `suggested_ppl_rtol`, and the
//! scored-token counts exactly. Expected values are read from the fixture files.
//!
//! Every fixture's rows 0 and 1 are held per token on the CPU and on lavapipe by the
//! conformance suite (two windows in one batch); the whole plans, 20-28k tokens a fixture
//! through the f64-accumulating reference, run here on samples: every method's plan on
//! [`EVERY_METHOD`], the exl3 plan on one fixture of each layer kind whose state crosses
//! windows or batches ([`EXL3_PLAN`]: several sequences a batch, at every offset of the
//! plan). The GPU machine runs every fixture's whole plan (`quantppl check`, the conformance
//! suite's CUDA instances).

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

/// The fixtures whose whole plans of every method their reference records run here: the
/// three plans of llama.cpp's, ExLlamaV3's and the GPTQ papers' rules.
const EVERY_METHOD: [&str; 4] = [
    "stories260K",
    "stories260K-w4a16-g4-asym",
    "synth-llama-mini-w4a16-g128",
    // Activations quantized per token.
    "stories260K-fp8-dynamic",
];

/// The fixtures whose whole exl3 plan (windows overlapping, eight a batch) runs here: each
/// layer kind whose state or selection depends on the batch's sequences.
const EXL3_PLAN: [&str; 8] = [
    // Routing over every token of a batch.
    "synth-qwen3moe-mini",
    // Sliding and global layers; attention sinks.
    "synth-gemma3-mini",
    "synth-gpt-oss-mini",
    // Recurrent layers (gated DeltaNet, Mamba-2, short convolutions) reset per sequence.
    "synth-qwen3_5-mini",
    "synth-bamba-mini",
    "synth-lfm2-mini",
    // Latent attention with a top-k key selection shorter than the window.
    "synth-deepseek-v3.2-mini",
    // A GGUF file's ggml blocks.
    "synth-gguf-llama",
];

#[test]
fn sampled_fixtures_plan_ppl_matches_their_reference() {
    let b = CpuBackend::new();
    let text_path = common::wiki_test_raw();
    let text = load_text(&text_path, TextView::Raw).expect("wiki.test.raw");
    let mut failures = Vec::new();
    let all = common::reference_dirs();
    let sample = EVERY_METHOD.iter().map(|f| (f, true));
    for (sampled, every_method) in sample.chain(EXL3_PLAN.iter().map(|f| (f, false))) {
        let dir = all
            .iter()
            .find(|d| d.ends_with(*sampled))
            .unwrap_or_else(|| panic!("{sampled}: no such fixture with a reference.json"))
            .clone();
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
        if every_method && l.is_object() {
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
        if every_method {
            plans.push((
                "nonoverlap",
                plan::gptq(&tokens, n(&g["L"]), Some(n(&g["rows"]))).expect("plan"),
                g,
            ));
        }
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
