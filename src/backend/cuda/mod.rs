//! The CUDA backend: weights kept packed on the device, activations in one of two types
//! (`CudaPrecision`, decided when the backend is made):
//! - bf16 (the fast path): bf16 activations and GEMM operands on the tensor cores, f32
//!   accumulation, attention on the tensor cores (flash_attention_sm90.cu on Hopper, else
//!   flash_attention.cu);
//! - f32 (the exact path, for f32 checkpoints and `--dtype f32`): f32 activations, weights
//!   dequantized to f32 (exactly `QLinear::dequantize`), f32 GEMMs without TF32.
//!
//! In both, the residual stream (embedding output and the sums `add_assign` forms) is f32:
//! it is the accumulator across layers. Activation fake quantization runs in f32 as the f32
//! reference runs it (`ActQuant::apply_row`), its result stored in the activation type, on
//! inputs the ops before it hand over in f32 (`Backend::input_type`): quantizing bf16-rounded
//! values moved NVFP4 W4A4 PPL 2-3 % away from the f32 reference, quantizing the f32 values
//! < 0.5 %; rounding the quantizer's scales and quotients to bf16 (as compressed-tensors does
//! in a bf16 model) put an FP8 W8A8 8B at 4.6e-3, f32 quantization at 1.2e-3.
//!
//! A linear dequantizes its packed weight into one reused scratch buffer (the size of the
//! largest layer) and multiplies with cuBLAS (a W8A8 linear may instead multiply its 8-bit
//! codes on the integer or FP8 tensor cores, `eight_bit`: INT8 exactly in the f32 precisions,
//! FP8 and INT8 unrounded under `CudaPrecision::Bf16With8BitCores`); the lm_head runs over
//! vocab tiles folded into an online log-sum-exp, so only one f32 NLL per scored row comes
//! back. Everything is queued on one stream, which orders the reuses of the scratch buffer.

mod device;
mod eight_bit;
mod gemm;
mod gemm8;
mod kernels;
mod memory;
mod mixture;
mod nvrtc;
mod probe;
mod products;
mod vocab;
mod weights;

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, DriverError};

pub use memory::CudaTensor;
pub use probe::{DeviceInfo, cuda_available, device_info, nvrtc_available};
pub use weights::CudaLinear;

/// Compiles kernel source `code` (the file `name`.cu) for compute capability `cc` with NVRTC
/// as the backend does at first use, without a GPU (tests/cuda_kernels.rs): a kernel that
/// does not compile shows on any machine with NVRTC, not first on a lent GPU.
pub fn compile_kernel(name: &str, code: &str, cc: (i32, i32)) -> Result<()> {
    kernels::compile(name, code, cc)
}

/// Whether kernel source `code` (the file `name`.cu) is compiled for compute capability `cc`:
/// its `// nvrtc:` lines may name one architecture or the oldest.
pub fn kernel_is_for(name: &str, code: &str, cc: (i32, i32)) -> Result<bool> {
    kernels::is_for(name, code, cc)
}

use memory::{Act, DevBuf, Memory, Planes, keep_freed_memory};
use weights::DevWeight;

use super::options::BackendOptions;
use super::{
    AttnSpec, Backend, ColumnBlocks, Device, GatedMlp, GemmSplit, Head, IndexSpec, KldTerms,
    NormGate, OutType, Recurrence, RecurrenceGates, RotarySpan, RouteRule, RowStats, SeqLayout,
    Shaped,
};
use crate::checkpoint::{DeltaNetConfig, GatedActivation};
use crate::{Error, Result};
use kernels::{Dt, Kernels, Stream};

/// A layer's token rows grouped by expert: rows (u32) and weights (f32) on the device, the
/// group offsets on the host.
pub struct CudaGroups {
    rows: DevBuf,
    weights: DevBuf,
    /// `groups + 1` offsets into `rows` / `weights`: where each group starts (device routing
    /// starts each routed group at a multiple of `mixture::GEMM_ROW_MULTIPLE`, the rows
    /// between groups holding row 0 at weight 0), and where the last one's room ends.
    offsets: Vec<usize>,
    /// Each group's rows.
    lens: Vec<usize>,
    /// Every row index is below this.
    rows_below: usize,
    /// Where routing on the device put each token's picks (`[tokens, k]` u32 positions in
    /// `rows`, over the first `routed` groups), and k; `None` for groups made on the host.
    slots: Option<(DevBuf, usize)>,
    /// The groups `slots` covers (the routed experts; a shared expert's group follows).
    routed: usize,
    /// A factor per row on the gathered input (`RowGroups::input_scales`: Llama 4's routing
    /// weights, whose `weights` are then 1).
    input_scales: Option<DevBuf>,
}

impl CudaGroups {
    /// Group `g`'s range, for a tensor of `rows` rows (an error if it has too few).
    fn range(&self, g: usize, rows: usize) -> Result<std::ops::Range<usize>> {
        if g + 1 >= self.offsets.len() || rows < self.rows_below {
            return Err(Error::InvalidArgument(format!(
                "row group {g} of {} (rows below {}) on a tensor of {rows} rows",
                self.offsets.len().saturating_sub(1),
                self.rows_below
            )));
        }
        Ok(self.offsets[g]..self.offsets[g] + self.lens[g])
    }
}

/// Sparse attention's indexer: the most bytes of q . k products (cuBLAS's f32 output) and of
/// score rows (order keys) it holds at once (`index_top_k`; reserved by `workspace_bytes`).
const INDEX_PRODUCTS_BYTES: usize = 512 << 20;
const INDEX_SCORES_BYTES: usize = 1 << 30;

/// A batch's sequences on the device: each token's position and its sequence's first token.
pub struct CudaSequences {
    /// u32 position of each token.
    positions: DevBuf,
    /// u32 flattened index of the first token of each token's sequence.
    seq_start: DevBuf,
    /// The chunked recurrence's work lists (`SeqLayout::chunks`): u32 chunk boundaries and
    /// each sequence's first chunk.
    chunks: DevBuf,
    seq_chunks: DevBuf,
    n_chunks: usize,
    n_seqs: usize,
    n_tokens: usize,
    max_position: usize,
    /// Each sequence's first row, then the token count (`SeqLayout::starts`), on the host.
    starts: Vec<usize>,
    /// Where sequences have branches, the rows each token sees as the attention kernels' key
    /// mask (`SeqLayout::visible_mask`) and its u32 words a token.
    branch_mask: Option<(DevBuf, usize)>,
}

