//! One wrapper per WGSL kernel: its `#[repr(C)]` Params (mirroring `struct Params` at the top of
//! the shader), its dispatch shape, and one function that records it.

pub mod act_quant;
pub mod add;
pub mod attention;
pub mod gather;
pub mod kld_accum;
pub mod lse_update;
pub mod matmul;
pub mod matmul_dense;
pub mod matmul_nvfp4;
pub mod matmul_packed_int;
pub mod matmul_unpacked8;
pub mod rms_norm;
pub mod rope;
pub mod silu_mul;

/// Threads per workgroup of the elementwise and row kernels.
pub(crate) const WG: u64 = 256;
