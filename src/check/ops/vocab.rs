//! The vocabulary ends of the model: the embedding gather (plain and scaled), and the fused
//! lm_head + log-softmax-gather (NLL), `serve`'s row statistics and KL divergence over
//! vocabularies that are not multiples of a tile, with soft-capped and quantized heads.

use super::super::{CaseReport, Ctx, compare, matrix};
use crate::Result;
use crate::backend::{Backend, Device, Head};
use crate::checkpoint::scheme::Strategy;
use crate::numerics::FloatType;
use crate::rng::Rng;
use crate::synth::linear::{LinearSpec, WeightKind};

pub(in crate::check) fn cases<B: Backend>(
    c: &Ctx<'_, B>,
    rng: &mut Rng,
    out: &mut Vec<CaseReport>,
) -> Result<()> {
    let (b, cpu, rel) = (c.b, &c.cpu, c.rel);
    let nll_tol = c.nll_tol;
    // Embedding gather, and the fused lm_head + log-softmax-gather / KLD over vocabularies
    // that are not multiples of a tile.
    // The test model's head is dense or INT4 (the KLD's two heads differ in kind then).
    for (vocab, hidden, rows, int4_head) in [
        (1000, 48, 9, false),
        (32003, 64, 5, false),
        (512, 256, 40, false),
        (20011, 96, 50, true),
        // More rows than a launch of CUDA's fused head takes (8,192), in more row tiles than
        // it groups (16 of 128).
        (300, 128, 8200, false),
    ] {
        let dense = WeightKind::Dense(FloatType::Bf16);
        let head = LinearSpec::new(dense, vocab, hidden, FloatType::Bf16).build(rng);
        let test_kind = if int4_head {
            WeightKind::int(4, Strategy::Group(32))
        } else {
            dense
        };
        let test_head = LinearSpec::new(test_kind, vocab, hidden, FloatType::Bf16).build(rng);
        let hq = head.qlinear();
        let (ch, bh) = (cpu.upload_linear(&hq)?, b.upload_linear(&hq)?);
        let tq = test_head.qlinear();
        let (ct, bt) = (cpu.upload_linear(&tq)?, b.upload_linear(&tq)?);
        let vars = format!("vocab={vocab} hidden={hidden} rows={rows}");
        let ids: Vec<u32> = (0..rows).map(|_| rng.below(vocab as u64) as u32).collect();
        for scale in [1.0, b.activation_type().round(59.866_5)] {
            let want = cpu.download(&cpu.embed(&ch, &ids, scale)?)?;
            let got = b.download(&b.embed(&bh, &ids, scale)?)?;
            let vars = format!("{vars} scale={scale}");
            out.push(compare("embed", vars, &got, &want, rel, true));
        }

        let h = rng.normal_vec(rows * hidden, 1.0);
        let targets: Vec<i32> = (0..rows)
            .map(|r| {
                if r % 4 == 3 {
                    -1
                } else {
                    rng.below(vocab as u64) as i32
                }
            })
            .collect();
        let hb = matrix(b, "h", &h, rows, hidden)?;
        let hc = matrix(cpu, "h", &h, rows, hidden)?;
        // Gemma 2 soft-caps the logits (a cap the logits of unit hidden rows cross).
        let heads = [
            ("", &ch, &bh, None),
            (" softcap=6", &ch, &bh, Some(6.0)),
            (" int4 head", &ct, &bt, None),
        ];
        for (head_name, c, g, softcap) in heads {
            if head_name != " int4 head" || int4_head {
                let want = cpu.nll(&hc, Head { linear: c, softcap }, &targets)?;
                let got = b.nll(&hb, Head { linear: g, softcap }, &targets)?;
                let vars = format!("{vars}{head_name}");
                out.push(compare("nll", vars.clone(), &got, &want, nll_tol, false));
                // serve's reduction: each row's log-sum-exp, target and greedy logprobs and
                // its top-5 logprobs, and in f32 the greedy and top-5 tokens (held absolutely:
                // another token is off by at least 1; bf16 activations move near-tied logits
                // past each other).
                let f32_acts = b.product_type() == crate::numerics::FloatType::F32;
                let stats = |rs: Vec<crate::backend::RowStats>| -> Vec<f32> {
                    rs.iter()
                        .flat_map(|r| {
                            let lp = |l: f32| (f64::from(l) - r.lse) as f32;
                            let best = f32_acts.then_some(r.best as f32);
                            let top = r.top.iter().flat_map(|&(t, l)| {
                                [lp(l)].into_iter().chain(f32_acts.then_some(t as f32))
                            });
                            [r.lse as f32, lp(r.target_logit), lp(r.best_logit)]
                                .into_iter()
                                .chain(best)
                                .chain(top)
                                .collect::<Vec<_>>()
                        })
                        .collect()
                };
                let top5 = (vocab, 5);
                let want =
                    stats(cpu.row_stats(&hc, Head { linear: c, softcap }, &targets, top5)?);
                let got = stats(b.row_stats(&hb, Head { linear: g, softcap }, &targets, top5)?);
                out.push(compare(
                    "row_stats",
                    format!("{vars} top=5"),
                    &got,
                    &want,
                    nll_tol,
                    false,
                ));
            }
        }

        let h2: Vec<f32> = h.iter().map(|v| v + 0.1 * rng.normal()).collect();
        // The base soft-capped, the test not: each head's own logits.
        let (capped, plain) = (Some(6.0), None);
        let want = cpu.kld(
            &hc,
            Head {
                linear: &ch,
                softcap: capped,
            },
            &matrix(cpu, "h2", &h2, rows, hidden)?,
            Head {
                linear: &ct,
                softcap: plain,
            },
            &targets,
        )?;
        let got = b.kld(
            &hb,
            Head {
                linear: &bh,
                softcap: capped,
            },
            &matrix(b, "h2", &h2, rows, hidden)?,
            Head {
                linear: &bt,
                softcap: plain,
            },
            &targets,
        )?;
        // The rankings' agreement joins the values as small counts: the top-1 flag always, the
        // rest in f32 only (bf16 activations move near-tied logits past each other; one place
        // moved is an error of at least 1).
        let f32_acts = b.product_type() == crate::numerics::FloatType::F32;
        let flat = |k: &[crate::backend::KldTerms]| -> Vec<f32> {
            k.iter()
                .flat_map(|t| {
                    let top = &t.top;
                    let ranks = [top.same_ranking, top.base_top_rank]
                        .into_iter()
                        .chain(top.shared)
                        .map(f32::from)
                        .filter(|_| f32_acts);
                    [
                        t.kld as f32,
                        t.kld_reverse as f32,
                        t.nll_q as f32,
                        t.nll_base as f32,
                        t.base_top_p as f32,
                        f32::from(u8::from(t.same_top())),
                    ]
                    .into_iter()
                    .chain(ranks)
                })
                .collect()
        };
        out.push(compare(
            "kld",
            vars,
            &flat(&got),
            &flat(&want),
            nll_tol,
            false,
        ));
    }
    Ok(())
}
