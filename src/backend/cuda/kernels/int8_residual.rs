//! `int8_residual.cu`: the residual codes that make an INT8 weight's two integer GEMMs sum the
//! reference's bf16-rounded weights exactly.

use cudarc::driver::{CudaFunction, PushKernelArg};

use super::{Kernels, Loader, Module, Source, Stream, cuda_source, elementwise, i32_arg, launch};
use crate::Result;

/// `int8_residual.cu`'s entry point.
struct Entry(CudaFunction);

impl Module for Entry {
    const SOURCE: Source<'static> = cuda_source!("int8_residual");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.func("int8_residual")?)))
    }
}

/// Writes the `[n_out, n_in]` residual codes of the INT8 codes at `codes` into `out`, from
/// each channel's f32 scale (bf16-valued) and unit (the power of two that leaves the scale's
/// 8-bit significand).
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: u64,
    (codes, scale, unit): (u64, u64, u64),
    [n_out, n_in]: [usize; 2],
) -> Result<()> {
    let (rows, cols) = (
        i32_arg(n_out, "out_features")?,
        i32_arg(n_in, "in_features")?,
    );
    let e = k.get::<Entry>()?;
    let mut b = s.launch_builder(&e.0);
    b.arg(&out)
        .arg(&codes)
        .arg(&scale)
        .arg(&unit)
        .arg(&rows)
        .arg(&cols);
    launch(b, elementwise(n_out * n_in)?, "int8_residual")
}
