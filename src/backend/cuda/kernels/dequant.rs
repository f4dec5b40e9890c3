//! `dequant.cu`: packed weights to rows of the reused scratch buffer, in the activation type;
//! one weight per launch, or many weights of one layout (a layer's experts) per launch.

use cudarc::driver::{LaunchArgs, LaunchConfig, PushKernelArg};

use super::{
    Dt, Kernels, Loader, Module, Source, Stream, Typed, cuda_source, elementwise, i32_arg, launch,
};
use crate::backend::lowering::ScaleIndex;
use crate::checkpoint::Fp4Scale;
use crate::{Error, Result};

/// Where the kernels find the scale and zero point of a weight (`ScaleIndex`), as i32s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaleArgs {
    pub row_div: i32,
    pub row_stride: i32,
    pub col_div: i32,
}

impl ScaleArgs {
    pub fn new(i: ScaleIndex) -> Result<Self> {
        Ok(Self {
            row_div: i32_arg(i.row_div, "scale row divisor")?,
            row_stride: i32_arg(i.row_stride, "scale row stride")?,
            col_div: i32_arg(i.col_div, "scale column divisor")?,
        })
    }
}

/// Where a dequantization writes.
#[derive(Clone, Copy)]
pub enum Target {
    /// One weight, the arguments' addresses, into `out`; with `f16_scale` (bf16 values only)
    /// as f16 times that power of two, the operand of `split_gemm.cu`.
    One { out: u64, f16_scale: Option<f32> },
    /// The weights of a device table of `count` [`ExpertRow`]s, each with its own tensors and
    /// output (the arguments' addresses are unused; their layout is every weight's).
    Experts { table: u64, count: usize },
}

/// One weight of a [`Target::Experts`] table (`Expert` in dequant.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ExpertRow {
    pub out: u64,
    pub packed: u64,
    pub scales: u64,
    /// 0: symmetric.
    pub zeros: u64,
    /// 0: none.
    pub g_idx: u64,
    /// FP4: the f32 bits of its scalar (`Fp4Args::scalar`).
    pub scalar: u64,
}

impl Target {
    /// One weight into `out` in the type of the kernel run.
    pub fn one(out: u64) -> Self {
        Target::One {
            out,
            f16_scale: None,
        }
    }

    /// One bf16-valued weight into `out` as f16 times `scale` (exact where
    /// `LoweredWeight::f16_exact_scale` gave it).
    pub fn f16(out: u64, scale: f32) -> Self {
        Target::One {
            out,
            f16_scale: Some(scale),
        }
    }

    /// The type of the kernel entry that writes it: f16 comes from the bf16 entries.
    fn entry_dt(&self, dt: Dt) -> Dt {
        match self {
            Target::One {
                f16_scale: Some(_), ..
            } => Dt::Bf16,
            _ => dt,
        }
    }

    /// The one-weight entries' last argument, `f16_scale` (0: the entry's own type).
    fn end<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        if let Target::One { f16_scale, .. } = self {
            b.arg(f16_scale.as_ref().unwrap_or(&0.0));
        }
    }

    /// A launch of `kernel`'s one-weight or experts entry with its first argument pushed
    /// (the output, or the table); the one-weight entries take the addresses in `addrs` next.
    fn begin<'a>(
        &'a self,
        s: &'a Stream,
        kernel: &'a KernelPair,
        dt: Dt,
        addrs: &'a [u64],
    ) -> LaunchArgs<'a> {
        match self {
            Target::One { out, .. } => {
                let mut b = s.launch_builder(kernel.one.get(self.entry_dt(dt)));
                b.arg(out);
                for a in addrs {
                    b.arg(a);
                }
                b
            }
            Target::Experts { table, .. } => {
                let mut b = s.launch_builder(kernel.experts.get(dt));
                b.arg(table);
                b
            }
        }
    }

    /// `threads` per weight, one grid row per weight.
    fn config(&self, threads: usize) -> Result<LaunchConfig> {
        let mut cfg = elementwise(threads)?;
        if let Target::Experts { count, .. } = *self {
            cfg.grid_dim.1 = u32::try_from(count)
                .ok()
                .filter(|&c| (1..=65535).contains(&c))
                .ok_or_else(|| {
                    Error::backend("cuda", format!("{count} weights in one dequantization"))
                })?;
        }
        Ok(cfg)
    }
}

