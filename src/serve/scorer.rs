//! The scoring loop of `serve`: prompts from every client are queued, taken in the order they
//! came, packed into forward batches of up to `max_batch_tokens` tokens (as `eval` packs
//! windows; prompts of a batch that start alike share their common start's rows), and each
//! position's full-vocabulary distribution is reduced where its logits are made
//! (`Backend::row_stats`) to the prompt token's log-probability, the top-N list and the greedy
//! next token. A model is one or more stages: a replica on one device, or its layers split
//! across devices in order.

use std::sync::Mutex;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use super::prefixes::{KeptPrompt, PrefixCache};
use crate::Result;
use crate::backend::{Backend, Branches, RowStats, SeqLayout, Shaped};
use crate::model::{Continuation, Model};

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

/// Fewest tokens prompts must start with alike for the common start to run once (lm-eval
/// sends each multiple-choice context once per choice).
pub(super) const MIN_SHARED: usize = 8;

/// Where a prompt's positions lie among the batch's rows: its first `shared` positions in a
/// prefix other prompts read too, the rest in rows of its own.
#[derive(Clone, Copy, Debug, PartialEq)]
struct PromptRows {
    seq: usize,
    shared_from: usize,
    shared: usize,
    own_from: usize,
}

impl PromptRows {
    fn row(&self, pos: usize) -> usize {
        if pos < self.shared {
            self.shared_from + pos
        } else {
            self.own_from + pos - self.shared
        }
    }
}

/// How many tokens `a` and `b` start with alike.
pub(super) fn common_start(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A batch laid out: its tokens, layout and each prompt's rows, and per sequence its first
/// prompt and the tokens every prompt of it starts with (a lone prompt's whole length).
struct Packed {
    ids: Vec<u32>,
    layout: SeqLayout,
    placed: Vec<PromptRows>,
    seqs: Vec<(usize, usize)>,
}

/// The batch's tokens and layout: prompts (of the same top list) that start with at least
/// `MIN_SHARED` equal tokens are one sequence, their common start but its last token once, then
/// a branch per prompt (`backend::Branches`: each scored exactly as alone), where the model
/// allows a sequence of that many rows (`limit`, `None`: never); each prompt's rows.
fn pack(prompts: &[&Prompt], limit: Option<usize>) -> Packed {
    let mut order: Vec<usize> = (0..prompts.len()).collect();
    if limit.is_some() {
        order.sort_by(|&a, &b| {
            (prompts[a].top, &prompts[a].ids).cmp(&(prompts[b].top, &prompts[b].ids))
        });
    }
    // Groups of prompts in `order`, each with its members' common start.
    let mut groups: Vec<(Vec<usize>, usize)> = Vec::new();
    for &i in &order {
        let p = prompts[i];
        if let Some((members, start)) = groups.last_mut() {
            let last = prompts[*members.last().expect("a group has members")];
            let joint = (*start).min(common_start(&last.ids, &p.ids));
            let rows = |s: usize| {
                s + members
                    .iter()
                    .map(|&m| prompts[m].ids.len() - s)
                    .sum::<usize>()
                    + p.ids.len()
                    - s
            };
            if last.top == p.top
                && joint >= MIN_SHARED
                && limit.is_some_and(|l| rows(joint - 1) <= l)
            {
                members.push(i);
                *start = joint;
                continue;
            }
        }
        groups.push((vec![i], p.ids.len()));
    }
    let mut ids = Vec::new();
    let mut seqs = Vec::new();
    let mut firsts = Vec::new();
    let mut placed = vec![
        PromptRows {
            seq: 0,
            shared_from: 0,
            shared: 0,
            own_from: 0,
        };
        prompts.len()
    ];
    for (members, start) in groups {
        let from = ids.len();
        firsts.push((members[0], start));
        if members.len() == 1 {
            placed[members[0]].seq = seqs.len();
            placed[members[0]].own_from = from;
            ids.extend_from_slice(&prompts[members[0]].ids);
            seqs.push((ids.len() - from, None));
            continue;
        }
        // The common start's last token begins every branch: its row's target is the prompt's
        // own next token.
        let shared = start - 1;
        ids.extend_from_slice(&prompts[members[0]].ids[..shared]);
        for &m in &members {
            placed[m] = PromptRows {
                seq: seqs.len(),
                shared_from: from,
                shared,
                own_from: ids.len(),
            };
            ids.extend_from_slice(&prompts[m].ids[shared..]);
        }
        let lens = members
            .iter()
            .map(|&m| prompts[m].ids.len() - shared)
            .collect();
        seqs.push((
            ids.len() - from,
            Some(Branches {
                prefix: shared,
                lens,
            }),
        ));
    }
    let layout = SeqLayout::from_sequences(seqs.iter().map(|(n, b)| (*n, b.as_ref())));
    Packed {
        ids,
        layout,
        placed,
        seqs: firsts,
    }
}

/// The rows a batch will take once packed (`pack`), kept as prompts join it, so that a batch
/// of prompts sharing their start (lm-eval's choices of one context) fills the token budget
/// with rows rather than with repeated contexts. Prompts share only within a bucket of the same
/// top list and first `MIN_SHARED` tokens (`pack` sorts by both and joins neighbours sharing
/// that many), and a bucket packs as one sequence: its members' longest common start once,
/// less its last token, then each member's rest; where that sequence would be longer than the
/// model allows, `pack` splits it, and the bucket is counted whole (an upper bound). A
/// sequence that continues rows of the prefix cache counts only its own (`reuse`: the rows
/// `continuations` takes from the cache for a sequence of that first prompt and common start).
struct BatchRows<'a> {
    limit: Option<usize>,
    reuse: &'a dyn Fn(&Prompt, usize) -> usize,
    /// Each bucket's first prompt (what later members' common start is measured against)
    /// and its count.
    buckets: std::collections::HashMap<(usize, Vec<u32>), (Prompt, Count)>,
    total: usize,
    /// The rows of the attention's sequences, cached ones included.
    attended: usize,
}

