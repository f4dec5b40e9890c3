//! `elementwise.cu`: residual add and SiLU-mul.

use cudarc::driver::PushKernelArg;

use super::{Kernels, Stream, elementwise, launch};
use crate::Result;

/// `x += y`; `x` is the f32 residual stream when `f32_x`, else bf16.
pub fn add_assign(k: &Kernels, s: &Stream, x: u64, y: u64, n: usize, f32_x: bool) -> Result<()> {
    let n64 = n as i64;
    let f = if f32_x {
        &k.add_assign_f32
    } else {
        &k.add_assign
    };
    let mut b = s.launch_builder(f);
    b.arg(&x).arg(&y).arg(&n64);
    launch(b, elementwise(n)?, "add_assign")
}

pub fn silu_mul(k: &Kernels, s: &Stream, out: u64, gate: u64, up: u64, n: usize) -> Result<()> {
    let n64 = n as i64;
    let mut b = s.launch_builder(&k.silu_mul);
    b.arg(&out).arg(&gate).arg(&up).arg(&n64);
    launch(b, elementwise(n)?, "silu_mul")
}

pub fn to_bf16(k: &Kernels, s: &Stream, out: u64, x: u64, n: usize) -> Result<()> {
    let n64 = n as i64;
    let mut b = s.launch_builder(&k.to_bf16);
    b.arg(&out).arg(&x).arg(&n64);
    launch(b, elementwise(n)?, "to_bf16")
}
