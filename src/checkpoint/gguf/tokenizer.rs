//! The tokenizer a GGUF file describes (`tokenizer.ggml.*`), written as the `tokenizer.json`
//! the `tokenizers` crate reads: llama.cpp's byte-level BPE (`gpt2`: tokens, merges) with the
//! pre-tokenizer regex its `tokenizer.ggml.pre` names (`llama-vocab.cpp`; the families read so
//! far in `PRE_TOKENIZERS`), its SentencePiece (`llama`: tokens and scores, merges ranked by
//! score), or Gemma 4's BPE on raw UTF-8 (`gemma4`), BOS added as llama.cpp adds it.

use serde_json::{Value as Json, json};

use super::{GgufFile, Value};
use crate::{Error, Result};

/// llama.cpp's GPT-2 split (`LLAMA_VOCAB_PRE_TYPE_GPT2`).
const GPT2_SPLIT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// `LLAMA_VOCAB_PRE_TYPE_LLAMA3`: digits in threes.
const LLAMA3_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// `LLAMA_VOCAB_PRE_TYPE_QWEN2`: single digits.
const QWEN2_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// `LLAMA_VOCAB_PRE_TYPE_QWEN35`: Qwen2's split with combining marks kept in words.
const QWEN35_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// `LLAMA_VOCAB_PRE_TYPE_TEKKEN` (Mistral's Tekken): words split before capitals, single
/// digits; llama.cpp's form of the case classes (a letter not `a-z`, a letter not `A-Z`),
/// which every other letter satisfies both ways.
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// `LLAMA_VOCAB_PRE_TYPE_GPT4O` (o200k): Tekken's words with the contractions attached,
/// digits in threes.
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM` (DeepSeek-V3 / R1, and llama.cpp's `hunyuan-dense`,
/// `joyai-llm` and `hy_v4`): digits in threes, then runs of CJK ideographs, hiragana and
/// katakana, then words with a leading ASCII punctuation mark, punctuation runs and spaces.
const DEEPSEEK3_SPLITS: [&str; 3] = [
    r"\p{N}{1,3}",
    "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

/// `LLAMA_VOCAB_PRE_TYPE_KIMI_K2`, as llama.cpp's code runs it (`unicode.cpp`'s
/// `unicode_regex_split_custom_kimi_k2`): runs of Han characters, then words of any other
/// letters with one leading mark and a contraction (case-insensitive), digits in threes, GPT-4's
/// punctuation and spaces. Kimi-K2's own tiktoken pattern splits words before capitals and
/// keeps combining marks in them; llama.cpp's code does neither, and llama-perplexity's windows
/// are its tokens.
const KIMI_K2_SPLIT: &str = r"\p{Han}+|[^\r\n\p{L}\p{N}]?[\p{L}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.pre` names by family: the splits applied one after another (each piece of
/// one split by the next, as llama.cpp applies its `regex_exprs`), whether a piece that is a
/// whole token is taken as it is (`ignore_merges`), and whether BOS is added where the file
/// does not say.
const PRE_TOKENIZERS: [(&[&str], &[&str], bool, bool); 10] = [
    (&["gpt-2", "phi-2", "mellum"], &[GPT2_SPLIT], false, false),
    (
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "pixtral",
            "lfm2",
        ],
        &[LLAMA3_SPLIT],
        true,
        true,
    ),
    // `LLAMA_VOCAB_PRE_TYPE_DBRX`, `_SMAUG` (cl100k vocabularies) and `_CHATGLM4` (GLM-4 and
    // GLM-4.5): Llama 3's split without its whole-token rule or BOS.
    (
        &["dbrx", "smaug-bpe", "glm4", "chatglm-bpe"],
        &[LLAMA3_SPLIT],
        false,
        false,
    ),
    (&["qwen2", "deepseek-r1-qwen"], &[QWEN2_SPLIT], false, false),
    (&["qwen35"], &[QWEN35_SPLIT], false, false),
    // `LLAMA_VOCAB_PRE_TYPE_SMOLLM`: every digit alone, then GPT-2's split.
    (&["smollm"], &[r"\p{N}", GPT2_SPLIT], false, false),
    (&["tekken"], &[TEKKEN_SPLIT], true, true),
    (
        &["gpt-4o", "llama4", "minimax-m2"],
        &[GPT4O_SPLIT],
        false,
        false,
    ),
    (
        &["deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"],
        &DEEPSEEK3_SPLITS,
        false,
        false,
    ),
    (&["kimi-k2"], &[KIMI_K2_SPLIT], false, false),
];

/// llama.cpp's token type of text a user may write that stays one token (`USER_DEFINED`);
/// control tokens (3) are matched only where special tokens are parsed, which perplexity
/// does not do.
const USER_DEFINED: u64 = 4;

/// A GGUF file's tokenizer as `tokenizer.json` bytes, with its BOS id and whether encoding
/// adds it.
pub struct GgufTokenizer {
    pub json: Vec<u8>,
    pub bos: Option<u32>,
    pub adds_bos: bool,
}

