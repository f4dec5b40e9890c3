//! Every wgpu kernel against the CPU reference on seeded random inputs of awkward sizes (not
//! multiples of the tiles, one token, group sizes 32/128/full row, vocabularies that do not
//! divide the vocabulary tile). Dequantization is checked bit for bit: a matmul with the
//! identity as input returns W^T exactly. Without a GPU adapter each test says so and passes.

use quantppl::backend::cpu::CpuBackend;
use quantppl::backend::wgpu::{TileConfig, WgpuBackend, list_adapters};
use quantppl::backend::{AttnShape, Backend, OutType, SeqLayout};
use quantppl::checkpoint::scheme::Strategy;
use quantppl::checkpoint::{Packing, QLinear, TensorRef, ZeroPoint};
use quantppl::numerics::{ActQuant, FloatType};
use safetensors::Dtype;

/// The adapter's own tile shapes, then the 256-thread matmul / 16-query attention shape where
/// it differs and fits (so a CPU adapter also runs the workgroup layout of discrete GPUs).
fn backends() -> Vec<WgpuBackend> {
    if list_adapters().is_empty() {
        println!("skipping: no wgpu adapter with compute shaders on this machine");
        return Vec::new();
    }
    let b = WgpuBackend::new(None).expect("wgpu backend");
    let wide = TileConfig::MEDIUM;
    let differs = b.tiles() != wide;
    let mut v = vec![b];
    if differs && let Ok(w) = WgpuBackend::with_tiles(None, wide) {
        v.push(w);
    }
    v
}

/// xorshift64*: reproducible inputs (seed printed in failures through the case name).
struct Rng(u64);

impl Rng {
    fn u32(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545F4914F6CDD1D) >> 32) as u32
    }
    fn f32(&mut self) -> f32 {
        self.u32() as f32 / u32::MAX as f32 * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u32() as u8).collect()
    }
}

