//! Config and quantization values of the wrong JSON type or out of range (issue 56, F1 and
//! F10): each is a one-line error naming the key, through the binary where a user meets it
//! (`inspect`), never a panic and never a default taken in silence (a string `rope_theta`
//! used to run as 10,000 and print another model's perplexity).

use crate::common;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

const MODEL: &str = "assets/stories260K-w4a16-channel";

/// A copy of the bundled INT4 checkpoint whose config.json `edit` changed.
fn model_with(tag: &str, edit: impl Fn(&mut Value)) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(MODEL);
    let dir = std::env::temp_dir().join(format!("quantppl-config-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    dir
}

fn weights(config: &mut Value) -> &mut Value {
    &mut config["quantization_config"]["config_groups"]["group_0"]["weights"]
}

/// A change to a config.
type Edit = Box<dyn Fn(&mut Value)>;

#[test]
fn values_of_the_wrong_type_or_range_are_refused_naming_the_key() {
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "theta",
            Box::new(|c| c["rope_theta"] = json!("500000")),
            "rope_theta",
        ),
        (
            "eps",
            Box::new(|c| c["rms_norm_eps"] = json!("1e-5")),
            "rms_norm_eps",
        ),
        (
            "kv",
            Box::new(|c| c["num_key_value_heads"] = json!("4")),
            "num_key_value_heads",
        ),
        (
            "tie",
            Box::new(|c| c["tie_word_embeddings"] = json!("true")),
            "tie_word_embeddings",
        ),
        (
            "eos",
            Box::new(|c| c["eos_token_id"] = json!(-2)),
            "eos_token_id",
        ),
        (
            "mtp",
            Box::new(|c| c["num_nextn_predict_layers"] = json!("1")),
            "num_nextn_predict_layers",
        ),
        (
            "scaling",
            Box::new(|c| c["rope_scaling"] = json!({"rope_type": "linear", "factor": "2"})),
            "factor",
        ),
        (
            "bits",
            Box::new(|c| weights(c)["num_bits"] = json!(4_294_967_300u64)),
            "num_bits",
        ),
        (
            "sym",
            Box::new(|c| weights(c)["symmetric"] = json!("yes")),
            "symmetric",
        ),
        (
            "block",
            Box::new(|c| {
                weights(c)["strategy"] = json!("block");
                weights(c)["block_structure"] = json!([0, 64]);
            }),
            "block_structure",
        ),
        (
            "block-str",
            Box::new(|c| {
                weights(c)["strategy"] = json!("block");
                weights(c)["block_structure"] = json!("0x0");
            }),
            "block_structure",
        ),
    ];
    for (tag, edit, key) in cases {
        let dir = model_with(tag, edit);
        common::fails_with(&["inspect", dir.to_str().unwrap()], &[key]);
        let _ = std::fs::remove_dir_all(&dir);
    }
    // The unchanged copy inspects: the refusals above are the values', not the copy's.
    let dir = model_with("unchanged", |_| {});
    common::succeeds(&["inspect", dir.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The quantizers' own configs (GPTQ, AutoAWQ, native FP8, ModelOpt) read as typed as
/// compressed-tensors': a value of the wrong JSON type, or a module list with an entry that is
/// no name, is refused naming the key instead of falling back to a default (a `dynamic` that
/// was not an object, or an excluded module given as a number, was dropped in silence).
#[test]
fn native_quantization_values_of_the_wrong_type_are_refused_naming_the_key() {
    let cases = [
        (json!({"quant_method": 4}), "quant_method"),
        (
            json!({"quant_method": "gptq", "checkpoint_format": 2}),
            "checkpoint_format",
        ),
        (
            json!({"quant_method": "gptq", "pack_dtype": 32}),
            "pack_dtype",
        ),
        (
            json!({"quant_method": "gptq", "dynamic": ["-:lm_head"]}),
            "dynamic",
        ),
        (json!({"quant_method": "awq", "version": 1}), "version"),
        (
            json!({"quant_method": "awq", "modules_to_not_convert": "lm_head"}),
            "modules_to_not_convert",
        ),
        (
            json!({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": 1}),
            "activation_scheme",
        ),
        (
            json!({"quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head", 7]}),
            "modules_to_not_convert",
        ),
        // An experts' format other than DeepSeek-V4's FP4 (or FP8), and a scale format.
        (
            json!({"quant_method": "fp8", "weight_block_size": [128, 128], "expert_dtype": "fp6"}),
            "expert_dtype",
        ),
        (
            json!({"quant_method": "fp8", "weight_block_size": [128, 128], "expert_dtype": 4}),
            "expert_dtype",
        ),
        (
            json!({"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "e5m2"}),
            "scale_fmt",
        ),
        (
            json!({"quant_method": "modelopt", "quant_algo": ["NVFP4"]}),
            "quant_algo",
        ),
        (
            json!({"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head", null]}),
            "exclude_modules",
        ),
    ];
    for (n, (q, key)) in cases.into_iter().enumerate() {
        let dir = model_with(&format!("native-{n}"), |c| {
            c["quantization_config"] = q.clone()
        });
        common::fails_with(
            &["inspect", dir.to_str().unwrap()],
            &[key, "quantization_config"],
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A config that claims fewer layers than the checkpoint holds (issue 56, F14) would evaluate
/// a truncated model in silence: refused, naming the key and the last layer on disk.
#[test]
fn a_config_with_fewer_layers_than_the_checkpoint_is_refused() {
    let dir = model_with("fewer-layers", |c| {
        let n = c["num_hidden_layers"].as_u64().unwrap();
        c["num_hidden_layers"] = json!(n - 1);
    });
    common::fails_with(
        &["inspect", dir.to_str().unwrap()],
        &["num_hidden_layers", "model.layers.4"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}
