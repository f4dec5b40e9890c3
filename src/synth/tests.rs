//! Write `tiny` in every scheme and read it back with the `safetensors` crate, decoding the
//! packed formats with the formulas of formats.md written out again here. Long (about 1,050
//! lines): one short test a scheme and shape, sharing those decoders.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use half::bf16;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use super::*;
use crate::checkpoint::config::DeltaNetLayout;

const ALL: [SynthScheme; 7] = [
    SynthScheme::DenseBf16,
    SynthScheme::W4a16G128,
    SynthScheme::W4a16G128Asym,
    SynthScheme::Nvfp4,
    SynthScheme::Nvfp4a16,
    SynthScheme::Fp8Dynamic,
    SynthScheme::W8a8Int8,
];

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        TempDir(std::env::temp_dir().join(format!(
            "quantppl-synth-{tag}-{}-{nanos}",
            std::process::id()
        )))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every tensor (name -> dtype, shape) of a checkpoint directory, with the file holding it,
/// checking that no tensor appears in two shards.
fn read_all(dir: &Path) -> BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>, String)> {
    let mut out = BTreeMap::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    files.sort();
    for f in files {
        let bytes = std::fs::read(dir.join(&f)).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let (hlen, meta) = SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(hlen % 8, 0, "{f}: header not padded to 8 bytes");
        assert_eq!(
            meta.metadata()
                .as_ref()
                .and_then(|m| m.get("format"))
                .map(String::as_str),
            Some("pt")
        );
        for (name, view) in st.iter() {
            // Every tensor starts aligned to its element size (the reader can cast in place).
            let off = view.data().as_ptr() as usize - bytes.as_ptr() as usize;
            assert_eq!(off % (view.dtype().bitsize() / 8), 0, "{name} misaligned");
            let prev = out.insert(
                name.to_string(),
                (
                    view.dtype(),
                    view.shape().to_vec(),
                    view.data().to_vec(),
                    f.clone(),
                ),
            );
            assert!(prev.is_none(), "{name} in two shards");
        }
    }
    out
}

/// The tensors formats.md and the fixtures prescribe for tiny (hidden 256, inter 768,
/// 2 layers, q 256, kv 128, vocab 512, untied), built independently of `units`.
fn expected(scheme: SynthScheme) -> BTreeMap<String, (Dtype, Vec<usize>)> {
    let mut e = BTreeMap::new();
    e.insert(
        "model.embed_tokens.weight".to_string(),
        (Dtype::BF16, vec![512, 256]),
    );
    e.insert("lm_head.weight".to_string(), (Dtype::BF16, vec![512, 256]));
    e.insert("model.norm.weight".to_string(), (Dtype::BF16, vec![256]));
    for l in 0..2 {
        for n in ["input_layernorm", "post_attention_layernorm"] {
            e.insert(
                format!("model.layers.{l}.{n}.weight"),
                (Dtype::BF16, vec![256]),
            );
        }
        for (m, out, inp) in [
            ("self_attn.q_proj", 256, 256),
            ("self_attn.k_proj", 128, 256),
            ("self_attn.v_proj", 128, 256),
            ("self_attn.o_proj", 256, 256),
            ("mlp.gate_proj", 768, 256),
            ("mlp.up_proj", 768, 256),
            ("mlp.down_proj", 256, 768),
        ] {
            let p = format!("model.layers.{l}.{m}");
            let mut add = |s: &str, d, shape: Vec<usize>| e.insert(format!("{p}.{s}"), (d, shape));
            match scheme {
                SynthScheme::DenseBf16 => {
                    add("weight", Dtype::BF16, vec![out, inp]);
                }
                SynthScheme::Fp8AttnNvfp4Experts
                | SynthScheme::Mxfp4
                | SynthScheme::Mxfp4A4
                | SynthScheme::Mxfp8
                | SynthScheme::Mxfp8A8
                | SynthScheme::GptqInt4
                | SynthScheme::AwqInt4
                | SynthScheme::AwqGemvInt4
                | SynthScheme::Fp8Block
                | SynthScheme::ModeloptNvfp4 => unreachable!("not in ALL"),
                SynthScheme::W4a16G128 | SynthScheme::W4a16G128Asym => {
                    add("weight_packed", Dtype::I32, vec![out, inp / 8]);
                    add("weight_scale", Dtype::BF16, vec![out, inp / 128]);
                    add("weight_shape", Dtype::I64, vec![2]);
                    if scheme == SynthScheme::W4a16G128Asym {
                        add("weight_zero_point", Dtype::I32, vec![out / 8, inp / 128]);
                    }
                }
                SynthScheme::Nvfp4 | SynthScheme::Nvfp4a16 => {
                    add("weight_packed", Dtype::U8, vec![out, inp / 2]);
                    add("weight_scale", Dtype::F8_E4M3, vec![out, inp / 16]);
                    add("weight_global_scale", Dtype::F32, vec![1]);
                    if scheme == SynthScheme::Nvfp4 {
                        add("input_global_scale", Dtype::F32, vec![1]);
                    }
                }
                SynthScheme::Fp8Dynamic => {
                    add("weight", Dtype::F8_E4M3, vec![out, inp]);
                    add("weight_scale", Dtype::BF16, vec![out, 1]);
                }
                SynthScheme::W8a8Int8 => {
                    add("weight", Dtype::I8, vec![out, inp]);
                    add("weight_scale", Dtype::BF16, vec![out, 1]);
                }
            }
        }
    }
    e
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn i32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn bf16s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
        .collect()
}

/// formats.md §1.4 FP8 E4M3FN decoding.
fn fp8(b: u8) -> f32 {
    let e = ((b >> 3) & 15) as i32;
    let m = (b & 7) as f32;
    let v = if e == 0 {
        m * 2f32.powi(-9)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    if b & 0x80 != 0 { -v } else { v }
}

/// The f32 weights the generator drew for linear `prefix` (before quantization).
fn original(seed: u64, prefix: &str, out: usize, inp: usize) -> Vec<f32> {
    let ts = tensor_seed(seed, &format!("{prefix}.weight"));
    let mut w = vec![0f32; out * inp];
    for (r, row) in w.chunks_mut(inp).enumerate() {
        quantize::gen_row(ts, r, Init::Normal(WEIGHT_STD), row);
    }
    w
}

#[test]
fn tiny_every_scheme_has_the_formats_md_layout() {
    for scheme in ALL {
        let dir = TempDir::new("layout");
        let summary = write_checkpoint(SynthShape::Tiny, scheme, &dir.0, 7, |_| {}).unwrap();
        let got = read_all(&dir.0);
        let want = expected(scheme);
        let got_meta: BTreeMap<_, _> = got
            .iter()
            .map(|(k, v)| (k.clone(), (v.0, v.1.clone())))
            .collect();
        assert_eq!(got_meta, want, "{scheme:?}");
        assert_eq!(summary.tensors, want.len());
        assert_eq!(summary.shards, 1);
        assert!(dir.0.join("model.safetensors").exists());
        assert!(!dir.0.join("model.safetensors.index.json").exists());
        assert_eq!(summary.params, SynthShape::Tiny.spec().params());
        let on_disk: u64 = summary
            .files
            .iter()
            .map(|f| std::fs::metadata(f).unwrap().len())
            .sum();
        assert_eq!(summary.bytes_written, on_disk);

        let config = read_json(&dir.0.join("config.json"));
        assert_eq!(config["architectures"][0], "LlamaForCausalLM");
        assert_eq!(config["hidden_size"], 256);
        assert_eq!(config["num_key_value_heads"], 4);
        assert_eq!(config["head_dim"], 32);
        assert_eq!(config["vocab_size"], 512);
        assert_eq!(config["torch_dtype"], "bfloat16");
        assert_eq!(config["tie_word_embeddings"], false);
        let gen_config = read_json(&dir.0.join("generation_config.json"));
        assert_eq!(gen_config["bos_token_id"], 1);
        let q = &config["quantization_config"];
        if scheme == SynthScheme::DenseBf16 {
            assert!(q.is_null());
            continue;
        }
        assert_eq!(q["quant_method"], "compressed-tensors");
        assert_eq!(q["quantization_status"], "compressed");
        assert_eq!(q["version"], "0.20.0");
        assert_eq!(q["ignore"], serde_json::json!(["lm_head"]));
        assert_eq!(q["sparsity_config"], serde_json::json!({}));
        assert_eq!(q["transform_config"], serde_json::json!({}));
        assert!(q["kv_cache_scheme"].is_null() && q["global_compression_ratio"].is_null());
        let g = &q["config_groups"]["group_0"];
        assert_eq!(g["targets"], serde_json::json!(["Linear"]));
        assert_eq!(g["format"], q["format"]);
        assert!(g["output_activations"].is_null());
        let (format, bits, ty, strategy, has_input) = match scheme {
            SynthScheme::W4a16G128 | SynthScheme::W4a16G128Asym => {
                ("pack-quantized", 4, "int", "group", false)
            }
            SynthScheme::Nvfp4 => ("nvfp4-pack-quantized", 4, "float", "tensor_group", true),
            SynthScheme::Nvfp4a16 => ("nvfp4-pack-quantized", 4, "float", "tensor_group", false),
            SynthScheme::Fp8Dynamic => ("float-quantized", 8, "float", "channel", true),
            SynthScheme::W8a8Int8 => ("int-quantized", 8, "int", "channel", true),
            _ => unreachable!("not in ALL"),
        };
        assert_eq!(q["format"], format);
        assert_eq!(g["weights"]["num_bits"], bits);
        assert_eq!(g["weights"]["type"], ty);
        assert_eq!(g["weights"]["strategy"], strategy);
        assert_eq!(
            g["weights"]["symmetric"],
            scheme != SynthScheme::W4a16G128Asym
        );
        assert_eq!(g["input_activations"].is_object(), has_input);
    }
}

/// The config blocks equal the fixtures' own (same generator: llm-compressor presets), apart
/// from keys the fixtures got from GPTQ (`actorder`) and their group size.
#[test]
fn quantization_config_matches_fixtures() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for (scheme, dir) in [
        (SynthScheme::Nvfp4, "synth-llama-mini-nvfp4"),
        (SynthScheme::Nvfp4a16, "synth-llama-mini-nvfp4a16"),
        (SynthScheme::Fp8Dynamic, "synth-llama-mini-fp8-dynamic"),
        (SynthScheme::W4a16G128, "synth-llama-mini-w4a16-g128"),
    ] {
        let path = fixtures.join(dir).join("config.json");
        let mut want = read_json(&path)["quantization_config"].clone();
        if scheme == SynthScheme::W4a16G128 {
            // GPTQ wrote actorder; min-max RTN does not.
            want["config_groups"]["group_0"]["weights"]
                .as_object_mut()
                .unwrap()
                .remove("actorder");
        }
        assert_eq!(
            scheme
                .quantization_config(&SynthShape::Tiny.spec())
                .unwrap(),
            want,
            "{dir}"
        );
    }
}

