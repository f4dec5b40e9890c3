//! The reference backend: plain f32 values, f64 reductions, rayon threads. Obviously correct
//! first, fast enough second; every GPU kernel is checked against it.

use rayon::prelude::*;

use super::{
    AttnSpec, Backend, ColumnBlocks, Device, Head, IndexSpec, KldTerms, NormGate, OutType,
    Recurrence, RecurrenceGates, RotarySpan, RowGroups, SeqLayout, Shaped, TOP_K, TopAgreement,
    recurrent, softcap, top_ranking,
};
use crate::checkpoint::{DeltaNetConfig, GatedActivation, QLinear};
use crate::numerics::{ActQuant, FloatType};
use crate::{Error, Result};

/// Tokens per block in the matmuls: a weight row is read once per block.
const TOKEN_BLOCK: usize = 16;

#[derive(Default)]
pub struct CpuBackend;

pub struct CpuLinear {
    out_features: usize,
    in_features: usize,
    /// Dequantized `[out, in]` weight, exactly the reference values.
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    act_quant: Option<ActQuant>,
    dense: bool,
    name: String,
}

impl CpuBackend {
    pub fn new() -> Self {
        Self
    }
}

/// A `[rows, cols]` matrix of f32 values on the host.
#[derive(Clone, Debug)]
pub struct CpuTensor {
    data: Vec<f32>,
    rows: usize,
    cols: usize,
}

impl CpuTensor {
    fn new(data: Vec<f32>, cols: usize) -> Self {
        let rows = data.len().checked_div(cols).unwrap_or(0);
        Self { data, rows, cols }
    }
}

impl Shaped for CpuTensor {
    fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    fn reshaped(self, rows: usize, cols: usize) -> Result<Self> {
        if rows * cols != self.data.len() {
            return Err(super::reshape_error(self.data.len(), rows, cols));
        }
        Ok(Self {
            data: self.data,
            rows,
            cols,
        })
    }
}

/// An error unless `t` has `cols` columns (and `rows` rows, where given).
fn expect_shape(t: &CpuTensor, rows: Option<usize>, cols: usize, what: &str) -> Result<()> {
    if t.cols != cols || rows.is_some_and(|r| r != t.rows) {
        return Err(Error::InvalidArgument(format!(
            "cpu {what}: expected [{}, {cols}], got [{}, {}]",
            rows.map_or("rows".to_string(), |r| r.to_string()),
            t.rows,
            t.cols
        )));
    }
    Ok(())
}

/// Dot product with f64 accumulation in 8 independent lanes (fixed order: deterministic).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let n8 = a.len() / 8 * 8;
    for (ca, cb) in a[..n8].chunks_exact(8).zip(b[..n8].chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += ca[l] as f64 * cb[l] as f64;
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in n8..a.len() {
        s += a[i] as f64 * b[i] as f64;
    }
    s
}

/// `y[t, o] = sum_i x[t, i] w[o, i]`, blocked over tokens, parallel over token blocks.
fn matmul_xwt(x: &[f32], w: &[f32], n_in: usize, n_out: usize) -> Vec<f32> {
    let rows = x.len() / n_in;
    let mut y = vec![0f32; rows * n_out];
    y.par_chunks_mut(TOKEN_BLOCK * n_out)
        .zip(x.par_chunks(TOKEN_BLOCK * n_in))
        .for_each(|(yb, xb)| matmul_block(xb, w, n_in, n_out, yb));
    y
}

