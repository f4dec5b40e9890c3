//! shaders/wgsl/sparse_attention.wgsl: attention over the keys each query's list names
//! (DeepSeek sparse attention, branched layouts), one query and head per workgroup, values
//! as narrow as `Params::v_dim`; launched by `attention::attention`, whose `Params` it shares
//! (and bindings, plus the key lists).

use super::super::pipelines::wgsl_kernel;
use super::attention::Params;

wgsl_kernel!(
    "sparse_attention",
    libs: ["num", "attention"],
    bindings: [R, R, R, R, R, R, RW],
    params: Params,
    form: Plain,
);
