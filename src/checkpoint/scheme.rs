//! compressed-tensors `quantization_config` -> the scheme of each linear layer
//! (research/formats.md §1.1). Anything that cannot be computed exactly is refused.

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
}

/// Weight storage formats quantppl reads exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Format {
    Dense,
    PackQuantized,
    Nvfp4PackQuantized,
    /// `float-quantized`, `int-quantized` and `naive-quantized` share one unpacked layout.
    Naive,
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
        }
    }
}

#[derive(Clone, Debug)]
pub struct QuantConfig {
    pub groups: Vec<SchemeGroup>,
    ignore: Vec<Target>,
    pub kv_cache_quantized: bool,
}

impl QuantConfig {
    /// Reads `quantization_config` (or the pre-0.7 `compression_config`); `None` for dense models.
    pub fn from_config(config: &Value, file: &Path) -> Result<Option<Self>> {
        let Some(q) = config
            .get("quantization_config")
            .or_else(|| config.get("compression_config"))
        else {
            return Ok(None);
        };
        let what = format!("{} quantization_config", file.display());
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
        if method != "compressed-tensors" {
            return Err(Error::unsupported(
                what,
                "quant_method",
                format!("`{method}` (quantppl reads compressed-tensors checkpoints)"),
            ));
        }
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
                    "float-quantized" | "int-quantized" | "naive-quantized" => Format::Naive,
                    other => {
                        return Err(Error::unsupported(
                            &gwhat,
                            "format",
                            format!(
                                "`{other}` (supported: pack-quantized, nvfp4-pack-quantized, \
                                 float-quantized, int-quantized, naive-quantized, dense)"
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
                    .map(|t| Target::parse(t, &what))
                    .collect::<Result<Vec<_>>>()
            })
            .transpose()?
            .unwrap_or_default();
        Ok(Some(Self {
            groups,
            ignore,
            kv_cache_quantized: q.get("kv_cache_scheme").is_some_and(|v| !v.is_null()),
        }))
    }

    /// The scheme group that governs linear `module`, or `None` if it stays dense.
    pub fn scheme_for(&self, module: &str) -> Option<&SchemeGroup> {
        if self.ignore.iter().any(|t| t.matches(module)) {
            return None;
        }
        self.groups
            .iter()
            .find(|g| g.targets.iter().any(|t| t.matches(module)))
    }
}

fn parse_args(v: Option<&Value>, what: &str) -> Result<Option<QuantArgs>> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let num_bits = v.get("num_bits").and_then(Value::as_u64).unwrap_or(8) as u32;
    let num_type = match v.get("type").and_then(Value::as_str).unwrap_or("int") {
        "int" => NumType::Int,
        "float" => NumType::Float,
        other => return Err(Error::unsupported(what, "type", format!("`{other}`"))),
    };
    let group_size = v.get("group_size").and_then(Value::as_i64);
    let strategy_name = v.get("strategy").and_then(Value::as_str);
    let strategy = match (strategy_name, group_size) {
        (Some("tensor"), _) => Strategy::Tensor,
        (Some("channel"), _) => Strategy::Channel,
        (Some("token"), _) => Strategy::Token,
        (Some("group"), Some(g)) if g > 0 => Strategy::Group(g as usize),
        (Some("tensor_group"), Some(g)) if g > 0 => Strategy::TensorGroup(g as usize),
        (Some("block"), _) => {
            let bs = parse_block(v.get("block_structure")).ok_or_else(|| {
                Error::unsupported(what, "block_structure", "missing or malformed")
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
        symmetric: v.get("symmetric").and_then(Value::as_bool).unwrap_or(true),
        strategy,
        dynamic,
    }))
}

fn parse_block(v: Option<&Value>) -> Option<(usize, usize)> {
    match v? {
        Value::Array(a) if a.len() == 2 => Some((a[0].as_u64()? as usize, a[1].as_u64()? as usize)),
        Value::String(s) => {
            let (a, b) = s.split_once('x')?;
            Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
        }
        _ => None,
    }
}
