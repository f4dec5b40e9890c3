//! `quantppl bench`: forward throughput on random token windows, effective TFLOP/s, where the
//! time goes per op, and peak device memory.

use std::path::PathBuf;

use std::fmt::Write as _;

use super::{BackendArgs, print_output};
use crate::run::bench::{BenchSettings, bench};
use crate::units::{human_bytes, human_count};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Model directory (a `synth` checkpoint needs no tokenizer: tokens are random).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 2048)]
    pub ctx: usize,
    /// Sequences per forward batch.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Timed batches (the median is reported), after one warm-up batch. 0: the warm-up batch
    /// alone, profiled, is the measurement (its time includes one-time set-up and every op
    /// synchronized): for windows too long to run three times.
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    /// Seed of the random tokens.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Sparse attention (DeepSeek-V3.2, GLM-5, Mistral Large 4) in the latent space from
    /// windows of TIMES x index_topk keys, over the expanded heads below (1: always; a large
    /// number: never). Both give the same scores; the default, 8, is where the latent form
    /// costs less on an H200. For measuring the two.
    #[arg(long, value_name = "TIMES")]
    pub sparse_latent_from: Option<usize>,
    /// Also write the results as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

pub fn run(args: Args, quiet: bool) -> anyhow::Result<()> {
    let settings = BenchSettings {
        model: args.model.clone(),
        ctx: args.ctx,
        batch: args.batch,
        iters: args.iters,
        seed: args.seed,
        sparse_latent_from: args.sparse_latent_from,
        quiet,
    };
    let r = bench(&args.backend.request()?, &settings)?;
    let mut out = String::new();
    writeln!(out, "model        {}", r.model)?;
    writeln!(out, "backend      {}", r.backend)?;
    writeln!(
        out,
        "workload     {} x {} tokens per batch, {}; {} params in matmuls",
        r.batch,
        r.ctx,
        match args.iters {
            0 => "the warm-up batch alone (--iters 0: one-time set-up included)".to_string(),
            n => format!("{n} timed batches after 1 warm-up"),
        },
        human_count(r.params_in_matmuls)
    )?;
    writeln!(
        out,
        "load         {:.2} s ({} checkpoint); the warm-up batch {:.3} s",
        r.load_seconds,
        human_bytes(r.checkpoint_bytes),
        r.first_batch_seconds
    )?;
    writeln!(
        out,
        "throughput   {:.0} tokens/s, {:.3} s per batch (median), effective {:.3} TFLOP/s{}",
        r.tokens_per_second,
        r.median_batch_seconds,
        r.effective_tflops,
        match (
            r.gemm_peak_tflops,
            r.share_of_gemm_peak,
            r.gemm_burst_tflops
        ) {
            (Some(p), Some(s), Some(burst)) => format!(
                " = {:.1} % of the {} TFLOP/s GEMM peak sustained here ({} in a burst)",
                100.0 * s,
                tflops(p),
                tflops(burst)
            ),
            _ => String::new(),
        }
    )?;
    if let Some(m) = r.peak_device_memory_bytes {
        writeln!(out, "memory       peak {} on the device", human_bytes(m))?;
    }
    writeln!(
        out,
        "time per op  (one batch, each op synchronized; the warm-up batch's seconds last)"
    )?;
    for o in &r.ops {
        let warm_up = r.first_batch_ops.iter().find(|w| w.op == o.op);
        writeln!(
            out,
            "  {:<16} {:>6.1} %  {:>9.4} s  {:>6} calls  {:>9.4} s",
            o.op,
            100.0 * o.share,
            o.seconds,
            o.calls,
            warm_up.map_or(0.0, |w| w.seconds)
        )?;
    }
    print_output(&out, args.json.as_deref(), &r)
}

/// Three significant digits for slow devices, none past 100.
fn tflops(v: f64) -> String {
    let digits = (2 - v.max(1e-3).log10().floor() as i64).clamp(0, 3) as usize;
    format!("{v:.digits$}")
}
