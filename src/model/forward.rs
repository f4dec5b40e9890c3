//! One decoder forward pass for Llama, Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k norm), Gemma 2/3
//! (`1 + w` norms, sandwich norms, scaled embeddings, GELU-tanh, soft-capping, sliding-window
//! layers with their own RoPE), Phi-3 (fused projections, read as views), gpt-oss (attention
//! sinks, biases, interleaved clamped-SwiGLU experts), tied or untied embeddings, and the
//! mixture-of-experts variants (Qwen2-MoE, Qwen3-MoE, Mixtral, GLM-4.5, gpt-oss: a layer's MLP
//! is then a router over experts), over any `Backend`.
//!
//! A `Model` holds a contiguous range of decoder layers, and the embedding and/or the final
//! norm + lm_head when the range starts or ends the network: the whole model on one device, or
//! one stage of a pipeline split across devices (`--parallel layers`).

use std::ops::Range;

use crate::backend::{
    AttnSpec, Backend, ColumnBlocks, GatedMlp, Head, KldTerms, OutType, RotarySpan, RouteRule,
    RowGroups, SeqLayout, Shaped, routing,
};
use crate::checkpoint::config::MlaConfig;
use crate::checkpoint::{
    self, AttnProjections, Checkpoint, FeedForward, GatedActivation, ModelConfig, Router,
};
use crate::{Error, Result};

/// Linear `m` of `ckpt` on `b`, its stored floats checked for NaN and infinities first.
fn upload<B: Backend>(b: &B, ckpt: &Checkpoint, m: &checkpoint::Module) -> Result<B::Linear> {
    b.upload_linear(&ckpt.linear_checked(m)?)
}

struct Layer<B: Backend> {
    attn_norm: B::Tensor,
    proj: Projections<B>,
    o: B::Linear,
    /// Gemma's norm of the attention output before it joins the residual stream.
    attn_out_norm: Option<B::Tensor>,
    mlp_norm: B::Tensor,
    /// Gemma's norm of the MLP output before it joins the residual stream.
    mlp_out_norm: Option<B::Tensor>,
    ffn: Ffn<B>,
    attn: AttnSpec,
    /// gpt-oss's per-head sink logits `[1, heads]`.
    sinks: Option<B::Tensor>,
    /// Which of the model's RoPE tables the layer rotates by.
    rope: usize,
}

