//! The 8-bit tensor-core GEMMs of linears whose checkpoint quantizes both operands to one
//! scale a token and one a channel (FP8 and INT8 W8A8): `y = (x_codes · w_codes^T) * x_scale
//! * w_scale`, or FP8 with a scale per 128x128 weight block and per token and 128 inputs, the
//! products exact on the tensor cores (`eight_bit` says when each runs). FP8 E4M3 runs on
//! cuBLASLt, which applies the scales itself (`OUTER_VEC_32F`, or `BLK128x128_32F` and
//! `VEC128_32F`) and promotes the tensor cores' partial sums to f32 (`FAST_ACCUM` off); INT8
//! runs on cuBLAS into exact int32 sums, scaled afterwards by `gemm_epilogue.cu`.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{cublasComputeType_t, cublasOperation_t, cudaDataType_t};
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys::{
    self as lt_sys, cublasLtMatmulDescAttributes_t as Desc, cublasLtMatmulMatrixScale_t,
    cublasLtMatmulPreferenceAttributes_t as Pref,
};

use super::gemm::{Scalars, gemm_tn};
use super::kernels::Dt;
use super::memory::DevBuf;
use crate::{Error, Result};

/// cuBLASLt's workspace: what its Hopper FP8 kernels ask for at most.
pub const LT_WORKSPACE: usize = 32 << 20;

/// FP8 plans kept at most (an eval batch needs a few a linear shape).
const MAX_FP8_PLANS: usize = 1024;

/// Which tensor cores a linear's 8-bit operands run on, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EightBit {
    /// FP8 E4M3 codes (sm_89 and later), `code * scale` unrounded.
    Fp8,
    /// FP8 E4M3 codes with 128x128 weight-block and 1x128 input-group scales (Hopper).
    Fp8Blocks,
    /// Two's-complement INT8 codes (sm_75 and later), `code * scale` unrounded.
    Int8,
    /// INT8 codes and their residual codes: the reference's bf16-rounded weights exactly.
    Int8Exact,
}

/// How an FP8 product's scales apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scaling {
    /// `x_scale[row]`, `w_scale[col]`.
    Outer,
    /// `x_scale[group * rows + row]` per 128 inputs, and `w_scale[block_row * ld + block_col]`
    /// per 128x128 weight block with `ld` the block columns rounded up to 4 (cuBLASLt's
    /// layouts for `VEC128_32F` and `BLK128x128_32F`).
    Blocks128,
}

/// One product `y[rows, n_out] = (x[rows, n_in] · w[n_out, n_in]^T)` scaled as `scaling`
/// says, all row-major at device addresses; `x`, `w` one 8-bit code a value, the scales f32,
/// `y` of `out_dt`.
#[derive(Clone, Copy, Debug)]
pub struct Product8 {
    pub x: u64,
    pub x_scale: u64,
    pub w: u64,
    pub w_scale: u64,
    pub y: u64,
    pub rows: usize,
    pub n_in: usize,
    pub n_out: usize,
    pub out_dt: Dt,
    pub scaling: Scaling,
}

/// A cuBLASLt handle, its workspace on one stream, and its FP8 plans by shape (a plan's
/// descriptors and heuristic cost tens of microseconds, a layer's products reuse them).
pub struct Lt {
    handle: lt_sys::cublasLtHandle_t,
    workspace: DevBuf,
    fp8_plans: HashMap<(usize, usize, usize, Dt, Scaling), Fp8Plan>,
}

// SAFETY: the handle is used under the backend's lock only, one thread at a time, as cuBLASLt
// allows for a handle.
unsafe impl Send for Lt {}

