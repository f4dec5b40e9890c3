//! Window plans: which token ids each forward pass reads and which positions it scores.
//!
//! One pure function per community method, each reproducing that tool's loop exactly
//! (`docs/methods.md` gives the source lines). Plans know nothing of models or GPUs, so the
//! same plan gives the same scored tokens on every backend and batch size.

use serde::{Deserialize, Serialize};

use crate::backend::Branches;
use crate::data::python_word_count;
use crate::{Error, Result};

/// The evaluation method whose windows and scoring rule are reproduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// ExLlamaV3 `compare_q.py` / `ppl.py`: overlapping rows, all positions scored.
    Exl3,
    /// llama.cpp `llama-perplexity`: BOS-led chunks, second half scored.
    Llamacpp,
    /// GPTQ / AWQ / QuIP# papers: disjoint rows, all positions scored.
    Gptq,
    /// transformers "Perplexity of fixed-length models" guide: strided, each token once.
    HfStride,
    /// lm-evaluation-harness `loglikelihood_rolling` over documents.
    LmEval,
    /// A multiple-choice task's requests (`--task`; lm-eval's `loglikelihood`), not a
    /// method one asks for.
    #[value(skip)]
    Task,
}

/// One forward pass. `targets[j]` is the token that the logits at position `j` are scored
/// against, or `-1` where position `j` is not scored (i32 so it can be uploaded as is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub ids: Vec<u32>,
    pub targets: Vec<i32>,
    /// Index of the document the window belongs to (0 for single-stream methods).
    pub doc: u32,
    /// Rows after a common prefix split into branches (a task item's continuations).
    pub branches: Option<Branches>,
}

impl Window {
    /// Number of scored positions.
    pub fn scored(&self) -> usize {
        self.targets.iter().filter(|&&t| t >= 0).count()
    }
}

/// lm-eval's per-document normalisers, both taken from the ORIGINAL page (before
/// detokenization), as lm-eval's `process_results` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DocStats {
    /// `len(re.split(r"\s+", page))`.
    pub words: u64,
    /// `len(page.encode("utf-8"))`.
    pub bytes: u64,
}

impl DocStats {
    pub fn of_page(page: &str) -> Self {
        DocStats {
            words: python_word_count(page),
            bytes: page.len() as u64,
        }
    }
}

/// The full list of windows for one evaluation, in the order results are aggregated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub method: Method,
    pub windows: Vec<Window>,
    /// Word and byte counts per document (lm-eval only; empty otherwise).
    pub docs: Vec<DocStats>,
    /// Documents the plan was built from (1 for single-stream methods).
    pub n_docs: usize,
    /// Tokens in the input stream(s).
    pub n_tokens: usize,
}

impl Plan {
    /// Total scored positions over all windows.
    pub fn scored(&self) -> usize {
        self.windows.iter().map(Window::scored).sum()
    }

    /// Tokens through the model over all windows (overlaps counted each time).
    pub fn forwarded(&self) -> u64 {
        self.windows.iter().map(|w| w.ids.len() as u64).sum()
    }

    /// The longest window: the context the models are loaded for.
    pub fn max_window(&self) -> usize {
        self.windows.iter().map(|w| w.ids.len()).max().unwrap_or(1)
    }

    /// lm-eval's word and byte counts summed over the plan's documents (`None` for other
    /// methods). lm-eval divides corpus-level sums, so the sums are all a report needs.
    pub fn summed_docs(&self) -> Option<DocStats> {
        (!self.docs.is_empty()).then(|| DocStats {
            words: self.docs.iter().map(|d| d.words).sum(),
            bytes: self.docs.iter().map(|d| d.bytes).sum(),
        })
    }

    /// Attaches lm-eval's per-document word/byte counts; one per document of the plan.
    pub fn with_docs(mut self, docs: Vec<DocStats>) -> Result<Self> {
        if docs.len() != self.n_docs {
            return Err(Error::InvalidArgument(format!(
                "{} document statistics given for a plan of {} documents",
                docs.len(),
                self.n_docs
            )));
        }
        self.docs = docs;
        Ok(self)
    }

    /// A plan of `windows` cut from one stream of `n_tokens` tokens.
    pub(crate) fn single(method: Method, windows: Vec<Window>, n_tokens: usize) -> Self {
        Plan {
            method,
            windows,
            docs: Vec::new(),
            n_docs: 1,
            n_tokens,
        }
    }
}

