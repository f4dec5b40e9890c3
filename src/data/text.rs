//! Reading evaluation text exactly as each community tool sees it.
//!
//! WikiText-2 reaches the tools in three shapes (see `docs/methods.md` §0): the raw file
//! (llama.cpp), the Hugging Face line-level rows joined with `"\n\n"` (transformers guide, GPTQ,
//! ExLlamaV3) and the document-level pages (lm-eval). The row and page views are rebuilt here
//! from the raw file, so no dataset download is needed and the bytes are reproducible.

use std::path::Path;
use std::sync::LazyLock;

use regex::{NoExpand, Regex};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// How a text file is turned into the one string that gets tokenized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TextView {
    /// The file bytes as UTF-8, whole file one string (llama.cpp, ExLlamaV3 `ppl.py -g`).
    #[default]
    Raw,
    /// `"\n\n".join(rows)` of the Hugging Face `wikitext-2-raw-v1` line view, blank rows
    /// included (transformers guide, GPTQ papers, ExLlamaV3 compare_q before 2026-05-11).
    HfRows,
    /// As `hf-rows` with blank rows dropped before joining (ExLlamaV3 after 2026-05-11, qbench).
    #[value(name = "hf-rows-nonempty")]
    #[serde(rename = "hf-rows-nonempty")]
    HfRowsNonEmpty,
}

/// Python's `str.isspace`: Unicode White_Space plus the separators U+001C..U+001F, which
/// Python (and its `re` module's `\s`) also treats as whitespace. Matching it keeps `strip()`
/// and `re.split(r"\s+")` results identical to the Python tools.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// Python's `\s` for `str` patterns, as a regex class.
const PY_SPACE: &str = r"[\s\x1c-\x1f]";

fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

fn regex(pattern: &str) -> Regex {
    // Only called with the constant patterns below; a failure is a bug in this file.
    Regex::new(pattern).expect("constant regex")
}

/// Reads a text file as UTF-8 and applies `view`. Empty (or whitespace-only) text is an
/// error: it would yield no windows, and it usually means the wrong file was passed.
pub fn load_text(path: &Path, view: TextView) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let raw = String::from_utf8(bytes).map_err(|e| Error::Dataset {
        path: path.to_path_buf(),
        why: format!(
            "is not valid UTF-8 (first bad byte at offset {})",
            e.utf8_error().valid_up_to()
        ),
    })?;
    if py_strip(&raw).is_empty() {
        return Err(Error::Dataset {
            path: path.to_path_buf(),
            why: "is empty".into(),
        });
    }
    Ok(apply_view(&raw, view))
}

/// Applies a [`TextView`] to text already in memory.
pub fn apply_view(raw: &str, view: TextView) -> String {
    match view {
        TextView::Raw => raw.to_string(),
        TextView::HfRows => hf_rows(raw, false).join("\n\n"),
        TextView::HfRowsNonEmpty => hf_rows(raw, true).join("\n\n"),
    }
}

/// What Python's text-mode `open()` reads: `\r\n` and lone `\r` become `\n`.
fn universal_newlines(raw: &str) -> String {
    if raw.contains('\r') {
        raw.replace("\r\n", "\n").replace('\r', "\n")
    } else {
        raw.to_string()
    }
}

/// The rows of the Hugging Face `wikitext` builder: it iterates the file opened in Python text
/// mode (universal newlines, so `\r\n` and `\r` become `\n`), keeps each line with its `"\n"`,
/// and stores a line whose `strip()` is empty as `""`. With `drop_empty` those rows are left
/// out, as ExLlamaV3 does since 2026-05-11.
fn hf_rows(raw: &str, drop_empty: bool) -> Vec<String> {
    universal_newlines(raw)
        .split_inclusive('\n')
        .filter_map(|line| {
            if py_strip(line).is_empty() {
                (!drop_empty).then(String::new)
            } else {
                Some(line.to_string())
            }
        })
        .collect()
}

/// Splits the raw WikiText file into the pages of `EleutherAI/wikitext_document_level`
/// (lm-eval's `wikitext` task), following that dataset's builder: the file is split at `"\n"`;
/// a line starts a new page when, after `"= = ="`→`"==="`, `"= ="`→`"=="` and `strip()`, it
/// starts with `"= "` and ends with `" ="` (top-level ` = Title = ` only; ` = = Sub = = `
/// becomes `"== Sub =="` and does not split); lines are joined back with `"\n"`; a page whose
/// `strip()` is empty (the blank line before the first title) is not emitted, except the
/// last one. The file is read with universal newlines, as the builder's Python `open()` does.
/// (Builder: `EleutherAI/wikitext_document_level`, `_generate_examples`.)
pub fn wikitext_documents(raw: &str) -> Vec<String> {
    let text = universal_newlines(raw);
    let mut pages = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for line in text.split('\n') {
        let rline = line.replace("= = =", "===").replace("= =", "==");
        let rline = py_strip(&rline);
        if rline.starts_with("= ") && rline.ends_with(" =") {
            let page = current.join("\n");
            if !py_strip(&page).is_empty() {
                pages.push(page);
            }
            current.clear();
        }
        current.push(line);
    }
    // The builder yields the last page even when it is blank.
    pages.push(current.join("\n"));
    pages
}

/// `len(re.split(r"\s+", page))` in Python: the number of whitespace runs plus one, so leading
/// or trailing whitespace counts an empty "word" — lm-eval's word count, kept as is so that
/// word perplexities match its tables.
pub fn python_word_count(page: &str) -> u64 {
    static RUNS: LazyLock<Regex> = LazyLock::new(|| regex(&format!("{PY_SPACE}+")));
    RUNS.find_iter(page).count() as u64 + 1
}