#[test]
fn int4_codes_decode_to_the_intended_values() {
    let (out, inp, group) = (16, 256, 128);
    let ts = tensor_seed(3, "t");
    for symmetric in [true, false] {
        let q = quantize::int4(ts, out, inp, group, 0.02, symmetric);
        let words = i32s(&q.packed);
        let scales = bf16s(&q.scale);
        let zps = q.zero_point.as_deref().map(i32s);
        let ng = inp / group;
        let (mut lo, mut hi) = (0, 0);
        let mut row = vec![0f32; inp];
        for r in 0..out {
            quantize::gen_row(ts, r, Init::Normal(0.02), &mut row);
            for c in 0..inp {
                let g = c / group;
                // formats.md §1.3 decode, b = 4, per = 8.
                let u = (words[r * (inp / 8) + c / 8] >> (4 * (c % 8))) & 15;
                let code = u as i32 - 8;
                let z = match &zps {
                    Some(z) => ((z[(r / 8) * ng + g] >> (4 * (r % 8))) & 15) as i32 - 8,
                    None => 0,
                };
                let s = scales[r * ng + g];
                // What min-max quantization intends for this weight.
                let intended = ((row[c] / s + z as f32).round_ties_even()).clamp(-8.0, 7.0) as i32;
                assert_eq!(code, intended, "sym={symmetric} r={r} c={c}");
                let w = (code - z) as f32 * s;
                assert!((w - row[c]).abs() <= s * 0.5 + 1e-6 || code == 7 || code == -8);
                lo = lo.min(code);
                hi = hi.max(code);
            }
        }
        assert_eq!(
            (lo, hi),
            (-8, 7),
            "sym={symmetric}: codes must span the full range"
        );
    }
}

#[test]
fn packed_checkpoints_decode_close_to_the_dense_weights() {
    let seed = 11;
    let (prefix, out, inp) = ("model.layers.1.mlp.down_proj", 256, 768);
    let w = original(seed, prefix, out, inp);
    for scheme in [
        SynthScheme::W4a16G128,
        SynthScheme::W4a16G128Asym,
        SynthScheme::Nvfp4a16,
        SynthScheme::Fp8Dynamic,
        SynthScheme::W8a8Int8,
        SynthScheme::DenseBf16,
    ] {
        let dir = TempDir::new("decode");
        write_checkpoint(SynthShape::Tiny, scheme, &dir.0, seed, |_| {}).unwrap();
        let t = read_all(&dir.0);
        let get = |s: &str| t[&format!("{prefix}.{s}")].2.clone();
        let deq: Vec<f32> = match scheme {
            SynthScheme::DenseBf16 => bf16s(&get("weight")),
            SynthScheme::W4a16G128 | SynthScheme::W4a16G128Asym => {
                let shape: Vec<i64> = get("weight_shape")
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                assert_eq!(shape, [out as i64, inp as i64]);
                let (words, s) = (i32s(&get("weight_packed")), bf16s(&get("weight_scale")));
                let zp =
                    (scheme == SynthScheme::W4a16G128Asym).then(|| i32s(&get("weight_zero_point")));
                let ng = inp / 128;
                (0..out * inp)
                    .map(|i| {
                        let (r, c) = (i / inp, i % inp);
                        let q = ((words[r * inp / 8 + c / 8] >> (4 * (c % 8))) & 15) as i32 - 8;
                        let z = zp.as_ref().map_or(0, |z| {
                            ((z[(r / 8) * ng + c / 128] >> (4 * (r % 8))) & 15) as i32 - 8
                        });
                        bf16::from_f32((q - z) as f32 * s[r * ng + c / 128]).to_f32()
                    })
                    .collect()
            }
            SynthScheme::Nvfp4a16 | SynthScheme::Nvfp4 => {
                const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
                let (packed, scale) = (get("weight_packed"), get("weight_scale"));
                let gs = f32::from_le_bytes(get("weight_global_scale")[..].try_into().unwrap());
                (0..out * inp)
                    .map(|i| {
                        let (r, c) = (i / inp, i % inp);
                        let byte = packed[r * inp / 2 + c / 2];
                        let code = if c % 2 == 0 { byte & 15 } else { byte >> 4 };
                        let v = if code & 8 != 0 {
                            -E2M1[(code & 7) as usize]
                        } else {
                            E2M1[(code & 7) as usize]
                        };
                        let s_eff = fp8(scale[r * inp / 16 + c / 16]) / gs;
                        bf16::from_f32(v * s_eff).to_f32()
                    })
                    .collect()
            }
            SynthScheme::Fp8Dynamic => {
                let (q, s) = (get("weight"), bf16s(&get("weight_scale")));
                (0..out * inp)
                    .map(|i| bf16::from_f32(fp8(q[i]) * s[i / inp]).to_f32())
                    .collect()
            }
            SynthScheme::W8a8Int8 => {
                let (q, s) = (get("weight"), bf16s(&get("weight_scale")));
                (0..out * inp)
                    .map(|i| bf16::from_f32(q[i] as i8 as f32 * s[i / inp]).to_f32())
                    .collect()
            }
            _ => unreachable!("not in the list"),
        };
        let err: f64 = w
            .iter()
            .zip(&deq)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let norm: f64 = w.iter().map(|a| (*a as f64).powi(2)).sum();
        let rel = (err / norm).sqrt();
        let bound = match scheme {
            SynthScheme::DenseBf16 => 0.005,
            SynthScheme::Fp8Dynamic | SynthScheme::W8a8Int8 => 0.05,
            _ => 0.2,
        };
        assert!(rel < bound, "{scheme:?}: relative Frobenius error {rel}");
        assert!(rel > 0.0);
    }
}

#[test]
fn nvfp4_shares_global_scales_like_fused_layers() {
    let dir = TempDir::new("nvfp4");
    write_checkpoint(SynthShape::Tiny, SynthScheme::Nvfp4, &dir.0, 5, |_| {}).unwrap();
    let t = read_all(&dir.0);
    let gs = |m: &str, s: &str| {
        f32::from_le_bytes(
            t[&format!("model.layers.0.{m}.{s}")].2[..]
                .try_into()
                .unwrap(),
        )
    };
    let q = gs("self_attn.q_proj", "weight_global_scale");
    assert!(q.is_finite() && q > 0.0);
    assert_eq!(q, gs("self_attn.k_proj", "weight_global_scale"));
    assert_eq!(q, gs("self_attn.v_proj", "weight_global_scale"));
    assert_eq!(
        gs("mlp.gate_proj", "weight_global_scale"),
        gs("mlp.up_proj", "weight_global_scale")
    );
    assert!(gs("mlp.down_proj", "input_global_scale") > 0.0);
    // Every E2M1 code, -0 aside, appears: the group maxima land on ±6.
    let packed = &t["model.layers.0.mlp.gate_proj.weight_packed"].2;
    let mut seen = [false; 16];
    for b in packed {
        seen[(b & 15) as usize] = true;
        seen[(b >> 4) as usize] = true;
    }
    assert!(
        seen.iter().enumerate().all(|(c, s)| *s || c == 8),
        "{seen:?}"
    );
}

#[test]
fn fp8_encoder_round_trips_every_code_and_rounds_to_even() {
    for c in (0u8..=0x7E).chain(0x80..=0xFE) {
        let v = quantize::e4m3_to_f32(c);
        assert_eq!(fp8(c), v);
        let back = quantize::f32_to_e4m3(v);
        assert!(
            back == c || (v == 0.0 && back & 0x7F == 0),
            "{c:#x} -> {v} -> {back:#x}"
        );
    }
    assert_eq!(quantize::f32_to_e4m3(1000.0), 0x7E);
    assert_eq!(quantize::f32_to_e4m3(-1000.0), 0xFE);
    // 1 + 1/16 is halfway between 1 (0x38) and 1.125 (0x39): to even.
    assert_eq!(quantize::f32_to_e4m3(1.0625), 0x38);
    assert_eq!(quantize::f32_to_e4m3(1.1875), 0x3A);
    // Subnormal halfway 1.5 * 2^-9 -> 2 * 2^-9.
    assert_eq!(quantize::f32_to_e4m3(1.5 * 2f32.powi(-9)), 0x02);
}

