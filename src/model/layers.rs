//! A decoder layer's parts, loaded from the checkpoint onto a backend and run by the one
//! forward pass (`forward.rs`): the attention projections (q/k/v heads, or DeepSeek's latent
//! attention), the dense MLP or the mixture of experts, and what each producer emits for the
//! linears that read it (`Emits`, decided at load).

use crate::backend::compressed::EntryKeys;
use crate::backend::{
    AttnSpec, Backend, ColumnBlocks, GatedMlp, IndexSpec, NormGate, OutType, Recurrence,
    RecurrenceGates, RotarySpan, RouteRule, SeqLayout, Shaped, routing,
};
use crate::checkpoint::config::{
    DeltaNetConfig, DeltaNetLayout, ExpertNaming, KeyPools, LatentSource, MambaConfig, MambaNorm,
    MlaConfig, QkNorm,
};
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

/// A dense linear `[out, inp]` of `values` (f32, row-major) on `b`, its input quantized as
/// `act_quant` says: weights made at load (latent attention's per-head parts of `kv_b`,
/// DeepSeek-V4's hyper-connections, kept in f32 as the reference keeps them).
pub(super) fn upload_dense<B: Backend>(
    b: &B,
    name: &str,
    values: &[f32],
    (out, inp): (usize, usize),
    (act_quant, model_dtype): (
        Option<crate::numerics::ActQuant>,
        crate::numerics::FloatType,
    ),
) -> Result<B::Linear> {
    let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    let shape = [out, inp];
    let weight = checkpoint::TensorRef {
        name,
        dtype: safetensors::Dtype::F32,
        shape: &shape,
        bytes: &bytes,
    };
    b.upload_linear(&checkpoint::QLinear {
        name,
        out_features: out,
        in_features: inp,
        packing: checkpoint::Packing::Dense {
            weight,
            transposed: None,
        },
        bias: None,
        act_quant,
        model_dtype,
    })
}

/// A depthwise causal convolution's taps `{module}.weight` (`[width, 1, taps]` on disk,
/// `[width, taps]` on the backend) and, where `biased`, its bias `{module}.bias` `[1, width]`.
fn conv_taps<B: Backend>(
    b: &B,
    ckpt: &Checkpoint,
    module: &str,
    (width, taps): (usize, usize),
    biased: bool,
) -> Result<(B::Tensor, Option<B::Tensor>)> {
    let weight = format!("{module}.weight");
    let taps = b
        .upload_vector(&weight, &ckpt.floats(&weight, &[width, 1, taps])?)?
        .reshaped(width, taps)?;
    let bias = match biased {
        true => {
            let name = format!("{module}.bias");
            Some(
                b.upload_vector(&name, &ckpt.norm(&name, width)?)?
                    .reshaped(1, width)?,
            )
        }
        false => None,
    };
    Ok((taps, bias))
}

/// Columns `from..from + cols` of `x` as a tensor of their own (a fused projection's part).
fn columns<B: Backend>(b: &B, x: &B::Tensor, from: usize, cols: usize) -> Result<B::Tensor> {
    let part = [(x, ColumnBlocks::single(cols, from, 0))];
    b.assemble_columns(x.rows(), cols, &part, OutType::Activation)
}

/// A decoder layer: a token mixer, then an MLP, each behind its norm (Nemotron-H's blocks
/// have one of the two).
pub(super) struct Layer<B: Backend> {
    pub(super) mixer: Option<MixerPart<B>>,
    /// A second mixer beside the first, normed from the same residual stream, its output
    /// added with the first's (Falcon-H1's Mamba-2 beside its attention).
    pub(super) parallel: Option<MixerPart<B>>,
    pub(super) mlp: Option<MlpPart<B>>,
    /// Gemma 4's update from the layer's per-layer input, after the MLP.
    pub(super) per_layer_input: Option<LayerInput<B>>,
    /// `[1, hidden]` factors on the residual stream after the layer (Gemma 4's
    /// `layer_scalar`, where it is not 1).
    pub(super) scalar: Option<B::Tensor>,
    /// DeepSeek-V4's hyper-connections around the mixer and the MLP (`attn_hc`, `ffn_hc`).
    pub(super) hyper: Option<[super::compressed::HyperConnection<B>; 2]>,
}

/// Gemma 4's per-layer input of a layer: `x += norm(projection(gelu(gate(x)) * input))`.
pub(super) struct LayerInput<B: Backend> {
    pub(super) gate: B::Linear,
    pub(super) projection: B::Linear,
    pub(super) norm: B::Tensor,
}

impl<B: Backend> LayerInput<B> {
    /// The update `norm(projection(gelu(gate(x)) * input))` of residual stream `x` by layer
    /// `layer`'s part (`width` columns) of the per-layer inputs `inputs`.
    pub(super) fn forward(
        &self,
        b: &B,
        x: &B::Tensor,
        inputs: &B::Tensor,
        (layer, width): (usize, usize),
        eps: f32,
    ) -> Result<B::Tensor> {
        let input = columns(b, inputs, layer * width, width)?;
        let gate = super::forward::linear_of_stream(b, x, &self.gate)?;
        let out = b.input_type(&self.projection);
        let gated = b.gated_act(&gate, Some(&input), GatedActivation::GeluTanh, out)?;
        drop((gate, input));
        let update = b.linear(&gated, &self.projection)?;
        b.rms_norm(&update, &self.norm, eps, OutType::Activation)
    }
}

/// A layer's token mixer: attention (or a recurrent layer in its place) and `o_proj`.
pub(super) struct MixerPart<B: Backend> {
    pub(super) norm: B::Tensor,
    pub(super) proj: Projections<B>,
    pub(super) o: B::Linear,
    /// Gemma's norm of the attention output before it joins the residual stream.
    pub(super) out_norm: Option<B::Tensor>,
    pub(super) attn: AttnSpec,
    /// gpt-oss's per-head sink logits `[1, heads]`.
    pub(super) sinks: Option<B::Tensor>,
    /// Which of the model's RoPE tables the layer rotates by.
    pub(super) rope: usize,
    /// Whether it rotates at all (not: Nemotron-H's attention, Llama 4's layers without RoPE).
    pub(super) rotates: bool,
    /// Its queries see only their own chunk of this many positions (Llama 4).
    pub(super) chunk: Option<usize>,
    /// The values of each query/key head RoPE rotates.
    pub(super) span: RotarySpan,
    /// Its query heads scaled by position (Mistral Large 4).
    pub(super) query_scaling: Option<QueryScaling<B>>,
    /// The layer whose keys and values this one attends to instead of its own (Gemma 4).
    pub(super) kv_source: Option<usize>,
    /// A later layer attends to this one's keys and values.
    pub(super) keeps_kv: bool,
    pub(super) emits: Emits,
    /// `[1, hidden]` factors on the output (Falcon-H1's `attention_out_multiplier` or
    /// `ssm_out_multiplier`).
    pub(super) out_scale: Option<B::Tensor>,
}

/// A layer's MLP or mixture of experts.
pub(super) struct MlpPart<B: Backend> {
    pub(super) norm: B::Tensor,
    pub(super) ffn: Ffn<B>,
    /// Gemma's norm of the MLP output before it joins the residual stream.
    pub(super) out_norm: Option<B::Tensor>,
    /// What the norm emits for the MLP or mixture (`Backend::input_type`).
    pub(super) emits: OutType,
    /// `[1, hidden]` factors on the output (Falcon-H1's down multiplier, Granite's
    /// `residual_multiplier`).
    pub(super) out_scale: Option<B::Tensor>,
    /// A mixture beside the MLP (Gemma 4), its output joining the MLP's.
    pub(super) beside: Option<ExpertsBeside<B>>,
}

/// Gemma 4's mixture beside the dense MLP, reading the same residual stream: the router its
/// RMS norm (no weight) times `router.scale * hidden^-0.5` (one norm weight), the experts it
/// normed by `pre_feedforward_layernorm_2`; the dense MLP's output normed by
/// `post_feedforward_layernorm_1` plus the mixture's normed by `post_feedforward_layernorm_2`.
pub(super) struct ExpertsBeside<B: Backend> {
    pub(super) moe: Moe<B>,
    pub(super) router_norm: B::Tensor,
    pub(super) input_norm: B::Tensor,
    /// What `input_norm` emits for the experts.
    pub(super) emits: OutType,
    pub(super) dense_out_norm: B::Tensor,
    pub(super) out_norm: B::Tensor,
}

impl<B: Backend> ExpertsBeside<B> {
    /// The MLP's output `dense` joined by the mixture's, for residual stream `x`.
    pub(super) fn forward(
        &self,
        b: &B,
        dense: B::Tensor,
        x: &B::Tensor,
        eps: f32,
    ) -> Result<B::Tensor> {
        // Summed in f32, the residual stream's type (`add_assign`).
        let mut sum = b.rms_norm(&dense, &self.dense_out_norm, eps, OutType::F32)?;
        drop(dense);
        // The router picks from f32 logits, as every router does.
        let routed = b.rms_norm(x, &self.router_norm, eps, OutType::F32)?;
        let experts_in = b.rms_norm(x, &self.input_norm, eps, self.emits)?;
        let mixed = self
            .moe
            .forward(b, &experts_in, (Some(&routed), &[]), None)?
            .ok_or_else(|| Error::backend("mixture", "no output"))?;
        drop((routed, experts_in));
        let mixed = b.rms_norm(&mixed, &self.out_norm, eps, OutType::Activation)?;
        b.add_assign(&mut sum, &mixed)?;
        Ok(sum)
    }
}

