//! A checkpoint's quantization config -> the scheme of each linear layer. One reader per
//! `quant_method` (compressed-tensors; the quantizers' native GPTQ, AWQ, FP8 and ModelOpt
//! configs), all producing the same scheme groups. Anything that cannot be computed exactly
//! is refused.

mod compressed_tensors;
mod native;

use std::path::Path;

use regex::Regex;
use serde_json::Value;

use crate::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Strategy {
    Tensor,
    Channel,
    Group(usize),
    Block(usize, usize),
    Token,
    TensorGroup(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum NumType {
    Int,
    Float,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct QuantArgs {
    pub num_bits: u32,
    pub num_type: NumType,
    pub symmetric: bool,
    pub strategy: Strategy,
    /// `true`, `false` or `"local"` in the config.
    pub dynamic: String,
    /// `scale_dtype: uint8`: E8M0 power-of-two scales, the MX formats' marker.
    pub e8m0_scales: bool,
}

/// The `quant_method`s quantppl reads.
const SUPPORTED_METHODS: [&str; 6] = [
    "compressed-tensors",
    "gptq",
    "awq",
    "fp8",
    "modelopt",
    "mxfp4",
];

/// Weight storage formats quantppl reads exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Format {
    Dense,
    PackQuantized,
    Nvfp4PackQuantized,
    /// `mxfp4-pack-quantized`: E2M1 pairs with E8M0 scales per 32.
    Mxfp4PackQuantized,
    /// ModelOpt NVFP4: `weight` (E2M1 pairs), FP8 `weight_scale` per 16, `weight_scale_2`;
    /// W4A4 activations from `input_scale`.
    ModelOptNvfp4,
    /// ModelOpt FP8: FP8 `weight`, per-tensor `weight_scale`, static per-tensor `input_scale`.
    ModelOptFp8,
    /// Native FP8 (`quant_method: fp8`): FP8 `weight` with `weight_scale_inv` per block.
    Fp8Block,
    /// `float-quantized`, `int-quantized`, `naive-quantized` and `mxfp8-quantized` (E8M0
    /// scales) share one unpacked layout.
    Naive,
    /// GPTQ's `qweight [in*b/32, out]` packed along `in`, `qzeros`, `scales [groups, out]`,
    /// `g_idx`; v1 (`checkpoint_format: gptq`) stores each zero point minus one.
    Gptq {
        v2: bool,
    },
    /// AutoAWQ's GEMM layout: `qweight [in, out/8]` packed along `out` in AWQ's nibble order;
    /// with `gemv`, its GEMV layout: `qweight [out, in/8]`, `qzeros` and `scales` per output
    /// row, packed along `in` in natural order, zero points and scales padded.
    Awq {
        gemv: bool,
    },
    /// gpt-oss's MXFP4 experts (`quant_method: mxfp4`): `*_blocks` E2M1 pairs and `*_scales`
    /// E8M0 per 32, named per expert as `weight_packed` / `weight_scale` by `Checkpoint::open`;
    /// decoded as compressed-tensors' MXFP4 (the same values, transformers'
    /// `convert_moe_packed_tensors`).
    GptOssMxfp4,
    /// DeepSeek-V4's FP4 experts (native FP8's `expert_dtype: fp4`): `weight` E2M1 pairs
    /// (stored as int8) with an E8M0 `weight_scale_inv` per 32 inputs, decoded as
    /// compressed-tensors' MXFP4 (transformers' `Fp8Dequantize`: the same values).
    Fp4Experts,
}

impl Format {
    /// The tensor whose presence marks a module as quantized, for formats whose config names
    /// no modules (the quantizers' native formats): a module without it is read dense.
    fn marker(self) -> Option<&'static str> {
        match self {
            Format::Gptq { .. } | Format::Awq { .. } => Some("qweight"),
            Format::ModelOptNvfp4 | Format::ModelOptFp8 => Some("weight_scale"),
            Format::Fp8Block | Format::Fp4Experts => Some("weight_scale_inv"),
            Format::GptOssMxfp4 => Some("weight_packed"),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct SchemeGroup {
    pub name: String,
    targets: Vec<Target>,
    pub format: Format,
    pub format_name: String,
    pub weights: Option<QuantArgs>,
    pub input_activations: Option<QuantArgs>,
}

#[derive(Clone, Debug)]
enum Target {
    /// "Linear": every linear layer (lm_head included unless ignored).
    AnyLinear,
    Exact(String),
    Pattern(Regex),
    /// AutoAWQ's `modules_to_not_convert`: any module whose name contains it.
    Contains(String),
    /// transformers' `modules_to_not_convert` (`should_convert_module`): the pattern as a
    /// regex from the start of the name to a module boundary, or the name ending with it.
    /// `to_boundary` is the pattern followed by a dot or the end, `prefix` the pattern alone.
    ModuleBoundary {
        pattern: String,
        to_boundary: Regex,
        prefix: Regex,
    },
}

impl Target {
    fn parse(s: &str, what: &str) -> Result<Self> {
        if let Some(p) = s.strip_prefix("re:") {
            // Python's re.match anchors at the start only.
            let re = Regex::new(&format!("^(?:{p})"))
                .map_err(|e| Error::unsupported(what, "regex", format!("`{p}`: {e}")))?;
            Ok(Target::Pattern(re))
        } else if s == "Linear" {
            Ok(Target::AnyLinear)
        } else {
            Ok(Target::Exact(s.to_string()))
        }
    }

    fn matches(&self, module: &str) -> bool {
        match self {
            Target::AnyLinear => true,
            Target::Exact(name) => name == module,
            Target::Pattern(re) => re.is_match(module),
            Target::Contains(part) => module.contains(part.as_str()),
            Target::ModuleBoundary {
                pattern,
                to_boundary,
                prefix,
            } => {
                // Python's boundary `(?:(?<=\.)|(?=\.|$))` after the match: `to_boundary` is
                // the look-ahead; the look-behind, a match that ends with the dot itself.
                to_boundary.is_match(module)
                    || module.ends_with(pattern.as_str())
                    || prefix
                        .find(module)
                        .is_some_and(|m| module[..m.end()].ends_with('.'))
            }
        }
    }

    /// transformers' reading of a `modules_to_not_convert` entry.
    fn module_boundary(pattern: String, what: &str) -> Result<Self> {
        let regex = |tail: &str| {
            Regex::new(&format!("^(?:{pattern}){tail}")).map_err(|e| {
                Error::unsupported(what, "modules_to_not_convert", format!("`{pattern}`: {e}"))
            })
        };
        Ok(Target::ModuleBoundary {
            to_boundary: regex(r"(?:\.|$)")?,
            prefix: regex("")?,
            pattern,
        })
    }
}

#[derive(Clone, Debug)]
pub struct QuantConfig {
    pub groups: Vec<SchemeGroup>,
    ignore: Vec<Target>,
    pub kv_cache_quantized: bool,
}

impl QuantConfig {
    /// Reads the checkpoint's quantization config: `quantization_config` (or the pre-0.7
    /// `compression_config`) in `config.json`, or the quantizer's own file beside it
    /// (`quantize_config.json` of GPTQ, `hf_quant_config.json` of ModelOpt); `None` for dense
    /// models. Each `quant_method` has its own reader; all end in the same scheme groups.
    pub fn from_config(config: &Value, file: &Path) -> Result<Option<Self>> {
        let dir = file.parent().unwrap_or(Path::new("."));
        let Some((q, source)) = native::quantization_json(config, file, dir)? else {
            return Ok(None);
        };
        let what = format!("{} quantization_config", source.display());
        let method = native::str_field(&q, "quant_method", &what)?.unwrap_or("");
        match method.to_ascii_lowercase().as_str() {
            "compressed-tensors" => compressed_tensors::read(&q, &what).map(Some),
            "gptq" => native::gptq(&q, &what).map(Some),
            "awq" => native::awq(&q, &what).map(Some),
            "fp8" => native::fp8_blocks(&q, config, file, &what).map(Some),
            "modelopt" => native::modelopt(&q, &what).map(Some),
            "mxfp4" => Ok(Some(native::gpt_oss_mxfp4())),
            other => Err(Error::unsupported(
                what,
                "quant_method",
                format!("`{other}` (supported: {})", SUPPORTED_METHODS.join(", ")),
            )),
        }
    }

    /// Whether the config leaves `module` dense by name.
    pub fn ignores(&self, module: &str) -> bool {
        self.ignore.iter().any(|t| t.matches(module))
    }

    /// The scheme group that governs linear `module`, or `None` if it stays dense. `on_disk`
    /// tells whether a tensor of the module exists (formats whose config names no modules
    /// quantize exactly those that hold their packed tensors).
    pub fn scheme_for(&self, module: &str, on_disk: impl Fn(&str) -> bool) -> Option<&SchemeGroup> {
        if self.ignores(module) {
            return None;
        }
        self.groups
            .iter()
            .find(|g| g.targets.iter().any(|t| t.matches(module)))
            .filter(|g| {
                g.format
                    .marker()
                    .is_none_or(|m| on_disk(&format!("{module}.{m}")))
            })
    }
}