#[test]
fn sharded_checkpoint_has_a_complete_index() {
    let dir = TempDir::new("shards");
    let summary = write_checkpoint_sharded(
        SynthShape::Tiny,
        None,
        SynthScheme::W4a16G128Asym,
        &dir.0,
        9,
        300_000,
        |_| {},
    )
    .unwrap();
    assert!(summary.shards > 3, "{}", summary.shards);
    let index = read_json(&dir.0.join("model.safetensors.index.json"));
    let map = index["weight_map"].as_object().unwrap();
    let t = read_all(&dir.0);
    assert_eq!(map.len(), t.len());
    for (name, (.., file)) in &t {
        assert_eq!(map[name], file.as_str(), "{name}");
    }
    let total: usize = t.values().map(|v| v.2.len()).sum();
    assert_eq!(index["metadata"]["total_size"], total as u64);
    assert_eq!(summary.tensor_bytes, total as u64);
    let n = summary.shards;
    for i in 1..=n {
        assert!(
            dir.0
                .join(format!("model-{i:05}-of-{n:05}.safetensors"))
                .exists()
        );
    }
    assert!(!dir.0.join("model.safetensors").exists());
    // A linear's tensors stay in one shard.
    assert_eq!(
        map["model.layers.0.mlp.up_proj.weight_packed"],
        map["model.layers.0.mlp.up_proj.weight_zero_point"]
    );
    // Same bytes as the unsharded checkpoint.
    let one = TempDir::new("one");
    write_checkpoint(
        SynthShape::Tiny,
        SynthScheme::W4a16G128Asym,
        &one.0,
        9,
        |_| {},
    )
    .unwrap();
    let u = read_all(&one.0);
    assert!(t.iter().all(|(k, v)| u[k].2 == v.2));
}

#[test]
fn output_is_deterministic_and_seeded() {
    let (a, b, c) = (TempDir::new("a"), TempDir::new("b"), TempDir::new("c"));
    let mut calls = 0;
    let s = write_checkpoint(SynthShape::Tiny, SynthScheme::Fp8Dynamic, &a.0, 1, |p| {
        calls += 1;
        assert!(p.bytes_done <= p.bytes_total);
    })
    .unwrap();
    assert_eq!(calls, s.tensors);
    write_checkpoint(SynthShape::Tiny, SynthScheme::Fp8Dynamic, &b.0, 1, |_| {}).unwrap();
    write_checkpoint(SynthShape::Tiny, SynthScheme::Fp8Dynamic, &c.0, 2, |_| {}).unwrap();
    let read = |d: &TempDir| std::fs::read(d.0.join("model.safetensors")).unwrap();
    assert_eq!(read(&a), read(&b));
    assert_ne!(read(&a), read(&c));
}

#[test]
fn run_refuses_a_non_empty_directory() {
    let dir = TempDir::new("refuse");
    std::fs::create_dir_all(&dir.0).unwrap();
    std::fs::write(dir.0.join("config.json"), "{}").unwrap();
    let err = run(
        SynthShape::Tiny,
        None,
        SynthScheme::DenseBf16,
        &dir.0,
        0,
        |_| (),
    )
    .unwrap_err();
    assert!(err.to_string().contains("not empty"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.0.join("config.json")).unwrap(),
        "{}"
    );
    // An empty directory is fine.
    let empty = TempDir::new("empty");
    std::fs::create_dir_all(&empty.0).unwrap();
    let s = run(
        SynthShape::Tiny,
        None,
        SynthScheme::DenseBf16,
        &empty.0,
        0,
        |_| (),
    )
    .unwrap();
    assert_eq!(s.shards, 1);
}

/// Every tensor or linear of a shape as `name[shape]` (a linear as `prefix[out, in]`).
fn unit_names(spec: &shapes::ModelSpec) -> Vec<String> {
    let linear = |l: &Linear| format!("{}{:?}", l.prefix, [l.out, l.inp]);
    units(spec)
        .iter()
        .flat_map(|u| match u {
            Unit::Dense { name, shape, .. } => vec![format!("{name}{shape:?}")],
            Unit::Linears(ls) => ls.iter().map(linear).collect(),
            Unit::Experts {
                prefix,
                experts,
                parts,
            } => expert_linears(prefix, *experts, parts)
                .iter()
                .map(linear)
                .collect(),
        })
        .collect()
}

#[test]
fn real_shapes_have_their_published_sizes() {
    let params: HashMap<SynthShape, u64> = [
        SynthShape::Llama3_8b,
        SynthShape::Llama31_8b,
        SynthShape::Llama3_70b,
        SynthShape::Qwen3_8b,
        SynthShape::Qwen3_0_6b,
        SynthShape::MistralLarge123b,
    ]
    .into_iter()
    .map(|s| (s, s.spec().params()))
    .collect();
    assert_eq!(params[&SynthShape::Llama3_8b], 8_030_261_248);
    assert_eq!(params[&SynthShape::Llama31_8b], 8_030_261_248);
    assert_eq!(params[&SynthShape::Llama3_70b], 70_553_706_496);
    assert_eq!(params[&SynthShape::Qwen3_8b], 8_190_735_360);
    assert_eq!(params[&SynthShape::Qwen3_0_6b], 596_049_920);
    assert_eq!(params[&SynthShape::MistralLarge123b], 122_610_069_504);

    let qwen = SynthShape::Qwen3_8b.spec();
    let names = unit_names(&qwen);
    assert!(names.contains(&"model.layers.35.self_attn.q_norm.weight[128]".to_string()));
    assert!(names.contains(&"model.layers.0.self_attn.k_norm.weight[128]".to_string()));
    assert!(names.contains(&"model.layers.0.self_attn.q_proj[4096, 4096]".to_string()));
    assert!(names.contains(&"model.layers.0.self_attn.k_proj[1024, 4096]".to_string()));
    assert!(names.contains(&"lm_head.weight[151936, 4096]".to_string()));
    let tied = units(&SynthShape::Qwen3_0_6b.spec());
    assert!(
        !tied
            .iter()
            .any(|u| matches!(u, Unit::Dense { name, .. } if name == "lm_head.weight"))
    );

    let config = SynthShape::Llama31_8b
        .spec()
        .config_json(SynthScheme::Nvfp4.quantization_config(&SynthShape::Llama31_8b.spec()));
    assert_eq!(config["rope_scaling"]["rope_type"], "llama3");
    assert_eq!(config["max_position_embeddings"], 131_072);
    assert_eq!(config["rope_theta"], 500_000.0);
    let mistral = SynthShape::MistralLarge123b.spec().config_json(None);
    assert_eq!(mistral["architectures"][0], "MistralForCausalLM");
    assert_eq!(mistral["num_attention_heads"], 96);
    let qwen = qwen.config_json(None);
    assert_eq!(qwen["architectures"][0], "Qwen3ForCausalLM");
    assert_eq!(qwen["head_dim"], 128);
    assert_eq!(qwen["rms_norm_eps"], 1e-6);
    // Keys sorted, as the fixtures' config.json.
    let keys: Vec<&String> = qwen.as_object().unwrap().keys().collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
}

/// Throughput check on a real shape, not run by default:
/// `QUANTPPL_SYNTH_BENCH=llama3-8b,w4a16-g128 cargo test --release --lib synth_bench -- --ignored --nocapture`
/// (writes under the temp dir and deletes the checkpoint afterwards).
#[test]
#[ignore]
fn synth_bench() {
    use clap::ValueEnum;
    let spec =
        std::env::var("QUANTPPL_SYNTH_BENCH").unwrap_or_else(|_| "llama3-8b,w4a16-g128".into());
    let (shape, scheme) = spec.split_once(',').unwrap();
    let shape = SynthShape::from_str(shape, true).unwrap();
    let scheme = SynthScheme::from_str(scheme, true).unwrap();
    let dir = TempDir::new("bench");
    let s = write_checkpoint(shape, scheme, &dir.0, 0, |_| {}).unwrap();
    eprintln!(
        "{shape:?} {scheme:?}: {} tensors, {} shards, {:.2} GB in {:.1} s = {:.2} GB/s",
        s.tensors,
        s.shards,
        s.bytes_written as f64 / 1e9,
        s.seconds,
        s.bytes_written as f64 / 1e9 / s.seconds
    );
}

#[test]
fn e2m1_rounds_half_to_even_on_the_grid() {
    let cases = [
        (0.0, 0),
        (0.25, 0),
        (0.26, 1),
        (0.75, 2),
        (1.25, 2),
        (1.5, 3),
        (1.75, 4),
        (2.5, 4),
        (3.0, 5),
        (3.5, 6),
        (5.0, 6),
        (5.01, 7),
        (6.0, 7),
        (-0.5, 9),
        (-6.0, 15),
        (-0.1, 0),
    ];
    for (y, code) in cases {
        assert_eq!(quantize::f32_to_e2m1(y), code, "{y}");
    }
}

#[test]
fn moe_shapes_have_their_published_sizes() {
    // The model cards' counts, to the digits they print: Qwen3-30B-A3B 30.5B, Qwen3-235B-A22B
    // 235B, Mixtral-8x7B 46.7B in all; GLM-4.5-Air 106B, which matches the count without the
    // embedding and lm_head (with them, 106.85B).
    let within = |shape: SynthShape, card: f64, half_digit: f64, embeddings: bool| {
        let s = shape.spec();
        let embed = if embeddings {
            0
        } else {
            2 * s.vocab * s.hidden
        } as u64;
        let p = (s.params() - embed) as f64 / 1e9;
        assert!(
            (p - card).abs() <= half_digit,
            "{shape:?}: {p}B vs the card's {card}B"
        );
    };
    within(SynthShape::Qwen3_30bA3b, 30.5, 0.05, true);
    within(SynthShape::Qwen3_235bA22b, 235.0, 0.5, true);
    within(SynthShape::Mixtral8x7b, 46.7, 0.05, true);
    within(SynthShape::Glm45Air, 106.0, 0.5, false);
    let c = SynthShape::Qwen3_30bA3b.spec().config_json(None);
    let cfg = crate::checkpoint::ModelConfig::from_json(&c).unwrap();
    let moe = cfg.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.experts_per_token), (128, 8));
    // The checkpoint's count (norms aside) and the synthesizer's agree.
    let norms = (48 * (2 * 2048 + 2 * 128) + 2048) as u64;
    assert_eq!(
        cfg.num_params() + norms,
        SynthShape::Qwen3_30bA3b.spec().params()
    );
    // About 3.3B of them active per token (the "A3B").
    assert!((3_000_000_000..3_500_000_000).contains(&cfg.active_params()));
}