/// How many times the rows a batch computes its attention may read (rows continued from the
/// prefix cache included): the keys and values of those the batch holds through its layers.
const WHOLE_ROWS: usize = 2;

/// A bucket's members, their summed lengths, their longest common start, and the rows its
/// sequence continues from the prefix cache.
#[derive(Clone, Copy)]
struct Count {
    members: usize,
    tokens: usize,
    common: usize,
    reused: usize,
}

impl Count {
    /// The rows of the bucket's sequence before any taken from the cache, and whether the
    /// bucket packs as one sequence (which may then continue cached rows).
    fn whole(self, limit: Option<usize>) -> (usize, bool) {
        if self.members < 2 || self.common < MIN_SHARED {
            let one = self.members == 1 && limit.is_some_and(|l| self.tokens <= l);
            return (self.tokens, one);
        }
        let shared = self.common - 1;
        let rows = shared + self.tokens - self.members * shared;
        match limit {
            Some(l) if rows <= l => (rows, true),
            _ => (self.tokens, false),
        }
    }

    fn rows(self, limit: Option<usize>) -> usize {
        self.whole(limit).0 - self.reused
    }
}

impl<'a> BatchRows<'a> {
    fn new(limit: Option<usize>, reuse: &'a dyn Fn(&Prompt, usize) -> usize) -> Self {
        Self {
            limit,
            reuse,
            buckets: Default::default(),
            total: 0,
            attended: 0,
        }
    }

    fn key(p: &Prompt) -> (usize, Vec<u32>) {
        (p.top, p.ids[..p.ids.len().min(MIN_SHARED)].to_vec())
    }

