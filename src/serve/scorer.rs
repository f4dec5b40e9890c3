//! The scoring loop of `serve`: prompts from every client are queued, taken in the order they
//! came, packed into forward batches of up to `max_batch_tokens` tokens (as `eval` packs
//! windows), and each position's full-vocabulary distribution is reduced to the prompt
//! token's log-probability, the top-N list and the greedy next token (where the logits are
//! made for lists of at most one, `Backend::row_stats`; on the host for longer ones). A model
//! is one or more stages: a replica on one device, or its layers split across devices in
//! order.

use std::sync::Mutex;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use crate::Result;
use crate::backend::{Backend, RowStats, SeqLayout, Shaped};
use crate::model::Model;

/// One prompt to score.
#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    pub ids: Vec<u32>,
    /// Entries of each position's top list (OpenAI's `logprobs`).
    pub top: usize,
    /// Also the greedy next token after the prompt (`max_tokens: 1`).
    pub next: bool,
}

/// A token and its log-probability (natural log).
pub type TokenLogprob = (u32, f64);

/// What a prompt scores.
#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    /// `log p(ids[p] | ids[..p])` for `p` in `1..ids.len()`.
    pub token_logprobs: Vec<f64>,
    /// The `top` most likely tokens after `ids[..p]`, most likely first (ties: lower id first),
    /// for the same positions, then after the whole prompt when `next` was asked.
    pub top: Vec<Vec<TokenLogprob>>,
    /// The greedy next token after the whole prompt, when asked.
    pub next: Option<TokenLogprob>,
}

/// A queued prompt and where its result goes (dropped when the client went away).
pub struct Job {
    pub prompt: Prompt,
    pub reply: tokio::sync::oneshot::Sender<std::result::Result<Scored, String>>,
}

/// A model on its devices, in layer order: one stage holding every layer (a replica), or the
/// stages of a layer split.
pub type Stages<'a, B> = [(&'a B, &'a Model<B>)];

/// Scores `prompts` in one forward batch through `stages`.
pub fn score<B: Backend>(stages: &Stages<B>, prompts: &[&Prompt]) -> Result<Vec<Scored>> {
    let ids: Vec<u32> = prompts.iter().flat_map(|p| p.ids.iter().copied()).collect();
    let layout = SeqLayout::from_lengths(prompts.iter().map(|p| p.ids.len()));
    let mut handed_on: Option<(&B, B::Tensor)> = None;
    for &(b, stage) in stages {
        let x = stage.stage_forward(b, handed_on.take(), &ids, &layout)?;
        handed_on = Some((b, x));
    }
    let (b, residual) = handed_on
        .ok_or_else(|| crate::Error::InvalidArgument("a model placed on no device".into()))?;
    let model = stages[stages.len() - 1].1;
    let hidden = model.final_norm(b, &residual)?;
    // The rows whose distributions are needed, with (prompt, position) for each.
    let mut rows: Vec<(u32, usize, usize)> = Vec::new();
    let mut start = 0usize;
    for (i, p) in prompts.iter().enumerate() {
        let n = p.ids.len();
        let last = if p.next { n } else { n - 1 };
        rows.extend((0..last).map(|pos| ((start + pos) as u32, i, pos)));
        start += n;
    }
    let mut out: Vec<Scored> = prompts
        .iter()
        .map(|p| Scored {
            token_logprobs: Vec::with_capacity(p.ids.len().saturating_sub(1)),
            top: Vec::new(),
            next: None,
        })
        .collect();
    // Logprobs of 0 or 1: each row reduced where its logits are made (on a GPU only 20 bytes
    // a row come back); longer top lists need the rows on the host.
    if prompts.iter().all(|p| p.top <= 1) {
        let mut targets = vec![-1i32; hidden.rows()];
        for &(r, i, pos) in &rows {
            let ids = &prompts[i].ids;
            // The last position's target is its own greedy token, read from `best`.
            targets[r as usize] = ids.get(pos + 1).map_or(0, |&t| t as i32);
        }
        let stats = model.head_row_stats(b, &hidden, &targets)?;
        for (&(_, i, pos), st) in rows.iter().zip(&stats) {
            record(prompts[i], &mut out[i], pos, st, None);
        }
        return Ok(out);
    }
    // Each row reduced on its own core: the vocabulary-wide passes dominate on the host.
    let picked: Vec<u32> = rows.iter().map(|r| r.0).collect();
    let reduced = model.head_reduce(b, &hidden, &picked, |row, k| {
        let (_, i, pos) = rows[k];
        let p = prompts[i];
        let st = RowStats::of(row, p.ids.get(pos + 1).map_or(0, |&t| t as usize));
        let top: Vec<TokenLogprob> = top_n(row, p.top)
            .into_iter()
            .map(|t| (t, f64::from(row[t as usize]) - st.lse))
            .collect();
        (st, top)
    })?;
    for (&(_, i, pos), (st, top)) in rows.iter().zip(reduced) {
        record(prompts[i], &mut out[i], pos, &st, Some(top));
    }
    Ok(out)
}

