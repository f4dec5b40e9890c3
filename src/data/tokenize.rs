//! Tokenization through the Hugging Face `tokenizers` crate, the same Rust code that backs
//! Python's `tokenizers` and transformers' fast tokenizers, so token streams match the
//! reference tools id for id.

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use crate::fnv::Fnv;
use crate::{Error, Result};

/// A `tokenizer.json` tokenizer plus the BOS facts the window plans need.
pub struct TextTokenizer {
    inner: Tokenizer,
    path: PathBuf,
    /// A hash of the tokenizer.json bytes: what a cached token stream was made with.
    identity: u64,
    bos: Option<u32>,
    adds_bos: bool,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("path", &self.path)
            .field("bos", &self.bos)
            .field("adds_bos", &self.adds_bos)
            .finish()
    }
}

impl TextTokenizer {
    /// Loads `<dir>/tokenizer.json` (the fast-tokenizer file every HF model directory has).
    /// A GGUF model (a file) brings its own tokenizer in its metadata; where that is of a
    /// kind not read yet, a `tokenizer.json` beside the file is taken (the report names the
    /// tokenizer file).
    pub fn from_model_dir(dir: &Path) -> Result<Self> {
        if dir.is_file() {
            let beside = dir
                .parent()
                .unwrap_or(Path::new("."))
                .join("tokenizer.json");
            return match Self::from_gguf(dir) {
                Err(_) if beside.is_file() => Self::from_file(&beside),
                other => other,
            };
        }
        Self::from_file(&dir.join("tokenizer.json"))
    }

    /// The tokenizer in GGUF file `path`'s metadata (`checkpoint::gguf::tokenizer`).
    pub fn from_gguf(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let map = crate::checkpoint::mapped::MappedFile::new(path, &file)?;
        let parsed = crate::checkpoint::gguf::GgufFile::parse(path, &map)?;
        let t = crate::checkpoint::gguf::tokenizer::GgufTokenizer::of(&parsed, path)?;
        let inner = Tokenizer::from_bytes(&t.json).map_err(|e| Error::Tokenizer {
            path: path.to_path_buf(),
            message: format!("the GGUF vocabulary as a tokenizer: {e}"),
        })?;
        Ok(TextTokenizer {
            inner,
            path: path.to_path_buf(),
            identity: Fnv::of(&t.json).value(),
            bos: t.bos,
            adds_bos: t.adds_bos,
        })
    }

    /// Loads a `tokenizer.json` file; the BOS token is looked up in the files next to it.
    pub fn from_file(path: &Path) -> Result<Self> {
        if !path.is_file() {
            return Err(Error::Tokenizer {
                path: path.to_path_buf(),
                message: "not found; quantppl needs the fast-tokenizer file tokenizer.json \
                          (write it with transformers: \
                          AutoTokenizer.from_pretrained(model).save_pretrained(dir)), or name \
                          one with --tokenizer FILE (`--tokenizer bundled`: the bundled model's)"
                    .into(),
            });
        }
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let inner = Tokenizer::from_bytes(&bytes).map_err(|e| Error::Tokenizer {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut tok = TextTokenizer {
            inner,
            path: path.to_path_buf(),
            identity: Fnv::of(&bytes).value(),
            bos: None,
            adds_bos: false,
        };
        tok.bos = tok.find_bos(dir)?;
        tok.adds_bos = match tok.bos {
            Some(bos) => {
                let with = tok.encode("a", true)?;
                let without = tok.encode("a", false)?;
                with.len() == without.len() + 1 && with.first() == Some(&bos)
            }
            None => false,
        };
        Ok(tok)
    }

    /// Token ids of `text`, exactly as Python's `Tokenizer.encode(text, add_special_tokens)`.
    /// Offsets are not computed (`encode_fast`): they do not change the ids and cost time on
    /// the 1.3 MB WikiText file. A long text's ids are kept in the cache (`TokenCache`), so a
    /// second run on the same text and tokenizer does not tokenize it again.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let cache = (text.len() >= TokenCache::FROM_BYTES)
            .then(|| TokenCache::new(self.identity, text, add_special_tokens));
        if let Some(ids) = cache.as_ref().and_then(TokenCache::read) {
            return Ok(ids);
        }
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer {
                path: self.path.clone(),
                message: format!("encoding failed: {e}"),
            })?;
        let ids = enc.get_ids().to_vec();
        if let Some(c) = &cache {
            c.write(&ids);
        }
        Ok(ids)
    }

    /// The BOS id, from `tokenizer_config.json` `bos_token`, else `special_tokens_map.json`
    /// `bos_token`, else `config.json` `bos_token_id`, whichever is found first.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// Whether `encode(text, true)` puts BOS at position 0 (Llama/Mistral yes, GPT-2/Qwen no).
    pub fn adds_bos(&self) -> bool {
        self.adds_bos
    }

