//! The compute interface the forward pass is written against, once.
//!
//! A backend holds weights (uploaded packed, as they are on disk) and activations of one
//! batch of token sequences laid end to end. It knows nothing of datasets, windows or methods.
//!
//! Long (about 770 lines) on purpose: the two traits are documented where they are declared,
//! the one file a backend's author reads.

pub mod compressed;
pub mod cpu;
pub mod cuda;
pub mod lowering;
pub mod options;
pub mod profiled;
pub mod recurrent;
pub mod routing;
pub mod wgpu;

use crate::Result;
use crate::checkpoint::{DeltaNetConfig, GatedActivation, QLinear};

/// Where each sequence of a batch starts in the flattened token list, and each token's
/// position inside its sequence (RoPE position); with branches, which earlier rows of its
/// sequence a token does not see.
#[derive(Clone, Debug, Default)]
pub struct SeqLayout {
    /// `n_seqs + 1` offsets into the flattened tokens, starting at 0.
    pub starts: Vec<usize>,
    pub positions: Vec<u32>,
    /// Per token, the rows `[from, to)` of its sequence (offsets from its first row) that it
    /// does not see although they come before it: the branches before its own. Empty when no
    /// sequence has branches (every token sees every row of its sequence up to itself).
    pub hidden: Vec<[u32; 2]>,
}

/// A sequence whose rows after a common `prefix` are several branches laid end to end
/// (`lens`): each branch's tokens see the prefix and their own branch, at the positions that
/// continue the prefix, exactly as if each branch followed the prefix alone. Several
/// continuations of one context then share the context's rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Branches {
    pub prefix: usize,
    pub lens: Vec<usize>,
}

impl Branches {
    /// Rows of the sequence.
    pub fn rows(&self) -> usize {
        self.prefix + self.lens.iter().sum::<usize>()
    }
}

impl SeqLayout {
    pub fn from_lengths(lengths: impl IntoIterator<Item = usize>) -> Self {
        Self::from_sequences(lengths.into_iter().map(|len| (len, None)))
    }

    /// Sequences of `len` rows, each plain or split into [`Branches`] that cover its `len`
    /// rows (the windows and serve's packing build them so; anything else is a bug, not
    /// input).
    pub fn from_sequences<'a>(
        seqs: impl IntoIterator<Item = (usize, Option<&'a Branches>)>,
    ) -> Self {
        let mut starts = vec![0];
        let mut positions = Vec::new();
        let mut hidden: Vec<[u32; 2]> = Vec::new();
        for (len, branches) in seqs {
            let from = positions.len();
            starts.push(from + len);
            match branches {
                Some(b) => {
                    assert_eq!(b.rows(), len, "branches cover their sequence's rows");
                    if hidden.is_empty() {
                        hidden.resize(from, [0, 0]);
                    }
                    let p = b.prefix as u32;
                    positions.extend(0..p);
                    hidden.extend(std::iter::repeat_n([0, 0], b.prefix));
                    let mut at = p;
                    for &n in &b.lens {
                        positions.extend(p..p + n as u32);
                        hidden.extend(std::iter::repeat_n([p, at], n));
                        at += n as u32;
                    }
                }
                None => {
                    positions.extend(0..len as u32);
                    if !hidden.is_empty() {
                        hidden.extend(std::iter::repeat_n([0, 0], len));
                    }
                }
            }
        }
        Self {
            starts,
            positions,
            hidden,
        }
    }

    /// Whether some sequence has branches.
    pub fn branched(&self) -> bool {
        self.hidden.iter().any(|h| h[0] < h[1])
    }

    /// The rows of its sequence (offsets from the first) token `t`, whose offset is `own`,
    /// sees: every one up to itself but those a branch before its own holds.
    pub fn visible_rows(&self, t: usize, own: usize) -> impl Iterator<Item = usize> + '_ {
        let [from, to] = self.hidden.get(t).copied().unwrap_or([0, 0]);
        (0..=own).filter(move |&r| r < from as usize || r >= to as usize)
    }

    /// For each token, the rows of its sequence it sees as one bit each (`words` u32 a token,
    /// bit r of a token's words set where it sees row r): the key mask of the GPU attention
    /// kernels, where `branched`.
    pub fn visible_mask(&self) -> (Vec<u32>, usize) {
        let words = self.max_len().div_ceil(32).max(1);
        let mut mask = vec![0u32; self.n_tokens() * words];
        for w in self.starts.windows(2) {
            for t in w[0]..w[1] {
                for r in self.visible_rows(t, t - w[0]) {
                    mask[t * words + r / 32] |= 1 << (r % 32);
                }
            }
        }
        (mask, words)
    }

    pub fn n_tokens(&self) -> usize {
        self.positions.len()
    }

    pub fn n_seqs(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// For every token, the index of its sequence's first token (the causal mask's lower
    /// bound in the GPU attention kernels). Fails when the offsets and the positions disagree.
    pub fn token_seq_starts(&self) -> Result<Vec<u32>> {
        let mut v = Vec::with_capacity(self.n_tokens());
        for w in self.starts.windows(2) {
            v.extend(std::iter::repeat_n(w[0] as u32, w[1] - w[0]));
        }
        if v.len() != self.n_tokens() {
            return Err(crate::Error::InvalidArgument(format!(
                "sequence layout: starts cover {} tokens, positions {}",
                v.len(),
                self.n_tokens()
            )));
        }
        Ok(v)
    }

    /// The sequences cut into chunks of up to `size` tokens, each sequence's from its first
    /// token: the chunks' boundaries (`n_chunks + 1` token offsets, chunk c being
    /// `bounds[c]..bounds[c + 1]`) and each sequence's first chunk (`n_seqs + 1` offsets into
    /// the chunks). The chunked recurrence kernels' work lists.
    pub fn chunks(&self, size: usize) -> (Vec<u32>, Vec<u32>) {
        let (mut bounds, mut firsts) = (vec![0u32], vec![0u32]);
        for w in self.starts.windows(2) {
            let mut at = w[0];
            while at < w[1] {
                at = (at + size.max(1)).min(w[1]);
                bounds.push(at as u32);
            }
            firsts.push((bounds.len() - 1) as u32);
        }
        (bounds, firsts)
    }

    /// Each sequence cut into sequences of up to `size` rows from its first, positions kept:
    /// the layout of attention within chunks (Llama 4's chunked layers). Branches are not
    /// kept (the model refuses them past a chunk: `ModelConfig::branch_rows_limit`).
    pub fn split(&self, size: usize) -> SeqLayout {
        let (bounds, _) = self.chunks(size);
        SeqLayout {
            starts: bounds.into_iter().map(|b| b as usize).collect(),
            positions: self.positions.clone(),
            hidden: Vec::new(),
        }
    }

    pub fn max_len(&self) -> usize {
        self.starts
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0)
    }
}

/// Token rows grouped by expert, with the weight each row's expert output is scaled by:
/// group `g` is `rows[offsets[g]..offsets[g + 1]]`. Built on the host by the router; uploaded
/// once per layer (`Device::upload_groups`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowGroups {
    pub rows: Vec<u32>,
    pub weights: Vec<f32>,
    pub offsets: Vec<usize>,
    /// A factor per row on the gathered input (`Backend::gather_group` multiplies each row
    /// by it): the routing weights of a rule that scales the experts' inputs
    /// (`RouteRule::weights_on_input`, Llama 4), whose `weights` are then 1. Empty: none.
    pub input_scales: Vec<f32>,
}

impl RowGroups {
    /// Group `g` as a range into `rows` / `weights`.
    pub fn group(&self, g: usize) -> std::ops::Range<usize> {
        self.offsets[g]..self.offsets[g + 1]
    }

