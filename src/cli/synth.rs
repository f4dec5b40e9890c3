//! `quantppl synth`: a random-weight checkpoint of a real model's shape, for benchmarks.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};

use std::fmt::Write as _;

use super::print_output;
use crate::synth::{SynthScheme, SynthShape};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Model shape (published configs of these models).
    #[arg(long, value_enum)]
    pub shape: SynthShape,
    /// On-disk format of the decoder linears (embeddings, norms and lm_head stay BF16).
    #[arg(long, value_enum)]
    pub scheme: SynthScheme,
    /// Output directory (created; must be empty or absent).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Write only the first N decoder layers (with the embedding, final norm and lm_head): a
    /// slice of a model too large for the disk or the GPU, for benchmarks.
    #[arg(long, value_name = "N")]
    pub layers: Option<usize>,
    /// Seed of the weights: the same seed gives the same bytes; schemes share the dense model.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write the summary as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

pub fn run(args: Args, quiet: bool) -> anyhow::Result<()> {
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        let style = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        ProgressBar::new(0).with_style(style)
    };
    let s = crate::synth::run(
        args.shape,
        args.layers,
        args.scheme,
        &args.out,
        args.seed,
        |p| {
            bar.set_length(p.bytes_total);
            bar.set_position(p.bytes_done);
            bar.set_message(p.tensor.to_string());
        },
    )?;
    bar.finish_and_clear();
    let mut out = String::new();
    writeln!(
        out,
        "wrote {} ({} layers, {} params, {} tensors in {} shard(s), {}) in {:.1} s",
        s.out_dir.display(),
        s.layers,
        crate::units::human_count(s.params),
        s.tensors,
        s.shards,
        crate::units::human_bytes(s.bytes_written),
        s.seconds
    )?;
    print_output(&out, args.json.as_deref(), &s)
}