/// A tensor owned by the test, lent to a QLinear as a TensorRef.
struct T {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl T {
    fn new(name: &str, dtype: Dtype, shape: &[usize], bytes: Vec<u8>) -> Self {
        Self {
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
            bytes,
        }
    }
    fn floats(name: &str, dt: FloatType, shape: &[usize], v: &[f32]) -> Self {
        let (dtype, bytes): (Dtype, Vec<u8>) = match dt {
            FloatType::F32 => (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            FloatType::F16 => (
                Dtype::F16,
                v.iter()
                    .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                    .collect(),
            ),
            FloatType::Bf16 => (
                Dtype::BF16,
                v.iter()
                    .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                    .collect(),
            ),
        };
        Self::new(name, dtype, shape, bytes)
    }
    fn r(&self) -> TensorRef<'_> {
        TensorRef {
            name: &self.name,
            dtype: self.dtype,
            shape: &self.shape,
            bytes: &self.bytes,
        }
    }
}

fn linear<'a>(name: &'a str, out: usize, n_in: usize, packing: Packing<'a>) -> QLinear<'a> {
    QLinear {
        name,
        out_features: out,
        in_features: n_in,
        packing,
        bias: None,
        act_quant: None,
        model_dtype: FloatType::Bf16,
    }
}

/// The GPU matmul of the identity returns every dequantized weight; compare bit for bit.
fn assert_exact_dequant(b: &WgpuBackend, w: &QLinear, case: &str) {
    let (out, n_in) = (w.out_features, w.in_features);
    let mut eye = vec![0f32; n_in * n_in];
    for i in 0..n_in {
        eye[i * n_in + i] = 1.0;
    }
    let gw = b.upload_linear(w).expect("upload");
    let x = b.upload_vector("eye", &eye).expect("eye");
    let y = b
        .download(&b.linear(&x, &gw, n_in).expect("linear"))
        .expect("download");
    let want = w.dequantize().expect("reference dequantization");
    for r in 0..out {
        for c in 0..n_in {
            let (g, e) = (y[c * out + r], want[r * n_in + c]);
            assert!(
                g.to_bits() == e.to_bits() || (g == 0.0 && e == 0.0),
                "{case}: W[{r}, {c}] = {g:e} on the GPU, {e:e} in the reference"
            );
        }
    }
}

/// Packs signed codes `q` (row-major `[out, in]`) as compressed-tensors does (dense bitstream).
fn pack_codes(q: &[i64], out: usize, n_in: usize, bits: u32) -> (Vec<u8>, usize) {
    let wpr = (n_in * bits as usize).div_ceil(32);
    let mut words = vec![0u32; out * wpr];
    for r in 0..out {
        for c in 0..n_in {
            let u = (q[r * n_in + c] + (1 << (bits - 1))) as u64;
            let bit = c * bits as usize;
            let v = u << (bit % 32);
            words[r * wpr + bit / 32] |= v as u32;
            if bit % 32 + bits as usize > 32 {
                words[r * wpr + bit / 32 + 1] |= (v >> 32) as u32;
            }
        }
    }
    (bytemuck::cast_slice(&words).to_vec(), wpr)
}

#[test]
fn packed_int_dequantizes_bit_exactly() {
    for b in backends() {
        packed_int_dequantizes_bit_exactly_on(&b);
    }
}

fn packed_int_dequantizes_bit_exactly_on(b: &WgpuBackend) {
    let mut rng = Rng(7);
    // (bits, out, in, strategy, asym, g_idx, scale dtype)
    let cases = [
        (
            4,
            70,
            200,
            Strategy::Group(32),
            false,
            false,
            FloatType::Bf16,
        ),
        (
            4,
            33,
            200,
            Strategy::Group(128),
            true,
            true,
            FloatType::Bf16,
        ),
        (4, 9, 72, Strategy::Channel, true, false, FloatType::F16),
        (8, 65, 100, Strategy::Channel, false, false, FloatType::Bf16),
        (8, 17, 96, Strategy::Group(96), true, false, FloatType::F32),
        (
            3,
            21,
            77,
            Strategy::Group(32),
            false,
            false,
            FloatType::Bf16,
        ),
        (4, 5, 40, Strategy::Tensor, false, false, FloatType::Bf16),
    ];
    for (bits, out, n_in, strategy, asym, with_g_idx, sdt) in cases {
        let case =
            format!("int{bits} {out}x{n_in} {strategy:?} asym={asym} g_idx={with_g_idx} {sdt:?}");
        let half = 1i64 << (bits - 1);
        let q: Vec<i64> = (0..out * n_in)
            .map(|_| (rng.u32() % (1 << bits)) as i64 - half)
            .collect();
        let (codes, wpr) = pack_codes(&q, out, n_in, bits);
        let packed = T::new("w.weight_packed", Dtype::I32, &[out, wpr], codes);
        let n_groups = match strategy {
            Strategy::Group(g) => n_in.div_ceil(g),
            _ => 1,
        };
        let n_scales = if strategy == Strategy::Tensor {
            1
        } else {
            out * n_groups
        };
        let scales: Vec<f32> = (0..n_scales)
            .map(|_| rng.f32().abs() * 0.05 + 1e-3)
            .collect();
        let scale_shape = if strategy == Strategy::Tensor {
            vec![1]
        } else {
            vec![out, n_groups]
        };
        let scale = T::floats("w.weight_scale", sdt, &scale_shape, &scales);
        // Zero points packed along out, 32/bits rows per word.
        let per = (32 / bits) as usize;
        let mut zw = vec![0u32; out.div_ceil(per) * n_groups];
        for r in 0..out {
            for g in 0..n_groups {
                let z = rng.u32() % (1 << bits);
                zw[(r / per) * n_groups + g] |= z << (bits as usize * (r % per));
            }
        }
        let zeros = T::new(
            "w.weight_zero_point",
            Dtype::I32,
            &[out.div_ceil(per), n_groups],
            bytemuck::cast_slice(&zw).to_vec(),
        );
        let g_idx: Vec<i32> = (0..n_in).map(|c| ((c * 7 + 3) % n_groups) as i32).collect();
        let g_idx = T::new(
            "w.weight_g_idx",
            Dtype::I32,
            &[n_in],
            bytemuck::cast_slice(&g_idx).to_vec(),
        );
        let w = linear(
            "w",
            out,
            n_in,
            Packing::PackedInt {
                bits,
                packed: packed.r(),
                words_per_row: wpr,
                legacy_codes_per_word: None,
                scale: scale.r(),
                zero_point: asym.then(|| ZeroPoint::PackedAlongOut(zeros.r())),
                strategy,
                g_idx: with_g_idx.then(|| g_idx.r()),
            },
        );
        assert_exact_dequant(b, &w, &case);
    }
}

#[test]
fn legacy_3bit_layout_dequantizes_bit_exactly() {
    for b in backends() {
        legacy_3bit_layout_dequantizes_bit_exactly_on(&b);
    }
}

fn legacy_3bit_layout_dequantizes_bit_exactly_on(b: &WgpuBackend) {
    let mut rng = Rng(11);
    let (out, n_in, per) = (13usize, 45usize, 10usize);
    let wpr = n_in.div_ceil(per);
    let mut words = vec![0u32; out * wpr];
    for r in 0..out {
        for c in 0..n_in {
            words[r * wpr + c / per] |= (rng.u32() % 8) << (3 * (c % per));
        }
    }
    let packed = T::new(
        "w.weight_packed",
        Dtype::I32,
        &[out, wpr],
        bytemuck::cast_slice(&words).to_vec(),
    );
    let scales: Vec<f32> = (0..out).map(|_| rng.f32().abs() * 0.1).collect();
    let scale = T::floats("w.weight_scale", FloatType::Bf16, &[out, 1], &scales);
    let mut w = linear(
        "w",
        out,
        n_in,
        Packing::PackedInt {
            bits: 3,
            packed: packed.r(),
            words_per_row: wpr,
            legacy_codes_per_word: Some(per),
            scale: scale.r(),
            zero_point: None,
            strategy: Strategy::Channel,
            g_idx: None,
        },
    );
    assert_exact_dequant(b, &w, "int3 legacy bf16 model");
    w.model_dtype = FloatType::F16;
    assert_exact_dequant(b, &w, "int3 legacy f16 model");
}

#[test]
fn nvfp4_dequantizes_bit_exactly() {
    for b in backends() {
        nvfp4_dequantizes_bit_exactly_on(&b);
    }
}

fn nvfp4_dequantizes_bit_exactly_on(b: &WgpuBackend) {
    let mut rng = Rng(13);
    let (out, n_in) = (67, 208);
    let packed = T::new(
        "w.weight_packed",
        Dtype::U8,
        &[out, n_in / 2],
        rng.bytes(out * n_in / 2),
    );
    // Every FP8 byte but the NaNs.
    let sb: Vec<u8> = (0..out * n_in / 16)
        .map(|_| {
            let v = rng.u32() as u8;
            if v & 0x7f == 0x7f { 0x38 } else { v & 0x7f }
        })
        .collect();
    let scale = T::new("w.weight_scale", Dtype::F8_E4M3, &[out, n_in / 16], sb);
    for (gs, md) in [
        (2688.0 / 3.7, FloatType::Bf16),
        (1234.567, FloatType::F16),
        (0.3, FloatType::F32),
    ] {
        let mut w = linear(
            "w",
            out,
            n_in,
            Packing::Nvfp4 {
                packed: packed.r(),
                scale: scale.r(),
                global_scale: gs,
            },
        );
        w.model_dtype = md;
        assert_exact_dequant(b, &w, &format!("nvfp4 gs={gs} {md:?}"));
    }
}

#[test]
fn unpacked_fp8_and_int8_dequantize_bit_exactly() {
    for b in backends() {
        unpacked_fp8_and_int8_dequantize_bit_exactly_on(&b);
    }
}

fn unpacked_fp8_and_int8_dequantize_bit_exactly_on(b: &WgpuBackend) {
    let mut rng = Rng(17);
    let (out, n_in) = (70, 99);
    let fp8: Vec<u8> = rng
        .bytes(out * n_in)
        .into_iter()
        .map(|v| if v & 0x7f == 0x7f { 0 } else { v })
        .collect();
    let fp8 = T::new("w.weight", Dtype::F8_E4M3, &[out, n_in], fp8);
    let i8w = T::new("w.weight", Dtype::I8, &[out, n_in], rng.bytes(out * n_in));
    let ch: Vec<f32> = (0..out).map(|_| rng.f32().abs() * 0.02 + 1e-4).collect();
    let ch_scale = T::floats("w.weight_scale", FloatType::Bf16, &[out, 1], &ch);
    let blk: Vec<f32> = (0..5 * 4).map(|_| rng.f32().abs() * 0.02 + 1e-4).collect();
    let blk_scale = T::floats("w.weight_scale", FloatType::F32, &[5, 4], &blk);
    let t_scale = T::floats("w.weight_scale", FloatType::F16, &[1], &[0.0123]);
    let t_zero = T::new("w.weight_zero_point", Dtype::I8, &[1], vec![(-3i8) as u8]);
    let cases = [
        ("fp8 channel", &fp8, &ch_scale, None, Strategy::Channel),
        (
            "fp8 block 16x32",
            &fp8,
            &blk_scale,
            None,
            Strategy::Block(16, 32),
        ),
        (
            "int8 tensor asym",
            &i8w,
            &t_scale,
            Some(&t_zero),
            Strategy::Tensor,
        ),
        ("int8 channel", &i8w, &ch_scale, None, Strategy::Channel),
    ];
    for (case, weight, scale, zero, strategy) in cases {
        let w = linear(
            "w",
            out,
            n_in,
            Packing::Unpacked {
                weight: weight.r(),
                scale: scale.r(),
                zero_point: zero.map(|z| z.r()),
                strategy,
            },
        );
        assert_exact_dequant(b, &w, case);
    }
}

#[test]
fn dense_weights_dequantize_bit_exactly() {
    for b in backends() {
        dense_weights_dequantize_bit_exactly_on(&b);
    }
}

fn dense_weights_dequantize_bit_exactly_on(b: &WgpuBackend) {
    let mut rng = Rng(19);
    let (out, n_in) = (37, 53);
    for dt in [FloatType::F32, FloatType::F16, FloatType::Bf16] {
        let t = T::floats("w.weight", dt, &[out, n_in], &rng.vec(out * n_in, 2.0));
        let w = linear("w", out, n_in, Packing::Dense { weight: t.r() });
        assert_exact_dequant(b, &w, &format!("dense {dt:?}"));
    }
}

fn max_rel(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want
        .iter()
        .fold(0f64, |m, &v| m.max(v.abs() as f64))
        .max(1e-30);
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w as f64).abs() / scale)
        .fold(0f64, f64::max)
}

