//! Text sources (raw files, the Hugging Face row views of WikiText-2, JSONL and parquet rows,
//! named data sets in the hub cache, lm-eval documents) and tokenization. Each view reproduces, byte for byte, the string some community tool feeds
//! its tokenizer, because a single changed newline moves the token stream and every PPL after it.

pub mod gptq_sample;
pub mod named;
pub mod named_tasks;
pub mod rows;
pub mod source;
pub mod task;
pub mod text;
pub mod tokenize;

pub use named::NamedData;
pub use source::{Body, Data, Source};
pub use text::{
    TextView, apply_view, load_text, python_word_count, wikitext_detokenize, wikitext_documents,
};
pub use tokenize::TextTokenizer;
