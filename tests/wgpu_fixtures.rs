//! The wgpu backend against transformers' float32 references on every fixture: per-token NLL
//! of exl3 rows 0 and 1 within 1e-3 (weight-only), mean within the fixture's PPL tolerance
//! (activation-quantized). Without a GPU adapter the test says so and passes.

mod common;

use quantppl::backend::wgpu::WgpuBackend;

#[test]
fn wgpu_per_token_nll_matches_every_fixture_reference() {
    if quantppl::backend::wgpu::list_adapters().is_empty() {
        println!("skipping: no wgpu adapter with compute shaders on this machine");
        return;
    }
    let backend = WgpuBackend::new(None).expect("wgpu backend");
    println!("{}", quantppl::backend::Backend::name(&backend));
    let failures = common::rows01_failures(&backend, 1e-3);
    println!(
        "peak device memory: {:?} bytes",
        quantppl::backend::Backend::peak_memory_bytes(&backend)
    );
    assert!(failures.is_empty(), "{failures:#?}");
}
