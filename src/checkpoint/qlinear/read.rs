//! Reading one linear from the store in each on-disk format (docs/formats.md): its packed
//! codes, scales, zero points and activation quantization checked against the shapes its
//! scheme implies, as a `QLinear`.

use safetensors::Dtype;

use super::{Fp4Scale, Packing, QLinear, ZeroPoint, float_type, scale_values};
use crate::checkpoint::modules::Module;
use crate::checkpoint::scheme::{Format, NumType, QuantArgs, SchemeGroup, Strategy};
use crate::checkpoint::store::{TensorRef, TensorStore};
use crate::checkpoint::transposed::TransposedInt;
use crate::numerics::{ActQuant, FloatType};
use crate::{Error, Result};

impl<'a> QLinear<'a> {
    /// Reads linear `m` (e.g. `model.layers.0.self_attn.q_proj`, `[out, in]`) under `scheme`;
    /// `weight_only` drops the activation quantization the scheme declares.
    pub fn load(
        store: &'a TensorStore,
        m: &'a Module,
        scheme: Option<&SchemeGroup>,
        model_dtype: FloatType,
        weight_only: bool,
    ) -> Result<Self> {
        let (module, out_features, in_features) = (m.name.as_str(), m.out_features, m.in_features);
        let with_bias = m.bias;
        let t = |suffix: &str| store.get(&format!("{module}.{suffix}"));
        let has = |suffix: &str| store.contains(&format!("{module}.{suffix}"));
        let what = || module.to_string();
        let bias = if with_bias {
            let b = t("bias")?;
            b.expect_shape(&[out_features])?;
            Some(b)
        } else {
            None
        };
        let quantized_on_disk = has("weight_packed") || has("weight_scale") || has("qweight");
        let (packing, act_quant) = match scheme {
            None
            | Some(SchemeGroup {
                format: Format::Dense,
                ..
            }) => {
                if quantized_on_disk {
                    return Err(Error::unsupported(
                        what(),
                        "quantization_config",
                        "the layer has quantized tensors on disk but no scheme in quantization_config targets it",
                    ));
                }
                // gpt-oss's dense experts are stored `[in, out]` (`weight_t` views), Qwen3-VL-MoE's
                // gate and up as the halves of a fused `[in, 2 out]` (`gate_up_proj.weight_t`,
                // gate first); the generic split of fused expert tensors may also have named
                // them `weight`, wrongly.
                let fused = module
                    .strip_suffix(".gate_proj")
                    .map(|e| (e, 0))
                    .or_else(|| module.strip_suffix(".up_proj").map(|e| (e, out_features)))
                    .map(|(expert, first)| (format!("{expert}.gate_up_proj.weight_t"), first))
                    .filter(|(name, _)| store.contains(name));
                let packing = if has("weight_t") {
                    let weight = t("weight_t")?;
                    dense_weight(weight, in_features, out_features)?;
                    Packing::Dense {
                        weight,
                        transposed: Some(0),
                    }
                } else if let Some((name, first)) = fused {
                    let weight = store.get(&name)?;
                    dense_weight(weight, in_features, 2 * out_features)?;
                    Packing::Dense {
                        weight,
                        transposed: Some(first),
                    }
                } else if let Some(ty) = store.ggml_type(&format!("{module}.weight")) {
                    let blocks = t("weight")?;
                    blocks.expect_shape(&[out_features, in_features])?;
                    Packing::Gguf { ty, blocks }
                } else {
                    let weight = t("weight")?;
                    dense_weight(weight, out_features, in_features)?;
                    Packing::Dense {
                        weight,
                        transposed: None,
                    }
                };
                (packing, None)
            }
            Some(group) => {
                let args = group.weights.as_ref().ok_or_else(|| {
                    Error::unsupported(what(), "weights", "a quantized format without weight args")
                })?;
                let packing = match group.format {
                    Format::PackQuantized => {
                        packed_int(store, module, args, out_features, in_features)?
                    }
                    Format::Nvfp4PackQuantized => {
                        let gs = store.get(&format!("{module}.weight_global_scale"))?;
                        let kind = Fp4Scale::Nvfp4 {
                            global_scale: single_f32(&gs)?,
                        };
                        fp4(
                            store,
                            module,
                            ("weight_packed", "weight_scale"),
                            kind,
                            out_features,
                            in_features,
                        )?
                    }
                    Format::Mxfp4PackQuantized | Format::GptOssMxfp4 => fp4(
                        store,
                        module,
                        ("weight_packed", "weight_scale"),
                        Fp4Scale::E8m0,
                        out_features,
                        in_features,
                    )?,
                    Format::Fp4Experts => fp4(
                        store,
                        module,
                        ("weight", "weight_scale_inv"),
                        Fp4Scale::E8m0,
                        out_features,
                        in_features,
                    )?,
                    Format::ModelOptNvfp4 => {
                        let s2 = store.get(&format!("{module}.weight_scale_2"))?;
                        let kind = Fp4Scale::ModelOpt {
                            scale_2: single_f32(&s2)?,
                        };
                        fp4(
                            store,
                            module,
                            ("weight", "weight_scale"),
                            kind,
                            out_features,
                            in_features,
                        )?
                    }
                    Format::Naive | Format::ModelOptFp8 => unpacked(
                        store,
                        module,
                        args,
                        "weight_scale",
                        out_features,
                        in_features,
                    )?,
                    Format::Fp8Block => unpacked(
                        store,
                        module,
                        args,
                        "weight_scale_inv",
                        out_features,
                        in_features,
                    )?,
                    Format::Gptq { .. } | Format::Awq { .. } => {
                        Packing::Transposed(TransposedInt::load(
                            store,
                            module,
                            group.format,
                            args,
                            out_features,
                            in_features,
                        )?)
                    }
                    Format::Dense => unreachable!("handled above"),
                };
                let act = match &group.input_activations {
                    None => None,
                    Some(_) if weight_only => None,
                    Some(a) => Some(match group.format {
                        Format::ModelOptNvfp4 | Format::ModelOptFp8 => {
                            modelopt_activations(store, module, group.format)?
                        }
                        // transformers' act_quant arithmetic, not compressed-tensors' (whose
                        // group-wise FP8 activations round in the activation dtype).
                        Format::Fp8Block => match a.strategy {
                            Strategy::Group(g) => ActQuant::Fp8PerTokenGroup { group: g as u32 },
                            other => unreachable!("native FP8 activations by group, not {other:?}"),
                        },
                        // What DeepGEMM's FP8 x FP4 GEMM reads (docs/decisions.md: DeepSeek-V4's
                        // FP4 experts).
                        Format::Fp4Experts => ActQuant::Fp8Pow2Group { group: 32 },
                        _ => activation_quant(store, module, a)?,
                    }),
                };
                (packing, act)
            }
        };
        Ok(Self {
            name: module,
            out_features,
            in_features,
            packing,
            bias,
            act_quant,
            model_dtype,
        })
    }

