//! `quantppl check`: can this GPU be trusted? Every op against the CPU reference, then whole
//! models against the transformers reference values in their reference.json.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Serialize;

use std::fmt::Write as _;

use super::{BackendArgs, OnBackend, print_output, with_backend};
use crate::backend::Backend;
use crate::check::{
    CaseReport, FLIP_NATS, ModelCheck, OP_FAMILIES, check_model, check_op_families, known_op_names,
};
use crate::checkpoint::Checkpoint;
use crate::numerics::FloatType;
use crate::run::{ActDtype, DeviceRequest};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Seed of the random op inputs (printed, so a failure can be reproduced).
    #[arg(long, default_value_t = 20261121)]
    pub seed: u64,
    /// Model directories with a reference.json to check end to end (default: the bundled
    /// model, unless `--op` narrows the run to op checks). A mixture of experts in a 16-bit
    /// mode also runs on the CPU, token by token beside it: routing near-ties make its PPL
    /// noisy, and the bound widens to three standard errors of that noise where it exceeds
    /// 0.5 %, up to 1 %.
    #[arg(long = "model", value_name = "DIR")]
    pub models: Vec<PathBuf>,
    /// Only this op family's cases (repeatable): linear, norm, attention, elementwise, vocab,
    /// mixture; or one op's cases (e.g. rope, nll, dequant). `--op list` lists them.
    #[arg(long = "op", value_name = "NAME")]
    pub ops: Vec<String>,
    /// Also write the results as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(Serialize)]
struct CheckReport {
    backend: String,
    seed: u64,
    /// Op checks for each activation precision the backend has (CUDA: bf16, f32 and
    /// split-bf16, or the one `--dtype` names).
    op_runs: Vec<OpRun>,
    models: Vec<ModelCheck>,
}

