//! `quantppl serve`: the OpenAI-compatible scoring server (`crate::serve`).

use super::{BackendArgs, ModelArgs};
use crate::run::open_model;
use crate::serve::{Limits, ServeOptions, serve};

/// `quantppl serve --help`'s long description.
pub const LONG_ABOUT: &str = "An OpenAI-compatible scoring server: POST /v1/completions returns \
    the exact log-probability of every prompt token (`echo: true`), the top-N tokens of each \
    position from the full vocabulary (`logprobs: N`) and, with `max_tokens: 1`, the greedy next \
    token, computed from the packed weights. lm-evaluation-harness's `local-completions` model \
    runs its loglikelihood tasks (wikitext, multiple choice) through it; generation beyond one \
    token is refused (400). Also GET /v1/models, GET /health, GET /tokenizer_info, \
    POST /tokenize, POST /detokenize; chat completions are not served (404 saying so).\n\n\
    Text prompts are tokenized without BOS unless the request sets `add_special_tokens: true` \
    (lm-eval counts a text context's tokens without it); token-id prompts are scored as sent. \
    Token strings keep their leading spaces, as vLLM gives them.\n\n\
    Prompts of all clients are batched into forward batches of up to --max-batch-tokens rows \
    (prompts that start alike count their common start once), and a prompt that starts like \
    one scored in an earlier batch continues its kept keys and values (--prefix-cache-mb); \
    on several GPUs (--devices) each holds a replica serving batches of its own, or the layers \
    are split across them (--parallel), as for `eval`. A full queue answers 503 with Retry-After; a prompt longer than the model's \
    context, malformed JSON or a wrong field answers 400 naming it; a body, a request or an answer \
    past --max-body-mb, --queue or --max-response-mb 413; a client slower than --client-timeout \
    408 or a closed connection. Binds to 127.0.0.1 unless \
    --host says otherwise; give --api-key (or QUANTPPL_API_KEY) before exposing it. SIGTERM \
    or Ctrl-C stops accepting and gives the open connections --client-timeout to finish.";

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
    /// Rows per forward batch: prompts of several requests share a batch, those that start
    /// alike counting their common start once and rows continued from the prefix cache not at
    /// all (the attention's rows stay within twice this); a longer prompt runs alone.
    /// Default: --batch-tokens, else 4096.
    #[arg(long, value_name = "N")]
    pub max_batch_tokens: Option<usize>,
    /// Milliseconds a batch's first prompt waits for more prompts while the batch has room,
    /// when the device is idle (while it is busy, prompts gather on their own). 0: score at
    /// once.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub gather_ms: u64,
    /// Memory, in MB, that keeps recent batches' keys and values on the device and their
    /// prompts' answers on the host (each replica its own): a prompt starting like one scored
    /// before (at least 8 tokens; lm-eval sends a multiple-choice context once per choice)
    /// continues its rows instead of computing them again, with the same answer. Oldest
    /// batches go first; 0 turns it off. Models with recurrent or sparse-attention layers
    /// never keep any.
    #[arg(long, value_name = "MB", default_value_t = 2048)]
    pub prefix_cache_mb: u64,
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
    /// Largest request body, in MB (413 beyond, before any of it is parsed).
    #[arg(long, value_name = "MB", default_value_t = 32)]
    pub max_body_mb: usize,
    /// Largest answer, in MB, as estimated from the request before scoring (413 beyond: ask
    /// for fewer prompts, fewer echoed positions or a smaller logprobs).
    #[arg(long, value_name = "MB", default_value_t = 64)]
    pub max_response_mb: usize,
    /// Seconds a client has to send a request's headers, then its body (408); idle
    /// connections close after it, and SIGTERM waits as long for the open ones.
    #[arg(long, value_name = "S", default_value_t = 30)]
    pub client_timeout: u64,
    /// Connections open at once; more wait until one closes.
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub max_connections: usize,
    /// The model's name in /v1/models and in answers; a request naming another `model` is
    /// answered 404 (the model's path as given is also accepted). Default: the model
    /// directory's (or file's) name.
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
}

/// `--context`'s cap on what `max_position_embeddings` claims.
const DEFAULT_CONTEXT: usize = 32768;

pub fn run(args: Args, quiet: bool) -> anyhow::Result<()> {
    let m = &args.model;
    let max_batch_tokens = args
        .max_batch_tokens
        .or(args.backend.batch_tokens)
        .unwrap_or(4096);
    if [
        max_batch_tokens,
        args.queue,
        args.context.unwrap_or(1),
        args.max_body_mb,
        args.max_response_mb,
        args.client_timeout as usize,
        args.max_connections,
    ]
    .contains(&0)
    {
        anyhow::bail!(
            "--max-batch-tokens, --queue, --context, --max-body-mb, --max-response-mb, \
             --client-timeout and --max-connections must be at least 1"
        );
    }
    let mb = |n: usize| n.saturating_mul(1 << 20);
    let model = open_model(m.model.as_deref(), m.tokenizer.as_deref(), m.activations)?;
    let served_name = args.served_model_name.clone().unwrap_or_else(|| {
        std::path::Path::new(&model.name)
            .file_name()
            .map_or_else(|| model.name.clone(), |n| n.to_string_lossy().into_owned())
    });
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
            served_name,
            max_batch_tokens,
            gather: std::time::Duration::from_millis(args.gather_ms),
            prefix_cache_bytes: args.prefix_cache_mb.saturating_mul(1 << 20),
            context,
            queue: args.queue,
            api_key: args.api_key,
            parallel: args.backend.parallel,
            limits: Limits {
                max_body: mb(args.max_body_mb),
                max_response: mb(args.max_response_mb),
                client_timeout: std::time::Duration::from_secs(args.client_timeout),
                max_connections: args.max_connections,
            },
            quiet,
        },
    )
}