/// A dequantization kernel's one-weight entries and its `_experts` entries.
struct KernelPair {
    one: Typed,
    experts: Typed,
}

/// `dequant.cu`'s entry points, one pair a layout.
struct Entries {
    int: KernelPair,
    int4: KernelPair,
    fp4: KernelPair,
    unpacked: KernelPair,
}

impl Module for Entries {
    const SOURCE: Source<'static> = cuda_source!("dequant");

    fn load(l: &Loader) -> Result<Option<Self>> {
        let pair = |name: &str| -> Result<KernelPair> {
            Ok(KernelPair {
                one: l.typed(name)?,
                experts: l.typed(&format!("{name}_experts"))?,
            })
        };
        Ok(Some(Self {
            int: pair("dequant_int")?,
            int4: pair("dequant_int4")?,
            fp4: pair("dequant_fp4")?,
            unpacked: pair("dequant_unpacked")?,
        }))
    }
}

/// Rows of one output range and the row width, shared by the three kernels.
#[derive(Clone, Copy)]
pub struct Rows {
    pub row0: usize,
    pub nrows: usize,
    pub n_in: usize,
}

impl Rows {
    /// Threads of a kernel that decodes `per` consecutive weights of a row each.
    fn threads(&self, per: usize) -> usize {
        self.nrows * self.n_in.div_ceil(per)
    }
}

/// A packed INT layer's device arguments (addresses 0 as stored, filled in per launch).
#[derive(Clone, Copy, PartialEq)]
pub struct IntArgs {
    pub packed: u64,
    pub scales: u64,
    /// Signed zero points indexed like the scales (0: symmetric).
    pub zeros: u64,
    pub g_idx: u64,
    pub words_per_row: i32,
    pub bits: i32,
    /// 0 for the dense bitstream.
    pub legacy_per: i32,
    pub index: ScaleArgs,
    pub scale_dt: i32,
    pub model_dt: i32,
    /// What `zeros` holds and how a code is read (`dequant.cu`'s `code_kind`): 0 signed zero
    /// points (or nothing), the codes offset by `2^(bits-1)`; 1 f32 minimums subtracted from
    /// code * scale, the codes unsigned (`Scales::mins`); 2 the i32 value of each code
    /// (`LoweredWeight::PackedInt::codebook`).
    pub code_kind: i32,
}

impl IntArgs {
    /// The layout `dequant_int4` takes: 4-bit codes, 8 to a 32-bit word (the dense bitstream
    /// and the legacy layout agree), rows of whole words, no g_idx, and one scale row per
    /// weight row, constant over each word.
    fn fast_int4(&self, n_in: usize) -> bool {
        self.bits == 4
            && self.code_kind == 0
            && matches!(self.legacy_per, 0 | 8)
            && self.g_idx == 0
            && n_in.is_multiple_of(8)
            && self.words_per_row as usize * 8 == n_in
            && self.index.row_div == 1
            && self.index.col_div % 8 == 0
    }
}

pub fn int(k: &Kernels, s: &Stream, dt: Dt, to: Target, a: &IntArgs, rows: Rows) -> Result<()> {
    let (row0, nrows, n_in) = (
        i32_arg(rows.row0, "row")?,
        i32_arg(rows.nrows, "rows")?,
        i32_arg(rows.n_in, "in_features")?,
    );
    let e = k.get::<Entries>()?;
    if a.fast_int4(rows.n_in) {
        let addrs = [a.packed, a.scales, a.zeros];
        let mut b = to.begin(s, &e.int4, dt, &addrs);
        b.arg(&row0).arg(&nrows).arg(&n_in);
        b.arg(&a.index.row_stride).arg(&a.index.col_div);
        b.arg(&a.scale_dt).arg(&a.model_dt);
        to.end(&mut b);
        return launch(b, to.config(rows.threads(8))?, "dequant_int4");
    }
    let addrs = [a.packed, a.scales, a.zeros, a.g_idx];
    let mut b = to.begin(s, &e.int, dt, &addrs);
    b.arg(&row0).arg(&nrows).arg(&n_in).arg(&a.words_per_row);
    b.arg(&a.bits).arg(&a.legacy_per);
    b.arg(&a.index.row_div)
        .arg(&a.index.row_stride)
        .arg(&a.index.col_div);
    b.arg(&a.scale_dt).arg(&a.model_dt).arg(&a.code_kind);
    to.end(&mut b);
    launch(b, to.config(rows.threads(8))?, "dequant_int")
}

