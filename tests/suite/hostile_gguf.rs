//! Hostile GGUF files (issue 52's bad input): the Llama GGUF fixture cut at every length of its
//! header and tables, and rewritten with one metadata value, tensor entry or version broken.
//! Each must open and decode, or end in one line naming the file and the key or tensor.

use crate::common;

use std::path::{Path, PathBuf};

use common::gguf::{Meta, Tensors, write_gguf};
use quantppl::checkpoint::Checkpoint;
use quantppl::checkpoint::gguf::{GgmlType, GgufFile, Value};

/// GGUF fixture `name`'s bytes and its parse.
fn original_of(name: &str) -> (Vec<u8>, GgufFile) {
    let path = common::fixture(name).join("model.gguf");
    let bytes = std::fs::read(&path).unwrap();
    let parsed = GgufFile::parse(&path, &bytes).unwrap();
    (bytes, parsed)
}

/// The Llama GGUF fixture's bytes and its parse.
fn original() -> (Vec<u8>, GgufFile) {
    original_of("synth-gguf-llama")
}

/// GGUF fixture `name` as (metadata, tensors) to edit and write again.
fn editable_of(name: &str) -> (Meta, Tensors) {
    let (bytes, parsed) = original_of(name);
    let meta = parsed.metadata.clone().into_iter().collect();
    let ids: Vec<(GgmlType, u32)> = (0..64)
        .filter_map(|i| GgmlType::from_id(i).map(|t| (t, i)))
        .collect();
    let tensors = parsed
        .tensors
        .iter()
        .map(|t| {
            let id = ids.iter().find(|(ty, _)| *ty == t.ty).unwrap().1;
            (
                t.name.clone(),
                t.dims.clone(),
                id,
                bytes[t.start..t.end].to_vec(),
            )
        })
        .collect();
    (meta, tensors)
}

/// The Llama fixture as (metadata, tensors) to edit and write again.
fn editable() -> (Meta, Tensors) {
    editable_of("synth-gguf-llama")
}

