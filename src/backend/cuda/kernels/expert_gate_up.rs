//! `expert_gate_up.cu`: a mixture's routed rows gathered, multiplied by their expert's gate
//! and up weights and SiLU-gated in one kernel (Hopper's wgmma and TMA).

use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, LaunchConfig, PushKernelArg};

use super::{Stream, attention, i32_arg, launch, tensor_map};
use crate::{Error, Result};

/// Must match EG_BM, EG_HALF, EG_BK and EG_STAGES in expert_gate_up.cu: routed rows and
/// activation columns a tile, k-columns and stages of the pipeline.
const TILE_ROWS: usize = 128;
const TILE_COLUMNS: usize = 128;
const DEPTH: usize = 64;
const STAGES: usize = 4;
/// Stages of the rows (bf16 `TILE_ROWS x DEPTH`) and of gate and up (`2 TILE_COLUMNS x
/// DEPTH`), 1024 bytes of alignment slack and the two barriers of each stage.
const SMEM: usize = STAGES * (TILE_ROWS + 2 * TILE_COLUMNS) * DEPTH * 2 + 1024 + 2 * STAGES * 8;
/// Threads a block: a loading warpgroup and two multiplying ones.
const THREADS: u32 = 384;

/// The kernel and the device's multiprocessors (one persistent block each).
pub struct ExpertGateUp {
    f: CudaFunction,
    blocks: usize,
}

/// One tile's rows as the kernel's `GateUpTile`: grouped rows `[row0, row0 + 128)`, those from
/// `end` on not written, the expert's first gate row in the weights' tensor map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Tile {
    row0: i32,
    end: i32,
    wrow: i32,
    pad: i32,
}

impl ExpertGateUp {
    /// The kernel of `module`, `None` where the device lacks its shared memory.
    pub fn load(
        ctx: &Arc<CudaContext>,
        module: &Arc<CudaModule>,
        max_smem: usize,
    ) -> Result<Option<Self>> {
        if SMEM > max_smem {
            return Ok(None);
        }
        let f = module
            .load_function("expert_gate_up")
            .map_err(|e| Error::backend("cuda", format!("kernel expert_gate_up: {e:?}")))?;
        attention::set_smem(&f, SMEM, "expert_gate_up")?;
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| Error::backend("cuda", format!("multiprocessor count: {e:?}")))?;
        Ok(Some(Self {
            f,
            blocks: sms.max(1) as usize,
        }))
    }

    /// Whether it takes experts of `hidden` inputs and `inter` activations.
    pub fn takes(&self, hidden: usize, inter: usize) -> bool {
        hidden.is_multiple_of(DEPTH) && inter.is_multiple_of(TILE_COLUMNS) && hidden > 0
    }

    /// `act[r] = silu(x[rows[r]] · gate^T) * (x[rows[r]] · up^T)` for every row of every
    /// tile (`tiles`: device address and count, from [`tiles`]); `x` bf16 `[tokens, hidden]`,
    /// `rows` u32, `act` bf16 rows of `inter`; the weights bf16 rows of `hidden` at
    /// `weights.0`, `weights.1` rows, a tile's gate rows from its `wrow`, its up rows `inter`
    /// further.
    pub fn run(
        &self,
        s: &Stream,
        act: u64,
        (x, rows): (u64, u64),
        (tiles, n_tiles): (u64, usize),
        (hidden, inter): (usize, usize),
        weights: (u64, usize),
    ) -> Result<()> {
        if !self.takes(hidden, inter) {
            return Err(Error::backend(
                "cuda",
                format!(
                    "expert_gate_up on hidden {hidden}, inter {inter}: multiples of {DEPTH} and {TILE_COLUMNS} only"
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
        let total = n_tiles * (inter / TILE_COLUMNS);
        let (nt, hd, it) = (
            i32_arg(n_tiles, "gate/up tiles")?,
            i32_arg(hidden, "hidden")?,
            i32_arg(inter, "inter")?,
        );
        let mut b = s.launch_builder(&self.f);
        b.arg(&act).arg(&x).arg(&rows).arg(&tiles);
        b.arg(&nt).arg(&hd).arg(&it).arg(&map);
        let cfg = LaunchConfig {
            grid_dim: (total.min(self.blocks) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: SMEM as u32,
        };
        launch(b, cfg, "expert_gate_up")
    }
}

/// The tiles of groups `(row0, rows, wrow)`: each group's rows in tiles of 128 (the last
/// partial), all with the group's end and weight row.
pub fn tiles(groups: &[(usize, usize, usize)]) -> Result<Vec<Tile>> {
    let mut out = Vec::new();
    for &(row0, rows, wrow) in groups {
        let end = i32_arg(row0 + rows, "grouped rows")?;
        let wrow = i32_arg(wrow, "weight rows")?;
        for r in (0..rows).step_by(TILE_ROWS) {
            out.push(Tile {
                row0: i32_arg(row0 + r, "grouped rows")?,
                end,
                wrow,
                pad: 0,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_each_group_in_steps_of_128_rows() {
        let t = tiles(&[(0, 300, 0), (320, 128, 1536), (448, 0, 3072)]).unwrap();
        let rows: Vec<(i32, i32, i32)> = t.iter().map(|t| (t.row0, t.end, t.wrow)).collect();
        assert_eq!(
            rows,
            [(0, 300, 0), (128, 300, 0), (256, 300, 0), (320, 448, 1536)]
        );
    }
}
