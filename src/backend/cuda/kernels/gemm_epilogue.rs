//! `gemm_epilogue.cu`: a GEMM's f32 (or exact int32) sums times a row and a column scale plus
//! the bias, rounded once to the activation type.

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

/// What is applied to each sum, each factor at a device address where present: the row's
/// scale (a token's activation scale), the column's (a channel's weight scale), the f32 bias.
#[derive(Clone, Copy, Debug, Default)]
pub struct Factors {
    pub row_scale: Option<u64>,
    pub col_scale: Option<u64>,
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

/// `out = sums * row_scale * col_scale + bias` (of `out`'s shape and type; `sums` may be
/// `out` itself where both are f32).
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: &CudaTensor,
    (sums, kind): (u64, Sums),
    f: Factors,
) -> Result<()> {
    let [rows, cols] = out.shape();
    let (r, c) = (i32_arg(rows, "rows")?, i32_arg(cols, "cols")?);
    let entries = k.get::<Entries>()?;
    let func = &entries.0[(kind == Sums::I32) as usize][(out.dtype == Dt::F32) as usize];
    let (op, null) = (out.ptr(), 0u64);
    let (rs, cs, bias) = (
        f.row_scale.unwrap_or(null),
        f.col_scale.unwrap_or(null),
        f.bias.unwrap_or(null),
    );
    let mut b = s.launch_builder(func);
    b.arg(&op)
        .arg(&sums)
        .arg(&rs)
        .arg(&cs)
        .arg(&bias)
        .arg(&r)
        .arg(&c);
    launch(b, elementwise(rows * cols)?, "gemm_epilogue")
}
