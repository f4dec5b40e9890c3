//! The op families of `check`, one file each, and their registry.

mod attention;
mod elementwise;
mod linears;
mod mixture;
mod norms;
mod recurrent;
mod sparse;
mod streams;
mod vocab;

use super::{CaseReport, Ctx};
use crate::Result;
use crate::backend::Backend;
use crate::rng::Rng;

/// A family of op cases: what `quantppl check --op NAME` runs alone.
#[derive(Clone, Copy, Debug)]
pub struct OpFamily {
    pub name: &'static str,
    /// The case names its reports carry (each an op, or an op and what is fused to it).
    pub ops: &'static [&'static str],
    pub about: &'static str,
}

/// A family's cases on the backend of `Ctx`, appended to the reports.
pub(super) type Cases<B> = fn(&Ctx<'_, B>, &mut Rng, &mut Vec<CaseReport>) -> Result<()>;

/// Every family, in the order `check` runs them, with its cases.
pub(super) fn families<B: Backend>() -> [(OpFamily, Cases<B>); 9] {
    [
        (OP_FAMILIES[0], |c, rng, out| {
            linears::cases(c.b, rng, c.rel, out)
        }),
        (OP_FAMILIES[1], norms::cases),
        (OP_FAMILIES[2], attention::cases),
        (OP_FAMILIES[3], elementwise::cases),
        (OP_FAMILIES[4], vocab::cases),
        (OP_FAMILIES[5], |c, rng, out| {
            mixture::cases(c.b, &c.cpu, rng, c.norm_outs, out)
        }),
        (OP_FAMILIES[6], recurrent::cases),
        (OP_FAMILIES[7], sparse::cases),
        (OP_FAMILIES[8], streams::cases),
    ]
}

/// The families by name (`quantppl check --op` lists them).
pub const OP_FAMILIES: [OpFamily; 9] = [
    OpFamily {
        name: "linear",
        ops: &["dequant", "linear", "gated_linear", "act_quant"],
        about: "every storage format's weight bit for bit, its GEMM, the fused gated linear \
                and the activation quantizers",
    },
    OpFamily {
        name: "norm",
        ops: &["rms_norm", "add_rms_norm", "add_rms_norm residual"],
        about: "RMSNorm alone and fused with the residual add",
    },
    OpFamily {
        name: "attention",
        ops: &["assemble_columns", "rope", "rms_norm + rope", "attention"],
        about: "latent attention's column assembly, RoPE, q/k norms with RoPE, causal \
                attention and its variants",
    },
    OpFamily {
        name: "elementwise",
        ops: &["gated_act", "add", "scale_columns", "take_rows"],
        about: "the gated activations, the residual add, column scales (muP multipliers) and \
                rows joined from several tensors (serve's prefix cache)",
    },
    OpFamily {
        name: "vocab",
        ops: &["embed", "nll", "row_stats", "kld"],
        about: "the embedding gather, the fused lm_head NLL, serve's row statistics and KLD",
    },
    OpFamily {
        name: "mixture",
        ops: &[
            "router logits",
            "route (rows per expert)",
            "route + gather + scatter_add",
            "mixture (experts)",
            "mixture + residual",
            "gather_group",
        ],
        about: "routers, the grouped experts behind them, row gathers",
    },
    OpFamily {
        name: "recurrent",
        ops: &[
            "causal_conv",
            "linear_recurrence",
            "linear_recurrence chunked (cpu)",
            "gated_rms_norm",
        ],
        about: "gated DeltaNet, Mamba-2 and LFM2: the causal convolution (with SiLU; with a \
                bias), the delta rule and Mamba-2's scan (and their chunked form against the \
                step-by-step one), the gated norms of their output",
    },
    OpFamily {
        name: "sparse",
        ops: &["layer_norm", "index_top_k", "sparse_attention"],
        about: "DeepSeek sparse attention: the indexer key's LayerNorm, the indexer's top-k \
                selection (exact, ties included), attention over the selected keys and over \
                every earlier key (dense attention)",
    },
    OpFamily {
        name: "streams",
        ops: &[
            "hyper_weights",
            "mix_streams",
            "pool_windows",
            "compressed_keys",
        ],
        about: "DeepSeek-V4: the hyper-connections' weights and their mix of the residual \
                streams, the compressors' pooling of windows of tokens, and each query's key \
                list (its window, then the entries it sees)",
    },
];
