//! `attention.cu` (CUDA cores: f32 and any head_dim up to 512 that the device's shared memory
//! holds), and the choice between it and
//! the tensor-core kernels, `flash_attention_sm90.cu` (Hopper's wgmma; heads of 64 and 128),
//! `flash_attention.cu` (mma.sync, sm_80 and later; heads of 64 to 256, and f32 split into
//! f16 planes under `--dtype f32-grade`) and `flash_attention_wide.cu` (mma.sync; bf16 heads
//! of 512), which it launches with the same arguments: causal
//! GQA attention with an online softmax, a sliding window and soft-capped scores where the
//! layer has them, and sparse attention's selection as a key mask.

use std::sync::Arc;

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::flash_attention::{FlashAttention, Operands};
use super::{
    Dt, InOut, Kernels, Loader, Module, Source, Stream, cuda_source, flash_attention,
    flash_attention_sm90, flash_attention_wide, i32_arg, launch, set_smem, tensor_map,
};
use crate::backend::AttnSpec;
use crate::{Error, Result};

/// Must match WARPS, ROWS, KT and MAXT in attention.cu.
const WARPS: usize = 4;
const ROWS: usize = 4;
const KEY_TILE: usize = 32;
const MAX_HEAD_DIM: usize = 512;
/// Rows and columns of the TMA boxes of flash_attention_sm90.cu (FH_BOX: 64 x 64 bf16).
const TMA_BOX: u32 = 64;

/// `attention.cu`'s entry points, by (q, k and v, output) type, and the widest head they
/// take on this device.
struct Entries(InOut, usize);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("attention");

    /// Every entry is allowed the shared memory of the largest head_dim it takes, once at
    /// load: setting it per launch for the launch's head_dim raced between threads running
    /// models of different head sizes (a launch asking more than another thread had just set).
    /// Heads of 512 need 160 KiB: devices with less take heads up to what theirs holds.
    fn load(l: &Loader) -> Result<Option<Self>> {
        let entries = l.in_out("attention")?;
        let widest = (1..=MAX_HEAD_DIM / 32)
            .map(|t| 32 * t)
            .filter(|&d| cuda_core_smem(d) <= l.max_smem)
            .max()
            .unwrap_or(0);
        for f in entries.all() {
            set_smem(f, cuda_core_smem(widest), "attention")?;
        }
        Ok(Some(Self(entries, widest)))
    }
}

/// Dynamic shared memory of `attention.cu` for `head_dim` `d`: two key/value tiles (padded
/// rows) and the block's query rows.
fn cuda_core_smem(d: usize) -> usize {
    (2 * KEY_TILE * (d + 1) + WARPS * ROWS * d) * 4
}

/// A tensor-core kernel, held by its module.
enum FlashKernel {
    Sm90(Arc<flash_attention_sm90::Entries>),
    Mma(Arc<flash_attention::Entries>),
    MmaSplit(Arc<flash_attention::Entries>),
    Wide(Arc<flash_attention_wide::Entries>),
}

impl FlashKernel {
    fn get(&self) -> &FlashAttention {
        match self {
            FlashKernel::Sm90(m) => &m.0,
            FlashKernel::Mma(m) => &m.bf16,
            FlashKernel::MmaSplit(m) => &m.split,
            FlashKernel::Wide(m) => &m.0,
        }
    }
}

/// The tensor-core kernel `run` uses for bf16 heads of `d` values: the wgmma one where the
/// device has it (64 and 128) unless `portable` asks for the mma.sync one, which also takes
/// the wider heads up to 256; heads of 512 on the wide one.
fn flash_bf16(k: &Kernels, portable: bool, d: usize) -> Result<Option<FlashKernel>> {
    let sm90 = match portable {
        true => None,
        false => k.optional::<flash_attention_sm90::Entries>()?,
    };
    let mma = k.optional::<flash_attention::Entries>()?;
    let wide = match d > 256 {
        true => k.optional::<flash_attention_wide::Entries>()?,
        false => None,
    };
    Ok(sm90
        .map(FlashKernel::Sm90)
        .into_iter()
        .chain(mma.map(FlashKernel::Mma))
        .chain(wide.map(FlashKernel::Wide))
        .find(|f| f.get().entries(d).is_some()))
}

