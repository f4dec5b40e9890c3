//! The OpenAI completions request as `serve` reads it and the response it writes, as
//! lm-evaluation-harness's `local-completions` model uses them for log-likelihoods. Requests
//! are read field by field so that a wrong field is named in the 400 answer.

use std::collections::BTreeMap;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, SeqAccess, Visitor};

use serde_json::value::RawValue;
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
            404 => "not_found_error",
            408 => "timeout",
            413 => "request_too_large",
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
    /// The `model` the request names, if any.
    pub model: Option<String>,
}

/// What a request may ask for: the model's limits and the server's.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub vocab: usize,
    /// The model's maximum positions.
    pub context: usize,
    /// Bytes of a text prompt beyond which it cannot fit in `context` tokens
    /// (`TextTokenizer::max_prompt_bytes`): longer texts are refused before tokenizing.
    pub prompt_bytes: usize,
    /// Prompts one request may hold (the queue's size).
    pub max_prompts: usize,
    /// Estimated bytes of an answer.
    pub max_response: usize,
}

impl Bounds {
    /// No bound but the model's (for tests of the parser alone).
    pub fn model(vocab: usize, context: usize) -> Self {
        Bounds {
            vocab,
            context,
            prompt_bytes: usize::MAX,
            max_prompts: usize::MAX,
            max_response: usize::MAX,
        }
    }
}

/// The kind of the JSON value `raw` holds, from its first character.
fn raw_kind(raw: &str) -> &'static str {
    match raw.trim_start().chars().next() {
        Some('{') => "an object",
        Some('[') => "an array",
        Some('"') => "a string",
        Some('t' | 'f') => "a boolean",
        Some('n') => "null",
        _ => "a number",
    }
}

fn check_ids(ids: &[u32], vocab: usize) -> Result<(), ApiError> {
    match ids.iter().find(|&&id| id as usize >= vocab) {
        Some(id) => Err(ApiError::bad(
            "prompt",
            format!("token {id} is not an id of the vocabulary (0..{vocab})"),
        )),
        None => Ok(()),
    }
}

/// A scalar field read from its raw text (bounded first: a field is never parsed into a
/// large value).
fn scalar(raw: Option<&&RawValue>) -> Option<Value> {
    raw.filter(|r| r.get().len() <= 64)
        .and_then(|r| serde_json::from_str(r.get()).ok())
}

/// The request's prompts as token ids: texts tokenized (each bounded in bytes first), lists
/// of ids read straight into integers, never through a JSON tree.
fn prompts(
    raw: &RawValue,
    tokenizer: &TextTokenizer,
    special: bool,
    b: &Bounds,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let text = raw.get();
    let typed = |what: &str, e: serde_json::Error| {
        ApiError::bad("prompt", format!("`prompt` as {what}: {e}"))
    };
    let encode = |i: usize, s: &str| {
        if s.len() > b.prompt_bytes {
            return Err(ApiError::bad(
                "prompt",
                format!(
                    "prompt {i} has {} bytes, more than {} tokens of this tokenizer can hold: it \
                     cannot fit the model's context of {}",
                    s.len(),
                    b.context,
                    b.context
                ),
            ));
        }
        tokenizer
            .encode(s, special)
            .map_err(|e| ApiError::bad("prompt", e.to_string()))
    };
    let inner = text
        .strip_prefix('[')
        .map(|r| r.trim_start().chars().next());
    let prompts = match (text.chars().next(), inner) {
        (Some('"'), _) => {
            let s: String = serde_json::from_str(text).map_err(|e| typed("a string", e))?;
            vec![encode(0, &s)?]
        }
        (Some('['), Some(Some(']'))) => {
            return Err(ApiError::bad("prompt", "`prompt` is an empty list"));
        }
        (Some('['), Some(Some('"'))) => {
            let texts: Vec<String> = prompt_list(text, "a list of strings", b)?;
            texts
                .iter()
                .enumerate()
                .map(|(i, s)| encode(i, s))
                .collect::<Result<_, _>>()?
        }
        (Some('['), Some(Some('['))) => prompt_list(text, "a list of token-id lists", b)?,
        (Some('['), Some(Some(c))) if c.is_ascii_digit() || c == '-' => {
            vec![serde_json::from_str(text).map_err(|e| typed("a list of token ids", e))?]
        }
        (Some('['), _) => {
            let first = text[1..].trim_start();
            return Err(ApiError::bad(
                "prompt",
                format!("`prompt` is a list of {}", raw_kind(first)),
            ));
        }
        _ => {
            return Err(ApiError::bad(
                "prompt",
                format!(
                    "`prompt` is {}: a string, a list of strings, a list of token ids or a \
                     list of token-id lists",
                    raw_kind(text)
                ),
            ));
        }
    };
    for p in &prompts {
        check_ids(p, b.vocab)?;
    }
    Ok(prompts)
}

