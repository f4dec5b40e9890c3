//! `route.cu`: each token's top-k experts from the router's f32 logits, and the tokens
//! grouped by expert.

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

use super::{Kernels, Loader, Module, Source, Stream, cuda_source, i32_arg, launch};
use crate::Result;
use crate::checkpoint::Router;

/// `route.cu`'s entry points: `route_topk_128`, `_256` and `_512` (for up to that many
/// experts) and `route_fill`.
struct Entries {
    topk: [CudaFunction; 3],
    fill: CudaFunction,
}

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("route");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self {
            topk: [
                l.func("route_topk_128")?,
                l.func("route_topk_256")?,
                l.func("route_topk_512")?,
            ],
            fill: l.func("route_fill")?,
        }))
    }
}

/// The largest `experts_per_token`, `n_group` and expert count the kernel holds in registers
/// (one warp a token: a pick per lane, 16 experts a lane).
pub const MAX_K: usize = 32;
pub const MAX_GROUPS: usize = 64;
pub const MAX_EXPERTS: usize = 512;

/// Picks a block of `route_fill` places.
const FILL_THREADS: usize = 1024;

/// Tokens a block of `route_topk` routes, one warp each.
const TOKENS_PER_BLOCK: usize = 8;

/// Device addresses of one routing: the `[tokens, experts]` f32 logits, the `[experts]`
/// selection bias, the `[experts]` factors on the weights (0: none), each token's `[tokens, k]`
/// u32 experts where the token chooses them (0: by score), the `[tokens, k]` expert ids (u32)
/// and weights (f32) it writes, and the `[experts]` u32 counts it adds to (zeroed by
/// the caller).
pub struct TopK {
    pub logits: u64,
    pub bias: u64,
    pub expert_scale: u64,
    pub fixed: u64,
    pub ids: u64,
    pub weights: u64,
    pub counts: u64,
}

pub fn top_k(
    k: &Kernels,
    s: &Stream,
    p: &TopK,
    (tokens, experts, per_token): (usize, usize, usize),
    router: Router,
) -> Result<()> {
    let (t, e, kk) = (
        i32_arg(tokens, "tokens")?,
        i32_arg(experts, "experts")?,
        i32_arg(per_token, "experts per token")?,
    );
    let (rule, renorm, groups, top_groups, scale, eps) = match router {
        Router::Softmax { renormalize } => (0i32, renormalize, 1, 1, 1.0f32, 0.0f32),
        Router::TopKSoftmax => (2, false, 1, 1, 1.0, 0.0),
        Router::TopKSigmoid => (3, false, 1, 1, 1.0, 0.0),
        Router::Sigmoid {
            groups,
            top_groups,
            renormalize,
            scale,
            eps,
        } => (1, renormalize, groups, top_groups, scale, eps),
        // The host reference's epsilon on the sum of the k scores.
        Router::SqrtSoftplus { scale } => (4, true, 1, 1, scale, 1e-20),
        Router::GroupedSoftmax { .. } => {
            return Err(crate::Error::backend(
                "cuda",
                format!("router {router} is routed on the host"),
            ));
        }
    };
    let (renorm, g, tg) = (
        i32::from(renorm),
        i32_arg(groups, "groups")?,
        i32_arg(top_groups, "top groups")?,
    );
    // The entry of the fewest experts a lane that holds them all (MAX_EXPERTS checked by
    // the caller).
    let entry = match experts {
        0..=128 => 0,
        129..=256 => 1,
        _ => 2,
    };
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(&entries.topk[entry]);
    b.arg(&p.logits)
        .arg(&p.bias)
        .arg(&p.expert_scale)
        .arg(&p.fixed)
        .arg(&p.ids)
        .arg(&p.weights)
        .arg(&p.counts)
        .arg(&t)
        .arg(&e)
        .arg(&kk)
        .arg(&rule)
        .arg(&renorm)
        .arg(&g)
        .arg(&tg)
        .arg(&scale)
        .arg(&eps);
    let blocks = u32::try_from(tokens.div_ceil(TOKENS_PER_BLOCK).max(1))
        .map_err(|_| crate::Error::backend("cuda", format!("routing {tokens} tokens at once")))?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (32 * TOKENS_PER_BLOCK as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(b, cfg, "route_topk")
}

/// Writes each token's `(row, weight)` at its expert's `cursor` (u32, starting at each
/// group's offset) into `rows` / `row_weights`, and where each pick went into `slots`
/// (`[tokens, k]` u32).
pub fn fill(
    k: &Kernels,
    s: &Stream,
    (ids, weights, cursor): (u64, u64, u64),
    (rows, row_weights, slots): (u64, u64, u64),
    (tokens, per_token, experts): (usize, usize, usize),
) -> Result<()> {
    let (t, kk) = (i32_arg(tokens, "tokens")?, i32_arg(per_token, "k")?);
    let e = i32_arg(experts.min(MAX_EXPERTS), "experts")?;
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(&entries.fill);
    b.arg(&ids)
        .arg(&weights)
        .arg(&cursor)
        .arg(&rows)
        .arg(&row_weights)
        .arg(&slots)
        .arg(&t)
        .arg(&kk)
        .arg(&e);
    // Blocks of many picks: each expert's few places a block come from one cursor atomic.
    let picks = tokens * per_token;
    let blocks = u32::try_from(picks.div_ceil(FILL_THREADS).max(1))
        .map_err(|_| crate::Error::backend("cuda", format!("placing {picks} picks at once")))?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (FILL_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(b, cfg, "route_fill")
}