/// The mixed scheme on a small mixture: FP8-dynamic attention, NVFP4 (W4A4) experts, dense
/// routers, each as its config group says; the checkpoint loads and runs on the CPU.
#[test]
fn mixed_scheme_gives_each_module_its_group() {
    use crate::backend::cpu::CpuBackend;
    let dir = TempDir::new("mixed");
    write_checkpoint(
        SynthShape::TinyMoe,
        SynthScheme::Fp8AttnNvfp4Experts,
        &dir.0,
        3,
        |_| {},
    )
    .unwrap();
    let ckpt = crate::checkpoint::Checkpoint::open(&dir.0).unwrap();
    let labels: Vec<(String, String)> = ckpt.layers[1]
        .linears()
        .into_iter()
        .map(|m| (m.name.clone(), ckpt.linear(m).unwrap().scheme_label()))
        .collect();
    let label = |name: &str| &labels.iter().find(|(n, _)| n == name).unwrap().1;
    assert!(
        label("model.layers.1.self_attn.q_proj").starts_with("fp8"),
        "{labels:?}"
    );
    assert!(
        label("model.layers.1.mlp.gate").starts_with("dense"),
        "{labels:?}"
    );
    assert!(
        label("model.layers.1.mlp.experts.5.down_proj").starts_with("nvfp4"),
        "{labels:?}"
    );
    let q = ckpt.linear(ckpt.layers[1].linears()[0]).unwrap();
    assert!(q.name.ends_with("q_proj"), "{}", q.name);
    assert!(q.act_quant.is_some());
    // Batch sizing counts the W4A4 experts' quantized rows, unless run weight-only.
    assert!(ckpt.experts_quantize_input());
    let mut weight_only = crate::checkpoint::Checkpoint::open(&dir.0).unwrap();
    weight_only.weight_only = true;
    assert!(!weight_only.experts_quantize_input());
    let w4a16 = TempDir::new("mixed-w4a16");
    write_checkpoint(
        SynthShape::TinyMoe,
        SynthScheme::W4a16G128,
        &w4a16.0,
        3,
        |_| {},
    )
    .unwrap();
    let w4a16 = crate::checkpoint::Checkpoint::open(&w4a16.0).unwrap();
    assert!(!w4a16.experts_quantize_input());
    let b = CpuBackend::new();
    let model = crate::model::Model::load(&b, &ckpt, 16, &|_, _| {}).unwrap();
    let layout = crate::backend::SeqLayout::from_lengths([16]);
    let ids: Vec<u32> = (0..16).map(|i| i * 31 % 512).collect();
    let targets: Vec<i32> = ids.iter().skip(1).map(|&i| i as i32).chain([-1]).collect();
    let nll = model.nll(&b, &ids, &layout, &targets).unwrap();
    assert_eq!(nll.len(), 15);
    assert!(nll.iter().all(|v| v.is_finite() && *v > 0.0));
}

/// The NLLs of 16 fixed tokens of vocabulary 512 through `ckpt` on the CPU.
fn nll_on_cpu(ckpt: &crate::checkpoint::Checkpoint) -> Vec<f32> {
    nll_of_tokens_on_cpu(ckpt, 16)
}

/// `nll_on_cpu` over `n` tokens (past a sparse-attention indexer's keys where `n` is).
fn nll_of_tokens_on_cpu(ckpt: &crate::checkpoint::Checkpoint, n: usize) -> Vec<f32> {
    let b = crate::backend::cpu::CpuBackend::new();
    let model = crate::model::Model::load(&b, ckpt, n, &|_, _| {}).unwrap();
    let ids: Vec<u32> = (0..n as u32).map(|i| i * 37 % 512).collect();
    let targets: Vec<i32> = ids.iter().skip(1).map(|&i| i as i32).chain([-1]).collect();
    let layout = crate::backend::SeqLayout::from_lengths([n]);
    model.nll(&b, &ids, &layout, &targets).unwrap()
}

/// GLM-4.5's layout (q/k/v biases, partial rotary, selection bias, shared experts, layer 0
/// dense) loads as GLM in quantppl, in one scheme and in the mixed one, and runs on the CPU.
#[test]
fn glm_layout_loads_and_runs() {
    use crate::checkpoint::{Checkpoint, FeedForward};
    for scheme in [SynthScheme::Nvfp4a16, SynthScheme::Fp8AttnNvfp4Experts] {
        let dir = TempDir::new("glm");
        write_checkpoint(SynthShape::TinyGlm, scheme, &dir.0, 5, |_| {}).unwrap();
        let ckpt = Checkpoint::open(&dir.0).unwrap();
        let c = &ckpt.config;
        assert!(c.qkv_bias && c.rotary_dim == 32, "{c:?}");
        assert!(matches!(ckpt.layers[0].ffn, Some(FeedForward::Dense(_))));
        let Some(FeedForward::Sparse(s)) = &ckpt.layers[1].ffn else {
            panic!("layer 1 is sparse")
        };
        assert!(s.shared.is_some() && s.score_bias.is_some());
        let nll = nll_on_cpu(&ckpt);
        assert!(
            nll.iter().all(|v| v.is_finite() && *v > 0.0),
            "{scheme:?}: {nll:?}"
        );
    }
}

/// The quantizers' own layouts (and MXFP4) read back through `Checkpoint` decode to the
/// weights the generator drew, within each format's rounding: a transposed or misordered
/// layout would be off by the weights' own size.
#[test]
fn native_layouts_decode_to_the_drawn_weights() {
    for (scheme, max_rel_rms) in [
        (SynthScheme::Mxfp4, 0.25),
        (SynthScheme::Mxfp4A4, 0.25),
        (SynthScheme::Mxfp8, 0.05),
        (SynthScheme::Mxfp8A8, 0.05),
        (SynthScheme::GptqInt4, 0.15),
        (SynthScheme::AwqInt4, 0.15),
        (SynthScheme::AwqGemvInt4, 0.15),
        (SynthScheme::Fp8Block, 0.05),
        (SynthScheme::ModeloptNvfp4, 0.2),
    ] {
        let dir = TempDir::new("native");
        write_checkpoint(SynthShape::Tiny, scheme, &dir.0, 11, |_| {}).unwrap();
        let mut ckpt = crate::checkpoint::Checkpoint::open(&dir.0).unwrap();
        let act = ckpt.linear(ckpt.layers[0].linears()[0]).unwrap().act_quant;
        let want = match scheme {
            SynthScheme::Mxfp4A4 => Some(crate::numerics::ActQuant::Mx { bits: 4 }),
            SynthScheme::Mxfp8A8 => Some(crate::numerics::ActQuant::Mx { bits: 8 }),
            _ => act,
        };
        assert_eq!(act, want, "{scheme:?}");
        ckpt.weight_only = true;
        for m in ckpt.layers[1].linears() {
            let q = ckpt.linear(m).unwrap();
            assert!(
                !q.scheme_label().starts_with("dense"),
                "{scheme:?} {}: read dense",
                m.name
            );
            let got = q.dequantize().unwrap();
            let want = original(11, &m.name, m.out_features, m.in_features);
            let rms = |v: &mut dyn Iterator<Item = f32>| {
                let (s, n) = v.fold((0f64, 0usize), |(s, n), x| (s + (x as f64).powi(2), n + 1));
                (s / n as f64).sqrt()
            };
            let err = rms(&mut got.iter().zip(&want).map(|(a, b)| a - b));
            let rel = err / rms(&mut want.iter().copied());
            assert!(
                rel < max_rel_rms,
                "{scheme:?} {}: relative RMS error {rel}",
                m.name
            );
        }
    }
}

/// The Gemma 3 and Phi-4 shapes write configs quantppl reads as those families, with the
/// tensors the forward pass looks for (sandwich norms; fused projections).
#[test]
fn gemma3_and_phi4_shapes_read_back_as_their_families() {
    use crate::checkpoint::{Architecture, ModelConfig};
    let names = |shape: SynthShape| unit_names(&shape.spec());
    let spec = SynthShape::Gemma3_27b.spec();
    let q = SynthScheme::W4a16G128.quantization_config(&spec);
    let c = ModelConfig::from_json(&spec.config_json(q)).unwrap();
    assert_eq!(c.architecture, Architecture::Gemma3);
    assert_eq!(c.window_of(0), Some(1024));
    assert_eq!(c.window_of(5), None);
    assert_eq!(c.attn_scale, 168f64.powf(-0.5));
    assert_eq!(c.local_rope.as_ref().map(|r| r.theta), Some(10_000.0));
    let n = names(SynthShape::Gemma3_27b);
    for norm in [
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
        "q_norm",
    ] {
        assert!(n.iter().any(|x| x.contains(norm)), "{norm}");
    }
    let c12 = ModelConfig::from_json(&SynthShape::Gemma3_12b.spec().config_json(None)).unwrap();
    assert_eq!((c12.head_dim, c12.attn_scale), (256, 256f64.powf(-0.5)));

    let phi = SynthShape::Phi4.spec();
    let c = ModelConfig::from_json(&phi.config_json(None)).unwrap();
    assert!(c.architecture == Architecture::Phi3 && c.fused_projections);
    let n = names(SynthShape::Phi4);
    assert!(n.contains(&"model.layers.0.self_attn.qkv_proj[7680, 5120]".to_string()));
    assert!(n.contains(&"model.layers.39.mlp.gate_up_proj[35840, 5120]".to_string()));
    // microsoft/phi-4: 14.66B parameters.
    assert_eq!(phi.params(), 14_659_507_200);
}

