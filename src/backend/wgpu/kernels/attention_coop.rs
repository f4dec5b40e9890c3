//! shaders/wgsl/attention_coop.wgsl: attention.wgsl's causal GQA on cooperative matrices in
//! wgpu's one-product mode (heads of a multiple of 16 values up to 128, every key of the
//! sequence): q, k and v split into f16 planes by split_rows.wgsl, then one f16 product per
//! score and per weighted value. Launched by `attention::attention` with its `Params`.

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::attention::{Params, Qkv};
use super::split_rows;
use crate::Result;

wgsl_kernel!(
    "attention_coop",
    libs: ["num", "planes", "attention"],
    bindings: [R, R, R, R, R, RW],
    params: Params,
    form: Coop,
);

/// Rows of zeros in each plane after the last token's (the shader's PAD): its key tiles start
/// anywhere and run up to 63 keys past the last query.
const PAD_TOKENS: u32 = 64;

/// Whether this kernel computes attention `p`: in the one-product mode (on cooperative
/// matrices), heads it holds, no sparse key lists.
pub(crate) fn fits(gpu: &Gpu, p: &Params) -> bool {
    gpu.one_product && p.selected == 0 && p.head_dim.is_multiple_of(16) && p.head_dim <= 128
}

pub(crate) fn attention_coop(
    gpu: &Gpu,
    p: &Params,
    qkv: &Qkv,
    layout: &wgpu::Buffer,
    out: &wgpu::Buffer,
) -> Result<()> {
    let planes = |what: &str, x: &wgpu::Buffer, heads: u32| {
        let sp = split_rows::Params {
            rows: (p.tokens + PAD_TOKENS) * heads,
            cols: p.head_dim,
            source_rows: p.tokens * heads,
            high_only: 1,
        };
        let buf = gpu.scratch(
            what,
            split_rows::planes_bytes(sp.rows as usize, sp.cols as usize),
        )?;
        split_rows::split_rows(gpu, &sp, x, &buf.buf)?;
        Ok::<_, crate::Error>(buf)
    };
    let q = planes("attention query planes", qkv.q, p.heads)?;
    let k = planes("attention key planes", qkv.k, p.kv_heads)?;
    let v = planes("attention value planes", qkv.v, p.kv_heads)?;
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[&q.buf, &k.buf, &v.buf, layout, qkv.sinks, out],
        [p.tokens.div_ceil(32), p.heads, 1],
    )
}
