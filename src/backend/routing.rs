//! Routing tokens to experts on the host, from the router's f32 logits, the way transformers
//! computes it, then grouping the token rows by expert for the gather / expert MLP /
//! weighted scatter-add of the forward pass: `Backend::route`'s reference (and its default),
//! which the CUDA kernels of `shaders/cuda/route.cu` follow.

use rayon::prelude::*;

use super::{Backend, RouteRule, RowGroups};
use crate::checkpoint::Router;
use crate::{Error, Result};

/// Adds a group of every token with its own weight (a shared expert's: its gate's sigmoid,
/// or 1), after the routed experts, as transformers adds it after their sum.
pub fn push_all_tokens(groups: &mut RowGroups, weights: &[f32]) {
    if groups.offsets.is_empty() {
        groups.offsets.push(0);
    }
    groups.rows.extend(0..weights.len() as u32);
    groups.weights.extend_from_slice(weights);
    if !groups.input_scales.is_empty() {
        groups
            .input_scales
            .extend(std::iter::repeat_n(1.0, weights.len()));
    }
    groups.offsets.push(groups.rows.len());
}

/// The `k` largest of `scores`, largest first; equal scores keep the lower index first (as
/// `torch.topk` returns them on the CPU). One pass with a sorted list of `k`: routers pick a
/// few of up to a few hundred experts, for every token of every layer.
fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut best: Vec<usize> = Vec::with_capacity(k + 1);
    for (i, s) in scores.iter().enumerate() {
        // Only a strictly larger score passes an earlier index (NaN sorts below everything).
        let beats = |&j: &usize| s.total_cmp(&scores[j]).is_gt();
        if best.len() == k && !best.last().is_some_and(beats) {
            continue;
        }
        let at = best.iter().position(beats).unwrap_or(best.len());
        best.insert(at, i);
        best.truncate(k);
    }
    best
}

/// `softmax` in f32 as torch computes it on the CPU: `exp(x - max)` times the reciprocal of
/// their sum.
pub fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut p: Vec<f32> = logits.iter().map(|&x| (x - max).exp()).collect();
    let inv = 1.0 / p.iter().sum::<f32>();
    for v in &mut p {
        *v *= inv;
    }
    p
}

/// `sqrt(softplus(x))` in f32 as torch computes it (softplus is `x` past 20).
fn sqrt_softplus(x: f32) -> f32 {
    match x > 20.0 {
        true => x.sqrt(),
        false => x.exp().ln_1p().sqrt(),
    }
}

/// One token's experts and their weights (`bias`: a sigmoid router's selection bias;
/// `fixed`: the experts where they do not depend on the scores, DeepSeek-V4's hash routing).
fn route_token(
    logits: &[f32],
    k: usize,
    router: Router,
    bias: &[f32],
    fixed: Option<&[u32]>,
) -> Vec<(usize, f32)> {
    match router {
        Router::SqrtSoftplus { scale } => {
            let scores: Vec<f32> = logits.iter().map(|&x| sqrt_softplus(x)).collect();
            let chosen = match fixed {
                Some(fixed) => fixed.iter().map(|&e| e as usize).collect(),
                None => {
                    let choice: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
                    top_k(&choice, k)
                }
            };
            // An expert the token names twice runs once with both weights (the reference
            // adds its output twice): a group never holds a token twice.
            let mut picks: Vec<(usize, f32)> = Vec::with_capacity(k);
            for (e, w) in weigh(&scores, chosen, Some(1e-20), scale) {
                match picks.iter_mut().find(|(p, _)| *p == e) {
                    Some((_, sum)) => *sum += w,
                    None => picks.push((e, w)),
                }
            }
            picks
        }
        Router::Softmax { renormalize } => {
            let p = softmax(logits);
            let chosen = top_k(&p, k);
            let sum: f32 = chosen.iter().map(|&e| p[e]).sum();
            chosen
                .into_iter()
                .map(|e| (e, if renormalize { p[e] / sum } else { p[e] }))
                .collect()
        }
        Router::TopKSoftmax => {
            let chosen = top_k(logits, k);
            let top: Vec<f32> = chosen.iter().map(|&e| logits[e]).collect();
            chosen.into_iter().zip(softmax(&top)).collect()
        }
        Router::TopKSigmoid => top_k(logits, k)
            .into_iter()
            .map(|e| (e, sigmoid(logits[e])))
            .collect(),
        Router::Sigmoid {
            groups,
            top_groups,
            renormalize,
            scale,
            eps,
        } => {
            let scores: Vec<f32> = logits.iter().map(|&x| sigmoid(x)).collect();
            let choice: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
            let chosen = grouped_top_k(&choice, groups, top_groups, k);
            weigh(&scores, chosen, renormalize.then_some(eps), scale)
        }
        Router::GroupedSoftmax {
            groups,
            top_groups,
            renormalize,
            scale,
        } => {
            let p = softmax(logits);
            let chosen = grouped_top_k(&p, groups, top_groups, k);
            weigh(&p, chosen, renormalize.then_some(1e-20), scale)
        }
    }
}

