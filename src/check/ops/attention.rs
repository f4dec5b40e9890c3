//! Attention and what feeds it: latent attention's column assembly, RoPE (partial,
//! interleaved, at an offset), per-head q/k norms fused with RoPE, and causal attention over
//! sequences of very different lengths with Gemma's and gpt-oss's variants.

use super::super::{CaseReport, Ctx, compare, matrix};
use crate::Result;
use crate::backend::{
    AttnSpec, Backend, Branches, ColumnBlocks, Device, OutType, RotarySpan, SeqLayout, Shaped,
};
use crate::rng::Rng;

pub(in crate::check) fn cases<B: Backend>(
    c: &Ctx<'_, B>,
    rng: &mut Rng,
    out: &mut Vec<CaseReport>,
) -> Result<()> {
    let (b, cpu, rel) = (c.b, &c.cpu, c.rel);
    let (outs, out_tol) = (c.outs, |ot: OutType| c.out_tol(ot));
    // Column assembly as latent attention uses it: per-head key parts (an activation source)
    // beside a shared rotated part repeated into every head (an f32 source, stride 0), then
    // the values' cut back out of wider heads.
    let (t, heads, latent, rot, nope, vd) = (37, 3, 24, 8, 16, 12);
    let d = nope + rot;
    let kv: Vec<f32> = rng
        .normal_vec(t * heads * (nope + vd), 1.0)
        .into_iter()
        .map(|v| b.activation_type().round(v))
        .collect();
    let ckv = rng.normal_vec(t * (latent + rot), 1.0);
    let keys = [
        ColumnBlocks {
            blocks: heads,
            width: nope,
            from: 0,
            from_stride: nope + vd,
            to: 0,
            to_stride: d,
        },
        ColumnBlocks {
            blocks: heads,
            width: rot,
            from: latent,
            from_stride: 0,
            to: nope,
            to_stride: d,
        },
    ];
    let values = ColumnBlocks {
        blocks: heads,
        width: vd,
        from: nope,
        from_stride: nope + vd,
        to: 0,
        to_stride: vd,
    };
    for (ot, ot_name) in outs {
        let cpu_kv = cpu
            .upload_activation(&kv)?
            .reshaped(t, heads * (nope + vd))?;
        let cpu_ckv = matrix(cpu, "ckv", &ckv, t, latent + rot)?;
        let b_kv = b.upload_activation(&kv)?.reshaped(t, heads * (nope + vd))?;
        let b_ckv = matrix(b, "ckv", &ckv, t, latent + rot)?;
        for (what, parts, cols) in [
            ("keys", &[(0, keys[0]), (1, keys[1])][..], heads * d),
            ("values", &[(0, values)][..], heads * vd),
        ] {
            let pick_cpu = [&cpu_kv, &cpu_ckv];
            let pick_b = [&b_kv, &b_ckv];
            let cpu_parts: Vec<_> = parts.iter().map(|&(i, at)| (pick_cpu[i], at)).collect();
            let b_parts: Vec<_> = parts.iter().map(|&(i, at)| (pick_b[i], at)).collect();
            let want = cpu.download(&cpu.assemble_columns(t, cols, &cpu_parts, *ot)?)?;
            let got = b.download(&b.assemble_columns(t, cols, &b_parts, *ot)?)?;
            out.push(compare(
                "assemble_columns",
                format!("{what} heads={heads} nope={nope} rope={rot} v={vd}{ot_name}"),
                &got,
                &want,
                out_tol(*ot),
                true,
            ));
        }
    }

    // RoPE, attention: sequences of very different lengths laid end to end (one token;
    // several key tiles; sequence starts inside a tile), grouped-query and plain heads, the
    // head sizes of the tensor-core kernels (64, 128) and others.
    let act = b.activation_type();
    for (lens, heads, kv_heads, d) in [
        (&[1, 17, 70][..], 4, 2, 16),
        (&[1, 17, 70], 3, 3, 8),
        (&[1, 17, 70], 8, 1, 64),
        (&[1, 17, 70], 2, 1, 128),
        (&[1, 17, 70], 2, 2, 96),
        (&[13, 29], 3, 3, 40),
        (&[100, 37], 8, 2, 128),
        (&[33], 4, 1, 112),
        (&[1, 150, 70, 200], 4, 2, 64),
        (&[300, 5], 4, 4, 128),
        // DeepSeek's query/key heads (its values padded to them), Gemma's widest and Gemma
        // 4's full-attention heads.
        (&[1, 150, 70, 200], 4, 4, 192),
        (&[33, 100], 4, 2, 256),
        (&[33, 100], 8, 2, 512),
        (&[1, 150, 70, 200], 4, 1, 512),
    ] {
        if d > b.max_head_dim() {
            continue;
        }
        let layout = SeqLayout::from_lengths(lens.iter().copied());
        let t = layout.n_tokens();
        // Partial rotary (GLM-4.5 rotates half of each head) on two of the shapes: per pair,
        // and 8 pairs at a time on CUDA; latent attention's rotated tail of each head,
        // interleaved (DeepSeek) and in halves at an offset (8 pairs at a time on CUDA).
        let span = match (d, heads) {
            (96, _) => RotarySpan::leading(d, 48),
            (128, 2) => RotarySpan::leading(d, 64),
            (40, _) => RotarySpan {
                head_dim: d,
                start: 24,
                dims: 16,
                interleaved: true,
            },
            (112, _) => RotarySpan {
                head_dim: d,
                start: 48,
                dims: 64,
                interleaved: false,
            },
            _ => RotarySpan::leading(d, d),
        };
        let (half, max_pos) = (span.dims / 2, layout.max_len());
        let cos: Vec<f32> = (0..max_pos * half)
            .map(|i| ((i as f32) * 0.37).cos())
            .collect();
        let sin: Vec<f32> = (0..max_pos * half)
            .map(|i| ((i as f32) * 0.37).sin())
            .collect();
        let x = rng.normal_vec(t * heads * d, 1.0);
        let mut xg = matrix(b, "x", &x, t, heads * d)?;
        let mut xc = matrix(cpu, "x", &x, t, heads * d)?;
        let (cc, cs) = (
            cpu.upload_vector("cos", &cos)?,
            cpu.upload_vector("sin", &sin)?,
        );
        cpu.rope(&mut xc, &layout, &cc, &cs, span)?;
        let x = cpu.download(&xc)?;
        let (bc, bs) = (b.upload_vector("cos", &cos)?, b.upload_vector("sin", &sin)?);
        let bl = b.upload_sequences(&layout)?;
        b.rope(&mut xg, &bl, &bc, &bs, span)?;
        let vars = format!(
            "seqs={lens:?} heads={heads} kv_heads={kv_heads} head_dim={d} rotary={}+{}{}",
            span.start,
            span.dims,
            if span.interleaved { " interleaved" } else { "" }
        );
        out.push(compare(
            "rope",
            vars.clone(),
            &b.download(&xg)?,
            &x,
            rel,
            true,
        ));
        // Qwen3's per-head q/k norms and the RoPE after them (one pass on CUDA where the
        // rotation covers whole heads of 16, 64, 128 or 256 values).
        let (w, xn) = (rng.normal_vec(d, 1.0), rng.normal_vec(t * heads * d, 2.0));
        let want = cpu.norm_rope(
            matrix(cpu, "x", &xn, t, heads * d)?,
            &cpu.upload_vector("w", &w)?,
            1e-6,
            &layout,
            &cc,
            &cs,
            span,
        )?;
        let got = b.norm_rope(
            matrix(b, "x", &xn, t, heads * d)?,
            &b.upload_vector("w", &w)?,
            1e-6,
            &bl,
            &bc,
            &bs,
            span,
        )?;
        out.push(compare(
            "rms_norm + rope",
            vars.clone(),
            &b.download(&got)?,
            &cpu.download(&want)?,
            rel,
            true,
        ));

        let mut qkv = |n: usize| activations(rng, t * n * d, act);
        let (q, k, v) = (qkv(heads), qkv(kv_heads), qkv(kv_heads));
        let (qw, kw) = (heads * d, kv_heads * d);
        let (cq, ck, cv) = (
            matrix(cpu, "q", &q, t, qw)?,
            matrix(cpu, "k", &k, t, kw)?,
            matrix(cpu, "v", &v, t, kw)?,
        );
        let (bq, bk, bv) = (
            matrix(b, "q", &q, t, qw)?,
            matrix(b, "k", &k, t, kw)?,
            matrix(b, "v", &v, t, kw)?,
        );
        // Plain causal attention, then Gemma's variants: another scale, soft-capped scores
        // (a cap the scores of unit q and k cross) and a sliding window shorter than the longer
        // sequences (and one longer than a tile of every kernel).
        let causal = AttnSpec::causal(heads, kv_heads, d);
        let variants = [
            (causal, String::new()),
            (
                AttnSpec {
                    scale: 0.3,
                    softcap: Some(2.5),
                    window: Some(9),
                    ..causal
                },
                " scale=0.3 softcap=2.5 window=9".to_string(),
            ),
            (
                AttnSpec {
                    window: Some(77),
                    ..causal
                },
                " window=77".to_string(),
            ),
        ];
        // gpt-oss's per-head sinks (around the scores' size) with a window of 13.
        let sink_values = rng.normal_vec(heads, 2.0);
        let (sinks_c, sinks_b) = (
            cpu.upload_vector("sinks", &sink_values)?,
            b.upload_vector("sinks", &sink_values)?,
        );
        let with_sinks = (
            AttnSpec {
                window: Some(13),
                ..causal
            },
            " window=13 sinks".to_string(),
        );
        let last = variants.len();
        for (i, (spec, spec_name)) in variants.into_iter().chain([with_sinks]).enumerate() {
            let (sc, sb) = if i == last {
                (Some(&sinks_c), Some(&sinks_b))
            } else {
                (None, None)
            };
            let want = cpu.attention(&cq, &ck, &cv, &layout, spec, sc, OutType::Activation)?;
            let want = cpu.download(&want)?;
            for &(ot, ot_name) in outs {
                let got = b.attention(&bq, &bk, &bv, &bl, spec, sb, ot)?;
                out.push(compare(
                    "attention",
                    format!("{vars}{spec_name}{ot_name}"),
                    &b.download(&got)?,
                    &want,
                    rel,
                    true,
                ));
            }
        }
    }

    // Values whose rows span 2^20 by position: the first 32 tokens' 2^10, the rest 2^-10,
    // with a window of 9, so that queries from the 41st see only small values while a tile of
    // their block holds large ones. Judged row by row (each query's output against its own
    // largest value): a kernel that scales the values' rows per block of queries rather than
    // per query leaves the small queries' weights 2^-20 of their size, where f16 keeps 4 bits.
    // (CUDA's f32-grade planes scale each value column by its largest: they keep 2^20 exactly,
    // not 2^32.)
    let layout = SeqLayout::from_lengths([100, 37]);
    let t = layout.n_tokens();
    let (heads, kv_heads, d) = (4, 2, 64);
    let (q, k) = (
        activations(rng, t * heads * d, act),
        activations(rng, t * kv_heads * d, act),
    );
    let v: Vec<f32> = activations(rng, t * kv_heads * d, act)
        .into_iter()
        .enumerate()
        .map(|(i, x)| {
            let pos = layout.positions[i / (kv_heads * d)];
            x * if pos < 32 { 1024.0 } else { 1.0 / 1024.0 }
        })
        .collect();
    let spec = AttnSpec {
        window: Some(9),
        ..AttnSpec::causal(heads, kv_heads, d)
    };
    let vars = format!(
        "values 2^10 then 2^-10 by position, per row seqs=[100, 37] heads={heads} \
         kv_heads={kv_heads} head_dim={d} window=9"
    );
    attention_against_cpu(c, &layout, spec, [&q, &k, &v], None, true, &vars, out)?;

    // Continuations of one context sharing its rows (`eval --task`): sequences split into
    // branches after a prefix, beside plain ones, prefixes and branches across key tiles;
    // with sinks. The CPU's reference is held to separate sequences in its own tests.
    let branched = [
        Branches {
            prefix: 20,
            lens: vec![5, 1, 9],
        },
        Branches {
            prefix: 70,
            lens: vec![3, 66, 2],
        },
    ];
    let layout = SeqLayout::from_sequences([
        (17, None),
        (branched[0].rows(), Some(&branched[0])),
        (1, None),
        (branched[1].rows(), Some(&branched[1])),
    ]);
    let t = layout.n_tokens();
    for (heads, kv_heads, d) in [(4, 2, 64), (2, 1, 128), (3, 3, 40)] {
        let mut qkv = |n: usize| activations(rng, t * n * d, act);
        let (q, k, v) = (qkv(heads), qkv(kv_heads), qkv(kv_heads));
        let sinks = rng.normal_vec(heads, 2.0);
        let vars = format!(
            "branches prefix=20+[5,1,9] prefix=70+[3,66,2] heads={heads} kv_heads={kv_heads} \
             head_dim={d} sinks"
        );
        let spec = AttnSpec::causal(heads, kv_heads, d);
        attention_against_cpu(
            c,
            &layout,
            spec,
            [&q, &k, &v],
            Some(&sinks),
            false,
            &vars,
            out,
        )?;
    }

    Ok(())
}