#[test]
fn linear_with_bias_and_activation_quant_matches_cpu() {
    for b in backends() {
        linear_with_bias_and_activation_quant_matches_cpu_on(&b);
    }
}

fn linear_with_bias_and_activation_quant_matches_cpu_on(b: &WgpuBackend) {
    let cpu = CpuBackend::new();
    let mut rng = Rng(23);
    let (out, n_in) = (75, 96);
    let wt = T::floats(
        "w.weight",
        FloatType::Bf16,
        &[out, n_in],
        &rng.vec(out * n_in, 0.5),
    );
    let bias = T::floats("w.bias", FloatType::Bf16, &[out], &rng.vec(out, 0.5));
    let acts = [
        None,
        Some(ActQuant::Fp8PerToken),
        Some(ActQuant::Fp8Static { scale: 0.0037 }),
        Some(ActQuant::Int8PerToken),
        Some(ActQuant::Nvfp4 {
            global_scale: 448.0 * 6.0 / 3.1,
        }),
    ];
    for aq in acts {
        for rows in [1usize, 70] {
            let mut w = linear("w", out, n_in, Packing::Dense { weight: wt.r() });
            w.bias = Some(bias.r());
            w.act_quant = aq;
            // Large and tiny rows, exact zeros: every quantization branch is taken.
            let mut x = rng.vec(rows * n_in, 3.0);
            x[0] = 0.0;
            if rows > 1 {
                for v in &mut x[n_in..2 * n_in] {
                    *v *= 1e-3;
                }
            }
            let (gw, cw) = (b.upload_linear(&w).unwrap(), cpu.upload_linear(&w).unwrap());
            let gx = b.upload_vector("x", &x).unwrap();
            let got = b.download(&b.linear(&gx, &gw, rows).unwrap()).unwrap();
            let want = cpu.linear(&x, &cw, rows).unwrap();
            let err = max_rel(&got, &want);
            assert!(err < 1e-5, "{aq:?} rows={rows}: max rel err {err:e}");
        }
    }
}

