//! `hyper_weights.cu`: DeepSeek-V4's hyper-connection weights (sigmoids, a softmax a row and
//! Sinkhorn's passes), a thread a token.

use cudarc::driver::{CudaFunction, PushKernelArg};

use super::{Loader, Module, Source, Stream, cuda_source, elementwise, i32_arg, launch};
use crate::Result;
use crate::backend::compressed::HyperRule;
use crate::backend::cuda::CudaTensor;

struct Entry(CudaFunction);

impl Module for Entry {
    const SOURCE: Source<'static> = cuda_source!("hyper_weights");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.func("hyper_weights")?)))
    }
}

/// The streams `hyper_weights.cu` holds a token's `comb` for.
pub const MAX_STREAMS: usize = 8;

/// `pre`, `post` and `comb` (f32 `[tokens, n]`, `[tokens, n]`, `[tokens, n * n]`) from the f32
/// `outputs` `[tokens, (2 + n) * n]` and `base` (f32 `[(2 + n) * n]`) under `rule`
/// (`Backend::hyper_weights`; `rule.streams` at most [`MAX_STREAMS`], checked by the caller).
pub fn run(
    k: &super::Kernels,
    s: &Stream,
    [pre, post, comb]: [&CudaTensor; 3],
    (outputs, base): (&CudaTensor, u64),
    rule: &HyperRule,
) -> Result<()> {
    let tokens = outputs.rows as i64;
    let n = i32_arg(rule.streams, "streams")?;
    let iters = i32_arg(rule.iters, "Sinkhorn passes")?;
    let [s_pre, s_post, s_comb] = rule.scale;
    let (pp, qp, cp, op) = (pre.ptr(), post.ptr(), comb.ptr(), outputs.ptr());
    let entry = k.get::<Entry>()?;
    let mut b = s.launch_builder(&entry.0);
    b.arg(&pp).arg(&qp).arg(&cp).arg(&op).arg(&base);
    b.arg(&tokens).arg(&n).arg(&s_pre).arg(&s_post).arg(&s_comb);
    b.arg(&rule.eps).arg(&iters);
    launch(b, elementwise(outputs.rows)?, "hyper_weights")
}