#[derive(Serialize)]
struct OpRun {
    backend: String,
    ops: Vec<CaseReport>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.ops.iter().any(|o| o == "list") {
        for f in OP_FAMILIES {
            println!(
                "{:<12} {}\n{:<12} ops: {}",
                f.name,
                f.about,
                "",
                f.ops.join(", ")
            );
        }
        return Ok(());
    }
    known_op_names(&args.ops)?;
    let models = if !args.ops.is_empty() && args.models.is_empty() {
        Vec::new()
    } else if args.models.is_empty() {
        vec![crate::assets::default_model_dir()?]
    } else {
        args.models.clone()
    };
    // Op checks in every precision the backend offers (under `--dtype auto`; else the one
    // named). Each model runs on the backend its own dtype selects, as `eval` would run it
    // (under `--dtype auto`, f32 activations for f32 checkpoints).
    let req = args.backend.request()?;
    let mut precisions = vec![
        (req.clone(), FloatType::Bf16),
        (req.clone(), FloatType::F32),
    ];
    if req.dtype == ActDtype::Auto {
        let split = DeviceRequest {
            dtype: ActDtype::F32Grade,
            ..req.clone()
        };
        precisions.push((split, FloatType::F32));
    }
    let mut op_runs: Vec<OpRun> = Vec::new();
    for (precision, dt) in &precisions {
        let done: Vec<String> = op_runs.iter().map(|r| r.backend.clone()).collect();
        let job = OpsJob {
            seed: args.seed,
            ops: &args.ops,
            done,
        };
        op_runs.extend(with_backend(precision, *dt, job)?);
    }
    if op_runs.is_empty() && models.is_empty() {
        bail!(
            "--op: the op checks hold a GPU backend to the CPU reference; on the CPU there is \
             nothing to hold them to (name a GPU with --backend, or a model with --model)"
        );
    }
    let mut report = CheckReport {
        // No op run: the CPU, which runs none.
        backend: op_runs
            .first()
            .map_or_else(|| "cpu".into(), |r| r.backend.clone()),
        seed: args.seed,
        op_runs,
        models: Vec::new(),
    };
    for dir in &models {
        let dtype = Checkpoint::open(dir)?.config.auto_activation_dtype();
        report
            .models
            .push(with_backend(&req, dtype, ModelJob { dir })?);
    }
    let mut out = String::new();
    writeln!(
        out,
        "quantppl check on {} (seed {})",
        report.backend, report.seed
    )?;
    if report.op_runs.is_empty() {
        writeln!(
            out,
            "ops: none on the CPU (the reference the op checks hold the GPU backends to)"
        )?;
    }
    for run in &report.op_runs {
        writeln!(out, "ops on {}", run.backend)?;
        writeln!(
            out,
            "{:<10} {:<64} {:>10} {:>10} {:>9}  result",
            "op", "case", "max err", "scale", "tol"
        )?;
        for c in &run.ops {
            writeln!(
                out,
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
            )?;
        }
    }
    writeln!(
        out,
        "{:<40} {:>5} {:>12} {:>12} {:>10} {:>10} {:>9}  result",
        "model", "act", "PPL", "reference", "rel diff", "max dNLL", "tol"
    )?;
    for m in &report.models {
        writeln!(
            out,
            "{:<40} {:>5} {:>12.5} {:>12.5} {:>10.2e} {:>10.2e} {:>9.1e}  {}",
            truncate(&m.model, 40),
            format!("{:?}", m.activations).to_lowercase(),
            m.ppl,
            m.reference_ppl,
            m.ppl_rel_diff,
            m.max_token_diff,
            m.tolerance,
            if m.passed { "ok" } else { "FAIL" }
        )?;
        if let Some(f) = &m.routing {
            writeln!(
                out,
                "  a mixture in 16 bits: {} tokens moved over {} nat from the CPU's (experts \
                 chosen otherwise at near-ties), the PPL's standard error {:.2e}, its tol three \
                 of them (at most 1e-2) or the bound; the CPU's {:.2e} from the reference",
                f.moved_tokens, FLIP_NATS, f.standard_error, f.cpu_rel_diff
            )?;
        }
    }
    let n_ops: usize = report.op_runs.iter().map(|r| r.ops.len()).sum();
    let failed = report
        .op_runs
        .iter()
        .flat_map(|r| &r.ops)
        .filter(|c| !c.passed)
        .count()
        + report.models.iter().filter(|m| !m.passed).count();
    if failed == 0 {
        writeln!(out, "all {} checks passed", n_ops + report.models.len())?;
    }
    print_output(&out, args.json.as_deref(), &report)?;
    if failed > 0 {
        // Where: each precision whose op checks failed, and the failed models (each ran on
        // the precision its own dtype selects, printed in its row).
        let mut on: Vec<String> = report
            .op_runs
            .iter()
            .filter(|r| r.ops.iter().any(|c| !c.passed))
            .map(|r| format!("ops on {}", r.backend))
            .collect();
        let models = report.models.iter().filter(|m| !m.passed).count();
        if models > 0 {
            on.push(format!("{models} model(s)"));
        }
        bail!("{failed} check(s) failed: {}", on.join("; "));
    }
    Ok(())
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "~"
    }
}

struct OpsJob<'a> {
    seed: u64,
    /// The families or ops to run (all where empty).
    ops: &'a [String],
    /// Backends (by name: device and activation type) already checked: CPU and wgpu have
    /// one precision whatever the model dtype asks.
    done: Vec<String>,
}

impl OnBackend for OpsJob<'_> {
    type Output = Option<OpRun>;
    const ONE_DEVICE: bool = true;

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<Option<OpRun>> {
        let b = backends.first().context("no backend")?;
        // The op checks hold a backend to the CPU's results: on the CPU they would compare
        // the reference with itself.
        if self.done.contains(&b.name()) || b.is_reference() {
            return Ok(None);
        }
        let ops = check_op_families(b, self.seed, self.ops)
            .with_context(|| format!("op checks on {}", b.name()))?;
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
