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
    /// 1: Mamba-2's scan; 0: the delta rule.
    pub ssd: u32,
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

/// The inputs: `qkv` `[tokens, conv width]`, `a` `[tokens, v_heads]`, the rule's own (the
/// delta rule's `b` `[tokens, v_heads]`, Mamba-2's `D` `[v_heads]`), `A_log` and `dt_bias`
/// `[v_heads]`, and the batch's sequence buffer.
pub(crate) struct Inputs<'a> {
    pub qkv: &'a wgpu::Buffer,
    pub a: &'a wgpu::Buffer,
    pub b_or_d: &'a wgpu::Buffer,
    pub a_log: &'a wgpu::Buffer,
    pub dt_bias: &'a wgpu::Buffer,
    pub layout: &'a wgpu::Buffer,
}

pub(crate) fn linear_recurrence(
    gpu: &Gpu,
    p: &Params,
    x: &Inputs,
    out: &wgpu::Buffer,
) -> Result<()> {
    if p.dk as usize > MAX_KEY_DIM {
        return Err(Error::unsupported(
            "wgpu linear_recurrence",
            "the key (state) head width",
            format!("{} (the kernel holds up to {MAX_KEY_DIM})", p.dk),
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