impl Lt {
    pub fn new(workspace: DevBuf) -> Result<Self> {
        let handle = lt::create_handle().map_err(|e| lt_err("cublasLtCreate", e))?;
        Ok(Self {
            handle,
            workspace,
            fp8_plans: HashMap::new(),
        })
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // The plans' descriptors go before the handle they were made for.
        self.fp8_plans.clear();
        // SAFETY: created by `new`, destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

fn lt_err(what: &str, e: lt::CublasError) -> Error {
    Error::backend("cuda", format!("{what}: {e:?}"))
}

/// Descriptors destroyed when dropped.
struct Descriptors {
    desc: lt_sys::cublasLtMatmulDesc_t,
    layouts: Vec<lt_sys::cublasLtMatrixLayout_t>,
    pref: Option<lt_sys::cublasLtMatmulPreference_t>,
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each was created once below and is destroyed once, after the matmul call
        // that read them has been queued (cuBLASLt copies what it needs at the call).
        unsafe {
            let _ = lt::destroy_matmul_desc(self.desc);
            for l in &self.layouts {
                let _ = lt::destroy_matrix_layout(*l);
            }
            if let Some(p) = self.pref {
                let _ = lt::destroy_matmul_pref(p);
            }
        }
    }
}

/// Sets descriptor attribute `attr` to `value`.
///
/// # Safety
/// `desc` is live and `T` is the attribute's type.
unsafe fn set<T>(desc: lt_sys::cublasLtMatmulDesc_t, attr: Desc, value: &T) -> Result<()> {
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            value as *const T as *const c_void,
            size_of::<T>(),
        )
    }
    .map_err(|e| lt_err(&format!("cublasLtMatmulDescSetAttribute {attr:?}"), e))
}

/// Points `desc`'s scale vectors at `p`'s.
///
/// # Safety
/// `desc` is live.
unsafe fn set_scale_pointers(desc: lt_sys::cublasLtMatmulDesc_t, p: &Product8) -> Result<()> {
    unsafe {
        set(
            desc,
            Desc::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
            &(p.w_scale as *const c_void),
        )?;
        set(
            desc,
            Desc::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
            &(p.x_scale as *const c_void),
        )
    }
}

/// An FP8 product's descriptors and the kernel cuBLASLt chose for it.
struct Fp8Plan {
    d: Descriptors,
    algo: lt_sys::cublasLtMatmulAlgo_t,
}

/// Plans `p` with FP8 E4M3 codes on cuBLASLt; `None` where cuBLASLt has no kernel for it (a
/// GPU or library without its FP8 scaling). cuBLASLt checks the scale
/// pointers here (null ones are an invalid value), so `p` holds the real ones. In cuBLASLt's column-major
/// terms `y^T[n_out, rows] = w · x^T`: A is `w` read transposed (the "TN" layout FP8 requires),
/// its scale vector over A's rows (the channels), B's over its columns (the tokens).
fn plan_fp8(lt_handle: &Lt, p: &Product8) -> Result<Option<Fp8Plan>> {
    let out_type = match p.out_dt {
        Dt::Bf16 => lt_sys::cudaDataType::CUDA_R_16BF,
        Dt::F32 => lt_sys::cudaDataType::CUDA_R_32F,
    };
    let fp8 = lt_sys::cudaDataType::CUDA_R_8F_E4M3;
    let desc = lt::create_matmul_desc(
        lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        lt_sys::cudaDataType::CUDA_R_32F,
    )
    .map_err(|e| lt_err("cublasLtMatmulDescCreate", e))?;
    let mut d = Descriptors {
        desc,
        layouts: Vec::new(),
        pref: None,
    };
    for (rows, cols, ty) in [
        (p.n_in, p.n_out, fp8),
        (p.n_in, p.rows, fp8),
        (p.n_out, p.rows, out_type),
    ] {
        let l = lt::create_matrix_layout(ty, rows as u64, cols as u64, rows as i64)
            .map_err(|e| lt_err("cublasLtMatrixLayoutCreate", e))?;
        d.layouts.push(l);
    }
    use cublasLtMatmulMatrixScale_t as Mode;
    let (a_mode, b_mode) = match p.scaling {
        Scaling::Outer => (
            Mode::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
            Mode::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
        ),
        Scaling::Blocks128 => (
            Mode::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
            Mode::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
        ),
    };
    // SAFETY: `desc` is live; each value has its attribute's type (int32 enums, int8 flag,
    // device pointers).
    unsafe {
        let (t, n) = (
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
        );
        set(desc, Desc::CUBLASLT_MATMUL_DESC_TRANSA, &(t as i32))?;
        set(desc, Desc::CUBLASLT_MATMUL_DESC_TRANSB, &(n as i32))?;
        set(desc, Desc::CUBLASLT_MATMUL_DESC_FAST_ACCUM, &0i8)?;
        set(
            desc,
            Desc::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
            &(a_mode as i32),
        )?;
        set(
            desc,
            Desc::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
            &(b_mode as i32),
        )?;
        set_scale_pointers(desc, p)?;
    }
    let pref = lt::create_matmul_pref().map_err(|e| lt_err("cublasLtMatmulPreferenceCreate", e))?;
    d.pref = Some(pref);
    let room = lt_handle.workspace.len();
    let (a, b, c) = (d.layouts[0], d.layouts[1], d.layouts[2]);
    // SAFETY: all descriptors are live; the attribute is a size_t.
    let heuristic = unsafe {
        lt::set_matmul_pref_attribute(
            pref,
            Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &room as *const usize as *const c_void,
            size_of::<usize>(),
        )
        .map_err(|e| lt_err("cublasLtMatmulPreferenceSetAttribute", e))?;
        lt::get_matmul_algo_heuristic(lt_handle.handle, desc, a, b, c, c, pref)
    };
    match heuristic {
        Ok(h) => Ok(Some(Fp8Plan { d, algo: h.algo })),
        Err(lt::CublasError(lt_sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED)) => Ok(None),
        Err(e) => Err(lt_err("cublasLtMatmulAlgoGetHeuristic (FP8)", e)),
    }
}

