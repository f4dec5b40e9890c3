//! `serve`'s prefix cache: the keys and values of recent batches, kept on their devices
//! within a byte budget, so that a prompt starting like one scored before (lm-eval sends a
//! multiple-choice context once per choice, often in different batches) continues its rows
//! instead of computing them again (`model::Continuation`). Its answer is the one it gets
//! scored whole: the earlier positions' scores are the earlier prompt's, the later ones attend
//! to the kept keys and values.

use std::collections::{HashMap, VecDeque};

use super::scorer::{MIN_SHARED, Prompt, Scored, TokenLogprob, common_start};
use crate::backend::Backend;
use crate::model::KeysOfLayers;

/// Recent batches' keys and values, oldest first, within `budget` bytes (with the kept
/// prompts' tokens and answers, which take host memory of the same order on small models).
pub struct PrefixCache<B: Backend> {
    budget: u64,
    held: u64,
    batches: VecDeque<KeptBatch<B>>,
}

/// One batch's keys and values (per stage, by layer), over its attention's rows, and the
/// prompts whose rows they hold.
pub struct KeptBatch<B: Backend> {
    pub kv: Vec<KeysOfLayers<B>>,
    /// Rows of its attention (of each kept tensor).
    pub rows: usize,
    bytes: u64,
    /// By their first `MIN_SHARED` tokens.
    prompts: HashMap<Vec<u32>, Vec<KeptPrompt>>,
}

/// A prompt a kept batch scored: its tokens, top-list length, per position its row of the
/// batch's attention, and its answer.
pub struct KeptPrompt {
    pub ids: Vec<u32>,
    pub top: usize,
    pub rows: Vec<u32>,
    pub scored: Scored,
}

impl KeptPrompt {
    /// Host bytes it holds, allocator headers aside.
    fn bytes(&self) -> u64 {
        let list = size_of::<Vec<TokenLogprob>>();
        let lists: usize = self
            .scored
            .top
            .iter()
            .map(|l| list + l.len() * size_of::<TokenLogprob>())
            .sum();
        (size_of::<Self>()
            + (self.ids.len() + self.rows.len()) * size_of::<u32>()
            + self.scored.token_logprobs.len() * size_of::<f64>()
            + lists) as u64
    }
}

/// The longest start a prompt shares with a kept one: the kept batch (its index, oldest
/// first), the prompt, and how many tokens they share.
pub struct Reuse<'a> {
    pub batch: usize,
    pub kept: &'a KeptPrompt,
    pub common: usize,
}