    pub fn groups(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// An error unless group `g` exists and its rows lie below `rows` (the tensor's).
    pub fn check(&self, g: usize, rows: usize) -> Result<std::ops::Range<usize>> {
        if g >= self.groups() {
            return Err(crate::Error::InvalidArgument(format!(
                "row group {g} of {}",
                self.groups()
            )));
        }
        let r = self.group(g);
        if let Some(&bad) = self.rows[r.clone()].iter().find(|&&i| i as usize >= rows) {
            return Err(crate::Error::InvalidArgument(format!(
                "row group {g} names row {bad} of a tensor of {rows} rows"
            )));
        }
        Ok(r)
    }
}

/// How a layer's router picks experts: the rule, the experts per token, and the layer's
/// selection bias (sigmoid routers; zeros where the checkpoint has none).
#[derive(Clone, Copy, Debug)]
pub struct RouteRule<'a> {
    pub experts: usize,
    pub experts_per_token: usize,
    pub router: crate::checkpoint::Router,
    pub bias: &'a [f32],
    /// A factor per expert on its weights after the rule (Gemma 4's `per_expert_scale`;
    /// empty: none).
    pub expert_scale: &'a [f32],
    /// The weights scale each routed row's input, the outputs summed unweighted (Llama 4;
    /// `RowGroups::input_scales`).
    pub weights_on_input: bool,
    /// Each row's experts `[rows, experts_per_token]` where they do not depend on the scores
    /// (DeepSeek-V4's `tid2eid[token]`), weighed as the router weighs its choice; empty: the
    /// rule chooses.
    pub fixed: &'a [u32],
}

/// A layer's attention: its geometry (grouped-query attention: `heads` is a multiple of
/// `kv_heads`) and the variants of its scores.
#[derive(Clone, Copy, Debug)]
pub struct AttnSpec {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Scores are `q . k * scale` (`head_dim^-0.5` unless the model says otherwise).
    pub scale: f32,
    /// Scores become `cap * tanh(score / cap)` before the mask and the softmax.
    pub softcap: Option<f32>,
    /// A query sees only the keys less than `window` positions before it (itself included).
    pub window: Option<usize>,
}

impl AttnSpec {
    /// Plain causal attention scaled by `head_dim^-0.5`.
    pub fn causal(heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        Self {
            heads,
            kv_heads,
            head_dim,
            scale: (1.0 / (head_dim as f64).sqrt()) as f32,
            softcap: None,
            window: None,
        }
    }

    /// The width of each value head of `v` (`[tokens, kv_heads * v_dim]`) for
    /// [`Backend::sparse_attention`], which allows values narrower than the keys (latent
    /// attention's: the latent beside a rotated part).
    pub fn value_dim(&self, v_cols: usize) -> Result<usize> {
        let v_dim = v_cols / self.kv_heads.max(1);
        if v_dim == 0 || v_dim * self.kv_heads != v_cols || v_dim > self.head_dim {
            return Err(crate::Error::InvalidArgument(format!(
                "sparse_attention: values of {v_cols} columns for {} key heads of {}",
                self.kv_heads, self.head_dim
            )));
        }
        Ok(v_dim)
    }

    /// The first key a query at batch row `row` of a sequence starting at row `start` sees.
    pub fn first_key(&self, row: usize, start: usize) -> usize {
        match self.window {
            Some(w) => start.max((row + 1).saturating_sub(w)),
            None => start,
        }
    }
}

/// DeepSeek sparse attention's lightning indexer as `Backend::index_top_k` computes it: a
/// query's score of a key is `sum_h weight_h * weight_scale * relu(scale * q_h . k)` over
/// `heads` query heads of `head_dim` (one key head), and it keeps its `top_k` best keys.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IndexSpec {
    pub heads: usize,
    pub head_dim: usize,
    pub top_k: usize,
    /// `head_dim^-0.5`.
    pub scale: f32,
    /// `heads^-0.5`.
    pub weight_scale: f32,
    /// A query at position `p` sees the keys `j < (p + 1) / rate`: 1, the keys up to itself;
    /// DeepSeek-V4's compressed entries (key `j` at row `start + j`), those whose `rate`
    /// tokens it has seen.
    pub rate: usize,
}

/// Which values of each head RoPE rotates: `dims` values from offset `start`, paired as halves
/// (rotate-half: value `j` with `j + dims / 2`) or, `interleaved`, as neighbours (`2j` with
/// `2j + 1`: DeepSeek's `rope_interleave`). Each pair rotates by the angle of table column `j`
/// and stays where it is; transformers writes DeepSeek's rotated pairs de-interleaved, one
/// permutation that queries and keys share, so every score is the same sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RotarySpan {
    pub head_dim: usize,
    pub start: usize,
    pub dims: usize,
    pub interleaved: bool,
}

impl RotarySpan {
    /// Rotate-half over the first `dims` values of each head.
    pub fn leading(head_dim: usize, dims: usize) -> Self {
        Self {
            head_dim,
            start: 0,
            dims,
            interleaved: false,
        }
    }

    /// The offsets in a head of pair `j`'s two values.
    pub fn pair(&self, j: usize) -> (usize, usize) {
        if self.interleaved {
            (self.start + 2 * j, self.start + 2 * j + 1)
        } else {
            (self.start + j, self.start + j + self.dims / 2)
        }
    }

    /// An error unless the span lies inside heads that tile rows of `cols` values.
    pub fn check(&self, cols: usize, op: &str) -> Result<()> {
        if self.head_dim == 0
            || !cols.is_multiple_of(self.head_dim)
            || !self.dims.is_multiple_of(2)
            || self.start + self.dims > self.head_dim
        {
            return Err(crate::Error::InvalidArgument(format!(
                "{op}: rows of {cols} values, {self:?}"
            )));
        }
        Ok(())
    }
}

/// Where [`Backend::assemble_columns`] copies from one source: for each row and each block
/// `b < blocks`, `width` values from column `from + b * from_stride` of the source to column
/// `to + b * to_stride` of the result (`from_stride` 0 repeats one block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnBlocks {
    pub blocks: usize,
    pub width: usize,
    pub from: usize,
    pub from_stride: usize,
    pub to: usize,
    pub to_stride: usize,
}

impl ColumnBlocks {
    /// One block of `width` columns from column `from` to column `to`.
    pub fn single(width: usize, from: usize, to: usize) -> Self {
        Self {
            blocks: 1,
            width,
            from,
            from_stride: 0,
            to,
            to_stride: 0,
        }
    }

    /// An error unless every block lies inside rows of `src_cols` and `dst_cols` values and
    /// no two blocks write the same column.
    pub fn check(&self, src_cols: usize, dst_cols: usize) -> Result<()> {
        let last = |start: usize, stride: usize| {
            self.blocks
                .checked_sub(1)
                .and_then(|b| b.checked_mul(stride))
                .and_then(|o| o.checked_add(start))
                .and_then(|o| o.checked_add(self.width))
        };
        let inside = |start, stride, cols| last(start, stride).is_some_and(|end| end <= cols);
        let disjoint = self.blocks <= 1 || self.width <= self.to_stride;
        if !(inside(self.from, self.from_stride, src_cols)
            && inside(self.to, self.to_stride, dst_cols)
            && disjoint)
        {
            return Err(crate::Error::InvalidArgument(format!(
                "column blocks {self:?} do not fit rows of {src_cols} -> {dst_cols} values"
            )));
        }
        Ok(())
    }
}

/// An output projection and what follows it: logits become `cap * tanh(logit / cap)` where
/// the model soft-caps them (Gemma 2).
pub struct Head<'a, L> {
    pub linear: &'a L,
    pub softcap: Option<f32>,
}

impl<L> Clone for Head<'_, L> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<L> Copy for Head<'_, L> {}

