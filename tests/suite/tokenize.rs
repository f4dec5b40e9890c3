//! Tokenization must reproduce Python `tokenizers` id for id: expected ids come from the
//! fixture files (generated with tokenizers 0.23.3), never from this code.

use std::path::Path;

use quantppl::data::{TextTokenizer, TextView, load_text};

use crate::common;

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| u32::try_from(x.as_u64().unwrap()).unwrap())
        .collect()
}

fn wiki_text() -> String {
    load_text(&common::wiki_test_raw(), TextView::Raw).unwrap()
}

#[test]
fn expected_encodings() {
    let expected = read_json(&common::fixtures_dir().join("tokenizers/EXPECTED_ENCODINGS.json"));
    let samples: Vec<&str> = expected["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let text = wiki_text();
    let tokenizers = expected["tokenizers"].as_object().unwrap();
    assert!(!tokenizers.is_empty());
    for (name, exp) in tokenizers {
        // stories260K is a bundled model, the others live under tokenizers/.
        let dir = [
            common::fixtures_dir().join("tokenizers").join(name),
            common::fixture(name),
        ]
        .into_iter()
        .find(|d| d.join("tokenizer.json").is_file())
        .unwrap_or_else(|| panic!("no tokenizer.json for {name}"));
        let tok = TextTokenizer::from_model_dir(&dir).unwrap();
        assert_eq!(
            tok.vocab_size() as u64,
            exp["vocab_size_with_added"].as_u64().unwrap(),
            "{name}"
        );
        for (special, key) in [
            (true, "samples_add_special_tokens_true"),
            (false, "samples_add_special_tokens_false"),
        ] {
            for (sample, want) in samples.iter().zip(exp[key].as_array().unwrap()) {
                assert_eq!(
                    tok.encode(sample, special).unwrap(),
                    ids(want),
                    "{name} {sample:?}"
                );
            }
        }
        let started = std::time::Instant::now();
        let n = tok.encode(&text, true).unwrap().len() as u64;
        eprintln!("{name}: whole file in {:?}", started.elapsed());
        assert_eq!(
            n,
            exp["wiki.test.raw_whole_file_token_count_add_special_tokens_true"]
                .as_u64()
                .unwrap(),
            "{name}"
        );
        let with = tok.encode("Hello", true).unwrap();
        let without = tok.encode("Hello", false).unwrap();
        assert_eq!(tok.adds_bos(), with.len() > without.len(), "{name}");
    }
}

#[test]
fn reference_tokenizer_check() {
    let text = wiki_text();
    for dir in ["stories260K", "synth-vocab32k"] {
        let dir = common::fixture(dir);
        let check = &read_json(&dir.join("reference.json"))["tokenizer_check"];
        let tok = TextTokenizer::from_model_dir(&dir).unwrap();
        let t = tok.encode(&text, true).unwrap();
        assert_eq!(t.len() as u64, check["n_tokens"].as_u64().unwrap());
        assert_eq!(t[..16], ids(&check["first16"]));
        assert_eq!(tok.bos_id().map(u64::from), check["bos_token_id"].as_u64());
        assert_eq!(tok.adds_bos(), check["adds_bos"].as_bool().unwrap());
    }
}

/// A GGUF file's own tokenizer (`tokenizer.ggml.*`) gives llama.cpp's ids: gpt2's vocabulary
/// as `convert_hf_to_gguf.py --vocab-only` writes it, under each pre-tokenizer family read
/// (`tokenizer.ggml.pre` rewritten here as the fixture script rewrote it), against
/// `llama-tokenize` of the same file on the first 200 kB of WikiText and a page of other scripts
/// (tests/fixtures/gguf-vocab); and a SentencePiece and a Gemma 4 vocabulary the same way.
#[test]
fn gguf_vocabularies_tokenize_as_llama_cpp() {
    use quantppl::checkpoint::gguf::{GgufFile, Value};
    let dir = common::fixture("gguf-vocab");
    let expected = read_json(&dir.join("ids.json"));
    let bytes = std::fs::read(common::wiki_test_raw()).unwrap();
    let head = &bytes[..200_000];
    let valid = std::str::from_utf8(head).map_or_else(|e| e.valid_up_to(), |s| s.len());
    let scripts = std::fs::read_to_string(dir.join("scripts.txt")).unwrap();
    let text = format!("{}{scripts}", std::str::from_utf8(&head[..valid]).unwrap());
    let text = text.as_str();
    let file = dir.join("gpt2.gguf");
    let original = std::fs::read(&file).unwrap();
    let parsed = GgufFile::parse(&file, &original).unwrap();
    // `tok`'s ids of the text are llama.cpp's `want` (`label` names the vocabulary).
    let same_ids = |label: &str, tok: &TextTokenizer, want: &serde_json::Value| {
        let got = tok.encode(text, true).unwrap();
        let want = ids(want);
        let first = got.iter().zip(&want).position(|(g, w)| g != w);
        assert!(
            got == want,
            "{label}: {} ids against llama.cpp's {}, first difference at {first:?}",
            got.len(),
            want.len()
        );
    };
    let families = expected["families"].as_object().unwrap();
    assert_eq!(families.len(), 12);
    for (pre, want) in families {
        let mut meta: common::gguf::Meta = parsed.metadata.clone().into_iter().collect();
        meta.retain(|(k, _)| k != "tokenizer.ggml.pre");
        meta.push(("tokenizer.ggml.pre".into(), Value::Str(pre.clone())));
        let path =
            std::env::temp_dir().join(format!("quantppl-vocab-{pre}-{}.gguf", std::process::id()));
        std::fs::write(&path, common::gguf::write_gguf(3, &meta, &Vec::new())).unwrap();
        same_ids(pre, &TextTokenizer::from_gguf(&path).unwrap(), want);
        let _ = std::fs::remove_file(&path);
    }
    // A SentencePiece vocabulary with its scores (`tokenizer.ggml.model` `llama`), and Gemma
    // 4's kind (`gemma4`: BPE on raw UTF-8, spaces as U+2581).
    let file_of = |kind: &str| dir.join(expected[kind]["file"].as_str().unwrap());
    for kind in ["sentencepiece", "gemma4"] {
        let tokenizer = TextTokenizer::from_gguf(&file_of(kind)).unwrap();
        same_ids(kind, &tokenizer, &expected[kind]["ids"]);
    }
    let file = file_of("sentencepiece");
    // One score for every piece (a vocabulary converted without its tokenizer.model): llama.cpp
    // merges leftmost first, which ranked merges cannot do: refused, naming the key.
    let original = std::fs::read(&file).unwrap();
    let parsed = GgufFile::parse(&file, &original).unwrap();
    let mut meta: common::gguf::Meta = parsed.metadata.clone().into_iter().collect();
    for (k, v) in meta.iter_mut() {
        if let (true, Value::Array(a)) = (k == "tokenizer.ggml.scores", v) {
            a.iter_mut().for_each(|s| *s = Value::Float(-1000.0));
        }
    }
    let flat =
        std::env::temp_dir().join(format!("quantppl-vocab-flat-{}.gguf", std::process::id()));
    std::fs::write(&flat, common::gguf::write_gguf(3, &meta, &Vec::new())).unwrap();
    let e = TextTokenizer::from_gguf(&flat).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer.ggml.scores") && e.contains("all -1000 equal"),
        "{e}"
    );
    let _ = std::fs::remove_file(&flat);
}
