//! `combine_experts.cu`: the experts' output rows of every token, weighted and summed in
//! expert order into the mixture's f32 accumulator.

use cudarc::driver::PushKernelArg;

use super::{
    Kernels, Loader, Module, Source, Stream, Typed, cuda_source, elementwise, i32_arg, launch,
};
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;
use crate::{Error, Result};

/// `combine_experts.cu`'s entry points.
struct Entries(Typed);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("combine_experts");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.typed("combine_experts")?)))
    }
}

/// The most picks per token the kernel sorts in registers.
pub const MAX_K: usize = 32;

/// `acc[t] = sum_j weights[p] * y[p]` over the `k` rows `p = slots[t * k + j]` of token `t`,
/// in ascending `p`, or with `add` `acc[t] += ` that sum; `slots` (u32) and `weights` (f32,
/// per row of `y`) are device addresses.
pub fn run(
    k: &Kernels,
    s: &Stream,
    acc: &CudaTensor,
    y: &CudaTensor,
    (slots, weights, per_token): (u64, u64, usize),
    add: bool,
) -> Result<()> {
    let [tokens, cols] = acc.shape();
    if !cols.is_multiple_of(8) || per_token > MAX_K || y.cols != cols {
        return Err(Error::backend(
            "cuda",
            format!(
                "combining {per_token} expert rows of {} into {cols} columns",
                y.cols
            ),
        ));
    }
    let (t, kk, c) = (
        i32_arg(tokens, "tokens")?,
        i32_arg(per_token, "k")?,
        i32_arg(cols, "cols")?,
    );
    let (ap, yp, add) = (acc.ptr(), y.ptr(), add as i32);
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(y.dtype));
    b.arg(&ap).arg(&yp).arg(&slots).arg(&weights);
    b.arg(&t).arg(&kk).arg(&c).arg(&add);
    launch(b, elementwise(tokens * cols / 8)?, "combine_experts")
}
