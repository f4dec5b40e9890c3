//! `flash_attention_sm90.cu` (Hopper's wgmma, tiles loaded by TMA; heads of 64 and 128) or
//! `flash_attention.cu` (mma.sync, sm_80 and later; heads of 64, 128, 192 and 256), both for
//! bf16, the latter also for f32 split into f16 planes (`--dtype f32-grade`; 64 and 128),
//! and `attention.cu` (CUDA cores, f32 and any other head_dim): causal GQA attention with an
//! online softmax, a sliding window and soft-capped scores where the layer has them.

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaModule, LaunchConfig, PushKernelArg};

use super::{Dt, Kernels, Stream, Typed, i32_arg, launch, tensor_map};
use crate::backend::AttnSpec;
use crate::{Error, Result};

/// Must match WARPS, ROWS, KT and MAXT in attention.cu.
const WARPS: usize = 4;
const ROWS: usize = 4;
const KEY_TILE: usize = 32;
const MAX_HEAD_DIM: usize = 256;
/// Must match FA_WARPS, FA_BM and FA_BN in flash_attention.cu and FH_BM in
/// flash_attention_sm90.cu.
const FA_WARPS: usize = 8;
const FA_ROWS: usize = 128;
const FA_KEYS: usize = 64;
/// Must match FH_WARPS and FH_BN in flash_attention_sm90.cu.
const FH_WARPS: usize = 12;
const FH_KEYS: usize = 128;
/// Rows and columns of the TMA boxes of flash_attention_sm90.cu (FH_BOX: 64 x 64 bf16).
const TMA_BOX: u32 = 64;

/// bf16 q, k, v (or their planes); `Typed` by the output type.
pub struct FlashAttention {
    pub name: &'static str,
    /// The entry points by head size, for the sizes whose shared memory the device has.
    entries: Vec<(usize, Typed)>,
    operands: Operands,
}

/// How a tensor-core attention kernel is handed q, k and v, which also fixes its shared memory.
#[derive(Clone, Copy)]
pub enum Operands {
    /// Device pointers, each thread copying its share of every tile; tile rows padded by
    /// `row_pad` elements against bank conflicts (flash_attention.cu). `planes`: 1 for bf16
    /// operands, 2 for f32 ones split into high parts and residuals, both planes of a key and
    /// value tile in shared memory.
    Pointers { row_pad: usize, planes: usize },
    /// TMA tensor maps, tiles in the copy engine's 128-byte swizzled layout
    /// (flash_attention_sm90.cu), run by `blocks` persistent blocks (one a multiprocessor).
    TensorMaps { blocks: usize },
}

impl Operands {
    /// Dynamic shared memory: FA_ROWS query rows, then two stages of a key tile and a value
    /// tile (each in every plane).
    fn smem(self, head_dim: usize) -> usize {
        let rows = |planes, keys| FA_ROWS + 2 * 2 * planes * keys;
        match self {
            Operands::Pointers { row_pad, planes } => {
                rows(planes, FA_KEYS) * (head_dim + row_pad) * 2
            }
            // Two buffers of query rows, plus up to 1023 bytes to align the tiles to the
            // swizzle's 1024-byte period and twelve 8-byte mbarriers.
            Operands::TensorMaps { .. } => {
                (rows(1, FH_KEYS) + FA_ROWS) * head_dim * 2 + 1024 + 12 * 8
            }
        }
    }

    /// Threads a block: the wgmma kernel adds a loading warpgroup.
    fn threads(self) -> u32 {
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
        m: &Arc<CudaModule>,
        name: &'static str,
        operands: Operands,
        head_dims: &[usize],
        max_smem: usize,
    ) -> Result<Self> {
        let entry = |d: usize, out: &str| -> Result<CudaFunction> {
            let entry = format!("{name}_d{d}_{out}");
            let f = m
                .load_function(&entry)
                .map_err(|e| Error::backend("cuda", format!("kernel {entry}: {e:?}")))?;
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
                .filter(|&&d| operands.smem(d) <= max_smem)
                .map(|&d| Ok((d, typed(d)?)))
                .collect::<Result<_>>()?,
            operands,
        })
    }

    /// The entry points for head size `d`, where this kernel has them.
    fn entries(&self, d: usize) -> Option<&Typed> {
        self.entries.iter().find(|(w, _)| *w == d).map(|(_, t)| t)
    }
}

/// Dynamic shared memory of `attention.cu` for `head_dim` `d`: two key/value tiles (padded
/// rows) and the block's query rows.
fn cuda_core_smem(d: usize) -> usize {
    (2 * KEY_TILE * (d + 1) + WARPS * ROWS * d) * 4
}

/// Allows every `attention.cu` entry the shared memory of the largest head_dim it takes, once
/// at load: setting it per launch for the launch's head_dim raced between threads running
/// models of different head sizes (a launch asking more than another thread had just set).
pub fn allow_cuda_core_smem(attention: &super::InOut) -> Result<()> {
    for f in attention.fns.iter().flatten() {
        set_smem(f, cuda_core_smem(MAX_HEAD_DIM), "attention")?;
    }
    Ok(())
}

pub(super) fn set_smem(f: &CudaFunction, bytes: usize, name: &str) -> Result<()> {
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        bytes as i32,
    )
    .map_err(|e| Error::backend("cuda", format!("{name} shared memory {bytes}: {e:?}")))
}

/// The tensor-core kernel `run` uses for bf16 heads of `d` values, with its entry points: the
/// wgmma one where the device has it (64 and 128) unless `portable` asks for the mma.sync
/// one, which also takes the wider heads.
pub fn flash_kernel(k: &Kernels, portable: bool, d: usize) -> Option<(&FlashAttention, &Typed)> {
    let preferred = k.flash_attention_sm90.as_ref().filter(|_| !portable);
    preferred
        .into_iter()
        .chain(&k.flash_attention)
        .find_map(|f| f.entries(d).map(|e| (f, e)))
}

