//! `--dump-nll`: every window's per-position negative log-likelihoods, for analysis outside
//! quantppl. JSON Lines, one object per window in window order:
//!
//! ```text
//! {"window": 0, "doc": 0, "ids": [1, 403, ...], "positions": [0, 1, ...],
//!  "targets": [403, 73, ...], "nll": [5.1327, 4.0061, ...]}
//! ```
//!
//! `ids` are the window's input tokens; position `positions[j]` of it predicts the token
//! `targets[j]` (the next token of the text) with NLL `nll[j]` in nats (the f32 the backend
//! computed, written so that it reads back to the same f32). Only scored positions are
//! listed: the method decides which (llama.cpp scores the second half of each chunk).

use std::path::Path;

use serde::Serialize;

use crate::plan::Plan;
use crate::{Error, Result};

#[derive(Serialize)]
struct WindowNll<'a> {
    window: usize,
    doc: u32,
    ids: &'a [u32],
    positions: Vec<usize>,
    targets: Vec<i32>,
    nll: &'a [f32],
}

/// Writes the dump of `plan`'s windows, whose NLLs are `results` (window order), to `path`.
pub fn write_nll_dump(path: &Path, plan: &Plan, results: &[Vec<f32>]) -> Result<()> {
    let scored = |w: usize| -> Vec<usize> {
        let targets = &plan.windows[w].targets;
        (0..targets.len()).filter(|&p| targets[p] >= 0).collect()
    };
    for (w, nll) in results.iter().enumerate().take(plan.windows.len()) {
        let n = scored(w).len();
        if n != nll.len() {
            return Err(Error::InvalidArgument(format!(
                "window {w}: {} NLLs for {n} scored positions",
                nll.len()
            )));
        }
    }
    crate::report::write_whole(path, |out| {
        for (w, (window, nll)) in plan.windows.iter().zip(results).enumerate() {
            let positions = scored(w);
            let line = WindowNll {
                window: w,
                doc: window.doc,
                ids: &window.ids,
                targets: positions.iter().map(|&p| window.targets[p]).collect(),
                positions,
                nll,
            };
            serde_json::to_writer(&mut *out, &line)?;
            out.write_all(b"\n")?;
        }
        Ok(())
    })
}
