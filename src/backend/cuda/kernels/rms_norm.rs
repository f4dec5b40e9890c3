//! `rms_norm.cu`: one block per row, plain or fused with the residual add before it.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{Dt, Kernels, Stream, i32_arg, launch};
use crate::Result;

/// Must match RN_CHUNKS in rms_norm.cu: 8-value chunks a thread keeps in registers.
const CHUNKS: usize = 4;

/// One block per row, wide enough that a row fits the threads' registers (up to 1024
/// threads, 32768 values); at least one warp.
fn row_blocks(rows: usize, cols: usize) -> LaunchConfig {
    let threads = cols
        .div_ceil(8 * CHUNKS)
        .next_multiple_of(32)
        .clamp(32, 1024);
    LaunchConfig {
        grid_dim: (rows.max(1) as u32, 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Normalizes `rows` rows of `x` into `out`. Without `update`, `x` is of the input type; with
/// it, `x` is the f32 residual stream, `x += update` (of the input type) is written back first
/// and the sum is normalized. `types` is (input, output).
#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    s: &Stream,
    types: (Dt, Dt),
    out: u64,
    x: u64,
    update: Option<u64>,
    weight: u64,
    rows: usize,
    cols: usize,
    eps: f32,
) -> Result<()> {
    let c = i32_arg(cols, "cols")?;
    let (name, f) = match update {
        None => ("rms_norm", k.rms_norm.get(types.0, types.1)),
        Some(_) => ("add_rms_norm", k.add_rms_norm.get(types.0, types.1)),
    };
    let mut b = s.launch_builder(f);
    b.arg(&out).arg(&x);
    if let Some(y) = &update {
        b.arg(y);
    }
    b.arg(&weight).arg(&c).arg(&eps);
    launch(b, row_blocks(rows, cols), name)
}
