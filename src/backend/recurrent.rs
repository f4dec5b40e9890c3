//! The reference arithmetic of the recurrent layers (gated DeltaNet, Qwen3.5's
//! `linear_attention`; Mamba-2's SSD, the same recurrence without the delta correction), in
//! f64 over one sequence and one value head: the gates, the rule step by step (transformers'
//! `torch_recurrent_linear_recurrence`, `mamba2_selective_state_update`) and chunked
//! (`torch_chunk_linear_recurrence`, `mamba2_chunk_scan`: the form GPU kernels take, products
//! within a chunk, a state pass between chunks). The CPU backend runs the step-by-step form;
//! `check` holds the chunked one to it.

/// Tokens a chunk of the chunked form on GPUs (`linear_recurrence.cu`'s RC) and in `check`.
pub const CHUNK: usize = 64;

/// torch's `softplus` (beta 1, threshold 20): `x` itself above the threshold.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// The per-token gates of value head `h` as transformers computes them in f32: the log
/// decay `g = -exp(A_log) * softplus(a + dt_bias)` and the update strength `beta = sigmoid(b)`.
pub fn gates(a: f32, b: f32, a_log: f32, dt_bias: f32) -> (f32, f32) {
    let g = -a_log.exp() * softplus(a + dt_bias);
    (g, 1.0 / (1.0 + (-b).exp()))
}

/// [`gates`] under GLM-5.3-Flash's safe gate (`Glm5NextTextForgetGate` with
/// `linear_lower_bound`): the log decay `lower_bound * sigmoid(exp(A_log) * (a + dt_bias))`,
/// between `lower_bound` and 0.
pub fn safe_gates(a: f32, b: f32, a_log: f32, dt_bias: f32, lower_bound: f32) -> (f32, f32) {
    let g = lower_bound * super::routing::sigmoid(a_log.exp() * (a + dt_bias));
    (g, super::routing::sigmoid(b))
}

/// Mamba-2's per-token gates of head `h` as transformers computes them in f32: the time step
/// `dt = clamp(softplus(a + dt_bias), dt_min, dt_max)`, which is both the update strength and,
/// times `-exp(A_log)`, the log decay. Returns `(g, dt)`.
pub fn ssd_gates(a: f32, a_log: f32, dt_bias: f32, dt_min: f32, dt_max: f32) -> (f32, f32) {
    let dt = softplus(a + dt_bias).max(dt_min).min(dt_max);
    (-a_log.exp() * dt, dt)
}

/// `x * rsqrt(sum(x^2) + 1e-6)` (the FLA library's `l2norm`, as transformers copies it), times
/// `scale`.
pub fn l2_normalized(x: &[f32], scale: f64) -> Vec<f64> {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let inv = scale / (ss + 1e-6).sqrt();
    x.iter().map(|&v| v as f64 * inv).collect()
}

/// One value head over one sequence of `t` tokens: queries and keys (`[t, dk]`; for the delta
/// rule normalized, the queries scaled by `dk^-0.5`; Mamba-2's C and B), values `[t, dv]`,
/// log decays (`[t]`, or `[t, dk]` a key channel each where `per_key`) and update strengths
/// `[t]`.
pub struct DeltaInputs<'a> {
    pub q: &'a [f64],
    pub k: &'a [f64],
    pub v: &'a [f64],
    pub g: &'a [f64],
    pub beta: &'a [f64],
    pub dk: usize,
    pub dv: usize,
    /// The delta rule's correction (what the state already predicts for `k` is taken off the
    /// update); without it, Mamba-2's SSD: `S = exp(g) S + k (beta v)^T`.
    pub delta: bool,
    /// Each key channel (row of the state) decays at its own rate (Kimi Delta Attention).
    pub per_key: bool,
}

