//! cuBLAS GEMM: bf16 operands on the tensor cores with f32 accumulation (CUBLAS_COMPUTE_32F),
//! or f32 operands in full f32 (CUBLAS_COMPUTE_32F_PEDANTIC: no TF32, no reduced-precision
//! reductions), the precision of the f32 activation path.

use std::ffi::c_void;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};

use super::CudaBackend;
use super::kernels::Dt;
use crate::backend::Backend;
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

impl CudaBackend {
    /// Measures a square GEMM of `n` in the activation type (random operands: zeros run
    /// faster than real data): TFLOP/s over 10 products after 3 warm-ups.
    pub(super) fn measure_gemm(&self, n: usize) -> Result<f64> {
        let mut state = 0x9E3779B97F4A7C15u64;
        let values: Vec<f32> = (0..n * n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        let bytes = self.act_bytes(&values);
        let (a, b) = (
            self.upload_bytes(&bytes, "GEMM peak operand")?,
            self.upload_bytes(&bytes, "GEMM peak operand")?,
        );
        let c = self.alloc(n * n * self.act.bytes(), "GEMM peak output")?;
        let blas = self.blas()?;
        let run = || {
            xwt(
                &blas,
                a.ptr(),
                b.ptr(),
                c.ptr(),
                n,
                n,
                n,
                n,
                (self.act, self.act),
            )
        };
        for _ in 0..3 {
            run()?;
        }
        Backend::synchronize(self)?;
        let start = std::time::Instant::now();
        for _ in 0..10 {
            run()?;
        }
        Backend::synchronize(self)?;
        Ok(20.0 * (n as f64).powi(3) / start.elapsed().as_secs_f64() / 1e12)
    }
}
