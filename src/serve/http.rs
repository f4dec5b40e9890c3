//! The HTTP side of `serve`: axum's router on hyper connections of our own accept loop, on a
//! tokio runtime of its own. Every client is bounded: at most `max_connections` open at once,
//! its headers and then its body within the client timeout (idle connections close after it),
//! its body within `max_body` bytes before anything is parsed, its prompts tokenized off the
//! async workers and its answer within `max_response` bytes. Handlers parse and check
//! requests, queue their prompts for the scoring loop (503 with Retry-After when the queue is
//! full) and await the answers; a client that disconnects drops its receivers, and the loop
//! skips its prompts. SIGTERM or Ctrl-C stops accepting, gives the open connections the
//! client timeout to finish, then closes the queue.

use std::sync::Arc;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State as Shared};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use super::Limits;
use super::api::{self, ApiError, Bounds};
use super::scorer::Job;
use crate::data::TextTokenizer;

/// What every handler shares.
pub struct State {
    pub jobs: SyncSender<Job>,
    pub tokenizer: TextTokenizer,
    /// The served name (`--served-model-name`).
    pub model_name: String,
    /// The model's path as given, which a request's `model` may also name.
    pub model_path: String,
    pub bounds: Bounds,
    pub limits: Limits,
    pub api_key: Option<String>,
}

type AppState = Arc<State>;

/// Serves `listener` until SIGTERM or Ctrl-C.
pub fn run(listener: std::net::TcpListener, state: AppState) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let limits = state.limits;
        let app = Router::new()
            .route("/v1/completions", post(completions))
            .route("/v1/models", get(models))
            .route("/tokenizer_info", get(tokenizer_info))
            .route("/tokenize", post(tokenize))
            .route("/detokenize", post(detokenize))
            .route("/v1/chat/completions", post(chat_completions))
            .fallback(not_served)
            .layer(middleware::from_fn_with_state(state.clone(), authorize))
            // After the key check's layer: open to probes that carry no key.
            .route("/health", get(health))
            .layer(DefaultBodyLimit::max(limits.max_body))
            .layer(middleware::from_fn_with_state(state.clone(), bounded_body))
            .with_state(state);
        accept(listener, app, limits).await;
        Ok(())
    })
}

/// Accepts connections until SIGTERM or Ctrl-C, at most `max_connections` open at once, each
/// given `client_timeout` to send its headers (hyper's header-read timeout, which also closes
/// an idle connection); then waits as long for the open ones before returning.
async fn accept(listener: tokio::net::TcpListener, app: Router, limits: Limits) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.client_timeout);
    let stop = stop_signal();
    tokio::pin!(stop);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut stop => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors and the like: a pause, then accept again.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            let _ = connection.await;
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.client_timeout) => {
            eprintln!(
                "quantppl serve: closing the connections still open {} s after the stop",
                limits.client_timeout.as_secs()
            );
        }
    }
}

/// What a client sends of a refused body, read and dropped for a moment (at most
/// `DRAIN_SECONDS`, and as many bytes as the body limit allows, four times over): a client
/// still writing then reads the answer, where closing on unread bytes would reset it.
async fn drain(body: Body, limits: Limits) {
    const DRAIN_SECONDS: u64 = 2;
    let mut body = body;
    let mut left = limits.max_body.saturating_mul(4);
    let reading = async {
        while let Some(Ok(frame)) = body.frame().await {
            let n = frame.data_ref().map_or(0, |d| d.len());
            left = left.saturating_sub(n);
            if left == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(DRAIN_SECONDS), reading).await;
}

/// Every request's body read whole before its handler, within `max_body` bytes and the
/// client timeout: a larger body is 413 before any of it is parsed, one that does not arrive
/// in time 408.
async fn bounded_body(Shared(state): Shared<AppState>, request: Request, next: Next) -> Response {
    let limits = state.limits;
    let too_large = || {
        error(ApiError {
            status: 413,
            message: format!(
                "the request body is larger than {} MB (--max-body-mb)",
                limits.max_body >> 20
            ),
            param: Some("body"),
        })
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        drain(request.into_body(), limits).await;
        return too_large();
    }
    let (parts, body) = request.into_parts();
    let read = axum::body::to_bytes(body, limits.max_body);
    let bytes = match tokio::time::timeout(limits.client_timeout, read).await {
        Err(_) => {
            return error(ApiError {
                status: 408,
                message: format!(
                    "the request body did not arrive within {} s",
                    limits.client_timeout.as_secs()
                ),
                param: Some("body"),
            });
        }
        Ok(Err(_)) => return too_large(),
        Ok(Ok(bytes)) => bytes,
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, axum::Json(e.body())).into_response();
    if e.status == 503 {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// With `--api-key`, every request but `/health` carries `Authorization: Bearer <key>` (the
/// scheme in any case, RFC 9110), the key compared in constant time.
async fn authorize(Shared(state): Shared<AppState>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, given)| given.trim_start());
        let matches = given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(key.as_bytes())));
        if !matches {
            return error(ApiError {
                status: 401,
                message: "missing or wrong `Authorization: Bearer` API key".into(),
                param: None,
            });
        }
    }
    next.run(request).await
}

async fn completions(Shared(state): Shared<AppState>, body: Bytes) -> Response {
    match complete(state, body).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => error(e),
    }
}

