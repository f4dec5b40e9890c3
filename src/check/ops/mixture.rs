//! The mixture-of-experts data flow against the CPU.

use super::super::{CaseReport, compare, matrix, tolerances};
use crate::Result;
use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, Device, GatedMlp, OutType, RouteRule, Shaped};
use crate::checkpoint::scheme::Strategy;
use crate::checkpoint::{Fp4Scale, GatedActivation, Router};
use crate::numerics::{ActQuant, FloatType};
use crate::rng::Rng;
use crate::synth::linear::{LinearSpec, OwnedLinear, WeightKind};

/// The mixture-of-experts data flow against the CPU: router logits (f32 whatever the
/// activation type); the backend's own routing (each expert's row count exactly, then each
/// expert's rows gathered and added back weighted into an f32 accumulator, which does not
/// depend on the order of rows inside a group), softmax and grouped-sigmoid routers, with and
/// without a shared expert's group; the experts themselves behind that routing
/// (`Backend::mixture`); and gathers of given groups in both output types.
pub(super) fn cases<B: Backend>(
    b: &B,
    cpu: &CpuBackend,
    rng: &mut Rng,
    outs: &[(OutType, &str)],
    out: &mut Vec<CaseReport>,
) -> Result<()> {
    let f32_tol = tolerances(FloatType::F32).0;
    let softmax = Router::Softmax { renormalize: true };
    // DeepSeek's renormalization (+1e-20), and LFM2-MoE's (+1e-6).
    let grouped = Router::Sigmoid {
        groups: 4,
        top_groups: 2,
        renormalize: true,
        scale: 2.5,
        eps: 1e-20,
    };
    // Mistral 4's (routed on the host by every backend).
    let grouped_softmax = Router::GroupedSoftmax {
        groups: 4,
        top_groups: 2,
        renormalize: true,
        scale: 1.5,
    };
    let wide_groups = Router::Sigmoid {
        groups: 8,
        top_groups: 4,
        renormalize: true,
        scale: 2.5,
        eps: 1e-6,
    };
    // The device kernel holds 32 experts a slot: the 160-expert case fills several slots, its
    // groups straddling them (160 experts in groups of 20, as GLM-4.5's). Experts are of
    // `Mix` unless a case gives them all quantized and wider (`Wide`: the shapes CUDA's Hopper
    // gate/up and down kernels take, each in more tiles than an H100 has multiprocessors, some
    // of them partial).
    // Gemma 4's routing: the renormalised softmax weights times a factor per expert.
    const PER_EXPERT_FACTORS: &str = "softmax, times a factor per expert";
    // DeepSeek-V4's hash-routed layers: each token's experts fixed, weighed by the scores.
    const BY_TOKEN: &str = "sqrt(softplus) scores, experts by the token";
    // ... where a token names one expert twice (its output added twice, as the reference
    // adds it): CUDA routes such a batch on the host, a group holding a token once.
    const BY_TOKEN_TWICE: &str = "sqrt(softplus) scores, an expert named twice";
    let sqrt_softplus = Router::SqrtSoftplus { scale: 1.5 };
    let cases = [
        (37, 72, 8, 2, (softmax, "softmax"), false, Mix),
        (
            300,
            64,
            5,
            3,
            (Router::Softmax { renormalize: false }, "softmax raw"),
            true,
            Mix,
        ),
        (1, 40, 4, 4, (softmax, "softmax"), false, Mix),
        (
            150,
            64,
            16,
            3,
            (grouped, "sigmoid 2 of 4 groups"),
            true,
            Mix,
        ),
        (
            90,
            64,
            32,
            4,
            (Router::TopKSoftmax, "softmax of the top k"),
            false,
            Mix,
        ),
        (48, 64, 128, 8, (softmax, "softmax"), false, Mix),
        // More picks than the combine kernel keeps in registers (Qwen3-Next routes to 10).
        (70, 64, 24, 10, (softmax, "softmax"), false, Mix),
        (
            40,
            64,
            160,
            8,
            (wide_groups, "sigmoid 4 of 8 groups"),
            false,
            Mix,
        ),
        (2400, 512, 8, 4, (softmax, "softmax"), false, Wide(384)),
        // Last: the cases above keep their output types (the cycle below pairs them by place;
        // the grouped-sigmoid cases' quantizing experts must not meet planes).
        (
            37,
            64,
            16,
            3,
            (grouped_softmax, "softmax 2 of 4 groups"),
            true,
            Mix,
        ),
        (53, 64, 16, 4, (softmax, PER_EXPERT_FACTORS), false, Mix),
        // DeepSeek-V4's, with its clamped SwiGLU and a shared expert.
        (
            45,
            64,
            16,
            4,
            (sqrt_softplus, "sqrt(softplus) scores, a selection bias"),
            true,
            Mix,
        ),
        (29, 64, 8, 2, (sqrt_softplus, BY_TOKEN), false, Mix),
        // Llama 4's: the top-k sigmoids scale the experts' inputs, a shared expert beside.
        (
            61,
            64,
            16,
            1,
            (Router::TopKSigmoid, "sigmoid of the top k, on the inputs"),
            true,
            Mix,
        ),
        (31, 64, 8, 2, (sqrt_softplus, BY_TOKEN_TWICE), false, Mix),
    ];
    for ((tokens, hidden, experts, k, (router_kind, rule_name), shared, shape), (ot, ot_name)) in
        cases.into_iter().zip(outs.iter().cycle())
    {
        let ot = *ot;
        let wide = match shape {
            Mix => String::new(),
            Wide(inter) => format!(" inter={inter}"),
        };
        let vars = format!("tokens={tokens} hidden={hidden}{wide} experts={experts} top={k}");
        let router = LinearSpec::new(
            WeightKind::Dense(FloatType::Bf16),
            experts,
            hidden,
            FloatType::Bf16,
        );
        // gpt-oss's router has a bias.
        let router = match router_kind {
            Router::TopKSoftmax => router.with_bias(),
            _ => router,
        }
        .build(rng);
        let (router_b, router_c) = (
            b.upload_linear(&router.qlinear())?,
            cpu.upload_linear(&router.qlinear())?,
        );
        let x = rng.normal_vec(tokens * hidden, 1.0);
        // The backend's input in the case's type, planes as the forward pass makes them (a
        // norm's output; no case's experts that quantize their input come with planes), and
        // the same values on the CPU.
        let xb = match ot {
            OutType::F32 => b.upload_vector("x", &x)?,
            OutType::Activation => b.upload_activation(&x)?,
            OutType::ExactForRouter => {
                let x = b.upload_vector("x", &x)?.reshaped(tokens, hidden)?;
                let w = b.upload_vector("norm weight", &rng.normal_vec(hidden, 1.0))?;
                b.rms_norm(&x, &w, 1e-6, OutType::ExactForRouter)?
            }
        }
        .reshaped(tokens, hidden)?;
        let xc = matrix(cpu, "x", &b.download(&xb)?, tokens, hidden)?;
        // What the backend's gathers read: planes as the activation type (only the router
        // reads them whole).
        let (x_read, gather_ot) = match ot {
            OutType::ExactForRouter => {
                let round = |v: f32| b.activation_type().round(v);
                let read: Vec<f32> = b.download(&xb)?.into_iter().map(round).collect();
                (
                    matrix(cpu, "x as read", &read, tokens, hidden)?,
                    OutType::Activation,
                )
            }
            _ => (
                matrix(cpu, "x as read", &b.download(&xb)?, tokens, hidden)?,
                ot,
            ),
        };
        let want = cpu.logits(&xc, &router_c)?;
        let got = b.logits(&xb, &router_b)?;
        out.push(compare(
            "router logits",
            vars.clone(),
            &got,
            &want,
            f32_tol,
            true,
        ));

        let bias: Vec<f32> = match router_kind {
            Router::Sigmoid { .. } | Router::SqrtSoftplus { .. } => rng.normal_vec(experts, 0.05),
            Router::Softmax { .. }
            | Router::TopKSoftmax
            | Router::TopKSigmoid
            | Router::GroupedSoftmax { .. } => vec![0.0; experts],
        };
        let factors = match rule_name {
            PER_EXPERT_FACTORS => rng
                .normal_vec(experts, 0.3)
                .iter()
                .map(|v| 1.0 + v)
                .collect(),
            _ => Vec::new(),
        };
        // k experts a token, where the token chooses them.
        let fixed: Vec<u32> = match rule_name {
            BY_TOKEN => (0..tokens)
                .flat_map(|t| (0..k).map(move |j| ((t * 3 + j * 5) % experts) as u32))
                .collect(),
            // Every third token names its first expert twice.
            BY_TOKEN_TWICE => (0..tokens)
                .flat_map(|t| {
                    let step = if t % 3 == 0 { 0 } else { 5 };
                    (0..k).map(move |j| ((t * 3 + j * step) % experts) as u32)
                })
                .collect(),
            _ => Vec::new(),
        };
        let rule = RouteRule {
            experts,
            experts_per_token: k,
            router: router_kind,
            bias: &bias,
            expert_scale: &factors,
            weights_on_input: router_kind == Router::TopKSigmoid,
            fixed: &fixed,
        };
        let all_rows: Option<Vec<f32>> = shared.then(|| rng.normal_vec(tokens, 1.0));
        let (gb, lens_b) = b.route(&xb, &router_b, &rule, all_rows.as_deref())?;
        let (gc, lens_c) = cpu.route(&xc, &router_c, &rule, all_rows.as_deref())?;
        let as_f32 = |v: &[usize]| v.iter().map(|&n| n as f32).collect::<Vec<_>>();
        let vars = format!("{vars} {rule_name}{}", if shared { " +shared" } else { "" });
        out.push(compare(
            "route (rows per expert)",
            vars.clone(),
            &as_f32(&lens_b),
            &as_f32(&lens_c),
            0.0,
            false,
        ));
        let mut acc_b = b.zeros(tokens, hidden)?;
        let mut acc_c = cpu.zeros(tokens, hidden)?;
        for g in (0..lens_c.len()).filter(|&g| lens_c[g] > 0 && lens_b.get(g) == Some(&lens_c[g])) {
            let rows_b = b.gather_group(&xb, &gb, g, gather_ot)?;
            b.scatter_add_group(&mut acc_b, &rows_b, &gb, g)?;
            let rows_c = cpu.gather_group(&x_read, &gc, g, OutType::F32)?;
            cpu.scatter_add_group(&mut acc_c, &rows_c, &gc, g)?;
        }
        // A gather copies values already in the activation type, exactly; scaled by the
        // routing weights (Llama 4) it rounds their products to it.
        let gather_tol = match rule.weights_on_input {
            true => tolerances(b.activation_type()).0,
            false => f32_tol,
        };
        out.push(compare(
            "route + gather + scatter_add",
            vars.clone(),
            &b.download(&acc_b)?,
            &cpu.download(&acc_c)?,
            gather_tol,
            true,
        ));

        // The experts themselves behind each backend's own routing (same row counts).
        if lens_b == lens_c {
            let experts = random_experts(rng, lens_c.len(), hidden, shared, router_kind, shape);
            out.push(compare(
                "mixture (experts)",
                format!("{vars}{ot_name}"),
                &run_mixture(b, &experts, &xb, &gb, &lens_b, None)?,
                &run_mixture(cpu, &experts, &xc, &gc, &lens_c, None)?,
                tolerances(b.product_type()).0,
                true,
            ));
            // Added into a residual stream (`mixture_into`: CUDA's combine adds it in place).
            let residual = rng.normal_vec(tokens * hidden, 1.0);
            out.push(compare(
                "mixture + residual",
                format!("{vars}{ot_name}"),
                &run_mixture(b, &experts, &xb, &gb, &lens_b, Some(&residual))?,
                &run_mixture(cpu, &experts, &xc, &gc, &lens_c, Some(&residual))?,
                tolerances(b.product_type()).0,
                true,
            ));
        }

        // Gathers of the same host-made groups, row for row. A gather copies values already in
        // the activation type: exact.
        let groups =
            crate::backend::routing::route(&want, experts, k, router_kind, (&bias, &fixed))?;
        let (gb, gc) = (b.upload_groups(&groups)?, cpu.upload_groups(&groups)?);
        let (mut rows_got, mut rows_want) = (Vec::new(), Vec::new());
        for g in (0..groups.groups()).filter(|&g| !groups.group(g).is_empty()) {
            rows_got.extend(b.download(&b.gather_group(&xb, &gb, g, gather_ot)?)?);
            rows_want.extend(cpu.download(&cpu.gather_group(&x_read, &gc, g, OutType::F32)?)?);
        }
        out.push(compare(
            "gather_group",
            format!("{vars}{ot_name}"),
            &rows_got,
            &rows_want,
            0.0,
            true,
        ));
    }
    Ok(())
}

