//! `softcap.cu`: `cap * tanh(x / cap)` in place on an f32 logits tile.

use cudarc::driver::PushKernelArg;

use super::{Kernels, Stream, elementwise, launch};
use crate::Result;

pub fn run(k: &Kernels, s: &Stream, x: u64, n: usize, cap: f32) -> Result<()> {
    let n64 = n as i64;
    let mut b = s.launch_builder(&k.softcap);
    b.arg(&x).arg(&n64).arg(&cap);
    launch(b, elementwise(n)?, "softcap")
}