/// The gpt-oss shapes write configs quantppl reads as gpt-oss (sinks, biases, alternating
/// windows, YaRN without truncation, softmax over the top 4), with their published sizes.
#[test]
fn gpt_oss_shapes_read_back_as_gpt_oss() {
    use crate::checkpoint::{Architecture, GatedActivation, ModelConfig, RopeScaling, Router};
    let spec = SynthShape::GptOss20b.spec();
    let q = SynthScheme::Mxfp4.quantization_config(&spec);
    let c = ModelConfig::from_json(&spec.config_json(q)).unwrap();
    assert_eq!(c.architecture, Architecture::GptOss);
    assert!(c.attention_sinks && c.qkv_bias && c.o_bias);
    assert_eq!((c.window_of(0), c.window_of(1)), (Some(128), None));
    assert!(matches!(
        c.rope.scaling,
        Some(RopeScaling::Yarn {
            truncate: false,
            ..
        })
    ));
    let m = c.moe.as_ref().unwrap();
    assert_eq!((m.num_experts, m.experts_per_token), (32, 4));
    assert_eq!(m.router, Router::TopKSoftmax);
    assert!(matches!(
        c.mlp_activation,
        GatedActivation::ClampedSwiglu { limit: 7.0, .. }
    ));
    // openai/gpt-oss-20b: 20.91B parameters, gpt-oss-120b 116.83B.
    let b = |p: u64| p as f64 / 1e9;
    assert!((b(spec.params()) - 20.91).abs() < 0.01, "{}", spec.params());
    let big = SynthShape::GptOss120b.spec().params();
    assert!((b(big) - 116.83).abs() < 0.01, "{big}");
}

/// gpt-oss's layouts as `synth` writes them load as gpt-oss and run on the CPU: openai's
/// stacked MXFP4, transformers' stacked bf16 `[E, in, out]` and per-expert INT4 linears; the
/// stacked MXFP4 experts decode to the same weights as per-expert MXFP4 linears would.
#[test]
fn gpt_oss_layouts_load_and_run() {
    use crate::checkpoint::{Checkpoint, FeedForward};
    for scheme in [
        SynthScheme::Mxfp4,
        SynthScheme::DenseBf16,
        SynthScheme::W4a16G128,
    ] {
        let dir = TempDir::new("gpt-oss");
        write_checkpoint(SynthShape::TinyGptOss, scheme, &dir.0, 5, |_| {}).unwrap();
        let ckpt = Checkpoint::open(&dir.0).unwrap();
        assert!(ckpt.config.attention_sinks, "{scheme:?}");
        let Some(FeedForward::Sparse(s)) = &ckpt.layers[1].ffn else {
            panic!("layer 1 is sparse")
        };
        let gate_up = ckpt.linear(&s.experts[3].gate).unwrap();
        assert_eq!((gate_up.out_features, gate_up.in_features), (256, 256));
        assert!(gate_up.bias.is_some());
        if scheme == SynthScheme::Mxfp4 {
            // Expert 3's slice of the stack is the MXFP4 of expert 3's own seed.
            let name = "model.layers.1.mlp.experts.3.gate_up_proj.weight";
            let q = quantize::mxfp4(tensor_seed(5, name), 256, 256, WEIGHT_STD);
            let w = gate_up.dequantize().unwrap();
            let code = |i: usize| q.packed[i / 2] >> (4 * (i % 2)) & 0xf;
            let scale = crate::numerics::e8m0_to_f32(q.scale[0]);
            let want = crate::numerics::e2m1_to_f32(code(7)) * scale;
            assert_eq!(w[7], crate::numerics::FloatType::Bf16.round(want));
        }
        let nll = nll_on_cpu(&ckpt);
        assert!(nll.iter().all(|v| v.is_finite() && *v > 0.0), "{scheme:?}");
    }
}

/// DeepSeek-V3's published shape (671B, 37B active, as the DeepSeek-V3 report counts without
/// the multi-token-prediction module), its config read back as latent attention, a `--layers`
/// slice, and the test-size layout loading and running in every weight format.
#[test]
fn deepseek_v3_shapes_have_their_published_sizes_and_run() {
    use crate::checkpoint::{AttnProjections, Checkpoint, ModelConfig};
    let spec = SynthShape::DeepseekV3.spec();
    let b = |p: u64| p as f64 / 1e9;
    assert!(
        (b(spec.params()) / 671.0 - 1.0).abs() < 5e-3,
        "{}",
        spec.params()
    );
    let c = ModelConfig::from_json(&spec.config_json(None)).unwrap();
    assert!((b(c.active_params()) / 37.0 - 1.0).abs() < 2e-2);
    let m = c.mla.unwrap();
    assert_eq!((c.head_dim, c.rotary_dim, m.kv_lora_rank), (192, 64, 512));
    let names = unit_names(&spec);
    for n in [
        "model.layers.0.self_attn.q_b_proj[24576, 1536]",
        "model.layers.60.self_attn.kv_a_proj_with_mqa[576, 7168]",
        "model.layers.60.self_attn.kv_b_proj[32768, 512]",
        "model.layers.60.self_attn.o_proj[7168, 16384]",
        "model.layers.3.mlp.experts.255.down_proj[7168, 2048]",
        "model.layers.3.mlp.shared_experts.gate_proj[2048, 7168]",
        "model.layers.2.mlp.up_proj[18432, 7168]",
    ] {
        assert!(names.contains(&n.to_string()), "{n}");
    }

    let dir = TempDir::new("deepseek-slice");
    let summary = write_checkpoint_sharded(
        SynthShape::TinyDeepseekV3,
        Some(1),
        SynthScheme::DenseBf16,
        &dir.0,
        1,
        DEFAULT_MAX_SHARD_BYTES,
        |_| {},
    )
    .unwrap();
    assert_eq!(summary.layers, 1);
    assert_eq!(Checkpoint::open(&dir.0).unwrap().config.num_layers, 1);
    let too_many = write_checkpoint_sharded(
        SynthShape::TinyDeepseekV3,
        Some(3),
        SynthScheme::DenseBf16,
        &TempDir::new("deepseek-slice-3").0,
        1,
        DEFAULT_MAX_SHARD_BYTES,
        |_| {},
    );
    assert!(too_many.unwrap_err().to_string().contains("--layers 3"));

    for scheme in [
        SynthScheme::DenseBf16,
        SynthScheme::W4a16G128,
        SynthScheme::Fp8Block,
        SynthScheme::Nvfp4,
    ] {
        let dir = TempDir::new("deepseek");
        write_checkpoint(SynthShape::TinyDeepseekV3, scheme, &dir.0, 5, |_| {}).unwrap();
        let ckpt = Checkpoint::open(&dir.0).unwrap();
        assert!(
            matches!(
                ckpt.layers[1].mixer.as_ref().map(|m| &m.attn),
                Some(AttnProjections::Latent { q_a: Some(_), .. })
            ),
            "{scheme:?}"
        );
        let nll = nll_on_cpu(&ckpt);
        assert!(nll.iter().all(|v| v.is_finite() && *v > 0.0), "{scheme:?}");
    }
}

/// Mistral Small 4: 119B parameters as its name says, its config read back as Mistral 4's
/// latent attention under a grouped softmax router without a selection bias and with the
/// queries' position scale; per-expert linears as llm-compressor writes them; the tiny
/// shape's checkpoint runs on the CPU, dense and quantized.
#[test]
fn mistral_small_4_shape_reads_back_as_mistral4_and_runs() {
    use crate::checkpoint::{Architecture, Checkpoint, ModelConfig, Router};
    let spec = SynthShape::MistralSmall4.spec();
    let b = |p: u64| p as f64 / 1e9;
    assert!(
        (b(spec.params()) / 119.0 - 1.0).abs() < 1e-2,
        "{}",
        spec.params()
    );
    let c = ModelConfig::from_json(&spec.config_json(None)).unwrap();
    assert_eq!(c.architecture, Architecture::Mistral4);
    let m = c.mla.unwrap();
    assert_eq!((c.head_dim, c.rotary_dim, m.kv_lora_rank), (128, 64, 256));
    let moe = c.moe.unwrap();
    assert!(!moe.selection_bias && moe.is_sparse(0));
    assert!(matches!(
        moe.router,
        Router::GroupedSoftmax { renormalize: true, scale, .. } if scale == 1.0
    ));
    assert_eq!(c.query_scale.map(|q| q.period), Some(8192));
    let names = unit_names(&spec);
    for n in [
        "model.layers.0.self_attn.q_b_proj[4096, 1024]",
        "model.layers.35.self_attn.kv_a_proj_with_mqa[320, 4096]",
        "model.layers.35.self_attn.kv_b_proj[6144, 256]",
        "model.layers.0.mlp.experts.127.down_proj[4096, 2048]",
        "model.layers.0.mlp.shared_experts.gate_proj[2048, 4096]",
    ] {
        assert!(names.contains(&n.to_string()), "{n}");
    }
    for scheme in [SynthScheme::DenseBf16, SynthScheme::W4a16G128] {
        let dir = TempDir::new("mistral4");
        write_checkpoint(SynthShape::TinyMistral4, scheme, &dir.0, 5, |_| {}).unwrap();
        let ckpt = Checkpoint::open(&dir.0).unwrap();
        assert_eq!(ckpt.config.architecture, Architecture::Mistral4);
        let nll = nll_on_cpu(&ckpt);
        assert!(nll.iter().all(|v| v.is_finite() && *v > 0.0), "{scheme:?}");
    }
}

