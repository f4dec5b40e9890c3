//! Where a Llama-3-8B-shaped layer's time goes on a CUDA GPU: each op class alone, the whole
//! layer (INT4 and dense bf16), attention on each tensor-core kernel, the lm_head NLL and the
//! cuBLAS GEMM peak. `cargo bench --bench cuda_layer_speed` (needs a CUDA GPU).

use std::time::Instant;

use quantppl::backend::cuda::{CudaBackend, CudaPrecision, CudaTensor, cuda_available};
use quantppl::backend::options::BackendOptions;
use quantppl::backend::{AttnSpec, Backend, Device, Head, OutType, RotarySpan, SeqLayout, Shaped};
use quantppl::checkpoint::GatedActivation;
use quantppl::checkpoint::scheme::Strategy;
use quantppl::numerics::FloatType;
use quantppl::rng::Rng;
use quantppl::synth::linear::{LinearSpec, WeightKind};

/// `n` normal values of standard deviation `scale`, rounded to bf16.
fn bf16s(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    rng.normal_vec(n, scale)
        .into_iter()
        .map(|v| FloatType::Bf16.round(v))
        .collect()
}

/// An activation `[rows, cols]` of bf16 values on `gpu`.
fn act(gpu: &CudaBackend, rng: &mut Rng, rows: usize, cols: usize, scale: f32) -> CudaTensor {
    gpu.upload_activation(&bf16s(rng, rows * cols, scale))
        .and_then(|x| x.reshaped(rows, cols))
        .unwrap()
}

/// Mean time of `f` in ms over `reps` runs queued back to back (one synchronization at the
/// end, after one synchronized warm-up), so launch latency overlaps as in a real forward.
fn time_ms(gpu: &CudaBackend, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    gpu.synchronize().unwrap();
    let start = Instant::now();
    for _ in 0..reps {
        f();
    }
    gpu.synchronize().unwrap();
    start.elapsed().as_secs_f64() * 1e3 / reps as f64
}

/// Milliseconds of one causal attention over `layout`.
fn attention_ms(
    gpu: &CudaBackend,
    [q, k, v]: [&CudaTensor; 3],
    layout: &<CudaBackend as Device>::Sequences,
    shape: AttnSpec,
) -> f64 {
    time_ms(gpu, 10, || {
        drop(
            gpu.attention(q, k, v, layout, shape, None, OutType::Activation)
                .unwrap(),
        )
    })
}