/// One token block. The AVX-512 or AVX2 build of the same loop is chosen at run time;
/// without contraction to FMA every build gives bit-identical results, just faster.
fn matmul_block(xb: &[f32], w: &[f32], n_in: usize, n_out: usize, yb: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F, checked just above.
            unsafe { matmul_block_avx512(xb, w, n_in, n_out, yb) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            unsafe { matmul_block_avx2(xb, w, n_in, n_out, yb) };
            return;
        }
    }
    matmul_block_portable(xb, w, n_in, n_out, yb);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn matmul_block_avx512(xb: &[f32], w: &[f32], n_in: usize, n_out: usize, yb: &mut [f32]) {
    matmul_block_portable(xb, w, n_in, n_out, yb);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn matmul_block_avx2(xb: &[f32], w: &[f32], n_in: usize, n_out: usize, yb: &mut [f32]) {
    matmul_block_portable(xb, w, n_in, n_out, yb);
}

/// Tokens whose dot products with one weight row run together (each weight chunk is loaded
/// and widened once for all of them); every product is still `dot`'s, term for term.
const DOT_TOKENS: usize = 8;

#[inline(always)]
fn matmul_block_portable(xb: &[f32], w: &[f32], n_in: usize, n_out: usize, yb: &mut [f32]) {
    let nt = xb.len() / n_in;
    let grouped = nt / DOT_TOKENS * DOT_TOKENS;
    // The block's activations widened once, not once per weight row.
    let x64: Vec<f64> = xb[..grouped * n_in].iter().map(|&v| v as f64).collect();
    for (o, wr) in w.chunks_exact(n_in).enumerate() {
        for t in (0..grouped).step_by(DOT_TOKENS) {
            let d = dots(&x64[t * n_in..(t + DOT_TOKENS) * n_in], wr);
            for (k, v) in d.into_iter().enumerate() {
                yb[(t + k) * n_out + o] = v as f32;
            }
        }
        for t in grouped..nt {
            yb[t * n_out + o] = dot(&xb[t * n_in..(t + 1) * n_in], wr) as f32;
        }
    }
}

/// `dot(x_k, w)` of the `DOT_TOKENS` rows `x_k` (widened to f64) laid end to end in `xs`,
/// with `dot`'s lanes, order of additions and final sum.
#[inline(always)]
fn dots(xs: &[f64], w: &[f32]) -> [f64; DOT_TOKENS] {
    let n = w.len();
    let n8 = n / 8 * 8;
    let rows: [&[f64]; DOT_TOKENS] = std::array::from_fn(|k| &xs[k * n..(k + 1) * n]);
    let mut acc = [[0f64; 8]; DOT_TOKENS];
    for (c, wc) in w[..n8].chunks_exact(8).enumerate() {
        let wc: [f64; 8] = std::array::from_fn(|l| wc[l] as f64);
        for (a, row) in acc.iter_mut().zip(rows) {
            let xc: &[f64; 8] = row[8 * c..8 * c + 8].try_into().expect("8 values");
            for l in 0..8 {
                a[l] += xc[l] * wc[l];
            }
        }
    }
    std::array::from_fn(|k| {
        let a = &acc[k];
        let mut s = (a[0] + a[4]) + (a[1] + a[5]) + ((a[2] + a[6]) + (a[3] + a[7]));
        for i in n8..n {
            s += rows[k][i] * w[i] as f64;
        }
        s
    })
}

/// log-sum-exp of a logit row in f64, and its first maximum.
fn logsumexp(logits: &[f32]) -> (f64, usize) {
    let (mut imax, mut max) = (0, f32::NEG_INFINITY);
    for (i, &v) in logits.iter().enumerate() {
        if v > max {
            max = v;
            imax = i;
        }
    }
    let m = max as f64;
    let s: f64 = logits.iter().map(|&v| (v as f64 - m).exp()).sum();
    (m + s.ln(), imax)
}

/// Logits `[block.len(), vocab]` of the hidden rows listed in `block`.
/// The logits of rows `block` of `hidden`, soft-capped where the head says so.
fn block_logits(hidden: &[f32], head: Head<'_, CpuLinear>, block: &[usize]) -> Vec<f32> {
    let w = head.linear;
    let n_in = w.in_features;
    let x: Vec<f32> = block
        .iter()
        .flat_map(|&r| hidden[r * n_in..(r + 1) * n_in].iter().copied())
        .collect();
    let mut logits = matmul_xwt(&x, &w.weight, n_in, w.out_features);
    if let Some(cap) = head.softcap {
        logits.iter_mut().for_each(|l| *l = softcap(*l, cap));
    }
    logits
}

/// The gated MLP's `act(g) * u`: SiLU in f32 as torch computes it, GELU-tanh's formula in
/// f64 rounded once, gpt-oss's clamped SwiGLU op by op in f32 as transformers writes it.
pub fn gated(act: GatedActivation, g: f32, u: f32) -> f32 {
    match act {
        GatedActivation::Silu => g / (1.0 + (-g).exp()) * u,
        GatedActivation::GeluTanh => {
            let x = g as f64;
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            (0.5 * x * (1.0 + inner.tanh())) as f32 * u
        }
        GatedActivation::ClampedSwiglu { alpha, limit } => {
            let g = g.min(limit);
            let u = u.clamp(-limit, limit);
            let glu = g * (1.0 / (1.0 + (-(g * alpha)).exp()));
            (u + 1.0) * glu
        }
        GatedActivation::ClampedSilu { limit } => {
            let g = g.min(limit);
            g / (1.0 + (-g).exp()) * u.clamp(-limit, limit)
        }
        GatedActivation::Sigmoid => 1.0 / (1.0 + (-g).exp()) * u,
        GatedActivation::Product => g * u,
        // Ungated: `u` is not read.
        GatedActivation::Relu2 => {
            let r = g.max(0.0);
            r * r
        }
    }
}

/// The sequence of each token row of `layout`.
fn seq_of_rows(layout: &SeqLayout) -> Vec<usize> {
    (0..layout.n_seqs())
        .flat_map(|s| std::iter::repeat_n(s, layout.starts[s + 1] - layout.starts[s]))
        .collect()
}

/// Attention of every query row `t` over the key rows `keys(t)` (its sequence's, in
/// order), in f64: `Backend::attention` and `sparse_attention`.
fn attend(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    layout: &SeqLayout,
    spec: AttnSpec,
    sinks: Option<&CpuTensor>,
    (keys, v_dim): (impl Fn(usize) -> Vec<usize> + Sync, usize),
) -> Result<CpuTensor> {
    let AttnSpec {
        heads,
        kv_heads,
        head_dim: d,
        ..
    } = spec;
    let t = layout.n_tokens();
    expect_shape(q, Some(t), heads * d, "attention q")?;
    // Keys and values may hold rows past the tokens (`Backend::sparse_attention`).
    expect_shape(k, None, kv_heads * d, "attention k")?;
    expect_shape(v, Some(k.rows()), kv_heads * v_dim, "attention v")?;
    if k.rows() < t {
        return Err(Error::InvalidArgument(format!(
            "attention: {} key rows for {t} tokens",
            k.rows()
        )));
    }
    let (q, k, v) = (&q.data, &k.data, &v.data);
    let group = heads / kv_heads;
    let scale = spec.scale as f64;
    let cap = spec.softcap.map(f64::from);
    let (qw, kw, vw, ow) = (heads * d, kv_heads * d, kv_heads * v_dim, heads * v_dim);
    let sinks = sinks.map(|s| &s.data);
    let mut out = vec![0f32; t * ow];
    // One task per token row.
    out.par_chunks_mut(ow.max(1))
        .enumerate()
        .for_each(|(t, orow)| {
            let rows = keys(t);
            let mut scores = vec![0f64; rows.len()];
            let mut acc = vec![0f64; v_dim];
            for h in 0..heads {
                let kh = h / group;
                let qv = &q[t * qw + h * d..t * qw + (h + 1) * d];
                let mut max = f64::NEG_INFINITY;
                for (s, &kr) in scores.iter_mut().zip(&rows) {
                    *s = dot(qv, &k[kr * kw + kh * d..kr * kw + (kh + 1) * d]) * scale;
                    if let Some(c) = cap {
                        *s = c * (*s / c).tanh();
                    }
                    max = max.max(*s);
                }
                // A sink is one more logit in the denominator, with no value.
                let sink = sinks.map(|s| s[h] as f64);
                if let Some(l) = sink {
                    max = max.max(l);
                }
                let mut sum = sink.map_or(0.0, |l| (l - max).exp());
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                // Each output value sums its products over the keys in order; the keys are
                // the outer loop so that a value row is read contiguously.
                acc.iter_mut().for_each(|a| *a = 0.0);
                for (&p, &kr) in scores.iter().zip(&rows) {
                    let vr = &v[kr * vw + kh * v_dim..kr * vw + (kh + 1) * v_dim];
                    for (a, &x) in acc.iter_mut().zip(vr) {
                        *a += p * x as f64;
                    }
                }
                for (ov, a) in orow[h * v_dim..(h + 1) * v_dim].iter_mut().zip(&acc) {
                    *ov = (a / sum) as f32;
                }
            }
        });
    Ok(CpuTensor::new(out, ow))
}

/// The lightning indexer's score of one key `k` for a query `q` of `spec.heads` heads
/// weighed by `w` (`IndexSpec`), in f64.
pub fn index_score(q: &[f32], k: &[f32], w: &[f32], spec: IndexSpec) -> f64 {
    let d = spec.head_dim;
    let sum: f64 = w
        .iter()
        .zip(q.chunks_exact(d))
        .map(|(&w, qh)| {
            let s = (dot(qh, k) * spec.scale as f64).max(0.0);
            w as f64 * spec.weight_scale as f64 * s
        })
        .sum();
    // -0 as +0 (a negative weight times a zero): equal scores, as the GPU kernels rank them.
    sum + 0.0
}

/// `Backend::linear_recurrence` on the host, each (sequence, value head) computed by `form`
/// (`recurrent::delta_rule_steps`, or the chunked form `check` compares with it).
pub fn linear_recurrence_in(
    qkv: &CpuTensor,
    gates: RecurrenceGates<'_, CpuTensor>,
    layout: &SeqLayout,
    net: DeltaNetConfig,
    form: impl Fn(&recurrent::DeltaInputs) -> Vec<f64> + Sync,
) -> Result<CpuTensor> {
    let n = layout.n_tokens();
    let (hv, dk, dv) = (net.v_heads, net.k_dim, net.v_dim);
    // Decays a value head and token: 1, or one a key channel.
    let dw = gates.rule.decay_width(net);
    let per = dw / hv;
    expect_shape(qkv, Some(n), net.conv_width(), "linear_recurrence qkv")?;
    expect_shape(gates.a, Some(n), dw, "linear_recurrence a")?;
    expect_shape(gates.a_log, Some(1), hv, "linear_recurrence A_log")?;
    expect_shape(gates.dt_bias, Some(1), dw, "linear_recurrence dt_bias")?;
    match gates.rule {
        Recurrence::Delta { b, .. } => expect_shape(b, Some(n), hv, "linear_recurrence b")?,
        Recurrence::Ssd { d, .. } => expect_shape(d, Some(1), hv, "linear_recurrence D")?,
    }
    let w = net.conv_width();
    let [q_at, k_at, v_at] = gates.rule.offsets(net);
    // One task per (sequence, value head); the heads' outputs are interleaved after.
    let tasks: Vec<(usize, usize)> = (0..layout.n_seqs())
        .flat_map(|s| (0..hv).map(move |h| (s, h)))
        .collect();
    let outs: Vec<Vec<f64>> = tasks
        .par_iter()
        .map(|&(s, h)| {
            let rows = layout.starts[s]..layout.starts[s + 1];
            let kh = net.key_head(h);
            let head = |t: usize, from: usize, d: usize| &qkv.data[t * w + from..t * w + from + d];
            // The delta rule L2-normalizes queries and keys (queries scaled); Mamba-2 does not.
            let delta = matches!(gates.rule, Recurrence::Delta { .. });
            let normed = |x: &[f32], scale: f64| -> Vec<f64> {
                match delta {
                    true => recurrent::l2_normalized(x, scale),
                    false => x.iter().map(|&v| v as f64).collect(),
                }
            };
            let scale = 1.0 / (dk as f64).sqrt();
            let q: Vec<f64> = rows
                .clone()
                .flat_map(|t| normed(head(t, q_at + kh * dk, dk), scale))
                .collect();
            let k: Vec<f64> = rows
                .clone()
                .flat_map(|t| normed(head(t, k_at + kh * dk, dk), 1.0))
                .collect();
            let v: Vec<f64> = rows
                .clone()
                .flat_map(|t| head(t, v_at + h * dv, dv).iter().map(|&x| x as f64))
                .collect();
            let a_log = gates.a_log.data[h];
            let dt_bias = &gates.dt_bias.data[h * per..(h + 1) * per];
            // Each token's `per` log decays, and its update strength.
            let mut g = Vec::with_capacity(rows.len() * per);
            let beta: Vec<f64> = rows
                .clone()
                .map(|t| {
                    let a = &gates.a.data[t * dw + h * per..t * dw + (h + 1) * per];
                    let mut beta = 0.0;
                    for (&a, &bias) in a.iter().zip(dt_bias) {
                        let (gi, b) = match gates.rule {
                            Recurrence::Delta { b, lower_bound, .. } => {
                                let b = b.data[t * hv + h];
                                match lower_bound {
                                    Some(lb) => recurrent::safe_gates(a, b, a_log, bias, lb),
                                    None => recurrent::gates(a, b, a_log, bias),
                                }
                            }
                            Recurrence::Ssd { dt_min, dt_max, .. } => {
                                recurrent::ssd_gates(a, a_log, bias, dt_min, dt_max)
                            }
                        };
                        g.push(gi as f64);
                        beta = b as f64;
                    }
                    beta
                })
                .collect();
            let inputs = recurrent::DeltaInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
                dk,
                dv,
                delta,
                per_key: per > 1,
            };
            let mut o = form(&inputs);
            // Mamba's skip: D times the head's input.
            if let Recurrence::Ssd { d, .. } = gates.rule {
                let d = d.data[h] as f64;
                o.iter_mut().zip(&v).for_each(|(o, &x)| *o += d * x);
            }
            o
        })
        .collect();
    let mut y = vec![0f32; n * hv * dv];
    for (&(s, h), o) in tasks.iter().zip(&outs) {
        for (i, t) in (layout.starts[s]..layout.starts[s + 1]).enumerate() {
            for j in 0..dv {
                y[t * hv * dv + h * dv + j] = o[i * dv + j] as f32;
            }
        }
    }
    Ok(CpuTensor::new(y, hv * dv))
}

