//! From user settings to a plan: load the text, tokenize it as the method's reference tool
//! does (BOS included or not), fill in defaults, and build the windows.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::checkpoint::ModelConfig;
use crate::data::{self, Body, Data, Source, TextTokenizer, TextView, apply_view};
use crate::plan::{self, DocStats, Method, Plan};
use crate::{Error, Result};

/// Rows ExLlamaV3 evaluates by default (`ppl.py --rows`, the `*_large` compare_q specs).
pub const EXL3_DEFAULT_ROWS: usize = 100;

#[derive(Clone, Debug)]
pub struct PlanSettings {
    /// `--data`: a text, JSONL or parquet file, `-` (stdin) or a named data set; `None` = the
    /// bundled WikiText-2 test file.
    pub data: Option<PathBuf>,
    /// The field of JSONL/parquet rows (`None`: `text`).
    pub field: Option<String>,
    /// `None`: `raw` for a text, `hf-rows` (the rows joined) for rows.
    pub text: Option<TextView>,
    /// `None`: exl3, or llamacpp for a model read from GGUF.
    pub method: Option<Method>,
    pub ctx: Option<usize>,
    pub stride: Option<usize>,
    pub rows: Option<usize>,
}

/// The settings actually used, with the defaults that were filled in named.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ResolvedSettings {
    pub data: String,
    /// Size and hash of the data's bytes (what resumed runs compare).
    #[serde(default)]
    pub data_fingerprint: String,
    pub text: String,
    pub method: Method,
    pub ctx: usize,
    pub stride: Option<usize>,
    pub rows: Option<usize>,
    pub defaults: Vec<String>,
    /// Tokens of the input stream(s).
    pub n_tokens: usize,
    pub n_docs: usize,
    pub bos: String,
}

pub fn build_plan(
    settings: &PlanSettings,
    tokenizer: &TextTokenizer,
    cfg: &ModelConfig,
) -> Result<(Plan, ResolvedSettings)> {
    let mut defaults = Vec::new();
    let method = match settings.method {
        Some(m) => m,
        None if cfg.from_gguf => {
            defaults.push("method=llamacpp (a GGUF model)".to_string());
            Method::Llamacpp
        }
        None => Method::Exl3,
    };
    let max_pos = cfg.max_position_embeddings;
    let ctx = match settings.ctx {
        Some(c) => c,
        None => {
            defaults.push("ctx=min(2048, max_position_embeddings)".to_string());
            2048.min(max_pos)
        }
    };
    if ctx < 2 {
        return Err(Error::InvalidArgument(format!(
            "--ctx {ctx} is too small: at least 2 tokens"
        )));
    }
    if ctx > max_pos {
        return Err(Error::ContextTooLong { ctx, max: max_pos });
    }
    let strided = matches!(method, Method::Exl3 | Method::HfStride);
    let stride = if strided {
        Some(match settings.stride {
            Some(0) => return Err(Error::InvalidArgument("--stride must be at least 1".into())),
            Some(s) => s,
            None => {
                defaults.push("stride=ctx/4".to_string());
                (ctx / 4).max(1)
            }
        })
    } else {
        if settings.stride.is_some() {
            return Err(Error::InvalidArgument(format!(
                "--stride does not apply to --method {}: it uses disjoint windows",
                method_name(method)
            )));
        }
        None
    };
    let data = data::source::load(
        &Source::parse(settings.data.as_deref())?,
        settings.field.as_deref(),
    )?;
    let rows = match (method, settings.rows, data.named.and_then(|n| n.windows)) {
        (_, Some(0), _) => return Err(Error::InvalidArgument("--rows must be at least 1".into())),
        (Method::Gptq, None, Some(n)) => {
            defaults.push(format!("rows={n} (the reference's sample count)"));
            Some(n)
        }
        (Method::Exl3, None, _) => {
            defaults.push(format!("rows={EXL3_DEFAULT_ROWS}"));
            Some(EXL3_DEFAULT_ROWS)
        }
        (Method::HfStride | Method::LmEval, Some(_), _) => {
            return Err(Error::InvalidArgument(format!(
                "--rows does not apply to --method {}: it scores every token once",
                method_name(method)
            )));
        }
        (_, r, _) => r,
    };
    let bos = tokenizer.bos_id();
    let bos_note = match bos {
        Some(b) if tokenizer.adds_bos() => format!("tokenizer adds BOS {b}"),
        Some(b) => format!("BOS {b}, not added by the tokenizer"),
        None => "no BOS".to_string(),
    };
    let empty = |why: &str| Error::Dataset {
        path: PathBuf::from(&data.name),
        why: why.to_string(),
    };
    let (plan, n_tokens, n_docs, bos_text, text) = if method == Method::LmEval {
        let docs = lm_eval_documents(&data, settings.text)?;
        let prefix = bos.or(cfg.eos_token_id).ok_or_else(|| {
            Error::InvalidArgument(
                "lm-eval needs a prefix token (BOS or EOS); the tokenizer has neither".into(),
            )
        })?;
        let mut toks = Vec::with_capacity(docs.len());
        let mut stats = Vec::with_capacity(docs.len());
        for (page, text) in &docs {
            toks.push(tokenizer.encode(text, false)?);
            stats.push(DocStats::of_page(page));
        }
        if toks.iter().all(Vec::is_empty) {
            return Err(empty("has no tokens"));
        }
        let n: usize = toks.iter().map(Vec::len).sum();
        let plan = plan::lm_eval(&toks, prefix, ctx)?.with_docs(stats)?;
        (
            plan,
            n,
            docs.len(),
            format!("prefix token {prefix} per document, no BOS in the text"),
            "lm-eval documents",
        )
    } else {
        let (tokens, n_docs, text_label) = match &data.body {
            Body::Text(text) => {
                let view = settings.text.unwrap_or(TextView::Raw);
                let tokens = tokenizer.encode(&apply_view(text, view), true)?;
                (tokens, 1, view_name(view))
            }
            Body::Rows { rows, join } => {
                let view = row_view(settings.text, &mut defaults)?;
                let kept: Vec<&str> = rows
                    .iter()
                    .map(String::as_str)
                    .filter(|r| view != TextView::HfRowsNonEmpty || !r.trim().is_empty())
                    .collect();
                (
                    tokenizer.encode(&kept.join(join), true)?,
                    kept.len(),
                    view_name(view),
                )
            }
            Body::GptqC4(docs) => {
                if method != Method::Gptq || settings.text.is_some() {
                    return Err(Error::InvalidArgument(format!(
                        "{} is GPTQ's sample of windows from C4 documents: use --method gptq \
                         (and no --text)",
                        data.name
                    )));
                }
                let windows = rows.unwrap_or(1);
                let tokens = data::gptq_sample::c4_windows(docs, tokenizer, ctx, windows)?;
                (tokens, docs.len(), "gptq-c4-sample")
            }
        };
        if tokens.len() <= usize::from(tokenizer.adds_bos()) {
            return Err(empty("has no tokens"));
        }
        let plan = match method {
            Method::Exl3 => plan::exl3(&tokens, ctx, stride.unwrap_or(1), rows)?,
            Method::Llamacpp => {
                let overwrite = if tokenizer.adds_bos() { bos } else { None };
                plan::llamacpp(&tokens, ctx, overwrite, rows)?
            }
            Method::Gptq => plan::gptq(&tokens, ctx, rows)?,
            Method::HfStride => plan::hf_stride(&tokens, ctx, stride.unwrap_or(1))?,
            Method::LmEval => unreachable!("handled above"),
            Method::Task => {
                return Err(Error::InvalidArgument(
                    "a task's windows come from its items (--task), not from a text".into(),
                ));
            }
        };
        let bos_text = if method == Method::Llamacpp && tokenizer.adds_bos() {
            format!("{bos_note}; BOS written over position 0 of every chunk")
        } else {
            bos_note
        };
        (plan, tokens.len(), n_docs, bos_text, text_label)
    };
    Ok((
        plan,
        ResolvedSettings {
            data: data.name.clone(),
            data_fingerprint: data.fingerprint.clone(),
            text: text.into(),
            method,
            ctx,
            stride,
            rows,
            defaults,
            n_tokens,
            n_docs,
            bos: bos_text,
        },
    ))
}