/// lm-eval's `preprocess_wikitext.wikitext_detokenizer`, step for step and in its order
/// (`docs/methods.md` §3). The odd `/' [0-9]/` rule is reproduced literally: it matches
/// a slash-delimited string and replaces it with the text `/'[0-9]/`.
pub fn wikitext_detokenize(page: &str) -> String {
    static SLASH_QUOTE: LazyLock<Regex> = LazyLock::new(|| regex(r"/' [0-9]/"));
    static BRACKETS: LazyLock<[(Regex, &str); 5]> = LazyLock::new(|| {
        let s = PY_SPACE;
        [
            (regex(&format!(r"\({s}*([^)]*?){s}*\)")), "(${1})"),
            (regex(&format!(r"\[{s}*([^\]]*?){s}*\]")), "[${1}]"),
            (regex(&format!(r"\{{{s}*([^}}]*?){s}*\}}")), "{${1}}"),
            (regex(&format!(r#""{s}*([^"]*?){s}*""#)), "\"${1}\""),
            (regex(&format!(r"'{s}*([^']*?){s}*'")), "'${1}'"),
        ]
    });

    let mut s = page.replace("s '", "s'");
    s = SLASH_QUOTE
        .replace_all(&s, NoExpand("/'[0-9]/"))
        .into_owned();
    for (from, to) in [
        (" @-@ ", "-"),
        (" @,@ ", ","),
        (" @.@ ", "."),
        (" : ", ": "),
        (" ; ", "; "),
        (" . ", ". "),
        (" ! ", "! "),
        (" ? ", "? "),
        (" , ", ", "),
    ] {
        s = s.replace(from, to);
    }
    for (re, to) in BRACKETS.iter() {
        s = re.replace_all(&s, *to).into_owned();
    }
    for (from, to) in [
        ("= = = =", "===="),
        ("= = =", "==="),
        ("= =", "=="),
        (" \u{b0} ", "\u{b0}"),
        (" \n", "\n"),
        ("\n ", "\n"),
        (" N ", " 1 "),
        (" 's", "'s"),
    ] {
        s = s.replace(from, to);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wiki_raw_path() -> std::path::PathBuf {
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/wikitext-2-raw/wiki.test.raw"
        ))
        .to_path_buf()
    }

    #[test]
    fn hf_rows_match_the_dataset_view() {
        let raw = " \n = Robert Boulter = \n \n Robert is .\n";
        let rows = hf_rows(raw, false);
        assert_eq!(rows, ["", " = Robert Boulter = \n", "", " Robert is .\n"]);
        assert_eq!(
            apply_view(raw, TextView::HfRows),
            "\n\n = Robert Boulter = \n\n\n\n\n Robert is .\n"
        );
        assert_eq!(
            apply_view(raw, TextView::HfRowsNonEmpty),
            " = Robert Boulter = \n\n\n Robert is .\n"
        );
        assert_eq!(apply_view(raw, TextView::Raw), raw);
        // A last line without "\n" is still a row; "\r\n" is read as "\n" (universal newlines).
        assert_eq!(hf_rows("a\r\nb", false), ["a\n", "b"]);
    }

    #[test]
    fn wiki_test_rows_and_pages() {
        let raw = load_text(&wiki_raw_path(), TextView::Raw).unwrap();
        let rows = hf_rows(&raw, false);
        assert_eq!(rows.len(), 4358);
        assert_eq!(rows[..2], ["", " = Robert Boulter = \n"]);
        let pages = wikitext_documents(&raw);
        assert_eq!(pages.len(), 62);
        assert!(pages[0].starts_with(" = Robert Boulter = \n"));
        assert!(pages.iter().all(|p| p.starts_with(" = ")));
        // The pages are the whole file minus the blank first line, split at "\n" boundaries.
        assert_eq!(format!(" \n{}", pages.join("\n")), raw);
    }

    #[test]
    fn empty_text_is_an_error() {
        let dir = std::env::temp_dir().join(format!("quantppl-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("blank.txt");
        std::fs::write(&path, " \n\t\n").unwrap();
        let err = load_text(&path, TextView::Raw).unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");

        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn word_count_follows_python_split() {
        // re.split(r"\s+", " a  b\n") == ['', 'a', 'b', '']
        assert_eq!(python_word_count(" a  b\n"), 4);
        assert_eq!(python_word_count("a"), 1);
        assert_eq!(python_word_count(""), 1);
        assert_eq!(python_word_count("a\x1fb"), 2);
    }

    #[test]
    fn detokenizer_rules_in_order() {
        assert_eq!(
            wikitext_detokenize("the players ' club"),
            "the players' club"
        );
        assert_eq!(
            wikitext_detokenize("1 @,@ 000 @.@ 5 and 2 @-@ 3"),
            "1,000.5 and 2-3"
        );
        assert_eq!(
            wikitext_detokenize("a , b . c : d ; e ! f ? g"),
            "a, b. c: d; e! f? g"
        );
        assert_eq!(
            wikitext_detokenize("x ( a b ) [ c ] { d } \" e \" ' f '"),
            "x (a b) [c] {d} \"e\" 'f'"
        );
        assert_eq!(
            wikitext_detokenize(" = = = = H = = = = \n = = S = = \n = T = "),
            " ==== H ====\n== S ==\n= T = "
        );
        assert_eq!(wikitext_detokenize("5 \u{b0} C"), "5\u{b0}C");
        assert_eq!(wikitext_detokenize("a N b"), "a 1 b");
        assert_eq!(wikitext_detokenize("John 's"), "John's");
        assert_eq!(wikitext_detokenize("/' 5/"), "/'[0-9]/");
        // Order matters: " , " is squeezed before the bracket rule sees the text.
        assert_eq!(wikitext_detokenize("( a , b )"), "(a, b)");
    }
}
