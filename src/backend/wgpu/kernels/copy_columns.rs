//! shaders/wgsl/copy_columns.wgsl: column blocks of one tensor into another.

use bytemuck::{Pod, Zeroable};

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::WG;
use crate::Result;
use crate::backend::ColumnBlocks;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Params {
    pub rows: u32,
    pub src_cols: u32,
    pub dst_cols: u32,
    pub blocks: u32,
    pub width: u32,
    pub from_col: u32,
    pub from_stride: u32,
    pub to_col: u32,
    pub to_stride: u32,
    pub _pad: [u32; 3],
}

wgsl_kernel!(
    "copy_columns",
    libs: ["num"],
    bindings: [R, RW],
    params: Params,
    form: Plain,
);

impl Params {
    /// The blocks `at` names from rows of `src_cols` into rows of `dst_cols` values.
    pub fn new(rows: usize, src_cols: usize, dst_cols: usize, at: ColumnBlocks) -> Self {
        Self {
            rows: rows as u32,
            src_cols: src_cols as u32,
            dst_cols: dst_cols as u32,
            blocks: at.blocks as u32,
            width: at.width as u32,
            from_col: at.from as u32,
            from_stride: at.from_stride as u32,
            to_col: at.to as u32,
            to_stride: at.to_stride as u32,
            _pad: [0; 3],
        }
    }
}

pub(crate) fn copy_columns(
    gpu: &Gpu,
    p: &Params,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
) -> Result<()> {
    let n = p.rows as u64 * p.blocks as u64 * p.width as u64;
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[x, y],
        gpu.grid(n.div_ceil(WG)),
    )
}