impl GgufTokenizer {
    /// The tokenizer of `file`'s metadata; an error naming the key where it is of a kind not
    /// read yet (`--tokenizer` then gives one).
    pub fn of(file: &GgufFile, path: &std::path::Path) -> Result<Self> {
        let key = |k: &str| format!("tokenizer.ggml.{k}");
        let get = |k: &str| file.get(&key(k));
        let unsupported = |k: &str, v: String| {
            Error::unsupported(
                path.display().to_string(),
                key(k),
                format!("{v} (not read yet: give --tokenizer the model's tokenizer.json)"),
            )
        };
        let wrong = |k: &str, want: &str| {
            Error::format(path, format!("metadata `{}` is not {want}", key(k)))
        };
        let kind = match get("model").map(|v| (v, v.as_str())) {
            Some((_, Some("gpt2"))) => Kind::ByteLevel,
            Some((_, Some("llama"))) => Kind::SentencePiece,
            Some((_, Some("gemma4"))) => Kind::Gemma4,
            Some((v, _)) => return Err(unsupported("model", v.to_json().to_string())),
            None => {
                return Err(Error::format(
                    path,
                    "no `tokenizer.ggml.model`: the file holds no tokenizer (give --tokenizer)",
                ));
            }
        };
        let (splits, ignore_merges, bos_by_default): (&[&str], bool, bool) = match kind {
            Kind::SentencePiece | Kind::Gemma4 => (&[], false, true),
            Kind::ByteLevel => {
                let pre = get("pre").and_then(Value::as_str).unwrap_or("default");
                let (_, splits, ignore_merges, bos) = PRE_TOKENIZERS
                    .iter()
                    .find(|(names, ..)| names.contains(&pre))
                    .ok_or_else(|| unsupported("pre", format!("`{pre}`")))?;
                (*splits, *ignore_merges, *bos)
            }
        };
        let strings = |k: &str| -> Result<Vec<&str>> {
            get(k)
                .and_then(Value::as_array)
                .ok_or_else(|| wrong(k, "an array"))?
                .iter()
                .map(|v| v.as_str().ok_or_else(|| wrong(k, "an array of strings")))
                .collect()
        };
        let tokens = strings("tokens")?;
        let merges: Vec<String> = if kind == Kind::SentencePiece {
            let scores: Vec<f64> = get("scores")
                .and_then(Value::as_array)
                .filter(|a| a.len() == tokens.len())
                .ok_or_else(|| wrong("scores", "an array as long as the tokens"))?
                .iter()
                .map(|v| {
                    v.as_f64()
                        .ok_or_else(|| wrong("scores", "an array of numbers"))
                })
                .collect::<Result<_>>()?;
            // A vocabulary converted without its SentencePiece model carries one score for
            // every piece; llama.cpp then merges the leftmost pair first, which merges
            // ranked by score cannot express.
            if scores.windows(2).all(|w| w[0] == w[1]) {
                return Err(unsupported(
                    "scores",
                    format!(
                        "all {} equal (a vocabulary converted without its tokenizer.model)",
                        scores.first().copied().unwrap_or_default()
                    ),
                ));
            }
            merges_by_score(&tokens, &scores)
        } else {
            strings("merges")?.into_iter().map(str::to_string).collect()
        };
        let types: Vec<u64> = match get("token_type").and_then(Value::as_array) {
            Some(a) => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
            None => Vec::new(),
        };
        let id = |k: &str| -> Result<Option<u32>> {
            match get(k) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|i| u32::try_from(i).ok())
                    .filter(|&i| (i as usize) < tokens.len())
                    .map(Some)
                    .ok_or_else(|| wrong(k, "the id of a token")),
            }
        };
        let bos = id("bos_token_id")?;
        // llama.cpp adds BOS to a Gemma 4 vocabulary's text whatever the file says.
        let adds_bos = match get("add_bos_token") {
            _ if kind == Kind::Gemma4 => true,
            None => bos_by_default,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(wrong("add_bos_token", "a boolean")),
        } && bos.is_some();
        let mut vocab = serde_json::Map::new();
        for (i, t) in tokens.iter().enumerate() {
            // A repeated token string keeps its first id (the later ones cannot be produced
            // by merges; llama.cpp maps text to the first too).
            vocab.entry(t.to_string()).or_insert(json!(i));
        }
        let added: Vec<Json> = types
            .iter()
            .enumerate()
            .filter(|(_, t)| **t == USER_DEFINED)
            .map(|(i, _)| {
                json!({"id": i, "content": tokens[i], "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": false})
            })
            .collect();
        let post_processor = match bos.filter(|_| adds_bos) {
            None => Json::Null,
            Some(b) => {
                let t = tokens[b as usize];
                json!({
                    "type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": t, "type_id": 0}},
                               {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": t, "type_id": 0}},
                             {"Sequence": {"id": "A", "type_id": 0}},
                             {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {t: {"id": t, "ids": [b], "tokens": [t]}},
                })
            }
        };
        let spaces_as_u2581 = json!({"type": "Replace", "pattern": {"String": " "},
                                     "content": "\u{2581}"});
        let pieces_decoder = json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
        ]});
        let pipeline = match kind {
            Kind::ByteLevel => Pipeline {
                normalizer: Json::Null,
                pre_tokenizer: json!({"type": "Sequence", "pretokenizers": splits
                    .iter()
                    .map(|split| json!({"type": "Split", "pattern": {"Regex": split},
                                        "behavior": "Isolated", "invert": false}))
                    .chain([json!({"type": "ByteLevel", "add_prefix_space": false,
                                   "trim_offsets": false, "use_regex": false})])
                    .collect::<Vec<_>>()}),
                decoder: json!({"type": "ByteLevel", "add_prefix_space": false,
                                "trim_offsets": false, "use_regex": false}),
                unk: None,
                byte_fallback: false,
                ignore_merges,
            },
            // llama.cpp's Gemma 4 (`LLAMA_VOCAB_PRE_TYPE_GEMMA4`): spaces as U+2581, the text
            // split into runs of newlines and runs of anything else, merges ranked as listed
            // over raw UTF-8 characters, bytes of what no token spells as `<0xXX>` tokens. A run
            // of newlines that is a token is taken whole (llama.cpp's rule for Gemma 4); so is
            // any other run that is one, where llama.cpp merges: the same token wherever the
            // merges lead back to it.
            Kind::Gemma4 => Pipeline {
                normalizer: spaces_as_u2581,
                pre_tokenizer: json!({"type": "Split", "pattern": {"Regex": r"[^\n]+|[\n]+"},
                                      "behavior": "Isolated", "invert": false}),
                decoder: pieces_decoder,
                unk: None,
                byte_fallback: true,
                ignore_merges: true,
            },
            // llama.cpp's SentencePiece: a space before the text (`add_space_prefix`, on
            // unless the file says otherwise), spaces as U+2581, the highest-scoring adjacent
            // pair merged first, bytes of what no token spells as `<0xXX>` tokens.
            Kind::SentencePiece => {
                let prefix = !matches!(get("add_space_prefix"), Some(Value::Bool(false)));
                let mut normalizers = Vec::new();
                if prefix {
                    normalizers.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
                }
                normalizers.push(spaces_as_u2581);
                Pipeline {
                    normalizer: json!({"type": "Sequence", "normalizers": normalizers}),
                    pre_tokenizer: Json::Null,
                    decoder: pieces_decoder,
                    unk: id("unknown_token_id")?.map(|u| tokens[u as usize]),
                    byte_fallback: true,
                    ignore_merges: false,
                }
            }
        };
        let tokenizer = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": pipeline.normalizer,
            "pre_tokenizer": pipeline.pre_tokenizer,
            "post_processor": post_processor,
            "decoder": pipeline.decoder,
            "model": {"type": "BPE", "dropout": null, "unk_token": pipeline.unk,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      // An unknown token once for a run of unknown characters (SentencePiece).
                      "fuse_unk": pipeline.unk.is_some(),
                      "byte_fallback": pipeline.byte_fallback,
                      "ignore_merges": pipeline.ignore_merges, "vocab": vocab, "merges": merges},
        });
        Ok(GgufTokenizer {
            json: serde_json::to_vec(&tokenizer).unwrap_or_default(),
            bos,
            adds_bos,
        })
    }
}

