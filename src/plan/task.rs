//! A multiple-choice task's requests as windows (`eval --task`, `compare --task`): each
//! request encoded as lm-eval's `hf` model encodes it (`data::task::encode_request`, the
//! sequence cut from the left to the model's context), an item's requests one window whose
//! rows after their common start are branches, one a request (`backend::Branches`: each
//! request's tokens computed exactly as if it ran alone, its shared context run once), or a
//! window per request where the model cannot share rows.

use rayon::prelude::*;

use super::{Method, Plan, ResolvedSettings, Window};
use crate::backend::Branches;
use crate::checkpoint::ModelConfig;
use crate::data::TextTokenizer;
use crate::data::task::{Task, encode_request};
use crate::{Error, Result};

/// A request as the model reads it: its input tokens and the targets of its last `scored`
/// positions (the continuation's tokens).
struct Encoded {
    input: Vec<u32>,
    targets: Vec<i32>,
    scored: usize,
}

/// Which requests each window scores, to turn its per-position values into log-likelihoods.
pub struct TaskRequests {
    /// Per window, in the order of its scored positions: (item, choice, positions).
    windows: Vec<Vec<(usize, usize, usize)>>,
    /// Choices per item.
    choices: Vec<usize>,
}

impl TaskRequests {
    /// Every item's log-likelihoods, choice by choice: minus the sum of `nll` over each
    /// request's positions in `results` (each window's values at its scored positions).
    pub fn loglikelihoods<T>(&self, results: &[Vec<T>], nll: impl Fn(&T) -> f64) -> Vec<Vec<f64>> {
        let mut lls: Vec<Vec<f64>> = self.choices.iter().map(|&n| vec![0.0; n]).collect();
        for (requests, values) in self.windows.iter().zip(results) {
            let mut at = 0;
            for &(item, choice, n) in requests {
                lls[item][choice] = -values[at..at + n].iter().map(&nll).sum::<f64>();
                at += n;
            }
        }
        lls
    }
}

/// The windows of `task` for a model of `cfg` read with `tokenizer`; an item's requests share
/// their common start where its window has at most `branch_rows` rows (`None`: never).
pub fn task_plan(
    task: &Task,
    tokenizer: &TextTokenizer,
    cfg: &ModelConfig,
    branch_rows: Option<usize>,
) -> Result<(Plan, ResolvedSettings, TaskRequests)> {
    let max_len = cfg.max_position_embeddings;
    let prefix = tokenizer.bos_id().or(cfg.bos_token_id).or(cfg.eos_token_id);
    let encoded: Vec<Vec<Encoded>> = task
        .items
        .par_iter()
        .enumerate()
        .map(|(i, item)| {
            item.requests
                .iter()
                .enumerate()
                .map(|(c, (context, continuation))| {
                    let at = |e: String| format!("task item {}, choice {c}: {e}", i + 1);
                    let (ctx, cont) = encode_request(tokenizer, (context, continuation), prefix)
                        .map_err(|e| Error::InvalidArgument(at(e.to_string())))?;
                    if cont.is_empty() || cont.len() > max_len {
                        return Err(Error::InvalidArgument(at(format!(
                            "a continuation of {} tokens (1 to the model's {max_len} are \
                             scored)",
                            cont.len()
                        ))));
                    }
                    let whole: Vec<u32> = ctx.iter().chain(&cont).copied().collect();
                    let seq = &whole[whole.len().saturating_sub(max_len + 1)..];
                    let first = seq.len() - 1 - cont.len();
                    Ok(Encoded {
                        input: seq[..seq.len() - 1].to_vec(),
                        targets: (0..seq.len() - 1)
                            .map(|p| if p >= first { seq[p + 1] as i32 } else { -1 })
                            .collect(),
                        scored: cont.len(),
                    })
                })
                .collect()
        })
        .collect::<Result<_>>()?;
    let mut windows = Vec::new();
    let mut requests = Vec::new();
    for (item, reqs) in encoded.into_iter().enumerate() {
        let doc = item as u32;
        let shared = shared_prefix(&reqs);
        let rows = shared + reqs.iter().map(|r| r.input.len() - shared).sum::<usize>();
        if shared > 0 && branch_rows.is_some_and(|limit| rows <= limit.min(max_len)) {
            let mut ids = reqs[0].input[..shared].to_vec();
            let mut targets = vec![-1; shared];
            for r in &reqs {
                ids.extend_from_slice(&r.input[shared..]);
                targets.extend_from_slice(&r.targets[shared..]);
            }
            let lens = reqs.iter().map(|r| r.input.len() - shared).collect();
            windows.push(Window {
                ids,
                targets,
                doc,
                branches: Some(Branches {
                    prefix: shared,
                    lens,
                }),
            });
            requests.push(
                reqs.iter()
                    .enumerate()
                    .map(|(c, r)| (item, c, r.scored))
                    .collect(),
            );
        } else {
            for (c, r) in reqs.into_iter().enumerate() {
                windows.push(Window {
                    ids: r.input,
                    targets: r.targets,
                    doc,
                    branches: None,
                });
                requests.push(vec![(item, c, r.scored)]);
            }
        }
    }
    let n_tokens = windows.iter().map(|w| w.ids.len()).sum();
    let plan = Plan {
        method: Method::Task,
        windows,
        docs: Vec::new(),
        n_docs: task.items.len(),
        n_tokens,
    };
    let settings = ResolvedSettings {
        data: task.name.clone(),
        data_fingerprint: task.fingerprint.clone(),
        text: "task".into(),
        method: Method::Task,
        ctx: plan.max_window(),
        stride: None,
        rows: None,
        defaults: Vec::new(),
        n_tokens,
        n_docs: task.items.len(),
        bos: "as lm-eval's hf model encodes requests (the tokenizer's own special tokens)".into(),
    };
    let choices = task.items.iter().map(|i| i.requests.len()).collect();
    Ok((
        plan,
        settings,
        TaskRequests {
            windows: requests,
            choices,
        },
    ))
}