fn scored_rows(targets: &[i32]) -> Vec<usize> {
    (0..targets.len()).filter(|&r| targets[r] >= 0).collect()
}

impl Device for CpuBackend {
    type Tensor = CpuTensor;
    type Linear = CpuLinear;
    type Sequences = SeqLayout;
    type Groups = RowGroups;

    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn is_reference(&self) -> bool {
        true
    }

    fn upload_linear(&self, w: &QLinear) -> Result<CpuLinear> {
        Ok(CpuLinear {
            out_features: w.out_features,
            in_features: w.in_features,
            weight: w.dequantize()?,
            bias: w.bias_f32()?,
            act_quant: w.act_quant,
            dense: matches!(w.packing, crate::checkpoint::Packing::Dense { .. }),
            name: w.name.to_string(),
        })
    }

    fn upload_vector(&self, _name: &str, values: &[f32]) -> Result<CpuTensor> {
        Ok(CpuTensor {
            data: values.to_vec(),
            rows: 1,
            cols: values.len(),
        })
    }

    fn upload_sequences(&self, layout: &SeqLayout) -> Result<SeqLayout> {
        Ok(layout.clone())
    }

    fn upload_groups(&self, groups: &RowGroups) -> Result<RowGroups> {
        Ok(groups.clone())
    }

    fn download(&self, t: &CpuTensor) -> Result<Vec<f32>> {
        Ok(t.data.clone())
    }
}

