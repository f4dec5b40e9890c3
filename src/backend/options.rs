//! The GPU backends' development switches (kernel work, side-by-side comparisons, tests): one
//! value, parsed once from `QUANTPPL_DEV` by the command line or built by a test, and handed to
//! the backend when it is opened. The backends read no environment of their own.
//!
//! `QUANTPPL_DEV` holds comma-separated settings:
//! - `wgpu-tiles=TX:TY:BK:BK_PER_STEP:QB`: the wgpu kernels' tile shapes instead of the
//!   adapter's choice (tuning);
//! - `wgpu-coop=off`: the shader-core matmuls where the adapter has cooperative matrices;
//! - `wgpu-checks=all`: every naga run-time check kept (loop bounding and integer-division
//!   guards too); `wgpu-checks=none` drops index clamping as well, in debug builds only;
//! - `wgpu-max-binding=BYTES`: no storage binding larger than this, below the adapter's own
//!   limit (a small GPU's limit reproduced on a larger one: what the row blocks are for);
//! - `wgpu-sources=DIR`: each WGSL kernel's file from DIR where DIR has a file of its name
//!   (`<name>.wgsl`; the `lib/` files stay built in), as `cuda-sources` for CUDA;
//! - `cuda-experts=loop`: each expert's GEMMs one after another instead of grouped;
//! - `cuda-attention=portable`: the portable attention kernel where the GPU has a faster one;
//! - `cuda-recurrence=steps`: the linear recurrences step by step where they run in chunks;
//! - `cuda-sources=DIR`: each CUDA kernel's source (and `common.cuh`, `hopper.cuh`) from DIR
//!   where DIR has a file of its name, so one binary runs variants of a kernel side by side.

use std::path::PathBuf;

use crate::backend::wgpu::TileConfig;
use crate::{Error, Result};

/// The variable the command line reads the switches from.
pub const DEV_VAR: &str = "QUANTPPL_DEV";

/// Which of naga's run-time checks the wgpu kernels keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ShaderChecks {
    /// Index clamping kept (memory safety); forced loop bounding and integer-division guards
    /// off: every loop in the kernels has a constant or uniform bound and no divisor can be
    /// zero, and the two cost 15-70 % (matmul, attention) on an H200.
    #[default]
    Indices,
    /// Every check kept.
    All,
    /// None kept (6 % faster on an H200; every kernel bounds-checks its own storage accesses).
    /// Debug builds only: a release build cannot turn index clamping off.
    #[cfg(debug_assertions)]
    None,
}

/// How CUDA runs a linear recurrence (`BackendOptions::cuda_recurrence`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecurrenceForm {
    /// In chunks wherever the chunked kernels hold the heads, else step by step.
    #[default]
    Chunks,
    /// Step by step.
    Steps,
}

/// The switches; `Default` is what users run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackendOptions {
    /// wgpu: kernels compiled for these tiles rather than the adapter's choice.
    pub wgpu_tiles: Option<TileConfig>,
    /// wgpu: the shader-core matmuls even where the adapter has cooperative matrices.
    pub wgpu_no_coop: bool,
    pub wgpu_checks: ShaderChecks,
    /// wgpu: the largest storage binding, where lower than the adapter's.
    pub wgpu_max_binding: Option<u64>,
    /// wgpu: kernel files from this folder where it has a file of the kernel's name.
    pub wgpu_sources: Option<PathBuf>,
    /// CUDA: each expert's GEMMs in turn (a comparison for the grouped path).
    pub cuda_experts_loop: bool,
    /// CUDA: the linear recurrences step by step even where the chunked kernels hold the heads
    /// (comparisons).
    pub cuda_recurrence: RecurrenceForm,
    /// CUDA: the portable attention kernel even where the GPU has a faster one.
    pub cuda_portable_attention: bool,
    /// CUDA: kernel sources from this folder where it has a file of the kernel's name.
    pub cuda_sources: Option<PathBuf>,
}

impl BackendOptions {
    /// The switches `QUANTPPL_DEV` sets (none where it is unset or empty).
    pub fn from_env() -> Result<Self> {
        match std::env::var(DEV_VAR) {
            Ok(v) => Self::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(e) => Err(Error::InvalidArgument(format!("{DEV_VAR}: {e}"))),
        }
    }

