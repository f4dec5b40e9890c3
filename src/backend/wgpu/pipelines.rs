//! Every compute pipeline, built once at backend creation and looked up by a typed kernel id.
//! Shader or layout errors surface there as errors naming the kernel, before any long run.

use std::collections::HashMap;

use crate::{Error, Result};

macro_rules! wgsl {
    ($($file:literal),+) => {
        concat!($(include_str!(concat!("../../../shaders/wgsl/", $file))),+)
    };
}

/// One kernel = one `shaders/wgsl/<name>.wgsl` file (entry point `<name>`) = one wrapper in
/// `kernels/<name>.rs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelId {
    MatmulDense,
    MatmulPackedInt,
    MatmulNvfp4,
    MatmulUnpacked8,
    ActQuant,
    RmsNorm,
    Rope,
    Attention,
    SiluMul,
    Add,
    Gather,
    LseUpdate,
    KldAccum,
}

/// How a storage binding is declared in WGSL (`read` or `read_write`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
}

use Access::{Read as R, ReadWrite as RW};

impl KernelId {
    pub const ALL: [KernelId; 13] = [
        KernelId::MatmulDense,
        KernelId::MatmulPackedInt,
        KernelId::MatmulNvfp4,
        KernelId::MatmulUnpacked8,
        KernelId::ActQuant,
        KernelId::RmsNorm,
        KernelId::Rope,
        KernelId::Attention,
        KernelId::SiluMul,
        KernelId::Add,
        KernelId::Gather,
        KernelId::LseUpdate,
        KernelId::KldAccum,
    ];

    /// The WGSL file stem and entry point.
    pub fn name(self) -> &'static str {
        match self {
            KernelId::MatmulDense => "matmul_dense",
            KernelId::MatmulPackedInt => "matmul_packed_int",
            KernelId::MatmulNvfp4 => "matmul_nvfp4",
            KernelId::MatmulUnpacked8 => "matmul_unpacked8",
            KernelId::ActQuant => "act_quant",
            KernelId::RmsNorm => "rms_norm",
            KernelId::Rope => "rope",
            KernelId::Attention => "attention",
            KernelId::SiluMul => "silu_mul",
            KernelId::Add => "add",
            KernelId::Gather => "gather",
            KernelId::LseUpdate => "lse_update",
            KernelId::KldAccum => "kld_accum",
        }
    }

    /// The full WGSL module: shared helpers from `shaders/wgsl/lib/` then the kernel file.
    pub fn source(self) -> &'static str {
        match self {
            KernelId::MatmulDense => wgsl!("lib/num.wgsl", "lib/matmul.wgsl", "matmul_dense.wgsl"),
            KernelId::MatmulPackedInt => {
                wgsl!("lib/num.wgsl", "lib/matmul.wgsl", "matmul_packed_int.wgsl")
            }
            KernelId::MatmulNvfp4 => wgsl!("lib/num.wgsl", "lib/matmul.wgsl", "matmul_nvfp4.wgsl"),
            KernelId::MatmulUnpacked8 => {
                wgsl!("lib/num.wgsl", "lib/matmul.wgsl", "matmul_unpacked8.wgsl")
            }
            KernelId::ActQuant => wgsl!("lib/num.wgsl", "lib/quant.wgsl", "act_quant.wgsl"),
            KernelId::RmsNorm => wgsl!("lib/num.wgsl", "rms_norm.wgsl"),
            KernelId::Rope => wgsl!("lib/num.wgsl", "rope.wgsl"),
            KernelId::Attention => wgsl!("lib/num.wgsl", "attention.wgsl"),
            KernelId::SiluMul => wgsl!("lib/num.wgsl", "silu_mul.wgsl"),
            KernelId::Add => wgsl!("lib/num.wgsl", "add.wgsl"),
            KernelId::Gather => wgsl!("lib/num.wgsl", "gather.wgsl"),
            KernelId::LseUpdate => wgsl!("lib/num.wgsl", "lse_update.wgsl"),
            KernelId::KldAccum => wgsl!("lib/num.wgsl", "kld_accum.wgsl"),
        }
    }

    /// Storage bindings 1.. in order (binding 0 is always the uniform `Params`).
    pub fn storage_bindings(self) -> &'static [Access] {
        match self {
            // Matmuls: x, y, bias (shaders/wgsl/lib/matmul.wgsl), then the weight's buffers.
            KernelId::MatmulDense => &[R, RW, R, R],
            KernelId::MatmulPackedInt => &[R, RW, R, R, R, R, R],
            KernelId::MatmulNvfp4 | KernelId::MatmulUnpacked8 => &[R, RW, R, R, R, R],
            KernelId::ActQuant => &[R, RW],
            KernelId::RmsNorm => &[R, R, RW],
            KernelId::Rope => &[RW, R, R, R],
            KernelId::Attention => &[R, R, R, R, RW],
            KernelId::SiluMul => &[R, R, RW],
            KernelId::Add => &[RW, R],
            KernelId::Gather => &[R, R, RW],
            KernelId::LseUpdate => &[R, R, RW, RW],
            KernelId::KldAccum => &[R, R, R, R, RW, RW],
        }
    }

    /// Size in bytes of the kernel's uniform `Params` (its Rust mirror in `kernels/`).
    pub fn params_size(self) -> usize {
        use super::kernels as k;
        use std::mem::size_of;
        match self {
            KernelId::MatmulDense => size_of::<k::matmul_dense::Params>(),
            KernelId::MatmulPackedInt => size_of::<k::matmul_packed_int::Params>(),
            KernelId::MatmulNvfp4 => size_of::<k::matmul_nvfp4::Params>(),
            KernelId::MatmulUnpacked8 => size_of::<k::matmul_unpacked8::Params>(),
            KernelId::ActQuant => size_of::<k::act_quant::Params>(),
            KernelId::RmsNorm => size_of::<k::rms_norm::Params>(),
            KernelId::Rope => size_of::<k::rope::Params>(),
            KernelId::Attention => size_of::<k::attention::Params>(),
            KernelId::SiluMul => size_of::<k::silu_mul::Params>(),
            KernelId::Add => size_of::<k::add::Params>(),
            KernelId::Gather => size_of::<k::gather::Params>(),
            KernelId::LseUpdate => size_of::<k::lse_update::Params>(),
            KernelId::KldAccum => size_of::<k::kld_accum::Params>(),
        }
    }
}

