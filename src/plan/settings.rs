//! From user settings to a plan: load the text, tokenize it as the method's reference tool
//! does (BOS included or not), fill in defaults, and build the windows.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::checkpoint::ModelConfig;
use crate::data::{self, TextTokenizer, TextView};
use crate::plan::{self, DocStats, Method, Plan};
use crate::{Error, Result};

/// Rows ExLlamaV3 evaluates by default (`ppl.py --rows`, the `*_large` compare_q specs).
pub const EXL3_DEFAULT_ROWS: usize = 100;

#[derive(Clone, Debug)]
pub struct PlanSettings {
    /// Text file (raw or .jsonl); `None` = the bundled WikiText-2 test file.
    pub data: Option<PathBuf>,
    pub text: TextView,
    pub method: Method,
    pub ctx: Option<usize>,
    pub stride: Option<usize>,
    pub rows: Option<usize>,
}

/// The settings actually used, with the defaults that were filled in named.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ResolvedSettings {
    pub data: String,
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
    let strided = matches!(settings.method, Method::Exl3 | Method::HfStride);
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
                method_name(settings.method)
            )));
        }
        None
    };
    let rows = match (settings.method, settings.rows) {
        (_, Some(0)) => return Err(Error::InvalidArgument("--rows must be at least 1".into())),
        (Method::Exl3, None) => {
            defaults.push(format!("rows={EXL3_DEFAULT_ROWS}"));
            Some(EXL3_DEFAULT_ROWS)
        }
        (Method::HfStride | Method::LmEval, Some(_)) => {
            return Err(Error::InvalidArgument(format!(
                "--rows does not apply to --method {}: it scores every token once",
                method_name(settings.method)
            )));
        }
        (_, r) => r,
    };
    let (path, data_name) = match &settings.data {
        Some(p) => (p.clone(), p.display().to_string()),
        None => (
            crate::assets::wikitext_path()?,
            crate::assets::WIKITEXT_NAME.to_string(),
        ),
    };
    let bos = tokenizer.bos_id();
    let bos_note = match bos {
        Some(b) if tokenizer.adds_bos() => format!("tokenizer adds BOS {b}"),
        Some(b) => format!("BOS {b}, not added by the tokenizer"),
        None => "no BOS".to_string(),
    };
    let empty = |why: &str| Error::Dataset {
        path: path.clone(),
        why: why.to_string(),
    };
    let (plan, n_tokens, n_docs, bos_text) = if settings.method == Method::LmEval {
        let docs = lm_eval_documents(&path, settings.text)?;
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
        )
    } else {
        let docs = data::load_documents(&path, settings.text)?;
        let text = docs.join("\n\n");
        let tokens = tokenizer.encode(&text, true)?;
        if tokens.len() <= usize::from(tokenizer.adds_bos()) {
            return Err(empty("has no tokens"));
        }
        let plan = match settings.method {
            Method::Exl3 => plan::exl3(&tokens, ctx, stride.unwrap_or(1), rows)?,
            Method::Llamacpp => {
                let overwrite = if tokenizer.adds_bos() { bos } else { None };
                plan::llamacpp(&tokens, ctx, overwrite, rows)?
            }
            Method::Gptq => plan::gptq(&tokens, ctx, rows)?,
            Method::HfStride => plan::hf_stride(&tokens, ctx, stride.unwrap_or(1))?,
            Method::LmEval => unreachable!("handled above"),
        };
        let bos_text = if settings.method == Method::Llamacpp && tokenizer.adds_bos() {
            format!("{bos_note}; BOS written over position 0 of every chunk")
        } else {
            bos_note
        };
        (plan, tokens.len(), docs.len(), bos_text)
    };
    Ok((
        plan,
        ResolvedSettings {
            data: data_name,
            text: if settings.method == Method::LmEval {
                "lm-eval documents".into()
            } else {
                view_name(settings.text).into()
            },
            method: settings.method,
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
/// a BOS, so the first window reads `[BOS, BOS, ...]` (methods.md §3). A WikiText file is split
/// into its articles and detokenized like lm-eval's `wikitext` task; a .jsonl file gives one
/// document per line; any other file is one document, unchanged.
fn lm_eval_documents(path: &std::path::Path, view: TextView) -> Result<Vec<(String, String)>> {
    let docs = data::load_documents(path, view)?;
    if docs.len() == 1 {
        let pages = data::wikitext_documents(&docs[0]);
        if pages.len() > 1 {
            return Ok(pages
                .into_iter()
                .map(|p| {
                    let t = data::wikitext_detokenize(&p);
                    (p, t)
                })
                .collect());
        }
    }
    Ok(docs.into_iter().map(|d| (d.clone(), d)).collect())
}

pub fn method_name(m: Method) -> &'static str {
    match m {
        Method::Exl3 => "exl3",
        Method::Llamacpp => "llamacpp",
        Method::Gptq => "gptq",
        Method::HfStride => "hf-stride",
        Method::LmEval => "lm-eval",
    }
}

fn view_name(v: TextView) -> &'static str {
    match v {
        TextView::Raw => "raw",
        TextView::HfRows => "hf-rows",
        TextView::HfRowsNonEmpty => "hf-rows-nonempty",
    }
}
