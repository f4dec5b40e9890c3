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
    AttnSpec, Backend, ColumnBlocks, Head, KldTerms, OutType, RotarySpan, RowStats, SeqLayout,
    Shaped,
};
use crate::checkpoint::config::{MlaConfig, QkNorm, QueryScale};
use crate::checkpoint::{self, AttnProjections, Checkpoint, GatedActivation, ModelConfig};
use crate::{Error, Result};

use super::compressed::{HyperConnection, HyperHead, LayerTables, spread};
use super::continued::Continuation;
use super::layers::{
    Absorbed, Emits, ExpertsBeside, Ffn, KeptLatents, Layer, LayerInput, LogPositions, MixerPart,
    MlpPart, Moe, Projected, Projections, QueryScaling, upload,
};

/// The final norm and the output projection.
struct OutputHead<B: Backend> {
    norm: B::Tensor,
    /// `None`: tied to the embedding, which this stage holds.
    lm_head: Option<B::Linear>,
    /// What the final norm emits for the output projection (`Backend::input_type`).
    emits: OutType,
}

/// One rotary embedding's tables on the device (`rope::tables`).
struct RopeTables<B: Backend> {
    cos: B::Tensor,
    sin: B::Tensor,
    /// LongRoPE: sequences of this many tokens or more read the second half of the tables.
    long_from: Option<usize>,
    /// The queries' tables where they differ (`ModelConfig::query_scale`).
    query: Option<QueryTables<B>>,
}

/// Queries scaled by position: the rotated values' tables (scaled), and where RoPE leaves some
/// of each head the scale of those as a rotation by angle 0 over `unrotated`.
struct QueryTables<B: Backend> {
    cos: B::Tensor,
    sin: B::Tensor,
    unrotated: Option<(B::Tensor, B::Tensor, RotarySpan)>,
}

impl<B: Backend> QueryTables<B> {
    /// The query tables of the RoPE tables `(cos, sin)` (`[rows, rotary_dim / 2]`).
    fn load(
        b: &B,
        c: &ModelConfig,
        (cos, sin): (&[f32], &[f32]),
        scale: QueryScale,
        max_positions: usize,
    ) -> Result<Self> {
        // The values of each query head RoPE leaves: latent attention's first, else the last.
        let unrotated = RotarySpan {
            head_dim: c.head_dim,
            start: if c.mla.is_some() { 0 } else { c.rotary_dim },
            dims: c.head_dim - c.rotary_dim,
            interleaved: false,
        };
        if !unrotated.dims.is_multiple_of(2) {
            return Err(Error::InvalidArgument(format!(
                "queries scaled by position with an odd unrotated part ({} of {})",
                unrotated.dims, c.head_dim
            )));
        }
        let rows = cos.len() / (c.rotary_dim / 2).max(1);
        let tables = (cos.to_vec(), sin.to_vec());
        let (qc, qs) = super::rope::query_tables(tables, c.rotary_dim, max_positions, scale);
        let unrotated = match unrotated.dims {
            0 => None,
            d => {
                let (uc, us) = super::rope::scale_tables(rows, d / 2, max_positions, scale);
                Some((
                    b.upload_vector("query_scale_cos", &uc)?,
                    b.upload_vector("query_scale_sin", &us)?,
                    unrotated,
                ))
            }
        };
        Ok(Self {
            cos: b.upload_vector("rope_cos_q", &qc)?,
            sin: b.upload_vector("rope_sin_q", &qs)?,
            unrotated,
        })
    }
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
    /// Gemma 4's per-layer inputs (the first stage of a model holding them all).
    per_layer_inputs: Option<PerLayerInputs<B>>,
    /// Llama 4's temperature on the queries of the layers without RoPE: a rotation by angle 0
    /// whose cos is each position's factor, over the whole head.
    unrotated_queries: Option<(B::Tensor, B::Tensor)>,
    /// `ln(pos + 1)` tables of Mistral Large 4's query scaling (`QueryScaling`).
    log_positions: Option<LogPositions<B>>,
    /// Batches whose longest sequence holds this many times `index_topk` tokens or more
    /// attend sparsely in the latent space (`Absorbed`).
    latent_from_top_k: usize,
    /// DeepSeek-V4's RoPE tables beside `ropes` (`StreamTables`), and its final collapse of
    /// the residual streams (the last stage's).
    v4_tables: Option<StreamTables<B>>,
    hyper_head: Option<HyperHead<B>>,
}

/// DeepSeek-V4's RoPE tables beside `Model::ropes`: `-sin` of each (rotating the attention's
/// output back), and the compressed layers' at stride `rate` for their entries.
struct StreamTables<B: Backend> {
    inverse_sin: Vec<B::Tensor>,
    entries: Vec<(usize, B::Tensor, B::Tensor)>,
}

/// Past this many times `index_topk` keys, sparse attention costs less in the latent space,
/// where each query's selected keys are read once for all its heads, than over the expanded
/// heads with the unselected keys masked, where a tile of queries reads each key once but
/// every key of the window is read: the latent form's scores and values are 576 + 512 wide
/// against the expanded heads' 192 + 192, and the masked form reads half the window on
/// average (docs/performance.md, "Sparse attention in the latent space").
pub const LATENT_FROM_TOP_K: usize = 8;

/// Gemma 4's per-layer inputs (PLE): each token's row of `embed_tokens_per_layer` (scaled by
/// `sqrt(width)`) and `per_layer_model_projection` of its embedding (scaled by
/// `hidden^-0.5`, each layer's part RMS-normed by `per_layer_projection_norm`), summed and
/// scaled by `2^-0.5`: `[tokens, layers * width]`, layer `l`'s input its `l`-th part.
struct PerLayerInputs<B: Backend> {
    table: B::Linear,
    projection: B::Linear,
    norm: B::Tensor,
    width: usize,
    /// `[1, layers * width]` of `hidden^-0.5`, then of `2^-0.5`.
    scales: [B::Tensor; 2],
}

impl<B: Backend> PerLayerInputs<B> {
    /// Every layer's input `[tokens, layers * width]` for tokens `ids` of embeddings `x`.
    fn compute(&self, b: &B, x: &B::Tensor, ids: &[u32], eps: f32) -> Result<B::Tensor> {
        let (t, cols, w) = (x.rows(), self.scales[0].cols(), self.width);
        // `embed_scale` cast to the model dtype, as for the token embeddings.
        let scale = b.activation_type().round((w as f64).sqrt() as f32);
        let tokens = b.embed(&self.table, ids, scale)?;
        let mut projected = linear_of_stream(b, x, &self.projection)?;
        b.scale_columns(&mut projected, &self.scales[0])?;
        let parts = projected.reshaped(t * cols / w, w)?;
        // Summed in f32, the residual stream's type (`add_assign`).
        let mut inputs = b
            .rms_norm(&parts, &self.norm, eps, OutType::F32)?
            .reshaped(t, cols)?;
        b.add_assign(&mut inputs, &tokens)?;
        b.scale_columns(&mut inputs, &self.scales[1])?;
        Ok(inputs)
    }
}

/// Keys and values as a layer attends to them, kept by layer for the later layers that
/// reuse them (Gemma 4's `num_kv_shared_layers`).
type KeptKv<B> = Vec<(usize, KeyValuePair<B>)>;