fn at_least(flag: &str, value: usize, min: usize) -> Result<()> {
    if value < min {
        return Err(Error::InvalidArgument(format!(
            "--{flag} must be at least {min}"
        )));
    }
    Ok(())
}

fn check_max(flag: &str, max: Option<usize>) -> Result<usize> {
    match max {
        Some(m) => at_least(flag, m, 1).map(|()| m),
        None => Ok(usize::MAX),
    }
}

/// Targets are i32 on the device; token ids never reach 2^31 in practice, but a corrupt
/// stream must not silently wrap into "not scored".
fn check_ids(tokens: &[u32]) -> Result<()> {
    match tokens.iter().find(|&&t| i32::try_from(t).is_err()) {
        Some(t) => Err(Error::InvalidArgument(format!(
            "token id {t} does not fit a signed 32-bit target"
        ))),
        None => Ok(()),
    }
}

fn too_few(method: &str, n: usize, needed: usize, why: &str) -> Error {
    Error::InvalidArgument(format!(
        "{method}: the text has {n} tokens, at least {needed} are needed ({why})"
    ))
}

/// Window over `ids` scoring position `j` against `ids[j+1]` for `j` in `scored`.
fn next_token_window(ids: Vec<u32>, scored: std::ops::Range<usize>, doc: u32) -> Window {
    let targets = (0..ids.len())
        .map(|j| {
            if scored.contains(&j) && j + 1 < ids.len() {
                ids[j + 1] as i32
            } else {
                -1
            }
        })
        .collect();
    Window {
        ids,
        targets,
        doc,
        branches: None,
    }
}

/// ExLlamaV3 `compare_q.py` `get_test_data` / `ppl.py` (methods.md §1.2–1.4): rows
/// `T[a:a+ctx]` for `a in range(0, len(T) - ctx, stride)` — strict `<`, so a window ending
/// exactly at the last token is skipped — capped at `max_rows`. Every position but the last is
/// scored against the next token of the row (`ctx - 1` per row); overlapping tokens count once
/// per row, as in ExLlamaV3's token-weighted mean.
pub fn exl3(tokens: &[u32], ctx: usize, stride: usize, max_rows: Option<usize>) -> Result<Plan> {
    at_least("ctx", ctx, 2)?;
    at_least("stride", stride, 1)?;
    let max_rows = check_max("rows", max_rows)?;
    check_ids(tokens)?;
    let n = tokens.len();
    if n <= ctx {
        return Err(too_few(
            "exl3",
            n,
            ctx + 1,
            "rows start at range(0, n_tokens - ctx, stride)",
        ));
    }
    let windows = (0..n - ctx)
        .step_by(stride)
        .take(max_rows)
        .map(|a| next_token_window(tokens[a..a + ctx].to_vec(), 0..ctx - 1, 0))
        .collect();
    Ok(Plan::single(Method::Exl3, windows, n))
}

/// llama.cpp `perplexity()` (methods.md §2.1): `n_chunk = len(T) / ctx`, capped at
/// `max_chunks`; chunk `i` is `T[i*ctx..(i+1)*ctx]` with `ids[0]` overwritten by `bos` when
/// given (pass it when the vocab has `add_bos`); logits `ctx/2 ..= ctx-2` are scored against
/// the ORIGINAL tokens `j+1` (the overwrite changes only the input). Like llama.cpp it needs
/// `len(T) >= 2*ctx`.
pub fn llamacpp(
    tokens: &[u32],
    ctx: usize,
    bos: Option<u32>,
    max_chunks: Option<usize>,
) -> Result<Plan> {
    // ctx/2 ..= ctx-2 is empty below 3.
    at_least("ctx", ctx, 3)?;
    let max_chunks = check_max("rows", max_chunks)?;
    check_ids(tokens)?;
    let n = tokens.len();
    let needed = ctx.saturating_mul(2);
    if n < needed {
        return Err(too_few(
            "llamacpp",
            n,
            needed,
            "llama.cpp requires 2 x ctx tokens",
        ));
    }
    let first = ctx / 2;
    let windows = (0..(n / ctx).min(max_chunks))
        .map(|i| {
            let start = i * ctx;
            let mut w = next_token_window(tokens[start..start + ctx].to_vec(), first..ctx - 1, 0);
            if let Some(b) = bos {
                w.ids[0] = b;
            }
            w
        })
        .collect();
    Ok(Plan::single(Method::Llamacpp, windows, n))
}

