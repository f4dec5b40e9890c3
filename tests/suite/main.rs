//! The integration tests as one binary (one link, not one per file), a module per concern.
//! The conformance suite (one instance per backend) and the CUDA kernels' compilation keep
//! binaries of their own: they report what this machine lacks as ignored (harness = false).

#[path = "../common/mod.rs"]
mod common;

mod architectures;
mod base_states;
mod cli;
mod compare;
mod data_sources;
mod dequant;
mod faults;
mod fixtures_ppl;
mod fused_experts;
mod fuzz;
mod hostile_config;
mod hostile_data;
mod hostile_files;
mod hostile_gguf;
mod hostile_records;
mod hostile_requests;
mod hybrids;
mod multi_device;
mod plan_spec;
mod resume;
mod serve;
mod task;
mod tokenize;
