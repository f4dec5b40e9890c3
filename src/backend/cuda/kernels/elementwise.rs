//! `elementwise.cu`: residual add, the gated MLP activation, column scales and the f32 -> bf16
//! conversion.

use cudarc::driver::{CudaFunction, PushKernelArg};

use super::{
    Dt, InOut, Kernels, Loader, Module, Source, Stream, Typed, cuda_source, elementwise, launch,
};
use crate::Result;
use crate::checkpoint::GatedActivation;

/// `elementwise.cu`'s entry points.
struct Entries {
    add_assign: Typed,
    gated_act: InOut,
    scale_columns: Typed,
    to_bf16: CudaFunction,
}

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("elementwise");

    fn load(l: &Loader) -> Result<Option<Self>> {
        Ok(Some(Self {
            add_assign: l.typed("add_assign")?,
            gated_act: l.in_out("gated_act")?,
            scale_columns: l.typed("scale_columns")?,
            to_bf16: l.func("to_bf16")?,
        }))
    }
}

/// `x += y` with `x` the f32 residual stream and `y` of type `y_dt` (8 values a thread).
pub fn add_assign(k: &Kernels, s: &Stream, y_dt: Dt, x: u64, y: u64, n: usize) -> Result<()> {
    let n64 = n as i64;
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.add_assign.get(y_dt));
    b.arg(&x).arg(&y).arg(&n64);
    launch(b, elementwise(n.div_ceil(8))?, "add_assign")
}

/// Where a gated activation finds gate and up.
#[derive(Clone, Copy, Debug)]
pub enum GateUp {
    /// `up` is its own tensor of the output's shape.
    Apart(u64),
    /// gate and up alternate (gpt-oss): `2n` values at `gate`.
    Interleaved,
    /// Each row of `2 * cols` values holds `cols` of gate, then `cols` of up (the experts'
    /// gate and up computed as one GEMM).
    SideBySide { cols: usize },
}

/// `gated_times`'s (act, alpha, limit) for `act` (common.cuh).
pub fn act_args(act: GatedActivation) -> (i32, f32, f32) {
    match act {
        GatedActivation::Silu => (0, 0.0, 0.0),
        GatedActivation::GeluTanh => (1, 0.0, 0.0),
        GatedActivation::ClampedSwiglu { alpha, limit } => (2, alpha, limit),
        GatedActivation::Sigmoid => (3, 0.0, 0.0),
        GatedActivation::Product => (4, 0.0, 0.0),
        GatedActivation::Relu2 => (5, 0.0, 0.0),
        GatedActivation::ClampedSilu { limit } => (6, 0.0, limit),
    }
}

/// `out = act(gate) * up` over `n` outputs, 8 values a thread; `types` is (gate and up, out).
#[allow(clippy::too_many_arguments)]
pub fn gated_act(
    k: &Kernels,
    s: &Stream,
    types: (Dt, Dt),
    out: u64,
    gate: u64,
    up: GateUp,
    n: usize,
    act: GatedActivation,
) -> Result<()> {
    let n64 = n as i64;
    let (code, alpha, limit) = act_args(act);
    let bytes = types.0.bytes() as u64;
    // (up, step, cols, in_stride) as the kernel reads them.
    let (up, step, cols, in_stride): (u64, i32, i64, i64) = match up {
        GateUp::Apart(u) => (u, 1, n64, n64),
        GateUp::Interleaved => (gate + bytes, 2, n64, n64),
        GateUp::SideBySide { cols } => {
            (gate + cols as u64 * bytes, 1, cols as i64, 2 * cols as i64)
        }
    };
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.gated_act.get(types.0, types.1));
    b.arg(&out).arg(&gate).arg(&up).arg(&n64).arg(&code);
    b.arg(&step)
        .arg(&alpha)
        .arg(&limit)
        .arg(&cols)
        .arg(&in_stride);
    launch(b, elementwise(n.div_ceil(8))?, "gated_act")
}

/// `x[i] *= scales[i % cols]` over the `n` values of `x` (of type `dt`) in place.
pub fn scale_columns(
    k: &Kernels,
    s: &Stream,
    dt: Dt,
    x: u64,
    scales: u64,
    n: usize,
    cols: usize,
) -> Result<()> {
    let (n64, cols64) = (n as i64, cols as i64);
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(entries.scale_columns.get(dt));
    b.arg(&x).arg(&scales).arg(&n64).arg(&cols64);
    launch(b, elementwise(n)?, "scale_columns")
}

pub fn to_bf16(k: &Kernels, s: &Stream, out: u64, x: u64, n: usize) -> Result<()> {
    let n64 = n as i64;
    let entries = k.get::<Entries>()?;
    let mut b = s.launch_builder(&entries.to_bf16);
    b.arg(&out).arg(&x).arg(&n64);
    launch(b, elementwise(n)?, "to_bf16")
}