/// A linear recurrence's gates: per token `a` (`[tokens, v_heads]`: gated DeltaNet's
/// `in_proj_a`, Mamba-2's `dt`; `[tokens, v_heads * k_dim]` where the decay is per key channel),
/// per value head `A_log` (`[1, v_heads]`, f32), `dt_bias` as wide as a row of `a` (f32), and
/// what the rule adds.
pub struct RecurrenceGates<'a, T> {
    pub a: &'a T,
    pub a_log: &'a T,
    pub dt_bias: &'a T,
    pub rule: Recurrence<'a, T>,
}

/// An error unless rows of `cols` values are whole groups of `group` and whole repeats of a
/// `weight_len`-long weight that is itself whole groups (`Backend::gated_rms_norm`).
pub(crate) fn gated_norm_groups(
    cols: usize,
    weight_len: usize,
    group: usize,
    backend: &'static str,
) -> Result<()> {
    let whole = |n: usize, d: usize| d > 0 && n.is_multiple_of(d);
    if whole(cols, group) && whole(cols, weight_len) && whole(weight_len, group) {
        return Ok(());
    }
    Err(crate::Error::backend(
        backend,
        format!(
            "gated_rms_norm: rows of {cols} values, groups of {group}, a weight of {weight_len}: \
             not whole groups"
        ),
    ))
}

/// How `Backend::gated_rms_norm` gates: the gate's activation and whether it comes before the
/// norm. The numbers are the kernels' `mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormGate {
    /// `rms_norm(x) * w * silu(gate)`: gated DeltaNet's `RMSNormGated` (a group a head).
    SiluAfter = 0,
    /// `rms_norm(x * silu(gate)) * w`: Mamba-2's (`group` = `intermediate / n_groups`).
    SiluBefore = 1,
    /// `rms_norm(x) * w * sigmoid(gate)`: Kimi Delta Attention's `o_norm`.
    SigmoidAfter = 2,
}

impl NormGate {
    /// The gate's activation of `g`, in f32 as the kernels compute it.
    pub fn activate(self, g: f32) -> f32 {
        match self {
            Self::SiluAfter | Self::SiluBefore => g / (1.0 + (-g).exp()),
            Self::SigmoidAfter => 1.0 / (1.0 + (-g).exp()),
        }
    }
}

/// Which linear recurrence `Backend::linear_recurrence` runs.
pub enum Recurrence<'a, T> {
    /// Gated DeltaNet: `qkv` holds queries, keys and values; queries and keys L2-normalized
    /// per head, queries scaled by `k_dim^-0.5`; `beta = sigmoid(b)` (`b` `[tokens,
    /// v_heads]`, `in_proj_b`), the decay as `recurrent::gates`; the delta correction. With
    /// `per_key`, Kimi Delta Attention: each key channel of the state decays at its own rate
    /// (`a` and `dt_bias` a value per value head and key channel). With a `lower_bound`,
    /// GLM-5.3-Flash's safe gate: the log decay `lower_bound * sigmoid(exp(A_log) * (a +
    /// dt_bias))` (`recurrent::safe_gates`).
    Delta {
        b: &'a T,
        per_key: bool,
        lower_bound: Option<f32>,
    },
    /// Mamba-2's SSD: `qkv` holds x (values, a head of `v_dim` per value head), B (keys) and C
    /// (queries, a group of `k_dim` per key head); `dt = clamp(softplus(a + dt_bias), dt_min,
    /// dt_max)` is the update strength and the decay's step (`recurrent::ssd_gates`); no
    /// correction; `d[h] * x` (`[1, v_heads]`, f32, Mamba's `D`) added to each output.
    Ssd { d: &'a T, dt_min: f32, dt_max: f32 },
}

impl<T> Recurrence<'_, T> {
    /// The decay's inputs per token (a row of `a` and of `dt_bias`): one per value head, or
    /// one per value head and key channel.
    pub fn decay_width(&self, net: DeltaNetConfig) -> usize {
        match self {
            Self::Delta { per_key: true, .. } => net.v_heads * net.k_dim,
            _ => net.v_heads,
        }
    }

    /// Where queries, keys and values start in a row of `qkv`.
    pub fn offsets(&self, net: DeltaNetConfig) -> [usize; 3] {
        let (kw, vw) = (net.key_width(), net.value_width());
        match self {
            Self::Delta { .. } => [0, kw, 2 * kw],
            Self::Ssd { .. } => [vw + kw, vw, 0],
        }
    }
}

impl<T> Clone for Recurrence<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Recurrence<'_, T> {}

impl<T> Clone for RecurrenceGates<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for RecurrenceGates<'_, T> {}

/// A gated MLP's linears, borrowed: a dense layer's MLP, one expert of a mixture, or its
/// shared expert (`up` is `None` where `gate` holds gate and up interleaved: gpt-oss).
pub struct GatedMlp<'a, L> {
    pub gate: &'a L,
    pub up: Option<&'a L>,
    pub down: &'a L,
    pub act: GatedActivation,
}

impl<L> GatedMlp<'_, L> {
    /// `down(act(gate(x)) * up(x))`.
    pub fn forward<B: Backend<Linear = L> + ?Sized>(
        &self,
        b: &B,
        x: &B::Tensor,
    ) -> Result<B::Tensor> {
        let (g, u) = match self.up {
            Some(up) => {
                let [g, u] = <[_; 2]>::try_from(b.linears(x, &[self.gate, up])?)
                    .map_err(|_| crate::Error::backend("linears", "not two outputs"))?;
                (g, Some(u))
            }
            None => (b.linear(x, self.gate)?, None),
        };
        b.gated_linear(g, u, self.act, self.down)
    }
}

/// Bytes of logits brought to the host at a time (rows x vocabulary f32) where a reduction
/// runs there: large enough for a wide GEMM and every core busy, below wgpu's default 128 MiB
/// binding.
const HOST_LOGITS_BYTES: usize = 64 << 20;