/// Position `pos` of prompt `p` into its answer `s`: the next prompt token's logprob, or at
/// the last position the greedy next token; its top list, `top` where given (else the greedy
/// token where `p.top` is 1).
fn record(p: &Prompt, s: &mut Scored, pos: usize, st: &RowStats, top: Option<Vec<TokenLogprob>>) {
    let logprob = |logit: f32| f64::from(logit) - st.lse;
    if pos + 1 < p.ids.len() {
        s.token_logprobs.push(logprob(st.target_logit));
    } else {
        s.next = Some((st.best, logprob(st.best_logit)));
    }
    if p.top > 0 {
        s.top
            .push(top.unwrap_or_else(|| vec![(st.best, logprob(st.best_logit))]));
    }
}

/// The `n` largest entries' indices, largest first, ties by lower index.
fn top_n(row: &[f32], n: usize) -> Vec<u32> {
    let order = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let n = n.min(row.len());
    if n < idx.len() {
        idx.select_nth_unstable_by(n, order);
        idx.truncate(n);
    }
    idx.sort_unstable_by(order);
    idx
}

/// Serves `jobs` through `stages` until every sender is gone: takes the waiting prompts in
/// order into batches of up to `max_batch_tokens` tokens (a longer prompt runs alone), waiting
/// up to `gather` after a batch's first prompt for more while the batch has room, skips those
/// whose client has gone, and answers each. Prompts are taken in arrival order, so none
/// waits behind later ones. Several loops (one per replica) may share `jobs`: each takes a
/// batch while holding the lock, then scores it.
pub fn run_queue<B: Backend>(
    stages: &Stages<B>,
    jobs: &Mutex<Receiver<Job>>,
    carried: &Mutex<Option<Job>>,
    max_batch_tokens: usize,
    gather: Duration,
) {
    loop {
        let batch = {
            let jobs = jobs.lock().unwrap_or_else(|p| p.into_inner());
            let mut carried = carried.lock().unwrap_or_else(|p| p.into_inner());
            let first = match carried.take() {
                Some(j) => j,
                None => match jobs.recv() {
                    Ok(j) => j,
                    Err(_) => return,
                },
            };
            let mut tokens = first.prompt.ids.len();
            let mut batch = vec![first];
            let until = Instant::now() + gather;
            loop {
                let next = match jobs.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty) if tokens < max_batch_tokens => {
                        match jobs.recv_timeout(until.saturating_duration_since(Instant::now())) {
                            Ok(j) => j,
                            Err(_) => break,
                        }
                    }
                    Err(_) => break,
                };
                if tokens + next.prompt.ids.len() > max_batch_tokens {
                    *carried = Some(next);
                    break;
                }
                tokens += next.prompt.ids.len();
                batch.push(next);
            }
            batch
        };
        let batch: Vec<Job> = batch.into_iter().filter(|j| !j.reply.is_closed()).collect();
        if batch.is_empty() {
            continue;
        }
        let prompts: Vec<&Prompt> = batch.iter().map(|j| &j.prompt).collect();
        match score(stages, &prompts) {
            Ok(results) => {
                for (job, r) in batch.into_iter().zip(results) {
                    let _ = job.reply.send(Ok(r));
                }
            }
            Err(e) => {
                for job in batch {
                    let _ = job.reply.send(Err(e.to_string()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_lists_order_by_value_then_id() {
        let row = [0.5, 2.0, 2.0, -1.0, 3.0];
        assert_eq!(top_n(&row, 3), [4, 1, 2]);
        assert_eq!(top_n(&row, 9), [4, 1, 2, 0, 3]);
        // The greedy token is the first of equal largest logits, as the device passes take it.
        let st = RowStats::of(&[1.0, 3.0, 3.0], 0);
        assert_eq!((st.best, st.best_logit, st.target_logit), (1, 3.0, 1.0));
        let lse = RowStats::of(&[0.0, 0.0], 1).lse;
        assert!((lse - 2f64.ln()).abs() < 1e-15);
    }
}
