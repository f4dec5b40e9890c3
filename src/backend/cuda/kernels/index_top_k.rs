//! `index_top_k.cu`: DeepSeek sparse attention's selection, a block per query row, its scores
//! in a scratch row.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{Kernels, Loader, Module, Source, Stream, Typed, cuda_source, i32_arg, launch};
use crate::backend::IndexSpec;
use crate::backend::cuda::CudaTensor;
use crate::{Error, Result};

/// Must match IX_THREADS in index_top_k.cu (its histogram has a bin a thread).
const THREADS: u32 = 256;
/// The query heads' shared memory a block may take without opting in.
const MAX_QUERY_BYTES: usize = 48 << 10;

/// `index_top_k.cu`'s entry points by input type.
struct Entries(Typed);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("index_top_k");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.typed("index_top_k")?)))
    }
}

/// Selects the keys of query rows `rows` (`[tokens, top_k]` f32 `out`) from `q`, `k` and
/// `weights` (`IndexSpec`; one input type); `scratch` holds `rows.len() * max_len` u32s.
#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: &CudaTensor,
    (q, kk, w): (&CudaTensor, &CudaTensor, &CudaTensor),
    seq_start: u64,
    scratch: u64,
    spec: IndexSpec,
    (rows, max_len): (std::ops::Range<usize>, usize),
) -> Result<()> {
    let smem = spec.heads * spec.head_dim * 4;
    if smem > MAX_QUERY_BYTES {
        return Err(Error::unsupported(
            "cuda index_top_k",
            "index heads",
            format!(
                "{} of {} (at most {} values a query)",
                spec.heads,
                spec.head_dim,
                MAX_QUERY_BYTES / 4
            ),
        ));
    }
    let args = (
        i32_arg(spec.heads, "index heads")?,
        i32_arg(spec.head_dim, "index head_dim")?,
        i32_arg(spec.top_k, "index_topk")?,
        i32_arg(rows.start, "index_top_k row")?,
        i32_arg(max_len, "index_top_k max_len")?,
    );
    let ptrs = (out.ptr(), q.ptr(), kk.ptr(), w.ptr());
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(q.dtype));
    b.arg(&ptrs.0).arg(&ptrs.1).arg(&ptrs.2).arg(&ptrs.3);
    b.arg(&seq_start).arg(&scratch);
    b.arg(&args.0).arg(&args.1).arg(&args.2);
    b.arg(&spec.scale).arg(&spec.weight_scale);
    b.arg(&args.3).arg(&args.4);
    let cfg = LaunchConfig {
        grid_dim: (rows.len() as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    launch(b, cfg, "index_top_k")
}
