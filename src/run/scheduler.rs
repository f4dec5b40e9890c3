//! Packs a plan's windows into batches, drives one or several workers, and hands back each
//! window's per-token NLLs. Results are keyed by window index and aggregated by the caller in
//! window order, so every reported digit is the same whatever the batch size, the number of
//! workers or the order in which batches finish.

use std::sync::Mutex;
use std::sync::mpsc;
use std::time::Instant;

use serde::Serialize;

use crate::backend::{Backend, SeqLayout};
use crate::model::{LoadFor, Model};
use crate::plan::{Plan, Window};
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

impl Batch {
    /// Tokens through the model in this batch.
    pub fn tokens(&self, plan: &Plan) -> usize {
        self.windows
            .iter()
            .map(|&w| plan.windows[w].ids.len())
            .sum()
    }
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

/// What a model that runs `batches` of `plan` is loaded for: sequences as long as the plan's
/// longest window, the first batch's token count.
pub fn load_for(plan: &Plan, batches: &[Batch]) -> LoadFor {
    LoadFor {
        max_positions: plan.max_window(),
        first_batch_rows: batches.first().map(|b| b.tokens(plan)),
    }
}

/// The seconds one worker (a replica, or a pipeline stage) spent computing its batches, from
/// handing a batch to its device to having its results back. The first batch is apart: it
/// pays one-time costs (cuBLAS choosing kernels for shapes it has not seen, the memory pool
/// growing).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WorkerTime {
    pub batches: usize,
    pub seconds: f64,
    pub first_batch_seconds: f64,
}

impl WorkerTime {
    /// Runs `f` as one more batch of this worker, timing it.
    fn time<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = f();
        let seconds = start.elapsed().as_secs_f64();
        if self.batches == 0 {
            self.first_batch_seconds = seconds;
        }
        self.batches += 1;
        self.seconds += seconds;
        r
    }

    /// Adds a later run's times on the same workers (`compare`'s models one after another).
    pub fn add_runs(total: &mut Vec<WorkerTime>, run: Vec<WorkerTime>) {
        if total.is_empty() {
            *total = run;
            return;
        }
        for (t, r) in total.iter_mut().zip(run) {
            t.batches += r.batches;
            t.seconds += r.seconds;
        }
    }
}

/// One batch's windows laid end to end: token ids, targets (-1 = not scored) and layout.
pub struct BatchInputs {
    pub ids: Vec<u32>,
    pub targets: Vec<i32>,
    pub layout: SeqLayout,
}

/// The inputs of `batch`. A pipeline builds them once, at its first stage, and hands them on
/// with the residual stream.
pub fn batch_inputs(plan: &Plan, batch: &Batch) -> BatchInputs {
    let windows: Vec<&Window> = batch.windows.iter().map(|&w| &plan.windows[w]).collect();
    let ids = windows.iter().flat_map(|w| w.ids.iter().copied()).collect();
    let targets = windows
        .iter()
        .flat_map(|w| w.targets.iter().copied())
        .collect();
    let layout =
        SeqLayout::from_sequences(windows.iter().map(|w| (w.ids.len(), w.branches.as_ref())));
    BatchInputs {
        ids,
        targets,
        layout,
    }
}

/// Splits a batch's per-scored-position results into `(window, values)`, refusing any value
/// that is not `finite` with the window and position it came from.
pub fn split_by_window<T>(
    plan: &Plan,
    batch: &Batch,
    values: Vec<T>,
    what: &'static str,
    finite: impl Fn(&T) -> bool,
) -> Result<Vec<(usize, Vec<T>)>> {
    let needed: usize = batch
        .windows
        .iter()
        .map(|&w| plan.windows[w].scored())
        .sum();
    if values.len() != needed {
        return Err(Error::InvalidArgument(format!(
            "backend returned {} {what} values for a batch needing {needed}",
            values.len()
        )));
    }
    let mut out = Vec::with_capacity(batch.windows.len());
    let mut rest = values.into_iter();
    for &wi in &batch.windows {
        let w = &plan.windows[wi];
        let slice: Vec<T> = rest.by_ref().take(w.scored()).collect();
        if let Some(i) = slice.iter().position(|v| !finite(v)) {
            let position = w
                .targets
                .iter()
                .enumerate()
                .filter(|(_, t)| **t >= 0)
                .nth(i)
                .map_or(0, |(p, _)| p);
            return Err(Error::NonFinite {
                what,
                window: wi,
                position,
            });
        }
        out.push((wi, slice));
    }
    Ok(out)
}

