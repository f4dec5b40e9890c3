//! The wgpu backend: Vulkan, Metal, DX12 (and lavapipe for tests). Weights stay packed on the
//! GPU and are dequantized inside the matmul tiles, bit-exactly as `QLinear::dequantize_rows`;
//! activations are f32; the lm_head + log-softmax walks the vocabulary in tiles so only one
//! f32 per scored row comes back.

mod device;
pub mod kernels;
pub mod pipelines;
mod weights;

pub use device::{AdapterInfo, list_adapters};
pub use pipelines::TileConfig;
use weights::Dest;
pub use weights::WgpuLinear;

use super::options::BackendOptions;
use super::{
    AttnSpec, Backend, ColumnBlocks, Device, Head, IndexSpec, KldTerms, NormGate, OutType,
    Recurrence, RecurrenceGates, RotarySpan, RowGroups, RowStats, SeqLayout, Shaped, TOP_K,
    TopAgreement,
};
use crate::checkpoint::{DeltaNetConfig, GatedActivation, QLinear};
use crate::{Error, Result};
use device::{Gpu, GpuBuf};
use kernels::{
    act_quant, add, attention, causal_conv, copy_columns, gated_act, gated_rms_norm, gather,
    index_top_k, kld_accum, layer_norm, lse_update, mix_streams, pool_windows, rank_update,
    rms_norm, rope, scale_columns, scatter_add, softcap,
};
use kernels::{recurrence_chunk_prepare as prepare, recurrence_chunk_scan as scan};

/// Bytes of the logits scratch of one (row chunk x vocabulary tile) of the NLL and KLD.
const LOGITS_BUDGET: u64 = 256 << 20;
/// Widest vocabulary tile (a multiple of the matmul tile).
const MAX_VOCAB_TILE: usize = 16384;

pub struct WgpuBackend {
    gpu: Gpu,
}

/// An f32 activation matrix on the device.
pub struct WgpuTensor {
    buf: GpuBuf,
    rows: usize,
    cols: usize,
}

impl Shaped for WgpuTensor {
    fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    fn reshaped(self, rows: usize, cols: usize) -> Result<Self> {
        if rows * cols != self.len() {
            return Err(super::reshape_error(self.len(), rows, cols));
        }
        Ok(Self { rows, cols, ..self })
    }
}

/// A batch's `SeqLayout` on the device: the start of each token's sequence, then each token's
/// position (u32 each).
pub struct WgpuSequences {
    buf: GpuBuf,
    n_tokens: usize,
    /// The longest sequence's tokens.
    longest: usize,
    /// The chunked recurrence's work list (`SeqLayout::chunks`): the chunk boundaries, then
    /// each sequence's first chunk (u32), and their counts; the most chunks a sequence has.
    chunks: GpuBuf,
    n_chunks: usize,
    n_seqs: usize,
    most_chunks: usize,
    /// Where sequences have branches: the rows of its sequence each token sees, as sparse
    /// attention's key lists (f32 `[tokens, width]`, ascending, then -1s).
    branch_keys: Option<WgpuTensor>,
}

/// How the linears on cooperative matrices multiply (the shader-core kernels, where the
/// adapter has none, compute in f32 either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProductMode {
    /// Two or three f16 products of each activation's and weight's high part and residual:
    /// f32-grade.
    F32Grade,
    /// One f16 product of each (the 16-bit mode); `named`: asked for by `--dtype f16`, so
    /// the backend's name says where the adapter cannot give it.
    OneProduct { named: bool },
}

impl WgpuBackend {
    /// Opens adapter `adapter_index` of `list_adapters()`, or the best one, and builds every
    /// pipeline (so shader errors surface here, not mid-run), as `options` say (tiles,
    /// cooperative matrices, naga's checks), its linears' products as `products` says.
    pub fn new(
        adapter_index: Option<usize>,
        options: &BackendOptions,
        products: ProductMode,
    ) -> Result<Self> {
        Ok(Self {
            gpu: Gpu::open(adapter_index, options, products)?,
        })
    }

    /// The tile shapes the kernels were compiled with.
    pub fn tiles(&self) -> TileConfig {
        self.gpu.tiles
    }

    fn tensor(&self, what: &str, rows: usize, cols: usize) -> Result<WgpuTensor> {
        Ok(WgpuTensor {
            buf: self.gpu.storage(what, (rows * cols) as u64 * 4)?,
            rows,
            cols,
        })
    }

    /// As `tensor`, not zeroed: for what the next dispatches write before anything reads it.
    fn scratch_tensor(&self, what: &str, rows: usize, cols: usize) -> Result<WgpuTensor> {
        Ok(WgpuTensor {
            buf: self.gpu.scratch(what, (rows * cols) as u64 * 4)?,
            rows,
            cols,
        })
    }