/// The GPTQ paper convention (`IST-DASLab/gptq` `llama_eval`, methods.md §4): disjoint rows
/// `T[i*L:(i+1)*L]` for `i < len(T) / L` (tail dropped), capped at `max_rows`, all `L-1`
/// positions scored. GPTQ averages per-row mean losses; rows have equal length, so that equals
/// the token-weighted mean used here.
pub fn gptq(tokens: &[u32], seqlen: usize, max_rows: Option<usize>) -> Result<Plan> {
    at_least("ctx", seqlen, 2)?;
    let max_rows = check_max("rows", max_rows)?;
    check_ids(tokens)?;
    let n = tokens.len();
    if n < seqlen {
        return Err(too_few("gptq", n, seqlen, "one row of ctx tokens"));
    }
    let windows = (0..(n / seqlen).min(max_rows))
        .map(|i| {
            let row = tokens[i * seqlen..(i + 1) * seqlen].to_vec();
            next_token_window(row, 0..seqlen - 1, 0)
        })
        .collect();
    Ok(Plan::single(Method::Gptq, windows, n))
}

/// The transformers guide loop (methods.md §4): for `begin in range(0, len(T), stride)`,
/// `end = min(begin + max_length, len(T))`, `trg_len = end - prev_end`; window `T[begin:end]`
/// with labels before the last `trg_len` masked, and the model's internal shift drops label 0.
/// So position `j` is scored against `ids[j+1]` when `j+1 >= max(len - trg_len, 1)`; the loop
/// stops after the window that reaches the end (which may be shorter). With
/// `stride < max_length` every token but token 0 is scored exactly once; with
/// `stride == max_length` (disjoint) the first token of each window is not scored.
///
/// Weights are the exact scored counts. The guide's current text weights each window's mean
/// loss by `n_valid = labels != -100 count - 1`, which undercounts windows after the first by
/// one; summing per-token NLLs avoids that bias. `stride > max_length` is refused because the
/// guide would then skip tokens, and windows with nothing to score are left out.
pub fn hf_stride(tokens: &[u32], max_length: usize, stride: usize) -> Result<Plan> {
    at_least("ctx", max_length, 2)?;
    at_least("stride", stride, 1)?;
    if stride > max_length {
        return Err(Error::InvalidArgument(format!(
            "--stride {stride} must not exceed --ctx {max_length} for hf-stride (tokens between windows would never be scored)"
        )));
    }
    check_ids(tokens)?;
    let n = tokens.len();
    if n < 2 {
        return Err(too_few("hf-stride", n, 2, "one scored token"));
    }
    let mut windows = Vec::new();
    let mut prev_end = 0;
    for begin in (0..n).step_by(stride) {
        let end = (begin + max_length).min(n);
        let len = end - begin;
        let trg_len = end - prev_end;
        let first_label = len.saturating_sub(trg_len).max(1);
        let w = next_token_window(tokens[begin..end].to_vec(), first_label - 1..len - 1, 0);
        if w.scored() > 0 {
            windows.push(w);
        }
        prev_end = end;
        if end == n {
            break;
        }
    }
    Ok(Plan::single(Method::HfStride, windows, n))
}

