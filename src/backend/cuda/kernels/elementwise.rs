//! `elementwise.cu`: residual add and SiLU-mul.

use cudarc::driver::PushKernelArg;

use super::{Kernels, Stream, elementwise, launch};
use crate::Result;

pub fn add_assign(k: &Kernels, s: &Stream, x: u64, y: u64, n: usize) -> Result<()> {
    let n64 = n as i64;
    let mut b = s.launch_builder(&k.add_assign);
    b.arg(&x).arg(&y).arg(&n64);
    launch(b, elementwise(n)?, "add_assign")
}

pub fn silu_mul(k: &Kernels, s: &Stream, out: u64, gate: u64, up: u64, n: usize) -> Result<()> {
    let n64 = n as i64;
    let mut b = s.launch_builder(&k.silu_mul);
    b.arg(&out).arg(&gate).arg(&up).arg(&n64);
    launch(b, elementwise(n)?, "silu_mul")
}
