//! `gated_delta_rule.cu`: the delta rule step by step, a block per (sequence, value head,
//! 64 columns), the next token's inputs loaded while a step computes.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{InOut, Kernels, Loader, Module, Source, Stream, cuda_source, i32_arg, launch};
use crate::backend::cuda::CudaTensor;
use crate::checkpoint::DeltaNetConfig;
use crate::{Error, Result};

/// `gated_delta_rule.cu`'s entry points by (input, output) type: any key width, and the
/// key width of 128 compiled in (the state in registers).
struct Entries {
    any: InOut,
    k128: InOut,
}

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("gated_delta_rule");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self {
            any: l.in_out("gated_delta_rule")?,
            k128: l.in_out("gated_delta_rule_k128")?,
        }))
    }
}

/// Columns of a value head a block (DR_COLS in the kernel).
const COLS: usize = 64;
/// The widest key head the kernel's state holds (DR_MAX_DK).
pub const MAX_KEY_DIM: usize = 256;

/// The per-token and per-head gate inputs: `a`, `b` (activations `[tokens, v_heads]`),
/// `A_log`, `dt_bias` (f32 `[1, v_heads]`).
pub struct Gates<'a> {
    pub a: &'a CudaTensor,
    pub b: &'a CudaTensor,
    pub a_log: &'a CudaTensor,
    pub dt_bias: &'a CudaTensor,
}

pub fn run(
    k: &Kernels,
    s: &Stream,
    out: &CudaTensor,
    qkv: &CudaTensor,
    gates: Gates,
    seq_start: u64,
    net: DeltaNetConfig,
) -> Result<()> {
    if net.k_dim > MAX_KEY_DIM {
        return Err(Error::unsupported(
            "cuda gated_delta_rule",
            "linear_key_head_dim",
            format!("{} (the kernel holds up to {MAX_KEY_DIM})", net.k_dim),
        ));
    }
    let tokens = qkv.rows;
    let args = [
        i32_arg(tokens, "tokens")?,
        i32_arg(net.k_heads, "key heads")?,
        i32_arg(net.v_heads, "value heads")?,
        i32_arg(net.k_dim, "key head dim")?,
        i32_arg(net.v_dim, "value head dim")?,
    ];
    let ptrs = [
        out.ptr(),
        qkv.ptr(),
        gates.a.ptr(),
        gates.b.ptr(),
        gates.a_log.ptr(),
        gates.dt_bias.ptr(),
        seq_start,
    ];
    let entries = k.get::<Entries>()?;
    let kernel = if net.k_dim == 128 {
        &entries.k128
    } else {
        &entries.any
    };
    let mut b = s.launch_builder(kernel.get(qkv.dtype, out.dtype));
    for p in &ptrs {
        b.arg(p);
    }
    for a in &args {
        b.arg(a);
    }
    let cfg = LaunchConfig {
        grid_dim: (
            tokens.max(1) as u32,
            net.v_heads as u32,
            net.v_dim.div_ceil(COLS) as u32,
        ),
        block_dim: (COLS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(b, cfg, "gated_delta_rule")
}