/// Attention of `qkv` (the `layout`'s tokens) with `sinks` on the backend, in each output type,
/// against the CPU's, as the case `vars`; `each_row` judges every query's output on its own
/// scale.
#[allow(clippy::too_many_arguments)]
fn attention_against_cpu<B: Backend>(
    c: &Ctx<'_, B>,
    layout: &SeqLayout,
    spec: AttnSpec,
    qkv: [&[f32]; 3],
    sinks: Option<&[f32]>,
    each_row: bool,
    vars: &str,
    out: &mut Vec<CaseReport>,
) -> Result<()> {
    let (b, cpu) = (c.b, &c.cpu);
    let t = layout.n_tokens();
    let widths = [spec.heads, spec.kv_heads, spec.kv_heads].map(|h| h * spec.head_dim);
    let names = ["q", "k", "v"];
    let mut on_cpu = Vec::new();
    let mut on_b = Vec::new();
    for ((x, w), name) in qkv.iter().zip(widths).zip(names) {
        on_cpu.push(matrix(cpu, name, x, t, w)?);
        on_b.push(matrix(b, name, x, t, w)?);
    }
    let cpu_sinks = sinks.map(|s| cpu.upload_vector("sinks", s)).transpose()?;
    let want = cpu.attention(
        &on_cpu[0],
        &on_cpu[1],
        &on_cpu[2],
        layout,
        spec,
        cpu_sinks.as_ref(),
        OutType::Activation,
    )?;
    let want = cpu.download(&want)?;
    let bl = b.upload_sequences(layout)?;
    let b_sinks = sinks.map(|s| b.upload_vector("sinks", s)).transpose()?;
    for &(ot, ot_name) in c.outs {
        let got = b.attention(
            &on_b[0],
            &on_b[1],
            &on_b[2],
            &bl,
            spec,
            b_sinks.as_ref(),
            ot,
        )?;
        let got = b.download(&got)?;
        let (got, want) = if each_row {
            per_row(&got, &want, widths[0])
        } else {
            (got, want.clone())
        };
        out.push(compare(
            "attention",
            format!("{vars}{ot_name}"),
            &got,
            &want,
            c.rel,
            true,
        ));
    }
    Ok(())
}

/// `got` and `want` with each row of `cols` divided by `want`'s largest |value| in it: a
/// relative comparison of them judges every row on its own scale.
fn per_row(got: &[f32], want: &[f32], cols: usize) -> (Vec<f32>, Vec<f32>) {
    let mut scaled = (
        Vec::with_capacity(got.len()),
        Vec::with_capacity(want.len()),
    );
    for (g, w) in got.chunks(cols).zip(want.chunks(cols)) {
        let top = w
            .iter()
            .fold(0f32, |m, x| m.max(x.abs()))
            .max(f32::MIN_POSITIVE);
        scaled.0.extend(g.iter().map(|x| x / top));
        scaled.1.extend(w.iter().map(|x| x / top));
    }
    scaled
}

/// `n` normal values as the activation type holds them.
fn activations(rng: &mut Rng, n: usize, act: crate::numerics::FloatType) -> Vec<f32> {
    rng.normal_vec(n, 1.0)
        .into_iter()
        .map(|v| act.round(v))
        .collect()
}