impl CudaSequences {
    /// An error unless `cos` and `sin` are f32 tables of `half` values a position that cover
    /// every token's position (`op` names the caller).
    fn check_rope_tables(
        &self,
        (cos, sin): (&CudaTensor, &CudaTensor),
        half: usize,
        op: &str,
    ) -> Result<()> {
        if cos.len() != sin.len()
            || cos.dtype != Dt::F32
            || (self.max_position + 1) * half > cos.len()
        {
            return Err(Error::InvalidArgument(format!(
                "{op}: tables of {} values do not cover position {} with {half} pairs",
                cos.len(),
                self.max_position
            )));
        }
        Ok(())
    }
}

pub struct CudaBackend {
    info: DeviceInfo,
    ctx: Arc<CudaContext>,
    stream: Stream,
    blas: Mutex<CudaBlas>,
    /// Streams beside `stream`, each with its cuBLAS handle, on which a mixture's experts'
    /// GEMMs run at once (made at first use by `side_by_side`).
    side: Mutex<Vec<(Stream, CudaBlas)>>,
    kernels: Kernels,
    memory: Arc<Memory>,
    /// What the numbers guarantee, decided once at creation: the activation type (GEMM
    /// operands, dequantized weights and every activation but the residual stream) and how
    /// f32 products run.
    precision: CudaPrecision,
    /// The reused dequantization buffer (activation type).
    scratch: Mutex<Option<DevBuf>>,
    /// Elements of the largest quantized layer uploaded so far (the scratch size to allocate).
    largest_layer: AtomicUsize,
    /// Attention on the mma.sync kernel even where the wgmma one exists (to compare them).
    portable_attention: bool,
    /// A mixture's experts one by one (`mixture_by_group`) even where they could run grouped:
    /// `BackendOptions::cuda_experts_loop`, to compare the two or rule the grouped path out.
    experts_one_by_one: bool,
    /// `BackendOptions::cuda_recurrence`.
    recurrence_form: crate::backend::options::RecurrenceForm,
    /// cuBLAS has `cublasGemmGroupedBatchedEx` (12.5 and later); else experts' GEMMs run one
    /// by one.
    grouped_gemm: bool,
    /// cuBLASLt (FP8 GEMMs), made at first use.
    lt: Mutex<Option<gemm8::Lt>>,
    /// Whether cuBLASLt has FP8 kernels with per-token and per-channel scales, asked once.
    fp8_scaled: OnceLock<bool>,
    /// The same for 128x128 weight-block and 1x128 input-group scales.
    fp8_block_scaled: OnceLock<bool>,
    /// Linears uploaded to run on the 8-bit tensor cores (for the report).
    eight_bit_linears: AtomicUsize,
}

/// What a CUDA backend's numbers guarantee (`--dtype`), the one precision value its ops
/// branch on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaPrecision {
    /// bf16 activations, tensor-core GEMMs with f32 accumulation: the fast path.
    Bf16,
    /// f32 activations and f32 GEMMs (no TF32).
    F32,
    /// f32 activations, the GEMMs and attention of f32 operands on 16-bit tensor cores, each
    /// operand split into a high part and its residual (f16 planes with a power of two a row
    /// on `split_gemm.cu` on Hopper, `split_bf16.cu`'s bf16 parts elsewhere), the products
    /// summed in f32.
    F32Grade,
    /// `Bf16`, with W8A8 linears on the 8-bit tensor cores (`eight_bit`).
    Bf16With8BitCores,
}

impl CudaPrecision {
    /// The activation type.
    fn act(self) -> Dt {
        match self {
            CudaPrecision::Bf16 | CudaPrecision::Bf16With8BitCores => Dt::Bf16,
            CudaPrecision::F32 | CudaPrecision::F32Grade => Dt::F32,
        }
    }

    /// Whether products of f32 operands run split on the tensor cores.
    fn splits(self) -> bool {
        self == CudaPrecision::F32Grade
    }
}

fn driver_err(what: &str, e: DriverError) -> Error {
    Error::backend("cuda", format!("{what}: {e:?}"))
}

