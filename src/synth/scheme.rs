//! What each synthetic scheme writes: the scheme a module is stored in, and the
//! `quantization_config` and tensors that llm-compressor's preset of it would write.

use serde_json::{Value, json};

use super::quantize;
use super::shapes::{self, ModelSpec};
use super::units::Linear;
use super::writer::{DType, TensorSpec};
use super::{FP8_BLOCK, SynthScheme};
use crate::{Error, Result};

impl SynthScheme {
    /// The single scheme linear `prefix` is stored in (a mixed scheme picks one per module).
    pub(super) fn for_linear(self, prefix: &str) -> SynthScheme {
        match self {
            SynthScheme::Fp8AttnNvfp4Experts if prefix.contains(".experts.") => SynthScheme::Nvfp4,
            SynthScheme::Fp8AttnNvfp4Experts => SynthScheme::Fp8Dynamic,
            s => s,
        }
    }

    /// The tensors one linear is stored as, or why its shape cannot be stored this way.
    pub(super) fn linear_tensors(self, l: &Linear) -> Result<Vec<TensorSpec>> {
        let (out, inp, p) = (l.out, l.inp, &l.prefix);
        let this = self.for_linear(p);
        if this != self {
            return this.linear_tensors(l);
        }
        let need = |ok: bool, why: &str| {
            if ok {
                Ok(())
            } else {
                Err(Error::unsupported(
                    format!("{p} [{out}, {inp}]"),
                    format!("{self:?}"),
                    why.to_string(),
                ))
            }
        };
        Ok(match self {
            SynthScheme::DenseBf16 => vec![TensorSpec::new(
                format!("{p}.weight"),
                DType::BF16,
                &[out, inp],
            )],
            SynthScheme::W4a16G128 | SynthScheme::W4a16G128Asym => {
                need(
                    inp % 128 == 0 && out % 8 == 0,
                    "INT4 g128 needs in % 128 == 0 and out % 8 == 0",
                )?;
                let mut t = vec![
                    TensorSpec::new(format!("{p}.weight_packed"), DType::I32, &[out, inp / 8]),
                    TensorSpec::new(format!("{p}.weight_scale"), DType::BF16, &[out, inp / 128]),
                    TensorSpec::new(format!("{p}.weight_shape"), DType::I64, &[2]),
                ];
                if self == SynthScheme::W4a16G128Asym {
                    t.push(TensorSpec::new(
                        format!("{p}.weight_zero_point"),
                        DType::I32,
                        &[out / 8, inp / 128],
                    ));
                }
                t
            }
            SynthScheme::Nvfp4 | SynthScheme::Nvfp4a16 => {
                need(inp % 16 == 0, "NVFP4 needs in % 16 == 0")?;
                let mut t = vec![
                    TensorSpec::new(format!("{p}.weight_packed"), DType::U8, &[out, inp / 2]),
                    TensorSpec::new(format!("{p}.weight_scale"), DType::F8E4M3, &[out, inp / 16]),
                    TensorSpec::new(format!("{p}.weight_global_scale"), DType::F32, &[1]),
                ];
                if self == SynthScheme::Nvfp4 {
                    t.push(TensorSpec::new(
                        format!("{p}.input_global_scale"),
                        DType::F32,
                        &[1],
                    ));
                }
                t
            }
            SynthScheme::Fp8Dynamic | SynthScheme::W8a8Int8 => {
                let code = if self == SynthScheme::W8a8Int8 {
                    DType::I8
                } else {
                    DType::F8E4M3
                };
                vec![
                    TensorSpec::new(format!("{p}.weight"), code, &[out, inp]),
                    TensorSpec::new(format!("{p}.weight_scale"), DType::BF16, &[out, 1]),
                ]
            }
            SynthScheme::Fp8AttnNvfp4Experts => unreachable!("resolved by for_linear"),
            SynthScheme::Mxfp4 | SynthScheme::Mxfp4A4 => {
                need(inp % 32 == 0, "MXFP4 needs in % 32 == 0")?;
                vec![
                    TensorSpec::new(format!("{p}.weight_packed"), DType::U8, &[out, inp / 2]),
                    TensorSpec::new(format!("{p}.weight_scale"), DType::U8, &[out, inp / 32]),
                ]
            }
            SynthScheme::Mxfp8 | SynthScheme::Mxfp8A8 => {
                need(inp % 32 == 0, "MXFP8 needs in % 32 == 0")?;
                vec![
                    TensorSpec::new(format!("{p}.weight"), DType::F8E4M3, &[out, inp]),
                    TensorSpec::new(format!("{p}.weight_scale"), DType::U8, &[out, inp / 32]),
                ]
            }
            SynthScheme::AwqGemvInt4 => {
                need(
                    inp % 128 == 0 && out % 8 == 0,
                    "INT4 g128 needs in % 128 == 0 and out % 8 == 0",
                )?;
                let width = quantize::awq_gemv_width(inp / 128);
                vec![
                    TensorSpec::new(format!("{p}.qweight"), DType::I32, &[out, inp / 8]),
                    TensorSpec::new(format!("{p}.qzeros"), DType::I32, &[out, width]),
                    TensorSpec::new(format!("{p}.scales"), DType::F16, &[out, width * 8]),
                ]
            }
            SynthScheme::GptqInt4 | SynthScheme::AwqInt4 => {
                need(
                    inp % 128 == 0 && out % 8 == 0,
                    "INT4 g128 needs in % 128 == 0 and out % 8 == 0",
                )?;
                let groups = inp / 128;
                let mut t = if self == SynthScheme::GptqInt4 {
                    vec![
                        TensorSpec::new(format!("{p}.qweight"), DType::I32, &[inp / 8, out]),
                        TensorSpec::new(format!("{p}.qzeros"), DType::I32, &[groups, out / 8]),
                    ]
                } else {
                    vec![
                        TensorSpec::new(format!("{p}.qweight"), DType::I32, &[inp, out / 8]),
                        TensorSpec::new(format!("{p}.qzeros"), DType::I32, &[groups, out / 8]),
                    ]
                };
                t.push(TensorSpec::new(
                    format!("{p}.scales"),
                    DType::F16,
                    &[groups, out],
                ));
                if self == SynthScheme::GptqInt4 {
                    t.push(TensorSpec::new(format!("{p}.g_idx"), DType::I32, &[inp]));
                }
                t
            }
            SynthScheme::Fp8Block => vec![
                TensorSpec::new(format!("{p}.weight"), DType::F8E4M3, &[out, inp]),
                TensorSpec::new(
                    format!("{p}.weight_scale_inv"),
                    DType::F32,
                    &[out.div_ceil(FP8_BLOCK), inp.div_ceil(FP8_BLOCK)],
                ),
            ],
            SynthScheme::ModeloptNvfp4 => {
                need(inp % 16 == 0, "NVFP4 needs in % 16 == 0")?;
                vec![
                    TensorSpec::new(format!("{p}.weight"), DType::U8, &[out, inp / 2]),
                    TensorSpec::new(format!("{p}.weight_scale"), DType::F8E4M3, &[out, inp / 16]),
                    TensorSpec::new(format!("{p}.weight_scale_2"), DType::F32, &[]),
                    TensorSpec::new(format!("{p}.input_scale"), DType::F32, &[]),
                ]
            }
        })
    }