    /// `Backend::attention`, and `sparse_attention` where `keys` names each query's keys.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        q: &WgpuTensor,
        k: &WgpuTensor,
        v: &WgpuTensor,
        layout: &WgpuSequences,
        spec: AttnSpec,
        sinks: Option<&WgpuTensor>,
        keys: Option<&WgpuTensor>,
    ) -> Result<WgpuTensor> {
        let AttnSpec {
            heads,
            kv_heads,
            head_dim,
            ..
        } = spec;
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(Error::InvalidArgument(format!(
                "attention: {heads} heads are not a multiple of {kv_heads} kv heads"
            )));
        }
        let t = layout.n_tokens;
        // Listed keys (sparse attention) may come with narrower values.
        let v_dim = match keys {
            Some(_) => spec.value_dim(v.cols)?,
            None => head_dim,
        };
        expect_shape("attention q", q, t, heads * head_dim)?;
        // Listed keys may name rows past the tokens (`Backend::sparse_attention`).
        let key_rows = match keys {
            Some(_) if k.rows >= t => k.rows,
            _ => t,
        };
        expect_shape("attention k", k, key_rows, kv_heads * head_dim)?;
        expect_shape("attention v", v, key_rows, kv_heads * v_dim)?;
        let out = self.tensor("attention", t, heads * v_dim)?;
        let p = attention::Params {
            tokens: t as u32,
            heads: heads as u32,
            kv_heads: kv_heads as u32,
            head_dim: head_dim as u32,
            scale: spec.scale,
            softcap: spec.softcap.unwrap_or(0.0),
            window: spec
                .window
                .map_or(Ok(0), u32::try_from)
                .map_err(|_| Error::InvalidArgument(format!("sliding window {:?}", spec.window)))?,
            has_sinks: u32::from(sinks.is_some()),
            selected: keys.map_or(Ok(0), |k| u32_of(k.cols, "sparse attention keys"))?,
            v_dim: v_dim as u32,
            _pad: [0; 2],
        };
        let qkv = attention::Qkv {
            q: &q.buf.buf,
            k: &k.buf.buf,
            v: &v.buf.buf,
            sinks: &sinks.unwrap_or(q).buf.buf,
            keys: &keys.unwrap_or(q).buf.buf,
        };
        attention::attention(&self.gpu, &p, &qkv, &layout.buf.buf, &out.buf.buf)?;
        Ok(out)
    }

    /// The rows of its sequence each token of `layout` sees, as sparse attention's key lists.
    fn branch_keys(&self, layout: &SeqLayout) -> Result<WgpuTensor> {
        let mut lists = Vec::with_capacity(layout.n_tokens());
        for w in layout.starts.windows(2) {
            for t in w[0]..w[1] {
                lists.push(layout.visible_rows(t, t - w[0]).collect::<Vec<_>>());
            }
        }
        let width = lists.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let mut keys = vec![-1f32; lists.len() * width];
        for (row, list) in keys.chunks_mut(width).zip(&lists) {
            for (k, &r) in row.iter_mut().zip(list) {
                *k = r as f32;
            }
        }
        Ok(WgpuTensor {
            buf: self
                .gpu
                .upload("branch key lists", bytemuck::cast_slice(&keys))?,
            rows: lists.len(),
            cols: width,
        })
    }

    fn u32s(&self, what: &str, v: &[u32]) -> Result<GpuBuf> {
        self.gpu.upload(what, bytemuck::cast_slice(v))
    }

    /// Row chunk and vocabulary tile of the logits scratch for `rows` scored rows.
    fn logits_tiling(&self, rows: usize, vocab: usize) -> (usize, usize) {
        let budget = LOGITS_BUDGET.min(self.gpu.max_binding()) / 4;
        let tile = vocab.clamp(1, MAX_VOCAB_TILE);
        let chunk = ((budget / tile as u64) as usize).clamp(1, rows.max(1));
        (chunk, tile)
    }

    /// `Backend::linear`; `f32_grade` keeps f32-grade products in the one-product mode.
    fn linear_products(
        &self,
        x: &WgpuTensor,
        w: &WgpuLinear,
        f32_grade: bool,
    ) -> Result<WgpuTensor> {
        let rows = x.rows;
        expect_shape(&w.name, x, rows, w.in_features)?;
        let quantized = match w.act_quant {
            None => None,
            Some(aq) => {
                let q = self.tensor("quantized activations", rows, w.in_features)?;
                let p = act_quant::Params::new(aq, rows as u32, w.in_features as u32);
                act_quant::act_quant(&self.gpu, &p, &x.buf.buf, &q.buf.buf)?;
                Some(q)
            }
        };
        let input = quantized.as_ref().unwrap_or(x);
        let y = self.tensor(&w.name, rows, w.out_features)?;
        w.matmul(
            &self.gpu,
            &input.buf.buf,
            rows,
            0..w.out_features,
            Dest {
                y: &y.buf.buf,
                ldy: w.out_features,
                with_bias: true,
            },
            f32_grade,
        )?;
        Ok(y)
    }

    /// Logits of `rows` rows of `x` against head rows `vocab` into `y` (row stride `ld`),
    /// soft-capped where the head says so.
    fn logits_tile(
        &self,
        head: Head<'_, WgpuLinear>,
        x: &wgpu::Buffer,
        rows: usize,
        vocab: std::ops::Range<usize>,
        y: &wgpu::Buffer,
        ld: usize,
    ) -> Result<()> {
        head.linear.matmul(
            &self.gpu,
            x,
            rows,
            vocab,
            Dest {
                y,
                ldy: ld,
                with_bias: false,
            },
            false,
        )?;
        if let Some(cap) = head.softcap {
            let p = softcap::Params {
                n: (rows * ld) as u32,
                cap,
                _pad: [0; 2],
            };
            softcap::softcap(&self.gpu, &p, y)?;
        }
        Ok(())
    }

    /// `x[rows]` gathered into a dense `[rows.len(), cols]` matrix.
    /// Rows `rows` of `x`, each times its factor in `scales` where given.
    fn gather_rows(
        &self,
        x: &WgpuTensor,
        cols: usize,
        rows: &[u32],
        scales: Option<&[f32]>,
    ) -> Result<WgpuTensor> {
        let out = self.tensor("scored rows", rows.len(), cols)?;
        let ids = self.u32s("scored row ids", rows)?;
        let scales = scales
            .map(|s| self.gpu.upload("row scales", bytemuck::cast_slice(s)))
            .transpose()?;
        let p = gather::Params {
            n_ids: rows.len() as u32,
            cols: cols as u32,
            row0: 0,
            row1: x.rows as u32,
            dtype: crate::backend::lowering::float_code(crate::numerics::FloatType::F32),
            scale: 1.0,
            row_scales: u32::from(scales.is_some()),
            ..Default::default()
        };
        let scales_buf = scales.as_ref().map_or(&ids.buf, |s| &s.buf);
        gather::gather(
            &self.gpu,
            &p,
            &x.buf.buf,
            &ids.buf,
            scales_buf,
            &out.buf.buf,
        )?;
        Ok(out)
    }

    /// Runs the first log-sum-exp pass of `head` over every vocabulary tile for the rows of
    /// `x`; returns the state buffer, when `want.nll` is set the read-back NLL per row, and
    /// when `want.top` > 0 each row's ranking of that many largest logits (`rank_update`'s
    /// layout: a row's logits, then their ids).
    fn lse_pass(
        &self,
        x: &WgpuTensor,
        head: Head<'_, WgpuLinear>,
        (rows, targets): (usize, &GpuBuf),
        tile: usize,
        want: LseWants,
    ) -> Result<LsePass> {
        let v = head.linear.out_features;
        let logits = self.gpu.storage("logits tile", (rows * tile) as u64 * 4)?;
        let state = self.gpu.storage("log-sum-exp state", rows as u64 * 16)?;
        let nll = self.gpu.storage("nll", rows as u64 * 4)?;
        let ranking = match want.top {
            0 => None,
            k => Some(self.gpu.storage("top lists", (rows * 2 * k) as u64 * 4)?),
        };
        for v0 in (0..v).step_by(tile) {
            let width = tile.min(v - v0);
            self.logits_tile(head, &x.buf.buf, rows, v0..v0 + width, &logits.buf, tile)?;
            let p = lse_update::Params {
                rows: rows as u32,
                width: width as u32,
                v0: v0 as u32,
                ld: tile as u32,
                first: (v0 == 0) as u32,
                last: (v0 + width == v) as u32,
                ..Default::default()
            };
            let io = lse_update::Io {
                logits: &logits.buf,
                targets: &targets.buf,
                state: &state.buf,
                nll: &nll.buf,
            };
            lse_update::lse_update(&self.gpu, &p, &io)?;
            if let Some(ranking) = &ranking {
                let p = rank_update::Params {
                    rows: rows as u32,
                    width: width as u32,
                    v0: v0 as u32,
                    ld: tile as u32,
                    k: want.top as u32,
                    first: (v0 == 0) as u32,
                    _pad: [0; 2],
                };
                rank_update::rank_update(&self.gpu, &p, &logits.buf, &ranking.buf)?;
            }
        }
        let nll = if want.nll {
            Some(self.gpu.read_f32(&nll.buf, rows)?)
        } else {
            None
        };
        Ok(LsePass {
            state,
            nll,
            ranking,
        })
    }

    /// `lse_pass` over the rows of `hidden` with a target, a bounded chunk of rows at a time:
    /// `each` gets a chunk's row indices and its pass.
    fn lse_chunks(
        &self,
        what: &str,
        hidden: &WgpuTensor,
        head: Head<'_, WgpuLinear>,
        targets: &[i32],
        want: LseWants,
        mut each: impl FnMut(&[u32], LsePass) -> Result<()>,
    ) -> Result<()> {
        let (rows, tg) = scored(targets, head.linear.out_features)?;
        let h = head.linear.in_features;
        expect_shape(&format!("{what} hidden"), hidden, targets.len(), h)?;
        let (chunk, tile) = self.logits_tiling(rows.len(), head.linear.out_features);
        for (rc, tc) in rows.chunks(chunk).zip(tg.chunks(chunk)) {
            let x = self.gather_rows(hidden, h, rc, None)?;
            let targets = self.u32s("targets", tc)?;
            each(
                rc,
                self.lse_pass(&x, head, (rc.len(), &targets), tile, want)?,
            )?;
        }
        Ok(())
    }
}