/// What a mixer's producers emit for the linears that read them (`Backend::input_type`),
/// decided once at load: the norm for the projections, attention for `o_proj`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Emits {
    pub(super) qkv: OutType,
    pub(super) attention: OutType,
}

/// A layer's projections into the attention's queries, keys and values.
pub(super) enum Projections<B: Backend> {
    /// `q_proj`, `k_proj`, `v_proj`, and the norms of q and k (`ModelConfig::qk_norm`).
    Heads {
        q: B::Linear,
        /// Keys and values, `None` where the layer reuses an earlier layer's (Gemma 4).
        kv: Option<KeyValueProjections<B>>,
        q_norm: Option<B::Tensor>,
        /// `q` gives each head's queries and then its output gate (Qwen3.5).
        output_gate: bool,
    },
    Latent(Latent<B>),
    /// A gated DeltaNet in place of attention (its `o` is `out_proj`).
    DeltaNet(DeltaNet<B>),
    /// LFM2's short convolution in place of attention (its `o` is `conv.out_proj`).
    ShortConv(ShortConv<B>),
    /// Mamba-2 in place of attention (its `o` is `out_proj`).
    Mamba(Mamba<B>),
    /// DeepSeek-V4's attention over a sliding window and compressed entries (its `o` is
    /// `o_b_proj`).
    Compressed(super::compressed::CompressedAttention<B>),
}

/// A layer's own key and value projections and the norms on their heads.
pub(super) struct KeyValueProjections<B: Backend> {
    pub(super) k: B::Linear,
    /// `None`: the values are the key projection's output (Gemma 4's `attention_k_eq_v`).
    pub(super) v: Option<B::Linear>,
    pub(super) k_norm: Option<B::Tensor>,
    /// Ones `[head_dim]`: Gemma 4's weightless RMS norm of each value head.
    pub(super) v_norm: Option<B::Tensor>,
}

/// Mamba-2 (`NemotronHMamba2Mixer`, `FalconH1Mixer`): `in_proj` gives the gate z, x/B/C for
/// the causal convolution (with its bias, then SiLU) and dt; the scan (`Recurrence::Ssd`) with
/// `A_log`, `dt_bias` and `D`; the gated norm in `groups` groups (`MambaNorm`) to `out_proj`.
pub(super) struct Mamba<B: Backend> {
    pub(super) in_proj: B::Linear,
    /// `[1, in_proj width]` factors on `in_proj`'s output (Falcon-H1's `mup_vector`).
    pub(super) in_scale: Option<B::Tensor>,
    /// `[conv_width, taps]` and the bias `[1, conv_width]` where the layer has one.
    pub(super) conv: B::Tensor,
    pub(super) conv_bias: Option<B::Tensor>,
    pub(super) a_log: B::Tensor,
    pub(super) dt_bias: B::Tensor,
    pub(super) d: B::Tensor,
    /// The gated norm's weight `[1, heads * head_dim]` (none where `MambaNorm::Ungated`).
    pub(super) norm: Option<B::Tensor>,
    pub(super) dims: MambaConfig,
}

impl<B: Backend> Mamba<B> {
    fn load(
        b: &B,
        ckpt: &Checkpoint,
        in_proj: &checkpoint::Module,
        dims: MambaConfig,
    ) -> Result<Self> {
        let block = in_proj.name.strip_suffix(".in_proj").ok_or_else(|| {
            Error::InvalidArgument(format!("{}: not a Mamba-2 in_proj", in_proj.name))
        })?;
        let name = |n: &str| format!("{block}.{n}");
        let vector = |n: &str, len: usize| -> Result<B::Tensor> {
            b.upload_vector(&name(n), &ckpt.norm(&name(n), len)?)
        };
        let shape = (dims.as_recurrence().conv_width(), dims.conv_kernel);
        let (conv, conv_bias) = conv_taps(b, ckpt, &name("conv1d"), shape, dims.conv_bias)?;
        let heads = dims.heads;
        let in_scale = match &ckpt.config.multipliers {
            Some(u) if u.ssm_parts != [1.0; 5] => {
                Some(b.upload_vector(&name("mup_vector"), &u.in_proj_scales(&dims))?)
            }
            _ => None,
        };
        Ok(Self {
            in_proj: upload(b, ckpt, in_proj)?,
            in_scale,
            conv,
            conv_bias,
            a_log: vector("A_log", heads)?,
            dt_bias: vector("dt_bias", heads)?,
            d: vector("D", heads)?,
            norm: match dims.norm {
                MambaNorm::Ungated => None,
                _ => Some(vector("norm.weight", dims.inner())?),
            },
            dims,
        })
    }

    /// The layer's normed scan `[tokens, heads * head_dim]` of normed input `xn`, in type
    /// `out` (for `out_proj`).
    pub(super) fn forward(
        &self,
        b: &B,
        xn: &B::Tensor,
        seqs: &B::Sequences,
        eps: f32,
        out: OutType,
    ) -> Result<B::Tensor> {
        let m = &self.dims;
        let net = m.as_recurrence();
        let (inner, width) = (m.inner(), net.conv_width());
        let act = OutType::Activation;
        let mut projected = b.linear(xn, &self.in_proj)?;
        if let Some(scales) = &self.in_scale {
            b.scale_columns(&mut projected, scales)?;
        }
        let z = columns(b, &projected, 0, inner)?;
        let xbc = columns(b, &projected, inner, width)?;
        let dt = columns(b, &projected, inner + width, m.heads)?;
        drop(projected);
        let conv = b.causal_conv(&xbc, &self.conv, self.conv_bias.as_ref(), true, seqs, act)?;
        drop(xbc);
        let gates = RecurrenceGates {
            a: &dt,
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
            rule: Recurrence::Ssd {
                d: &self.d,
                dt_min: m.dt_min,
                dt_max: m.dt_max,
            },
        };
        let scan = b.linear_recurrence(&conv, gates, seqs, net, act)?;
        drop((conv, dt));
        let group = inner / m.groups;
        match (&self.norm, m.norm) {
            (Some(w), MambaNorm::GateFirst) => {
                b.gated_rms_norm(&scan, &z, w, group, NormGate::SiluBefore, eps, out)
            }
            (Some(w), MambaNorm::NormFirst) => {
                b.gated_rms_norm(&scan, &z, w, group, NormGate::SiluAfter, eps, out)
            }
            _ => b.gated_act(&z, Some(&scan), GatedActivation::Silu, out),
        }
    }
}

/// LFM2's short convolution (`Lfm2ShortConv`): `in_proj` gives B, C and x side by side;
/// `C * conv(B * x)` (no activation) goes to `out_proj`.
pub(super) struct ShortConv<B: Backend> {
    pub(super) in_proj: B::Linear,
    /// `[hidden, taps]`, and the bias `[1, hidden]` where `conv_bias`.
    pub(super) conv: B::Tensor,
    pub(super) bias: Option<B::Tensor>,
}

impl<B: Backend> ShortConv<B> {
    fn load(
        b: &B,
        ckpt: &Checkpoint,
        in_proj: &checkpoint::Module,
        layer_prefix: &str,
    ) -> Result<Self> {
        let c = &ckpt.config;
        let sc = c.short_conv.ok_or_else(|| {
            Error::InvalidArgument("short-convolution modules without their config".into())
        })?;
        let module = format!("{layer_prefix}.conv.conv");
        let shape = (c.hidden_size, sc.taps);
        let (conv, bias) = conv_taps(b, ckpt, &module, shape, sc.bias)?;
        Ok(Self {
            in_proj: upload(b, ckpt, in_proj)?,
            conv,
            bias,
        })
    }

    /// The layer's `C * conv(B * x)` `[tokens, hidden]` of normed input `xn`, in type `out`
    /// (for `out_proj`).
    pub(super) fn forward(
        &self,
        b: &B,
        xn: &B::Tensor,
        seqs: &B::Sequences,
        out: OutType,
    ) -> Result<B::Tensor> {
        let bcx = b.linear(xn, &self.in_proj)?;
        let h = xn.cols();
        let act = OutType::Activation;
        let part = |k: usize| columns(b, &bcx, k * h, h);
        let (gate_in, gate_out, x) = (part(0)?, part(1)?, part(2)?);
        drop(bcx);
        let bx = b.gated_act(&gate_in, Some(&x), GatedActivation::Product, act)?;
        drop((gate_in, x));
        let mixed = b.causal_conv(&bx, &self.conv, self.bias.as_ref(), false, seqs, act)?;
        drop(bx);
        b.gated_act(&gate_out, Some(&mixed), GatedActivation::Product, out)
    }
}

