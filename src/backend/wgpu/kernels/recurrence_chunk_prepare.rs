//! shaders/wgsl/recurrence_chunk_prepare.wgsl: the chunked recurrence's first pass, a workgroup
//! per (chunk, value head): the decays summed within the chunk, the within-chunk products and,
//! for the delta rules, the triangular system's solution. Also the recurrence's parameters,
//! which both passes read (lib/recurrence.wgsl).

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use crate::Result;

/// `Params::rule`: the delta rule, Mamba-2's scan, Kimi's delta rule (a decay a key channel).
pub const DELTA: u32 = 0;
pub const SSD: u32 = 1;
pub const KIMI: u32 = 2;
/// The widest key head the passes hold (the scan's rows an invocation times its row groups).
pub const MAX_KEY_DIM: usize = 256;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub k_heads: u32,
    pub v_heads: u32,
    pub dk: u32,
    pub dv: u32,
    /// `DELTA`, `SSD` or `KIMI`.
    pub rule: u32,
    pub n_chunks: u32,
    pub n_seqs: u32,
    /// The scan's column blocks a value head.
    pub col_blocks: u32,
    /// The chunks of each sequence one scan dispatch walks: `[first_chunk, + chunk_steps)`.
    pub first_chunk: u32,
    pub chunk_steps: u32,
    /// The gate's bounds: Mamba-2's limits on `dt`; for the delta rules the safe gate's lower
    /// bound (below 0) in `gate_lo`, or 0 for the softplus decay.
    pub gate_lo: f32,
    pub gate_hi: f32,
    /// `DeltaNetConfig::key_head_span`.
    pub kh_span: u32,
    pub _pad: [u32; 3],
}

wgsl_kernel!(
    "recurrence_chunk_prepare",
    libs: ["recurrence"],
    bindings: [R, R, R, R, R, R, RW, RW, RW, RW],
    params: Params,
    form: Plain,
);

/// The inputs: `qkv` `[tokens, conv width]`, `a` `[tokens, v_heads]` (Kimi's `[tokens,
/// v_heads * dk]`), the rule's own (the delta rule's `b` `[tokens, v_heads]`, Mamba-2's `D`
/// `[v_heads]`), `A_log` `[v_heads]` and `dt_bias` (as wide as a row of `a`), and the batch's
/// chunk list (`WgpuSequences::chunks`).
pub(crate) struct Inputs<'a> {
    pub qkv: &'a wgpu::Buffer,
    pub a: &'a wgpu::Buffer,
    pub b_or_d: &'a wgpu::Buffer,
    pub a_log: &'a wgpu::Buffer,
    pub dt_bias: &'a wgpu::Buffer,
    pub chunks: &'a wgpu::Buffer,
}

/// The f32 intermediates both passes share: `[tokens, v_heads, width]` each, the widths
/// `CHUNK`, `dv`, `dk` (the delta rules; any buffer for Mamba-2's scan) and 1 or `dk` (Kimi).
pub(crate) struct Scratch<'a> {
    pub products: &'a wgpu::Buffer,
    pub values: &'a wgpu::Buffer,
    pub corrections: &'a wgpu::Buffer,
    pub decays: &'a wgpu::Buffer,
}

pub(crate) fn recurrence_chunk_prepare(
    gpu: &Gpu,
    p: &Params,
    x: &Inputs,
    out: &Scratch,
) -> Result<()> {
    let n = p.n_chunks as u64 * p.v_heads as u64;
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[
            x.qkv,
            x.a,
            x.b_or_d,
            x.a_log,
            x.dt_bias,
            x.chunks,
            out.products,
            out.values,
            out.corrections,
            out.decays,
        ],
        gpu.grid(n),
    )
}
