//! `quantppl devices`: every compute device quantppl can use, with what it offers.

use std::path::PathBuf;

use serde::Serialize;

use std::fmt::Write as _;

use super::print_output;
use crate::backend::cuda::{DeviceInfo, cuda_available};
use crate::backend::wgpu::{AdapterInfo, list_adapters};
use crate::units::human_bytes;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Also write the list as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(Serialize)]
struct Devices {
    cuda: Result<DeviceInfo, String>,
    wgpu: Vec<AdapterInfo>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let d = Devices {
        cuda: cuda_available(),
        wgpu: list_adapters(),
    };
    let mut out = String::new();
    match &d.cuda {
        Ok(c) => writeln!(
            out,
            "cuda  {} GPU(s); device {}: {} (compute capability {}.{}), {}",
            c.device_count,
            c.ordinal,
            c.name,
            c.compute_capability.0,
            c.compute_capability.1,
            human_bytes(c.total_memory)
        )?,
        Err(why) => writeln!(out, "cuda  not available: {why}")?,
    }
    if d.wgpu.is_empty() {
        writeln!(
            out,
            "wgpu  no adapter with compute shaders (install a Vulkan driver, e.g. mesa-vulkan-drivers)"
        )?;
    }
    for a in &d.wgpu {
        writeln!(
            out,
            "wgpu  --adapter {}: {} ({}, {}, driver {}); max storage binding {}, max buffer {}, \
             workgroup storage {} B, {} invocations; shader-f16 {}, subgroups {}; matmuls on \
             {}",
            a.index,
            a.name,
            a.backend,
            a.device_type,
            a.driver,
            human_bytes(a.max_storage_buffer_binding_size),
            human_bytes(a.max_buffer_size),
            a.max_compute_workgroup_storage_size,
            a.max_compute_invocations_per_workgroup,
            if a.shader_f16 { "yes" } else { "no" },
            if a.subgroups { "yes" } else { "no" },
            if a.cooperative_matrix {
                "cooperative matrices (f16 split, f32-grade)"
            } else {
                "f32 shader cores"
            }
        )?;
    }
    print_output(&out, args.json.as_deref(), &d)
}
