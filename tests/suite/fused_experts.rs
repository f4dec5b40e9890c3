//! transformers 5 holds a dense mixture's experts fused (`mlp.experts.gate_up_proj`
//! `[E, 2I, H]`, `mlp.experts.down_proj` `[E, H, I]`): the BF16 Qwen3-MoE fixture rewritten
//! that way (its per-expert tensors stacked, bytes unchanged) gives the reference's per-token
//! NLLs, as the per-expert checkpoint does.

use crate::common;

use std::collections::BTreeMap;

use quantppl::backend::cpu::CpuBackend;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

#[test]
fn fused_3d_expert_tensors_read_as_per_expert_linears() {
    let src = common::fixture("synth-qwen3moe-mini");
    // The copy's model.safetensors is replaced below.
    let dir = common::writable_copy(&src, "fused");
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let (layers, experts) = (
        cfg["num_hidden_layers"].as_u64().unwrap() as usize,
        cfg["num_experts"].as_u64().unwrap() as usize,
    );
    let get = |n: &str| st.tensor(n).unwrap();
    let mut out: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    for (name, t) in st.tensors() {
        if !name.contains(".experts.") {
            out.insert(name, (t.shape().to_vec(), t.data().to_vec()));
        }
    }
    for l in 0..layers {
        let p = format!("model.layers.{l}.mlp.experts");
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        let [i, h] = get(&format!("{p}.0.gate_proj.weight")).shape()[..] else {
            panic!("2D expert weight")
        };
        for e in 0..experts {
            gate_up.extend_from_slice(get(&format!("{p}.{e}.gate_proj.weight")).data());
            gate_up.extend_from_slice(get(&format!("{p}.{e}.up_proj.weight")).data());
            down.extend_from_slice(get(&format!("{p}.{e}.down_proj.weight")).data());
        }
        out.insert(
            format!("{p}.gate_up_proj"),
            (vec![experts, 2 * i, h], gate_up),
        );
        out.insert(format!("{p}.down_proj"), (vec![experts, h, i], down));
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

    let ckpt = quantppl::checkpoint::Checkpoint::open(&dir).unwrap();
    // On disk only the fused tensors; each expert's projection is a view of them.
    assert!(
        ckpt.store
            .contains("model.layers.0.mlp.experts.gate_up_proj")
    );
    assert!(
        ckpt.store
            .contains("model.layers.2.mlp.experts.7.down_proj.weight")
    );
    assert!(
        !out.keys()
            .any(|n| n.ends_with("experts.0.gate_proj.weight"))
    );
    // The views are not counted twice in the checkpoint's size.
    let on_disk = std::fs::metadata(dir.join("model.safetensors"))
        .unwrap()
        .len();
    assert!(ckpt.store.total_bytes() <= on_disk);
    let r = common::reference(&src);
    let failure = common::rows01_failures_of(&CpuBackend::new(), &dir, &r, 1e-4);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failure.is_none(), "{failure:?}");
}
