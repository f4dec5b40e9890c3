//! Multiple-choice tasks (`eval --task`, `compare --task`): a JSON Lines file of items, each
//! turned into lm-eval's loglikelihood requests and encoded as lm-eval's `hf` model encodes
//! them, so that a model's answers and accuracies are lm-eval's item by item.
//!
//! An item is one object a line, in one of two shapes:
//! - `{"context": C, "choices": [A, B, ..], "label": i}`: one context, a continuation per
//!   choice (ARC, HellaSwag, MMLU); request k is (C, " " + choices[k]);
//! - `{"contexts": [C0, C1, ..], "continuation": T, "label": i}`: a context per choice and
//!   one continuation (WinoGrande's partial scoring); request k is (contexts[k], " " + T).
//!
//! `label` (or `gold`) is the index of the right choice. The separator " " is lm-eval's default
//! `target_delimiter`.

use std::path::Path;

use serde::Deserialize;

use super::TextTokenizer;
use super::named_tasks::NamedTask;
use crate::{Error, Result};

/// lm-eval's default `target_delimiter`, put before every continuation.
const DELIMITER: &str = " ";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawItem {
    context: Option<String>,
    choices: Option<Vec<String>>,
    contexts: Option<Vec<String>>,
    continuation: Option<String>,
    #[serde(alias = "gold")]
    label: usize,
}

/// One item: its requests (context, continuation) in choice order, the right choice, and
/// each choice's length in characters (lm-eval's `acc_norm` divides by it).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskItem {
    pub requests: Vec<(String, String)>,
    pub label: usize,
    pub choice_chars: Vec<usize>,
    /// One context, several continuations (`acc_norm` applies); else WinoGrande's shape.
    pub shared_context: bool,
}

impl TaskItem {
    /// One context and a continuation per choice (ARC, HellaSwag, MMLU).
    pub fn with_choices(
        context: &str,
        choices: &[String],
        label: usize,
    ) -> std::result::Result<Self, String> {
        Self::checked(TaskItem {
            requests: choices
                .iter()
                .map(|k| (context.to_string(), format!("{DELIMITER}{k}")))
                .collect(),
            label,
            choice_chars: choices.iter().map(|k| k.chars().count()).collect(),
            shared_context: true,
        })
    }

    /// A context per choice and one continuation (WinoGrande's partial scoring).
    pub fn with_contexts(
        contexts: &[String],
        continuation: &str,
        label: usize,
    ) -> std::result::Result<Self, String> {
        Self::checked(TaskItem {
            requests: contexts
                .iter()
                .map(|c| (c.clone(), format!("{DELIMITER}{continuation}")))
                .collect(),
            label,
            choice_chars: contexts.iter().map(|c| c.chars().count()).collect(),
            shared_context: false,
        })
    }

    fn checked(item: TaskItem) -> std::result::Result<Self, String> {
        if item.requests.len() < 2 || item.label >= item.requests.len() {
            return Err(format!(
                "{} choices and label {}: an item needs two choices or more and a label among \
                 them",
                item.requests.len(),
                item.label
            ));
        }
        Ok(item)
    }
}

/// A task's items, what it is called in reports and what identifies its bytes for resumed
/// runs.
pub struct Task {
    pub name: String,
    pub items: Vec<TaskItem>,
    pub fingerprint: String,
}

impl Task {
    /// What `--task` names: an existing file, else a task found by name in the hub cache.
    pub fn open(arg: &Path) -> Result<Self> {
        if arg.exists() {
            return Self::from_file(arg);
        }
        match arg.to_str().and_then(NamedTask::by_name) {
            Some(named) => named.load(),
            None => Err(Error::Dataset {
                path: arg.to_path_buf(),
                why: format!(
                    "no such file, nor a task known by name ({})",
                    super::named_tasks::names()
                ),
            }),
        }
    }

    /// Reads a task file, naming the line of anything that is not an item.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            Error::format(
                path,
                format!("not UTF-8 (first bad byte at offset {})", e.valid_up_to()),
            )
        })?;
        let bad = |line: usize, what: String| Error::format(path, format!("line {line}: {what}"));
        let mut items = Vec::new();
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let raw: RawItem = serde_json::from_str(line).map_err(|e| bad(i + 1, e.to_string()))?;
            let item = match raw {
                RawItem {
                    context: Some(c),
                    choices: Some(choices),
                    contexts: None,
                    continuation: None,
                    label,
                } => TaskItem::with_choices(&c, &choices, label),
                RawItem {
                    context: None,
                    choices: None,
                    contexts: Some(contexts),
                    continuation: Some(t),
                    label,
                } => TaskItem::with_contexts(&contexts, &t, label),
                _ => Err(
                    "an item has `context` and `choices`, or `contexts` and `continuation`".into(),
                ),
            };
            items.push(item.map_err(|e| bad(i + 1, e))?);
        }
        if items.is_empty() {
            return Err(Error::format(path, "no items"));
        }
        Ok(Task {
            name: path.display().to_string(),
            items,
            fingerprint: super::source::fingerprint(&bytes),
        })
    }
}

/// A request as tokens, as lm-eval's `hf` model makes it (`_encode_pair`, `tok_encode`): the
/// context's trailing spaces move to the continuation; strings are encoded with the
/// tokenizer's own special tokens (Llama's BOS) unless they start with the prefix token's text;
/// the continuation's tokens are those of context + continuation after the context's own; an
/// empty context is the prefix token alone (BOS, else EOS) before the continuation's encoding.
pub fn encode_request(
    tok: &TextTokenizer,
    (context, continuation): (&str, &str),
    prefix: Option<u32>,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let prefix_text = match prefix {
        Some(id) => tok.decode(&[id])?,
        None => String::new(),
    };
    let encode = |text: &str| {
        let specials = prefix_text.is_empty() || !text.starts_with(&prefix_text);
        tok.encode(text, specials)
    };
    let kept = context.trim_end().len();
    let (context, moved) = context.split_at(kept);
    let continuation = format!("{moved}{continuation}");
    if context.is_empty() {
        let prefix = prefix.ok_or_else(|| {
            Error::InvalidArgument(
                "a task item with an empty context needs a BOS or EOS token to start from".into(),
            )
        })?;
        return Ok((vec![prefix], encode(&continuation)?));
    }
    let whole = encode(&format!("{context}{continuation}"))?;
    let ctx = encode(context)?;
    let cont = whole.get(ctx.len()..).unwrap_or_default().to_vec();
    Ok((ctx, cont))
}
