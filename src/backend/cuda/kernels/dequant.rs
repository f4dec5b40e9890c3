//! `dequant.cu`: packed weights to rows of the reused scratch buffer, in the activation type.

use cudarc::driver::PushKernelArg;

use super::{Dt, Kernels, Stream, elementwise, i32_arg, launch};
use crate::backend::lowering::ScaleIndex;
use crate::checkpoint::Fp4Scale;
use crate::{Error, Result};

/// Where the kernels find the scale and zero point of a weight (`ScaleIndex`), as i32s.
#[derive(Clone, Copy, Debug)]
pub struct ScaleArgs {
    pub row_div: i32,
    pub row_stride: i32,
    pub col_div: i32,
}

impl ScaleArgs {
    pub fn new(i: ScaleIndex) -> Result<Self> {
        Ok(Self {
            row_div: i32_arg(i.row_div, "scale row divisor")?,
            row_stride: i32_arg(i.row_stride, "scale row stride")?,
            col_div: i32_arg(i.col_div, "scale column divisor")?,
        })
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
    /// Threads of a kernel that decodes `per` consecutive weights of a row each.
    fn threads(&self, per: usize) -> usize {
        self.nrows * self.n_in.div_ceil(per)
    }
}

pub struct IntArgs {
    pub packed: u64,
    pub scales: u64,
    /// Signed zero points indexed like the scales (0: symmetric).
    pub zeros: u64,
    pub g_idx: u64,
    pub words_per_row: i32,
    pub bits: i32,
    /// 0 for the dense bitstream.
    pub legacy_per: i32,
    pub index: ScaleArgs,
    pub scale_dt: i32,
    pub model_dt: i32,
}

impl IntArgs {
    /// The layout `dequant_int4` takes: 4-bit codes, 8 to a 32-bit word (the dense bitstream
    /// and the legacy layout agree), rows of whole words, no g_idx, and one scale row per
    /// weight row, constant over each word.
    fn fast_int4(&self, n_in: usize) -> bool {
        self.bits == 4
            && matches!(self.legacy_per, 0 | 8)
            && self.g_idx == 0
            && n_in.is_multiple_of(8)
            && self.words_per_row as usize * 8 == n_in
            && self.index.row_div == 1
            && self.index.col_div % 8 == 0
    }
}

pub fn int(k: &Kernels, s: &Stream, dt: Dt, out: u64, a: &IntArgs, rows: Rows) -> Result<()> {
    let (row0, nrows, n_in) = (
        i32_arg(rows.row0, "row")?,
        i32_arg(rows.nrows, "rows")?,
        i32_arg(rows.n_in, "in_features")?,
    );
    if a.fast_int4(rows.n_in) {
        let mut b = s.launch_builder(k.dequant_int4.get(dt));
        b.arg(&out).arg(&a.packed).arg(&a.scales).arg(&a.zeros);
        b.arg(&row0).arg(&nrows).arg(&n_in);
        b.arg(&a.index.row_stride).arg(&a.index.col_div);
        b.arg(&a.scale_dt).arg(&a.model_dt);
        return launch(b, elementwise(rows.threads(8))?, "dequant_int4");
    }
    let mut b = s.launch_builder(k.dequant_int.get(dt));
    b.arg(&out)
        .arg(&a.packed)
        .arg(&a.scales)
        .arg(&a.zeros)
        .arg(&a.g_idx);
    b.arg(&row0).arg(&nrows).arg(&n_in).arg(&a.words_per_row);
    b.arg(&a.bits).arg(&a.legacy_per);
    b.arg(&a.index.row_div)
        .arg(&a.index.row_stride)
        .arg(&a.index.col_div);
    b.arg(&a.scale_dt).arg(&a.model_dt);
    launch(b, elementwise(rows.threads(8))?, "dequant_int")
}

/// An FP4 layer's device arguments: the scale byte's meaning (`dequant.cu`'s `kind`), its
/// scalar (global divisor or second-level scale; unused for E8M0), inputs per scale byte.
#[derive(Clone, Copy)]
pub struct Fp4Args {
    pub kind: i32,
    pub scalar: f32,
    pub group: i32,
    pub model_dt: i32,
}

impl Fp4Args {
    pub fn new(scale_kind: Fp4Scale, group: usize, model_dt: i32) -> Self {
        let (kind, scalar) = match scale_kind {
            Fp4Scale::Nvfp4 { global_scale } => (0, global_scale),
            Fp4Scale::ModelOpt { scale_2 } => (1, scale_2),
            Fp4Scale::E8m0 => (2, 1.0),
        };
        Fp4Args {
            kind,
            scalar,
            group: group as i32,
            model_dt,
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn fp4(
    k: &Kernels,
    s: &Stream,
    dt: Dt,
    out: u64,
    packed: u64,
    scales: u64,
    a: &Fp4Args,
    rows: Rows,
) -> Result<()> {
    let (row0, nrows, n_in) = (
        i32_arg(rows.row0, "row")?,
        i32_arg(rows.nrows, "rows")?,
        i32_arg(rows.n_in, "in_features")?,
    );
    if a.group < 16 || !rows.n_in.is_multiple_of(a.group as usize) {
        return Err(Error::backend(
            "cuda",
            format!(
                "FP4 rows of {} weights in groups of {} (whole groups of at least 16 needed)",
                rows.n_in, a.group
            ),
        ));
    }
    let mut b = s.launch_builder(k.dequant_fp4.get(dt));
    b.arg(&out)
        .arg(&packed)
        .arg(&scales)
        .arg(&a.kind)
        .arg(&a.scalar)
        .arg(&a.group);
    b.arg(&row0).arg(&nrows).arg(&n_in).arg(&a.model_dt);
    launch(b, elementwise(rows.threads(16))?, "dequant_fp4")
}

pub struct UnpackedArgs {
    pub weight: u64,
    pub is_int8: i32,
    pub scales: u64,
    /// Signed zero points indexed like the scales (0: symmetric).
    pub zeros: u64,
    pub index: ScaleArgs,
    pub scale_dt: i32,
    pub model_dt: i32,
}

pub fn unpacked(
    k: &Kernels,
    s: &Stream,
    dt: Dt,
    out: u64,
    a: &UnpackedArgs,
    rows: Rows,
) -> Result<()> {
    let (row0, nrows, n_in) = (
        i32_arg(rows.row0, "row")?,
        i32_arg(rows.nrows, "rows")?,
        i32_arg(rows.n_in, "in_features")?,
    );
    let mut b = s.launch_builder(k.dequant_unpacked.get(dt));
    b.arg(&out)
        .arg(&a.weight)
        .arg(&a.is_int8)
        .arg(&a.scales)
        .arg(&a.zeros);
    b.arg(&row0).arg(&nrows).arg(&n_in);
    b.arg(&a.index.row_div)
        .arg(&a.index.row_stride)
        .arg(&a.index.col_div);
    b.arg(&a.scale_dt).arg(&a.model_dt);
    launch(b, elementwise(rows.threads(8))?, "dequant_unpacked")
}
