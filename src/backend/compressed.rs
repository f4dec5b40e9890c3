//! DeepSeek-V4's per-token bookkeeping on the host: each query's key list in a compressed
//! attention layer (and in GLM-5.3-Flash's pooled sparse attention) and each token's
//! hyper-connection weights. These are the references of
//! `Backend::compressed_keys` and `Backend::hyper_weights` (and their defaults: the inputs
//! down, the result up), which CUDA's `compressed_keys.cu` and `hyper_weights.cu` follow.

use rayon::prelude::*;

use super::{Backend, SeqLayout, Shaped, routing};
use crate::Result;
use crate::checkpoint::config::KeyPools;

/// The entries a query of a compressed layer attends to after its window.
#[derive(Clone, Copy, Debug)]
pub enum EntryKeys<'a, T> {
    /// The indexer's picks: `[tokens, top_k]` entry positions (in the query's sequence),
    /// then -1s.
    Picked(&'a T),
    /// Every entry whose `rate` tokens the query has seen.
    Seen { rate: usize },
    /// GLM-5.3-Flash: the tokens of the indexer's picked pools (`picks` `[tokens, k]` pool
    /// positions, then -1s; pool `e` is tokens `e * size ..`), not entries after the tokens,
    /// then where `pools.tail` those after the query's last whole pool; no window.
    Pools { picks: &'a T, pools: KeyPools },
}

/// `Backend::mix_streams`' streams `n` and values a stream `d` for `streams` `[rows, n * d]`,
/// `weights` `[rows, n * m]` and `added` (`[rows, d]`, `[rows, m]`), or an error naming the
/// shapes.
pub fn mix_streams_shape<T: Shaped>(
    streams: &T,
    weights: &T,
    added: Option<(&T, &T)>,
    m: usize,
) -> Result<(usize, usize)> {
    let rows = streams.rows();
    let n = weights.cols() / m.max(1);
    let d = streams.cols() / n.max(1);
    let bad = m == 0
        || n == 0
        || n * m != weights.cols()
        || n * d != streams.cols()
        || weights.rows() != rows
        || added.is_some_and(|(x, s)| x.shape() != [rows, d] || s.shape() != [rows, m]);
    if bad {
        let added = added.map(|(x, s)| (x.shape(), s.shape()));
        return Err(crate::Error::InvalidArgument(format!(
            "mix_streams: streams {:?}, weights {:?}, added {added:?}, {m} outputs",
            streams.shape(),
            weights.shape()
        )));
    }
    Ok((n, d))
}

/// The key lists' width: `window` keys (no more than the longest sequence) and the entries.
pub fn key_list_width(layout: &SeqLayout, window: usize, entries: usize) -> usize {
    (window.min(layout.max_len()) + entries).max(1)
}

/// The keys a query of pooled sparse attention lists at most: `k` picked pools of `size`
/// tokens, and where `tail` those after its last whole pool.
pub fn pooled_width(k: usize, pools: KeyPools) -> usize {
    k * pools.size + if pools.tail { pools.size - 1 } else { 0 }
}

/// Each query's keys in a compressed layer, as `Backend::sparse_attention` reads them
/// (`[tokens, width]` positions, then -1s): its window of `window` tokens (itself the last),
/// then the entries it sees, as positions `tokens + e`: every entry whose `rate` tokens it
/// has seen (`Seen`), or the indexer's picks (`Picked`: `[tokens, top_k]` host values); or
/// without a window the tokens of the picked pools and the tail (`Pools`).
pub fn key_lists(
    layout: &SeqLayout,
    window: usize,
    entries: EntryKeys<'_, (Vec<f32>, usize)>,
) -> (Vec<f32>, usize) {
    let t = layout.n_tokens();
    let window = match entries {
        EntryKeys::Pools { .. } => 0,
        _ => window,
    };
    let width = key_list_width(
        layout,
        window,
        match entries {
            EntryKeys::Picked((_, top_k)) => *top_k,
            EntryKeys::Seen { rate } => layout.max_len() / rate.max(1),
            EntryKeys::Pools {
                picks: (_, k),
                pools,
            } => pooled_width(*k, pools),
        },
    );
    let mut lists = vec![-1f32; t * width];
    // Row by row on every core (a CSA layer's 8,192 x 640 keys took ~24 ms on one).
    lists
        .par_chunks_exact_mut(width)
        .enumerate()
        .for_each(|(r, row)| {
            let s = layout.starts.partition_point(|&a| a <= r) - 1;
            let p = r - layout.starts[s];
            let own = (p + 1).saturating_sub(window)..=p;
            let n = own.clone().count();
            for (slot, key) in row.iter_mut().zip(own) {
                *slot = key as f32;
            }
            let seen = &mut row[n..];
            match entries {
                EntryKeys::Picked((picks, top_k)) => {
                    let picked = picks[r * top_k..(r + 1) * top_k]
                        .iter()
                        .take_while(|&&e| e >= 0.0);
                    for (slot, &e) in seen.iter_mut().zip(picked) {
                        *slot = (t + e as usize) as f32;
                    }
                }
                EntryKeys::Seen { rate } => {
                    for (slot, e) in seen.iter_mut().zip(0..(p + 1) / rate) {
                        *slot = (t + e) as f32;
                    }
                }
                EntryKeys::Pools {
                    picks: (picks, k),
                    pools,
                } => {
                    let size = pools.size;
                    let picked = picks[r * k..(r + 1) * k]
                        .iter()
                        .take_while(|&&e| e >= 0.0)
                        .flat_map(|&e| (e as usize * size)..(e as usize + 1) * size);
                    // The tokens after the last whole pool up to the query itself.
                    let tail = ((p + 1) / size * size..=p).filter(|_| pools.tail);
                    for (slot, key) in seen.iter_mut().zip(picked.chain(tail)) {
                        *slot = key as f32;
                    }
                }
            }
        });
    (lists, width)
}

/// `Backend::compressed_keys`' default: the picks down, [`key_lists`], the lists up.
pub fn compressed_keys_on_host<B: Backend + ?Sized>(
    b: &B,
    layout: &SeqLayout,
    window: usize,
    entries: EntryKeys<'_, B::Tensor>,
) -> Result<B::Tensor> {
    let (lists, width) = match entries {
        EntryKeys::Picked(picks) => {
            let top_k = picks.cols();
            key_lists(
                layout,
                window,
                EntryKeys::Picked(&(b.download(picks)?, top_k)),
            )
        }
        EntryKeys::Seen { rate } => key_lists(layout, window, EntryKeys::Seen { rate }),
        EntryKeys::Pools { picks, pools } => {
            let k = picks.cols();
            key_lists(
                layout,
                window,
                EntryKeys::Pools {
                    picks: &(b.download(picks)?, k),
                    pools,
                },
            )
        }
    };
    b.upload_vector("compressed attention keys", &lists)?
        .reshaped(layout.n_tokens(), width)
}

/// A block's hyper-connection rule: from `fn`'s outputs `v` (`(2 + n) * n` a token) and
/// their bias `base`, `pre = sigmoid(v * scale[0] + base) + eps`, `post = 2 sigmoid(v *
/// scale[1] + base)` and `comb`, each of its `n` rows the softmax of `v * scale[2] + base`
/// plus `eps`, made doubly stochastic by `iters` Sinkhorn passes.
#[derive(Clone, Copy, Debug)]
pub struct HyperRule<'a> {
    pub streams: usize,
    pub base: &'a [f32],
    pub scale: [f32; 3],
    pub eps: f32,
    pub iters: usize,
}

