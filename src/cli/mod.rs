//! Command-line front end: one module per subcommand, each an `Args` struct and a `run`.

pub mod bench;
pub mod check;
pub mod compare;
pub mod devices;
pub mod eval;
pub mod inspect;
pub mod merge;
pub mod serve;
pub mod synth;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::backend::options::BackendOptions;
use crate::data::TextView;
use crate::plan::{Method, PlanSettings};
use crate::report::svg::svg_scatter;
use crate::report::{PlotMetric, Rendered};
pub use crate::run::devices::{OnBackend, progress_bar, with_backend};
use crate::run::record::Shard;
use crate::run::{
    ActDtype, Activations, BackendKind, DeviceRequest, Parallel, RecordOptions, RunOptions,
};

#[derive(Parser)]
#[command(
    name = "quantppl",
    version,
    about = "Exact perplexity and KL divergence of quantized LLM checkpoints, read as they are on disk",
    long_about = "Exact perplexity and KL divergence of quantized LLM checkpoints \
        (compressed-tensors INT4/INT8, NVFP4, FP8; GPTQ and AutoAWQ; dense BF16/F16/F32), read as they are on \
        disk and kept packed. Reproduces the window and scoring rules of ExLlamaV3, llama.cpp, \
        the GPTQ papers, the transformers guide and lm-eval.\n\n\
        Run `quantppl eval` with no arguments to evaluate the bundled INT4 model on the bundled \
        WikiText-2 test set."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// No progress bars or notes on stderr (any subcommand; the report and errors are always
    /// printed).
    #[arg(long, short, global = true)]
    pub quiet: bool,
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
    /// An OpenAI-compatible scoring server (exact prompt logprobs) for lm-evaluation-harness.
    #[command(long_about = serve::LONG_ABOUT)]
    Serve(serve::Args),
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
    /// Tokens per forward batch (default: sized from the device's memory, but small enough to
    /// give every replica a batch and each stage of a layer split four, and a mixture's
    /// experts no more than 16,384 routed rows each; evened out over the batches; 4 x ctx on
    /// the CPU).
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
    /// Activation precision on a CUDA GPU; on wgpu with cooperative matrices how the linears
    /// multiply (`f32`/`f32-grade`: f32-grade products; `f16`, and `auto` for all but float32
    /// checkpoints: one f16 product); the CPU computes in f32.
    #[arg(long, value_enum, default_value_t = ActDtype::Auto)]
    pub dtype: ActDtype,
}

#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model directory (config.json, *.safetensors, tokenizer.json), a llama.cpp GGUF file
    /// (or a directory holding one; split files: the first part), or a Hugging Face
    /// repository id `org/name[@revision]` found offline in the local hub cache. Default (or
    /// `bundled`): the bundled INT4 stories260K model.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// tokenizer.json to use instead of the model's own (for a checkpoint without one, or to
    /// score another tokenization): the file, a directory holding it, a GGUF file (its
    /// vocabulary), or a hub repository id `org/name[@revision]` in the local cache
    /// (`bundled`: the bundled model's). A GGUF model's own is its metadata's (byte-level BPE
    /// vocabularies; others take a tokenizer.json beside the file). Its ids must fit the
    /// model's vocabulary.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Activation quantization declared by the checkpoint: emulated, or skipped.
    #[arg(long, value_enum, default_value_t = Activations::Declared)]
    pub activations: Activations,
}