    /// Vocabulary size including added tokens (`len(tokenizer)` in transformers).
    /// Bytes of text that `tokens` tokens can hold at most: each token covers no more bytes
    /// than its longest vocabulary entry spells, times 4 for normalizers that shrink text (a
    /// full-width character to one byte). A longer text cannot encode to `tokens` tokens or
    /// fewer, so it is refused before tokenizing.
    pub fn max_prompt_bytes(&self, tokens: usize) -> usize {
        let longest = self.inner.get_vocab(true).keys().map(String::len).max();
        tokens
            .saturating_mul(longest.unwrap_or(1).max(1))
            .saturating_mul(4)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The `tokenizer.json` this was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The text of `ids` (`tokenizer.decode(ids)`), special tokens kept.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| Error::Tokenizer {
            path: self.path.clone(),
            message: format!("decoding failed: {e}"),
        })
    }

    /// The special-token strings of `tokenizer_config.json` next to the tokenizer (`bos_token`,
    /// `eos_token`, `pad_token`, `chat_template`), `None` where absent.
    pub fn config_field(&self, key: &str) -> Result<Option<String>> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let Some(json) = read_json(&dir.join("tokenizer_config.json"))? else {
            return Ok(None);
        };
        Ok(match json.get(key) {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Object(o)) => {
                o.get("content").and_then(|c| c.as_str()).map(String::from)
            }
            _ => None,
        })
    }

    fn find_bos(&self, dir: &Path) -> Result<Option<u32>> {
        for file in ["tokenizer_config.json", "special_tokens_map.json"] {
            let Some(json) = read_json(&dir.join(file))? else {
                continue;
            };
            let token = match json.get("bos_token") {
                Some(serde_json::Value::String(s)) => Some(s.as_str()),
                Some(serde_json::Value::Object(o)) => o.get("content").and_then(|c| c.as_str()),
                _ => None,
            };
            if let Some(id) = token.and_then(|t| self.inner.token_to_id(t)) {
                return Ok(Some(id));
            }
        }
        if let Some(json) = read_json(&dir.join("config.json"))? {
            let id = json.get("bos_token_id").and_then(|v| v.as_u64());
            if let Some(id) = id.and_then(|id| u32::try_from(id).ok()) {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }
}

/// `None` when the file does not exist; a malformed file is an error (it means a broken
/// model directory, and guessing BOS from the wrong source would shift every window).
fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    match std::fs::read_to_string(path) {
        Ok(s) => serde_json::from_str(&s)
            .map(Some)
            .map_err(|e| Error::format(path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// A long text's token ids on disk (`crate::cache::dir()/tokens/`), keyed by the tokenizer
/// file's bytes, the text's bytes and the special-tokens flag. An entry holds the key and the
/// text's length again and a checksum of the ids; one that does not match is ignored (and
/// rewritten), so a damaged or foreign file costs a tokenization, never a wrong id.
struct TokenCache {
    key: u64,
    text_len: u64,
    path: PathBuf,
}

impl TokenCache {
    /// Texts shorter than this tokenize faster than a file is read.
    const FROM_BYTES: usize = 256 << 10;
    const MAGIC: &'static [u8; 8] = b"QPPLTOK1";

    fn new(tokenizer: u64, text: &str, add_special_tokens: bool) -> Self {
        let mut h = Fnv::of(&tokenizer.to_le_bytes());
        h.update(&[u8::from(add_special_tokens)]);
        // What made the ids: the tokenizers release (bump it with the dependency) and, to
        // be safe across any other change, quantppl's own version.
        h.update(b"tokenizers 0.23");
        h.update(env!("CARGO_PKG_VERSION").as_bytes());
        h.update(text.as_bytes());
        let key = h.value();
        TokenCache {
            key,
            text_len: text.len() as u64,
            path: crate::cache::dir()
                .join("tokens")
                .join(format!("{key:016x}.ids")),
        }
    }

    fn read(&self) -> Option<Vec<u32>> {
        let bytes = std::fs::read(&self.path).ok()?;
        let (head, rest) = bytes.split_at_checked(32)?;
        let word = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
        let (ids, sum) = rest.split_at_checked(rest.len().checked_sub(8)?)?;
        let n = word(24);
        if &head[..8] != Self::MAGIC
            || word(8) != self.key
            || word(16) != self.text_len
            || ids.len() as u64 != n.checked_mul(4)?
            || u64::from_le_bytes(sum.try_into().ok()?) != Fnv::of(ids).value()
        {
            return None;
        }
        Some(
            ids.chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect(),
        )
    }

    fn write(&self, ids: &[u32]) {
        let body: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        let mut bytes = Vec::with_capacity(40 + body.len());
        bytes.extend_from_slice(Self::MAGIC);
        bytes.extend_from_slice(&self.key.to_le_bytes());
        bytes.extend_from_slice(&self.text_len.to_le_bytes());
        bytes.extend_from_slice(&(ids.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&body);
        bytes.extend_from_slice(&Fnv::of(&body).value().to_le_bytes());
        crate::cache::store(&self.path, &bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tokenizer_names_the_path() {
        let dir = Path::new("/nonexistent/model");
        let err = TextTokenizer::from_model_dir(dir).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/model/tokenizer.json"), "{err}");
        assert!(err.contains("save_pretrained"), "{err}");
    }

    /// What the cache wrote is read back; a changed byte, another key or another text
    /// length is a miss, never other ids.
    #[test]
    fn token_cache_reads_back_only_what_it_wrote() {
        let dir = std::env::temp_dir().join(format!("quantppl-tokcache-{}", std::process::id()));
        let entry = |key: u64, text_len: u64| TokenCache {
            key,
            text_len,
            path: dir.join("e.ids"),
        };
        let ids: Vec<u32> = (0..1000).map(|i| i * 7919 % 32000).collect();
        entry(5, 77).write(&ids);
        assert_eq!(entry(5, 77).read(), Some(ids));
        assert_eq!(entry(6, 77).read(), None);
        assert_eq!(entry(5, 78).read(), None);
        let mut bytes = std::fs::read(dir.join("e.ids")).unwrap();
        for at in [0, 9, 40, bytes.len() - 1] {
            bytes[at] ^= 1;
            std::fs::write(dir.join("e.ids"), &bytes).unwrap();
            assert_eq!(entry(5, 77).read(), None, "byte {at} changed");
            bytes[at] ^= 1;
        }
        std::fs::write(dir.join("e.ids"), &bytes[..bytes.len() - 3]).unwrap();
        assert_eq!(entry(5, 77).read(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
