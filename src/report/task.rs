//! What `eval --task` and `compare --task` report: lm-eval's multiple-choice metrics (`acc`:
//! the choice of largest log-likelihood; `acc_norm`: of largest log-likelihood per character
//! of the choice, where an item has one context) with lm-eval's standard errors, every item's
//! log-likelihoods, and for a comparison the flips against the base (items the base answers
//! right and the model wrong, or the reverse: Dutta et al., 2024).

use serde::Serialize;

use super::CompareReport;
use super::metrics::ValueUnc;
use super::table::{render_table, short_name};
use super::{Plot, PlotMetric, Rendered};
use crate::data::task::TaskItem;
use crate::run::{RunInfo, Timing};

/// One item's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ItemAnswer {
    /// Per choice, the continuation's log-likelihood (natural log).
    pub loglikelihoods: Vec<f64>,
    pub label: usize,
    /// The choice of largest log-likelihood (the first of equal ones, as numpy's argmax).
    pub pred: usize,
    /// The choice of largest log-likelihood per character; `None` for a context per choice.
    pub pred_norm: Option<usize>,
}

/// A model's answers to a task and its accuracies.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TaskScores {
    pub model: String,
    pub acc: ValueUnc,
    /// Where every item has one context (lm-eval computes it for those tasks).
    pub acc_norm: Option<ValueUnc>,
    pub items: Vec<ItemAnswer>,
}

fn argmax(values: impl Iterator<Item = f64>) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (i, v) in values.enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0
}

/// A fraction of `n` right with lm-eval's standard error (`sqrt(p (1 - p) / (n - 1))`, the
/// sample standard deviation over `sqrt(n)`).
fn accuracy(right: usize, n: usize) -> ValueUnc {
    let p = right as f64 / n as f64;
    ValueUnc {
        value: p,
        unc: if n > 1 {
            (p * (1.0 - p) / (n - 1) as f64).sqrt()
        } else {
            0.0
        },
    }
}

impl TaskScores {
    /// `lls[i][k]`: item `i`'s choice `k` log-likelihood.
    pub fn new(model: String, items: &[TaskItem], lls: &[Vec<f64>]) -> Self {
        let answers: Vec<ItemAnswer> = items
            .iter()
            .zip(lls)
            .map(|(item, ll)| ItemAnswer {
                loglikelihoods: ll.clone(),
                label: item.label,
                pred: argmax(ll.iter().copied()),
                pred_norm: item.shared_context.then(|| {
                    argmax(
                        ll.iter()
                            .zip(&item.choice_chars)
                            .map(|(l, &c)| l / c as f64),
                    )
                }),
            })
            .collect();
        let n = answers.len();
        let right = answers.iter().filter(|a| a.pred == a.label).count();
        let acc_norm = answers.iter().all(|a| a.pred_norm.is_some()).then(|| {
            let right = answers
                .iter()
                .filter(|a| a.pred_norm == Some(a.label))
                .count();
            accuracy(right, n)
        });
        TaskScores {
            model,
            acc: accuracy(right, n),
            acc_norm,
            items: answers,
        }
    }

    fn right(&self) -> impl Iterator<Item = bool> + '_ {
        self.items.iter().map(|a| a.pred == a.label)
    }
}

/// Items answered differently from the base (by `acc`'s choice).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TaskFlips {
    /// Right under the base, wrong under the model.
    pub right_to_wrong: usize,
    pub wrong_to_right: usize,
    /// Both kinds over the items.
    pub rate: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TaskReport {
    pub quantppl_version: &'static str,
    pub task: String,
    pub items: usize,
    /// `eval --task`: the model; `compare --task`: the base.
    pub scores: TaskScores,
    /// `compare --task`: each quantized model with its flips against the base.
    pub compared: Vec<(TaskScores, TaskFlips)>,
    /// `compare --task`: the KL divergence and the rest of `compare`'s statistics over the
    /// positions of the choices' tokens, from the pass that scored them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comparison: Option<CompareReport>,
    /// How the requests ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<TaskRun>,
    /// The whole command: reading and encoding the task, loading, the forward passes.
    pub wall_seconds: f64,
}

/// How a task's requests ran: their windows (an item's requests share one where the model
/// allows), the tokens forwarded through each model, and the time spent.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TaskRun {
    pub backend: String,
    pub devices: usize,
    pub windows: usize,
    pub forwarded_tokens: u64,
    pub batch_tokens: usize,
    pub load_seconds: f64,
    /// Loading and the forward passes.
    pub run_seconds: f64,
}

