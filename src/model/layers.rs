//! A decoder layer's parts, loaded from the checkpoint onto a backend and run by the one
//! forward pass (`forward.rs`): the attention projections (q/k/v heads, or DeepSeek's latent
//! attention), the dense MLP or the mixture of experts, and what each producer emits for the
//! linears that read it (`Emits`, decided at load).

use crate::backend::{
    AttnSpec, Backend, ColumnBlocks, GatedMlp, OutType, RouteRule, Shaped, routing,
};
use crate::checkpoint::config::MlaConfig;
use crate::checkpoint::{
    self, AttnProjections, Checkpoint, FeedForward, GatedActivation, ModelConfig, Router,
};
use crate::{Error, Result};

/// Linear `m` of `ckpt` on `b`, its stored floats checked for NaN and infinities first.
pub(super) fn upload<B: Backend>(
    b: &B,
    ckpt: &Checkpoint,
    m: &checkpoint::Module,
) -> Result<B::Linear> {
    b.upload_linear(&ckpt.linear_checked(m)?)
}

pub(super) struct Layer<B: Backend> {
    pub(super) attn_norm: B::Tensor,
    pub(super) proj: Projections<B>,
    pub(super) o: B::Linear,
    /// Gemma's norm of the attention output before it joins the residual stream.
    pub(super) attn_out_norm: Option<B::Tensor>,
    pub(super) mlp_norm: B::Tensor,
    /// Gemma's norm of the MLP output before it joins the residual stream.
    pub(super) mlp_out_norm: Option<B::Tensor>,
    pub(super) ffn: Ffn<B>,
    pub(super) attn: AttnSpec,
    /// gpt-oss's per-head sink logits `[1, heads]`.
    pub(super) sinks: Option<B::Tensor>,
    /// Which of the model's RoPE tables the layer rotates by.
    pub(super) rope: usize,
    pub(super) emits: Emits,
}

/// What a layer's producers emit for the linears that read them (`Backend::input_type`),
/// decided once at load: the attention norm for the projections, attention for `o_proj`,
/// the MLP norm for the MLP or mixture.
#[derive(Clone, Copy, Debug)]
pub(super) struct Emits {
    pub(super) qkv: OutType,
    pub(super) attention: OutType,
    pub(super) mlp: OutType,
}

/// A layer's projections into the attention's queries, keys and values.
pub(super) enum Projections<B: Backend> {
    /// `q_proj`, `k_proj`, `v_proj`, and Qwen3/Gemma 3's per-head norms of q and k.
    Heads {
        q: B::Linear,
        k: B::Linear,
        v: B::Linear,
        qk_norms: Option<(B::Tensor, B::Tensor)>,
    },
    Latent(Latent<B>),
}

/// DeepSeek's multi-head latent attention, computed through the expanded heads: keys are
/// each head's unrotated part from `kv_b` beside the rotated part shared by all heads, and
/// values are zero-padded to the key width so that every attention kernel runs it as plain
/// multi-head attention (the padding is cut off its output).
pub(super) struct Latent<B: Backend> {
    /// `q_a_proj` and `q_a_layernorm` where the query is low-rank (`q` is then `q_b_proj`).
    pub(super) q_a: Option<(B::Linear, B::Tensor)>,
    pub(super) q: B::Linear,
    pub(super) kv_a: B::Linear,
    pub(super) kv_norm: B::Tensor,
    pub(super) kv_b: B::Linear,
    pub(super) dims: MlaConfig,
    pub(super) heads: usize,
    /// What `q_a_layernorm` and `kv_a_layernorm` emit for `q` and `kv_b`.
    pub(super) emits_q: OutType,
    pub(super) emits_kv: OutType,
}