/// The rows an item's requests may share: their common start, up to the first position any
/// of them scores (its target differs from request to request).
fn shared_prefix(reqs: &[Encoded]) -> usize {
    let first = &reqs[0].input;
    let mut n = reqs
        .iter()
        .map(|r| r.input.len() - r.scored)
        .min()
        .unwrap_or(0);
    for r in &reqs[1..] {
        n = n.min(
            first
                .iter()
                .zip(&r.input)
                .take_while(|(a, b)| a == b)
                .count(),
        );
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::task::TaskItem;

    /// Each branch of a shared window, after the shared rows, is its request's own window
    /// (ids and targets), and values map back to the same request either way.
    #[test]
    fn a_branch_after_its_shared_rows_is_its_request_alone() {
        let dir = crate::assets::dense_model_dir().unwrap();
        let tok = TextTokenizer::from_model_dir(&dir).unwrap();
        let (cfg, _) = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let items = vec![
            TaskItem::with_choices("Once upon a time", &s(&["there was", "a dog ran", "it"]), 1)
                .unwrap(),
            TaskItem::with_contexts(
                &s(&["Tom saw the cat", "Tom saw the big dog"]),
                "and ran",
                0,
            )
            .unwrap(),
        ];
        let task = Task {
            name: "t".into(),
            items,
            fingerprint: String::new(),
        };
        let (alone, _, alone_req) = task_plan(&task, &tok, &cfg, None).unwrap();
        let (shared, _, shared_req) = task_plan(&task, &tok, &cfg, Some(usize::MAX)).unwrap();
        assert_eq!(alone.windows.len(), 5);
        assert_eq!(shared.windows.len(), 2);
        let mut next = alone.windows.iter();
        for w in &shared.windows {
            let b = w.branches.as_ref().expect("branches");
            assert!(b.prefix > 0);
            let mut at = b.prefix;
            for &n in &b.lens {
                let own = next.next().unwrap();
                let ids: Vec<u32> = w.ids[..b.prefix]
                    .iter()
                    .chain(&w.ids[at..at + n])
                    .copied()
                    .collect();
                let targets: Vec<i32> = w.targets[..b.prefix]
                    .iter()
                    .chain(&w.targets[at..at + n])
                    .copied()
                    .collect();
                assert_eq!((ids, targets), (own.ids.clone(), own.targets.clone()));
                at += n;
            }
        }
        // Per-position values numbered in scored order give each request the same sum.
        let numbered = |plan: &Plan| -> Vec<Vec<f64>> {
            let mut k = 0.0;
            plan.windows
                .iter()
                .map(|w| {
                    (0..w.scored())
                        .map(|_| {
                            k += 1.0;
                            k
                        })
                        .collect()
                })
                .collect()
        };
        let a = alone_req.loglikelihoods(&numbered(&alone), |&v| v);
        let b = shared_req.loglikelihoods(&numbered(&shared), |&v| v);
        assert_eq!(a, b);
        assert!(a.iter().flatten().all(|&v| v < 0.0));
    }
}