    /// `p`'s bucket's count before and after `p` joins it.
    fn counts(&self, p: &Prompt) -> (Option<Count>, Count) {
        let (first, old, joined) = match self.buckets.get(&Self::key(p)) {
            None => {
                let alone = Count {
                    members: 1,
                    tokens: p.ids.len(),
                    common: p.ids.len(),
                    reused: 0,
                };
                (p, None, alone)
            }
            Some((first, c)) => {
                let joined = Count {
                    members: c.members + 1,
                    tokens: c.tokens + p.ids.len(),
                    common: c.common.min(common_start(&first.ids, &p.ids)),
                    reused: 0,
                };
                (first, Some(*c), joined)
            }
        };
        let reused = match joined.whole(self.limit).1 {
            true => (self.reuse)(first, joined.common),
            false => 0,
        };
        (old, Count { reused, ..joined })
    }

    /// Adds `p` where the batch's rows stay within `max`, and its attention's rows (the
    /// cached ones too, whose keys and values the batch holds) within `WHOLE_ROWS` times
    /// that; whether it did.
    fn add_within(&mut self, p: &Prompt, max: usize) -> bool {
        let (old, new) = self.counts(p);
        let total = self.total - old.map_or(0, |c| c.rows(self.limit)) + new.rows(self.limit);
        let whole = |c: Count| c.whole(self.limit).0;
        let attended = self.attended - old.map_or(0, whole) + whole(new);
        if total > max || attended > max.saturating_mul(WHOLE_ROWS) {
            return false;
        }
        self.total = total;
        self.attended = attended;
        self.buckets
            .entry(Self::key(p))
            .or_insert_with(|| (p.clone(), new))
            .1 = new;
        true
    }
}

/// Where a batch's sequences continue rows of the prefix cache: per sequence the kept rows
/// (indices into the `used` kept batches' rows laid end to end) and the kept prompt whose
/// answer gives their positions' scores.
struct Continuations<'c> {
    continued: Vec<Vec<u32>>,
    reused: Vec<Option<&'c KeptPrompt>>,
    used: Vec<usize>,
}

/// The rows `cache` gives a sequence of first prompt `p` whose prompts all start with the
/// same `common` tokens: the kept prompt sharing the longest start but the start's last token
/// (its target is each prompt's own).
fn reuse_of<B: Backend>(cache: &PrefixCache<B>, p: &Prompt, common: usize) -> usize {
    cache.find(p, common).map_or(0, |r| r.common - 1)
}

/// The packed batch's sequences continued from `cache`, where the model computes continued
/// sequences exactly (`limit`: `Model::branch_rows`).
fn continuations<'c, B: Backend>(
    packed: &Packed,
    prompts: &[&Prompt],
    cache: &'c PrefixCache<B>,
    limit: Option<usize>,
) -> Continuations<'c> {
    let n = packed.seqs.len();
    let mut out = Continuations {
        continued: vec![Vec::new(); n],
        reused: vec![None; n],
        used: Vec::new(),
    };
    let starts = &packed.layout.starts;
    for (s, &(first, common)) in packed.seqs.iter().enumerate() {
        let rows = starts[s + 1] - starts[s];
        if limit.is_none_or(|l| rows > l) {
            continue;
        }
        let Some(r) = cache.find(prompts[first], common) else {
            continue;
        };
        let used = &mut out.used;
        let part = used.iter().position(|&u| u == r.batch).unwrap_or_else(|| {
            used.push(r.batch);
            used.len() - 1
        });
        let offset: usize = used[..part].iter().map(|&u| cache.batch(u).rows).sum();
        // The common start's last token stays the prompt's own row (its target differs).
        out.continued[s] = r.kept.rows[..r.common - 1]
            .iter()
            .map(|&row| row + offset as u32)
            .collect();
        out.reused[s] = Some(r.kept);
    }
    out
}