impl CudaBackend {
    /// `Backend::attention`, and `sparse_attention` where `key_mask` hides the keys a query
    /// does not keep.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        layout: &CudaSequences,
        spec: AttnSpec,
        sinks: Option<&CudaTensor>,
        out: OutType,
        key_mask: Option<kernels::attention::KeyMask>,
    ) -> Result<CudaTensor> {
        if let Some(s) = sinks {
            self.check_tensor(s, [1, spec.heads], Dt::F32, "attention sinks")?;
        }
        let (t, dt) = (layout.n_tokens, self.precision.act());
        let (qw, kw) = (spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim);
        let (q, k, v) = (self.act(q)?, self.act(k)?, self.act(v)?);
        let (q, k, v) = (q.get(), k.get(), v.get());
        self.check_tensor(q, [t, qw], dt, "attention q")?;
        self.check_tensor(k, [t, kw], dt, "attention k")?;
        self.check_tensor(v, [t, kw], dt, "attention v")?;
        let out = self.new_tensor([t, qw], self.out_dt(out), "attention output")?;
        if t > 0 {
            use kernels::attention::{self as attn, Inputs};
            let (ks, st) = (&self.kernels, &self.stream);
            let d = spec.head_dim;
            // f32 operands as f16 planes for the tensor cores where GEMMs are split too: q and
            // k row by row of each head, v column by column.
            let planes = if self.precision.splits() && dt == Dt::F32 && attn::splits(ks, d)? {
                let (sq, sk) = (
                    self.split_rows(q.ptr(), [t * spec.heads, d])?,
                    self.split_rows(k.ptr(), [t * spec.kv_heads, d])?,
                );
                let plane = (t * kw * 2) as u64;
                let sv = self.alloc(2 * plane as usize + kw * 4, "split v")?;
                let to = (sv.ptr(), sv.ptr() + plane, sv.ptr() + 2 * plane);
                kernels::split_columns_f16::run(ks, st, to, v.ptr(), [t, kw])?;
                Some((sq, sk, sv, to.2))
            } else {
                None
            };
            let (inputs, qkv) = match &planes {
                Some(((_, q), (_, k), v, v_top)) => (
                    Inputs::SplitPlanes {
                        q_undo: q.undo,
                        k_undo: k.undo,
                        v_top: *v_top,
                    },
                    (q.hi, k.hi, v.ptr()),
                ),
                None => (Inputs::Act(dt), (q.ptr(), k.ptr(), v.ptr())),
            };
            attn::run(
                ks,
                self.portable_attention,
                st,
                (inputs, out.dtype),
                out.ptr(),
                qkv,
                layout.seq_start.ptr(),
                t,
                spec,
                sinks.map(|s| s.ptr()),
                key_mask,
            )?;
        }
        Ok(out)
    }

    /// Opens device `device_ordinal` computing in `precision`: probes the libraries, creates a
    /// context, a stream and a cuBLAS handle; kernels compile (or load from the PTX cache) for
    /// its architecture at first use, as `options` say.
    pub fn new(
        device_ordinal: usize,
        precision: CudaPrecision,
        options: &BackendOptions,
    ) -> Result<Self> {
        let info = device_info(device_ordinal).map_err(|m| Error::backend("cuda", m))?;
        let ctx =
            CudaContext::new(device_ordinal).map_err(|e| driver_err("creating context", e))?;
        if ctx.has_async_alloc() {
            keep_freed_memory(&ctx)?;
        }
        // One stream orders all work, so cudarc's per-buffer events are unnecessary overhead.
        // SAFETY: no buffer of this context exists yet and only `stream` is ever used.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| driver_err("creating stream", e))?;
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| Error::backend("cuda", format!("cuBLAS handle: {e:?}")))?;
        let kernels = Kernels::new(&ctx, info.compute_capability, options.cuda_sources.clone())?;
        Ok(Self {
            info,
            ctx,
            stream,
            blas: Mutex::new(blas),
            side: Mutex::new(Vec::new()),
            kernels,
            memory: Arc::default(),
            precision,
            scratch: Mutex::new(None),
            largest_layer: AtomicUsize::new(0),
            portable_attention: options.cuda_portable_attention,
            experts_one_by_one: options.cuda_experts_loop,
            recurrence_form: options.cuda_recurrence,
            grouped_gemm: probe::cublas_exports("cublasGemmGroupedBatchedEx"),
            lt: Mutex::new(None),
            fp8_scaled: OnceLock::new(),
            fp8_block_scaled: OnceLock::new(),
            eight_bit_linears: AtomicUsize::new(0),
        })
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.info
    }

    /// The tensor-core attention kernel used for bf16 heads of 128 values, if any.
    pub fn attention_kernel(&self) -> Result<Option<&'static str>> {
        kernels::attention::flash_kernel_name(&self.kernels, self.portable_attention, 128)
    }

    fn blas(&self) -> Result<MutexGuard<'_, CudaBlas>> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))?;
        self.blas
            .lock()
            .map_err(|_| Error::backend("cuda", "cuBLAS lock poisoned"))
    }

    /// `rms_norm(x)` in the type `out` asks for (planes on the bf16 path where it asks for
    /// them); with `update`, the kernel first adds it to `x` (the f32 residual stream, written
    /// in place) and normalizes the sum.
    fn normalized(
        &self,
        x: &CudaTensor,
        update: Option<&CudaTensor>,
        weight: &CudaTensor,
        eps: f32,
        out: OutType,
    ) -> Result<CudaTensor> {
        self.check_tensor(weight, [1, x.cols], Dt::F32, "rms_norm weight")?;
        let out = match (out, self.precision.act()) {
            (OutType::ExactForRouter, Dt::Bf16) => {
                let residuals = self.alloc(2 * x.len() * 2, "rms_norm output's residual planes")?;
                CudaTensor {
                    planes: Some(Planes::new(residuals)),
                    ..self.new_tensor(x.shape(), Dt::Bf16, "rms_norm output")?
                }
            }
            _ => self.new_tensor(x.shape(), self.out_dt(out), "rms_norm output")?,
        };
        kernels::rms_norm::run(&self.kernels, &self.stream, &out, x, update, weight, eps)?;
        Ok(out)
    }
}

impl Backend for CudaBackend {
    fn embed(&self, table: &CudaLinear, ids: &[u32], scale: f32) -> Result<CudaTensor> {
        let DevWeight::Dense(buf) = &table.weight else {
            return Err(Error::unsupported(
                &table.name,
                "embedding",
                "a quantized embedding table",
            ));
        };
        crate::backend::check_token_ids(ids, table.out_features)?;
        let h = table.in_features;
        // The embedding starts the residual stream, which stays f32 (see the module docs).
        let out = self.new_tensor([ids.len(), h], Dt::F32, "embeddings")?;
        if !ids.is_empty() {
            let ids_dev = self.upload_pod(ids, "token ids")?;
            let table = (buf.ptr(), self.weight_dt(table.bf16_values));
            kernels::gather_rows::run(
                &self.kernels,
                &self.stream,
                &out,
                table,
                ids_dev.ptr(),
                (scale, 0),
            )?;
        }
        Ok(out)
    }

    fn rms_norm(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        out: OutType,
    ) -> Result<CudaTensor> {
        // The f32 residual stream or an activation in, of either type.
        self.normalized(x, None, weight, eps, out)
    }

    fn linear_split(&self, w: &CudaLinear) -> Option<GemmSplit> {
        let split = self.gemm_split()?;
        Some(match w.f16_weight {
            Some(w16) if kernels::split_gemm::SplitGemm::takes(w.in_features, w16) => {
                GemmSplit::F16Rows {
                    weight_planes: w16 == gemm::F16Weight::Planes,
                }
            }
            _ => split,
        })
    }

    fn input_type(&self, w: &CudaLinear) -> OutType {
        if w.act_quant.is_some() && self.precision.act() != Dt::F32 {
            OutType::F32
        } else {
            OutType::Activation
        }
    }

    fn linear(&self, x: &CudaTensor, w: &CudaLinear) -> Result<CudaTensor> {
        self.linear_of(x, w, None)
    }