impl HyperRule<'_> {
    /// The outputs a token: `pre`, `post` and `comb`'s.
    pub fn outputs(&self) -> usize {
        (2 + self.streams) * self.streams
    }

    /// Output `i`'s `pre` weight from its value `v` under factor `scale` (the final collapse
    /// has its own).
    pub fn pre(&self, v: f32, i: usize, scale: f32) -> f32 {
        routing::sigmoid(v * scale + self.base[i]) + self.eps
    }

    /// Every token's `pre` `[tokens, n]`, `post` `[tokens, n]` and `comb` `[tokens, n * n]`
    /// from `outputs` `[tokens, (2 + n) * n]`.
    pub fn weights(&self, outputs: &[f32]) -> [Vec<f32>; 3] {
        let n = self.streams;
        let t = outputs.len() / self.outputs();
        let (mut pre, mut post, mut comb) =
            (vec![0.0; t * n], vec![0.0; t * n], vec![0.0; t * n * n]);
        let [pre_scale, post_scale, comb_scale] = self.scale;
        // Token by token, on every core (Sinkhorn's 20 passes took ~7 ms a block for 8,192
        // tokens on one).
        outputs
            .par_chunks_exact(self.outputs())
            .zip(pre.par_chunks_mut(n))
            .zip(post.par_chunks_mut(n))
            .zip(comb.par_chunks_mut(n * n))
            .for_each(|(((row, pre), post), m)| {
                let at = |i: usize, scale: f32| row[i] * scale + self.base[i];
                for (i, p) in pre.iter_mut().enumerate() {
                    *p = self.pre(row[i], i, pre_scale);
                }
                for (i, p) in post.iter_mut().enumerate() {
                    *p = 2.0 * routing::sigmoid(at(n + i, post_scale));
                }
                for (j, m_row) in m.chunks_exact_mut(n).enumerate() {
                    let logits: Vec<f32> =
                        (0..n).map(|k| at(2 * n + j * n + k, comb_scale)).collect();
                    for (v, p) in m_row.iter_mut().zip(routing::softmax(&logits)) {
                        *v = p + self.eps;
                    }
                }
                sinkhorn(m, n, self.iters, self.eps);
            });
        [pre, post, comb]
    }
}

