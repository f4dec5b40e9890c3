//! One wrapper per WGSL kernel: its `#[repr(C)]` Params (mirroring `struct Params` at the top of
//! the shader), its dispatch shape, and one function that records it.

pub mod act_quant;
pub mod add;
pub mod attention;
pub mod copy_columns;
pub mod gated_act;
pub mod gather;
pub mod kld_accum;
pub mod lse_update;
pub mod matmul;
pub mod matmul_dense;
pub mod matmul_fp4;
pub mod matmul_packed_int;
pub mod matmul_unpacked8;
pub mod rms_norm;
pub mod rope;
pub mod scatter_add;
pub mod softcap;
pub mod split_rows;

use super::pipelines::KernelId;

/// Threads per workgroup of the elementwise and row kernels.
pub(crate) const WG: u64 = 256;

/// Size in bytes of kernel `id`'s uniform `Params` (its Rust mirror in this folder), which
/// the naga tests hold against the WGSL struct.
pub fn params_size(id: KernelId) -> usize {
    use std::mem::size_of;
    match id {
        KernelId::MatmulDense(_) => size_of::<matmul_dense::Params>(),
        KernelId::MatmulPackedInt(_) => size_of::<matmul_packed_int::Params>(),
        KernelId::MatmulFp4(_) => size_of::<matmul_fp4::Params>(),
        KernelId::MatmulUnpacked8(_) => size_of::<matmul_unpacked8::Params>(),
        KernelId::ActQuant => size_of::<act_quant::Params>(),
        KernelId::RmsNorm => size_of::<rms_norm::Params>(),
        KernelId::Rope => size_of::<rope::Params>(),
        KernelId::Attention | KernelId::AttentionWide => size_of::<attention::Params>(),
        KernelId::GatedAct => size_of::<gated_act::Params>(),
        KernelId::Softcap => size_of::<softcap::Params>(),
        KernelId::Add => size_of::<add::Params>(),
        KernelId::Gather => size_of::<gather::Params>(),
        KernelId::ScatterAdd => size_of::<scatter_add::Params>(),
        KernelId::CopyColumns => size_of::<copy_columns::Params>(),
        KernelId::LseUpdate => size_of::<lse_update::Params>(),
        KernelId::KldAccum => size_of::<kld_accum::Params>(),
        KernelId::SplitRows => size_of::<split_rows::Params>(),
        KernelId::SplitGemm(_) => size_of::<matmul::Shape>(),
    }
}
