//! Every CUDA kernel source in `shaders/cuda` compiles with NVRTC, exactly as the CUDA backend
//! compiles it at first use (common.cuh prepended, the options its `// nvrtc:` lines ask),
//! for Ampere (sm_80) and Hopper (sm_90, with the architecture-specific wgmma kernels), and
//! for Ada (sm_89) where the source (or common.cuh) tests `__CUDA_ARCH__` against an Ada
//! value — elsewhere sm_89 compiles sm_80's code path, which sm_80's trial already holds —,
//! each architecture the source is for: no GPU or driver needed, only the NVRTC library. On a machine without NVRTC the trials are reported as ignored, with the
//! reason; `QUANTPPL_REQUIRE_NVRTC=1` makes that a failure (CI installs NVRTC from PyPI's
//! `nvidia-cuda-nvrtc` wheel and sets it). Whether the kernels compute the right values is
//! `quantppl check --backend cuda`'s part, on a GPU.

use libtest_mimic::{Arguments, Trial};
use quantppl::backend::cuda::{compile_kernel, kernel_is_for, nvrtc_available};

fn main() {
    let args = Arguments::from_args();
    let available = nvrtc_available();
    let required = std::env::var_os("QUANTPPL_REQUIRE_NVRTC").is_some_and(|v| v == "1");
    if !available {
        eprintln!(
            "NVRTC could not be loaded (linker path, $CUDA_HOME, $CUDA_PATH, /usr/local/cuda)"
        );
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders/cuda");
    let mut sources: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("shaders/cuda")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .map(|p| {
            let name = p
                .file_stem()
                .expect("file name")
                .to_string_lossy()
                .into_owned();
            (
                name,
                std::fs::read_to_string(&p).expect("read kernel source"),
            )
        })
        .collect();
    sources.sort();
    let common = std::fs::read_to_string(dir.join("common.cuh")).expect("common.cuh");
    // An `__CUDA_ARCH__` test that separates Ada from Ampere: a comparison with 81x to 89x.
    let ada_test = regex::Regex::new(r"__CUDA_ARCH__\s*[<>=!]=?\s*8[1-9]\d").unwrap();
    let mut trials = Vec::new();
    for cc in [(8, 0), (8, 9), (9, 0)] {
        for (name, code) in &sources {
            if !kernel_is_for(name, code, cc).expect("the source's `// nvrtc:` lines") {
                continue;
            }
            if cc == (8, 9) && !ada_test.is_match(code) && !ada_test.is_match(&common) {
                continue;
            }
            let (name, code) = (name.clone(), code.clone());
            let trial = Trial::test(format!("sm_{}{}::{name}", cc.0, cc.1), move || {
                if !available {
                    return Err("NVRTC could not be loaded".into());
                }
                compile_kernel(&name, &code, cc).map_err(|e| e.to_string().into())
            });
            trials.push(if available || required {
                trial
            } else {
                trial.with_ignored_flag(true).with_kind("no NVRTC")
            });
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
