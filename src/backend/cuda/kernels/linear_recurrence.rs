//! `linear_recurrence.cu`: the delta rule (a decay a value head, or Kimi's a key channel) or
//! Mamba-2's scan, chunked (every chunk's products and triangular solve at once, then a pass
//! over each sequence's chunks; 3xTF32 tensor-core products) for key and value heads up to 128
//! on sm_80 and later, else step by step (a block per sequence, value head and 64 columns, the
//! next token's inputs loaded while a step computes).

use cudarc::driver::{LaunchArgs, LaunchConfig, PushKernelArg};

use super::{Dt, set_smem};
use super::{InOut, Kernels, Loader, Module, Source, Stream, Typed, cuda_source, i32_arg, launch};
use crate::backend::cuda::CudaTensor;
use crate::backend::options::RecurrenceForm;
use crate::backend::recurrent::CHUNK;
use crate::backend::{Recurrence, RecurrenceGates};
use crate::checkpoint::DeltaNetConfig;
use crate::{Error, Result};

/// The rules, in the kernels' names and in `Recurrence` order: the delta rule, Mamba-2's scan,
/// Kimi's delta rule (a decay a key channel, `KEYED`).
const RULES: [(&str, bool); 3] = [("delta", false), ("ssd", false), ("kimi", true)];

/// `linear_recurrence.cu`'s entry points, a rule each (`RULES`): the step kernels by (input,
/// output) type (any key width, and the key width of 128 compiled in, the state in
/// registers); the chunked ones on sm_80 and later (tf32 tensor cores) where the device has
/// their shared memory.
struct Entries {
    steps: [[InOut; 2]; 3],
    /// The chunk preparation (by input type) and the chunk pass (by types).
    chunked: [Option<(Typed, InOut)>; 3],
}

/// The chunked kernels' shared memory (f32, rows padded as the kernels pad them): two
/// `[CHUNK][128]` tiles and the delta rule's `[CHUNK][CHUNK]` matrix; one `[CHUNK][128]` tile,
/// the state's `[128][32]` columns, `[CHUNK][CHUNK]` products and `[CHUNK][32]` values; Kimi's
/// rule one `[CHUNK][128]` tile more in each (the decays summed a key channel each) and in the
/// preparation the keys before its last sub-chunk, scaled (`[CHUNK - SUB_CHUNK][128]`).
const fn chunk_smem(keyed: bool) -> (usize, usize) {
    let row = CHUNK_MAX_HEAD_DIM + 4;
    let tile = CHUNK * row;
    let more = if keyed { tile } else { 0 };
    let scaled_keys = if keyed { (CHUNK - SUB_CHUNK) * row } else { 0 };
    let prepare = 2 * tile + CHUNK * (CHUNK + 4) + more + scaled_keys;
    let scan = tile
        + CHUNK_MAX_HEAD_DIM * (SCAN_COLS + 8)
        + CHUNK * (CHUNK + 4)
        + CHUNK * (SCAN_COLS + 8)
        + more;
    (4 * prepare, 4 * scan)
}

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("linear_recurrence");

    fn load(l: &Loader) -> Result<Option<Self>> {
        let mut chunked = [None, None, None];
        for (slot, (name, keyed)) in chunked.iter_mut().zip(RULES) {
            let (prepare_smem, scan_smem) = chunk_smem(keyed);
            if l.cc < (8, 0) || l.max_smem < prepare_smem.max(scan_smem) {
                continue;
            }
            let prepare = l.typed(&format!("recurrence_chunk_prepare_{name}"))?;
            let scan = l.in_out(&format!("recurrence_chunk_scan_{name}"))?;
            for f in [&prepare.bf16, &prepare.f32] {
                set_smem(f, prepare_smem, "recurrence_chunk_prepare")?;
            }
            for f in scan.all() {
                set_smem(f, scan_smem, "recurrence_chunk_scan")?;
            }
            *slot = Some((prepare, scan));
        }
        let rule = |name: &str| -> Result<[InOut; 2]> {
            Ok([l.in_out(name)?, l.in_out(&format!("{name}_k128"))?])
        };
        // The step kernels' names, in `RULES` order.
        Ok(Some(Self {
            steps: [
                rule("gated_delta_rule")?,
                rule("ssd_scan")?,
                rule("kimi_delta_rule")?,
            ],
            chunked,
        }))
    }
}

