//! One launcher per WGSL kernel, in the file of the kernel's name: its `#[repr(C)]` Params
//! (mirroring `struct Params` at the top of the shader), its declaration (`wgsl_kernel!`: the
//! libraries it uses, its bindings), its dispatch shape, and one function that records it.

pub mod act_quant;
pub mod add;
pub mod attention;
pub mod attention_coop;
pub mod causal_conv;
pub mod copy_columns;
pub mod gated_act;
pub mod gated_rms_norm;
pub mod gather;
pub mod index_top_k;
pub mod kld_accum;
pub mod layer_norm;
pub mod lse_update;
pub mod matmul;
pub mod matmul_dense;
pub mod matmul_fp4;
pub mod matmul_packed_int;
pub mod matmul_unpacked8;
pub mod mix_streams;
pub mod pool_windows;
pub mod rank_update;
pub mod recurrence_chunk_prepare;
pub mod recurrence_chunk_scan;
pub mod rms_norm;
pub mod rope;
pub mod scale_columns;
pub mod scatter_add;
pub mod softcap;
pub mod sparse_attention;
pub mod split_gemm;
pub mod split_rows;

/// Threads per workgroup of the elementwise and row kernels.
pub(crate) const WG: u64 = 256;