/// `reduce(logits, k)` of each row `rows[k]` of `hidden`, in order, on the host: the rows'
/// full-vocabulary f32 logits (`head`'s, `vocab` wide, gathered in type `emits`, soft-capped
/// where it says) brought over `HOST_LOGITS_BYTES` at a time and reduced in parallel.
pub fn reduce_logits_on_host<B: Backend + ?Sized, T: Send>(
    b: &B,
    hidden: &B::Tensor,
    rows: &[u32],
    (head, emits, vocab): (Head<'_, B::Linear>, OutType, usize),
    reduce: impl Fn(&[f32], usize) -> T + Sync,
) -> Result<Vec<T>> {
    use rayon::prelude::*;
    let chunk = (HOST_LOGITS_BYTES / (4 * vocab.max(1))).max(1);
    let mut out = Vec::with_capacity(rows.len());
    for (c, picked) in rows.chunks(chunk).enumerate() {
        let logits = host_logits(b, hidden, picked, head, emits)?;
        if logits.len() != picked.len() * vocab {
            return Err(crate::Error::backend(
                "host logits",
                format!(
                    "{} logits for {} rows of {vocab}",
                    logits.len(),
                    picked.len()
                ),
            ));
        }
        out.par_extend(
            logits
                .par_chunks_exact(vocab)
                .enumerate()
                .map(|(j, row)| reduce(row, c * chunk + j)),
        );
    }
    Ok(out)
}

/// Full-vocabulary f32 logits `[rows, vocab]` of rows `rows` of `hidden` (gathered in type
/// `emits`), soft-capped where `head` says.
fn host_logits<B: Backend + ?Sized>(
    b: &B,
    hidden: &B::Tensor,
    rows: &[u32],
    head: Head<'_, B::Linear>,
    emits: OutType,
) -> Result<Vec<f32>> {
    let groups = b.upload_groups(&RowGroups {
        rows: rows.to_vec(),
        weights: vec![1.0; rows.len()],
        offsets: vec![0, rows.len()],
        input_scales: Vec::new(),
    })?;
    let picked = b.gather_group(hidden, &groups, 0, emits)?;
    let mut logits = b.logits(&picked, head.linear)?;
    if let Some(cap) = head.softcap {
        logits.iter_mut().for_each(|l| *l = softcap(*l, cap));
    }
    Ok(logits)
}

/// `Backend::norm_rope` as two passes: each head RMS-normed (`rms_norm` over rows of
/// `span.head_dim`), then rotated in place (`rope`).
#[allow(clippy::too_many_arguments)]
pub fn norm_then_rope<B: Backend + ?Sized>(
    b: &B,
    x: B::Tensor,
    weight: &B::Tensor,
    eps: f32,
    seqs: &B::Sequences,
    cos: &B::Tensor,
    sin: &B::Tensor,
    span: RotarySpan,
) -> Result<B::Tensor> {
    let [t, cols] = x.shape();
    span.check(cols, "norm_rope")?;
    let heads = x.reshaped(t * (cols / span.head_dim), span.head_dim)?;
    let mut y = b
        .rms_norm(&heads, weight, eps, OutType::Activation)?
        .reshaped(t, cols)?;
    b.rope(&mut y, seqs, cos, sin, span)?;
    Ok(y)
}

/// `Backend::mixture` expert by expert, from group `first` on (`mlps[first..]`): each
/// group's rows gathered (in the type its expert wants), run through its MLP, and added,
/// weighted, in group order into `acc` (the earlier groups' sum) or a new zero accumulator.
pub fn mixture_by_group<B: Backend + ?Sized>(
    b: &B,
    acc: Option<B::Tensor>,
    x: &B::Tensor,
    groups: &B::Groups,
    lens: &[usize],
    mlps: &[GatedMlp<'_, B::Linear>],
    first: usize,
) -> Result<B::Tensor> {
    let mut acc = match acc {
        Some(acc) => acc,
        None => {
            let [rows, cols] = x.shape();
            b.zeros(rows, cols)?
        }
    };
    for (g, mlp) in mlps.iter().enumerate().skip(first) {
        if lens.get(g).is_none_or(|&n| n == 0) {
            continue;
        }
        let rows = b.gather_group(x, groups, g, b.input_type(mlp.gate))?;
        let y = mlp.forward(b, &rows)?;
        drop(rows);
        b.scatter_add_group(&mut acc, &y, groups, g)?;
    }
    Ok(acc)
}

/// The shape of `gated_act`'s result for `gate` `[rows, cols]` (`cols / 2` when gate and up
/// are interleaved in it: an activation that `interleaves` without `up`), or an error naming
/// what does not fit.
pub fn gated_shape(
    gate: [usize; 2],
    up: Option<[usize; 2]>,
    act: GatedActivation,
) -> Result<[usize; 2]> {
    let [rows, cols] = gate;
    let interleaved = up.is_none() && act.interleaves();
    let ok = match up {
        Some(u) => u == gate && !act.ungated(),
        None => act.ungated() || (interleaved && cols.is_multiple_of(2)),
    };
    if !ok {
        return Err(crate::Error::InvalidArgument(format!(
            "gated activation {act:?}: gate {gate:?} and up {up:?} do not fit"
        )));
    }
    Ok([rows, if interleaved { cols / 2 } else { cols }])
}

/// `cap * tanh(x / cap)`, Gemma 2's soft-capping of f32 logits, in f32 as torch computes it.
pub fn softcap(x: f32, cap: f32) -> f32 {
    (x / cap).tanh() * cap
}

/// One row's next-token distribution as `serve` needs it: its log-sum-exp over the
/// vocabulary, its greedy token (the first of equal largest logits) and that logit, the
/// target's logit, and where asked its most likely tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct RowStats {
    pub lse: f64,
    pub best: u32,
    pub best_logit: f32,
    pub target_logit: f32,
    /// The `top` most likely tokens with their logits in [`top_ranking`]'s order (empty when
    /// none were asked for).
    pub top: Vec<(u32, f32)>,
}

/// The longest top list [`Backend::row_stats`] gives a row (the device rankings' size).
pub const ROW_TOP_MAX: usize = 20;

impl RowStats {
    /// From one row of f32 logits with its `top` most likely tokens, on the host
    /// (`Backend::row_stats`' default).
    pub fn of(row: &[f32], target: usize, top: usize) -> Self {
        let mut best = 0;
        for (i, &v) in row.iter().enumerate() {
            if v > row[best] {
                best = i;
            }
        }
        let max = f64::from(row[best]);
        let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
        RowStats {
            lse: max + sum.ln(),
            best: best as u32,
            best_logit: row[best],
            target_logit: row[target],
            top: top_ranking(row, top)
                .into_iter()
                .map(|t| (t, row[t as usize]))
                .collect(),
        }
    }
}

/// Per-position statistics comparing a test distribution Q with a base P over the full
/// vocabulary, for `compare`: llama.cpp's `--kl-divergence` set (without truncation), the
/// reverse KL and how the two rankings of the most probable tokens agree.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KldTerms {
    /// KL(P_base || Q) in nats.
    pub kld: f64,
    /// KL(Q || P_base) in nats.
    pub kld_reverse: f64,
    pub nll_q: f64,
    pub nll_base: f64,
    /// Probability the base gives its own top token (ExLlamaV3's "confidence").
    pub base_top_p: f64,
    pub top: TopAgreement,
}

impl KldTerms {
    /// Top-1 of Q equals top-1 of P (the first of equal largest logits in each); a position
    /// where it does not is a flip.
    pub fn same_top(&self) -> bool {
        self.top.same_ranking >= 1
    }
}

/// How many of each distribution's most probable tokens a backend ranks: [`TopAgreement`]'s
/// largest K.
pub const TOP_K: usize = 10;

/// The K of [`TopAgreement::shared`].
pub const TOP_KS: [usize; 3] = [1, 5, TOP_K];

/// How the [`TOP_K`] most probable tokens of the base P and of Q agree at one position. A
/// ranking lists token ids by logit, larger first, the lower id first among equal logits (the
/// CPU reference's and every device kernel's order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopAgreement {
    /// Length of the common start of the two rankings: their top K are the same tokens in the
    /// same order for every K up to it (ExLlamaV3's top-K agreement).
    pub same_ranking: u8,
    /// Where the base's top token stands in Q's ranking (1: Q's top token too), 0 beyond
    /// [`TOP_K`].
    pub base_top_rank: u8,
    /// For each K of [`TOP_KS`], how many of the base's top K are among Q's top K.
    pub shared: [u8; 3],
}

impl TopAgreement {
    /// From the two rankings (at most [`TOP_K`] ids each; shorter where the vocabulary is).
    pub fn of(base: &[u32], q: &[u32]) -> Self {
        let same_ranking = base.iter().zip(q).take_while(|(a, b)| a == b).count();
        let base_top_rank = base
            .first()
            .and_then(|t| q.iter().position(|x| x == t))
            .map_or(0, |i| i + 1);
        let shared = TOP_KS.map(|k| {
            let q_top = &q[..k.min(q.len())];
            base.iter().take(k).filter(|t| q_top.contains(t)).count() as u8
        });
        Self {
            same_ranking: same_ranking as u8,
            base_top_rank: base_top_rank as u8,
            shared,
        }
    }
}

/// The ranking of [`TopAgreement`]: the ids of the `k` largest logits of `row`, larger first,
/// the lower id first among equal logits (NaNs never ranked).
pub fn top_ranking(row: &[f32], k: usize) -> Vec<u32> {
    // (logit, id) pairs in ranking order, the worst last.
    let mut top: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (i, &v) in row.iter().enumerate() {
        // Later ids lose ties, so only a strictly larger logit enters a full list.
        if v.is_nan() || (top.len() == k && top.last().is_none_or(|&(w, _)| v <= w)) {
            continue;
        }
        let at = top.partition_point(|&(w, _)| w >= v);
        top.insert(at, (v, i as u32));
        top.truncate(k);
    }
    top.into_iter().map(|(_, i)| i).collect()
}

