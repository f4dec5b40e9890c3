//! One decoder forward pass for Llama, Mistral, Qwen2 (q/k/v bias) and Qwen3 (q/k norm),
//! tied or untied embeddings, and their mixture-of-experts variants (Qwen2-MoE, Qwen3-MoE,
//! Mixtral: a layer's MLP is then a router over experts), over any `Backend`.
//!
//! A `Model` holds a contiguous range of decoder layers, and the embedding and/or the final
//! norm + lm_head when the range starts or ends the network: the whole model on one device, or
//! one stage of a pipeline split across devices (`--parallel layers`).

use std::ops::Range;

use crate::backend::{
    AttnShape, Backend, KldTerms, OutType, RouteRule, RowGroups, SeqLayout, Shaped, routing,
};
use crate::checkpoint::{self, Checkpoint, FeedForward, ModelConfig, Router};
use crate::{Error, Result};

struct Layer<B: Backend> {
    attn_norm: B::Tensor,
    q: B::Linear,
    k: B::Linear,
    v: B::Linear,
    o: B::Linear,
    q_norm: Option<B::Tensor>,
    k_norm: Option<B::Tensor>,
    mlp_norm: B::Tensor,
    ffn: Ffn<B>,
}

/// A gated MLP's three linears.
struct Mlp<B: Backend> {
    gate: B::Linear,
    up: B::Linear,
    down: B::Linear,
}

impl<B: Backend> Mlp<B> {
    fn load(b: &B, ckpt: &Checkpoint, m: &checkpoint::Mlp) -> Result<Self> {
        Ok(Self {
            gate: b.upload_linear(&ckpt.linear(&m.gate)?)?,
            up: b.upload_linear(&ckpt.linear(&m.up)?)?,
            down: b.upload_linear(&ckpt.linear(&m.down)?)?,
        })
    }

    /// `down(silu(gate(x)) * up(x))`.
    fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let g = b.linear(x, &self.gate)?;
        let u = b.linear(x, &self.up)?;
        let gu = b.silu_mul(&g, &u, b.input_type(&self.down))?;
        drop((g, u));
        b.linear(&gu, &self.down)
    }
}

/// The experts of a sparse layer, their router, and the shared expert where there is one.
struct Moe<B: Backend> {
    router: B::Linear,
    experts: Vec<Mlp<B>>,
    shared: Option<Mlp<B>>,
    /// `[1, hidden]`: its sigmoid scales the shared expert (Qwen2-MoE).
    shared_gate: Option<B::Linear>,
    experts_per_token: usize,
    routing: Router,
    /// The router's selection bias (sigmoid routers; zeros where the checkpoint has none).
    score_bias: Vec<f32>,
}

impl<B: Backend> Moe<B> {
    /// `sum_i w_i expert_i(x)` over each token's routed experts, plus the shared expert: every
    /// expert runs once over the rows routed to it (gathered), and its output is scaled and
    /// added into an f32 accumulator in expert order, as transformers' loop does.
    fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let [t, h] = x.shape();
        let shared_weights = match (&self.shared, &self.shared_gate) {
            (None, _) => None,
            (Some(_), Some(g)) => Some(b.logits(x, g)?.into_iter().map(routing::sigmoid).collect()),
            (Some(_), None) => Some(vec![1.0; t]),
        };
        let rule = RouteRule {
            experts: self.experts.len(),
            experts_per_token: self.experts_per_token,
            router: self.routing,
            bias: &self.score_bias,
        };
        let (uploaded, lens) = b.route(x, &self.router, &rule, shared_weights.as_deref())?;
        let mut acc = b.zeros(t, h)?;
        for (g, mlp) in self.experts.iter().chain(&self.shared).enumerate() {
            if lens.get(g).is_none_or(|&n| n == 0) {
                continue;
            }
            let rows = b.gather_group(x, &uploaded, g, b.input_type(&mlp.gate))?;
            let y = mlp.forward(b, &rows)?;
            drop(rows);
            b.scatter_add_group(&mut acc, &y, &uploaded, g)?;
        }
        Ok(acc)
    }
}

/// A layer's MLP: dense, or a mixture of experts.
enum Ffn<B: Backend> {
    Dense(Mlp<B>),
    Moe(Moe<B>),
}

