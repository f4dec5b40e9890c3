//! One launch wrapper per `shaders/cuda/*.cu` file. Wrappers take raw device addresses
//! (`u64`, offsets already applied) so callers can pass row ranges of a buffer; the backend
//! owns every buffer and keeps it alive until the stream has used it.

pub mod act_quant;
pub mod attention;
pub mod bias_add;
pub mod dequant;
pub mod elementwise;
pub mod gather_rows;
pub mod nll;
pub mod rms_norm;
pub mod rope;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchArgs, LaunchConfig};

use super::nvrtc::{self, Source};
use crate::{Error, Result};

/// Threads per block of the elementwise and per-row kernels.
const THREADS: u32 = 256;

macro_rules! source {
    ($name:literal, $exact:expr) => {
        Source {
            name: $name,
            code: include_str!(concat!("../../../../shaders/cuda/", $name, ".cu")),
            exact: $exact,
        }
    };
}

/// Every kernel function, loaded once per device.
pub struct Kernels {
    pub dequant_int: CudaFunction,
    pub dequant_nvfp4: CudaFunction,
    pub dequant_unpacked: CudaFunction,
    pub act_quant: CudaFunction,
    pub bias_add: CudaFunction,
    pub rms_norm: CudaFunction,
    pub rms_norm_f32in: CudaFunction,
    pub rope: CudaFunction,
    pub add_assign: CudaFunction,
    pub add_assign_f32: CudaFunction,
    pub silu_mul: CudaFunction,
    pub to_bf16: CudaFunction,
    pub gather_rows: CudaFunction,
    pub gather_rows_f32: CudaFunction,
    pub attention: CudaFunction,
    pub lse_tile: CudaFunction,
    pub nll_finish: CudaFunction,
    pub kld_tile: CudaFunction,
}

impl Kernels {
    pub fn load(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> Result<Self> {
        let module = |s: Source| nvrtc::load(ctx, &s, cc);
        let func = |m: &Arc<cudarc::driver::CudaModule>, name: &str| {
            m.load_function(name)
                .map_err(|e| Error::backend("cuda", format!("kernel {name}: {e:?}")))
        };
        let dequant = module(source!("dequant", true))?;
        let act = module(source!("act_quant", true))?;
        let bias = module(source!("bias_add", false))?;
        let norm = module(source!("rms_norm", false))?;
        let rope = module(source!("rope", false))?;
        let elem = module(source!("elementwise", false))?;
        let gather = module(source!("gather_rows", false))?;
        let attn = module(source!("attention", false))?;
        let nll = module(source!("nll", false))?;
        Ok(Self {
            dequant_int: func(&dequant, "dequant_int")?,
            dequant_nvfp4: func(&dequant, "dequant_nvfp4")?,
            dequant_unpacked: func(&dequant, "dequant_unpacked")?,
            act_quant: func(&act, "act_quant")?,
            bias_add: func(&bias, "bias_add")?,
            rms_norm: func(&norm, "rms_norm")?,
            rms_norm_f32in: func(&norm, "rms_norm_f32in")?,
            rope: func(&rope, "rope")?,
            add_assign: func(&elem, "add_assign")?,
            add_assign_f32: func(&elem, "add_assign_f32")?,
            silu_mul: func(&elem, "silu_mul")?,
            to_bf16: func(&elem, "to_bf16")?,
            gather_rows: func(&gather, "gather_rows")?,
            gather_rows_f32: func(&gather, "gather_rows_f32")?,
            attention: func(&attn, "attention")?,
            lse_tile: func(&nll, "lse_tile")?,
            nll_finish: func(&nll, "nll_finish")?,
            kld_tile: func(&nll, "kld_tile")?,
        })
    }
}

/// One thread per element.
fn elementwise(n: usize) -> Result<LaunchConfig> {
    let blocks = n.div_ceil(THREADS as usize);
    if blocks > i32::MAX as usize {
        return Err(Error::backend(
            "cuda",
            format!("{n} elements is too many for one launch"),
        ));
    }
    Ok(LaunchConfig {
        grid_dim: (blocks.max(1) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// One block per row.
fn per_row(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.max(1) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches a built argument list, naming the kernel in the error.
fn launch(mut args: LaunchArgs, cfg: LaunchConfig, name: &str) -> Result<()> {
    // SAFETY: every wrapper pushes exactly the arguments of its kernel's C signature, and the
    // addresses come from live buffers of the right size (checked by the backend).
    unsafe { args.launch(cfg) }
        .map(|_| ())
        .map_err(|e| Error::backend("cuda", format!("launching {name}: {e:?}")))
}

/// `i32` kernel argument from a size, refusing what does not fit.
fn i32_arg(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::backend("cuda", format!("{what} = {v} exceeds i32")))
}

pub type Stream = Arc<CudaStream>;