/// Qwen3.5's shapes: the 35B-A3B's parameters as its name says (about 35B in all, 3B active
/// per token, MTP and vision aside), the dense 27B's, its config read back as a DeltaNet hybrid with
/// llm-compressor's dense modules, and the tiny shape's checkpoint runs on the CPU.
#[test]
fn qwen3_5_shapes_read_back_as_hybrids_and_run() {
    let spec = SynthShape::Qwen3_5_35bA3b.spec();
    let total = spec.params() as f64 / 1e9;
    assert!((34.0..36.0).contains(&total), "{total}B");
    let cfg = crate::checkpoint::ModelConfig::from_json(&spec.config_json(None)).unwrap();
    let active = cfg.active_params() as f64 / 1e9;
    assert!((2.5..3.5).contains(&active), "{active}B active");
    assert_eq!(cfg.delta_net.map(|d| d.conv_width()), Some(8192));
    assert_eq!((0..40).filter(|&l| cfg.is_delta_net(l)).count(), 30);
    assert!(cfg.attn_output_gate && cfg.qk_norm.is_some() && cfg.rotary_dim == 64);
    // The checkpoint's count and the synthesizer's differ by the norms and per-head vectors.
    let d = cfg.delta_net.unwrap();
    let extra = 30 * (2 * 2048 + 2 * d.v_heads + d.v_dim) + 10 * (2 * 2048 + 2 * 256) + 2048;
    assert_eq!(cfg.num_params() + extra as u64, spec.params());
    // Qwen3.5-27B: about 27B with its embeddings (the language model of a 27B checkpoint
    // whose vision tower is about 0.4B).
    let dense = SynthShape::Qwen3_5_27b.spec();
    let total = dense.params() as f64 / 1e9;
    assert!((26.0..27.5).contains(&total), "27b: {total}B");
    let cfg = crate::checkpoint::ModelConfig::from_json(&dense.config_json(None)).unwrap();
    assert_eq!((0..64).filter(|&l| cfg.is_delta_net(l)).count(), 48);
    assert_eq!(cfg.delta_net.map(|d| d.value_width()), Some(6144));
    assert!(cfg.moe.is_none() && cfg.intermediate_size == 17_408);

    let (_dir, ckpt) = tiny_w4a16(SynthShape::TinyQwen3_5Moe, "qwen3_5");
    let label = |name: &str| scheme_label(&ckpt, name);
    assert!(label("model.layers.0.linear_attn.in_proj_qkv").starts_with("dense"));
    assert!(label("model.layers.3.self_attn.q_proj").starts_with("int4"));
    assert!(label("model.layers.0.mlp.experts.7.down_proj").starts_with("int4"));
    runs_on_two_sequences(&ckpt);
}

/// Qwen3-Next-80B-A3B's shape: about 80B parameters and 3B active as published, read back as
/// Qwen3-Next with its DeltaNets' projections fused (36 of 48 layers); the tiny layout's W4A16
/// checkpoint loads its fused projections and runs on the CPU.
#[test]
fn qwen3_next_shape_reads_back_fused_and_runs() {
    let spec = SynthShape::Qwen3Next80bA3b.spec();
    let total = spec.params() as f64 / 1e9;
    assert!((79.0..82.0).contains(&total), "{total}B");
    let cfg = crate::checkpoint::ModelConfig::from_json(&spec.config_json(None)).unwrap();
    assert_eq!(cfg.architecture, crate::checkpoint::Architecture::Qwen3Next);
    let active = cfg.active_params() as f64 / 1e9;
    assert!((2.8..3.9).contains(&active), "{active}B active");
    assert!(
        cfg.delta_net
            .is_some_and(|d| d.layout == DeltaNetLayout::Fused)
    );
    assert_eq!((0..48).filter(|&l| cfg.is_delta_net(l)).count(), 36);
    assert_eq!(cfg.moe.as_ref().map(|m| m.num_experts), Some(512));

    let (_dir, ckpt) = tiny_w4a16(SynthShape::TinyQwen3Next, "qwen3-next");
    assert!(
        ckpt.config
            .delta_net
            .is_some_and(|d| d.layout == DeltaNetLayout::Fused)
    );
    runs_on_two_sequences(&ckpt);
}

/// The tiny shape's W4A16 checkpoint (seed 5) written to a temporary directory and opened;
/// the directory lives as long as the returned guard.
fn tiny_w4a16(shape: SynthShape, tag: &str) -> (TempDir, crate::checkpoint::Checkpoint) {
    let dir = TempDir::new(tag);
    write_checkpoint(shape, SynthScheme::W4a16G128, &dir.0, 5, |_| {}).unwrap();
    let ckpt = crate::checkpoint::Checkpoint::open(&dir.0).unwrap();
    (dir, ckpt)
}

/// The scheme label of linear `name` of `ckpt` (`int4 group128 sym`, `dense bf16`, …).
fn scheme_label(ckpt: &crate::checkpoint::Checkpoint, name: &str) -> String {
    let m = ckpt
        .layers
        .iter()
        .flat_map(|l| l.linears())
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no linear {name}"));
    ckpt.linear(m).unwrap().scheme_label()
}

/// `ckpt` on the CPU over two sequences of 200 and 56 tokens (a recurrent layer's state and
/// convolution restart at the second): every NLL finite and positive.
fn runs_on_two_sequences(ckpt: &crate::checkpoint::Checkpoint) {
    let b = crate::backend::cpu::CpuBackend::new();
    let model = crate::model::Model::load(&b, ckpt, 256, &|_, _| {}).unwrap();
    let ids: Vec<u32> = (0..256).map(|i| (i * 37 + 11) % 512).collect();
    let targets: Vec<i32> = ids[1..].iter().map(|&t| t as i32).chain([-1]).collect();
    let layout = crate::backend::SeqLayout::from_lengths([200, 56]);
    let nll = model.nll(&b, &ids, &layout, &targets).unwrap();
    assert!(nll.len() == 255 && nll.iter().all(|v| v.is_finite() && *v > 0.0));
}

/// A write that fails part-way (a full disk; here a shard path that is a directory) leaves no
/// config.json beside a sized, unwritten shard that would read back as zeros (issue 56, F8):
/// what was written is removed and the error says so.
#[test]
fn a_failed_write_removes_the_partial_checkpoint() {
    let dir = TempDir::new("partial");
    std::fs::create_dir_all(dir.0.join("model.safetensors")).unwrap();
    let e = write_checkpoint(SynthShape::Tiny, SynthScheme::DenseBf16, &dir.0, 0, |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("files were removed"),
        "{e}"
    );
    assert!(!dir.0.join("config.json").exists());
    assert!(!dir.0.join("generation_config.json").exists());
}

/// LFM2's and Nemotron-H's shapes: their parameters as published (LFM2-1.2B and -2.6B to
/// the parameter, as their cards give them; Nemotron-H-8B about 8.10B), their configs read back
/// with the same count and block kinds, and the tiny shapes' W4A16 checkpoints load and run on
/// the CPU.
#[test]
fn lfm2_and_nemotron_h_shapes_read_back_and_run() {
    assert_eq!(SynthShape::Lfm2_1_2b.spec().params(), 1_170_340_608);
    assert_eq!(SynthShape::Lfm2_2_6b.spec().params(), 2_569_272_320);
    for (shape, billions) in [
        (SynthShape::Lfm2_1_2b, 1.10..1.25),
        (SynthShape::Lfm2_2_6b, 2.55..2.60),
        (SynthShape::NemotronH8b, 8.05..8.15),
    ] {
        let spec = shape.spec();
        let total = spec.params() as f64 / 1e9;
        assert!(billions.contains(&total), "{shape:?}: {total}B");
        let cfg = crate::checkpoint::ModelConfig::from_json(&spec.config_json(None)).unwrap();
        assert_eq!(cfg.num_layers, spec.layers);
        // The config's count leaves out norms and per-head vectors.
        let counted = cfg.num_params() as f64 / spec.params() as f64;
        assert!((0.999..=1.0).contains(&counted), "{shape:?}: {counted}");
    }
    let cfg = crate::checkpoint::ModelConfig::from_json(
        &SynthShape::NemotronH8b.spec().config_json(None),
    )
    .unwrap();
    assert_eq!((0..52).filter(|&l| cfg.is_mamba(l)).count(), 24);
    assert_eq!((0..52).filter(|&l| !cfg.has_mixer(l)).count(), 24);
    assert_eq!(cfg.mamba.unwrap().in_proj_width(), 18_560);

    for shape in [SynthShape::TinyLfm2, SynthShape::TinyNemotronH] {
        let (_dir, ckpt) = tiny_w4a16(shape, "recurrent-shapes");
        runs_on_two_sequences(&ckpt);
    }
}

/// Granite 4.0-H-Small's shape: about 32B parameters and 9B active as published, read back
/// as the hybrid mixture it is (36 Mamba-2 layers, 72 experts of 768, 10 per token, the shared
/// MLP of 1536, Granite's multipliers); the tiny layout's W4A16 checkpoint (the shared MLP's
/// fused `input_linear` packed, each expert's linears) loads and runs on the CPU.
#[test]
fn granite_4_h_shapes_read_back_and_run() {
    let spec = SynthShape::Granite4HSmall.spec();
    let total = spec.params() as f64 / 1e9;
    assert!((31.0..33.5).contains(&total), "{total}B");
    let cfg = crate::checkpoint::ModelConfig::from_json(&spec.config_json(None)).unwrap();
    let active = cfg.active_params() as f64 / 1e9;
    assert!((8.0..10.0).contains(&active), "{active}B active");
    assert_eq!((0..40).filter(|&l| cfg.is_mamba(l)).count(), 36);
    let moe = cfg.moe.clone().unwrap();
    assert_eq!((moe.num_experts, moe.experts_per_token), (72, 10));
    assert_eq!(
        (moe.expert_intermediate_size, cfg.intermediate_size),
        (768, 1536)
    );
    assert_eq!(cfg.mamba.unwrap().inner(), 8192);
    assert!(cfg.rotary_dim == 0 && cfg.multipliers.is_some());
    // The config's count leaves out norms and per-head vectors.
    let counted = cfg.num_params() as f64 / spec.params() as f64;
    assert!((0.999..=1.0).contains(&counted), "{counted}");

    let (_dir, ckpt) = tiny_w4a16(SynthShape::TinyGranite4H, "granite");
    runs_on_two_sequences(&ckpt);
}