    /// Dense weight of a linear that reuses another tensor (tied lm_head = embed_tokens).
    pub fn dense(name: &'a str, weight: TensorRef<'a>, model_dtype: FloatType) -> Result<Self> {
        if weight.shape.len() != 2 {
            return Err(Error::ShapeMismatch {
                tensor: weight.name.to_string(),
                expected: vec![0, 0],
                found: weight.shape.to_vec(),
            });
        }
        let (out_features, in_features) = (weight.shape[0], weight.shape[1]);
        dense_weight(weight, out_features, in_features)?;
        Ok(Self {
            name,
            out_features,
            in_features,
            packing: Packing::Dense {
                weight,
                transposed: None,
            },
            bias: None,
            act_quant: None,
            model_dtype,
        })
    }
}

fn dense_weight(weight: TensorRef, out_features: usize, in_features: usize) -> Result<()> {
    // Codes of a format whose marker tensor (a scale) is missing read as a dense weight here:
    // the message says so rather than naming float dtypes alone.
    if matches!(
        weight.dtype,
        Dtype::I8 | Dtype::U8 | Dtype::I32 | Dtype::F8_E4M3 | Dtype::F8_E5M2
    ) {
        return Err(Error::DtypeMismatch {
            tensor: weight.name.to_string(),
            expected: "F32, F16 or BF16 for a dense weight (quantized codes need their scales \
                       beside them, and a quantization config that covers the module)"
                .into(),
            found: format!("{:?}", weight.dtype),
        });
    }
    weight.expect_dtype(&[Dtype::F32, Dtype::F16, Dtype::BF16])?;
    weight.expect_shape(&[out_features, in_features])
}

/// Expected scale shape for a strategy.
fn scale_shape(s: Strategy, out: usize, n_in: usize) -> Vec<usize> {
    match s {
        Strategy::Tensor | Strategy::Token => vec![1],
        Strategy::Channel => vec![out, 1],
        Strategy::Group(g) | Strategy::TensorGroup(g) => vec![out, n_in.div_ceil(g)],
        Strategy::Block(bh, bw) => vec![out.div_ceil(bh), n_in.div_ceil(bw)],
    }
}

fn check_scale(scale: &TensorRef, s: Strategy, out: usize, n_in: usize) -> Result<()> {
    let want = scale_shape(s, out, n_in);
    // A per-tensor scale may be stored as [1] or [] or [1, 1].
    if want == [1] && scale.numel() == 1 {
        return Ok(());
    }
    scale.expect_shape(&want)
}