/// Refuses a top list longer than [`Backend::row_stats`] gives.
pub fn check_row_top(top: usize) -> Result<()> {
    if top > ROW_TOP_MAX {
        return Err(crate::Error::InvalidArgument(format!(
            "row_stats: a top list of {top} tokens (at most {ROW_TOP_MAX})"
        )));
    }
    Ok(())
}

/// Refuses token ids outside an embedding table of `vocab` rows, naming the first one.
pub fn check_token_ids(ids: &[u32], vocab: usize) -> Result<()> {
    match ids.iter().find(|&&id| id as usize >= vocab) {
        Some(&id) => Err(crate::Error::InvalidArgument(format!(
            "token id {id} is outside the model's vocabulary of {vocab}"
        ))),
        None => Ok(()),
    }
}

/// What every device tensor knows of itself: its `[rows, cols]` (a vector is one row).
pub trait Shaped: Sized {
    fn shape(&self) -> [usize; 2];
    /// The same values as `[rows, cols]` (no copy); an error when the counts differ.
    fn reshaped(self, rows: usize, cols: usize) -> Result<Self>;

    fn rows(&self) -> usize {
        self.shape()[0]
    }
    fn cols(&self) -> usize {
        self.shape()[1]
    }
    fn len(&self) -> usize {
        self.rows() * self.cols()
    }
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The columns and the total rows of `Backend::take_rows`'s parts laid end to end; an error
/// where their columns differ or `rows` names a row past them.
pub fn joined_rows<T: Shaped>(parts: &[&T], rows: &[u32]) -> Result<(usize, usize)> {
    let cols = parts.first().map_or(0, |p| p.cols());
    if let Some(p) = parts.iter().find(|p| p.cols() != cols) {
        return Err(crate::Error::InvalidArgument(format!(
            "take_rows: a part of {} columns beside one of {cols}",
            p.cols()
        )));
    }
    let total: usize = parts.iter().map(|p| p.rows()).sum();
    if let Some(&bad) = rows.iter().find(|&&r| r as usize >= total) {
        return Err(crate::Error::InvalidArgument(format!(
            "take_rows: row {bad} of parts holding {total} rows"
        )));
    }
    Ok((cols, total))
}

/// The error of a reshape to `[rows, cols]` of `len` values.
pub fn reshape_error(len: usize, rows: usize, cols: usize) -> crate::Error {
    crate::Error::InvalidArgument(format!("cannot view {len} values as [{rows}, {cols}]"))
}

/// The element type of the tensor an op returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutType {
    /// The backend's activation type.
    Activation,
    /// f32 whatever the activation type: what `Backend::input_type` asks for where a linear
    /// fake-quantizes its input. Rounding that input to bf16 first moves values across the
    /// quantizer's rounding boundaries, a systematic error of several % in PPL for NVFP4
    /// W4A4 that the f32 reference does not have.
    F32,
    /// The values exactly (f32) for a mixture's router, in the activation type for every
    /// other reader: the input of a mixture whose experts do not quantize theirs. A backend
    /// keeps them in the exact form it likes (CUDA's bf16 path: three bf16 planes that sum to
    /// the values, which its router multiplies f32-exactly on the tensor cores, the first one
    /// the values rounded to bf16, what the experts read; f32 elsewhere).
    ExactForRouter,
}

/// The device part of a backend: memory, transfers, synchronisation and copies between
/// devices of one kind. It reports facts (free memory, buffer limits, its own workspace); how
/// many tokens a batch holds is decided from them by `run`.
pub trait Device: Sync {
    /// An activation matrix of the current batch, `[rows, cols]` row-major, that knows its
    /// shape.
    type Tensor: Shaped + Send + Sync;
    /// A linear layer uploaded as stored (packed codes stay packed where the backend can).
    type Linear: Send + Sync;
    /// A batch's sequences (each token's position and its sequence's start), uploaded.
    type Sequences;
    /// A layer's token rows grouped by expert ([`RowGroups`]), uploaded.
    type Groups;

    /// Short name for reports, e.g. `cpu`, `wgpu (NVIDIA H200, Vulkan)`.
    fn name(&self) -> String;
    /// Whether this is the CPU reference, the backend the op checks hold the others to.
    fn is_reference(&self) -> bool {
        false
    }
    /// The precision activations are kept in; checks derive their tolerances from it.
    fn activation_type(&self) -> crate::numerics::FloatType {
        crate::numerics::FloatType::F32
    }
    /// The precision the linears round their operands to (wgpu's one-product mode: f16 over
    /// f32 activations); the checks of linears and models derive their tolerances from it.
    fn product_type(&self) -> crate::numerics::FloatType {
        self.activation_type()
    }

    fn upload_linear(&self, w: &QLinear) -> Result<Self::Linear>;
    /// f32 values as one row `[1, n]` (norm weights, RoPE tables; `reshaped` makes a matrix
    /// of them), which ops read as they are.
    fn upload_vector(&self, name: &str, values: &[f32]) -> Result<Self::Tensor>;
    /// Values in the activation type (rounded to it), as ops hand them on, as one row.
    fn upload_activation(&self, values: &[f32]) -> Result<Self::Tensor> {
        self.upload_vector("activation", values)
    }
    fn upload_sequences(&self, layout: &SeqLayout) -> Result<Self::Sequences>;
    fn upload_groups(&self, groups: &RowGroups) -> Result<Self::Groups>;
    /// An f32 `[rows, cols]` of zeros (an accumulator, like the residual stream).
    fn zeros(&self, rows: usize, cols: usize) -> Result<Self::Tensor> {
        self.upload_vector("zeros", &vec![0.0; rows * cols])?
            .reshaped(rows, cols)
    }
    /// Reads an activation back as f32 (for checks against the CPU reference; never on the
    /// evaluation path).
    fn download(&self, t: &Self::Tensor) -> Result<Vec<f32>>;
    /// The device memory `t` holds (what a cache of tensors counts against its budget).
    fn tensor_bytes(&self, t: &Self::Tensor) -> u64 {
        4 * t.len() as u64
    }
    /// A copy on this device of `t`, which lives on `src` (another device of the same kind):
    /// how pipeline stages hand the residual stream on. The default goes through the host;
    /// backends with a direct device-to-device path override it.
    fn copy_from(&self, src: &Self, t: &Self::Tensor) -> Result<Self::Tensor>
    where
        Self: Sized,
    {
        let [rows, cols] = t.shape();
        self.upload_vector("residual", &src.download(t)?)?
            .reshaped(rows, cols)
    }
    /// Makes the device usable from the calling thread (a CUDA context binding); called by
    /// the scheduler at the start of every worker or pipeline-stage thread.
    fn enter_thread(&self) -> Result<()> {
        Ok(())
    }
    /// Waits until all queued work has finished (for timing; a no-op on synchronous backends).
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    /// Whether this device's first calls at a batch's shapes cost enough to be met while
    /// loading (`Model::load_stage` then runs the first layer on a batch of the first batch's
    /// size as the others load): CUDA, where cuBLAS loads kernel libraries at each GEMM shape's
    /// first call.
    fn warms_up_while_loading(&self) -> bool {
        false
    }