impl<B: Backend> Latent<B> {
    /// Queries and keys `[tokens, heads * qk_head_dim]` (before RoPE) and values padded to
    /// the same width.
    pub(super) fn qkv(&self, b: &B, xn: &B::Tensor, eps: f32) -> Result<[B::Tensor; 3]> {
        let q = match &self.q_a {
            Some((a, norm)) => {
                let low = b.linear(xn, a)?;
                let low = b.rms_norm(&low, norm, eps, self.emits_q)?;
                b.linear(&low, &self.q)?
            }
            None => b.linear(xn, &self.q)?,
        };
        let m = &self.dims;
        let (t, h, d) = (xn.rows(), self.heads, m.qk_head_dim());
        // [latent | rotated key part]: the latent normed and expanded per head.
        let compressed = b.linear(xn, &self.kv_a)?;
        let latent = b.assemble_columns(
            t,
            m.kv_lora_rank,
            &[(&compressed, ColumnBlocks::single(m.kv_lora_rank, 0, 0))],
            OutType::Activation,
        )?;
        let latent = b.rms_norm(&latent, &self.kv_norm, eps, self.emits_kv)?;
        let kv = b.linear(&latent, &self.kv_b)?;
        drop(latent);
        let per_head = |width, from, to| ColumnBlocks {
            blocks: h,
            width,
            from,
            from_stride: m.nope_dim + m.v_head_dim,
            to,
            to_stride: d,
        };
        let shared_rotated = ColumnBlocks {
            from_stride: 0,
            ..per_head(m.rope_dim, m.kv_lora_rank, m.nope_dim)
        };
        let k = b.assemble_columns(
            t,
            h * d,
            &[
                (&kv, per_head(m.nope_dim, 0, 0)),
                (&compressed, shared_rotated),
            ],
            OutType::Activation,
        )?;
        let v = b.assemble_columns(
            t,
            h * d,
            &[(&kv, per_head(m.v_head_dim, m.nope_dim, 0))],
            OutType::Activation,
        )?;
        Ok([q, k, v])
    }
}

impl<B: Backend> Projections<B> {
    pub(super) fn load(
        b: &B,
        ckpt: &Checkpoint,
        modules: &AttnProjections,
        layer_prefix: &str,
        norm_vec: &dyn Fn(&str, usize) -> Result<B::Tensor>,
    ) -> Result<Self> {
        let c = &ckpt.config;
        let attn_norm =
            |name: &str, n| norm_vec(&format!("{layer_prefix}.self_attn.{name}.weight"), n);
        Ok(match (modules, &c.mla) {
            (AttnProjections::Heads { q, k, v }, _) => Self::Heads {
                q: upload(b, ckpt, q)?,
                k: upload(b, ckpt, k)?,
                v: upload(b, ckpt, v)?,
                qk_norms: if c.qk_norm {
                    Some((
                        attn_norm("q_norm", c.head_dim)?,
                        attn_norm("k_norm", c.head_dim)?,
                    ))
                } else {
                    None
                },
            },
            (AttnProjections::Latent { q_a, q, kv_a, kv_b }, Some(m)) => {
                let q_a = match (q_a, m.q_lora_rank) {
                    (Some(a), Some(r)) => {
                        Some((upload(b, ckpt, a)?, attn_norm("q_a_layernorm", r)?))
                    }
                    _ => None,
                };
                let q = upload(b, ckpt, q)?;
                let kv_a = upload(b, ckpt, kv_a)?;
                let kv_norm = attn_norm("kv_a_layernorm", m.kv_lora_rank)?;
                let kv_b = upload(b, ckpt, kv_b)?;
                Self::Latent(Latent {
                    emits_q: b.input_type(&q),
                    emits_kv: b.input_type(&kv_b),
                    q_a,
                    q,
                    kv_a,
                    kv_norm,
                    kv_b,
                    dims: *m,
                    heads: c.num_heads,
                })
            }
            (AttnProjections::Latent { .. }, None) => {
                return Err(Error::InvalidArgument(
                    "latent attention modules without an MLA config".into(),
                ));
            }
        })
    }

    /// The type the projections want their input in.
    pub(super) fn input_type(&self, b: &B) -> OutType {
        match self {
            Self::Heads { q, .. } => b.input_type(q),
            Self::Latent(l) => b.input_type(l.q_a.as_ref().map_or(&l.q, |(a, _)| a)),
        }
    }

    /// Queries, keys and values of normed input `xn` `[tokens, hidden]`, before the per-head
    /// q/k norms (`qk_norms`) and RoPE.
    pub(super) fn qkv(&self, b: &B, xn: &B::Tensor, c: &ModelConfig) -> Result<[B::Tensor; 3]> {
        match self {
            Self::Heads { q, k, v, .. } => <[_; 3]>::try_from(b.linears(xn, &[q, k, v])?)
                .map_err(|_| Error::backend("linears", "not three outputs")),
            Self::Latent(l) => l.qkv(b, xn, c.rms_norm_eps as f32),
        }
    }

    /// Qwen3's and Gemma 3's norms of each query and key head, applied before RoPE.
    pub(super) fn qk_norms(&self) -> Option<&(B::Tensor, B::Tensor)> {
        match self {
            Self::Heads { qk_norms, .. } => qk_norms.as_ref(),
            Self::Latent(_) => None,
        }
    }
}

