//! Statistics over per-token NLLs, in f64 and in window order, so that a result does not
//! depend on batch size, backend count or completion order. Formulas follow the tools whose
//! numbers we reproduce: llama.cpp (`perplexity.cpp`: PPL stderr, the `--kl-divergence`
//! report), lm-eval (word/byte perplexity, bits per byte) and ExLlamaV3 (KLD by reference
//! confidence).

use serde::{Deserialize, Serialize};

use crate::backend::{KldTerms, TOP_KS};
use crate::plan::DocStats;
use crate::run::layer_drift::LayerSums;

/// Running sums of per-token NLLs (natural log).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct NllStats {
    pub sum: f64,
    pub sum_sq: f64,
    pub count: u64,
}

impl NllStats {
    pub fn push(&mut self, nll: f64) {
        self.sum += nll;
        self.sum_sq += nll * nll;
        self.count += 1;
    }

    /// Adds another accumulator's sums (for results gathered per window, merged in order).
    pub fn merge(&mut self, other: &NllStats) {
        self.sum += other.sum;
        self.sum_sq += other.sum_sq;
        self.count += other.count;
    }

    /// Mean NLL; NaN when nothing was scored.
    pub fn mean(&self) -> f64 {
        self.sum / self.count as f64
    }

    /// `exp(mean NLL)`, token-weighted.
    pub fn ppl(&self) -> f64 {
        self.mean().exp()
    }

    /// llama.cpp's standard error of the mean NLL, `sqrt((mean(nll²) - mean²) / (n-1))`;
    /// 0 where llama.cpp prints no estimate (variance not positive, or fewer than 2 tokens).
    pub fn stderr_nll(&self) -> f64 {
        if self.count < 2 {
            return 0.0;
        }
        let n = self.count as f64;
        let mean = self.sum / n;
        let var = self.sum_sq / n - mean * mean;
        if var > 0.0 {
            (var / (n - 1.0)).sqrt()
        } else {
            0.0
        }
    }

    /// llama.cpp's `Final estimate: PPL = x +/- stderr_nll·PPL`.
    pub fn stderr_ppl(&self) -> f64 {
        self.stderr_nll() * self.ppl()
    }
}

/// `exp(-LL / words)`: lm-eval's `word_perplexity` from the summed log-likelihood.
pub fn word_perplexity(total_ll: f64, words: u64) -> f64 {
    (-total_ll / words as f64).exp()
}

/// `exp(-LL / bytes)`: lm-eval's `byte_perplexity`.
pub fn byte_perplexity(total_ll: f64, bytes: u64) -> f64 {
    (-total_ll / bytes as f64).exp()
}

/// `-(LL / bytes) / ln 2`: lm-eval's `bits_per_byte` (= log2 of the byte perplexity).
pub fn bits_per_byte(total_ll: f64, bytes: u64) -> f64 {
    -(total_ll / bytes as f64) / std::f64::consts::LN_2
}

/// lm-eval's three `wikitext` metrics (it reports no token-level perplexity).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LmEvalReport {
    /// Sum over documents of the log-likelihood (= -sum of NLLs).
    pub log_likelihood: f64,
    pub words: u64,
    pub bytes: u64,
    pub word_perplexity: f64,
    pub byte_perplexity: f64,
    pub bits_per_byte: f64,
}

impl LmEvalReport {
    /// From the NLLs of every scored token and the per-document counts; lm-eval sums
    /// log-likelihoods and counts over all documents before dividing (corpus-level).
    pub fn new(nll: &NllStats, docs: &[DocStats]) -> Self {
        let log_likelihood = -nll.sum;
        let words = docs.iter().map(|d| d.words).sum();
        let bytes = docs.iter().map(|d| d.bytes).sum();
        LmEvalReport {
            log_likelihood,
            words,
            bytes,
            word_perplexity: word_perplexity(log_likelihood, words),
            byte_perplexity: byte_perplexity(log_likelihood, bytes),
            bits_per_byte: bits_per_byte(log_likelihood, bytes),
        }
    }
}

/// A value with its uncertainty (one standard error), as llama.cpp prints `x ± u`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ValueUnc {
    pub value: f64,
    pub unc: f64,
}