/// What a log-sum-exp pass also gives: the NLLs, each row's top list of `top` tokens.
#[derive(Clone, Copy, Default)]
struct LseWants {
    nll: bool,
    top: usize,
}

/// A log-sum-exp pass's results on the device (`lse_update`'s state; `rank_update`'s
/// rankings) and its NLLs where asked.
struct LsePass {
    state: GpuBuf,
    nll: Option<Vec<f32>>,
    ranking: Option<GpuBuf>,
}

impl LsePass {
    /// The rankings of `rows` rows of `k` tokens read back (a row's logits, then their ids as
    /// bits); empty where none was asked for.
    fn ranking_values(&self, gpu: &Gpu, rows: usize, k: usize) -> Result<Vec<f32>> {
        match &self.ranking {
            Some(r) => gpu.read_f32(&r.buf, rows * 2 * k),
            None => Ok(Vec::new()),
        }
    }
}

/// Rows with a target, and the targets themselves, checked against the vocabulary.
fn scored(targets: &[i32], vocab: usize) -> Result<(Vec<u32>, Vec<u32>)> {
    let mut rows = Vec::new();
    let mut tg = Vec::new();
    for (r, &t) in targets.iter().enumerate() {
        if t < 0 {
            continue;
        }
        if t as usize >= vocab {
            return Err(Error::InvalidArgument(format!(
                "target token {t} at row {r} is outside the vocabulary of {vocab}"
            )));
        }
        rows.push(r as u32);
        tg.push(t as u32);
    }
    Ok((rows, tg))
}

/// An error unless `t` is `[rows, cols]`.
/// `n` as a kernel's u32 parameter, or an error naming `what`.
fn u32_of(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n)
        .map_err(|_| Error::InvalidArgument(format!("wgpu: {n} {what} exceed a u32 index")))
}

fn expect_shape(what: &str, t: &WgpuTensor, rows: usize, cols: usize) -> Result<()> {
    if t.shape() != [rows, cols] {
        return Err(Error::ShapeMismatch {
            tensor: what.to_string(),
            expected: vec![rows, cols],
            found: t.shape().to_vec(),
        });
    }
    Ok(())
}

impl Device for WgpuBackend {
    type Tensor = WgpuTensor;
    type Linear = WgpuLinear;
    type Sequences = WgpuSequences;
    /// Kept on the host: each group's rows are uploaded by the op that reads them.
    type Groups = RowGroups;

    fn max_head_dim(&self) -> usize {
        pipelines::HD_WIDE
    }

    fn name(&self) -> String {
        let matmuls = match (self.gpu.coop, self.gpu.one_product_asked) {
            (true, true) => ", cooperative matrices, one f16 product",
            (true, false) => ", cooperative matrices",
            (false, true) => ", f32 matmuls: no cooperative matrices for --dtype f16",
            (false, false) => "",
        };
        format!(
            "wgpu ({}, {:?}{matmuls})",
            self.gpu.info.name, self.gpu.info.backend
        )
    }

    fn product_type(&self) -> crate::numerics::FloatType {
        match self.gpu.one_product {
            true => crate::numerics::FloatType::F16,
            false => crate::numerics::FloatType::F32,
        }
    }

