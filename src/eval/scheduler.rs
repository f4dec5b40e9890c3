//! Packs a plan's windows into batches, drives one or several workers, and hands back each
//! window's per-token NLLs. Results are keyed by window index and aggregated by the caller in
//! window order, so every reported digit is the same whatever the batch size, the number of
//! workers or the order in which batches finish.

use std::sync::Mutex;
use std::sync::mpsc;

use crate::backend::{Backend, SeqLayout};
use crate::eval::plan::{Plan, Window};
use crate::model::Model;
use crate::{Error, Result};

/// One worker: a backend and the model uploaded to it (a GPU, or the CPU).
pub struct Worker<'a, B: Backend> {
    pub backend: &'a B,
    pub model: &'a Model<B>,
}

/// Consecutive windows evaluated in one forward pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub windows: Vec<usize>,
}

/// Groups the windows in `todo` (in order) into batches of at most `batch_tokens` tokens;
/// a window longer than the budget still gets a batch of its own.
pub fn make_batches(plan: &Plan, todo: &[usize], batch_tokens: usize) -> Vec<Batch> {
    let mut batches = Vec::new();
    let mut cur = Vec::new();
    let mut tokens = 0;
    for &w in todo {
        let len = plan.windows[w].ids.len();
        if !cur.is_empty() && tokens + len > batch_tokens {
            batches.push(Batch {
                windows: std::mem::take(&mut cur),
            });
            tokens = 0;
        }
        cur.push(w);
        tokens += len;
    }
    if !cur.is_empty() {
        batches.push(Batch { windows: cur });
    }
    batches
}

/// Forward pass of one batch on one worker: the scored NLLs of each window, checked finite.
pub fn run_batch<B: Backend>(
    worker: &Worker<B>,
    plan: &Plan,
    batch: &Batch,
) -> Result<Vec<(usize, Vec<f32>)>> {
    let windows: Vec<&Window> = batch.windows.iter().map(|&w| &plan.windows[w]).collect();
    let ids: Vec<u32> = windows.iter().flat_map(|w| w.ids.iter().copied()).collect();
    let targets: Vec<i32> = windows
        .iter()
        .flat_map(|w| w.targets.iter().copied())
        .collect();
    let layout = SeqLayout::from_lengths(windows.iter().map(|w| w.ids.len()));
    let nll = worker.model.nll(worker.backend, &ids, &layout, &targets)?;
    let mut out = Vec::with_capacity(windows.len());
    let mut k = 0;
    for (&wi, w) in batch.windows.iter().zip(&windows) {
        let n = w.scored();
        let slice = nll[k..k + n].to_vec();
        if let Some(i) = slice.iter().position(|v| !v.is_finite()) {
            let position = w
                .targets
                .iter()
                .enumerate()
                .filter(|(_, t)| **t >= 0)
                .nth(i)
                .map_or(0, |(p, _)| p);
            return Err(Error::NonFinite {
                what: "NLL",
                window: wi,
                position,
            });
        }
        out.push((wi, slice));
        k += n;
    }
    Ok(out)
}

/// Evaluates the batches on every worker at once (data parallel: each worker pulls the next
/// batch), calling `sink(window, nlls)` on this thread as results arrive. The first error
/// stops every worker after its current batch.
pub fn run<B: Backend>(
    workers: &[Worker<B>],
    plan: &Plan,
    batches: &[Batch],
    mut sink: impl FnMut(usize, Vec<f32>) -> Result<()>,
) -> Result<()>
where
    B::Linear: Sync,
    B::Tensor: Sync,
{
    if workers.len() <= 1 {
        let worker = workers
            .first()
            .ok_or_else(|| Error::InvalidArgument("no worker to run on".into()))?;
        for batch in batches {
            for (w, nll) in run_batch(worker, plan, batch)? {
                sink(w, nll)?;
            }
        }
        return Ok(());
    }
    let next = Mutex::new(0usize);
    let failed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<Result<Vec<(usize, Vec<f32>)>>>();
        for worker in workers {
            let tx = tx.clone();
            let (next, failed) = (&next, &failed);
            scope.spawn(move || {
                loop {
                    if failed.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    let i = {
                        let mut n = next.lock().unwrap_or_else(|p| p.into_inner());
                        let i = *n;
                        *n += 1;
                        i
                    };
                    let Some(batch) = batches.get(i) else { return };
                    let r = run_batch(worker, plan, batch);
                    let stop = r.is_err();
                    if tx.send(r).is_err() || stop {
                        return;
                    }
                }
            });
        }
        drop(tx);
        let mut first_err = None;
        for r in rx {
            match r.and_then(|done| done.into_iter().try_for_each(|(w, nll)| sink(w, nll))) {
                Ok(()) => {}
                Err(e) => {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    })
}
