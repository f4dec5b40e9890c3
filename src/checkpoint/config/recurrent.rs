//! The recurrent layers of hybrid models: gated DeltaNet (Qwen3.5's `linear_attention`
//! layers), as transformers' `Qwen3_5GatedDeltaNet` defines it, Kimi Delta Attention
//! (`KimiLinearDeltaAttention`), Mamba-2, and LFM2's short convolution (`Lfm2ShortConv`).

use serde_json::Value;

use super::{Architecture, Keys};

/// Gated DeltaNet's geometry: `in_proj_qkv` gives queries and keys (`k_heads` heads of
/// `k_dim`) and values (`v_heads` heads of `v_dim`; each query/key head serves `v_heads /
/// k_heads` value heads, consecutive ones unless `tiled_values`), which a depthwise causal
/// convolution of `conv_kernel` taps (then SiLU) mixes along the sequence before the delta rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeltaNetConfig {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub conv_kernel: usize,
    pub layout: DeltaNetLayout,
    /// The value heads (and every row, column and value of one) in tiled order, value head
    /// `j * k_heads + g` the `j`-th of key head `g`: llama.cpp's converter reorders Qwen3.5's
    /// so for ggml's broadcast. transformers' order is grouped (`g * per + j`).
    pub tiled_values: bool,
}

/// How a checkpoint stores a DeltaNet's projections, and which delta rule it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeltaNetLayout {
    /// Qwen3.5: `linear_attn.in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Split,
    /// Qwen3-Next: `linear_attn.in_proj_qkvz` and `in_proj_ba`, grouped by key head.
    Fused,
    /// Kimi Delta Attention (Kimi-Linear): `self_attn.q_proj`/`k_proj`/`v_proj` each with its
    /// own convolution, low-rank decay and output-gate projections (`f_a_proj` then `f_b_proj`,
    /// `g_a_proj` then `g_b_proj`), `b_proj`; a decay per key channel, the output normed and
    /// gated by a sigmoid; as many key heads as value heads, of one width.
    Kimi,
}

impl DeltaNetConfig {
    /// Queries (or keys) per token: `k_heads * k_dim`.
    pub fn key_width(&self) -> usize {
        self.k_heads * self.k_dim
    }

    /// Values (and the output) per token: `v_heads * v_dim`.
    pub fn value_width(&self) -> usize {
        self.v_heads * self.v_dim
    }

    /// The convolved channels: queries, keys and values side by side.
    pub fn conv_width(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }

    /// Consecutive value heads that read one key head: `v_heads / k_heads` in transformers'
    /// grouped order, 1 where tiled; value head `h` reads key head `(h / span) % k_heads`.
    pub fn key_head_span(&self) -> usize {
        match self.tiled_values {
            true => 1,
            false => self.v_heads / self.k_heads,
        }
    }

    /// The key head value head `h` reads.
    pub fn key_head(&self, h: usize) -> usize {
        (h / self.key_head_span()) % self.k_heads
    }

    /// transformers' `Qwen3_5TextConfig` / `Qwen3NextConfig` keys (Kimi-Linear's
    /// `linear_num_heads`, `linear_head_dim` for both key and value heads), with its defaults
    /// where a key is absent.
    pub(super) fn from_json(j: &Value, layout: DeltaNetLayout) -> Result<Self, String> {
        let keys = Keys(j);
        let dim = |k: &str, default: usize, max: usize| -> Result<usize, String> {
            match keys.usize(k)?.unwrap_or(default) {
                v if v > 0 && v <= max => Ok(v),
                v => Err(format!("`{k}` is {v}; it must be 1 to {max}")),
            }
        };
        let c = match layout {
            DeltaNetLayout::Kimi => {
                let (heads, width) = (
                    dim("linear_num_heads", 32, 1 << 12)?,
                    dim("linear_head_dim", 128, 1 << 10)?,
                );
                Self {
                    k_heads: heads,
                    v_heads: heads,
                    k_dim: width,
                    v_dim: width,
                    conv_kernel: dim("linear_conv_kernel_dim", 4, 64)?,
                    layout,
                    tiled_values: false,
                }
            }
            _ => Self {
                k_heads: dim("linear_num_key_heads", 16, 1 << 12)?,
                v_heads: dim("linear_num_value_heads", 32, 1 << 12)?,
                k_dim: dim("linear_key_head_dim", 128, 1 << 10)?,
                v_dim: dim("linear_value_head_dim", 128, 1 << 10)?,
                conv_kernel: dim("linear_conv_kernel_dim", 4, 64)?,
                layout,
                tiled_values: false,
            },
        };
        if !c.v_heads.is_multiple_of(c.k_heads) {
            return Err(format!(
                "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                c.v_heads, c.k_heads
            ));
        }
        Ok(c)
    }
}