    fn upload_linear(&self, w: &QLinear) -> Result<WgpuLinear> {
        WgpuLinear::upload(&self.gpu, w)
    }

    fn gemm_split(&self) -> Option<crate::backend::GemmSplit> {
        self.gpu
            .coop
            .then_some(crate::backend::GemmSplit::F16Planes {
                high_only: self.gpu.one_product,
            })
    }

    fn upload_vector(&self, name: &str, values: &[f32]) -> Result<WgpuTensor> {
        Ok(WgpuTensor {
            buf: self.gpu.upload(name, bytemuck::cast_slice(values))?,
            rows: 1,
            cols: values.len(),
        })
    }

    fn upload_sequences(&self, layout: &SeqLayout) -> Result<WgpuSequences> {
        let n = layout.n_tokens();
        // Sequence starts, then positions, in one buffer.
        let mut v = layout.token_seq_starts()?;
        v.extend_from_slice(&layout.positions);
        let (bounds, firsts) = layout.chunks(crate::backend::recurrent::CHUNK);
        let most_chunks = firsts.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        let (n_chunks, n_seqs) = (bounds.len() - 1, firsts.len() - 1);
        Ok(WgpuSequences {
            buf: self.u32s("sequence layout", &v)?,
            n_tokens: n,
            longest: layout.max_len(),
            chunks: self.u32s("recurrence chunks", &[bounds, firsts].concat())?,
            n_chunks,
            n_seqs,
            most_chunks: most_chunks as usize,
            branch_keys: match layout.branched() {
                true => Some(self.branch_keys(layout)?),
                false => None,
            },
        })
    }

    fn upload_groups(&self, groups: &RowGroups) -> Result<RowGroups> {
        Ok(groups.clone())
    }

    fn download(&self, t: &WgpuTensor) -> Result<Vec<f32>> {
        self.gpu.read_f32(&t.buf.buf, t.len())
    }

    /// One storage binding: the widest activation of a batch must fit it.
    fn max_buffer_bytes(&self) -> Option<u64> {
        Some(self.gpu.max_binding())
    }

    fn peak_memory_bytes(&self) -> Option<u64> {
        Some(self.gpu.mem.peak())
    }

    fn synchronize(&self) -> Result<()> {
        self.gpu.wait_idle()
    }
}

impl Backend for WgpuBackend {
    fn linear_split(&self, w: &WgpuLinear) -> Option<crate::backend::GemmSplit> {
        self.gpu
            .coop
            .then_some(crate::backend::GemmSplit::F16Planes {
                high_only: w.one_product(&self.gpu),
            })
    }

    fn embed(&self, table: &WgpuLinear, ids: &[u32], scale: f32) -> Result<WgpuTensor> {
        let Some(dtype) = table.dense_dtype() else {
            return Err(Error::unsupported(
                &table.name,
                "embedding",
                "a quantized embedding table",
            ));
        };
        crate::backend::check_token_ids(ids, table.out_features)?;
        let h = table.in_features;
        let out = self.tensor("embeddings", ids.len(), h)?;
        let idb = self.u32s("token ids", ids)?;
        for (rows, buf) in table.dense_blocks(&self.gpu) {
            let p = gather::Params {
                n_ids: ids.len() as u32,
                cols: h as u32,
                row0: rows.start as u32,
                row1: rows.end as u32,
                dtype,
                scale,
                ..Default::default()
            };
            gather::gather(&self.gpu, &p, buf, &idb.buf, &idb.buf, &out.buf.buf)?;
        }
        Ok(out)
    }

    fn rms_norm(
        &self,
        x: &WgpuTensor,
        weight: &WgpuTensor,
        eps: f32,
        _out: OutType,
    ) -> Result<WgpuTensor> {
        let [rows, cols] = x.shape();
        expect_shape("rms_norm weight", weight, 1, cols)?;
        let y = self.tensor("rms_norm", rows, cols)?;
        let p = rms_norm::Params {
            rows: rows as u32,
            cols: cols as u32,
            eps,
            _pad: 0,
        };
        rms_norm::rms_norm(&self.gpu, &p, &x.buf.buf, &weight.buf.buf, &y.buf.buf)?;
        Ok(y)
    }

    fn linear(&self, x: &WgpuTensor, w: &WgpuLinear) -> Result<WgpuTensor> {
        self.linear_products(x, w, false)
    }

    /// A router's logits: f32-grade products also in the one-product mode (f16 products would
    /// flip experts at near-ties; a router is a small GEMM).
    fn logits(&self, x: &WgpuTensor, w: &WgpuLinear) -> Result<Vec<f32>> {
        self.download(&self.linear_products(x, w, true)?)
    }

    fn rope(
        &self,
        x: &mut WgpuTensor,
        layout: &WgpuSequences,
        cos: &WgpuTensor,
        sin: &WgpuTensor,
        span: RotarySpan,
    ) -> Result<()> {
        span.check(x.cols, "wgpu rope")?;
        expect_shape("rope input", x, layout.n_tokens, x.cols)?;
        let p = rope::Params {
            tokens: layout.n_tokens as u32,
            heads: (x.cols / span.head_dim) as u32,
            head_dim: span.head_dim as u32,
            rotary_dim: span.dims as u32,
            start: span.start as u32,
            interleaved: u32::from(span.interleaved),
            _pad: [0; 2],
        };
        let tables = rope::Tables {
            cos: &cos.buf.buf,
            sin: &sin.buf.buf,
        };
        rope::rope(&self.gpu, &p, &x.buf.buf, &layout.buf.buf, &tables)
    }

    fn assemble_columns(
        &self,
        rows: usize,
        cols: usize,
        parts: &[(&WgpuTensor, ColumnBlocks)],
        _out: OutType,
    ) -> Result<WgpuTensor> {
        // A fresh storage buffer is zeroed.
        let y = self.tensor("assembled columns", rows, cols)?;
        for (src, at) in parts {
            expect_shape("assemble_columns source", src, rows, src.cols)?;
            at.check(src.cols, cols)?;
            let p = copy_columns::Params::new(rows, src.cols, cols, *at);
            copy_columns::copy_columns(&self.gpu, &p, &src.buf.buf, &y.buf.buf)?;
        }
        Ok(y)
    }

