//! `split_gemm.cu`: f32-grade `y = x · w^T` for `--dtype f32-grade` on Hopper, x split into
//! two f16 planes with row scales (`split_rows_f16.cu`), a weight whose values are bf16 scaled
//! into f16 (dequantized straight to it, or `weight_f16.cu` for a dense one) or any other
//! split like x, the tensor cores' partial sums promoted to f32 registers every 64 inner
//! values.

use cudarc::driver::PushKernelArg;

use super::expert_tiles::{DEPTH, Persistent, TILE_ROWS};
use super::{Loader, Module, Source, Stream, cuda_source, i32_arg, launch, tensor_map_ld};
use crate::backend::cuda::gemm::F16Weight;
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

impl Module for SplitGemm {
    const SOURCE: Source<'static> = cuda_source!("split_gemm");

    /// `None` where the device lacks its shared memory.
    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Persistent::load(l, "split_gemm", SMEM)?.map(Self))
    }
}

impl SplitGemm {
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
