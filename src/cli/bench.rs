//! `quantppl bench`: forward throughput on random token windows, effective TFLOP/s, where the
//! time goes per op, and peak device memory.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use super::{BackendArgs, OnBackend, with_backend, write_json};
use crate::backend::profiled::Profiled;
use crate::backend::{Backend, SeqLayout};
use crate::checkpoint::Checkpoint;
use crate::rng::Rng;
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
    /// Timed batches (the median is reported), after one warm-up batch.
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    /// Seed of the random tokens.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write the results as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Serialize)]
pub struct OpShare {
    pub op: &'static str,
    pub calls: u64,
    pub seconds: f64,
    pub share: f64,
}

#[derive(Serialize)]
pub struct BenchReport {
    pub model: String,
    pub backend: String,
    pub params_in_matmuls: u64,
    pub ctx: usize,
    pub batch: usize,
    pub tokens_per_batch: usize,
    pub load_seconds: f64,
    /// Seconds per batch of each timed iteration.
    pub batch_seconds: Vec<f64>,
    pub median_batch_seconds: f64,
    pub tokens_per_second: f64,
    /// 2 x params x tokens / time (the attention's own FLOPs are not counted).
    pub effective_tflops: f64,
    pub gemm_peak_tflops: Option<f64>,
    pub share_of_gemm_peak: Option<f64>,
    pub peak_device_memory_bytes: Option<u64>,
    pub checkpoint_bytes: u64,
    /// One profiled batch, every op synchronized: shares of its time.
    pub ops: Vec<OpShare>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let ckpt = Checkpoint::open(&args.model)?;
    if args.ctx > ckpt.config.max_position_embeddings {
        anyhow::bail!(crate::Error::ContextTooLong {
            ctx: args.ctx,
            max: ckpt.config.max_position_embeddings
        });
    }
    if args.batch == 0 || args.iters == 0 {
        anyhow::bail!("--batch and --iters must be at least 1");
    }
    let r = with_backend(
        &args.backend.request(),
        ckpt.config.dtype,
        BenchJob {
            args: &args,
            ckpt: &ckpt,
        },
    )?;
    println!("model        {}", r.model);
    println!("backend      {}", r.backend);
    println!(
        "workload     {} x {} tokens per batch, {} timed batches after 1 warm-up; {} params in matmuls",
        r.batch,
        r.ctx,
        r.batch_seconds.len(),
        human_count(r.params_in_matmuls)
    );
    println!(
        "load         {:.2} s ({} checkpoint)",
        r.load_seconds,
        human_bytes(r.checkpoint_bytes)
    );
    println!(
        "throughput   {:.0} tokens/s, {:.3} s per batch (median), effective {:.3} TFLOP/s{}",
        r.tokens_per_second,
        r.median_batch_seconds,
        r.effective_tflops,
        match (r.gemm_peak_tflops, r.share_of_gemm_peak) {
            (Some(p), Some(s)) => format!(
                " = {:.1} % of the {:.0} TFLOP/s GEMM peak measured here",
                100.0 * s,
                p
            ),
            _ => String::new(),
        }
    );
    if let Some(m) = r.peak_device_memory_bytes {
        println!("memory       peak {} on the device", human_bytes(m));
    }
    println!("time per op  (one batch, each op synchronized)");
    for o in &r.ops {
        println!(
            "  {:<14} {:>6.1} %  {:>9.4} s  {:>6} calls",
            o.op,
            100.0 * o.share,
            o.seconds,
            o.calls
        );
    }
    if let Some(p) = &args.json {
        write_json(p, &r)?;
    }
    Ok(())
}

struct BenchJob<'a> {
    args: &'a Args,
    ckpt: &'a Checkpoint,
}

impl OnBackend for BenchJob<'_> {
    type Output = BenchReport;
    const ONE_DEVICE: bool = true;

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<BenchReport> {
        let a = self.args;
        let cfg = &self.ckpt.config;
        let b = Profiled::new(&backends[0]);
        let t0 = Instant::now();
        let model = crate::run::placement::load_replicas(
            std::slice::from_ref(&b),
            self.ckpt,
            a.ctx,
            a.quiet,
        )?
        .pop()
        .ok_or_else(|| anyhow::anyhow!("no model loaded"))?;
        b.synchronize()?;
        let load_seconds = t0.elapsed().as_secs_f64();
        let mut rng = Rng::new(a.seed);
        let tokens = a.batch * a.ctx;
        let ids: Vec<u32> = (0..tokens)
            .map(|_| rng.below(cfg.vocab_size as u64) as u32)
            .collect();
        // Every position scored against the next random token: the full lm_head + NLL cost.
        let targets: Vec<i32> = (0..tokens).map(|i| ids[(i + 1) % tokens] as i32).collect();
        let layout = SeqLayout::from_lengths(std::iter::repeat_n(a.ctx, a.batch));
        let forward = || -> anyhow::Result<f64> {
            let start = Instant::now();
            let nll = model.nll(&b, &ids, &layout, &targets)?;
            b.synchronize()?;
            if let Some(i) = nll.iter().position(|v| !v.is_finite()) {
                anyhow::bail!(crate::Error::NonFinite {
                    what: "NLL",
                    window: i / a.ctx,
                    position: i % a.ctx
                });
            }
            Ok(start.elapsed().as_secs_f64())
        };
        forward()?;
        let mut batch_seconds = Vec::with_capacity(a.iters);
        for _ in 0..a.iters {
            batch_seconds.push(forward()?);
        }
        let mut sorted = batch_seconds.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        b.set_enabled(true);
        let profiled_total = forward()?;
        b.set_enabled(false);
        let ops = b
            .take()
            .into_iter()
            .map(|(op, d, calls)| OpShare {
                op,
                calls,
                seconds: d.as_secs_f64(),
                share: d.as_secs_f64() / profiled_total,
            })
            .collect();
        let params = cfg.matmul_params();
        let effective = 2.0 * params as f64 * tokens as f64 / median / 1e12;
        let peak = b.gemm_peak_tflops()?;
        Ok(BenchReport {
            model: a.model.display().to_string(),
            backend: b.name(),
            params_in_matmuls: params,
            ctx: a.ctx,
            batch: a.batch,
            tokens_per_batch: tokens,
            load_seconds,
            batch_seconds,
            median_batch_seconds: median,
            tokens_per_second: tokens as f64 / median,
            effective_tflops: effective,
            gemm_peak_tflops: peak,
            share_of_gemm_peak: peak.map(|p| effective / p),
            peak_device_memory_bytes: b.peak_memory_bytes(),
            checkpoint_bytes: self.ckpt.store.total_bytes(),
            ops,
        })
    }
}