    /// `config.json["quantization_config"]` as compressed-tensors 0.20.0 writes it for the
    /// llm-compressor preset (the form of the fixtures), `None` for dense.
    pub(super) fn quantization_config(self, spec: &ModelSpec) -> Option<Value> {
        // The quantizers' own configs name no modules: those holding their tensors are quantized.
        match self {
            SynthScheme::GptqInt4 => {
                return Some(json!({
                    "bits": 4, "checkpoint_format": "gptq", "desc_act": false, "group_size": 128,
                    "lm_head": false, "pack_dtype": "int32", "quant_method": "gptq", "sym": true,
                }));
            }
            SynthScheme::AwqInt4 | SynthScheme::AwqGemvInt4 => {
                let version = if self == SynthScheme::AwqInt4 {
                    "gemm"
                } else {
                    "gemv"
                };
                return Some(json!({
                    "bits": 4, "group_size": 128, "modules_to_not_convert": null,
                    "quant_method": "awq", "version": version, "zero_point": true,
                }));
            }
            SynthScheme::Fp8Block => {
                return Some(json!({
                    "activation_scheme": "dynamic", "quant_method": "fp8",
                    "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
                }));
            }
            SynthScheme::Mxfp4 if spec.arch == shapes::Arch::GptOss => {
                return Some(json!({
                    "modules_to_not_convert": [
                        "model.layers.*.self_attn", "model.layers.*.mlp.router",
                        "model.embed_tokens", "lm_head",
                    ],
                    "quant_method": "mxfp4",
                }));
            }
            SynthScheme::ModeloptNvfp4 => {
                return Some(json!({
                    "exclude_modules": spec.ignored_modules(), "group_size": 16,
                    "kv_cache_quant_algo": null, "quant_algo": "NVFP4", "quant_method": "modelopt",
                }));
            }
            _ => {}
        }
        let group = |s: SynthScheme, targets: Value| {
            let (format, weights, input) = s.group_args()?;
            Some(json!({
                "format": format,
                "input_activations": input,
                "output_activations": null,
                "targets": targets,
                "weights": weights,
            }))
        };
        let (groups, format) = match self {
            SynthScheme::Fp8AttnNvfp4Experts => (
                json!({
                    "group_0": group(SynthScheme::Fp8Dynamic, json!(["re:.*self_attn\\..*", "re:.*mlp\\.(gate|up|down)_proj$", "re:.*shared_experts?\\.(gate|up|down)_proj$"]))?,
                    "group_1": group(SynthScheme::Nvfp4, json!(["re:.*\\.experts\\..*"]))?,
                }),
                "mixed-precision",
            ),
            s => (
                json!({"group_0": group(s, json!(["Linear"]))?}),
                s.group_args()?.0,
            ),
        };
        Some(json!({
            "config_groups": groups,
            "format": format,
            "global_compression_ratio": null,
            "ignore": spec.ignored_modules(),
            "kv_cache_scheme": null,
            "moe_sparsity_config": null,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
            "sparsity_config": {},
            "transform_config": {},
            "version": "0.20.0",
        }))
    }

