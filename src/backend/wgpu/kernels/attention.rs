//! shaders/wgsl/attention.wgsl: causal GQA with an online softmax, `TileConfig::attn_qb` queries
//! of one head per workgroup (heads wider than its HD_MAX in slices of output columns, a
//! workgroup each); sparse attention on sparse_attention.wgsl (declared in sparse_attention.rs,
//! launched here with the same arguments), one query and head per workgroup; in the one-product
//! mode on attention_coop.wgsl where it holds the heads.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::{HD_MAX, HD_SPARSE, HD_WIDE, wgsl_kernel};
use super::{attention_coop, sparse_attention};
use crate::{Error, Result};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub tokens: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub scale: f32,
    /// 0: no soft-capping.
    pub softcap: f32,
    /// 0: no sliding window.
    pub window: u32,
    /// 1: `sinks` holds one logit per head.
    pub has_sinks: u32,
    /// Sparse attention (sparse_attention.wgsl): each query's key positions, `selected` a row
    /// of `Qkv::keys`; 0: every key.
    pub selected: u32,
    /// The width of each value head (sparse attention; `head_dim` elsewhere).
    pub v_dim: u32,
    pub _pad: [u32; 2],
}

wgsl_kernel!(
    "attention",
    libs: ["num", "attention"],
    bindings: [R, R, R, R, R, RW],
    params: Params,
    form: Plain,
);

pub(crate) struct Qkv<'a> {
    pub q: &'a wgpu::Buffer,
    pub k: &'a wgpu::Buffer,
    pub v: &'a wgpu::Buffer,
    /// The heads' sink logits (any buffer of at least `heads` floats when `has_sinks` is 0).
    pub sinks: &'a wgpu::Buffer,
    /// Sparse attention's key positions (any buffer when `selected` is 0).
    pub keys: &'a wgpu::Buffer,
}

pub(crate) fn attention(
    gpu: &Gpu,
    p: &Params,
    qkv: &Qkv,
    layout: &wgpu::Buffer,
    out: &wgpu::Buffer,
) -> Result<()> {
    let d = p.head_dim as usize;
    if p.selected > 0 {
        let v = p.v_dim as usize;
        if d == 0
            || d > HD_SPARSE
            || !d.is_multiple_of(4)
            || v == 0
            || v > HD_WIDE
            || !v.is_multiple_of(4)
        {
            return Err(Error::unsupported(
                "wgpu sparse attention",
                "head_dim",
                format!("{d} keys, {v} values (multiples of 4 up to {HD_SPARSE} and {HD_WIDE})"),
            ));
        }
        // One workgroup per (query, head).
        let n = p.tokens as u64 * p.heads as u64;
        let buffers = [qkv.q, qkv.k, qkv.v, layout, qkv.sinks, qkv.keys, out];
        return gpu.run(
            &sparse_attention::KERNEL,
            bytemuck::bytes_of(p),
            &buffers,
            gpu.grid(n),
        );
    }
    if d == 0 || d > HD_WIDE || (d > HD_MAX && !d.is_multiple_of(4)) {
        return Err(Error::unsupported(
            "wgpu attention",
            "head_dim",
            format!("{d} (the kernels hold up to {HD_MAX}, and multiples of 4 up to {HD_WIDE})"),
        ));
    }
    if attention_coop::fits(gpu, p) {
        return attention_coop::attention_coop(gpu, p, qkv, layout, out);
    }
    // Heads wider than HD_MAX: a workgroup per slice of HD_MAX output columns.
    let slices = d.div_ceil(HD_MAX) as u32;
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[qkv.q, qkv.k, qkv.v, layout, qkv.sinks, out],
        [p.tokens.div_ceil(gpu.tiles.attn_qb), p.heads, slices],
    )
}
