//! The CPU reference backend against transformers + compressed-tensors (float32) on every
//! fixture: per-token NLL of exl3 rows 0 and 1, read from each reference.json.

mod common;

use quantppl::backend::SeqLayout;
use quantppl::backend::cpu::CpuBackend;
use quantppl::checkpoint::Checkpoint;
use quantppl::model::Model;

#[test]
fn cpu_per_token_nll_matches_every_fixture_reference() {
    let backend = CpuBackend::new();
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
        failures.extend(common::judge_rows01(&name, &r, &got, &want, 1e-4));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
