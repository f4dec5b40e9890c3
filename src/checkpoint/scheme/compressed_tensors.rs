//! compressed-tensors `quantization_config` (docs/formats.md §1.1).

use serde_json::Value;

use super::{Format, NumType, QuantArgs, QuantConfig, SchemeGroup, Strategy, Target};
use crate::checkpoint::config::Keys;
use crate::{Error, Result};

/// The scheme groups of a compressed-tensors `quantization_config` `q`; `what` names it.
pub(super) fn read(q: &Value, what: &str) -> Result<QuantConfig> {
    for field in ["transform_config", "sparsity_config"] {
        if q.get(field)
            .is_some_and(|v| v.as_object().is_some_and(|o| !o.is_empty()))
        {
            return Err(Error::unsupported(
                what,
                field,
                "non-empty (online rotations / sparsity cannot be evaluated exactly)",
            ));
        }
    }
    if let Some(status) = q.get("quantization_status").and_then(Value::as_str)
        && status != "compressed"
    {
        return Err(Error::unsupported(
            what,
            "quantization_status",
            format!("`{status}` (only `compressed` checkpoints hold packed weights)"),
        ));
    }
    let global_format = q.get("format").and_then(Value::as_str).unwrap_or("dense");
    let mut groups = Vec::new();
    if let Some(cg) = q.get("config_groups").and_then(Value::as_object) {
        for (name, g) in cg {
            let gwhat = format!("{what} config_groups.{name}");
            let targets = g
                .get("targets")
                .and_then(Value::as_array)
                .ok_or_else(|| Error::unsupported(&gwhat, "targets", "missing"))?
                .iter()
                .filter_map(Value::as_str)
                .map(|t| Target::parse(t, &gwhat))
                .collect::<Result<Vec<_>>>()?;
            let format_name = g
                .get("format")
                .and_then(Value::as_str)
                .unwrap_or(global_format)
                .to_string();
            let format = match format_name.as_str() {
                "dense" => Format::Dense,
                "pack-quantized" => Format::PackQuantized,
                "nvfp4-pack-quantized" => Format::Nvfp4PackQuantized,
                "mxfp4-pack-quantized" => Format::Mxfp4PackQuantized,
                "float-quantized" | "int-quantized" | "naive-quantized" | "mxfp8-quantized" => {
                    Format::Naive
                }
                other => {
                    return Err(Error::unsupported(
                        &gwhat,
                        "format",
                        format!(
                            "`{other}` (supported: pack-quantized, nvfp4-pack-quantized, \
                                 mxfp4-pack-quantized, float-quantized, int-quantized, \
                                 naive-quantized, mxfp8-quantized, dense)"
                        ),
                    ));
                }
            };
            let weights = parse_args(g.get("weights"), &format!("{gwhat}.weights"))?;
            let input_activations = parse_args(
                g.get("input_activations"),
                &format!("{gwhat}.input_activations"),
            )?;
            if g.get("output_activations").is_some_and(|v| !v.is_null()) {
                return Err(Error::unsupported(
                    gwhat,
                    "output_activations",
                    "output activation quantization",
                ));
            }
            groups.push(SchemeGroup {
                name: name.clone(),
                targets,
                format,
                format_name,
                weights,
                input_activations,
            });
        }
    }
    let ignore = q
        .get("ignore")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|t| Target::parse(t, what))
                .collect::<Result<Vec<_>>>()
        })
        .transpose()?
        .unwrap_or_default();
    Ok(QuantConfig {
        groups,
        ignore,
        kv_cache_quantized: q.get("kv_cache_scheme").is_some_and(|v| !v.is_null()),
    })
}

fn parse_args(v: Option<&Value>, what: &str) -> Result<Option<QuantArgs>> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let keys = Keys(v);
    let typed = |e: String| Error::unsupported(what, "quantization args", e);
    let num_bits = match keys.usize("num_bits").map_err(typed)? {
        None => 8,
        Some(b @ 1..=32) => b as u32,
        Some(b) => return Err(Error::unsupported(what, "num_bits", b.to_string())),
    };
    let num_type = match keys.str("type").map_err(typed)?.unwrap_or("int") {
        "int" => NumType::Int,
        "float" => NumType::Float,
        other => return Err(Error::unsupported(what, "type", format!("`{other}`"))),
    };
    let group_size = match v.get("group_size") {
        None | Some(Value::Null) => None,
        Some(g) => Some(
            g.as_i64()
                .ok_or_else(|| typed(format!("`group_size` is {g}, not an integer")))?,
        ),
    };
    let strategy_name = keys.str("strategy").map_err(typed)?;
    let strategy = match (strategy_name, group_size) {
        (Some("tensor"), _) => Strategy::Tensor,
        (Some("channel"), _) => Strategy::Channel,
        (Some("token"), _) => Strategy::Token,
        (Some("group"), Some(g)) if g > 0 => Strategy::Group(g as usize),
        (Some("tensor_group"), Some(g)) if g > 0 => Strategy::TensorGroup(g as usize),
        (Some("block"), _) => {
            let bs = parse_block(v.get("block_structure")).ok_or_else(|| {
                let got = v.get("block_structure").unwrap_or(&Value::Null);
                Error::unsupported(
                    what,
                    "block_structure",
                    format!("{got}: two positive sizes wanted"),
                )
            })?;
            Strategy::Block(bs.0, bs.1)
        }
        (None, None) => Strategy::Tensor,
        (None, Some(-1)) => Strategy::Channel,
        (None, Some(g)) if g > 0 => Strategy::Group(g as usize),
        (s, g) => {
            return Err(Error::unsupported(
                what,
                "strategy",
                format!("{s:?} with group_size {g:?}"),
            ));
        }
    };
    let dynamic = match v.get("dynamic") {
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::String(s)) => s.clone(),
        _ => "false".into(),
    };
    Ok(Some(QuantArgs {
        num_bits,
        num_type,
        symmetric: keys.bool("symmetric").map_err(typed)?.unwrap_or(true),
        strategy,
        dynamic,
        e8m0_scales: matches!(
            v.get("scale_dtype").and_then(Value::as_str),
            Some("torch.uint8" | "uint8")
        ),
    }))
}

/// `[rows, cols]` or `"RxC"`, both positive.
fn parse_block(v: Option<&Value>) -> Option<(usize, usize)> {
    let (r, c): (usize, usize) = match v? {
        Value::Array(a) if a.len() == 2 => (
            usize::try_from(a[0].as_u64()?).ok()?,
            usize::try_from(a[1].as_u64()?).ok()?,
        ),
        Value::String(s) => {
            let (a, b) = s.split_once('x')?;
            (a.trim().parse().ok()?, b.trim().parse().ok()?)
        }
        _ => return None,
    };
    (r > 0 && c > 0).then_some((r, c))
}