/// Forward pass of one batch on one worker: the scored NLLs of each window, checked finite.
pub fn run_batch<B: Backend>(
    worker: &Worker<B>,
    plan: &Plan,
    batch: &Batch,
) -> Result<Vec<(usize, Vec<f32>)>> {
    let BatchInputs {
        ids,
        targets,
        layout,
    } = batch_inputs(plan, batch);
    let nll = worker.model.nll(worker.backend, &ids, &layout, &targets)?;
    split_by_window(plan, batch, nll, "NLL", |v| v.is_finite())
}

/// Evaluates the batches on every worker at once (data parallel: each worker pulls the next
/// batch), calling `sink(window, nlls)` on this thread as results arrive. The first error
/// stops every worker after its current batch. Returns each worker's time.
pub fn run<B: Backend>(
    workers: &[Worker<B>],
    plan: &Plan,
    batches: &[Batch],
    sink: impl FnMut(usize, Vec<f32>) -> Result<()>,
) -> Result<Vec<WorkerTime>> {
    run_each(
        workers.len(),
        batches,
        |i| workers[i].backend.enter_thread(),
        |i, batch| run_batch(&workers[i], plan, batch),
        sink,
    )
}

/// The batch loop behind [`run`], for any per-window result: `work(worker, batch)` evaluates
/// one batch on worker `worker` (of `n_workers`) and returns `(window, result)` pairs, which
/// `sink` receives on this thread; `enter(worker)` prepares each worker thread (see
/// `Backend::enter_thread`). `compare` runs its KL divergence batches through it. Returns
/// each worker's time.
pub fn run_each<T: Send>(
    n_workers: usize,
    batches: &[Batch],
    enter: impl Fn(usize) -> Result<()> + Sync,
    work: impl Fn(usize, &Batch) -> Result<Vec<(usize, T)>> + Sync,
    mut sink: impl FnMut(usize, T) -> Result<()>,
) -> Result<Vec<WorkerTime>> {
    if n_workers <= 1 {
        if n_workers == 0 {
            return Err(Error::InvalidArgument("no worker to run on".into()));
        }
        let mut time = WorkerTime::default();
        for batch in batches {
            for (w, r) in time.time(|| work(0, batch))? {
                sink(w, r)?;
            }
        }
        return Ok(vec![time]);
    }
    let next = Mutex::new(0usize);
    let failed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<Result<Vec<(usize, T)>>>();
        let threads: Vec<_> = (0..n_workers)
            .map(|worker| {
                let tx = tx.clone();
                let (next, failed, work, enter) = (&next, &failed, &work, &enter);
                scope.spawn(move || {
                    let mut time = WorkerTime::default();
                    if let Err(e) = enter(worker) {
                        let _ = tx.send(Err(e));
                        return time;
                    }
                    loop {
                        if failed.load(std::sync::atomic::Ordering::Relaxed) {
                            return time;
                        }
                        let i = {
                            let mut n = next.lock().unwrap_or_else(|p| p.into_inner());
                            let i = *n;
                            *n += 1;
                            i
                        };
                        let Some(batch) = batches.get(i) else {
                            return time;
                        };
                        let r = time.time(|| work(worker, batch));
                        let stop = r.is_err();
                        if tx.send(r).is_err() || stop {
                            return time;
                        }
                    }
                })
            })
            .collect();
        drop(tx);
        drain(rx, &failed, sink)?;
        Ok(join_times(threads))
    })
}

