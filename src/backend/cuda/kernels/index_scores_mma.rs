//! `index_scores_mma.cu`: DeepSeek sparse attention's indexer scores on the tensor cores
//! (mma.sync, sm_80 and later), each query's heads weighed and summed in registers instead of
//! through cuBLAS's per-head products in memory; `index_top_k.cu`'s selection reads them.

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

use super::index_top_k::Scratch;
use super::{Loader, Module, Source, Stream, cuda_source, i32_arg, launch, set_smem};
use crate::Result;
use crate::backend::IndexSpec;

/// Must match IM_WARPS, IM_QB and IM_BN in index_scores_mma.cu.
const WARPS: u32 = 4;
const QUERY_ROWS: usize = 4;
const KEY_TILE: usize = 64;
/// The head widths it has entries for, and the most heads its shared memory is set for.
const WIDTHS: [usize; 3] = [32, 64, 128];
const MAX_HEADS: usize = 64;

/// Shared memory for `heads` heads of `d`: the queries, two key tiles (padded rows of bf16),
/// the warps' sums.
fn smem(heads: usize, d: usize) -> usize {
    (QUERY_ROWS * heads * (d + 8) + 2 * KEY_TILE * (d + 8)) * 2 + WARPS as usize * KEY_TILE * 4
}

pub struct IndexScoresMma([CudaFunction; 3]);

impl Module for IndexScoresMma {
    const SOURCE: Source<'static> = cuda_source!("index_scores_mma");

    fn load(l: &Loader) -> Result<Option<Self>> {
        if l.max_smem < smem(MAX_HEADS, 128) {
            return Ok(None);
        }
        let f = WIDTHS.map(|d| l.func(&format!("index_scores_mma_d{d}")));
        let [a, b, c] = f;
        let f = [a?, b?, c?];
        for (f, d) in f.iter().zip(WIDTHS) {
            set_smem(f, smem(MAX_HEADS, d), "index_scores_mma")?;
        }
        Ok(Some(Self(f)))
    }
}

impl IndexScoresMma {
    /// Whether it computes `spec`'s scores: heads a multiple of 16 up to 64, of 32, 64 or 128.
    pub fn takes(&self, spec: IndexSpec) -> bool {
        spec.heads.is_multiple_of(16) && spec.heads <= MAX_HEADS && WIDTHS.contains(&spec.head_dim)
    }

    /// The scores of query rows `rows` (of one sequence) into `scratch`, from bf16 `q`, `k` and
    /// the heads' weights `w` (device addresses of whole tensors).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        s: &Stream,
        (q, k, w): (u64, u64, u64),
        seq_start: u64,
        spec: IndexSpec,
        (rows, scratch): (std::ops::Range<usize>, Scratch),
    ) -> Result<()> {
        let d = spec.head_dim;
        let Some(i) = WIDTHS.iter().position(|&x| x == d) else {
            return Err(crate::Error::backend(
                "cuda",
                format!("index scores of heads of {d}"),
            ));
        };
        let at = scratch.ptr + ((rows.start - scratch.row0) * scratch.max_len * 4) as u64;
        let (heads, row0, n, max_len, rate) = (
            i32_arg(spec.heads, "index heads")?,
            i32_arg(rows.start, "index_top_k row")?,
            i32_arg(rows.len(), "index_top_k rows")?,
            i32_arg(scratch.max_len, "index_top_k max_len")?,
            i32_arg(spec.rate, "index_top_k rate")?,
        );
        let mut b = s.launch_builder(&self.0[i]);
        b.arg(&at)
            .arg(&q)
            .arg(&k)
            .arg(&w)
            .arg(&seq_start)
            .arg(&heads);
        b.arg(&spec.scale)
            .arg(&spec.weight_scale)
            .arg(&row0)
            .arg(&n)
            .arg(&max_len)
            .arg(&rate);
        let cfg = LaunchConfig {
            grid_dim: (rows.len().div_ceil(QUERY_ROWS) as u32, 1, 1),
            block_dim: (WARPS * 32, 1, 1),
            shared_mem_bytes: smem(spec.heads, d) as u32,
        };
        launch(b, cfg, "index_scores_mma")
    }
}