    /// Device memory free for weights and activations, where the backend knows it.
    fn free_memory_bytes(&self) -> Option<u64> {
        None
    }
    /// The largest buffer one op may read or write, where the device limits it.
    fn max_buffer_bytes(&self) -> Option<u64> {
        None
    }
    /// Device memory the backend needs beside the weights and the activations to run a model
    /// of `cfg` (dequantization scratch, logits tiles).
    fn workspace_bytes(&self, cfg: &crate::checkpoint::ModelConfig) -> u64 {
        let _ = cfg;
        0
    }
    /// How f32 GEMM operands are split onto 16-bit tensor cores ([`GemmSplit`]; a linear may
    /// take another, [`Backend::linear_split`]). `None`: f32 GEMMs stay f32.
    fn gemm_split(&self) -> Option<GemmSplit> {
        None
    }
    /// The widest attention head (values per head) the backend's attention takes.
    fn max_head_dim(&self) -> usize {
        usize::MAX
    }
    /// Peak device memory in bytes since the backend was created, where the backend knows it.
    fn peak_memory_bytes(&self) -> Option<u64> {
        None
    }
}

/// How a backend runs products of f32 operands on 16-bit tensor cores: each operand as a
/// high part and a residual, the products summed in f32. What each keeps of a value
/// (`check::gemm_split`) is what `check` expects of a product with an exact 1 (an identity).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmSplit {
    /// Both operands as bf16 high parts and bf16 residuals, `hi·hi + hi·lo + lo·hi` (CUDA's
    /// `--dtype f32-grade`, `split_bf16.cu`).
    Bf16,
    /// Both as f16 parts after a power of two, the high part the mantissa rounded to 10 bits
    /// (to nearest, ties to even, in f32): activation rows' largest magnitude in [1, 2), the
    /// weight by `f16_split_scale` (wgpu's cooperative matrices: split_rows.wgsl,
    /// lib/weight_planes.wgsl); `high_only`: the one-product mode, which multiplies the high
    /// parts alone.
    F16Planes { high_only: bool },
    /// The activation as two f16 parts rounded to nearest after the power of two that puts
    /// its row's largest magnitude in [2^14, 2^15); the weight, bf16-valued, exact in f16, or
    /// with `weight_planes` (other values) split the same way row by row (CUDA's
    /// `split_gemm.cu` on Hopper).
    F16Rows { weight_planes: bool },
}

/// The ops part: what the forward pass is written with, over the device's tensors.
pub trait Backend: Device {
    /// How `w`'s GEMM splits f32 operands (`Device::gemm_split` unless the backend splits some
    /// weights another way).
    fn linear_split(&self, w: &Self::Linear) -> Option<GemmSplit> {
        let _ = w;
        self.gemm_split()
    }

    /// The type in which the op producing the input of `w` should return it (`OutType`).
    fn input_type(&self, w: &Self::Linear) -> OutType {
        let _ = w;
        OutType::Activation
    }