/// Mamba-2's geometry (Nemotron-H's `linear_attention` blocks, `NemotronHMamba2Mixer`;
/// Falcon-H1's `FalconH1Mixer` beside each layer's attention):
/// `in_proj` gives the gate `z` (`heads * head_dim`), the convolved x, B and C (B and C a group
/// of `state` values per each of `groups` groups), and `dt` (one per head); the scan's state
/// is `state x head_dim` per head; `dt` is clamped to `[dt_min, dt_max]`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct MambaConfig {
    pub heads: usize,
    pub head_dim: usize,
    pub state: usize,
    pub groups: usize,
    pub conv_kernel: usize,
    /// The convolution's bias (`use_conv_bias`).
    pub conv_bias: bool,
    /// `in_proj` carries a bias (`use_bias` / `mamba_proj_bias`).
    pub in_bias: bool,
    /// `out_proj` carries a bias (Nemotron-H's `use_bias`; Falcon-H1's `projectors_bias`).
    pub out_bias: bool,
    pub dt_min: f32,
    pub dt_max: f32,
    /// The norm between the scan and `out_proj`.
    pub norm: MambaNorm,
}

/// What Mamba-2 does with the scan `y` and the gate `z` before `out_proj`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MambaNorm {
    /// `rms_norm(y * silu(z))` in groups (Nemotron-H; Falcon-H1's `mamba_rms_norm` with
    /// `mamba_norm_before_gate: false`, its 1.5B-34B models).
    GateFirst,
    /// `rms_norm(y) * silu(z)` in groups (Falcon-H1's `mamba_norm_before_gate: true`).
    NormFirst,
    /// `y * silu(z)`, no norm and no norm weight (Falcon-H1 without `mamba_rms_norm`, its 0.5B).
    Ungated,
}