    /// Under split GEMMs on `split_gemm.cu`, the input is split once for all of `ws`.
    fn linears(&self, x: &CudaTensor, ws: &[&CudaLinear]) -> Result<Vec<CudaTensor>> {
        if let [first, ..] = ws
            && let (Some(_), Some(aq)) = (&first.eight_bit, first.act_quant)
            && ws
                .iter()
                .all(|w| w.eight_bit.is_some() && w.act_quant == Some(aq))
        {
            // One quantization of the input for all of them.
            let what = format!("{} input", first.name);
            self.check_tensor(x, [x.rows, first.in_features], x.dtype, &what)?;
            let codes = self.quantize_codes(x, aq)?;
            return ws
                .iter()
                .map(|w| self.linear_from_codes(&codes, w))
                .collect();
        }
        let shared = ws.len() > 1 && ws.iter().all(|w| self.reads_planes(x.shape(), x.dtype, w));
        if !shared {
            return ws.iter().map(|w| self.linear(x, w)).collect();
        }
        let (_buf, planes) = self.split_rows(x.ptr(), [x.rows, x.cols])?;
        ws.iter()
            .map(|w| self.linear_of(x, w, Some(planes)))
            .collect()
    }

    fn mixture(
        &self,
        x: &CudaTensor,
        groups: &CudaGroups,
        lens: &[usize],
        mlps: &[GatedMlp<'_, CudaLinear>],
    ) -> Result<CudaTensor> {
        match self.mixture_on(x, groups, lens, mlps, None)? {
            mixture::Mixed::Sum(acc) => Ok(acc),
            mixture::Mixed::Added => {
                Err(Error::backend("cuda", "a mixture added with no residual"))
            }
        }
    }

    fn mixture_into(
        &self,
        residual: &mut CudaTensor,
        x: &CudaTensor,
        groups: &CudaGroups,
        lens: &[usize],
        mlps: &[GatedMlp<'_, CudaLinear>],
    ) -> Result<Option<CudaTensor>> {
        Ok(
            match self.mixture_on(x, groups, lens, mlps, Some(residual))? {
                mixture::Mixed::Sum(acc) => Some(acc),
                mixture::Mixed::Added => None,
            },
        )
    }

    fn logits(&self, x: &CudaTensor, w: &CudaLinear) -> Result<Vec<f32>> {
        match self.router_logits(x, w)? {
            Some(t) => self.download(&t),
            None => self.download(&self.linear(x, w)?),
        }
    }

    fn route(
        &self,
        x: &CudaTensor,
        router: &CudaLinear,
        rule: &RouteRule,
        all_rows: Option<&[f32]>,
    ) -> Result<(CudaGroups, Vec<usize>)> {
        self.route_on_device(x, router, rule, all_rows)
    }

    fn take_rows(&self, parts: &[&CudaTensor], rows: &[u32]) -> Result<CudaTensor> {
        let (cols, total) = super::joined_rows(parts, rows)?;
        let dt = parts.first().map_or(self.precision.act(), |p| p.dtype);
        if parts.iter().any(|p| p.dtype != dt || p.planes.is_some()) {
            return Err(Error::backend(
                "cuda",
                "take_rows: parts of different element types",
            ));
        }
        let out = self.new_tensor([rows.len(), cols], dt, "taken rows")?;
        if rows.is_empty() {
            return Ok(out);
        }
        // Several parts are copied end to end first (stream order frees the copy after the
        // gather has read it).
        let joined = match parts {
            [_] => None,
            _ => {
                let joined = self.new_tensor([total, cols], dt, "joined rows")?;
                let mut at = joined.ptr();
                for p in parts {
                    let bytes = p.len() * dt.bytes();
                    self.copy_bytes(at, p.ptr(), bytes)?;
                    at += bytes as u64;
                }
                Some(joined)
            }
        };
        let table = joined
            .as_ref()
            .map_or_else(|| parts[0].ptr(), CudaTensor::ptr);
        let ids = self.upload_pod(rows, "taken row ids")?;
        kernels::gather_rows::run(
            &self.kernels,
            &self.stream,
            &out,
            (table, dt),
            ids.ptr(),
            (1.0, 0),
        )?;
        Ok(out)
    }

    fn gather_group(
        &self,
        x: &CudaTensor,
        groups: &CudaGroups,
        g: usize,
        out: OutType,
    ) -> Result<CudaTensor> {
        let range = groups.range(g, x.rows)?;
        let out = self.new_tensor([range.len(), x.cols], self.out_dt(out), "expert rows")?;
        if !range.is_empty() {
            let at = |b: &DevBuf| b.ptr() + 4 * range.start as u64;
            kernels::gather_rows::run(
                &self.kernels,
                &self.stream,
                &out,
                (x.ptr(), x.dtype),
                at(&groups.rows),
                (1.0, groups.input_scales.as_ref().map_or(0, at)),
            )?;
        }
        Ok(out)
    }

    fn scatter_add_group(
        &self,
        acc: &mut CudaTensor,
        y: &CudaTensor,
        groups: &CudaGroups,
        g: usize,
    ) -> Result<()> {
        let range = groups.range(g, acc.rows)?;
        self.check_tensor(acc, acc.shape(), Dt::F32, "expert accumulator")?;
        self.check_tensor(y, [range.len(), acc.cols], y.dtype, "expert output rows")?;
        if range.is_empty() {
            return Ok(());
        }
        let offset = 4 * range.start as u64;
        kernels::scatter_add::run(
            &self.kernels,
            &self.stream,
            acc,
            y,
            groups.rows.ptr() + offset,
            groups.weights.ptr() + offset,
        )
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        layout: &CudaSequences,
        cos: &CudaTensor,
        sin: &CudaTensor,
        span: RotarySpan,
    ) -> Result<()> {
        let t = layout.n_tokens;
        if let Act::Converted(c) = self.act(x)? {
            *x = c;
        }
        span.check(x.cols, "cuda rope")?;
        self.check_tensor(x, [t, x.cols], self.precision.act(), "rope input")?;
        layout.check_rope_tables((cos, sin), span.dims / 2, "cuda rope")?;
        let positions = layout.positions.ptr();
        kernels::rope::run(&self.kernels, &self.stream, x, positions, (cos, sin), span)
    }

    fn norm_rope(
        &self,
        x: CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        layout: &CudaSequences,
        cos: &CudaTensor,
        sin: &CudaTensor,
        span: RotarySpan,
    ) -> Result<CudaTensor> {
        let d = span.head_dim;
        let (t, cols) = (layout.n_tokens, x.cols);
        let fused = span == RotarySpan::leading(d, d)
            && kernels::qk_norm_rope::fits(d)
            && cols.is_multiple_of(d)
            && weight.len() == d
            && weight.dtype == Dt::F32;
        if !fused {
            return crate::backend::norm_then_rope(self, x, weight, eps, layout, cos, sin, span);
        }
        let mut x = x;
        if let Act::Converted(c) = self.act(&x)? {
            x = c;
        }
        self.check_tensor(&x, [t, cols], self.precision.act(), "norm_rope input")?;
        layout.check_rope_tables((cos, sin), d / 2, "cuda norm_rope")?;
        kernels::qk_norm_rope::run(
            &self.kernels,
            &self.stream,
            &x,
            (weight.ptr(), eps),
            layout.positions.ptr(),
            (cos.ptr(), sin.ptr()),
            d,
        )?;
        Ok(x)
    }

    fn assemble_columns(
        &self,
        rows: usize,
        cols: usize,
        parts: &[(&CudaTensor, ColumnBlocks)],
        out: OutType,
    ) -> Result<CudaTensor> {
        let t = self.new_tensor([rows, cols], self.out_dt(out), "assembled columns")?;
        self.zero_fill(&t, "assembled columns")?;
        for (src, at) in parts {
            self.check_tensor(src, [rows, src.cols], src.dtype, "assemble_columns source")?;
            at.check(src.cols, cols)?;
            if rows > 0 && at.blocks * at.width > 0 {
                kernels::copy_columns::run(&self.kernels, &self.stream, &t, src, *at)?;
            }
        }
        Ok(t)
    }

    fn attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        layout: &CudaSequences,
        spec: AttnSpec,
        sinks: Option<&CudaTensor>,
        out: OutType,
    ) -> Result<CudaTensor> {
        let key_mask =
            layout
                .branch_mask
                .as_ref()
                .map(|(mask, words)| kernels::attention::KeyMask {
                    ptr: mask.ptr(),
                    words: *words,
                });
        self.attend(q, k, v, layout, spec, sinks, out, key_mask)
    }

    fn sparse_attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        layout: &CudaSequences,
        spec: AttnSpec,
        (keys, sinks): (&CudaTensor, Option<&CudaTensor>),
        out: OutType,
    ) -> Result<CudaTensor> {
        if spec.window.is_some() {
            return Err(Error::backend(
                "cuda",
                "sparse_attention: a sliding window is not supported",
            ));
        }
        let t = layout.n_tokens;
        self.check_tensor(keys, [t, keys.cols], Dt::F32, "sparse_attention keys")?;
        let v_dim = spec.value_dim(v.cols)?;
        // One key head (latent attention) or narrower values: each query gathers its listed
        // keys. Heads of their own attend on the dense kernels with the others masked: every
        // key a tile of queries shares is read once (cheaper up to tens of thousands of
        // tokens; the forward pass turns to the latent form past that).
        // Keys past the tokens (DeepSeek-V4's compressed entries) are listed rows too.
        let key_rows = k.rows.max(t);
        if let Some(s) = sinks {
            self.check_tensor(s, [1, spec.heads], Dt::F32, "sparse_attention sinks")?;
        }
        if spec.kv_heads == 1 || v_dim != spec.head_dim || key_rows > t || sinks.is_some() {
            let dt = self.precision.act();
            let (q, k, v) = (self.act(q)?, self.act(k)?, self.act(v)?);
            let (q, k, v) = (q.get(), k.get(), v.get());
            self.check_tensor(q, [t, spec.heads * spec.head_dim], dt, "sparse_attention q")?;
            self.check_tensor(
                k,
                [key_rows, spec.kv_heads * spec.head_dim],
                dt,
                "sparse_attention k",
            )?;
            let v_shape = [key_rows, spec.kv_heads * v_dim];
            self.check_tensor(v, v_shape, dt, "sparse_attention v")?;
            let o = self.new_tensor(
                [t, spec.heads * v_dim],
                self.out_dt(out),
                "sparse_attention",
            )?;
            if t > 0 {
                let listed = kernels::listed_attention::Listed {
                    q: q.ptr(),
                    k: k.ptr(),
                    v: v.ptr(),
                    seq_start: layout.seq_start.ptr(),
                    keys: keys.ptr(),
                    n_keys: keys.cols,
                    tokens: t,
                    input: dt,
                    sinks: sinks.map_or(0, |s| s.ptr()),
                };
                let to = (o.ptr(), o.dtype);
                let (ks, st, portable) = (&self.kernels, &self.stream, self.portable_attention);
                kernels::listed_attention::run(ks, st, portable, to, &listed, spec, v_dim)?;
            }
            return Ok(o);
        }
        // The selection as one bit a (query, key position) for the attention kernels.
        let words = (layout.max_position + 1).div_ceil(32);
        // (4-byte words: a tensor of that width holds them.)
        let mask = self.new_tensor([t, words], Dt::F32, "sparse attention key mask")?;
        if t > 0 {
            self.zero_fill(&mask, "the sparse attention key mask")?;
            kernels::sparse_attention::run(&self.kernels, &self.stream, mask.ptr(), keys, words)?;
        }
        let key_mask = kernels::attention::KeyMask {
            ptr: mask.ptr(),
            words,
        };
        self.attend(q, k, v, layout, spec, None, out, Some(key_mask))
    }