impl TaskRun {
    pub fn of(info: &RunInfo, timing: &Timing) -> Self {
        TaskRun {
            backend: info.backend.clone(),
            devices: info.devices,
            windows: info.windows,
            forwarded_tokens: info.forwarded_tokens,
            batch_tokens: info.batch_tokens,
            load_seconds: timing.load_seconds,
            run_seconds: timing.wall_seconds,
        }
    }

    fn line(&self) -> String {
        let forward = self.run_seconds - self.load_seconds;
        format!(
            "{} windows, {} tokens a model in batches of up to {} on {}{}: loading {:.1} s, \
             forward passes {:.1} s ({:.0} tokens/s)",
            self.windows,
            self.forwarded_tokens,
            self.batch_tokens,
            self.backend,
            if self.devices > 1 {
                format!(" x {}", self.devices)
            } else {
                String::new()
            },
            self.load_seconds,
            forward,
            self.forwarded_tokens as f64 / forward.max(1e-9)
        )
    }
}

impl TaskReport {
    pub fn new(task: String, scores: TaskScores, quantized: Vec<TaskScores>, secs: f64) -> Self {
        let compared = quantized
            .into_iter()
            .map(|q| {
                let (mut rw, mut wr) = (0, 0);
                for (b, m) in scores.right().zip(q.right()) {
                    rw += usize::from(b && !m);
                    wr += usize::from(!b && m);
                }
                let n = q.items.len().max(1);
                let flips = TaskFlips {
                    right_to_wrong: rw,
                    wrong_to_right: wr,
                    rate: (rw + wr) as f64 / n as f64,
                };
                (q, flips)
            })
            .collect();
        TaskReport {
            quantppl_version: env!("CARGO_PKG_VERSION"),
            items: scores.items.len(),
            task,
            scores,
            compared,
            comparison: None,
            run: None,
            wall_seconds: secs,
        }
    }

    /// With how its requests ran.
    pub fn with_run(self, run: TaskRun) -> Self {
        Self {
            run: Some(run),
            ..self
        }
    }

    /// With `compare`'s report over the task's positions.
    pub fn with_comparison(self, comparison: CompareReport) -> Self {
        Self {
            comparison: Some(comparison),
            ..self
        }
    }

    fn table(&self, markdown: bool) -> String {
        let pct = |v: &ValueUnc| format!("{:.2} ± {:.2} %", 100.0 * v.value, 100.0 * v.unc);
        let norm = |s: &TaskScores| s.acc_norm.as_ref().map_or("-".into(), pct);
        let mut rows = vec![vec![
            short_name(&self.scores.model)
                + if self.compared.is_empty() {
                    ""
                } else {
                    " (base)"
                },
            pct(&self.scores.acc),
            norm(&self.scores),
            "-".into(),
            "-".into(),
        ]];
        for (q, f) in &self.compared {
            rows.push(vec![
                short_name(&q.model),
                pct(&q.acc),
                norm(q),
                format!("{} / {}", f.right_to_wrong, f.wrong_to_right),
                format!("{:.2} %", 100.0 * f.rate),
            ]);
        }
        let header = [
            "Model",
            "acc",
            "acc_norm",
            "Flips (right→wrong / wrong→right)",
            "Flip rate",
        ];
        render_table(&header, &rows, markdown)
    }
}

impl Rendered for TaskReport {
    fn to_text(&self) -> String {
        let mut text = format!(
            "task         {} ({} items; lm-eval's multiple-choice scoring)\n\n{}\n",
            self.task,
            self.items,
            self.table(false),
        );
        if let Some(run) = &self.run {
            text += &format!("{}\n", run.line());
        }
        text += &format!("{:.2} s in all\n", self.wall_seconds);
        if let Some(c) = &self.comparison {
            text += "\nOver the positions of the choices' tokens, the same pass:\n\n";
            text += &c.to_text();
        }
        text
    }

    fn to_markdown(&self) -> String {
        match &self.comparison {
            Some(c) => format!("{}\n{}", self.table(true), c.to_markdown()),
            None => self.table(true),
        }
    }

    fn plot_points(&self, _metric: PlotMetric) -> crate::Result<Plot> {
        Err(crate::Error::InvalidArgument(
            "--plot draws perplexity or KL divergence, not --task accuracy".into(),
        ))
    }
}
