//! A mixture's routed experts in a handful of launches per layer, on bf16 activations: every
//! routed row gathered once in group (expert) order, the active experts' weights dequantized
//! in one launch into an arena (the dequantization scratch, grown to `EXPERT_ARENA_BYTES` at
//! most), gate and up of all of them as one grouped cuBLAS GEMM (or one GEMM each where they
//! have many rows), the activation over all rows, down likewise, and each token's outputs
//! summed in expert order (`combine_experts.cu`): the values of the expert-by-expert loop but
//! for the GEMMs' own summation orders. The loop was ~9 launches per expert, its GEMMs too
//! small to fill the GPU at a few hundred rows per expert.

use super::kernels::{self, Dt, combine_experts, gather_rows};
use super::weights::{DevWeight, scratch_ptr};
use super::{Act, CudaBackend, CudaGroups, CudaLinear, CudaTensor, gemm};
use crate::Result;
use crate::backend::{Backend, GatedMlp, mixture_by_group};

/// The most bytes of dequantized expert weights held at once: a layer's active experts run in
/// chunks whose weights fit (all 128 of Qwen3-30B-A3B's gate and up: 0.8 GB).
pub(super) const EXPERT_ARENA_BYTES: usize = 1 << 30;

/// Rows per expert from which separate cuBLAS GEMMs beat one grouped call. Measured on an
/// H100 with Qwen3-30B-A3B's experts (BENCHMARKS.md, session 13): at 512 rows per expert the
/// grouped call took 0.70x the separate GEMMs' time, at 2048 rows 1.34x.
const SEPARATE_GEMMS_FROM_ROWS: usize = 1024;

/// One expert's GEMM of a grouped call: its weight, its rows' first index into the gathered
/// input and output, and their count.
struct Problem<'a> {
    w: &'a CudaLinear,
    row0: usize,
    rows: usize,
}

impl CudaBackend {
    /// The arena bytes a model of `experts` experts of `gate` and `up` `[inter, hidden]`
    /// would take (bf16 activations only).
    pub(super) fn expert_arena_bytes(&self, experts: usize, inter: usize, hidden: usize) -> usize {
        match self.act {
            Dt::Bf16 => (2 * experts * inter * hidden * 2).min(EXPERT_ARENA_BYTES),
            Dt::F32 => 0,
        }
    }

    /// `Backend::mixture` grouped, or `None` where it does not apply: f32 activations (the
    /// exact path keeps its f32 GEMMs), groups routed on the host (no slots), experts of
    /// different shapes or kinds of activation quantizer, biases, or gate and up fused
    /// (gpt-oss), or gate and up of one expert quantizing their input differently. A shared
    /// expert's group runs after the routed ones, expert by expert, as it would have.
    pub(super) fn grouped_mixture<'a>(
        &self,
        x: &CudaTensor,
        groups: &CudaGroups,
        lens: &[usize],
        mlps: &[GatedMlp<'a, CudaLinear>],
    ) -> Result<Option<CudaTensor>> {
        let (Some((slots, k)), routed) = (&groups.slots, groups.routed) else {
            return Ok(None);
        };
        let Some(first) = mlps.first() else {
            return Ok(None);
        };
        let (t, h) = (x.rows, x.cols);
        let inter = first.gate.out_features;
        let same = |m: &GatedMlp<'_, CudaLinear>| {
            let Some(up) = m.up else { return false };
            // Shape, no bias, and an input quantizer of the kind of the first expert's `like`
            // (its parameters may differ: each expert's rows are quantized with its own).
            let shaped = |w: &CudaLinear, like: &CudaLinear, out: usize, n_in: usize| {
                w.out_features == out
                    && w.in_features == n_in
                    && w.bias.is_none()
                    && w.act_quant.as_ref().map(std::mem::discriminant)
                        == like.act_quant.as_ref().map(std::mem::discriminant)
            };
            // Gate and up read one quantized input, as their own linears would each make it.
            shaped(m.gate, first.gate, inter, h)
                && shaped(up, first.gate, inter, h)
                && up.act_quant == m.gate.act_quant
                && shaped(m.down, first.down, h, inter)
                && m.act == first.act
        };
        if self.act != Dt::Bf16
            || mlps.len() < routed
            || lens.len() < routed
            || *k > combine_experts::MAX_K
            || !h.is_multiple_of(8)
            || !mlps[..routed].iter().all(same)
        {
            return Ok(None);
        }
        groups.range(routed - 1, t)?;
        let picks = groups.offsets[routed];
        let active: Vec<usize> = (0..routed).filter(|&g| lens[g] > 0).collect();
        let problems = |pick: fn(&GatedMlp<'a, CudaLinear>) -> &'a CudaLinear, out: u64| {
            active.iter().map(move |&g| {
                let p = Problem {
                    w: pick(&mlps[g]),
                    row0: groups.offsets[g],
                    rows: lens[g],
                };
                (p, out)
            })
        };

        // Every routed row once, in group order, in the type the gate wants: f32 where it
        // quantizes its input, else bf16, gathered from a bf16 copy of x (each token's row is
        // read k times, at half the bytes).
        let in_dt = self.out_dt(self.input_type(first.gate));
        let source = match in_dt {
            Dt::Bf16 => self.act(x)?,
            Dt::F32 => Act::Same(x),
        };
        let gathered = self.new_tensor([picks, h], in_dt, "expert rows")?;
        let table = (source.get().ptr(), source.get().dtype);
        gather_rows::run(
            &self.kernels,
            &self.stream,
            &gathered,
            table,
            groups.rows.ptr(),
            1.0,
        )?;
        drop(source);
        let gate = self.new_tensor([picks, inter], Dt::Bf16, "experts' gate")?;
        let up = self.new_tensor([picks, inter], Dt::Bf16, "experts' up")?;
        let jobs: Vec<_> = problems(|m| m.gate, gate.ptr())
            .chain(problems(|m| m.up.unwrap_or(m.gate), up.ptr()))
            .collect();
        // The gate jobs come first; up quantizes its input as gate does.
        let xs = self.expert_inputs(&gathered, &jobs[..active.len()])?;
        self.grouped_linears(xs.get(), &jobs, h, inter)?;
        drop(xs);
        drop(gathered);

        let act = self.gated_act(&gate, Some(&up), first.act, self.input_type(first.down))?;
        drop((gate, up));
        let y = self.new_tensor([picks, h], Dt::Bf16, "experts' output")?;
        let jobs: Vec<_> = problems(|m| m.down, y.ptr()).collect();
        let act_in = self.expert_inputs(&act, &jobs)?;
        self.grouped_linears(act_in.get(), &jobs, inter, h)?;
        drop(act_in);
        drop(act);

        let acc = self.new_tensor([t, h], Dt::F32, "mixture accumulator")?;
        combine_experts::run(
            &self.kernels,
            &self.stream,
            &acc,
            &y,
            slots.ptr(),
            groups.weights.ptr(),
            *k,
        )?;
        mixture_by_group(self, Some(acc), x, groups, lens, mlps, routed).map(Some)
    }