impl<B: Backend> Ffn<B> {
    fn load(b: &B, ckpt: &Checkpoint, f: &FeedForward) -> Result<Self> {
        Ok(match f {
            FeedForward::Dense(m) => Self::Dense(Mlp::load(b, ckpt, m)?),
            FeedForward::Sparse(s) => {
                let moe = ckpt.config.moe.as_ref().ok_or_else(|| {
                    Error::InvalidArgument("a sparse layer in a dense config".into())
                })?;
                let (shared, shared_gate) = match &s.shared {
                    None => (None, None),
                    Some((m, gate)) => (
                        Some(Mlp::load(b, ckpt, m)?),
                        gate.as_ref()
                            .map(|g| b.upload_linear(&ckpt.linear(g)?))
                            .transpose()?,
                    ),
                };
                Self::Moe(Moe {
                    router: b.upload_linear(&ckpt.linear(&s.router)?)?,
                    experts: s
                        .experts
                        .iter()
                        .map(|m| Mlp::load(b, ckpt, m))
                        .collect::<Result<_>>()?,
                    shared,
                    shared_gate,
                    experts_per_token: moe.experts_per_token,
                    routing: moe.router,
                    score_bias: match &s.score_bias {
                        Some(name) => ckpt.norm(name, moe.num_experts)?,
                        None => vec![0.0; moe.num_experts],
                    },
                })
            }
        })
    }

    fn input_type(&self, b: &B) -> OutType {
        match self {
            Self::Dense(m) => b.input_type(&m.gate),
            // The router reads it in f32: rounded to bf16 first, its logits would pick other
            // experts at near-ties. Each expert's rows are gathered in the type it wants.
            Self::Moe(_) => OutType::F32,
        }
    }

    fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        match self {
            Self::Dense(m) => m.forward(b, x),
            Self::Moe(m) => m.forward(b, x),
        }
    }
}

/// The final norm and the output projection.
struct Head<B: Backend> {
    norm: B::Tensor,
    /// `None`: tied to the embedding, which this stage holds.
    lm_head: Option<B::Linear>,
}

pub struct Model<B: Backend> {
    pub config: ModelConfig,
    /// The decoder layers this model holds.
    pub layers_range: Range<usize>,
    embed: Option<B::Linear>,
    layers: Vec<Layer<B>>,
    head: Option<Head<B>>,
    rope_cos: B::Tensor,
    rope_sin: B::Tensor,
    max_positions: usize,
}

/// What `Model::load` reports as it uploads, for progress bars.
pub type LoadProgress<'a> = &'a dyn Fn(usize, usize);

impl<B: Backend> Model<B> {
    /// Uploads every weight of `ckpt` to `backend`, for sequences of up to `max_positions`.
    pub fn load(
        backend: &B,
        ckpt: &Checkpoint,
        max_positions: usize,
        progress: LoadProgress,
    ) -> Result<Self> {
        Self::load_stage(
            backend,
            ckpt,
            0..ckpt.config.num_layers,
            max_positions,
            progress,
        )
    }

