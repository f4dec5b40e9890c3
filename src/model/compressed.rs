//! DeepSeek-V4's layer parts (`DeepseekV4Layers`), as transformers' `modeling_deepseek_v4.py`
//! computes them: attention over a sliding window and the entries its compressors pool from
//! earlier windows of tokens (`CompressedAttention`), and the hyper-connections that collapse
//! the residual streams into each block's input and spread its output back over them
//! (`HyperConnection`, `HyperHead`; GLM-5.3-Flash's too, `HyperConnections`).

use super::layers::{linear_per_block, upload, upload_dense};
use crate::backend::compressed::{EntryKeys, HyperRule};
use crate::backend::{
    AttnSpec, Backend, ColumnBlocks, IndexSpec, OutType, RotarySpan, SeqLayout, Shaped,
};
use crate::checkpoint::config::{self, Compression};
use crate::checkpoint::{self, AttnProjections, Checkpoint};
use crate::{Error, Result};

/// One compressor's pooling: `kv_proj` and `gate_proj` of the layer's input, each slot's
/// `position_bias`, and `kv_norm` on the pooled entries.
struct Pool<B: Backend> {
    kv: B::Linear,
    gate: B::Linear,
    /// `[rate, kv_proj's outputs]`.
    bias: B::Tensor,
    norm: B::Tensor,
    rate: usize,
    /// Entries from overlapping windows (CSA's two series).
    overlap: bool,
}

impl<B: Backend> Pool<B> {
    fn load(
        b: &B,
        ckpt: &Checkpoint,
        [kv, gate]: [&checkpoint::Module; 2],
        (rate, overlap): (usize, bool),
    ) -> Result<Self> {
        let at = kv.name.strip_suffix(".kv_proj").unwrap_or(&kv.name);
        let width = kv.out_features / if overlap { 2 } else { 1 };
        let bias = format!("{at}.position_bias");
        let cols = kv.out_features;
        let norm = format!("{at}.kv_norm.weight");
        Ok(Self {
            kv: upload(b, ckpt, kv)?,
            gate: upload(b, ckpt, gate)?,
            bias: b
                .upload_vector(&bias, &ckpt.floats(&bias, &[rate, cols])?)?
                .reshaped(rate, cols)?,
            norm: b.upload_vector(&norm, &ckpt.norm(&norm, width)?)?,
            rate,
            overlap,
        })
    }

    /// The entries of `xn`'s sequences, normed and rotated at their windows' first positions
    /// (`tables` at stride `rate`): entry `e` of a sequence at its row `e`, zeros after.
    fn entries(
        &self,
        b: &B,
        xn: &B::Tensor,
        seqs: &B::Sequences,
        (cos, sin): (&B::Tensor, &B::Tensor),
        span: RotarySpan,
        eps: f32,
    ) -> Result<B::Tensor> {
        let kv = b.linear(xn, &self.kv)?;
        let gate = b.linear(xn, &self.gate)?;
        let windows = (self.rate, self.overlap);
        let pooled = b.pool_windows(&kv, &gate, &self.bias, seqs, windows)?;
        drop((kv, gate));
        let mut e = b.rms_norm(&pooled, &self.norm, eps, OutType::Activation)?;
        b.rope(&mut e, seqs, cos, sin, span)?;
        Ok(e)
    }
}

/// A sparse layer's indexer over its compressed entries: a compressor of its own at
/// `index_head_dim`, its query heads `q_b_proj` of the query latent, their weights
/// `scorer.weights_proj` of the layer's input.
struct EntryIndexer<B: Backend> {
    pool: Pool<B>,
    q_b: B::Linear,
    weights: B::Linear,
    spec: IndexSpec,
    span: RotarySpan,
}

/// The RoPE tables a DeepSeek-V4 layer reads: its own (`cos`, `sin`, and `-sin` for the
/// output's rotation back), the compressed layers' at stride `rate` for their entries, and
/// the compressed layers' at the tokens' positions for the indexer's queries.
pub(super) struct LayerTables<'a, B: Backend> {
    pub(super) cos: &'a B::Tensor,
    pub(super) sin: &'a B::Tensor,
    pub(super) inverse_sin: &'a B::Tensor,
    pub(super) entries: Option<(&'a B::Tensor, &'a B::Tensor)>,
    pub(super) index_queries: (&'a B::Tensor, &'a B::Tensor),
}

