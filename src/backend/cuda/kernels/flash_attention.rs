//! `flash_attention.cu`: causal GQA attention on the tensor cores (mma.sync, sm_80 and
//! later), for bf16 q, k and v with heads of 64, 128, 192 and 256, and for f32 ones split into
//! f16 planes (`--dtype f32-grade`; 64 and 128). Launched by `attention::run`, which also
//! launches `flash_attention_sm90.cu` with the same `FlashAttention`.

use cudarc::driver::CudaFunction;

use super::{Loader, Module, Source, Typed, cuda_source, set_smem};
use crate::Result;

/// Must match FA_WARPS, FA_BM and FA_BN in flash_attention.cu and FH_BM in
/// flash_attention_sm90.cu; flash_attention_wide.cu has FA_WARPS too.
const FA_WARPS: usize = 8;
const FA_ROWS: usize = 128;
const FA_KEYS: usize = 64;
/// Must match FH_WARPS and FH_BN in flash_attention_sm90.cu.
const FH_WARPS: usize = 12;
const FH_KEYS: usize = 128;

/// `flash_attention.cu`'s kernels: on bf16 operands and on split f32 ones.
pub struct Entries {
    pub bf16: FlashAttention,
    pub split: FlashAttention,
}

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("flash_attention");

    fn load(l: &Loader) -> Result<Option<Self>> {
        let planes = |planes| Operands::Pointers {
            row_pad: 8,
            planes,
            rows: FA_ROWS,
            keys: FA_KEYS,
        };
        Ok(Some(Self {
            bf16: FlashAttention::load(l, "flash_attention", planes(1), &[64, 128, 192, 256])?,
            split: FlashAttention::load(l, "flash_attention_split", planes(2), &[64, 128])?,
        }))
    }
}

/// bf16 q, k, v (or their planes); `Typed` by the output type.
pub struct FlashAttention {
    pub name: &'static str,
    /// The entry points by head size, for the sizes whose shared memory the device has.
    entries: Vec<(usize, Typed)>,
    pub operands: Operands,
}

/// How a tensor-core attention kernel is handed q, k and v, which also fixes its shared memory.
#[derive(Clone, Copy)]
pub enum Operands {
    /// Device pointers, each thread copying its share of every tile; tile rows padded by
    /// `row_pad` elements against bank conflicts (flash_attention.cu,
    /// flash_attention_wide.cu). `planes`: 1 for bf16 operands, 2 for f32 ones split into high
    /// parts and residuals, both planes of a key and value tile in shared memory. A block
    /// takes `rows` query rows and tiles of `keys` keys.
    Pointers {
        row_pad: usize,
        planes: usize,
        rows: usize,
        keys: usize,
    },
    /// TMA tensor maps, tiles in the copy engine's 128-byte swizzled layout
    /// (flash_attention_sm90.cu), run by `blocks` persistent blocks (one a multiprocessor).
    TensorMaps { blocks: usize },
}

impl Operands {
    /// Dynamic shared memory: a block's query rows, then two stages of a key tile and a
    /// value tile (each in every plane).
    pub fn smem(self, head_dim: usize) -> usize {
        let tiles = |rows, planes, keys| rows + 2 * 2 * planes * keys;
        match self {
            Operands::Pointers {
                row_pad,
                planes,
                rows,
                keys,
            } => tiles(rows, planes, keys) * (head_dim + row_pad) * 2,
            // Two buffers of query rows, plus up to 1023 bytes to align the tiles to the
            // swizzle's 1024-byte period and twelve 8-byte mbarriers.
            Operands::TensorMaps { .. } => {
                (tiles(FA_ROWS, 1, FH_KEYS) + FA_ROWS) * head_dim * 2 + 1024 + 12 * 8
            }
        }
    }

    /// Query rows a block takes.
    pub fn rows(self) -> usize {
        match self {
            Operands::Pointers { rows, .. } => rows,
            Operands::TensorMaps { .. } => FA_ROWS,
        }
    }

    /// Threads a block: the wgmma kernel adds a loading warpgroup.
    pub fn threads(self) -> u32 {
        let warps = match self {
            Operands::Pointers { .. } => FA_WARPS,
            Operands::TensorMaps { .. } => FH_WARPS,
        };
        (warps * 32) as u32
    }
}

impl FlashAttention {
    /// The entry points `<name>_d<D>_<bf16|f32>` of a compiled flash-attention source for
    /// each head size D of `head_dims` whose shared memory fits `max_smem` (the device's
    /// per-block opt-in limit: heads of 128 need 102 KiB on the mma.sync kernel and 193 KiB on
    /// the wgmma one, more than consumer Ampere/Ada
    /// GPUs give), each allowed the shared memory it needs once, here, rather than at every
    /// launch. Heads without an entry run on the CUDA-core kernel.
    pub fn load(
        l: &Loader,
        name: &'static str,
        operands: Operands,
        head_dims: &[usize],
    ) -> Result<Self> {
        let entry = |d: usize, out: &str| -> Result<CudaFunction> {
            let entry = format!("{name}_d{d}_{out}");
            let f = l.func(&entry)?;
            set_smem(&f, operands.smem(d), &entry)?;
            Ok(f)
        };
        let typed = |d: usize| -> Result<Typed> {
            Ok(Typed {
                bf16: entry(d, "bf16")?,
                f32: entry(d, "f32")?,
            })
        };
        Ok(Self {
            name,
            entries: head_dims
                .iter()
                .filter(|&&d| operands.smem(d) <= l.max_smem)
                .map(|&d| Ok((d, typed(d)?)))
                .collect::<Result<_>>()?,
            operands,
        })
    }

    /// The entry points for head size `d`, where this kernel has them.
    pub fn entries(&self, d: usize) -> Option<&Typed> {
        self.entries.iter().find(|(w, _)| *w == d).map(|(_, t)| t)
    }
}