    /// Uploads layers `layers` of `ckpt`, plus the embedding if the range starts at layer 0
    /// and the final norm + lm_head if it ends at the last layer.
    pub fn load_stage(
        backend: &B,
        ckpt: &Checkpoint,
        layers_range: Range<usize>,
        max_positions: usize,
        progress: LoadProgress,
    ) -> Result<Self> {
        let c = ckpt.config.clone();
        if max_positions > c.max_position_embeddings {
            return Err(Error::ContextTooLong {
                ctx: max_positions,
                max: c.max_position_embeddings,
            });
        }
        if let Some(w) = c.sliding_window
            && max_positions > w
        {
            return Err(Error::unsupported(
                ckpt.dir.display().to_string(),
                "sliding_window",
                format!("context {max_positions} exceeds the sliding window {w}; use --ctx <= {w}"),
            ));
        }
        let first = layers_range.start == 0;
        let last = layers_range.end == c.num_layers;
        let steps = layers_range.len() + 2;
        progress(0, steps);
        let norm_vec = |name: &str, n: usize| -> Result<B::Tensor> {
            backend.upload_vector(name, &ckpt.norm(name, n)?)
        };
        let embed = if first {
            Some(backend.upload_linear(&ckpt.embedding()?)?)
        } else {
            None
        };
        let head = if last {
            let lm_head = match ckpt.lm_head()? {
                Some(h) => Some(backend.upload_linear(&h)?),
                // Tied: the embedding table is the output projection, uploaded a second time
                // only by a stage that does not hold the embedding.
                None if first => None,
                None => Some(backend.upload_linear(&ckpt.embedding()?)?),
            };
            Some(Head {
                norm: norm_vec("model.norm.weight", c.hidden_size)?,
                lm_head,
            })
        } else {
            None
        };
        progress(1, steps);
        let mut layers = Vec::with_capacity(layers_range.len());
        for (k, l) in layers_range.clone().enumerate() {
            let p = format!("model.layers.{l}");
            let modules = &ckpt.layers[l];
            let upload = |m| backend.upload_linear(&ckpt.linear(m)?);
            let (q_norm, k_norm) = if c.qk_norm {
                (
                    Some(norm_vec(
                        &format!("{p}.self_attn.q_norm.weight"),
                        c.head_dim,
                    )?),
                    Some(norm_vec(
                        &format!("{p}.self_attn.k_norm.weight"),
                        c.head_dim,
                    )?),
                )
            } else {
                (None, None)
            };
            layers.push(Layer {
                attn_norm: norm_vec(&format!("{p}.input_layernorm.weight"), c.hidden_size)?,
                q: upload(&modules.q)?,
                k: upload(&modules.k)?,
                v: upload(&modules.v)?,
                o: upload(&modules.o)?,
                ffn: Ffn::load(backend, ckpt, &modules.ffn)?,
                q_norm,
                k_norm,
                mlp_norm: norm_vec(
                    &format!("{p}.post_attention_layernorm.weight"),
                    c.hidden_size,
                )?,
            });
            progress(k + 2, steps);
        }
        let (cos, sin) = super::rope::tables(&c, max_positions);
        let rope_cos = backend.upload_vector("rope_cos", &cos)?;
        let rope_sin = backend.upload_vector("rope_sin", &sin)?;
        progress(steps, steps);
        Ok(Self {
            config: c,
            layers_range,
            embed,
            layers,
            head,
            rope_cos,
            rope_sin,
            max_positions,
        })
    }

    pub fn has_embedding(&self) -> bool {
        self.embed.is_some()
    }

    pub fn has_head(&self) -> bool {
        self.head.is_some()
    }

    fn check_len(&self, layout: &SeqLayout) -> Result<()> {
        if layout.max_len() > self.max_positions {
            return Err(Error::ContextTooLong {
                ctx: layout.max_len(),
                max: self.max_positions,
            });
        }
        Ok(())
    }

    /// Token embeddings `[tokens, hidden]` (first stage only).
    pub fn embed(&self, b: &B, ids: &[u32]) -> Result<B::Tensor> {
        let table = self.embed.as_ref().ok_or_else(|| {
            Error::InvalidArgument("this pipeline stage holds no embedding".into())
        })?;
        b.embed(table, ids)
    }