/// Gated DeltaNet (the `linear_attention` layers of Qwen3.5 and Qwen3-Next; Kimi-Linear's Kimi
/// Delta Attention): projections, the causal convolution's taps, the decay's parameters (per
/// value head; Kimi's `dt_bias` per key channel too) and the gated norm of its output.
pub(super) struct DeltaNet<B: Backend> {
    pub(super) proj: DeltaProjections<B>,
    /// `[conv_width, taps]`.
    pub(super) conv: B::Tensor,
    pub(super) a_log: B::Tensor,
    pub(super) dt_bias: B::Tensor,
    /// `RMSNormGated`'s weight, `[1, v_dim]` (applied as `w`, not `1 + w`).
    pub(super) norm: B::Tensor,
    pub(super) net: DeltaNetConfig,
    /// GLM-5.3-Flash's safe gate (`ModelConfig::kda_lower_bound`).
    pub(super) lower_bound: Option<f32>,
}

/// A DeltaNet's input projections (`checkpoint::DeltaNetProjections`).
pub(super) enum DeltaProjections<B: Backend> {
    Split {
        qkv: B::Linear,
        z: B::Linear,
        b: B::Linear,
        a: B::Linear,
    },
    Fused {
        qkvz: B::Linear,
        ba: B::Linear,
    },
    /// `[q, k, v, f_a, b, g_a]` of the layer's input, then `f_b` and `g_b` of `f_a`'s and
    /// `g_a`'s outputs.
    Kimi {
        of_input: [B::Linear; 6],
        f_b: B::Linear,
        g_b: B::Linear,
    },
}

impl<B: Backend> DeltaProjections<B> {
    /// The first linear (what the layer's input norm emits for).
    pub(super) fn first(&self) -> &B::Linear {
        match self {
            Self::Split { qkv, .. } => qkv,
            Self::Fused { qkvz, .. } => qkvz,
            Self::Kimi { of_input, .. } => &of_input[0],
        }
    }
}

impl<B: Backend> DeltaNet<B> {
    fn load(
        b: &B,
        ckpt: &Checkpoint,
        modules: &checkpoint::DeltaNetProjections,
        layer_prefix: &str,
        net: DeltaNetConfig,
    ) -> Result<Self> {
        let kimi = net.layout == DeltaNetLayout::Kimi;
        let block = if kimi {
            ckpt.config.names.attn
        } else {
            "linear_attn"
        };
        let name = |n: &str| format!("{layer_prefix}.{block}.{n}");
        let vector = |n: &str, shape: &[usize]| -> Result<B::Tensor> {
            b.upload_vector(&name(n), &ckpt.floats(&name(n), shape)?)
        };
        let (kw, taps) = (net.key_width(), net.conv_kernel);
        let conv = match kimi {
            // Queries, keys and values each with their own convolution, side by side.
            true => {
                let part = |n: &str, width| ckpt.floats(&name(n), &[width, 1, taps]);
                let all = [
                    part("q_conv1d.weight", kw)?,
                    part("k_conv1d.weight", kw)?,
                    part("v_conv1d.weight", net.value_width())?,
                ]
                .concat();
                b.upload_vector(&name("conv1d.weight"), &all)?
                    .reshaped(net.conv_width(), taps)?
            }
            false => conv_taps(b, ckpt, &name("conv1d"), (net.conv_width(), taps), false)?.0,
        };
        let up = |m| upload(b, ckpt, m);
        let proj = match modules {
            checkpoint::DeltaNetProjections::Split { qkv, z, b: beta, a } => {
                DeltaProjections::Split {
                    qkv: up(qkv)?,
                    z: up(z)?,
                    b: up(beta)?,
                    a: up(a)?,
                }
            }
            checkpoint::DeltaNetProjections::Fused { qkvz, ba } => DeltaProjections::Fused {
                qkvz: up(qkvz)?,
                ba: up(ba)?,
            },
            checkpoint::DeltaNetProjections::Kimi {
                q,
                k,
                v,
                f_a,
                f_b,
                b: beta,
                g_a,
                g_b,
            } => DeltaProjections::Kimi {
                of_input: [up(q)?, up(k)?, up(v)?, up(f_a)?, up(beta)?, up(g_a)?],
                f_b: up(f_b)?,
                g_b: up(g_b)?,
            },
        };
        let hv = net.v_heads;
        // Kimi's `A_log` as the family stores it, a decay bias a key channel, `o_norm`.
        let (a_log, dt_bias, norm) = match kimi {
            true => (
                ckpt.config.kda_a_log_shape(hv),
                hv * net.k_dim,
                "o_norm.weight",
            ),
            false => (vec![hv], hv, "norm.weight"),
        };
        Ok(Self {
            proj,
            conv,
            a_log: vector("A_log", &a_log)?,
            dt_bias: vector("dt_bias", &[dt_bias])?,
            norm: vector(norm, &[net.v_dim])?,
            net,
            lower_bound: ckpt.config.kda_lower_bound,
        })
    }

    /// The convolution's input (queries, keys and values side by side), `z`, `b` and `a` of
    /// normed input `xn`; Qwen3-Next's outputs regrouped from key-head order by
    /// `assemble_columns`.
    fn project(&self, b: &B, xn: &B::Tensor) -> Result<[B::Tensor; 4]> {
        let (qkvz, ba) = match &self.proj {
            DeltaProjections::Split { qkv, z, b: beta, a } => {
                return <[_; 4]>::try_from(b.linears(xn, &[qkv, z, beta, a])?)
                    .map_err(|_| Error::backend("linears", "not four outputs"));
            }
            DeltaProjections::Kimi { of_input, f_b, g_b } => {
                let ws: Vec<&B::Linear> = of_input.iter().collect();
                let [q, k, v, f_a, beta, g_a] = <[_; 6]>::try_from(b.linears(xn, &ws)?)
                    .map_err(|_| Error::backend("linears", "not six outputs"))?;
                let (a, z) = (b.linear(&f_a, f_b)?, b.linear(&g_a, g_b)?);
                let (kw, vw) = (self.net.key_width(), self.net.value_width());
                let mixed = b.assemble_columns(
                    xn.rows(),
                    self.net.conv_width(),
                    &[
                        (&q, ColumnBlocks::single(kw, 0, 0)),
                        (&k, ColumnBlocks::single(kw, 0, kw)),
                        (&v, ColumnBlocks::single(vw, 0, 2 * kw)),
                    ],
                    OutType::Activation,
                )?;
                return Ok([mixed, z, beta, a]);
            }
            DeltaProjections::Fused { qkvz, ba } => {
                let [qkvz, ba] = <[_; 2]>::try_from(b.linears(xn, &[qkvz, ba])?)
                    .map_err(|_| Error::backend("linears", "not two outputs"))?;
                (qkvz, ba)
            }
        };
        let n = &self.net;
        let (t, kh, dk) = (xn.rows(), n.k_heads, n.k_dim);
        // Value heads (and their z, b, a) a key head serves.
        let per = n.v_heads / kh;
        let group = 2 * dk + 2 * per * n.v_dim;
        let blocks = |width, from, to, from_stride| ColumnBlocks {
            blocks: kh,
            width,
            from,
            from_stride,
            to,
            to_stride: width,
        };
        let kw = n.key_width();
        let vw = per * n.v_dim;
        let act = OutType::Activation;
        let mixed = b.assemble_columns(
            t,
            n.conv_width(),
            &[
                (&qkvz, blocks(dk, 0, 0, group)),
                (&qkvz, blocks(dk, dk, kw, group)),
                (&qkvz, blocks(vw, 2 * dk, 2 * kw, group)),
            ],
            act,
        )?;
        let z = b.assemble_columns(
            t,
            n.value_width(),
            &[(&qkvz, blocks(vw, 2 * dk + vw, 0, group))],
            act,
        )?;
        drop(qkvz);
        let beta = b.assemble_columns(t, n.v_heads, &[(&ba, blocks(per, 0, 0, 2 * per))], act)?;
        let a = b.assemble_columns(t, n.v_heads, &[(&ba, blocks(per, per, 0, 2 * per))], act)?;
        Ok([mixed, z, beta, a])
    }

    /// The layer's mixed sequence `[tokens, value width]` of normed input `xn`, in type `out`
    /// (for `out_proj`).
    pub(super) fn forward(
        &self,
        b: &B,
        xn: &B::Tensor,
        seqs: &B::Sequences,
        eps: f32,
        out: OutType,
    ) -> Result<B::Tensor> {
        let [mixed, z, beta, a] = self.project(b, xn)?;
        let conv = b.causal_conv(&mixed, &self.conv, None, true, seqs, OutType::Activation)?;
        drop(mixed);
        let kimi = self.net.layout == DeltaNetLayout::Kimi;
        let gates = RecurrenceGates {
            a: &a,
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
            rule: Recurrence::Delta {
                b: &beta,
                per_key: kimi,
                lower_bound: self.lower_bound,
            },
        };
        let core = b.linear_recurrence(&conv, gates, seqs, self.net, OutType::Activation)?;
        drop(conv);
        let how = match kimi {
            true => NormGate::SigmoidAfter,
            false => NormGate::SiluAfter,
        };
        b.gated_rms_norm(&core, &z, &self.norm, self.net.v_dim, how, eps, out)
    }
}