/// `m` (`n x n`, row-major) made doubly stochastic as transformers does: its columns
/// normalised, then `iters - 1` times its rows and its columns, each sum plus `eps`.
fn sinkhorn(m: &mut [f32], n: usize, iters: usize, eps: f32) {
    let columns = |m: &mut [f32]| {
        for k in 0..n {
            let sum = (0..n).map(|j| m[j * n + k]).fold(0.0f32, |a, v| a + v) + eps;
            (0..n).for_each(|j| m[j * n + k] /= sum);
        }
    };
    columns(m);
    for _ in 1..iters {
        for row in m.chunks_exact_mut(n) {
            let sum = row.iter().fold(0.0f32, |a, v| a + v) + eps;
            row.iter_mut().for_each(|v| *v /= sum);
        }
        columns(m);
    }
}

/// `Backend::hyper_weights`' default: `mix`'s f32 outputs down, [`HyperRule::weights`], the
/// three up.
pub fn hyper_weights_on_host<B: Backend + ?Sized>(
    b: &B,
    x: &B::Tensor,
    mix: &B::Linear,
    rule: &HyperRule,
) -> Result<[B::Tensor; 3]> {
    let outputs = b.logits(x, mix)?;
    let (t, n) = (x.rows(), rule.streams);
    let [pre, post, comb] = rule.weights(&outputs);
    let up = |name: &str, v: &[f32], cols: usize| {
        b.upload_vector(name, v).and_then(|x| x.reshaped(t, cols))
    };
    Ok([
        up("hyper-connection pre", &pre, n)?,
        up("hyper-connection post", &post, n)?,
        up("hyper-connection comb", &comb, n * n)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::{EntryKeys, key_lists, mix_streams_shape, sinkhorn};
    use crate::backend::cpu::{CpuBackend, CpuTensor};
    use crate::backend::{Device, SeqLayout, Shaped};

    #[test]
    fn mix_streams_shape_reads_the_streams_and_refuses_mismatches() {
        let b = CpuBackend::new();
        let t = |rows: usize, cols: usize| -> CpuTensor {
            let x = b.upload_activation(&vec![0.0; rows * cols]).unwrap();
            x.reshaped(rows, cols).unwrap()
        };
        // 4 streams of 2 values collapsed (m 1), then mixed with a block's output added (m 4).
        assert_eq!(
            mix_streams_shape(&t(3, 8), &t(3, 4), None, 1).unwrap(),
            (4, 2)
        );
        let added = (t(3, 2), t(3, 4));
        let got = mix_streams_shape(&t(3, 8), &t(3, 16), Some((&added.0, &added.1)), 4);
        assert_eq!(got.unwrap(), (4, 2));
        let (narrow, short) = (t(3, 3), t(2, 4));
        let bad = [
            mix_streams_shape(&t(3, 8), &t(3, 4), None, 0),
            mix_streams_shape(&t(3, 8), &t(3, 3), None, 1),
            mix_streams_shape(&t(3, 8), &short, None, 1),
            mix_streams_shape(&t(3, 8), &t(3, 16), Some((&narrow, &added.1)), 4),
        ];
        for got in bad {
            let err = got.unwrap_err().to_string();
            assert!(err.contains("mix_streams: streams [3, 8]"), "{err}");
        }
    }

    #[test]
    fn sinkhorn_makes_rows_and_columns_sum_to_one() {
        let mut m = vec![0.7f32, 0.1, 0.2, 0.05, 0.05, 0.9, 0.3, 0.3, 0.4];
        sinkhorn(&mut m, 3, 20, 1e-6);
        for i in 0..3 {
            let row: f32 = m[i * 3..i * 3 + 3].iter().sum();
            let col: f32 = (0..3).map(|j| m[j * 3 + i]).sum();
            assert!(
                (row - 1.0).abs() < 1e-3 && (col - 1.0).abs() < 1e-5,
                "{m:?}"
            );
        }
    }

    #[test]
    fn each_query_lists_its_window_then_the_entries_it_has_seen() {
        // Two sequences of 6 and 9 tokens, windows of 3, entries of 4 tokens.
        let layout = SeqLayout::from_lengths([6, 9]);
        let (lists, width) = key_lists(&layout, 3, EntryKeys::Seen { rate: 4 });
        assert_eq!(width, 3 + 9 / 4);
        let row = |r: usize| lists[r * width..(r + 1) * width].to_vec();
        assert_eq!(row(0), vec![0.0, -1.0, -1.0, -1.0, -1.0]);
        // Position 3 has seen entry 0 (tokens 0..4): the batch's 15 tokens, then entry 0.
        assert_eq!(row(3), vec![1.0, 2.0, 3.0, 15.0, -1.0]);
        // The second sequence's position 8 has seen entries 0 and 1.
        assert_eq!(row(6 + 8), vec![6.0, 7.0, 8.0, 15.0, 16.0]);
        // The indexer's picks, where it selects: entry 1 only.
        let mut picks = vec![-1.0; 15 * 2];
        picks[14 * 2] = 1.0;
        let (lists, width) = key_lists(&layout, 3, EntryKeys::Picked(&(picks, 2)));
        assert_eq!(width, 5);
        assert_eq!(lists[14 * width..15 * width], [6.0, 7.0, 8.0, 16.0, -1.0]);
    }

    #[test]
    fn each_query_lists_its_picked_pools_tokens_then_the_tail() {
        use crate::checkpoint::config::KeyPools;
        // One sequence of 11 tokens, pools of 4, two kept a query.
        let layout = SeqLayout::from_lengths([11]);
        let mut picks = vec![-1.0f32; 11 * 2];
        // Position 9 (pools 0 and 1 whole) keeps pool 1 alone; position 10 both.
        picks[9 * 2] = 1.0;
        picks[10 * 2..10 * 2 + 2].copy_from_slice(&[0.0, 1.0]);
        for tail in [true, false] {
            let pools = KeyPools { size: 4, tail };
            let entries = EntryKeys::Pools {
                picks: &(picks.clone(), 2),
                pools,
            };
            let (lists, width) = key_lists(&layout, 0, entries);
            assert_eq!(width, 2 * 4 + if tail { 3 } else { 0 });
            let row = |r: usize| -> Vec<f32> {
                lists[r * width..(r + 1) * width]
                    .iter()
                    .copied()
                    .take_while(|&k| k >= 0.0)
                    .collect()
            };
            let after = |keys: &[f32]| if tail { keys.to_vec() } else { vec![] };
            // Position 2 sees no whole pool: its tail alone.
            assert_eq!(row(2), after(&[0.0, 1.0, 2.0]));
            // Position 3 closes pool 0, which it did not pick: nothing after it.
            assert_eq!(row(3), Vec::<f32>::new());
            assert_eq!(
                row(9),
                [&[4.0, 5.0, 6.0, 7.0][..], &after(&[8.0, 9.0])].concat()
            );
            let both: Vec<f32> = (0..8).map(|k| k as f32).collect();
            assert_eq!(row(10), [both, after(&[8.0, 9.0, 10.0])].concat());
        }
    }
}
