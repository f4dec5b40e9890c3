//! shaders/wgsl/recurrence_chunk_scan.wgsl: the chunked recurrence's second pass, a workgroup
//! per (sequence, value head, 64 columns) walking the sequence's chunks with the state, in as
//! many dispatches as a CPU Vulkan driver's loop limit asks for (one on a GPU).

use super::super::device::Gpu;
use super::super::pipelines::wgsl_kernel;
use super::recurrence_chunk_prepare::{Params, Scratch};
use crate::Result;

/// Value columns a workgroup (SC in the kernel), and its row groups (RG).
pub const COLS: usize = 64;
const ROW_GROUPS: u64 = 4;
/// Mesa's CPU drivers (llvmpipe, lavapipe) end every loop of a shader invocation, silently,
/// once this many iterations have run in all (gallivm's `LP_MAX_TGSI_LOOP_ITERATIONS`): a
/// 160-wide step-by-step delta rule lost its 134th token to it.
pub const CPU_DRIVER_LOOP_LIMIT: u64 = 65_535;

wgsl_kernel!(
    "recurrence_chunk_scan",
    libs: ["recurrence"],
    bindings: [R, R, R, R, R, R, R, RW, RW],
    params: Params,
    form: Plain,
);

/// The loop iterations one invocation runs a chunk with key heads of `dk`, each loop counted
/// once more for its exit test as those drivers count: the norms, the new values' and the
/// outputs' blocks of 8 rows (their partial sums and reductions, the outputs' products with
/// up to 64 rows), the state's update.
fn loops_per_chunk(dk: u64) -> u64 {
    let rows = dk.div_ceil(ROW_GROUPS);
    let (blocks, block) = (8, 8);
    let partials = block * (rows + 1) + 1;
    let values = blocks * (partials + 2 * (ROW_GROUPS + 1) + 1);
    let outputs = blocks * (partials + 2 * (ROW_GROUPS + 1 + 65) + 1);
    (dk + 1) + values + outputs + rows * 65 + 1
}

/// Chunks a dispatch walks: every one of the longest sequence's on a GPU; on a CPU driver as
/// many as its loop limit lets one invocation run.
pub(crate) fn chunks_per_dispatch(gpu: &Gpu, dk: usize, most: usize) -> usize {
    if gpu.info.device_type != wgpu::DeviceType::Cpu {
        return most.max(1);
    }
    let fixed = 2 * (dk as u64).div_ceil(ROW_GROUPS) + 2;
    ((CPU_DRIVER_LOOP_LIMIT - fixed) / loops_per_chunk(dk as u64)).max(1) as usize
}

/// The buffers the pass reads besides the scratch: `qkv`, Mamba-2's `D` (any buffer for the
/// delta rules) and the chunk list; the state `[n_seqs, v_heads, dk, dv]` it carries between
/// dispatches, and `out` `[tokens, v_heads * dv]`.
pub(crate) struct Buffers<'a> {
    pub qkv: &'a wgpu::Buffer,
    pub skip: &'a wgpu::Buffer,
    pub chunks: &'a wgpu::Buffer,
    pub state: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
}

pub(crate) fn recurrence_chunk_scan(gpu: &Gpu, p: &Params, x: &Scratch, b: &Buffers) -> Result<()> {
    let n = p.n_seqs as u64 * p.v_heads as u64 * p.col_blocks as u64;
    gpu.run(
        &KERNEL,
        bytemuck::bytes_of(p),
        &[
            b.qkv,
            b.skip,
            b.chunks,
            x.products,
            x.values,
            x.corrections,
            x.decays,
            b.state,
            b.out,
        ],
        gpu.grid(n),
    )
}
