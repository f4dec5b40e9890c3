//! `sparse_attention.cu`: attention over each query's selected keys (DeepSeek sparse
//! attention), a warp per (query, head) on the CUDA cores.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{InOut, Kernels, Loader, Module, Source, Stream, cuda_source, i32_arg, launch};
use crate::backend::AttnSpec;
use crate::backend::cuda::CudaTensor;
use crate::{Error, Result};

/// Must match SA_WARPS and SA_MAXT in sparse_attention.cu.
const WARPS: usize = 4;
const MAX_HEAD_DIM: usize = 256;

/// `sparse_attention.cu`'s entry points by (q, k and v, output) type.
struct Entries(InOut);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("sparse_attention");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.in_out("sparse_attention")?)))
    }
}

/// `out` = each query's attention over the keys its row of `keys` (f32 positions) names.
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: &CudaTensor,
    (q, kk, v): (&CudaTensor, &CudaTensor, &CudaTensor),
    seq_start: u64,
    keys: &CudaTensor,
    spec: AttnSpec,
) -> Result<()> {
    let d = spec.head_dim;
    if d > MAX_HEAD_DIM || spec.kv_heads == 0 || !spec.heads.is_multiple_of(spec.kv_heads) {
        return Err(Error::unsupported(
            "sparse attention",
            "shape",
            format!("{spec:?}: head_dim <= {MAX_HEAD_DIM} and heads a multiple of kv_heads"),
        ));
    }
    let args = (
        i32_arg(keys.cols, "selected keys")?,
        i32_arg(spec.heads, "heads")?,
        i32_arg(spec.kv_heads, "kv_heads")?,
        i32_arg(d, "head_dim")?,
    );
    let softcap = spec.softcap.unwrap_or(0.0);
    let ptrs = (out.ptr(), q.ptr(), kk.ptr(), v.ptr(), keys.ptr());
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(q.dtype, out.dtype));
    b.arg(&ptrs.0).arg(&ptrs.1).arg(&ptrs.2).arg(&ptrs.3);
    b.arg(&seq_start).arg(&ptrs.4);
    b.arg(&args.0).arg(&args.1).arg(&args.2).arg(&args.3);
    b.arg(&spec.scale).arg(&softcap);
    let cfg = LaunchConfig {
        grid_dim: (q.rows as u32, spec.heads.div_ceil(WARPS) as u32, 1),
        block_dim: ((WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: (WARPS * d * 4) as u32,
    };
    launch(b, cfg, "sparse_attention")
}