/// A vocabulary kind's `tokenizer.json` parts around its BPE model.
struct Pipeline<'a> {
    normalizer: Json,
    pre_tokenizer: Json,
    decoder: Json,
    /// The unknown token, where the vocabulary has one (SentencePiece's).
    unk: Option<&'a str>,
    /// Bytes of what no token spells as `<0xXX>` tokens.
    byte_fallback: bool,
    /// A piece that is a whole token taken as it is.
    ignore_merges: bool,
}

/// The vocabulary kinds read (`tokenizer.ggml.model`).
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// `gpt2`: byte-level BPE under a pre-tokenizer family.
    ByteLevel,
    /// `llama`: SentencePiece, merges from the pieces' scores.
    SentencePiece,
    /// `gemma4`: BPE on raw UTF-8 with spaces as U+2581 and byte fallback.
    Gemma4,
}

/// A SentencePiece vocabulary's merges as BPE reads them: every way a token splits into two
/// tokens, ranked by the whole token's score, highest first (llama.cpp merges the adjacent pair
/// whose concatenation scores highest), ties by the parts' ids.
fn merges_by_score(tokens: &[&str], scores: &[f64]) -> Vec<String> {
    let ids: std::collections::HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (*t, i))
        .rev()
        .collect();
    let mut ranked: Vec<(f64, usize, usize, String)> = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        for (at, _) in t.char_indices().skip(1) {
            let (l, r) = t.split_at(at);
            if let (Some(&a), Some(&b)) = (ids.get(l), ids.get(r)) {
                ranked.push((scores[i], a, b, format!("{l} {r}")));
            }
        }
    }
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
    ranked.into_iter().map(|(.., m)| m).collect()
}
