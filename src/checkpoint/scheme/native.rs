//! The quantizers' own configs (GPTQ, AutoAWQ, docs/formats.md §2-3; native FP8 with
//! block scales; NVIDIA ModelOpt): where they live and the scheme groups they mean. Unlike compressed-tensors they name no modules; a module is
//! quantized when it holds the format's packed tensors (`Format::marker`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Format, NumType, QuantArgs, QuantConfig, SchemeGroup, Strategy, Target};
use crate::{Error, Result};

/// The quantization config and the file it came from: `config.json`'s `quantization_config`
/// (or compressed-tensors' older `compression_config`), else a quantizer's file beside it
/// (GPTQ's `quantize_config.json`, AutoAWQ's `quant_config.json`, ModelOpt's
/// `hf_quant_config.json`), which transformers also
/// reads when the config lacks one.
pub(super) fn quantization_json(
    config: &Value,
    file: &Path,
    dir: &Path,
) -> Result<Option<(Value, PathBuf)>> {
    if let Some(q) = config
        .get("quantization_config")
        .or_else(|| config.get("compression_config"))
    {
        return Ok(Some((q.clone(), file.to_path_buf())));
    }
    for (name, method) in [
        ("quantize_config.json", "gptq"),
        ("quant_config.json", "awq"),
        ("hf_quant_config.json", "modelopt"),
    ] {
        let path = dir.join(name);
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let mut q: Value = serde_json::from_str(&text)
            .map_err(|e| Error::format(&path, format!("invalid JSON: {e}")))?;
        if let Some(o) = q.as_object_mut() {
            o.entry("quant_method").or_insert(method.into());
        }
        return Ok(Some((q, path)));
    }
    Ok(None)
}

fn int_field(q: &Value, keys: &[&str], what: &str) -> Result<Option<i64>> {
    for key in keys {
        if let Some(v) = q.get(*key).filter(|v| !v.is_null()) {
            return v
                .as_i64()
                .map(Some)
                .ok_or_else(|| Error::unsupported(what, *key, format!("`{v}` is not an integer")));
        }
    }
    Ok(None)
}

/// The string at `key` (absent or null: `None`); any other type is an error naming it.
pub(super) fn str_field<'a>(q: &'a Value, key: &str, what: &str) -> Result<Option<&'a str>> {
    match q.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(Error::unsupported(
            what,
            key,
            format!("`{v}` is not a string"),
        )),
    }
}

/// The list of strings at `key` (absent or null: empty); another type, or an entry that is not
/// a string, is an error naming it (a module left out of the list would be read quantized).
fn string_list(q: &Value, key: &str, what: &str) -> Result<Vec<String>> {
    let items = match q.get(key) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(Error::unsupported(
                what,
                key,
                format!("`{v}` is not a list of module names"),
            ));
        }
    };
    items
        .iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.clone()),
            v => Err(Error::unsupported(
                what,
                key,
                format!("entry `{v}` is not a module name"),
            )),
        })
        .collect()
}

fn bool_field(q: &Value, key: &str, default: bool, what: &str) -> Result<bool> {
    match q.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(Error::unsupported(
            what,
            key,
            format!("`{v}` is not a boolean"),
        )),
    }
}

/// Integer weights of `bits` in groups of `group_size` (-1: one group per row).
fn int_args(bits: i64, group_size: i64, symmetric: bool, what: &str) -> Result<QuantArgs> {
    let strategy = match group_size {
        -1 => Strategy::Channel,
        g if g > 0 => Strategy::Group(g as usize),
        g => {
            return Err(Error::unsupported(
                what,
                "group_size",
                format!("{g} (a positive size or -1)"),
            ));
        }
    };
    Ok(QuantArgs {
        num_bits: bits as u32,
        num_type: NumType::Int,
        symmetric,
        strategy,
        dynamic: "false".into(),
        e8m0_scales: false,
    })
}

fn group(name: &str, targets: Vec<Target>, format: Format, args: Option<QuantArgs>) -> SchemeGroup {
    SchemeGroup {
        name: name.to_string(),
        targets,
        format,
        format_name: format!("{format:?}").to_lowercase(),
        weights: args,
        input_activations: None,
    }
}