/// One Llama-3-8B-shaped layer (hidden 4096, inter 14336, 32 heads / 8 kv, head_dim 128,
/// INT4 group-128 weights) on 4 sequences x 2048 tokens, op class by op class, the lm_head
/// NLL over vocab 128256, and the bf16 cuBLAS GEMM peak on 8192^3.
fn main() {
    if let Err(e) = cuda_available() {
        eprintln!("cuda_layer_speed needs a CUDA GPU: {e}");
        std::process::exit(1);
    }
    let gpu =
        CudaBackend::new(0, CudaPrecision::Bf16, &BackendOptions::default()).expect("cuda backend");
    let mut rng = Rng::new(7);
    let dense = |rng: &mut Rng, out: usize, n_in: usize| {
        let kind = WeightKind::Dense(FloatType::Bf16);
        LinearSpec::new(kind, out, n_in, FloatType::Bf16).build(rng)
    };
    let (seqs, ctx) = (4usize, 2048usize);
    let t = seqs * ctx;
    let (h, inter, heads, kv_heads, d, vocab) = (4096usize, 14336usize, 32, 8, 128, 128256);
    let shape = AttnSpec::causal(heads, kv_heads, d);
    let tflops = |flop: f64, ms: f64| flop / ms / 1e9;

    // bf16 GEMM peak: 8192 x 8192 x 8192 through the same cuBLAS call as every linear.
    let peak = quantppl::run::bench::gemm_peak_tflops(&gpu).unwrap();
    println!(
        "bf16 cuBLAS GEMM 8192^3: {:.1} TFLOP/s sustained, {:.1} in a burst",
        peak.sustained, peak.burst
    );
    let peak = peak.sustained;

    // The layer: INT4 g128 weights and dense bf16 twins of the same shapes (GEMM alone).
    let names = ["q", "k", "v", "o", "gate", "up", "down"];
    let shapes = [
        (heads * d, h),
        (kv_heads * d, h),
        (kv_heads * d, h),
        (h, heads * d),
        (inter, h),
        (inter, h),
        (h, inter),
    ];
    let int4 = |rng: &mut Rng, out, n_in| {
        let kind = WeightKind::int(4, Strategy::Group(128));
        let s = LinearSpec::new(kind, out, n_in, FloatType::Bf16).build(rng);
        gpu.upload_linear(&s.qlinear()).unwrap()
    };
    let qw: Vec<_> = shapes.iter().map(|&(o, i)| int4(&mut rng, o, i)).collect();
    let dw: Vec<_> = shapes
        .iter()
        .map(|&(o, i)| gpu.upload_linear(&dense(&mut rng, o, i).qlinear()).unwrap())
        .collect();
    let params: usize = shapes.iter().map(|&(o, i)| o * i).sum();
    let layout = gpu
        .upload_sequences(&SeqLayout::from_lengths(vec![ctx; seqs]))
        .unwrap();
    let half = d / 2;
    let ang: Vec<f32> = (0..ctx * half)
        .map(|i| (i / half) as f32 * (10000f32).powf(-((i % half) as f32) / half as f32))
        .collect();
    let cos = gpu
        .upload_vector("cos", &ang.iter().map(|a| a.cos()).collect::<Vec<_>>())
        .unwrap();
    let sin = gpu
        .upload_vector("sin", &ang.iter().map(|a| a.sin()).collect::<Vec<_>>())
        .unwrap();
    let norm_w = gpu.upload_vector("norm", &vec![1.0; h]).unwrap();
    let mut resid = gpu
        .upload_vector("residual", &bf16s(&mut rng, t * h, 1.0))
        .and_then(|x| x.reshaped(t, h))
        .unwrap();
    let mut down = act(&gpu, &mut rng, t, h, 0.1);

    // One forward of the layer as model/forward.rs runs it: each residual update is added by
    // the norm after it (the previous layer's MLP output by this layer's first norm).
    let mut forward = |w: &[quantppl::backend::cuda::CudaLinear]| {
        let xn = gpu
            .add_rms_norm(&mut resid, &down, &norm_w, 1e-5, OutType::Activation)
            .unwrap();
        let mut q = gpu.linear(&xn, &w[0]).unwrap();
        let mut k = gpu.linear(&xn, &w[1]).unwrap();
        let v = gpu.linear(&xn, &w[2]).unwrap();
        gpu.rope(&mut q, &layout, &cos, &sin, RotarySpan::leading(d, d))
            .unwrap();
        gpu.rope(&mut k, &layout, &cos, &sin, RotarySpan::leading(d, d))
            .unwrap();
        let a = gpu
            .attention(&q, &k, &v, &layout, shape, None, OutType::Activation)
            .unwrap();
        let o = gpu.linear(&a, &w[3]).unwrap();
        let xn = gpu
            .add_rms_norm(&mut resid, &o, &norm_w, 1e-5, OutType::Activation)
            .unwrap();
        let g = gpu.linear(&xn, &w[4]).unwrap();
        let u = gpu.linear(&xn, &w[5]).unwrap();
        let gu = gpu
            .gated_act(&g, Some(&u), GatedActivation::Silu, OutType::Activation)
            .unwrap();
        down = gpu.linear(&gu, &w[6]).unwrap();
    };
    let t_layer = time_ms(&gpu, 5, || forward(&qw));
    let t_layer_dense = time_ms(&gpu, 5, || forward(&dw));

    // Op classes, each timed alone.
    println!(
        "{:<6} {:>12} {:>9} {:>11} {:>9} {:>9}",
        "linear", "out x in", "GEMM ms", "dequant ms", "dequant", "TFLOP/s"
    );
    let (mut t_gemm, mut t_dequant) = (0.0, 0.0);
    for (j, name) in names.iter().enumerate() {
        let (o, i) = shapes[j];
        let x = act(&gpu, &mut rng, t, i, 1.0);
        let tg = time_ms(&gpu, 10, || drop(gpu.linear(&x, &dw[j]).unwrap()));
        let tq = time_ms(&gpu, 10, || gpu.dequantize_weight(&qw[j]).unwrap());
        t_gemm += tg;
        t_dequant += tq;
        println!(
            "{name:<6} {:>12} {tg:>9.3} {tq:>11.3} {:>8.1}% {:>9.1}",
            format!("{o}x{i}"),
            100.0 * tq / tg,
            tflops(2.0 * (o * i * t) as f64, tg)
        );
    }
    let mut q = act(&gpu, &mut rng, t, heads * d, 1.0);
    let mut k = act(&gpu, &mut rng, t, kv_heads * d, 1.0);
    let v = act(&gpu, &mut rng, t, kv_heads * d, 1.0);
    let t_attn = attention_ms(&gpu, [&q, &k, &v], &layout, shape);
    let kernel_name = |b: &CudaBackend| {
        b.attention_kernel()
            .expect("attention kernels")
            .unwrap_or("cuda cores")
    };
    let attn_kernel = kernel_name(&gpu);
    // Where a wgmma kernel exists, the mma.sync one alone too, for comparison (a backend of
    // its own, on inputs of the same shape).
    let portable = BackendOptions {
        cuda_portable_attention: true,
        ..BackendOptions::default()
    };
    let portable = CudaBackend::new(0, CudaPrecision::Bf16, &portable).expect("cuda backend");
    let portable_attn = (kernel_name(&portable) != attn_kernel).then(|| {
        let mut rng = Rng::new(7);
        let q = act(&portable, &mut rng, t, heads * d, 1.0);
        let k = act(&portable, &mut rng, t, kv_heads * d, 1.0);
        let v = act(&portable, &mut rng, t, kv_heads * d, 1.0);
        let layout = portable
            .upload_sequences(&SeqLayout::from_lengths(vec![ctx; seqs]))
            .unwrap();
        (
            kernel_name(&portable),
            attention_ms(&portable, [&q, &k, &v], &layout, shape),
        )
    });
    let attn_flop = 4.0 * (heads * d) as f64 * seqs as f64 * (ctx * (ctx + 1) / 2) as f64;
    let t_rope = time_ms(&gpu, 10, || {
        gpu.rope(&mut q, &layout, &cos, &sin, RotarySpan::leading(d, d))
            .unwrap();
        gpu.rope(&mut k, &layout, &cos, &sin, RotarySpan::leading(d, d))
            .unwrap();
    });
    let gate = act(&gpu, &mut rng, t, inter, 2.0);
    let up = act(&gpu, &mut rng, t, inter, 2.0);
    let t_silu = time_ms(&gpu, 10, || {
        drop(
            gpu.gated_act(&gate, Some(&up), GatedActivation::Silu, OutType::Activation)
                .unwrap(),
        )
    });
    drop((gate, up));
    let o = act(&gpu, &mut rng, t, h, 1.0);
    let t_add_norm = time_ms(&gpu, 10, || {
        drop(
            gpu.add_rms_norm(&mut resid, &o, &norm_w, 1e-5, OutType::Activation)
                .unwrap(),
        )
    });
    let t_small = 2.0 * t_add_norm + t_rope + t_silu;
    println!(
        "small ops (ms): add + rms_norm {t_add_norm:.3} x2, rope q+k {t_rope:.3}, \
         silu_mul {t_silu:.3}"
    );

    // The fused lm_head + log-softmax-gather over every token of the batch.
    let head = gpu
        .upload_linear(&dense(&mut rng, vocab, h).qlinear())
        .unwrap();
    let hidden = act(&gpu, &mut rng, t, h, 1.0);
    let targets: Vec<i32> = (0..t).map(|_| rng.below(vocab as u64) as i32).collect();
    let t_nll = time_ms(&gpu, 3, || {
        drop(
            gpu.nll(
                &hidden,
                Head {
                    linear: &head,
                    softcap: None,
                },
                &targets,
            )
            .unwrap(),
        )
    });

    let layer_flop = 2.0 * params as f64 * t as f64;
    let pct = |x: f64| 100.0 * x / t_layer;
    println!("\n8B-shaped layer, {seqs} x {ctx} tokens, INT4 g128 weights ({params} params)");
    println!(
        "{:<34} {:>9} {:>8} {:>9}",
        "op class", "ms", "% layer", "TFLOP/s"
    );
    println!(
        "{:<34} {t_dequant:>9.3} {:>7.1}%",
        "dequant (7 linears)",
        pct(t_dequant)
    );
    println!(
        "{:<34} {t_gemm:>9.3} {:>7.1}% {:>9.1}",
        "GEMM (7 linears, bf16 cuBLAS)",
        pct(t_gemm),
        tflops(layer_flop, t_gemm)
    );
    println!(
        "{:<34} {t_attn:>9.3} {:>7.1}% {:>9.1}",
        format!("attention, {attn_kernel}"),
        pct(t_attn),
        tflops(attn_flop, t_attn)
    );
    println!(
        "{:<34} {t_small:>9.3} {:>7.1}%",
        "add+norm x2, rope, silu_mul",
        pct(t_small)
    );
    println!(
        "{:<34} {:>9.3} {:>7.1}%",
        "sum of the parts",
        t_dequant + t_gemm + t_attn + t_small,
        pct(t_dequant + t_gemm + t_attn + t_small)
    );
    println!(
        "{:<34} {t_layer:>9.3} {:>7.1}% {:>9.1}",
        "full layer forward (INT4)",
        100.0,
        tflops(layer_flop, t_layer)
    );
    println!(
        "{:<34} {t_layer_dense:>9.3} {:>8} {:>9.1}",
        "full layer forward (dense bf16)",
        "",
        tflops(layer_flop, t_layer_dense)
    );
    println!(
        "{:<34} {t_nll:>9.3} {:>8} {:>9.1}",
        format!("lm_head NLL, vocab {vocab}"),
        "",
        tflops(2.0 * (vocab * h * t) as f64, t_nll)
    );
    if let Some((kernel, ms)) = portable_attn {
        println!(
            "{:<34} {ms:>9.3} {:>8} {:>9.1}",
            format!("attention, {kernel} (not used)"),
            "",
            tflops(attn_flop, ms)
        );
    }
    println!("(attention TFLOP/s count the causal half's FLOPs)");
    println!("bf16 GEMM peak (8192^3)            {peak:>28.1}");
    println!(
        "peak device memory: {:.2} GiB",
        gpu.peak_memory_bytes().unwrap_or(0) as f64 / (1u64 << 30) as f64
    );
}
