//! From a method and a text to windows: which token ids each forward pass reads and which
//! positions it scores. Pure functions, no devices.

pub mod settings;
pub mod task;
pub mod windows;

pub use settings::{EXL3_DEFAULT_ROWS, PlanSettings, ResolvedSettings, build_plan, method_name};
pub use windows::{DocStats, Method, Plan, Window, exl3, gptq, hf_stride, llamacpp, lm_eval};
