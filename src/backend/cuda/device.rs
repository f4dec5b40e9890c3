//! The CUDA backend's device part: uploads, downloads, tensors, its facts (free and peak
//! memory, workspace, how it splits products) and copies between GPUs.

use std::sync::atomic::Ordering;

use super::kernels::Dt;
use super::vocab::{ROW_CHUNK, VOCAB_TILE};
use super::{
    CudaBackend, CudaGroups, CudaLinear, CudaPrecision, CudaSequences, CudaTensor, driver_err,
};
use crate::Result;
use crate::backend::{Device, GemmSplit, RowGroups, SeqLayout, Shaped};
use crate::checkpoint::{ModelConfig, QLinear};
use crate::numerics::FloatType;

impl Device for CudaBackend {
    type Tensor = CudaTensor;
    type Linear = CudaLinear;
    type Sequences = CudaSequences;
    type Groups = CudaGroups;

    fn name(&self) -> String {
        let (a, b) = self.info.compute_capability;
        let act = match self.precision {
            CudaPrecision::Bf16 => "bf16 activations",
            CudaPrecision::Bf16With8BitCores => "bf16 activations, W8A8 on 8-bit tensor cores",
            CudaPrecision::F32 => "f32 activations",
            CudaPrecision::F32Grade => "f32 activations, f32-grade split GEMMs",
        };
        let eight_bit = match (
            self.precision,
            self.eight_bit_linears.load(Ordering::Relaxed),
        ) {
            (CudaPrecision::Bf16With8BitCores, n) => format!(" ({n} linears)"),
            (_, 0) => String::new(),
            // The reference's INT8 weights, exactly, on the integer tensor cores (`eight_bit`).
            (_, n) => format!(", {n} INT8 W8A8 linears exact on integer tensor cores"),
        };
        format!("cuda ({}, sm_{a}{b}, {act}{eight_bit})", self.info.name)
    }

    fn upload_linear(&self, w: &QLinear) -> Result<CudaLinear> {
        self.upload_weight(w)
    }

    fn upload_vector(&self, name: &str, values: &[f32]) -> Result<CudaTensor> {
        Ok(CudaTensor {
            buf: self.upload_pod(values, name)?,
            rows: 1,
            cols: values.len(),
            dtype: Dt::F32,
            planes: None,
        })
    }

    /// Uploads an activation matrix in the activation type (rounded to it where it is bf16),
    /// for checks against the CPU reference.
    fn upload_activation(&self, values: &[f32]) -> Result<CudaTensor> {
        Ok(CudaTensor {
            buf: self.upload_bytes(&self.act_bytes(values), "activation")?,
            rows: 1,
            cols: values.len(),
            dtype: self.precision.act(),
            planes: None,
        })
    }

    fn upload_sequences(&self, layout: &SeqLayout) -> Result<CudaSequences> {
        let n = layout.n_tokens();
        let seq_start = layout.token_seq_starts()?;
        let (chunks, seq_chunks) = layout.chunks(crate::backend::recurrent::CHUNK);
        Ok(CudaSequences {
            positions: self.upload_pod(&layout.positions, "positions")?,
            seq_start: self.upload_pod(&seq_start, "sequence starts")?,
            n_chunks: chunks.len() - 1,
            n_seqs: layout.n_seqs(),
            chunks: self.upload_pod(&chunks, "recurrence chunks")?,
            seq_chunks: self.upload_pod(&seq_chunks, "sequences' chunks")?,
            n_tokens: n,
            max_position: layout.positions.iter().copied().max().unwrap_or(0) as usize,
            starts: layout.starts.clone(),
            branch_mask: match layout.branched() {
                true => {
                    let (mask, words) = layout.visible_mask();
                    Some((self.upload_pod(&mask, "branch key mask")?, words))
                }
                false => None,
            },
        })
    }

    fn upload_groups(&self, groups: &RowGroups) -> Result<CudaGroups> {
        Ok(CudaGroups {
            rows: self.upload_pod(&groups.rows, "expert rows")?,
            weights: self.upload_pod(&groups.weights, "expert weights")?,
            offsets: groups.offsets.clone(),
            lens: groups.offsets.windows(2).map(|w| w[1] - w[0]).collect(),
            rows_below: groups.rows.iter().max().map_or(0, |&r| r as usize + 1),
            slots: None,
            routed: 0,
            input_scales: match groups.input_scales.len() {
                0 => None,
                _ => Some(self.upload_pod(&groups.input_scales, "expert input scales")?),
            },
        })
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        let t = self.new_tensor([rows, cols], Dt::F32, "accumulator")?;
        self.zero_fill(&t, "the accumulator")?;
        Ok(t)
    }

