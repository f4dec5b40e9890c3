//! `lm_head_lse.cu`: the lm_head GEMM with the log-sum-exp of each row's logits in its
//! epilogue (Hopper's wgmma and TMA), partials a 256-column slice that `nll_from_slices` folds.

use cudarc::driver::PushKernelArg;

use super::expert_tiles::{DEPTH, Persistent, TILE_ROWS, smem};
use super::{Loader, Module, Source, Stream, cuda_source, i32_arg, launch, tensor_map};
use crate::{Error, Result};

/// Must match LH_BN and LH_STAGES in lm_head_lse.cu: vocabulary columns a slice and stages of
/// the pipeline.
pub const SLICE: usize = 256;
const STAGES: usize = 4;
/// No staged outputs: the epilogue reduces in registers.
const SMEM: usize = smem(STAGES, SLICE, 0);

/// The kernel, one persistent block a multiprocessor.
pub struct LmHeadLse(Persistent);

/// What one launch reads and writes: `rows` bf16 hidden rows of `hidden` at `x`, the bf16
/// head's `vocab` rows of `hidden` at `head` (Gemma's soft cap, or 0), the targets (i32 a row);
/// `partials` takes `slices(vocab)` (max, sum) f32 pairs a row, `target_logits` an f32 a row.
pub struct Job {
    pub x: u64,
    pub rows: usize,
    pub head: u64,
    pub hidden: usize,
    pub vocab: usize,
    pub softcap: f32,
    pub targets: u64,
    pub partials: u64,
    pub target_logits: u64,
}

impl Module for LmHeadLse {
    const SOURCE: Source<'static> = cuda_source!("lm_head_lse");

    /// `None` where the device lacks its shared memory.
    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Persistent::load(l, "lm_head_lse", SMEM)?.map(Self))
    }
}

impl LmHeadLse {
    /// Whether it takes rows of `hidden` values.
    pub fn takes(&self, hidden: usize) -> bool {
        hidden.is_multiple_of(DEPTH) && hidden > 0
    }

    /// The partials a row for a vocabulary of `vocab`.
    pub fn slices(vocab: usize) -> usize {
        vocab.div_ceil(SLICE)
    }

    pub fn run(&self, s: &Stream, j: &Job) -> Result<()> {
        if !self.takes(j.hidden) {
            return Err(Error::backend(
                "cuda",
                format!(
                    "lm_head_lse on rows of {}: a multiple of {DEPTH} only",
                    j.hidden
                ),
            ));
        }
        if j.rows == 0 {
            return Ok(());
        }
        let (d, c, r) = (DEPTH as u32, SLICE as u32, TILE_ROWS as u32);
        let head = tensor_map(j.head, j.hidden, j.vocab, [d, c], "lm_head weight")?;
        let x = tensor_map(j.x, j.hidden, j.rows, [d, r], "lm_head input")?;
        let (rows, hidden, vocab) = (
            i32_arg(j.rows, "scored rows")?,
            i32_arg(j.hidden, "hidden")?,
            i32_arg(j.vocab, "vocabulary")?,
        );
        let tiles = j.rows.div_ceil(TILE_ROWS) * Self::slices(j.vocab);
        i32_arg(tiles, "lm_head tiles")?;
        let mut b = s.launch_builder(&self.0.f);
        b.arg(&j.partials).arg(&j.target_logits).arg(&j.targets);
        b.arg(&rows).arg(&hidden).arg(&vocab).arg(&j.softcap);
        b.arg(&head).arg(&x);
        launch(b, self.0.config(tiles), self.0.name)
    }
}