/// A directory holding `bytes` as model.gguf beside the fixture's tokenizer.
fn model_dir(tag: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("quantppl-gguf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        common::fixture("synth-gguf-llama").join("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(dir.join("model.gguf"), bytes).unwrap();
    dir
}

/// Opens the model in `dir` and decodes every linear on the CPU.
fn open_and_decode(dir: &Path) -> Result<(), String> {
    let ckpt = Checkpoint::open(dir).map_err(|e| e.to_string())?;
    for m in ckpt.layers.iter().flat_map(|l| l.linears()) {
        ckpt.linear(m)
            .and_then(|l| l.dequantize())
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The file cut at every length of its header and tables (and a little into the data): each
/// is refused in one line naming the file.
#[test]
fn a_gguf_file_cut_anywhere_is_refused_in_one_line() {
    let (bytes, parsed) = original();
    let data_start = parsed.tensors.iter().map(|t| t.start).min().unwrap();
    let dir = model_dir("cut", &[]);
    let file = dir.join("model.gguf");
    let mut refused = 0;
    for len in (0..data_start + 64).chain([bytes.len() - 1]) {
        std::fs::write(&file, &bytes[..len]).unwrap();
        let e = open_and_decode(&dir).expect_err("a cut file is refused");
        assert!(
            !e.contains('\n') && e.contains("model.gguf"),
            "cut at {len}: {e}"
        );
        refused += 1;
    }
    println!("{refused} cut GGUF files refused with a one-line error");
    let _ = std::fs::remove_dir_all(&dir);
}

/// One broken value, entry or version at a time, each through the binary: one line naming it.
#[test]
fn broken_gguf_files_are_refused_naming_what_is_wrong() {
    type Edit = Box<dyn Fn(&mut Meta, &mut Tensors, &mut u32)>;
    let set = |key: &'static str, v: Value| -> Edit {
        Box::new(move |meta, _, _| {
            meta.retain(|(k, _)| k != key);
            meta.push((key.to_string(), v.clone()));
        })
    };
    let cases: Vec<(Edit, &[&str])> = vec![
        (
            Box::new(|_, _, version| *version = 1),
            &["GGUF version", "1"],
        ),
        (
            set("general.architecture", Value::Str("mamba".into())),
            &["GGUF architecture", "mamba"],
        ),
        (
            set("llama.block_count", Value::Str("2".into())),
            &["llama.block_count", "not a count"],
        ),
        (
            Box::new(|meta, _, _| meta.retain(|(k, _)| k != "llama.embedding_length")),
            &["llama.embedding_length"],
        ),
        // Per-layer key-value heads that differ (zeros mark convolutions in LFM2 alone).
        (
            set(
                "llama.attention.head_count_kv",
                Value::Array(vec![Value::UInt(2), Value::UInt(0)]),
            ),
            &["llama.attention.head_count_kv", "one count for every layer"],
        ),
        // More multi-token-prediction layers than blocks.
        (
            set("llama.nextn_predict_layers", Value::UInt(9)),
            &["llama.nextn_predict_layers", "9"],
        ),
        (
            set("general.alignment", Value::UInt(3)),
            &["general.alignment"],
        ),
        (Box::new(|_, t, _| t[3].2 = 99), &["ggml type", "99"]),
        // Q8_K (id 15) blocks of the right size: read, then refused where decoded.
        (
            Box::new(|_, t, _| {
                let i = t
                    .iter()
                    .position(|x| x.0 == "blk.0.ffn_down.weight")
                    .unwrap();
                let (rows, cols) = (t[i].1[1], t[i].1[0]);
                t[i].2 = 15;
                t[i].3 = vec![0u8; rows * cols / 256 * 292];
            }),
            &["blk.0.ffn_down.weight", "Q8_K"],
        ),
        (Box::new(|_, t, _| t[5].1[0] = 33), &["not whole blocks"]),
        (
            Box::new(|_, t, _| {
                let extra = ("rope_freqs.weight".to_string(), vec![32], 0, vec![0u8; 128]);
                t.push(extra);
            }),
            &["rope_freqs.weight"],
        ),
        // A long LongRoPE table without its short one.
        (
            Box::new(|_, t, _| {
                let ones = 1f32.to_le_bytes().repeat(32);
                t.push(("rope_factors_long.weight".to_string(), vec![32], 0, ones));
            }),
            &["rope_factors_short.weight", "rope_factors_long.weight"],
        ),
        (
            Box::new(|_, t, _| {
                let dup = t[2].clone();
                t.push(dup);
            }),
            &["appears twice"],
        ),
    ];
    for (i, (edit, needles)) in cases.iter().enumerate() {
        let (mut meta, mut tensors) = editable();
        let mut version = 3;
        edit(&mut meta, &mut tensors, &mut version);
        let dir = model_dir(
            &format!("broken-{i}"),
            &write_gguf(version, &meta, &tensors),
        );
        let mut wanted: Vec<&str> = needles.to_vec();
        wanted.push("model.gguf");
        common::fails_with(
            &[
                "eval",
                "--backend",
                "cpu",
                "--ctx",
                "32",
                "--rows",
                "1",
                "--model",
                dir.to_str().unwrap(),
            ],
            &wanted,
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    // The writer itself: the unchanged tables written again run.
    let (meta, tensors) = editable();
    let dir = model_dir("rewritten", &write_gguf(3, &meta, &tensors));
    open_and_decode(&dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// DeepSeek-V2's softmax routing, and a latent attention whose `kv_b_proj` lacks its value
/// half: each refused in one line naming the key or the tensors.
#[test]
fn deepseek2_files_that_cannot_be_read_are_refused_naming_why() {
    type Edit = Box<dyn Fn(&mut Meta, &mut Tensors)>;
    let cases: Vec<(Edit, &[&str])> = vec![
        (
            Box::new(|meta, _| {
                let key = "deepseek2.expert_gating_func";
                meta.retain(|(k, _)| k != key);
                meta.push((key.to_string(), Value::UInt(1)));
            }),
            &["deepseek2.expert_gating_func", "softmax"],
        ),
        (
            Box::new(|_, t| t.retain(|x| x.0 != "blk.1.attn_v_b.weight")),
            &["blk.1.attn_k_b.weight + blk.1.attn_v_b.weight", "missing"],
        ),
    ];
    for (i, (edit, needles)) in cases.iter().enumerate() {
        refused_when_edited("synth-gguf-deepseek2", i, edit, needles);
    }
}

/// Fixture `fixture` (a GGUF one) with its tables changed by `edit` (case `i`) is refused by
/// `inspect` in one line naming each of `needles` and the file.
fn refused_when_edited(
    fixture: &str,
    i: usize,
    edit: &dyn Fn(&mut Meta, &mut Tensors),
    needles: &[&str],
) {
    let (mut meta, mut tensors) = editable_of(fixture);
    edit(&mut meta, &mut tensors);
    let dir = model_dir(&format!("{fixture}-{i}"), &write_gguf(3, &meta, &tensors));
    let mut wanted: Vec<&str> = needles.to_vec();
    wanted.push("model.gguf");
    common::fails_with(&["inspect", dir.to_str().unwrap()], &wanted);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tensor's data pointing past the end of the file (its offset moved): one line naming it.
#[test]
fn a_tensor_past_the_end_is_refused_naming_it() {
    let (bytes, parsed) = original();
    let last = parsed.tensors.iter().max_by_key(|t| t.start).unwrap();
    // The offset field of the last entry lies 8 bytes before the data section's padding:
    // simplest to cut the file so that its data ends early.
    let dir = model_dir("past-end", &bytes[..last.end - 1]);
    common::fails_with(
        &["inspect", dir.to_str().unwrap()],
        &[&last.name, "past the end"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The hybrids' layer layout unreadable: Qwen3.5 without its recurrent-layer flags or with a
/// value width its value heads do not divide, Nemotron-H with two MLP widths, Qwen3-Next with
/// value heads its key heads do not divide: each refused in one line naming the keys.
/// An edit of a fixture's tables.
type Edit = Box<dyn Fn(&mut Meta, &mut Tensors)>;

/// Metadata `key` set to `value`.
fn set(key: &'static str, value: Value) -> Edit {
    Box::new(move |meta: &mut Meta, _: &mut Tensors| {
        meta.retain(|(k, _)| k != key);
        meta.push((key.to_string(), value.clone()));
    })
}

fn counts(values: &[u64]) -> Value {
    Value::Array(values.iter().copied().map(Value::UInt).collect())
}

#[test]
fn hybrid_files_that_cannot_be_read_are_refused_naming_why() {
    let cases: Vec<(&str, Edit, &[&str])> = vec![
        (
            "synth-gguf-qwen35",
            Box::new(|meta, _| meta.retain(|(k, _)| k != "qwen35.attention.recurrent_layers")),
            &[
                "qwen35.attention.recurrent_layers",
                "one flag for each of 4 layers",
            ],
        ),
        (
            "synth-gguf-qwen35",
            set("qwen35.ssm.inner_size", Value::UInt(130)),
            &["qwen35.ssm.inner_size", "qwen35.ssm.time_step_rank"],
        ),
        (
            "synth-gguf-nemotron-h",
            set(
                "nemotron_h.feed_forward_length",
                counts(&[0, 384, 0, 256, 0, 384]),
            ),
            &["nemotron_h.feed_forward_length", "one MLP width"],
        ),
        (
            "synth-gguf-qwen3next",
            set("qwen3next.ssm.group_count", Value::UInt(3)),
            &["qwen3next.ssm.time_step_rank", "qwen3next.ssm.group_count"],
        ),
    ];
    for (i, (fixture, edit, needles)) in cases.iter().enumerate() {
        refused_when_edited(fixture, i, edit, needles);
    }
}

/// Gemma 4's layer layout unreadable: no sliding-layer flags, two key-value head counts among
/// the sliding layers, MLP widths that are neither one nor doubled where keys and values are
/// reused, values narrower than the keys: each refused in one line naming the key.
#[test]
fn gemma4_files_that_cannot_be_read_are_refused_naming_why() {
    const PATTERN: &str = "gemma4.attention.sliding_window_pattern";
    let cases: Vec<(Edit, &[&str])> = vec![
        (
            Box::new(|meta, _| meta.retain(|(k, _)| k != PATTERN)),
            &[PATTERN, "missing"],
        ),
        (
            set(
                "gemma4.attention.head_count_kv",
                counts(&[2, 1, 1, 2, 2, 1]),
            ),
            &[
                "gemma4.attention.head_count_kv",
                "one count for the sliding layers",
            ],
        ),
        (
            set(
                "gemma4.feed_forward_length",
                counts(&[256, 256, 256, 256, 384, 512]),
            ),
            &["gemma4.feed_forward_length", "twice that in the 2 layers"],
        ),
        (
            set("gemma4.attention.value_length", Value::UInt(48)),
            &["gemma4.attention.value_length", "48"],
        ),
    ];
    for (i, (edit, needles)) in cases.iter().enumerate() {
        refused_when_edited("synth-gguf-gemma4", i, edit, needles);
    }
}

/// A Ministral 3 file whose queries are scaled by position (`attention.temperature_scale`)
/// over a context that is not YaRN's is refused naming both keys.
#[test]
fn ministral3_files_without_yarn_are_refused_naming_the_keys() {
    let scale = "mistral3.attention.temperature_scale";
    refused_when_edited(
        "synth-gguf-ministral3",
        0,
        &set("mistral3.rope.scaling.type", Value::Str("linear".into())),
        &[scale, "mistral3.rope.scaling.type"],
    );
}

/// Sparse-attention files whose indexer cannot be read: DeepSeek-V3.2 without its top k or
/// with a layer that reuses another's selection (DeepSeek-V3.2 has none), GLM-5 with a flag
/// list shorter than its layers: each refused in one line naming the key.
#[test]
fn sparse_attention_files_that_cannot_be_read_are_refused_naming_why() {
    let cases: Vec<(&str, Edit, &[&str])> = vec![
        (
            "synth-gguf-deepseek32",
            Box::new(|meta, _| meta.retain(|(k, _)| k != "deepseek32.attention.indexer.top_k")),
            &["deepseek32.attention.indexer.top_k", "no "],
        ),
        (
            "synth-gguf-deepseek32",
            set(
                "deepseek32.attention.indexer.types",
                Value::Array(vec![Value::Bool(true), Value::Bool(false)]),
            ),
            &["deepseek32.attention.indexer.types", "reuse"],
        ),
        (
            "synth-gguf-glm-dsa",
            set(
                "glm-dsa.attention.indexer.types",
                Value::Array(vec![Value::Bool(true), Value::Bool(false)]),
            ),
            &[
                "glm-dsa.attention.indexer.types",
                "one flag for each of 3 layers",
            ],
        ),
    ];
    for (i, (fixture, edit, needles)) in cases.iter().enumerate() {
        refused_when_edited(fixture, i, edit, needles);
    }
}

/// Mistral 4's query scale as a file from Mistral's own checkpoint format states it
/// (`attention.temperature_scale` and `temperature_length`, YaRN's original context) is read;
/// a length other than YaRN's, or sigmoid routing, is refused naming the key. (The fixture,
/// converted from transformers' layout, states none: its queries are not scaled.)
#[test]
fn mistral4_files_read_the_query_scale_and_refuse_what_transformers_cannot_hold() {
    const SCALE: &str = "mistral4.attention.temperature_scale";
    const LENGTH: &str = "mistral4.attention.temperature_length";
    let (mut meta, tensors) = editable_of("synth-gguf-mistral4");
    meta.push((SCALE.to_string(), Value::Float(0.5)));
    meta.push((LENGTH.to_string(), Value::UInt(64)));
    let dir = model_dir("mistral4-scaled", &write_gguf(3, &meta, &tensors));
    let shown = common::succeeds(&["inspect", dir.to_str().unwrap()]);
    assert!(
        shown.contains("queries scaled by 1 + 0.5 ln(1 + floor(pos / 64))"),
        "{shown}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let plain = common::succeeds(&[
        "inspect",
        common::fixture("synth-gguf-mistral4").to_str().unwrap(),
    ]);
    assert!(!plain.contains("queries scaled"), "{plain}");
    let cases: Vec<(Edit, &[&str])> = vec![
        (
            Box::new(|meta, _| {
                meta.push((SCALE.to_string(), Value::Float(0.5)));
                meta.push((LENGTH.to_string(), Value::UInt(32)));
            }),
            &[LENGTH, "32", "64"],
        ),
        (
            set("mistral4.expert_gating_func", Value::UInt(2)),
            &["mistral4.expert_gating_func", "softmax"],
        ),
    ];
    for (i, (edit, needles)) in cases.iter().enumerate() {
        refused_when_edited("synth-gguf-mistral4", i, edit, needles);
    }
}

/// A DeepSeek-style file without `expert_weights_norm` (the converter writes it only when
/// true) does not renormalize its top k, as llama.cpp's graph reads it; with it, it does.
#[test]
fn deepseek_style_files_renormalize_the_top_k_only_where_the_file_says() {
    const NORM: &str = "deepseek2.expert_weights_norm";
    let fixture = common::fixture("synth-gguf-deepseek2");
    let stated = common::succeeds(&["inspect", fixture.to_str().unwrap()]);
    assert!(stated.contains("renormalised"), "{stated}");
    let (mut meta, tensors) = editable_of("synth-gguf-deepseek2");
    meta.retain(|(k, _)| k != NORM);
    let dir = model_dir("deepseek2-no-norm", &write_gguf(3, &meta, &tensors));
    let unstated = common::succeeds(&["inspect", dir.to_str().unwrap()]);
    assert!(
        unstated.contains("routing:") && !unstated.contains("renormalised"),
        "{unstated}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Bamba file (`granitehybrid` with RoPE over part of each head, whose q/k rows the
/// converter permuted whole) is refused naming the key: llama.cpp rotates other pairs than
/// transformers' Bamba there, and neither reading is the model's.
#[test]
fn bamba_files_are_refused_naming_the_rotated_width() {
    let edit: Edit = Box::new(|meta, _| {
        meta.retain(|(k, _)| {
            k != "granitehybrid.rope.scaling.finetuned" && k != "granitehybrid.rope.dimension_count"
        });
        meta.push((
            "granitehybrid.rope.scaling.finetuned".into(),
            Value::Bool(true),
        ));
        meta.push(("granitehybrid.rope.dimension_count".into(), Value::UInt(32)));
    });
    refused_when_edited(
        "synth-gguf-granite-h",
        0,
        &edit,
        &["granitehybrid.rope.dimension_count", "32 of 64", "Bamba"],
    );
}