impl DeltaInputs<'_> {
    fn tokens(&self) -> usize {
        self.beta.len()
    }

    /// Token `t`'s log decay of key channel `i`.
    fn decay(&self, t: usize, i: usize) -> f64 {
        match self.per_key {
            true => self.g[t * self.dk + i],
            false => self.g[t],
        }
    }

    fn row<'s>(&self, x: &'s [f64], width: usize, t: usize) -> &'s [f64] {
        &x[t * width..(t + 1) * width]
    }
}

/// The delta rule one token at a time from a zero state `S` (`[dk, dv]`): `S *= exp(g)` (row
/// `i` by `exp(g_i)` where the decay is per key channel), then
/// `S += k (beta (v - S^T k))^T` (without `delta`, `S += k (beta v)^T`), and the output
/// `S^T q`. Returns `[t, dv]`.
pub fn delta_rule_steps(x: &DeltaInputs) -> Vec<f64> {
    let (dk, dv) = (x.dk, x.dv);
    let mut state = vec![0f64; dk * dv];
    let mut out = vec![0f64; x.tokens() * dv];
    let mut delta = vec![0f64; dv];
    for t in 0..x.tokens() {
        let (q, k, v) = (x.row(x.q, dk, t), x.row(x.k, dk, t), x.row(x.v, dv, t));
        for (i, row) in state.chunks_mut(dv).enumerate() {
            let decay = x.decay(t, i).exp();
            row.iter_mut().for_each(|s| *s *= decay);
        }
        for (j, d) in delta.iter_mut().enumerate() {
            let remembered: f64 = match x.delta {
                true => (0..dk).map(|i| state[i * dv + j] * k[i]).sum(),
                false => 0.0,
            };
            *d = (v[j] - remembered) * x.beta[t];
        }
        for i in 0..dk {
            for j in 0..dv {
                state[i * dv + j] += k[i] * delta[j];
            }
        }
        for j in 0..dv {
            out[t * dv + j] = (0..dk).map(|i| state[i * dv + j] * q[i]).sum();
        }
    }
    out
}