#[test]
fn elementwise_norm_rope_attention_and_embedding_match_cpu() {
    for b in backends() {
        elementwise_norm_rope_attention_and_embedding_match_cpu_on(&b);
    }
}

fn elementwise_norm_rope_attention_and_embedding_match_cpu_on(b: &WgpuBackend) {
    let cpu = CpuBackend::new();
    let mut rng = Rng(29);
    // Three sequences (1, 37 and 70 tokens) laid end to end: varlen attention.
    let layout = SeqLayout::from_lengths([1, 37, 70]);
    let t = layout.n_tokens();
    let (heads, kv_heads, d) = (6, 2, 40);
    let up = |v: &[f32]| b.upload_vector("t", v).unwrap();

    let (rows, cols) = (t, 300);
    let x = rng.vec(rows * cols, 2.0);
    let w = rng.vec(cols, 1.0);
    let got = b
        .download(
            &b.rms_norm(&up(&x), &up(&w), rows, cols, 1e-5, OutType::Activation)
                .unwrap(),
        )
        .unwrap();
    let want = cpu
        .rms_norm(&x, &w, rows, cols, 1e-5, OutType::Activation)
        .unwrap();
    assert!(
        max_rel(&got, &want) < 1e-5,
        "rms_norm {:e}",
        max_rel(&got, &want)
    );

    let (g, u) = (rng.vec(1001, 6.0), rng.vec(1001, 2.0));
    let got = b
        .download(
            &b.silu_mul(&up(&g), &up(&u), 1001, OutType::Activation)
                .unwrap(),
        )
        .unwrap();
    let want = cpu.silu_mul(&g, &u, 1001, OutType::Activation).unwrap();
    assert!(
        max_rel(&got, &want) < 1e-5,
        "silu_mul {:e}",
        max_rel(&got, &want)
    );

    let mut gx = up(&g);
    b.add_assign(&mut gx, &up(&u), 1001).unwrap();
    let mut want = g.clone();
    cpu.add_assign(&mut want, &u, 1001).unwrap();
    assert_eq!(b.download(&gx).unwrap(), want, "add");

    let half = d / 2;
    let cos = rng.vec(80 * half, 1.0);
    let sin = rng.vec(80 * half, 1.0);
    let q = rng.vec(t * heads * d, 1.0);
    let mut gq = up(&q);
    let gl = b.upload_layout(&layout).unwrap();
    b.rope(&mut gq, &gl, &up(&cos), &up(&sin), heads, d)
        .unwrap();
    let mut want = q.clone();
    cpu.rope(&mut want, &layout, &cos, &sin, heads, d).unwrap();
    let got = b.download(&gq).unwrap();
    assert!(
        max_rel(&got, &want) < 1e-5,
        "rope {:e}",
        max_rel(&got, &want)
    );

    let k = rng.vec(t * kv_heads * d, 1.0);
    let v = rng.vec(t * kv_heads * d, 1.0);
    let shape = AttnShape {
        heads,
        kv_heads,
        head_dim: d,
    };
    let got = b
        .download(
            &b.attention(&up(&q), &up(&k), &up(&v), &gl, shape, OutType::Activation)
                .unwrap(),
        )
        .unwrap();
    let want = cpu
        .attention(&q, &k, &v, &layout, shape, OutType::Activation)
        .unwrap();
    assert!(
        max_rel(&got, &want) < 1e-5,
        "attention {:e}",
        max_rel(&got, &want)
    );

    for dt in [FloatType::F32, FloatType::Bf16, FloatType::F16] {
        let table = T::floats("embed", dt, &[50, 24], &rng.vec(50 * 24, 1.0));
        let w = linear("embed", 50, 24, Packing::Dense { weight: table.r() });
        let ids = [0u32, 49, 7, 7, 23];
        let got = b
            .download(&b.embed(&b.upload_linear(&w).unwrap(), &ids).unwrap())
            .unwrap();
        let want = cpu.embed(&cpu.upload_linear(&w).unwrap(), &ids).unwrap();
        assert_eq!(got, want, "embed {dt:?}");
    }
}