/// MiniMax-M2's shape: about 229B parameters and 10B active (embeddings aside) as published, read back as
/// MiniMax-M2 (q/k norms over the whole projections, 64 of 128 values rotated, the sigmoid
/// router with its selection bias, every layer sparse); the tiny layout's W4A16 checkpoint
/// loads and runs on the CPU.
#[test]
fn minimax_m2_shape_reads_back_and_runs() {
    use crate::checkpoint::config::{QkNorm, Router};
    let spec = SynthShape::MiniMaxM2.spec();
    let total = spec.params() as f64 / 1e9;
    assert!((228.0..231.0).contains(&total), "{total}B");
    let cfg = crate::checkpoint::ModelConfig::from_json(&spec.config_json(None)).unwrap();
    // The card's 10B active leave out the embedding and lm_head.
    let embeddings = 2 * spec.vocab * spec.hidden;
    let active = (cfg.active_params() - embeddings as u64) as f64 / 1e9;
    assert!((9.5..10.5).contains(&active), "{active}B active");
    assert_eq!(
        (cfg.qk_norm, cfg.rotary_dim),
        (Some(QkNorm::Projection), 64)
    );
    let moe = cfg.moe.clone().unwrap();
    assert_eq!((moe.num_experts, moe.experts_per_token), (256, 8));
    assert!(moe.selection_bias && (0..62).all(|l| moe.is_sparse(l)));
    assert!(matches!(
        moe.router,
        Router::Sigmoid {
            groups: 1,
            renormalize: true,
            ..
        }
    ));
    let counted = cfg.num_params() as f64 / spec.params() as f64;
    assert!((0.999..=1.0).contains(&counted), "{counted}");

    let (_dir, ckpt) = tiny_w4a16(SynthShape::TinyMiniMaxM2, "minimax-m2");
    runs_on_two_sequences(&ckpt);
}

/// Nemotron 3 Nano's shape: about 31.6B parameters and 3.2-3.6B active as published, its
/// mixture blocks read back (128 ungated experts, 6 per token, the grouped sigmoid router, a
/// shared expert of 3712); the tiny layout's mixtures run above.
#[test]
fn nemotron_3_nano_shape_reads_back_as_a_hybrid_mixture() {
    let spec = SynthShape::Nemotron3Nano30bA3b.spec();
    let total = spec.params() as f64 / 1e9;
    assert!((31.0..32.5).contains(&total), "{total}B");
    let cfg = crate::checkpoint::ModelConfig::from_json(&spec.config_json(None)).unwrap();
    let active = cfg.active_params() as f64 / 1e9;
    assert!((3.0..3.8).contains(&active), "{active}B active");
    let m = cfg.moe.as_ref().unwrap();
    assert_eq!((m.num_experts, m.experts_per_token), (128, 6));
    assert_eq!(m.shared_expert.map(|s| s.intermediate_size), Some(3712));
    assert_eq!((0..52).filter(|&l| m.is_sparse(l)).count(), 23);
    assert_eq!((0..52).filter(|&l| cfg.is_mamba(l)).count(), 23);
    let counted = cfg.num_params() as f64 / spec.params() as f64;
    assert!((0.999..=1.0).contains(&counted), "{counted}");
}

/// DeepSeek-V3.2's and GLM-5's shapes: their indexers' tensors and parameters (DeepSeek-V3.2
/// is DeepSeek-V3 plus 61 indexers; GLM-5 about 744B, 40B active, as its card says), their
/// configs read back with sparse attention, and the test-size layout's checkpoint running
/// sparse on the CPU past its 64 keys a query in every weight format.
#[test]
fn sparse_attention_shapes_have_their_indexers_and_run() {
    use crate::checkpoint::{Architecture, Checkpoint, ModelConfig};
    let v3 = SynthShape::DeepseekV3.spec().params();
    let v32 = SynthShape::DeepseekV32.spec();
    let per_layer = 1536 * 64 * 128 + 7168 * (128 + 64) + 2 * 128;
    assert_eq!(v32.params() - v3, 61 * per_layer);
    let c = ModelConfig::from_json(&v32.config_json(None)).unwrap();
    assert_eq!(c.architecture, Architecture::DeepseekV32);
    let ix = c.indexer.unwrap();
    assert_eq!(
        (ix.heads, ix.head_dim, ix.top_k, ix.rope_interleave),
        (64, 128, 2048, false)
    );
    let names = unit_names(&v32);
    for n in [
        "model.layers.60.self_attn.indexer.wq_b[8192, 1536]",
        "model.layers.60.self_attn.indexer.wk[128, 7168]",
        "model.layers.60.self_attn.indexer.k_norm.bias[128]",
        "model.layers.60.self_attn.indexer.weights_proj[64, 7168]",
    ] {
        assert!(names.contains(&n.to_string()), "{n}");
    }
    let glm = SynthShape::Glm5.spec();
    let b = |p: u64| p as f64 / 1e9;
    assert!(
        (b(glm.params()) / 744.0 - 1.0).abs() < 2e-2,
        "{}",
        glm.params()
    );
    let c = ModelConfig::from_json(&glm.config_json(None)).unwrap();
    assert_eq!(c.architecture, Architecture::GlmMoeDsa);
    assert!(
        (b(c.active_params()) / 40.0 - 1.0).abs() < 5e-2,
        "{}",
        c.active_params()
    );
    assert!(c.indexer.unwrap().rope_interleave);

    for scheme in [
        SynthScheme::DenseBf16,
        SynthScheme::W4a16G128,
        SynthScheme::Fp8Block,
    ] {
        let dir = TempDir::new("deepseek-v3.2");
        write_checkpoint(SynthShape::TinyDeepseekV32, scheme, &dir.0, 5, |_| {}).unwrap();
        let ckpt = Checkpoint::open(&dir.0).unwrap();
        assert_eq!(ckpt.config.indexer.as_ref().map(|ix| ix.top_k), Some(64));
        // 160 tokens: the later queries keep 64 of their keys.
        let nll = nll_of_tokens_on_cpu(&ckpt, 160);
        assert!(nll.iter().all(|v| v.is_finite() && *v > 0.0), "{scheme:?}");
    }
}

/// Mistral Large 4's shape has its published size (1T parameters, 52B active; the count
/// `params` gives is the tensors' the writer lays out) and reads back
/// as Mistral Large 4 (every fourth layer without RoPE, its latent heads then unrotated; the
/// indexer's queries from the layer's input); the tiny layout's checkpoints load and run on
/// the CPU past the indexer's 64 keys.
#[test]
fn mistral_large4_shapes_read_back_and_run() {
    use crate::checkpoint::{Architecture, Checkpoint, ModelConfig};
    let spec = SynthShape::MistralLarge4.spec();
    let b = |p: u64| p as f64 / 1e9;
    // 1,050B: the name rounds it.
    assert!(
        (b(spec.params()) / 1000.0 - 1.0).abs() < 6e-2,
        "{}",
        spec.params()
    );
    let laid_out = |spec: &shapes::ModelSpec| -> u64 {
        let dims = |n: &String| -> u64 {
            let shape = &n[n.find('[').unwrap() + 1..n.len() - 1];
            shape
                .split(", ")
                .map(|d| d.parse::<u64>().unwrap())
                .product()
        };
        unit_names(spec).iter().map(dims).sum()
    };
    for s in [SynthShape::MistralLarge4, SynthShape::TinyMistralLarge4].map(|s| s.spec()) {
        assert_eq!(laid_out(&s), s.params());
    }
    let c = ModelConfig::from_json(&spec.config_json(None)).unwrap();
    assert_eq!(c.architecture, Architecture::MistralLarge4);
    assert!(
        (b(c.active_params()) / 52.0 - 1.0).abs() < 5e-2,
        "{}",
        c.active_params()
    );
    assert!(c.indexer.as_ref().unwrap().query_from_input);
    assert_eq!(c.mla.unwrap().q_lora_rank, None);
    assert!(c.uses_rope(2) && !c.uses_rope(3) && c.latent_dims(3).unwrap().rope_dim == 0);
    let names = unit_names(&spec);
    for n in [
        "model.rotary_emb.alpha[32]",
        "model.layers.3.self_attn.kv_a_proj_with_mqa[512, 6144]",
        "model.layers.3.self_attn.kv_b_proj[16384, 512]",
        "model.layers.2.self_attn.kv_b_proj[12288, 512]",
        "model.layers.3.self_attn.softmax_scaling.bias[64]",
        "model.layers.3.self_attn.indexer.wq_b[4096, 6144]",
        "model.layers.3.self_attn.indexer.q_input_norm.bias[6144]",
        "model.layers.3.self_attn.indexer.softmax_scaling.scale[32]",
    ] {
        assert!(names.contains(&n.to_string()), "{n}");
    }
    for scheme in [SynthScheme::DenseBf16, SynthScheme::W4a16G128] {
        let dir = TempDir::new("mistral-large4");
        write_checkpoint(SynthShape::TinyMistralLarge4, scheme, &dir.0, 5, |_| {}).unwrap();
        let ckpt = Checkpoint::open(&dir.0).unwrap();
        assert_eq!(ckpt.config.architecture, Architecture::MistralLarge4);
        // 160 tokens: the later queries keep 64 of their keys.
        let nll = nll_of_tokens_on_cpu(&ckpt, 160);
        assert!(nll.iter().all(|v| v.is_finite() && *v > 0.0), "{scheme:?}");
    }
}