/// Latent attention's queries, the query latent its indexer reads, and its latent and
/// `kv_a_proj_with_mqa`'s output (`Latent::project`).
type LatentProjections<'a, B> = (
    <B as crate::backend::Device>::Tensor,
    Option<<B as crate::backend::Device>::Tensor>,
    [&'a <B as crate::backend::Device>::Tensor; 2],
);

/// Latents (normed) and unrotated key parts that later layers expand, by the layer that made
/// them (Mistral Large 4's `kv_source_layers`).
pub(super) type KeptLatents<B> = Vec<(
    usize,
    (
        <B as crate::backend::Device>::Tensor,
        <B as crate::backend::Device>::Tensor,
    ),
)>;

/// DeepSeek's multi-head latent attention, computed through the expanded heads: keys are
/// each head's unrotated part from `kv_b` beside the rotated part shared by all heads, and
/// values are zero-padded to the key width so that every attention kernel runs it as plain
/// multi-head attention (the padding is cut off its output).
pub(super) struct Latent<B: Backend> {
    /// `q_a_proj` and `q_a_layernorm` where the query is low-rank (`q` is then `q_b_proj`).
    pub(super) q_a: Option<(B::Linear, B::Tensor)>,
    pub(super) q: B::Linear,
    /// `kv_a_proj_with_mqa` and `kv_a_layernorm`, unless the layer expands an earlier layer's
    /// latent (`source`).
    pub(super) kv_a: Option<(B::Linear, B::Tensor)>,
    pub(super) source: LatentSource,
    pub(super) kv_b: B::Linear,
    pub(super) dims: MlaConfig,
    pub(super) heads: usize,
    /// What `q_a_layernorm` and `kv_a_layernorm` emit for `q` and `kv_b`.
    pub(super) emits_q: OutType,
    pub(super) emits_kv: OutType,
    /// The layer's own sparse-attention indexer (DeepSeek-V3.2, GLM-5's `full` layers).
    pub(super) indexer: Option<Indexer<B>>,
    /// `kv_b` split by head for the latent form, in models with sparse attention.
    pub(super) absorbed: Option<Absorbed<B>>,
    /// The epsilon of `q_a_layernorm` and `kv_a_layernorm`.
    pub(super) norm_eps: f32,
}

/// Latent attention in the latent space (DeepSeek's "absorbed" form): each head's key part
/// of `kv_b` moved onto its queries and its value part applied after the attention, so that
/// every query head attends to one key head, `[latent | rotated key part]`, whose values are
/// the latent. Sparse attention gathers each query's selected keys once for all its heads
/// there, at a cost that grows with the keys selected rather than with the window
/// (`Model::attend_latent`). The same scores and outputs as the expanded heads, summed in
/// another order.
pub(super) struct Absorbed<B: Backend> {
    /// Where `kv_b` quantizes its input per token (FP8-block and other W8A8 checkpoints), an
    /// identity carrying that quantization: the latent as `kv_b` reads it, which the keys and
    /// values of the latent form then are (`kv_b` itself never meets the latent there).
    input: Option<B::Linear>,
    /// Per head: its unrotated query part `[nope]` to the latent `[kv_lora_rank]` (its rows
    /// of `kv_b`'s key part, transposed).
    queries: Vec<B::Linear>,
    /// Per head: the latent to its values `[v_head_dim]` (its rows of `kv_b`'s value part).
    values: Vec<B::Linear>,
}

impl<B: Backend> Absorbed<B> {
    /// From `kv_b` (`[heads * (nope + v_head_dim), kv_lora_rank]`) as the backends dequantize
    /// it.
    fn load(b: &B, kv_b: &checkpoint::QLinear, m: &MlaConfig, heads: usize) -> Result<Self> {
        let (r, nope, v) = (m.kv_lora_rank, m.nope_dim, m.v_head_dim);
        let w = kv_b.dequantize()?;
        let linear = |name: &str, values: Vec<f32>, shape, act_quant| {
            upload_dense(b, name, &values, shape, (act_quant, kv_b.model_dtype))
        };
        let dense = |name: &str, values, out, inp| linear(name, values, (out, inp), None);
        let input = match kv_b.act_quant {
            Some(quant) => {
                let eye = (0..r * r).map(|i| f32::from(i % (r + 1) == 0)).collect();
                let name = format!("{}'s input quantization", kv_b.name);
                Some(linear(&name, eye, (r, r), Some(quant))?)
            }
            None => None,
        };
        let (mut queries, mut values) = (Vec::with_capacity(heads), Vec::with_capacity(heads));
        for h in 0..heads {
            let row = |i: usize| &w[(h * (nope + v) + i) * r..][..r];
            let keys: Vec<f32> = (0..r)
                .flat_map(|o| (0..nope).map(move |i| (o, i)))
                .map(|(o, i)| row(i)[o])
                .collect();
            queries.push(dense(
                &format!("{} key part of head {h}", kv_b.name),
                keys,
                r,
                nope,
            )?);
            let vals: Vec<f32> = (0..v).flat_map(|j| row(nope + j).iter().copied()).collect();
            values.push(dense(
                &format!("{} value part of head {h}", kv_b.name),
                vals,
                v,
                r,
            )?);
        }
        Ok(Self {
            input,
            queries,
            values,
        })
    }

    /// The latent as the latent form's keys and values hold it where that is not the latent
    /// itself: as `kv_b` would read it, quantized.
    pub(super) fn quantized(&self, b: &B, latent: &B::Tensor) -> Result<Option<B::Tensor>> {
        self.input
            .as_ref()
            .map(|id| b.linear(latent, id))
            .transpose()
    }

    /// Queries `[tokens, heads * qk_head_dim]` (rotated) in the latent space: `[tokens, heads
    /// * (kv_lora_rank + rope_dim)]`, each head's unrotated part taken through its key part of
    /// `kv_b`, its rotated part beside.
    pub(super) fn queries(&self, b: &B, q: &B::Tensor, m: &MlaConfig) -> Result<B::Tensor> {
        let (t, h, d) = (q.rows(), self.queries.len(), m.qk_head_dim());
        let (r, width) = (m.kv_lora_rank, m.kv_lora_rank + m.rope_dim);
        let mut parts = Vec::with_capacity(h);
        for (i, w) in self.queries.iter().enumerate() {
            let part = ColumnBlocks::single(m.nope_dim, i * d, 0);
            let head = b.assemble_columns(t, m.nope_dim, &[(q, part)], b.input_type(w))?;
            parts.push(b.linear(&head, w)?);
        }
        let rotated = ColumnBlocks {
            blocks: h,
            width: m.rope_dim,
            from: m.nope_dim,
            from_stride: d,
            to: r,
            to_stride: width,
        };
        let mut pieces: Vec<(&B::Tensor, ColumnBlocks)> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| (p, ColumnBlocks::single(r, 0, i * width)))
            .collect();
        if m.rope_dim > 0 {
            pieces.push((q, rotated));
        }
        b.assemble_columns(t, h * width, &pieces, OutType::Activation)
    }

    /// The attention's output in the latent space `[tokens, heads * kv_lora_rank]` through
    /// each head's value part of `kv_b`: `[tokens, heads * v_head_dim]` in type `out`.
    pub(super) fn values(
        &self,
        b: &B,
        attn: &B::Tensor,
        r: usize,
        out: OutType,
    ) -> Result<B::Tensor> {
        linear_per_block(b, attn, (&self.values, r), out)
    }
}

/// `x`'s consecutive column blocks of `width`, one a linear of `ws`, each through its linear,
/// their outputs side by side in type `out`: latent attention's per-head value parts,
/// DeepSeek-V4's grouped output projection.
pub(super) fn linear_per_block<B: Backend>(
    b: &B,
    x: &B::Tensor,
    (ws, width): (&[B::Linear], usize),
    out: OutType,
) -> Result<B::Tensor> {
    let t = x.rows();
    if ws.len() * width != x.cols() {
        return Err(Error::backend(
            "linears by block",
            format!("{} columns for {} blocks of {width}", x.cols(), ws.len()),
        ));
    }
    let mut parts = Vec::with_capacity(ws.len());
    for (i, w) in ws.iter().enumerate() {
        let cols = [(x, ColumnBlocks::single(width, i * width, 0))];
        let block = b.assemble_columns(t, width, &cols, b.input_type(w))?;
        parts.push(b.linear(&block, w)?);
    }
    let mut to = 0;
    let mut pieces = Vec::with_capacity(parts.len());
    for p in &parts {
        pieces.push((p, ColumnBlocks::single(p.cols(), 0, to)));
        to += p.cols();
    }
    b.assemble_columns(t, to, &pieces, out)
}