impl MambaConfig {
    /// The scan's values per token: `heads * head_dim` (Mamba's intermediate size).
    pub fn inner(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The scan as the linear recurrence's geometry: B and C are its keys and queries (a key
    /// head a group), x its values (a value head a head).
    pub fn as_recurrence(&self) -> DeltaNetConfig {
        DeltaNetConfig {
            k_heads: self.groups,
            v_heads: self.heads,
            k_dim: self.state,
            v_dim: self.head_dim,
            conv_kernel: self.conv_kernel,
            layout: DeltaNetLayout::Split,
            tiled_values: false,
        }
    }

    /// `in_proj`'s outputs: z, the convolved channels (x, B, C), dt.
    pub fn in_proj_width(&self) -> usize {
        self.inner() + self.as_recurrence().conv_width() + self.heads
    }

    /// transformers' `NemotronHConfig` keys (and the older names it maps), with its defaults;
    /// Nemotron-H's mixer clamps `dt` below at `time_step_min` only.
    pub(super) fn from_json(j: &Value) -> Result<Self, String> {
        let keys = Keys(j);
        let either = |new: &str, old: &str| -> Result<Option<usize>, String> {
            Ok(keys.usize(new)?.or(keys.usize(old)?))
        };
        let dim = |v: Option<usize>, k: &str, default: usize, max: usize| match v.unwrap_or(default)
        {
            v if v > 0 && v <= max => Ok(v),
            v => Err(format!("`{k}` is {v}; it must be 1 to {max}")),
        };
        match keys.str("mamba_hidden_act")? {
            None | Some("silu") => {}
            Some(other) => {
                return Err(format!(
                    "unsupported mamba_hidden_act `{other}` (supported: silu)"
                ));
            }
        }
        let biased = keys.bool("mamba_proj_bias")?.unwrap_or(false)
            || keys.bool("use_bias")?.unwrap_or(false);
        let c = Self {
            heads: dim(
                keys.usize("mamba_num_heads")?,
                "mamba_num_heads",
                128,
                1 << 12,
            )?,
            head_dim: dim(keys.usize("mamba_head_dim")?, "mamba_head_dim", 64, 1 << 10)?,
            state: dim(
                keys.usize("ssm_state_size")?,
                "ssm_state_size",
                128,
                1 << 10,
            )?,
            groups: dim(
                either("n_groups", "mamba_n_groups")?,
                "n_groups",
                8,
                1 << 10,
            )?,
            conv_kernel: dim(either("conv_kernel", "mamba_d_conv")?, "conv_kernel", 4, 64)?,
            conv_bias: match keys.bool("use_conv_bias")? {
                Some(b) => b,
                None => keys.bool("mamba_conv_bias")?.unwrap_or(true),
            },
            in_bias: biased,
            out_bias: biased,
            dt_min: match keys.f64("time_step_min")? {
                Some(v) => v,
                None => keys.f64("mamba_dt_min")?.unwrap_or(1e-3),
            } as f32,
            dt_max: f32::INFINITY,
            norm: MambaNorm::GateFirst,
        };
        c.check_groups("mamba_num_heads", "n_groups")
    }

    /// The `mamba_*` keys of transformers' `FalconH1Config`, `GraniteMoeHybridConfig` and
    /// `BambaConfig`, with
    /// their defaults: the scan `mamba_d_ssm` (Falcon-H1) or `mamba_expand * hidden_size` wide
    /// in `mamba_n_heads` heads of `mamba_d_head` (`auto`: the width over the heads), `dt`
    /// clamped to `time_step_limit`; Falcon-H1's norm as `mamba_rms_norm` and
    /// `mamba_norm_before_gate` say and `out_proj`'s bias as `projectors_bias`, Granite's and
    /// Bamba's norm gate first and both biases `mamba_proj_bias`.
    pub(super) fn mamba_keyed(
        j: &Value,
        hidden: usize,
        arch: Architecture,
    ) -> Result<Self, String> {
        let falcon = arch == Architecture::FalconH1;
        let keys = Keys(j);
        let dim = |k: &str, default: usize, max: usize| match keys.usize(k)?.unwrap_or(default) {
            v if v > 0 && v <= max => Ok(v),
            v => Err(format!("`{k}` is {v}; it must be 1 to {max}")),
        };
        let family = match arch {
            Architecture::FalconH1 => "Falcon-H1",
            Architecture::Bamba => "Bamba",
            _ => "Granite 4.0-H",
        };
        match keys.str("hidden_act")? {
            None | Some("silu") => {}
            Some(other) => {
                return Err(format!(
                    "unsupported hidden_act `{other}` for {family} (supported: silu)"
                ));
            }
        }
        let inner = match keys.usize("mamba_d_ssm")?.filter(|_| falcon) {
            Some(w) => w,
            None => dim("mamba_expand", 2, 64)? * hidden,
        };
        let heads = dim("mamba_n_heads", 128, 1 << 12)?;
        let head_dim = match j.get("mamba_d_head") {
            None | Some(Value::Null) => inner / heads,
            Some(Value::String(s)) if s == "auto" => inner / heads,
            Some(_) => dim("mamba_d_head", 64, 1 << 10)?,
        };
        if head_dim == 0 || heads * head_dim != inner {
            return Err(format!(
                "mamba_n_heads {heads} x mamba_d_head {head_dim} is not the Mamba width {inner}"
            ));
        }
        let (dt_min, dt_max) = time_step_limit(j)?;
        let c = Self {
            heads,
            head_dim,
            state: dim("mamba_d_state", 256, 1 << 10)?,
            groups: dim("mamba_n_groups", 1, 1 << 10)?,
            conv_kernel: dim("mamba_d_conv", 4, 64)?,
            conv_bias: keys.bool("mamba_conv_bias")?.unwrap_or(true),
            in_bias: keys.bool("mamba_proj_bias")?.unwrap_or(false),
            out_bias: match falcon {
                true => keys.bool("projectors_bias")?.unwrap_or(false),
                false => keys.bool("mamba_proj_bias")?.unwrap_or(false),
            },
            dt_min,
            dt_max,
            norm: match (
                falcon,
                keys.bool("mamba_rms_norm")?.unwrap_or(false),
                keys.bool("mamba_norm_before_gate")?.unwrap_or(true),
            ) {
                (false, _, _) | (true, true, false) => MambaNorm::GateFirst,
                (true, false, _) => MambaNorm::Ungated,
                (true, true, true) => MambaNorm::NormFirst,
            },
        };
        c.check_groups("mamba_n_heads", "mamba_n_groups")
    }

    fn check_groups(self, heads: &str, groups: &str) -> Result<Self, String> {
        if !self.heads.is_multiple_of(self.groups) {
            return Err(format!(
                "{heads} {} is not a multiple of {groups} {}",
                self.heads, self.groups
            ));
        }
        Ok(self)
    }
}

/// Falcon-H1's and Granite's `time_step_limit` `[min, max]` (null: no limit, `(0, inf)`); transformers 5
/// writes infinities as `{"__float__": "Infinity"}`.
fn time_step_limit(j: &Value) -> Result<(f32, f32), String> {
    let bound = |v: &Value| -> Option<f32> {
        match v {
            Value::Number(n) => n.as_f64().map(|x| x as f32),
            Value::Object(o) => match o.get("__float__")?.as_str()? {
                "Infinity" | "inf" => Some(f32::INFINITY),
                "-Infinity" | "-inf" => Some(f32::NEG_INFINITY),
                _ => None,
            },
            _ => None,
        }
    };
    let v = match j.get("time_step_limit") {
        None | Some(Value::Null) => return Ok((0.0, f32::INFINITY)),
        Some(v) => v,
    };
    match v
        .as_array()
        .map(|a| a.iter().map(bound).collect::<Vec<_>>())
    {
        Some(b) if b.len() == 2 => match (b[0], b[1]) {
            (Some(lo), Some(hi)) if lo <= hi => Ok((lo, hi)),
            _ => Err(format!("`time_step_limit` is {v}, not [min, max]")),
        },
        _ => Err(format!("`time_step_limit` is {v}, not [min, max]")),
    }
}

/// LFM2's short convolution (`conv` layers): `in_proj` gives `B`, `C` and `x` (each
/// `hidden_size` wide), `B * x` goes through a depthwise causal convolution of `taps` taps
/// (no activation), `C` times that through `out_proj`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ShortConvConfig {
    /// `conv_L_cache`.
    pub taps: usize,
    /// `conv_bias`: `in_proj`, the convolution and `out_proj` carry biases.
    pub bias: bool,
}

