//! `sparse_attention.cu`: sparse attention's selection as a bitmask the attention kernels
//! read (`attention::run`'s `key_mask`).

use cudarc::driver::PushKernelArg;

use super::{Kernels, Loader, Module, Source, Stream, cuda_source, elementwise, i32_arg, launch};
use crate::Result;
use crate::backend::Shaped;
use crate::backend::cuda::CudaTensor;

struct Entries(cudarc::driver::CudaFunction);

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("sparse_attention");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self(l.func("select_mask")?)))
    }
}

/// Sets in `mask` (zeroed, `words` u32 a row) the bit of every position `keys` (f32 `[rows,
/// n]`, -1 for none) names.
pub fn run(k: &Kernels, s: &Stream, mask: u64, keys: &CudaTensor, words: usize) -> Result<()> {
    let total = keys.len();
    let (n, words) = (
        i32_arg(keys.cols, "selected keys")?,
        i32_arg(words, "mask words")?,
    );
    let (kp, total64) = (keys.ptr(), total as i64);
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(&entries.0);
    b.arg(&mask).arg(&kp).arg(&total64).arg(&n).arg(&words);
    launch(b, elementwise(total)?, "select_mask")
}
