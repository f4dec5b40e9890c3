//! `expert_gate_up.cu`: a mixture's routed rows gathered, multiplied by their expert's gate
//! and up weights and SiLU-gated in one kernel (Hopper's wgmma and TMA).

use cudarc::driver::PushKernelArg;

use super::expert_tiles::{DEPTH, Persistent, STORE_ROWS, smem};
use super::{Loader, Module, Source, Stream, cuda_source, i32_arg, launch, tensor_map};
use crate::{Error, Result};

/// Must match EG_HALF, EG_STAGES and EG_PARTS in expert_gate_up.cu: activation columns a tile
/// (gate and up: twice as many weight rows), stages of the pipeline, and the stages a tile's
/// epilogue is spread over (the next tile's first).
const TILE_COLUMNS: usize = 128;
const STAGES: usize = 4;
const EPILOGUE_PARTS: usize = 8;
const SMEM: usize = smem(STAGES, 2 * TILE_COLUMNS, TILE_COLUMNS);

/// The kernel, one persistent block a multiprocessor.
pub struct ExpertGateUp(Persistent);

impl Module for ExpertGateUp {
    const SOURCE: Source<'static> = cuda_source!("expert_gate_up");

    /// `None` where the device lacks its shared memory.
    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Persistent::load(l, "expert_gate_up", SMEM)?.map(Self))
    }
}

impl ExpertGateUp {
    /// Whether it takes experts of `hidden` inputs and `inter` activations.
    pub fn takes(&self, hidden: usize, inter: usize) -> bool {
        hidden.is_multiple_of(DEPTH)
            && inter.is_multiple_of(TILE_COLUMNS)
            && hidden >= EPILOGUE_PARTS * DEPTH
    }

    /// `act[r] = silu(x[rows[r]] · gate^T) * (x[rows[r]] · up^T)` for every row of every
    /// tile (`tiles`: device address and count, from [`super::expert_tiles::tiles`]); `x`
    /// bf16 `[tokens, hidden]`, `rows` u32, `act` bf16 `act.1` rows of `inter`; the weights
    /// bf16 rows of `hidden` at `weights.0`, `weights.1` rows, a tile's gate rows from its
    /// `wrow`, its up rows `inter` further.
    pub fn run(
        &self,
        s: &Stream,
        act: (u64, usize),
        (x, rows): (u64, u64),
        (tiles, n_tiles): (u64, usize),
        (hidden, inter): (usize, usize),
        weights: (u64, usize),
    ) -> Result<()> {
        if !self.takes(hidden, inter) {
            return Err(Error::backend(
                "cuda",
                format!(
                    "expert_gate_up on hidden {hidden}, inter {inter}: multiples of {DEPTH} (at least {}) and {TILE_COLUMNS} only",
                    EPILOGUE_PARTS * DEPTH
                ),
            ));
        }
        if n_tiles == 0 {
            return Ok(());
        }
        let map = tensor_map(
            weights.0,
            hidden,
            weights.1,
            [DEPTH as u32, TILE_COLUMNS as u32],
            "experts' gate and up weights",
        )?;
        let (d, r) = (DEPTH as u32, STORE_ROWS as u32);
        let act_map = tensor_map(act.0, inter, act.1, [d, r], "experts' activation")?;
        let (nt, hd, it) = (
            i32_arg(n_tiles, "gate/up tiles")?,
            i32_arg(hidden, "hidden")?,
            i32_arg(inter, "inter")?,
        );
        let mut b = s.launch_builder(&self.0.f);
        b.arg(&act.0).arg(&x).arg(&rows).arg(&tiles);
        b.arg(&nt).arg(&hd).arg(&it).arg(&map).arg(&act_map);
        launch(
            b,
            self.0.config(n_tiles * (inter / TILE_COLUMNS)),
            self.0.name,
        )
    }
}