/// Each worker thread's time, in worker order.
fn join_times(threads: Vec<std::thread::ScopedJoinHandle<'_, WorkerTime>>) -> Vec<WorkerTime> {
    threads
        .into_iter()
        .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        .collect()
}

/// Evaluates the batches through a pipeline of stages, one per device, each holding a
/// contiguous range of layers (`--parallel layers`). Stage threads hand the residual stream
/// on (`Backend::copy_from`: device to device where the backend can, else through the host);
/// several batches are in flight so every device works at once.
/// Results reach `sink` on this thread; the first error stops every stage. Returns each
/// stage's time.
pub fn run_pipeline<B: Backend>(
    stages: &[Worker<B>],
    plan: &Plan,
    batches: &[Batch],
    sink: impl FnMut(usize, Vec<f32>) -> Result<()>,
) -> Result<Vec<WorkerTime>> {
    if stages.first().is_some_and(|s| !s.model.has_embedding())
        || stages.last().is_some_and(|s| !s.model.has_head())
    {
        return Err(Error::InvalidArgument(
            "the first pipeline stage must hold the embedding and the last the lm_head".into(),
        ));
    }
    let devices: Vec<&B> = stages.iter().map(|s| s.backend).collect();
    run_pipeline_each(
        &devices,
        batches,
        |si, batch, state: Option<(BatchInputs, B::Tensor)>| {
            let (inputs, handed_on) = match state {
                Some((inputs, x)) => (inputs, Some((stages[si - 1].backend, x))),
                None => (batch_inputs(plan, batch), None),
            };
            let b = stages[si].backend;
            let x = stages[si]
                .model
                .stage_forward(b, handed_on, &inputs.ids, &inputs.layout)?;
            Ok((inputs, x))
        },
        |batch, (inputs, x)| {
            let last = &stages[stages.len() - 1];
            let nll = last
                .model
                .nll_from_residual(last.backend, &x, &inputs.targets)?;
            split_by_window(plan, batch, nll, "NLL", |v| v.is_finite())
        },
        sink,
    )
}