    fn index_top_k(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        weights: &CudaTensor,
        layout: &CudaSequences,
        spec: IndexSpec,
    ) -> Result<CudaTensor> {
        let (t, dt) = (layout.n_tokens, self.precision.act());
        let (q, k, w) = (self.act(q)?, self.act(k)?, self.act(weights)?);
        let (q, k, w) = (q.get(), k.get(), w.get());
        let (heads, d, top_k) = (spec.heads, spec.head_dim, spec.top_k);
        self.check_tensor(q, [t, heads * d], dt, "index_top_k q")?;
        self.check_tensor(k, [t, d], dt, "index_top_k k")?;
        self.check_tensor(w, [t, heads], dt, "index_top_k weights")?;
        let rate = spec.rate;
        if rate == 0 {
            return Err(Error::backend("cuda", "index_top_k: rate 0"));
        }
        let out = self.new_tensor([t, top_k], Dt::F32, "index_top_k output")?;
        use kernels::index_scores_mma::IndexScoresMma;
        use kernels::index_top_k::{self as ix, Scratch};
        let (ks, st, seq_start) = (&self.kernels, &self.stream, layout.seq_start.ptr());
        let max_len = layout.max_position + 1;
        // Rows of scores selected a launch (INDEX_SCORES_BYTES of them: every multiprocessor
        // busy), each from the products of chunks of rows with the sequence's keys up to the
        // chunk's last (cuBLAS, f32 out; INDEX_PRODUCTS_BYTES of them), or on the tensor cores
        // with the heads summed in registers where bf16 heads fit `index_scores_mma.cu`.
        let fused = match (dt, self.portable_attention) {
            (Dt::Bf16, false) => ks.optional::<IndexScoresMma>()?.filter(|m| m.takes(spec)),
            _ => None,
        };
        let select_rows = (INDEX_SCORES_BYTES / (max_len * 4)).clamp(1, t.max(1));
        let gemm_rows = (INDEX_PRODUCTS_BYTES / (heads * max_len * 4)).clamp(1, select_rows);
        let products = match fused {
            Some(_) => None,
            None => Some(self.alloc(gemm_rows * heads * max_len * 4, "index_top_k products")?),
        };
        let scores = self.alloc(select_rows * max_len * 4, "index_top_k scores")?;
        let bytes = dt.bytes();
        for seq in layout.starts.windows(2) {
            let (a, b) = (seq[0], seq[1]);
            for s0 in (a..b).step_by(select_rows) {
                let s1 = (s0 + select_rows).min(b);
                let scratch = Scratch {
                    ptr: scores.ptr(),
                    row0: s0,
                    max_len,
                };
                // The rows that keep every key (no more than top_k of them) need no scores.
                let scored = s0.max(a + (top_k + 1) * rate - 1)..s1;
                match (&fused, &products) {
                    (Some(m), _) if !scored.is_empty() => {
                        let qkw = (q.ptr(), k.ptr(), w.ptr());
                        m.run(st, qkw, seq_start, spec, (scored, scratch))?;
                    }
                    (None, Some(products)) => {
                        for r0 in scored.step_by(gemm_rows) {
                            let r1 = (r0 + gemm_rows).min(s1);
                            // The keys the chunk's last row sees.
                            let keys = (r1 - a) / rate;
                            let p = gemm::Product {
                                x: q.ptr() + (r0 * heads * d * bytes) as u64,
                                w: k.ptr() + (a * d * bytes) as u64,
                                y: products.ptr(),
                                rows: (r1 - r0) * heads,
                                n_in: d,
                                n_out: keys,
                                ldy: keys,
                                w_bf16_values: false,
                                w_f16: None,
                                x_f16: None,
                            };
                            gemm::xwt(&*self.blas()?, p, (dt, Dt::F32))?;
                            let from = (products.ptr(), keys);
                            ix::scores(ks, st, from, w, seq_start, spec, (r0..r1, scratch))?;
                        }
                    }
                    _ => {}
                }
                ix::select(ks, st, &out, seq_start, (top_k, rate), (scratch, s1 - s0))?;
            }
        }
        Ok(out)
    }

