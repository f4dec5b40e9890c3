//! The lm_head over vocabulary tiles: logits are computed a tile of rows x VOCAB_TILE at a
//! time and folded into an online log-sum-exp (and, for `kld`, the KL sums), so only one f32
//! value per scored row and statistic comes back to the host.

use super::kernels::lm_head_lse::{self, LmHeadLse};
use super::kernels::nll::{LseState, Ranking};
use super::kernels::{self, Dt};
use super::memory::{CudaTensor, DevBuf};
use super::weights::{CudaLinear, DevWeight};
use super::{CudaBackend, gemm};
use crate::backend::{Device, Head, KldTerms, RowStats, TOP_K, TopAgreement};
use crate::{Error, Result};

/// Vocab columns per lm_head tile.
pub(super) const VOCAB_TILE: usize = 8192;
/// Scored rows per lm_head pass: with VOCAB_TILE, a 256 MiB f32 logits tile.
pub(super) const ROW_CHUNK: usize = 8192;

/// A downloaded `LseState` buffer (layout of `CudaBackend::lse_state`).
pub(super) struct HostLse {
    pub(super) s: Vec<f64>,
    pub(super) m: Vec<f32>,
    pub(super) tgt: Vec<f32>,
    pub(super) arg: Vec<i32>,
}

impl HostLse {
    pub(super) fn new(bytes: &[u8], n: usize) -> Self {
        Self {
            s: bytemuck::pod_collect_to_vec(&bytes[..8 * n]),
            m: bytemuck::pod_collect_to_vec(&bytes[8 * n..12 * n]),
            tgt: bytemuck::pod_collect_to_vec(&bytes[12 * n..16 * n]),
            arg: bytemuck::pod_collect_to_vec(&bytes[16 * n..20 * n]),
        }
    }

    pub(super) fn lse(&self, r: usize) -> f64 {
        self.m[r] as f64 + self.s[r].ln()
    }
}

/// What a first pass over the vocabulary leaves: its per-row state (the buffer and its
/// addresses) and the logits tile it went through.
pub(super) struct FirstPass {
    pub(super) state: DevBuf,
    pub(super) st: LseState,
    pub(super) tile: DevBuf,
}

impl CudaBackend {
    /// Logits tile `[rows, cols]` (f32, row stride `cols`) of hidden rows `x` against head
    /// rows `v0..v0 + cols`, soft-capped where the head says so.
    pub(super) fn logits_tile(
        &self,
        x: u64,
        head: Head<'_, CudaLinear>,
        rows: usize,
        v0: usize,
        cols: usize,
        out: u64,
    ) -> Result<()> {
        let softcap = head.softcap;
        let head = head.linear;
        let w = self.weight_rows(head, v0, cols)?;
        let product = gemm::Product {
            n_out: cols,
            ldy: cols,
            w_f16: w.f16,
            ..head.product(x, w.ptr, out, rows)
        };
        self.xwt(product, (self.precision.act(), Dt::F32))?;
        match softcap {
            Some(cap) => kernels::softcap::run(&self.kernels, &self.stream, out, rows * cols, cap),
            None => Ok(()),
        }
    }

    /// The scored rows of `hidden` gathered into one matrix of the activation type, with their
    /// targets.
    pub(super) fn scored(
        &self,
        hidden: &CudaTensor,
        n_in: usize,
        targets: &[i32],
        vocab: usize,
    ) -> Result<(CudaTensor, DevBuf, usize)> {
        let hidden = self.act(hidden)?;
        let hidden = hidden.get();
        self.check_tensor(
            hidden,
            [targets.len(), n_in],
            self.precision.act(),
            "lm_head input",
        )?;
        let mut ids = Vec::new();
        let mut tg = Vec::new();
        for (r, &t) in targets.iter().enumerate() {
            if t >= 0 {
                if t as usize >= vocab {
                    return Err(Error::InvalidArgument(format!(
                        "target {t} is outside the vocabulary of {vocab}"
                    )));
                }
                ids.push(r as u32);
                tg.push(t);
            }
        }
        let n = ids.len();
        let out = self.new_tensor([n, n_in], self.precision.act(), "scored hidden rows")?;
        if n > 0 {
            let ids_dev = self.upload_pod(&ids, "scored row ids")?;
            let table = (hidden.ptr(), hidden.dtype);
            kernels::gather_rows::run(
                &self.kernels,
                &self.stream,
                &out,
                table,
                ids_dev.ptr(),
                (1.0, 0),
            )?;
        }
        let tg_dev = self.upload_pod(&tg, "targets")?;
        Ok((out, tg_dev, n))
    }