/// The pipeline loop behind [`run_pipeline`], for any state handed from stage to stage:
/// stage `s` runs on its own thread on `devices[s]` and turns the previous stage's output
/// (`None` at the first stage) into its own with `advance(s, batch, input)`; the last stage's
/// output goes to `finish(batch, output)` on that stage's thread, and the `(window, result)`
/// pairs it returns reach `sink` on this thread. `compare` pipelines its base and quantized
/// model side by side through it. The first error stops every stage. Returns each stage's
/// time (a stage's batch: its layers, the hand-over's synchronization, and the last stage's
/// `finish`).
pub fn run_pipeline_each<B: Backend, S: Send, T: Send>(
    devices: &[&B],
    batches: &[Batch],
    advance: impl Fn(usize, &Batch, Option<S>) -> Result<S> + Sync,
    finish: impl Fn(&Batch, S) -> Result<Vec<(usize, T)>> + Sync,
    sink: impl FnMut(usize, T) -> Result<()>,
) -> Result<Vec<WorkerTime>> {
    let n = devices.len();
    if n == 0 {
        return Err(Error::InvalidArgument("no pipeline stage to run on".into()));
    }
    let failed = std::sync::atomic::AtomicBool::new(false);
    // Two batches may wait between stages: enough to keep every device busy, bounded memory.
    const IN_FLIGHT: usize = 2;
    std::thread::scope(|scope| {
        let (done_tx, done_rx) = mpsc::channel::<Result<Vec<(usize, T)>>>();
        let mut upstream: Option<mpsc::Receiver<(usize, S)>> = None;
        let mut threads = Vec::with_capacity(n);
        for (si, &b) in devices.iter().enumerate() {
            let last = si + 1 == n;
            let (tx, rx) = mpsc::sync_channel::<(usize, S)>(IN_FLIGHT);
            let input = upstream.take();
            upstream = Some(rx);
            let done_tx = done_tx.clone();
            let (failed, advance, finish) = (&failed, &advance, &finish);
            threads.push(scope.spawn(move || {
                let mut time = WorkerTime::default();
                let work = || -> Result<()> {
                    b.enter_thread()?;
                    let mut step = |bi: usize, state: Option<S>| -> Result<bool> {
                        if failed.load(std::sync::atomic::Ordering::Relaxed) {
                            return Ok(false);
                        }
                        let batch = &batches[bi];
                        if last {
                            let done = time.time(|| finish(batch, advance(si, batch, state)?))?;
                            Ok(done_tx.send(Ok(done)).is_ok())
                        } else {
                            let out = time.time(|| -> Result<S> {
                                let out = advance(si, batch, state)?;
                                // The next stage reads `out` from another thread and device.
                                b.synchronize()?;
                                Ok(out)
                            })?;
                            Ok(tx.send((bi, out)).is_ok())
                        }
                    };
                    match input {
                        None => {
                            for bi in 0..batches.len() {
                                if !step(bi, None)? {
                                    break;
                                }
                            }
                        }
                        Some(rx) => {
                            for (bi, v) in rx {
                                if !step(bi, Some(v))? {
                                    break;
                                }
                            }
                        }
                    }
                    Ok(())
                };
                if let Err(e) = work() {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    let _ = done_tx.send(Err(e));
                }
                time
            }));
        }
        drop(done_tx);
        drop(upstream);
        drain(done_rx, &failed, sink)?;
        Ok(join_times(threads))
    })
}

/// Hands every result arriving on `rx` to `sink` until all senders are gone; the first error
/// (a worker's or the sink's) raises `failed` so the workers stop, and is returned.
fn drain<T>(
    rx: mpsc::Receiver<Result<Vec<(usize, T)>>>,
    failed: &std::sync::atomic::AtomicBool,
    mut sink: impl FnMut(usize, T) -> Result<()>,
) -> Result<()> {
    let mut first_err = None;
    for r in rx {
        if let Err(e) = r.and_then(|done| done.into_iter().try_for_each(|(w, r)| sink(w, r))) {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::{load_for, make_batches};
    use crate::model::LoadFor;
    use crate::plan::{Method, Plan, Window};

    fn plan_of(lengths: &[usize]) -> Plan {
        let windows: Vec<Window> = lengths
            .iter()
            .map(|&n| Window {
                ids: vec![1; n],
                targets: vec![-1; n],
                doc: 0,
                branches: None,
            })
            .collect();
        Plan::single(Method::Exl3, windows, lengths.iter().sum())
    }

    /// A model is loaded for the plan's longest window and for the first batch of the windows
    /// still to do, as `make_batches` packs them.
    #[test]
    fn loaded_for_the_longest_window_and_the_first_batch_to_do() {
        let plan = plan_of(&[64, 64, 30, 100]);
        let for_todo = |todo: &[usize], batch_tokens| {
            load_for(&plan, &make_batches(&plan, todo, batch_tokens))
        };
        let loaded = |rows| LoadFor {
            max_positions: 100,
            first_batch_rows: rows,
        };
        assert_eq!(for_todo(&[0, 1, 2, 3], 128), loaded(Some(128)));
        // Resumed after the first two windows: 30 + 100 > 128, so 30 alone.
        assert_eq!(for_todo(&[2, 3], 128), loaded(Some(30)));
        // A window longer than the budget gets a batch of its own.
        assert_eq!(for_todo(&[3], 50), loaded(Some(100)));
        assert_eq!(for_todo(&[], 128), loaded(None));
    }
}