    fn tensor_bytes(&self, t: &CudaTensor) -> u64 {
        let planes = t
            .planes
            .as_ref()
            .map_or(0, |p| p.held(|b| b.len()).unwrap_or(0));
        (t.buf.len() + planes) as u64
    }

    /// The values, f32 exactly where the tensor holds them as planes (summed here).
    fn download(&self, t: &CudaTensor) -> Result<Vec<f32>> {
        let bytes = self.download_bytes(&t.buf, "tensor")?;
        let bf16 = |bytes: &[u8]| -> Vec<f32> {
            let bits: Vec<u16> = bytemuck::pod_collect_to_vec(bytes);
            bits.iter()
                .map(|&b| half::bf16::from_bits(b).to_f32())
                .collect()
        };
        let n = t.len();
        let mut values = match t.dtype {
            Dt::F32 => bytemuck::pod_collect_to_vec(&bytes[..n * 4]),
            Dt::Bf16 => bf16(&bytes[..n * 2]),
        };
        // Planes whose residuals routing released read as what every op reads: bf16.
        let residuals = t
            .planes
            .as_ref()
            .and_then(|p| p.held(|buf| self.download_bytes(buf, "residual planes")));
        if let Some(residuals) = residuals {
            let rest = bf16(&residuals?[..4 * n]);
            for (i, v) in values.iter_mut().enumerate() {
                *v += rest[i] + rest[n + i];
            }
        }
        Ok(values)
    }

    fn activation_type(&self) -> FloatType {
        match self.precision.act() {
            Dt::Bf16 => FloatType::Bf16,
            Dt::F32 => FloatType::F32,
        }
    }

    /// The dequantization scratch (the largest quantized layer, at least the lm_head's, or the
    /// experts' arena of a mixture), the two f32 logits tiles of `kld`, and where GEMMs split
    /// their operands the largest weight's split (an MLP weight's, or an lm_head tile's).
    fn workspace_bytes(&self, cfg: &ModelConfig) -> u64 {
        let arena = cfg.moe.as_ref().map_or(0, |m| {
            self.expert_arena_bytes(m.num_experts, m.expert_intermediate_size, cfg.hidden_size)
        });
        let scratch = (self
            .largest_layer
            .load(Ordering::Relaxed)
            .max(cfg.vocab_size * cfg.hidden_size)
            * self.precision.act().bytes())
        .max(arena);
        let widest = cfg.hidden_size * cfg.widest_mlp().max(VOCAB_TILE);
        let split = if self.precision.splits() {
            4 * widest
        } else {
            0
        };
        // Sparse attention's indexer: its products and score rows at their caps.
        let indexer = match cfg.indexer {
            Some(_) => super::INDEX_PRODUCTS_BYTES + super::INDEX_SCORES_BYTES,
            None => 0,
        };
        (2 * ROW_CHUNK * VOCAB_TILE * 4 + scratch + split + indexer) as u64
    }

    fn gemm_split(&self) -> Option<GemmSplit> {
        self.precision.splits().then_some(GemmSplit::Bf16)
    }

    fn peak_memory_bytes(&self) -> Option<u64> {
        Some(self.memory.peak.load(Ordering::Relaxed))
    }

    fn enter_thread(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("binding the context", e))
    }

    /// What the device has free once this backend's freed buffers are handed back: the ones
    /// it keeps for reuse, and the pool's (kept from one batch to the next otherwise).
    fn free_memory_bytes(&self) -> Option<u64> {
        self.release_freed();
        self.ctx.mem_get_info().ok().map(|(free, _)| free as u64)
    }

    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| driver_err("synchronizing", e))
    }

    /// cuBLAS loads the kernel libraries of a GEMM shape at its first call: 92 and 35 ms of
    /// host time before a Qwen3-30B-A3B eval's first q projection and router GEMM
    /// (docs/decisions.md: The first layer runs while the rest loads).
    fn warms_up_while_loading(&self) -> bool {
        true
    }

    /// A peer copy between GPUs (NVLink or PCIe), never through the host. The caller has
    /// synchronized `src`; this waits for the copy so `t` may be freed afterwards.
    fn copy_from(&self, src: &Self, t: &CudaTensor) -> Result<CudaTensor> {
        let out = self.new_tensor(t.shape(), t.dtype, "residual from the previous GPU")?;
        let bytes = t.len() * t.dtype.bytes();
        // SAFETY: both buffers hold `bytes` bytes and stay alive until the synchronize below.
        unsafe {
            cudarc::driver::result::memcpy_peer_async(
                self.ctx.cu_ctx(),
                out.ptr(),
                src.ctx.cu_ctx(),
                t.ptr(),
                bytes,
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| driver_err("copying the residual between GPUs", e))?;
        self.synchronize()?;
        Ok(out)
    }
}