/// llama.cpp `mean_and_uncertainty(sum, sum2, count)`: the mean, and the standard error
/// `sqrt((s2/n - f²)/(n-1))` only when that variance is positive and `n > 10` (else 0).
pub fn mean_and_unc(s: f64, s2: f64, n: u64) -> ValueUnc {
    if n < 1 {
        return ValueUnc {
            value: 0.0,
            unc: 0.0,
        };
    }
    let nf = n as f64;
    let f = s / nf;
    let var = s2 / nf - f * f;
    let unc = if var > 0.0 && n > 10 {
        (var / (nf - 1.0)).sqrt()
    } else {
        0.0
    };
    ValueUnc { value: f, unc }
}

/// llama.cpp `covariance(suma, sumb, sumab, count)`: covariance of the two means,
/// `(ab/n - (a/n)(b/n)) / (n-1)`, 0 when `n < 10`.
pub fn covariance(a: f64, b: f64, ab: f64, n: u64) -> f64 {
    if n < 10 {
        return 0.0;
    }
    let nf = n as f64;
    (ab / nf - (a / nf) * (b / nf)) / (nf - 1.0)
}

/// Percentile of sorted values with llama.cpp's rule: `p = f·(n-1)`, linear interpolation
/// between neighbours (so the median of an even count is the mean of the two middle values).
pub fn percentile(sorted: &[f64], f: f64) -> f64 {
    let (Some(&first), Some(&last)) = (sorted.first(), sorted.last()) else {
        return f64::NAN;
    };
    if f <= 0.0 {
        return first;
    }
    if f >= 1.0 {
        return last;
    }
    let p = f * (sorted.len() - 1) as f64;
    let ip = p.floor() as usize;
    let frac = p - ip as f64;
    let next = sorted[(ip + 1).min(sorted.len() - 1)];
    (1.0 - frac) * sorted[ip] + frac * next
}

/// One percentile of a distribution; `q` is the fraction (1 = maximum, 0.5 = median, 0 = minimum).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentile {
    pub q: f64,
    pub value: f64,
}

/// The KLD percentiles llama.cpp prints (Maximum, 99.9%, ..., Median, ..., 0.1%, Minimum).
pub const KLD_PERCENTILES: [f64; 11] = [
    1.0, 0.999, 0.99, 0.95, 0.90, 0.5, 0.10, 0.05, 0.01, 0.001, 0.0,
];
/// The Δp percentiles llama.cpp prints; unlike KLD they include 75% and 25%.
pub const DP_PERCENTILES: [f64; 13] = [
    1.0, 0.999, 0.99, 0.95, 0.90, 0.75, 0.5, 0.25, 0.10, 0.05, 0.01, 0.001, 0.0,
];
/// ExLlamaV3 qbench buckets of the reference top-token probability, `[lo, hi)`.
pub const CONFIDENCE_BUCKETS: [(f64, f64); 5] = [
    (0.0, 0.25),
    (0.25, 0.5),
    (0.5, 0.75),
    (0.75, 0.95),
    (0.95, 1.01),
];

/// Accumulates llama.cpp's `--kl-divergence` sums plus the per-token values its percentiles
/// and ExLlamaV3's confidence buckets need, the reverse KL and the top-K agreement counts. Push
/// positions in window order.
#[derive(Debug, Clone, Default)]
pub struct KldStats {
    count: u64,
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_dp: f64,
    sum_dp2: f64,
    sum_dp4: f64,
    n_same_top: u64,
    sum_kld_reverse: f64,
    sum_kld_reverse2: f64,
    /// Per K of `TOP_KS`: positions whose rankings agree on the top K in order, the base's
    /// top K tokens among Q's top K (summed), positions with the base's top-1 in Q's top K.
    n_same_ranking: [u64; 3],
    n_shared: [u64; 3],
    n_base_top_in: [u64; 3],
    kld: Vec<f64>,
    kld_reverse: Vec<f64>,
    dp: Vec<f64>,
    base_top_p: Vec<f64>,
}

/// How the base's and Q's most probable tokens agree, for one K.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TopKAgreement {
    pub k: usize,
    /// Fraction of positions whose K most probable tokens are the same, in the same order
    /// (ExLlamaV3 model_diff's "top-K agreement"; K = 1 is llama.cpp's "same top p").
    pub same_ranking: f64,
    /// Mean fraction of the base's K most probable tokens that are among Q's K.
    pub shared: f64,
    /// Fraction of positions where the base's most probable token is among Q's K.
    pub base_top_in_q: f64,
}

/// Positions where the most probable token changes between the base and Q.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Flips {
    pub count: u64,
    /// `count` over the positions compared.
    pub rate: f64,
}

