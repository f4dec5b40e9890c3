//! `gemm_epilogue.cu`: a GEMM's f32 (or exact int32) sums times a column and a row scale (plus
//! a second GEMM's sums times their own column scale) plus the bias, rounded once to the
//! activation type.

use cudarc::driver::{CudaFunction, PushKernelArg};

use super::{
    Dt, Kernels, Loader, Module, Source, Stream, cuda_source, elementwise, i32_arg, launch,
};
use crate::Result;
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;

/// The type of the GEMM's sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sums {
    F32,
    /// Exact sums of 8-bit integer products.
    I32,
}

/// What is applied to each sum, each part at a device address where present: the row's
/// scale (a token's activation scale), the column's (a channel's weight scale), a second
/// GEMM's sums of the same type with their column scale (an INT8 weight's residual sums and
/// unit), the f32 bias.
#[derive(Clone, Copy, Debug, Default)]
pub struct Factors {
    pub row_scale: Option<u64>,
    pub col_scale: Option<u64>,
    pub residual: Option<(u64, u64)>,
    pub bias: Option<u64>,
}

/// `gemm_epilogue.cu`'s entry points, indexed `[sums][output]`.
struct Entries([[CudaFunction; 2]; 2]);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("gemm_epilogue");

    fn load(l: &Loader) -> Result<Option<Self>> {
        let f = |acc: &str, out: &str| l.func(&format!("gemm_epilogue_{acc}_{out}"));
        Ok(Some(Self([
            [f("f32", "bf16")?, f("f32", "f32")?],
            [f("i32", "bf16")?, f("i32", "f32")?],
        ])))
    }
}

/// `out = (sums * col_scale + sums2 * col_scale2) * row_scale + bias` over `[rows, cols]` at
/// `out` (of type `out_dt`; `sums` may be `out` itself where both are f32).
pub fn run(
    k: &Kernels,
    s: &Stream,
    (out, out_dt): (u64, Dt),
    (sums, kind): (u64, Sums),
    [rows, cols]: [usize; 2],
    f: Factors,
) -> Result<()> {
    let (r, c) = (i32_arg(rows, "rows")?, i32_arg(cols, "cols")?);
    let entries = k.get::<Entries>()?;
    let func = &entries.0[(kind == Sums::I32) as usize][(out_dt == Dt::F32) as usize];
    let null = 0u64;
    let (rs, cs, bias) = (
        f.row_scale.unwrap_or(null),
        f.col_scale.unwrap_or(null),
        f.bias.unwrap_or(null),
    );
    let (sums2, cs2) = f.residual.unwrap_or((null, null));
    let mut b = s.launch_builder(func);
    b.arg(&out)
        .arg(&sums)
        .arg(&sums2)
        .arg(&rs)
        .arg(&cs)
        .arg(&cs2);
    b.arg(&bias).arg(&r).arg(&c);
    launch(b, elementwise(rows * cols)?, "gemm_epilogue")
}

/// `out = sums + bias` (f32 sums of `out`'s shape; `sums` may be `out` itself where it is f32).
pub fn add_bias(k: &Kernels, s: &Stream, out: &CudaTensor, sums: u64, bias: u64) -> Result<()> {
    let f = Factors {
        bias: Some(bias),
        ..Factors::default()
    };
    let to = (out.ptr(), out.dtype);
    run(k, s, to, (sums, Sums::F32), out.shape(), f)
}