/// One group's expert, packed: `up` is `None` where `gate` holds gate and up interleaved.
struct Expert {
    gate: OwnedLinear,
    up: Option<OwnedLinear>,
    down: OwnedLinear,
    act: GatedActivation,
}

/// The experts of a case: `Mix` of intermediate width 48 (the last 32 where shared), every
/// third dense where the router is a softmax; `Wide(inter)` all quantized, `inter` wide.
#[derive(Clone, Copy)]
enum ExpertShape {
    Mix,
    Wide(usize),
}
use ExpertShape::{Mix, Wide};

/// Random packed experts for `groups` groups of `hidden`-wide rows, of intermediate width 48
/// (the last 32 where `shared`: a shared expert narrower than the routed ones) or as `shape`
/// says: INT4 g32 asymmetric, every third expert dense bf16 (a dense base's experts are read
/// in place, not dequantized beside their neighbours'); NVFP4 for grouped-sigmoid routers, gate and up
/// quantizing their input per token to INT8 or INT7, expert by expert (each expert's rows
/// with its own quantizer, as static scales are); gpt-oss's biased, interleaved dense experts
/// behind its router.
fn random_experts(
    rng: &mut Rng,
    groups: usize,
    hidden: usize,
    shared: bool,
    router: Router,
    shape: ExpertShape,
) -> Vec<Expert> {
    let (kind, quantized, gpt_oss) = match router {
        Router::Sigmoid { .. } => (
            WeightKind::Fp4(Fp4Scale::Nvfp4 { global_scale: 95.0 }),
            true,
            false,
        ),
        Router::Softmax { .. }
        | Router::TopKSigmoid
        | Router::GroupedSoftmax { .. }
        | Router::SqrtSoftplus { .. } => (
            WeightKind::Int {
                bits: 4,
                strategy: Strategy::Group(32),
                asym: true,
                g_idx: false,
                legacy: false,
            },
            false,
            false,
        ),
        Router::TopKSoftmax => (WeightKind::Dense(FloatType::Bf16), false, true),
    };
    let act_quant = |g: usize| {
        quantized.then_some(ActQuant::IntPerToken {
            bits: 8 - (g % 2) as u32,
        })
    };
    // Only gate and up quantize their input: the mixture's input is the same on both sides,
    // while down's differs in the last bits and a quantizer flips on them (see README
    // Numerics). INT8 per token: a bf16 backend quantizes in bf16, the CPU in f32, and a
    // flipped code moves an output by 1/127 of the row's range, not by a whole FP4 step.
    let linear = |rng: &mut Rng, g: usize, out, n_in, aq: Option<ActQuant>| {
        let kind = match router {
            Router::Softmax { .. } if g % 3 == 2 && matches!(shape, Mix) => {
                WeightKind::Dense(FloatType::Bf16)
            }
            _ => kind,
        };
        let mut s = LinearSpec::new(kind, out, n_in, FloatType::Bf16);
        if gpt_oss {
            s = s.with_bias();
        }
        if let Some(aq) = aq {
            s = s.with_act_quant(aq);
        }
        s.build(rng)
    };
    (0..groups)
        .map(|g| {
            let inter = match shape {
                Wide(inter) => inter,
                Mix if shared && g + 1 == groups => 32,
                Mix => 48,
            };
            let (gate_rows, act) = match gpt_oss {
                true => (
                    2 * inter,
                    GatedActivation::ClampedSwiglu {
                        alpha: 1.702,
                        limit: 7.0,
                    },
                ),
                false => match router {
                    Router::SqrtSoftplus { .. } => {
                        (inter, GatedActivation::ClampedSilu { limit: 0.05 })
                    }
                    _ => (inter, GatedActivation::Silu),
                },
            };
            Expert {
                gate: linear(rng, g, gate_rows, hidden, act_quant(g)),
                up: (!gpt_oss).then(|| linear(rng, g, inter, hidden, act_quant(g))),
                down: linear(rng, g, hidden, inter, None),
                act,
            }
        })
        .collect()
}

