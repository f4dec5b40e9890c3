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

/// A kernel source, `shaders/cuda/<name>.cu`, as its launcher declares it (`cuda_source!`).
/// How it is compiled is written in the file itself, on `// nvrtc:` lines: `exact` (no FMA
/// contraction: the dequantization and activation fake-quant reproduce the reference rounding
/// step by step), `sm_80+` (needs that architecture or a later one), `sm_90a` (instructions of
/// exactly that architecture, Hopper's wgmma: compiled for `compute_90a`, and on sm_90 only).
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    pub name: &'a str,
    pub code: &'a str,
}

/// What a source's `// nvrtc:` lines say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags {
    pub exact: bool,
    /// Compiled for exactly this architecture's `a` target, and only there.
    pub arch_specific: Option<(i32, i32)>,
    /// The oldest architecture it compiles for.
    pub min_cc: (i32, i32),
}

impl Flags {
    /// The flags of source text `code`, naming `name` in the error on a word it does not know.
    pub fn parse(name: &str, code: &str) -> Result<Self> {
        let mut flags = Flags::default();
        for word in code
            .lines()
            .filter_map(|l| l.trim().strip_prefix("// nvrtc:"))
            .flat_map(str::split_whitespace)
        {
            let arch = |digits: &str| -> Option<(i32, i32)> {
                let n: i32 = digits.parse().ok()?;
                Some((n / 10, n % 10))
            };
            match word {
                "exact" => flags.exact = true,
                w if w.starts_with("sm_") && w.ends_with('+') => {
                    flags.min_cc = arch(&w[3..w.len() - 1]).ok_or_else(|| bad(name, w))?;
                }
                w if w.starts_with("sm_") && w.ends_with('a') => {
                    flags.arch_specific =
                        Some(arch(&w[3..w.len() - 1]).ok_or_else(|| bad(name, w))?);
                }
                w => return Err(bad(name, w)),
            }
        }
        Ok(flags)
    }

    /// Whether a device of compute capability `cc` compiles and runs the source.
    pub fn compiles_for(&self, cc: (i32, i32)) -> bool {
        match self.arch_specific {
            Some(only) => cc == only,
            None => cc >= self.min_cc,
        }
    }
}

fn bad(name: &str, word: &str) -> Error {
    Error::backend(
        "cuda",
        format!("{name}.cu: unknown `// nvrtc:` word {word:?} (exact, sm_NN+, sm_NNa)"),
    )
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
fn program(src: Source, cc: (i32, i32), dir: Option<&Path>) -> Result<(String, CompileOptions)> {
    let code = source_text(dir, &format!("{}.cu", src.name), src.code)?;
    let flags = Flags::parse(src.name, &code)?;
    let suffix = if flags.arch_specific.is_some() {
        "a"
    } else {
        ""
    };
    let arch = format!("--gpu-architecture=compute_{}{}{suffix}", cc.0, cc.1);
    let opts = CompileOptions {
        fmad: Some(!flags.exact),
        ftz: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        options: vec![arch],
        name: Some(format!("{}.cu", src.name)),
        ..Default::default()
    };
    let common = source_text(dir, "common.cuh", COMMON)?;
    let hopper = if flags.arch_specific.is_some() {
        source_text(dir, "hopper.cuh", HOPPER)?
    } else {
        String::new()
    };
    Ok((format!("{common}\n{hopper}\n{code}"), opts))
}

/// Compiles one source for compute capability `cc` (no cache, no device).
pub fn compile(src: Source, cc: (i32, i32)) -> Result<String> {
    let (code, opts) = program(src, cc, None)?;
    compile_program(src, &code, opts)
}

fn compile_program(src: Source, code: &str, opts: CompileOptions) -> Result<String> {
    compile_ptx_with_opts(code, opts)
        .map(|ptx| ptx.to_src())
        .map_err(|e| Error::backend("cuda", format!("NVRTC failed on {}.cu: {e}", src.name)))
}

/// Compiles (or loads from the cache) one source for compute capability `cc`, taken from
/// `sources` where that folder has it.
pub fn load(
    ctx: &Arc<CudaContext>,
    src: Source,
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
        std::fs::write(dir.join("hopper.cuh"), "// hopper variant\n").unwrap();
        let src = |code| Source {
            name: "probe",
            code,
        };
        let hopper_src = src("// nvrtc: sm_90a\n// built in\n");
        std::fs::write(dir.join("probe.cu"), "// nvrtc: sm_90a\n// the variant\n").unwrap();
        let (code, opts) = program(hopper_src, (9, 0), Some(&dir)).unwrap();
        assert!(
            code.starts_with(COMMON),
            "common.cuh is not in the folder: built in"
        );
        assert!(code.contains("// hopper variant") && !code.contains(HOPPER));
        assert!(code.ends_with("// the variant\n"));
        assert_eq!(opts.options, ["--gpu-architecture=compute_90a"]);
        std::fs::write(dir.join("probe.cu"), "// the variant\n").unwrap();
        let (code, opts) = program(hopper_src, (8, 0), Some(&dir)).unwrap();
        assert!(
            !code.contains("hopper variant"),
            "hopper.cuh only for sm_90a sources: the folder's file says it is not one"
        );
        assert_eq!(opts.options, ["--gpu-architecture=compute_80"]);
        let (code, _) = program(hopper_src, (9, 0), None).unwrap();
        assert_eq!(
            code,
            format!("{COMMON}\n{HOPPER}\n// nvrtc: sm_90a\n// built in\n")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn flags_come_from_the_nvrtc_lines() {
        let f = |code| Flags::parse("probe", code);
        assert_eq!(f("// plain\n").unwrap(), Flags::default());
        let hopper = f("// nvrtc: exact sm_90a\n").unwrap();
        assert!(hopper.exact && hopper.compiles_for((9, 0)) && !hopper.compiles_for((10, 0)));
        let ampere = f("// nvrtc: sm_80+\n").unwrap();
        assert!(!ampere.compiles_for((7, 5)) && ampere.compiles_for((8, 9)));
        let e = f("// nvrtc: fast\n").unwrap_err().to_string();
        assert!(e.contains("probe.cu") && e.contains("\"fast\""), "{e}");
    }
}
