//! Command-line front end: one module per subcommand, each an `Args` struct and a `run`.

pub mod bench;
pub mod check;
pub mod compare;
pub mod devices;
pub mod eval;
pub mod inspect;
pub mod merge;
pub mod runfile;
pub mod synth;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, cuda_available};
use crate::backend::wgpu::{WgpuBackend, list_adapters};
use crate::data::TextView;
use crate::eval::Method;
use crate::eval::setup::PlanSettings;
use crate::numerics::FloatType;

#[derive(Parser)]
#[command(
    name = "quantppl",
    version,
    about = "Exact perplexity and KL divergence of quantized LLM checkpoints, read as they are on disk",
    long_about = "Exact perplexity and KL divergence of quantized LLM checkpoints \
        (compressed-tensors INT4/INT8, NVFP4, FP8; dense BF16/F16/F32), read as they are on \
        disk and kept packed. Reproduces the window and scoring rules of ExLlamaV3, llama.cpp, \
        the GPTQ papers, the transformers guide and lm-eval.\n\n\
        Run `quantppl eval` with no arguments to evaluate the bundled INT4 model on the bundled \
        WikiText-2 test set."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Perplexity of one model on a text, with a method of your choice.
    Eval(eval::Args),
    /// Quantized models against their base: PPL ratio, exact full-vocabulary KL divergence,
    /// top-1 agreement (llama.cpp's statistics, ExLlamaV3's confidence buckets).
    #[command(long_about = compare::LONG_ABOUT)]
    Compare(compare::Args),
    /// Combine the partial files of a run split with --shard K/N into its report.
    Merge(merge::Args),
    /// Architecture, every linear's quantization scheme, bits per weight, memory needed.
    Inspect(inspect::Args),
    /// Every backend op against the CPU reference, then the bundled model against its reference values.
    Check(check::Args),
    /// Write a random-weight compressed-tensors checkpoint of a real model's shape (benchmarks).
    Synth(synth::Args),
    /// Forward throughput on random tokens: tokens/s, effective TFLOP/s, time per op, memory.
    Bench(bench::Args),
    /// List the CUDA GPUs and wgpu adapters (backend, driver, limits, features).
    Devices(devices::Args),
}

/// Which compute backend runs the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// The best available: CUDA, then a discrete wgpu adapter, then the CPU.
    Auto,
    /// The f32 reference implementation on all CPU cores.
    Cpu,
    /// NVIDIA GPU 0 through CUDA: cuBLAS GEMMs, weights packed on the device (see --dtype).
    Cuda,
    /// Any Vulkan / Metal / DX12 GPU through wgpu: f32 activations, weights packed on the
    /// device and dequantized inside the matmul tiles.
    Wgpu,
}

/// Precision of the activations on a GPU backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ActDtype {
    /// f32 for float32 checkpoints, bf16 for every other.
    Auto,
    /// f32 activations and GEMMs (no TF32): per-token NLL within 1e-3 of the f32 reference.
    F32,
    /// bf16 activations, tensor-core GEMMs with f32 accumulation: the fast path.
    Bf16,
}

#[derive(clap::Args, Clone, Debug)]
pub struct BackendArgs {
    /// Compute backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    pub backend: BackendKind,
    /// wgpu adapter index, in the order `backend::wgpu::list_adapters` gives them
    /// (default: the best one, discrete GPUs first).
    #[arg(long, value_name = "N")]
    pub adapter: Option<usize>,
    /// Tokens per forward batch (default: sized from the device's memory; 4 x ctx on the CPU).
    #[arg(long, value_name = "N")]
    pub batch_tokens: Option<usize>,
    /// GPUs to use, e.g. `0,1` (CUDA ordinals; default: every visible GPU for eval and compare
    /// with --backend cuda, GPU 0 otherwise; check and bench use the first listed). With --backend cpu, N ids make N CPU workers (a stand-in for tests).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub devices: Vec<usize>,
    /// How several devices share the work: `data` = a full model replica per device, windows
    /// dealt out; `layers` = the decoder layers split across devices in proportion to free
    /// memory, batches pipelined through them; `auto` = data when a replica fits every device.
    /// The report's `parallel` says which was used (`single`, `data`, `layers 0..16, 16..32`;
    /// for a resumed or merged run, each placement that computed some windows, joined by `; `).
    #[arg(long, value_enum, default_value_t = Parallel::Auto)]
    pub parallel: Parallel,
    /// Activation precision on a CUDA GPU (the CPU and wgpu backends compute in f32).
    #[arg(long, value_enum, default_value_t = ActDtype::Auto)]
    pub dtype: ActDtype,
}