    fn layer_norm(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        bias: &CudaTensor,
        eps: f32,
        out: OutType,
    ) -> Result<CudaTensor> {
        let [rows, cols] = x.shape();
        self.check_tensor(weight, [1, cols], Dt::F32, "layer_norm weight")?;
        self.check_tensor(bias, [1, cols], Dt::F32, "layer_norm bias")?;
        let y = self.new_tensor([rows, cols], self.out_dt(out), "layer_norm output")?;
        if rows > 0 {
            kernels::layer_norm::run(&self.kernels, &self.stream, &y, x, (weight, bias), eps)?;
        }
        Ok(y)
    }

    fn mix_streams(
        &self,
        streams: &CudaTensor,
        weights: &CudaTensor,
        added: Option<(&CudaTensor, &CudaTensor)>,
        m: usize,
    ) -> Result<CudaTensor> {
        let rows = streams.rows;
        let (n, d) = crate::backend::compressed::mix_streams_shape(streams, weights, added, m)?;
        if n > kernels::mix_streams::MAX_STREAMS {
            return Err(Error::backend(
                "cuda",
                format!(
                    "mix_streams: {n} streams, the kernel's most {}",
                    kernels::mix_streams::MAX_STREAMS
                ),
            ));
        }
        self.check_tensor(streams, [rows, n * d], Dt::F32, "mix_streams streams")?;
        self.check_tensor(weights, [rows, n * m], Dt::F32, "mix_streams weights")?;
        // The block's output in its own type (planes read as their activation).
        let x = match added {
            Some((x, scales)) => {
                self.check_tensor(scales, [rows, m], Dt::F32, "mix_streams scales")?;
                Some((self.act(x)?, scales))
            }
            None => None,
        };
        if let Some((x, _)) = &x {
            self.check_tensor(x.get(), [rows, d], x.get().dtype, "mix_streams output")?;
        }
        let out = self.new_tensor([rows, m * d], Dt::F32, "mixed streams")?;
        if out.len() > 0 {
            let added = x.as_ref().map(|(x, s)| (x.get(), *s));
            let (k, s) = (&self.kernels, &self.stream);
            kernels::mix_streams::run(k, s, &out, (streams, weights), added, (n, m, d))?;
        }
        Ok(out)
    }

    fn hyper_weights(
        &self,
        x: &CudaTensor,
        mix: &CudaLinear,
        rule: &crate::backend::compressed::HyperRule,
    ) -> Result<[CudaTensor; 3]> {
        let (t, n) = (x.rows, rule.streams);
        let outputs = match self.router_logits(x, mix)? {
            Some(o) if n <= kernels::hyper_weights::MAX_STREAMS => o,
            _ => return crate::backend::compressed::hyper_weights_on_host(self, x, mix, rule),
        };
        if outputs.shape() != [t, rule.outputs()] || rule.base.len() != rule.outputs() {
            return Err(Error::backend(
                "cuda",
                format!(
                    "hyper_weights: {:?} outputs and {} biases for {n} streams",
                    outputs.shape(),
                    rule.base.len()
                ),
            ));
        }
        let base = self.upload_pod(rule.base, "hyper-connection base")?;
        let pre = self.new_tensor([t, n], Dt::F32, "hyper-connection pre")?;
        let post = self.new_tensor([t, n], Dt::F32, "hyper-connection post")?;
        let comb = self.new_tensor([t, n * n], Dt::F32, "hyper-connection comb")?;
        if t > 0 {
            let (k, s) = (&self.kernels, &self.stream);
            let weights = [&pre, &post, &comb];
            kernels::hyper_weights::run(k, s, weights, (&outputs, base.ptr()), rule)?;
        }
        Ok([pre, post, comb])
    }