/// DeepSeek-V4's attention: queries from the query latent (`q_a_proj`, `q_a_norm`,
/// `q_b_proj`, each head RMS-normed without a weight), one key/value head (`kv_proj`,
/// `kv_norm`) read as keys and as values, the last `rotary_dim` values of every head rotated
/// (pairs interleaved). A query attends to its sliding window and, in the compressed layers,
/// to the entries pooled from the windows of `rate` tokens it has seen: all of them
/// (`heavily_compressed_attention`), or its indexer's top `index_topk`
/// (`compressed_sparse_attention`); sinks in the softmax. The output's rotated values are
/// rotated back, then each group of heads goes through its part of `o_a_proj`.
pub(super) struct CompressedAttention<B: Backend> {
    q_a: B::Linear,
    q_a_norm: B::Tensor,
    q_b: B::Linear,
    /// Ones `[head_dim]`: the queries' weightless norm.
    head_ones: B::Tensor,
    kv: B::Linear,
    kv_norm: B::Tensor,
    o_a: Vec<B::Linear>,
    pool: Option<Pool<B>>,
    indexer: Option<EntryIndexer<B>>,
    compression: Compression,
    window: usize,
}

impl<B: Backend> CompressedAttention<B> {
    pub(super) fn load(
        b: &B,
        ckpt: &Checkpoint,
        modules: &AttnProjections,
        (layer, layer_prefix): (usize, &str),
    ) -> Result<Self> {
        let c = &ckpt.config;
        let (v4, window) = match (&c.deepseek_v4, c.sliding_window) {
            (Some(v4), Some(w)) => (v4, w),
            _ => {
                return Err(Error::InvalidArgument(
                    "DeepSeek-V4 modules without their config".into(),
                ));
            }
        };
        let AttnProjections::Compressed {
            q_a,
            q_b,
            kv,
            o_a,
            compressor,
        } = modules
        else {
            return Err(Error::InvalidArgument(
                "DeepSeek-V4's attention from other modules".into(),
            ));
        };
        let compression = *v4.compression.get(layer).ok_or_else(|| {
            Error::InvalidArgument(format!("DeepSeek-V4 layer {layer} past its layer_types"))
        })?;
        let norm = |name: &str, n| -> Result<B::Tensor> {
            let name = format!("{layer_prefix}.self_attn.{name}.weight");
            b.upload_vector(&name, &ckpt.norm(&name, n)?)
        };
        let rope_dim = c.rotary_dim;
        let (pool, indexer) = match (compressor, compression) {
            (None, Compression::None) => (None, None),
            (Some(m), Compression::Heavy { rate }) if m.indexer.is_none() => (
                Some(Pool::load(b, ckpt, [&m.kv, &m.gate], (rate, false))?),
                None,
            ),
            (Some(m), Compression::Sparse { rate }) => {
                let [ix_kv, ix_gate, q_b, weights] = m.indexer.as_ref().ok_or_else(|| {
                    Error::InvalidArgument(format!("{layer_prefix}: no indexer modules"))
                })?;
                let (heads, d) = (v4.index_heads, v4.index_head_dim);
                if d < rope_dim {
                    return Err(Error::InvalidArgument(format!(
                        "index_head_dim {d} is narrower than the rotated {rope_dim} values"
                    )));
                }
                let indexer = EntryIndexer {
                    pool: Pool::load(b, ckpt, [ix_kv, ix_gate], (rate, true))?,
                    q_b: upload(b, ckpt, q_b)?,
                    weights: upload(b, ckpt, weights)?,
                    spec: IndexSpec {
                        heads,
                        head_dim: d,
                        top_k: v4.index_top_k,
                        scale: (1.0 / (d as f64).sqrt()) as f32,
                        weight_scale: (1.0 / (heads as f64).sqrt()) as f32,
                        rate,
                    },
                    span: RotarySpan {
                        head_dim: d,
                        start: d - rope_dim,
                        dims: rope_dim,
                        interleaved: true,
                    },
                };
                let pool = Pool::load(b, ckpt, [&m.kv, &m.gate], (rate, true))?;
                (Some(pool), Some(indexer))
            }
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "{layer_prefix}: a compressor that does not match the layer's type \
                     ({compression:?})"
                )));
            }
        };
        Ok(Self {
            q_a: upload(b, ckpt, q_a)?,
            q_a_norm: norm("q_a_norm", v4.q_lora_rank)?,
            q_b: upload(b, ckpt, q_b)?,
            head_ones: b.upload_vector("query head norm", &vec![1.0; c.head_dim])?,
            kv: upload(b, ckpt, kv)?,
            kv_norm: norm("kv_norm", c.head_dim)?,
            o_a: o_a
                .iter()
                .map(|m| upload(b, ckpt, m))
                .collect::<Result<_>>()?,
            pool,
            indexer,
            compression,
            window,
        })
    }

    /// The type the projections want their input in.
    pub(super) fn input_type(&self, b: &B) -> OutType {
        b.input_type(&self.q_a)
    }

    /// The input of `o_b_proj` (in type `out`) from the layer's normed input `xn`: `spec` the
    /// heads (one key/value head), `span` the values of each head RoPE rotates.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward(
        &self,
        b: &B,
        xn: B::Tensor,
        (seqs, layout): (&B::Sequences, &SeqLayout),
        tables: LayerTables<'_, B>,
        (spec, span, sinks): (AttnSpec, RotarySpan, Option<&B::Tensor>),
        eps: f32,
        out: OutType,
    ) -> Result<B::Tensor> {
        let t = xn.rows();
        let (heads, d) = (spec.heads, spec.head_dim);
        let latent = b.linear(&xn, &self.q_a)?;
        let q_residual = b.rms_norm(&latent, &self.q_a_norm, eps, b.input_type(&self.q_b))?;
        drop(latent);
        let q = b.linear(&q_residual, &self.q_b)?.reshaped(t * heads, d)?;
        let mut q = b
            .rms_norm(&q, &self.head_ones, eps, OutType::Activation)?
            .reshaped(t, heads * d)?;
        b.rope(&mut q, seqs, tables.cos, tables.sin, span)?;
        let kv = b.linear(&xn, &self.kv)?;
        let mut kv = b.rms_norm(&kv, &self.kv_norm, eps, OutType::Activation)?;
        b.rope(&mut kv, seqs, tables.cos, tables.sin, span)?;
        let act = OutType::Activation;
        let mut attn = match (&self.pool, self.compression.rate()) {
            (Some(pool), Some(rate)) => {
                let entry_tables = tables.entries.ok_or_else(|| {
                    Error::backend("attention", "no RoPE tables for compressed entries")
                })?;
                // One key head: the span of a query head.
                let entries = pool.entries(b, &xn, seqs, entry_tables, span, eps)?;
                let picked = match &self.indexer {
                    Some(ix) => Some(ix.select(b, (&xn, &q_residual), seqs, &tables, eps)?),
                    None => None,
                };
                drop((xn, q_residual));
                // The entries after the tokens: entry e of a sequence starting at row `a` is
                // row `t + a + e`, position `t + e` in its lists.
                let rows: Vec<u32> = (0..2 * t as u32).collect();
                let keys = b.take_rows(&[&kv, &entries], &rows)?;
                drop((kv, entries));
                let entries = match &picked {
                    Some(p) => EntryKeys::Picked(p),
                    None => EntryKeys::Seen { rate },
                };
                let lists = b.compressed_keys((seqs, layout), self.window, entries)?;
                drop(picked);
                b.sparse_attention(&q, &keys, &keys, seqs, spec, (&lists, sinks), act)?
            }
            _ => {
                drop((xn, q_residual));
                let windowed = AttnSpec {
                    window: Some(self.window),
                    ..spec
                };
                b.attention(&q, &kv, &kv, seqs, windowed, sinks, act)?
            }
        };
        drop(q);
        // The values were rotated with the keys: the output's rotated part turned back.
        b.rope(&mut attn, seqs, tables.cos, tables.inverse_sin, span)?;
        let group_in = heads * d / self.o_a.len().max(1);
        linear_per_block(b, &attn, (&self.o_a, group_in), out)
    }
}

