//! Run-time compilation of `shaders/cuda/*.cu` for the device's architecture with NVRTC, so
//! building quantppl needs no CUDA toolkit. PTX is cached on disk in `crate::cache::dir()`'s
//! `ptx/` (`$XDG_CACHE_HOME/quantppl/ptx` or `~/.cache/quantppl/ptx`), keyed by a hash of the
//! source, the options and the NVRTC version: a changed kernel or compiler simply misses the cache.
//!
//! For kernel work, `BackendOptions::cuda_sources` (`QUANTPPL_DEV=cuda-sources=DIR`) takes
//! each source (and `common.cuh`, `hopper.cuh`) from DIR where DIR has a file of its name, the
//! built-in one otherwise: one binary then runs variants of a kernel side by side
//! (docs/decisions.md: Kernel variants side by side).

use std::path::Path;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};

use crate::fnv::Fnv;
use crate::{Error, Result};

/// Helpers prepended to every kernel (bf16 conversion, FP8 decode, reductions).
const COMMON: &str = include_str!("../../../shaders/cuda/common.cuh");
/// Helpers prepended after them to the architecture-specific (Hopper) kernels: wgmma
/// descriptors, TMA, mbarriers.
const HOPPER: &str = include_str!("../../../shaders/cuda/hopper.cuh");

/// A kernel source file, whether it must be compiled without FMA contraction (the
/// dequantization and activation fake-quant reproduce the reference rounding step by step),
/// and whether it uses instructions of exactly the device's architecture (`compute_90a`:
/// Hopper's wgmma), not of it and its successors.
pub struct Source {
    pub name: &'static str,
    pub code: &'static str,
    pub exact: bool,
    pub arch_specific: bool,
}

/// `name`'s text: from `dir` where it has that file, else `built_in`.
fn source_text(dir: Option<&Path>, name: &str, built_in: &str) -> Result<String> {
    let Some(path) = dir.map(|d| d.join(name)).filter(|p| p.exists()) else {
        return Ok(built_in.to_string());
    };
    std::fs::read_to_string(&path).map_err(|e| {
        Error::backend(
            "cuda",
            format!("kernel sources: reading {}: {e}", path.display()),
        )
    })
}

/// The full source NVRTC compiles and its options, for compute capability `cc`, with the
/// sources in `dir` replacing the built-in ones.
fn program(src: &Source, cc: (i32, i32), dir: Option<&Path>) -> Result<(String, CompileOptions)> {
    let suffix = if src.arch_specific { "a" } else { "" };
    let arch = format!("--gpu-architecture=compute_{}{}{suffix}", cc.0, cc.1);
    let opts = CompileOptions {
        fmad: Some(!src.exact),
        ftz: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        options: vec![arch],
        name: Some(format!("{}.cu", src.name)),
        ..Default::default()
    };
    let common = source_text(dir, "common.cuh", COMMON)?;
    let hopper = if src.arch_specific {
        source_text(dir, "hopper.cuh", HOPPER)?
    } else {
        String::new()
    };
    let code = source_text(dir, &format!("{}.cu", src.name), src.code)?;
    Ok((format!("{common}\n{hopper}\n{code}"), opts))
}

/// Compiles one built-in source for compute capability `cc` (no cache, no device).
pub fn compile(src: &Source, cc: (i32, i32)) -> Result<String> {
    let (code, opts) = program(src, cc, None)?;
    compile_program(src, &code, opts)
}

fn compile_program(src: &Source, code: &str, opts: CompileOptions) -> Result<String> {
    compile_ptx_with_opts(code, opts)
        .map(|ptx| ptx.to_src())
        .map_err(|e| Error::backend("cuda", format!("NVRTC failed on {}.cu: {e}", src.name)))
}

/// Compiles (or loads from the cache) one source for compute capability `cc`, taken from
/// `sources` where that folder has it.
pub fn load(
    ctx: &Arc<CudaContext>,
    src: &Source,
    cc: (i32, i32),
    sources: Option<&Path>,
) -> Result<Arc<CudaModule>> {
    let (code, opts) = program(src, cc, sources)?;
    let key = fnv1a(&[
        code.as_bytes(),
        format!("{opts:?}").as_bytes(),
        nvrtc_version().as_bytes(),
    ]);
    let cached = crate::cache::dir()
        .join("ptx")
        .join(format!("{}-{key:016x}.ptx", src.name));
    let ptx_text = match std::fs::read_to_string(&cached) {
        Ok(text) => text,
        Err(_) => {
            let text = compile_program(src, &code, opts)?;
            crate::cache::store(&cached, text.as_bytes());
            text
        }
    };
    ctx.load_module(Ptx::from_src(ptx_text))
        .map_err(|e| Error::backend("cuda", format!("loading {}.cu: {e:?}", src.name)))
}

fn nvrtc_version() -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    format!("{major}.{minor}")
}

/// The FNV-1a hash of `parts`, each followed by a 0xff byte.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h = Fnv::default();
    for part in parts {
        h.update(part);
        h.update(&[0xff]);
    }
    h.value()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_in_the_folder_replace_the_built_in_ones() {
        let dir = std::env::temp_dir().join(format!("quantppl-sources-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("probe.cu"), "// the variant\n").unwrap();
        std::fs::write(dir.join("hopper.cuh"), "// hopper variant\n").unwrap();
        let src = |arch_specific| Source {
            name: "probe",
            code: "// built in\n",
            exact: false,
            arch_specific,
        };
        let (code, _) = program(&src(true), (9, 0), Some(&dir)).unwrap();
        assert!(
            code.starts_with(COMMON),
            "common.cuh is not in the folder: built in"
        );
        assert!(code.contains("// hopper variant") && !code.contains(HOPPER));
        assert!(code.ends_with("// the variant\n"));
        let (code, _) = program(&src(false), (8, 0), Some(&dir)).unwrap();
        assert!(
            !code.contains("hopper variant"),
            "hopper.cuh only for sm_90a sources"
        );
        let (code, _) = program(&src(true), (9, 0), None).unwrap();
        assert_eq!(code, format!("{COMMON}\n{HOPPER}\n// built in\n"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