/// The mixture of `experts` over `x`'s `groups` on `d`: its sum, or with `residual` (f32
/// values of x's shape) `residual` plus it (`Backend::mixture_into`, its sum added here where
/// the backend returns it).
fn run_mixture<D: Backend>(
    d: &D,
    experts: &[Expert],
    x: &D::Tensor,
    groups: &D::Groups,
    lens: &[usize],
    residual: Option<&[f32]>,
) -> Result<Vec<f32>> {
    let up = |w: &OwnedLinear| d.upload_linear(&w.qlinear());
    let linears: Vec<_> = experts
        .iter()
        .map(|e| {
            Ok((
                up(&e.gate)?,
                e.up.as_ref().map(up).transpose()?,
                up(&e.down)?,
            ))
        })
        .collect::<Result<_>>()?;
    let mlps: Vec<_> = linears
        .iter()
        .zip(experts)
        .map(|((gate, up, down), e)| GatedMlp {
            gate,
            up: up.as_ref(),
            down,
            act: e.act,
        })
        .collect();
    match residual {
        None => d.download(&d.mixture(x, groups, lens, &mlps)?),
        Some(r) => {
            let [rows, cols] = x.shape();
            let mut sum = d.upload_vector("residual", r)?.reshaped(rows, cols)?;
            if let Some(mixture) = d.mixture_into(&mut sum, x, groups, lens, &mlps)? {
                d.add_assign(&mut sum, &mixture)?;
            }
            d.download(&sum)
        }
    }
}