    /// (format, weights, input_activations) of a single-scheme config group; `None` for dense.
    pub(super) fn group_args(self) -> Option<(&'static str, Value, Value)> {
        let weights_int = |symmetric: bool| {
            json!({"dynamic": false, "group_size": 128, "num_bits": 4, "observer": "memoryless_minmax",
                   "strategy": "group", "symmetric": symmetric, "type": "int"})
        };
        let nvfp4_weights = json!({"dynamic": false, "group_size": 16, "num_bits": 4,
            "observer": "memoryless_minmax", "scale_dtype": "torch.float8_e4m3fn",
            "strategy": "tensor_group", "symmetric": true, "type": "float"});
        Some(match self {
            SynthScheme::DenseBf16
            | SynthScheme::Fp8AttnNvfp4Experts
            | SynthScheme::GptqInt4
            | SynthScheme::AwqInt4
            | SynthScheme::AwqGemvInt4
            | SynthScheme::Fp8Block
            | SynthScheme::ModeloptNvfp4 => return None,
            SynthScheme::Mxfp4
            | SynthScheme::Mxfp4A4
            | SynthScheme::Mxfp8
            | SynthScheme::Mxfp8A8 => {
                let bits = if matches!(self, SynthScheme::Mxfp4 | SynthScheme::Mxfp4A4) {
                    4
                } else {
                    8
                };
                let args = |dynamic: bool| {
                    json!({"dynamic": dynamic, "group_size": 32,
                    "num_bits": bits, "scale_dtype": "torch.uint8", "strategy": "group",
                    "symmetric": true, "type": "float"})
                };
                (
                    if bits == 4 {
                        "mxfp4-pack-quantized"
                    } else {
                        "mxfp8-quantized"
                    },
                    args(false),
                    if matches!(self, SynthScheme::Mxfp4A4 | SynthScheme::Mxfp8A8) {
                        args(true)
                    } else {
                        Value::Null
                    },
                )
            }
            SynthScheme::W4a16G128 => ("pack-quantized", weights_int(true), Value::Null),
            SynthScheme::W4a16G128Asym => ("pack-quantized", weights_int(false), Value::Null),
            SynthScheme::Nvfp4a16 => ("nvfp4-pack-quantized", nvfp4_weights, Value::Null),
            SynthScheme::Nvfp4 => (
                "nvfp4-pack-quantized",
                nvfp4_weights,
                json!({"dynamic": "local", "group_size": 16, "num_bits": 4, "observer": "static_minmax",
                       "scale_dtype": "torch.float8_e4m3fn", "strategy": "tensor_group",
                       "symmetric": true, "type": "float"}),
            ),
            SynthScheme::Fp8Dynamic => (
                "float-quantized",
                json!({"dynamic": false, "group_size": null, "num_bits": 8, "observer": "memoryless_minmax",
                       "strategy": "channel", "symmetric": true, "type": "float"}),
                json!({"dynamic": true, "group_size": null, "num_bits": 8, "strategy": "token",
                       "symmetric": true, "type": "float"}),
            ),
            SynthScheme::W8a8Int8 => (
                "int-quantized",
                json!({"dynamic": false, "group_size": null, "num_bits": 8, "observer": "memoryless_minmax",
                       "strategy": "channel", "symmetric": true, "type": "int"}),
                json!({"dynamic": true, "group_size": null, "num_bits": 8, "strategy": "token",
                       "symmetric": true, "type": "int"}),
            ),
        })
    }
}