/// A layer's projections into the attention's queries, keys and values.
enum Projections<B: Backend> {
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
struct Latent<B: Backend> {
    /// `q_a_proj` and `q_a_layernorm` where the query is low-rank (`q` is then `q_b_proj`).
    q_a: Option<(B::Linear, B::Tensor)>,
    q: B::Linear,
    kv_a: B::Linear,
    kv_norm: B::Tensor,
    kv_b: B::Linear,
    dims: MlaConfig,
    heads: usize,
}

impl<B: Backend> Latent<B> {
    /// Queries and keys `[tokens, heads * qk_head_dim]` (before RoPE) and values padded to
    /// the same width.
    fn qkv(&self, b: &B, xn: &B::Tensor, eps: f32) -> Result<[B::Tensor; 3]> {
        let q = match &self.q_a {
            Some((a, norm)) => {
                let low = b.linear(xn, a)?;
                let low = b.rms_norm(&low, norm, eps, b.input_type(&self.q))?;
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
        let latent = b.rms_norm(&latent, &self.kv_norm, eps, b.input_type(&self.kv_b))?;
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
    fn load(
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
            (AttnProjections::Latent { q_a, q, kv_a, kv_b }, Some(m)) => Self::Latent(Latent {
                q_a: match (q_a, m.q_lora_rank) {
                    (Some(a), Some(r)) => {
                        Some((upload(b, ckpt, a)?, attn_norm("q_a_layernorm", r)?))
                    }
                    _ => None,
                },
                q: upload(b, ckpt, q)?,
                kv_a: upload(b, ckpt, kv_a)?,
                kv_norm: attn_norm("kv_a_layernorm", m.kv_lora_rank)?,
                kv_b: upload(b, ckpt, kv_b)?,
                dims: *m,
                heads: c.num_heads,
            }),
            (AttnProjections::Latent { .. }, None) => {
                return Err(Error::InvalidArgument(
                    "latent attention modules without an MLA config".into(),
                ));
            }
        })
    }

    /// The type the projections want their input in.
    fn input_type(&self, b: &B) -> OutType {
        match self {
            Self::Heads { q, .. } => b.input_type(q),
            Self::Latent(l) => b.input_type(l.q_a.as_ref().map_or(&l.q, |(a, _)| a)),
        }
    }

    /// Queries, keys and values of normed input `xn` `[tokens, hidden]`, before the per-head
    /// q/k norms (`qk_norms`) and RoPE.
    fn qkv(&self, b: &B, xn: &B::Tensor, c: &ModelConfig) -> Result<[B::Tensor; 3]> {
        match self {
            Self::Heads { q, k, v, .. } => <[_; 3]>::try_from(b.linears(xn, &[q, k, v])?)
                .map_err(|_| Error::backend("linears", "not three outputs")),
            Self::Latent(l) => l.qkv(b, xn, c.rms_norm_eps as f32),
        }
    }

    /// Qwen3's and Gemma 3's norms of each query and key head, applied before RoPE.
    fn qk_norms(&self) -> Option<&(B::Tensor, B::Tensor)> {
        match self {
            Self::Heads { qk_norms, .. } => qk_norms.as_ref(),
            Self::Latent(_) => None,
        }
    }
}

/// A gated MLP's linears and its activation (`up` is `None` where `gate` holds gate and up
/// interleaved: gpt-oss).
struct Mlp<B: Backend> {
    gate: B::Linear,
    up: Option<B::Linear>,
    down: B::Linear,
    act: GatedActivation,
}

impl<B: Backend> Mlp<B> {
    fn load(b: &B, ckpt: &Checkpoint, m: &checkpoint::Mlp) -> Result<Self> {
        Ok(Self {
            gate: upload(b, ckpt, &m.gate)?,
            up: m.up.as_ref().map(|up| upload(b, ckpt, up)).transpose()?,
            down: upload(b, ckpt, &m.down)?,
            act: ckpt.config.mlp_activation,
        })
    }