fn packed_int<'a>(
    store: &'a TensorStore,
    module: &str,
    args: &QuantArgs,
    out: usize,
    n_in: usize,
) -> Result<Packing<'a>> {
    let t = |s: &str| store.get(&format!("{module}.{s}"));
    let b = args.num_bits;
    if args.num_type != NumType::Int || !(1..=8).contains(&b) {
        return Err(Error::unsupported(
            module,
            "weights.num_bits",
            format!("{:?} {b}-bit in pack-quantized", args.num_type),
        ));
    }
    if let Some(shape) = store.try_get(&format!("{module}.weight_shape")) {
        let dims = shape.to_i64()?;
        if dims != [out as i64, n_in as i64] {
            return Err(Error::ShapeMismatch {
                tensor: shape.name.to_string(),
                expected: vec![out, n_in],
                found: dims.iter().map(|&d| d as usize).collect(),
            });
        }
    }
    let packed = t("weight_packed")?;
    packed.expect_dtype(&[Dtype::I32])?;
    let dense_words = (n_in * b as usize).div_ceil(32);
    let per = (32 / b) as usize;
    let legacy_words = n_in.div_ceil(per);
    let width = packed.shape.get(1).copied().unwrap_or(0);
    let legacy_codes_per_word = if width == dense_words {
        None
    } else if width == legacy_words {
        Some(per)
    } else {
        return Err(Error::ShapeMismatch {
            tensor: packed.name.to_string(),
            expected: vec![out, dense_words],
            found: packed.shape.to_vec(),
        });
    };
    packed.expect_shape(&[out, width])?;
    let scale = t("weight_scale")?;
    float_type(&scale)?;
    check_scale(&scale, args.strategy, out, n_in)?;
    let zero_point = if args.symmetric {
        None
    } else {
        let z = t("weight_zero_point")?;
        let n_groups = scale_shape(args.strategy, out, n_in)[..]
            .iter()
            .skip(1)
            .product::<usize>();
        Some(match z.dtype {
            Dtype::I32 if args.strategy != Strategy::Tensor => {
                if 32 % b != 0 {
                    return Err(Error::unsupported(
                        module,
                        "weight_zero_point",
                        format!("packed {b}-bit zero points"),
                    ));
                }
                z.expect_shape(&[out.div_ceil(per), n_groups.max(1)])?;
                ZeroPoint::PackedAlongOut(z)
            }
            Dtype::I8 | Dtype::I32 => {
                if z.numel() != scale.numel() {
                    return Err(Error::ShapeMismatch {
                        tensor: z.name.to_string(),
                        expected: scale.shape.to_vec(),
                        found: z.shape.to_vec(),
                    });
                }
                ZeroPoint::Unpacked(z)
            }
            _ => {
                z.expect_dtype(&[Dtype::I32, Dtype::I8])?;
                unreachable!()
            }
        })
    };
    let g_idx = match store.try_get(&format!("{module}.weight_g_idx")) {
        None => None,
        Some(g) => {
            g.expect_shape(&[n_in])?;
            let Strategy::Group(gs) = args.strategy else {
                return Err(Error::unsupported(
                    module,
                    "weight_g_idx",
                    "without group strategy",
                ));
            };
            let n_groups = n_in.div_ceil(gs) as i64;
            if g.to_i64()?.iter().any(|&v| v < 0 || v >= n_groups) {
                return Err(Error::format(
                    store.dir(),
                    format!("{}: group index out of range 0..{n_groups}", g.name),
                ));
            }
            Some(g)
        }
    };
    Ok(Packing::PackedInt {
        bits: b,
        packed,
        words_per_row: width,
        legacy_codes_per_word,
        scale,
        zero_point,
        strategy: args.strategy,
        g_idx,
    })
}

/// Two E2M1 codes per byte in tensor `names.0` (`[out, in/2]`, bytes: U8, or I8 as
/// DeepSeek-V4 stores them), one scale byte per group in `names.1`: 16 inputs with FP8 E4M3
/// scales, 32 with E8M0 ones (U8, or F8_E8M0).
fn fp4<'a>(
    store: &'a TensorStore,
    module: &str,
    (codes, scales): (&str, &str),
    scale_kind: Fp4Scale,
    out: usize,
    n_in: usize,
) -> Result<Packing<'a>> {
    let t = |s: &str| store.get(&format!("{module}.{s}"));
    let (group, scale_dtypes): (usize, &[Dtype]) = match scale_kind {
        Fp4Scale::E8m0 => (32, &[Dtype::U8, Dtype::F8_E8M0]),
        _ => (16, &[Dtype::F8_E4M3]),
    };
    if !n_in.is_multiple_of(group) {
        return Err(Error::unsupported(
            module,
            "in_features",
            format!("{n_in} is not a multiple of the FP4 group of {group}"),
        ));
    }
    let packed = t(codes)?;
    packed.expect_dtype(&[Dtype::U8, Dtype::I8])?;
    packed.expect_shape(&[out, n_in / 2])?;
    let scale = t(scales)?;
    scale.expect_dtype(scale_dtypes)?;
    scale.expect_shape(&[out, n_in / group])?;
    Ok(Packing::Fp4 {
        packed,
        scale,
        group,
        scale_kind,
    })
}