/// KLD statistics of the positions whose base confidence falls in `[lo, hi)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KldBucket {
    pub lo: f64,
    pub hi: f64,
    pub count: u64,
    /// Fraction of all positions in this bucket.
    pub share: f64,
    /// Mean and median KLD; `None` for an empty bucket.
    pub mean: Option<f64>,
    pub median: Option<f64>,
}

/// The llama.cpp KLD report (methods.md §2.4) plus ExLlamaV3's KLD by confidence.
/// Δp values are probabilities (llama.cpp prints them ×100 as percent).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KldReport {
    pub count: u64,
    pub ppl_q: ValueUnc,
    pub ppl_base: ValueUnc,
    /// `Cor(ln(PPL(Q)), ln(PPL(base)))`; `None` when either uncertainty is 0.
    pub cor_ln_ppl: Option<f64>,
    pub ln_ppl_ratio: ValueUnc,
    pub ppl_ratio: ValueUnc,
    pub ppl_diff: ValueUnc,
    pub kld: ValueUnc,
    pub kld_percentiles: Vec<Percentile>,
    pub dp: ValueUnc,
    pub dp_percentiles: Vec<Percentile>,
    pub rms_dp: ValueUnc,
    pub same_top: ValueUnc,
    pub kld_by_confidence: Vec<KldBucket>,
    /// `KL(Q ‖ P_base)`, ExLlamaV3 model_diff's "KL divergence (B, A)".
    pub kld_reverse: ValueUnc,
    pub kld_reverse_percentiles: Vec<Percentile>,
    pub flips: Flips,
    /// For K = 1, 5, 10.
    pub top_k: [TopKAgreement; 3],
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

fn percentiles(sorted: &[f64], qs: &[f64]) -> Vec<Percentile> {
    qs.iter()
        .map(|&q| Percentile {
            q,
            value: percentile(sorted, q),
        })
        .collect()
}