pub(crate) struct Pipelines {
    map: HashMap<KernelId, (wgpu::ComputePipeline, wgpu::BindGroupLayout)>,
}

impl Pipelines {
    /// Compiles every kernel inside a validation error scope.
    pub(crate) fn build(device: &wgpu::Device) -> Result<Self> {
        let mut map = HashMap::new();
        for kernel in KernelId::ALL {
            map.insert(kernel, build_one(device, kernel)?);
        }
        Ok(Self { map })
    }

    pub(crate) fn get(
        &self,
        kernel: KernelId,
    ) -> Result<(&wgpu::ComputePipeline, &wgpu::BindGroupLayout)> {
        self.map
            .get(&kernel)
            .map(|(p, l)| (p, l))
            .ok_or_else(|| Error::backend("wgpu", format!("kernel {} not built", kernel.name())))
    }
}

fn build_one(
    device: &wgpu::Device,
    kernel: KernelId,
) -> Result<(wgpu::ComputePipeline, wgpu::BindGroupLayout)> {
    let name = kernel.name();
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(name),
        source: wgpu::ShaderSource::Wgsl(kernel.source().into()),
    });
    let mut entries = vec![wgpu::BindGroupLayoutEntry {
        binding: 0,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }];
    entries.extend(kernel.storage_bindings().iter().enumerate().map(|(i, a)| {
        wgpu::BindGroupLayoutEntry {
            binding: i as u32 + 1,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage {
                    read_only: *a == Access::Read,
                },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        }
    }));
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(name),
        entries: &entries,
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(name),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(name),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some(name),
        compilation_options: wgpu::PipelineCompilationOptions::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(Error::backend(
            "wgpu",
            format!("compiling kernel `{name}`: {e}"),
        ));
    }
    Ok((pipeline, layout))
}