/// A gated MLP's linears and its activation (`up` is `None` where `gate` holds gate and up
/// interleaved: gpt-oss).
pub(super) struct Mlp<B: Backend> {
    pub(super) gate: B::Linear,
    pub(super) up: Option<B::Linear>,
    pub(super) down: B::Linear,
    pub(super) act: GatedActivation,
}

impl<B: Backend> Mlp<B> {
    pub(super) fn load(b: &B, ckpt: &Checkpoint, m: &checkpoint::Mlp) -> Result<Self> {
        Ok(Self {
            gate: upload(b, ckpt, &m.gate)?,
            up: m.up.as_ref().map(|up| upload(b, ckpt, up)).transpose()?,
            down: upload(b, ckpt, &m.down)?,
            act: ckpt.config.mlp_activation,
        })
    }

    pub(super) fn view(&self) -> GatedMlp<'_, B::Linear> {
        GatedMlp {
            gate: &self.gate,
            up: self.up.as_ref(),
            down: &self.down,
            act: self.act,
        }
    }
}

/// The experts of a sparse layer, their router, and the shared expert where there is one.
pub(super) struct Moe<B: Backend> {
    pub(super) router: B::Linear,
    pub(super) experts: Vec<Mlp<B>>,
    pub(super) shared: Option<Mlp<B>>,
    /// `[1, hidden]`: its sigmoid scales the shared expert (Qwen2-MoE).
    pub(super) shared_gate: Option<B::Linear>,
    pub(super) experts_per_token: usize,
    pub(super) routing: Router,
    /// The router's selection bias (sigmoid routers; zeros where the checkpoint has none).
    pub(super) score_bias: Vec<f32>,
}

impl<B: Backend> Moe<B> {
    /// `sum_i w_i expert_i(x)` over each token's routed experts, plus the shared expert
    /// (`Backend::mixture`: each expert runs once over the rows routed to it, its output
    /// scaled and added into an f32 accumulator in expert order, as transformers' loop does),
    /// returned, or added into `residual` where the backend can (`Backend::mixture_into`).
    pub(super) fn forward(
        &self,
        b: &B,
        x: &B::Tensor,
        residual: Option<&mut B::Tensor>,
    ) -> Result<Option<B::Tensor>> {
        let t = x.rows();
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
        let mlps: Vec<_> = self
            .experts
            .iter()
            .chain(&self.shared)
            .map(Mlp::view)
            .collect();
        match residual {
            Some(r) => b.mixture_into(r, x, &uploaded, &lens, &mlps),
            None => b.mixture(x, &uploaded, &lens, &mlps).map(Some),
        }
    }
}

/// A layer's MLP: dense, or a mixture of experts.
pub(super) enum Ffn<B: Backend> {
    Dense(Mlp<B>),
    Moe(Moe<B>),
}

impl<B: Backend> Ffn<B> {
    pub(super) fn load(b: &B, ckpt: &Checkpoint, f: &FeedForward) -> Result<Self> {
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
                        gate.as_ref().map(|g| upload(b, ckpt, g)).transpose()?,
                    ),
                };
                Self::Moe(Moe {
                    router: upload(b, ckpt, &s.router)?,
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

    pub(super) fn input_type(&self, b: &B) -> OutType {
        match self {
            Self::Dense(m) => b.input_type(&m.gate),
            // The router reads it in f32: rounded to bf16 first, its logits would pick other
            // experts at near-ties. Each expert's rows are gathered in the type it wants: f32
            // where any expert quantizes its input, else the activation type, and then the
            // backend may keep them in another exact form (`OutType::ExactForRouter`).
            Self::Moe(m) => {
                let mlps = m.experts.iter().chain(&m.shared);
                let reading = mlps.flat_map(|e| std::iter::once(&e.gate).chain(&e.up));
                let mut inputs = reading.chain(&m.shared_gate).map(|w| b.input_type(w));
                if inputs.all(|t| t == OutType::Activation) {
                    OutType::ExactForRouter
                } else {
                    OutType::F32
                }
            }
        }
    }

    /// The MLP's output, or `None` where it was added into `residual` (a mixture, given one,
    /// on a backend that can).
    pub(super) fn forward(
        &self,
        b: &B,
        x: &B::Tensor,
        residual: Option<&mut B::Tensor>,
    ) -> Result<Option<B::Tensor>> {
        match self {
            Self::Dense(m) => m.view().forward(b, x).map(Some),
            Self::Moe(m) => m.forward(b, x, residual),
        }
    }
}