    fn attention(
        &self,
        q: &WgpuTensor,
        k: &WgpuTensor,
        v: &WgpuTensor,
        layout: &WgpuSequences,
        spec: AttnSpec,
        sinks: Option<&WgpuTensor>,
        _out: OutType,
    ) -> Result<WgpuTensor> {
        if let Some(s) = sinks {
            expect_shape("attention sinks", s, 1, spec.heads)?;
        }
        self.attend(q, k, v, layout, spec, sinks, layout.branch_keys.as_ref())
    }

    fn sparse_attention(
        &self,
        q: &WgpuTensor,
        k: &WgpuTensor,
        v: &WgpuTensor,
        layout: &WgpuSequences,
        spec: AttnSpec,
        (keys, sinks): (&WgpuTensor, Option<&WgpuTensor>),
        _out: OutType,
    ) -> Result<WgpuTensor> {
        if spec.window.is_some() {
            return Err(Error::InvalidArgument(
                "wgpu sparse_attention: a sliding window is not supported".into(),
            ));
        }
        expect_shape("sparse_attention keys", keys, layout.n_tokens, keys.cols)?;
        self.attend(q, k, v, layout, spec, sinks, Some(keys))
    }

    fn index_top_k(
        &self,
        q: &WgpuTensor,
        k: &WgpuTensor,
        weights: &WgpuTensor,
        layout: &WgpuSequences,
        spec: IndexSpec,
    ) -> Result<WgpuTensor> {
        let t = layout.n_tokens;
        expect_shape("index_top_k q", q, t, spec.heads * spec.head_dim)?;
        expect_shape("index_top_k k", k, t, spec.head_dim)?;
        expect_shape("index_top_k weights", weights, t, spec.heads)?;
        let out = self.tensor("index_top_k", t, spec.top_k)?;
        // Rows of scores per launch: a scratch of at most 256 MiB (and what a binding holds).
        let max_len = layout.longest.max(1);
        let budget = self.gpu.max_binding().min(256 << 20) / 4;
        let chunk = (budget / max_len as u64).clamp(1, t.max(1) as u64) as usize;
        let scratch = self
            .gpu
            .scratch("index_top_k scores", (chunk * max_len) as u64 * 4)?;
        let what = "index_top_k";
        for row0 in (0..t).step_by(chunk) {
            let rows = chunk.min(t - row0);
            let p = index_top_k::Params {
                tokens: u32_of(t, what)?,
                heads: u32_of(spec.heads, what)?,
                head_dim: u32_of(spec.head_dim, what)?,
                top_k: u32_of(spec.top_k, what)?,
                scale: spec.scale,
                weight_scale: spec.weight_scale,
                row0: u32_of(row0, what)?,
                max_len: u32_of(max_len, what)?,
                rate: u32_of(spec.rate, what)?.max(1),
                _pad: [0; 3],
            };
            let inputs = [&q.buf.buf, &k.buf.buf, &weights.buf.buf, &layout.buf.buf];
            index_top_k::index_top_k(
                &self.gpu,
                &p,
                rows as u32,
                inputs,
                &scratch.buf,
                &out.buf.buf,
            )?;
        }
        Ok(out)
    }

    fn layer_norm(
        &self,
        x: &WgpuTensor,
        weight: &WgpuTensor,
        bias: &WgpuTensor,
        eps: f32,
        _out: OutType,
    ) -> Result<WgpuTensor> {
        let (rows, cols) = (x.rows, x.cols);
        expect_shape("layer_norm weight", weight, 1, cols)?;
        expect_shape("layer_norm bias", bias, 1, cols)?;
        let y = self.tensor("layer_norm", rows, cols)?;
        let p = rms_norm::Params {
            rows: u32_of(rows, "layer_norm rows")?,
            cols: u32_of(cols, "layer_norm cols")?,
            eps,
            _pad: 0,
        };
        let inputs = [&x.buf.buf, &weight.buf.buf, &bias.buf.buf];
        layer_norm::layer_norm(&self.gpu, &p, inputs, &y.buf.buf)?;
        Ok(y)
    }

    fn causal_conv(
        &self,
        x: &WgpuTensor,
        weight: &WgpuTensor,
        bias: Option<&WgpuTensor>,
        silu: bool,
        layout: &WgpuSequences,
        _out: OutType,
    ) -> Result<WgpuTensor> {
        let (t, c) = (layout.n_tokens, x.cols);
        expect_shape("causal_conv x", x, t, c)?;
        let taps = weight.cols;
        expect_shape("causal_conv weight", weight, c, taps)?;
        if let Some(bias) = bias {
            expect_shape("causal_conv bias", bias, 1, c)?;
        }
        let y = self.tensor("causal_conv", t, c)?;
        let p = causal_conv::Params {
            n: u32_of(t * c, "causal_conv values")?,
            channels: c as u32,
            taps: taps as u32,
            flags: if silu { causal_conv::SILU } else { 0 }
                | if bias.is_some() { causal_conv::BIAS } else { 0 },
        };
        let bias = bias.unwrap_or(weight);
        let inputs = [&x.buf.buf, &weight.buf.buf, &bias.buf.buf];
        causal_conv::causal_conv(&self.gpu, &p, inputs, &layout.buf.buf, &y.buf.buf)?;
        Ok(y)
    }

