//! shaders/wgsl/gated_delta_rule.wgsl: the delta rule step by step, a workgroup per (token,
//! value head, 64 columns); only tokens that start a sequence do any work.

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
    pub _pad: [u32; 2],
}

wgsl_kernel!(
    "gated_delta_rule",
    libs: [],
    bindings: [R, R, R, R, R, R, RW],
    params: Params,
    form: Plain,
);

/// The inputs: `qkv` `[tokens, conv width]`, `a` and `b` `[tokens, v_heads]`, `A_log` and
/// `dt_bias` `[v_heads]`, and the batch's sequence buffer.
pub(crate) struct Inputs<'a> {
    pub qkv: &'a wgpu::Buffer,
    pub a: &'a wgpu::Buffer,
    pub b: &'a wgpu::Buffer,
    pub a_log: &'a wgpu::Buffer,
    pub dt_bias: &'a wgpu::Buffer,
    pub layout: &'a wgpu::Buffer,
}

pub(crate) fn gated_delta_rule(
    gpu: &Gpu,
    p: &Params,
    x: &Inputs,
    out: &wgpu::Buffer,
) -> Result<()> {
    if p.dk as usize > MAX_KEY_DIM {
        return Err(Error::unsupported(
            "wgpu gated_delta_rule",
            "linear_key_head_dim",
            format!("{} (the kernel holds up to {MAX_KEY_DIM})", p.dk),
        ));
    }
    let n = p.tokens as u64 * p.v_heads as u64 * p.col_blocks as u64;
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[x.qkv, x.a, x.b, x.a_log, x.dt_bias, x.layout, out],
        gpu.grid(n),
    )
}