    fn compressed_keys(
        &self,
        (seqs, layout): (&CudaSequences, &SeqLayout),
        window: usize,
        entries: crate::backend::compressed::EntryKeys<'_, CudaTensor>,
    ) -> Result<CudaTensor> {
        use crate::backend::compressed::{EntryKeys, key_list_width, pooled_width};
        // Branches hide rows from a token: its window is not the rows before it.
        if layout.branched() {
            return crate::backend::compressed::compressed_keys_on_host(
                self, layout, window, entries,
            );
        }
        let t = seqs.n_tokens;
        let (k, s, seq_start) = (&self.kernels, &self.stream, seqs.seq_start.ptr());
        let (picks, rate, listed) = match entries {
            EntryKeys::Pools { picks, pools } => {
                self.check_tensor(picks, [t, picks.cols], Dt::F32, "compressed_keys picks")?;
                let width = key_list_width(layout, 0, pooled_width(picks.cols, pools));
                let lists = self.new_tensor([t, width], Dt::F32, "pooled attention keys")?;
                if lists.len() > 0 {
                    kernels::compressed_keys::run_pooled(k, s, &lists, seq_start, picks, pools)?;
                }
                return Ok(lists);
            }
            EntryKeys::Picked(p) => {
                self.check_tensor(p, [t, p.cols], Dt::F32, "compressed_keys picks")?;
                (Some(p), 1, p.cols)
            }
            EntryKeys::Seen { rate } if rate > 0 => (None, rate, layout.max_len() / rate),
            EntryKeys::Seen { .. } => {
                return Err(Error::backend(
                    "cuda",
                    "compressed_keys: entries of 0 tokens",
                ));
            }
        };
        let width = key_list_width(layout, window, listed);
        let lists = self.new_tensor([t, width], Dt::F32, "compressed attention keys")?;
        if lists.len() > 0 {
            kernels::compressed_keys::run(k, s, &lists, seq_start, picks, (window, rate))?;
        }
        Ok(lists)
    }

    fn pool_windows(
        &self,
        kv: &CudaTensor,
        gate: &CudaTensor,
        bias: &CudaTensor,
        seqs: &CudaSequences,
        (rate, overlap): (usize, bool),
    ) -> Result<CudaTensor> {
        let t = seqs.n_tokens;
        let w = kv.cols / if overlap { 2 } else { 1 };
        let (kv, gate) = (self.act(kv)?, self.act(gate)?);
        let (kv, gate) = (kv.get(), gate.get());
        self.check_tensor(kv, [t, kv.cols], kv.dtype, "pool_windows kv")?;
        self.check_tensor(gate, [t, kv.cols], kv.dtype, "pool_windows gate")?;
        self.check_tensor(bias, [rate, kv.cols], Dt::F32, "pool_windows bias")?;
        if rate == 0 || w * (1 + usize::from(overlap)) != kv.cols {
            return Err(Error::backend(
                "cuda",
                format!("pool_windows: {} columns over windows of {rate}", kv.cols),
            ));
        }
        let out = self.new_tensor([t, w], Dt::F32, "pooled windows")?;
        if out.len() > 0 {
            let (k, s) = (&self.kernels, &self.stream);
            let seq_start = seqs.seq_start.ptr();
            kernels::pool_windows::run(k, s, &out, [kv, gate, bias], seq_start, (rate, overlap))?;
        }
        Ok(out)
    }

    fn causal_conv(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        bias: Option<&CudaTensor>,
        silu: bool,
        layout: &CudaSequences,
        out: OutType,
    ) -> Result<CudaTensor> {
        // Read in their own type (an f32 input with bf16 activations: the op checks').
        let (t, c) = (layout.n_tokens, x.cols);
        self.check_tensor(x, [t, c], x.dtype, "causal_conv x")?;
        if weight.rows != c || weight.dtype != Dt::F32 {
            return Err(Error::backend(
                "cuda",
                format!("causal_conv: weight {:?} for {c} channels", weight.shape()),
            ));
        }
        if let Some(bias) = bias {
            self.check_tensor(bias, [1, c], Dt::F32, "causal_conv bias")?;
        }
        let y = self.new_tensor([t, c], self.out_dt(out), "causal_conv output")?;
        if t > 0 {
            let (k, s) = (&self.kernels, &self.stream);
            let seq_start = layout.seq_start.ptr();
            kernels::causal_conv::run(k, s, &y, x, weight, bias, silu, seq_start)?;
        }
        Ok(y)
    }

    fn linear_recurrence(
        &self,
        qkv: &CudaTensor,
        gates: RecurrenceGates<'_, CudaTensor>,
        layout: &CudaSequences,
        net: DeltaNetConfig,
        out: OutType,
    ) -> Result<CudaTensor> {
        let (t, dt, hv) = (layout.n_tokens, qkv.dtype, net.v_heads);
        let dw = gates.rule.decay_width(net);
        self.check_tensor(qkv, [t, net.conv_width()], dt, "linear_recurrence qkv")?;
        self.check_tensor(gates.a, [t, dw], dt, "linear_recurrence a")?;
        self.check_tensor(gates.a_log, [1, hv], Dt::F32, "A_log")?;
        self.check_tensor(gates.dt_bias, [1, dw], Dt::F32, "dt_bias")?;
        match gates.rule {
            Recurrence::Delta { b, .. } => {
                self.check_tensor(b, [t, hv], dt, "linear_recurrence b")?
            }
            Recurrence::Ssd { d, .. } => self.check_tensor(d, [1, hv], Dt::F32, "D")?,
        }
        let y = self.new_tensor(
            [t, net.value_width()],
            self.out_dt(out),
            "linear recurrence output",
        )?;
        if t > 0 {
            use kernels::linear_recurrence::{Scratch, Sequences, run};
            let (k, s) = (&self.kernels, &self.stream);
            let alloc = |shape| self.new_tensor(shape, Dt::F32, "linear recurrence chunk scratch");
            let form = self.recurrence_form;
            let scratch = Scratch::new(k, net, gates.rule, (t, form), alloc)?;
            let seqs = Sequences {
                seq_start: layout.seq_start.ptr(),
                chunks: layout.chunks.ptr(),
                seq_chunks: layout.seq_chunks.ptr(),
                n_chunks: layout.n_chunks,
                n_seqs: layout.n_seqs,
            };
            run(k, s, (&y, qkv), gates, &seqs, scratch.as_ref(), net)?;
        }
        Ok(y)
    }

