//! `mix_streams.cu`: DeepSeek-V4's hyper-connections, the residual streams collapsed into a
//! block's input or mixed with its output spread over them, a thread a column of a row.

use cudarc::driver::PushKernelArg;

use super::{
    Kernels, Loader, Module, Source, Stream, Typed, cuda_source, elementwise, i32_arg, launch,
};
use crate::Result;
use crate::backend::cuda::CudaTensor;

/// `mix_streams.cu`'s entry points by the type of the block's output.
struct Entries(Typed);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("mix_streams");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.typed("mix_streams")?)))
    }
}

/// The streams `mix_streams.cu` holds a column of in registers.
pub const MAX_STREAMS: usize = 8;

/// `out` (f32 `[rows, m * d]`) from the f32 `streams` `[rows, n * d]` and `weights` `[rows,
/// n * m]`, plus `scales[r, k] * x[r]` where `added` is `(x, scales)` (`Backend::mix_streams`;
/// `n` at most [`MAX_STREAMS`], checked by the caller).
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: &CudaTensor,
    (streams, weights): (&CudaTensor, &CudaTensor),
    added: Option<(&CudaTensor, &CudaTensor)>,
    (n, m, d): (usize, usize, usize),
) -> Result<()> {
    let (rows, dt) = (
        streams.rows as i64,
        added.map_or(out.dtype, |(x, _)| x.dtype),
    );
    let (xp, sp) = added.map_or((0, 0), |(x, scales)| (x.ptr(), scales.ptr()));
    let (n, m, d) = (
        i32_arg(n, "streams")?,
        i32_arg(m, "outputs")?,
        i32_arg(d, "hidden")?,
    );
    let (op, stp, wp) = (out.ptr(), streams.ptr(), weights.ptr());
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(dt));
    b.arg(&op).arg(&stp).arg(&wp).arg(&xp).arg(&sp);
    b.arg(&rows).arg(&n).arg(&m).arg(&d);
    launch(b, elementwise(streams.rows * d as usize)?, "mix_streams")
}