    fn linear_recurrence(
        &self,
        qkv: &WgpuTensor,
        gates: RecurrenceGates<'_, WgpuTensor>,
        layout: &WgpuSequences,
        net: DeltaNetConfig,
        _out: OutType,
    ) -> Result<WgpuTensor> {
        let (t, hv) = (layout.n_tokens, net.v_heads);
        let dw = gates.rule.decay_width(net);
        expect_shape("linear_recurrence qkv", qkv, t, net.conv_width())?;
        expect_shape("linear_recurrence a", gates.a, t, dw)?;
        expect_shape("linear_recurrence A_log", gates.a_log, 1, hv)?;
        expect_shape("linear_recurrence dt_bias", gates.dt_bias, 1, dw)?;
        let (b_or_d, rule, [gate_lo, gate_hi]) = match gates.rule {
            Recurrence::Delta {
                b,
                per_key,
                lower_bound,
            } => {
                expect_shape("linear_recurrence b", b, t, hv)?;
                let rule = match per_key {
                    true => prepare::KIMI,
                    false => prepare::DELTA,
                };
                // The delta rules' gate bounds: the safe gate's lower bound, 0 for softplus.
                (b, rule, [lower_bound.unwrap_or(0.0), 0.0])
            }
            Recurrence::Ssd { d, dt_min, dt_max } => {
                expect_shape("linear_recurrence D", d, 1, hv)?;
                // No infinity in a uniform: the largest float clamps the same.
                (d, prepare::SSD, [dt_min, dt_max.min(f32::MAX)])
            }
        };
        if net.k_dim > prepare::MAX_KEY_DIM {
            return Err(Error::unsupported(
                "wgpu linear_recurrence",
                "the key (state) head width",
                format!(
                    "{} (the kernels hold up to {})",
                    net.k_dim,
                    prepare::MAX_KEY_DIM
                ),
            ));
        }
        // Every output, intermediate and state value is written before it is read (the
        // products only where the scan reads them, j <= i; the state from zero at a
        // sequence's first chunk): none is zeroed.
        let out = self.scratch_tensor("linear_recurrence", t, net.value_width())?;
        if t == 0 {
            return Ok(out);
        }
        let delta = rule != prepare::SSD;
        let mut p = prepare::Params {
            k_heads: net.k_heads as u32,
            v_heads: hv as u32,
            dk: net.k_dim as u32,
            dv: net.v_dim as u32,
            rule,
            n_chunks: u32_of(layout.n_chunks, "recurrence chunks")?,
            n_seqs: u32_of(layout.n_seqs, "sequences")?,
            col_blocks: net.v_dim.div_ceil(scan::COLS) as u32,
            first_chunk: 0,
            chunk_steps: 0,
            gate_lo,
            gate_hi,
            kh_span: net.key_head_span() as u32,
            _pad: [0; 3],
        };
        let chunk = crate::backend::recurrent::CHUNK;
        let what = "linear_recurrence chunk scratch";
        let products = self.scratch_tensor(what, t, hv * chunk)?;
        let values = self.scratch_tensor(what, t, hv * net.v_dim)?;
        let corrections = self.scratch_tensor(what, if delta { t } else { 1 }, hv * net.k_dim)?;
        let decays = self.scratch_tensor(what, t, dw)?;
        let state = self.scratch_tensor(
            "linear_recurrence state",
            layout.n_seqs * hv * net.k_dim,
            net.v_dim,
        )?;
        let inputs = prepare::Inputs {
            qkv: &qkv.buf.buf,
            a: &gates.a.buf.buf,
            b_or_d: &b_or_d.buf.buf,
            a_log: &gates.a_log.buf.buf,
            dt_bias: &gates.dt_bias.buf.buf,
            chunks: &layout.chunks.buf,
        };
        let scratch = prepare::Scratch {
            products: &products.buf.buf,
            values: &values.buf.buf,
            corrections: &corrections.buf.buf,
            decays: &decays.buf.buf,
        };
        prepare::recurrence_chunk_prepare(&self.gpu, &p, &inputs, &scratch)?;
        let buffers = scan::Buffers {
            qkv: &qkv.buf.buf,
            skip: &b_or_d.buf.buf,
            chunks: &layout.chunks.buf,
            state: &state.buf.buf,
            out: &out.buf.buf,
        };
        let steps = scan::chunks_per_dispatch(&self.gpu, net.k_dim, layout.most_chunks);
        for first in (0..layout.most_chunks).step_by(steps) {
            p.first_chunk = first as u32;
            p.chunk_steps = steps as u32;
            scan::recurrence_chunk_scan(&self.gpu, &p, &scratch, &buffers)?;
        }
        Ok(out)
    }

    fn gated_rms_norm(
        &self,
        x: &WgpuTensor,
        gate: &WgpuTensor,
        weight: &WgpuTensor,
        group: usize,
        how: NormGate,
        eps: f32,
        _out: OutType,
    ) -> Result<WgpuTensor> {
        let [rows, cols] = x.shape();
        super::gated_norm_groups(cols, weight.len(), group, "wgpu")?;
        expect_shape("gated_rms_norm gate", gate, rows, cols)?;
        let y = self.tensor("gated_rms_norm", rows, cols)?;
        let p = gated_rms_norm::Params {
            groups: u32_of(rows * cols / group, "gated_rms_norm groups")?,
            d: group as u32,
            eps,
            wlen: u32_of(weight.len(), "gated_rms_norm weight")?,
            mode: how as u32,
            _pad: [0; 3],
        };
        let bufs = (&x.buf.buf, &gate.buf.buf);
        gated_rms_norm::gated_rms_norm(&self.gpu, &p, bufs, &weight.buf.buf, &y.buf.buf)?;
        Ok(y)
    }

    fn gated_act(
        &self,
        gate: &WgpuTensor,
        up: Option<&WgpuTensor>,
        act: GatedActivation,
        _out: OutType,
    ) -> Result<WgpuTensor> {
        let [rows, cols] = super::gated_shape(gate.shape(), up.map(Shaped::shape), act)?;
        let y = self.tensor("gated activation", rows, cols)?;
        let (code, alpha, limit) = match act {
            GatedActivation::Silu => (0, 0.0, 0.0),
            GatedActivation::GeluTanh => (1, 0.0, 0.0),
            GatedActivation::ClampedSwiglu { alpha, limit } => (2, alpha, limit),
            GatedActivation::Sigmoid => (3, 0.0, 0.0),
            GatedActivation::Product => (4, 0.0, 0.0),
            GatedActivation::Relu2 => (5, 0.0, 0.0),
            GatedActivation::ClampedSilu { limit } => (6, 0.0, limit),
        };
        let p = gated_act::Params {
            n: (rows * cols) as u32,
            act: code,
            alpha,
            limit,
            interleaved: u32::from(up.is_none() && act.interleaves()),
            _pad: [0; 3],
        };
        // Interleaved or ungated: `up` is not read; the gate buffer fills its binding.
        let up = up.unwrap_or(gate);
        gated_act::gated_act(&self.gpu, &p, &gate.buf.buf, &up.buf.buf, &y.buf.buf)?;
        Ok(y)
    }