    /// Running log-sum-exp state for `n` rows: (buffer, state addresses).
    fn lse_state(&self, n: usize, what: &str) -> Result<(DevBuf, LseState)> {
        let buf = self.alloc(n * 20, what)?;
        let base = buf.ptr();
        let st = LseState {
            s: base,
            m: base + 8 * n as u64,
            tgt: base + 12 * n as u64,
            arg: base + 16 * n as u64,
        };
        Ok((buf, st))
    }

    /// First pass over the vocab: per-row max, sumexp, target logit and argmax of `x · head^T`
    /// into a new state (`who` names its buffers), through a logits tile the caller may reuse;
    /// with `rank`, each row's ranking of its largest logits too.
    pub(super) fn lse_pass(
        &self,
        x: &CudaTensor,
        head: Head<'_, CudaLinear>,
        (n, targets): (usize, &DevBuf),
        who: &str,
        rank: Option<Ranking>,
    ) -> Result<FirstPass> {
        let (n_in, vocab) = (head.linear.in_features, head.linear.out_features);
        let (state, st) = self.lse_state(n, &format!("{who}log-sum-exp state"))?;
        let tile = self.logits_buffer(n, vocab, &format!("{who}logits tile"))?;
        for r0 in (0..n).step_by(ROW_CHUNK) {
            let rows = ROW_CHUNK.min(n - r0);
            let xr = x.ptr() + (r0 * n_in * self.precision.act().bytes()) as u64;
            for v0 in (0..vocab).step_by(VOCAB_TILE) {
                let cols = VOCAB_TILE.min(vocab - v0);
                self.logits_tile(xr, head, rows, v0, cols, tile.ptr())?;
                kernels::nll::lse_tile(
                    &self.kernels,
                    &self.stream,
                    tile.ptr(),
                    rows,
                    cols,
                    targets.ptr() + 4 * r0 as u64,
                    v0,
                    v0 == 0,
                    st.offset(r0),
                )?;
                if let Some(rank) = rank {
                    let (k, s) = (&self.kernels, &self.stream);
                    let at = (rows, cols, v0);
                    kernels::nll::top_tile(k, s, tile.ptr(), at, v0 == 0, rank.offset(r0))?;
                }
            }
        }
        Ok(FirstPass { state, st, tile })
    }

    fn logits_buffer(&self, n: usize, vocab: usize, what: &str) -> Result<DevBuf> {
        self.alloc(ROW_CHUNK.min(n) * VOCAB_TILE.min(vocab) * 4, what)
    }

    /// Fused lm_head + log-softmax + gather over vocab tiles (`Backend::nll`).
    pub(super) fn vocab_nll(
        &self,
        hidden: &CudaTensor,
        head: Head<'_, CudaLinear>,
        targets: &[i32],
    ) -> Result<Vec<f32>> {
        let (n_in, vocab) = (head.linear.in_features, head.linear.out_features);
        let (x, tg, n) = self.scored(hidden, n_in, targets, vocab)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let out = self.new_tensor([1, n], Dt::F32, "nll")?;
        if !self.fused_nll(&x, head, &tg, &out)? {
            let pass = self.lse_pass(&x, head, (n, &tg), "", None)?;
            kernels::nll::nll_finish(&self.kernels, &self.stream, out.ptr(), pass.st, n)?;
        }
        self.download(&out)
    }