/// GPTQ's bits, group size and symmetry at `q` (the top level or a `dynamic` override), each
/// falling back to `base`.
fn gptq_args(q: &Value, base: Option<&QuantArgs>, what: &str) -> Result<QuantArgs> {
    let bits = match int_field(q, &["bits"], what)? {
        Some(b) => b,
        None => base.map_or(4, |a| a.num_bits as i64),
    };
    if ![2, 3, 4, 8].contains(&bits) {
        return Err(Error::unsupported(
            what,
            "bits",
            format!("{bits} (GPTQ's int32 packing: 2, 3, 4 or 8)"),
        ));
    }
    let group_size = match int_field(q, &["group_size"], what)? {
        Some(g) => g,
        None => base.map_or(128, |a| match a.strategy {
            Strategy::Group(g) => g as i64,
            _ => -1,
        }),
    };
    let sym = bool_field(q, "sym", base.is_none_or(|a| a.symmetric), what)?;
    int_args(bits, group_size, sym, what)
}

/// GPTQ (AutoGPTQ, GPTQModel, optimum): one group for every module holding `qweight`, after
/// GPTQModel's `dynamic` overrides in their order (`-:regex` leaves a module dense).
pub(super) fn gptq(q: &Value, what: &str) -> Result<QuantConfig> {
    if bool_field(q, "is_marlin_format", false, what)? {
        return Err(Error::unsupported(
            what,
            "is_marlin_format",
            "true (AutoGPTQ's Marlin re-layout)",
        ));
    }
    let format = match str_field(q, "checkpoint_format", what)? {
        Some(f) => f,
        None => str_field(q, "format", what)?.unwrap_or("gptq"),
    };
    let v2 = match format {
        "gptq" => false,
        "gptq_v2" => true,
        other => {
            return Err(Error::unsupported(
                what,
                "checkpoint_format",
                format!("`{other}` (supported: gptq, gptq_v2)"),
            ));
        }
    };
    if let Some(p) = str_field(q, "pack_dtype", what)?
        && p != "int32"
    {
        return Err(Error::unsupported(
            what,
            "pack_dtype",
            format!("`{p}` (GPTQ tensors are read as int32 words)"),
        ));
    }
    let base = gptq_args(q, None, what)?;
    let mut groups = Vec::new();
    let dynamic = match q.get("dynamic") {
        None | Some(Value::Null) => None,
        Some(Value::Object(d)) => Some(d),
        Some(v) => {
            return Err(Error::unsupported(
                what,
                "dynamic",
                format!("`{v}` is not an object of module patterns"),
            ));
        }
    };
    if let Some(dynamic) = dynamic {
        for (pattern, overrides) in dynamic {
            let dwhat = format!("{what} dynamic.{pattern}");
            let (skip, regex) = match pattern.strip_prefix("-:") {
                Some(r) => (true, r),
                None => (false, pattern.strip_prefix("+:").unwrap_or(pattern)),
            };
            let target = Target::parse(&format!("re:{regex}"), &dwhat)?;
            groups.push(if skip {
                group(pattern, vec![target], Format::Dense, None)
            } else {
                let args = gptq_args(overrides, Some(&base), &dwhat)?;
                group(pattern, vec![target], Format::Gptq { v2 }, Some(args))
            });
        }
    }
    groups.push(group(
        "gptq",
        vec![Target::AnyLinear],
        Format::Gptq { v2 },
        Some(base),
    ));
    Ok(QuantConfig {
        groups,
        ignore: Vec::new(),
        kv_cache_quantized: false,
    })
}