    fn take_rows(&self, parts: &[&WgpuTensor], rows: &[u32]) -> Result<WgpuTensor> {
        let (cols, _) = super::joined_rows(parts, rows)?;
        let out = self.scratch_tensor("taken rows", rows.len(), cols)?;
        if rows.is_empty() {
            return Ok(out);
        }
        let ids = self.u32s("taken row ids", rows)?;
        // Each part writes the rows that name it (gather.wgsl skips ids outside its range).
        let mut row0 = 0;
        for part in parts {
            let p = gather::Params {
                n_ids: rows.len() as u32,
                cols: cols as u32,
                row0,
                row1: row0 + part.rows as u32,
                dtype: crate::backend::lowering::float_code(crate::numerics::FloatType::F32),
                scale: 1.0,
                row_scales: 0,
                ..Default::default()
            };
            gather::gather(
                &self.gpu,
                &p,
                &part.buf.buf,
                &ids.buf,
                &ids.buf,
                &out.buf.buf,
            )?;
            row0 = p.row1;
        }
        Ok(out)
    }

    fn gather_group(
        &self,
        x: &WgpuTensor,
        groups: &RowGroups,
        g: usize,
        _out: OutType,
    ) -> Result<WgpuTensor> {
        let range = groups.check(g, x.rows)?;
        let scales = groups.input_scales.get(range.clone());
        self.gather_rows(x, x.cols, &groups.rows[range], scales)
    }

    fn scatter_add_group(
        &self,
        acc: &mut WgpuTensor,
        y: &WgpuTensor,
        groups: &RowGroups,
        g: usize,
    ) -> Result<()> {
        let range = groups.check(g, acc.rows)?;
        expect_shape("scatter_add rows", y, range.len(), acc.cols)?;
        let rows = self.u32s("expert rows", &groups.rows[range.clone()])?;
        let weights = self.gpu.upload(
            "expert weights",
            bytemuck::cast_slice(&groups.weights[range.clone()]),
        )?;
        let p = scatter_add::Params {
            n_rows: range.len() as u32,
            cols: acc.cols as u32,
            acc_rows: acc.rows as u32,
            _pad: 0,
        };
        scatter_add::scatter_add(
            &self.gpu,
            &p,
            &acc.buf.buf,
            &y.buf.buf,
            &rows.buf,
            &weights.buf,
        )
    }

    fn mix_streams(
        &self,
        streams: &WgpuTensor,
        weights: &WgpuTensor,
        added: Option<(&WgpuTensor, &WgpuTensor)>,
        m: usize,
    ) -> Result<WgpuTensor> {
        let rows = streams.rows;
        let (n, d) = crate::backend::compressed::mix_streams_shape(streams, weights, added, m)?;
        let out = self.tensor("mixed streams", rows, m * d)?;
        let what = "mix_streams";
        let p = mix_streams::Params {
            rows: u32_of(rows, what)?,
            n: u32_of(n, what)?,
            m: u32_of(m, what)?,
            d: u32_of(d, what)?,
            added: u32::from(added.is_some()),
            _pad: [0; 3],
        };
        let (x, scales) = added.unwrap_or((streams, weights));
        let inputs = [
            &streams.buf.buf,
            &weights.buf.buf,
            &x.buf.buf,
            &scales.buf.buf,
        ];
        mix_streams::mix_streams(&self.gpu, &p, inputs, &out.buf.buf)?;
        Ok(out)
    }

    fn pool_windows(
        &self,
        kv: &WgpuTensor,
        gate: &WgpuTensor,
        bias: &WgpuTensor,
        layout: &WgpuSequences,
        (rate, overlap): (usize, bool),
    ) -> Result<WgpuTensor> {
        let t = layout.n_tokens;
        let w = kv.cols / if overlap { 2 } else { 1 };
        expect_shape("pool_windows kv", kv, t, kv.cols)?;
        expect_shape("pool_windows gate", gate, t, kv.cols)?;
        expect_shape("pool_windows bias", bias, rate, kv.cols)?;
        if rate == 0 || w * (1 + usize::from(overlap)) != kv.cols {
            return Err(Error::InvalidArgument(format!(
                "pool_windows: {} columns over windows of {rate}",
                kv.cols
            )));
        }
        let out = self.tensor("pooled windows", t, w)?;
        let what = "pool_windows";
        let p = pool_windows::Params {
            rows: u32_of(t, what)?,
            w: u32_of(w, what)?,
            rate: u32_of(rate, what)?,
            overlap: u32::from(overlap),
        };
        let inputs = [&kv.buf.buf, &gate.buf.buf, &bias.buf.buf, &layout.buf.buf];
        pool_windows::pool_windows(&self.gpu, &p, inputs, &out.buf.buf)?;
        Ok(out)
    }

    fn scale_columns(&self, x: &mut WgpuTensor, scales: &WgpuTensor) -> Result<()> {
        expect_shape("column scales", scales, 1, x.cols)?;
        let p = scale_columns::Params {
            n: u32_of(x.len(), "scale_columns values")?,
            cols: x.cols as u32,
            _pad: [0; 2],
        };
        scale_columns::scale_columns(&self.gpu, &p, &x.buf.buf, &scales.buf.buf)
    }

    fn add_assign(&self, x: &mut WgpuTensor, y: &WgpuTensor) -> Result<()> {
        expect_shape("residual update", y, x.rows, x.cols)?;
        let n = x.len();
        let p = add::Params {
            n: n as u32,
            _pad: [0; 3],
        };
        add::add(&self.gpu, &p, &x.buf.buf, &y.buf.buf)
    }

