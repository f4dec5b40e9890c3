//! `nll.cu`: vocab-tiled online log-sum-exp, target gather, KL sums and rankings.

use cudarc::driver::{CudaFunction, PushKernelArg};

use super::{
    Kernels, Loader, Module, Source, Stream, cuda_source, elementwise, i32_arg, launch, per_row,
};
use crate::Result;

/// `nll.cu`'s entry points.
struct Entries {
    lse_tile: CudaFunction,
    nll_finish: CudaFunction,
    nll_from_slices: CudaFunction,
    kld_tile: CudaFunction,
    top_tile: CudaFunction,
}

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("nll");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self {
            lse_tile: l.func("lse_tile")?,
            nll_finish: l.func("nll_finish")?,
            nll_from_slices: l.func("nll_from_slices")?,
            kld_tile: l.func("kld_tile")?,
            top_tile: l.func("top_tile")?,
        }))
    }
}

/// Running per-row state over vocab tiles (device addresses of `rows` entries each).
#[derive(Clone, Copy)]
pub struct LseState {
    /// f32 running max.
    pub m: u64,
    /// f64 sum of exp(logit - m).
    pub s: u64,
    /// f32 logit of the target.
    pub tgt: u64,
    /// i32 first index of the maximum.
    pub arg: u64,
}

impl LseState {
    /// The same state advanced by `rows` rows.
    pub fn offset(self, rows: usize) -> Self {
        let r = rows as u64;
        Self {
            m: self.m + 4 * r,
            s: self.s + 8 * r,
            tgt: self.tgt + 4 * r,
            arg: self.arg + 4 * r,
        }
    }
}

/// Folds one logits tile `[rows, cols]` (vocab columns `v0..v0 + cols`) into `state`.
#[allow(clippy::too_many_arguments)]
pub fn lse_tile(
    k: &Kernels,
    s: &Stream,
    logits: u64,
    rows: usize,
    cols: usize,
    targets: u64,
    v0: usize,
    first: bool,
    st: LseState,
) -> Result<()> {
    let (c, v0, first) = (i32_arg(cols, "cols")?, i32_arg(v0, "vocab")?, first as i32);
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(&entries.lse_tile);
    b.arg(&logits).arg(&c).arg(&targets).arg(&v0).arg(&first);
    b.arg(&st.m).arg(&st.s).arg(&st.tgt).arg(&st.arg);
    launch(b, per_row(rows), "lse_tile")
}

pub fn nll_finish(k: &Kernels, s: &Stream, out: u64, st: LseState, rows: usize) -> Result<()> {
    let r = i32_arg(rows, "rows")?;
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(&entries.nll_finish);
    b.arg(&out).arg(&st.m).arg(&st.s).arg(&st.tgt).arg(&r);
    launch(b, elementwise(rows)?, "nll_finish")
}

/// NLL of `rows` rows from `lm_head_lse`'s partials (`slices` f32 pairs a row) and the
/// targets' logits.
pub fn nll_from_slices(
    k: &Kernels,
    s: &Stream,
    out: u64,
    (partials, slices): (u64, usize),
    target_logits: u64,
    rows: usize,
) -> Result<()> {
    let (r, n) = (
        i32_arg(rows, "rows")?,
        i32_arg(slices, "vocabulary slices")?,
    );
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(&entries.nll_from_slices);
    b.arg(&out)
        .arg(&partials)
        .arg(&target_logits)
        .arg(&r)
        .arg(&n);
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (rows.div_ceil(8).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(b, cfg, "nll_from_slices")
}

/// Adds one pair of logits tiles to `acc` (two f64 a row: KL(P||Q), KL(Q||P)).
#[allow(clippy::too_many_arguments)]
pub fn kld_tile(
    k: &Kernels,
    s: &Stream,
    p_logits: u64,
    q_logits: u64,
    rows: usize,
    cols: usize,
    p: LseState,
    q: LseState,
    acc: u64,
) -> Result<()> {
    let c = i32_arg(cols, "cols")?;
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(&entries.kld_tile);
    b.arg(&p_logits).arg(&q_logits).arg(&c);
    b.arg(&p.m).arg(&p.s).arg(&q.m).arg(&q.s).arg(&acc);
    launch(b, per_row(rows), "kld_tile")
}

/// The most `k` a ranking of `top_tile` holds.
pub const TOP_K_MAX: usize = 20;

/// Running per-row rankings of the `k` largest logits (device addresses: `rows * k` f32
/// logits, then as many i32 ids).
#[derive(Clone, Copy)]
pub struct Ranking {
    pub logits: u64,
    pub ids: u64,
    pub k: usize,
}

impl Ranking {
    /// The same rankings advanced by `rows` rows.
    pub fn offset(self, rows: usize) -> Self {
        let b = (4 * rows * self.k) as u64;
        Self {
            logits: self.logits + b,
            ids: self.ids + b,
            k: self.k,
        }
    }
}

/// Folds one logits tile `[rows, cols]` (vocab columns `v0..v0 + cols`) into `ranking`
/// (`first`: the tile is the first, what the ranking holds is not read).
pub fn top_tile(
    k: &Kernels,
    s: &Stream,
    logits: u64,
    (rows, cols, v0): (usize, usize, usize),
    first: bool,
    ranking: Ranking,
) -> Result<()> {
    if ranking.k == 0 || ranking.k > TOP_K_MAX {
        return Err(crate::Error::InvalidArgument(format!(
            "top_tile: a ranking of {} tokens (1 to {TOP_K_MAX} are supported)",
            ranking.k
        )));
    }
    let (c, v0, n) = (
        i32_arg(cols, "cols")?,
        i32_arg(v0, "vocab")?,
        ranking.k as i32,
    );
    let first = first as i32;
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(&entries.top_tile);
    b.arg(&logits).arg(&c).arg(&v0).arg(&n).arg(&first);
    b.arg(&ranking.logits).arg(&ranking.ids);
    launch(b, per_row(rows), "top_tile")
}
