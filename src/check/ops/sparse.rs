//! DeepSeek sparse attention: the indexer key's LayerNorm, the indexer's top-k selection
//! (exact: integer inputs and power-of-two scales make every score exact on every backend,
//! so the many equal scores test the tie rule too), and attention restricted to given keys,
//! which equals dense attention where every earlier key is kept, over expanded heads and over
//! the latent form's one key head with narrower values.

use super::super::{CaseReport, Ctx, compare, matrix};
use crate::Result;
use crate::backend::{AttnSpec, Backend, Device, IndexSpec, OutType, SeqLayout, Shaped};
use crate::rng::Rng;

pub(in crate::check) fn cases<B: Backend>(
    c: &Ctx<'_, B>,
    rng: &mut Rng,
    out: &mut Vec<CaseReport>,
) -> Result<()> {
    let (b, cpu) = (c.b, &c.cpu);
    for (rows, cols) in [(37, 32), (5, 300)] {
        let x = rng.normal_vec(rows * cols, 1.0);
        let (w, bias) = (rng.normal_vec(cols, 1.0), rng.normal_vec(cols, 0.5));
        // The CPU normalizes the values the backend holds (bf16-rounded on CUDA's bf16 path).
        let xb = b.upload_activation(&x)?.reshaped(rows, cols)?;
        let want = cpu.layer_norm(
            &matrix(cpu, "x", &b.download(&xb)?, rows, cols)?,
            &matrix(cpu, "w", &w, 1, cols)?,
            &matrix(cpu, "bias", &bias, 1, cols)?,
            1e-6,
            OutType::Activation,
        )?;
        let want = cpu.download(&want)?;
        let (wb, bb) = (
            matrix(b, "w", &w, 1, cols)?,
            matrix(b, "bias", &bias, 1, cols)?,
        );
        for &(ot, ot_name) in c.outs {
            let got = b.layer_norm(&xb, &wb, &bb, 1e-6, ot)?;
            out.push(compare(
                "layer_norm",
                format!("rows={rows} cols={cols}{ot_name}"),
                &b.download(&got)?,
                &want,
                c.out_tol(ot),
                true,
            ));
        }
    }

    // Sequences of one token, of fewer keys than top_k, and of several times top_k; more heads
    // than CUDA sums at once.
    let layout = SeqLayout::from_lengths([1, 20, 300, 7, 130]);
    let t = layout.n_tokens();
    let (seqs_c, seqs_b) = (cpu.upload_sequences(&layout)?, b.upload_sequences(&layout)?);
    let small_ints = |rng: &mut Rng, n: usize| -> Vec<f32> {
        (0..n).map(|_| rng.below(5) as f32 - 2.0).collect()
    };
    // The selection against the CPU's, exact; the last two cases on CUDA's tensor cores in
    // bf16 (heads a multiple of 16, of 32, 64 or 128), the others on its CUDA cores.
    // Rate 4: DeepSeek-V4's selection over compressed entries (a query sees the entries whose
    // four tokens it has seen), on CUDA's CUDA cores and (16 heads) its tensor cores.
    let index_case = |rng: &mut Rng, out: &mut Vec<CaseReport>, (heads, head_dim, top_k, rate)| {
        let spec = IndexSpec {
            heads,
            head_dim,
            top_k,
            scale: (1.0 / (head_dim as f64).sqrt()) as f32,
            weight_scale: (1.0 / (heads as f64).sqrt()) as f32,
            rate,
        };
        let q = small_ints(rng, t * heads * head_dim);
        let k = small_ints(rng, t * head_dim);
        let w = small_ints(rng, t * heads);
        let want = select(cpu, [&q, &k, &w], &layout, spec)?;
        out.push(compare(
            "index_top_k",
            format!("tokens={t} heads={heads} head_dim={head_dim} top_k={top_k} rate={rate}"),
            &select(b, [&q, &k, &w], &layout, spec)?,
            &want,
            0.0,
            false,
        ));
        Result::Ok(want)
    };
    for case in [
        (64, 64, 40, 1),
        (16, 64, 100, 1),
        (4, 16, 8, 4),
        (16, 64, 12, 4),
    ] {
        index_case(rng, out, case)?;
    }
    for (heads, head_dim, top_k) in [(4, 16, 24), (64, 4, 50)] {
        let want = index_case(rng, out, (heads, head_dim, top_k, 1))?;

        // Attention over those keys (the CPU's selection given to both; on CUDA the key mask of
        // each attention kernel: CUDA cores, Hopper's and mma.sync's tensor cores for 48, 128
        // and DeepSeek's 192), then every earlier key kept, against dense attention; and the
        // latent form's one key head with narrower values (CUDA's gathering kernels: the
        // tensor cores' for DeepSeek's 576 and 512, the CUDA cores' for the rest).
        let shapes = [
            (4, 4, 48, 48),
            (4, 4, 128, 128),
            (2, 2, 192, 192),
            (4, 1, 80, 64),
            (6, 2, 36, 20),
            (64, 1, 576, 512),
        ];
        for (heads, kv_heads, d, v_dim) in shapes {
            if d > b.max_head_dim() && v_dim == d {
                continue;
            }
            let (width, k_width, v_width) = (heads * d, kv_heads * d, kv_heads * v_dim);
            let (q, k, v) = (
                rng.normal_vec(t * width, 1.0),
                rng.normal_vec(t * k_width, 1.0),
                rng.normal_vec(t * v_width, 1.0),
            );
            let spec = AttnSpec::causal(heads, kv_heads, d);
            let (cq, ck, cv) = (
                matrix(cpu, "q", &q, t, width)?,
                matrix(cpu, "k", &k, t, k_width)?,
                matrix(cpu, "v", &v, t, v_width)?,
            );
            let (bq, bk, bv) = (
                b.upload_activation(&q)?.reshaped(t, width)?,
                b.upload_activation(&k)?.reshaped(t, k_width)?,
                b.upload_activation(&v)?.reshaped(t, v_width)?,
            );
            let n = layout.max_len();
            let every: Vec<f32> = (layout.positions.iter())
                .flat_map(|&p| (0..n).map(move |j| if j <= p as usize { j as f32 } else { -1.0 }))
                .collect();
            let selected = [
                (&want, top_k, " selected"),
                (&every, layout.max_len(), " every key"),
            ];
            // Dense attention has values as wide as its keys.
            let selected = if v_dim == d {
                &selected[..]
            } else {
                &selected[..1]
            };
            for &(keys, n, keys_name) in selected {
                let wanted = match keys_name {
                    " every key" => cpu.download(&cpu.attention(
                        &cq,
                        &ck,
                        &cv,
                        &seqs_c,
                        spec,
                        None,
                        OutType::Activation,
                    )?)?,
                    _ => {
                        let kc = matrix(cpu, "keys", keys, t, n)?;
                        let got = cpu.sparse_attention(
                            &cq,
                            &ck,
                            &cv,
                            &seqs_c,
                            spec,
                            (&kc, None),
                            OutType::Activation,
                        )?;
                        cpu.download(&got)?
                    }
                };
                let kb = matrix(b, "keys", keys, t, n)?;
                for &(ot, ot_name) in c.outs {
                    let got = b.sparse_attention(&bq, &bk, &bv, &seqs_b, spec, (&kb, None), ot)?;
                    out.push(compare(
                        "sparse_attention",
                        format!(
                            "tokens={t} heads={heads}/{kv_heads} head_dim={d}/{v_dim} \
                             top_k={n}{keys_name}{ot_name}"
                        ),
                        &b.download(&got)?,
                        &wanted,
                        c.rel,
                        true,
                    ));
                }
            }
        }
    }

    // DeepSeek-V4's form: one key/value head read as keys and values, the batch's tokens then
    // as many rows of compressed entries after them, each query listing its window of 32 and
    // the entries it has seen (positions `tokens + e`), sinks in the softmax.
    for (heads, d) in [(4, 64), (8, 512)] {
        if d > b.max_head_dim() {
            continue;
        }
        let (q, keys) = (
            rng.normal_vec(t * heads * d, 1.0),
            rng.normal_vec(2 * t * d, 1.0),
        );
        let sinks = rng.normal_vec(heads, 1.0);
        let spec = AttnSpec::causal(heads, 1, d);
        let (rate, window) = (4, 32);
        let width = window + layout.max_len() / rate;
        let mut lists = vec![-1f32; t * width];
        for (r, &p) in layout.positions.iter().enumerate() {
            let p = p as usize;
            let own = (p + 1).saturating_sub(window)..=p;
            let entries = (0..(p + 1) / rate).map(|e| t + e);
            for (slot, key) in lists[r * width..].iter_mut().zip(own.chain(entries)) {
                *slot = key as f32;
            }
        }
        let wanted = cpu.download(&cpu.sparse_attention(
            &matrix(cpu, "q", &q, t, heads * d)?,
            &matrix(cpu, "k", &keys, 2 * t, d)?,
            &matrix(cpu, "v", &keys, 2 * t, d)?,
            &seqs_c,
            spec,
            (
                &matrix(cpu, "keys", &lists, t, width)?,
                Some(&matrix(cpu, "sinks", &sinks, 1, heads)?),
            ),
            OutType::Activation,
        )?)?;
        let bq = b.upload_activation(&q)?.reshaped(t, heads * d)?;
        let bk = b.upload_activation(&keys)?.reshaped(2 * t, d)?;
        let (bl, bs) = (
            matrix(b, "keys", &lists, t, width)?,
            matrix(b, "sinks", &sinks, 1, heads)?,
        );
        for &(ot, ot_name) in c.outs {
            let got = b.sparse_attention(&bq, &bk, &bk, &seqs_b, spec, (&bl, Some(&bs)), ot)?;
            out.push(compare(
                "sparse_attention",
                format!(
                    "tokens={t} heads={heads}/1 head_dim={d} window={window} entries after the \
                     tokens, sinks{ot_name}"
                ),
                &b.download(&got)?,
                &wanted,
                c.rel,
                true,
            ));
        }
    }
    Ok(())
}

/// `d`'s selection of `q`, `k` and weights `w` as `spec` says, on the host.
fn select<D: Backend>(
    d: &D,
    [q, k, w]: [&[f32]; 3],
    layout: &SeqLayout,
    spec: IndexSpec,
) -> Result<Vec<f32>> {
    let (t, h, hd) = (layout.n_tokens(), spec.heads, spec.head_dim);
    let keys = d.index_top_k(
        &matrix(d, "q", q, t, h * hd)?,
        &matrix(d, "k", k, t, hd)?,
        &matrix(d, "w", w, t, h)?,
        &d.upload_sequences(layout)?,
        spec,
    )?;
    d.download(&keys)
}
