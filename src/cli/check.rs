//! `quantppl check`: can this GPU be trusted? Every op against the CPU reference, then whole
//! models against the transformers reference values in their reference.json.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Serialize;

use super::{BackendArgs, OnBackend, with_backend, write_json};
use crate::backend::{Backend, SeqLayout};
use crate::check::{CaseReport, check_ops};
use crate::checkpoint::Checkpoint;
use crate::data::{TextTokenizer, TextView, load_text};
use crate::eval::plan;
use crate::eval::report::aggregate;
use crate::model::Model;
use crate::numerics::FloatType;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Seed of the random op inputs (printed, so a failure can be reproduced).
    #[arg(long, default_value_t = 20261121)]
    pub seed: u64,
    /// Model directories with a reference.json to check end to end (default: the bundled model).
    #[arg(long = "model", value_name = "DIR")]
    pub models: Vec<PathBuf>,
    /// Also write the results as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(Serialize)]
pub struct ModelCheck {
    pub model: String,
    /// The backend's activation type for this model (`--dtype`, or the model's under auto).
    pub activations: FloatType,
    /// Largest per-token |NLL - reference| over exl3 rows 0 and 1.
    pub max_token_diff: f64,
    pub ppl: f64,
    pub reference_ppl: f64,
    pub ppl_rel_diff: f64,
    pub tolerance: f64,
    pub passed: bool,
}

#[derive(Serialize)]
struct CheckReport {
    backend: String,
    seed: u64,
    /// Op checks for each activation precision the backend has (CUDA: bf16 and f32).
    op_runs: Vec<OpRun>,
    models: Vec<ModelCheck>,
}

#[derive(Serialize)]
struct OpRun {
    backend: String,
    ops: Vec<CaseReport>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let models = if args.models.is_empty() {
        vec![crate::assets::default_model_dir()?]
    } else {
        args.models.clone()
    };
    // Op checks in every activation precision the backend offers. Each model runs on the
    // backend its own dtype selects, as `eval` would run it (under `--dtype auto`, f32
    // activations for f32 checkpoints).
    let mut op_runs: Vec<OpRun> = Vec::new();
    for dt in [FloatType::Bf16, FloatType::F32] {
        let done: Vec<String> = op_runs.iter().map(|r| r.backend.clone()).collect();
        let job = OpsJob {
            seed: args.seed,
            done,
        };
        op_runs.extend(with_backend(&args.backend, dt, job)?);
    }
    let mut report = CheckReport {
        backend: op_runs
            .first()
            .map(|r| r.backend.clone())
            .unwrap_or_default(),
        seed: args.seed,
        op_runs,
        models: Vec::new(),
    };
    for dir in &models {
        let dtype = Checkpoint::open(dir)?.config.dtype;
        report
            .models
            .push(with_backend(&args.backend, dtype, ModelJob { dir })?);
    }
    println!(
        "quantppl check on {} (seed {})",
        report.backend, report.seed
    );
    for run in &report.op_runs {
        println!("ops on {}", run.backend);
        println!(
            "{:<10} {:<64} {:>10} {:>10} {:>9}  result",
            "op", "case", "max err", "scale", "tol"
        );
        for c in &run.ops {
            println!(
                "{:<10} {:<64} {:>10.2e} {:>10.2e} {:>9.1e}  {}",
                c.name,
                truncate(&c.vars, 64),
                c.max_abs_err,
                c.ref_scale,
                c.tolerance,
                if c.passed {
                    "ok".to_string()
                } else {
                    format!(
                        "FAIL at {}: got {} want {}",
                        c.worst.0, c.worst.1, c.worst.2
                    )
                }
            );
        }
    }
    println!(
        "{:<40} {:>5} {:>12} {:>12} {:>10} {:>10} {:>9}  result",
        "model", "act", "PPL", "reference", "rel diff", "max dNLL", "tol"
    );
    for m in &report.models {
        println!(
            "{:<40} {:>5} {:>12.5} {:>12.5} {:>10.2e} {:>10.2e} {:>9.1e}  {}",
            truncate(&m.model, 40),
            format!("{:?}", m.activations).to_lowercase(),
            m.ppl,
            m.reference_ppl,
            m.ppl_rel_diff,
            m.max_token_diff,
            m.tolerance,
            if m.passed { "ok" } else { "FAIL" }
        );
    }
    if let Some(p) = &args.json {
        write_json(p, &report)?;
    }
    let n_ops: usize = report.op_runs.iter().map(|r| r.ops.len()).sum();
    let failed = report
        .op_runs
        .iter()
        .flat_map(|r| &r.ops)
        .filter(|c| !c.passed)
        .count()
        + report.models.iter().filter(|m| !m.passed).count();
    if failed > 0 {
        bail!("{failed} check(s) failed on {}", report.backend);
    }
    println!("all {} checks passed", n_ops + report.models.len());
    Ok(())
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "~"
    }
}

