//! `bench`'s measurement: forward throughput of a checkpoint on random tokens, effective
//! TFLOP/s against the GEMM peak sustained on the same device, and where the time goes per op.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use super::devices::{DeviceRequest, OnBackend, progress_bar, with_backend};
use super::placement::load_replicas;
use crate::backend::profiled::Profiled;
use crate::backend::{Backend, Device, SeqLayout, Shaped};
use crate::checkpoint::Checkpoint;
use crate::model::LoadFor;
use crate::rng::Rng;

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchSettings {
    /// A checkpoint directory (a `synth` one needs no tokenizer: tokens are random).
    pub model: PathBuf,
    /// Tokens per sequence.
    pub ctx: usize,
    /// Sequences per forward batch.
    pub batch: usize,
    /// Timed batches, after one warm-up.
    pub iters: usize,
    /// Seed of the random tokens.
    pub seed: u64,
    /// Sparse attention in the latent space from windows of this many times `index_topk`
    /// keys (`Model::set_latent_from`; the model's own choice where `None`).
    pub sparse_latent_from: Option<usize>,
    pub quiet: bool,
}

#[derive(Clone, Serialize)]
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
    /// The untimed first batch, each op synchronized: it pays one-time set-up (cuBLAS
    /// picking kernels for new shapes, the memory pool growing).
    pub first_batch_seconds: f64,
    /// That batch's ops: where the one-time set-up goes.
    pub first_batch_ops: Vec<OpShare>,
    /// Seconds per batch of each timed iteration.
    pub batch_seconds: Vec<f64>,
    pub median_batch_seconds: f64,
    pub tokens_per_second: f64,
    /// 2 x params x tokens / time (the attention's own FLOPs are not counted).
    pub effective_tflops: f64,
    /// The sustained GEMM peak (`GemmPeak::sustained`) and this run's share of it.
    pub gemm_peak_tflops: Option<f64>,
    pub share_of_gemm_peak: Option<f64>,
    /// The same products' rate in a burst of 10, before the clocks settle.
    pub gemm_burst_tflops: Option<f64>,
    pub peak_device_memory_bytes: Option<u64>,
    pub checkpoint_bytes: u64,
    /// One profiled batch, every op synchronized: shares of its time.
    pub ops: Vec<OpShare>,
}

/// Measures `settings`' checkpoint on the device `req` names.
pub fn bench(req: &DeviceRequest, settings: &BenchSettings) -> anyhow::Result<BenchReport> {
    let ckpt = Checkpoint::open(&settings.model)?;
    if settings.ctx > ckpt.config.max_position_embeddings {
        anyhow::bail!(crate::Error::ContextTooLong {
            ctx: settings.ctx,
            max: ckpt.config.max_position_embeddings
        });
    }
    if settings.batch == 0 {
        anyhow::bail!("--batch must be at least 1");
    }
    with_backend(
        req,
        ckpt.config.auto_activation_dtype(),
        BenchJob {
            settings,
            ckpt: &ckpt,
        },
    )
}

/// How long the sustained GEMM peak runs: a power-capped GPU lowers its clocks within about a
/// second of dense GEMMs (an H100 SXM at 700 W: 1,980 -> ~1,350 MHz; docs/decisions.md:
/// Sustained, not burst, GEMM peak), so a
/// burst of products measures a rate no workload of seconds can keep.
const SUSTAINED_PEAK_SECONDS: f64 = 2.0;

/// The device's dense GEMM throughput in its activation type, through the same `linear` every
/// dense layer runs: square products of the largest size up to 8192 that takes under 50 ms
/// once warm (so a CPU measures in seconds), random operands (zeros run faster than real
/// data).
#[derive(Clone, Copy, Debug)]
pub struct GemmPeak {
    /// TFLOP/s of 10 products timed after warm-ups.
    pub burst: f64,
    /// TFLOP/s over `SUSTAINED_PEAK_SECONDS` of products right after the burst: the peak a
    /// batch of that length can reach, which bench's shares are of.
    pub sustained: f64,
}