/// DeepSeek sparse attention's lightning indexer (`IndexerConfig`): which keys each query of
/// a batch attends to.
pub(super) struct Indexer<B: Backend> {
    wq_b: B::Linear,
    wk: B::Linear,
    weights_proj: B::Linear,
    /// `k_norm`'s LayerNorm weight and bias.
    k_norm: (B::Tensor, B::Tensor),
    spec: IndexSpec,
    /// The values of its query and key heads RoPE rotates: the first `qk_rope_head_dim`
    /// (none in Mistral Large 4's layers without RoPE).
    span: Option<RotarySpan>,
    /// Mistral Large 4: its queries from the layer's input.
    from_input: Option<InputQuery<B>>,
    /// GLM-5.3-Flash: its keys scored in pools.
    pools: Option<KeyPooling<B>>,
}

/// GLM-5.3-Flash's pools (`KeyPools`): each pool's key the softmax over its tokens of
/// `index_kpool_compress_gate` of the layer's input (`gate`, `[head_dim, hidden]`, kept in
/// f32) plus `index_kpool_compress_ape` (`slots`, `[size, head_dim]`) weighing their keys.
struct KeyPooling<B: Backend> {
    gate: B::Linear,
    slots: B::Tensor,
    pools: KeyPools,
}

/// Mistral Large 4's indexer queries: `q_input_norm`'s LayerNorm (weight and bias) on the
/// layer's input before `wq_b`, then the query heads scaled by position.
struct InputQuery<B: Backend> {
    norm: (B::Tensor, B::Tensor),
    scaling: QueryScaling<B>,
}

impl<B: Backend> Indexer<B> {
    fn load(
        b: &B,
        ckpt: &Checkpoint,
        m: &checkpoint::IndexerModules,
        c: &checkpoint::IndexerConfig,
        rope_dim: usize,
    ) -> Result<Self> {
        let d = c.head_dim;
        let layer_norm = |name: &str, n| -> Result<(B::Tensor, B::Tensor)> {
            let vector = |part: &str| -> Result<B::Tensor> {
                let name = format!("{name}.{part}");
                b.upload_vector(&name, &ckpt.norm(&name, n)?)
            };
            Ok((vector("weight")?, vector("bias")?))
        };
        let from_input = match &m.q_norm {
            Some(q_norm) => {
                let at = q_norm.strip_suffix(".q_input_norm").unwrap_or(q_norm);
                Some(InputQuery {
                    norm: layer_norm(q_norm, ckpt.config.hidden_size)?,
                    scaling: QueryScaling::load(
                        b,
                        ckpt,
                        &format!("{at}.softmax_scaling"),
                        c.heads,
                        d,
                    )?,
                })
            }
            None => None,
        };
        let pools = match c.pools {
            Some(pools) => {
                let at = m.wq_b.name.strip_suffix(".wq_b").unwrap_or(&m.wq_b.name);
                let (gate, slots) = (
                    format!("{at}.index_kpool_compress_gate"),
                    format!("{at}.index_kpool_compress_ape"),
                );
                let hidden = ckpt.config.hidden_size;
                let values = ckpt.floats(&gate, &[d, hidden])?;
                let f32_weights = (None, crate::numerics::FloatType::F32);
                Some(KeyPooling {
                    gate: upload_dense(b, &gate, &values, (d, hidden), f32_weights)?,
                    slots: b
                        .upload_vector(&slots, &ckpt.floats(&slots, &[pools.size, d])?)?
                        .reshaped(pools.size, d)?,
                    pools,
                })
            }
            None => None,
        };
        Ok(Self {
            wq_b: upload(b, ckpt, &m.wq_b)?,
            wk: upload(b, ckpt, &m.wk)?,
            weights_proj: upload(b, ckpt, &m.weights_proj)?,
            k_norm: layer_norm(&m.k_norm, d)?,
            spec: IndexSpec {
                heads: c.heads,
                head_dim: d,
                top_k: c.top_k,
                scale: (1.0 / (d as f64).sqrt()) as f32,
                weight_scale: (1.0 / (c.heads as f64).sqrt()) as f32,
                rate: 1,
            },
            span: (rope_dim > 0).then(|| RotarySpan {
                interleaved: c.rope_interleave,
                ..RotarySpan::leading(d, rope_dim)
            }),
            from_input,
            pools,
        })
    }

    /// The keys each query attends to (`Backend::index_top_k`; GLM-5.3-Flash's pools through
    /// `Backend::compressed_keys`) from the layer's normed input `xn` and its query latent
    /// `low` (`q_a_layernorm`'s output; Mistral Large 4 reads `xn` there), RoPE from `tables`,
    /// the queries' scaling by position from `log_positions`.
    pub(super) fn select(
        &self,
        b: &B,
        (xn, low): (&B::Tensor, Option<&B::Tensor>),
        seqs: (&B::Sequences, &B::Sequences, &SeqLayout),
        (cos, sin): (&B::Tensor, &B::Tensor),
        log_positions: Option<&LogPositions<B>>,
    ) -> Result<B::Tensor> {
        let (seqs, rope_seqs, layout) = seqs;
        // transformers' LayerNorm default epsilon.
        let eps = 1e-6;
        let mut q = match (&self.from_input, low) {
            (
                Some(InputQuery {
                    norm: (w, bias),
                    scaling,
                }),
                _,
            ) => {
                let input = b.layer_norm(xn, w, bias, eps, b.input_type(&self.wq_b))?;
                let q = b.linear(&input, &self.wq_b)?;
                drop(input);
                scaling.apply(b, q, rope_seqs, log_positions)?
            }
            (None, Some(low)) => b.linear(low, &self.wq_b)?,
            (None, None) => {
                return Err(Error::InvalidArgument(
                    "a sparse-attention indexer without its query latent".into(),
                ));
            }
        };
        let k = b.linear(xn, &self.wk)?;
        let (w, bias) = &self.k_norm;
        let mut k = b.layer_norm(&k, w, bias, eps, OutType::Activation)?;
        if let Some(span) = self.span {
            b.rope(&mut q, rope_seqs, cos, sin, span)?;
            b.rope(&mut k, rope_seqs, cos, sin, span)?;
        }
        let weights = b.linear(xn, &self.weights_proj)?;
        let Some(p) = &self.pools else {
            return b.index_top_k(&q, &k, &weights, seqs, self.spec);
        };
        let gate = b.linear(xn, &p.gate)?;
        let keys = b.pool_windows(&k, &gate, &p.slots, seqs, (p.pools.size, false))?;
        drop((k, gate));
        let spec = IndexSpec {
            top_k: self.spec.top_k / p.pools.size,
            rate: p.pools.size,
            ..self.spec
        };
        let picks = b.index_top_k(&q, &keys, &weights, seqs, spec)?;
        let pooled = EntryKeys::Pools {
            picks: &picks,
            pools: p.pools,
        };
        b.compressed_keys((seqs, layout), 0, pooled)
    }
}

/// Mistral Large 4's softmax scaling (`MistralLarge4TextSoftmaxScaling`): each query head `h`
/// at position `pos` times `scale_h * ln(pos + 1) + bias_h`, computed as
/// `bias * q + scale * (ln(pos + 1) * q)`: the second term through a rotation by angle 0
/// whose cos is `ln(pos + 1)` (`LogPositions`), then a column scaling each, and their sum.
pub(super) struct QueryScaling<B: Backend> {
    /// `[1, heads * head_dim]`: each head's factor over its values.
    scale: B::Tensor,
    bias: B::Tensor,
    head_dim: usize,
}

impl<B: Backend> QueryScaling<B> {
    /// `{module}.scale` and `{module}.bias` (`[heads]` each).
    pub(super) fn load(
        b: &B,
        ckpt: &Checkpoint,
        module: &str,
        heads: usize,
        head_dim: usize,
    ) -> Result<Self> {
        let per_value = |part: &str| -> Result<B::Tensor> {
            let name = format!("{module}.{part}");
            let per_head = ckpt.norm(&name, heads)?;
            let values: Vec<f32> = per_head
                .iter()
                .flat_map(|&v| std::iter::repeat_n(v, head_dim))
                .collect();
            b.upload_vector(&name, &values)
        };
        Ok(Self {
            scale: per_value("scale")?,
            bias: per_value("bias")?,
            head_dim,
        })
    }