    /// The log-sum-exp, greedy token, target logit and `top` largest logits of every scored
    /// row from the first pass over the vocabulary (`Backend::row_stats`): 20 bytes and 8 a
    /// listed token a row leave the device.
    pub(super) fn vocab_row_stats(
        &self,
        hidden: &CudaTensor,
        head: Head<'_, CudaLinear>,
        targets: &[i32],
        top: usize,
    ) -> Result<Vec<RowStats>> {
        crate::backend::check_row_top(top)?;
        let (n_in, vocab) = (head.linear.in_features, head.linear.out_features);
        let (x, tg, n) = self.scored(hidden, n_in, targets, vocab)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        // `n * top` logits, then as many ids.
        let rank_buf = self.upload_pod(&vec![0u32; 2 * n * top.max(1)], "top lists")?;
        let rank = (top > 0).then(|| Ranking {
            logits: rank_buf.ptr(),
            ids: rank_buf.ptr() + (4 * n * top) as u64,
            k: top,
        });
        let pass = self.lse_pass(&x, head, (n, &tg), "", rank)?;
        let host = HostLse::new(&self.download_bytes(&pass.state, "log-sum-exp state")?, n);
        let ranks: Vec<u32> = match rank {
            Some(_) => bytemuck::pod_collect_to_vec(&self.download_bytes(&rank_buf, "top lists")?),
            None => Vec::new(),
        };
        Ok((0..n)
            .map(|r| RowStats {
                lse: host.lse(r),
                best: host.arg[r] as u32,
                best_logit: host.m[r],
                target_logit: host.tgt[r],
                // The unfilled places of a vocabulary shorter than the list left out.
                top: (0..top)
                    .map(|j| {
                        (
                            ranks[n * top + r * top + j],
                            f32::from_bits(ranks[r * top + j]),
                        )
                    })
                    .filter(|&(t, _)| (t as usize) < vocab)
                    .collect(),
            })
            .collect())
    }

    /// The NLL of the scored rows `x` into `out` with the log-sum-exp in the lm_head GEMM's
    /// epilogue (`lm_head_lse.cu`, `ROW_CHUNK` rows a launch), where it applies: on Hopper, for
    /// bf16 activations and a dense head. `false` where it does not (nothing queued).
    fn fused_nll(
        &self,
        x: &CudaTensor,
        head: Head<'_, CudaLinear>,
        targets: &DevBuf,
        out: &CudaTensor,
    ) -> Result<bool> {
        let (n_in, vocab) = (head.linear.in_features, head.linear.out_features);
        let (DevWeight::Dense(w), Dt::Bf16) = (&head.linear.weight, self.precision.act()) else {
            return Ok(false);
        };
        let Some(kernel) = self.kernels.optional::<LmHeadLse>()? else {
            return Ok(false);
        };
        if !kernel.takes(n_in) {
            return Ok(false);
        }
        let n = x.rows;
        let slices = LmHeadLse::slices(vocab);
        let chunk = ROW_CHUNK.min(n);
        let partials = self.alloc(chunk * slices * 8, "log-sum-exp partials")?;
        let target_logits = self.alloc(n * 4, "target logits")?;
        for r0 in (0..n).step_by(ROW_CHUNK) {
            let rows = ROW_CHUNK.min(n - r0);
            let job = lm_head_lse::Job {
                x: x.ptr() + (r0 * n_in * 2) as u64,
                rows,
                head: w.ptr(),
                hidden: n_in,
                vocab,
                softcap: head.softcap.unwrap_or(0.0),
                targets: targets.ptr() + 4 * r0 as u64,
                partials: partials.ptr(),
                target_logits: target_logits.ptr() + 4 * r0 as u64,
            };
            kernel.run(&self.stream, &job)?;
            kernels::nll::nll_from_slices(
                &self.kernels,
                &self.stream,
                out.ptr() + 4 * r0 as u64,
                (partials.ptr(), slices),
                job.target_logits,
                rows,
            )?;
        }
        Ok(true)
    }