impl<B: Backend> EntryIndexer<B> {
    /// Each query's top `index_topk` entries `[tokens, top_k]` (positions of entries, then
    /// -1s), scored from the layer's input `xn` and the query latent `q_residual`.
    fn select(
        &self,
        b: &B,
        (xn, q_residual): (&B::Tensor, &B::Tensor),
        seqs: &B::Sequences,
        tables: &LayerTables<'_, B>,
        eps: f32,
    ) -> Result<B::Tensor> {
        let entry_tables = tables
            .entries
            .ok_or_else(|| Error::backend("index", "no RoPE tables for compressed entries"))?;
        let keys = self
            .pool
            .entries(b, xn, seqs, entry_tables, self.span, eps)?;
        let mut q = b.linear(q_residual, &self.q_b)?;
        let (cos, sin) = tables.index_queries;
        b.rope(&mut q, seqs, cos, sin, self.span)?;
        let weights = b.linear(xn, &self.weights)?;
        b.index_top_k(&q, &keys, &weights, seqs, self.spec)
    }
}

/// What the hyper-connections and the final collapse (`hc_head`) share: the linear `fn`
/// (`[outputs, streams * hidden]`, kept in f32 as the reference keeps it) of the streams
/// RMS-normed together without a weight, the bias `base` of its outputs, and the rule of the
/// weights they give (`HyperRule`).
pub(super) struct StreamWeights<B: Backend> {
    mix: B::Linear,
    base: Vec<f32>,
    ones: B::Tensor,
    streams: usize,
    hc_eps: f32,
    norm_eps: f32,
}

