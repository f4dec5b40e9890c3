//! Tokenization through the Hugging Face `tokenizers` crate, the same Rust code that backs
//! Python's `tokenizers` and transformers' fast tokenizers, so token streams match the
//! reference tools id for id.

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use crate::{Error, Result};

/// A `tokenizer.json` tokenizer plus the BOS facts the window plans need.
pub struct TextTokenizer {
    inner: Tokenizer,
    path: PathBuf,
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
    pub fn from_model_dir(dir: &Path) -> Result<Self> {
        Self::from_file(&dir.join("tokenizer.json"))
    }

    /// Loads a `tokenizer.json` file; the BOS token is looked up in the files next to it.
    pub fn from_file(path: &Path) -> Result<Self> {
        if !path.is_file() {
            return Err(Error::Tokenizer {
                path: path.to_path_buf(),
                message: "not found; quantppl needs the fast-tokenizer file tokenizer.json \
                          (write it with transformers: \
                          AutoTokenizer.from_pretrained(model).save_pretrained(dir))"
                    .into(),
            });
        }
        let inner = Tokenizer::from_file(path).map_err(|e| Error::Tokenizer {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut tok = TextTokenizer {
            inner,
            path: path.to_path_buf(),
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
    /// the 1.3 MB WikiText file.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer {
                path: self.path.clone(),
                message: format!("encoding failed: {e}"),
            })?;
        Ok(enc.get_ids().to_vec())
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
}
