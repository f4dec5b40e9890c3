//! Every backend op against the CPU reference on fresh random inputs of awkward sizes: the
//! case list behind `quantppl check` and the GPU backends' tests, as a registry of named
//! families (`ops/`, one file each; `quantppl check --op NAME` runs one).
//!
//! Inputs come from a seeded generator (each family's own, from the seed and its name, so a
//! family run alone sees the inputs it sees in the whole run), weights are packed exactly as
//! on disk, and the CPU backend's result is the expected value.

mod gemm_split;
mod model;
mod ops;

pub use model::{FLIP_NATS, ModelCheck, RoutingNoise, check_model};

use serde::Serialize;

pub use ops::{OP_FAMILIES, OpFamily};

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, Device, OutType, Shaped};
use crate::numerics::FloatType;
use crate::rng::Rng;
use crate::{Error, Result};

#[derive(Clone, Debug, Serialize)]
pub struct CaseReport {
    pub name: String,
    /// Shapes and parameters, e.g. `rows=37 in=96 out=40 group=32`.
    pub vars: String,
    pub max_abs_err: f64,
    /// Largest |reference| value, the scale the error is judged against.
    pub ref_scale: f64,
    /// Tolerance on max_abs_err / ref_scale (relative) or max_abs_err (for NLLs).
    pub tolerance: f64,
    pub passed: bool,
    /// Index of the worst element with the backend's and the reference's values.
    pub worst: (usize, f32, f32),
}

pub(crate) fn compare(
    name: &str,
    vars: String,
    got: &[f32],
    want: &[f32],
    tol: f64,
    relative: bool,
) -> CaseReport {
    let mut worst = (0, 0f32, 0f32);
    let mut max_abs = 0f64;
    let mut scale = 0f64;
    let mut finite = got.len() == want.len();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        scale = scale.max((w as f64).abs());
        let d = (g as f64 - w as f64).abs();
        if !g.is_finite() {
            finite = false;
        }
        if d > max_abs || d.is_nan() {
            max_abs = d;
            worst = (i, g, w);
        }
    }
    let judged = if relative {
        max_abs / scale.max(1e-30)
    } else {
        max_abs
    };
    CaseReport {
        name: name.to_string(),
        vars,
        max_abs_err: max_abs,
        ref_scale: scale,
        tolerance: tol,
        passed: finite && judged <= tol,
        worst,
    }
}

/// `values` as a `[rows, cols]` tensor of `d`.
pub fn matrix<D: Device>(
    d: &D,
    name: &str,
    values: &[f32],
    rows: usize,
    cols: usize,
) -> Result<D::Tensor> {
    d.upload_vector(name, values)?.reshaped(rows, cols)
}

/// Tolerances from docs/DESIGN.md's numerics contract for the backend's activation precision:
/// (relative error of op outputs, absolute error of NLLs).
fn tolerances(t: FloatType) -> (f64, f64) {
    match t {
        FloatType::F32 => (1e-4, 1e-3),
        FloatType::F16 | FloatType::Bf16 => (2e-2, 2e-2),
    }
}

/// What every family's cases share: the backend under test, the CPU reference, and the
/// tolerances and output types of the backend's precision.
pub(crate) struct Ctx<'a, B> {
    pub b: &'a B,
    pub cpu: CpuBackend,
    /// Relative tolerance of op outputs in the activation type.
    pub rel: f64,
    /// Absolute tolerance of NLLs.
    pub nll_tol: f64,
    /// The output types of ops whose output may feed a linear, where they differ.
    pub outs: &'static [(OutType, &'static str)],
    /// The norms' output types: also the planes a mixture reads (f32 values, however a
    /// backend holds them).
    pub norm_outs: &'static [(OutType, &'static str)],
}

