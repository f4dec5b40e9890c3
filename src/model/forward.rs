//! One decoder forward pass for Llama, Mistral, Qwen2 (q/k/v bias) and Qwen3 (q/k norm),
//! tied or untied embeddings, over any `Backend`.

use crate::backend::{AttnShape, Backend, KldTerms, SeqLayout};
use crate::checkpoint::{Checkpoint, LAYER_LINEARS, ModelConfig, QLinear};
use crate::{Error, Result};

struct Layer<B: Backend> {
    attn_norm: B::Tensor,
    /// q, k, v, o, gate, up, down
    linears: Vec<B::Linear>,
    q_norm: Option<B::Tensor>,
    k_norm: Option<B::Tensor>,
    mlp_norm: B::Tensor,
}

pub struct Model<B: Backend> {
    pub config: ModelConfig,
    embed: B::Linear,
    lm_head: Option<B::Linear>,
    layers: Vec<Layer<B>>,
    norm: B::Tensor,
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
        let steps = c.num_layers + 2;
        progress(0, steps);
        let embed = backend.upload_linear(&ckpt.embedding()?)?;
        let lm_head = ckpt
            .lm_head()?
            .map(|h: QLinear| backend.upload_linear(&h))
            .transpose()?;
        let norm_vec = |name: &str, n: usize| -> Result<B::Tensor> {
            backend.upload_vector(name, &ckpt.norm(name, n)?)
        };
        progress(1, steps);
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            let p = format!("model.layers.{l}");
            let linears = (0..LAYER_LINEARS.len())
                .map(|i| backend.upload_linear(&ckpt.layer_linear(l, i)?))
                .collect::<Result<Vec<_>>>()?;
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
                linears,
                q_norm,
                k_norm,
                mlp_norm: norm_vec(
                    &format!("{p}.post_attention_layernorm.weight"),
                    c.hidden_size,
                )?,
            });
            progress(l + 2, steps);
        }
        let norm = norm_vec("model.norm.weight", c.hidden_size)?;
        let (cos, sin) = super::rope::tables(&c, max_positions);
        let rope_cos = backend.upload_vector("rope_cos", &cos)?;
        let rope_sin = backend.upload_vector("rope_sin", &sin)?;
        progress(steps, steps);
        Ok(Self {
            config: c,
            embed,
            lm_head,
            layers,
            norm,
            rope_cos,
            rope_sin,
            max_positions,
        })
    }

    fn head(&self) -> &B::Linear {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Final-normed hidden states `[tokens, hidden]` of a batch of sequences laid end to end.
    pub fn hidden(&self, b: &B, ids: &[u32], layout: &SeqLayout) -> Result<B::Tensor> {
        let c = &self.config;
        if layout.max_len() > self.max_positions {
            return Err(Error::ContextTooLong {
                ctx: layout.max_len(),
                max: self.max_positions,
            });
        }
        let t = ids.len();
        let (h, d) = (c.hidden_size, c.head_dim);
        let eps = c.rms_norm_eps as f32;
        let shape = AttnShape {
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: d,
        };
        let dev_layout = b.upload_layout(layout)?;
        let mut x = b.embed(&self.embed, ids)?;
        for layer in &self.layers {
            let [wq, wk, wv, wo, wg, wu, wd] = &layer.linears[..] else {
                unreachable!("seven linears per layer");
            };
            let xn = b.rms_norm(&x, &layer.attn_norm, t, h, eps)?;
            let mut q = b.linear(&xn, wq, t)?;
            let mut k = b.linear(&xn, wk, t)?;
            let v = b.linear(&xn, wv, t)?;
            drop(xn);
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                q = b.rms_norm(&q, qn, t * c.num_heads, d, eps)?;
                k = b.rms_norm(&k, kn, t * c.num_kv_heads, d, eps)?;
            }
            b.rope(
                &mut q,
                &dev_layout,
                &self.rope_cos,
                &self.rope_sin,
                c.num_heads,
                d,
            )?;
            b.rope(
                &mut k,
                &dev_layout,
                &self.rope_cos,
                &self.rope_sin,
                c.num_kv_heads,
                d,
            )?;
            let attn = b.attention(&q, &k, &v, &dev_layout, shape)?;
            drop((q, k, v));
            let o = b.linear(&attn, wo, t)?;
            b.add_assign(&mut x, &o, t * h)?;
            drop((attn, o));
            let xn = b.rms_norm(&x, &layer.mlp_norm, t, h, eps)?;
            let g = b.linear(&xn, wg, t)?;
            let u = b.linear(&xn, wu, t)?;
            let gu = b.silu_mul(&g, &u, t * c.intermediate_size)?;
            drop((g, u, xn));
            let down = b.linear(&gu, wd, t)?;
            b.add_assign(&mut x, &down, t * h)?;
        }
        b.rms_norm(&x, &self.norm, t, h, eps)
    }

    /// Negative log-likelihood of each target (`targets[i] >= 0`), in token order.
    pub fn nll(&self, b: &B, ids: &[u32], layout: &SeqLayout, targets: &[i32]) -> Result<Vec<f32>> {
        let hidden = self.hidden(b, ids, layout)?;
        b.nll(&hidden, self.head(), targets)
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
        let base_hidden = base.hidden(b, ids, layout)?;
        let hidden = self.hidden(b, ids, layout)?;
        b.kld(&base_hidden, base.head(), &hidden, self.head(), targets)
    }
}
