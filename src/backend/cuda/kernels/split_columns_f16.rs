//! `split_columns_f16.cu`: an f32 matrix as two f16 planes with one power of two per column,
//! for attention's P·V under `--dtype f32-grade` (v, whose sum over keys runs down its rows).

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

use super::{Kernels, Loader, Module, Source, Stream, cuda_source, elementwise, i32_arg, launch};
use crate::backend::cuda::driver_err;
use crate::{Error, Result};

/// `split_columns_f16.cu`'s entry points.
struct Entries {
    column_top: CudaFunction,
    split: CudaFunction,
}

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("split_columns_f16");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self {
            column_top: l.func("column_top")?,
            split: l.func("split_columns_f16")?,
        }))
    }
}

/// Rows one thread of `column_top` reads (CT_ROWS in the source).
const TOP_ROWS: usize = 64;

/// Writes the `[rows, cols]` f32 matrix at `x` as f16 planes `hi` and `lo` (`rows x cols` each)
/// and each column's largest magnitude, as f32 bits, at `top` (`cols` u32; the kernels that
/// read the planes undo each column's scale from it). `cols` a multiple of 4.
pub fn run(
    k: &Kernels,
    s: &Stream,
    (hi, lo, top): (u64, u64, u64),
    x: u64,
    [rows, cols]: [usize; 2],
) -> Result<()> {
    if !cols.is_multiple_of(4) {
        return Err(Error::backend(
            "cuda",
            format!("split_columns_f16 on rows of {cols} values: a multiple of 4 only"),
        ));
    }
    // SAFETY: `top` holds `cols` u32 on this stream's device (the caller's allocation).
    unsafe { cudarc::driver::result::memset_d8_async(top, 0, cols * 4, s.cu_stream()) }
        .map_err(|e| driver_err("zeroing the columns' largest magnitudes", e))?;
    let (r, c) = (i32_arg(rows, "rows")?, i32_arg(cols, "cols")?);
    let e = k.get::<Entries>()?;
    let mut b = s.launch_builder(&e.column_top);
    b.arg(&top).arg(&x).arg(&r).arg(&c);
    let cfg = LaunchConfig {
        grid_dim: (cols.div_ceil(256) as u32, rows.div_ceil(TOP_ROWS) as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(b, cfg, "column_top")?;
    let n = (rows * cols) as i64;
    let mut b = s.launch_builder(&e.split);
    b.arg(&hi).arg(&lo).arg(&x).arg(&top).arg(&n).arg(&c);
    launch(b, elementwise(rows * cols / 4)?, "split_columns_f16")
}