impl<B: Backend> PrefixCache<B> {
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            held: 0,
            batches: VecDeque::new(),
        }
    }

    /// Whether batches are kept at all (a budget of 0 turns the cache off).
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// Bytes held on the devices.
    pub fn held_bytes(&self) -> u64 {
        self.held
    }

    /// Drops every kept batch.
    pub fn clear(&mut self) {
        self.batches.clear();
        self.held = 0;
    }

    pub fn batch(&self, i: usize) -> &KeptBatch<B> {
        &self.batches[i]
    }

    /// The kept prompt sharing the longest start with `p` among those with top lists at least
    /// as long, at most `upto` tokens of it counted (the newest at equal lengths); `None`
    /// below `MIN_SHARED`.
    pub fn find(&self, p: &Prompt, upto: usize) -> Option<Reuse<'_>> {
        let key = p.ids.get(..MIN_SHARED)?;
        let mut best: Option<Reuse> = None;
        for (batch, kept) in self.batches.iter().enumerate() {
            for k in kept.prompts.get(key).into_iter().flatten() {
                if k.top < p.top {
                    continue;
                }
                let common = common_start(&k.ids, &p.ids).min(upto);
                if common >= MIN_SHARED && best.as_ref().is_none_or(|b| common >= b.common) {
                    best = Some(Reuse {
                        batch,
                        kept: k,
                        common,
                    });
                }
            }
        }
        best
    }

    /// Keeps a batch's keys and values (`bytes` of them) and the prompts whose rows they hold,
    /// dropping the oldest batches beyond the budget; a batch larger than the whole budget
    /// (with its prompts) is not kept.
    pub fn keep(
        &mut self,
        (kv, rows, bytes): (Vec<KeysOfLayers<B>>, usize, u64),
        prompts: Vec<KeptPrompt>,
    ) {
        let prompts: Vec<KeptPrompt> = prompts
            .into_iter()
            .filter(|p| p.ids.len() >= MIN_SHARED)
            .collect();
        let bytes = bytes + prompts.iter().map(KeptPrompt::bytes).sum::<u64>();
        if bytes > self.budget {
            return;
        }
        let mut by_start: HashMap<Vec<u32>, Vec<KeptPrompt>> = HashMap::new();
        for p in prompts {
            by_start
                .entry(p.ids[..MIN_SHARED].to_vec())
                .or_default()
                .push(p);
        }
        while self.held + bytes > self.budget {
            match self.batches.pop_front() {
                Some(old) => self.held -= old.bytes,
                None => break,
            }
        }
        self.held += bytes;
        self.batches.push_back(KeptBatch {
            kv,
            rows,
            bytes,
            prompts: by_start,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    fn kept(ids: &[u32], top: usize) -> KeptPrompt {
        KeptPrompt {
            ids: ids.to_vec(),
            top,
            rows: (0..ids.len() as u32).collect(),
            scored: Scored {
                token_logprobs: vec![0.0; ids.len() - 1],
                top: Vec::new(),
                next: None,
            },
        }
    }

    fn prompt(ids: &[u32], top: usize) -> Prompt {
        Prompt {
            ids: ids.to_vec(),
            top,
            next: false,
        }
    }

    /// The longest start shared with a kept prompt wins (the newest at equal lengths), never
    /// below `MIN_SHARED` nor past `upto`, only from a top list at least as long; the oldest
    /// batches go first past the budget, which counts the kept prompts too, and a batch larger
    /// than it is not kept.
    #[test]
    fn the_longest_kept_start_within_the_budget() {
        let a: Vec<u32> = (0..20).collect();
        let mut b = a.clone();
        b[15] = 99;
        let short: Vec<u32> = (0..7).collect();
        let other: Vec<u32> = (50..70).collect();
        // Prompts of 20 and 12 tokens, the latter with a top list at each position.
        let whole = kept(&a, 0).bytes();
        let mut a12 = kept(&a[..12], 1);
        a12.scored.top = vec![vec![(0, 0.0)]; 11];
        let part = a12.bytes();
        assert_eq!(part - kept(&a[..12], 1).bytes(), 11 * (24 + 16));
        let mut cache = PrefixCache::<CpuBackend>::new(100 + whole + part);
        // The 7-token prompt is too short to be kept and costs nothing.
        cache.keep((vec![], 5, 40), vec![kept(&b, 5), kept(&short, 0)]);
        cache.keep((vec![], 7, 40), vec![a12]);
        assert_eq!(cache.held_bytes(), 80 + whole + part);
        let found = cache.find(&prompt(&a, 1), usize::MAX).unwrap();
        assert_eq!((found.batch, found.common), (0, 15));
        assert_eq!(found.kept.ids.len(), 20);
        assert_eq!(cache.find(&prompt(&a, 1), 13).unwrap().common, 13);
        // A top list longer than every kept one: none serves.
        assert!(cache.find(&prompt(&a, 9), usize::MAX).is_none());
        assert!(cache.find(&prompt(&a[..7], 0), usize::MAX).is_none());
        assert!(cache.find(&prompt(&other, 0), usize::MAX).is_none());
        // A third batch pushes the first out.
        cache.keep((vec![], 3, 30), vec![kept(&other, 0)]);
        assert_eq!(cache.held_bytes(), 70 + part + whole);
        assert_eq!(cache.find(&prompt(&a, 0), usize::MAX).unwrap().common, 12);
        // Keys and values within the budget whose prompt takes it over: not kept.
        cache.keep((vec![], 3, 101 + part), vec![kept(&a, 0)]);
        assert_eq!(cache.held_bytes(), 70 + part + whole);
        assert_eq!(cache.find(&prompt(&a, 0), usize::MAX).unwrap().common, 12);
        cache.clear();
        assert_eq!(cache.held_bytes(), 0);
        assert!(cache.find(&prompt(&other, 0), usize::MAX).is_none());
    }
}
