//! `spread_rows.cu`: each token's row written to the places routing gave its picks.

use cudarc::driver::PushKernelArg;

use super::{
    Kernels, Loader, Module, Source, Stream, Typed, cuda_source, elementwise, i32_arg, launch,
};
use crate::backend::cuda::CudaTensor;
use crate::{Error, Result};

/// `spread_rows.cu`'s entry points.
struct Entries(Typed);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("spread_rows");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.typed("spread_rows")?)))
    }
}

/// Row `t` of `x` (`[tokens, cols]`) into rows `slots[t * k..][..k]` of `out`, and row 0 into
/// each of the `n_gaps` rows listed at `gaps` (u32); `out` of `x`'s type and width.
pub fn run(
    k: &Kernels,
    s: &Stream,
    out: &CudaTensor,
    x: &CudaTensor,
    (slots, per_token): (u64, usize),
    (gaps, n_gaps): (u64, usize),
) -> Result<()> {
    let (tokens, cols) = (x.rows, x.cols);
    if out.dtype != x.dtype || out.cols != cols || !cols.is_multiple_of(8) {
        return Err(Error::backend(
            "cuda",
            format!("spreading rows of {cols} values into rows of {}", out.cols),
        ));
    }
    let (t, kk, g, c) = (
        i32_arg(tokens, "tokens")?,
        i32_arg(per_token, "k")?,
        i32_arg(n_gaps, "gap rows")?,
        i32_arg(cols, "cols")?,
    );
    let (op, xp) = (out.ptr(), x.ptr());
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.0.get(x.dtype));
    b.arg(&op)
        .arg(&xp)
        .arg(&slots)
        .arg(&t)
        .arg(&kk)
        .arg(&gaps)
        .arg(&g)
        .arg(&c);
    launch(b, elementwise((tokens + n_gaps) * cols / 8)?, "spread_rows")
}
