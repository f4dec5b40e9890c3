//! `quantppl serve`: the OpenAI-compatible scoring server (`crate::serve`).

use super::{BackendArgs, ModelArgs};
use crate::run::open_model;
use crate::serve::{ServeOptions, serve};

/// `quantppl serve --help`'s long description.
pub const LONG_ABOUT: &str = "An OpenAI-compatible scoring server: POST /v1/completions returns \
    the exact log-probability of every prompt token (`echo: true`), the top-N tokens of each \
    position from the full vocabulary (`logprobs: N`) and, with `max_tokens: 1`, the greedy next \
    token, computed from the packed weights. lm-evaluation-harness's `local-completions` model \
    runs its loglikelihood tasks (wikitext, multiple choice) through it; generation beyond one \
    token is refused (400). Also GET /v1/models, GET /health, GET /tokenizer_info, \
    POST /tokenize, POST /detokenize.\n\n\
    Prompts of all clients are batched into forward batches of up to --max-batch-tokens tokens; \
    on several GPUs (--devices) each holds a replica serving batches of its own, or the layers \
    are split across them (--parallel), as for `eval`. A full queue answers 503 with Retry-After; a prompt longer than the model's \
    context, malformed JSON or a wrong field answers 400 naming it. Binds to 127.0.0.1 unless \
    --host says otherwise; give --api-key (or QUANTPPL_API_KEY) before exposing it. SIGTERM \
    or Ctrl-C stops it after the running requests.";

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Tokens per forward batch (prompts of several requests share a batch; a longer prompt
    /// runs alone). Default: --batch-tokens, else 4096.
    #[arg(long, value_name = "N")]
    pub max_batch_tokens: Option<usize>,
    /// Prompts waiting to be scored at most; beyond, requests are answered 503.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub queue: usize,
    /// Longest prompt served, in tokens (longer ones are answered 400); the RoPE tables and
    /// every per-position buffer are sized for it. Default: min(max_position_embeddings,
    /// 32768), so a config claiming millions of positions does not allocate for them.
    #[arg(long, value_name = "N")]
    pub context: Option<usize>,
    /// Require `Authorization: Bearer KEY` (the scheme in any case) on every request but
    /// `/health`.
    #[arg(
        long,
        value_name = "KEY",
        env = "QUANTPPL_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
}

/// `--context`'s cap on what `max_position_embeddings` claims.
const DEFAULT_CONTEXT: usize = 32768;

pub fn run(args: Args, quiet: bool) -> anyhow::Result<()> {
    let m = &args.model;
    let max_batch_tokens = args
        .max_batch_tokens
        .or(args.backend.batch_tokens)
        .unwrap_or(4096);
    if max_batch_tokens == 0 || args.queue == 0 || args.context == Some(0) {
        anyhow::bail!("--max-batch-tokens, --queue and --context must be at least 1");
    }
    let model = open_model(m.model.as_deref(), m.tokenizer.as_deref(), m.activations)?;
    let max_positions = model.ckpt.config.max_position_embeddings;
    let context = match args.context {
        Some(n) if n > max_positions => anyhow::bail!(
            "--context {n} is longer than the model allows (max_position_embeddings = {max_positions})"
        ),
        Some(n) => n,
        None => max_positions.min(DEFAULT_CONTEXT),
    };
    serve(
        model,
        &args.backend.request()?,
        ServeOptions {
            host: args.host,
            port: args.port,
            max_batch_tokens,
            context,
            queue: args.queue,
            api_key: args.api_key,
            parallel: args.backend.parallel,
            quiet,
        },
    )
}