/// An FP4 layer's device arguments: the scale byte's meaning (`dequant.cu`'s `kind`), its
/// scalar (global divisor or second-level scale; unused for E8M0), inputs per scale byte.
#[derive(Clone, Copy)]
pub struct Fp4Args {
    pub kind: i32,
    pub scalar: f32,
    pub group: i32,
    pub model_dt: i32,
}

impl Fp4Args {
    pub fn new(scale_kind: Fp4Scale, group: usize, model_dt: i32) -> Self {
        let (kind, scalar) = match scale_kind {
            Fp4Scale::Nvfp4 { global_scale } => (0, global_scale),
            Fp4Scale::ModelOpt { scale_2 } => (1, scale_2),
            Fp4Scale::E8m0 => (2, 1.0),
            Fp4Scale::GgmlMxfp4 => (3, 1.0),
        };
        Fp4Args {
            kind,
            scalar,
            group: group as i32,
            model_dt,
        }
    }
}

/// FP4 weights: `packed` and `scales` are the one weight's addresses (unused for experts).
#[allow(clippy::too_many_arguments)]
pub fn fp4(
    k: &Kernels,
    s: &Stream,
    dt: Dt,
    to: Target,
    (packed, scales): (u64, u64),
    a: &Fp4Args,
    rows: Rows,
) -> Result<()> {
    let (row0, nrows, n_in) = (
        i32_arg(rows.row0, "row")?,
        i32_arg(rows.nrows, "rows")?,
        i32_arg(rows.n_in, "in_features")?,
    );
    if a.group < 16 || !rows.n_in.is_multiple_of(a.group as usize) {
        return Err(Error::backend(
            "cuda",
            format!(
                "FP4 rows of {} weights in groups of {} (whole groups of at least 16 needed)",
                rows.n_in, a.group
            ),
        ));
    }
    // The experts entry reads its scalar from the table.
    let addrs = [packed, scales];
    let e = k.get::<Entries>()?;
    let mut b = to.begin(s, &e.fp4, dt, &addrs);
    b.arg(&a.kind);
    if let Target::One { .. } = to {
        b.arg(&a.scalar);
    }
    b.arg(&a.group);
    b.arg(&row0).arg(&nrows).arg(&n_in).arg(&a.model_dt);
    to.end(&mut b);
    launch(b, to.config(rows.threads(16))?, "dequant_fp4")
}

#[derive(Clone, Copy, PartialEq)]
pub struct UnpackedArgs {
    pub weight: u64,
    pub is_int8: i32,
    pub scales: u64,
    /// Signed zero points indexed like the scales (0: symmetric).
    pub zeros: u64,
    pub index: ScaleArgs,
    pub scale_dt: i32,
    pub model_dt: i32,
}

pub fn unpacked(
    k: &Kernels,
    s: &Stream,
    dt: Dt,
    to: Target,
    a: &UnpackedArgs,
    rows: Rows,
) -> Result<()> {
    let (row0, nrows, n_in) = (
        i32_arg(rows.row0, "row")?,
        i32_arg(rows.nrows, "rows")?,
        i32_arg(rows.n_in, "in_features")?,
    );
    // The one-weight entry takes the codes' address before is_int8, the others after it.
    let weight = [a.weight];
    let e = k.get::<Entries>()?;
    let mut b = to.begin(s, &e.unpacked, dt, &weight);
    b.arg(&a.is_int8);
    if let Target::One { .. } = to {
        b.arg(&a.scales).arg(&a.zeros);
    }
    b.arg(&row0).arg(&nrows).arg(&n_in);
    b.arg(&a.index.row_div)
        .arg(&a.index.row_stride)
        .arg(&a.index.col_div);
    b.arg(&a.scale_dt).arg(&a.model_dt);
    to.end(&mut b);
    launch(b, to.config(rows.threads(8))?, "dequant_unpacked")
}
