//! `layer_norm.cu`: LayerNorm, one block per row.

use cudarc::driver::PushKernelArg;

use super::{
    InOut, Kernels, Loader, Module, Source, Stream, cuda_source, i32_arg, launch, per_row,
};
use crate::Result;
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;

/// `layer_norm.cu`'s entry points by (input, output) type.
struct Entries(InOut);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("layer_norm");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.in_out("layer_norm")?)))
    }
}

/// `y = layer_norm(x) * weight + bias` over the rows of `x`; `weight` and `bias` f32.
pub fn run(
    k: &Kernels,
    s: &Stream,
    y: &CudaTensor,
    x: &CudaTensor,
    (weight, bias): (&CudaTensor, &CudaTensor),
    eps: f32,
) -> Result<()> {
    let cols = i32_arg(x.cols, "layer_norm cols")?;
    let (yp, xp, wp, bp) = (y.ptr(), x.ptr(), weight.ptr(), bias.ptr());
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(x.dtype, y.dtype));
    b.arg(&yp).arg(&xp).arg(&wp).arg(&bp).arg(&cols).arg(&eps);
    launch(b, per_row(x.rows()), "layer_norm")
}
