//! `index_top_k.cu`: DeepSeek sparse attention's selection from the indexer's products (q . k
//! of every query head and key, cuBLAS's), a block per query row, its scores in a scratch row.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{Kernels, Loader, Module, Source, Stream, Typed, cuda_source, i32_arg, launch};
use crate::Result;
use crate::backend::IndexSpec;
use crate::backend::cuda::CudaTensor;

/// Must match IX_THREADS in index_top_k.cu (its histogram has a bin a thread).
const THREADS: u32 = 256;

/// `index_top_k.cu`'s entry points by the weights' type.
struct Entries(Typed);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("index_top_k");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.typed("index_top_k")?)))
    }
}

/// The products of query rows `rows` (f32 at `products`: row `(r - rows.start) * heads + h`
/// holds head h's products with the sequence's keys, `ld` apart; 0 where every row of `rows`
/// keeps all its keys) and `max_len` u32 of `scratch` a row.
#[derive(Clone, Copy, Debug)]
pub struct Products {
    pub products: u64,
    pub ld: usize,
    pub scratch: u64,
    pub max_len: usize,
}

/// Selects the keys of query rows `rows` into `out` (`[tokens, top_k]` f32), the heads
/// weighed by `w` (`[tokens, heads]`).
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: &CudaTensor,
    w: &CudaTensor,
    seq_start: u64,
    spec: IndexSpec,
    rows: std::ops::Range<usize>,
    p: Products,
) -> Result<()> {
    let args = (
        i32_arg(spec.heads, "index heads")?,
        i32_arg(spec.top_k, "index_topk")?,
        i32_arg(rows.start, "index_top_k row")?,
        p.ld as i64,
        i32_arg(p.max_len, "index_top_k max_len")?,
    );
    let (op, wp) = (out.ptr(), w.ptr());
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(w.dtype));
    b.arg(&op)
        .arg(&p.products)
        .arg(&wp)
        .arg(&seq_start)
        .arg(&p.scratch);
    b.arg(&args.0)
        .arg(&args.1)
        .arg(&spec.scale)
        .arg(&spec.weight_scale);
    b.arg(&args.2).arg(&args.3).arg(&args.4);
    let cfg = LaunchConfig {
        grid_dim: (rows.len() as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(b, cfg, "index_top_k")
}