impl Backend for CpuBackend {
    fn embed(&self, table: &CpuLinear, ids: &[u32], scale: f32) -> Result<CpuTensor> {
        if !table.dense {
            return Err(Error::unsupported(
                &table.name,
                "embedding",
                "a quantized embedding table",
            ));
        }
        super::check_token_ids(ids, table.out_features)?;
        let h = table.in_features;
        let mut out = Vec::with_capacity(ids.len() * h);
        for &id in ids {
            let id = id as usize;
            out.extend(
                table.weight[id * h..(id + 1) * h]
                    .iter()
                    .map(|&v| v * scale),
            );
        }
        Ok(CpuTensor::new(out, h))
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuTensor, eps: f32, _out: OutType) -> Result<CpuTensor> {
        let cols = x.cols;
        expect_shape(w, Some(1), cols, "rms_norm weight")?;
        let mut y = x.clone();
        y.data.par_chunks_mut(cols.max(1)).for_each(|row| {
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64;
            // transformers: x * rsqrt(mean(x^2) + eps) in f32, then weight * that.
            let inv = (1.0 / (ms as f32 + eps).sqrt() as f64) as f32;
            for (v, &g) in row.iter_mut().zip(&w.data) {
                *v = g * (*v * inv);
            }
        });
        Ok(y)
    }

    fn linear(&self, x: &CpuTensor, w: &CpuLinear) -> Result<CpuTensor> {
        expect_shape(x, None, w.in_features, &format!("{} input", w.name))?;
        let quantized;
        let x = match &w.act_quant {
            None => &x.data,
            Some(aq) => {
                let mut q = x.data.clone();
                q.par_chunks_mut(w.in_features)
                    .for_each(|row| aq.apply_row(row, FloatType::F32));
                quantized = q;
                &quantized
            }
        };
        let mut y = matmul_xwt(x, &w.weight, w.in_features, w.out_features);
        if let Some(b) = &w.bias {
            y.par_chunks_mut(w.out_features).for_each(|row| {
                for (v, bv) in row.iter_mut().zip(b) {
                    *v += bv;
                }
            });
        }
        Ok(CpuTensor::new(y, w.out_features))
    }

    fn rope(
        &self,
        x: &mut CpuTensor,
        layout: &SeqLayout,
        cos: &CpuTensor,
        sin: &CpuTensor,
        span: RotarySpan,
    ) -> Result<()> {
        expect_shape(x, Some(layout.n_tokens()), x.cols, "rope input")?;
        span.check(x.cols, "cpu rope")?;
        let half = span.dims / 2;
        let (cos, sin) = (&cos.data, &sin.data);
        let max_pos = layout.positions.iter().copied().max().unwrap_or(0) as usize;
        if (max_pos + 1) * half > cos.len().min(sin.len()) {
            return Err(Error::InvalidArgument(format!(
                "cpu rope: tables of {} values for position {max_pos}",
                cos.len()
            )));
        }
        x.data
            .par_chunks_mut(x.cols)
            .zip(layout.positions.par_iter())
            .for_each(|(row, &pos)| {
                let c = &cos[pos as usize * half..(pos as usize + 1) * half];
                let s = &sin[pos as usize * half..(pos as usize + 1) * half];
                for head in row.chunks_exact_mut(span.head_dim) {
                    for j in 0..half {
                        let (ia, ib) = span.pair(j);
                        let (a, b) = (head[ia], head[ib]);
                        // q*cos + rotate_half(q)*sin, rotate_half = (-x2, x1)
                        head[ia] = a * c[j] + (-b) * s[j];
                        head[ib] = b * c[j] + a * s[j];
                    }
                }
            });
        Ok(())
    }

    fn assemble_columns(
        &self,
        rows: usize,
        cols: usize,
        parts: &[(&CpuTensor, ColumnBlocks)],
        _out: OutType,
    ) -> Result<CpuTensor> {
        let mut data = vec![0.0; rows * cols];
        for (src, at) in parts {
            expect_shape(src, Some(rows), src.cols, "assemble_columns source")?;
            at.check(src.cols, cols)?;
            for (dst, src) in data
                .chunks_exact_mut(cols.max(1))
                .zip(src.data.chunks_exact(src.cols.max(1)))
            {
                for b in 0..at.blocks {
                    let (f, t) = (at.from + b * at.from_stride, at.to + b * at.to_stride);
                    dst[t..t + at.width].copy_from_slice(&src[f..f + at.width]);
                }
            }
        }
        Ok(CpuTensor { data, rows, cols })
    }

