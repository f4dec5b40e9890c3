//! cuBLAS GEMM: bf16 operands on the tensor cores with f32 accumulation (CUBLAS_COMPUTE_32F),
//! or f32 operands in full f32 (CUBLAS_COMPUTE_32F_PEDANTIC: no TF32, no reduced-precision
//! reductions), the precision of the f32 activation path.

use std::ffi::c_void;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};

use super::kernels::Dt;
use crate::{Error, Result};

/// `y[rows, n_out] = x[rows, n_in] · w[n_out, n_in]^T`, all row-major, `x` and `w` of type
/// `in_dt`, `y` of type `out_dt` with row stride `ldy` (f32 operands give an f32 `y`). In
/// cuBLAS's column-major terms this is `y^T = w · x^T` with `w` read transposed.
#[allow(clippy::too_many_arguments)]
pub fn xwt(
    blas: &CudaBlas,
    x: u64,
    w: u64,
    y: u64,
    rows: usize,
    n_in: usize,
    n_out: usize,
    ldy: usize,
    (in_dt, out_dt): (Dt, Dt),
) -> Result<()> {
    let dim = |v: usize, what: &str| {
        i32::try_from(v)
            .map_err(|_| Error::backend("cuda", format!("GEMM {what} = {v} exceeds i32")))
    };
    let (m, n, k, ldc) = (
        dim(n_out, "n_out")?,
        dim(rows, "rows")?,
        dim(n_in, "n_in")?,
        dim(ldy, "ldy")?,
    );
    let (alpha, beta) = (1.0f32, 0.0f32);
    let ty = |dt| match dt {
        Dt::F32 => cudaDataType_t::CUDA_R_32F,
        Dt::Bf16 => cudaDataType_t::CUDA_R_16BF,
    };
    let (ab_type, c_type) = (ty(in_dt), ty(out_dt));
    let compute = match in_dt {
        Dt::Bf16 => cublasComputeType_t::CUBLAS_COMPUTE_32F,
        Dt::F32 if out_dt == Dt::F32 => cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC,
        Dt::F32 => {
            return Err(Error::backend(
                "cuda",
                "f32 GEMM operands with a bf16 output",
            ));
        }
    };
    // SAFETY: the backend passes live device buffers of at least these extents; alpha and
    // beta are host scalars of the compute type (f32).
    unsafe {
        cudarc::cublas::result::gemm_ex(
            *blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            m,
            n,
            k,
            &alpha as *const f32 as *const c_void,
            w as *const c_void,
            ab_type,
            k,
            x as *const c_void,
            ab_type,
            k,
            &beta as *const f32 as *const c_void,
            y as *mut c_void,
            c_type,
            ldc,
            compute,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| Error::backend("cuda", format!("cublasGemmEx {n}x{m}x{k}: {e:?}")))
}