/// `work` on tokio's blocking threads: tokenizing never holds up the async workers (`/health`
/// and the other clients).
async fn off_workers<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|_| internal("the request's parser stopped"))?
}

async fn complete(state: AppState, body: Bytes) -> Result<Value, ApiError> {
    let parsing = state.clone();
    let c = off_workers(move || api::parse_completion(&body, &parsing.tokenizer, &parsing.bounds))
        .await?;
    if let Some(m) = c.model.as_deref()
        && m != state.model_name
        && m != state.model_path
    {
        return Err(ApiError {
            status: 404,
            message: format!(
                "model `{m}` is not served here: this server serves `{}` (--served-model-name)",
                state.model_name
            ),
            param: Some("model"),
        });
    }
    let mut waiting = Vec::with_capacity(c.prompts.len());
    for i in 0..c.prompts.len() {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job {
            prompt: c.prompt(i),
            reply,
        };
        match state.jobs.try_send(job) {
            Ok(()) => waiting.push(answer),
            Err(TrySendError::Full(_)) => {
                return Err(ApiError {
                    status: 503,
                    message: "the queue is full; retry shortly".into(),
                    param: None,
                });
            }
            Err(TrySendError::Disconnected(_)) => return Err(internal("the server is stopping")),
        }
    }
    let mut choices = Vec::with_capacity(waiting.len());
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    for (i, answer) in waiting.into_iter().enumerate() {
        let scored = answer
            .await
            .map_err(|_| internal("the scoring loop stopped"))?
            .map_err(|e| internal(&e))?;
        prompt_tokens += c.prompts[i].len();
        completion_tokens += usize::from(scored.next.is_some());
        choices.push(
            api::choice(i, &c, &c.prompts[i], &scored, &state.tokenizer)
                .map_err(|e| internal(&e.to_string()))?,
        );
    }
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(json!({
        "id": format!("cmpl-quantppl-{created}"),
        "object": "text_completion",
        "created": created,
        "model": state.model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }))
}

fn internal(message: &str) -> ApiError {
    ApiError {
        status: 500,
        message: message.to_string(),
        param: None,
    }
}

async fn models(Shared(state): Shared<AppState>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "quantppl",
            "max_model_len": state.bounds.context,
        }],
    }))
    .into_response()
}

async fn chat_completions() -> Response {
    error(ApiError {
        status: 404,
        message: "chat completions are not served: quantppl serve scores prompts (POST \
                  /v1/completions with echo and logprobs) and gives at most one greedy token"
            .into(),
        param: None,
    })
}

async fn not_served(uri: axum::http::Uri) -> Response {
    error(ApiError {
        status: 404,
        message: format!(
            "no endpoint {}: this server answers POST /v1/completions, GET /v1/models, GET \
             /health, GET /tokenizer_info, POST /tokenize and POST /detokenize",
            uri.path()
        ),
        param: None,
    })
}

async fn health() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn tokenizer_info(Shared(state): Shared<AppState>) -> Response {
    let t = &state.tokenizer;
    let field = |k: &str| t.config_field(k).ok().flatten();
    axum::Json(json!({
        "eos_token": field("eos_token"),
        "bos_token": field("bos_token"),
        "pad_token": field("pad_token"),
        "chat_template": field("chat_template"),
        "model_max_length": state.bounds.context,
        "vocab_size": t.vocab_size(),
    }))
    .into_response()
}

fn json_body(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::bad("body", "the body is not a JSON object")),
        Err(e) => Err(ApiError::bad("body", format!("the body is not JSON: {e}"))),
    }
}

async fn tokenize(Shared(state): Shared<AppState>, body: Bytes) -> Response {
    let run = move || -> Result<Value, ApiError> {
        let o = json_body(&body)?;
        let prompt = o
            .get("prompt")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad("prompt", "`prompt` must be a string"))?;
        let special = match o.get("add_special_tokens") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ApiError::bad("add_special_tokens", "must be a boolean")),
        };
        let context = state.bounds.context;
        if prompt.len() > state.bounds.prompt_bytes {
            return Err(ApiError::bad(
                "prompt",
                format!(
                    "`prompt` has {} bytes, more than {context} tokens of this tokenizer can \
                     hold (the model's context)",
                    prompt.len()
                ),
            ));
        }
        let tokens = state
            .tokenizer
            .encode(prompt, special)
            .map_err(|e| internal(&e.to_string()))?;
        Ok(json!({"tokens": tokens, "count": tokens.len(), "max_model_len": context}))
    };
    match off_workers(run).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => error(e),
    }
}

async fn detokenize(Shared(state): Shared<AppState>, body: Bytes) -> Response {
    let run = || -> Result<Value, ApiError> {
        let o = json_body(&body)?;
        let ids = o
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or_else(|| ApiError::bad("tokens", "`tokens` must be a list of token ids"))?;
        let ids: Vec<u32> = ids
            .iter()
            .map(|t| {
                t.as_u64()
                    .filter(|&id| (id as usize) < state.bounds.vocab)
                    .map(|id| id as u32)
                    .ok_or_else(|| ApiError::bad("tokens", format!("{t} is not a token id")))
            })
            .collect::<Result<_, _>>()?;
        let prompt = state
            .tokenizer
            .decode(&ids)
            .map_err(|e| internal(&e.to_string()))?;
        Ok(json!({"prompt": prompt}))
    };
    match run() {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => error(e),
    }
}