impl KldStats {
    pub fn push(&mut self, t: &KldTerms) {
        self.count += 1;
        self.sum_nll += t.nll_q;
        self.sum_nll2 += t.nll_q * t.nll_q;
        self.sum_nll_base += t.nll_base;
        self.sum_nll_base2 += t.nll_base * t.nll_base;
        self.sum_nll_nll_base += t.nll_q * t.nll_base;
        self.sum_kld += t.kld;
        self.sum_kld2 += t.kld * t.kld;
        let dp = (-t.nll_q).exp() - (-t.nll_base).exp();
        self.sum_dp += dp;
        self.sum_dp2 += dp * dp;
        self.sum_dp4 += dp * dp * dp * dp;
        self.n_same_top += u64::from(t.same_top());
        self.sum_kld_reverse += t.kld_reverse;
        self.sum_kld_reverse2 += t.kld_reverse * t.kld_reverse;
        let top = &t.top;
        for (i, k) in TOP_KS.into_iter().enumerate() {
            self.n_same_ranking[i] += u64::from(usize::from(top.same_ranking) >= k);
            self.n_shared[i] += u64::from(top.shared[i]);
            let rank = usize::from(top.base_top_rank);
            self.n_base_top_in[i] += u64::from((1..=k).contains(&rank));
        }
        self.kld.push(t.kld);
        self.kld_reverse.push(t.kld_reverse);
        self.dp.push(dp);
        self.base_top_p.push(t.base_top_p);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The final report; `None` before any token was pushed. (llama.cpp prints it only from
    /// 100 tokens on; the caller decides whether to show it.)
    pub fn report(&self) -> Option<KldReport> {
        if self.count == 0 {
            return None;
        }
        let n = self.count;
        let log_q = mean_and_unc(self.sum_nll, self.sum_nll2, n);
        let log_b = mean_and_unc(self.sum_nll_base, self.sum_nll_base2, n);
        let ppl_q = ValueUnc {
            value: log_q.value.exp(),
            unc: log_q.value.exp() * log_q.unc,
        };
        let ppl_base = ValueUnc {
            value: log_b.value.exp(),
            unc: log_b.value.exp() * log_b.unc,
        };
        let cov = covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, n);
        let denom = log_q.unc * log_b.unc;
        let cor_ln_ppl = (denom > 0.0).then(|| cov / denom);
        // llama.cpp takes these square roots unguarded; a negative argument (rounding with
        // perfectly correlated inputs) is reported as 0 instead of NaN.
        let ln_ratio_unc = (log_q.unc * log_q.unc + log_b.unc * log_b.unc - 2.0 * cov)
            .max(0.0)
            .sqrt();
        let ln_ppl_ratio = ValueUnc {
            value: log_q.value - log_b.value,
            unc: ln_ratio_unc,
        };
        let ratio = ln_ppl_ratio.value.exp();
        let ppl_ratio = ValueUnc {
            value: ratio,
            unc: ratio * ln_ratio_unc,
        };
        let ppl_cov = ppl_q.value * ppl_base.value * cov;
        let ppl_diff = ValueUnc {
            value: ppl_q.value - ppl_base.value,
            unc: (ppl_q.unc * ppl_q.unc + ppl_base.unc * ppl_base.unc - 2.0 * ppl_cov)
                .max(0.0)
                .sqrt(),
        };
        let mse = mean_and_unc(self.sum_dp2, self.sum_dp4, n);
        let rms = mse.value.sqrt();
        let rms_dp = ValueUnc {
            value: rms,
            unc: if rms > 0.0 { 0.5 / rms * mse.unc } else { 0.0 },
        };
        let same = self.n_same_top as f64 / n as f64;
        let same_top = ValueUnc {
            value: same,
            unc: if n > 1 {
                (same * (1.0 - same) / (n - 1) as f64).sqrt()
            } else {
                0.0
            },
        };
        Some(KldReport {
            count: n,
            ppl_q,
            ppl_base,
            cor_ln_ppl,
            ln_ppl_ratio,
            ppl_ratio,
            ppl_diff,
            kld: mean_and_unc(self.sum_kld, self.sum_kld2, n),
            kld_percentiles: percentiles(&sorted(&self.kld), &KLD_PERCENTILES),
            dp: mean_and_unc(self.sum_dp, self.sum_dp2, n),
            dp_percentiles: percentiles(&sorted(&self.dp), &DP_PERCENTILES),
            rms_dp,
            same_top,
            kld_by_confidence: self.buckets(),
            kld_reverse: mean_and_unc(self.sum_kld_reverse, self.sum_kld_reverse2, n),
            kld_reverse_percentiles: percentiles(&sorted(&self.kld_reverse), &KLD_PERCENTILES),
            flips: Flips {
                count: n - self.n_same_top,
                rate: (n - self.n_same_top) as f64 / n as f64,
            },
            top_k: std::array::from_fn(|i| {
                let k = TOP_KS[i];
                TopKAgreement {
                    k,
                    same_ranking: self.n_same_ranking[i] as f64 / n as f64,
                    shared: self.n_shared[i] as f64 / (n as f64 * k as f64),
                    base_top_in_q: self.n_base_top_in[i] as f64 / n as f64,
                }
            }),
        })
    }

    /// ExLlamaV3 qbench's KLD by reference confidence: share of positions, mean and median
    /// (linear interpolation) KLD per bucket.
    fn buckets(&self) -> Vec<KldBucket> {
        CONFIDENCE_BUCKETS
            .iter()
            .map(|&(lo, hi)| {
                let in_bucket: Vec<f64> = self
                    .kld
                    .iter()
                    .zip(&self.base_top_p)
                    .filter(|&(_, &c)| lo <= c && c < hi)
                    .map(|(&k, _)| k)
                    .collect();
                let count = in_bucket.len() as u64;
                let (mean, median) = if in_bucket.is_empty() {
                    (None, None)
                } else {
                    let mean = in_bucket.iter().sum::<f64>() / count as f64;
                    (Some(mean), Some(percentile(&sorted(&in_bucket), 0.5)))
                };
                KldBucket {
                    lo,
                    hi,
                    count,
                    share: count as f64 / self.count as f64,
                    mean,
                    median,
                }
            })
            .collect()
    }
}

/// One layer's drift from the base (`compare --layers`): means over the compared positions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LayerDrift {
    pub layer: usize,
    /// Mean of `||h_Q - h_base|| / ||h_base||`, the residual streams after the layer.
    pub rel_l2: f64,
    /// Mean cosine similarity of `h_Q` and `h_base`.
    pub cosine: f64,
    /// 1 for the layer with the largest `rel_l2`.
    pub rank: usize,
}