    /// Rows `ids` of a dense table (the token embedding), `[ids.len(), table.in_features]`,
    /// each value times `scale` (rounded to the activation type as transformers multiplies
    /// in the model dtype: Gemma's `sqrt(hidden)`; 1 for the others).
    fn embed(&self, table: &Self::Linear, ids: &[u32], scale: f32) -> Result<Self::Tensor>;
    /// `y = x / rms(x) * weight`, row by row of `x`; `weight` has one value per column.
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        out: OutType,
    ) -> Result<Self::Tensor>;
    /// `y = x W^T + b` for `x` `[rows, in]`, with the layer's declared input-activation
    /// fake quantization applied to `x` first.
    fn linear(&self, x: &Self::Tensor, w: &Self::Linear) -> Result<Self::Tensor>;
    /// `linear(x, w)` for each of `ws` in order: one input read by several layers (q, k and
    /// v; gate and up), which a backend may prepare once for all of them.
    fn linears(&self, x: &Self::Tensor, ws: &[&Self::Linear]) -> Result<Vec<Self::Tensor>> {
        ws.iter().map(|w| self.linear(x, w)).collect()
    }
    /// [`linear`](Self::linear) read back as f32 without rounding to the activation type: a
    /// router's logits, which pick experts on the host.
    fn logits(&self, x: &Self::Tensor, w: &Self::Linear) -> Result<Vec<f32>> {
        self.download(&self.linear(x, w)?)
    }
    /// Routes every row of `x` by `router`'s logits under `rule` and groups the rows by expert
    /// (group `e` = expert `e`; the order of rows inside a group is the backend's), then adds
    /// a last group of every row weighted by `all_rows` where given (a shared expert's
    /// weights). Returns the groups and each group's row count. The default routes on the
    /// host ([`routing::route_on_host`]) from the downloaded f32 logits.
    fn route(
        &self,
        x: &Self::Tensor,
        router: &Self::Linear,
        rule: &RouteRule,
        all_rows: Option<&[f32]>,
    ) -> Result<(Self::Groups, Vec<usize>)> {
        routing::route_on_host(self, x, router, rule, all_rows)
    }
    /// The rows of `x` that group `g` of `groups` names, in the group's order.
    fn gather_group(
        &self,
        x: &Self::Tensor,
        groups: &Self::Groups,
        g: usize,
        out: OutType,
    ) -> Result<Self::Tensor>;
    /// `acc[rows[i]] += weights[i] * y[i]` over group `g`'s rows (its `y` rows in group
    /// order); `acc` is an f32 accumulator from [`Device::zeros`].
    fn scatter_add_group(
        &self,
        acc: &mut Self::Tensor,
        y: &Self::Tensor,
        groups: &Self::Groups,
        g: usize,
    ) -> Result<()>;
    /// `sum_g weights_g * mlps[g](rows of group g)` into a new f32 `[rows of x, cols of x]`
    /// accumulator, each token's terms added in group order as transformers' expert loop
    /// does; `lens` are the groups' row counts from [`route`](Self::route), `mlps[g]` group
    /// `g`'s expert (the routed experts, then the shared one). The default runs expert by
    /// expert ([`mixture_by_group`]).
    fn mixture(
        &self,
        x: &Self::Tensor,
        groups: &Self::Groups,
        lens: &[usize],
        mlps: &[GatedMlp<'_, Self::Linear>],
    ) -> Result<Self::Tensor> {
        mixture_by_group(self, None, x, groups, lens, mlps, 0)
    }
    /// A mixture's sum added into the residual stream where the backend can add each token's
    /// sum as it makes it (`None`; the same values: the sum first, then the add), without an
    /// accumulator's round trip through memory; else the sum (`Some`), for the caller to add
    /// (the forward pass: with the next layer's norm). The default: [`mixture`](Self::mixture).
    fn mixture_into(
        &self,
        _residual: &mut Self::Tensor,
        x: &Self::Tensor,
        groups: &Self::Groups,
        lens: &[usize],
        mlps: &[GatedMlp<'_, Self::Linear>],
    ) -> Result<Option<Self::Tensor>> {
        self.mixture(x, groups, lens, mlps).map(Some)
    }
    /// Rotates `x` `[tokens, heads * span.head_dim]` in place by each token's position, over
    /// the values `span` names in each head (the rest pass through: partial rotary, latent
    /// attention's unrotated part); `cos`/`sin` are `[max_position, span.dims / 2]` tables.
    fn rope(
        &self,
        x: &mut Self::Tensor,
        seqs: &Self::Sequences,
        cos: &Self::Tensor,
        sin: &Self::Tensor,
        span: RotarySpan,
    ) -> Result<()>;
    /// Each `span.head_dim`-wide head of `x` `[tokens, heads * head_dim]` RMS-normed with
    /// `weight` (`[head_dim]`) into the activation type, then rotated as [`rope`](Self::rope)
    /// rotates it: Qwen3's and Gemma 3's q/k norms and the RoPE after them, which a backend
    /// may run as one pass over `x` ([`norm_then_rope`] otherwise).
    #[allow(clippy::too_many_arguments)]
    fn norm_rope(
        &self,
        x: Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        seqs: &Self::Sequences,
        cos: &Self::Tensor,
        sin: &Self::Tensor,
        span: RotarySpan,
    ) -> Result<Self::Tensor> {
        norm_then_rope(self, x, weight, eps, seqs, cos, sin, span)
    }
    /// A `[rows, cols]` tensor in type `out`, zero but where `parts` copy column blocks of
    /// their sources (each of `rows` rows) into it: how latent attention cuts its latent,
    /// assembles keys from per-head and shared parts, pads values to the key width and cuts
    /// the padding off again.
    fn assemble_columns(
        &self,
        rows: usize,
        cols: usize,
        parts: &[(&Self::Tensor, ColumnBlocks)],
        out: OutType,
    ) -> Result<Self::Tensor>;
    /// The rows of `parts` laid end to end that `rows` names (indices into that
    /// concatenation), in that order, in the parts' own element type (every part has the same
    /// columns and type): a batch's keys and values joined to those of rows an earlier batch
    /// computed (serve's prefix cache), and a batch's rows taken out of the attention's.
    fn take_rows(&self, parts: &[&Self::Tensor], rows: &[u32]) -> Result<Self::Tensor>;
    /// Causal self-attention inside each sequence as `spec` says (scale, soft-capping,
    /// sliding window); `q` is `[tokens, heads * head_dim]`, `k` and `v`
    /// `[tokens, kv_heads * head_dim]`; `sinks` (`[1, heads]` f32, gpt-oss) adds one logit per
    /// head to every softmax's denominator.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        seqs: &Self::Sequences,
        spec: AttnSpec,
        sinks: Option<&Self::Tensor>,
        out: OutType,
    ) -> Result<Self::Tensor>;
    /// [`attention`](Self::attention) with each query restricted to the keys `keys` names
    /// (`[tokens, n]`, as [`index_top_k`](Self::index_top_k) gives them: positions in the
    /// query's sequence, ascending, then -1s); DeepSeek sparse attention. Its values may be
    /// narrower than its keys (`v` `[tokens, kv_heads * v_dim]`, [`AttnSpec::value_dim`]; the
    /// output `[tokens, heads * v_dim]`): latent attention attends over the latent as one key
    /// head, its values the latent's first columns. `k` and `v` may hold rows past the
    /// batch's tokens, which a position past the query names as any other (`start + p`):
    /// DeepSeek-V4's compressed entries after them. `sinks` as in `attention`. Its cost grows
    /// with the keys selected, not with the window. `spec`'s window is not supported.
    #[allow(clippy::too_many_arguments)]
    fn sparse_attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        seqs: &Self::Sequences,
        spec: AttnSpec,
        keys_and_sinks: (&Self::Tensor, Option<&Self::Tensor>),
        out: OutType,
    ) -> Result<Self::Tensor>;
    /// DeepSeek sparse attention's selection (`IndexSpec`): for each query row of `q`
    /// (`[tokens, heads * head_dim]`), its sequence's keys up to itself in `k` (`[tokens,
    /// head_dim]`) scored with the heads weighed by `weights` (`[tokens, heads]`); returns
    /// `[tokens, top_k]` f32: the positions (in the query's sequence) of its `top_k` best keys,
    /// ascending, a higher score first and at equal scores the earlier key; every key up to
    /// the query where there are no more than `top_k`, the row's rest -1.
    fn index_top_k(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        weights: &Self::Tensor,
        seqs: &Self::Sequences,
        spec: IndexSpec,
    ) -> Result<Self::Tensor>;
    /// DeepSeek-V4's hyper-connections: `out[r, k] = sum_j weights[r, j * m + k] *
    /// streams[r, j]` (summed in stream order) over the `n` streams of `d` values of each row
    /// of `streams` (`[rows, n * d]`, f32; `weights` `[rows, n * m]` f32), plus `scales[r, k] *
    /// x[r]` where `added` is `(x [rows, d], scales [rows, m])`; `[rows, m * d]` f32. `m` 1: the
    /// streams collapsed into a block's input; `m = n`: the streams mixed and the block's
    /// output spread over them.
    fn mix_streams(
        &self,
        streams: &Self::Tensor,
        weights: &Self::Tensor,
        added: Option<(&Self::Tensor, &Self::Tensor)>,
        m: usize,
    ) -> Result<Self::Tensor>;
    /// DeepSeek-V4's hyper-connection weights `[pre, post, comb]` (`[rows, n]`, `[rows, n]`,
    /// `[rows, n * n]` f32) from `mix`'s f32 outputs over `x`, under `rule`
    /// ([`compressed::HyperRule`]). The default computes them on the host from the
    /// downloaded outputs.
    fn hyper_weights(
        &self,
        x: &Self::Tensor,
        mix: &Self::Linear,
        rule: &compressed::HyperRule,
    ) -> Result<[Self::Tensor; 3]> {
        compressed::hyper_weights_on_host(self, x, mix, rule)
    }
    /// Each query's keys in a DeepSeek-V4 compressed layer as `sparse_attention` reads them
    /// (`[tokens, width]` f32: [`compressed::key_lists`]): its window of `window` tokens, then
    /// `entries`. The default builds them on the host (the indexer's picks downloaded).
    fn compressed_keys(
        &self,
        (_, layout): (&Self::Sequences, &SeqLayout),
        window: usize,
        entries: compressed::EntryKeys<'_, Self::Tensor>,
    ) -> Result<Self::Tensor> {
        compressed::compressed_keys_on_host(self, layout, window, entries)
    }
    /// DeepSeek-V4's compressor: each sequence's tokens pooled in windows of `rate`, each
    /// value of an entry the softmax over the window's tokens (in f32) of `gate + bias[slot]`
    /// weighing `kv`, where `kv` and `gate` are `[tokens, w]` (`bias` `[rate, w]` f32); with
    /// `overlap` they are `[tokens, 2 w]` and entry `e` pools the first halves of window `e -
    /// 1` (slots `0..rate`) with the second halves of window `e` (slots `rate..2 rate`: CSA's
    /// two series; `windows` is `(rate, overlap)`). Entry `e` of a sequence starting at row
    /// `start` is row `start + e` of the `[tokens, w]` f32 result; rows past a sequence's whole
    /// windows are zero.
    fn pool_windows(
        &self,
        kv: &Self::Tensor,
        gate: &Self::Tensor,
        bias: &Self::Tensor,
        seqs: &Self::Sequences,
        windows: (usize, bool),
    ) -> Result<Self::Tensor>;
    /// LayerNorm of each row: `(x - mean) / sqrt(var + eps) * weight + bias` (`weight` and
    /// `bias` `[cols]` f32, the variance biased): DeepSeek's indexer's key norm.
    fn layer_norm(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        bias: &Self::Tensor,
        eps: f32,
        out: OutType,
    ) -> Result<Self::Tensor>;
    /// Depthwise causal convolution inside each sequence: `y[t, c] = act(bias[c] + sum_j
    /// weight[c, j] * x[t - K + 1 + j, c])` for `weight` `[channels, K]` and `bias` `[1,
    /// channels]` (f32), taps before the sequence's first token reading zeros (each sequence
    /// starts from nothing, as the reference runs it alone); `act` SiLU where `silu` (gated
    /// DeltaNet's `conv1d`), else none (LFM2's short convolution).
    fn causal_conv(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        bias: Option<&Self::Tensor>,
        silu: bool,
        seqs: &Self::Sequences,
        out: OutType,
    ) -> Result<Self::Tensor>;
    /// A gated linear recurrence over each sequence from a zero state: the delta rule or
    /// Mamba-2's scan (`gates.rule`; `recurrent::delta_rule_steps` says what it computes; a
    /// backend may run it chunked); `qkv` `[tokens, net.conv_width()]` holds queries, keys and
    /// values side by side as the convolution gives them, in the rule's order. Returns
    /// `[tokens, net.value_width()]`.
    fn linear_recurrence(
        &self,
        qkv: &Self::Tensor,
        gates: RecurrenceGates<'_, Self::Tensor>,
        seqs: &Self::Sequences,
        net: DeltaNetConfig,
        out: OutType,
    ) -> Result<Self::Tensor>;
    /// `x` gated by `gate` (the same shape) as `how` says and RMS-normed in groups of `group`
    /// values, times `weight` (repeated along the row where shorter).
    #[allow(clippy::too_many_arguments)]
    fn gated_rms_norm(
        &self,
        x: &Self::Tensor,
        gate: &Self::Tensor,
        weight: &Self::Tensor,
        group: usize,
        how: NormGate,
        eps: f32,
        out: OutType,
    ) -> Result<Self::Tensor>;
    /// `act(gate) * up`, elementwise; with `up` `None`, `gate` holds gate and up interleaved
    /// (`[rows, 2n]`, gate the even columns) and the result is `[rows, n]`.
    fn gated_act(
        &self,
        gate: &Self::Tensor,
        up: Option<&Self::Tensor>,
        act: GatedActivation,
        out: OutType,
    ) -> Result<Self::Tensor>;
    /// `x[r, c] *= scales[c]` in place, rounded to `x`'s type; `scales` is `[1, cols]` f32:
    /// Falcon-H1's muP multipliers on a projection's output.
    fn scale_columns(&self, x: &mut Self::Tensor, scales: &Self::Tensor) -> Result<()>;
    /// `linear(act(gate) * up, w)` (`gated_act`'s operands), gate and up consumed: a gated
    /// MLP's down projection and the activation it reads, which a backend may fuse (CUDA
    /// under split GEMMs writes the activation straight as the GEMM's split operand).
    fn gated_linear(
        &self,
        gate: Self::Tensor,
        up: Option<Self::Tensor>,
        act: GatedActivation,
        w: &Self::Linear,
    ) -> Result<Self::Tensor> {
        let h = self.gated_act(&gate, up.as_ref(), act, self.input_type(w))?;
        drop((gate, up));
        self.linear(&h, w)
    }
    /// `x += y` (the residual stream).
    fn add_assign(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()>;
    /// `x += y`, then `rms_norm(x)`: a residual update and the norm that reads it next, which
    /// a backend may fuse into one pass over the residual stream.
    fn add_rms_norm(
        &self,
        x: &mut Self::Tensor,
        y: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        out: OutType,
    ) -> Result<Self::Tensor> {
        self.add_assign(x, y)?;
        self.rms_norm(x, weight, eps, out)
    }
    /// Fused lm_head + log-softmax + gather: for every row with `targets[row] >= 0`, the
    /// negative log-probability of that target, in row order. Logits stay on the device.
    fn nll(
        &self,
        hidden: &Self::Tensor,
        head: Head<'_, Self::Linear>,
        targets: &[i32],
    ) -> Result<Vec<f32>>;
    /// [`RowStats`] of every row of `hidden` with `targets[row] >= 0`, in row order, each with
    /// its `top` (at most [`ROW_TOP_MAX`]) most likely tokens: the logits (`head`'s, `vocab`
    /// wide, soft-capped where it says) reduced where they are made, so that only these leave
    /// the device (`serve`'s log-probabilities and top lists). The default reduces them on the
    /// host ([`reduce_logits_on_host`]).
    fn row_stats(
        &self,
        hidden: &Self::Tensor,
        head: Head<'_, Self::Linear>,
        targets: &[i32],
        (vocab, top): (usize, usize),
    ) -> Result<Vec<RowStats>> {
        check_row_top(top)?;
        let scored: Vec<u32> = (0..targets.len() as u32)
            .filter(|&r| targets[r as usize] >= 0)
            .collect();
        let logits = (head, self.input_type(head.linear), vocab);
        reduce_logits_on_host(self, hidden, &scored, logits, |row, k| {
            RowStats::of(row, targets[scored[k] as usize] as usize, top)
        })
    }
    /// KL divergence and friends between a base model's and a test model's next-token
    /// distributions at every row with `targets[row] >= 0` (full vocabulary, exact). Both
    /// heads have the same vocabulary (`Model::kld_against` checks).
    fn kld(
        &self,
        base_hidden: &Self::Tensor,
        base_head: Head<'_, Self::Linear>,
        hidden: &Self::Tensor,
        head: Head<'_, Self::Linear>,
        targets: &[i32],
    ) -> Result<Vec<KldTerms>>;
}