/// Whether `run` can take f32 q, k and v of heads of `d` values as split planes
/// (`Inputs::SplitPlanes`) on this device.
pub fn splits(k: &Kernels, d: usize) -> bool {
    split_entries(k, d).is_some()
}

fn split_entries(k: &Kernels, d: usize) -> Option<(&FlashAttention, &Typed)> {
    let f = k.flash_attention_split.as_ref()?;
    f.entries(d).map(|e| (f, e))
}

/// What `run`'s q, k and v are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inputs {
    /// Activations of this type.
    Act(Dt),
    /// f32 activations as two f16 planes each (`tokens` rows of high parts, then as many of
    /// residuals), for the tensor cores: q and k with a power of two per token and head
    /// (`split_rows_f16.cu` over rows of one head), undone on S from `q_undo` and `k_undo`
    /// (`[tokens, heads]` and `[tokens, kv_heads]` f32); v with one per column
    /// (`split_columns_f16.cu`), undone on O from the columns' largest magnitudes at `v_top`;
    /// see [`splits`].
    SplitPlanes {
        q_undo: u64,
        k_undo: u64,
        v_top: u64,
    },
}

/// `types` is (q, k and v, out).
#[allow(clippy::too_many_arguments)]
pub fn run(
    k: &Kernels,
    portable: bool,
    s: &Stream,
    types: (Inputs, Dt),
    out: u64,
    (q, kk, v): (u64, u64, u64),
    seq_start: u64,
    tokens: usize,
    shape: AttnSpec,
    sinks: Option<u64>,
) -> Result<()> {
    // A null pointer: no sinks.
    let sinks = sinks.unwrap_or(0);
    let d = shape.head_dim;
    let softcap = shape.softcap.unwrap_or(0.0);
    let window = match shape.window {
        Some(w) => i32_arg(w, "sliding window")?,
        None => 0,
    };
    if d > MAX_HEAD_DIM || shape.kv_heads == 0 || !shape.heads.is_multiple_of(shape.kv_heads) {
        return Err(Error::unsupported(
            "attention",
            "shape",
            format!("{shape:?}: head_dim <= {MAX_HEAD_DIM} and heads a multiple of kv_heads"),
        ));
    }
    let (t, h, kvh, dd) = (
        i32_arg(tokens, "tokens")?,
        i32_arg(shape.heads, "heads")?,
        i32_arg(shape.kv_heads, "kv_heads")?,
        i32_arg(d, "head_dim")?,
    );
    let (flash, in_dt) = match types.0 {
        Inputs::Act(Dt::Bf16) => (flash_kernel(k, portable, d), Dt::Bf16),
        Inputs::Act(Dt::F32) => (None, Dt::F32),
        Inputs::SplitPlanes { .. } => match split_entries(k, d) {
            Some(f) => (Some(f), Dt::Bf16),
            None => {
                return Err(Error::backend(
                    "cuda",
                    format!("no split-plane attention for heads of {d} on this device"),
                ));
            }
        },
    };
    let flash = flash.map(|(f, e)| (f, e.get(types.1)));
    if let Some((kernel, f)) = flash {
        let scale_log2 = (std::f64::consts::LOG2_E * shape.scale as f64) as f32;
        let q_tiles = tokens.div_ceil(FA_ROWS);
        let grid_dim = match kernel.operands {
            Operands::Pointers { .. } => (q_tiles as u32, shape.heads as u32, 1),
            Operands::TensorMaps { blocks } => ((q_tiles * shape.heads).min(blocks) as u32, 1, 1),
        };
        let cfg = LaunchConfig {
            grid_dim,
            block_dim: (kernel.operands.threads(), 1, 1),
            shared_mem_bytes: kernel.operands.smem(d) as u32,
        };
        let mut b = s.launch_builder(f);
        b.arg(&out);
        let maps;
        match kernel.operands {
            Operands::Pointers { .. } => {
                b.arg(&q).arg(&kk).arg(&v);
            }
            Operands::TensorMaps { .. } => {
                let (qw, kw) = (shape.heads * d, shape.kv_heads * d);
                let boxes = [TMA_BOX, TMA_BOX];
                maps = [
                    tensor_map(q, qw, tokens, boxes, "attention q")?,
                    tensor_map(kk, kw, tokens, boxes, "attention k")?,
                    tensor_map(v, kw, tokens, boxes, "attention v")?,
                ];
                b.arg(&maps[0]).arg(&maps[1]).arg(&maps[2]);
            }
        }
        b.arg(&seq_start).arg(&t).arg(&h).arg(&kvh).arg(&scale_log2);
        b.arg(&softcap).arg(&window).arg(&sinks);
        if let Inputs::SplitPlanes {
            q_undo,
            k_undo,
            v_top,
        } = &types.0
        {
            b.arg(q_undo).arg(k_undo).arg(v_top);
        }
        return launch(b, cfg, kernel.name);
    }
    let f = k.attention.get(in_dt, types.1);
    let smem = cuda_core_smem(d);
    let mut b = s.launch_builder(f);
    b.arg(&out).arg(&q).arg(&kk).arg(&v).arg(&seq_start);
    b.arg(&t).arg(&h).arg(&kvh).arg(&dd).arg(&shape.scale);
    b.arg(&softcap).arg(&window).arg(&sinks);
    let cfg = LaunchConfig {
        grid_dim: (tokens.div_ceil(WARPS * ROWS) as u32, shape.heads as u32, 1),
        block_dim: ((WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    launch(b, cfg, "attention")
}