#[test]
fn nll_and_kld_match_cpu_over_vocabulary_tiles() {
    for b in backends() {
        nll_and_kld_match_cpu_over_vocabulary_tiles_on(&b);
    }
}

fn nll_and_kld_match_cpu_over_vocabulary_tiles_on(b: &WgpuBackend) {
    let cpu = CpuBackend::new();
    let mut rng = Rng(31);
    // 16384 is the widest vocabulary tile: 17001 takes two tiles, the second 617 wide.
    for (vocab, h, rows) in [(17001usize, 24usize, 9usize), (333, 40, 1)] {
        let head = T::floats(
            "lm_head",
            FloatType::Bf16,
            &[vocab, h],
            &rng.vec(vocab * h, 0.5),
        );
        let head2 = T::floats(
            "lm_head2",
            FloatType::F16,
            &[vocab, h],
            &rng.vec(vocab * h, 0.5),
        );
        let l1 = linear("lm_head", vocab, h, Packing::Dense { weight: head.r() });
        let l2 = linear("lm_head2", vocab, h, Packing::Dense { weight: head2.r() });
        let x = rng.vec(rows * h, 2.0);
        let x2 = rng.vec(rows * h, 2.0);
        let mut targets: Vec<i32> = (0..rows)
            .map(|_| (rng.u32() as usize % vocab) as i32)
            .collect();
        targets[0] = vocab as i32 - 1;
        if rows > 2 {
            targets[2] = -1;
        }
        let (g1, g2) = (b.upload_linear(&l1).unwrap(), b.upload_linear(&l2).unwrap());
        let (c1, c2) = (
            cpu.upload_linear(&l1).unwrap(),
            cpu.upload_linear(&l2).unwrap(),
        );
        let (gx, gx2) = (
            b.upload_vector("x", &x).unwrap(),
            b.upload_vector("x2", &x2).unwrap(),
        );
        let got = b.nll(&gx, &g1, &targets).unwrap();
        let want = cpu.nll(&x, &c1, &targets).unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-4, "nll vocab {vocab}: {g} vs {w}");
        }
        let got = b.kld(&gx, &g1, &gx2, &g2, &targets).unwrap();
        let want = cpu.kld(&x, &c1, &x2, &c2, &targets).unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g.kld - w.kld).abs() < 1e-4 * (1.0 + w.kld),
                "kld {g:?} vs {w:?}"
            );
            assert!((g.nll_q - w.nll_q).abs() < 1e-4, "nll_q {g:?} vs {w:?}");
            assert!(
                (g.nll_base - w.nll_base).abs() < 1e-4,
                "nll_base {g:?} vs {w:?}"
            );
            assert!(
                (g.base_top_p - w.base_top_p).abs() < 1e-5,
                "top p {g:?} vs {w:?}"
            );
            assert_eq!(g.same_top, w.same_top, "same top {g:?} vs {w:?}");
        }
    }
}

#[test]
fn quantppl_check_cases_pass_on_wgpu() {
    for b in backends() {
        quantppl_check_cases_pass_on_wgpu_on(&b);
    }
}

fn quantppl_check_cases_pass_on_wgpu_on(b: &WgpuBackend) {
    let reports = quantppl::check::check_ops(b, 1).expect("check cases run");
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| !r.passed)
        .map(|r| {
            format!(
                "{} {}: max abs err {:e} > {:e} (worst {:?})",
                r.name, r.vars, r.max_abs_err, r.tolerance, r.worst
            )
        })
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
}
