//! Text sources (raw files, the Hugging Face row views of WikiText-2, JSONL, lm-eval documents)
//! and tokenization. Each view reproduces, byte for byte, the string some community tool feeds
//! its tokenizer, because a single changed newline moves the token stream and every PPL after it.

pub mod text;
pub mod tokenize;

pub use text::{
    TextView, apply_view, load_documents, load_jsonl_texts, load_text, python_word_count,
    wikitext_detokenize, wikitext_documents,
};
pub use tokenize::TextTokenizer;
