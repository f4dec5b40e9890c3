//! `weight_f16.cu`: a dense bf16 weight as one f16 plane times a power of two, the weight
//! operand of `split_gemm.cu`.

use cudarc::driver::{CudaFunction, PushKernelArg};

use super::{Kernels, Loader, Module, Source, Stream, cuda_source, elementwise, launch};
use crate::Result;

/// `weight_f16.cu`'s entry point.
struct Entries(CudaFunction);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("weight_f16");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.func("weight_f16")?)))
    }
}

/// `n` bf16 values at `w` as f16 times `scale` at `out` (`weight_f16.cu`; `n` a multiple of 8,
/// both 16-byte aligned).
pub fn run(k: &Kernels, s: &Stream, out: u64, w: u64, n: usize, scale: f32) -> Result<()> {
    let count = n as i64;
    let e = k.get::<Entries>()?;
    let mut b = s.launch_builder(&e.0);
    b.arg(&out).arg(&w).arg(&count).arg(&scale);
    launch(b, elementwise(n.div_ceil(8))?, "weight_f16")
}
