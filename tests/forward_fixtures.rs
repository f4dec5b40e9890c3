//! The CPU reference backend against transformers + compressed-tensors (float32) on every
//! fixture: per-token NLL of exl3 rows 0 and 1, read from each reference.json.

mod common;

use quantppl::backend::cpu::CpuBackend;

#[test]
fn cpu_per_token_nll_matches_every_fixture_reference() {
    let backend = CpuBackend::new();
    let failures = common::rows01_failures(&backend, 1e-4);
    assert!(failures.is_empty(), "{failures:#?}");
}