    /// `q` `[tokens, heads * head_dim]` scaled, positions from `seqs`.
    pub(super) fn apply(
        &self,
        b: &B,
        q: B::Tensor,
        seqs: &B::Sequences,
        log_positions: Option<&LogPositions<B>>,
    ) -> Result<B::Tensor> {
        let (cos, sin) = log_positions
            .and_then(|l| l.of(self.head_dim))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "no ln(pos + 1) table for query heads of {}",
                    self.head_dim
                ))
            })?;
        let (t, cols) = (q.rows(), q.cols());
        let whole = ColumnBlocks::single(cols, 0, 0);
        let mut by_position = b.assemble_columns(t, cols, &[(&q, whole)], OutType::Activation)?;
        let span = RotarySpan::leading(self.head_dim, self.head_dim);
        b.rope(&mut by_position, seqs, cos, sin, span)?;
        b.scale_columns(&mut by_position, &self.scale)?;
        // Summed in f32, the type `add_assign` adds into, then rounded once.
        let mut sum = b.assemble_columns(t, cols, &[(&q, whole)], OutType::F32)?;
        drop(q);
        b.scale_columns(&mut sum, &self.bias)?;
        b.add_assign(&mut sum, &by_position)?;
        b.assemble_columns(t, cols, &[(&sum, whole)], OutType::Activation)
    }
}

/// Tables `[positions, head_dim / 2]` of a rotation by angle 0 whose cos is `ln(pos + 1)`, one
/// per query head width that `QueryScaling` scales (Mistral Large 4's attention and indexer).
pub(super) struct LogPositions<B: Backend> {
    tables: Vec<(usize, B::Tensor, B::Tensor)>,
}

impl<B: Backend> LogPositions<B> {
    pub(super) fn load(b: &B, head_dims: &[usize], positions: usize) -> Result<Self> {
        let mut tables = Vec::new();
        for &d in head_dims {
            if tables.iter().any(|(w, _, _)| *w == d) {
                continue;
            }
            let pairs = d / 2;
            // torch: `(position_ids + 1).float().log()`, in f32.
            let cos: Vec<f32> = (0..positions)
                .flat_map(|p| std::iter::repeat_n(((p + 1) as f32).ln(), pairs))
                .collect();
            let sin = vec![0.0; positions * pairs];
            tables.push((
                d,
                b.upload_vector("log_position_cos", &cos)?,
                b.upload_vector("log_position_sin", &sin)?,
            ));
        }
        Ok(Self { tables })
    }

    fn of(&self, head_dim: usize) -> Option<(&B::Tensor, &B::Tensor)> {
        self.tables
            .iter()
            .find(|(d, _, _)| *d == head_dim)
            .map(|(_, cos, sin)| (cos, sin))
    }
}

impl<B: Backend> Latent<B> {
    /// Queries `[tokens, heads * qk_head_dim]` (before RoPE), where the layer has an indexer
    /// the query latent it reads, and the latent (normed) and `kv_a_proj_with_mqa`'s output
    /// (its last `rope_dim` values the unrotated key part): the layer's own, kept in `latents`
    /// for later layers where it stores them (else in `own`), or a kept one it reuses.
    pub(super) fn project<'a>(
        &self,
        b: &B,
        xn: &B::Tensor,
        (layer, latents): (usize, &'a mut KeptLatents<B>),
        own: &'a mut Option<(B::Tensor, B::Tensor)>,
    ) -> Result<LatentProjections<'a, B>> {
        let eps = self.norm_eps;
        let (q, low) = match &self.q_a {
            Some((a, norm)) => {
                let low = b.linear(xn, a)?;
                let low = b.rms_norm(&low, norm, eps, self.emits_q)?;
                let q = b.linear(&low, &self.q)?;
                (q, self.indexer.is_some().then_some(low))
            }
            None => (b.linear(xn, &self.q)?, None),
        };
        let m = &self.dims;
        let t = xn.rows();
        let (latent, compressed) = match (&self.kv_a, self.source) {
            (Some((kv_a, norm)), source) => {
                let compressed = b.linear(xn, kv_a)?;
                let latent = b.assemble_columns(
                    t,
                    m.kv_lora_rank,
                    &[(&compressed, ColumnBlocks::single(m.kv_lora_rank, 0, 0))],
                    OutType::Activation,
                )?;
                let latent = b.rms_norm(&latent, norm, eps, self.emits_kv)?;
                if source == LatentSource::Stores {
                    latents.push((layer, (latent, compressed)));
                    let (_, (latent, compressed)) = &latents[latents.len() - 1];
                    (latent, compressed)
                } else {
                    let (latent, compressed) = own.insert((latent, compressed));
                    (&*latent, &*compressed)
                }
            }
            (None, LatentSource::Reuses(source)) => {
                let kept = latents.iter().find(|(l, _)| *l == source);
                let (_, (latent, compressed)) = kept.ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "layer {layer} expands the latent keys and values of layer {source}, \
                         which this model part did not compute: split the layers elsewhere"
                    ))
                })?;
                (latent, compressed)
            }
            (None, _) => {
                return Err(Error::InvalidArgument(format!(
                    "layer {layer} has no kv_a_proj_with_mqa"
                )));
            }
        };
        Ok((q, low, [latent, compressed]))
    }

    /// The latent form's one key head `[tokens, kv_lora_rank + rope_dim]`: the latent (as
    /// `Absorbed::quantized` gives it) beside the unrotated key part of `compressed`
    /// (`kv_a_proj_with_mqa`'s output), for `Model::attend_latent`.
    pub(super) fn latent_key(
        &self,
        b: &B,
        latent: &B::Tensor,
        compressed: &B::Tensor,
    ) -> Result<B::Tensor> {
        let m = &self.dims;
        let r = m.kv_lora_rank;
        let parts = [
            (latent, ColumnBlocks::single(r, 0, 0)),
            (compressed, ColumnBlocks::single(m.rope_dim, r, r)),
        ];
        // A layer without RoPE (Mistral Large 4) has no rotated part.
        let parts = &parts[..if m.rope_dim > 0 { 2 } else { 1 }];
        b.assemble_columns(latent.rows(), r + m.rope_dim, parts, OutType::Activation)
    }

    /// Keys `[tokens, heads * qk_head_dim]` (before RoPE) and values padded to the same width
    /// from the latent (normed) and `compressed` (`kv_a_proj_with_mqa`'s output, its last
    /// `rope_dim` values the unrotated key part shared by every head).
    pub(super) fn expanded_kv(
        &self,
        b: &B,
        latent: &B::Tensor,
        compressed: &B::Tensor,
    ) -> Result<[B::Tensor; 2]> {
        let m = &self.dims;
        let (t, h, d) = (latent.rows(), self.heads, m.qk_head_dim());
        // [latent | rotated key part]: the latent normed and expanded per head.
        let kv = b.linear(latent, &self.kv_b)?;
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
        let nope = (&kv, per_head(m.nope_dim, 0, 0));
        let parts = [nope, (compressed, shared_rotated)];
        // A layer without RoPE (Mistral Large 4) has no shared rotated part.
        let parts = if m.rope_dim > 0 {
            &parts[..]
        } else {
            &parts[..1]
        };
        let k = b.assemble_columns(t, h * d, parts, OutType::Activation)?;
        let v = b.assemble_columns(
            t,
            h * d,
            &[(&kv, per_head(m.v_head_dim, m.nope_dim, 0))],
            OutType::Activation,
        )?;
        Ok([k, v])
    }
}

