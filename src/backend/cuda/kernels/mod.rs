//! One launcher per `shaders/cuda/*.cu` file, in the file of the same name: it declares its
//! source (`cuda_source!`), its entry points (a `Module`, loaded on first use) and its launch.
//! Launchers take raw device addresses (`u64`, offsets already applied) so callers can pass
//! row ranges of a buffer; the backend owns every buffer and keeps it alive until the stream
//! has used it.

pub mod act_quant;
pub mod attention;
pub mod causal_conv;
pub mod combine_experts;
pub mod compressed_keys;
pub mod copy_columns;
pub mod dequant;
pub mod elementwise;
pub mod expert_down;
pub mod expert_gate_up;
pub mod expert_tiles;
pub mod flash_attention;
pub mod flash_attention_sm90;
pub mod flash_attention_wide;
pub mod gated_rms_norm;
pub mod gather_rows;
pub mod gemm_epilogue;
pub mod hyper_weights;
pub mod index_scores_mma;
pub mod index_top_k;
pub mod int8_residual;
pub mod layer_norm;
pub mod linear_recurrence;
pub mod listed_attention;
pub mod lm_head_lse;
pub mod mix_streams;
pub mod nll;
pub mod pool_windows;
pub mod qk_norm_rope;
pub mod rms_norm;
pub mod rope;
pub mod route;
pub mod scatter_add;
pub mod softcap;
pub mod sparse_attention;
pub mod split_bf16;
pub mod split_columns_f16;
pub mod split_gemm;
pub mod split_rows_f16;
pub mod spread_rows;
pub mod weight_f16;

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{
    self, CUfunction_attribute, CUtensorMapDataType, CUtensorMapFloatOOBfill,
    CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, LaunchArgs, LaunchConfig,
};

pub use super::nvrtc::Source;
use super::nvrtc::{self, Flags};
use crate::{Error, Result};

/// Threads per block of the elementwise and per-row kernels.
const THREADS: u32 = 256;

/// The `Source` of `shaders/cuda/<name>.cu`.
macro_rules! cuda_source {
    ($name:literal) => {
        $crate::backend::cuda::kernels::Source {
            name: $name,
            code: include_str!(concat!("../../../../shaders/cuda/", $name, ".cu")),
        }
    };
}
pub(crate) use cuda_source;

/// The entry points of one kernel source, as its launcher wants them.
pub trait Module: Sized + Send + Sync + 'static {
    const SOURCE: Source<'static>;

    /// The entry points from the compiled module; `None` where the device cannot run the
    /// kernel (its shared memory).
    fn load(l: &Loader) -> Result<Option<Self>>;
}

/// A compiled source and the device facts a module's loading needs.
pub struct Loader<'a> {
    module: Arc<CudaModule>,
    pub ctx: &'a Arc<CudaContext>,
    /// The device's per-block opt-in shared memory limit.
    pub max_smem: usize,
    /// The device's compute capability.
    pub cc: (i32, i32),
}

impl Loader<'_> {
    pub fn func(&self, name: &str) -> Result<CudaFunction> {
        self.module
            .load_function(name)
            .map_err(|e| Error::backend("cuda", format!("kernel {name}: {e:?}")))
    }

    /// `<name>_bf16` and `<name>_f32`.
    pub fn typed(&self, name: &str) -> Result<Typed> {
        Ok(Typed {
            bf16: self.func(&format!("{name}_bf16"))?,
            f32: self.func(&format!("{name}_f32"))?,
        })
    }

    /// `<name>_<in>_<out>` for the four type pairs.
    pub fn in_out(&self, name: &str) -> Result<InOut> {
        let f = |i: Dt, o: Dt| self.func(&format!("{name}_{}_{}", i.name(), o.name()));
        Ok(InOut {
            fns: [
                [f(Dt::Bf16, Dt::Bf16)?, f(Dt::Bf16, Dt::F32)?],
                [f(Dt::F32, Dt::Bf16)?, f(Dt::F32, Dt::F32)?],
            ],
        })
    }
}

/// A module loaded on this device, or `None` where the device cannot run it.
type Loaded = Option<Arc<dyn Any + Send + Sync>>;

/// One device's kernels, each source compiled for its architecture (or taken from the PTX
/// cache) when a launcher first asks for it.
pub struct Kernels {
    ctx: Arc<CudaContext>,
    cc: (i32, i32),
    /// `BackendOptions::cuda_sources`: a folder whose files replace the built-in sources.
    sources: Option<PathBuf>,
    max_smem: usize,
    loaded: Mutex<HashMap<TypeId, Loaded>>,
}

impl Kernels {
    pub fn new(ctx: &Arc<CudaContext>, cc: (i32, i32), sources: Option<PathBuf>) -> Result<Self> {
        let max_smem = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(|e| Error::backend("cuda", format!("shared memory per block: {e:?}")))?
            as usize;
        Ok(Self {
            ctx: ctx.clone(),
            cc,
            sources,
            max_smem,
            loaded: Mutex::new(HashMap::new()),
        })
    }

    /// Module `M`, loaded on first use; `None` where this device cannot run it (a source for
    /// another architecture, or too little shared memory).
    pub fn optional<M: Module>(&self) -> Result<Option<Arc<M>>> {
        let mut loaded = self
            .loaded
            .lock()
            .map_err(|_| Error::backend("cuda", "kernel table lock poisoned"))?;
        let entry = match loaded.get(&TypeId::of::<M>()) {
            Some(entry) => entry.clone(),
            None => {
                let entry = self.load::<M>()?.map(|m| Arc::new(m) as _);
                loaded.insert(TypeId::of::<M>(), entry.clone());
                entry
            }
        };
        Ok(entry.map(|m| m.downcast::<M>().expect("the type id's own module")))
    }