/// The top `k` of `choice` within its best `top_groups` of `groups` equal groups, each group
/// scored by the sum of its two best values (its only one when a group holds one expert).
fn grouped_top_k(choice: &[f32], groups: usize, top_groups: usize, k: usize) -> Vec<usize> {
    let size = choice.len() / groups;
    let group_scores: Vec<f32> = choice
        .chunks(size)
        .map(|g| top_k(g, 2).iter().map(|&i| g[i]).sum())
        .collect();
    // Experts outside the chosen groups drop to -inf.
    let mut masked = vec![f32::NEG_INFINITY; choice.len()];
    for g in top_k(&group_scores, top_groups) {
        masked[g * size..(g + 1) * size].copy_from_slice(&choice[g * size..(g + 1) * size]);
    }
    top_k(&masked, k)
}

/// The chosen experts weighted by their `scores`, renormalised where `renorm_eps` (their sum
/// plus it), times `scale`.
fn weigh(
    scores: &[f32],
    chosen: Vec<usize>,
    renorm_eps: Option<f32>,
    scale: f32,
) -> Vec<(usize, f32)> {
    let sum = renorm_eps.map(|eps| chosen.iter().map(|&e| scores[e]).sum::<f32>() + eps);
    chosen
        .into_iter()
        .map(|e| (e, sum.map_or(scores[e], |s| scores[e] / s) * scale))
        .collect()
}

/// Each token's experts and weights from `logits` `[tokens, experts]` (row-major), grouped by
/// expert: `experts` groups, in expert order, each in token order. `bias` is a sigmoid
/// router's `e_score_correction_bias` (`[experts]`; zeros where the checkpoint has none);
/// `fixed` each token's experts where the token chooses them (`RouteRule::fixed`).
pub fn route(
    logits: &[f32],
    experts: usize,
    k: usize,
    router: Router,
    (bias, fixed): (&[f32], &[u32]),
) -> Result<RowGroups> {
    let rule = RouteRule {
        experts,
        experts_per_token: k,
        router,
        bias,
        expert_scale: &[],
        weights_on_input: false,
        fixed,
    };
    check_rule(experts, k, &rule)?;
    if !logits.len().is_multiple_of(experts) {
        return Err(Error::InvalidArgument(format!(
            "{} router logits are not rows of {experts} experts",
            logits.len()
        )));
    }
    let tokens = logits.len() / experts;
    if !fixed.is_empty() && fixed.len() != tokens * k {
        return Err(Error::InvalidArgument(format!(
            "{} fixed experts for {tokens} tokens of {k}",
            fixed.len()
        )));
    }
    let chosen: Vec<Vec<(usize, f32)>> = logits
        .par_chunks(experts)
        .enumerate()
        .map(|(t, row)| {
            let fixed = (!fixed.is_empty()).then(|| &fixed[t * k..(t + 1) * k]);
            route_token(row, k, router, bias, fixed)
        })
        .collect();
    // A counting sort by expert keeps each group in token order.
    let mut offsets = vec![0usize; experts + 1];
    for &(e, _) in chosen.iter().flatten() {
        offsets[e + 1] += 1;
    }
    for e in 0..experts {
        offsets[e + 1] += offsets[e];
    }
    let mut next = offsets.clone();
    let n = offsets[experts];
    let (mut rows, mut weights) = (vec![0u32; n], vec![0f32; n]);
    for (t, picks) in chosen.iter().enumerate() {
        for &(e, w) in picks {
            rows[next[e]] = t as u32;
            weights[next[e]] = w;
            next[e] += 1;
        }
    }
    Ok(RowGroups {
        rows,
        weights,
        offsets,
        input_scales: Vec::new(),
    })
}

