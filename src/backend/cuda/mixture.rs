//! A mixture's routed experts in a handful of launches per layer, on bf16 activations: every
//! routed row gathered once in group (expert) order, the active experts' weights dequantized
//! in one launch into an arena (the dequantization scratch, grown to `EXPERT_ARENA_BYTES` at
//! most), each expert's gate and up stacked into one GEMM of twice the width (all experts'
//! as one grouped cuBLAS call, or one GEMM each where they have many rows), the activation
//! over all rows, down likewise, and each token's outputs summed in expert order
//! (`combine_experts.cu`): the values of the expert-by-expert loop but for the GEMMs' own
//! summation orders. The loop was ~9 launches per expert, its GEMMs too small to fill the GPU
//! at a few hundred rows per expert. On Hopper the gather, the gate/up GEMM and the activation
//! are one kernel (`expert_gate_up.cu`), and the down GEMMs another (`expert_down.cu`), where
//! the experts allow it (`grouped_mixture`).

use super::kernels::elementwise::GateUp;
use super::kernels::expert_down::ExpertDown;
use super::kernels::expert_gate_up::ExpertGateUp;
use super::kernels::{self, Dt, combine_experts, expert_tiles, gather_rows, spread_rows};
use super::weights::{DevWeight, scratch_ptr};
use super::{Act, CudaBackend, CudaGroups, CudaLinear, CudaTensor, gemm};
use crate::backend::{Backend, Device, GatedMlp, OutType, RouteRule, Shaped, mixture_by_group};
use crate::checkpoint::GatedActivation;
use crate::{Error, Result};

/// The most bytes of dequantized expert weights held at once: a layer's active experts run in
/// chunks whose weights fit (all 128 of Qwen3-30B-A3B's gate and up: 0.8 GB).
pub(super) const EXPERT_ARENA_BYTES: usize = 1 << 30;

/// Rows per expert from which separate cuBLAS GEMMs beat one grouped call. Measured on an
/// H100 with Qwen3-30B-A3B's experts, gate and up as one GEMM (docs/decisions.md: Experts: one
/// grouped call, or separate GEMMs from 512 rows): at
/// 512 rows per expert separate GEMMs ran the batch 1.04x faster, at 1,024 alike, at 2,048
/// 1.29x faster.
const SEPARATE_GEMMS_FROM_ROWS: usize = 512;

/// Separate GEMMs run on a multiple of this many rows, reading and writing past their expert's
/// last row into the gap routing leaves before the next group (each group starts at a
/// multiple: `CudaBackend::route`). cuBLAS picks a kernel for every new shape it sees, at
/// about a millisecond each (its heuristics cache is per process), and experts get new row
/// counts batch after batch: rounded up, a handful of shapes remain. On an H100
/// (Qwen3-30B-A3B, batches of 8,192 tokens of real text) the first batch fell from 1.2 to
/// 0.6 s and the others from 0.28 to 0.22 s (docs/decisions.md: Expert GEMMs on a multiple of
/// 64 rows).
pub(super) const GEMM_ROW_MULTIPLE: usize = 64;

/// Streams the separate GEMMs of a chunk of experts are spread over: each is a few thousand
/// tiles or fewer, so one at a time leaves the GPU partly idle at its start and end.
const SIDE_STREAMS: usize = 4;

/// One expert's product in a grouped call: `y[row0..row0 + rows] = x[row0..row0 + rows] ·
/// [ws_0; ws_1]^T`, its weights stacked along the output (gate and up as one GEMM twice as
/// wide: more tiles for the GPU to share out, one problem instead of two).
struct Job<'a> {
    ws: Vec<&'a CudaLinear>,
    row0: usize,
    rows: usize,
}

/// One GEMM of a chunk: the weight's address (in the arena or where a dense one lies), the
/// input's, the output's, rows, the rows it may compute alone (`GEMM_ROW_MULTIPLE`, within
/// the buffers), and output width.
struct Gemm {
    w: u64,
    x: u64,
    y: u64,
    rows: usize,
    padded_rows: usize,
    n_out: usize,
}

