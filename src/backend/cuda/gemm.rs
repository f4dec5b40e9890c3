//! cuBLAS GEMM: bf16 operands on the tensor cores, f32 accumulation (CUBLAS_COMPUTE_32F).

use std::ffi::c_void;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};

use crate::{Error, Result};

/// `y[rows, n_out] = x[rows, n_in] · w[n_out, n_in]^T`, all row-major, `y` bf16 or f32 with
/// row stride `ldy`. In cuBLAS's column-major terms this is `y^T = w · x^T` with `w` read
/// transposed.
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
    y_f32: bool,
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
    let c_type = if y_f32 {
        cudaDataType_t::CUDA_R_32F
    } else {
        cudaDataType_t::CUDA_R_16BF
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
            cudaDataType_t::CUDA_R_16BF,
            k,
            x as *const c_void,
            cudaDataType_t::CUDA_R_16BF,
            k,
            &beta as *const f32 as *const c_void,
            y as *mut c_void,
            c_type,
            ldc,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| Error::backend("cuda", format!("cublasGemmEx {n}x{m}x{k}: {e:?}")))
}
