//! `quantppl serve`: an OpenAI-compatible scoring server. The model is loaded once; prompts
//! from every client are batched by the scoring loop (`scorer`) on the thread that owns the
//! device, while the HTTP side (`http`, axum on tokio) parses requests (`api`) and waits for
//! the answers. It returns the exact log-probability of every prompt token and the top-N
//! lists from the full vocabulary, so lm-evaluation-harness's `local-completions` model runs
//! loglikelihood tasks on the quantized weights.

pub mod api;
pub mod http;
pub mod prefixes;
pub mod scorer;

use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use anyhow::Context;

use crate::backend::Backend;
use crate::model::LoadFor;
use crate::run::placement::place;
use crate::run::{DeviceRequest, OnBackend, OpenedModel, Parallel, with_backend};

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub host: String,
    pub port: u16,
    /// The model's name in answers and the `model` requests must name (or omit).
    pub served_name: String,
    /// Tokens per forward batch.
    pub max_batch_tokens: usize,
    /// How long a batch's first prompt waits for more while the batch has room.
    pub gather: std::time::Duration,
    /// Device memory each replica keeps recent batches' keys and values in (0: none).
    pub prefix_cache_bytes: u64,
    /// Longest prompt served: what per-position tables are sized for.
    pub context: usize,
    /// Prompts waiting at most; more are answered 503.
    pub queue: usize,
    /// Bearer token every request must carry, when set.
    pub api_key: Option<String>,
    /// How several devices share the model (as for `eval`).
    pub parallel: Parallel,
    pub limits: Limits,
    pub quiet: bool,
}

/// What one client may cost the server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes of a request body: 413 beyond, before any of it is parsed.
    pub max_body: usize,
    /// Estimated bytes of an answer: 413 beyond, before anything is scored.
    pub max_response: usize,
    /// Time a client has to send a request's headers, then its body (408); an idle
    /// connection closes after it, and SIGTERM waits this long for the open ones.
    pub client_timeout: std::time::Duration,
    /// Connections open at once; more wait in the listen backlog.
    pub max_connections: usize,
}

/// Loads `model` on the device `req` names and serves until SIGTERM or Ctrl-C.
pub fn serve(model: OpenedModel, req: &DeviceRequest, opts: ServeOptions) -> anyhow::Result<()> {
    // Bound before the model loads, so that a taken port fails at once.
    let listener = TcpListener::bind((opts.host.as_str(), opts.port))
        .with_context(|| format!("binding {}:{}", opts.host, opts.port))?;
    let dtype = model.ckpt.config.auto_activation_dtype();
    with_backend(
        req,
        dtype,
        ServeJob {
            model,
            opts,
            listener,
        },
    )
}

struct ServeJob {
    model: OpenedModel,
    opts: ServeOptions,
    listener: TcpListener,
}

impl OnBackend for ServeJob {
    type Output = ();

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<()> {
        let cfg = &self.model.ckpt.config;
        let context = self.opts.context;
        let placed = place(
            backends,
            &self.model.ckpt,
            // A batch of the largest size runs once while the layers load, where the device
            // pays for first calls (CUDA compiling its kernels at a first start, cuBLAS
            // choosing its GEMMs), rather than in the first requests' answers.
            LoadFor {
                max_positions: context,
                first_batch_rows: Some(self.opts.max_batch_tokens),
            },
            self.opts.parallel,
            self.opts.quiet,
        )
        .with_context(|| format!("loading {}", self.model.name))?;
        let (jobs, queue) = std::sync::mpsc::sync_channel(self.opts.queue);
        let limits = self.opts.limits;
        let bounds = api::Bounds {
            vocab: cfg.vocab_size,
            context,
            prompt_bytes: self.model.tokenizer.max_prompt_bytes(context),
            max_prompts: self.opts.queue,
            max_response: limits.max_response,
        };
        let state = Arc::new(http::State {
            jobs,
            tokenizer: self.model.tokenizer,
            model_name: self.opts.served_name.clone(),
            model_path: self.model.name.clone(),
            bounds,
            limits,
            api_key: self.opts.api_key.clone(),
        });
        let address = self.listener.local_addr()?;
        if !self.opts.quiet {
            eprintln!(
                "quantppl serve: {} on {} ({}), listening on http://{address}/v1 (Ctrl-C or \
                 SIGTERM stops)",
                self.model.name,
                backends[0].name(),
                placed.label()
            );
        }
        if !address.ip().is_loopback() && self.opts.api_key.is_none() {
            eprintln!(
                "quantppl serve: warning: listening on {} without --api-key: anyone who can \
                 reach this address can use the server",
                address.ip()
            );
        }
        let listener = self.listener;
        let server = std::thread::spawn(move || http::run(listener, state));
        let (queue, carried) = (Mutex::new(queue), Mutex::new(None));
        let (max, gather) = (self.opts.max_batch_tokens, self.opts.gather);
        let cache = self.opts.prefix_cache_bytes;
        let stages: Vec<(&B, &_)> = backends.iter().zip(&placed.models).collect();
        let served = if placed.pipeline || stages.len() == 1 {
            scorer::run_queue(&stages, &queue, &carried, max, gather, cache)
        } else {
            // A replica per device, each with its own loop (and cache) on its own thread.
            std::thread::scope(|scope| {
                let loops: Vec<_> = stages
                    .iter()
                    .map(|stage| {
                        let (queue, carried) = (&queue, &carried);
                        scope.spawn(move || match stage.0.enter_thread() {
                            Ok(()) => {
                                let stage = std::slice::from_ref(stage);
                                scorer::run_queue(stage, queue, carried, max, gather, cache)
                            }
                            Err(e) => {
                                eprintln!("quantppl serve: {}: {e}", stage.0.name());
                                scorer::Served::default()
                            }
                        })
                    })
                    .collect();
                let mut served = scorer::Served::default();
                for l in loops {
                    served += l.join().unwrap_or_default();
                }
                served
            })
        };
        if !self.opts.quiet && served.batches > 0 {
            // Not `eprintln!`: a client that closed our stderr must not turn the clean exit
            // into a panic.
            use std::io::Write;
            // Scoring time (summed over replicas) against a client's wall time says how much
            // of it the server took.
            let cached = match served.reused_rows {
                0 => String::new(),
                n => format!(", the prefix cache gave {n} rows"),
            };
            let _ = writeln!(
                std::io::stderr(),
                "quantppl serve: {} prompts in {} batches, {:.2} s scoring; {} rows \
                 computed{cached}",
                served.prompts,
                served.batches,
                served.busy.as_secs_f64(),
                served.computed_rows
            );
        }
        server
            .join()
            .map_err(|_| anyhow::anyhow!("the HTTP server thread panicked"))?
    }
}