impl CudaBackend {
    /// The arena bytes a model of `experts` experts of `gate` and `up` `[inter, hidden]`
    /// would take (bf16 activations only).
    pub(super) fn expert_arena_bytes(&self, experts: usize, inter: usize, hidden: usize) -> usize {
        match self.precision.act() {
            Dt::Bf16 => (2 * experts * inter * hidden * 2).min(EXPERT_ARENA_BYTES),
            Dt::F32 => 0,
        }
    }

    /// `Backend::mixture` grouped, or `None` where it does not apply: f32 activations (the
    /// exact path keeps its f32 GEMMs), groups routed on the host (no slots) or scaling the
    /// experts' inputs, experts of
    /// different shapes or kinds of activation quantizer, biases, or gate and up fused
    /// (gpt-oss), or gate and up of one expert quantizing their input differently. A shared
    /// expert's group runs after the routed ones, expert by expert, as it would have. With
    /// `residual` (`mixture_into`) and no shared expert, each token's sum is added into it
    /// instead of returned.
    pub(super) fn grouped_mixture<'a>(
        &self,
        x: &CudaTensor,
        groups: &CudaGroups,
        lens: &[usize],
        mlps: &[GatedMlp<'a, CudaLinear>],
        residual: Option<&mut CudaTensor>,
    ) -> Result<Option<Mixed>> {
        let (Some((slots, k_per_token)), routed) = (&groups.slots, groups.routed) else {
            return Ok(None);
        };
        // Experts whose inputs the routing weights scale (Llama 4) run one by one: on a
        // Llama-4-Scout slice (16 experts) 10 % faster than these launches without the fused
        // gate/up kernel, which reads the rows unscaled (docs/performance.md).
        if groups.input_scales.is_some() {
            return Ok(None);
        }
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
        if self.precision.act() != Dt::Bf16
            || mlps.len() < routed
            || lens.len() < routed
            || *k_per_token > combine_experts::MAX_K
            || !h.is_multiple_of(8)
            || !mlps[..routed].iter().all(same)
        {
            return Ok(None);
        }
        groups.range(routed - 1, t)?;
        let picks = groups.offsets[routed]; // every routed row, with the gaps between groups
        let active: Vec<usize> = (0..routed).filter(|&g| lens[g] > 0).collect();
        let jobs = |pick: &dyn Fn(&GatedMlp<'a, CudaLinear>) -> Vec<&'a CudaLinear>| {
            active
                .iter()
                .map(|&g| Job {
                    ws: pick(&mlps[g]),
                    row0: groups.offsets[g],
                    rows: lens[g],
                })
                .collect::<Vec<_>>()
        };
        // Every tensor a GEMM reads or writes has room for its last expert's padded rows, and
        // for the most rows routing these tokens can give (every expert's group padded), so
        // that every layer asks for the sizes the one before freed and is handed those
        // buffers back (`memory::Memory`) instead of the driver's pool searching for them.
        let most_picks = t * k_per_token + (GEMM_ROW_MULTIPLE - 1) * routed;
        let slack = most_picks.max(picks) - picks + GEMM_ROW_MULTIPLE - 1;

        // x in the type the gate wants: f32 where it quantizes its input, else bf16 (the
        // first of the planes where x came as planes).
        let in_dt = self.out_dt(self.input_type(first.gate));
        let act_dt = self.out_dt(self.input_type(first.down));
        let source = match in_dt {
            Dt::Bf16 => self.act(x)?,
            Dt::F32 => Act::Same(x),
        };
        let gate_up_jobs = jobs(&|m| vec![m.gate, m.up.unwrap_or(m.gate)]);
        // On Hopper, gate, up and SiLU in one kernel reading the rows where they lie, for
        // bf16 in and out and quantized (arena-held) gate and up weights.
        let fused_kernel = match act_dt {
            Dt::Bf16 => self.kernels.optional::<ExpertGateUp>()?,
            Dt::F32 => None,
        };
        let fused = fused_kernel.as_deref().filter(|kernel| {
            kernel.takes(h, inter)
                && source.get().dtype == Dt::Bf16
                && act_dt == Dt::Bf16
                && first.act == GatedActivation::Silu
                && first.gate.act_quant.is_none()
                && gate_up_jobs
                    .iter()
                    .flat_map(|j| &j.ws)
                    .all(|w| dense(w).is_none())
        });
        let act = if let Some(kernel) = fused {
            let act =
                self.new_tensor_with_slack([picks, inter], slack, act_dt, "experts' activation")?;
            let gathered = (source.get(), groups.rows.ptr());
            self.expert_products(ExpertKernel::GateUp(kernel, gathered), &gate_up_jobs, &act)?;
            act
        } else {
            // Every routed row once, in group order, each token's row read once and written
            // to its k places.
            let gathered = self.new_tensor_with_slack([picks, h], slack, in_dt, "expert rows")?;
            if source.get().dtype == in_dt {
                let gaps: Vec<u32> = (0..routed)
                    .flat_map(|g| groups.offsets[g] + lens[g]..groups.offsets[g + 1])
                    .map(|r| r as u32)
                    .collect();
                let gap_rows = (!gaps.is_empty())
                    .then(|| self.upload_pod(&gaps, "rows between expert groups"))
                    .transpose()?;
                // With no gaps the kernel reads no address: any will do.
                let gaps_at = gap_rows.as_ref().map_or(slots.ptr(), |b| b.ptr());
                let (k, s) = (&self.kernels, &self.stream);
                let places = (slots.ptr(), *k_per_token);
                spread_rows::run(k, s, &gathered, source.get(), places, (gaps_at, gaps.len()))?;
            } else {
                let table = (source.get().ptr(), source.get().dtype);
                let rows = groups.rows.ptr();
                gather_rows::run(
                    &self.kernels,
                    &self.stream,
                    &gathered,
                    table,
                    rows,
                    (1.0, 0),
                )?;
            }
            // Each row's gate and up side by side, one GEMM of 2 * inter outputs an expert.
            let gate_up = self.new_tensor_with_slack(
                [picks, 2 * inter],
                slack,
                Dt::Bf16,
                "experts' gate and up",
            )?;
            // Up quantizes its input as gate does.
            let xs = self.expert_inputs(&gathered, &gate_up_jobs)?;
            self.grouped_linears(xs.get(), &gate_up_jobs, inter, &gate_up)?;
            drop(xs);
            drop(gathered);
            let act =
                self.new_tensor_with_slack([picks, inter], slack, act_dt, "experts' activation")?;
            kernels::elementwise::gated_act(
                &self.kernels,
                &self.stream,
                (Dt::Bf16, act_dt),
                act.ptr(),
                gate_up.ptr(),
                GateUp::SideBySide { cols: inter },
                picks * inter,
                first.act,
            )?;
            act
        };
        drop(source);
        let y = self.new_tensor_with_slack([picks, h], slack, Dt::Bf16, "experts' output")?;
        let down_jobs = jobs(&|m| vec![m.down]);
        // On Hopper, down in one kernel for bf16 in and quantized (arena-held) weights.
        let fused_down_kernel = match act.dtype {
            Dt::Bf16 => self.kernels.optional::<ExpertDown>()?,
            Dt::F32 => None,
        };
        let fused_down = fused_down_kernel.as_deref().filter(|kernel| {
            kernel.takes(inter, h)
                && act.dtype == Dt::Bf16
                && first.down.act_quant.is_none()
                && down_jobs.iter().all(|j| dense(j.ws[0]).is_none())
        });
        if let Some(kernel) = fused_down {
            self.expert_products(ExpertKernel::Down(kernel, &act), &down_jobs, &y)?;
        } else {
            let act_in = self.expert_inputs(&act, &down_jobs)?;
            self.grouped_linears(act_in.get(), &down_jobs, h, &y)?;
        }
        drop(act);

        let combine = |out: &CudaTensor, add: bool| {
            let picks = (slots.ptr(), groups.weights.ptr(), *k_per_token);
            combine_experts::run(&self.kernels, &self.stream, out, &y, picks, add)
        };
        if let Some(residual) = residual.filter(|_| mlps.len() == routed) {
            self.check_tensor(residual, [t, h], Dt::F32, "residual stream")?;
            combine(residual, true)?;
            return Ok(Some(Mixed::Added));
        }
        let acc = self.new_tensor([t, h], Dt::F32, "mixture accumulator")?;
        combine(&acc, false)?;
        let acc = mixture_by_group(self, Some(acc), x, groups, lens, mlps, routed)?;
        Ok(Some(Mixed::Sum(acc)))
    }

    /// Runs `products` (bf16 in and out, writing disjoint rows) spread over `SIDE_STREAMS`
    /// streams beside the main one: they start after everything queued before and everything
    /// queued after waits for them.
    fn side_by_side(&self, products: &[gemm::Product]) -> Result<()> {
        let err = |e| super::driver_err("ordering the experts' streams", e);
        // The side handles are used as `blas()` uses the main one: with the context bound.
        self.ctx
            .bind_to_thread()
            .map_err(|e| super::driver_err("binding the context", e))?;
        let mut side = self
            .side
            .lock()
            .map_err(|_| crate::Error::backend("cuda", "side streams lock poisoned"))?;
        while side.len() < SIDE_STREAMS.min(products.len()) {
            let stream = self.stream.fork().map_err(err)?;
            let blas = cudarc::cublas::CudaBlas::new(stream.clone())
                .map_err(|e| crate::Error::backend("cuda", format!("cuBLAS handle: {e:?}")))?;
            side.push((stream, blas));
        }
        let used = &side[..SIDE_STREAMS.min(products.len())];
        for (stream, _) in used {
            stream.join(&self.stream).map_err(err)?;
        }
        for (i, p) in products.iter().enumerate() {
            gemm::xwt(&used[i % used.len()].1, *p, (Dt::Bf16, Dt::Bf16))?;
        }
        for (stream, _) in used {
            self.stream.join(stream).map_err(err)?;
        }
        Ok(())
    }

    /// `x`'s rows as each job's GEMM reads them: `gemm_input` of the whole where every job's
    /// first weight quantizes its input alike (or not at all), else each job's rows quantized
    /// with its own quantizer (static scales are per expert). A job's stacked weights share
    /// their first one's quantizer (`grouped_mixture` checks).
    fn expert_inputs<'x>(&self, x: &'x CudaTensor, jobs: &[Job<'_>]) -> Result<Act<'x>> {
        let Some(first) = jobs.first().map(|j| j.ws[0]) else {
            return self.act(x);
        };
        if jobs.iter().all(|j| j.ws[0].act_quant == first.act_quant) {
            return self.gemm_input(x, first);
        }
        let slack = x.row_capacity() - x.rows;
        let q = self.new_tensor_with_slack(
            [x.rows, x.cols],
            slack,
            self.precision.act(),
            "quantized expert rows",
        )?;
        for j in jobs {
            let w = j.ws[0];
            let aq = w.act_quant.ok_or_else(|| {
                crate::Error::backend(
                    "cuda",
                    format!("{}: no input quantizer among experts with one", w.name),
                )
            })?;
            let at = |t: &CudaTensor| t.ptr() + (j.row0 * x.cols * t.dtype.bytes()) as u64;
            kernels::act_quant::run_rows(
                &self.kernels,
                &self.stream,
                (at(&q), q.dtype),
                (at(x), x.dtype),
                [j.rows, x.cols],
                aq,
            )?;
        }
        Ok(Act::Converted(q))
    }

    /// Runs `each` on chunks of `jobs` whose dequantized weights (`[n_out, n_in]` each) fit
    /// the arena, with each job's weight addresses and the arena's start: the chunk's
    /// quantized weights dequantized in one launch, a job's stacked weights into adjacent
    /// slots; a dense weight is read where it lies.
    fn dequantized_chunks(
        &self,
        jobs: &[Job<'_>],
        (n_out, n_in): (usize, usize),
        mut each: impl FnMut(&[Job<'_>], &[Vec<u64>], u64) -> Result<()>,
    ) -> Result<()> {
        let bytes = (n_in * n_out * 2) as u64;
        let stack = jobs.iter().map(|j| j.ws.len()).max().unwrap_or(1);
        for chunk in jobs.chunks((EXPERT_ARENA_BYTES / (bytes as usize * stack)).max(1)) {
            // Arena slots for the quantized weights only.
            let slots = chunk
                .iter()
                .flat_map(|j| &j.ws)
                .filter(|w| dense(w).is_none())
                .count();
            let arena = self.scratch(slots.max(1) * n_in * n_out)?;
            let start = scratch_ptr(&arena)?;
            let mut next = start;
            let mut dequantize = Vec::with_capacity(slots);
            let ws: Vec<Vec<u64>> = chunk
                .iter()
                .map(|j| {
                    j.ws.iter()
                        .map(|&w| {
                            dense(w).unwrap_or_else(|| {
                                dequantize.push((w, next));
                                next += bytes;
                                next - bytes
                            })
                        })
                        .collect()
                })
                .collect();
            self.dequantize_all(&dequantize, n_out, n_in)?;
            each(chunk, &ws, start)?;
        }
        Ok(())
    }

    /// Every job's product into `y` (its rows of `y.cols` values), all weights `[n_out,
    /// x.cols]` in bf16, chunk by chunk (`dequantized_chunks`): a job's stacked weights as one
    /// GEMM of their summed width, a job with a dense one a GEMM a weight, side by side in its
    /// output rows; then one grouped cuBLAS call, or one GEMM each where they have
    /// `SEPARATE_GEMMS_FROM_ROWS` rows on average or cuBLAS predates the grouped call.
    fn grouped_linears(
        &self,
        x: &CudaTensor,
        jobs: &[Job<'_>],
        n_out: usize,
        y: &CudaTensor,
    ) -> Result<()> {
        let (n_in, ldy) = (x.cols, y.cols);
        let row_capacity = x.row_capacity().min(y.row_capacity());
        self.dequantized_chunks(jobs, (n_out, n_in), |chunk, weights, _| {
            let mut gemms = Vec::with_capacity(weights.iter().map(Vec::len).sum());
            for (j, ws) in chunk.iter().zip(weights) {
                let x = x.ptr() + (j.row0 * n_in * 2) as u64;
                let y = y.ptr() + (j.row0 * ldy * 2) as u64;
                let padded = j.rows.next_multiple_of(GEMM_ROW_MULTIPLE);
                let padded_rows = if j.row0 + padded <= row_capacity {
                    padded
                } else {
                    j.rows
                };
                let gemm = |w, y, n_out| Gemm {
                    w,
                    x,
                    y,
                    rows: j.rows,
                    padded_rows,
                    n_out,
                };
                if j.ws.iter().all(|w| dense(w).is_none()) {
                    // Adjacent slots: one weight of the summed width.
                    gemms.push(gemm(ws[0], y, n_out * ws.len()));
                } else {
                    let at = |i: usize| y + (i * n_out * 2) as u64;
                    gemms.extend(ws.iter().enumerate().map(|(i, &w)| gemm(w, at(i), n_out)));
                }
            }
            let rows: usize = gemms.iter().map(|g| g.rows).sum();
            if rows >= SEPARATE_GEMMS_FROM_ROWS * gemms.len() || !self.grouped_gemm {
                let products: Vec<gemm::Product> = gemms
                    .iter()
                    .map(|g| gemm::Product {
                        x: g.x,
                        w: g.w,
                        y: g.y,
                        rows: g.padded_rows,
                        n_in,
                        n_out: g.n_out,
                        ldy,
                        w_bf16_values: false,
                        w_f16: None,
                        x_f16: None,
                    })
                    .collect();
                return self.side_by_side(&products);
            }
            let addrs: Vec<u64> = [|g: &Gemm| g.w, |g: &Gemm| g.x, |g: &Gemm| g.y]
                .iter()
                .flat_map(|f| gemms.iter().map(f))
                .collect();
            let table = self.upload_pod(&addrs, "grouped GEMM addresses")?;
            let problems: Vec<(usize, usize)> = gemms.iter().map(|g| (g.rows, g.n_out)).collect();
            gemm::grouped_xwt(&*self.blas()?, table.ptr(), &problems, n_in, ldy)
        })
    }

    /// Every job's product into `out` by one of the Hopper expert kernels, chunk by chunk
    /// (`dequantized_chunks`; every job's weights quantized, so that a chunk's are adjacent
    /// arena slots of one tensor map).
    fn expert_products(
        &self,
        kernel: ExpertKernel<'_>,
        jobs: &[Job<'_>],
        out: &CudaTensor,
    ) -> Result<()> {
        let n_in = match kernel {
            ExpertKernel::GateUp(_, (x, _)) | ExpertKernel::Down(_, x) => x.cols,
        };
        let n_out = out.cols;
        let slot_bytes = (n_in * n_out * 2) as u64;
        self.dequantized_chunks(jobs, (n_out, n_in), |chunk, weights, arena| {
            let groups: Vec<(usize, usize, usize)> = chunk
                .iter()
                .zip(weights)
                .map(|(j, ws)| {
                    (
                        j.row0,
                        j.rows,
                        ((ws[0] - arena) / slot_bytes) as usize * n_out,
                    )
                })
                .collect();
            let tiles = expert_tiles::tiles(&groups)?;
            let table = self.upload_pod(&tiles, "expert tiles")?;
            let tiles = (table.ptr(), tiles.len());
            let weights = (arena, weights.iter().map(Vec::len).sum::<usize>() * n_out);
            let s = &self.stream;
            match kernel {
                ExpertKernel::GateUp(k, (x, rows)) => {
                    let out = (out.ptr(), out.rows);
                    k.run(s, out, (x.ptr(), rows), tiles, (n_in, n_out), weights)
                }
                ExpertKernel::Down(k, act) => k.run(
                    s,
                    (out.ptr(), out.rows),
                    (act.ptr(), act.rows),
                    tiles,
                    (n_in, n_out),
                    weights,
                ),
            }
        })
    }
}

/// What `grouped_mixture` did: the mixture's sum, or the sum added into the residual.
pub(super) enum Mixed {
    Sum(CudaTensor),
    Added,
}

/// A Hopper expert kernel and what it reads: gate/up (SiLU-gated) of the rows of `x`
/// (bf16 `[tokens, hidden]`) named by `rows` (the grouped layout's token of each row, u32),
/// or down of the grouped rows of `act`.
#[derive(Clone, Copy)]
enum ExpertKernel<'a> {
    GateUp(&'a ExpertGateUp, (&'a CudaTensor, u64)),
    Down(&'a ExpertDown, &'a CudaTensor),
}

/// Where a dense (unquantized) weight lies; `None` for the quantized ones.
fn dense(w: &CudaLinear) -> Option<u64> {
    match &w.weight {
        DevWeight::Dense(b) => Some(b.ptr()),
        _ => None,
    }
}

impl CudaBackend {
    /// `Backend::mixture` grouped where it applies (`grouped_mixture`, given `residual` to add
    /// into), else expert by expert.
    pub(super) fn mixture_on(
        &self,
        x: &CudaTensor,
        groups: &CudaGroups,
        lens: &[usize],
        mlps: &[GatedMlp<'_, CudaLinear>],
        residual: Option<&mut CudaTensor>,
    ) -> Result<Mixed> {
        // Planes are read as bf16: right only where no expert quantizes its input (which
        // wants the f32 values; the forward pass asks for planes only then).
        let quantizing = |w: &CudaLinear| self.input_type(w) != OutType::Activation;
        if x.planes.is_some()
            && mlps
                .iter()
                .any(|m| quantizing(m.gate) || m.up.is_some_and(quantizing))
        {
            return Err(Error::backend(
                "cuda",
                "a mixture whose experts quantize their input was given it as bf16 planes",
            ));
        }
        if !self.experts_one_by_one
            && let Some(done) = self.grouped_mixture(x, groups, lens, mlps, residual)?
        {
            return Ok(done);
        }
        let acc = crate::backend::mixture_by_group(self, None, x, groups, lens, mlps, 0)?;
        Ok(Mixed::Sum(acc))
    }

    /// Routing in kernels (`route.cu`): top-k per token on the device, the tokens grouped by
    /// expert there; only the per-expert counts come back to the host (the f32 logits of every
    /// token crossed at about 1 GB/s on the virtualised H200s: 40 % of a batch).
    pub(super) fn route_on_device(
        &self,
        x: &CudaTensor,
        router: &CudaLinear,
        rule: &RouteRule,
        all_rows: Option<&[f32]>,
    ) -> Result<(CudaGroups, Vec<usize>)> {
        let groups = match rule.router {
            crate::checkpoint::Router::Softmax { .. } | crate::checkpoint::Router::TopKSoftmax => 1,
            crate::checkpoint::Router::Sigmoid { groups, .. } => groups,
            crate::checkpoint::Router::TopKSigmoid
            | crate::checkpoint::Router::SqrtSoftplus { .. } => 1,
            // Mistral 4's grouped softmax has no kernel: routed on the host.
            crate::checkpoint::Router::GroupedSoftmax { .. } => {
                return crate::backend::routing::route_on_host(self, x, router, rule, all_rows);
            }
        };
        let (t, e, k) = (x.rows, rule.experts, rule.experts_per_token);
        let fits = k <= kernels::route::MAX_K
            && groups <= kernels::route::MAX_GROUPS
            && e <= kernels::route::MAX_EXPERTS;
        // A token naming one expert twice (DeepSeek-V4's hash routing) runs it once with both
        // weights on the host: a group holds a token once.
        let repeats = rule
            .fixed
            .chunks(k.max(1))
            .any(|c| c.iter().enumerate().any(|(i, e)| c[..i].contains(e)));
        let bias_ok = rule.bias.len() == e || (rule.bias.is_empty() && !rule.fixed.is_empty());
        let logits = match self.router_logits(x, router)? {
            Some(l) if fits && l.shape() == [t, e] && bias_ok && !repeats => l,
            _ => return crate::backend::routing::route_on_host(self, x, router, rule, all_rows),
        };
        // The router was the planes' last reader (its GEMMs are queued before the free).
        if let Some(planes) = &x.planes {
            planes.release();
        }
        crate::backend::routing::check_rule(e, k, rule)?;
        let picks = t * k;
        if !rule.fixed.is_empty() && rule.fixed.len() != picks {
            return Err(Error::backend(
                "cuda",
                format!("{} fixed experts for {t} tokens of {k}", rule.fixed.len()),
            ));
        }
        let bias = match rule.bias.is_empty() {
            true => self.zeros(1, e)?.buf,
            false => self.upload_pod(rule.bias, "router bias")?,
        };
        let fixed = match rule.fixed.is_empty() {
            true => None,
            false => Some(self.upload_pod(rule.fixed, "experts by token")?),
        };
        let expert_scale = match rule.expert_scale.len() {
            0 => None,
            n if n == e => Some(self.upload_pod(rule.expert_scale, "per-expert factors")?),
            n => {
                return Err(Error::backend(
                    "cuda",
                    format!("{n} per-expert factors for {e} experts"),
                ));
            }
        };
        let ids = self.alloc(picks * 4, "routed experts")?;
        let weights = self.alloc(picks * 4, "routing weights")?;
        let counts = self.zeros(1, e)?;
        let tk = kernels::route::TopK {
            logits: logits.ptr(),
            bias: bias.ptr(),
            expert_scale: expert_scale.as_ref().map_or(0, |f| f.ptr()),
            fixed: fixed.as_ref().map_or(0, |f| f.ptr()),
            ids: ids.ptr(),
            weights: weights.ptr(),
            counts: counts.ptr(),
        };
        kernels::route::top_k(&self.kernels, &self.stream, &tk, (t, e, k), rule.router)?;
        let counts: Vec<u32> = bytemuck::pod_collect_to_vec(
            &self.download_bytes(&counts.buf, "expert counts")?[..e * 4],
        );
        // Each group starts at a multiple of GEMM_ROW_MULTIPLE rows: an expert's GEMM may run
        // on its rows rounded up without touching another expert's (they may run at once).
        let mut lens: Vec<usize> = counts.iter().map(|&c| c as usize).collect();
        let mut offsets = vec![0usize];
        for &n in &lens {
            let end = offsets.last().copied().unwrap_or(0);
            offsets.push(end + n.next_multiple_of(GEMM_ROW_MULTIPLE));
        }
        let routed_rows = offsets[e];
        let extra = all_rows.map_or(0, |w| w.len());
        let sum: usize = lens.iter().sum();
        if all_rows.is_some_and(|w| w.len() != t) || sum != picks {
            return Err(Error::backend(
                "cuda",
                format!("routing {t} tokens gave {sum} picks of {picks}"),
            ));
        }
        let cursor: Vec<u32> = offsets[..e].iter().map(|&o| o as u32).collect();
        let cursor = self.upload_pod(&cursor, "group cursors")?;
        // Rows between groups: row 0 at weight 0 (gathered and computed, never added).
        let rows = self.zeros(1, routed_rows + extra)?.buf;
        let mut row_weights = self.zeros(1, routed_rows + extra)?.buf;
        let slots = self.alloc(picks * 4, "expert slots")?;
        kernels::route::fill(
            &self.kernels,
            &self.stream,
            (ids.ptr(), weights.ptr(), cursor.ptr()),
            (rows.ptr(), row_weights.ptr(), slots.ptr()),
            (t, k, e),
        )?;
        // Llama 4: the weights scale the gathered inputs, the outputs join with weight 1; the
        // shared expert's rows are read unscaled.
        let input_scales = match rule.weights_on_input {
            true => {
                let ones = vec![1.0f32; routed_rows + extra];
                let scales = std::mem::replace(
                    &mut row_weights,
                    self.upload_pod(&ones, "expert output weights")?,
                );
                if extra > 0 {
                    let tail = 4 * routed_rows as u64;
                    let ones = self.upload_pod(&ones[..extra], "shared expert input scales")?;
                    self.copy_in(scales.ptr() + tail, &ones)?;
                }
                Some(scales)
            }
            false => None,
        };
        if let Some(w) = all_rows {
            // The shared expert's group: every row, in order, after the routed ones.
            let all: Vec<u32> = (0..t as u32).collect();
            let tail = 4 * routed_rows as u64;
            self.copy_in(
                rows.ptr() + tail,
                &self.upload_pod(&all, "shared expert rows")?,
            )?;
            self.copy_in(
                row_weights.ptr() + tail,
                &self.upload_pod(w, "shared expert weights")?,
            )?;
            offsets.push(routed_rows + t);
            lens.push(t);
        }
        Ok((
            CudaGroups {
                rows,
                weights: row_weights,
                offsets,
                lens: lens.clone(),
                rows_below: t,
                slots: Some((slots, k)),
                routed: e,
                input_scales,
            },
            lens,
        ))
    }
}
