//! shaders/wgsl/act_quant.wgsl: input-activation fake quantization, one row per workgroup.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use crate::Result;
use crate::numerics::ActQuant;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub rows: u32,
    pub cols: u32,
    pub mode: u32,
    pub scale: f32,
}

wgsl_kernel!(
    "act_quant",
    libs: ["num", "quant"],
    bindings: [R, RW],
    params: Params,
    form: Plain,
);

impl Params {
    pub fn new(aq: ActQuant, rows: u32, cols: u32) -> Self {
        let (mode, scale) = aq.kernel_code();
        Self {
            rows,
            cols,
            mode,
            scale,
        }
    }
}

pub(crate) fn act_quant(gpu: &Gpu, p: &Params, x: &wgpu::Buffer, y: &wgpu::Buffer) -> Result<()> {
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[x, y],
        gpu.grid(p.rows as u64),
    )
}
