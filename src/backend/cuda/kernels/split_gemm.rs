//! `split_gemm.cu` and its operands: f32-grade `y = x · w^T` for `--dtype split-bf16` on
//! Hopper, x split into two f16 planes with row scales (`split_rows_f16.cu`), a weight whose
//! values are bf16 scaled into f16 (`weight_f16.cu`), the tensor cores' partial sums promoted
//! to f32 registers every 256 inner values.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule, PushKernelArg};

use super::expert_tiles::{DEPTH, Persistent, TILE_ROWS};
use super::{Kernels, Stream, elementwise, i32_arg, launch, per_row, tensor_map};
use crate::{Error, Result};

/// Must match SG_BN and SG_STAGES in split_gemm.cu.
const TILE_COLUMNS: usize = 128;
const STAGES: usize = 4;
/// Stages of two activation planes and the weight's rows, 1024 bytes of alignment slack and
/// two barriers a stage.
const SMEM: usize = STAGES * (2 * TILE_ROWS + TILE_COLUMNS) * DEPTH * 2 + 1024 + 16 * STAGES;

/// The kernel, one persistent block a multiprocessor.
pub struct SplitGemm(Persistent);

/// One product: `y[rows, n_out]` (f32, rows `ldy` apart) of x's planes `hi` and `lo` (f16,
/// `rows x n_in` each) scaled back by `undo[rows]`, and the f16 weight `w` (`n_out x n_in`)
/// by `w_undo`.
pub struct Job {
    pub y: u64,
    pub ldy: usize,
    pub hi: u64,
    pub lo: u64,
    pub undo: u64,
    pub w: u64,
    pub w_undo: f32,
    pub rows: usize,
    pub n_in: usize,
    pub n_out: usize,
}

impl SplitGemm {
    /// The kernel of `module`, `None` where the device lacks its shared memory.
    pub fn load(
        ctx: &Arc<CudaContext>,
        module: &Arc<CudaModule>,
        max_smem: usize,
    ) -> Result<Option<Self>> {
        Ok(Persistent::load(ctx, module, "split_gemm", SMEM, max_smem)?.map(Self))
    }

    /// Whether it takes `n_in` inner values: TMA wants rows of a multiple of 16 bytes.
    pub fn takes(n_in: usize) -> bool {
        n_in.is_multiple_of(8) && n_in > 0
    }

    pub fn run(&self, s: &Stream, j: &Job) -> Result<()> {
        if !Self::takes(j.n_in) {
            return Err(Error::backend(
                "cuda",
                format!(
                    "split_gemm on {} inner values: a multiple of 8 only",
                    j.n_in
                ),
            ));
        }
        if j.rows == 0 || j.n_out == 0 {
            return Ok(());
        }
        let (d, r, c) = (DEPTH as u32, TILE_ROWS as u32, TILE_COLUMNS as u32);
        let hi = tensor_map(
            j.hi,
            j.n_in,
            j.rows,
            [d, r],
            "split activations (high parts)",
        )?;
        let lo = tensor_map(
            j.lo,
            j.n_in,
            j.rows,
            [d, r],
            "split activations (residuals)",
        )?;
        let w = tensor_map(j.w, j.n_in, j.n_out, [d, c], "f16 weight")?;
        let (rows, n_out, n_in) = (
            i32_arg(j.rows, "rows")?,
            i32_arg(j.n_out, "n_out")?,
            i32_arg(j.n_in, "n_in")?,
        );
        let ldy = j.ldy as i64;
        let mut b = s.launch_builder(&self.0.f);
        b.arg(&j.y)
            .arg(&j.undo)
            .arg(&j.w_undo)
            .arg(&rows)
            .arg(&n_out)
            .arg(&n_in)
            .arg(&ldy);
        b.arg(&hi).arg(&lo).arg(&w);
        let tiles = j.rows.div_ceil(TILE_ROWS) * j.n_out.div_ceil(TILE_COLUMNS);
        launch(b, self.0.config(tiles), self.0.name)
    }
}

/// The f32 `[rows, cols]` at `x` as f16 planes `hi` and `lo` and each row's scale back `undo`
/// (`split_rows_f16.cu`; `cols` a multiple of 4).
pub fn split_rows(
    k: &Kernels,
    s: &Stream,
    (hi, lo, undo): (u64, u64, u64),
    x: u64,
    [rows, cols]: [usize; 2],
) -> Result<()> {
    let c = i32_arg(cols, "cols")?;
    let mut b = s.launch_builder(&k.split_rows_f16);
    b.arg(&hi).arg(&lo).arg(&undo).arg(&x).arg(&c);
    launch(b, per_row(rows), "split_rows_f16")
}

/// `n` bf16 values at `w` as f16 times `scale` at `out` (`weight_f16.cu`; `n` a multiple of 8,
/// both 16-byte aligned).
pub fn weight_f16(k: &Kernels, s: &Stream, out: u64, w: u64, n: usize, scale: f32) -> Result<()> {
    let count = n as i64;
    let mut b = s.launch_builder(&k.weight_f16);
    b.arg(&out).arg(&w).arg(&count).arg(&scale);
    launch(b, elementwise(n.div_ceil(8))?, "weight_f16")
}