    /// Runs this model's decoder layers over the residual stream `x` `[tokens, hidden]`.
    pub fn run_layers(&self, b: &B, mut x: B::Tensor, layout: &SeqLayout) -> Result<B::Tensor> {
        self.check_len(layout)?;
        let c = &self.config;
        let t = layout.n_tokens();
        let d = c.head_dim;
        let eps = c.rms_norm_eps as f32;
        let shape = AttnShape {
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: d,
        };
        let seqs = b.upload_sequences(layout)?;
        // Each residual update is added by the norm that reads the stream next (fused where
        // the backend can); the last layer's MLP output is added on its own at the end.
        let mut pending: Option<B::Tensor> = None;
        for layer in &self.layers {
            let (wq, wk, wv, wo) = (&layer.q, &layer.k, &layer.v, &layer.o);
            let qkv_in = b.input_type(wq);
            let xn = match pending.take() {
                Some(down) => b.add_rms_norm(&mut x, &down, &layer.attn_norm, eps, qkv_in)?,
                None => b.rms_norm(&x, &layer.attn_norm, eps, qkv_in)?,
            };
            let mut q = b.linear(&xn, wq)?;
            let mut k = b.linear(&xn, wk)?;
            let v = b.linear(&xn, wv)?;
            drop(xn);
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                // Each token's heads as rows of head_dim, normed, then back.
                let norm_heads = |x: B::Tensor, w: &B::Tensor, heads: usize| {
                    let rows = x.reshaped(t * heads, d)?;
                    b.rms_norm(&rows, w, eps, OutType::Activation)?
                        .reshaped(t, heads * d)
                };
                q = norm_heads(q, qn, c.num_heads)?;
                k = norm_heads(k, kn, c.num_kv_heads)?;
            }
            let r = c.rotary_dim;
            b.rope(&mut q, &seqs, &self.rope_cos, &self.rope_sin, d, r)?;
            b.rope(&mut k, &seqs, &self.rope_cos, &self.rope_sin, d, r)?;
            let attn = b.attention(&q, &k, &v, &seqs, shape, b.input_type(wo))?;
            drop((q, k, v));
            let o = b.linear(&attn, wo)?;
            drop(attn);
            let mlp_in = layer.ffn.input_type(b);
            let xn = b.add_rms_norm(&mut x, &o, &layer.mlp_norm, eps, mlp_in)?;
            drop(o);
            pending = Some(layer.ffn.forward(b, &xn)?);
        }
        if let Some(down) = pending {
            b.add_assign(&mut x, &down)?;
        }
        Ok(x)
    }

    /// This model's part of a pipelined forward pass on device `b`: the residual stream
    /// `handed_on` by the previous stage's device, or at the first stage the embeddings of
    /// `ids`, through this stage's layers.
    pub fn stage_forward(
        &self,
        b: &B,
        handed_on: Option<(&B, B::Tensor)>,
        ids: &[u32],
        layout: &SeqLayout,
    ) -> Result<B::Tensor> {
        let x = match handed_on {
            Some((from, x)) => b.copy_from(from, &x)?,
            None => self.embed(b, ids)?,
        };
        self.run_layers(b, x, layout)
    }

    /// The final norm and the output projection (last stage only).
    fn head(&self) -> Result<(&B::Tensor, &B::Linear)> {
        let no_head = || Error::InvalidArgument("this pipeline stage holds no lm_head".into());
        let head = self.head.as_ref().ok_or_else(no_head)?;
        let projection = head.lm_head.as_ref().or(self.embed.as_ref());
        Ok((&head.norm, projection.ok_or_else(no_head)?))
    }

    /// The final norm of the residual stream (last stage only).
    pub fn final_norm(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let (norm, projection) = self.head()?;
        let eps = self.config.rms_norm_eps as f32;
        b.rms_norm(x, norm, eps, b.input_type(projection))
    }

    /// NLL of each target (`targets[i] >= 0`) from the residual stream after the last layer.
    pub fn nll_from_residual(&self, b: &B, x: &B::Tensor, targets: &[i32]) -> Result<Vec<f32>> {
        let hidden = self.final_norm(b, x)?;
        b.nll(&hidden, self.head()?.1, targets)
    }

    /// Final-normed hidden states `[tokens, hidden]` of a batch of sequences laid end to end
    /// (a model holding every layer).
    pub fn hidden(&self, b: &B, ids: &[u32], layout: &SeqLayout) -> Result<B::Tensor> {
        let x = self.run_layers(b, self.embed(b, ids)?, layout)?;
        self.final_norm(b, &x)
    }

    /// Full-vocabulary f32 logits of rows `rows` of final-normed `hidden`, `[rows, vocab]`
    /// (`serve` reduces them on the host).
    pub fn head_logits(&self, b: &B, hidden: &B::Tensor, rows: &[u32]) -> Result<Vec<f32>> {
        let projection = self.head()?.1;
        let groups = b.upload_groups(&RowGroups {
            rows: rows.to_vec(),
            weights: vec![1.0; rows.len()],
            offsets: vec![0, rows.len()],
        })?;
        let picked = b.gather_group(hidden, &groups, 0, b.input_type(projection))?;
        b.logits(&picked, projection)
    }

    /// Negative log-likelihood of each target (`targets[i] >= 0`), in token order.
    pub fn nll(&self, b: &B, ids: &[u32], layout: &SeqLayout, targets: &[i32]) -> Result<Vec<f32>> {
        let hidden = self.hidden(b, ids, layout)?;
        b.nll(&hidden, self.head()?.1, targets)
    }

    /// KL divergence terms of this model against `base` on the same batch.
    pub fn kld_against(
        &self,
        base: &Model<B>,
        b: &B,
        ids: &[u32],
        layout: &SeqLayout,
        targets: &[i32],
    ) -> Result<Vec<KldTerms>> {
        self.check_same_vocab(base)?;
        let base_hidden = base.hidden(b, ids, layout)?;
        let hidden = self.hidden(b, ids, layout)?;
        b.kld(
            &base_hidden,
            base.head()?.1,
            &hidden,
            self.head()?.1,
            targets,
        )
    }

    /// [`kld_against`](Self::kld_against) from both models' residual streams after their
    /// last layers (the last stages of two pipelines, on the same device).
    pub fn kld_from_residuals(
        &self,
        base: &Model<B>,
        b: &B,
        base_x: B::Tensor,
        x: B::Tensor,
        targets: &[i32],
    ) -> Result<Vec<KldTerms>> {
        self.check_same_vocab(base)?;
        // Each residual is dropped once normed: at most three activations live at once, as in
        // `kld_against`.
        let base_hidden = base.final_norm(b, &base_x)?;
        drop(base_x);
        let hidden = self.final_norm(b, &x)?;
        drop(x);
        b.kld(
            &base_hidden,
            base.head()?.1,
            &hidden,
            self.head()?.1,
            targets,
        )
    }

    /// Saved final-normed hidden states (`[rows, hidden]` f32 values) on `b`, in the type
    /// this model's head reads, as `final_norm` would have handed them on.
    pub fn upload_head_input(&self, b: &B, values: &[f32], rows: usize) -> Result<B::Tensor> {
        let projection = self.head()?.1;
        let t = match b.input_type(projection) {
            OutType::F32 => b.upload_vector("base states", values)?,
            OutType::Activation => b.upload_activation(values)?,
        };
        t.reshaped(rows, self.config.hidden_size)
    }

    /// KL divergence terms against a base known by its saved hidden states `base_hidden`
    /// (`base` holds only its head: `load_stage` of the empty range after its last layer),
    /// from this model's residual stream after its last layer.
    pub fn kld_from_base_states(
        &self,
        base: &Model<B>,
        b: &B,
        base_hidden: &B::Tensor,
        x: B::Tensor,
        targets: &[i32],
    ) -> Result<Vec<KldTerms>> {
        self.check_same_vocab(base)?;
        let hidden = self.final_norm(b, &x)?;
        drop(x);
        b.kld(
            base_hidden,
            base.head()?.1,
            &hidden,
            self.head()?.1,
            targets,
        )
    }

    fn check_same_vocab(&self, base: &Model<B>) -> Result<()> {
        if base.config.vocab_size != self.config.vocab_size {
            return Err(Error::InvalidArgument(format!(
                "vocabulary sizes differ: base {} vs test {}",
                base.config.vocab_size, self.config.vocab_size
            )));
        }
        Ok(())
    }
}