    fn attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        layout: &SeqLayout,
        spec: AttnSpec,
        sinks: Option<&CpuTensor>,
        _out: OutType,
    ) -> Result<CpuTensor> {
        if let Some(s) = sinks {
            expect_shape(s, Some(1), spec.heads, "attention sinks")?;
        }
        expect_shape(k, Some(layout.n_tokens()), k.cols, "attention k")?;
        let seq_of = seq_of_rows(layout);
        let keys = |t: usize| {
            let start = layout.starts[seq_of[t]];
            let first = spec.first_key(t, start);
            layout
                .visible_rows(t, t - start)
                .map(|r| start + r)
                .filter(|&r| r >= first)
                .collect()
        };
        attend(q, k, v, layout, spec, sinks, (keys, spec.head_dim))
    }

    fn sparse_attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        layout: &SeqLayout,
        spec: AttnSpec,
        (keys, sinks): (&CpuTensor, Option<&CpuTensor>),
        _out: OutType,
    ) -> Result<CpuTensor> {
        if spec.window.is_some() {
            return Err(Error::InvalidArgument(
                "cpu sparse_attention: a sliding window is not supported".into(),
            ));
        }
        let t = layout.n_tokens();
        expect_shape(keys, Some(t), keys.cols, "sparse_attention keys")?;
        if let Some(s) = sinks {
            expect_shape(s, Some(1), spec.heads, "sparse_attention sinks")?;
        }
        let seq_of = seq_of_rows(layout);
        let n = keys.cols;
        let listed = |r: usize| {
            let start = layout.starts[seq_of[r]];
            keys.data[r * n..(r + 1) * n]
                .iter()
                .take_while(|&&p| p >= 0.0)
                .map(|&p| start + p as usize)
                .collect::<Vec<_>>()
        };
        // A listed row is the query's own or earlier, or past the tokens.
        for r in 0..t {
            if let Some(bad) = listed(r)
                .into_iter()
                .find(|&kr| kr > r && kr < t || kr >= k.rows())
            {
                return Err(Error::InvalidArgument(format!(
                    "sparse_attention: query row {r} lists key row {bad} of {} (tokens {t})",
                    k.rows()
                )));
            }
        }
        attend(
            q,
            k,
            v,
            layout,
            spec,
            sinks,
            (listed, spec.value_dim(v.cols)?),
        )
    }

    fn index_top_k(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        weights: &CpuTensor,
        layout: &SeqLayout,
        spec: IndexSpec,
    ) -> Result<CpuTensor> {
        let IndexSpec {
            heads,
            head_dim: d,
            top_k,
            rate,
            ..
        } = spec;
        if rate == 0 {
            return Err(Error::InvalidArgument("index_top_k: rate 0".into()));
        }
        let t = layout.n_tokens();
        expect_shape(q, Some(t), heads * d, "index_top_k q")?;
        expect_shape(k, Some(t), d, "index_top_k k")?;
        expect_shape(weights, Some(t), heads, "index_top_k weights")?;
        let seq_of = seq_of_rows(layout);
        let mut out = vec![-1f32; t * top_k];
        out.par_chunks_mut(top_k.max(1))
            .enumerate()
            .for_each(|(row, orow)| {
                let start = layout.starts[seq_of[row]];
                let mut keys: Vec<usize> = (0..(row - start + 1) / rate).collect();
                if keys.len() > top_k {
                    let qr = &q.data[row * heads * d..(row + 1) * heads * d];
                    let w = &weights.data[row * heads..(row + 1) * heads];
                    let score: Vec<f64> = keys
                        .iter()
                        .map(|&p| index_score(qr, &k.data[(start + p) * d..][..d], w, spec))
                        .collect();
                    // A higher score first, the earlier key at equal scores.
                    let order =
                        |a: &usize, b: &usize| score[*b].total_cmp(&score[*a]).then(a.cmp(b));
                    keys.select_nth_unstable_by(top_k - 1, order);
                    keys.truncate(top_k);
                    keys.sort_unstable();
                }
                for (o, p) in orow.iter_mut().zip(keys) {
                    *o = p as f32;
                }
            });
        Ok(CpuTensor::new(out, top_k))
    }

    fn mix_streams(
        &self,
        streams: &CpuTensor,
        weights: &CpuTensor,
        added: Option<(&CpuTensor, &CpuTensor)>,
        m: usize,
    ) -> Result<CpuTensor> {
        let rows = streams.rows;
        let (n, d) = super::compressed::mix_streams_shape(streams, weights, added, m)?;
        let (s, w) = (&streams.data, &weights.data);
        let mut out = vec![0f32; rows * m * d];
        out.par_chunks_mut((m * d).max(1))
            .enumerate()
            .for_each(|(r, orow)| {
                for (k, o) in orow.chunks_mut(d.max(1)).enumerate() {
                    for (c, o) in o.iter_mut().enumerate() {
                        // The streams' sum in order, then the block's output: transformers'
                        // `comb^T @ streams`, and `post * output` added to it.
                        let mixed = (0..n)
                            .map(|j| w[(r * n + j) * m + k] * s[(r * n + j) * d + c])
                            .fold(0.0f32, |acc, v| acc + v);
                        *o = match added {
                            Some((x, scales)) => scales.data[r * m + k] * x.data[r * d + c] + mixed,
                            None => mixed,
                        };
                    }
                }
            });
        Ok(CpuTensor::new(out, m * d))
    }

    fn pool_windows(
        &self,
        kv: &CpuTensor,
        gate: &CpuTensor,
        bias: &CpuTensor,
        layout: &SeqLayout,
        (rate, overlap): (usize, bool),
    ) -> Result<CpuTensor> {
        let rows = layout.n_tokens();
        let cols = kv.cols;
        let width = cols / if overlap { 2 } else { 1 };
        if rate == 0 || width * (1 + usize::from(overlap)) != cols {
            return Err(Error::InvalidArgument(format!(
                "pool_windows: {cols} columns over windows of {rate}"
            )));
        }
        expect_shape(kv, Some(rows), cols, "pool_windows kv")?;
        expect_shape(gate, Some(rows), cols, "pool_windows gate")?;
        expect_shape(bias, Some(rate), cols, "pool_windows bias")?;
        let (kv, gate, bias) = (&kv.data, &gate.data, &bias.data);
        let slots = if overlap { 2 * rate } else { rate };
        let seq_of = seq_of_rows(layout);
        let mut out = vec![0f32; rows * width];
        out.par_chunks_mut(width.max(1))
            .enumerate()
            .for_each(|(r, orow)| {
                let start = layout.starts[seq_of[r]];
                let e = r - start;
                // Only entries whose window of `rate` tokens lies in the sequence.
                if start + (e + 1) * rate > layout.starts[seq_of[r] + 1] {
                    return;
                }
                // Slot i's (row, column offset, bias row); None: an empty slot (-inf gate).
                let slot = |i: usize| -> Option<(usize, usize, usize)> {
                    match (overlap, i < rate) {
                        (false, _) => Some((start + e * rate + i, 0, i)),
                        (true, true) if e == 0 => None,
                        (true, true) => Some((start + (e - 1) * rate + i, 0, i)),
                        (true, false) => Some((start + e * rate + i - rate, width, i - rate)),
                    }
                };
                for (c, o) in orow.iter_mut().enumerate() {
                    let logits: Vec<(f32, f32)> = (0..slots)
                        .filter_map(slot)
                        .map(|(row, off, b)| {
                            let at = row * cols + off + c;
                            (gate[at] + bias[b * cols + off + c], kv[at])
                        })
                        .collect();
                    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &(g, _)| m.max(g));
                    let sum: f32 = logits.iter().map(|&(g, _)| (g - max).exp()).sum();
                    *o = logits
                        .iter()
                        .map(|&(g, v)| v * ((g - max).exp() / sum))
                        .fold(0.0f32, |acc, v| acc + v);
                }
            });
        Ok(CpuTensor::new(out, width))
    }

    fn layer_norm(
        &self,
        x: &CpuTensor,
        weight: &CpuTensor,
        bias: &CpuTensor,
        eps: f32,
        _out: OutType,
    ) -> Result<CpuTensor> {
        let n = x.cols;
        expect_shape(weight, Some(1), n, "layer_norm weight")?;
        expect_shape(bias, Some(1), n, "layer_norm bias")?;
        let mut out = vec![0f32; x.data.len()];
        out.par_chunks_mut(n.max(1))
            .zip(x.data.par_chunks(n.max(1)))
            .for_each(|(o, r)| {
                let mean = r.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
                let var = r.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
                let inv = 1.0 / (var + eps as f64).sqrt();
                for (j, (o, &v)) in o.iter_mut().zip(r).enumerate() {
                    let y = (v as f64 - mean) * inv * weight.data[j] as f64 + bias.data[j] as f64;
                    *o = y as f32;
                }
            });
        Ok(CpuTensor::new(out, n))
    }

    fn causal_conv(
        &self,
        x: &CpuTensor,
        weight: &CpuTensor,
        bias: Option<&CpuTensor>,
        silu: bool,
        layout: &SeqLayout,
        _out: OutType,
    ) -> Result<CpuTensor> {
        let c = x.cols;
        expect_shape(x, Some(layout.n_tokens()), c, "causal_conv x")?;
        let taps = weight.len().checked_div(c).unwrap_or(0);
        expect_shape(weight, Some(c), taps.max(1), "causal_conv weight")?;
        if let Some(bias) = bias {
            expect_shape(bias, Some(1), c, "causal_conv bias")?;
        }
        let seq_of = seq_of_rows(layout);
        let mut y = vec![0f32; x.data.len()];
        y.par_chunks_mut(c.max(1)).enumerate().for_each(|(t, row)| {
            let first = layout.starts[seq_of[t]];
            for (ch, out) in row.iter_mut().enumerate() {
                // Tap j reads token t - (taps - 1) + j, zero before the sequence.
                let sum: f64 = (0..taps)
                    .filter(|&j| t + j + 1 >= first + taps)
                    .map(|j| {
                        weight.data[ch * taps + j] as f64
                            * x.data[(t + j + 1 - taps) * c + ch] as f64
                    })
                    .sum::<f64>()
                    + bias.map_or(0.0, |b| b.data[ch] as f64);
                *out = match silu {
                    true => gated(GatedActivation::Silu, sum as f32, 1.0),
                    false => sum as f32,
                };
            }
        });
        Ok(CpuTensor::new(y, c))
    }

    fn linear_recurrence(
        &self,
        qkv: &CpuTensor,
        gates: RecurrenceGates<'_, CpuTensor>,
        layout: &SeqLayout,
        net: DeltaNetConfig,
        _out: OutType,
    ) -> Result<CpuTensor> {
        linear_recurrence_in(qkv, gates, layout, net, recurrent::delta_rule_steps)
    }

    fn gated_rms_norm(
        &self,
        x: &CpuTensor,
        gate: &CpuTensor,
        weight: &CpuTensor,
        group: usize,
        how: NormGate,
        eps: f32,
        _out: OutType,
    ) -> Result<CpuTensor> {
        super::gated_norm_groups(x.cols, weight.len(), group, "cpu")?;
        expect_shape(gate, Some(x.rows), x.cols, "gated_rms_norm gate")?;
        let mut y = x.clone();
        let wlen = weight.len();
        y.data
            .par_chunks_mut(group)
            .zip(gate.data.par_chunks(group))
            .enumerate()
            .for_each(|(i, (values, gate))| {
                // The weight's part for this group (it repeats along the row).
                let from = (i * group) % wlen;
                let w = &weight.data[from..from + group];
                let before = how == NormGate::SiluBefore;
                if before {
                    for (v, &g) in values.iter_mut().zip(gate) {
                        *v *= how.activate(g);
                    }
                }
                let ms = values.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / group as f64;
                let inv = (1.0 / (ms as f32 + eps).sqrt() as f64) as f32;
                for ((v, &w), &g) in values.iter_mut().zip(w).zip(gate) {
                    *v = match before {
                        true => w * (*v * inv),
                        false => w * (*v * inv) * how.activate(g),
                    };
                }
            });
        Ok(y)
    }

    fn gated_act(
        &self,
        gate: &CpuTensor,
        up: Option<&CpuTensor>,
        act: GatedActivation,
        _out: OutType,
    ) -> Result<CpuTensor> {
        let [_, cols] = super::gated_shape(gate.shape(), up.map(Shaped::shape), act)?;
        let data = match up {
            Some(up) => gate
                .data
                .par_iter()
                .zip(up.data.par_iter())
                .map(|(&g, &u)| gated(act, g, u))
                .collect(),
            None if act.ungated() => gate.data.par_iter().map(|&g| gated(act, g, 1.0)).collect(),
            None => gate
                .data
                .par_chunks(2)
                .map(|p| gated(act, p[0], p[1]))
                .collect(),
        };
        Ok(CpuTensor::new(data, cols))
    }

    fn take_rows(&self, parts: &[&CpuTensor], rows: &[u32]) -> Result<CpuTensor> {
        let (cols, _) = super::joined_rows(parts, rows)?;
        let joined: Vec<&[f32]> = parts
            .iter()
            .flat_map(|p| p.data.chunks(cols.max(1)))
            .collect();
        let data = rows.iter().flat_map(|&r| joined[r as usize]).copied();
        Ok(CpuTensor::new(data.collect(), cols))
    }

    fn gather_group(
        &self,
        x: &CpuTensor,
        groups: &RowGroups,
        g: usize,
        _out: OutType,
    ) -> Result<CpuTensor> {
        let cols = x.cols;
        let mut out = Vec::new();
        for i in groups.check(g, x.rows)? {
            let r = groups.rows[i] as usize;
            let row = &x.data[r * cols..(r + 1) * cols];
            match groups.input_scales.get(i) {
                // transformers: `hidden_states * router_scores`, in f32.
                Some(&s) => out.extend(row.iter().map(|&v| v * s)),
                None => out.extend_from_slice(row),
            }
        }
        Ok(CpuTensor::new(out, cols))
    }

    fn scatter_add_group(
        &self,
        acc: &mut CpuTensor,
        y: &CpuTensor,
        groups: &RowGroups,
        g: usize,
    ) -> Result<()> {
        let range = groups.check(g, acc.rows)?;
        expect_shape(y, Some(range.len()), acc.cols, "scatter_add rows")?;
        let cols = acc.cols;
        for (i, yr) in range.zip(y.data.chunks_exact(cols.max(1))) {
            let (r, w) = (groups.rows[i] as usize, groups.weights[i]);
            // transformers: index_add_ of (expert output * weight), both f32.
            for (a, &v) in acc.data[r * cols..(r + 1) * cols].iter_mut().zip(yr) {
                *a += v * w;
            }
        }
        Ok(())
    }

    fn scale_columns(&self, x: &mut CpuTensor, scales: &CpuTensor) -> Result<()> {
        expect_shape(scales, Some(1), x.cols, "column scales")?;
        x.data
            .par_chunks_mut(x.cols.max(1))
            .for_each(|row| row.iter_mut().zip(&scales.data).for_each(|(v, s)| *v *= s));
        Ok(())
    }

    fn add_assign(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        expect_shape(y, Some(x.rows), x.cols, "residual update")?;
        x.data
            .par_iter_mut()
            .zip(y.data.par_iter())
            .for_each(|(a, &b)| *a += b);
        Ok(())
    }

    fn nll(
        &self,
        hidden: &CpuTensor,
        head: Head<'_, CpuLinear>,
        targets: &[i32],
    ) -> Result<Vec<f32>> {
        expect_shape(
            hidden,
            Some(targets.len()),
            head.linear.in_features,
            "lm_head input",
        )?;
        let (hidden, v) = (&hidden.data, head.linear.out_features);
        Ok(scored_rows(targets)
            .par_chunks(TOKEN_BLOCK)
            .flat_map_iter(|block| {
                let logits = block_logits(hidden, head, block);
                block
                    .iter()
                    .zip(logits.chunks_exact(v))
                    .map(|(&r, l)| (logsumexp(l).0 - l[targets[r] as usize] as f64) as f32)
                    .collect::<Vec<_>>()
            })
            .collect())
    }

    fn kld(
        &self,
        base_hidden: &CpuTensor,
        base_head: Head<'_, CpuLinear>,
        hidden: &CpuTensor,
        head: Head<'_, CpuLinear>,
        targets: &[i32],
    ) -> Result<Vec<KldTerms>> {
        let n = Some(targets.len());
        let in_features = (base_head.linear.in_features, head.linear.in_features);
        expect_shape(base_hidden, n, in_features.0, "base lm_head input")?;
        expect_shape(hidden, n, in_features.1, "lm_head input")?;
        let (base_hidden, hidden) = (&base_hidden.data, &hidden.data);
        let v = head.linear.out_features;
        Ok(scored_rows(targets)
            .par_chunks(TOKEN_BLOCK)
            .flat_map_iter(|block| {
                let p = block_logits(base_hidden, base_head, block);
                let q = block_logits(hidden, head, block);
                block
                    .iter()
                    .zip(p.chunks_exact(v).zip(q.chunks_exact(v)))
                    .map(|(&r, (pl, ql))| kld_terms(pl, ql, targets[r] as usize))
                    .collect::<Vec<_>>()
            })
            .collect())
    }
}

