//! Multiple-choice tasks found by name (`--task hellaswag`), read from the local Hugging Face
//! hub cache as `huggingface-cli download` leaves them (never downloaded), each item made as
//! lm-eval 0.4.13's task of that name makes it (its YAML and `utils.py`): the same split, the
//! same context and choices, the same right answer.

use std::path::PathBuf;
use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use super::named::HubFiles;
use super::rows::{RowFile, parquet_records};
use super::task::{Task, TaskItem};
use crate::{Error, Result};

/// A task quantppl finds by name.
pub struct NamedTask {
    pub name: &'static str,
    pub hub: HubFiles,
    /// The lm-eval task and split it reproduces.
    pub reproduces: &'static str,
    /// One row as an item (a row's fields as JSON), or why it is not one.
    item: fn(&Value) -> std::result::Result<TaskItem, String>,
}

/// ARC's two sets: the same layout, another folder.
macro_rules! arc {
    ($name:literal, $config:literal) => {
        NamedTask {
            name: $name,
            hub: HubFiles {
                repos: &["allenai/ai2_arc", "ai2_arc"],
                files: concat!(r"^", $config, r"/(test-\d+-of-\d+|test/\d+)\.parquet$"),
                download: concat!(
                    "allenai/ai2_arc --repo-type dataset --include '",
                    $config,
                    "/test-*'"
                ),
            },
            reproduces: concat!("lm-eval `", $name, "` (test split)"),
            item: arc_item,
        }
    };
}

pub const NAMED_TASKS: &[NamedTask] = &[
    NamedTask {
        name: "hellaswag",
        hub: HubFiles {
            repos: &["Rowan/hellaswag", "hellaswag"],
            files: r"^(data/validation-\d+-of-\d+|default/validation/\d+)\.parquet$",
            download: "Rowan/hellaswag --repo-type dataset --include 'data/validation-*'",
        },
        reproduces: "lm-eval `hellaswag` (validation split)",
        item: hellaswag_item,
    },
    arc!("arc_easy", "ARC-Easy"),
    arc!("arc_challenge", "ARC-Challenge"),
    NamedTask {
        name: "mmlu",
        hub: HubFiles {
            repos: &["cais/mmlu"],
            files: r"^all/(test-\d+-of-\d+|test/\d+)\.parquet$",
            download: "cais/mmlu --repo-type dataset --include 'all/test-*'",
        },
        reproduces: "lm-eval `mmlu`, zero-shot, its 57 subjects as one task (test split)",
        item: mmlu_item,
    },
    NamedTask {
        name: "winogrande",
        hub: HubFiles {
            repos: &["allenai/winogrande", "winogrande"],
            files: r"^winogrande_xl/(validation-\d+-of-\d+|validation/\d+)\.parquet$",
            download: "allenai/winogrande --repo-type dataset --include 'winogrande_xl/validation-*'",
        },
        reproduces: "lm-eval `winogrande` (winogrande_xl, validation split)",
        item: winogrande_item,
    },
];

/// The names, for help and errors.
pub fn names() -> String {
    NAMED_TASKS
        .iter()
        .map(|t| t.name)
        .collect::<Vec<_>>()
        .join(", ")
}

impl NamedTask {
    pub fn by_name(name: &str) -> Option<&'static NamedTask> {
        NAMED_TASKS.iter().find(|t| t.name == name)
    }

    /// The task's items from its files in the hub cache.
    pub fn load(&self) -> Result<Task> {
        let (origin, files) = self.hub.locate(self.name)?;
        let mut items = Vec::new();
        let mut all = Vec::new();
        for path in &files {
            let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
            if RowFile::of(path) != Some(RowFile::Parquet) {
                return Err(Error::format(path, "not a parquet file"));
            }
            for (i, row) in parquet_records(path, &bytes)?.iter().enumerate() {
                let item = (self.item)(row)
                    .map_err(|why| Error::format(path, format!("row {}: {why}", i + 1)))?;
                items.push(item);
            }
            all.extend_from_slice(&bytes);
        }
        if items.is_empty() {
            return Err(Error::Dataset {
                path: PathBuf::from(self.name),
                why: format!("{origin} holds no rows"),
            });
        }
        Ok(Task {
            name: format!("{} ({origin}; {})", self.name, self.reproduces),
            items,
            fingerprint: super::source::fingerprint(&all),
        })
    }
}

fn field<'a>(row: &'a Value, name: &str) -> std::result::Result<&'a Value, String> {
    row.get(name).ok_or_else(|| format!("no field `{name}`"))
}

fn text<'a>(row: &'a Value, name: &str) -> std::result::Result<&'a str, String> {
    field(row, name)?
        .as_str()
        .ok_or_else(|| format!("field `{name}` is not a string"))
}