/// lm-eval's documents as (original page, text fed to the tokenizer). Each document is
/// tokenized without special tokens and conditioned on one prefix token (BOS, else EOS): the
/// behaviour of lm-eval up to v0.4.9; from v0.4.10 its HF backend also lets the tokenizer add
/// a BOS, so the first window reads `[BOS, BOS, ...]` (methods.md §3). A WikiText text is split
/// into its articles and detokenized like lm-eval's `wikitext` task; JSONL or parquet rows are
/// one document each; any other text is one document, unchanged.
fn lm_eval_documents(data: &Data, view: Option<TextView>) -> Result<Vec<(String, String)>> {
    if view.is_some() {
        return Err(Error::InvalidArgument(
            "--text does not apply to --method lm-eval: it reads whole documents".into(),
        ));
    }
    match &data.body {
        _ if data.named.is_some() => Err(Error::InvalidArgument(format!(
            "--method lm-eval reads whole documents, and {} holds rows: give lm-eval's text \
             (e.g. the raw wiki.test.raw) with --data FILE",
            data.name
        ))),
        Body::Text(text) => {
            let pages = data::wikitext_documents(text);
            Ok(if pages.len() > 1 {
                pages
                    .into_iter()
                    .map(|p| {
                        let t = data::wikitext_detokenize(&p);
                        (p, t)
                    })
                    .collect()
            } else {
                vec![(text.clone(), text.clone())]
            })
        }
        Body::Rows { rows, .. } | Body::GptqC4(rows) => {
            Ok(rows.iter().map(|d| (d.clone(), d.clone())).collect())
        }
    }
}

/// The view of rows: `hf-rows` (all rows joined) unless `hf-rows-nonempty` is asked for; a
/// raw view has no meaning for rows.
fn row_view(asked: Option<TextView>, defaults: &mut Vec<String>) -> Result<TextView> {
    match asked {
        None => {
            defaults.push("text=hf-rows (rows joined)".to_string());
            Ok(TextView::HfRows)
        }
        Some(TextView::Raw) => Err(Error::InvalidArgument(
            "--text raw applies to a text file; rows (JSONL, parquet, a named data set) are \
             joined (hf-rows) or joined without blank rows (hf-rows-nonempty)"
                .into(),
        )),
        Some(view) => Ok(view),
    }
}

pub fn method_name(m: Method) -> &'static str {
    match m {
        Method::Exl3 => "exl3",
        Method::Llamacpp => "llamacpp",
        Method::Gptq => "gptq",
        Method::HfStride => "hf-stride",
        Method::LmEval => "lm-eval",
        Method::Task => "task",
    }
}

fn view_name(v: TextView) -> &'static str {
    match v {
        TextView::Raw => "raw",
        TextView::HfRows => "hf-rows",
        TextView::HfRowsNonEmpty => "hf-rows-nonempty",
    }
}