/// KL(P||Q) and KL(Q||P) over the full vocabulary in f64 from two f32 logit rows, and how
/// their rankings agree.
pub fn kld_terms(p_logits: &[f32], q_logits: &[f32], target: usize) -> KldTerms {
    let (lse_p, top_p) = logsumexp(p_logits);
    let (lse_q, _) = logsumexp(q_logits);
    let (mut kld, mut kld_reverse) = (0f64, 0f64);
    for (&lp, &lq) in p_logits.iter().zip(q_logits) {
        let (lpp, lqq) = (lp as f64 - lse_p, lq as f64 - lse_q);
        let (p, q) = (lpp.exp(), lqq.exp());
        if p > 0.0 {
            kld += p * (lpp - lqq);
        }
        if q > 0.0 {
            kld_reverse += q * (lqq - lpp);
        }
    }
    KldTerms {
        kld,
        kld_reverse,
        nll_q: lse_q - q_logits[target] as f64,
        nll_base: lse_p - p_logits[target] as f64,
        base_top_p: (p_logits[top_p] as f64 - lse_p).exp(),
        top: TopAgreement::of(&top_ranking(p_logits, TOP_K), &top_ranking(q_logits, TOP_K)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Branches;

    /// `kld_terms` against the definitions computed another way in f64: probabilities as
    /// exp(l) / sum exp(l) (shifted by the max), KL as sum p ln(p / q) both ways, rankings by a
    /// whole sort; on rows with near-certain, flat and tied logits.
    #[test]
    fn kld_terms_match_a_direct_f64_computation() {
        let mut rng = crate::rng::Rng::new(5);
        let probs = |l: &[f32]| -> Vec<f64> {
            let m = l.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64));
            let e: Vec<f64> = l.iter().map(|&v| (v as f64 - m).exp()).collect();
            let z: f64 = e.iter().sum();
            e.iter().map(|v| v / z).collect()
        };
        let kl = |a: &[f64], b: &[f64]| -> f64 {
            a.iter()
                .zip(b)
                .filter(|(a, _)| **a > 0.0)
                .map(|(a, b)| a * (a / b).ln())
                .sum()
        };
        let ranking = |l: &[f32]| -> Vec<u32> {
            let mut ids: Vec<u32> = (0..l.len() as u32).collect();
            // IEEE order: -0 equals +0, as the kernels compare.
            let by = |a: u32, b: u32| l[b as usize].partial_cmp(&l[a as usize]);
            ids.sort_by(|&a, &b| by(a, b).expect("no NaN").then(a.cmp(&b)));
            ids.truncate(TOP_K);
            ids
        };
        for (vocab, scale, grid) in [
            (7, 1.0, 0.0),
            (300, 12.0, 0.0),
            (300, 0.05, 0.0),
            (2000, 3.0, 2.0),
        ] {
            for _ in 0..4 {
                let mut row = |s: f32| -> Vec<f32> {
                    let v = rng.normal_vec(vocab, s);
                    if grid > 0.0 {
                        v.iter().map(|x| (x * grid).round() / grid).collect()
                    } else {
                        v
                    }
                };
                let (pl, ql) = (row(scale), row(scale));
                let target = rng.below(vocab as u64) as usize;
                let t = kld_terms(&pl, &ql, target);
                let (p, q) = (probs(&pl), probs(&ql));
                let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * (1.0 + b.abs());
                assert!(close(t.kld, kl(&p, &q)), "{} vs {}", t.kld, kl(&p, &q));
                assert!(close(t.kld_reverse, kl(&q, &p)));
                assert!(close(t.nll_q, -q[target].ln()));
                assert!(close(t.nll_base, -p[target].ln()));
                let top_p = p.iter().cloned().fold(0.0, f64::max);
                assert!(close(t.base_top_p, top_p));
                assert_eq!(t.top, TopAgreement::of(&ranking(&pl), &ranking(&ql)));
            }
        }
    }

    /// The blocked product gives every output bit for bit as `dot` of its row and column,
    /// for token counts around the group size and widths around the lane count.
    #[test]
    fn blocked_matmul_is_dot_bit_for_bit() {
        let mut rng = crate::rng::Rng::new(3);
        for (rows, n_in, n_out) in [(1, 7, 3), (5, 64, 9), (16, 203, 17), (37, 256, 40)] {
            let x = rng.normal_vec(rows * n_in, 1.0);
            let w = rng.normal_vec(n_out * n_in, 1.0);
            let y = matmul_xwt(&x, &w, n_in, n_out);
            for t in 0..rows {
                for o in 0..n_out {
                    let want = dot(&x[t * n_in..(t + 1) * n_in], &w[o * n_in..(o + 1) * n_in]);
                    assert_eq!(y[t * n_out + o].to_bits(), (want as f32).to_bits());
                }
            }
        }
    }

    /// A sequence split into branches gives each branch's rows what the prefix followed by
    /// that branch alone gives (positions and attention), beside a plain sequence.
    #[test]
    fn branches_attend_as_their_prefix_and_branch_alone() {
        let mut rng = crate::rng::Rng::new(3);
        let branches = Branches {
            prefix: 6,
            lens: vec![3, 1, 4],
        };
        let layout = SeqLayout::from_sequences([(5, None), (branches.rows(), Some(&branches))]);
        assert!(layout.branched());
        let (heads, kv_heads, d) = (4, 2, 8);
        let spec = AttnSpec::causal(heads, kv_heads, d);
        let t = layout.n_tokens();
        let (q, k, v) = (
            rng.normal_vec(t * heads * d, 1.0),
            rng.normal_vec(t * kv_heads * d, 1.0),
            rng.normal_vec(t * kv_heads * d, 1.0),
        );
        let sinks = CpuTensor::new(rng.normal_vec(heads, 1.0), heads);
        let cpu = CpuBackend::new();
        let run = |rows: &[usize], layout: &SeqLayout| {
            let pick = |x: &[f32], w: usize| {
                let v: Vec<f32> = rows
                    .iter()
                    .flat_map(|&r| x[r * w..(r + 1) * w].to_vec())
                    .collect();
                CpuTensor::new(v, w)
            };
            let (qw, kw) = (heads * d, kv_heads * d);
            cpu.attention(
                &pick(&q, qw),
                &pick(&k, kw),
                &pick(&v, kw),
                layout,
                spec,
                Some(&sinks),
                OutType::Activation,
            )
            .unwrap()
            .data
        };
        let all: Vec<usize> = (0..t).collect();
        let together = run(&all, &layout);
        let w = heads * d;
        let mut at = 5 + branches.prefix;
        for &n in &branches.lens {
            // The prefix, then this branch, as one plain sequence.
            let rows: Vec<usize> = (5..5 + branches.prefix).chain(at..at + n).collect();
            let alone = run(&rows, &SeqLayout::from_lengths([rows.len()]));
            for (j, &r) in rows.iter().enumerate() {
                assert_eq!(layout.positions[r], j as u32, "row {r}");
                let (a, b) = (&together[r * w..(r + 1) * w], &alone[j * w..(j + 1) * w]);
                assert_eq!(a, b, "row {r}");
            }
            at += n;
        }
        // The plain sequence is untouched by its neighbour's branches.
        let plain = run(&all[..5], &SeqLayout::from_lengths([5]));
        assert_eq!(&together[..5 * w], &plain[..]);
    }

    /// The indexer's selection is the definition written out: every causal key's score
    /// (`sum_h w_h * weight_scale * relu(scale * q_h . k)`, from scratch here), the keys fully
    /// sorted by score, higher first, the earlier at equal scores, the first `top_k` kept in
    /// position order; every key while a query has no more. Small integers make exact ties.
    #[test]
    fn index_top_k_keeps_the_best_keys_earlier_first_at_equal_scores() {
        let mut rng = crate::rng::Rng::new(11);
        let layout = SeqLayout::from_lengths([3, 40, 1, 25]);
        let t = layout.n_tokens();
        let (heads, d, top_k) = (3, 4, 6);
        let spec = IndexSpec {
            heads,
            head_dim: d,
            top_k,
            scale: 0.5,
            weight_scale: 0.25,
            rate: 1,
        };
        let ints = |rng: &mut crate::rng::Rng, n| -> Vec<f32> {
            (0..n).map(|_| rng.below(3) as f32 - 1.0).collect()
        };
        let (q, k, w) = (
            ints(&mut rng, t * heads * d),
            ints(&mut rng, t * d),
            ints(&mut rng, t * heads),
        );
        let got = CpuBackend::new()
            .index_top_k(
                &CpuTensor::new(q.clone(), heads * d),
                &CpuTensor::new(k.clone(), d),
                &CpuTensor::new(w.clone(), heads),
                &layout,
                spec,
            )
            .unwrap();
        let mut ties = 0;
        for seq in layout.starts.windows(2) {
            for row in seq[0]..seq[1] {
                // Exact in f32: small integers, power-of-two scales.
                let score = |p: usize| -> f32 {
                    (0..heads)
                        .map(|h| {
                            let qk: f32 = (0..d)
                                .map(|i| q[(row * heads + h) * d + i] * k[(seq[0] + p) * d + i])
                                .sum();
                            w[row * heads + h] * 0.25 * (0.5 * qk).max(0.0)
                        })
                        .sum()
                };
                let mut keys: Vec<usize> = (0..=row - seq[0]).collect();
                keys.sort_by(|&a, &b| score(b).partial_cmp(&score(a)).unwrap().then(a.cmp(&b)));
                if keys.len() > top_k && score(keys[top_k - 1]) == score(keys[top_k]) {
                    ties += 1;
                }
                keys.truncate(top_k);
                keys.sort_unstable();
                let mut want: Vec<f32> = keys.iter().map(|&p| p as f32).collect();
                want.resize(top_k, -1.0);
                let got_row = &got.data[row * top_k..(row + 1) * top_k];
                assert_eq!(got_row, &want[..], "row {row}");
            }
        }
        // The boundary falls between equal scores often enough to test the tie rule.
        assert!(ties > 10, "{ties} tied boundaries");
    }

    /// LayerNorm as its formula: the mean and the biased variance of each row.
    #[test]
    fn layer_norm_is_its_formula() {
        let mut rng = crate::rng::Rng::new(12);
        let (rows, cols) = (5, 33);
        let x = rng.normal_vec(rows * cols, 2.0);
        let (w, b) = (rng.normal_vec(cols, 1.0), rng.normal_vec(cols, 1.0));
        let y = CpuBackend::new()
            .layer_norm(
                &CpuTensor::new(x.clone(), cols),
                &CpuTensor::new(w.clone(), cols),
                &CpuTensor::new(b.clone(), cols),
                1e-5,
                OutType::Activation,
            )
            .unwrap();
        for r in 0..rows {
            let row = &x[r * cols..(r + 1) * cols];
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
            for c in 0..cols {
                let want = (row[c] as f64 - mean) / (var + 1e-5).sqrt() * w[c] as f64 + b[c] as f64;
                assert!((y.data[r * cols + c] as f64 - want).abs() < 1e-6, "{r} {c}");
            }
        }
    }
}