    /// `x`'s rows as each problem's GEMM reads them: `gemm_input` of the whole where every
    /// problem quantizes its input alike (or not at all), else each problem's rows quantized
    /// with its own quantizer (static scales are per expert).
    fn expert_inputs<'x>(
        &self,
        x: &'x CudaTensor,
        problems: &[(Problem<'_>, u64)],
    ) -> Result<Act<'x>> {
        let Some((first, _)) = problems.first() else {
            return self.act(x);
        };
        if problems
            .iter()
            .all(|(p, _)| p.w.act_quant == first.w.act_quant)
        {
            return self.gemm_input(x, first.w);
        }
        let q = self.new_tensor([x.rows, x.cols], self.act, "quantized expert rows")?;
        for (p, _) in problems {
            let aq = p.w.act_quant.ok_or_else(|| {
                crate::Error::backend(
                    "cuda",
                    format!("{}: no input quantizer among experts with one", p.w.name),
                )
            })?;
            let at = |t: &CudaTensor| t.ptr() + (p.row0 * x.cols * t.dtype.bytes()) as u64;
            kernels::act_quant::run_rows(
                &self.kernels,
                &self.stream,
                (at(&q), q.dtype),
                (at(x), x.dtype),
                [p.rows, x.cols],
                aq,
            )?;
        }
        Ok(Act::Converted(q))
    }

    /// `out[row0..row0 + rows] = x[row0..row0 + rows] · w^T` for every `(problem, out)`, all
    /// `[_, n_in] -> [_, n_out]` in bf16, over chunks of problems whose dequantized weights
    /// fit the arena (dense weights are read where they lie): the chunk's weights dequantized
    /// in one launch, then one grouped cuBLAS call, or one GEMM per problem where they have
    /// `SEPARATE_GEMMS_FROM_ROWS` rows on average or cuBLAS predates the grouped call.
    fn grouped_linears(
        &self,
        x: &CudaTensor,
        jobs: &[(Problem<'_>, u64)],
        n_in: usize,
        n_out: usize,
    ) -> Result<()> {
        let bytes = n_in * n_out * 2;
        for chunk in jobs.chunks((EXPERT_ARENA_BYTES / bytes).max(1)) {
            // Arena slots for the quantized weights only.
            let dense = |p: &Problem<'_>| matches!(p.w.weight, DevWeight::Dense(_));
            let slots = chunk.iter().filter(|(p, _)| !dense(p)).count();
            let arena = self.scratch(slots.max(1) * n_in * n_out)?;
            let mut next = scratch_ptr(&arena)?;
            let weights: Vec<(&CudaLinear, u64)> = chunk
                .iter()
                .map(|(p, _)| match &p.w.weight {
                    DevWeight::Dense(b) => (p.w, b.ptr()),
                    _ => {
                        let at = next;
                        next += bytes as u64;
                        (p.w, at)
                    }
                })
                .collect();
            self.dequantize_all(&weights, n_out, n_in)?;
            let xs = chunk
                .iter()
                .map(|(p, _)| x.ptr() + (p.row0 * n_in * 2) as u64);
            let ys = chunk
                .iter()
                .map(|(p, out)| out + (p.row0 * n_out * 2) as u64);
            let rows: Vec<usize> = chunk.iter().map(|(p, _)| p.rows).collect();
            let blas = self.blas()?;
            let separate = rows.iter().sum::<usize>() >= SEPARATE_GEMMS_FROM_ROWS * rows.len();
            if separate || !self.grouped_gemm {
                for (((_, w), x), (y, &r)) in weights.iter().zip(xs).zip(ys.zip(&rows)) {
                    gemm::xwt(&blas, x, *w, y, r, n_in, n_out, n_out, (Dt::Bf16, Dt::Bf16))?;
                }
                continue;
            }
            let mut addrs: Vec<u64> = weights.iter().map(|&(_, w)| w).collect();
            addrs.extend(xs);
            addrs.extend(ys);
            let table = self.upload_pod(&addrs, "grouped GEMM addresses")?;
            gemm::grouped_xwt(&blas, table.ptr(), &rows, n_in, n_out)?;
        }
        Ok(())
    }
}
