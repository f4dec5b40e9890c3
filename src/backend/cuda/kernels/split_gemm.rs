//! `split_gemm.cu` and its operands: f32-grade `y = x · w^T` for `--dtype f32-grade` on
//! Hopper, x split into two f16 planes with row scales (`split_rows_f16.cu`), a weight whose
//! values are bf16 scaled into f16 (dequantized straight to it, or `weight_f16.cu` for a
//! dense one) or any other split like x, the tensor cores' partial sums promoted to f32
//! registers every 64 inner values.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule, LaunchConfig, PushKernelArg};

use super::expert_tiles::{DEPTH, Persistent, TILE_ROWS};
use super::{Kernels, Stream, elementwise, i32_arg, launch, per_row, tensor_map_ld};
use crate::backend::cuda::gemm::F16Weight;
use crate::checkpoint::GatedActivation;
use crate::{Error, Result};

/// Must match SG_BN and SG_STAGES in split_gemm.cu.
const TILE_COLUMNS: usize = 128;
const STAGES: usize = 4;
/// Stages of two activation planes and the weight's rows, 1024 bytes of alignment slack and
/// two barriers a stage.
const SMEM: usize = STAGES * (2 * TILE_ROWS + TILE_COLUMNS) * DEPTH * 2 + 1024 + 16 * STAGES;

/// The kernel, one persistent block a multiprocessor.
pub struct SplitGemm(Persistent);

/// How the weight's products are scaled back.
#[derive(Clone, Copy, Debug)]
pub enum WeightUndo {
    /// One power of two for the whole weight.
    Scale(f32),
    /// One a weight row (an output column), `n_out` f32 at this address.
    Rows(u64),
}

/// One product: `y[rows, n_out]` (f32, rows `ldy` apart; added to where `accumulate`) of x's
/// planes `hi` and `lo` (f16, `rows x n_in` each) scaled back by `undo[rows]`, and the f16
/// weight plane `w` (`n_out x n_in`) by `w_undo`; the planes' rows are `plane_ld(n_in)`
/// values apart.
pub struct Job {
    pub y: u64,
    pub ldy: usize,
    pub hi: u64,
    pub lo: u64,
    pub undo: u64,
    pub w: u64,
    pub w_undo: WeightUndo,
    pub accumulate: bool,
    pub rows: usize,
    pub n_in: usize,
    pub n_out: usize,
}

/// The row stride, in values, of the f16 planes of a matrix `n` wide: TMA wants rows of a
/// multiple of 16 bytes.
pub fn plane_ld(n: usize) -> usize {
    n.next_multiple_of(8)
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

    /// Whether it takes `n_in` inner values against `w`: `split_rows_f16.cu` reads rows of
    /// a multiple of 16 bytes, and TMA reads `weight_f16.cu`'s plane, which has no padding.
    pub fn takes(n_in: usize, w: F16Weight) -> bool {
        let row = match w {
            F16Weight::Scaled(_) | F16Weight::ScaledF16(_) => 8,
            F16Weight::Planes => 4,
        };
        n_in.is_multiple_of(row) && n_in > 0
    }

    pub fn run(&self, s: &Stream, j: &Job) -> Result<()> {
        if !Self::takes(j.n_in, F16Weight::Planes) {
            return Err(Error::backend(
                "cuda",
                format!(
                    "split_gemm on {} inner values: a multiple of 4 only",
                    j.n_in
                ),
            ));
        }
        if j.rows == 0 || j.n_out == 0 {
            return Ok(());
        }
        let (d, r, c) = (DEPTH as u32, TILE_ROWS as u32, TILE_COLUMNS as u32);
        let width = [j.n_in, plane_ld(j.n_in)];
        let hi = tensor_map_ld(
            j.hi,
            width,
            j.rows,
            [d, r],
            "split activations (high parts)",
        )?;
        let lo = tensor_map_ld(j.lo, width, j.rows, [d, r], "split activations (residuals)")?;
        let w = tensor_map_ld(j.w, width, j.n_out, [d, c], "f16 weight")?;
        let (w_rows, w_undo) = match j.w_undo {
            WeightUndo::Scale(s) => (0u64, s),
            WeightUndo::Rows(p) => (p, 1.0),
        };
        let accumulate = j.accumulate as i32;
        let (rows, n_out, n_in) = (
            i32_arg(j.rows, "rows")?,
            i32_arg(j.n_out, "n_out")?,
            i32_arg(j.n_in, "n_in")?,
        );
        let ldy = j.ldy as i64;
        let mut b = s.launch_builder(&self.0.f);
        b.arg(&j.y)
            .arg(&j.undo)
            .arg(&w_rows)
            .arg(&w_undo)
            .arg(&accumulate)
            .arg(&rows)
            .arg(&n_out)
            .arg(&n_in)
            .arg(&ldy);
        b.arg(&hi).arg(&lo).arg(&w);
        let tiles = j.rows.div_ceil(TILE_ROWS) * j.n_out.div_ceil(TILE_COLUMNS);
        launch(b, self.0.config(tiles), self.0.name)
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
    let mut b = s.launch_builder(&k.split_rows_f16);
    b.arg(&hi).arg(&lo).arg(&undo).arg(&x).arg(&c).arg(&ld);
    // Short rows (attention's heads) get a warp each, not a block of mostly idle threads.
    let mut cfg = per_row(rows);
    cfg.block_dim.0 = cfg.block_dim.0.min((cols / 4).next_multiple_of(32) as u32);
    launch(b, cfg, "split_rows_f16")
}

/// The widest row `split_gated_rows` takes: the kernel holds a row in shared memory.
pub const GATED_ROW_MAX: usize = 24 * 1024;

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
    let (code, alpha, limit) = elementwise::act_args(act);
    let mut b = s.launch_builder(&k.split_gated_rows_f16);
    b.arg(&hi).arg(&lo).arg(&undo).arg(&gate).arg(&up);
    b.arg(&c).arg(&ld).arg(&code).arg(&alpha).arg(&limit);
    let cfg = LaunchConfig {
        shared_mem_bytes: (cols * 4) as u32,
        ..per_row(rows)
    };
    launch(b, cfg, "split_gated_rows_f16")
}

/// `n` bf16 values at `w` as f16 times `scale` at `out` (`weight_f16.cu`; `n` a multiple of 8,
/// both 16-byte aligned).
pub fn weight_f16(k: &Kernels, s: &Stream, out: u64, w: u64, n: usize, scale: f32) -> Result<()> {
    let count = n as i64;
    let mut b = s.launch_builder(&k.weight_f16);
    b.arg(&out).arg(&w).arg(&count).arg(&scale);
    launch(b, elementwise(n.div_ceil(8))?, "weight_f16")
}
