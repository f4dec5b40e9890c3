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

use std::io::Write;
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
    let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let mut out = std::io::BufWriter::new(file);
    for (w, (window, nll)) in plan.windows.iter().zip(results).enumerate() {
        let positions: Vec<usize> = (0..window.targets.len())
            .filter(|&p| window.targets[p] >= 0)
            .collect();
        if positions.len() != nll.len() {
            return Err(Error::InvalidArgument(format!(
                "window {w}: {} NLLs for {} scored positions",
                nll.len(),
                positions.len()
            )));
        }
        let line = WindowNll {
            window: w,
            doc: window.doc,
            ids: &window.ids,
            targets: positions.iter().map(|&p| window.targets[p]).collect(),
            positions,
            nll,
        };
        serde_json::to_writer(&mut out, &line).map_err(|e| Error::io(path, e.into()))?;
        out.write_all(b"\n").map_err(|e| Error::io(path, e))?;
    }
    out.flush().map_err(|e| Error::io(path, e))
}
