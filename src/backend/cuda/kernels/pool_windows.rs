//! `pool_windows.cu`: DeepSeek-V4's compressors, each entry a softmax-weighted pool of its
//! window's tokens, a thread a value.

use cudarc::driver::PushKernelArg;

use super::{
    Kernels, Loader, Module, Source, Stream, Typed, cuda_source, elementwise, i32_arg, launch,
};
use crate::Result;
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;

/// `pool_windows.cu`'s entry points by the type of kv and gate.
struct Entries(Typed);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("pool_windows");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.typed("pool_windows")?)))
    }
}

/// `out` (f32 `[rows, w]`) pooled from `kv` and `gate` (`[rows, w]`, or `[rows, 2 w]` with
/// `overlap`) with the f32 `bias` `[rate, kv's columns]`; `seq_start` the u32 first row of each
/// row's sequence (`Backend::pool_windows`).
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: &CudaTensor,
    [kv, gate, bias]: [&CudaTensor; 3],
    seq_start: u64,
    (rate, overlap): (usize, bool),
) -> Result<()> {
    let (rows, w) = (out.rows as i64, i32_arg(out.cols, "entry width")?);
    let (rate, overlap) = (i32_arg(rate, "rate")?, i32::from(overlap));
    let (op, kp, gp, bp) = (out.ptr(), kv.ptr(), gate.ptr(), bias.ptr());
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(kv.dtype));
    b.arg(&op).arg(&kp).arg(&gp).arg(&bp).arg(&seq_start);
    b.arg(&rows).arg(&w).arg(&rate).arg(&overlap);
    launch(b, elementwise(out.len())?, "pool_windows")
}