struct OpsJob {
    seed: u64,
    /// Backends (by name: device and activation type) already checked: CPU and wgpu have
    /// one precision whatever the model dtype asks.
    done: Vec<String>,
}

impl OnBackend for OpsJob {
    type Output = Option<OpRun>;
    const ONE_DEVICE: bool = true;

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<Option<OpRun>> {
        let b = backends.first().context("no backend")?;
        if self.done.contains(&b.name()) {
            return Ok(None);
        }
        let ops = check_ops(b, self.seed).with_context(|| format!("op checks on {}", b.name()))?;
        Ok(Some(OpRun {
            backend: b.name(),
            ops,
        }))
    }
}

struct ModelJob<'a> {
    dir: &'a Path,
}

impl OnBackend for ModelJob<'_> {
    type Output = ModelCheck;
    const ONE_DEVICE: bool = true;

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<ModelCheck> {
        check_model(backends.first().context("no backend")?, self.dir)
    }
}

/// The exl3 plan of the model's reference.json on WikiText-2, against the recorded values.
pub fn check_model<B: Backend>(b: &B, dir: &Path) -> anyhow::Result<ModelCheck> {
    let ref_path = dir.join("reference.json");
    let text = std::fs::read_to_string(&ref_path)
        .with_context(|| format!("reading {}", ref_path.display()))?;
    let r: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", ref_path.display()))?;
    let num = |v: &serde_json::Value, what: &str| {
        v.as_f64()
            .with_context(|| format!("{}: missing {what}", ref_path.display()))
    };
    let ckpt = Checkpoint::open(dir)?;
    let tok = TextTokenizer::from_model_dir(dir)?;
    let wiki = load_text(&crate::assets::wikitext_path()?, TextView::Raw)?;
    let tokens = tok.encode(&wiki, true)?;
    let e = &r["exl3"];
    let (l, s, rows) = (
        num(&e["L"], "exl3.L")? as usize,
        num(&e["S"], "exl3.S")? as usize,
        num(&e["max_rows"], "exl3.max_rows")? as usize,
    );
    let p = plan::exl3(&tokens, l, s, Some(rows))?;
    let model = Model::load(b, &ckpt, l, &|_, _| {})?;
    let mut results = Vec::with_capacity(p.windows.len());
    let mut max_token_diff = 0f64;
    for (i, w) in p.windows.iter().enumerate() {
        let layout = SeqLayout::from_lengths([w.ids.len()]);
        let nll = model.nll(b, &w.ids, &layout, &w.targets)?;
        if i < 2 {
            let want = r["exl3"][format!("row{i}")]["nll"]
                .as_array()
                .context("reference rows")?;
            for (g, wv) in nll.iter().zip(want) {
                max_token_diff =
                    max_token_diff.max((*g as f64 - wv.as_f64().unwrap_or(f64::NAN)).abs());
            }
        }
        results.push(nll);
    }
    let (stats, _) = aggregate(&p, &results);
    let reference_ppl = num(&e["ppl"], "exl3.ppl")?;
    let rtol = num(
        &r["f32_rounding_sensitivity"]["suggested_ppl_rtol"],
        "suggested_ppl_rtol",
    )?;
    // DESIGN numerics contract: PPL within 0.2 % for bf16/f16 activations.
    let tolerance = match b.activation_type() {
        FloatType::F32 => rtol,
        _ => rtol.max(2e-3),
    };
    let ppl = stats.ppl();
    let ppl_rel_diff = (ppl / reference_ppl - 1.0).abs();
    Ok(ModelCheck {
        model: dir.display().to_string(),
        activations: b.activation_type(),
        max_token_diff,
        ppl,
        reference_ppl,
        ppl_rel_diff,
        tolerance,
        passed: ppl_rel_diff <= tolerance
            && stats.count == num(&e["scored"], "exl3.scored")? as u64,
    })
}
