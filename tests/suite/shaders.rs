//! Every WGSL kernel, assembled exactly as the backend compiles it, parsed and validated with
//! naga (the version wgpu uses) and written out as SPIR-V, MSL and HLSL: a shader that would
//! break on Vulkan, Metal or DX12 fails here without a GPU. Also checks that each kernel's
//! uniform `Params` has the size of its Rust mirror, and that no .wgsl file is left unused.

use naga::back::{hlsl, msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use quantppl::backend::wgpu::kernels::params_size;
use quantppl::backend::wgpu::pipelines::{KernelId, SPLIT_GEMM_WORKGROUP_BYTES, TileConfig};

/// Every tile shape an adapter may be given (pipelines.rs `TileConfig::for_adapter`).
const TILES: [TileConfig; 3] = TileConfig::CANDIDATES;

fn validate(kernel: KernelId, tiles: &TileConfig) -> (naga::Module, naga::valid::ModuleInfo) {
    let name = kernel.name();
    let source = kernel.source(tiles);
    let module = naga::front::wgsl::parse_str(&source)
        .unwrap_or_else(|e| panic!("{name} {tiles:?}: {}", e.emit_to_string(&source)));
    // The cooperative-matrix kernels need what `Gpu::open` requests for them.
    let caps = if kernel.needs_coop() {
        Capabilities::COOPERATIVE_MATRIX
            | Capabilities::SHADER_FLOAT16
            | Capabilities::SHADER_FLOAT16_IN_FLOAT32
    } else {
        Capabilities::empty()
    };
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name} {tiles:?}: {}", e.emit_to_string(&source)));
    (module, info)
}

#[test]
fn every_kernel_validates_and_translates() {
    for (kernel, tiles) in KernelId::ALL
        .into_iter()
        .flat_map(|k| TILES.iter().map(move |t| (k, t)))
    {
        let name = kernel.name();
        let (module, info) = validate(kernel, tiles);
        assert!(
            module.entry_points.iter().any(|e| e.name == name),
            "{name}: no entry point named {name}"
        );
        spv::write_vec(&module, &info, &spv::Options::default(), None)
            .unwrap_or_else(|e| panic!("{name}: SPIR-V: {e}"));
        if kernel.needs_coop() {
            // wgpu offers cooperative matrices on Vulkan and Metal: naga has no HLSL for them.
            let mut out = String::new();
            let options = msl::Options {
                lang_version: (2, 3),
                ..Default::default()
            };
            msl::Writer::new(&mut out)
                .write(&module, &info, &options, &msl::PipelineOptions::default())
                .unwrap_or_else(|e| panic!("{name}: MSL: {e}"));
            continue;
        }
        let mut out = String::new();
        msl::Writer::new(&mut out)
            .write(
                &module,
                &info,
                &msl::Options::default(),
                &msl::PipelineOptions::default(),
            )
            .unwrap_or_else(|e| panic!("{name}: MSL: {e}"));
        let mut out = String::new();
        let options = hlsl::Options::default();
        hlsl::Writer::new(&mut out, &options, &hlsl::PipelineOptions::default())
            .write(&module, &info, None)
            .unwrap_or_else(|e| panic!("{name}: HLSL: {e}"));
    }
}

#[test]
fn params_match_their_rust_mirrors() {
    for kernel in KernelId::ALL {
        let (module, _) = validate(kernel, &TileConfig::SMALL);
        let mut layouter = naga::proc::Layouter::default();
        layouter
            .update(module.to_ctx())
            .expect("layout of the module's types");
        let params = module
            .global_variables
            .iter()
            .find(|(_, g)| {
                g.binding
                    .as_ref()
                    .is_some_and(|b| b.group == 0 && b.binding == 0)
            })
            .map(|(_, g)| g)
            .unwrap_or_else(|| panic!("{}: no binding 0", kernel.name()));
        assert_eq!(
            params.space,
            naga::AddressSpace::Uniform,
            "{}",
            kernel.name()
        );
        assert_eq!(
            layouter[params.ty].size as usize,
            params_size(kernel),
            "{}: WGSL Params vs Rust Params size",
            kernel.name()
        );
    }
}

/// `TileConfig::workgroup_bytes`, from which a config is judged to fit an adapter, is the
/// workgroup memory naga lays out for the kernels (each variable padded to 16 bytes).
#[test]
fn workgroup_bytes_match_the_kernels() {
    for tiles in TILES {
        let (mm, attn) = tiles.workgroup_bytes();
        let mut mm_largest = 0;
        for kernel in KernelId::ALL {
            let (module, _) = validate(kernel, &tiles);
            let mut layouter = naga::proc::Layouter::default();
            layouter
                .update(module.to_ctx())
                .expect("layout of the module's types");
            let bytes: u32 = module
                .global_variables
                .iter()
                .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
                .map(|(_, g)| layouter[g.ty].size.next_multiple_of(16))
                .sum();
            let want = match kernel {
                KernelId::Attention => attn,
                KernelId::SplitGemm(_) => SPLIT_GEMM_WORKGROUP_BYTES,
                k if k.name().starts_with("matmul") => {
                    // The weight planes kernels have none.
                    if !k.needs_coop() {
                        mm_largest = mm_largest.max(bytes);
                    }
                    tiles.matmul_workgroup_bytes(k.sum())
                }
                _ => continue,
            };
            assert_eq!(bytes, want, "{kernel:?} {tiles:?}");
        }
        assert_eq!(mm, mm_largest, "{tiles:?}: the larger matmul variant");
    }
}

#[test]
fn every_wgsl_file_belongs_to_a_kernel() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders/wgsl");
    let mut files = Vec::new();
    for sub in [dir.clone(), dir.join("lib")] {
        for e in std::fs::read_dir(&sub).expect("shaders/wgsl") {
            let p = e.expect("dir entry").path();
            if p.extension().is_some_and(|x| x == "wgsl") {
                files.push(p);
            }
        }
    }
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read shader");
        assert!(
            KernelId::ALL
                .iter()
                .any(|k| k.source(&TileConfig::SMALL).contains(&text)),
            "{} is not part of any kernel",
            f.display()
        );
    }
}
