//! `quantppl compare`: quantized models against their base on the same windows.

use std::path::PathBuf;

use anyhow::bail;

use super::{
    BackendArgs, DataArgs, OutputArgs, RecordArgs, check_writable, emit, report_shard_done,
};
use crate::report::CompareReport;
use crate::run::{Activations, CompareRun, OpenedModel, open_model};

/// `--base bundled`: the bundled dense stories260K.
const BUNDLED: &str = "bundled";

/// `quantppl compare --help`'s long description (set on the subcommand in cli/mod.rs, where
/// the one-line doc comment would otherwise take its place).
pub const LONG_ABOUT: &str = "Perplexity and KL divergence of quantized models against their base, \
    on the same windows (the plan is built once, from the base's tokenizer).\n\n\
    Memory: the base and ONE quantized model are resident on the backend at the same time \
    (the base stays loaded, the quantized models are loaded one after another), plus the \
    activations of both for one batch. On several devices, --parallel places them as for \
    `eval`, chosen for the base and the largest quantized model together: both replicated on \
    every device, or both models' layers split across the devices in the same proportions, \
    their batches pipelined side by side and compared on the last device. No logits are \
    stored anywhere: each batch runs the base and the quantized model, and the backend \
    reduces both logit rows to the KL divergence KL(P_base || Q), the two target NLLs and \
    the top-1 agreement. The KL divergence is exact over the full vocabulary: no 16-nat \
    truncation and no uint16 compression (llama.cpp), no top-k (vLLM).\n\n\
    Statistics: llama.cpp's `--kl-divergence` report (PPL ratio, KLD percentiles, RMS Δp, \
    same top p, each ± one standard error) over the method's scored positions, plus \
    ExLlamaV3's KLD by the base's top-token probability.\n\n\
    With no model arguments, compares the bundled INT4 stories260K with its bundled dense base.";

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Quantized model directories (default with no --base: the bundled INT4 model).
    #[arg(value_name = "QUANT_DIR")]
    pub quants: Vec<PathBuf>,
    /// The base (unquantized) model directory; `bundled` = the bundled dense stories260K.
    /// Its tokenizer builds the windows every model is scored on.
    #[arg(long, value_name = "DIR")]
    pub base: Option<PathBuf>,
    /// tokenizer.json to use instead of the base directory's own (a file, a directory, or a
    /// hub repository id `org/name[@revision]` in the local cache).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Activation quantization declared by the checkpoints: emulated, or skipped.
    #[arg(long, value_enum, default_value_t = Activations::Declared)]
    pub activations: Activations,
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub records: RecordArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub fn run(args: Args, quiet: bool) -> anyhow::Result<()> {
    check_writable(args.output.paths().chain(args.records.resume.as_deref()))?;
    let (base_dir, base_name, quants) = match (&args.base, args.quants.is_empty()) {
        (None, true) => (
            crate::assets::dense_model_dir()?,
            crate::assets::DENSE_MODEL_NAME.to_string(),
            vec![(
                crate::assets::default_model_dir()?,
                crate::assets::DEFAULT_MODEL_NAME.to_string(),
            )],
        ),
        (None, false) => bail!("--base DIR is required to compare quantized models"),
        (Some(_), true) => bail!("give at least one quantized model directory after --base DIR"),
        (Some(b), false) => {
            let (dir, name) = if b.as_os_str() == BUNDLED {
                (
                    crate::assets::dense_model_dir()?,
                    crate::assets::DENSE_MODEL_NAME.to_string(),
                )
            } else {
                (b.clone(), b.display().to_string())
            };
            let quants = args
                .quants
                .iter()
                .map(|q| (q.clone(), q.display().to_string()))
                .collect();
            (dir, name, quants)
        }
    };
    let base =
        open_model(Some(&base_dir), args.tokenizer.as_deref(), args.activations).map(|m| {
            OpenedModel {
                name: base_name,
                ..m
            }
        })?;
    let run = CompareRun::prepare(base, quants, &args.data.settings(), args.activations)?;
    let options = args.backend.run_options(&args.records, quiet);
    match run.run(&args.backend.request(), &options)? {
        Some(f) => emit(
            &CompareReport::new(
                &f.info,
                &f.results,
                &f.placements,
                f.timing.forwarded,
                f.timing.wall_seconds,
                f.peak_memory,
            ),
            &args.output,
        ),
        None => {
            report_shard_done(&args.records, run.prepared.plan.windows.len(), quiet);
            Ok(())
        }
    }
}
