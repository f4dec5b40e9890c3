//! Property-based fuzzing of the parsers a user's files and a client's bytes reach (issue 56):
//! `serve`'s completion bodies, `config.json` with its `quantization_config`, the safetensors
//! header, GGUF headers, run files. Each property mutates seeds from `tests/fuzz-corpus` (and the fixtures,
//! the bundled model, a run file written here) and holds the parser to its contract: a value
//! or a one-line error, never a panic, and what it accepts consistent. proptest shrinks a
//! failure and records it in `fuzz.proptest-regressions`, replayed first on every run.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use quantppl::checkpoint::{Checkpoint, ModelConfig};
use quantppl::data::TextTokenizer;
use quantppl::run::record;
use quantppl::serve::api::{Bounds, MAX_LOGPROBS, parse_completion};
use serde_json::Value;

fn config() -> Config {
    Config {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}

fn one_line(e: &impl std::fmt::Display) -> Result<(), TestCaseError> {
    let e = e.to_string();
    prop_assert!(!e.is_empty() && !e.contains('\n'), "error `{e}`");
    Ok(())
}

/// Edits of a byte string: (position, kind, byte) with kind 0 replace, 1 insert, 2 remove, 3 cut
/// there.
fn byte_edits(max: usize) -> impl Strategy<Value = Vec<(usize, u8, u8)>> {
    prop::collection::vec((any::<usize>(), 0u8..4, any::<u8>()), 1..max)
}

fn mutate(seed: &[u8], edits: &[(usize, u8, u8)], within: usize) -> Vec<u8> {
    let mut v = seed.to_vec();
    for &(at, kind, byte) in edits {
        let span = within.min(v.len()).max(1);
        let i = at % span;
        match kind {
            0 if i < v.len() => v[i] = byte,
            1 => v.insert(i.min(v.len()), byte),
            2 if i < v.len() => {
                v.remove(i);
            }
            3 => v.truncate(i),
            _ => {}
        }
    }
    v
}

/// JSON values of every kind, nested a little, with the numbers that size things.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |f| f.is_finite())
            .prop_map(Value::from),
        prop::sample::select(vec![0i64, 1, -1, 2, 3, 64, 4096, 1 << 31, 1 << 62])
            .prop_map(Value::from),
        "[a-z_0-9]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,10}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn corpus(dir: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz-corpus")
        .join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

fn tokenizer() -> &'static TextTokenizer {
    static T: OnceLock<TextTokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/stories260K-w4a16-channel");
        TextTokenizer::from_model_dir(&dir).unwrap()
    })
}

