//! `rms_norm.cu`: a block or a warp per row, plain or fused with the residual add before it.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{InOut, Kernels, Loader, Module, Source, Stream, Typed, cuda_source, i32_arg, launch};
use crate::Result;
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;

/// `rms_norm.cu`'s entry points: plain and after the residual add, by (input, output) type,
/// and with the output as three bf16 planes by input type.
struct Entries {
    plain: InOut,
    add: InOut,
    planes: Typed,
    add_planes: Typed,
}

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("rms_norm");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self {
            plain: l.in_out("rms_norm")?,
            add: l.in_out("add_rms_norm")?,
            planes: l.typed("rms_norm_planes")?,
            add_planes: l.typed("add_rms_norm_planes")?,
        }))
    }
}

/// Must match RN_CHUNKS in rms_norm.cu: 8-value chunks a thread keeps in registers.
const CHUNKS: usize = 4;
/// Rows this long or shorter take a warp each (RN_WARP_COLS in rms_norm.cu).
const WARP_COLS: usize = 8 * CHUNKS * 32;
/// Warps, hence narrow rows, a block.
const ROWS_A_BLOCK: usize = 8;

/// A warp a row for narrow rows, `ROWS_A_BLOCK` of them a block; else one block a row, wide
/// enough that a row fits the threads' registers (up to 1024 threads, 32768 values).
fn row_blocks(rows: usize, cols: usize) -> LaunchConfig {
    let (blocks, threads) = if cols <= WARP_COLS {
        (rows.div_ceil(ROWS_A_BLOCK), 32 * ROWS_A_BLOCK)
    } else {
        let threads = cols.div_ceil(8 * CHUNKS).next_multiple_of(32).min(1024);
        (rows, threads)
    };
    LaunchConfig {
        grid_dim: (blocks.max(1) as u32, 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Normalizes `rows` rows of `x` into `out`. Without `update`, `x` is of the input type; with
/// it, `x` is the f32 residual stream, `x += update` (of the input type) is written back first
/// and the sum is normalized. The output is of `out`'s type, or its three planes where it has
/// residual planes (`CudaTensor::planes`).
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: &CudaTensor,
    x: &CudaTensor,
    update: Option<&CudaTensor>,
    weight: &CudaTensor,
    eps: f32,
) -> Result<()> {
    let [rows, cols] = out.shape();
    let (r, c) = (i32_arg(rows, "rows")?, i32_arg(cols, "cols")?);
    let in_dt = update.map_or(x.dtype, |y| y.dtype);
    let rest = match &out.planes {
        None => None,
        Some(p) => Some(p.residuals().ok_or_else(|| {
            crate::Error::backend("cuda", "rms_norm into planes already released")
        })?),
    };
    let e = k.get::<Entries>()?;
    let (name, f) = match (update, rest) {
        (None, None) => ("rms_norm", e.plain.get(in_dt, out.dtype)),
        (Some(_), None) => ("add_rms_norm", e.add.get(in_dt, out.dtype)),
        (None, Some(_)) => ("rms_norm_planes", e.planes.get(in_dt)),
        (Some(_), Some(_)) => ("add_rms_norm_planes", e.add_planes.get(in_dt)),
    };
    let (op, xp, wp) = (out.ptr(), x.ptr(), weight.ptr());
    let yp = update.map(CudaTensor::ptr);
    let mut b = s.launch_builder(f);
    b.arg(&op);
    if let Some(rest) = &rest {
        b.arg(rest);
    }
    b.arg(&xp);
    if let Some(y) = &yp {
        b.arg(y);
    }
    b.arg(&wp).arg(&r).arg(&c).arg(&eps);
    launch(b, row_blocks(rows, cols), name)
}
