//! `rms_norm.cu`: one block per row, plain or fused with the residual add before it.

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

use super::{Dt, Kernels, Stream, Typed, i32_arg, launch};
use crate::{Error, Result};

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

/// The entry point of one family for (input type, output type): the same type, or f32 into
/// bf16 (the f32 residual stream normalized into bf16 activations).
fn entry<'a>(
    same: &'a Typed,
    f32_to_bf16: &'a CudaFunction,
    types: (Dt, Dt),
    name: &str,
) -> Result<&'a CudaFunction> {
    match types {
        (a, b) if a == b => Ok(same.get(a)),
        (Dt::F32, Dt::Bf16) => Ok(f32_to_bf16),
        (a, b) => Err(Error::backend(
            "cuda",
            format!("{name}: no kernel from {a:?} to {b:?}"),
        )),
    }
}

/// Normalizes `rows` rows of `x` (type `in_dt`) into `out` (type `out_dt`): bf16 -> bf16,
/// f32 -> f32, or the f32 residual stream into bf16.
#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    s: &Stream,
    types: (Dt, Dt),
    out: u64,
    x: u64,
    weight: u64,
    rows: usize,
    cols: usize,
    eps: f32,
) -> Result<()> {
    let c = i32_arg(cols, "cols")?;
    let f = entry(&k.rms_norm, &k.rms_norm_f32_bf16, types, "rms_norm")?;
    let mut b = s.launch_builder(f);
    b.arg(&out).arg(&x).arg(&weight).arg(&c).arg(&eps);
    launch(b, row_blocks(rows, cols), "rms_norm")
}

/// `x += y` on the f32 residual stream `x`, then `out = rms_norm(x)`: `y` and `out` of one
/// type, or an f32 `y` into a bf16 `out`.
#[allow(clippy::too_many_arguments)]
pub fn add_then_run(
    k: &Kernels,
    s: &Stream,
    types: (Dt, Dt),
    out: u64,
    (x, y): (u64, u64),
    weight: u64,
    rows: usize,
    cols: usize,
    eps: f32,
) -> Result<()> {
    let c = i32_arg(cols, "cols")?;
    let f = entry(
        &k.add_rms_norm,
        &k.add_rms_norm_f32_bf16,
        types,
        "add_rms_norm",
    )?;
    let mut b = s.launch_builder(f);
    b.arg(&out).arg(&x).arg(&y).arg(&weight).arg(&c).arg(&eps);
    launch(b, row_blocks(rows, cols), "add_rms_norm")
}