/// Scores `prompts` in one forward batch through `stages`, a sequence continuing the rows of
/// an earlier prompt it starts like where `cache` holds them (and keeps this batch's); with
/// the answers, the rows it computed and took from the cache.
pub fn score<B: Backend>(
    stages: &Stages<B>,
    prompts: &[&Prompt],
    cache: &mut PrefixCache<B>,
) -> Result<(Vec<Scored>, Served)> {
    let model = stages[stages.len() - 1].1;
    let limit = model.branch_rows();
    let packed = pack(prompts, limit);
    let caching = cache.enabled() && limit.is_some();
    let Continuations {
        continued,
        reused,
        used,
    } = continuations(&packed, prompts, cache, limit);
    let earlier_rows = used.iter().map(|&u| cache.batch(u).rows).sum();
    let Packed {
        ids,
        layout,
        placed,
        ..
    } = packed;
    let plan = Continuation::new(layout, &continued, earlier_rows)?;
    let own_ids: Vec<u32> = plan.outputs.iter().map(|&r| ids[r as usize]).collect();
    let mut handed_on: Option<(&B, B::Tensor)> = None;
    let mut kept_kv = Vec::new();
    let mut kept_bytes = 0;
    for (j, &(b, stage)) in stages.iter().enumerate() {
        let x = match caching {
            true => {
                let earlier: Vec<_> = used.iter().map(|&u| &cache.batch(u).kv[j]).collect();
                let (x, kv) = stage.stage_forward_continued(
                    b,
                    handed_on.take(),
                    &own_ids,
                    &plan,
                    &earlier,
                )?;
                kept_bytes += kv
                    .iter()
                    .flatten()
                    .map(|(k, v)| b.tensor_bytes(k) + b.tensor_bytes(v))
                    .sum::<u64>();
                kept_kv.push(kv);
                x
            }
            false => stage.stage_forward(b, handed_on.take(), &own_ids, &plan.rows)?,
        };
        handed_on = Some((b, x));
    }
    let (b, residual) = handed_on
        .ok_or_else(|| crate::Error::InvalidArgument("a model placed on no device".into()))?;
    let hidden = model.final_norm(b, &residual)?;
    // Each batch row of an attention row (none for an earlier row).
    let mut own_row = vec![u32::MAX; plan.attention.n_tokens()];
    for (own, &r) in plan.outputs.iter().enumerate() {
        own_row[r as usize] = own as u32;
    }
    // Each row whose distribution is needed, with its target (the next prompt token; at a
    // prompt's last position any, its greedy token being read from `best`); a shared row is
    // needed by several prompts, with the same target.
    let mut targets = vec![-1i32; hidden.rows()];
    for (p, at) in prompts.iter().zip(&placed) {
        for pos in continued[at.seq].len()..scored_positions(p) {
            targets[own_row[at.row(pos)] as usize] = p.ids.get(pos + 1).map_or(0, |&t| t as i32);
        }
    }
    let mut slot = vec![usize::MAX; targets.len()];
    for (k, r) in (0..targets.len()).filter(|&r| targets[r] >= 0).enumerate() {
        slot[r] = k;
    }
    // Each row reduced where its logits are made: on a GPU only its log-sum-exp, two logits
    // and the longest top list asked for come back.
    let top = prompts.iter().map(|p| p.top).max().unwrap_or(0);
    let stats = model.head_row_stats(b, &hidden, &targets, top)?;
    let mut answers = Vec::with_capacity(prompts.len());
    for (p, at) in prompts.iter().zip(&placed) {
        let mut s = Scored {
            token_logprobs: Vec::with_capacity(p.ids.len().saturating_sub(1)),
            top: Vec::new(),
            next: None,
        };
        let earlier = continued[at.seq].len();
        if let Some(kept) = reused[at.seq] {
            s.token_logprobs
                .extend_from_slice(&kept.scored.token_logprobs[..earlier]);
            if p.top > 0 {
                s.top.extend(
                    kept.scored.top[..earlier]
                        .iter()
                        .map(|list| list[..p.top.min(list.len())].to_vec()),
                );
            }
        }
        for pos in earlier..scored_positions(p) {
            record(p, &mut s, pos, &stats[slot[own_row[at.row(pos)] as usize]]);
        }
        answers.push(s);
    }
    let served = Served {
        batches: 1,
        prompts: prompts.len() as u64,
        busy: Duration::ZERO,
        reused_rows: continued.iter().map(|c| c.len() as u64).sum(),
        computed_rows: plan.outputs.len() as u64,
    };
    if caching {
        let kept = prompts
            .iter()
            .zip(&placed)
            .zip(&answers)
            .map(|((p, at), s)| KeptPrompt {
                ids: p.ids.clone(),
                top: p.top,
                rows: (0..p.ids.len()).map(|pos| at.row(pos) as u32).collect(),
                scored: s.clone(),
            })
            .collect();
        let rows = plan.attention.n_tokens();
        cache.keep((kept_kv, rows, kept_bytes), kept);
    }
    Ok((answers, served))
}