impl<B: Backend> StreamWeights<B> {
    /// `fn` and `base` of `outputs` values.
    fn load(b: &B, ckpt: &Checkpoint, [fn_name, base]: [&str; 2], outputs: usize) -> Result<Self> {
        let c = &ckpt.config;
        let hyper = c.hyper.as_ref().ok_or_else(|| {
            Error::InvalidArgument("hyper-connections without their config".into())
        })?;
        let width = hyper.streams * c.hidden_size;
        let values = ckpt.floats(fn_name, &[outputs, width])?;
        let dense_f32 = (None, crate::numerics::FloatType::F32);
        Ok(Self {
            mix: upload_dense(b, fn_name, &values, (outputs, width), dense_f32)?,
            base: ckpt.floats(base, &[outputs])?,
            ones: b.upload_vector("stream norm", &vec![1.0; width])?,
            streams: hyper.streams,
            hc_eps: hyper.eps as f32,
            norm_eps: c.rms_norm_eps as f32,
        })
    }

    /// `streams` RMS-normed together without a weight: `fn`'s input.
    fn normed(&self, b: &B, streams: &B::Tensor) -> Result<B::Tensor> {
        b.rms_norm(streams, &self.ones, self.norm_eps, OutType::F32)
    }

    /// The rule of the weights (`scale`: the `pre`, `post` and `comb` outputs' factors).
    fn rule(&self, scale: [f32; 3], iters: usize) -> HyperRule<'_> {
        HyperRule {
            streams: self.streams,
            base: &self.base,
            scale,
            eps: self.hc_eps,
            iters,
        }
    }
}

/// A block's hyper-connection (`attn_hc`, `ffn_hc`): from the residual streams `fn` gives
/// each token's weights: `pre` (which collapse the streams into the block's input), `post`
/// (which spread the block's output over them) and `comb` (which mix them: Sinkhorn-normalised
/// to a doubly stochastic matrix).
pub(super) struct HyperConnection<B: Backend> {
    weights: StreamWeights<B>,
    /// The `pre`, `post` and `comb` outputs' factors.
    scale: [f32; 3],
    iters: usize,
}

/// A block's `post` `[tokens, streams]` and `comb` `[tokens, streams * streams]` weights.
pub(super) struct Mixing<B: Backend> {
    post: B::Tensor,
    comb: B::Tensor,
}

