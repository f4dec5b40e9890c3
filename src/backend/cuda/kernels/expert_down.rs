//! `expert_down.cu`: a mixture's routed rows (grouped by expert) multiplied by their expert's
//! down weights in one kernel (Hopper's wgmma and TMA, outputs stored by TMA).

use cudarc::driver::PushKernelArg;

use super::expert_tiles::{DEPTH, Persistent, STORE_ROWS, TILE_ROWS, smem};
use super::{Loader, Module, Source, Stream, cuda_source, i32_arg, launch, tensor_map};
use crate::{Error, Result};

/// Must match ED_BN and ED_STAGES in expert_down.cu: output columns a tile and stages of the
/// pipeline.
const TILE_COLUMNS: usize = 256;
const STAGES: usize = 3;
const SMEM: usize = smem(STAGES, TILE_COLUMNS, TILE_COLUMNS);

/// The kernel, one persistent block a multiprocessor.
pub struct ExpertDown(Persistent);

impl Module for ExpertDown {
    const SOURCE: Source<'static> = cuda_source!("expert_down");

    /// `None` where the device lacks its shared memory.
    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Persistent::load(l, "expert_down", SMEM)?.map(Self))
    }
}

impl ExpertDown {
    /// Whether it takes experts of `inter` inputs and `hidden` outputs.
    pub fn takes(&self, inter: usize, hidden: usize) -> bool {
        inter.is_multiple_of(DEPTH) && hidden.is_multiple_of(TILE_COLUMNS) && inter > 0
    }

    /// `y[r] = act[r] · down^T` for every row of every tile (`tiles`: device address and
    /// count, from [`super::expert_tiles::tiles`]); `act` bf16 `act.1` rows of `inter`, `y`
    /// bf16 `y.1` rows of `hidden`; the weights bf16 rows of `inter` at `weights.0`,
    /// `weights.1` rows, a tile's from its `wrow`.
    pub fn run(
        &self,
        s: &Stream,
        y: (u64, usize),
        act: (u64, usize),
        (tiles, n_tiles): (u64, usize),
        (inter, hidden): (usize, usize),
        weights: (u64, usize),
    ) -> Result<()> {
        if !self.takes(inter, hidden) {
            return Err(Error::backend(
                "cuda",
                format!(
                    "expert_down on inter {inter}, hidden {hidden}: multiples of {DEPTH} and {TILE_COLUMNS} only"
                ),
            ));
        }
        if n_tiles == 0 {
            return Ok(());
        }
        let (d, c, r) = (DEPTH as u32, TILE_COLUMNS as u32, TILE_ROWS as u32);
        let wmap = tensor_map(weights.0, inter, weights.1, [d, c], "experts' down weights")?;
        let amap = tensor_map(act.0, inter, act.1, [d, r], "experts' activation")?;
        let ymap = tensor_map(y.0, hidden, y.1, [d, STORE_ROWS as u32], "experts' output")?;
        let (nt, it, hd) = (
            i32_arg(n_tiles, "down tiles")?,
            i32_arg(inter, "inter")?,
            i32_arg(hidden, "hidden")?,
        );
        let mut b = s.launch_builder(&self.0.f);
        b.arg(&y.0).arg(&tiles).arg(&nt).arg(&it).arg(&hd);
        b.arg(&wmap).arg(&amap).arg(&ymap);
        launch(
            b,
            self.0.config(n_tiles * (hidden / TILE_COLUMNS)),
            self.0.name,
        )
    }
}