/// The positions of `p` whose next-token distribution is read: all but the last, which too
/// where the greedy next token is asked for.
fn scored_positions(p: &Prompt) -> usize {
    if p.next { p.ids.len() } else { p.ids.len() - 1 }
}

/// Position `pos` of prompt `p` into its answer `s`: the next prompt token's logprob, or at
/// the last position the greedy next token; its top list (the first `p.top` of the row's).
fn record(p: &Prompt, s: &mut Scored, pos: usize, st: &RowStats) {
    let logprob = |logit: f32| f64::from(logit) - st.lse;
    if pos + 1 < p.ids.len() {
        s.token_logprobs.push(logprob(st.target_logit));
    } else {
        s.next = Some((st.best, logprob(st.best_logit)));
    }
    if p.top > 0 {
        s.top.push(
            st.top
                .iter()
                .take(p.top)
                .map(|&(t, l)| (t, logprob(l)))
                .collect(),
        );
    }
}

/// What was served: batches, prompts, the time spent scoring them, the rows computed and
/// those continued from the prefix cache.
#[derive(Clone, Copy, Debug, Default)]
pub struct Served {
    pub batches: u64,
    pub prompts: u64,
    pub busy: Duration,
    pub reused_rows: u64,
    pub computed_rows: u64,
}

impl std::ops::AddAssign for Served {
    fn add_assign(&mut self, other: Self) {
        self.batches += other.batches;
        self.prompts += other.prompts;
        self.busy += other.busy;
        self.reused_rows += other.reused_rows;
        self.computed_rows += other.computed_rows;
    }
}