/// [`Backend::route`]'s default: the f32 logits to the host, [`route`] there, the groups
/// uploaded (and a last group of every row weighted by `all_rows`, where given).
pub fn route_on_host<B: Backend + ?Sized>(
    b: &B,
    x: &B::Tensor,
    router: &B::Linear,
    rule: &RouteRule,
    all_rows: Option<&[f32]>,
) -> Result<(B::Groups, Vec<usize>)> {
    let logits = b.logits(x, router)?;
    check_rule(rule.experts, rule.experts_per_token, rule)?;
    let mut groups = route(
        &logits,
        rule.experts,
        rule.experts_per_token,
        rule.router,
        (rule.bias, rule.fixed),
    )?;
    scale_experts(&mut groups, rule.expert_scale);
    if rule.weights_on_input {
        let ones = vec![1.0; groups.weights.len()];
        groups.input_scales = std::mem::replace(&mut groups.weights, ones);
    }
    if let Some(w) = all_rows {
        push_all_tokens(&mut groups, w);
    }
    let lens = (0..groups.groups())
        .map(|g| groups.group(g).len())
        .collect();
    Ok((b.upload_groups(&groups)?, lens))
}

/// Each expert group's weights times its factor in `scale` (none where empty).
fn scale_experts(groups: &mut RowGroups, scale: &[f32]) {
    for (e, &f) in scale.iter().enumerate() {
        let (from, to) = (groups.offsets[e], groups.offsets[e + 1]);
        groups.weights[from..to].iter_mut().for_each(|w| *w *= f);
    }
}

/// An error unless `k` of `experts` can be routed under `rule` (group counts that divide the
/// experts, enough experts in the kept groups, a bias per expert for sigmoid routers).
pub fn check_rule(experts: usize, k: usize, rule: &RouteRule) -> Result<()> {
    let grouped = |groups: usize, top_groups: usize| {
        groups > 0
            && experts.is_multiple_of(groups)
            && (1..=groups).contains(&top_groups)
            && k <= top_groups * (experts / groups)
    };
    let groups_ok = match rule.router {
        Router::Softmax { .. } | Router::TopKSoftmax | Router::TopKSigmoid => true,
        Router::Sigmoid {
            groups, top_groups, ..
        } => grouped(groups, top_groups) && rule.bias.len() == experts,
        Router::GroupedSoftmax {
            groups, top_groups, ..
        } => grouped(groups, top_groups),
        Router::SqrtSoftplus { .. } => rule.bias.len() == experts || !rule.fixed.is_empty(),
    };
    let fixed_ok = rule.fixed.iter().all(|&e| (e as usize) < experts)
        && (rule.fixed.is_empty() || matches!(rule.router, Router::SqrtSoftplus { .. }));
    let factors_ok = rule.expert_scale.is_empty() || rule.expert_scale.len() == experts;
    if experts == 0 || k == 0 || k > experts || !groups_ok || !factors_ok || !fixed_ok {
        return Err(Error::InvalidArgument(format!(
            "routing over {experts} experts, top {k}, {:?} with {} biases and {} per-expert factors",
            rule.router,
            rule.bias.len(),
            rule.expert_scale.len()
        )));
    }
    Ok(())
}

