//! `act_quant.cu`: a linear's declared input-activation fake quantization, computed in f32
//! (as the f32 reference computes it) and stored in the output (activation) type, or as the
//! 8-bit codes and row scales the 8-bit tensor cores multiply.

use cudarc::driver::PushKernelArg;

use super::{
    Dt, InOut, Kernels, Loader, Module, Source, Stream, Typed, cuda_source, i32_arg, launch,
    per_row,
};
use crate::Result;
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;
use crate::numerics::ActQuant;

/// `act_quant.cu`'s entry points: the fake quantization (`act_quant_<in>_<out>`) and the
/// 8-bit codes (`act_codes_<in>`).
struct Entries(InOut, Typed);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("act_quant");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.in_out("act_quant")?, l.typed("act_codes")?)))
    }
}

/// Writes the fake-quantized copy of `x` into `out` (same shape, `out`'s type).
pub fn run(k: &Kernels, s: &Stream, out: &CudaTensor, x: &CudaTensor, aq: ActQuant) -> Result<()> {
    let [rows, cols] = x.shape();
    run_rows(
        k,
        s,
        (out.ptr(), out.dtype),
        (x.ptr(), x.dtype),
        [rows, cols],
        aq,
    )
}

/// The same over `[rows, cols]` at raw addresses: a row range of a larger tensor (one
/// expert's rows, each expert with its own quantizer).
pub fn run_rows(
    k: &Kernels,
    s: &Stream,
    (out, out_dt): (u64, Dt),
    (x, x_dt): (u64, Dt),
    [rows, cols]: [usize; 2],
    aq: ActQuant,
) -> Result<()> {
    let (mode, param) = aq.kernel_code();
    let mode = mode as i32;
    let cols = i32_arg(cols, "in_features")?;
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(x_dt, out_dt));
    b.arg(&out).arg(&x).arg(&cols).arg(&mode).arg(&param);
    launch(b, per_row(rows), "act_quant")
}

/// `x`'s rows quantized by `aq` (one scale a token: FP8 per token or static, INT per token;
/// or FP8 per token and group) as an 8-bit GEMM operand: a code per value at `codes` (FP8
/// E4M3FN bits, or two's-complement integers), each row's f32 scale at `scales` (a group's
/// scales one vector over the rows, the groups' vectors one after another); code times scale
/// is what `run` writes. `padded_rows` (at least `x`'s) rows are written, those past `x`'s
/// with zero codes and scales.
pub fn codes(
    k: &Kernels,
    s: &Stream,
    (codes, scales): (u64, u64),
    (x, padded_rows): (&CudaTensor, usize),
    aq: ActQuant,
) -> Result<()> {
    let [rows, cols] = x.shape();
    let (mode, param) = aq.kernel_code();
    let mode = mode as i32;
    let (rows, cols) = (i32_arg(rows, "rows")?, i32_arg(cols, "in_features")?);
    let xp = x.ptr();
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.1.get(x.dtype));
    b.arg(&codes)
        .arg(&scales)
        .arg(&xp)
        .arg(&rows)
        .arg(&cols)
        .arg(&mode)
        .arg(&param);
    launch(b, per_row(padded_rows), "act_codes")
}