/// Serves `jobs` through `stages` until every sender is gone: takes the waiting prompts in
/// order into batches of up to `max_batch_tokens` rows once packed (prompts that start alike
/// count their common start once; a longer prompt runs alone), waiting
/// up to `gather` after a batch's first prompt for more while the batch has room, skips those
/// whose client has gone, and answers each, keeping up to `cache_bytes` of recent batches'
/// keys and values for prompts that start like earlier ones (`PrefixCache`; returns what it
/// served). Prompts are taken in arrival order, so none
/// waits behind later ones. Several loops (one per replica) may share `jobs`: each takes a
/// batch while holding the lock, then scores it.
pub fn run_queue<B: Backend>(
    stages: &Stages<B>,
    jobs: &Mutex<Receiver<Job>>,
    carried: &Mutex<Option<Job>>,
    max_batch_tokens: usize,
    gather: Duration,
    cache_bytes: u64,
) -> Served {
    let limit = stages[stages.len() - 1].1.branch_rows();
    let mut cache = PrefixCache::new(cache_bytes);
    let mut served = Served::default();
    loop {
        let batch = {
            let jobs = jobs.lock().unwrap_or_else(|p| p.into_inner());
            let mut carried = carried.lock().unwrap_or_else(|p| p.into_inner());
            let first = match carried.take() {
                Some(j) => j,
                None => match jobs.recv() {
                    Ok(j) => j,
                    Err(_) => return served,
                },
            };
            let reuse = |p: &Prompt, common| reuse_of(&cache, p, common);
            let mut rows = BatchRows::new(limit, &reuse);
            rows.add_within(&first.prompt, usize::MAX);
            let mut batch = vec![first];
            let until = Instant::now() + gather;
            loop {
                let next = match jobs.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty) if rows.total < max_batch_tokens => {
                        match jobs.recv_timeout(until.saturating_duration_since(Instant::now())) {
                            Ok(j) => j,
                            Err(_) => break,
                        }
                    }
                    Err(_) => break,
                };
                if !rows.add_within(&next.prompt, max_batch_tokens) {
                    *carried = Some(next);
                    break;
                }
                batch.push(next);
            }
            batch
        };
        let batch: Vec<Job> = batch.into_iter().filter(|j| !j.reply.is_closed()).collect();
        if batch.is_empty() {
            continue;
        }
        let prompts: Vec<&Prompt> = batch.iter().map(|j| &j.prompt).collect();
        let started = Instant::now();
        // The cache's memory is the first to give back: a batch that fails beside it (a device
        // out of memory) runs again without it.
        let scored = score(stages, &prompts, &mut cache).or_else(|e| match cache.held_bytes() {
            0 => Err(e),
            _ => {
                cache.clear();
                score(stages, &prompts, &mut cache)
            }
        });
        served.busy += started.elapsed();
        match scored {
            Ok((results, batch_served)) => {
                served += batch_served;
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

    /// Prompts that start alike share their start's rows (but its last), each prompt's
    /// positions find its own tokens, and nothing is shared where the model allows no branches
    /// or prompts differ within `MIN_SHARED` tokens or in their top lists.
    #[test]
    fn prompts_that_start_alike_share_rows() {
        let ctx: Vec<u32> = (0..12).collect();
        let p = |tail: &[u32], top| Prompt {
            ids: ctx.iter().chain(tail).copied().collect(),
            top,
            next: true,
        };
        let prompts = [
            p(&[50, 51], 1),
            Prompt {
                ids: vec![0, 1, 2, 9],
                top: 1,
                next: false,
            },
            p(&[60], 1),
            p(&[50, 51], 5),
            p(&[70, 71, 72], 1),
        ];
        let refs: Vec<&Prompt> = prompts.iter().collect();
        let Packed {
            ids,
            layout,
            placed,
            ..
        } = pack(&refs, Some(usize::MAX));
        assert!(layout.branched());
        // 11 shared rows once, then 3 + 2 + 4 own rows; the other two prompts alone.
        assert_eq!(ids.len(), 11 + 3 + 2 + 4 + 4 + 14);
        for (p, at) in prompts.iter().zip(&placed) {
            for (pos, &t) in p.ids.iter().enumerate() {
                assert_eq!(ids[at.row(pos)], t);
                assert_eq!(layout.positions[at.row(pos)], pos as u32);
            }
        }
        assert_eq!(placed[0].shared, 11);
        assert_eq!(placed[1].shared, 0);
        assert_eq!(placed[3].shared, 0);
        let Packed { ids, layout, .. } = pack(&refs, None);
        assert!(!layout.branched());
        assert_eq!(
            ids.len(),
            prompts.iter().map(|p| p.ids.len()).sum::<usize>()
        );
    }

    /// The rows the queue counts as prompts join a batch are the rows `pack` lays out less
    /// those the prefix cache gives (`continuations`) where the model allows any length, and
    /// never fewer where it does not: random prompts, many starting alike (contexts with
    /// choices), some short, two top lists; with the cache empty and holding some of the
    /// contexts' starts.
    #[test]
    fn batch_rows_are_what_pack_lays_out() {
        use crate::backend::cpu::CpuBackend;
        let mut rng = crate::rng::Rng::new(53);
        let (mut shared_batches, mut cached_batches) = (0, 0);
        for trial in 0..200 {
            let contexts: Vec<Vec<u32>> = (0..3)
                .map(|c| {
                    let len = 4 + (rng.next_u64() % 30) as usize;
                    (0..len).map(|i| (c * 100 + i) as u32).collect()
                })
                .collect();
            let draw = |rng: &mut crate::rng::Rng| {
                let mut ids = contexts[(rng.next_u64() % 3) as usize].clone();
                let cut = (rng.next_u64() % (ids.len() as u64 + 1)) as usize;
                ids.truncate(cut.max(1));
                let tail = rng.next_u64() % 6;
                ids.extend((0..tail).map(|_| 1000 + (rng.next_u64() % 3) as u32));
                Prompt {
                    ids,
                    top: (rng.next_u64() % 2) as usize * 5,
                    next: false,
                }
            };
            let prompts: Vec<Prompt> = (0..1 + rng.next_u64() % 12)
                .map(|_| draw(&mut rng))
                .collect();
            let kept: Vec<Prompt> = (0..rng.next_u64() % 4).map(|_| draw(&mut rng)).collect();
            let refs: Vec<&Prompt> = prompts.iter().collect();
            for with_cache in [false, true] {
                let mut cache = PrefixCache::<CpuBackend>::new(1 << 20);
                if with_cache {
                    let as_kept = kept.iter().map(|p| KeptPrompt {
                        ids: p.ids.clone(),
                        top: p.top,
                        rows: (0..p.ids.len() as u32).collect(),
                        scored: Scored {
                            token_logprobs: vec![0.0; p.ids.len() - 1],
                            top: vec![Vec::new(); p.ids.len() - 1],
                            next: None,
                        },
                    });
                    cache.keep((vec![], 64, 1), as_kept.collect());
                }
                let reuse = |p: &Prompt, common| reuse_of(&cache, p, common);
                for limit in [Some(usize::MAX), Some(40), None] {
                    let mut rows = BatchRows::new(limit, &reuse);
                    for (k, p) in prompts.iter().enumerate() {
                        // A budget one row short refuses the prompt and leaves the count as it
                        // was.
                        let before = rows.total;
                        assert!(rows.add_within(p, usize::MAX));
                        let mut short = BatchRows::new(limit, &reuse);
                        prompts[..k]
                            .iter()
                            .for_each(|q| assert!(short.add_within(q, usize::MAX)));
                        assert!(!short.add_within(p, rows.total - 1));
                        assert_eq!(short.total, before);
                        let packed = pack(&refs[..=k], limit);
                        let from_cache: usize = continuations(&packed, &refs[..=k], &cache, limit)
                            .continued
                            .iter()
                            .map(Vec::len)
                            .sum();
                        let own = packed.ids.len() - from_cache;
                        match limit {
                            Some(usize::MAX) => {
                                assert_eq!(rows.total, own, "trial {trial}");
                                assert_eq!(rows.attended, packed.ids.len(), "trial {trial}");
                            }
                            _ => {
                                assert!(rows.total >= own, "trial {trial}");
                                assert!(rows.attended >= packed.ids.len(), "trial {trial}");
                            }
                        }
                        let naive: usize = refs[..=k].iter().map(|p| p.ids.len()).sum();
                        assert!(rows.total <= naive);
                        shared_batches += usize::from(limit.is_some() && rows.total < naive);
                        cached_batches += usize::from(from_cache > 0);
                    }
                }
            }
        }
        assert!(shared_batches > 500, "{shared_batches}");
        assert!(cached_batches > 500, "{cached_batches}");
    }

    #[test]
    fn row_stats_of_a_row_on_the_host() {
        // The greedy token is the first of equal largest logits, as the device passes take
        // it; the top list orders by value, then id.
        let st = RowStats::of(&[1.0, 3.0, 3.0, -1.0], 0, 3);
        assert_eq!((st.best, st.best_logit, st.target_logit), (1, 3.0, 1.0));
        assert_eq!(st.top, [(1, 3.0), (2, 3.0), (0, 1.0)]);
        let lse = RowStats::of(&[0.0, 0.0], 1, 0).lse;
        assert!((lse - 2f64.ln()).abs() < 1e-15);
    }
}