pub fn gemm_peak_tflops<B: Backend>(b: &B) -> anyhow::Result<GemmPeak> {
    use crate::numerics::FloatType;
    use crate::synth::linear::{LinearSpec, WeightKind};
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15);
    let mut n = 1024;
    loop {
        let weight = LinearSpec::new(WeightKind::Dense(FloatType::Bf16), n, n, FloatType::Bf16)
            .build(&mut rng);
        let w = b.upload_linear(&weight.qlinear())?;
        let x = b
            .upload_activation(&rng.normal_vec(n * n, 1.0))?
            .reshaped(n, n)?;
        let time = |reps: usize| -> anyhow::Result<f64> {
            let start = Instant::now();
            for _ in 0..reps {
                drop(b.linear(&x, &w)?);
            }
            b.synchronize()?;
            Ok(start.elapsed().as_secs_f64() / reps as f64)
        };
        // The first product of a size pays for library set-up and kernel selection.
        time(1)?;
        if n < 8192 && time(1)? < 0.05 / 8.0 {
            n *= 2;
            continue;
        }
        time(2)?;
        let flop = 2.0 * (n as f64).powi(3) / 1e12;
        let one = time(10)?;
        let reps = (SUSTAINED_PEAK_SECONDS / one).ceil() as usize;
        return Ok(GemmPeak {
            burst: flop / one,
            sustained: flop / time(reps.max(1))?,
        });
    }
}

struct BenchJob<'a> {
    settings: &'a BenchSettings,
    ckpt: &'a Checkpoint,
}

impl OnBackend for BenchJob<'_> {
    type Output = BenchReport;
    const ONE_DEVICE: bool = true;

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<BenchReport> {
        let a = self.settings;
        let cfg = &self.ckpt.config;
        let b = Profiled::new(&backends[0]);
        let t0 = Instant::now();
        // The timed batches come after a warm-up batch of their own.
        let batches = LoadFor::positions(a.ctx);
        let mut model = load_replicas(std::slice::from_ref(&b), self.ckpt, batches, a.quiet)?
            .pop()
            .ok_or_else(|| anyhow::anyhow!("no model loaded"))?;
        if let Some(times) = a.sparse_latent_from {
            model.set_latent_from(times);
        }
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
        // The warm-up, the timed batches and the profiled one: on a first run the warm-up also
        // compiles every kernel (a 30B mixture's took 92-103 s on a fresh H200), so the bar
        // says that it is under way.
        let batches = 1 + if a.iters > 0 { a.iters + 1 } else { 0 };
        let bar = progress_bar((batches * tokens) as u64, "warm-up", a.quiet);
        let forward = || -> anyhow::Result<f64> {
            let start = Instant::now();
            let nll = model.nll(&b, &ids, &layout, &targets)?;
            b.synchronize()?;
            bar.inc(tokens as u64);
            bar.set_message("tokens");
            if let Some(i) = nll.iter().position(|v| !v.is_finite()) {
                anyhow::bail!(crate::Error::NonFinite {
                    what: "NLL",
                    window: i / a.ctx,
                    position: i % a.ctx
                });
            }
            Ok(start.elapsed().as_secs_f64())
        };
        let shares = |total: f64| -> Vec<OpShare> {
            b.take()
                .into_iter()
                .map(|(op, d, calls)| OpShare {
                    op,
                    calls,
                    seconds: d.as_secs_f64(),
                    share: d.as_secs_f64() / total,
                })
                .collect()
        };
        b.set_enabled(true);
        let first_batch_seconds = forward()?;
        b.set_enabled(false);
        let first_batch_ops = shares(first_batch_seconds);
        let (batch_seconds, ops) = match a.iters {
            // One batch only (a window too long to run three times): the profiled first batch
            // is the measurement, its one-time set-up included.
            0 => (vec![first_batch_seconds], first_batch_ops.clone()),
            iters => {
                let mut batch_seconds = Vec::with_capacity(iters);
                for _ in 0..iters {
                    batch_seconds.push(forward()?);
                }
                b.set_enabled(true);
                let profiled_total = forward()?;
                b.set_enabled(false);
                (batch_seconds, shares(profiled_total))
            }
        };
        bar.finish_and_clear();
        let mut sorted = batch_seconds.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let params = cfg.matmul_params();
        let effective = 2.0 * params as f64 * tokens as f64 / median / 1e12;
        let peak = gemm_peak_tflops(&backends[0])?;
        Ok(BenchReport {
            model: a.model.display().to_string(),
            backend: b.name(),
            params_in_matmuls: params,
            ctx: a.ctx,
            batch: a.batch,
            tokens_per_batch: tokens,
            load_seconds,
            first_batch_seconds,
            first_batch_ops,
            batch_seconds,
            median_batch_seconds: median,
            tokens_per_second: tokens as f64 / median,
            effective_tflops: effective,
            gemm_peak_tflops: Some(peak.sustained),
            share_of_gemm_peak: Some(effective / peak.sustained),
            gemm_burst_tflops: Some(peak.burst),
            peak_device_memory_bytes: b.peak_memory_bytes(),
            checkpoint_bytes: self.ckpt.store.total_bytes(),
            ops,
        })
    }
}
