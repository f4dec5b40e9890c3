//! `listed_attention.cu` (CUDA cores, any shape) and `listed_attention_mma.cu` (tensor cores,
//! one key head of bf16 heads: latent attention's 576 keys and 512 values, DeepSeek-V4's 512
//! and 512 with sinks): attention over the keys each query's list names, sparse attention's
//! cost growing with the keys selected.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::set_smem;
use super::{Dt, InOut, Kernels, Loader, Module, Source, Stream, cuda_source, i32_arg, launch};
use crate::backend::AttnSpec;
use crate::{Error, Result};

/// Must match LC_WARPS, LC_MAXK and LC_MAXV in listed_attention.cu.
const WARPS: usize = 4;
const MAX_KEYS_DIM: usize = 576;
const MAX_VALUES_DIM: usize = 512;
/// Must match LA_WARPS, LA_BM, LA_BN and LA_DV in listed_attention_mma.cu, and its entries'
/// key widths.
const MMA_WARPS: u32 = 8;
const MMA_HEADS: usize = 64;
const MMA_KEYS: usize = 32;
const MMA_DKS: [usize; 2] = [576, 512];
const MMA_DV: usize = 512;

struct Cores(InOut);

impl Module for Cores {
    const SOURCE: Source<'static> = cuda_source!("listed_attention");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.in_out("listed_attention")?)))
    }
}

/// `listed_attention_mma.cu`'s entries by key width (`MMA_DKS`) and output type, where the
/// device has their shared memory.
struct Mma([[cudarc::driver::CudaFunction; 2]; 2]);

/// The Q tile and two stages of key and value tiles, padded rows of bf16, for keys of `dk`.
const fn mma_smem(dk: usize) -> usize {
    (MMA_HEADS * (dk + 8) + 2 * MMA_KEYS * (dk + 8 + MMA_DV + 8)) * 2
}

impl Module for Mma {
    const SOURCE: Source<'static> = cuda_source!("listed_attention_mma");

    fn load(l: &Loader) -> Result<Option<Self>> {
        if l.max_smem < mma_smem(MMA_DKS[0]) {
            return Ok(None);
        }
        let by_width = |dk: usize| -> Result<[cudarc::driver::CudaFunction; 2]> {
            let f = [
                l.func(&format!("listed_attention_mma_d{dk}_bf16"))?,
                l.func(&format!("listed_attention_mma_d{dk}_f32"))?,
            ];
            for f in &f {
                set_smem(f, mma_smem(dk), "listed_attention_mma")?;
            }
            Ok(f)
        };
        Ok(Some(Self([by_width(MMA_DKS[0])?, by_width(MMA_DKS[1])?])))
    }
}

/// The operands of one launch: device addresses of `q` `[tokens, heads * dk]`, `k` `[tokens,
/// kv_heads * dk]`, `v` `[tokens, kv_heads * dv]` (of type `input`), the sequences' starts by
/// token, the key lists `keys` (f32 `[tokens, n_keys]`) and the heads' sink logits (f32
/// `[heads]`, 0: none). `k` and `v` may hold rows past the tokens.
pub struct Listed {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub seq_start: u64,
    pub keys: u64,
    pub n_keys: usize,
    pub tokens: usize,
    pub input: Dt,
    pub sinks: u64,
}

impl Listed {
    /// The arguments both kernels begin with: the output, then these operands.
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>, out: &'a u64) {
        b.arg(out)
            .arg(&self.q)
            .arg(&self.k)
            .arg(&self.v)
            .arg(&self.seq_start)
            .arg(&self.keys);
    }
}

/// Writes each query's attention over its listed keys to `out` (`[tokens, heads * v_dim]`
/// of type `output`); on the tensor cores where the shape is latent attention's or
/// DeepSeek-V4's in bf16 and `portable` does not ask for the CUDA cores.
pub fn run(
    k: &Kernels,
    s: &Stream,
    portable: bool,
    (out, output): (u64, Dt),
    a: &Listed,
    spec: AttnSpec,
    v_dim: usize,
) -> Result<()> {
    let d = spec.head_dim;
    if d > MAX_KEYS_DIM || v_dim > MAX_VALUES_DIM || !spec.heads.is_multiple_of(spec.kv_heads) {
        return Err(Error::unsupported(
            "cuda sparse attention",
            "shape",
            format!(
                "{spec:?}, values of {v_dim}: keys up to {MAX_KEYS_DIM} values, values up to {MAX_VALUES_DIM}"
            ),
        ));
    }
    let (n_keys, heads) = (
        i32_arg(a.n_keys, "listed keys")?,
        i32_arg(spec.heads, "heads")?,
    );
    let softcap = spec.softcap.unwrap_or(0.0);
    let width = MMA_DKS.iter().position(|&w| w == d);
    let one_key_head = spec.kv_heads == 1 && v_dim == MMA_DV;
    let mma = match (width, one_key_head, a.input, portable) {
        (Some(_), true, Dt::Bf16, false) if spec.heads.is_multiple_of(MMA_HEADS) => {
            k.optional::<Mma>()?
        }
        _ => None,
    };
    if let (Some(mma), Some(width)) = (mma, width) {
        let scale_log2 = (std::f64::consts::LOG2_E * spec.scale as f64) as f32;
        let f = &mma.0[width][output as usize];
        let cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(a.tokens).map_err(|_| Error::InvalidArgument("tokens".into()))?,
                (spec.heads / MMA_HEADS) as u32,
                1,
            ),
            block_dim: (MMA_WARPS * 32, 1, 1),
            shared_mem_bytes: mma_smem(d) as u32,
        };
        let mut b = s.launch_builder(f);
        a.push(&mut b, &out);
        b.arg(&n_keys).arg(&heads).arg(&scale_log2).arg(&softcap);
        b.arg(&a.sinks);
        return launch(b, cfg, "listed_attention_mma");
    }
    let cores = k.get::<Cores>()?;
    let (t, kvh, dk, dv) = (
        i32_arg(a.tokens, "tokens")?,
        i32_arg(spec.kv_heads, "kv_heads")?,
        i32_arg(d, "head_dim")?,
        i32_arg(v_dim, "values")?,
    );
    let warps = a.tokens * spec.heads;
    let cfg = LaunchConfig {
        grid_dim: (
            u32::try_from(warps.div_ceil(WARPS))
                .map_err(|_| Error::InvalidArgument(format!("{warps} attention rows")))?,
            1,
            1,
        ),
        block_dim: (WARPS as u32 * 32, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = s.launch_builder(cores.0.get(a.input, output));
    a.push(&mut b, &out);
    b.arg(&n_keys)
        .arg(&t)
        .arg(&heads)
        .arg(&kvh)
        .arg(&dk)
        .arg(&dv);
    b.arg(&spec.scale).arg(&softcap).arg(&a.sinks);
    launch(b, cfg, "listed_attention")
}