    /// Parses `QUANTPPL_DEV`'s value; an unknown or malformed setting is an error naming it.
    pub fn parse(text: &str) -> Result<Self> {
        let mut o = Self::default();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let bad =
                |want: &str| Error::InvalidArgument(format!("{DEV_VAR}: `{item}`: want {want}"));
            let (key, value) = item.split_once('=').ok_or_else(|| bad("KEY=VALUE"))?;
            match (key, value) {
                ("wgpu-tiles", v) => {
                    let n: Vec<u32> = v
                        .split(':')
                        .map(|s| s.trim().parse())
                        .collect::<std::result::Result<_, _>>()
                        .map_err(|_| bad("wgpu-tiles=TX:TY:BK:BK_PER_STEP:QB"))?;
                    let &[mm_tx, mm_ty, mm_bk, mm_bk_per_step, attn_qb] = n.as_slice() else {
                        return Err(bad("wgpu-tiles=TX:TY:BK:BK_PER_STEP:QB"));
                    };
                    o.wgpu_tiles = Some(TileConfig {
                        mm_tx,
                        mm_ty,
                        mm_bk,
                        mm_bk_per_step,
                        attn_qb,
                    });
                }
                ("wgpu-coop", "off") => o.wgpu_no_coop = true,
                ("wgpu-coop", "on") => o.wgpu_no_coop = false,
                ("wgpu-coop", _) => return Err(bad("wgpu-coop=on|off")),
                ("wgpu-checks", "indices") => o.wgpu_checks = ShaderChecks::Indices,
                ("wgpu-checks", "all") => o.wgpu_checks = ShaderChecks::All,
                #[cfg(debug_assertions)]
                ("wgpu-checks", "none") => o.wgpu_checks = ShaderChecks::None,
                ("wgpu-checks", _) => {
                    return Err(bad(if cfg!(debug_assertions) {
                        "wgpu-checks=indices|all|none"
                    } else {
                        "wgpu-checks=indices|all (none: debug builds only)"
                    }));
                }
                ("wgpu-max-binding", v) => {
                    let bytes: u64 = v.parse().map_err(|_| bad("wgpu-max-binding=BYTES"))?;
                    // Below a row of any tensor nothing could run.
                    if bytes < 1 << 16 {
                        return Err(bad("wgpu-max-binding=BYTES, at least 65536"));
                    }
                    o.wgpu_max_binding = Some(bytes);
                }
                ("cuda-experts", "loop") => o.cuda_experts_loop = true,
                ("cuda-experts", "grouped") => o.cuda_experts_loop = false,
                ("cuda-experts", _) => return Err(bad("cuda-experts=grouped|loop")),
                ("cuda-recurrence", "chunks") => o.cuda_recurrence = RecurrenceForm::Chunks,
                ("cuda-recurrence", "steps") => o.cuda_recurrence = RecurrenceForm::Steps,
                ("cuda-recurrence", _) => return Err(bad("cuda-recurrence=chunks|steps")),
                ("cuda-attention", "portable") => o.cuda_portable_attention = true,
                ("cuda-attention", "fastest") => o.cuda_portable_attention = false,
                ("cuda-attention", _) => return Err(bad("cuda-attention=fastest|portable")),
                ("cuda-sources" | "wgpu-sources", dir) => {
                    let dir = PathBuf::from(dir);
                    // A mistyped folder would silently compare the built-in kernels with
                    // themselves.
                    if !dir.is_dir() {
                        return Err(bad(&format!("{key}=DIR, an existing folder")));
                    }
                    if key == "cuda-sources" {
                        o.cuda_sources = Some(dir);
                    } else {
                        o.wgpu_sources = Some(dir);
                    }
                }
                _ => {
                    return Err(bad(
                        "one of wgpu-tiles, wgpu-coop, wgpu-checks, wgpu-max-binding, \
                         wgpu-sources, cuda-experts, cuda-attention, cuda-sources",
                    ));
                }
            }
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_parses_and_nothing_else_does() {
        let dir = std::env::temp_dir();
        let text = format!(
            "wgpu-tiles=8:8:32:16:16, wgpu-coop=off,wgpu-checks=all,wgpu-max-binding=1048576,\
             wgpu-sources={},cuda-experts=loop,cuda-attention=portable,cuda-recurrence=steps,\
             cuda-sources={}",
            dir.display(),
            dir.display()
        );
        let o = BackendOptions::parse(&text).unwrap();
        let want = BackendOptions {
            wgpu_tiles: Some(TileConfig {
                mm_tx: 8,
                mm_ty: 8,
                mm_bk: 32,
                mm_bk_per_step: 16,
                attn_qb: 16,
            }),
            wgpu_no_coop: true,
            wgpu_checks: ShaderChecks::All,
            wgpu_max_binding: Some(1 << 20),
            wgpu_sources: Some(dir.clone()),
            cuda_experts_loop: true,
            cuda_recurrence: RecurrenceForm::Steps,
            cuda_portable_attention: true,
            cuda_sources: Some(dir),
        };
        assert_eq!(o, want);
        assert_eq!(
            BackendOptions::parse("").unwrap(),
            BackendOptions::default()
        );
        for bad in [
            "wgpu-tiles=8:8:32",
            "wgpu-tiles=8:8:x:16:16",
            "wgpu-coop=maybe",
            "wgpu-max-binding=4k",
            "wgpu-max-binding=1024",
            "cuda-experts",
            "cuda-recurrence=scan",
            "cuda-sources=/no/such/folder",
            "wgpu-sources=/no/such/folder",
            "wgpu-unchecked=all",
        ] {
            let e = BackendOptions::parse(bad).unwrap_err().to_string();
            assert!(e.contains(DEV_VAR) && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn unchecked_shaders_only_in_debug_builds() {
        let parsed = BackendOptions::parse("wgpu-checks=none");
        #[cfg(debug_assertions)]
        assert_eq!(parsed.unwrap().wgpu_checks, ShaderChecks::None);
        #[cfg(not(debug_assertions))]
        assert!(
            parsed
                .unwrap_err()
                .to_string()
                .contains("debug builds only")
        );
    }
}