impl ShortConvConfig {
    /// transformers' `Lfm2Config` keys, with its defaults.
    pub(super) fn from_json(j: &Value) -> Result<Self, String> {
        let keys = Keys(j);
        let taps = keys.usize("conv_L_cache")?.unwrap_or(3);
        if taps == 0 || taps > 64 {
            return Err(format!("`conv_L_cache` is {taps}; it must be 1 to 64"));
        }
        Ok(Self {
            taps,
            bias: keys.bool("conv_bias")?.unwrap_or(false),
        })
    }
}

/// LFM2's MLP width as `Lfm2MLP` derives it: with `block_auto_adjust_ff_dim`, two thirds of
/// `intermediate_size` (`block_ff_dim`), times `block_ffn_dim_multiplier` and rounded up to a
/// multiple of `block_multiple_of` where a multiplier is given.
pub(super) fn lfm2_mlp_width(j: &Value) -> Result<usize, String> {
    let keys = Keys(j);
    let stated = match keys.usize("block_ff_dim")? {
        Some(w) => w,
        None => keys
            .usize("intermediate_size")?
            .ok_or("missing `intermediate_size`")?,
    };
    if !keys.bool("block_auto_adjust_ff_dim")?.unwrap_or(true) {
        return Ok(stated);
    }
    let mut width = 2 * stated / 3;
    let multiplier = match j.get("block_ffn_dim_multiplier") {
        None => Some(1.0),
        Some(_) => keys.f64("block_ffn_dim_multiplier")?,
    };
    if let Some(m) = multiplier {
        if !(m > 0.0 && m.is_finite()) {
            return Err(format!(
                "`block_ffn_dim_multiplier` is {m}; it must be positive"
            ));
        }
        // Python's `int()` truncates.
        width = (m * width as f64) as usize;
        let multiple = keys.usize("block_multiple_of")?.unwrap_or(256);
        if multiple == 0 {
            return Err("`block_multiple_of` is 0".into());
        }
        width = width.div_ceil(multiple) * multiple;
    }
    Ok(width)
}