/// AutoAWQ (`config.json` or its `quant_config.json` keys): 4-bit, GEMM and GEMV layouts.
pub(super) fn awq(q: &Value, what: &str) -> Result<QuantConfig> {
    let version = str_field(q, "version", what)?
        .unwrap_or("gemm")
        .to_ascii_lowercase();
    if version != "gemm" && version != "gemv" {
        return Err(Error::unsupported(
            what,
            "version",
            format!(
                "`{version}` (supported: gemm, gemv; gemv_fast, marlin and ipex lay codes out otherwise)"
            ),
        ));
    }
    let bits = int_field(q, &["bits", "w_bit"], what)?.unwrap_or(4);
    if bits != 4 {
        return Err(Error::unsupported(
            what,
            "bits",
            format!("{bits} (AWQ's GEMM and GEMV layouts hold 4-bit codes)"),
        ));
    }
    if !bool_field(q, "zero_point", true, what)? {
        return Err(Error::unsupported(
            what,
            "zero_point",
            "false (AWQ's GEMM and GEMV kernels always store zero points)",
        ));
    }
    let group_size = int_field(q, &["group_size", "q_group_size"], what)?.unwrap_or(128);
    let args = int_args(bits, group_size, false, what)?;
    let ignore = string_list(q, "modules_to_not_convert", what)?
        .into_iter()
        .map(Target::Contains)
        .collect();
    Ok(QuantConfig {
        groups: vec![group(
            "awq",
            vec![Target::AnyLinear],
            Format::Awq {
                gemv: version == "gemv",
            },
            Some(args),
        )],
        ignore,
        kv_cache_quantized: false,
    })
}

fn float_args(bits: u32, strategy: Strategy, dynamic: bool) -> QuantArgs {
    QuantArgs {
        num_bits: bits,
        num_type: NumType::Float,
        symmetric: true,
        strategy,
        dynamic: dynamic.to_string(),
        e8m0_scales: false,
    }
}

/// Native FP8 (DeepSeek-V3/R1, Qwen3-FP8; transformers' `FineGrainedFP8`): FP8 weights with
/// f32 `weight_scale_inv` per `weight_block_size` block (E8M0 where `scale_fmt: ue8m0`);
/// `activation_scheme: dynamic` means activations quantized per token and group of the block
/// width at run time (`ActQuant::Fp8PerTokenGroup`). DeepSeek-V4's routed experts are FP4
/// instead (`expert_dtype: fp4`, in `config` or, where transformers moves it, in `q`):
/// `Format::Fp4Experts`.
pub(super) fn fp8_blocks(
    q: &Value,
    config: &Value,
    file: &Path,
    what: &str,
) -> Result<QuantConfig> {
    let block = match q.get("weight_block_size") {
        Some(Value::Array(a)) if a.len() == 2 => match (a[0].as_u64(), a[1].as_u64()) {
            (Some(h), Some(w)) if h > 0 && w > 0 => (h as usize, w as usize),
            _ => {
                return Err(Error::unsupported(
                    what,
                    "weight_block_size",
                    format!("{a:?}"),
                ));
            }
        },
        None | Some(Value::Null) => {
            return Err(Error::unsupported(
                what,
                "weight_block_size",
                "missing (per-tensor native FP8 is not read; its compressed-tensors form is)",
            ));
        }
        Some(v) => {
            return Err(Error::unsupported(
                what,
                "weight_block_size",
                format!("`{v}`"),
            ));
        }
    };
    let config_what = file.display().to_string();
    let fp4_experts = match str_field(q, "expert_dtype", what)?
        .map(|d| (d, what))
        .or(str_field(config, "expert_dtype", &config_what)?.map(|d| (d, config_what.as_str())))
    {
        None | Some(("fp8", _)) => false,
        Some(("fp4", _)) => true,
        Some((other, source)) => {
            return Err(Error::unsupported(
                source,
                "expert_dtype",
                format!("`{other}` (supported: fp8, fp4)"),
            ));
        }
    };
    // The block scales' format: f32 multipliers, or E8M0 powers of two (read by their dtype).
    if let Some(fmt) = str_field(q, "scale_fmt", what)?.filter(|f| !["float", "ue8m0"].contains(f))
    {
        return Err(Error::unsupported(
            what,
            "scale_fmt",
            format!("`{fmt}` (supported: float, ue8m0)"),
        ));
    }
    let scheme = str_field(q, "activation_scheme", what)?.unwrap_or("dynamic");
    if scheme != "dynamic" {
        return Err(Error::unsupported(
            what,
            "activation_scheme",
            format!("`{scheme}` (supported: dynamic)"),
        ));
    }
    let mut g = group(
        "fp8",
        vec![Target::AnyLinear],
        Format::Fp8Block,
        Some(float_args(8, Strategy::Block(block.0, block.1), false)),
    );
    g.input_activations = Some(float_args(8, Strategy::Group(block.1), true));
    // The routed experts (`mlp.experts.E.*`, not the shared ones) first: a module takes the
    // first group that targets it.
    let experts = if fp4_experts {
        let mut e = group(
            "fp4-experts",
            vec![Target::parse(r"re:.*\.experts\.\d+\.", what)?],
            Format::Fp4Experts,
            Some(float_args(4, Strategy::Group(32), false)),
        );
        e.input_activations = Some(float_args(8, Strategy::Group(32), true));
        Some(e)
    } else {
        None
    };
    Ok(QuantConfig {
        groups: experts.into_iter().chain([g]).collect(),
        ignore: string_list(q, "modules_to_not_convert", what)?
            .into_iter()
            .map(|p| Target::module_boundary(p, what))
            .collect::<Result<_>>()?,
        kv_cache_quantized: false,
    })
}

