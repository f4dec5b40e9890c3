//! `linear_recurrence.cu`: the delta rule or Mamba-2's scan step by step, a block per
//! (sequence, value head, 64 columns), the next token's inputs loaded while a step computes.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{InOut, Kernels, Loader, Module, Source, Stream, cuda_source, i32_arg, launch};
use crate::backend::cuda::CudaTensor;
use crate::backend::{Recurrence, RecurrenceGates};
use crate::checkpoint::DeltaNetConfig;
use crate::{Error, Result};

/// `linear_recurrence.cu`'s entry points by (input, output) type, for each rule: any key
/// width, and the key width of 128 compiled in (the state in registers).
struct Entries {
    delta: [InOut; 2],
    ssd: [InOut; 2],
}

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("linear_recurrence");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self {
            delta: [
                l.in_out("gated_delta_rule")?,
                l.in_out("gated_delta_rule_k128")?,
            ],
            ssd: [l.in_out("ssd_scan")?, l.in_out("ssd_scan_k128")?],
        }))
    }
}

/// Columns of a value head a block (DR_COLS in the kernel).
const COLS: usize = 64;
/// The widest key head the kernel's state holds (DR_MAX_DK).
pub const MAX_KEY_DIM: usize = 256;

/// `out = linear_recurrence(qkv)` (`Backend::linear_recurrence`), the gates' shapes checked by
/// the caller.
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: &CudaTensor,
    qkv: &CudaTensor,
    gates: RecurrenceGates<'_, CudaTensor>,
    seq_start: u64,
    net: DeltaNetConfig,
) -> Result<()> {
    if net.k_dim > MAX_KEY_DIM {
        return Err(Error::unsupported(
            "cuda linear_recurrence",
            "the key (state) head width",
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
    let entries = k.get::<Entries>()?;
    let (kernels, b_ptr, d_ptr, limits) = match gates.rule {
        Recurrence::Delta { b } => (&entries.delta, b.ptr(), 0, [0.0, 0.0]),
        Recurrence::Ssd { d, dt_min, dt_max } => (&entries.ssd, 0, d.ptr(), [dt_min, dt_max]),
    };
    let ptrs = [
        out.ptr(),
        qkv.ptr(),
        gates.a.ptr(),
        b_ptr,
        d_ptr,
        gates.a_log.ptr(),
        gates.dt_bias.ptr(),
        seq_start,
    ];
    let kernel = &kernels[usize::from(net.k_dim == 128)];
    let mut b = s.launch_builder(kernel.get(qkv.dtype, out.dtype));
    for p in &ptrs {
        b.arg(p);
    }
    for a in &args {
        b.arg(a);
    }
    for l in &limits {
        b.arg(l);
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
    launch(b, cfg, "linear_recurrence")
}