/// What a batch's layers hand on to later layers.
struct HandedOn<B: Backend> {
    /// The last sparse-attention selection made, for the layers that reuse it (GLM-5).
    selection: Option<B::Tensor>,
    /// Keys and values that later layers attend to (Gemma 4), by layer.
    kv: KeptKv<B>,
    /// Latents that later layers expand (Mistral Large 4), by layer.
    latents: KeptLatents<B>,
}

/// A layer's keys and values as it attended to them.
pub type KeyValuePair<B> = (
    <B as crate::backend::Device>::Tensor,
    <B as crate::backend::Device>::Tensor,
);

/// A layer's keys and values: projected by it (before their norms and RoPE), or an earlier
/// layer's as that layer attended to them.
enum KeysValues<'a, B: Backend> {
    /// Keys, values, and the layer's index in this model part.
    Projected(B::Tensor, B::Tensor, usize),
    Reused(&'a KeyValuePair<B>),
}

/// `x += update`, where there is one.
fn flush<B: Backend>(b: &B, x: &mut B::Tensor, update: Option<B::Tensor>) -> Result<()> {
    match update {
        Some(u) => b.add_assign(x, &u),
        None => Ok(()),
    }
}

/// `linear(x, w)` of the residual stream itself (Gemma 4's per-layer inputs): `x` copied into
/// the type `w` reads (a backend may hold the stream in another, CUDA in f32 under bf16
/// activations; the model dtype's rounding of the hidden state, as the reference reads it).
pub(super) fn linear_of_stream<B: Backend>(
    b: &B,
    x: &B::Tensor,
    w: &B::Linear,
) -> Result<B::Tensor> {
    let whole = [(x, ColumnBlocks::single(x.cols(), 0, 0))];
    let typed = b.assemble_columns(x.rows(), x.cols(), &whole, b.input_type(w))?;
    b.linear(&typed, w)
}

fn no_head() -> Error {
    Error::InvalidArgument("this pipeline stage holds no lm_head".into())
}

/// Each layer's keys and values of a batch as its attention read them (`None`: a layer that
/// attends to another's, or computes none), by layer of a model part.
pub type KeysOfLayers<B> = Vec<Option<KeyValuePair<B>>>;

/// A batch's sequences as the layers read them: the batch's rows' (RoPE, and the attention
/// unless `continued`), each RoPE table's (LongRoPE), the chunked layers' (their sequences cut
/// into chunks, where one is longer), whether sparse attention selects keys, and the rows
/// earlier batches computed that its sequences continue.
struct Batch<'a, B: Backend> {
    /// The batch's sequences on the host.
    layout: &'a SeqLayout,
    seqs: &'a B::Sequences,
    rope_seqs: &'a [Option<B::Sequences>],
    chunked: Option<&'a B::Sequences>,
    sparse: bool,
    /// Sparse attention (`sparse`) in the latent space (`Model::attend_latent`), for long
    /// windows.
    latent: bool,
    continued: Option<Continued<'a, B>>,
    /// Every layer's keys and values are kept (for later batches to continue).
    keep_kv: bool,
}

/// The attention of a batch that continues earlier rows: its whole sequences, how its rows
/// map onto them (`Continuation`), and the earlier batches' keys and values (per earlier
/// batch, by layer of this model part).
struct Continued<'a, B: Backend> {
    seqs: B::Sequences,
    plan: &'a Continuation,
    earlier: &'a [&'a KeysOfLayers<B>],
}

impl<B: Backend> Continued<'_, B> {
    /// Layer `index`'s keys and values of the batch's rows joined to the earlier rows', as
    /// the attention's sequences hold them.
    fn join(&self, b: &B, index: usize, (k, v): KeyValuePair<B>) -> Result<KeyValuePair<B>> {
        let mut keys = Vec::with_capacity(self.earlier.len() + 1);
        let mut values = Vec::with_capacity(self.earlier.len() + 1);
        for kept in self.earlier {
            let Some((k, v)) = kept.get(index).and_then(Option::as_ref) else {
                return Err(Error::InvalidArgument(format!(
                    "layer {index} of this model part continues a batch that kept no keys for it"
                )));
            };
            keys.push(k);
            values.push(v);
        }
        self.plan.check_earlier(&keys)?;
        keys.push(&k);
        values.push(&v);
        let at = &self.plan.keys;
        Ok((b.take_rows(&keys, at)?, b.take_rows(&values, at)?))
    }
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

