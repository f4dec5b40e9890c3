//! `index_top_k.cu`: DeepSeek sparse attention's selection from the indexer's products (q . k
//! of every query head and key, cuBLAS's): the heads weighed into each row's scores
//! (`scores`, a thread a key), then each row's top k (`select`, a block a row).

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

use super::{Kernels, Loader, Module, Source, Stream, Typed, cuda_source, i32_arg, launch};
use crate::Result;
use crate::backend::IndexSpec;
use crate::backend::cuda::CudaTensor;

/// Must match IX_THREADS in index_top_k.cu (its histogram has a bin a thread).
const THREADS: u32 = 256;

/// `index_top_k.cu`'s entry points: the scores by the weights' type, the selection.
struct Entries {
    scores: Typed,
    select: CudaFunction,
}

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("index_top_k");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self {
            scores: l.typed("index_scores")?,
            select: l.func("index_select")?,
        }))
    }
}

/// Rows of order keys: `max_len` u32 a row from `ptr`, its first for query row `row0`.
#[derive(Clone, Copy, Debug)]
pub struct Scratch {
    pub ptr: u64,
    pub row0: usize,
    pub max_len: usize,
}

/// Each query row of `scratch`'s rows `rows`' scores from `products` (f32, row `(r - rows.start)
/// * heads + h` holding head h's products with the sequence's keys, `stride` apart), the heads
/// weighed by `w` (`[tokens, heads]`).
pub fn scores(
    k: &Kernels,
    s: &Stream,
    (products, stride): (u64, usize),
    w: &CudaTensor,
    seq_start: u64,
    spec: IndexSpec,
    (rows, scratch): (std::ops::Range<usize>, Scratch),
) -> Result<()> {
    let heads = i32_arg(spec.heads, "index heads")?;
    let (row0, max_len, rate) = (
        i32_arg(rows.start, "index_top_k row")?,
        i32_arg(scratch.max_len, "index_top_k max_len")?,
        i32_arg(spec.rate, "index_top_k rate")?,
    );
    let at = scratch.ptr + ((rows.start - scratch.row0) * scratch.max_len * 4) as u64;
    let (wp, stride) = (w.ptr(), stride as i64);
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.scores.get(w.dtype));
    b.arg(&at)
        .arg(&products)
        .arg(&wp)
        .arg(&seq_start)
        .arg(&heads);
    b.arg(&spec.scale)
        .arg(&spec.weight_scale)
        .arg(&row0)
        .arg(&stride)
        .arg(&max_len)
        .arg(&rate);
    let cfg = LaunchConfig {
        grid_dim: (
            scratch.max_len.div_ceil(THREADS as usize) as u32,
            rows.len() as u32,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(b, cfg, "index_scores")
}

/// Selects the keys of the query rows of `scratch` (from its `row0`, `rows` of them) into
/// `out` (`[tokens, top_k]` f32); the rows that keep every key read no scores.
pub fn select(
    k: &Kernels,
    s: &Stream,
    out: &CudaTensor,
    seq_start: u64,
    (top_k, rate): (usize, usize),
    (scratch, rows): (Scratch, usize),
) -> Result<()> {
    let args = (
        i32_arg(top_k, "index_topk")?,
        i32_arg(scratch.row0, "index_top_k row")?,
        i32_arg(scratch.max_len, "index_top_k max_len")?,
        i32_arg(rate, "index_top_k rate")?,
    );
    let op = out.ptr();
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(&entries.select);
    b.arg(&op).arg(&scratch.ptr).arg(&seq_start);
    b.arg(&args.0).arg(&args.1).arg(&args.2).arg(&args.3);
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(b, cfg, "index_select")
}
