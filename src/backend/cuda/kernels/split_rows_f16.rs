//! `split_rows_f16.cu`: an f32 matrix as two f16 planes with one power of two a row, the
//! operands of `split_gemm.cu` and of split attention's q and k; and the gated activation of
//! two f32 matrices split so without keeping it.

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

use super::split_gemm::plane_ld;
use super::{
    Kernels, Loader, Module, Source, Stream, cuda_source, i32_arg, launch, per_row, set_smem,
};
use crate::Result;
use crate::checkpoint::GatedActivation;

/// The widest row `split_gated_rows` takes: the kernel holds a row in shared memory.
pub const GATED_ROW_MAX: usize = 24 * 1024;

/// `split_rows_f16.cu`'s entry points.
struct Entries {
    rows: CudaFunction,
    gated_rows: CudaFunction,
}

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("split_rows_f16");

    fn load(l: &Loader) -> Result<Option<Self>> {
        let gated_rows = l.func("split_gated_rows_f16")?;
        let row = (GATED_ROW_MAX * 4).min(l.max_smem);
        set_smem(&gated_rows, row, "split_gated_rows_f16")?;
        Ok(Some(Self {
            rows: l.func("split_rows_f16")?,
            gated_rows,
        }))
    }
}

/// The f32 `[rows, cols]` at `x` as f16 planes `hi` and `lo`, rows `plane_ld(cols)` apart, and
/// each row's scale back `undo` (`split_rows_f16.cu`; `cols` a multiple of 4).
pub fn split_rows(
    k: &Kernels,
    s: &Stream,
    (hi, lo, undo): (u64, u64, u64),
    x: u64,
    [rows, cols]: [usize; 2],
) -> Result<()> {
    let (c, ld) = (i32_arg(cols, "cols")?, i32_arg(plane_ld(cols), "cols")?);
    let e = k.get::<Entries>()?;
    let mut b = s.launch_builder(&e.rows);
    b.arg(&hi).arg(&lo).arg(&undo).arg(&x).arg(&c).arg(&ld);
    // Short rows (attention's heads) get a warp each, not a block of mostly idle threads.
    let mut cfg = per_row(rows);
    cfg.block_dim.0 = cfg.block_dim.0.min((cols / 4).next_multiple_of(32) as u32);
    launch(b, cfg, "split_rows_f16")
}

/// `act(gate) * up` of the f32 `[rows, cols]` at `gate` and `up`, not kept, split as
/// `split_rows` splits a matrix (`split_gated_rows_f16` in `split_rows_f16.cu`; `cols` a
/// multiple of 4, at most `GATED_ROW_MAX`).
pub fn split_gated_rows(
    k: &Kernels,
    s: &Stream,
    (hi, lo, undo): (u64, u64, u64),
    (gate, up): (u64, u64),
    [rows, cols]: [usize; 2],
    act: GatedActivation,
) -> Result<()> {
    let (c, ld) = (i32_arg(cols, "cols")?, i32_arg(plane_ld(cols), "cols")?);
    let (code, alpha, limit) = super::elementwise::act_args(act);
    let e = k.get::<Entries>()?;
    let mut b = s.launch_builder(&e.gated_rows);
    b.arg(&hi).arg(&lo).arg(&undo).arg(&gate).arg(&up);
    b.arg(&c).arg(&ld).arg(&code).arg(&alpha).arg(&limit);
    let cfg = LaunchConfig {
        shared_mem_bytes: (cols * 4) as u32,
        ..per_row(rows)
    };
    launch(b, cfg, "split_gated_rows_f16")
}
