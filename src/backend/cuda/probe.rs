//! Is CUDA usable here? cudarc loads libcuda, libnvrtc and libcublas lazily and panics when
//! one is missing, so every library is dlopen-probed first and a machine without NVIDIA gets a
//! plain "CUDA not available: ..." message instead of a panic.

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

/// Probes the libraries and describes device `ordinal`; `Err` says what is missing.
pub fn device_info(ordinal: usize) -> Result<DeviceInfo, String> {
    let missing = |lib: &str| format!("CUDA not available: {lib} could not be loaded");
    // SAFETY: each probe only dlopens the library and closes it again.
    if !unsafe { sys::is_culib_present() } {
        return Err(missing("the driver library libcuda.so"));
    }
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
