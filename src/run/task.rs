//! Multiple-choice tasks on a model (`eval --task`, `compare --task`): each request's
//! log-likelihood, the sum over its continuation's tokens of log p(token | all before it), as
//! lm-eval's `hf` model computes it (the sequence cut from the left to the model's context),
//! requests packed end to end into forward batches.

use anyhow::{Context, bail};

use super::devices::{DeviceRequest, OnBackend, progress_bar, with_backend};
use super::open::OpenedModel;
use crate::backend::{Backend, SeqLayout};
use crate::data::task::{TaskItem, encode_request};
use crate::model::Model;

/// Tokens a forward batch of requests holds at most without `--batch-tokens` (one request
/// longer than it goes alone).
const BATCH_TOKENS: usize = 16384;

/// A request as the model reads it: its input tokens and how many of the last are the
/// continuation's (each scored against the token after it).
struct Encoded {
    input: Vec<u32>,
    targets: Vec<u32>,
    scored: usize,
}

/// The log-likelihood of every request of `items`, item by item, choice by choice, from
/// `model` (its tokenizer encodes them) on the devices of `req` (the first), in forward
/// batches of up to `batch_tokens` tokens.
pub fn task_loglikelihoods(
    model: &OpenedModel,
    items: &[TaskItem],
    req: &DeviceRequest,
    batch_tokens: Option<usize>,
    quiet: bool,
) -> anyhow::Result<Vec<Vec<f64>>> {
    let cfg = &model.ckpt.config;
    let max_len = cfg.max_position_embeddings;
    let prefix = model
        .tokenizer
        .bos_id()
        .or(cfg.bos_token_id)
        .or(cfg.eos_token_id);
    let mut encoded = Vec::new();
    for (i, item) in items.iter().enumerate() {
        for (c, (context, continuation)) in item.requests.iter().enumerate() {
            let (ctx, cont) = encode_request(&model.tokenizer, (context, continuation), prefix)
                .with_context(|| format!("task item {}, choice {c}", i + 1))?;
            if cont.is_empty() || cont.len() > max_len {
                bail!(
                    "task item {}, choice {c}: a continuation of {} tokens (1 to the model's \
                     {max_len} are scored)",
                    i + 1,
                    cont.len()
                );
            }
            let whole: Vec<u32> = ctx.iter().chain(&cont).copied().collect();
            let seq = &whole[whole.len().saturating_sub(max_len + 1)..];
            encoded.push(Encoded {
                input: seq[..seq.len() - 1].to_vec(),
                targets: seq[1..].to_vec(),
                scored: cont.len(),
            });
        }
    }
    let job = TaskJob {
        model,
        encoded: &encoded,
        batch_tokens: batch_tokens.unwrap_or(BATCH_TOKENS),
        quiet,
    };
    let lls = with_backend(req, cfg.auto_activation_dtype(), job)?;
    let mut it = lls.into_iter();
    Ok(items
        .iter()
        .map(|item| it.by_ref().take(item.requests.len()).collect())
        .collect())
}

struct TaskJob<'a> {
    model: &'a OpenedModel,
    encoded: &'a [Encoded],
    batch_tokens: usize,
    quiet: bool,
}

impl OnBackend for TaskJob<'_> {
    type Output = Vec<f64>;
    const ONE_DEVICE: bool = true;

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<Vec<f64>> {
        let b = &backends[0];
        let longest = self
            .encoded
            .iter()
            .map(|e| e.input.len())
            .max()
            .unwrap_or(1);
        let model = Model::load(b, &self.model.ckpt, longest, &|_, _| {})
            .with_context(|| format!("loading {}", self.model.name))?;
        let bar = progress_bar(self.encoded.len() as u64, "requests", self.quiet);
        let mut out = Vec::with_capacity(self.encoded.len());
        let mut start = 0;
        while start < self.encoded.len() {
            // Requests end to end up to the batch's tokens (at least one).
            let mut end = start + 1;
            let mut tokens = self.encoded[start].input.len();
            while end < self.encoded.len()
                && tokens + self.encoded[end].input.len() <= self.batch_tokens
            {
                tokens += self.encoded[end].input.len();
                end += 1;
            }
            let batch = &self.encoded[start..end];
            let ids: Vec<u32> = batch.iter().flat_map(|e| e.input.iter().copied()).collect();
            let targets: Vec<i32> = batch
                .iter()
                .flat_map(|e| {
                    let first = e.input.len() - e.scored;
                    (0..e.input.len()).map(
                        move |p| {
                            if p >= first { e.targets[p] as i32 } else { -1 }
                        },
                    )
                })
                .collect();
            let layout = SeqLayout::from_lengths(batch.iter().map(|e| e.input.len()));
            let nll = model.nll(b, &ids, &layout, &targets)?;
            let mut at = 0;
            for e in batch {
                let sum: f64 = nll[at..at + e.scored].iter().map(|&v| f64::from(v)).sum();
                out.push(-sum);
                at += e.scored;
            }
            bar.inc(batch.len() as u64);
            start = end;
        }
        bar.finish_and_clear();
        Ok(out)
    }
}
