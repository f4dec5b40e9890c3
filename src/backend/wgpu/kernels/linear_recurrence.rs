//! shaders/wgsl/linear_recurrence.wgsl: the delta rule or Mamba-2's scan step by step, a
//! workgroup per (token, value head, 64 columns); only tokens that start a sequence do any
//! work.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use crate::{Error, Result};

/// Columns of a value head a workgroup (COLS in the kernel).
pub const COLS: usize = 64;
/// The widest key head the kernel's state holds (MAX_DK).
pub const MAX_KEY_DIM: usize = 256;
/// Mesa's CPU drivers (llvmpipe, lavapipe) end every loop of a shader invocation, silently,
/// once this many iterations have run in all (gallivm's `LP_MAX_TGSI_LOOP_ITERATIONS`).
pub const CPU_DRIVER_LOOP_LIMIT: u64 = 65_535;

/// The loop iterations one invocation runs over a sequence of `len` tokens with key heads of
/// `dk`, each loop counted once more for its exit test as those drivers count: the state's
/// zeroing, the search for the sequence's end, and per token the staging of its query and key
/// and the rule's passes over the state (three for the delta rule, two for Mamba-2's scan).
/// On lavapipe a 160-wide delta rule ran 133 tokens (65,216) and lost the 134th (65,704).
pub fn loop_iterations(len: u64, dk: u64, ssd: bool) -> u64 {
    let passes = if ssd { 2 } else { 3 };
    let staging = dk.div_ceil(COLS as u64) + 1;
    (dk + 1) + (len + 1) + len * (1 + staging + passes * (dk + 1))
}

/// `Params::rule`: the delta rule, Mamba-2's scan, Kimi's delta rule (a decay a key channel).
pub const DELTA: u32 = 0;
pub const SSD: u32 = 1;
pub const KIMI: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub tokens: u32,
    pub k_heads: u32,
    pub v_heads: u32,
    pub dk: u32,
    pub dv: u32,
    /// `dv / COLS`, rounded up.
    pub col_blocks: u32,
    /// `DELTA`, `SSD` or `KIMI`.
    pub rule: u32,
    pub _pad: u32,
    /// Mamba-2's limits on `dt`.
    pub dt_min: f32,
    pub dt_max: f32,
    pub _pad1: [u32; 2],
}

wgsl_kernel!(
    "linear_recurrence",
    libs: [],
    bindings: [R, R, R, R, R, R, RW],
    params: Params,
    form: Plain,
);

/// The inputs: `qkv` `[tokens, conv width]`, `a` `[tokens, v_heads]` (Kimi's `[tokens,
/// v_heads * dk]`), the rule's own (the delta rule's `b` `[tokens, v_heads]`, Mamba-2's `D`
/// `[v_heads]`), `A_log` `[v_heads]` and `dt_bias` (as wide as a row of `a`), and the batch's
/// sequence buffer.
pub(crate) struct Inputs<'a> {
    pub qkv: &'a wgpu::Buffer,
    pub a: &'a wgpu::Buffer,
    pub b_or_d: &'a wgpu::Buffer,
    pub a_log: &'a wgpu::Buffer,
    pub dt_bias: &'a wgpu::Buffer,
    pub layout: &'a wgpu::Buffer,
}

/// Runs the kernel over sequences of up to `longest` tokens; refused where the adapter is a
/// CPU driver whose loop limit would silently cut a sequence short.
pub(crate) fn linear_recurrence(
    gpu: &Gpu,
    p: &Params,
    x: &Inputs,
    out: &wgpu::Buffer,
    longest: usize,
) -> Result<()> {
    if p.dk as usize > MAX_KEY_DIM {
        return Err(Error::unsupported(
            "wgpu linear_recurrence",
            "the key (state) head width",
            format!("{} (the kernel holds up to {MAX_KEY_DIM})", p.dk),
        ));
    }
    let loops = loop_iterations(longest as u64, p.dk as u64, p.rule == SSD);
    if gpu.info.device_type == wgpu::DeviceType::Cpu && loops > CPU_DRIVER_LOOP_LIMIT {
        return Err(Error::unsupported(
            format!(
                "wgpu linear_recurrence on {} (a CPU Vulkan driver)",
                gpu.info.name
            ),
            "the longest sequence",
            format!(
                "{longest} tokens with key heads of {}: {loops} loop iterations in one shader \
                 invocation, beyond the {CPU_DRIVER_LOOP_LIMIT} after which the driver silently \
                 stops its loops; use --backend cpu or a shorter --ctx",
                p.dk
            ),
        ));
    }
    let n = p.tokens as u64 * p.v_heads as u64 * p.col_blocks as u64;
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[x.qkv, x.a, x.b_or_d, x.a_log, x.dt_bias, x.layout, out],
        gpu.grid(n),
    )
}
