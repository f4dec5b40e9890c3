//! What the experts' Hopper kernels (`expert_gate_up.cu`, `expert_down.cu`) share: the
//! routed row tiles they take (`ExpertTile` in hopper.cuh) and their persistent launch, one
//! block of three warpgroups a multiprocessor.

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::{Loader, i32_arg, multiprocessors, set_smem};
use crate::Result;

/// Routed rows a tile (ED_BM / EG_BM in the kernels).
pub const TILE_ROWS: usize = 128;
/// k-columns a stage (ED_BK / EG_BK).
pub const DEPTH: usize = 64;
/// Rows a TMA store writes (a warpgroup's half of a tile), in boxes of `DEPTH` columns.
pub const STORE_ROWS: usize = 64;

/// Shared memory of a kernel of `stages` stages of `TILE_ROWS` rows and `weight_rows` weight
/// rows (bf16, `DEPTH` wide), the two warpgroups' staged outputs (`STORE_ROWS x out_cols`
/// each), 1024 bytes of alignment slack and the two barriers of each stage.
pub const fn smem(stages: usize, weight_rows: usize, out_cols: usize) -> usize {
    stages * (TILE_ROWS + weight_rows) * DEPTH * 2
        + 2 * STORE_ROWS * out_cols * 2
        + 1024
        + 16 * stages
}

/// Threads a block: a loading warpgroup and two multiplying ones.
const THREADS: u32 = 384;

/// One tile as the kernels' `ExpertTile`: grouped rows `[row0, row0 + 128)`, those from `end`
/// on not written, the expert's first weight row in the weights' tensor map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Tile {
    row0: i32,
    end: i32,
    wrow: i32,
    pad: i32,
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

/// A persistent kernel of `smem` bytes of shared memory and the device's multiprocessors.
pub struct Persistent {
    pub f: CudaFunction,
    pub name: &'static str,
    smem: usize,
    blocks: usize,
}

impl Persistent {
    /// Entry `name` of the module `l` loads, `None` where the device lacks its shared memory.
    pub fn load(l: &Loader, name: &'static str, smem: usize) -> Result<Option<Self>> {
        if smem > l.max_smem {
            return Ok(None);
        }
        let f = l.func(name)?;
        set_smem(&f, smem, name)?;
        Ok(Some(Self {
            f,
            name,
            smem,
            blocks: multiprocessors(l.ctx)?,
        }))
    }

    /// A block a multiprocessor, or one a tile where there are fewer.
    pub fn config(&self, tiles: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (tiles.min(self.blocks) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: self.smem as u32,
        }
    }
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