#[cfg(test)]
mod tests {
    use super::{SeqLayout, TOP_K, TopAgreement, top_ranking};

    /// The ranking by a whole sort of (logit descending, id ascending), NaNs left out.
    fn sorted_ranking(row: &[f32], k: usize) -> Vec<u32> {
        let mut ids: Vec<u32> = (0..row.len() as u32)
            .filter(|&i| !row[i as usize].is_nan())
            .collect();
        // IEEE order (-0 equals +0, as the kernels compare), NaNs already out.
        let by = |a: u32, b: u32| row[b as usize].partial_cmp(&row[a as usize]);
        ids.sort_by(|&a, &b| by(a, b).expect("no NaN").then(a.cmp(&b)));
        ids.truncate(k);
        ids
    }

    /// `top_ranking` equals a whole sort's first K, on rows with many equal logits (values
    /// rounded to a coarse grid), NaNs and vocabularies shorter than K.
    #[test]
    fn top_ranking_is_the_sorted_order_with_lower_ids_first_on_ties() {
        let mut rng = crate::rng::Rng::new(11);
        for (len, grid) in [(3, 1.0), (40, 0.5), (1000, 4.0), (1000, 0.01), (4097, 8.0)] {
            let mut row: Vec<f32> = rng
                .normal_vec(len, 2.0)
                .iter()
                .map(|v| (v * grid).round() / grid)
                .collect();
            row[len / 2] = f32::NAN;
            for k in [1, 5, TOP_K] {
                assert_eq!(
                    top_ranking(&row, k),
                    sorted_ranking(&row, k),
                    "len {len} k {k}"
                );
            }
        }
    }

    /// The agreement of two rankings counted directly from its definitions.
    #[test]
    fn top_agreement_counts_prefix_rank_and_overlaps() {
        let base = [7, 3, 9, 1, 4, 5, 6, 8, 2, 0];
        let q = [7, 3, 1, 9, 4, 11, 12, 13, 14, 5];
        let a = TopAgreement::of(&base, &q);
        assert_eq!(a.same_ranking, 2);
        assert_eq!(a.base_top_rank, 1);
        // K=5: {7,3,9,1,4} vs {7,3,1,9,4}: 5; K=10: those and 5.
        assert_eq!(a.shared, [1, 5, 6]);
        let b = TopAgreement::of(&base, &[3, 9, 1, 4, 5, 6, 8, 2, 0, 10]);
        assert_eq!(
            (b.same_ranking, b.base_top_rank, b.shared),
            (0, 0, [0, 4, 9])
        );
        let c = TopAgreement::of(&base, &[3, 7, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!((c.same_ranking, c.base_top_rank, c.shared[0]), (0, 2, 0));
        let same = TopAgreement::of(&base[..3], &base[..3]);
        assert_eq!((same.same_ranking, same.shared), (3, [1, 3, 3]));
    }

    /// Chunks start at each sequence's first token, none is empty, and a sequence shorter than
    /// a chunk (or empty) is one chunk (or none).
    #[test]
    fn chunks_follow_the_sequences() {
        let layout = SeqLayout::from_lengths([5, 0, 2, 4]);
        let (bounds, firsts) = layout.chunks(2);
        assert_eq!(bounds, [0, 2, 4, 5, 7, 9, 11]);
        assert_eq!(firsts, [0, 3, 3, 4, 6]);
    }
}