/// lm-evaluation-harness `loglikelihood_rolling` (methods.md §3): `get_rolling_token_windows`
/// with `context_len = 1` followed by `make_disjoint_window`, as the HF backend feeds it
/// (`(ctx + cont)[-(max_length+1):][:-1]`). Per document of `n` tokens:
/// * first window: `[prefix_token] + T[:first-1]`, `first = min(max_seq_len, n)`, all
///   positions scored against `T[:first]` (the first token is conditioned on the prefix only);
/// * then, while tokens remain, `w = min(n - predicted, max_seq_len)`, `end = predicted + w`:
///   input `T[end-max_seq_len-1 : end-1]`, and only its last `w` positions are scored (against
///   `T[end-w:end]`). Full windows are disjoint; the final partial one re-reads earlier tokens
///   as context without scoring them again.
///
/// Every token is scored exactly once. A document shorter than `max_seq_len` gives one shorter
/// window; an empty document gives none. (The vLLM backend passes `max_length - 2`.)
pub fn lm_eval(doc_tokens: &[Vec<u32>], prefix_token: u32, max_seq_len: usize) -> Result<Plan> {
    at_least("ctx", max_seq_len, 1)?;
    check_ids(&[prefix_token])?;
    let l = max_seq_len;
    let mut windows = Vec::new();
    let mut n_tokens = 0;
    for (d, toks) in doc_tokens.iter().enumerate() {
        check_ids(toks)?;
        let doc = u32::try_from(d)
            .map_err(|_| Error::InvalidArgument(format!("too many documents ({d})")))?;
        let n = toks.len();
        n_tokens += n;
        if n == 0 {
            continue;
        }
        let first = l.min(n);
        let mut ids = Vec::with_capacity(first);
        ids.push(prefix_token);
        ids.extend_from_slice(&toks[..first - 1]);
        let targets = toks[..first].iter().map(|&t| t as i32).collect();
        windows.push(Window {
            ids,
            targets,
            doc,
            branches: None,
        });
        let mut predicted = first;
        while predicted < n {
            let w = (n - predicted).min(l);
            let end = predicted + w;
            // end >= l + 1 here because the first window was full.
            let ids = toks[end - l - 1..end - 1].to_vec();
            let targets = (0..l)
                .map(|j| {
                    if j >= l - w {
                        toks[end - l + j] as i32
                    } else {
                        -1
                    }
                })
                .collect();
            windows.push(Window {
                ids,
                targets,
                doc,
                branches: None,
            });
            predicted += w;
        }
    }
    if windows.is_empty() {
        return Err(Error::InvalidArgument(
            "lm-eval: no document has any tokens".into(),
        ));
    }
    Ok(Plan {
        method: Method::LmEval,
        windows,
        docs: Vec::new(),
        n_docs: doc_tokens.len(),
        n_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// T[i] = 100 + i.
    fn stream(n: u32) -> Vec<u32> {
        (100..100 + n).collect()
    }

    fn w(ids: &[u32], targets: &[i32]) -> Window {
        Window {
            ids: ids.to_vec(),
            targets: targets.to_vec(),
            doc: 0,
            branches: None,
        }
    }

    #[test]
    fn exl3_rows_use_strict_range_and_cap() {
        let t = stream(10);
        let p = exl3(&t, 4, 3, None).unwrap();
        // range(0, 6, 3) = [0, 3]
        assert_eq!(
            p.windows,
            [
                w(&[100, 101, 102, 103], &[101, 102, 103, -1]),
                w(&[103, 104, 105, 106], &[104, 105, 106, -1]),
            ]
        );
        assert_eq!(exl3(&t, 4, 2, None).unwrap().windows.len(), 3); // 0, 2, 4
        assert_eq!(exl3(&t, 4, 2, Some(2)).unwrap().scored(), 6);
        // A window ending exactly at the last token is not used: range(0, 0) is empty.
        let err = exl3(&stream(4), 4, 1, None).unwrap_err().to_string();
        assert!(
            err.contains("has 4 tokens") && err.contains("at least 5"),
            "{err}"
        );
        assert_eq!(exl3(&stream(5), 4, 1, None).unwrap().windows.len(), 1);
    }

    #[test]
    fn llamacpp_overwrites_bos_but_scores_original_tokens() {
        let t = stream(13);
        let p = llamacpp(&t, 6, Some(1), None).unwrap();
        assert_eq!(
            p.windows,
            [
                w(&[1, 101, 102, 103, 104, 105], &[-1, -1, -1, 104, 105, -1]),
                w(&[1, 107, 108, 109, 110, 111], &[-1, -1, -1, 110, 111, -1]),
            ]
        );
        let p = llamacpp(&t, 6, None, Some(1)).unwrap();
        assert_eq!(
            p.windows,
            [w(
                &[100, 101, 102, 103, 104, 105],
                &[-1, -1, -1, 104, 105, -1]
            )]
        );
        let err = llamacpp(&stream(11), 6, None, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("has 11 tokens") && err.contains("at least 12"),
            "{err}"
        );
    }

    #[test]
    fn gptq_rows_are_disjoint_and_drop_the_tail() {
        let p = gptq(&stream(9), 4, None).unwrap();
        assert_eq!(
            p.windows,
            [
                w(&[100, 101, 102, 103], &[101, 102, 103, -1]),
                w(&[104, 105, 106, 107], &[105, 106, 107, -1]),
            ]
        );
        assert_eq!(gptq(&stream(9), 4, Some(1)).unwrap().windows.len(), 1);
        assert!(gptq(&stream(3), 4, None).is_err());
    }

    #[test]
    fn hf_stride_scores_new_tokens_only() {
        let p = hf_stride(&stream(10), 4, 2).unwrap();
        assert_eq!(
            p.windows,
            [
                w(&[100, 101, 102, 103], &[101, 102, 103, -1]),
                w(&[102, 103, 104, 105], &[-1, 104, 105, -1]),
                w(&[104, 105, 106, 107], &[-1, 106, 107, -1]),
                w(&[106, 107, 108, 109], &[-1, 108, 109, -1]),
            ]
        );
        // The last window is shorter when the stream ends inside it.
        let p = hf_stride(&stream(9), 4, 2).unwrap();
        assert_eq!(p.windows[3], w(&[106, 107, 108], &[-1, 108, -1]));
        // Disjoint: the first token of each window is not scored (internal label shift).
        let p = hf_stride(&stream(10), 4, 4).unwrap();
        assert_eq!(
            p.windows,
            [
                w(&[100, 101, 102, 103], &[101, 102, 103, -1]),
                w(&[104, 105, 106, 107], &[105, 106, 107, -1]),
                w(&[108, 109], &[109, -1]),
            ]
        );
        assert!(hf_stride(&stream(10), 4, 5).is_err());
    }

    #[test]
    fn hf_stride_scores_each_token_once() {
        for n in 2..40u32 {
            for l in 2..9 {
                for s in 1..l {
                    let p = hf_stride(&stream(n), l, s).unwrap();
                    let mut seen = vec![0; n as usize + 100];
                    for win in &p.windows {
                        for &t in win.targets.iter().filter(|&&t| t >= 0) {
                            seen[t as usize] += 1;
                        }
                    }
                    assert!(seen[101..100 + n as usize].iter().all(|&c| c == 1));
                    assert_eq!(p.scored(), n as usize - 1, "n {n} l {l} s {s}");
                }
            }
        }
    }

    #[test]
    fn lm_eval_rolling_windows() {
        let docs = vec![vec![1, 2, 3, 4, 5, 6, 7], vec![], vec![8, 9]];
        let p = lm_eval(&docs, 0, 3).unwrap();
        let mut last = w(&[0, 8], &[8, 9]);
        last.doc = 2;
        assert_eq!(
            p.windows,
            [
                w(&[0, 1, 2], &[1, 2, 3]),
                w(&[3, 4, 5], &[4, 5, 6]),
                w(&[4, 5, 6], &[-1, -1, 7]),
                last,
            ]
        );
        assert_eq!(p.scored(), 9);
        assert_eq!(p.n_docs, 3);
        let stats = vec![DocStats::of_page(" a b\n"); 3];
        assert_eq!(p.clone().with_docs(stats).unwrap().docs[0].words, 4);
        assert!(p.with_docs(vec![]).is_err());
        assert!(lm_eval(&[vec![]], 0, 3).is_err());
    }

    #[test]
    fn zero_sizes_are_refused_with_the_flag_name() {
        let t = stream(100);
        let msg = |r: Result<Plan>| r.unwrap_err().to_string();
        assert_eq!(msg(exl3(&t, 8, 0, None)), "--stride must be at least 1");
        assert_eq!(msg(exl3(&t, 0, 1, None)), "--ctx must be at least 2");
        assert_eq!(msg(exl3(&t, 8, 1, Some(0))), "--rows must be at least 1");
        assert_eq!(msg(gptq(&t, 0, None)), "--ctx must be at least 2");
        assert_eq!(
            msg(llamacpp(&t, 8, None, Some(0))),
            "--rows must be at least 1"
        );
        assert_eq!(msg(hf_stride(&t, 8, 0)), "--stride must be at least 1");
        assert_eq!(
            msg(lm_eval(std::slice::from_ref(&t), 0, 0)),
            "--ctx must be at least 1"
        );
    }
}
