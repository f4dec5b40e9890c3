//! The OpenAI completions request as `serve` reads it and the response it writes, as
//! lm-evaluation-harness's `local-completions` model uses them for log-likelihoods. Requests
//! are read field by field so that a wrong field is named in the 400 answer.

use serde_json::{Map, Value, json};

use super::scorer::{Prompt, Scored};
use crate::data::TextTokenizer;

/// The longest top list a request may ask for per position (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: usize = 20;

/// A request error: the HTTP status, the message and the field at fault.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub param: Option<&'static str>,
}

impl ApiError {
    pub fn bad(param: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            param: Some(param),
        }
    }

    /// OpenAI's error body.
    pub fn body(&self) -> Value {
        let kind = match self.status {
            400 => "invalid_request_error",
            401 => "authentication_error",
            503 => "server_overloaded",
            _ => "server_error",
        };
        json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": null}})
    }
}

/// What a completions request asks for.
#[derive(Debug)]
pub struct Completion {
    /// Prompts as token ids, and whether each was given as text (then the tokenizer's
    /// special tokens were added).
    pub prompts: Vec<Vec<u32>>,
    pub echo: bool,
    /// `logprobs: N` (None: no logprobs object in the answer).
    pub logprobs: Option<usize>,
    /// 0 or 1.
    pub max_tokens: usize,
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn token_ids(v: &[Value], vocab: usize) -> Result<Vec<u32>, ApiError> {
    v.iter()
        .map(|t| {
            t.as_u64()
                .filter(|&id| (id as usize) < vocab)
                .map(|id| id as u32)
                .ok_or_else(|| {
                    ApiError::bad(
                        "prompt",
                        format!("token {t} is not an id of the vocabulary (0..{vocab})"),
                    )
                })
        })
        .collect()
}

/// Reads a completions request body. `context` is the model's maximum positions.
pub fn parse_completion(
    body: &[u8],
    tokenizer: &TextTokenizer,
    vocab: usize,
    context: usize,
) -> Result<Completion, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad("body", format!("the body is not JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| ApiError::bad("body", format!("the body is {}, not an object", kind(&v))))?;
    let bool_field = |name: &'static str, default: bool| match obj.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::bad(
            name,
            format!("`{name}` is {}, not a boolean", kind(other)),
        )),
    };
    let uint_field = |name: &'static str| match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(n) => n.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
            ApiError::bad(name, format!("`{name}` is {n}, not a non-negative integer"))
        }),
    };
    let echo = bool_field("echo", false)?;
    if bool_field("stream", false)? {
        return Err(ApiError::bad(
            "stream",
            "streaming is not supported: this is a scoring server",
        ));
    }
    let logprobs = uint_field("logprobs")?;
    // Each position's list is sized by the request alone: bounded as vLLM bounds it.
    if let Some(n) = logprobs.filter(|&n| n > MAX_LOGPROBS) {
        return Err(ApiError::bad(
            "logprobs",
            format!("logprobs {n}: at most {MAX_LOGPROBS} per position"),
        ));
    }
    let max_tokens = uint_field("max_tokens")?.unwrap_or(0);
    if max_tokens > 1 {
        return Err(ApiError::bad(
            "max_tokens",
            format!(
                "max_tokens {max_tokens}: quantppl serve scores prompts and gives at most the one \
                 greedy next token (max_tokens 0 or 1); it does not generate"
            ),
        ));
    }
    if let Some(n) = uint_field("n")?.filter(|&n| n != 1) {
        return Err(ApiError::bad(
            "n",
            format!("n {n}: one choice per prompt only"),
        ));
    }
    match obj.get("temperature") {
        None | Some(Value::Null) => {}
        Some(t) if t.as_f64() == Some(0.0) => {}
        Some(t) if max_tokens == 0 && t.is_number() => {}
        Some(t) => {
            return Err(ApiError::bad(
                "temperature",
                format!("temperature {t}: the next token is the greedy one (temperature 0)"),
            ));
        }
    }
    let prompt = obj
        .get("prompt")
        .ok_or_else(|| ApiError::bad("prompt", "no `prompt`"))?;
    let encode = |text: &str| {
        tokenizer
            .encode(text, true)
            .map_err(|e| ApiError::bad("prompt", e.to_string()))
    };
    let prompts: Vec<Vec<u32>> = match prompt {
        Value::String(s) => vec![encode(s)?],
        Value::Array(items) if items.is_empty() => {
            return Err(ApiError::bad("prompt", "`prompt` is an empty list"));
        }
        Value::Array(items) => match &items[0] {
            Value::Number(_) => vec![token_ids(items, vocab)?],
            Value::String(_) => items
                .iter()
                .map(|s| match s {
                    Value::String(s) => encode(s),
                    other => Err(ApiError::bad(
                        "prompt",
                        format!("a list of strings holds {}", kind(other)),
                    )),
                })
                .collect::<Result<_, _>>()?,
            Value::Array(_) => items
                .iter()
                .map(|p| match p {
                    Value::Array(ids) => token_ids(ids, vocab),
                    other => Err(ApiError::bad(
                        "prompt",
                        format!("a list of token lists holds {}", kind(other)),
                    )),
                })
                .collect::<Result<_, _>>()?,
            other => {
                return Err(ApiError::bad(
                    "prompt",
                    format!("`prompt` is a list of {}", kind(other)),
                ));
            }
        },
        other => {
            return Err(ApiError::bad(
                "prompt",
                format!(
                    "`prompt` is {}: a string, a list of strings, a list of token ids or a \
                     list of token-id lists",
                    kind(other)
                ),
            ));
        }
    };
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(ApiError::bad("prompt", format!("prompt {i} has no tokens")));
        }
        // The next token is read from the last prompt position: it takes no position itself.
        if p.len() > context {
            return Err(ApiError::bad(
                "prompt",
                format!(
                    "prompt {i} has {} tokens, more than the model's context of {context}",
                    p.len()
                ),
            ));
        }
    }
    Ok(Completion {
        prompts,
        echo,
        logprobs,
        max_tokens,
    })
}