impl<B: Backend> Projections<B> {
    pub(super) fn load(
        b: &B,
        ckpt: &Checkpoint,
        modules: &AttnProjections,
        (layer, layer_prefix): (usize, &str),
        norm_vec: &dyn Fn(&str, usize) -> Result<B::Tensor>,
    ) -> Result<Self> {
        let c = &ckpt.config;
        let attn_norm =
            |name: &str, n| norm_vec(&format!("{layer_prefix}.{}.{name}.weight", c.names.attn), n);
        Ok(match (modules, &c.latent_dims(layer)) {
            (AttnProjections::Heads { q, k, v }, _) => {
                let shape = c.heads_of(layer);
                let d = shape.head_dim;
                let (q_width, kv_width) = match c.qk_norm {
                    Some(QkNorm::Projection) => (c.num_heads * d, shape.kv_heads * d),
                    _ => (d, d),
                };
                // Llama 4's weightless norms, in the layers that rotate only.
                let qk_norm = |name: &str, width| match c.qk_norm {
                    Some(QkNorm::Weightless) if c.uses_rope(layer) => b
                        .upload_vector(&format!("{layer_prefix}.{name}"), &vec![1.0; width])
                        .map(Some),
                    Some(QkNorm::Weightless) | None => Ok(None),
                    Some(_) => attn_norm(name, width).map(Some),
                };
                let kv = match k {
                    Some(k) => Some(KeyValueProjections {
                        k: upload(b, ckpt, k)?,
                        v: v.as_ref().map(|v| upload(b, ckpt, v)).transpose()?,
                        k_norm: qk_norm(c.names.k_norm, kv_width)?,
                        v_norm: c
                            .gemma4
                            .as_ref()
                            .map(|_| {
                                b.upload_vector(&format!("{layer_prefix}.v_norm"), &vec![1.0; d])
                            })
                            .transpose()?,
                    }),
                    None => None,
                };
                Self::Heads {
                    q: upload(b, ckpt, q)?,
                    kv,
                    q_norm: qk_norm(c.names.q_norm, q_width)?,
                    output_gate: c.attn_output_gate,
                }
            }
            (AttnProjections::DeltaNet(modules), _) => {
                let net = c.delta_net.ok_or_else(|| {
                    Error::InvalidArgument("DeltaNet modules without a DeltaNet config".into())
                })?;
                Self::DeltaNet(DeltaNet::load(b, ckpt, modules, layer_prefix, net)?)
            }
            (AttnProjections::ShortConv { in_proj }, _) => {
                Self::ShortConv(ShortConv::load(b, ckpt, in_proj, layer_prefix)?)
            }
            (AttnProjections::Mamba { in_proj }, _) => {
                let dims = c.mamba.ok_or_else(|| {
                    Error::InvalidArgument("Mamba-2 modules without their config".into())
                })?;
                Self::Mamba(Mamba::load(b, ckpt, in_proj, dims)?)
            }
            (
                AttnProjections::Latent {
                    q_a,
                    q,
                    kv_a,
                    kv_b,
                    indexer,
                },
                Some(m),
            ) => {
                let indexer = match (indexer, &c.indexer) {
                    (Some(modules), Some(ix)) => {
                        Some(Indexer::load(b, ckpt, modules, ix, m.rope_dim)?)
                    }
                    _ => None,
                };
                let q_a = match (q_a, m.q_lora_rank) {
                    (Some(a), Some(r)) => {
                        Some((upload(b, ckpt, a)?, attn_norm("q_a_layernorm", r)?))
                    }
                    _ => None,
                };
                let q = upload(b, ckpt, q)?;
                let kv_a = match kv_a {
                    Some(kv_a) => Some((
                        upload(b, ckpt, kv_a)?,
                        attn_norm("kv_a_layernorm", m.kv_lora_rank)?,
                    )),
                    None => None,
                };
                let kv_b_weights = ckpt.linear_checked(kv_b)?;
                let absorbed = match &c.indexer {
                    Some(_) => Some(Absorbed::load(b, &kv_b_weights, m, c.num_heads)?),
                    None => None,
                };
                let kv_b = b.upload_linear(&kv_b_weights)?;
                Self::Latent(Latent {
                    absorbed,
                    emits_q: b.input_type(&q),
                    emits_kv: b.input_type(&kv_b),
                    q_a,
                    q,
                    kv_a,
                    source: c.latent_source(layer),
                    kv_b,
                    dims: *m,
                    heads: c.num_heads,
                    indexer,
                    norm_eps: c.latent_norm_eps() as f32,
                })
            }
            (AttnProjections::Latent { .. }, None) => {
                return Err(Error::InvalidArgument(
                    "latent attention modules without an MLA config".into(),
                ));
            }
            (modules @ AttnProjections::Compressed { .. }, _) => {
                Self::Compressed(super::compressed::CompressedAttention::load(
                    b,
                    ckpt,
                    modules,
                    (layer, layer_prefix),
                )?)
            }
        })
    }

    /// The type the projections want their input in.
    pub(super) fn input_type(&self, b: &B) -> OutType {
        match self {
            Self::Heads { q, .. } => b.input_type(q),
            Self::Latent(l) => b.input_type(l.q_a.as_ref().map_or(&l.q, |(a, _)| a)),
            Self::DeltaNet(n) => b.input_type(n.proj.first()),
            Self::ShortConv(s) => b.input_type(&s.in_proj),
            Self::Mamba(m) => b.input_type(&m.in_proj),
            Self::Compressed(a) => a.input_type(b),
        }
    }

    /// Queries, keys and values of normed input `xn` `[tokens, hidden]`, before the per-head
    /// q/k norms (`qk_norms`) and RoPE, and the attention's output gate where it has one; a
    /// layer that reuses an earlier layer's keys and values has only queries (`Queries`).
    pub(super) fn qkv(&self, b: &B, xn: &B::Tensor, c: &ModelConfig) -> Result<Projected<B>> {
        match self {
            Self::Heads {
                q,
                kv: None,
                output_gate: false,
                ..
            } => Ok(Projected::Queries(b.linear(xn, q)?)),
            Self::Heads {
                q,
                kv: Some(kv),
                output_gate,
                ..
            } => {
                let (q, k, v) = match &kv.v {
                    Some(v) => {
                        let [q, k, v] = <[_; 3]>::try_from(b.linears(xn, &[q, &kv.k, v])?)
                            .map_err(|_| Error::backend("linears", "not three outputs"))?;
                        (q, k, v)
                    }
                    // The values: the keys' projection, normed apart from them.
                    None => {
                        let [q, k] = <[_; 2]>::try_from(b.linears(xn, &[q, &kv.k])?)
                            .map_err(|_| Error::backend("linears", "not two outputs"))?;
                        let v = columns(b, &k, 0, k.cols())?;
                        (q, k, v)
                    }
                };
                if !output_gate {
                    return Ok(Projected::All(([q, k, v], None)));
                }
                // Each head's 2d outputs: its queries, then its gate.
                let (h, d) = (c.num_heads, c.head_dim);
                let half = |from| {
                    let heads = ColumnBlocks {
                        blocks: h,
                        width: d,
                        from,
                        from_stride: 2 * d,
                        to: 0,
                        to_stride: d,
                    };
                    b.assemble_columns(q.rows(), h * d, &[(&q, heads)], OutType::Activation)
                };
                Ok(Projected::All(([half(0)?, k, v], Some(half(d)?))))
            }
            Self::Heads { kv: None, .. } => Err(Error::backend(
                "attention",
                "an output gate on a layer reusing keys and values",
            )),
            // `Model::mix` computes latent attention's own way (`Latent::qkv`).
            Self::Latent(_) => Err(Error::backend(
                "attention",
                "latent attention's projections come from Latent::qkv",
            )),
            Self::DeltaNet(_) | Self::ShortConv(_) | Self::Mamba(_) => Err(Error::backend(
                "attention",
                "a recurrent layer has no heads",
            )),
            Self::Compressed(_) => Err(Error::backend(
                "attention",
                "DeepSeek-V4's attention projects in CompressedAttention::forward",
            )),
        }
    }

    /// Qwen3's and Gemma's norms of each query and key head (applied before RoPE), and Gemma
    /// 4's weightless one of each value head.
    pub(super) fn head_norms(&self) -> HeadNorms<'_, B> {
        match self {
            Self::Heads { q_norm, kv, .. } => HeadNorms {
                q: q_norm.as_ref(),
                k: kv.as_ref().and_then(|kv| kv.k_norm.as_ref()),
                v: kv.as_ref().and_then(|kv| kv.v_norm.as_ref()),
            },
            Self::Latent(_)
            | Self::DeltaNet(_)
            | Self::ShortConv(_)
            | Self::Mamba(_)
            | Self::Compressed(_) => HeadNorms {
                q: None,
                k: None,
                v: None,
            },
        }
    }
}

/// The norm weights of a layer's query, key and value heads, where it has them.
pub(super) struct HeadNorms<'a, B: Backend> {
    pub(super) q: Option<&'a B::Tensor>,
    pub(super) k: Option<&'a B::Tensor>,
    pub(super) v: Option<&'a B::Tensor>,
}

/// What a layer's projections give: queries, keys and values (`Qkv`), or queries alone where
/// the layer attends to an earlier layer's keys and values.
pub(super) enum Projected<B: Backend> {
    All(Qkv<B>),
    Queries(B::Tensor),
}

/// Queries, keys and values, and beside them the attention's output gate where it has one
/// (`Projections::qkv`), or the query latent its sparse-attention indexer reads
/// (`Latent::qkv`).
pub(super) type Qkv<B> = (
    [<B as crate::backend::Device>::Tensor; 3],
    Option<<B as crate::backend::Device>::Tensor>,
);

/// A gated MLP's linears and its activation (`up` is `None` where `gate` holds gate and up
/// interleaved: gpt-oss).
pub(super) struct Mlp<B: Backend> {
    pub(super) gate: B::Linear,
    pub(super) up: Option<B::Linear>,
    pub(super) down: B::Linear,
    pub(super) act: GatedActivation,
    /// The widest of gate's and up's outputs: a row's intermediate values.
    width: usize,
}

impl<B: Backend> Mlp<B> {
    pub(super) fn load(b: &B, ckpt: &Checkpoint, m: &checkpoint::Mlp) -> Result<Self> {
        Ok(Self {
            gate: upload(b, ckpt, &m.gate)?,
            up: m.up.as_ref().map(|up| upload(b, ckpt, up)).transpose()?,
            down: upload(b, ckpt, &m.down)?,
            act: ckpt.config.mlp_activation,
            width: m
                .up
                .as_ref()
                .map_or(0, |u| u.out_features)
                .max(m.gate.out_features),
        })
    }