/// Each layer's means from its sums, in layer order, ranked by relative distance (largest
/// first, the earlier layer first among equal ones).
pub fn layer_drift(sums: &[LayerSums]) -> Vec<LayerDrift> {
    let mut out: Vec<LayerDrift> = sums
        .iter()
        .enumerate()
        .map(|(layer, s)| LayerDrift {
            layer,
            rel_l2: s.rel_l2 / s.positions as f64,
            cosine: s.cosine / s.positions as f64,
            rank: 0,
        })
        .collect();
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by(|&a, &b| out[b].rel_l2.total_cmp(&out[a].rel_l2).then(a.cmp(&b)));
    for (rank, &i) in order.iter().enumerate() {
        out[i].rank = rank + 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::TopAgreement;
    use crate::run::layer_drift::add_positions;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * (1.0 + b.abs())
    }

    /// A probability from its NLL.
    fn p(nll: f64) -> f64 {
        (-nll).exp()
    }

    /// Standard error of the mean from the two-pass sample variance, an independent route to
    /// llama.cpp's one-pass formula.
    fn sem(x: &[f64]) -> f64 {
        let n = x.len() as f64;
        let m = x.iter().sum::<f64>() / n;
        let var = x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / n;
        (var / (n - 1.0)).sqrt()
    }

    #[test]
    fn nll_stats_three_tokens() {
        let mut s = NllStats::default();
        for x in [1.0, 2.0, 3.0] {
            s.push(x);
        }
        assert_eq!(s.mean(), 2.0);
        assert!(close(s.ppl(), 2f64.exp()));
        // population variance 2/3, divided by n-1 = 2
        assert!(close(s.stderr_nll(), (1.0f64 / 3.0).sqrt()));
        assert!(close(s.stderr_ppl(), (1.0f64 / 3.0).sqrt() * 2f64.exp()));
        let mut a = NllStats::default();
        a.push(1.0);
        let mut b = NllStats::default();
        b.push(2.0);
        b.push(3.0);
        a.merge(&b);
        assert_eq!(a, s);
        assert_eq!(NllStats::default().stderr_nll(), 0.0);
        assert!(NllStats::default().mean().is_nan());
    }

    #[test]
    fn lm_eval_metrics() {
        let mut s = NllStats::default();
        s.push(4.0);
        s.push(6.0);
        let docs = [
            DocStats { words: 2, bytes: 8 },
            DocStats {
                words: 3,
                bytes: 12,
            },
        ];
        let r = LmEvalReport::new(&s, &docs);
        assert_eq!(r.log_likelihood, -10.0);
        assert!(close(r.word_perplexity, 2f64.exp()));
        assert!(close(r.byte_perplexity, 0.5f64.exp()));
        assert!(close(r.bits_per_byte, 0.5 / 2f64.ln()));
        assert!(close(r.bits_per_byte, r.byte_perplexity.log2()));
    }

    #[test]
    fn percentiles_interpolate_linearly() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 2.5);
        assert!(close(percentile(&v, 0.9), 3.7)); // p = 2.7
        assert_eq!(percentile(&v, 1.0), 4.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[5.0, 1.0, 3.0][..1], 0.3), 5.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn uncertainty_needs_more_than_ten_tokens() {
        let x: Vec<f64> = (0..3).map(f64::from).collect();
        let s2: f64 = x.iter().map(|v| v * v).sum();
        assert_eq!(mean_and_unc(3.0, s2, 3).unc, 0.0);
        assert_eq!(covariance(1.0, 1.0, 1.0, 9), 0.0);
        let x: Vec<f64> = (0..11).map(|i| f64::from(i * i) / 7.0).collect();
        let s: f64 = x.iter().sum();
        let s2: f64 = x.iter().map(|v| v * v).sum();
        let r = mean_and_unc(s, s2, 11);
        assert!(close(r.value, s / 11.0));
        assert!(close(r.unc, sem(&x)));
    }

    /// A position whose top-1 agrees or not; the rest of its ranking agreement is not read.
    fn token(nll_q: f64, nll_base: f64, kld: f64, same_top: bool, conf: f64) -> KldTerms {
        let top = if same_top { [0, 1] } else { [1, 0] };
        KldTerms {
            nll_q,
            nll_base,
            kld,
            kld_reverse: 2.0 * kld,
            base_top_p: conf,
            top: TopAgreement::of(&[0], &top),
        }
    }

    #[test]
    fn kld_report_three_tokens() {
        let toks = [
            token(1.0, 0.5, 0.1, true, 0.1),
            token(2.0, 1.5, 0.3, false, 0.6),
            token(0.5, 0.5, 0.2, true, 0.99),
        ];
        let mut s = KldStats::default();
        for t in &toks {
            s.push(t);
        }
        let r = s.report().unwrap();
        assert_eq!(r.count, 3);
        assert!(close(r.ppl_q.value, (3.5f64 / 3.0).exp()));
        assert!(close(r.ppl_base.value, (2.5f64 / 3.0).exp()));
        assert!(close(r.ln_ppl_ratio.value, 1.0 / 3.0));
        assert!(close(r.ppl_ratio.value, (1.0f64 / 3.0).exp()));
        assert!(close(
            r.ppl_diff.value,
            (3.5f64 / 3.0).exp() - (2.5f64 / 3.0).exp()
        ));
        // n <= 10: llama.cpp reports no uncertainty and no correlation.
        assert_eq!(r.ppl_q.unc, 0.0);
        assert_eq!(r.cor_ln_ppl, None);
        assert!(close(r.kld.value, 0.2));
        let q = |p: &[Percentile], f: f64| p.iter().find(|x| x.q == f).unwrap().value;
        assert_eq!(q(&r.kld_percentiles, 1.0), 0.3);
        assert_eq!(q(&r.kld_percentiles, 0.5), 0.2);
        assert!(close(q(&r.kld_percentiles, 0.9), 0.28)); // p = 1.8
        assert_eq!(q(&r.kld_percentiles, 0.0), 0.1);
        let dp: Vec<f64> = toks.iter().map(|t| p(t.nll_q) - p(t.nll_base)).collect();
        assert!(close(r.dp.value, dp.iter().sum::<f64>() / 3.0));
        assert_eq!(r.dp_percentiles.len(), 13);
        let mse = dp.iter().map(|d| d * d).sum::<f64>() / 3.0;
        assert!(close(r.rms_dp.value, mse.sqrt()));
        assert!(close(r.same_top.value, 2.0 / 3.0));
        assert!(close(r.same_top.unc, (2.0f64 / 9.0 / 2.0).sqrt()));
        let shares: Vec<f64> = r.kld_by_confidence.iter().map(|b| b.share).collect();
        assert!(close(shares.iter().sum(), 1.0));
        assert_eq!(r.kld_by_confidence[0].mean, Some(0.1));
        assert_eq!(r.kld_by_confidence[1].median, None);
        assert_eq!(r.kld_by_confidence[2].count, 1);
        assert_eq!(r.kld_by_confidence[4].median, Some(0.2));
    }

    /// The reverse KLD's mean and percentiles, flips and every top-K fraction, counted by hand
    /// from three positions' rankings.
    #[test]
    fn reverse_kld_top_k_and_flips_count_positions() {
        let base: Vec<u32> = (0..10).collect();
        let qs: [Vec<u32>; 3] = [
            (0..10).collect(),                         // the same ranking
            vec![0, 1, 2, 5, 4, 3, 6, 7, 8, 9],        // the same top 3, then swapped
            vec![1, 0, 20, 21, 22, 23, 24, 25, 26, 2], // a flip; base top-1 2nd
        ];
        let mut s = KldStats::default();
        for (i, q) in qs.iter().enumerate() {
            s.push(&KldTerms {
                kld_reverse: [0.1, 0.2, 0.6][i],
                top: TopAgreement::of(&base, q),
                ..token(1.0, 1.0, 0.0, true, 0.5)
            });
        }
        let r = s.report().unwrap();
        assert!(close(r.kld_reverse.value, 0.3));
        let q = |p: &[Percentile], f: f64| p.iter().find(|x| x.q == f).unwrap().value;
        assert_eq!(q(&r.kld_reverse_percentiles, 0.5), 0.2);
        assert_eq!(q(&r.kld_reverse_percentiles, 1.0), 0.6);
        assert_eq!((r.flips.count, r.flips.rate), (1, 1.0 / 3.0));
        assert!(close(r.same_top.value, 2.0 / 3.0));
        let ks: Vec<usize> = r.top_k.iter().map(|t| t.k).collect();
        assert_eq!(ks, [1, 5, 10]);
        // Same order up to K: 10, 3 and 0 places.
        let same: Vec<f64> = r.top_k.iter().map(|t| t.same_ranking).collect();
        assert_eq!(same, [2.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0]);
        // The base's K among Q's K: K=1: 1, 1, 0; K=5: 5, 4 ({0,1,2,5,4}), 2 ({1,0,..});
        // K=10: 10, 10, 3 (0, 1, 2).
        let shared: Vec<f64> = r.top_k.iter().map(|t| t.shared).collect();
        assert!(close(shared[0], 2.0 / 3.0));
        assert!(close(shared[1], (5.0 + 4.0 + 2.0) / 15.0));
        assert!(close(shared[2], (10.0 + 10.0 + 3.0) / 30.0));
        let base_top: Vec<f64> = r.top_k.iter().map(|t| t.base_top_in_q).collect();
        assert_eq!(base_top, [2.0 / 3.0, 1.0, 1.0]);
    }

    /// Relative distance and cosine of hand-made positions, and the ranking.
    #[test]
    fn layer_drift_means_and_ranks() {
        let mut s = Vec::new();
        // Layer 0: q = 2p at one position (rel 1, cos 1), orthogonal at the other (rel
        // sqrt(2), cos 0). Layer 1: equal (rel 0, cos 1).
        add_positions(&mut s, 0, (&[3.0, 4.0, 1.0, 0.0], &[6.0, 8.0, 0.0, 1.0]), 2);
        add_positions(&mut s, 1, (&[3.0, 4.0], &[3.0, 4.0]), 2);
        let r = layer_drift(&s);
        assert!(close(r[0].rel_l2, (1.0 + 2f64.sqrt()) / 2.0));
        assert!(close(r[0].cosine, 0.5));
        assert_eq!((r[1].rel_l2, r[1].cosine), (0.0, 1.0));
        assert_eq!((r[0].rank, r[1].rank), (1, 2));
    }

    #[test]
    fn kld_report_uncertainties_match_independent_formulas() {
        let toks: Vec<KldTerms> = (0..20)
            .map(|i| {
                let x = f64::from(i);
                let nq = 1.0 + (x * 0.7).sin();
                let nb = 1.0 + (x * 0.7).sin() * 0.8 + (x * 1.3).cos() * 0.1;
                token(nq, nb, 0.01 * (1.0 + x % 4.0), i % 3 != 0, x / 20.0)
            })
            .collect();
        let mut s = KldStats::default();
        toks.iter().for_each(|t| s.push(t));
        let r = s.report().unwrap();
        let n = toks.len() as f64;
        let nq: Vec<f64> = toks.iter().map(|t| t.nll_q).collect();
        let nb: Vec<f64> = toks.iter().map(|t| t.nll_base).collect();
        let mq = nq.iter().sum::<f64>() / n;
        let mb = nb.iter().sum::<f64>() / n;
        let cov = nq
            .iter()
            .zip(&nb)
            .map(|(a, b)| (a - mq) * (b - mb))
            .sum::<f64>()
            / n
            / (n - 1.0);
        let (uq, ub) = (sem(&nq), sem(&nb));
        assert!(close(r.ppl_q.unc, mq.exp() * uq));
        assert!(close(r.ppl_base.unc, mb.exp() * ub));
        assert!(close(r.cor_ln_ppl.unwrap(), cov / (uq * ub)));
        let ln_unc = (uq * uq + ub * ub - 2.0 * cov).sqrt();
        assert!(close(r.ln_ppl_ratio.unc, ln_unc));
        assert!(close(r.ppl_ratio.unc, (mq - mb).exp() * ln_unc));
        let (pq, pb) = (mq.exp(), mb.exp());
        let diff_unc = ((pq * uq).powi(2) + (pb * ub).powi(2) - 2.0 * pq * pb * cov).sqrt();
        assert!(close(r.ppl_diff.unc, diff_unc));
        let kld: Vec<f64> = toks.iter().map(|t| t.kld).collect();
        assert!(close(r.kld.unc, sem(&kld)));
        let dp2: Vec<f64> = toks
            .iter()
            .map(|t| (p(t.nll_q) - p(t.nll_base)).powi(2))
            .collect();
        let mse = dp2.iter().sum::<f64>() / n;
        assert!(close(r.rms_dp.unc, 0.5 / mse.sqrt() * sem(&dp2)));
        // Confidence x/20: 5 in [0,.25), 5 in [.25,.5), 5 in [.5,.75), 4 in [.75,.95), 1 above.
        let counts: Vec<u64> = r.kld_by_confidence.iter().map(|b| b.count).collect();
        assert_eq!(counts, [5, 5, 5, 4, 1]);
    }
}