    /// KL divergence terms over vocab tiles (`Backend::kld`).
    pub(super) fn vocab_kld(
        &self,
        base_hidden: &CudaTensor,
        base_head: Head<'_, CudaLinear>,
        hidden: &CudaTensor,
        head: Head<'_, CudaLinear>,
        targets: &[i32],
    ) -> Result<Vec<KldTerms>> {
        let vocab = head.linear.out_features;
        let n_in = (head.linear.in_features, base_head.linear.in_features);
        let (xp, tg, n) = self.scored(base_hidden, n_in.1, targets, vocab)?;
        let (xq, _, _) = self.scored(hidden, n_in.0, targets, vocab)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        // The base's ranking then Q's, each `n * TOP_K` logits then as many ids, made in the
        // first pass over the vocabulary.
        let rank_buf = self.upload_pod(&vec![0u32; 4 * n * TOP_K], "rankings")?;
        let ranking = |i: u64| Ranking {
            logits: rank_buf.ptr() + i * (8 * n * TOP_K) as u64,
            ids: rank_buf.ptr() + i * (8 * n * TOP_K) as u64 + (4 * n * TOP_K) as u64,
            k: TOP_K,
        };
        let pass_p = self.lse_pass(&xp, base_head, (n, &tg), "base ", Some(ranking(0)))?;
        let pass_q = self.lse_pass(&xq, head, (n, &tg), "", Some(ranking(1)))?;
        let (p, tile_p, p_buf) = (pass_p.st, &pass_p.tile, &pass_p.state);
        let (q, tile_q, q_buf) = (pass_q.st, &pass_q.tile, &pass_q.state);
        let acc = self.upload_pod(&vec![0f64; 2 * n], "KL sums")?;
        for r0 in (0..n).step_by(ROW_CHUNK) {
            let rows = ROW_CHUNK.min(n - r0);
            let (xpr, xqr) = (
                xp.ptr() + (r0 * n_in.1 * self.precision.act().bytes()) as u64,
                xq.ptr() + (r0 * n_in.0 * self.precision.act().bytes()) as u64,
            );
            for v0 in (0..vocab).step_by(VOCAB_TILE) {
                let cols = VOCAB_TILE.min(vocab - v0);
                self.logits_tile(xpr, base_head, rows, v0, cols, tile_p.ptr())?;
                self.logits_tile(xqr, head, rows, v0, cols, tile_q.ptr())?;
                kernels::nll::kld_tile(
                    &self.kernels,
                    &self.stream,
                    tile_p.ptr(),
                    tile_q.ptr(),
                    rows,
                    cols,
                    p.offset(r0),
                    q.offset(r0),
                    acc.ptr() + 16 * r0 as u64,
                )?;
            }
        }
        let p_state = self.download_bytes(p_buf, "base log-sum-exp state")?;
        let q_state = self.download_bytes(q_buf, "log-sum-exp state")?;
        let kl: Vec<f64> = bytemuck::pod_collect_to_vec(&self.download_bytes(&acc, "KL sums")?);
        let ranks: Vec<u32> =
            bytemuck::pod_collect_to_vec(&self.download_bytes(&rank_buf, "rankings")?);
        // Row r's ids in ranking `i` (0: the base's), the unfilled places of a short vocabulary
        // left out.
        let ids = |i: usize, r: usize| -> Vec<u32> {
            let at = (2 * i + 1) * n * TOP_K + r * TOP_K;
            let row = &ranks[at..at + TOP_K];
            row.iter()
                .copied()
                .filter(|&t| (t as usize) < vocab)
                .collect()
        };
        let (ps, qs) = (HostLse::new(&p_state, n), HostLse::new(&q_state, n));
        Ok((0..n)
            .map(|r| {
                let (lse_p, lse_q) = (ps.lse(r), qs.lse(r));
                KldTerms {
                    kld: kl[2 * r],
                    kld_reverse: kl[2 * r + 1],
                    nll_q: lse_q - qs.tgt[r] as f64,
                    nll_base: lse_p - ps.tgt[r] as f64,
                    base_top_p: (ps.m[r] as f64 - lse_p).exp(),
                    top: TopAgreement::of(&ids(0, r), &ids(1, r)),
                }
            })
            .collect())
    }
}