impl<B: Backend> HyperConnection<B> {
    /// `{at}.fn`, `{at}.base` and `{at}.scale`.
    pub(super) fn load(b: &B, ckpt: &Checkpoint, at: &str) -> Result<Self> {
        let n = ckpt.config.hyper.as_ref().map_or(0, |h| h.streams);
        let names = [&format!("{at}.fn")[..], &format!("{at}.base")];
        let weights = StreamWeights::load(b, ckpt, names, (2 + n) * n)?;
        let scale = ckpt.floats(&format!("{at}.scale"), &[3])?;
        Ok(Self {
            weights,
            scale: [scale[0], scale[1], scale[2]],
            iters: ckpt.config.hyper.as_ref().map_or(1, |h| h.sinkhorn_iters),
        })
    }

    /// The block's input `[tokens, hidden]` (f32) collapsed from `streams` `[tokens, streams
    /// * hidden]`, and the weights that spread its output back (`expand`).
    pub(super) fn collapse(&self, b: &B, streams: &B::Tensor) -> Result<(B::Tensor, Mixing<B>)> {
        let w = &self.weights;
        let normed = w.normed(b, streams)?;
        let [pre, post, comb] =
            b.hyper_weights(&normed, &w.mix, &w.rule(self.scale, self.iters))?;
        drop(normed);
        Ok((
            b.mix_streams(streams, &pre, None, 1)?,
            Mixing { post, comb },
        ))
    }

    /// The streams after the block: `comb^T` of the streams plus `post` times its output.
    pub(super) fn expand(
        &self,
        b: &B,
        streams: &B::Tensor,
        output: &B::Tensor,
        mixing: Mixing<B>,
    ) -> Result<B::Tensor> {
        let added = Some((output, &mixing.post));
        b.mix_streams(streams, &mixing.comb, added, self.weights.streams)
    }
}

/// The streams collapsed once more after the last layer, before the final norm
/// (`HyperConnections::head`).
pub(super) enum HyperHead<B: Backend> {
    /// DeepSeek-V4's `hc_head`: `pre` weights alone.
    Weighted {
        weights: StreamWeights<B>,
        scale: f32,
    },
    /// GLM-5.3-Flash's: the streams' mean.
    Mean { streams: usize },
}

impl<B: Backend> HyperHead<B> {
    pub(super) fn load(b: &B, ckpt: &Checkpoint) -> Result<Self> {
        let hyper = ckpt.config.hyper.as_ref().ok_or_else(|| {
            Error::InvalidArgument("hyper-connections without their config".into())
        })?;
        if hyper.head == config::HyperHead::Mean {
            return Ok(Self::Mean {
                streams: hyper.streams,
            });
        }
        let at = format!("{}.hc_head", ckpt.config.prefix);
        let names = [&format!("{at}.hc_fn")[..], &format!("{at}.hc_base")];
        Ok(Self::Weighted {
            weights: StreamWeights::load(b, ckpt, names, hyper.streams)?,
            scale: ckpt.floats(&format!("{at}.hc_scale"), &[1])?[0],
        })
    }

    /// `[tokens, hidden]` f32 from `streams` `[tokens, streams * hidden]`.
    pub(super) fn collapse(&self, b: &B, streams: &B::Tensor) -> Result<B::Tensor> {
        let (pre, n) = match self {
            Self::Weighted { weights: w, scale } => {
                let rule = w.rule([*scale; 3], 1);
                let outputs = b.logits(&w.normed(b, streams)?, &w.mix)?;
                let pre: Vec<f32> = (outputs.iter().enumerate())
                    .map(|(i, &v)| rule.pre(v, i % w.streams, *scale))
                    .collect();
                (pre, w.streams)
            }
            &Self::Mean { streams: n } => (vec![1.0 / n as f32; streams.rows() * n], n),
        };
        let pre = b
            .upload_vector("hyper-connection pre", &pre)?
            .reshaped(streams.rows(), n)?;
        b.mix_streams(streams, &pre, None, 1)
    }
}

/// The embeddings `x` `[tokens, hidden]` as the first layer's `streams` residual streams: each
/// a copy.
pub(super) fn spread<B: Backend>(b: &B, x: &B::Tensor, streams: usize) -> Result<B::Tensor> {
    let d = x.cols();
    let copies = ColumnBlocks {
        blocks: streams,
        width: d,
        from: 0,
        from_stride: 0,
        to: 0,
        to_stride: d,
    };
    b.assemble_columns(x.rows(), streams * d, &[(x, copies)], OutType::F32)
}