    fn view(&self) -> GatedMlp<'_, B::Linear> {
        GatedMlp {
            gate: &self.gate,
            up: self.up.as_ref(),
            down: &self.down,
            act: self.act,
        }
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
    /// `sum_i w_i expert_i(x)` over each token's routed experts, plus the shared expert
    /// (`Backend::mixture`: each expert runs once over the rows routed to it, its output
    /// scaled and added into an f32 accumulator in expert order, as transformers' loop does),
    /// returned, or added into `residual` where the backend can (`Backend::mixture_into`).
    fn forward(
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

    fn input_type(&self, b: &B) -> OutType {
        match self {
            Self::Dense(m) => b.input_type(&m.gate),
            // The router reads it in f32: rounded to bf16 first, its logits would pick other
            // experts at near-ties. Each expert's rows are gathered in the type it wants: f32
            // where any expert quantizes its input, else the activation type, and then the
            // backend may hold the f32 values as planes of it (`OutType::Planes`).
            Self::Moe(m) => {
                let mlps = m.experts.iter().chain(&m.shared);
                let reading = mlps.flat_map(|e| std::iter::once(&e.gate).chain(&e.up));
                let mut inputs = reading.chain(&m.shared_gate).map(|w| b.input_type(w));
                if inputs.all(|t| t == OutType::Activation) {
                    OutType::Planes
                } else {
                    OutType::F32
                }
            }
        }
    }

    /// The MLP's output, or `None` where it was added into `residual` (a mixture, given one,
    /// on a backend that can).
    fn forward(
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

/// The final norm and the output projection.
struct OutputHead<B: Backend> {
    norm: B::Tensor,
    /// `None`: tied to the embedding, which this stage holds.
    lm_head: Option<B::Linear>,
}

/// One rotary embedding's tables on the device (`rope::tables`).
struct RopeTables<B: Backend> {
    cos: B::Tensor,
    sin: B::Tensor,
    /// LongRoPE: sequences of this many tokens or more read the second half of the tables.
    long_from: Option<usize>,
}

pub struct Model<B: Backend> {
    pub config: ModelConfig,
    /// The decoder layers this model holds.
    pub layers_range: Range<usize>,
    embed: Option<B::Linear>,
    layers: Vec<Layer<B>>,
    head: Option<OutputHead<B>>,
    /// The full-attention layers' RoPE, then the sliding layers' where it differs.
    ropes: Vec<RopeTables<B>>,
    max_positions: usize,
}

/// What `Model::load` reports as it uploads, for progress bars.
pub type LoadProgress<'a> = &'a dyn Fn(usize, usize);

/// The batches a model is loaded for: sequences of up to `max_positions` tokens, and the
/// first batch's token count where the caller knows it (a backend that pays for its first
/// calls then meets them while loading: `Model::load_stage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadFor {
    pub max_positions: usize,
    pub first_batch_rows: Option<usize>,
}

impl LoadFor {
    /// Sequences of up to `max_positions` tokens, the first batch not known.
    pub fn positions(max_positions: usize) -> Self {
        LoadFor {
            max_positions,
            first_batch_rows: None,
        }
    }
}

impl<B: Backend> Model<B> {
    /// Uploads every weight of `ckpt` to `backend`, for sequences of up to `max_positions`.
    pub fn load(
        backend: &B,
        ckpt: &Checkpoint,
        max_positions: usize,
        progress: LoadProgress,
    ) -> Result<Self> {
        let batches = LoadFor::positions(max_positions);
        Self::load_stage(backend, ckpt, 0..ckpt.config.num_layers, batches, progress)
    }

    /// Uploads layers `layers` of `ckpt`, plus the embedding if the range starts at layer 0
    /// and the final norm + lm_head if it ends at the last layer. Where `batches` knows the
    /// first batch's size and the backend pays for its first calls
    /// (`Device::warms_up_while_loading`), the first layer runs once on a batch of that size on
    /// another thread while the others load (`warm_up`).
    pub fn load_stage(
        backend: &B,
        ckpt: &Checkpoint,
        layers_range: Range<usize>,
        batches: LoadFor,
        progress: LoadProgress,
    ) -> Result<Self> {
        let max_positions = batches.max_positions;
        let c = ckpt.config.clone();
        if max_positions > c.max_position_embeddings {
            return Err(Error::ContextTooLong {
                ctx: max_positions,
                max: c.max_position_embeddings,
            });
        }
        let first = layers_range.start == 0;
        let last = layers_range.end == c.num_layers;
        let steps = layers_range.len() + 2;
        progress(0, steps);
        // Gemma applies its norms as `1 + w`, added in f32 as transformers does.
        let norm_vec = |name: &str, n: usize| -> Result<B::Tensor> {
            let w: Vec<f32> = ckpt.norm(name, n)?;
            let w: Vec<f32> = w.into_iter().map(|v| c.norm_offset + v).collect();
            backend.upload_vector(name, &w)
        };
        let prefix = &c.prefix;
        let embed = if first {
            Some(backend.upload_linear(&ckpt.embedding()?)?)
        } else {
            None
        };
        let head = if last {
            let lm_head = match ckpt.lm_head()? {
                Some(h) => {
                    h.check_finite()?;
                    Some(backend.upload_linear(&h)?)
                }
                // Tied: the embedding table is the output projection, uploaded a second time
                // only by a stage that does not hold the embedding.
                None if first => None,
                None => Some(backend.upload_linear(&ckpt.embedding()?)?),
            };
            Some(OutputHead {
                norm: norm_vec(&format!("{prefix}.norm.weight"), c.hidden_size)?,
                lm_head,
            })
        } else {
            None
        };
        let mut ropes = Vec::new();
        for params in std::iter::once(&c.rope).chain(&c.local_rope) {
            let (cos, sin) = super::rope::tables(params, c.rotary_dim, max_positions);
            ropes.push(RopeTables {
                cos: backend.upload_vector("rope_cos", &cos)?,
                sin: backend.upload_vector("rope_sin", &sin)?,
                long_from: super::rope::long_from(params),
            });
        }
        progress(1, steps);
        let load_layer = |k: usize, l: usize| -> Result<Layer<B>> {
            let p = format!("{prefix}.layers.{l}");
            let modules = &ckpt.layers[l];
            let norm = |name: &str| norm_vec(&format!("{p}.{name}.weight"), c.hidden_size);
            // Gemma: post_attention_layernorm normalizes the attention output; the MLP's input
            // norm is pre_feedforward_layernorm.
            let (attn_out_norm, mlp_norm, mlp_out_norm) = if c.sandwich_norms {
                (
                    Some(norm("post_attention_layernorm")?),
                    norm("pre_feedforward_layernorm")?,
                    Some(norm("post_feedforward_layernorm")?),
                )
            } else {
                (None, norm("post_attention_layernorm")?, None)
            };
            let local = c.local_rope.is_some() && c.window_of(l).is_some();
            let layer = Layer {
                attn_norm: norm("input_layernorm")?,
                proj: Projections::load(backend, ckpt, &modules.attn, &p, &norm_vec)?,
                o: upload(backend, ckpt, &modules.o)?,
                ffn: Ffn::load(backend, ckpt, &modules.ffn)?,
                attn_out_norm,
                mlp_norm,
                mlp_out_norm,
                attn: AttnSpec {
                    scale: c.attn_scale as f32,
                    softcap: c.attn_softcap,
                    window: c.window_of(l),
                    ..AttnSpec::causal(c.num_heads, c.num_kv_heads, c.head_dim)
                },
                sinks: if c.attention_sinks {
                    let name = format!("{p}.self_attn.sinks");
                    Some(backend.upload_vector(&name, &ckpt.norm(&name, c.num_heads)?)?)
                } else {
                    None
                },
                rope: usize::from(local),
            };
            progress(k + 2, steps);
            Ok(layer)
        };
        let mut model = Self {
            config: c.clone(),
            layers_range: layers_range.clone(),
            embed,
            layers: Vec::with_capacity(layers_range.len()),
            head,
            ropes,
            max_positions,
        };
        let mut todo = layers_range.enumerate();
        let warm_up = batches
            .first_batch_rows
            .filter(|&rows| rows > 0 && backend.warms_up_while_loading())
            .and_then(|rows| Some((rows, todo.next()?)));
        if let Some((rows, (k, l))) = warm_up {
            model.layers.push(load_layer(k, l)?);
            let first = &model;
            let (warmed, rest) = std::thread::scope(|scope| {
                let warming = scope.spawn(move || first.warm_up(backend, rows));
                let rest: Result<Vec<_>> = todo.by_ref().map(|(k, l)| load_layer(k, l)).collect();
                (warming.join(), rest)
            });
            let warmed = warmed.map_err(|_| {
                let why = "the thread running the first layer while the others load panicked";
                Error::InvalidArgument(format!("{}: {why}", backend.name()))
            })?;
            let rest = rest?;
            warmed?;
            model.layers.extend(rest);
        }
        for (k, l) in todo {
            model.layers.push(load_layer(k, l)?);
        }
        progress(steps, steps);
        Ok(model)
    }

    /// Runs the layers loaded so far once on `rows` tokens of zeros (in sequences of up to
    /// `max_positions`), from another thread, results dropped: the device's first calls at the
    /// first batch's shapes (on CUDA, cuBLAS loading the kernel libraries of each GEMM shape:
    /// ~130 ms before a mixture-of-experts model's first batch; the memory pool growing to the
    /// batch's buffers) are paid while the other layers load rather than in the timed run.
    fn warm_up(&self, b: &B, rows: usize) -> Result<()> {
        b.enter_thread()?;
        let n = self.max_positions.max(1);
        let layout = SeqLayout::from_lengths((0..rows).step_by(n).map(|s| (rows - s).min(n)));
        let x = b.zeros(rows, self.config.hidden_size)?;
        drop(self.run_layers(b, x, &layout)?);
        b.synchronize()
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
        // Gemma: sqrt(hidden) as an f32 tensor, cast to the activation type, as transformers
        // multiplies it.
        let scale = if self.config.scaled_embeddings {
            b.activation_type()
                .round((self.config.hidden_size as f64).sqrt() as f32)
        } else {
            1.0
        };
        b.embed(table, ids, scale)
    }

    /// Runs this model's decoder layers over the residual stream `x` `[tokens, hidden]`.
    pub fn run_layers(&self, b: &B, mut x: B::Tensor, layout: &SeqLayout) -> Result<B::Tensor> {
        self.check_len(layout)?;
        let c = &self.config;
        let eps = c.rms_norm_eps as f32;
        // Latent attention rotates the last values of each query/key head, maybe interleaved.
        let span = RotarySpan {
            start: c.mla.map_or(0, |m| m.nope_dim),
            interleaved: c.mla.is_some_and(|m| m.rope_interleave),
            ..RotarySpan::leading(c.head_dim, c.rotary_dim)
        };
        let seqs = b.upload_sequences(layout)?;
        // LongRoPE: the sequences long enough for the long factors read the second half of
        // the tables (positions shifted past the first half), as transformers picks the
        // factors by each forward's length.
        let rope_seqs = self
            .ropes
            .iter()
            .map(|r| match r.long_from {
                Some(n) if layout.max_len() >= n => b
                    .upload_sequences(&long_rope_layout(layout, n, self.max_positions))
                    .map(Some),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        // Each residual update is added by the norm that reads the stream next (fused where
        // the backend can); the last layer's MLP output is added on its own at the end.
        let mut pending: Option<B::Tensor> = None;
        for layer in &self.layers {
            let wo = &layer.o;
            let qkv_in = layer.proj.input_type(b);
            let xn = match pending.take() {
                Some(down) => b.add_rms_norm(&mut x, &down, &layer.attn_norm, eps, qkv_in)?,
                None => b.rms_norm(&x, &layer.attn_norm, eps, qkv_in)?,
            };
            let [q, k, v] = layer.proj.qkv(b, &xn, c)?;
            drop(xn);
            let tables = &self.ropes[layer.rope];
            let rope_seqs = rope_seqs[layer.rope].as_ref().unwrap_or(&seqs);
            let (cos, sin) = (&tables.cos, &tables.sin);
            let rotate = |mut x: B::Tensor, norm: Option<&B::Tensor>| match norm {
                Some(w) => b.norm_rope(x, w, eps, rope_seqs, cos, sin, span),
                None => b.rope(&mut x, rope_seqs, cos, sin, span).map(|()| x),
            };
            let norms = layer.proj.qk_norms();
            let q = rotate(q, norms.map(|(qn, _)| qn))?;
            let k = rotate(k, norms.map(|(_, kn)| kn))?;
            let sinks = layer.sinks.as_ref();
            let attn = match c.mla {
                // The values' padding cut off each head.
                Some(m) if m.v_head_dim < c.head_dim => {
                    let padded =
                        b.attention(&q, &k, &v, &seqs, layer.attn, sinks, OutType::Activation)?;
                    let h = c.num_heads;
                    let heads = ColumnBlocks {
                        blocks: h,
                        width: m.v_head_dim,
                        from: 0,
                        from_stride: c.head_dim,
                        to: 0,
                        to_stride: m.v_head_dim,
                    };
                    let t = padded.rows();
                    b.assemble_columns(t, h * m.v_head_dim, &[(&padded, heads)], b.input_type(wo))?
                }
                _ => b.attention(&q, &k, &v, &seqs, layer.attn, sinks, b.input_type(wo))?,
            };
            drop((q, k, v));
            let mut o = b.linear(&attn, wo)?;
            drop(attn);
            if let Some(norm) = &layer.attn_out_norm {
                o = b.rms_norm(&o, norm, eps, OutType::Activation)?;
            }
            let mlp_in = layer.ffn.input_type(b);
            let xn = b.add_rms_norm(&mut x, &o, &layer.mlp_norm, eps, mlp_in)?;
            drop(o);
            // A mixture may add its sum into the residual stream itself (CUDA), unless a norm
            // comes between (Gemma's sandwich norms); else the next norm adds it.
            let residual = layer.mlp_out_norm.is_none().then_some(&mut x);
            pending = match layer.ffn.forward(b, &xn, residual)? {
                Some(down) => Some(match &layer.mlp_out_norm {
                    Some(norm) => b.rms_norm(&down, norm, eps, OutType::Activation)?,
                    None => down,
                }),
                None => None,
            };
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
    fn head(&self) -> Result<(&B::Tensor, Head<'_, B::Linear>)> {
        let no_head = || Error::InvalidArgument("this pipeline stage holds no lm_head".into());
        let head = self.head.as_ref().ok_or_else(no_head)?;
        let projection = head.lm_head.as_ref().or(self.embed.as_ref());
        let head_out = Head {
            linear: projection.ok_or_else(no_head)?,
            softcap: self.config.final_softcap,
        };
        Ok((&head.norm, head_out))
    }

    /// The final norm of the residual stream (last stage only).
    pub fn final_norm(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let (norm, projection) = self.head()?;
        let eps = self.config.rms_norm_eps as f32;
        b.rms_norm(x, norm, eps, b.input_type(projection.linear))
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
        let picked = b.gather_group(hidden, &groups, 0, b.input_type(projection.linear))?;
        let mut logits = b.logits(&picked, projection.linear)?;
        if let Some(cap) = projection.softcap {
            logits
                .iter_mut()
                .for_each(|l| *l = crate::backend::softcap(*l, cap));
        }
        Ok(logits)
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
        let projection = self.head()?.1.linear;
        let t = match b.input_type(projection) {
            OutType::F32 | OutType::Planes => b.upload_vector("base states", values)?,
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

/// `layout` with the positions of its sequences of `long_from` tokens or more moved past the
/// first `positions` rows of the RoPE tables (LongRoPE's long factors).
fn long_rope_layout(layout: &SeqLayout, long_from: usize, positions: usize) -> SeqLayout {
    let mut shifted = layout.clone();
    for w in layout.starts.windows(2) {
        if w[1] - w[0] >= long_from {
            for p in &mut shifted.positions[w[0]..w[1]] {
                *p += positions as u32;
            }
        }
    }
    shifted
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
    use super::{LoadFor, Model, split_layers};
    use crate::backend::SeqLayout;
    use crate::backend::cpu::CpuBackend;
    use crate::checkpoint::Checkpoint;

    /// Told the first batch's size, a backend that does not warm up (the CPU) still loads every
    /// layer once, in order: the same NLLs as a plain load.
    #[test]
    fn loading_for_a_known_first_batch_keeps_every_layer() {
        let dir = crate::assets::default_model_dir().expect("bundled model");
        let ckpt = Checkpoint::open(&dir).expect("checkpoint");
        let b = CpuBackend::new();
        let n = ckpt.config.num_layers;
        let batches = LoadFor {
            max_positions: 64,
            first_batch_rows: Some(64),
        };
        let told = Model::load_stage(&b, &ckpt, 0..n, batches, &|_, _| {}).expect("load");
        let plain = Model::load(&b, &ckpt, 64, &|_, _| {}).expect("load");
        assert_eq!(told.layers.len(), n);
        let ids: Vec<u32> = (0..64).map(|i| (i * 37 + 11) % 500).collect();
        let targets: Vec<i32> = ids[1..].iter().map(|&t| t as i32).chain([-1]).collect();
        let layout = SeqLayout::from_lengths([64]);
        let nll = |m: &Model<CpuBackend>| m.nll(&b, &ids, &layout, &targets).expect("nll");
        assert_eq!(nll(&told), nll(&plain));
    }

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