/// One code per weight; the scale in `scale_name` (`weight_scale`, or native FP8's
/// `weight_scale_inv`: the multiplier despite its name).
fn unpacked<'a>(
    store: &'a TensorStore,
    module: &str,
    args: &QuantArgs,
    scale_name: &str,
    out: usize,
    n_in: usize,
) -> Result<Packing<'a>> {
    let t = |s: &str| store.get(&format!("{module}.{s}"));
    let weight = t("weight")?;
    match (args.num_type, args.num_bits) {
        (NumType::Float, 8) => weight.expect_dtype(&[Dtype::F8_E4M3])?,
        (NumType::Int, 1..=8) => weight.expect_dtype(&[Dtype::I8])?,
        (ty, bits) => {
            return Err(Error::unsupported(
                module,
                "weights",
                format!("{ty:?} {bits}-bit in an unpacked format"),
            ));
        }
    }
    weight.expect_shape(&[out, n_in])?;
    let scale = t(scale_name)?;
    scale_values(&scale)?;
    check_scale(&scale, args.strategy, out, n_in)?;
    let zero_point = if args.symmetric {
        None
    } else {
        let z = t("weight_zero_point")?;
        if z.numel() != scale.numel() {
            return Err(Error::ShapeMismatch {
                tensor: z.name.to_string(),
                expected: scale.shape.to_vec(),
                found: z.shape.to_vec(),
            });
        }
        Some(z)
    };
    Ok(Packing::Unpacked {
        weight,
        scale,
        zero_point,
        strategy: args.strategy,
    })
}

fn single_f32(t: &TensorRef) -> Result<f32> {
    let v = t.to_f32()?;
    if v.len() != 1 {
        return Err(Error::ShapeMismatch {
            tensor: t.name.to_string(),
            expected: vec![1],
            found: t.shape.to_vec(),
        });
    }
    Ok(v[0])
}

/// ModelOpt's static activation scales: `input_scale` is `amax / (448 * 6)` for NVFP4, whose
/// global scale vLLM takes as its f32 reciprocal, and the FP8 per-tensor scale for FP8.
fn modelopt_activations(store: &TensorStore, module: &str, format: Format) -> Result<ActQuant> {
    let s = single_f32(&store.get(&format!("{module}.input_scale"))?)?;
    Ok(match format {
        Format::ModelOptNvfp4 => ActQuant::Nvfp4 {
            global_scale: 1.0 / s,
        },
        _ => ActQuant::Fp8Static { scale: s },
    })
}

fn activation_quant(store: &TensorStore, module: &str, a: &QuantArgs) -> Result<ActQuant> {
    let what = format!("{module} input_activations");
    if !a.symmetric {
        return Err(Error::unsupported(
            what,
            "symmetric",
            "asymmetric activation quantization",
        ));
    }
    match (a.num_type, a.num_bits, a.strategy, a.dynamic.as_str()) {
        (NumType::Float, 8, Strategy::Token, "true") => Ok(ActQuant::Fp8PerToken),
        (NumType::Int, bits @ 2..=8, Strategy::Token, "true") => Ok(ActQuant::IntPerToken { bits }),
        (NumType::Float, 8, Strategy::Tensor, "false") => {
            let s = store.get(&format!("{module}.input_scale"))?;
            Ok(ActQuant::Fp8Static {
                scale: single_f32(&s)?,
            })
        }
        (NumType::Float, 4, Strategy::TensorGroup(16) | Strategy::Group(16), "local") => {
            let gs = store.get(&format!("{module}.input_global_scale"))?;
            Ok(ActQuant::Nvfp4 {
                global_scale: single_f32(&gs)?,
            })
        }
        (NumType::Float, 4 | 8, Strategy::Group(32), "true") if a.e8m0_scales => {
            Ok(ActQuant::Mx { bits: a.num_bits })
        }
        (NumType::Float, 8, Strategy::Group(g), "true") => {
            Ok(ActQuant::Fp8Group { group: g as u32 })
        }
        (ty, bits, strategy, dynamic) => Err(Error::unsupported(
            what,
            "scheme",
            format!(
                "{ty:?} {bits}-bit, strategy {strategy:?}, dynamic {dynamic} is not emulated \
                 (--activations weight-only evaluates the weights alone)"
            ),
        )),
    }
}