impl<'a, B: Backend> Ctx<'a, B> {
    fn new(b: &'a B) -> Self {
        // Tolerances from the precision the linears multiply in (wgpu's one-product mode
        // multiplies f16 parts of f32 activations).
        let (rel, nll_tol) = tolerances(b.product_type());
        let f32_acts = b.activation_type() == FloatType::F32;
        Self {
            b,
            cpu: CpuBackend::new(),
            rel,
            nll_tol,
            outs: if f32_acts {
                &[(OutType::Activation, "")]
            } else {
                &[(OutType::Activation, ""), (OutType::F32, " out=f32")]
            },
            norm_outs: if f32_acts {
                &[(OutType::Activation, "")]
            } else {
                &[
                    (OutType::Activation, ""),
                    (OutType::F32, " out=f32"),
                    (OutType::ExactForRouter, " out=exact-for-router"),
                ]
            },
        }
    }

    /// An f32 output of f32 inputs is held to the f32 tolerance, which a path that still
    /// rounded to the activation type would fail.
    fn out_tol(&self, ot: OutType) -> f64 {
        match ot {
            OutType::F32 | OutType::ExactForRouter => tolerances(FloatType::F32).0,
            OutType::Activation => self.rel,
        }
    }
}

/// Runs every family's cases on `b` and on the CPU reference. Errors only when the backend
/// itself fails.
pub fn check_ops<B: Backend>(b: &B, seed: u64) -> Result<Vec<CaseReport>> {
    check_op_families(b, seed, &[])
}

/// Refuses a name in `names` that is neither an op family nor one of their ops, listing the
/// families (the command line asks before it opens a backend).
pub fn known_op_names(names: &[String]) -> Result<()> {
    for n in names {
        if !OP_FAMILIES
            .iter()
            .any(|f| f.name == n.as_str() || f.ops.contains(&n.as_str()))
        {
            let known: Vec<&str> = OP_FAMILIES.iter().map(|f| f.name).collect();
            return Err(Error::InvalidArgument(format!(
                "--op {n}: not an op family ({}) nor one of their ops",
                known.join(", ")
            )));
        }
    }
    Ok(())
}

/// As `check_ops`, only the families named in `names` (each a family, or an op whose family
/// runs and whose cases are kept); all of them where `names` is empty. An unknown name is an
/// error listing the families.
pub fn check_op_families<B: Backend>(
    b: &B,
    seed: u64,
    names: &[String],
) -> Result<Vec<CaseReport>> {
    known_op_names(names)?;
    let ctx = Ctx::new(b);
    let mut out = Vec::new();
    for (family, cases) in ops::families::<B>() {
        let whole = names.is_empty() || names.iter().any(|n| n == family.name);
        let some_ops: Vec<&str> = family
            .ops
            .iter()
            .copied()
            .filter(|op| names.iter().any(|n| n == op))
            .collect();
        if !whole && some_ops.is_empty() {
            continue;
        }
        let mut rng = Rng::new(seed ^ crate::fnv::Fnv::of(family.name.as_bytes()).value());
        let mut reports = Vec::new();
        cases(&ctx, &mut rng, &mut reports)?;
        out.extend(
            reports
                .into_iter()
                .filter(|r| whole || some_ops.contains(&r.name.as_str())),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An op run alone gives the cases (inputs included) it has in its family's run, and an
    /// unknown name is refused. (That each family's declared ops are exactly the case names it
    /// reports is checked by the conformance suite, which runs every case anyway.)
    #[test]
    fn an_op_runs_alone_as_in_its_family() {
        let cpu = CpuBackend::new();
        let family = check_op_families(&cpu, 7, &["elementwise".to_string()]).unwrap();
        let alone = check_op_families(&cpu, 7, &["add".to_string()]).unwrap();
        let in_family: Vec<_> = family.iter().filter(|r| r.name == "add").collect();
        assert!(!alone.is_empty() && alone.iter().all(|r| r.name == "add"));
        assert_eq!(alone.len(), in_family.len());
        for (a, b) in alone.iter().zip(in_family) {
            assert_eq!((&a.vars, a.ref_scale), (&b.vars, b.ref_scale));
        }
        let e = check_op_families(&cpu, 7, &["ropes".to_string()]).unwrap_err();
        assert!(e.to_string().contains("--op ropes"), "{e}");
    }
}