/// What `CappedList` says when a list passes its cap.
const TOO_MANY: &str = "more elements than allowed";

/// A JSON list read element by element and refused once it passes `cap`: a list of a hostile
/// length is never allocated whole.
struct CappedList<T> {
    cap: usize,
    element: PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for CappedList<T> {
    type Value = Vec<T>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<T>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for CappedList<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut out = Vec::new();
        while let Some(x) = seq.next_element()? {
            if out.len() == self.cap {
                return Err(serde::de::Error::custom(TOO_MANY));
            }
            out.push(x);
        }
        Ok(out)
    }
}

/// The prompts of a list of `what` in `text`, at most `b.max_prompts` of them (413 beyond: the
/// request could never be queued whole).
fn prompt_list<'de, T: Deserialize<'de>>(
    text: &'de str,
    what: &str,
    b: &Bounds,
) -> Result<Vec<T>, ApiError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let seed = CappedList {
        cap: b.max_prompts,
        element: PhantomData,
    };
    let read = seed
        .deserialize(&mut de)
        .and_then(|list| de.end().map(|()| list));
    read.map_err(|e| match e.to_string().starts_with(TOO_MANY) {
        true => ApiError {
            status: 413,
            message: format!(
                "more than {} prompts in one request: the queue holds at most {} (--queue)",
                b.max_prompts, b.max_prompts
            ),
            param: Some("prompt"),
        },
        false => ApiError::bad("prompt", format!("`prompt` as {what}: {e}")),
    })
}

/// Bytes an answer takes at most, about: each returned position's token, logprob, offset and
/// top list (a piece and a logprob each), and the echoed text.
fn answer_bytes(c: &Completion) -> usize {
    const PER_ENTRY: usize = 48;
    let entries = 1 + c.logprobs.unwrap_or(0);
    c.prompts
        .iter()
        .map(|p| {
            let positions = if c.echo { p.len() } else { 0 } + c.max_tokens;
            let listed = if c.logprobs.is_some() {
                positions * entries
            } else {
                0
            };
            (listed + positions) * PER_ENTRY
        })
        .sum()
}

/// Reads a completions request body within `b`: the body's fields read from its raw text, the
/// prompts straight into token ids; too many prompts or too large an answer is 413, anything
/// else wrong 400 naming the field.
pub fn parse_completion(
    body: &[u8],
    tokenizer: &TextTokenizer,
    b: &Bounds,
) -> Result<Completion, ApiError> {
    let raw: &RawValue = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad("body", format!("the body is not JSON: {e}")))?;
    if !raw.get().starts_with('{') {
        return Err(ApiError::bad(
            "body",
            format!("the body is {}, not an object", raw_kind(raw.get())),
        ));
    }
    let obj: BTreeMap<String, &RawValue> = serde_json::from_str(raw.get())
        .map_err(|e| ApiError::bad("body", format!("the body is not a JSON object: {e}")))?;
    let bool_field = |name: &'static str, default: bool| match obj.get(name) {
        None => Ok(default),
        Some(r) => match scalar(Some(r)) {
            Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(b),
            _ => Err(ApiError::bad(
                name,
                format!("`{name}` is {}, not a boolean", raw_kind(r.get())),
            )),
        },
    };
    let uint_field = |name: &'static str| match obj.get(name) {
        None => Ok(None),
        Some(r) => match scalar(Some(r)) {
            Some(Value::Null) => Ok(None),
            Some(n) if n.as_u64().is_some() => Ok(n.as_u64().map(|n| n as usize)),
            _ => Err(ApiError::bad(
                name,
                format!(
                    "`{name}` is {}, not a non-negative integer",
                    r.get().chars().take(40).collect::<String>()
                ),
            )),
        },
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
    if let Some(r) = obj.get("temperature") {
        match scalar(Some(r)) {
            Some(Value::Null) => {}
            Some(t) if t.as_f64() == Some(0.0) => {}
            Some(t) if max_tokens == 0 && t.is_number() => {}
            _ => {
                return Err(ApiError::bad(
                    "temperature",
                    format!(
                        "temperature {}: the next token is the greedy one (temperature 0)",
                        r.get().chars().take(40).collect::<String>()
                    ),
                ));
            }
        }
    }
    // lm-eval counts a text context's tokens without BOS (its remote tokenizer asks
    // /tokenize for them without special tokens): text prompts get none unless asked.
    let special = bool_field("add_special_tokens", false)?;
    let model = match obj
        .get("model")
        .map(|r| serde_json::from_str::<Value>(r.get()))
    {
        None | Some(Ok(Value::Null)) => None,
        Some(Ok(Value::String(m))) => Some(m),
        Some(_) => return Err(ApiError::bad("model", "`model` must be a string")),
    };
    let prompt = obj
        .get("prompt")
        .ok_or_else(|| ApiError::bad("prompt", "no `prompt`"))?;
    let prompts = prompts(prompt, tokenizer, special, b)?;
    let context = b.context;
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
    let c = Completion {
        prompts,
        echo,
        logprobs,
        max_tokens,
        model,
    };
    let bytes = answer_bytes(&c);
    if bytes > b.max_response {
        return Err(ApiError {
            status: 413,
            message: format!(
                "the answer would take about {} MB, more than the {} MB a response may \
                 (--max-response-mb): ask for fewer prompts, fewer positions (echo) or a \
                 smaller logprobs",
                bytes.div_ceil(1 << 20),
                b.max_response >> 20
            ),
            param: Some("prompt"),
        });
    }
    Ok(c)
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