    /// The rows of a batch whose intermediate values fit the device's largest buffer, where it
    /// has one: more rows run in blocks of this many. A row takes 4 bytes a value (f32, or
    /// wgpu's two f16 planes, padded to 8 values) and a word (the planes' exponent).
    fn rows_per_block<D: crate::backend::Device + ?Sized>(&self, b: &D, rows: usize) -> usize {
        let row_bytes = 4 * (self.width.max(1).next_multiple_of(8) + 1) as u64;
        b.max_buffer_bytes()
            .map_or(rows, |max| (max / row_bytes) as usize)
            .clamp(1, rows.max(1))
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
    /// A factor per expert on its routing weights (Gemma 4's `router.per_expert_scale`; empty
    /// where the family has none).
    pub(super) expert_scale: Vec<f32>,
    /// The routing weights scale the experts' inputs (Llama 4).
    pub(super) weights_on_input: bool,
    /// Each token's experts, `[vocab, experts_per_token]` (DeepSeek-V4's hash-routed layers).
    pub(super) token_experts: Option<Vec<u32>>,
}

impl<B: Backend> Moe<B> {
    /// `sum_i w_i expert_i(x)` over each token's routed experts, plus the shared expert
    /// (`Backend::mixture`: each expert runs once over the rows routed to it, its output
    /// scaled and added into an f32 accumulator in expert order, as transformers' loop does),
    /// returned, or added into `residual` where the backend can (`Backend::mixture_into`).
    /// `router_input`: what the router reads where it is not `x` (Gemma 4); `ids` the rows'
    /// tokens (which choose the experts of a hash-routed layer).
    pub(super) fn forward(
        &self,
        b: &B,
        x: &B::Tensor,
        (router_input, ids): (Option<&B::Tensor>, &[u32]),
        residual: Option<&mut B::Tensor>,
    ) -> Result<Option<B::Tensor>> {
        let t = x.rows();
        let k = self.experts_per_token;
        let fixed: Vec<u32> = match &self.token_experts {
            Some(table) => {
                if ids.len() != t {
                    return Err(Error::InvalidArgument(format!(
                        "hash-routed experts for {t} rows given {} tokens",
                        ids.len()
                    )));
                }
                let vocab = table.len() / k.max(1);
                let mut fixed = Vec::with_capacity(t * k);
                for &id in ids {
                    let row = table
                        .get(id as usize * k..(id as usize + 1) * k)
                        .ok_or_else(|| {
                            Error::InvalidArgument(format!(
                                "token {id} past the {vocab} rows of the hash router's tid2eid"
                            ))
                        })?;
                    fixed.extend_from_slice(row);
                }
                fixed
            }
            None => Vec::new(),
        };
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
            expert_scale: &self.expert_scale,
            weights_on_input: self.weights_on_input,
            fixed: &fixed,
        };
        let routed = router_input.unwrap_or(x);
        let (uploaded, lens) = b.route(routed, &self.router, &rule, shared_weights.as_deref())?;
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

impl<B: Backend> Moe<B> {
    /// The type the mixture wants its input in (`Ffn::input_type`).
    pub(super) fn input_type(&self, b: &B) -> OutType {
        let mlps = self.experts.iter().chain(&self.shared);
        let reading = mlps.flat_map(|e| std::iter::once(&e.gate).chain(&e.up));
        let mut inputs = reading.chain(&self.shared_gate).map(|w| b.input_type(w));
        if inputs.all(|t| t == OutType::Activation) {
            OutType::ExactForRouter
        } else {
            OutType::F32
        }
    }

    pub(super) fn load(b: &B, ckpt: &Checkpoint, s: &checkpoint::SparseMlp) -> Result<Self> {
        let moe = ckpt
            .config
            .moe
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("a sparse layer in a dense config".into()))?;
        let (shared, shared_gate) = match &s.shared {
            None => (None, None),
            Some((m, gate)) => (
                Some(Mlp::load(b, ckpt, m)?),
                gate.as_ref().map(|g| upload(b, ckpt, g)).transpose()?,
            ),
        };
        Ok(Self {
            router: upload(b, ckpt, &s.router)?,
            experts: s
                .experts
                .iter()
                .map(|m| Mlp::load(b, ckpt, m))
                .collect::<Result<_>>()?,
            shared,
            shared_gate,
            experts_per_token: moe.experts_per_token,
            weights_on_input: moe.weights_on_input,
            routing: moe.router,
            score_bias: match &s.score_bias {
                Some(name) => ckpt.norm(name, moe.num_experts)?,
                None => vec![0.0; moe.num_experts],
            },
            token_experts: match &s.token_experts {
                Some(name) => {
                    let k = moe.experts_per_token;
                    let ids = ckpt.integers(name, &[ckpt.config.vocab_size, k])?;
                    let experts = moe.num_experts as i64;
                    if let Some(bad) = ids.iter().find(|&&e| !(0..experts).contains(&e)) {
                        return Err(Error::InvalidArgument(format!(
                            "{name}: expert {bad} of {experts}"
                        )));
                    }
                    Some(ids.into_iter().map(|e| e as u32).collect())
                }
                None => None,
            },
            expert_scale: match moe.naming {
                ExpertNaming::Gemma4 => {
                    let name = format!(
                        "{}.per_expert_scale",
                        s.router.name.trim_end_matches(".proj")
                    );
                    ckpt.norm(&name, moe.num_experts)?
                }
                _ => Vec::new(),
            },
        })
    }
}

/// A layer's MLP: dense, or a mixture of experts.
pub(super) enum Ffn<B: Backend> {
    Dense {
        mlp: Mlp<B>,
        /// `[1, width]` factors on the gate projection's output, before the activation
        /// (Falcon-H1's first `mlp_multipliers`).
        gate_scale: Option<B::Tensor>,
    },
    Moe(Moe<B>),
}

impl<B: Backend> Ffn<B> {
    pub(super) fn load(b: &B, ckpt: &Checkpoint, f: &FeedForward) -> Result<Self> {
        Ok(match f {
            FeedForward::Dense(m) => {
                let gate = ckpt.config.multipliers.map_or(1.0, |u| u.mlp_gate);
                let gate_scale = (gate != 1.0)
                    .then(|| b.upload_vector(&m.gate.name, &vec![gate; m.gate.out_features]))
                    .transpose()?;
                Self::Dense {
                    mlp: Mlp::load(b, ckpt, m)?,
                    gate_scale,
                }
            }
            FeedForward::Sparse(s) => Self::Moe(Moe::load(b, ckpt, s)?),
            FeedForward::DenseAndSparse(..) => {
                return Err(Error::InvalidArgument(
                    "a dense MLP with a mixture beside it loads as its two parts".into(),
                ));
            }
        })
    }

    pub(super) fn input_type(&self, b: &B) -> OutType {
        match self {
            Self::Dense { mlp, .. } => b.input_type(&mlp.gate),
            // The router reads it in f32: rounded to bf16 first, its logits would pick other
            // experts at near-ties. Each expert's rows are gathered in the type it wants: f32
            // where any expert quantizes its input, else the activation type, and then the
            // backend may keep them in another exact form (`OutType::ExactForRouter`).
            Self::Moe(m) => m.input_type(b),
        }
    }

    /// The MLP's output, or `None` where it was added into `residual` (a mixture, given one,
    /// on a backend that can); `ids` the rows' tokens.
    pub(super) fn forward(
        &self,
        b: &B,
        x: &B::Tensor,
        ids: &[u32],
        residual: Option<&mut B::Tensor>,
    ) -> Result<Option<B::Tensor>> {
        match self {
            Self::Dense { mlp, gate_scale } => {
                // A batch whose intermediate values would not fit the device's largest buffer
                // (wgpu: one window of 131,072 tokens through an 8B's MLP of 14,336 holds 7.5
                // GB) runs in blocks of rows: each row's output is the same.
                let (t, block) = (x.rows(), mlp.rows_per_block(b, x.rows()));
                if block >= t {
                    return Self::dense(b, mlp, gate_scale.as_ref(), x).map(Some);
                }
                let parts = (0..t)
                    .step_by(block)
                    .map(|from| {
                        let rows: Vec<u32> = (from as u32..(from + block).min(t) as u32).collect();
                        Self::dense(b, mlp, gate_scale.as_ref(), &b.take_rows(&[x], &rows)?)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let parts: Vec<&B::Tensor> = parts.iter().collect();
                let all: Vec<u32> = (0..t as u32).collect();
                b.take_rows(&parts, &all).map(Some)
            }
            Self::Moe(m) => m.forward(b, x, (None, ids), residual),
        }
    }

    /// A dense MLP of the rows of `x`, its gate's outputs scaled by `gate_scale` where given.
    fn dense(
        b: &B,
        mlp: &Mlp<B>,
        gate_scale: Option<&B::Tensor>,
        x: &B::Tensor,
    ) -> Result<B::Tensor> {
        let Some(factors) = gate_scale else {
            return mlp.view().forward(b, x);
        };
        let up = mlp.up.as_ref().ok_or_else(|| {
            Error::backend("mlp", "scaled gates need a gate and an up projection")
        })?;
        let [mut gate, up] = <[_; 2]>::try_from(b.linears(x, &[&mlp.gate, up])?)
            .map_err(|_| Error::backend("linears", "not two outputs"))?;
        b.scale_columns(&mut gate, factors)?;
        b.gated_linear(gate, Some(up), mlp.act, &mlp.down)
    }
}