    /// Module `M`, which this device must be able to run.
    pub fn get<M: Module>(&self) -> Result<Arc<M>> {
        self.optional::<M>()?.ok_or_else(|| {
            Error::backend(
                "cuda",
                format!(
                    "{}.cu does not run on compute capability {}.{}",
                    M::SOURCE.name,
                    self.cc.0,
                    self.cc.1
                ),
            )
        })
    }

    fn load<M: Module>(&self) -> Result<Option<M>> {
        let src = M::SOURCE;
        if !Flags::parse(src.name, src.code)?.compiles_for(self.cc) {
            return Ok(None);
        }
        let module = nvrtc::load(&self.ctx, src, self.cc, self.sources.as_deref())?;
        M::load(&Loader {
            module,
            ctx: &self.ctx,
            max_smem: self.max_smem,
            cc: self.cc,
        })
    }
}

/// Whether kernel source `code` (the file `name`.cu) is for compute capability `cc` (its
/// `// nvrtc:` lines).
pub fn is_for(name: &str, code: &str, cc: (i32, i32)) -> Result<bool> {
    Ok(Flags::parse(name, code)?.compiles_for(cc))
}

/// Compiles kernel source `code` (the file `name`.cu) for compute capability `cc` with NVRTC,
/// without a device or cache.
pub fn compile(name: &str, code: &str, cc: (i32, i32)) -> Result<()> {
    nvrtc::compile(Source { name, code }, cc).map(drop)
}

/// Element type of a device tensor: activations are bf16 or f32; parameter vectors and the
/// residual stream are f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dt {
    Bf16 = 0,
    F32 = 1,
}

impl Dt {
    pub fn bytes(self) -> usize {
        match self {
            Dt::Bf16 => 2,
            Dt::F32 => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dt::Bf16 => "bf16",
            Dt::F32 => "f32",
        }
    }
}

/// A kernel with one entry point per activation type (`<name>_bf16`, `<name>_f32`).
pub struct Typed {
    pub bf16: CudaFunction,
    pub f32: CudaFunction,
}

impl Typed {
    pub fn get(&self, dt: Dt) -> &CudaFunction {
        match dt {
            Dt::Bf16 => &self.bf16,
            Dt::F32 => &self.f32,
        }
    }
}

/// A kernel with one entry point per (input, output) type pair (`<name>_<in>_<out>`): the ops
/// whose output may feed a linear that quantizes its input (which then wants it in f32), and
/// the row gather that widens the embedding into the f32 residual stream.
pub struct InOut {
    /// Indexed `[input][output]`, bf16 first.
    fns: [[CudaFunction; 2]; 2],
}

impl InOut {
    pub fn get(&self, input: Dt, output: Dt) -> &CudaFunction {
        &self.fns[input as usize][output as usize]
    }

    fn all(&self) -> impl Iterator<Item = &CudaFunction> {
        self.fns.iter().flatten()
    }
}

/// The device's multiprocessors: a persistent kernel's blocks.
pub fn multiprocessors(ctx: &Arc<CudaContext>) -> Result<usize> {
    let n = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| Error::backend("cuda", format!("multiprocessor count: {e:?}")))?;
    Ok(n.max(1) as usize)
}

/// Allows entry `f` (named `name` in the error) `bytes` of dynamic shared memory, once at
/// load rather than at every launch.
fn set_smem(f: &CudaFunction, bytes: usize, name: &str) -> Result<()> {
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        bytes as i32,
    )
    .map_err(|e| Error::backend("cuda", format!("{name} shared memory {bytes}: {e:?}")))
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

/// A `CUtensorMap`, passed by value as a kernel's `__grid_constant__ TensorMap`
/// (hopper.cuh).
#[repr(C, align(64))]
pub struct TensorMap(sys::CUtensorMap);

// SAFETY: a plain 128-byte value, the layout of the kernels' TensorMap parameter.
unsafe impl DeviceRepr for TensorMap {}

/// The tensor map of a row-major bf16 matrix of `rows` x `width` at `ptr`, read in boxes of
/// `boxes` (columns, rows) with 128-byte swizzling; rows past the end arrive as zeros.
fn tensor_map(
    ptr: u64,
    width: usize,
    rows: usize,
    boxes: [u32; 2],
    what: &str,
) -> Result<TensorMap> {
    tensor_map_ld(ptr, [width, width], rows, boxes, what)
}

/// `tensor_map` of rows `ld` values apart (a multiple of 8: TMA wants 16-byte rows), of which
/// the first `width` are read; columns past `width` arrive as zeros too.
fn tensor_map_ld(
    ptr: u64,
    [width, ld]: [usize; 2],
    rows: usize,
    boxes: [u32; 2],
    what: &str,
) -> Result<TensorMap> {
    let dims = [width as u64, rows as u64];
    let row_bytes = [ld as u64 * 2];
    let steps = [1u32, 1];
    let mut map = MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every array has the length the rank (2) asks for, and `map` is written before
    // it is read; the driver only records the address, which the caller keeps alive.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            row_bytes.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    r.result().map_err(|e| {
        Error::backend(
            "cuda",
            format!("TMA tensor map of {what} ({rows} x {width} bf16 at {ptr:#x}): {e:?}"),
        )
    })?;
    // SAFETY: written by the successful call above.
    Ok(TensorMap(unsafe { map.assume_init() }))
}
