//! `softcap.cu`: `cap * tanh(x / cap)` in place on an f32 logits tile.

use cudarc::driver::{CudaFunction, PushKernelArg};

use super::{Kernels, Loader, Module, Source, Stream, cuda_source, elementwise, launch};
use crate::Result;

/// `softcap.cu`'s entry points.
struct Entries(CudaFunction);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("softcap");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.func("softcap")?)))
    }
}

pub fn run(k: &Kernels, s: &Stream, x: u64, n: usize, cap: f32) -> Result<()> {
    let n64 = n as i64;
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(&entries.0);
    b.arg(&x).arg(&n64).arg(&cap);
    launch(b, elementwise(n)?, "softcap")
}