impl Completion {
    /// The scorer's job for prompt `i`.
    pub fn prompt(&self, i: usize) -> Prompt {
        Prompt {
            ids: self.prompts[i].clone(),
            top: self.logprobs.unwrap_or(0),
            next: self.max_tokens == 1,
        }
    }
}

/// One choice of the answer: the echoed prompt and/or the next token, with their logprobs.
pub fn choice(
    index: usize,
    c: &Completion,
    ids: &[u32],
    scored: &Scored,
    tokenizer: &TextTokenizer,
) -> crate::Result<Value> {
    let piece = |id: u32| tokenizer.decode(&[id]);
    let mut tokens: Vec<u32> = Vec::new();
    let mut logprobs: Vec<Value> = Vec::new();
    let mut tops: Vec<Value> = Vec::new();
    let top_dict = |list: &[(u32, f64)]| -> crate::Result<Value> {
        let mut m = Map::new();
        for &(t, lp) in list {
            m.entry(piece(t)?).or_insert(json!(lp));
        }
        Ok(Value::Object(m))
    };
    if c.echo {
        tokens.extend_from_slice(ids);
        logprobs.push(Value::Null);
        logprobs.extend(scored.token_logprobs.iter().map(|&l| json!(l)));
        tops.push(Value::Null);
        for p in 0..ids.len() - 1 {
            tops.push(match scored.top.get(p) {
                Some(list) => top_dict(list)?,
                None => json!({}),
            });
        }
    }
    if let Some((next, lp)) = scored.next {
        tokens.push(next);
        logprobs.push(json!(lp));
        tops.push(match scored.top.get(ids.len() - 1) {
            Some(list) => top_dict(list)?,
            None => json!({}),
        });
    }
    let pieces: Vec<String> = tokens
        .iter()
        .map(|&t| piece(t))
        .collect::<crate::Result<_>>()?;
    let mut offsets = Vec::with_capacity(pieces.len());
    let mut at = 0usize;
    for p in &pieces {
        offsets.push(at);
        at += p.chars().count();
    }
    let mut text = if c.echo {
        tokenizer.decode(ids)?
    } else {
        String::new()
    };
    if let Some((next, _)) = scored.next {
        text += &piece(next)?;
    }
    Ok(json!({
        "index": index,
        "text": text,
        "logprobs": c.logprobs.map(|_| json!({
            "tokens": pieces,
            "token_logprobs": logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        })),
        "finish_reason": "length",
    }))
}
