//! Routing tokens to experts on the host, from the router's f32 logits, the way transformers
//! computes it, then grouping the token rows by expert for the gather / expert MLP /
//! weighted scatter-add of the forward pass.

use crate::backend::RowGroups;
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
    groups.offsets.push(groups.rows.len());
}

/// The `k` largest of `scores`, largest first; equal scores keep the lower index first (as
/// `torch.topk` returns them on the CPU).
fn top_k(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    // A stable sort by descending score: ties stay in index order. NaN sorts last.
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    idx.truncate(k);
    idx
}

/// `softmax` in f32 as torch computes it on the CPU: `exp(x - max)` times the reciprocal of
/// their sum.
fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut p: Vec<f32> = logits.iter().map(|&x| (x - max).exp()).collect();
    let inv = 1.0 / p.iter().sum::<f32>();
    for v in &mut p {
        *v *= inv;
    }
    p
}

/// Each token's experts and weights from `logits` `[tokens, experts]` (row-major), grouped by
/// expert: `experts` groups, in expert order.
pub fn route(logits: &[f32], experts: usize, k: usize, router: Router) -> Result<RowGroups> {
    if experts == 0 || !logits.len().is_multiple_of(experts) || k == 0 || k > experts {
        return Err(Error::InvalidArgument(format!(
            "routing {} logits over {experts} experts, top {k}",
            logits.len()
        )));
    }
    let mut per_expert: Vec<Vec<(u32, f32)>> = vec![Vec::new(); experts];
    for (t, row) in logits.chunks_exact(experts).enumerate() {
        match router {
            Router::Softmax { renormalize } => {
                let p = softmax(row);
                let chosen = top_k(&p, k);
                let sum: f32 = chosen.iter().map(|&e| p[e]).sum();
                for e in chosen {
                    let w = if renormalize { p[e] / sum } else { p[e] };
                    per_expert[e].push((t as u32, w));
                }
            }
        }
    }
    let mut routes = RowGroups {
        offsets: vec![0],
        ..RowGroups::default()
    };
    for group in per_expert {
        for (row, w) in group {
            routes.rows.push(row);
            routes.weights.push(w);
        }
        routes.offsets.push(routes.rows.len());
    }
    Ok(routes)
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
        let r = route(&logits, 4, 2, Router::Softmax { renormalize: true }).unwrap();
        let g = groups(&r);
        assert_eq!(g[0], vec![(1, 0.5)]);
        assert_eq!(g[1], vec![(0, 0.5), (1, 0.5)]);
        assert_eq!(g[2], vec![]);
        assert_eq!(g[3], vec![(0, 0.5)]);
        // Without renormalisation the weights are the softmax probabilities themselves.
        let r = route(&logits, 4, 2, Router::Softmax { renormalize: false }).unwrap();
        let e = [0f32, 2.0, 1.0, 2.0].map(|x| (x - 2.0f32).exp());
        let p3 = e[3] / e.iter().sum::<f32>();
        assert!((groups(&r)[3][0].1 - p3).abs() < 1e-7);
        assert!((groups(&r)[1][1].1 - 0.25).abs() < 1e-7);
    }

    #[test]
    fn top_2_of_a_softmax_equals_the_softmax_of_the_top_2_logits() {
        // Mixtral's definition (softmax over the k chosen logits) against the renormalised one.
        let logits = [0.3f32, -1.2, 2.5, 0.9, 1.7, -0.4];
        let r = route(&logits, 6, 2, Router::Softmax { renormalize: true }).unwrap();
        let g = groups(&r);
        let (a, b) = (2.5f32, 1.7f32);
        let wa = 1.0 / (1.0 + (b - a).exp());
        assert!((g[2][0].1 - wa).abs() < 1e-6, "{:?}", g);
        assert!((g[4][0].1 - (1.0 - wa)).abs() < 1e-6, "{:?}", g);
        assert!(g[0].is_empty() && g[1].is_empty() && g[3].is_empty() && g[5].is_empty());
    }

    #[test]
    fn shared_expert_group_follows_the_routed_ones() {
        let mut r = route(&[1.0, 0.0], 2, 1, Router::Softmax { renormalize: true }).unwrap();
        push_all_tokens(&mut r, &[sigmoid(0.0)]);
        assert_eq!(r.groups(), 3);
        assert_eq!(groups(&r)[2], vec![(0, 0.5)]);
    }

    #[test]
    fn impossible_routing_is_an_error() {
        let softmax = Router::Softmax { renormalize: true };
        assert!(route(&[0.0; 6], 4, 2, softmax).is_err());
        assert!(route(&[0.0; 8], 4, 5, softmax).is_err());
    }
}