fn texts(v: &Value, name: &str) -> std::result::Result<Vec<String>, String> {
    v.as_array()
        .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect())
        .ok_or_else(|| format!("field `{name}` is not a list of strings"))
}

/// A label written as a number or as its digits ("2").
fn index(row: &Value, name: &str) -> std::result::Result<usize, String> {
    let v = field(row, name)?;
    v.as_u64()
        .map(|n| n as usize)
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        .ok_or_else(|| format!("field `{name}` is {v}, not an index"))
}

/// Python's `str.capitalize()`: the first character upper-cased, the rest lower-cased.
fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first
            .to_uppercase()
            .chain(chars.as_str().to_lowercase().chars())
            .collect(),
        None => String::new(),
    }
}

/// lm-eval's HellaSwag `preprocess`: stripped, " [title]" as ". ", bracketed WikiHow
/// artifacts dropped, double spaces halved (one pass, as `str.replace`).
fn hellaswag_preprocess(text: &str) -> String {
    static BRACKETS: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\[.*?\]").expect("constant pattern"));
    let text = text.trim().replace(" [title]", ". ");
    BRACKETS.replace_all(&text, "").replace("  ", " ")
}

/// `query` = preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()), the
/// endings preprocessed, `label` as an integer (hellaswag/utils.py `process_docs`).
fn hellaswag_item(row: &Value) -> std::result::Result<TaskItem, String> {
    let ctx = format!(
        "{} {}",
        text(row, "ctx_a")?,
        capitalize(text(row, "ctx_b")?)
    );
    let query = hellaswag_preprocess(&format!("{}: {ctx}", text(row, "activity_label")?));
    let endings: Vec<String> = texts(field(row, "endings")?, "endings")?
        .iter()
        .map(|e| hellaswag_preprocess(e))
        .collect();
    TaskItem::with_choices(&query, &endings, index(row, "label")?)
}

/// "Question: {question}\nAnswer:", the choices' texts, the answer key's place among their
/// labels (arc_easy.yaml).
fn arc_item(row: &Value) -> std::result::Result<TaskItem, String> {
    let choices = field(row, "choices")?;
    let texts_ = texts(field(choices, "text")?, "choices.text")?;
    let labels = texts(field(choices, "label")?, "choices.label")?;
    let key = text(row, "answerKey")?;
    let label = labels
        .iter()
        .position(|l| l == key)
        .ok_or_else(|| format!("answerKey {key:?} is not among the labels {labels:?}"))?;
    let context = format!("Question: {}\nAnswer:", text(row, "question")?);
    TaskItem::with_choices(&context, &texts_, label)
}

/// The subject's description, the question stripped and its four choices lettered, then
/// "Answer:"; the choices are the letters (mmlu/default/_default_template_yaml, zero-shot).
fn mmlu_item(row: &Value) -> std::result::Result<TaskItem, String> {
    let choices = texts(field(row, "choices")?, "choices")?;
    if choices.len() != 4 {
        return Err(format!("{} choices, MMLU has 4", choices.len()));
    }
    let subject = text(row, "subject")?.replace('_', " ");
    let context = format!(
        "The following are multiple choice questions (with answers) about {subject}.\n\n{}\nA. \
         {}\nB. {}\nC. {}\nD. {}\nAnswer:",
        text(row, "question")?.trim(),
        choices[0],
        choices[1],
        choices[2],
        choices[3]
    );
    let letters: Vec<String> = ["A", "B", "C", "D"].map(String::from).to_vec();
    TaskItem::with_choices(&context, &letters, index(row, "answer")?)
}

/// A context per option (the sentence up to its blank, then the option) and the rest of the
/// sentence as the one continuation; answer "1" or "2" (preprocess_winogrande.py).
fn winogrande_item(row: &Value) -> std::result::Result<TaskItem, String> {
    let sentence = text(row, "sentence")?;
    let blank = sentence
        .find('_')
        .ok_or_else(|| "the sentence has no blank `_`".to_string())?;
    let contexts = [text(row, "option1")?, text(row, "option2")?]
        .map(|o| format!("{}{o}", &sentence[..blank]))
        .to_vec();
    let answer = index(row, "answer")?;
    if !(1..=2).contains(&answer) {
        return Err(format!("answer {answer}, not 1 or 2"));
    }
    TaskItem::with_contexts(&contexts, sentence[blank + 1..].trim(), answer - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hellaswag_text_is_preprocessed_as_lm_eval_does() {
        assert_eq!(capitalize("tHE man"), "The man");
        assert_eq!(capitalize(""), "");
        assert_eq!(
            hellaswag_preprocess("  How to cook [title] Take a pan [step] and  heat it. "),
            "How to cook. Take a pan and heat it."
        );
    }
}