/// The split-plane kernel for f32 heads of `d` values, where the device has one.
fn flash_split(k: &Kernels, d: usize) -> Result<Option<FlashKernel>> {
    Ok(k.optional::<flash_attention::Entries>()?
        .map(FlashKernel::MmaSplit)
        .filter(|f| f.get().entries(d).is_some()))
}

/// The name of the tensor-core kernel `run` uses for bf16 heads of `d` values, if any.
pub fn flash_kernel_name(k: &Kernels, portable: bool, d: usize) -> Result<Option<&'static str>> {
    Ok(flash_bf16(k, portable, d)?.map(|f| f.get().name))
}

/// Whether `run` can take f32 q, k and v of heads of `d` values as split planes
/// (`Inputs::SplitPlanes`) on this device.
pub fn splits(k: &Kernels, d: usize) -> Result<bool> {
    Ok(flash_split(k, d)?.is_some())
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

/// The keys each query sees, as `sparse_attention.cu` sets sparse attention's selection or
/// `SeqLayout::visible_mask` a layout's branches: `words` u32 a query row, bit p of a row set
/// where the query sees the key at row p of its sequence.
#[derive(Clone, Copy, Debug)]
pub struct KeyMask {
    pub ptr: u64,
    pub words: usize,
}

/// `types` is (q, k and v, out); `key_mask` hides the keys a query does not keep.
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
    key_mask: Option<KeyMask>,
) -> Result<()> {
    // Null pointers: no sinks, no key mask.
    let sinks = sinks.unwrap_or(0);
    let (mask, words) = match key_mask {
        Some(m) => (m.ptr, i32_arg(m.words, "key mask words")?),
        None => (0, 0),
    };
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
        Inputs::Act(Dt::Bf16) => (flash_bf16(k, portable, d)?, Dt::Bf16),
        Inputs::Act(Dt::F32) => (None, Dt::F32),
        Inputs::SplitPlanes { .. } => match flash_split(k, d)? {
            Some(f) => (Some(f), Dt::Bf16),
            None => {
                return Err(Error::backend(
                    "cuda",
                    format!("no split-plane attention for heads of {d} on this device"),
                ));
            }
        },
    };
    if let Some(flash) = &flash {
        let kernel = flash.get();
        let f = kernel
            .entries(d)
            .expect("chosen for its entries of this head size")
            .get(types.1);
        let scale_log2 = (std::f64::consts::LOG2_E * shape.scale as f64) as f32;
        let q_tiles = tokens.div_ceil(kernel.operands.rows());
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
        b.arg(&softcap)
            .arg(&window)
            .arg(&sinks)
            .arg(&mask)
            .arg(&words);
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
    let entries = k.get::<Entries>()?;
    if d > entries.1 {
        return Err(Error::unsupported(
            "attention",
            "shape",
            format!(
                "heads of {d} values need {} bytes of shared memory on the CUDA cores; this \
                 device allows {} (heads up to {})",
                cuda_core_smem(d),
                cuda_core_smem(entries.1),
                entries.1
            ),
        ));
    }
    let f = entries.0.get(in_dt, types.1);
    let smem = cuda_core_smem(d);
    let mut b = s.launch_builder(f);
    b.arg(&out).arg(&q).arg(&kk).arg(&v).arg(&seq_start);
    b.arg(&t).arg(&h).arg(&kvh).arg(&dd).arg(&shape.scale);
    b.arg(&softcap)
        .arg(&window)
        .arg(&sinks)
        .arg(&mask)
        .arg(&words);
    let cfg = LaunchConfig {
        grid_dim: (tokens.div_ceil(WARPS * ROWS) as u32, shape.heads as u32, 1),
        block_dim: ((WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    launch(b, cfg, "attention")
}
