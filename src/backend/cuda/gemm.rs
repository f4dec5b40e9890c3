//! cuBLAS GEMM: bf16 operands on the tensor cores with f32 accumulation (CUBLAS_COMPUTE_32F),
//! or f32 operands in full f32 (CUBLAS_COMPUTE_32F_PEDANTIC: no TF32, no reduced-precision
//! reductions), the precision of the f32 activation path; all in one layout (`gemm_tn`), which
//! `gemm8`'s INT8 products share.

use std::ffi::c_void;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};

use super::kernels::Dt;
use crate::{Error, Result};

/// One product `y[rows, n_out] = x[rows, n_in] · w[n_out, n_in]^T`, all row-major, at device
/// addresses, `y` of row stride `ldy`.
#[derive(Clone, Copy, Debug)]
pub struct Product {
    pub x: u64,
    pub w: u64,
    pub y: u64,
    pub rows: usize,
    pub n_in: usize,
    pub n_out: usize,
    pub ldy: usize,
    /// `w`'s values are all bf16: a split GEMM needs no residual of it (and finds it held
    /// as bf16, `CudaBackend::weight_dt`).
    pub w_bf16_values: bool,
    /// How `split_gemm.cu` reads `w`, where it runs.
    pub w_f16: Option<F16Weight>,
    /// `x` already split for `split_gemm.cu` (shared by the linears reading it).
    pub x_f16: Option<F16Rows>,
}

/// A weight as `split_gemm.cu` reads it (`--dtype f32-grade` on Hopper).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum F16Weight {
    /// Its values are bf16, each exact in f16 times this power of two
    /// (`LoweredWeight::f16_exact_scale`): one plane, one launch.
    Scaled(f32),
    /// The same, already f16 times this power of two (dequantized straight to it): one
    /// plane, one launch, no conversion.
    ScaledF16(f32),
    /// Any other values (held in f32): two f16 planes, each row scaled by its own power of
    /// two (`split_rows_f16.cu`), one launch each.
    Planes,
}

/// An f32 matrix as `split_rows_f16.cu` leaves it: f16 planes `hi` and `lo`, and each row's
/// power of two back, `undo`.
#[derive(Clone, Copy, Debug)]
pub struct F16Rows {
    pub hi: u64,
    pub lo: u64,
    pub undo: u64,
}

/// Runs `p` with `x` and `w` of type `in_dt` and `y` of type `out_dt` (f32 operands give an
/// f32 `y`). In cuBLAS's column-major terms this is `y^T = w · x^T` with `w` read transposed.
pub fn xwt(blas: &CudaBlas, p: Product, types: (Dt, Dt)) -> Result<()> {
    xwt_strided(blas, p, (p.n_in, false), types)
}

/// `xwt` with `x`'s and `w`'s rows `ld_in` apart (the first `n_in` of each read), adding to
/// `y` where `accumulate` says so.
pub fn xwt_strided(
    blas: &CudaBlas,
    p: Product,
    (ld_in, accumulate): (usize, bool),
    (in_dt, out_dt): (Dt, Dt),
) -> Result<()> {
    let Product {
        x,
        w,
        y,
        rows,
        n_in,
        n_out,
        ldy,
        ..
    } = p;
    let beta = if accumulate { 1.0f32 } else { 0.0 };
    let ty = |dt| match dt {
        Dt::F32 => cudaDataType_t::CUDA_R_32F,
        Dt::Bf16 => cudaDataType_t::CUDA_R_16BF,
    };
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
    let types = (ty(in_dt), ty(out_dt), compute);
    let dims = [rows, n_in, n_out, ld_in, ldy];
    gemm_tn(blas, (w, x, y), dims, types, Scalars::F32(1.0, beta))
}

/// `alpha` and `beta` of a `cublasGemmEx` call, in its compute type's scale type.
#[derive(Clone, Copy, Debug)]
pub enum Scalars {
    F32(f32, f32),
    I32(i32, i32),
}

