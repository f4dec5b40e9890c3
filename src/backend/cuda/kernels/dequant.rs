//! `dequant.cu`: packed weights to bf16 rows of the reused scratch buffer.

use cudarc::driver::PushKernelArg;

use super::{Kernels, Stream, elementwise, i32_arg, launch};
use crate::Result;
use crate::checkpoint::scheme::Strategy;
use crate::numerics::FloatType;

/// A scale strategy as the kernel reads it: code 0 tensor, 1 channel, 2 group, 3 block.
#[derive(Clone, Copy, Debug)]
pub struct StrategyArgs {
    pub code: i32,
    pub group: i32,
    pub block_h: i32,
    pub block_w: i32,
}

impl StrategyArgs {
    pub fn new(s: Strategy) -> Result<Self> {
        let (code, group, bh, bw) = match s {
            Strategy::Tensor | Strategy::Token => (0, 1, 1, 1),
            Strategy::Channel => (1, 1, 1, 1),
            Strategy::Group(g) | Strategy::TensorGroup(g) => (2, g, 1, 1),
            Strategy::Block(h, w) => (3, 1, h, w),
        };
        Ok(Self {
            code,
            group: i32_arg(group, "group size")?,
            block_h: i32_arg(bh, "block height")?,
            block_w: i32_arg(bw, "block width")?,
        })
    }
}

/// Float type code of common.cuh's `round_to`.
pub fn dtype_code(t: FloatType) -> i32 {
    match t {
        FloatType::F32 => 0,
        FloatType::F16 => 1,
        FloatType::Bf16 => 2,
    }
}

/// Rows of one output range and the row width, shared by the three kernels.
#[derive(Clone, Copy)]
pub struct Rows {
    pub row0: usize,
    pub nrows: usize,
    pub n_in: usize,
}

impl Rows {
    /// One thread per 8 consecutive weights of a row (PER in dequant.cu).
    fn threads(&self) -> usize {
        self.nrows * self.n_in.div_ceil(8)
    }
}

pub struct IntArgs {
    pub packed: u64,
    pub scales: u64,
    /// Signed zero points (0 when symmetric), their count and row width.
    pub zeros: u64,
    pub zeros_len: i64,
    pub zero_cols: i32,
    pub g_idx: u64,
    pub words_per_row: i32,
    pub bits: i32,
    /// 0 for the dense bitstream.
    pub legacy_per: i32,
    pub strategy: StrategyArgs,
    pub scale_dt: i32,
    pub model_dt: i32,
}

pub fn int(k: &Kernels, s: &Stream, out: u64, a: &IntArgs, rows: Rows) -> Result<()> {
    let (row0, nrows, n_in) = (
        i32_arg(rows.row0, "row")?,
        i32_arg(rows.nrows, "rows")?,
        i32_arg(rows.n_in, "in_features")?,
    );
    let mut b = s.launch_builder(&k.dequant_int);
    b.arg(&out).arg(&a.packed).arg(&a.scales).arg(&a.zeros);
    b.arg(&a.zeros_len).arg(&a.zero_cols).arg(&a.g_idx);
    b.arg(&row0).arg(&nrows).arg(&n_in).arg(&a.words_per_row);
    b.arg(&a.bits).arg(&a.legacy_per).arg(&a.strategy.code);
    b.arg(&a.strategy.group)
        .arg(&a.strategy.block_h)
        .arg(&a.strategy.block_w);
    b.arg(&a.scale_dt).arg(&a.model_dt);
    launch(b, elementwise(rows.threads())?, "dequant_int")
}

#[allow(clippy::too_many_arguments)]
pub fn nvfp4(
    k: &Kernels,
    s: &Stream,
    out: u64,
    packed: u64,
    scales: u64,
    global_scale: f32,
    model_dt: i32,
    rows: Rows,
) -> Result<()> {
    let (row0, nrows, n_in) = (
        i32_arg(rows.row0, "row")?,
        i32_arg(rows.nrows, "rows")?,
        i32_arg(rows.n_in, "in_features")?,
    );
    let mut b = s.launch_builder(&k.dequant_nvfp4);
    b.arg(&out).arg(&packed).arg(&scales).arg(&global_scale);
    b.arg(&row0).arg(&nrows).arg(&n_in).arg(&model_dt);
    launch(b, elementwise(rows.threads())?, "dequant_nvfp4")
}

pub struct UnpackedArgs {
    pub weight: u64,
    pub is_int8: i32,
    pub scales: u64,
    /// f32 zero point per scale, 0 when symmetric.
    pub zeros: u64,
    pub strategy: StrategyArgs,
    pub scale_dt: i32,
    pub model_dt: i32,
}

pub fn unpacked(k: &Kernels, s: &Stream, out: u64, a: &UnpackedArgs, rows: Rows) -> Result<()> {
    let (row0, nrows, n_in) = (
        i32_arg(rows.row0, "row")?,
        i32_arg(rows.nrows, "rows")?,
        i32_arg(rows.n_in, "in_features")?,
    );
    let mut b = s.launch_builder(&k.dequant_unpacked);
    b.arg(&out)
        .arg(&a.weight)
        .arg(&a.is_int8)
        .arg(&a.scales)
        .arg(&a.zeros);
    b.arg(&row0).arg(&nrows).arg(&n_in).arg(&a.strategy.code);
    b.arg(&a.strategy.group)
        .arg(&a.strategy.block_h)
        .arg(&a.strategy.block_w);
    b.arg(&a.scale_dt).arg(&a.model_dt);
    launch(b, elementwise(rows.threads())?, "dequant_unpacked")
}
