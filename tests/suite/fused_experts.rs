//! transformers 5 holds a dense mixture's experts fused (`mlp.experts.gate_up_proj`
//! `[E, 2I, H]`, `mlp.experts.down_proj` `[E, H, I]`; Nemotron-H's ungated
//! `mixer.experts.up_proj` `[E, I, H]`): the BF16 Qwen3-MoE and Nemotron-H fixtures rewritten
//! that way (their per-expert tensors stacked, bytes unchanged) give the reference's per-token
//! NLLs, as the per-expert checkpoints do.

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use quantppl::backend::cpu::CpuBackend;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// A copy of fixture `name` whose experts under `{layer}.{block}.experts` are stacked: each
/// `(stack, parts)` of `stacks` the experts' `parts` one after another per expert, then the
/// next expert. Returns the copy and the stacked tensors' names.
fn stacked_copy(name: &str, block: &str, stacks: &[(&str, &[&str])]) -> (PathBuf, Vec<String>) {
    let src = common::fixture(name);
    // The copy's model.safetensors is replaced below.
    let dir = common::writable_copy(&src, &format!("fused-{name}"));
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    let mut prefixes = std::collections::BTreeSet::new();
    for (n, t) in st.tensors() {
        match n.split_once(&format!(".{block}.experts.")) {
            Some((layer, _)) => {
                prefixes.insert(format!("{layer}.{block}.experts"));
            }
            None => {
                out.insert(n, (t.shape().to_vec(), t.data().to_vec()));
            }
        }
    }
    let mut stacked = Vec::new();
    for p in prefixes {
        let experts = (0..)
            .take_while(|e| {
                st.tensor(&format!("{p}.{e}.{}.weight", stacks[0].1[0]))
                    .is_ok()
            })
            .count();
        for (stack, parts) in stacks {
            let (mut data, mut rows, mut cols) = (Vec::new(), 0, 0);
            for e in 0..experts {
                for part in *parts {
                    let t = st.tensor(&format!("{p}.{e}.{part}.weight")).unwrap();
                    if e == 0 {
                        rows += t.shape()[0];
                        cols = t.shape()[1];
                    }
                    data.extend_from_slice(t.data());
                }
            }
            stacked.push(format!("{p}.{stack}"));
            out.insert(format!("{p}.{stack}"), (vec![experts, rows, cols], data));
        }
    }
    let views: Vec<(String, TensorView)> = out
        .iter()
        .map(|(n, (shape, data))| {
            (
                n.clone(),
                TensorView::new(Dtype::BF16, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    (dir, stacked)
}

/// `dir`, stacked from fixture `name`, reads its experts as views and gives the reference.
fn reads_as_the_reference(name: &str, dir: &PathBuf, stacked: &[String], one_expert: &str) {
    let ckpt = quantppl::checkpoint::Checkpoint::open(dir).unwrap();
    // On disk only the stacked tensors; each expert's projection is a view of them.
    assert!(!stacked.is_empty() && stacked.iter().all(|n| ckpt.store.contains(n)));
    assert!(ckpt.store.contains(one_expert), "{one_expert}");
    // The views are not counted twice in the checkpoint's size.
    let on_disk = std::fs::metadata(dir.join("model.safetensors"))
        .unwrap()
        .len();
    assert!(ckpt.store.total_bytes() <= on_disk);
    let r = common::reference(&common::fixture(name));
    let failure = common::rows01_failures_of(&CpuBackend::new(), dir, &r, 1e-4);
    let _ = std::fs::remove_dir_all(dir);
    assert!(failure.is_none(), "{failure:?}");
}

#[test]
fn fused_3d_expert_tensors_read_as_per_expert_linears() {
    let name = "synth-qwen3moe-mini";
    let stacks: &[(&str, &[&str])] = &[
        ("gate_up_proj", &["gate_proj", "up_proj"]),
        ("down_proj", &["down_proj"]),
    ];
    let (dir, stacked) = stacked_copy(name, "mlp", stacks);
    let one = "model.layers.2.mlp.experts.7.down_proj.weight";
    reads_as_the_reference(name, &dir, &stacked, one);
}

#[test]
fn nemotron_h_stacked_ungated_experts_read_as_per_expert_linears() {
    let name = "synth-nemotron-h-moe-mini";
    let stacks: &[(&str, &[&str])] = &[("up_proj", &["up_proj"]), ("down_proj", &["down_proj"])];
    let (dir, stacked) = stacked_copy(name, "mixer", stacks);
    let one = "backbone.layers.5.mixer.experts.7.up_proj.weight";
    reads_as_the_reference(name, &dir, &stacked, one);
}