/// Columns of a value head a step block (DR_COLS in the kernel).
const COLS: usize = 64;
/// The widest key head the step kernel's state holds (DR_MAX_DK).
pub const MAX_KEY_DIM: usize = 256;
/// The widest key and value heads the chunked kernels hold (RK), and the value columns a scan
/// block (RV).
const CHUNK_MAX_HEAD_DIM: usize = 128;
const SCAN_COLS: usize = 32;
/// Tokens a sub-chunk of Kimi's within-chunk products (SUB).
const SUB_CHUNK: usize = 16;
const PREPARE_THREADS: u32 = 256;
const SCAN_THREADS: u32 = 128;

/// A batch's sequences as the kernels read them (`CudaSequences`): each token's sequence
/// start, and the chunk boundaries and each sequence's first chunk.
pub struct Sequences {
    pub seq_start: u64,
    pub chunks: u64,
    pub seq_chunks: u64,
    pub n_chunks: usize,
    pub n_seqs: usize,
}

/// The chunked form's f32 intermediates, each `[tokens, v_heads * width]`: the within-chunk
/// products (width `CHUNK`), the solved values (`v_dim`), the delta rule's key corrections
/// (`k_dim`; none for Mamba-2's scan), those two padded to a multiple of 4, and the decays
/// summed within the chunk (1; Kimi's `k_dim` padded so, a key channel each).
pub struct Scratch {
    products: CudaTensor,
    values: CudaTensor,
    key_corrections: Option<CudaTensor>,
    decays: CudaTensor,
}

impl Scratch {
    /// The intermediates of `tokens` tokens of `net` under `rule` from `alloc` (`[rows, cols]`
    /// of f32), or `None` where it runs step by step on this device (or `form` asks for steps).
    pub fn new<T>(
        k: &Kernels,
        net: DeltaNetConfig,
        rule: Recurrence<'_, T>,
        (tokens, form): (usize, RecurrenceForm),
        alloc: impl Fn([usize; 2]) -> Result<CudaTensor>,
    ) -> Result<Option<Self>> {
        let widest = net.k_dim.max(net.v_dim);
        let index = rule_index(&rule);
        let entries = k.get::<Entries>()?;
        if widest > CHUNK_MAX_HEAD_DIM
            || entries.chunked[index].is_none()
            || form == RecurrenceForm::Steps
        {
            return Ok(None);
        }
        let (delta, keyed) = (index != 1, RULES[index].1);
        let hv = net.v_heads;
        // Rows padded to a multiple of 4 values: the scan reads them as float4.
        let (dk4, dv4) = (net.k_dim.next_multiple_of(4), net.v_dim.next_multiple_of(4));
        Ok(Some(Self {
            products: alloc([tokens, hv * CHUNK])?,
            values: alloc([tokens, hv * dv4])?,
            key_corrections: delta.then(|| alloc([tokens, hv * dk4])).transpose()?,
            decays: alloc([tokens, hv * if keyed { dk4 } else { 1 }])?,
        }))
    }
}

/// `rule`'s place in `RULES`.
fn rule_index<T>(rule: &Recurrence<'_, T>) -> usize {
    match rule {
        Recurrence::Delta { per_key: false, .. } => 0,
        Recurrence::Ssd { .. } => 1,
        Recurrence::Delta { per_key: true, .. } => 2,
    }
}