impl BackendArgs {
    /// The CUDA activation type for a checkpoint of dtype `model`.
    pub fn activation_type(&self, model: FloatType) -> FloatType {
        match (self.dtype, model) {
            (ActDtype::F32, _) | (ActDtype::Auto, FloatType::F32) => FloatType::F32,
            _ => FloatType::Bf16,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Parallel {
    Auto,
    Data,
    Layers,
}

/// How input activations are treated where the checkpoint declares activation quantization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Activations {
    /// Fake-quantize activations exactly as compressed-tensors does (NVFP4 W4A4, FP8/INT8 W8A8).
    Declared,
    /// Keep activations unquantized (what vLLM runs for NVFP4 W4A4 on Hopper).
    WeightOnly,
}

#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model directory (config.json, *.safetensors, tokenizer.json). Default: the bundled
    /// INT4 stories260K model.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// tokenizer.json to use instead of the model directory's own (e.g. for `synth`
    /// checkpoints, which have none). Its ids must fit the model's vocabulary.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Activation quantization declared by the checkpoint: emulated, or skipped.
    #[arg(long, value_enum, default_value_t = Activations::Declared)]
    pub activations: Activations,
}

#[derive(clap::Args, Clone, Debug)]
pub struct DataArgs {
    /// Text to evaluate: a raw text file, or .jsonl with a `text` field per line. Default: the
    /// bundled WikiText-2 raw test file (wiki.test.raw).
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// How the text file is read: `raw` = the file as one string (llama.cpp); `hf-rows` = the
    /// Hugging Face row view joined with "\n\n" (GPTQ papers, transformers guide, ExLlamaV3
    /// before 2026-05); `hf-rows-nonempty` = the same without empty rows (ExLlamaV3 now).
    #[arg(long, value_enum, default_value_t = TextView::Raw)]
    pub text: TextView,
    /// Window and scoring rule: exl3 (overlapping rows, all positions scored), llamacpp (BOS-led
    /// chunks, second half scored, with stderr), gptq (disjoint windows), hf-stride (each token
    /// once), lm-eval (rolling windows per document; word/byte perplexity).
    #[arg(long, value_enum, default_value_t = Method::Exl3)]
    pub method: Method,
    /// Window length in tokens. Default: min(2048, max_position_embeddings).
    #[arg(long, value_name = "N")]
    pub ctx: Option<usize>,
    /// Distance between window starts (exl3, hf-stride). Default: ctx/4.
    #[arg(long, value_name = "N")]
    pub stride: Option<usize>,
    /// Cap on the number of windows (exl3 rows, llama.cpp chunks, gptq rows). Default: 100 for
    /// exl3 (as ExLlamaV3), all for the others.
    #[arg(long, value_name = "N")]
    pub rows: Option<usize>,
}

impl DataArgs {
    pub fn settings(&self) -> PlanSettings {
        PlanSettings {
            data: self.data.clone(),
            text: self.text,
            method: self.method,
            ctx: self.ctx,
            stride: self.stride,
            rows: self.rows,
        }
    }
}

/// Something a command runs on any backend: called once with the chosen backends.
pub trait OnBackend {
    type Output;
    /// The job runs on one device: without --devices it gets GPU 0, not every visible GPU.
    const ONE_DEVICE: bool = false;
    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<Self::Output>;
}

/// Picks the backend(s) for `args` and runs `job` on them; `model_dtype` is the checkpoint's
/// dtype, from which CUDA backends choose their activation precision under `--dtype auto`.
pub fn with_backend<J: OnBackend>(
    args: &BackendArgs,
    model_dtype: FloatType,
    job: J,
) -> anyhow::Result<J::Output> {
    let act = args.activation_type(model_dtype);
    // The GPUs of --devices, else `default` (every visible GPU, or GPU 0).
    let cuda = |default: Vec<usize>| -> crate::Result<Vec<CudaBackend>> {
        let ordinals = if args.devices.is_empty() {
            default
        } else {
            args.devices.clone()
        };
        ordinals
            .iter()
            .map(|&i| CudaBackend::with_activation_type(i, act))
            .collect()
    };
    match args.backend {
        BackendKind::Cpu => {
            let n = args.devices.len().max(1);
            job.run(&(0..n).map(|_| CpuBackend::new()).collect::<Vec<_>>())
        }
        BackendKind::Cuda => {
            let count = cuda_available()
                .map_err(|e| anyhow::anyhow!("cuda: {e}"))?
                .device_count;
            let count = if J::ONE_DEVICE { count.min(1) } else { count };
            job.run(&cuda((0..count).collect())?)
        }
        BackendKind::Wgpu => job.run(&[WgpuBackend::new(args.adapter)?]),
        BackendKind::Auto => match cuda_available() {
            Ok(_) => job.run(&cuda(vec![0])?),
            Err(_) => match list_adapters()
                .iter()
                .find(|a| a.device_type == "DiscreteGpu")
            {
                Some(a) => job.run(&[WgpuBackend::new(Some(a.index))?]),
                None => job.run(&[CpuBackend::new()]),
            },
        },
    }
}

/// Writes `value` as pretty JSON to `path` (`-` = stdout).
pub fn write_json<T: serde::Serialize>(path: &std::path::Path, value: &T) -> anyhow::Result<()> {
    use anyhow::Context;
    let text = serde_json::to_string_pretty(value)?;
    if path.as_os_str() == "-" {
        println!("{text}");
    } else {
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// A progress bar on stderr; invisible when stderr is not a terminal or `quiet`.
pub fn progress_bar(len: u64, what: &str, quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    let style = indicatif::ProgressStyle::with_template(
        "{msg:>10} [{bar:32}] {human_pos}/{human_len} {per_sec} ETA {eta}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}