/// What `Model::run_layers_observed` calls with each layer's index and the residual stream
/// after it.
pub type LayerObserver<'a, B> =
    dyn FnMut(usize, &<B as crate::backend::Device>::Tensor) -> Result<()> + 'a;

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
        if !c.may_begin_stage(layers_range.start) {
            return Err(Error::InvalidArgument(format!(
                "layer {} is reusing an earlier layer's sparse-attention selection (GLM-5 \
                 `shared`): a pipeline stage cannot begin there (this one holds layers {}..{})",
                layers_range.start, layers_range.start, layers_range.end
            )));
        }
        let first = layers_range.start == 0;
        let last = layers_range.end == c.num_layers;
        if let Some(g) = &c.gemma4 {
            let outside = layers_range
                .clone()
                .find_map(|l| c.kv_source(l).filter(|s| !layers_range.contains(s)));
            let per_layer = g.per_layer_inputs.is_some() && !(first && last);
            if per_layer || outside.is_some() {
                return Err(Error::InvalidArgument(format!(
                    "a pipeline stage of layers {}..{} of a Gemma 4 model: {}; run it on one \
                     device",
                    layers_range.start,
                    layers_range.end,
                    match outside {
                        Some(s) => format!("a layer reuses layer {s}'s keys and values"),
                        None => "every layer reads the per-layer inputs of the embedding".into(),
                    }
                )));
            }
        }
        let steps = layers_range.len() + 2;
        progress(0, steps);
        // Gemma applies its norms as `1 + w`, added in f32 as transformers does; Falcon-H1's
        // multipliers on a norm's output are taken into its weights.
        let scaled_norm = |name: &str, n: usize, factor: f32| -> Result<B::Tensor> {
            let w: Vec<f32> = ckpt.norm(name, n)?;
            let w: Vec<f32> = w
                .into_iter()
                .map(|v| (c.norm_offset + v) * factor)
                .collect();
            backend.upload_vector(name, &w)
        };
        let norm_vec = |name: &str, n: usize| scaled_norm(name, n, 1.0);
        let mup = c.multipliers;
        // `[1, n]` factors `v` for `scale_columns`, where `v` is not 1.
        let scales = |name: &str, v: f32, n: usize| -> Result<Option<B::Tensor>> {
            (v != 1.0)
                .then(|| backend.upload_vector(name, &vec![v; n]))
                .transpose()
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
            let emits = match (&lm_head, &embed) {
                (Some(w), _) | (None, Some(w)) => backend.input_type(w),
                (None, None) => OutType::Activation,
            };
            // Falcon-H1's `lm_head_multiplier` on the logits, as a factor on their input.
            let logit_scale = mup.map_or(1.0, |u| u.lm_head);
            Some(OutputHead {
                norm: scaled_norm(&c.final_norm_name(), c.hidden_size, logit_scale)?,
                lm_head,
                emits,
            })
        } else {
            None
        };
        // Mistral Large 4's RoPE frequencies times `exp(alpha)` (`rotary_emb.alpha`, learned).
        let alpha = match c.mistral_large4 {
            Some(_) => {
                let name = format!("{prefix}.rotary_emb.alpha");
                Some(ckpt.norm(&name, c.rotary_dim / 2)?)
            }
            None => None,
        };
        let log_positions = match (&c.mistral_large4, &c.indexer) {
            (Some(_), ix) => {
                let widths = [Some(c.head_dim), ix.as_ref().map(|ix| ix.head_dim)];
                let widths: Vec<usize> = widths.into_iter().flatten().collect();
                Some(LogPositions::load(backend, &widths, max_positions)?)
            }
            (None, _) => None,
        };
        let mut ropes = Vec::new();
        for (params, rotary_dim) in std::iter::once(&c.rope)
            .chain(&c.local_rope)
            .zip(c.rotary_dims())
        {
            let (cos, sin) = match &alpha {
                Some(alpha) => super::rope::learned_tables(params, alpha, max_positions),
                None => super::rope::tables(params, rotary_dim, max_positions),
            };
            let query = match c.query_scale {
                Some(scale) => Some(QueryTables::load(
                    backend,
                    &c,
                    (&cos, &sin),
                    scale,
                    max_positions,
                )?),
                None => None,
            };
            ropes.push(RopeTables {
                cos: backend.upload_vector("rope_cos", &cos)?,
                sin: backend.upload_vector("rope_sin", &sin)?,
                long_from: super::rope::long_from(params),
                query,
            });
        }
        let v4_tables = match &c.deepseek_v4 {
            Some(v4) => {
                let mut rates: Vec<usize> =
                    v4.compression.iter().filter_map(|c| c.rate()).collect();
                rates.sort_unstable();
                rates.dedup();
                let mut entries = Vec::with_capacity(rates.len());
                for rate in rates {
                    let (cos, sin) =
                        super::rope::strided_tables(&c.rope, c.rotary_dim, max_positions, rate);
                    entries.push((
                        rate,
                        backend.upload_vector("compressed entries' rope_cos", &cos)?,
                        backend.upload_vector("compressed entries' rope_sin", &sin)?,
                    ));
                }
                let mut inverse_sin = Vec::new();
                for (params, rotary_dim) in std::iter::once(&c.rope)
                    .chain(&c.local_rope)
                    .zip(c.rotary_dims())
                {
                    let (_, sin) = super::rope::tables(params, rotary_dim, max_positions);
                    let negated: Vec<f32> = sin.iter().map(|v| -v).collect();
                    inverse_sin.push(backend.upload_vector("rope_sin inverse", &negated)?);
                }
                Some(StreamTables {
                    inverse_sin,
                    entries,
                })
            }
            None => None,
        };
        let hyper_head = match (&c.hyper, last) {
            (Some(_), true) => Some(HyperHead::load(backend, ckpt)?),
            _ => None,
        };
        let unrotated_queries = match c.llama4.as_ref().and_then(|l| l.temperature) {
            Some(scale) => {
                let pairs = c.head_dim / 2;
                let (cos, sin) =
                    super::rope::scale_tables(max_positions, pairs, max_positions, scale);
                Some((
                    backend.upload_vector("query_temperature_cos", &cos)?,
                    backend.upload_vector("query_temperature_sin", &sin)?,
                ))
            }
            None => None,
        };
        progress(1, steps);
        let load_layer = |k: usize, l: usize| -> Result<Layer<B>> {
            let p = format!("{prefix}.layers.{l}");
            let modules = &ckpt.layers[l];
            let norm = |name: &str| norm_vec(&format!("{p}.{name}.weight"), c.hidden_size);
            // Gemma: post_attention_layernorm normalizes the attention output; the MLP's input
            // norm is pre_feedforward_layernorm.
            let sandwich = |name: &str| c.sandwich_norms.then(|| norm(name)).transpose();
            // A mixer behind the layer's input norm, its input and output times the family's
            // multipliers of its kind (Falcon-H1's attention or SSM branch; Granite's residual).
            let load_mixer = |m: &checkpoint::modules::Mixer| {
                let [input, output] = match (&m.attn, mup) {
                    (_, None) => [1.0; 2],
                    (AttnProjections::Mamba { .. }, Some(u)) => [u.ssm_in, u.ssm_out],
                    (_, Some(u)) => [u.attention_in, u.attention_out],
                };
                let proj = Projections::load(backend, ckpt, &m.attn, (l, &p), &norm_vec)?;
                let o = upload(backend, ckpt, &m.o)?;
                let local = c.local_rope.is_some() && c.window_of(l).is_some();
                let norm_name = format!("{p}.{}.weight", c.names.attn_norm);
                let shape = c.heads_of(l);
                let rotary_dim = c.rotary_dims()[usize::from(local)];
                Ok::<_, Error>(MixerPart {
                    norm: scaled_norm(&norm_name, c.hidden_size, input)?,
                    emits: Emits {
                        qkv: proj.input_type(backend),
                        attention: backend.input_type(&o),
                    },
                    out_scale: scales(&m.o.name, output, c.hidden_size)?,
                    proj,
                    o,
                    out_norm: sandwich("post_attention_layernorm")?,
                    attn: AttnSpec {
                        scale: c.attn_scale as f32,
                        softcap: c.attn_softcap,
                        window: c.window_of(l),
                        ..AttnSpec::causal(c.num_heads, shape.kv_heads, shape.head_dim)
                    },
                    // Latent attention rotates the last values of each query/key head, maybe
                    // interleaved.
                    // DeepSeek-V4 rotates each head's last values.
                    span: RotarySpan {
                        start: match c.deepseek_v4 {
                            Some(_) => shape.head_dim - rotary_dim,
                            None => c.mla.map_or(0, |m| m.nope_dim),
                        },
                        interleaved: c.rope_interleaved || c.mla.is_some_and(|m| m.rope_interleave),
                        ..RotarySpan::leading(shape.head_dim, rotary_dim)
                    },
                    query_scaling: match c.mistral_large4 {
                        Some(_) => Some(QueryScaling::load(
                            backend,
                            ckpt,
                            &format!("{p}.{}.softmax_scaling", c.names.attn),
                            c.num_heads,
                            shape.head_dim,
                        )?),
                        None => None,
                    },
                    kv_source: c.kv_source(l),
                    keeps_kv: c.gemma4.as_ref().is_some_and(|g| g.keeps_kv(l)),
                    sinks: if c.attention_sinks {
                        let name = format!("{p}.self_attn.sinks");
                        Some(backend.upload_vector(&name, &ckpt.norm(&name, c.num_heads)?)?)
                    } else {
                        None
                    },
                    rope: usize::from(local),
                    rotates: c.uses_rope(l),
                    chunk: c.chunk_of(l),
                })
            };
            let mixer = modules.mixer.as_ref().map(load_mixer).transpose()?;
            let parallel = modules.parallel.as_ref().map(load_mixer).transpose()?;
            let mlp = match &modules.ffn {
                Some(f) => {
                    let (ffn, beside) = match f {
                        checkpoint::FeedForward::DenseAndSparse(dense, sparse) => {
                            let dense = checkpoint::FeedForward::Dense(dense.clone());
                            let moe = Moe::load(backend, ckpt, sparse)?;
                            let router = ckpt.norm(&format!("{p}.router.scale"), c.hidden_size)?;
                            let root = (c.hidden_size as f64).powf(-0.5) as f32;
                            let router: Vec<f32> = router.iter().map(|w| w * root).collect();
                            // The router reads its own input: the experts' needs no exact
                            // form for it.
                            let emits = match moe.input_type(backend) {
                                OutType::ExactForRouter => OutType::Activation,
                                t => t,
                            };
                            let beside = ExpertsBeside {
                                emits,
                                router_norm: backend
                                    .upload_vector(&format!("{p}.router.scale"), &router)?,
                                input_norm: norm("pre_feedforward_layernorm_2")?,
                                dense_out_norm: norm("post_feedforward_layernorm_1")?,
                                out_norm: norm("post_feedforward_layernorm_2")?,
                                moe,
                            };
                            (Ffn::load(backend, ckpt, &dense)?, Some(beside))
                        }
                        f => (Ffn::load(backend, ckpt, f)?, None),
                    };
                    let down = mup.map_or(1.0, |u| u.mlp_down);
                    Some(MlpPart {
                        out_scale: scales(&format!("{p}.mlp_out"), down, c.hidden_size)?,
                        norm: match c.sandwich_norms {
                            true => norm("pre_feedforward_layernorm")?,
                            false => norm(c.names.mlp_norm)?,
                        },
                        emits: ffn.input_type(backend),
                        ffn,
                        out_norm: sandwich("post_feedforward_layernorm")?,
                        beside,
                    })
                }
                None => None,
            };
            let per_layer_input = match &modules.per_layer_input {
                Some([gate, projection]) => Some(LayerInput {
                    gate: upload(backend, ckpt, gate)?,
                    projection: upload(backend, ckpt, projection)?,
                    norm: norm("post_per_layer_input_norm")?,
                }),
                None => None,
            };
            let scalar = match c.gemma4 {
                Some(_) => {
                    let name = format!("{p}.layer_scalar");
                    let v = ckpt.norm(&name, 1)?[0];
                    scales(&name, v, c.hidden_size)?
                }
                None => None,
            };
            let hyper = match c.hyper {
                Some(_) => Some([
                    HyperConnection::load(backend, ckpt, &format!("{p}.attn_hc"))?,
                    HyperConnection::load(backend, ckpt, &format!("{p}.ffn_hc"))?,
                ]),
                None => None,
            };
            let layer = Layer {
                mixer,
                parallel,
                mlp,
                per_layer_input,
                scalar,
                hyper,
            };
            progress(k + 2, steps);
            Ok(layer)
        };
        let per_layer_inputs = match c.gemma4.as_ref().and_then(|g| g.per_layer_inputs) {
            Some(p) => {
                let name = |n: &str| format!("{prefix}.{n}");
                let table_name = name("embed_tokens_per_layer.weight");
                let table = ckpt.table(&table_name, [p.vocab, c.num_layers * p.width])?;
                let projection = checkpoint::Module::new(
                    name("per_layer_model_projection"),
                    c.num_layers * p.width,
                    c.hidden_size,
                );
                let cols = c.num_layers * p.width;
                let scale = |v: f64| backend.upload_vector(&table_name, &vec![v as f32; cols]);
                Some(PerLayerInputs {
                    table: backend.upload_linear(&table)?,
                    projection: upload(backend, ckpt, &projection)?,
                    norm: norm_vec(&name("per_layer_projection_norm.weight"), p.width)?,
                    width: p.width,
                    scales: [
                        scale((c.hidden_size as f64).powf(-0.5))?,
                        scale(0.5f64.sqrt())?,
                    ],
                })
            }
            None => None,
        };
        let mut model = Self {
            config: c.clone(),
            layers_range: layers_range.clone(),
            embed,
            layers: Vec::with_capacity(layers_range.len()),
            head,
            ropes,
            max_positions,
            per_layer_inputs,
            unrotated_queries,
            log_positions,
            latent_from_top_k: LATENT_FROM_TOP_K,
            v4_tables,
            hyper_head,
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
        drop(self.run_layers(b, x, &vec![0; rows], &layout)?);
        b.synchronize()
    }

    pub fn has_embedding(&self) -> bool {
        self.embed.is_some()
    }

    pub fn has_head(&self) -> bool {
        self.head.is_some()
    }

    /// The most rows a sequence split into branches may have on this model (`None`: none may
    /// be): `ModelConfig::branch_rows_limit` within the positions it was loaded for.
    pub fn branch_rows(&self) -> Option<usize> {
        self.config
            .branch_rows_limit()
            .map(|l| l.min(self.max_positions))
    }

    /// An error unless this model computes `layout` exactly: no longer than it was loaded
    /// for, and where its sequences are split into branches or `continue` earlier rows, within
    /// `ModelConfig::branch_rows_limit`.
    fn check_len(&self, layout: &SeqLayout, continues: bool) -> Result<()> {
        if layout.max_len() > self.max_positions {
            return Err(Error::ContextTooLong {
                ctx: layout.max_len(),
                max: self.max_positions,
            });
        }
        if layout.branched() || continues {
            let rows = layout.max_len();
            let how = match continues {
                true => "continuing rows of an earlier batch",
                false => "split into branches",
            };
            match self.config.branch_rows_limit() {
                Some(limit) if rows <= limit => {}
                limit => {
                    return Err(Error::InvalidArgument(format!(
                        "a sequence of {rows} rows {how}: {}",
                        match limit {
                            Some(l) => format!(
                                "this model computes such sequences exactly only up to {l} rows \
                                 (its sliding window, its attention chunks or LongRoPE's switch)"
                            ),
                            None => "this model's recurrent or sparse-attention layers read \
                                     every earlier row"
                                .into(),
                        }
                    )));
                }
            }
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
        // Falcon-H1: `embedding_multiplier`, a Python float.
        let scale = match &self.config.multipliers {
            _ if self.config.scaled_embeddings => b
                .activation_type()
                .round((self.config.hidden_size as f64).sqrt() as f32),
            Some(u) => u.embedding,
            None => 1.0,
        };
        b.embed(table, ids, scale)
    }

    /// Runs this model's decoder layers over the residual stream `x` `[tokens, hidden]` of
    /// tokens `ids` (whose per-layer inputs Gemma 4 reads; `x` is then their embeddings).
    pub fn run_layers(
        &self,
        b: &B,
        x: B::Tensor,
        ids: &[u32],
        layout: &SeqLayout,
    ) -> Result<B::Tensor> {
        self.run_layers_observed(b, x, ids, layout, None)
    }

    /// [`run_layers`](Self::run_layers), `observe(i, stream)` called with the residual
    /// stream after each layer `i` of this model (`compare --layers`): the layer's last update
    /// is then added at once instead of by the next norm.
    pub fn run_layers_observed(
        &self,
        b: &B,
        x: B::Tensor,
        ids: &[u32],
        layout: &SeqLayout,
        observe: Option<&mut LayerObserver<'_, B>>,
    ) -> Result<B::Tensor> {
        self.run_batch(b, x, ids, layout, observe, None)
            .map(|(x, _)| x)
    }

    /// [`run_layers`](Self::run_layers) over a batch whose sequences may continue rows earlier
    /// batches computed (`plan`; `earlier`: those batches' keys and values as this method
    /// returned them), `x` and `ids` the batch's own rows. Returns the residual stream and
    /// each layer's keys and values as its attention read them, for later batches to continue.
    pub fn run_layers_continued(
        &self,
        b: &B,
        x: B::Tensor,
        ids: &[u32],
        plan: &Continuation,
        earlier: &[&KeysOfLayers<B>],
    ) -> Result<(B::Tensor, KeysOfLayers<B>)> {
        let (x, kept) = self.run_batch(b, x, ids, &plan.rows, None, Some((plan, earlier)))?;
        Ok((x, kept.unwrap_or_default()))
    }

    /// The decoder layers over a batch, its keys and values kept by layer where it may
    /// continue earlier rows (`continued`; `layout` is then `plan.rows`).
    fn run_batch(
        &self,
        b: &B,
        mut x: B::Tensor,
        ids: &[u32],
        layout: &SeqLayout,
        mut observe: Option<&mut LayerObserver<'_, B>>,
        continued: Option<(&Continuation, &[&KeysOfLayers<B>])>,
    ) -> Result<(B::Tensor, Option<KeysOfLayers<B>>)> {
        match continued {
            Some((plan, _)) => self.check_len(&plan.attention, plan.continues())?,
            None => self.check_len(layout, false)?,
        }
        let c = &self.config;
        let eps = c.rms_norm_eps as f32;
        let seqs = b.upload_sequences(layout)?;
        let keep_kv = continued.is_some();
        let continued = match continued {
            Some((plan, earlier)) if plan.continues() => Some(Continued {
                seqs: b.upload_sequences(&plan.attention)?,
                plan,
                earlier,
            }),
            _ => None,
        };
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
        // Llama 4's chunked layers: sequences longer than a chunk attend as their chunks.
        let chunk = (0..c.num_layers).find_map(|l| c.chunk_of(l));
        let chunked = match chunk {
            Some(n) if layout.max_len() > n => Some(b.upload_sequences(&layout.split(n))?),
            _ => None,
        };
        let batch = Batch {
            layout,
            seqs: &seqs,
            rope_seqs: &rope_seqs,
            chunked: chunked.as_ref(),
            // Sparse attention keeps every key of a query with no more than top_k: a batch of
            // no longer sequences attends densely.
            sparse: c
                .indexer
                .as_ref()
                .is_some_and(|ix| layout.max_len() > ix.top_k),
            // Kept and continued batches hand on the expanded heads.
            latent: c.indexer.as_ref().is_some_and(|ix| {
                let from = self.latent_from_top_k.saturating_mul(ix.top_k);
                layout.max_len() > ix.top_k && layout.max_len() >= from
            }) && continued.is_none()
                && !keep_kv,
            continued,
            keep_kv,
        };
        let per_layer = match &self.per_layer_inputs {
            Some(p) => Some(p.compute(b, &x, ids, eps)?),
            None => None,
        };
        let mut handed = HandedOn {
            selection: None,
            kv: Vec::new(),
            latents: Vec::new(),
        };
        if self.config.hyper.is_some() {
            let x = self.run_streams(b, x, ids, &batch, &mut handed, observe)?;
            return Ok((x, None));
        }
        // Each residual update is added by the norm that reads the stream next (fused where
        // the backend can); the last layer's MLP output is added on its own at the end.
        let mut pending: Option<B::Tensor> = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let l = self.layers_range.start + i;
            if let Some(mixer) = &layer.mixer {
                let emits = mixer.emits;
                let xn = add_then_norm(b, &mut x, pending.take(), &mixer.norm, eps, emits.qkv)?;
                let o = self.mix(b, mixer, xn, &batch, (l, &mut handed))?;
                // The mixer beside it reads the same stream; its output joins it at once.
                if let Some(side) = &layer.parallel {
                    let xn = b.rms_norm(&x, &side.norm, eps, side.emits.qkv)?;
                    let o_side = self.mix(b, side, xn, &batch, (l, &mut handed))?;
                    b.add_assign(&mut x, &o_side)?;
                }
                pending = Some(o);
            }
            if let Some(mlp) = &layer.mlp {
                let xn = add_then_norm(b, &mut x, pending.take(), &mlp.norm, eps, mlp.emits)?;
                // A mixture may add its sum into the residual stream itself (CUDA), unless a
                // norm or a factor comes between (Gemma's sandwich norms, Falcon-H1's and
                // Granite's multipliers); else the next norm adds it.
                let direct = mlp.out_norm.is_none() && mlp.out_scale.is_none();
                let residual = direct.then_some(&mut x);
                pending = match mlp.ffn.forward(b, &xn, ids, residual)? {
                    Some(mut down) => {
                        drop(xn);
                        if let Some(beside) = &mlp.beside {
                            down = beside.forward(b, down, &x, eps)?;
                        }
                        if let Some(norm) = &mlp.out_norm {
                            down = b.rms_norm(&down, norm, eps, OutType::Activation)?;
                        }
                        if let Some(factors) = &mlp.out_scale {
                            b.scale_columns(&mut down, factors)?;
                        }
                        Some(down)
                    }
                    None => None,
                };
            }
            // Gemma 4: the per-layer input's update reads the stream after the MLP, then the
            // layer's scalar scales the stream.
            if let (Some(input), Some(inputs)) = (&layer.per_layer_input, &per_layer) {
                flush(b, &mut x, pending.take())?;
                let width = inputs.cols() / c.num_layers;
                pending = Some(input.forward(b, &x, inputs, (l, width), eps)?);
            }
            if let Some(scalar) = &layer.scalar {
                flush(b, &mut x, pending.take())?;
                b.scale_columns(&mut x, scalar)?;
            }
            if let Some(observe) = observe.as_mut() {
                flush(b, &mut x, pending.take())?;
                observe(i, &x)?;
            }
        }
        flush(b, &mut x, pending)?;
        let kept = keep_kv.then(|| {
            let mut by_layer: KeysOfLayers<B> = self.layers.iter().map(|_| None).collect();
            for (l, kv) in handed.kv {
                by_layer[l - self.layers_range.start] = Some(kv);
            }
            by_layer
        });
        Ok((x, kept))
    }

    /// `run_batch`'s layers under hyper-connections (DeepSeek-V4, GLM-5.3-Flash): the residual
    /// stream as `hc_mult` streams (the embeddings copied at the first stage; collapsed by the
    /// head at the last), each block reading their collapse and its output spread back over
    /// them (`HyperConnection`).
    fn run_streams(
        &self,
        b: &B,
        x: B::Tensor,
        ids: &[u32],
        batch: &Batch<'_, B>,
        handed: &mut HandedOn<B>,
        mut observe: Option<&mut LayerObserver<'_, B>>,
    ) -> Result<B::Tensor> {
        let c = &self.config;
        let eps = c.rms_norm_eps as f32;
        let missing = || Error::backend("forward", "a hyper-connected layer without its parts");
        let n = c.hyper.as_ref().ok_or_else(missing)?.streams;
        let mut streams = match x.cols() == c.hidden_size {
            true => spread(b, &x, n)?,
            false => x,
        };
        for (i, layer) in self.layers.iter().enumerate() {
            let l = self.layers_range.start + i;
            let ([attn_hc, ffn_hc], Some(mixer), Some(mlp)) = (
                layer.hyper.as_ref().ok_or_else(missing)?,
                &layer.mixer,
                &layer.mlp,
            ) else {
                return Err(missing());
            };
            let (collapsed, mixing) = attn_hc.collapse(b, &streams)?;
            let xn = b.rms_norm(&collapsed, &mixer.norm, eps, mixer.emits.qkv)?;
            drop(collapsed);
            let o = self.mix(b, mixer, xn, batch, (l, handed))?;
            streams = attn_hc.expand(b, &streams, &o, mixing)?;
            drop(o);
            let (collapsed, mixing) = ffn_hc.collapse(b, &streams)?;
            let xn = b.rms_norm(&collapsed, &mlp.norm, eps, mlp.emits)?;
            drop(collapsed);
            let down = mlp.ffn.forward(b, &xn, ids, None)?.ok_or_else(missing)?;
            drop(xn);
            streams = ffn_hc.expand(b, &streams, &down, mixing)?;
            if let Some(observe) = observe.as_mut() {
                observe(i, &streams)?;
            }
        }
        match &self.hyper_head {
            Some(head) => head.collapse(b, &streams),
            None => Ok(streams),
        }
    }

    /// The residual stream after each decoder layer at rows `rows` of a batch, on the host:
    /// `[layer][row * width + j]`, `width` the hidden size (DeepSeek-V4: its `hc_mult` streams
    /// side by side), for a model holding every layer.
    pub fn layer_states(
        &self,
        b: &B,
        ids: &[u32],
        layout: &SeqLayout,
        rows: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        let mut states = Vec::with_capacity(self.layers.len());
        let mut keep = |_: usize, x: &B::Tensor| -> Result<()> {
            let (all, width) = (b.download(x)?, x.cols());
            states.push(
                rows.iter()
                    .flat_map(|&r| all[r * width..(r + 1) * width].iter().copied())
                    .collect(),
            );
            Ok(())
        };
        let x = self.embed(b, ids)?;
        self.run_layers_observed(b, x, ids, layout, Some(&mut keep))?;
        Ok(states)
    }

    /// A mixer's output (`o_proj`'s, normed and scaled where the layer says) from its normed
    /// input `xn`; what layer `layer` hands on to later layers kept in `handed`.
    fn mix(
        &self,
        b: &B,
        mixer: &MixerPart<B>,
        xn: B::Tensor,
        batch: &Batch<'_, B>,
        (layer, handed): (usize, &mut HandedOn<B>),
    ) -> Result<B::Tensor> {
        let HandedOn {
            selection,
            kv: kept,
            latents,
        } = handed;
        let c = &self.config;
        let eps = c.rms_norm_eps as f32;
        let out = mixer.emits.attention;
        let seqs = batch.seqs;
        let index = layer - self.layers_range.start;
        let mixed = match &mixer.proj {
            Projections::Compressed(a) => {
                let v4 = self
                    .v4_tables
                    .as_ref()
                    .ok_or_else(|| Error::backend("attention", "no DeepSeek-V4 tables"))?;
                let own = &self.ropes[mixer.rope];
                let compress = &self.ropes[0];
                let rate = c
                    .deepseek_v4
                    .as_ref()
                    .and_then(|v| v.compression[layer].rate());
                let entries = v4
                    .entries
                    .iter()
                    .find(|(r, _, _)| Some(*r) == rate)
                    .map(|(_, cos, sin)| (cos, sin));
                let tables = LayerTables {
                    cos: &own.cos,
                    sin: &own.sin,
                    inverse_sin: &v4.inverse_sin[mixer.rope],
                    entries,
                    index_queries: (&compress.cos, &compress.sin),
                };
                let heads = (mixer.attn, mixer.span, mixer.sinks.as_ref());
                let at = (seqs, batch.layout);
                a.forward(b, xn, at, tables, heads, eps, out)?
            }
            Projections::DeltaNet(net) => net.forward(b, &xn, seqs, eps, out)?,
            Projections::ShortConv(conv) => conv.forward(b, &xn, seqs, out)?,
            Projections::Mamba(m) => m.forward(b, &xn, seqs, eps, out)?,
            Projections::Latent(l) => {
                let mut own = None;
                let (q, low, [latent, compressed]) =
                    l.project(b, &xn, (layer, latents), &mut own)?;
                // A layer with its own indexer selects; the others reuse the last selection.
                let keys = match (&l.indexer, batch.sparse) {
                    (_, false) => None,
                    (Some(ix), true) => {
                        let rope_seqs = batch.rope_seqs[0].as_ref().unwrap_or(seqs);
                        let tables = (&self.ropes[0].cos, &self.ropes[0].sin);
                        let logs = self.log_positions.as_ref();
                        let input = (&xn, low.as_ref());
                        let at = (seqs, rope_seqs, batch.layout);
                        *selection = Some(ix.select(b, input, at, tables, logs)?);
                        selection.as_ref()
                    }
                    (None, true) => Some(selection.as_ref().ok_or_else(|| {
                        Error::InvalidArgument(
                            "a layer reusing an earlier layer's sparse-attention selection \
                             (GLM-5 `shared`) is the first of its pipeline stage: split the \
                             layers elsewhere"
                                .into(),
                        )
                    })?),
                };
                drop(xn);
                let absorbed = l.absorbed.as_ref().filter(|_| batch.latent);
                if let (Some(absorbed), Some(keys)) = (absorbed, keys) {
                    // The values are the latent itself unless `kv_b` quantizes it.
                    let quantized = absorbed.quantized(b, latent)?;
                    let value = quantized.as_ref().unwrap_or(latent);
                    let key = l.latent_key(b, value, compressed)?;
                    let qkv = (q, key, value);
                    self.attend_latent(b, mixer, (absorbed, &l.dims), qkv, batch, keys)?
                } else {
                    let [k, v] = l.expanded_kv(b, latent, compressed)?;
                    let kv = KeysValues::Projected(k, v, index);
                    let (attn, own) = self.attend(b, mixer, q, kv, None, batch, keys)?;
                    if let (true, Some(own)) = (mixer.keeps_kv || batch.keep_kv, own) {
                        kept.push((layer, own));
                    }
                    attn
                }
            }
            _ => match mixer.proj.qkv(b, &xn, c)? {
                Projected::All(([q, k, v], gate)) => {
                    drop(xn);
                    let kv = KeysValues::Projected(k, v, index);
                    let (attn, own) = self.attend(b, mixer, q, kv, gate, batch, None)?;
                    if let (true, Some(own)) = (mixer.keeps_kv || batch.keep_kv, own) {
                        kept.push((layer, own));
                    }
                    attn
                }
                Projected::Queries(q) => {
                    drop(xn);
                    let source = mixer
                        .kv_source
                        .and_then(|s| kept.iter().find(|(l, _)| *l == s).map(|(_, kv)| (s, kv)));
                    let Some((_, kv)) = source else {
                        return Err(Error::InvalidArgument(format!(
                            "layer {layer} reuses the keys and values of layer {:?}, which this \
                             model part did not compute",
                            mixer.kv_source
                        )));
                    };
                    let kv = KeysValues::Reused(kv);
                    self.attend(b, mixer, q, kv, None, batch, None)?.0
                }
            },
        };
        let mut o = b.linear(&mixed, &mixer.o)?;
        drop(mixed);
        if let Some(norm) = &mixer.out_norm {
            o = b.rms_norm(&o, norm, eps, OutType::Activation)?;
        }
        if let Some(scales) = &mixer.out_scale {
            b.scale_columns(&mut o, scales)?;
        }
        Ok(o)
    }

    /// Queries or keys `x` of `layer` as its attention reads them: RMS-normed per head by
    /// `norm` where the layer norms them, rotated by `tables` at the positions of `rope_seqs`
    /// where it rotates.
    fn rotate(
        &self,
        b: &B,
        layer: &MixerPart<B>,
        mut x: B::Tensor,
        norm: Option<&B::Tensor>,
        (cos, sin): (&B::Tensor, &B::Tensor),
        rope_seqs: &B::Sequences,
    ) -> Result<B::Tensor> {
        let (c, span) = (&self.config, layer.span);
        let eps = c.rms_norm_eps as f32;
        match norm {
            // No positions (Nemotron-H's attention, Llama 4's layers without RoPE).
            None if !layer.rotates => Ok(x),
            // MiniMax-M2: one norm over all heads, then RoPE.
            Some(w) if c.qk_norm == Some(QkNorm::Projection) => {
                let mut y = b.rms_norm(&x, w, eps, OutType::Activation)?;
                drop(x);
                b.rope(&mut y, rope_seqs, cos, sin, span).map(|()| y)
            }
            Some(w) => b.norm_rope(x, w, eps, rope_seqs, cos, sin, span),
            None => b.rope(&mut x, rope_seqs, cos, sin, span).map(|()| x),
        }
    }

    /// `layer`'s queries `q` as its attention reads them: normed and rotated (`rotate`, by the
    /// queries' own table where the model has one), and scaled by position where it says.
    fn queries(
        &self,
        b: &B,
        layer: &MixerPart<B>,
        q: B::Tensor,
        rope_seqs: &B::Sequences,
    ) -> Result<B::Tensor> {
        let tables = &self.ropes[layer.rope];
        let keys = (&tables.cos, &tables.sin);
        let queries = tables.query.as_ref().map_or(keys, |t| (&t.cos, &t.sin));
        let mut q = self.rotate(b, layer, q, layer.proj.head_norms().q, queries, rope_seqs)?;
        if let Some((cos, sin, span)) = tables.query.as_ref().and_then(|t| t.unrotated.as_ref()) {
            b.rope(&mut q, rope_seqs, cos, sin, *span)?;
        }
        if let (Some((cos, sin)), false) = (&self.unrotated_queries, layer.rotates) {
            let d = layer.attn.head_dim;
            b.rope(&mut q, rope_seqs, cos, sin, RotarySpan::leading(d, d))?;
        }
        if let Some(scaling) = &layer.query_scaling {
            q = scaling.apply(b, q, rope_seqs, self.log_positions.as_ref())?;
        }
        Ok(q)
    }

    /// A layer's attention from its queries, its keys and values (projected: before the
    /// q/k/v norms and RoPE; or an earlier layer's as they were attended to), and its output
    /// gate where it has one: the input of `o_proj`, in the type it reads, and the layer's own
    /// keys and values as attended to; each query restricted to the keys `selected` names
    /// where given (sparse attention).
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        b: &B,
        layer: &MixerPart<B>,
        q: B::Tensor,
        kv: KeysValues<'_, B>,
        gate: Option<B::Tensor>,
        batch: &Batch<'_, B>,
        selected: Option<&B::Tensor>,
    ) -> Result<(B::Tensor, Option<KeyValuePair<B>>)> {
        let (seqs, rope_seqs) = (batch.seqs, batch.rope_seqs[layer.rope].as_ref());
        let rope_seqs = rope_seqs.unwrap_or(seqs);
        let c = &self.config;
        let eps = c.rms_norm_eps as f32;
        let norms = layer.proj.head_norms();
        let q = self.queries(b, layer, q, rope_seqs)?;
        // A batch continuing earlier rows attends over its whole sequences: the queries of the
        // earlier rows stand in (their outputs are dropped), the keys and values joined.
        let continues = batch.continued.as_ref();
        let q = match continues {
            Some(c) => b.take_rows(&[&q], &c.plan.queries)?,
            None => q,
        };
        let (own, reused) = match kv {
            KeysValues::Projected(k, v, index) => {
                let v = match norms.v {
                    // Gemma 4: each value head RMS-normed, no weight.
                    Some(ones) => {
                        let (t, cols, d) = (v.rows(), v.cols(), layer.attn.head_dim);
                        let heads = v.reshaped(t * cols / d, d)?;
                        b.rms_norm(&heads, ones, eps, OutType::Activation)?
                            .reshaped(t, cols)?
                    }
                    None => v,
                };
                let tables = &self.ropes[layer.rope];
                let keys = (&tables.cos, &tables.sin);
                let kv = (self.rotate(b, layer, k, norms.k, keys, rope_seqs)?, v);
                let kv = match continues {
                    Some(c) => c.join(b, index, kv)?,
                    None => kv,
                };
                (Some(kv), None)
            }
            KeysValues::Reused(kv) => (None, Some(kv)),
        };
        let Some((k, v)) = own.as_ref().or(reused) else {
            return Err(Error::backend(
                "attention",
                "neither keys of its own nor reused",
            ));
        };
        let sinks = layer.sinks.as_ref();
        // The attention itself in the activation type where a step follows it.
        let out = match gate {
            Some(_) => OutType::Activation,
            None => layer.emits.attention,
        };
        let seqs = match (layer.chunk, batch.chunked, continues.map(|c| &c.seqs)) {
            (_, _, Some(whole)) => whole,
            (Some(_), Some(chunks), None) => chunks,
            _ => seqs,
        };
        let attention = |out| match selected {
            Some(keys) => b.sparse_attention(&q, k, v, seqs, layer.attn, (keys, sinks), out),
            None => b.attention(&q, k, v, seqs, layer.attn, sinks, out),
        };
        let attn = match c.mla {
            // The values' padding cut off each head.
            Some(m) if m.v_head_dim < c.head_dim => {
                let padded = attention(OutType::Activation)?;
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
                b.assemble_columns(t, h * m.v_head_dim, &[(&padded, heads)], out)?
            }
            _ => attention(out)?,
        };
        drop(q);
        let attn = match continues {
            Some(c) => b.take_rows(&[&attn], &c.plan.outputs)?,
            None => attn,
        };
        let attn = match gate {
            // Qwen3.5: `attn * sigmoid(gate)`.
            Some(g) => b.gated_act(
                &g,
                Some(&attn),
                GatedActivation::Sigmoid,
                layer.emits.attention,
            )?,
            None => attn,
        };
        Ok((attn, own))
    }

    /// Latent attention's sparse attention in the latent space (`Absorbed`): the queries
    /// rotated and taken through each head's key part of `kv_b`, attending over one key head
    /// (`Latent::latent_key`, its rotated part rotated here) whose values are the latent, each
    /// query over the keys `selected` names; the output through each head's value part: the
    /// input of `o_proj`.
    fn attend_latent(
        &self,
        b: &B,
        layer: &MixerPart<B>,
        (absorbed, m): (&Absorbed<B>, &MlaConfig),
        (q, mut key, value): (B::Tensor, B::Tensor, &B::Tensor),
        batch: &Batch<'_, B>,
        selected: &B::Tensor,
    ) -> Result<B::Tensor> {
        let rope_seqs = batch.rope_seqs[layer.rope].as_ref().unwrap_or(batch.seqs);
        let q = self.queries(b, layer, q, rope_seqs)?;
        let q = absorbed.queries(b, &q, m)?;
        let r = m.kv_lora_rank;
        if layer.rotates && m.rope_dim > 0 {
            let tables = &self.ropes[layer.rope];
            let span = RotarySpan {
                head_dim: r + m.rope_dim,
                start: r,
                ..layer.span
            };
            b.rope(&mut key, rope_seqs, &tables.cos, &tables.sin, span)?;
        }
        let spec = AttnSpec {
            kv_heads: 1,
            head_dim: r + m.rope_dim,
            ..layer.attn
        };
        let attn = b.sparse_attention(
            &q,
            &key,
            value,
            batch.seqs,
            spec,
            (selected, None),
            OutType::Activation,
        )?;
        drop((q, key));
        absorbed.values(b, &attn, r, layer.emits.attention)
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
        let x = self.stage_input(b, handed_on, ids)?;
        self.run_layers(b, x, ids, layout)
    }

    /// [`stage_forward`](Self::stage_forward) of a batch whose sequences may continue rows
    /// earlier batches computed ([`run_layers_continued`](Self::run_layers_continued)).
    pub fn stage_forward_continued(
        &self,
        b: &B,
        handed_on: Option<(&B, B::Tensor)>,
        ids: &[u32],
        plan: &Continuation,
        earlier: &[&KeysOfLayers<B>],
    ) -> Result<(B::Tensor, KeysOfLayers<B>)> {
        let x = self.stage_input(b, handed_on, ids)?;
        self.run_layers_continued(b, x, ids, plan, earlier)
    }

    /// The residual stream a stage starts from: the previous stage's, or the embeddings.
    fn stage_input(
        &self,
        b: &B,
        handed_on: Option<(&B, B::Tensor)>,
        ids: &[u32],
    ) -> Result<B::Tensor> {
        match handed_on {
            Some((from, x)) => b.copy_from(from, &x),
            None => self.embed(b, ids),
        }
    }

    /// The final norm and the output projection (last stage only).
    fn head(&self) -> Result<(&B::Tensor, Head<'_, B::Linear>)> {
        let head = self.output_head()?;
        let projection = head.lm_head.as_ref().or(self.embed.as_ref());
        let head_out = Head {
            linear: projection.ok_or_else(no_head)?,
            softcap: self.config.final_softcap,
        };
        Ok((&head.norm, head_out))
    }

    fn output_head(&self) -> Result<&OutputHead<B>> {
        self.head.as_ref().ok_or_else(no_head)
    }

    /// The final norm of the residual stream (last stage only).
    pub fn final_norm(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let head = self.output_head()?;
        let eps = self.config.rms_norm_eps as f32;
        b.rms_norm(x, &head.norm, eps, head.emits)
    }

    /// NLL of each target (`targets[i] >= 0`) from the residual stream after the last layer.
    pub fn nll_from_residual(&self, b: &B, x: &B::Tensor, targets: &[i32]) -> Result<Vec<f32>> {
        let hidden = self.final_norm(b, x)?;
        b.nll(&hidden, self.head()?.1, targets)
    }

    /// Sparse attention turns to the latent space for batches whose longest sequence holds
    /// `times_top_k` times `index_topk` tokens or more (8 unless set here: where it costs
    /// less on a GPU); both forms give the same scores.
    pub fn set_latent_from(&mut self, times_top_k: usize) {
        self.latent_from_top_k = times_top_k;
    }

    /// Final-normed hidden states `[tokens, hidden]` of a batch of sequences laid end to end
    /// (a model holding every layer).
    pub fn hidden(&self, b: &B, ids: &[u32], layout: &SeqLayout) -> Result<B::Tensor> {
        let x = self.run_layers(b, self.embed(b, ids)?, ids, layout)?;
        self.final_norm(b, &x)
    }

    /// `reduce(logits, k)` of each row `rows[k]` of final-normed `hidden`, on the host from its
    /// full-vocabulary f32 logits (whole rows: what `serve`'s reductions are held to).
    pub fn head_reduce<T: Send>(
        &self,
        b: &B,
        hidden: &B::Tensor,
        rows: &[u32],
        reduce: impl Fn(&[f32], usize) -> T + Sync,
    ) -> Result<Vec<T>> {
        let head = (
            self.head()?.1,
            self.output_head()?.emits,
            self.config.vocab_size,
        );
        crate::backend::reduce_logits_on_host(b, hidden, rows, head, reduce)
    }

    /// [`RowStats`] of the rows of final-normed `hidden` with `targets[row] >= 0`, in row order,
    /// with their `top` most likely tokens (`serve`: reduced on the device where the backend
    /// can).
    pub fn head_row_stats(
        &self,
        b: &B,
        hidden: &B::Tensor,
        targets: &[i32],
        top: usize,
    ) -> Result<Vec<RowStats>> {
        b.row_stats(
            hidden,
            self.head()?.1,
            targets,
            (self.config.vocab_size, top),
        )
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
        let t = match self.output_head()?.emits {
            OutType::F32 | OutType::ExactForRouter => b.upload_vector("base states", values)?,
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
/// The residual stream `x` with the `pending` update added (fused with the norm where the
/// backend can), RMS-normed by `w` into type `out`: the input of the next mixer or MLP.
fn add_then_norm<B: Backend>(
    b: &B,
    x: &mut B::Tensor,
    pending: Option<B::Tensor>,
    w: &B::Tensor,
    eps: f32,
    out: OutType,
) -> Result<B::Tensor> {
    match pending {
        Some(update) => b.add_rms_norm(x, &update, w, eps, out),
        None => b.rms_norm(x, w, eps, out),
    }
}

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
/// (e.g. free memory), each at least one layer, each starting at a layer `may_begin` allows
/// where one lies within reach (`ModelConfig::may_begin_stage`). Needs `n_layers >=
/// capacity.len()`.
pub fn split_layers(
    n_layers: usize,
    capacity: &[u64],
    may_begin: impl Fn(usize) -> bool,
) -> Vec<Range<usize>> {
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
            let (lo, hi) = (start + 1, n_layers - (n - i - 1));
            let ideal = ideal.clamp(lo, hi);
            // The allowed boundary nearest the ideal one (the ideal where none is).
            (lo..=hi)
                .filter(|&e| may_begin(e))
                .min_by_key(|&e| e.abs_diff(ideal))
                .unwrap_or(ideal)
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
        let split = |n, c: &[u64]| split_layers(n, c, |_| true);
        assert_eq!(split(32, &[1, 1]), vec![0..16, 16..32]);
        assert_eq!(
            split(80, &[100, 100, 100, 100]),
            vec![0..20, 20..40, 40..60, 60..80]
        );
        // A device with three times the memory takes three times the layers.
        assert_eq!(split(8, &[3, 1]), vec![0..6, 6..8]);
        // Every device gets a layer even when its share rounds to zero.
        assert_eq!(split(3, &[1000, 1, 1]), vec![0..1, 1..2, 2..3]);
        assert_eq!(split(10, &[1, 1000]), vec![0..1, 1..10]);
        // GLM-5's layers that reuse the layer before's selection begin no stage: the nearest
        // boundary that may be taken instead.
        let reuse = |l: usize| l % 3 != 1 && l % 3 != 2;
        assert_eq!(split_layers(32, &[1, 1], reuse), vec![0..15, 15..32]);
        assert_eq!(
            split_layers(12, &[1, 1, 1, 1], reuse),
            vec![0..3, 3..6, 6..9, 9..12]
        );
        let r = split(5, &[7, 3, 9]);
        assert_eq!(r.first().map(|r| r.start), Some(0));
        assert_eq!(r.last().map(|r| r.end), Some(5));
        assert!(
            r.windows(2)
                .all(|w| w[0].end == w[1].start && !w[1].is_empty())
        );
    }
}