/// `out = linear_recurrence(qkv)` (`Backend::linear_recurrence`), the gates' shapes checked by
/// the caller; chunked where `scratch` is given (`chunk_scratch`'s widths).
pub fn run(
    k: &Kernels,
    s: &Stream,
    (out, qkv): (&CudaTensor, &CudaTensor),
    gates: RecurrenceGates<'_, CudaTensor>,
    seqs: &Sequences,
    scratch: Option<&Scratch>,
    net: DeltaNetConfig,
) -> Result<()> {
    if net.k_dim > MAX_KEY_DIM {
        return Err(Error::unsupported(
            "cuda linear_recurrence",
            "the key (state) head width",
            format!("{} (the kernel holds up to {MAX_KEY_DIM})", net.k_dim),
        ));
    }
    let tokens = qkv.rows;
    let heads = [
        i32_arg(net.k_heads, "key heads")?,
        i32_arg(net.v_heads, "value heads")?,
        i32_arg(net.k_dim, "key head dim")?,
        i32_arg(net.v_dim, "value head dim")?,
        i32_arg(net.key_head_span(), "value heads a key head")?,
    ];
    let entries = k.get::<Entries>()?;
    let rule = rule_index(&gates.rule);
    let (b_ptr, d_ptr, limits) = match gates.rule {
        // The delta rules' gate bounds: the safe gate's lower bound, 0 for softplus decays.
        Recurrence::Delta { b, lower_bound, .. } => (b.ptr(), 0, [lower_bound.unwrap_or(0.0), 0.0]),
        Recurrence::Ssd { d, dt_min, dt_max } => (0, d.ptr(), [dt_min, dt_max]),
    };
    let (a, a_log, dt_bias) = (gates.a.ptr(), gates.a_log.ptr(), gates.dt_bias.ptr());
    let (Some((prepare, scan)), Some(x)) = (&entries.chunked[rule], scratch) else {
        let kernel = &entries.steps[rule][usize::from(net.k_dim == 128)];
        let mut b = s.launch_builder(kernel.get(qkv.dtype, out.dtype));
        let ptrs = [
            out.ptr(),
            qkv.ptr(),
            a,
            b_ptr,
            d_ptr,
            a_log,
            dt_bias,
            seqs.seq_start,
        ];
        let ints = [&[i32_arg(tokens, "tokens")?], &heads[..]].concat();
        push(&mut b, &ptrs, &ints, &limits);
        let cfg = LaunchConfig {
            grid_dim: (
                tokens.max(1) as u32,
                net.v_heads as u32,
                net.v_dim.div_ceil(COLS) as u32,
            ),
            block_dim: (COLS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        return launch(b, cfg, "linear_recurrence");
    };
    for t in [&x.products, &x.values, &x.decays]
        .into_iter()
        .chain(&x.key_corrections)
    {
        if t.dtype != Dt::F32 || t.rows != tokens {
            return Err(Error::backend(
                "cuda",
                format!(
                    "linear_recurrence: scratch of {} rows for {tokens} tokens",
                    t.rows
                ),
            ));
        }
    }
    let corrections = x.key_corrections.as_ref().map_or(0, CudaTensor::ptr);
    let (products, values, decays) = (x.products.ptr(), x.values.ptr(), x.decays.ptr());
    let (prepare_smem, scan_smem) = chunk_smem(RULES[rule].1);
    let mut b = s.launch_builder(prepare.get(qkv.dtype));
    let ptrs = [
        products,
        values,
        corrections,
        decays,
        qkv.ptr(),
        a,
        b_ptr,
        a_log,
        dt_bias,
        seqs.chunks,
    ];
    push(&mut b, &ptrs, &heads, &limits);
    let cfg = LaunchConfig {
        grid_dim: (seqs.n_chunks as u32, net.v_heads as u32, 1),
        block_dim: (PREPARE_THREADS, 1, 1),
        shared_mem_bytes: prepare_smem as u32,
    };
    launch(b, cfg, "recurrence_chunk_prepare")?;
    let mut b = s.launch_builder(scan.get(qkv.dtype, out.dtype));
    let ptrs = [
        out.ptr(),
        products,
        values,
        corrections,
        decays,
        qkv.ptr(),
        d_ptr,
        seqs.chunks,
        seqs.seq_chunks,
    ];
    push(&mut b, &ptrs, &heads, &[]);
    let cfg = LaunchConfig {
        grid_dim: (
            seqs.n_seqs as u32,
            net.v_heads as u32,
            net.v_dim.div_ceil(SCAN_COLS) as u32,
        ),
        block_dim: (SCAN_THREADS, 1, 1),
        shared_mem_bytes: scan_smem as u32,
    };
    launch(b, cfg, "recurrence_chunk_scan")
}

/// Pushes a kernel's arguments in its C signature's order: pointers, ints, floats.
fn push<'a>(b: &mut LaunchArgs<'a>, ptrs: &'a [u64], ints: &'a [i32], floats: &'a [f32]) {
    for p in ptrs {
        b.arg(p);
    }
    for i in ints {
        b.arg(i);
    }
    for f in floats {
        b.arg(f);
    }
}