#[derive(clap::Args, Clone, Debug)]
pub struct DataArgs {
    /// Text to evaluate: a text file; `.jsonl`, `.jsonl.gz` or `.parquet` rows (the `--field`
    /// of each, joined with "\n\n"); `-` for standard input (text, or JSONL with --field); or
    /// a named data set found offline in the Hugging Face hub cache: wikitext-2-raw-v1,
    /// wikitext-103-raw-v1 (test split), ptb, ptb-new, c4, c4-new (the GPTQ code's evaluation
    /// sets; c4 is its 256 sampled windows and needs --method gptq). Default: the bundled
    /// WikiText-2 raw test file (wiki.test.raw).
    #[arg(long, value_name = "FILE|-|NAME")]
    pub data: Option<PathBuf>,
    /// The string field of JSONL or parquet rows.
    #[arg(long, value_name = "NAME")]
    pub field: Option<String>,
    /// How the text is read: `raw` = the file as one string (llama.cpp; the default for a
    /// text file); `hf-rows` = the Hugging Face row view joined with "\n\n" (GPTQ papers,
    /// transformers guide, ExLlamaV3 before 2026-05; the default for rows, which are joined
    /// as they are); `hf-rows-nonempty` = the same without empty rows (ExLlamaV3 now).
    #[arg(long, value_enum)]
    pub text: Option<TextView>,
    /// Window and scoring rule: exl3 (overlapping rows, all positions scored), llamacpp (BOS-led
    /// chunks, second half scored, with stderr), gptq (disjoint windows), hf-stride (each token
    /// once), lm-eval (rolling windows per document; word/byte perplexity). Default: exl3, or
    /// llamacpp for a GGUF model (llama-perplexity's windows).
    #[arg(long, value_enum)]
    pub method: Option<Method>,
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

impl BackendArgs {
    /// The devices these flags ask for, with the development switches of `QUANTPPL_DEV`.
    pub fn request(&self) -> anyhow::Result<DeviceRequest> {
        Ok(DeviceRequest {
            backend: self.backend,
            adapter: self.adapter,
            devices: self.devices.clone(),
            dtype: self.dtype,
            options: BackendOptions::from_env()?,
        })
    }

