//! shaders/wgsl/attention_wide.wgsl: attention.wgsl's causal GQA for heads wider than its
//! tiles hold (up to `HD_WIDE`) and sparse attention, one query and head per invocation;
//! launched by `attention::attention`, whose `Params` it shares (and bindings, plus the
//! sparse keys).

use super::super::pipelines::wgsl_kernel;
use super::attention::Params;

wgsl_kernel!(
    "attention_wide",
    libs: ["num", "attention"],
    bindings: [R, R, R, R, R, R, RW],
    params: Params,
    form: Plain,
);
