//! The recurrent layers of hybrid models: gated DeltaNet (Qwen3.5's `linear_attention`
//! layers), as transformers' `Qwen3_5GatedDeltaNet` defines it, and LFM2's short convolution
//! (`Lfm2ShortConv`).

use serde_json::Value;

use super::Keys;

/// Gated DeltaNet's geometry: `in_proj_qkv` gives queries and keys (`k_heads` heads of
/// `k_dim`) and values (`v_heads` heads of `v_dim`; each query/key head serves `v_heads /
/// k_heads` consecutive value heads), which a depthwise causal convolution of `conv_kernel`
/// taps (then SiLU) mixes along the sequence before the delta rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeltaNetConfig {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub conv_kernel: usize,
    /// `in_proj_qkvz` and `in_proj_ba`, grouped by key head (Qwen3-Next), instead of
    /// Qwen3.5's four projections.
    pub fused_projections: bool,
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

    /// transformers' `Qwen3_5TextConfig` / `Qwen3NextConfig` keys, with its defaults where a
    /// key is absent.
    pub(super) fn from_json(j: &Value, fused_projections: bool) -> Result<Self, String> {
        let keys = Keys(j);
        let dim = |k: &str, default: usize, max: usize| -> Result<usize, String> {
            match keys.usize(k)?.unwrap_or(default) {
                v if v > 0 && v <= max => Ok(v),
                v => Err(format!("`{k}` is {v}; it must be 1 to {max}")),
            }
        };
        let c = Self {
            k_heads: dim("linear_num_key_heads", 16, 1 << 12)?,
            v_heads: dim("linear_num_value_heads", 32, 1 << 12)?,
            k_dim: dim("linear_key_head_dim", 128, 1 << 10)?,
            v_dim: dim("linear_value_head_dim", 128, 1 << 10)?,
            conv_kernel: dim("linear_conv_kernel_dim", 4, 64)?,
            fused_projections,
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