    fn nll(
        &self,
        hidden: &WgpuTensor,
        head: Head<'_, WgpuLinear>,
        targets: &[i32],
    ) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        let want = LseWants { nll: true, top: 0 };
        self.lse_chunks("nll", hidden, head, targets, want, |rc, pass| {
            for (&r, &v) in rc.iter().zip(pass.nll.iter().flatten()) {
                if !v.is_finite() {
                    return Err(Error::NonFinite {
                        what: "nll",
                        window: 0,
                        position: r as usize,
                    });
                }
                out.push(v);
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// serve's reduction where the logits are made: the NLL's log-sum-exp pass over the
    /// vocabulary tiles, whose state per row (max, sum of exp(l - max), argmax, target logit)
    /// and ranking of its `top` largest logits come back, 16 bytes and 8 a listed token a row
    /// instead of the row.
    fn row_stats(
        &self,
        hidden: &WgpuTensor,
        head: Head<'_, WgpuLinear>,
        targets: &[i32],
        (vocab, top): (usize, usize),
    ) -> Result<Vec<RowStats>> {
        crate::backend::check_row_top(top)?;
        let mut out = Vec::new();
        let want = LseWants { nll: false, top };
        self.lse_chunks("row_stats", hidden, head, targets, want, |rc, pass| {
            let states = self.gpu.read_f32(&pass.state.buf, rc.len() * 4)?;
            let ranks = pass.ranking_values(&self.gpu, rc.len(), top)?;
            for (i, (&r, s)) in rc.iter().zip(states.chunks_exact(4)).enumerate() {
                let lse = f64::from(s[0]) + f64::from(s[1]).ln();
                if !lse.is_finite() || !s[3].is_finite() {
                    return Err(Error::NonFinite {
                        what: "row_stats",
                        window: 0,
                        position: r as usize,
                    });
                }
                out.push(RowStats {
                    lse,
                    best: s[2].to_bits(),
                    best_logit: s[0],
                    target_logit: s[3],
                    // The unfilled places of a vocabulary shorter than the list left out.
                    top: (0..top)
                        .map(|j| {
                            (
                                ranks[(2 * i + 1) * top + j].to_bits(),
                                ranks[2 * i * top + j],
                            )
                        })
                        .filter(|&(t, _)| (t as usize) < vocab)
                        .collect(),
                });
            }
            Ok(())
        })?;
        Ok(out)
    }

    fn kld(
        &self,
        base_hidden: &WgpuTensor,
        base_head: Head<'_, WgpuLinear>,
        hidden: &WgpuTensor,
        head: Head<'_, WgpuLinear>,
        targets: &[i32],
    ) -> Result<Vec<KldTerms>> {
        let v = head.linear.out_features;
        let (rows, tg) = scored(targets, v)?;
        let n = targets.len();
        let in_features = (base_head.linear.in_features, head.linear.in_features);
        expect_shape("kld base hidden", base_hidden, n, in_features.0)?;
        expect_shape("kld hidden", hidden, n, in_features.1)?;
        // Two logit tiles live at once (base and test).
        let (chunk, tile) = self.logits_tiling(rows.len(), v);
        let chunk = chunk.div_ceil(2).max(1);
        let mut out = Vec::with_capacity(rows.len());
        for (rc, tc) in rows.chunks(chunk).zip(tg.chunks(chunk)) {
            let n = rc.len();
            let xp = self.gather_rows(base_hidden, in_features.0, rc, None)?;
            let xq = self.gather_rows(hidden, in_features.1, rc, None)?;
            let targets = self.u32s("targets", tc)?;
            // Each model's TOP_K ranking comes from its first pass.
            let want = LseWants {
                nll: false,
                top: TOP_K,
            };
            let pass_p = self.lse_pass(&xp, base_head, (n, &targets), tile, want)?;
            let pass_q = self.lse_pass(&xq, head, (n, &targets), tile, want)?;
            let (state_p, state_q) = (&pass_p.state, &pass_q.state);
            let lp = self
                .gpu
                .storage("base logits tile", (n * tile) as u64 * 4)?;
            let lq = self.gpu.storage("logits tile", (n * tile) as u64 * 4)?;
            let acc = self.gpu.storage("kld sums", n as u64 * 8)?;
            let res = self.gpu.storage("kld terms", n as u64 * 20)?;
            for v0 in (0..v).step_by(tile) {
                let width = tile.min(v - v0);
                self.logits_tile(base_head, &xp.buf.buf, n, v0..v0 + width, &lp.buf, tile)?;
                self.logits_tile(head, &xq.buf.buf, n, v0..v0 + width, &lq.buf, tile)?;
                let p = kld_accum::Params {
                    rows: n as u32,
                    width: width as u32,
                    ld: tile as u32,
                    first: (v0 == 0) as u32,
                    last: (v0 + width == v) as u32,
                    _pad: [0; 3],
                };
                let io = kld_accum::Io {
                    logits_p: &lp.buf,
                    logits_q: &lq.buf,
                    state_p: &state_p.buf,
                    state_q: &state_q.buf,
                    acc: &acc.buf,
                    out: &res.buf,
                };
                kld_accum::kld_accum(&self.gpu, &p, &io)?;
            }
            let terms = self.gpu.read_f32(&res.buf, n * 5)?;
            let rank_p = pass_p.ranking_values(&self.gpu, n, TOP_K)?;
            let rank_q = pass_q.ranking_values(&self.gpu, n, TOP_K)?;
            // Row i's ids of a ranking, the unfilled places of a short vocabulary left out.
            let ids = |ranking: &[f32], i: usize| -> Vec<u32> {
                let row = &ranking[(2 * i + 1) * TOP_K..(2 * i + 2) * TOP_K];
                row.iter()
                    .map(|t| t.to_bits())
                    .filter(|&t| (t as usize) < v)
                    .collect()
            };
            for (i, (&r, t)) in rc.iter().zip(terms.chunks_exact(5)).enumerate() {
                if t.iter().any(|v| !v.is_finite()) {
                    return Err(Error::NonFinite {
                        what: "kld",
                        window: 0,
                        position: r as usize,
                    });
                }
                out.push(KldTerms {
                    kld: t[0] as f64,
                    kld_reverse: t[1] as f64,
                    nll_q: t[2] as f64,
                    nll_base: t[3] as f64,
                    base_top_p: t[4] as f64,
                    top: TopAgreement::of(&ids(&rank_p, i), &ids(&rank_q, i)),
                });
            }
        }
        Ok(out)
    }
}
