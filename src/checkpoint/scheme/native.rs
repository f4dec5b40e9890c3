//! The quantizers' own configs (GPTQ, AutoAWQ; research/formats.md §2-3): where they live and
//! the scheme groups they mean. Unlike compressed-tensors they name no modules; a module is
//! quantized when it holds the format's packed tensors (`Format::marker`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Format, NumType, QuantArgs, QuantConfig, SchemeGroup, Strategy, Target};
use crate::{Error, Result};

/// The quantization config and the file it came from: `config.json`'s `quantization_config`
/// (or compressed-tensors' older `compression_config`), else a quantizer's file beside it
/// (GPTQ's `quantize_config.json`, AutoAWQ's `quant_config.json`), which transformers also
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
    let format = q
        .get("checkpoint_format")
        .or_else(|| q.get("format"))
        .and_then(Value::as_str)
        .unwrap_or("gptq");
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
    if let Some(p) = q.get("pack_dtype").and_then(Value::as_str)
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
    if let Some(dynamic) = q.get("dynamic").and_then(Value::as_object) {
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

/// AutoAWQ (`config.json` or its `quant_config.json` keys): 4-bit, GEMM layout only.
pub(super) fn awq(q: &Value, what: &str) -> Result<QuantConfig> {
    let version = q
        .get("version")
        .and_then(Value::as_str)
        .unwrap_or("gemm")
        .to_ascii_lowercase();
    if version != "gemm" {
        return Err(Error::unsupported(
            what,
            "version",
            format!(
                "`{version}` (supported: gemm; gemv, gemv_fast, marlin and ipex lay codes out otherwise)"
            ),
        ));
    }
    let bits = int_field(q, &["bits", "w_bit"], what)?.unwrap_or(4);
    if bits != 4 {
        return Err(Error::unsupported(
            what,
            "bits",
            format!("{bits} (AWQ's GEMM layout holds 4-bit codes)"),
        ));
    }
    if !bool_field(q, "zero_point", true, what)? {
        return Err(Error::unsupported(
            what,
            "zero_point",
            "false (AWQ's GEMM kernels always store zero points)",
        ));
    }
    let group_size = int_field(q, &["group_size", "q_group_size"], what)?.unwrap_or(128);
    let args = int_args(bits, group_size, false, what)?;
    let ignore = q
        .get("modules_to_not_convert")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|m| Target::Contains(m.to_string()))
                .collect()
        })
        .unwrap_or_default();
    Ok(QuantConfig {
        groups: vec![group(
            "awq",
            vec![Target::AnyLinear],
            Format::Awq,
            Some(args),
        )],
        ignore,
        kv_cache_quantized: false,
    })
}