    /// How a run uses the devices, recording its windows as `records` say.
    pub fn run_options(&self, records: &RecordArgs, quiet: bool) -> anyhow::Result<RunOptions> {
        if self.batch_tokens == Some(0) {
            anyhow::bail!("--batch-tokens must be at least 1");
        }
        Ok(RunOptions {
            records: records.options(),
            batch_tokens: self.batch_tokens,
            parallel: self.parallel,
            quiet,
        })
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct RecordArgs {
    /// Record every finished window in FILE (appended and fsync'ed as the run goes) and, when
    /// FILE exists, continue the run it belongs to: only the missing windows are evaluated
    /// and the report's numbers are identical to an uninterrupted run's. A file written with
    /// other settings or another model is refused. With --shard this is the partial result
    /// file that `quantppl merge` combines (`--partial` is the same option).
    #[arg(long, visible_alias = "partial", value_name = "FILE")]
    pub resume: Option<PathBuf>,
    /// Evaluate only the K-th of N disjoint window sets (windows i with i % N == K-1) and
    /// record them in --partial FILE; `quantppl merge` combines the N files into the report
    /// a single run would give, digit for digit. `auto`: K and N from the scheduler's array
    /// job (Slurm's SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT, or a Kubernetes Indexed
    /// Job's JOB_COMPLETION_INDEX with JOB_COMPLETIONS set to its completions).
    #[arg(long, value_name = "K/N", requires = "resume")]
    pub shard: Option<Shard>,
}

impl RecordArgs {
    pub fn options(&self) -> RecordOptions {
        RecordOptions {
            resume: self.resume.clone(),
            shard: self.shard,
        }
    }
}

impl DataArgs {
    pub fn settings(&self) -> PlanSettings {
        PlanSettings {
            data: self.data.clone(),
            field: self.field.clone(),
            text: self.text,
            method: self.method,
            ctx: self.ctx,
            stride: self.stride,
            rows: self.rows,
        }
    }
}

/// Where a report goes besides stdout (eval, compare, merge).
#[derive(clap::Args, Clone, Debug)]
pub struct OutputArgs {
    /// Also write the report as JSON to FILE; `-` = stdout, which then holds only the JSON
    /// (the human report goes to stderr).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write a Markdown table for a model card (model, bits/weight, size, PPL; for compare
    /// also PPL ratio, KLD, same top p) to FILE.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// Write an SVG scatter of --plot-metric against bits per weight, one labelled point per
    /// model, to FILE.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// The y axis of --plot (all but ppl: compare only).
    #[arg(long, value_enum, default_value_t = PlotMetric::Ppl)]
    pub plot_metric: PlotMetric,
}

impl OutputArgs {
    /// The files this writes.
    pub fn paths(&self) -> impl Iterator<Item = &std::path::Path> {
        [&self.json, &self.markdown, &self.plot]
            .into_iter()
            .filter_map(|p| p.as_deref())
    }
}

/// Prints `report` and writes the files `out` asks for.
pub fn emit<R: Rendered>(report: &R, out: &OutputArgs) -> anyhow::Result<()> {
    // A metric the report lacks fails before anything is written.
    let plot = match &out.plot {
        Some(path) => Some((path, report.plot_points(out.plot_metric)?)),
        None => None,
    };
    print_output(&report.to_text(), out.json.as_deref(), report)?;
    if let Some(path) = &out.markdown {
        let md = report.to_markdown();
        crate::report::write_whole(path, |w| w.write_all(md.as_bytes()))?;
    }
    if let Some((path, (points, y))) = plot {
        let svg = svg_scatter(&points, "bits per weight (decoder linears)", &y);
        crate::report::write_whole(path, |w| w.write_all(svg.as_bytes()))?;
    }
    Ok(())
}

/// Prints a command's human report `text` and writes `value` as JSON where `json` says. With
/// `--json -` stdout holds exactly one JSON document and the text goes to stderr.
pub fn print_output<T: serde::Serialize>(
    text: &str,
    json: Option<&std::path::Path>,
    value: &T,
) -> anyhow::Result<()> {
    if json.is_some_and(|p| p.as_os_str() == "-") {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
    if let Some(path) = json {
        write_json(path, value)?;
    }
    Ok(())
}

/// Fails, before anything is loaded or computed, when an output file cannot be written: a
/// missing or unwritable directory, a directory given as the file. A missing file is probed
/// through the temporary file beside it that the report is later written through (removed
/// again); the target itself is never created empty.
///
/// Also refuses an output that names an input (`inputs`: the files the command reads) or
/// another output: writing it would destroy what the run reads or what it wrote first.
pub fn check_writable<'a>(
    outputs: impl IntoIterator<Item = &'a std::path::Path>,
    inputs: impl IntoIterator<Item = &'a std::path::Path>,
) -> anyhow::Result<()> {
    let outputs: Vec<&std::path::Path> = outputs
        .into_iter()
        .filter(|p| p.as_os_str() != "-")
        .collect();
    let inputs: Vec<(std::path::PathBuf, &std::path::Path)> =
        inputs.into_iter().map(|p| (file_identity(p), p)).collect();
    let mut written: Vec<(std::path::PathBuf, &std::path::Path)> = Vec::new();
    for &path in &outputs {
        let id = file_identity(path);
        if let Some((_, input)) = inputs.iter().find(|(i, _)| *i == id) {
            anyhow::bail!(
                "{}: the output is the input {}: writing it would destroy it",
                path.display(),
                input.display()
            );
        }
        if let Some((_, first)) = written.iter().find(|(w, _)| *w == id) {
            anyhow::bail!(
                "{}: given for two outputs (also as {}): one would overwrite the other",
                path.display(),
                first.display()
            );
        }
        written.push((id, path));
    }
    for path in outputs {
        if path.as_os_str() == "-" {
            continue;
        }
        let cannot =
            |e: std::io::Error| anyhow::anyhow!("{}: cannot be written: {e}", path.display());
        if path.exists() {
            std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .map_err(cannot)?;
        } else {
            // Probe with the temporary file the report will be written through, never with
            // the target itself: a kill here must not leave an empty report behind.
            let probe = crate::report::temp_beside(path)?;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&probe)
                .map_err(cannot)?;
            let _ = std::fs::remove_file(&probe);
        }
    }
    Ok(())
}

/// What names the same file as `path` names: its canonical path, or for a file not yet
/// written its directory's canonical path and its name.
fn file_identity(path: &std::path::Path) -> std::path::PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    match (dir.canonicalize(), path.file_name()) {
        (Ok(d), Some(name)) => d.join(name),
        _ => path.to_path_buf(),
    }
}

/// Writes `value` as pretty JSON to `path` (`-` = stdout).
pub fn write_json<T: serde::Serialize>(path: &std::path::Path, value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    if path.as_os_str() == "-" {
        println!("{text}");
    } else {
        crate::report::write_whole(path, |w| writeln!(w, "{text}"))?;
    }
    Ok(())
}

/// Tells, on stderr, that a `--shard K/N` run finished its windows and how to combine them.
pub fn report_shard_done(records: &RecordArgs, n_windows: usize, quiet: bool) {
    if quiet {
        return;
    }
    let shard = records.options().shard();
    let path = records
        .resume
        .as_deref()
        .unwrap_or(std::path::Path::new("-"));
    eprintln!(
        "shard {shard}: {} windows recorded in {}; combine all {} shards with `quantppl merge`",
        shard.windows(n_windows).len(),
        path.display(),
        shard.n
    );
}