/// `cublasGemmEx` in the layout of every product here: `y[rows, n_out] = x[rows, n_in] ·
/// w[n_out, n_in]^T` row-major, which in cuBLAS's column-major terms is `y^T = w · x^T` with
/// `w` read transposed; `w`'s and `x`'s rows `ld_in` apart, `y`'s `ldy`.
pub fn gemm_tn(
    blas: &CudaBlas,
    (w, x, y): (u64, u64, u64),
    [rows, n_in, n_out, ld_in, ldy]: [usize; 5],
    (ab_type, c_type, compute): (cudaDataType_t, cudaDataType_t, cublasComputeType_t),
    scalars: Scalars,
) -> Result<()> {
    let dim = |v: usize, what: &str| {
        i32::try_from(v)
            .map_err(|_| Error::backend("cuda", format!("GEMM {what} = {v} exceeds i32")))
    };
    let (m, n, k, ldc, ld_in) = (
        dim(n_out, "n_out")?,
        dim(rows, "rows")?,
        dim(n_in, "n_in")?,
        dim(ldy, "ldy")?,
        dim(ld_in, "ld_in")?,
    );
    let (f, i);
    let (alpha, beta): (*const c_void, *const c_void) = match scalars {
        Scalars::F32(a, b) => {
            f = [a, b];
            (&f[0] as *const f32 as _, &f[1] as *const f32 as _)
        }
        Scalars::I32(a, b) => {
            i = [a, b];
            (&i[0] as *const i32 as _, &i[1] as *const i32 as _)
        }
    };
    // SAFETY: the backend passes live device buffers of at least these extents; alpha and
    // beta are host scalars of the compute type's scale type, alive for the call.
    unsafe {
        cudarc::cublas::result::gemm_ex(
            *blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            m,
            n,
            k,
            alpha,
            w as *const c_void,
            ab_type,
            ld_in,
            x as *const c_void,
            ab_type,
            ld_in,
            beta,
            y as *mut c_void,
            c_type,
            ldc,
            compute,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| {
        Error::backend(
            "cuda",
            format!("cublasGemmEx {n}x{m}x{k} {ab_type:?}: {e:?}"),
        )
    })
}

/// Several `xwt`s of one input width in one cuBLAS call (`cublasGemmGroupedBatchedEx`), all
/// bf16 with f32 accumulation: problem `i` of `(rows, n_out)` is
/// `y_i[rows, n_out] = x_i[rows, n_in] · w_i^T`, `y_i` of row stride `ldy`. `ptrs` is a device
/// array of `3 * problems.len()` addresses: every `w_i`, then every `x_i`, then every `y_i`.
pub fn grouped_xwt(
    blas: &CudaBlas,
    ptrs: u64,
    problems: &[(usize, usize)],
    n_in: usize,
    ldy: usize,
) -> Result<()> {
    let dim = |v: usize, what: &str| {
        i32::try_from(v)
            .map_err(|_| Error::backend("cuda", format!("grouped GEMM {what} = {v} exceeds i32")))
    };
    let count = problems.len();
    if count == 0 {
        return Ok(());
    }
    let n: Vec<i32> = problems
        .iter()
        .map(|&(r, _)| dim(r, "rows"))
        .collect::<Result<_>>()?;
    let m: Vec<i32> = problems
        .iter()
        .map(|&(_, n_out)| dim(n_out, "n_out"))
        .collect::<Result<_>>()?;
    let (k, ldc) = (
        vec![dim(n_in, "n_in")?; count],
        vec![dim(ldy, "ldy")?; count],
    );
    let (ta, tb) = (
        vec![cublasOperation_t::CUBLAS_OP_T; count],
        vec![cublasOperation_t::CUBLAS_OP_N; count],
    );
    let (alpha, beta, ones) = (vec![1.0f32; count], vec![0.0f32; count], vec![1i32; count]);
    let bf16 = cudaDataType_t::CUDA_R_16BF;
    let (w, x, y) = (ptrs, ptrs + 8 * count as u64, ptrs + 16 * count as u64);
    // SAFETY: the host arrays hold `count` entries each; `ptrs` is a live device array of
    // 3 * count addresses of buffers of at least these extents (the backend's arena and
    // activations); alpha and beta are f32 as CUBLAS_COMPUTE_32F wants.
    unsafe {
        cudarc::cublas::sys::cublasGemmGroupedBatchedEx(
            *blas.handle(),
            ta.as_ptr(),
            tb.as_ptr(),
            m.as_ptr(),
            n.as_ptr(),
            k.as_ptr(),
            alpha.as_ptr() as *const c_void,
            w as *const *const c_void,
            bf16,
            k.as_ptr(),
            x as *const *const c_void,
            bf16,
            k.as_ptr(),
            beta.as_ptr() as *const c_void,
            y as *const *mut c_void,
            bf16,
            ldc.as_ptr(),
            dim(count, "problems")?,
            ones.as_ptr(),
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
        )
        .result()
    }
    .map_err(|e| {
        Error::backend(
            "cuda",
            format!("cublasGemmGroupedBatchedEx of {count} problems of width {n_in}: {e:?}"),
        )
    })
}