/// `sigmoid(x)` in f32 (a shared expert's gate).
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected group of each expert: (token, weight) pairs.
    fn groups(r: &RowGroups) -> Vec<Vec<(u32, f32)>> {
        (0..r.groups())
            .map(|g| {
                r.group(g)
                    .map(|i| (r.rows[i], r.weights[i]))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn softmax_top_k_renormalised_with_ties_to_the_lower_index() {
        // Token 0: experts 1 and 3 tie for first, 2 is third. Token 1: all four tie.
        let logits = [0.0, 2.0, 1.0, 2.0, 0.5, 0.5, 0.5, 0.5];
        let r = route(
            &logits,
            4,
            2,
            Router::Softmax { renormalize: true },
            (&[], &[]),
        )
        .unwrap();
        let g = groups(&r);
        assert_eq!(g[0], vec![(1, 0.5)]);
        assert_eq!(g[1], vec![(0, 0.5), (1, 0.5)]);
        assert_eq!(g[2], vec![]);
        assert_eq!(g[3], vec![(0, 0.5)]);
        // Without renormalisation the weights are the softmax probabilities themselves.
        let r = route(
            &logits,
            4,
            2,
            Router::Softmax { renormalize: false },
            (&[], &[]),
        )
        .unwrap();
        let e = [0f32, 2.0, 1.0, 2.0].map(|x| (x - 2.0f32).exp());
        let p3 = e[3] / e.iter().sum::<f32>();
        assert!((groups(&r)[3][0].1 - p3).abs() < 1e-7);
        assert!((groups(&r)[1][1].1 - 0.25).abs() < 1e-7);
    }

    #[test]
    fn top_2_of_a_softmax_equals_the_softmax_of_the_top_2_logits() {
        // Mixtral's definition (softmax over the k chosen logits) against the renormalised one.
        let logits = [0.3f32, -1.2, 2.5, 0.9, 1.7, -0.4];
        let r = route(
            &logits,
            6,
            2,
            Router::Softmax { renormalize: true },
            (&[], &[]),
        )
        .unwrap();
        let g = groups(&r);
        let (a, b) = (2.5f32, 1.7f32);
        let wa = 1.0 / (1.0 + (b - a).exp());
        assert!((g[2][0].1 - wa).abs() < 1e-6, "{:?}", g);
        assert!((g[4][0].1 - (1.0 - wa)).abs() < 1e-6, "{:?}", g);
        assert!(g[0].is_empty() && g[1].is_empty() && g[3].is_empty() && g[5].is_empty());
    }

    #[test]
    fn shared_expert_group_follows_the_routed_ones() {
        let mut r = route(
            &[1.0, 0.0],
            2,
            1,
            Router::Softmax { renormalize: true },
            (&[], &[]),
        )
        .unwrap();
        push_all_tokens(&mut r, &[sigmoid(0.0)]);
        assert_eq!(r.groups(), 3);
        assert_eq!(groups(&r)[2], vec![(0, 0.5)]);
    }

    #[test]
    fn top_k_matches_a_stable_sort() {
        let mut rng = crate::rng::Rng::new(7);
        for _ in 0..200 {
            let n = 1 + rng.below(40) as usize;
            // Few distinct values: many ties.
            let scores: Vec<f32> = (0..n).map(|_| rng.below(5) as f32).collect();
            let k = 1 + rng.below(n as u64) as usize;
            let mut want: Vec<usize> = (0..n).collect();
            want.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
            want.truncate(k);
            assert_eq!(top_k(&scores, k), want, "{scores:?} k={k}");
        }
    }

    #[test]
    fn sigmoid_router_chooses_by_biased_group_scores_and_weighs_unbiased() {
        // 8 experts in 4 groups of 2, keep 2 groups, top 2 experts, scale 2.5.
        let router = Router::Sigmoid {
            groups: 4,
            top_groups: 2,
            renormalize: true,
            scale: 2.5,
            eps: 1e-20,
        };
        let logits = [3.0, -3.0, 0.5, 0.4, 1.0, 1.0, -1.0, 2.0];
        // The bias lifts expert 3 for choosing; it never enters the weights.
        let bias = [0.0, 0.0, 0.0, 0.3, 0.0, 0.0, 0.0, 0.0];
        let s: Vec<f32> = logits.iter().map(|&x| sigmoid(x)).collect();
        let c: Vec<f32> = s.iter().zip(&bias).map(|(a, b)| a + b).collect();
        // Group scores (sum of both members): g0 = c0 + c1, g1 = c2 + c3, g2 = c4 + c5,
        // g3 = c6 + c7. g1 (0.62 + 0.90) and g2 (0.73 + 0.73) lead g0 (0.95 + 0.05) and
        // g3 (0.27 + 0.88); so expert 0, the best unbiased score, is not eligible.
        assert!(c[2] + c[3] > c[4] + c[5] && c[4] + c[5] > c[0] + c[1]);
        assert!(c[4] + c[5] > c[6] + c[7]);
        let r = route(&logits, 8, 2, router, (&bias, &[])).unwrap();
        let g = groups(&r);
        // Among experts 2..6 the biased scores rank 3 (0.90), then 4 and 5 tied (0.73): 4.
        assert!(g[0].is_empty() && g[2].is_empty() && g[5].is_empty() && g[7].is_empty());
        let sum = s[3] + s[4] + 1e-20;
        assert_eq!(g[3], vec![(0, s[3] / sum * 2.5)]);
        assert_eq!(g[4], vec![(0, s[4] / sum * 2.5)]);
    }

    #[test]
    fn grouped_softmax_router_chooses_within_the_best_groups() {
        // Mistral 4: 8 experts in 4 groups of 2, keep 2 groups, top 2 experts, scale 1.5, the
        // weights softmax scores renormalised (+1e-20).
        let router = Router::GroupedSoftmax {
            groups: 4,
            top_groups: 2,
            renormalize: true,
            scale: 1.5,
        };
        let logits = [3.0, -3.0, 1.2, 1.1, 1.0, 1.0, -1.0, 2.0];
        let p = softmax(&logits);
        // Group scores (both members): g0 = p0 + p1 leads; g3 = p6 + p7 beats g1 and g2.
        assert!(p[0] + p[1] > p[6] + p[7] && p[6] + p[7] > p[2] + p[3]);
        let r = route(&logits, 8, 2, router, (&[], &[])).unwrap();
        let g = groups(&r);
        // Experts 2 and 3 are out, though they score above expert 6 of a kept group.
        let sum = p[0] + p[7] + 1e-20;
        assert_eq!(g[0], vec![(0, p[0] / sum * 1.5)]);
        assert_eq!(g[7], vec![(0, p[7] / sum * 1.5)]);
        assert!((1..7).all(|e| g[e].is_empty()));
    }

    #[test]
    fn impossible_routing_is_an_error() {
        let softmax = Router::Softmax { renormalize: true };
        assert!(route(&[0.0; 6], 4, 2, softmax, (&[], &[])).is_err());
        assert!(route(&[0.0; 8], 4, 5, softmax, (&[], &[])).is_err());
        let sigmoid = Router::Sigmoid {
            groups: 3,
            top_groups: 1,
            renormalize: true,
            scale: 1.0,
            eps: 1e-20,
        };
        // 8 experts do not split in 3 groups; biases must cover every expert.
        assert!(route(&[0.0; 8], 8, 2, sigmoid, (&[0.0; 8], &[])).is_err());
        let two = Router::Sigmoid {
            groups: 2,
            top_groups: 1,
            renormalize: true,
            scale: 1.0,
            eps: 1e-20,
        };
        assert!(route(&[0.0; 8], 8, 2, two, (&[0.0; 7], &[])).is_err());
        // k beyond the experts of the kept groups.
        assert!(route(&[0.0; 8], 8, 5, two, (&[0.0; 8], &[])).is_err());
    }

    #[test]
    fn sqrt_softplus_router_chooses_by_biased_scores_or_by_the_token() {
        let logits = [0.5f32, -1.0, 2.0, 30.0, 0.0, 1.0];
        let bias = [0.0f32, 3.0, 0.0, 0.0, 0.0, 0.0];
        let router = Router::SqrtSoftplus { scale: 1.5 };
        // Scores: sqrt(ln(1 + e^x)), x itself past 20.
        let scores: Vec<f64> = logits
            .iter()
            .map(|&x| match x > 20.0 {
                true => (x as f64).sqrt(),
                false => (x as f64).exp().ln_1p().sqrt(),
            })
            .collect();
        let close = |got: &[(u32, f32)], want: &[(u32, f64)]| {
            got.len() == want.len()
                && got
                    .iter()
                    .zip(want)
                    .all(|(g, w)| g.0 == w.0 && (g.1 as f64 - w.1).abs() < 1e-6)
        };
        let chosen = groups(&route(&logits, 3, 2, router, (&bias[..3], &[])).unwrap());
        // Token 0: the bias lifts expert 1 above expert 0; token 1: expert 0, then expert 1.
        let (a, b) = (scores[1] + scores[2], scores[3] + scores[4]);
        assert!(close(&chosen[0], &[(1, scores[3] / b * 1.5)]), "{chosen:?}");
        let one = [(0, scores[1] / a * 1.5), (1, scores[4] / b * 1.5)];
        assert!(close(&chosen[1], &one), "{chosen:?}");
        assert!(close(&chosen[2], &[(0, scores[2] / a * 1.5)]), "{chosen:?}");
        // Fixed experts: token 0 takes 0 and 2, token 1 takes 1 and 2, weighed by their scores.
        let fixed = [0u32, 2, 1, 2];
        let hashed = groups(&route(&logits, 3, 2, router, (&[], &fixed)).unwrap());
        let (a, b) = (scores[0] + scores[2], scores[4] + scores[5]);
        assert!(close(&hashed[0], &[(0, scores[0] / a * 1.5)]), "{hashed:?}");
        assert!(close(&hashed[1], &[(1, scores[4] / b * 1.5)]), "{hashed:?}");
        let two = [(0, scores[2] / a * 1.5), (1, scores[5] / b * 1.5)];
        assert!(close(&hashed[2], &two), "{hashed:?}");
        assert!(route(&logits, 3, 2, router, (&[], &[0, 3, 1, 2])).is_err());
        // An expert named twice: one row of its group, both weights.
        let twice = groups(&route(&logits, 3, 2, router, (&[], &[2, 2, 0, 1])).unwrap());
        let sum = scores[2] + scores[2];
        assert!(
            close(&twice[2], &[(0, (scores[2] / sum + scores[2] / sum) * 1.5)]),
            "{twice:?}"
        );
    }
}