fn check_completion(body: &[u8]) -> Result<(), TestCaseError> {
    let bounds = Bounds {
        max_prompts: 8,
        max_response: 1 << 20,
        ..Bounds::model(512, 64)
    };
    match parse_completion(body, tokenizer(), &bounds) {
        Err(e) => {
            prop_assert!(e.status == 400 || e.status == 413, "status {}", e.status);
            prop_assert!(e.param.is_some(), "no field named: {}", e.message);
            one_line(&e.message)?;
        }
        Ok(c) => {
            prop_assert!(c.logprobs.unwrap_or(0) <= MAX_LOGPROBS);
            prop_assert!(c.max_tokens <= 1 && c.prompts.len() <= 8);
            for p in &c.prompts {
                prop_assert!(!p.is_empty() && p.len() <= 64);
                prop_assert!(p.iter().all(|&id| id < 512));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// `serve`'s completion bodies, their bytes edited.
    #[test]
    fn completion_bodies_with_edited_bytes(seed in any::<usize>(), edits in byte_edits(8)) {
        let seeds = corpus("requests");
        let seed = &seeds[seed % seeds.len()];
        check_completion(&mutate(seed, &edits, usize::MAX))?;
    }

    /// `serve`'s completion bodies, their fields replaced by values of every kind.
    #[test]
    fn completion_bodies_with_replaced_fields(
        seed in any::<usize>(),
        edits in prop::collection::vec((any::<usize>(), json_value()), 1..4),
    ) {
        let seeds = corpus("requests");
        let mut body: Value = serde_json::from_slice(&seeds[seed % seeds.len()]).unwrap();
        let keys = ["prompt", "echo", "logprobs", "max_tokens", "temperature", "n", "stream"];
        for (k, v) in edits {
            body[keys[k % keys.len()]] = v;
        }
        check_completion(&serde_json::to_vec(&body).unwrap())?;
    }

    /// `config.json` of every fixture, a key (or a key one level down) replaced by a value of
    /// every kind: a config, or one line.
    #[test]
    fn configs_with_replaced_values(
        seed in any::<usize>(),
        edits in prop::collection::vec((any::<usize>(), any::<usize>(), json_value()), 1..4),
    ) {
        let dirs = common::config_dirs();
        let dir = &dirs[seed % dirs.len()];
        let mut json: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        for (k, k2, v) in edits {
            let keys: Vec<String> = json.as_object().unwrap().keys().cloned().collect();
            let key = &keys[k % keys.len()];
            match json[key].as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()) {
                Some(inner) if !inner.is_empty() && k2 % 2 == 0 => {
                    json[key][&inner[k2 % inner.len()]] = v;
                }
                _ => json[key] = v,
            }
        }
        match ModelConfig::from_json(&json) {
            Err(e) => one_line(&e)?,
            Ok(c) => {
                prop_assert_eq!(c.layer_types.len(), c.num_layers);
                prop_assert!(c.head_dim > 0 && c.num_kv_heads > 0);
                prop_assert!(c.num_heads % c.num_kv_heads == 0);
            }
        }
        let path = dir.join("config.json");
        if let Err(e) = quantppl::checkpoint::QuantConfig::from_config(&json, &path) {
            one_line(&e)?;
        }
    }

    /// The bundled model's safetensors header, its bytes edited: the checkpoint opens and
    /// every linear reads, or one line.
    #[test]
    fn safetensors_headers_with_edited_bytes(edits in byte_edits(6), case in any::<u32>()) {
        let src = common::fixture("stories260K-w4a16-channel");
        let weights = std::fs::read(src.join("model.safetensors")).unwrap();
        let header = 8 + u64::from_le_bytes(weights[..8].try_into().unwrap()) as usize;
        let dir = common::writable_copy(&src, &format!("fuzz-st-{}", case % 4));
        std::fs::write(dir.join("model.safetensors"), mutate(&weights, &edits, header)).unwrap();
        let opened = Checkpoint::open(&dir).and_then(|ckpt| {
            for m in ckpt.layers.iter().flat_map(|l| l.linears()) {
                ckpt.linear(m)?;
            }
            Ok(())
        });
        if let Err(e) = opened {
            one_line(&e)?;
        }
    }

    /// A GGUF fixture's header (metadata and tensor table), its bytes edited: the model
    /// opens and every linear decodes, or one line.
    #[test]
    fn gguf_headers_with_edited_bytes(
        edits in byte_edits(6),
        seed in any::<usize>(),
        case in any::<u32>(),
    ) {
        let dirs = common::gguf_dirs();
        let src = dirs[seed % dirs.len()].join("model.gguf");
        let bytes = std::fs::read(&src).unwrap();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-gguf");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("damaged-{}.gguf", case % 4));
        // The header ends where the first tensor's data begins (about 10 KB in).
        std::fs::write(&file, mutate(&bytes, &edits, 16 << 10)).unwrap();
        let opened = Checkpoint::open(&file).and_then(|ckpt| {
            for m in ckpt.layers.iter().flat_map(|l| l.linears()) {
                ckpt.linear(m)?.dequantize()?;
            }
            Ok(())
        });
        if let Err(e) = opened {
            one_line(&e)?;
        }
    }

    /// A run file written by `eval --resume`, its bytes edited: the records it wrote, or one
    /// line.
    #[test]
    fn run_files_with_edited_bytes(edits in byte_edits(6), case in any::<u32>()) {
        let (original, _) = run_file();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-records");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("damaged-{}.qpr", case % 4));
        std::fs::write(&file, mutate(original, &edits, usize::MAX)).unwrap();
        match record::read::<f32>(&file) {
            Err(e) => one_line(&e)?,
            Ok(c) => prop_assert!(c.records.len() <= 3),
        }
    }
}

/// A 3-window run file of the bundled model (its bytes and path), written once.
fn run_file() -> &'static (Vec<u8>, PathBuf) {
    static FILE: OnceLock<(Vec<u8>, PathBuf)> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-run-file");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("run.qpr");
        common::write_run_file(&file);
        (std::fs::read(&file).unwrap(), file)
    })
}