/// Splits `n_layers` into contiguous ranges, one per device, in proportion to `capacity`
/// (e.g. free memory), each at least one layer. Needs `n_layers >= capacity.len()`.
pub fn split_layers(n_layers: usize, capacity: &[u64]) -> Vec<Range<usize>> {
    let n = capacity.len();
    let total: u128 = capacity.iter().map(|&c| c.max(1) as u128).sum();
    let mut ranges = Vec::with_capacity(n);
    let (mut start, mut acc) = (0usize, 0u128);
    for (i, &c) in capacity.iter().enumerate() {
        acc += c.max(1) as u128;
        let ideal = ((acc * n_layers as u128 + total / 2) / total) as usize;
        let end = if i + 1 == n {
            n_layers
        } else {
            ideal.clamp(start + 1, n_layers - (n - i - 1))
        };
        ranges.push(start..end);
        start = end;
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::split_layers;

    #[test]
    fn layers_split_in_proportion_to_capacity() {
        assert_eq!(split_layers(32, &[1, 1]), vec![0..16, 16..32]);
        assert_eq!(
            split_layers(80, &[100, 100, 100, 100]),
            vec![0..20, 20..40, 40..60, 60..80]
        );
        // A device with three times the memory takes three times the layers.
        assert_eq!(split_layers(8, &[3, 1]), vec![0..6, 6..8]);
        // Every device gets a layer even when its share rounds to zero.
        assert_eq!(split_layers(3, &[1000, 1, 1]), vec![0..1, 1..2, 2..3]);
        assert_eq!(split_layers(10, &[1, 1000]), vec![0..1, 1..10]);
        let r = split_layers(5, &[7, 3, 9]);
        assert_eq!(r.first().map(|r| r.start), Some(0));
        assert_eq!(r.last().map(|r| r.end), Some(5));
        assert!(
            r.windows(2)
                .all(|w| w[0].end == w[1].start && !w[1].is_empty())
        );
    }
}
