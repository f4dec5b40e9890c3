//! `rope.cu`: RoPE in place over a span of each head.

use cudarc::driver::PushKernelArg;

use super::{
    Kernels, Loader, Module, Source, Stream, Typed, cuda_source, elementwise, i32_arg, launch,
};
use crate::Result;
use crate::backend::RotarySpan;
use crate::backend::cuda::CudaTensor;

/// `rope.cu`'s entry points.
struct Entries(Typed);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("rope");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.typed("rope")?)))
    }
}

/// Rotates the values `span` names in each head of `x` `[tokens, heads * span.head_dim]` in
/// place by the u32 `positions` of its tokens.
pub fn run(
    k: &Kernels,
    s: &Stream,
    x: &CudaTensor,
    positions: u64,
    (cos, sin): (&CudaTensor, &CudaTensor),
    span: RotarySpan,
) -> Result<()> {
    let (tokens, heads) = (x.rows, x.cols / span.head_dim.max(1));
    let half = span.dims / 2;
    // 8 pairs a thread (16-byte accesses) where both halves start on 8-value boundaries.
    let aligned = [half, span.start, span.head_dim]
        .iter()
        .all(|v| v.is_multiple_of(8));
    let per = if !span.interleaved && aligned { 8 } else { 1 };
    let (t, h, d, st, r, il, pe) = (
        i32_arg(tokens, "tokens")?,
        i32_arg(heads, "heads")?,
        i32_arg(span.head_dim, "head_dim")?,
        i32_arg(span.start, "rotary start")?,
        i32_arg(span.dims, "rotary_dim")?,
        i32::from(span.interleaved),
        per as i32,
    );
    let (xp, cp, sp) = (x.ptr(), cos.ptr(), sin.ptr());
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(x.dtype));
    b.arg(&xp)
        .arg(&positions)
        .arg(&cp)
        .arg(&sp)
        .arg(&t)
        .arg(&h)
        .arg(&d)
        .arg(&st)
        .arg(&r)
        .arg(&il)
        .arg(&pe);
    launch(b, elementwise(tokens * heads * (half / per))?, "rope")
}
