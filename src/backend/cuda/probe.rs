//! Is CUDA usable here? cudarc loads libcuda, libnvrtc and libcublas lazily and panics when
//! one is missing, so every library is dlopen-probed first and a machine without NVIDIA gets a
//! plain "CUDA not available: ..." message instead of a panic.
//!
//! How the libraries are found: cudarc (built with the `cuda-13000` feature) tries the names
//! `lib<name>.so`, `lib<name>.so.13`, `lib<name>.so.12`, `lib<name>.so.11`, ... on the dynamic
//! linker's search path, so a CUDA 13 install (which ships only the versioned `.so.13` names
//! without its -dev package) and a CUDA 12 one both work; symbols are looked up one by one
//! when first called, and quantppl calls only functions that CUDA 12 and 13 both export, but
//! for cuBLAS's grouped GEMM (12.5 and later), which it calls only where `cublas_exports`
//! finds it.
//! Where a toolkit is installed but not on the search path (no ldconfig entry, no
//! `LD_LIBRARY_PATH`), the probe looks in `$CUDA_HOME`, `$CUDA_PATH` and `/usr/local/cuda`
//! (`lib64`, `targets/x86_64-linux/lib`) and loads the library from there by full path. The
//! handle is kept for the life of the process, so cudarc's later load by name gets that same
//! library (the dynamic linker matches already-loaded libraries by their soname).

use std::path::PathBuf;
use std::sync::OnceLock;

use cudarc::driver::{result, sys};

/// The device a `CudaBackend` would run on.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// (major, minor), e.g. (9, 0) for Hopper.
    pub compute_capability: (i32, i32),
    pub total_memory: u64,
    /// CUDA devices visible to this process.
    pub device_count: usize,
}

/// Probes the CUDA libraries and device 0 without panicking.
pub fn cuda_available() -> Result<DeviceInfo, String> {
    device_info(0)
}

/// Libraries loaded from a toolkit directory by full path, kept loaded for the process.
static PRELOADED: OnceLock<Vec<libloading::Library>> = OnceLock::new();

/// Toolkit library directories searched when a library is not on the linker's search path.
fn toolkit_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    roots
        .iter()
        .flat_map(|r| [r.join("lib64"), r.join("targets/x86_64-linux/lib")])
        .filter(|d| d.is_dir())
        .collect()
}

/// Whether `lib` (e.g. `cublas`) loads under one of cudarc's candidate names.
fn loads_by_name(lib: &str) -> bool {
    cudarc::get_lib_name_candidates(lib)
        .iter()
        // SAFETY: loading a CUDA library runs only its initializers, which have no
        // preconditions; the handle is closed again at once.
        .any(|name| unsafe { libloading::Library::new(name) }.is_ok())
}

/// Loads `lib` from a toolkit directory under one of cudarc's candidate names, or (for
/// NVRTC's builtins, whose name carries the minor version) any `lib<name>.so.*` there.
fn load_from_toolkit(lib: &str, dirs: &[PathBuf]) -> Option<libloading::Library> {
    let prefix = format!("lib{lib}.so");
    for dir in dirs {
        let mut paths: Vec<PathBuf> = cudarc::get_lib_name_candidates(lib)
            .iter()
            .map(|n| dir.join(n))
            .collect();
        if let Ok(entries) = std::fs::read_dir(dir) {
            let mut extra: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&format!("{prefix}.")))
                })
                .collect();
            extra.sort();
            paths.extend(extra.into_iter().rev());
        }
        for p in paths.iter().filter(|p| p.is_file()) {
            // SAFETY: as in `loads_by_name`; this handle is then kept loaded.
            if let Ok(l) = unsafe { libloading::Library::new(p) } {
                return Some(l);
            }
        }
    }
    None
}

/// Makes NVRTC and cuBLAS loadable by name, loading them from a toolkit directory where the
/// linker's search path does not have them (whatever is still missing is reported by the
/// `is_culib_present` checks that follow).
fn preload_libraries() {
    PRELOADED.get_or_init(|| {
        let dirs = toolkit_dirs();
        let mut kept = Vec::new();
        // Dependencies first: libnvrtc loads its builtins, libcublas needs libcublasLt.
        for group in [
            &["nvrtc-builtins", "nvrtc"][..],
            &["cublasLt", "cublas"][..],
        ] {
            let Some(main) = group.last() else { continue };
            if loads_by_name(main) {
                continue;
            }
            kept.extend(group.iter().filter_map(|lib| load_from_toolkit(lib, &dirs)));
        }
        kept
    });
}

/// Whether NVRTC loads (from the linker's search path or a toolkit directory), which is all
/// `compile_kernel` needs: no driver, no GPU.
pub fn nvrtc_available() -> bool {
    preload_libraries();
    // SAFETY: the probe only dlopens the library and closes it again.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether the cuBLAS that cudarc loads exports `symbol`, looked up as cudarc looks up the
/// functions it calls. Only after `device_info` has found cuBLAS (cudarc's `culib` panics
/// where there is none).
pub fn cublas_exports(symbol: &str) -> bool {
    // SAFETY: cuBLAS is present (the caller probed it); a symbol lookup runs nothing.
    unsafe { cudarc::cublas::sys::culib().get::<unsafe extern "C" fn()>(symbol.as_bytes()) }.is_ok()
}

/// Probes the libraries and describes device `ordinal`; `Err` says what is missing.
pub fn device_info(ordinal: usize) -> Result<DeviceInfo, String> {
    let missing = |lib: &str| {
        format!(
            "CUDA not available: {lib} could not be loaded (searched the linker path, \
             $CUDA_HOME, $CUDA_PATH and /usr/local/cuda)"
        )
    };
    // SAFETY: each probe only dlopens the library and closes it again.
    if !unsafe { sys::is_culib_present() } {
        return Err(missing("the driver library libcuda.so"));
    }
    preload_libraries();
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(missing("NVRTC (libnvrtc.so)"));
    }
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err(missing("cuBLAS (libcublas.so)"));
    }
    let fail = |what: &str, e: result::DriverError| format!("CUDA not available: {what}: {e:?}");
    result::init().map_err(|e| fail("cuInit", e))?;
    let count = result::device::get_count().map_err(|e| fail("cuDeviceGetCount", e))?;
    if ordinal >= count.max(0) as usize {
        return Err(format!(
            "CUDA not available: device {ordinal} requested, {count} visible"
        ));
    }
    let dev = result::device::get(ordinal as i32).map_err(|e| fail("cuDeviceGet", e))?;
    let attr = |a| unsafe { result::device::get_attribute(dev, a) };
    let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .map_err(|e| fail("compute capability", e))?;
    let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        .map_err(|e| fail("compute capability", e))?;
    let name = result::device::get_name(dev).map_err(|e| fail("cuDeviceGetName", e))?;
    let total =
        unsafe { result::device::total_mem(dev) }.map_err(|e| fail("cuDeviceTotalMem", e))?;
    Ok(DeviceInfo {
        ordinal,
        name,
        compute_capability: (major, minor),
        total_memory: total as u64,
        device_count: count as usize,
    })
}