    fn gated_rms_norm(
        &self,
        x: &CudaTensor,
        gate: &CudaTensor,
        weight: &CudaTensor,
        group: usize,
        how: NormGate,
        eps: f32,
        out: OutType,
    ) -> Result<CudaTensor> {
        super::gated_norm_groups(x.cols, weight.len(), group, "cuda")?;
        if weight.dtype != Dt::F32 {
            return Err(Error::backend(
                "cuda",
                "gated_rms_norm: the weight is not f32",
            ));
        }
        self.check_tensor(gate, x.shape(), x.dtype, "gated_rms_norm gate")?;
        let y = self.new_tensor(x.shape(), self.out_dt(out), "gated_rms_norm output")?;
        if !x.is_empty() {
            let (k, s) = (&self.kernels, &self.stream);
            let run = kernels::gated_rms_norm::run;
            run(k, s, &y, (x, gate), weight, group, how, eps)?;
        }
        Ok(y)
    }

    fn gated_act(
        &self,
        gate: &CudaTensor,
        up: Option<&CudaTensor>,
        act: GatedActivation,
        out: OutType,
    ) -> Result<CudaTensor> {
        let dt = gate.dtype;
        let shape = crate::backend::gated_shape(gate.shape(), up.map(Shaped::shape), act)?;
        if let Some(up) = up {
            self.check_tensor(up, gate.shape(), dt, "gated activation up")?;
        }
        let out = self.new_tensor(shape, self.out_dt(out), "gated activation output")?;
        kernels::elementwise::gated_act(
            &self.kernels,
            &self.stream,
            (dt, out.dtype),
            out.ptr(),
            gate.ptr(),
            match up {
                Some(u) => kernels::elementwise::GateUp::Apart(u.ptr()),
                // Ungated: `up` is not read.
                None if act.ungated() => kernels::elementwise::GateUp::Apart(gate.ptr()),
                None => kernels::elementwise::GateUp::Interleaved,
            },
            out.len(),
            act,
        )?;
        Ok(out)
    }

    fn scale_columns(&self, x: &mut CudaTensor, scales: &CudaTensor) -> Result<()> {
        let [rows, cols] = x.shape();
        self.check_tensor(scales, [1, cols], Dt::F32, "column scales")?;
        if x.planes.is_some() {
            return Err(Error::backend(
                "cuda",
                "scale_columns: a tensor held as exact planes is read only",
            ));
        }
        kernels::elementwise::scale_columns(
            &self.kernels,
            &self.stream,
            x.dtype,
            x.ptr(),
            scales.ptr(),
            rows * cols,
            cols,
        )
    }

    /// Under split GEMMs on `split_gemm.cu`, the activation is written straight as the down
    /// projection's f16 planes (`split_gated_rows_f16`): never as an f32 tensor.
    fn gated_linear(
        &self,
        gate: CudaTensor,
        up: Option<CudaTensor>,
        act: GatedActivation,
        w: &CudaLinear,
    ) -> Result<CudaTensor> {
        use kernels::split_rows_f16::{GATED_ROW_MAX, split_gated_rows};
        let fused = up.as_ref().filter(|u| {
            u.shape() == gate.shape()
                && u.dtype == gate.dtype
                && gate.cols <= GATED_ROW_MAX
                && gate.rows > 0
                && self.reads_planes(gate.shape(), gate.dtype, w)
        });
        let Some(up) = fused else {
            let h = self.gated_act(&gate, up.as_ref(), act, self.input_type(w))?;
            drop((gate, up));
            return self.linear(&h, w);
        };
        let (_buf, planes) = self.f16_rows(gate.shape())?;
        let to = (planes.hi, planes.lo, planes.undo);
        let (k, s) = (&self.kernels, &self.stream);
        split_gated_rows(k, s, to, (gate.ptr(), up.ptr()), gate.shape(), act)?;
        // The input's address is not read: split_gemm takes the planes.
        self.linear_on(0, gate.rows, w, Some(planes))
    }

    fn add_assign(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        // x is the f32 residual stream; y an activation (or an f32 vector from the checks).
        self.check_tensor(x, x.shape(), Dt::F32, "residual")?;
        self.check_tensor(y, x.shape(), y.dtype, "residual update")?;
        let n = x.len();
        kernels::elementwise::add_assign(&self.kernels, &self.stream, y.dtype, x.ptr(), y.ptr(), n)
    }

    fn add_rms_norm(
        &self,
        x: &mut CudaTensor,
        y: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        out: OutType,
    ) -> Result<CudaTensor> {
        // x is the f32 residual stream; y an activation (or an f32 vector from the checks).
        self.check_tensor(x, x.shape(), Dt::F32, "residual stream")?;
        self.check_tensor(y, x.shape(), y.dtype, "residual update")?;
        self.normalized(x, Some(y), weight, eps, out)
    }

    fn nll(
        &self,
        hidden: &CudaTensor,
        head: Head<'_, CudaLinear>,
        targets: &[i32],
    ) -> Result<Vec<f32>> {
        self.vocab_nll(hidden, head, targets)
    }

    fn row_stats(
        &self,
        hidden: &CudaTensor,
        head: Head<'_, CudaLinear>,
        targets: &[i32],
        (_, top): (usize, usize),
    ) -> Result<Vec<RowStats>> {
        self.vocab_row_stats(hidden, head, targets, top)
    }

    fn kld(
        &self,
        base_hidden: &CudaTensor,
        base_head: Head<'_, CudaLinear>,
        hidden: &CudaTensor,
        head: Head<'_, CudaLinear>,
        targets: &[i32],
    ) -> Result<Vec<KldTerms>> {
        self.vocab_kld(base_hidden, base_head, hidden, head, targets)
    }
}