/// `p` with FP8 E4M3 codes on cuBLASLt, queued on `stream`.
pub fn fp8_xwt(lt_handle: &mut Lt, stream: lt_sys::cudaStream_t, p: Product8) -> Result<()> {
    let shape = || format!("{}x{}x{}", p.rows, p.n_out, p.n_in);
    let key = (p.rows, p.n_in, p.n_out, p.out_dt, p.scaling);
    if !lt_handle.fp8_plans.contains_key(&key) {
        let plan = plan_fp8(lt_handle, &p)?.ok_or_else(|| {
            Error::backend("cuda", format!("no cuBLASLt FP8 kernel for {}", shape()))
        })?;
        // Bounded: a server sees a new token count with every request.
        if lt_handle.fp8_plans.len() >= MAX_FP8_PLANS {
            lt_handle.fp8_plans.clear();
        }
        lt_handle.fp8_plans.insert(key, plan);
    }
    let plan = &lt_handle.fp8_plans[&key];
    // SAFETY: the plan's descriptor is live; a previous call that read its pointers has been
    // queued (cuBLASLt reads a descriptor at the call, not when the kernel runs).
    unsafe { set_scale_pointers(plan.d.desc, &p)? };
    let (a, b, c) = (plan.d.layouts[0], plan.d.layouts[1], plan.d.layouts[2]);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let room = lt_handle.workspace.len();
    // SAFETY: the caller passes live device buffers of these extents on `stream`, the scale
    // vectors f32 of n_out and rows entries; alpha and beta are host f32 (the scale type);
    // the workspace is this handle's, used by one call at a time on its stream.
    unsafe {
        lt::matmul(
            lt_handle.handle,
            plan.d.desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            p.w as *const c_void,
            a,
            p.x as *const c_void,
            b,
            p.y as *const c_void,
            c,
            p.y as *mut c_void,
            c,
            &plan.algo,
            lt_handle.workspace.ptr() as *mut c_void,
            room,
            stream,
        )
    }
    .map_err(|e| lt_err(&format!("cublasLtMatmul FP8 {}", shape()), e))
}

/// `x[rows, n_in] · w[n_out, n_in]^T` of INT8 codes into the exact int32 sums `y[rows,
/// n_out]` on cuBLAS (CUBLAS_COMPUTE_32I: integer tensor cores, no rounding anywhere).
pub fn int8_xwt(
    blas: &CudaBlas,
    (x, w, y): (u64, u64, u64),
    rows: usize,
    n_in: usize,
    n_out: usize,
) -> Result<()> {
    let types = (
        cudaDataType_t::CUDA_R_8I,
        cudaDataType_t::CUDA_R_32I,
        cublasComputeType_t::CUBLAS_COMPUTE_32I,
    );
    let dims = [rows, n_in, n_out, n_in, n_out];
    gemm_tn(blas, (w, x, y), dims, types, Scalars::I32(1, 0))
}