/// gpt-oss's `quant_method: mxfp4`: the experts that hold MXFP4 blocks (its
/// `modules_to_not_convert` lists the rest, which hold none).
pub(super) fn gpt_oss_mxfp4() -> QuantConfig {
    QuantConfig {
        groups: vec![group(
            "mxfp4",
            vec![Target::AnyLinear],
            Format::GptOssMxfp4,
            Some(float_args(4, Strategy::Group(32), false)),
        )],
        ignore: Vec::new(),
        kv_cache_quantized: false,
    }
}

/// A ModelOpt `exclude_modules` entry: an fnmatch wildcard over the whole module name.
fn wildcard(pattern: &str, what: &str) -> Result<Target> {
    let mut re = String::from("re:");
    for c in pattern.chars() {
        match c {
            '*' => re.push_str(".*"),
            '?' => re.push('.'),
            c => re.push_str(&regex::escape(&c.to_string())),
        }
    }
    re.push('$');
    Target::parse(&re, what)
}

/// NVIDIA ModelOpt exports (`hf_quant_config.json`, or `quant_method: modelopt` in the config,
/// its fields at the top or under `quantization`): NVFP4 (W4A4) and FP8 (W8A8, static).
pub(super) fn modelopt(q: &Value, what: &str) -> Result<QuantConfig> {
    let q = q.get("quantization").unwrap_or(q);
    let algo = str_field(q, "quant_algo", what)?.unwrap_or("");
    let (format, weights, acts) = match algo {
        "NVFP4" => {
            let group_size = int_field(q, &["group_size"], what)?.unwrap_or(16);
            if group_size != 16 {
                return Err(Error::unsupported(
                    what,
                    "group_size",
                    format!("{group_size} (NVFP4 scales groups of 16)"),
                ));
            }
            let nvfp4 = float_args(4, Strategy::TensorGroup(16), false);
            (Format::ModelOptNvfp4, nvfp4.clone(), nvfp4)
        }
        "FP8" => (
            Format::ModelOptFp8,
            float_args(8, Strategy::Tensor, false),
            float_args(8, Strategy::Tensor, false),
        ),
        other => {
            return Err(Error::unsupported(
                what,
                "quant_algo",
                format!("`{other}` (supported: NVFP4, FP8)"),
            ));
        }
    };
    let mut g = group("modelopt", vec![Target::AnyLinear], format, Some(weights));
    g.input_activations = Some(acts);
    Ok(QuantConfig {
        groups: vec![g],
        ignore: string_list(q, "exclude_modules", what)?
            .iter()
            .map(|p| wildcard(p, what))
            .collect::<Result<_>>()?,
        kv_cache_quantized: q.get("kv_cache_quant_algo").is_some_and(|v| !v.is_null()),
    })
}