/// The same rule in chunks of `chunk` tokens: within a chunk, the updates' interactions solve
/// one unit lower-triangular system (`(I + A) U = beta V`, `A[i][j] = beta_i k_i.k_j
/// exp(c_i - c_j)` for `j < i`, `c` the decays summed from the chunk's start, a key channel
/// at a time where they are per channel; without `delta` there are none: `U = beta V`,
/// Mamba-2's chunk scan) and the outputs are products with the state at the chunk's start;
/// the state then advances once per chunk.
pub fn delta_rule_chunked(x: &DeltaInputs, chunk: usize) -> Vec<f64> {
    let (dk, dv) = (x.dk, x.dv);
    let n = x.tokens();
    // Decays a token: one, or one a key channel.
    let gw = if x.per_key { dk } else { 1 };
    let mut state = vec![0f64; dk * dv];
    let mut out = vec![0f64; n * dv];
    for start in (0..n).step_by(chunk.max(1)) {
        let c = chunk.min(n - start);
        let tok = |i: usize| start + i;
        // The decays summed from the chunk's start, `[c, gw]`.
        let mut cum = vec![0f64; c * gw];
        for i in 0..c {
            for d in 0..gw {
                let before = if i > 0 { cum[(i - 1) * gw + d] } else { 0.0 };
                cum[i * gw + d] = before + x.decay(tok(i), d);
            }
        }
        let cum_at = |i: usize, d: usize| cum[i * gw + d.min(gw - 1)];
        // `a . b` with channel `d` decayed from token `p` to token `i` of the chunk.
        let decayed_dot = |a: &[f64], b: &[f64], i: usize, p: usize| -> f64 {
            (0..dk)
                .map(|d| a[d] * b[d] * (cum_at(i, d) - cum_at(p, d)).exp())
                .sum()
        };
        // Forward substitution of (I + A): rows of u (`dv` wide) and w (`dk` wide, the
        // decayed betas' keys that read the old state).
        let mut u = vec![0f64; c * dv];
        let mut w = vec![0f64; c * dk];
        for i in 0..c {
            let (bi, ki) = (x.beta[tok(i)], x.row(x.k, dk, tok(i)));
            let vi = x.row(x.v, dv, tok(i));
            for j in 0..dv {
                u[i * dv + j] = bi * vi[j];
            }
            if !x.delta {
                continue;
            }
            for j in 0..dk {
                w[i * dk + j] = bi * cum_at(i, j).exp() * ki[j];
            }
            for p in 0..i {
                let a = bi * decayed_dot(ki, x.row(x.k, dk, tok(p)), i, p);
                for j in 0..dv {
                    u[i * dv + j] -= a * u[p * dv + j];
                }
                for j in 0..dk {
                    w[i * dk + j] -= a * w[p * dk + j];
                }
            }
        }
        // The new values: what the old state does not already predict.
        let mut v_new = u;
        for i in 0..c {
            for j in 0..dv {
                v_new[i * dv + j] -= (0..dk)
                    .map(|p| w[i * dk + p] * state[p * dv + j])
                    .sum::<f64>();
            }
        }
        for i in 0..c {
            let qi = x.row(x.q, dk, tok(i));
            for j in 0..dv {
                let old: f64 = (0..dk)
                    .map(|p| qi[p] * cum_at(i, p).exp() * state[p * dv + j])
                    .sum();
                let within: f64 = (0..=i)
                    .map(|p| decayed_dot(qi, x.row(x.k, dk, tok(p)), i, p) * v_new[p * dv + j])
                    .sum();
                out[tok(i) * dv + j] = old + within;
            }
        }
        for (d, row) in state.chunks_mut(dv).enumerate() {
            let last = cum_at(c - 1, d);
            row.iter_mut().for_each(|s| *s *= last.exp());
            for p in 0..c {
                let f = x.row(x.k, dk, tok(p))[d] * (last - cum_at(p, d)).exp();
                for (s, &v) in row.iter_mut().zip(&v_new[p * dv..(p + 1) * dv]) {
                    *s += f * v;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// The chunked form is the step-by-step rule rearranged: on a sequence crossing several
    /// chunks (and a last, partial one), strong and weak decays, one a token or one a key
    /// channel, the two agree to rounding.
    #[test]
    fn chunked_and_step_by_step_forms_agree() {
        let mut rng = Rng::new(7);
        let (t, dk, dv) = (150, 16, 8);
        let unit = |rng: &mut Rng, n: usize| -> Vec<f64> {
            (0..t)
                .flat_map(|_| l2_normalized(&rng.normal_vec(n, 1.0), 1.0))
                .collect()
        };
        let (q, k) = (unit(&mut rng, dk), unit(&mut rng, dk));
        let v: Vec<f64> = rng
            .normal_vec(t * dv, 1.0)
            .iter()
            .map(|&x| x as f64)
            .collect();
        let (a, b) = (rng.normal_vec(t * dk, 2.0), rng.normal_vec(t, 2.0));
        let beta: Vec<f64> = b
            .iter()
            .map(|&b| gates(0.0, b, 0.0, 0.0).1 as f64)
            .collect();
        // A token's decay (its first channel's input), or each channel's with its own bias:
        // from about 0.4 a token to nearly none.
        let per_token: Vec<f64> = (0..t)
            .map(|s| gates(a[s * dk], 0.0, 0.5, -1.0).0 as f64)
            .collect();
        let per_key: Vec<f64> = (0..t * dk)
            .map(|e| {
                let bias = -4.0 + 4.0 * (e % dk) as f32 / dk as f32;
                gates(a[e], 0.0, 0.5, bias).0 as f64
            })
            .collect();
        for (delta, keyed) in [(true, false), (false, false), (true, true)] {
            let x = DeltaInputs {
                q: &q,
                k: &k,
                v: &v,
                g: if keyed { &per_key } else { &per_token },
                beta: &beta,
                dk,
                dv,
                delta,
                per_key: keyed,
            };
            let steps = delta_rule_steps(&x);
            for chunk in [1, 16, 64] {
                let chunked = delta_rule_chunked(&x, chunk);
                let worst = steps
                    .iter()
                    .zip(&chunked)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                assert!(
                    worst < 1e-9,
                    "delta {delta}, per key {keyed}, chunk {chunk}: max abs difference {worst}"
                );
            }
            assert!(
                steps.iter().any(|&o| o.abs() > 0.1),
                "the outputs are not all near zero"
            );
        }
    }

    /// Without the correction the rule is Mamba-2's SSD as `mamba2_selective_state_update`
    /// writes it: `h = exp(dt A) h + dt B x`, `y = C h`, one state value at a time.
    #[test]
    fn without_the_correction_the_rule_is_mamba2s_scan() {
        let mut rng = Rng::new(11);
        let (t, n) = (40, 6);
        let f64s = |v: Vec<f32>| -> Vec<f64> { v.into_iter().map(f64::from).collect() };
        let (c, b) = (
            f64s(rng.normal_vec(t * n, 1.0)),
            f64s(rng.normal_vec(t * n, 1.0)),
        );
        let x = f64s(rng.normal_vec(t, 1.0));
        let (g, dt): (Vec<f64>, Vec<f64>) = rng
            .normal_vec(t, 2.0)
            .iter()
            .map(|&a| {
                let (g, dt) = ssd_gates(a, 0.3, -1.0, 1e-3, f32::INFINITY);
                (g as f64, dt as f64)
            })
            .unzip();
        let got = delta_rule_steps(&DeltaInputs {
            q: &c,
            k: &b,
            v: &x,
            g: &g,
            beta: &dt,
            dk: n,
            dv: 1,
            delta: false,
            per_key: false,
        });
        let mut h = vec![0f64; n];
        for s in 0..t {
            let y: f64 = (0..n)
                .map(|i| {
                    h[i] = (dt[s] * -(0.3f64.exp())).exp() * h[i] + dt[s] * b[s * n + i] * x[s];
                    c[s * n + i] * h[i]
                })
                .sum();
            assert!(
                (y - got[s]).abs() < 1e-5,
                "token {s}: {y} against {}",
                got[s]
            );
        }
    }

    /// Kimi's per-channel decays, all channels of a token equal, are the per-token rule; with
    /// channels apart, the state's rows forget at their own rates and the outputs differ.
    #[test]
    fn per_key_decays_reduce_to_the_per_token_rule() {
        let mut rng = Rng::new(13);
        let (t, dk, dv) = (30, 4, 3);
        let f64s = |v: Vec<f32>| -> Vec<f64> { v.into_iter().map(f64::from).collect() };
        let (q, k, v) = (
            f64s(rng.normal_vec(t * dk, 0.5)),
            f64s(rng.normal_vec(t * dk, 0.5)),
            f64s(rng.normal_vec(t * dv, 1.0)),
        );
        let beta = vec![0.5; t];
        let g = f64s(rng.normal_vec(t, 0.3))
            .iter()
            .map(|x| -x.abs())
            .collect::<Vec<_>>();
        let spread: Vec<f64> = g.iter().flat_map(|&g| [g; 4]).collect();
        let apart: Vec<f64> = g.iter().flat_map(|&g| [g, 2.0 * g, 0.0, -3.0]).collect();
        let run = |g: &[f64], per_key| {
            delta_rule_steps(&DeltaInputs {
                q: &q,
                k: &k,
                v: &v,
                g,
                beta: &beta,
                dk,
                dv,
                delta: true,
                per_key,
            })
        };
        let token = run(&g, false);
        assert_eq!(run(&spread, true), token);
        let differs = run(&apart, true)
            .iter()
            .zip(&token)
            .any(|(a, b)| (a - b).abs() > 1e-3);
        assert!(differs, "per-channel decays changed nothing");
    }

    #[test]
    fn gates_follow_torch() {
        // softplus(x) = log(1 + e^x), and x itself past torch's threshold of 20.
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        let (g, beta) = gates(0.3, 0.0, 0.0, -0.3);
        assert!((g + std::f32::consts::LN_2).abs() < 1e-7 && beta == 0.5);
    }
}
