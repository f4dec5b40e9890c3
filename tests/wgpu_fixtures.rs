//! The wgpu backend against transformers' float32 references on every fixture: per-token NLL
//! of exl3 rows 0 and 1 within 1e-3 (weight-only), mean within the fixture's PPL tolerance
//! (activation-quantized). Without a GPU adapter the test says so and passes.

mod common;

use quantppl::backend::SeqLayout;
use quantppl::backend::wgpu::WgpuBackend;
use quantppl::checkpoint::Checkpoint;
use quantppl::model::Model;

#[test]
fn wgpu_per_token_nll_matches_every_fixture_reference() {
    if quantppl::backend::wgpu::list_adapters().is_empty() {
        println!("skipping: no wgpu adapter with compute shaders on this machine");
        return;
    }
    let backend = WgpuBackend::new(None).expect("wgpu backend");
    println!("{}", quantppl::backend::Backend::name(&backend));
    let mut failures = Vec::new();
    for dir in common::reference_dirs() {
        let r = common::reference(&dir);
        let ckpt = Checkpoint::open(&dir).expect("open fixture");
        let model = Model::load(&backend, &ckpt, 256, &|_, _| {}).expect("load");
        let (ids, targets, want) = common::rows01(&r);
        let layout = SeqLayout::from_lengths([256, 256]);
        let got = model
            .nll(&backend, &ids, &layout, &targets)
            .expect("forward");
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        failures.extend(common::judge_rows01(&name, &r, &got, &want, 1e-3));
    }
    println!(
        "peak device memory: {:?} bytes",
        quantppl::backend::Backend::peak_memory_bytes(&backend)
    );
    assert!(failures.is_empty(), "{failures:#?}");
}
