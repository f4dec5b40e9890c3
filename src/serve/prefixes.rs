//! `serve`'s prefix cache: the keys and values of recent batches, kept on their devices
//! within a byte budget, so that a prompt starting like one scored before (lm-eval sends a
//! multiple-choice context once per choice, often in different batches) continues its rows
//! instead of computing them again (`model::Continuation`). Its answer is the one it gets
//! scored whole: the earlier positions' scores are the earlier prompt's, the later ones attend
//! to the kept keys and values.

use std::collections::{HashMap, VecDeque};

use super::scorer::{MIN_SHARED, Prompt, Scored, common_start};
use crate::backend::Backend;
use crate::model::KeysOfLayers;

/// Recent batches' keys and values, oldest first, within `budget` bytes.
pub struct PrefixCache<B: Backend> {
    budget: u64,
    held: u64,
    batches: VecDeque<KeptBatch<B>>,
    pub used: CacheUse,
}

/// Rows continued from the cache, and rows computed, since the server started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheUse {
    pub reused_rows: u64,
    pub computed_rows: u64,
}

impl std::ops::AddAssign for CacheUse {
    fn add_assign(&mut self, other: Self) {
        self.reused_rows += other.reused_rows;
        self.computed_rows += other.computed_rows;
    }
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
            used: CacheUse::default(),
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
    /// dropping the oldest batches beyond the budget; a batch larger than the whole budget is
    /// not kept.
    pub fn keep(
        &mut self,
        (kv, rows, bytes): (Vec<KeysOfLayers<B>>, usize, u64),
        prompts: Vec<KeptPrompt>,
    ) {
        if bytes > self.budget {
            return;
        }
        let mut by_start: HashMap<Vec<u32>, Vec<KeptPrompt>> = HashMap::new();
        for p in prompts.into_iter().filter(|p| p.ids.len() >= MIN_SHARED) {
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
    /// batches go first past the budget, and a batch larger than it is not kept.
    #[test]
    fn the_longest_kept_start_within_the_budget() {
        let mut cache = PrefixCache::<CpuBackend>::new(100);
        let a: Vec<u32> = (0..20).collect();
        let mut b = a.clone();
        b[15] = 99;
        let short: Vec<u32> = (0..7).collect();
        cache.keep((vec![], 5, 40), vec![kept(&b, 5), kept(&short, 0)]);
        cache.keep((vec![], 7, 40), vec![kept(&a[..12], 1)]);
        let found = cache.find(&prompt(&a, 1), usize::MAX).unwrap();
        assert_eq!((found.batch, found.common), (0, 15));
        assert_eq!(cache.find(&prompt(&a, 1), 13).unwrap().common, 13);
        // A longer top list than the first batch's: only the second batch's prompt serves.
        let found = cache.find(&prompt(&a, 9), usize::MAX);
        assert!(found.is_none());
        let found = cache.find(&prompt(&a, 1), usize::MAX).unwrap();
        assert_eq!(found.kept.ids.len(), 20);
        assert!(cache.find(&prompt(&a[..7], 0), usize::MAX).is_none());
        let other: Vec<u32> = (50..70).collect();
        assert!(cache.find(&prompt(&other, 0), usize::MAX).is_none());
        // A third batch pushes the first out; one over the budget is not kept.
        cache.keep((vec![], 3, 30), vec![kept(&other, 0)]);
        assert_eq!(cache.held_bytes(), 70);
        assert_eq!(cache.find(&prompt(&a, 0), usize::MAX).unwrap().common, 12);
        cache.keep((vec![], 3, 101), vec![kept(&a, 0)]);
        assert_eq!(cache.held_bytes(), 70);
        assert_eq!(cache.find(&prompt(&a, 0), usize::MAX).unwrap().common, 12);
        cache.clear();
        assert_eq!(cache.held_bytes(), 0);
        assert!(cache.find(&prompt(&other, 0), usize::MAX).is_none());
    }
}