/// Tokens of context a token is decoded after (vLLM's incremental detokenizer keeps five).
const PIECE_CONTEXT: usize = 5;

/// The text tokens add after the tokens before them (the last `PIECE_CONTEXT` of `before`),
/// as vLLM's incremental detokenizer gives token strings: " The" keeps the space that
/// decoding the token alone drops. A token whose text does not extend its context's (a
/// partial UTF-8 sequence) is decoded alone.
struct PiecesAfter<'a> {
    tokenizer: &'a TextTokenizer,
    context: Vec<u32>,
    text: String,
}

impl<'a> PiecesAfter<'a> {
    fn new(tokenizer: &'a TextTokenizer, before: &[u32]) -> crate::Result<Self> {
        let context = before[before.len().saturating_sub(PIECE_CONTEXT)..].to_vec();
        let text = tokenizer.decode(&context)?;
        Ok(PiecesAfter {
            tokenizer,
            context,
            text,
        })
    }

    fn piece(&mut self, t: u32) -> crate::Result<String> {
        if self.context.is_empty() {
            return self.tokenizer.decode(&[t]);
        }
        self.context.push(t);
        let full = self.tokenizer.decode(&self.context);
        self.context.pop();
        match full?.strip_prefix(self.text.as_str()) {
            Some(piece) => Ok(piece.to_string()),
            None => self.tokenizer.decode(&[t]),
        }
    }

    /// A top list as lm-eval reads it: each token's string (after the same context) to its
    /// logprob; tokens that read the same share the first one's entry.
    fn top(&mut self, list: &[(u32, f64)]) -> crate::Result<Value> {
        let mut m = Map::new();
        for &(t, lp) in list {
            m.entry(self.piece(t)?).or_insert(json!(lp));
        }
        Ok(Value::Object(m))
    }
}

/// One choice of the answer: the echoed prompt and/or the next token, with their logprobs.
/// Its `text` is its token strings end to end, so that `text_offset` (each string's first
/// character) indexes it.
pub fn choice(
    index: usize,
    c: &Completion,
    ids: &[u32],
    scored: &Scored,
    tokenizer: &TextTokenizer,
) -> crate::Result<Value> {
    let mut pieces: Vec<String> = Vec::new();
    let mut logprobs: Vec<Value> = Vec::new();
    let mut tops: Vec<Value> = Vec::new();
    // Position p's distribution is over the token after ids[..=p].
    let top_after = |p: usize, after: &mut PiecesAfter| match scored.top.get(p) {
        Some(list) => after.top(list),
        None => Ok(json!({})),
    };
    if c.echo {
        logprobs.push(Value::Null);
        logprobs.extend(scored.token_logprobs.iter().map(|&l| json!(l)));
        tops.push(Value::Null);
        for (p, &t) in ids.iter().enumerate() {
            let mut after = PiecesAfter::new(tokenizer, &ids[..p])?;
            pieces.push(after.piece(t)?);
            if p > 0 {
                tops.push(top_after(p - 1, &mut after)?);
            }
        }
    }
    if let Some((next, lp)) = scored.next {
        let mut after = PiecesAfter::new(tokenizer, ids)?;
        pieces.push(after.piece(next)?);
        logprobs.push(json!(lp));
        tops.push(top_after(ids.len() - 1, &mut after)?);
    }
    let mut offsets = Vec::with_capacity(pieces.len());
    let mut at = 0usize;
    for p in &pieces {
        offsets.push(at);
        at += p.chars().count();
    }
    Ok(json!({
        "index": index,
        "text": pieces.concat(),
        "logprobs": c.logprobs.map(|_| json!({
            "tokens": pieces,
            "token_logprobs": logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        })),
        "finish_reason": "length",
    }))
}