/// Gemma 4's large shapes read back as Gemma 4 (full-attention heads of 512 whose values are
/// the keys' projection, every sixth layer; the 26B-A4B's mixture beside each dense MLP), the
/// config's parameter count the writer's; the tiny mixture's W4A16 checkpoint (routers dense)
/// loads and runs on the CPU.
#[test]
fn gemma4_shapes_read_back_and_run() {
    use crate::checkpoint::config::HeadShape;
    for (shape, billions) in [
        // The cards' 30.7B and 25.2B.
        (SynthShape::Gemma4_31b, 30.6..30.8),
        (SynthShape::Gemma4_26bA4b, 25.1..25.3),
    ] {
        let spec = shape.spec();
        let total = spec.params() as f64 / 1e9;
        assert!(billions.contains(&total), "{shape:?}: {total}B");
        let q = SynthScheme::W4a16G128.quantization_config(&spec);
        let cfg = crate::checkpoint::ModelConfig::from_json(&spec.config_json(q)).unwrap();
        let counted = cfg.num_params() as f64 / spec.params() as f64;
        assert!((0.999..=1.0).contains(&counted), "{shape:?}: {counted}");
        assert_eq!(cfg.heads_of(0).head_dim, 256);
        assert_eq!(cfg.heads_of(5).head_dim, 512);
        assert!(cfg.values_from_keys(5) && !cfg.values_from_keys(4));
        assert_eq!(cfg.window_of(0), Some(1024));
    }
    let cfg = crate::checkpoint::ModelConfig::from_json(
        &SynthShape::Gemma4_26bA4b.spec().config_json(None),
    )
    .unwrap();
    assert_eq!(
        cfg.heads_of(29),
        HeadShape {
            head_dim: 512,
            kv_heads: 2
        }
    );
    let moe = cfg.moe.as_ref().unwrap();
    assert!(moe.beside_dense && (moe.num_experts, moe.experts_per_token) == (128, 8));
    // A slice ending before a sixth layer ends in a full one, as transformers reads it, and
    // holds what its config counts.
    let mut two = SynthShape::Gemma4_26bA4b.spec();
    two.layers = 2;
    let sliced = crate::checkpoint::ModelConfig::from_json(&two.config_json(None)).unwrap();
    assert_eq!(
        (sliced.heads_of(0).head_dim, sliced.heads_of(1).head_dim),
        (256, 512)
    );
    let counted = sliced.num_params() as f64 / two.params() as f64;
    assert!((0.999..=1.0).contains(&counted), "2 layers: {counted}");
    // The card's 3.8B active.
    let active = cfg.active_params() as f64 / 1e9;
    assert!((3.75..3.9).contains(&active), "{active}B active");

    let (_dir, ckpt) = tiny_w4a16(SynthShape::TinyGemma4, "gemma4");
    runs_on_two_sequences(&ckpt);
}

/// Llama-4-Scout read back as Llama 4 (RoPE and chunks on three layers of four, a mixture of
/// 16 experts with the top 1 on its input in every layer), the config's parameter count the
/// writer's; the tiny shape's W4A16 checkpoint (routers dense, mixtures on every second
/// layer) loads and runs on the CPU.
#[test]
fn llama4_shapes_read_back_and_run() {
    let spec = SynthShape::Llama4Scout.spec();
    let q = SynthScheme::W4a16G128.quantization_config(&spec);
    let cfg = crate::checkpoint::ModelConfig::from_json(&spec.config_json(q)).unwrap();
    let counted = cfg.num_params() as f64 / spec.params() as f64;
    assert!((0.999..=1.0).contains(&counted), "{counted}");
    // The card's 17B active; its 109B total counts the vision tower too (the language model:
    // 48 x 2.2B a layer, 2.1B of embeddings).
    let (total, active) = (spec.params() as f64 / 1e9, cfg.active_params() as f64 / 1e9);
    assert!((107.5..108.0).contains(&total), "{total}B");
    assert!((17.0..17.3).contains(&active), "{active}B active");
    assert!(cfg.uses_rope(2) && !cfg.uses_rope(3) && cfg.chunk_of(2) == Some(8192));
    let moe = cfg.moe.as_ref().unwrap();
    assert!(moe.weights_on_input && moe.sparse_layers.iter().all(|&s| s));

    let (_dir, ckpt) = tiny_w4a16(SynthShape::TinyLlama4, "llama4");
    let sparse = &ckpt.config.moe.as_ref().unwrap().sparse_layers;
    assert_eq!(sparse, &[false, true, false, true]);
    runs_on_two_sequences(&ckpt);
}

/// GLM-5.3-Flash's shape (transformers' `Glm5NextTextConfig` defaults) read back as
/// GLM-5.3-Flash: 34 KDA layers under the safe gate, 11 latent-attention layers with pooled
/// sparse attention, hyper-connections; the checkpoint's count equals the synthesizer's but
/// for the vectors, the pools' and the hyper-connections' tensors; the tiny layout's W4A16
/// checkpoint loads and runs on the CPU.
#[test]
fn glm5_next_shape_reads_back_and_runs() {
    use crate::checkpoint::Architecture;
    let spec = SynthShape::Glm53Flash.spec();
    let cfg = crate::checkpoint::ModelConfig::from_json(&spec.config_json(None)).unwrap();
    assert_eq!(cfg.architecture, Architecture::Glm5Next);
    assert_eq!((0..45).filter(|&l| cfg.is_delta_net(l)).count(), 34);
    assert_eq!(cfg.kda_lower_bound, Some(-5.0));
    let ix = cfg.indexer.as_ref().unwrap();
    assert_eq!(ix.pools.map(|p| p.size), Some(16));
    assert_eq!(cfg.hyper.map(|h| h.streams), Some(4));
    let (h, n) = (spec.hidden, 4);
    // Norms: two a layer and the final one; the latent layers' query and KV norms, the
    // indexer's k_norm (weight and bias), its pools' gate and slot terms; the KDA layers'
    // A_log, decay bias and o_norm; the routers' selection biases; the hyper-connections.
    let id = 128;
    let attending = 11 * (1536 + 512 + 2 * id + id * h + 16 * id);
    let kda = 34 * (64 + 64 * 128 + 128);
    let hyper = 45 * 2 * ((2 + n) * n * (n * h + 1) + 3);
    let vectors = 45 * 2 * h + h + attending + kda + 42 * 288 + hyper;
    assert_eq!(cfg.num_params() + vectors as u64, spec.params());

    let (_dir, ckpt) = tiny_w4a16(SynthShape::TinyGlm5Next, "glm5-next");
    let label = |name: &str| scheme_label(&ckpt, name);
    assert!(label("model.layers.0.self_attn.q_proj").starts_with("int4"));
    assert!(label("model.layers.0.self_attn.f_b_proj").starts_with("dense"));
    assert!(label("model.layers.3.self_attn.kv_b_proj").starts_with("int4"));
    assert!(label("model.layers.3.mlp.experts.7.down_proj").starts_with("int4"));
    runs_on_two_sequences(&ckpt);
}

/// Kimi-Linear-48B-A3B's shape: about 49B parameters and 3B active as published (its card's
/// "48B" rounds 49.1B down), read back as Kimi-Linear (20 KDA layers of 32 heads of 128, 7
/// latent-attention layers without RoPE, 256 experts of 1024 after a dense first layer); the
/// checkpoint's count equals the synthesizer's but for the norms and per-head vectors; the tiny
/// layout's W4A16 checkpoint (the KDA's low-rank pairs and b_proj dense) loads and runs on the
/// CPU.
#[test]
fn kimi_linear_shape_reads_back_and_runs() {
    use crate::checkpoint::Architecture;
    let spec = SynthShape::KimiLinear48bA3b.spec();
    let total = spec.params() as f64 / 1e9;
    assert!((48.5..49.5).contains(&total), "{total}B");
    let cfg = crate::checkpoint::ModelConfig::from_json(&spec.config_json(None)).unwrap();
    assert_eq!(cfg.architecture, Architecture::KimiLinear);
    let active = cfg.active_params() as f64 / 1e9;
    assert!((2.8..3.5).contains(&active), "{active}B active");
    let d = cfg.delta_net.unwrap();
    assert_eq!(d.layout, DeltaNetLayout::Kimi);
    assert_eq!((0..27).filter(|&l| cfg.is_delta_net(l)).count(), 20);
    assert!(!cfg.is_delta_net(26) && cfg.rotary_dim == 0);
    // Norms: two a layer and the final one; the latent layers' KV norm; the KDA layers' A_log,
    // decay bias and o_norm; the routers' selection biases.
    let h = spec.hidden;
    let vectors = 27 * 2 * h + h + 7 * 512 + 20 * (32 + 32 * 128 + 128) + 26 * 256;
    assert_eq!(cfg.num_params() + vectors as u64, spec.params());

    let (_dir, ckpt) = tiny_w4a16(SynthShape::TinyKimiLinear, "kimi-linear");
    let label = |name: &str| scheme_label(&ckpt, name);
    assert!(label("model.layers.0.self_attn.q_proj").starts_with("int4"));
    assert!(label("model.layers.0.self_attn.f_b_proj").starts_with("dense"));
    assert!(label("model.layers.2.self_attn.kv_b_proj").starts_with("int4"));
    assert!(label("model.layers.1.block_sparse_moe.experts.7.w2").starts_with("int4"));
    runs_on_two_sequences(&ckpt);
}
