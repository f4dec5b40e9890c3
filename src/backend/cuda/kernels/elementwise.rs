//! `elementwise.cu`: residual add, the gated MLP activation and the f32 -> bf16 conversion.

use cudarc::driver::PushKernelArg;

use super::{Dt, Kernels, Stream, elementwise, launch};
use crate::Result;
use crate::checkpoint::GatedActivation;

/// `x += y` with `x` the f32 residual stream and `y` of type `y_dt` (8 values a thread).
pub fn add_assign(k: &Kernels, s: &Stream, y_dt: Dt, x: u64, y: u64, n: usize) -> Result<()> {
    let n64 = n as i64;
    let mut b = s.launch_builder(k.add_assign.get(y_dt));
    b.arg(&x).arg(&y).arg(&n64);
    launch(b, elementwise(n.div_ceil(8))?, "add_assign")
}

/// `out = act(gate) * up` over `n` outputs, 8 values a thread; `types` is (gate and up, out).
/// With `up` `None`, `gate` holds gate and up interleaved (`2n` values of `types.0`).
#[allow(clippy::too_many_arguments)]
pub fn gated_act(
    k: &Kernels,
    s: &Stream,
    types: (Dt, Dt),
    out: u64,
    gate: u64,
    up: Option<u64>,
    n: usize,
    act: GatedActivation,
) -> Result<()> {
    let n64 = n as i64;
    let (code, alpha, limit): (i32, f32, f32) = match act {
        GatedActivation::Silu => (0, 0.0, 0.0),
        GatedActivation::GeluTanh => (1, 0.0, 0.0),
        GatedActivation::ClampedSwiglu { alpha, limit } => (2, alpha, limit),
    };
    let (up, step): (u64, i32) = match up {
        Some(u) => (u, 1),
        None => (gate + types.0.bytes() as u64, 2),
    };
    let mut b = s.launch_builder(k.gated_act.get(types.0, types.1));
    b.arg(&out).arg(&gate).arg(&up).arg(&n64).arg(&code);
    b.arg(&step).arg(&alpha).arg(&limit);
    launch(b, elementwise(n.div_ceil(8))?, "gated_act")
}

pub fn to_bf16(k: &Kernels, s: &Stream, out: u64, x: u64, n: usize) -> Result<()> {
    let n64 = n as i64;
    let mut b = s.launch_builder(&k.to_bf16);
    b.arg(&out).arg(&x).arg(&n64);
    launch(b, elementwise(n)?, "to_bf16")
}
