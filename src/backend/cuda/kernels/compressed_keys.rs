//! `compressed_keys.cu`: each query's key list in a DeepSeek-V4 compressed attention layer or
//! GLM-5.3-Flash's pooled sparse attention, a thread a place.

use cudarc::driver::{CudaFunction, PushKernelArg};

use super::{Loader, Module, Source, Stream, cuda_source, elementwise, i32_arg, launch};
use crate::Result;
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;

struct Entry {
    compressed: CudaFunction,
    pooled: CudaFunction,
}

impl Module for Entry {
    const SOURCE: Source<'static> = cuda_source!("compressed_keys");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self {
            compressed: l.func("compressed_keys")?,
            pooled: l.func("pooled_keys")?,
        }))
    }
}

/// `lists` (f32 `[tokens, width]`) from `seq_start` (the u32 first row of each row's
/// sequence): each row's `window` keys, then the indexer's `picks` (f32 `[tokens, top_k]`)
/// or, without them, every entry of `rate` tokens it has seen (`Backend::compressed_keys`).
pub fn run(
    k: &super::Kernels,
    s: &Stream,
    lists: &CudaTensor,
    seq_start: u64,
    picks: Option<&CudaTensor>,
    (window, rate): (usize, usize),
) -> Result<()> {
    let (tokens, width) = (lists.rows as i64, i32_arg(lists.cols, "key list width")?);
    let (window, rate) = (
        i32_arg(window.min(lists.cols), "window")?,
        i32_arg(rate.max(1), "rate")?,
    );
    let (pp, top_k) = picks.map_or((0, 0), |p| (p.ptr(), p.cols));
    let top_k = i32_arg(top_k, "picks a query")?;
    let lp = lists.ptr();
    let entry = k.get::<Entry>()?;
    let mut b = s.launch_builder(&entry.compressed);
    b.arg(&lp).arg(&seq_start).arg(&pp);
    b.arg(&tokens)
        .arg(&width)
        .arg(&window)
        .arg(&rate)
        .arg(&top_k);
    launch(b, elementwise(lists.len())?, "compressed_keys")
}

/// `lists` (f32 `[tokens, width]`) from `seq_start`: each row's picked pools' tokens
/// (`picks` f32 `[tokens, top_k]`, pools of `pools.size`), then its tail where `pools.tail`
/// (`Backend::compressed_keys` with `EntryKeys::Pools`).
pub fn run_pooled(
    k: &super::Kernels,
    s: &Stream,
    lists: &CudaTensor,
    seq_start: u64,
    picks: &CudaTensor,
    pools: crate::checkpoint::config::KeyPools,
) -> Result<()> {
    let (tokens, width) = (lists.rows as i64, i32_arg(lists.cols, "key list width")?);
    let (size, top_k) = (
        i32_arg(pools.size, "pool size")?,
        i32_arg(picks.cols, "picks a query")?,
    );
    let tail = i32::from(pools.tail);
    let (lp, pp) = (lists.ptr(), picks.ptr());
    let entry = k.get::<Entry>()?;
    let mut b = s.launch_builder(&entry.pooled);
    b.arg(&lp).arg(&seq_start).arg(&pp);
    b.arg(&tokens).arg(&width).arg(&size).arg(&top_k).arg(&tail);
    launch(b, elementwise(lists.len())?, "pooled_keys")
}
