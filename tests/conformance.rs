//! One conformance suite, run on every backend this machine has: every op against the CPU
//! reference on awkward sizes (`quantppl::check::check_ops`, the cases `quantppl check` runs),
//! then every fixture end to end against transformers' float32 reference.
//!
//! Instances (a backend kind, a precision and the `BackendOptions` switches): the CPU (fixtures
//! only: it is the ops' reference), wgpu f32-grade with the adapter's own tiles and with a
//! second shape (the medium tiles on GPUs, the small ones on a software adapter) and in its
//! one-product mode (`--dtype f16`, `auto` for
//! 16-bit checkpoints; ignored on adapters without cooperative matrices, lavapipe's in CI,
//! where every mode runs the f32 kernels that the first instance checks), CUDA in bf16 (and with the portable mma.sync attention kernel where
//! a Hopper kernel replaces it), in f32 and in f32 with the GEMMs split onto 16-bit tensor
//! cores (`--dtype f32-grade`), and with W8A8 linears on the 8-bit tensor cores (`--dtype w8a8`:
//! ops, and the fixtures whose activations are quantized, the only ones it changes). A backend this
//! machine lacks has its tests reported as ignored, with the reason; `QUANTPPL_REQUIRE_GPU=1`
//! (set it on GPU machines) makes them fail instead.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use libtest_mimic::{Arguments, Failed, Trial};
use quantppl::backend::cpu::CpuBackend;
use quantppl::backend::cuda::{CudaBackend, CudaPrecision, cuda_available};
use quantppl::backend::options::BackendOptions;
use quantppl::backend::wgpu::{ProductMode, TileConfig, WgpuBackend, list_adapters};
use quantppl::backend::{Backend, Device};
use quantppl::check::{OP_FAMILIES, check_model, check_op_families};
use quantppl::numerics::FloatType;
use quantppl::run::OnBackend;

/// The seed of the op checks' random inputs (as `quantppl check`'s default).
const SEED: u64 = 20261121;

/// A backend as the suite opens it: its kind, precision and development switches (the
/// `BackendOptions` a user would set through `QUANTPPL_DEV`).
#[derive(Clone, Debug)]
enum Instance {
    Cpu,
    Wgpu(BackendOptions, ProductMode),
    Cuda {
        precision: CudaPrecision,
        options: BackendOptions,
    },
}

impl Instance {
    fn name(&self) -> String {
        match self {
            Instance::Cpu => "cpu".into(),
            Instance::Wgpu(o, products) => {
                format!(
                    "wgpu{}{}",
                    if o.wgpu_tiles.is_some() {
                        "_second_tiles"
                    } else {
                        ""
                    },
                    if *products == ProductMode::F32Grade {
                        ""
                    } else {
                        "_f16"
                    }
                )
            }
            Instance::Cuda { precision, options } => format!(
                "cuda_{}{}",
                match precision {
                    CudaPrecision::Bf16 => "bf16",
                    CudaPrecision::F32 => "f32",
                    CudaPrecision::F32Grade => "f32_grade",
                    CudaPrecision::Bf16With8BitCores => "w8a8",
                },
                if options.cuda_portable_attention {
                    "_mma_sync_attention"
                } else {
                    ""
                }
            ),
        }
    }

    /// Whether this is the backend with its default switches (the one users run).
    fn default_switches(&self) -> bool {
        match self {
            Instance::Cpu => true,
            Instance::Cuda {
                precision: CudaPrecision::Bf16With8BitCores,
                ..
            } => false,
            Instance::Wgpu(o, _) | Instance::Cuda { options: o, .. } => {
                *o == BackendOptions::default()
            }
        }
    }

    /// DESIGN's numerics contract per token: the CPU 1e-4, GPUs in f32 1e-3; bf16 is held to
    /// its PPL bound only.
    fn per_token_tolerance(&self) -> Option<f64> {
        match self {
            Instance::Cpu => Some(1e-4),
            Instance::Wgpu(_, ProductMode::F32Grade) => Some(1e-3),
            Instance::Wgpu(..) => None,
            Instance::Cuda {
                precision: CudaPrecision::F32 | CudaPrecision::F32Grade,
                ..
            } => Some(1e-3),
            Instance::Cuda { .. } => None,
        }
    }

    /// The GPU backend's own op checks (the CPU is their reference).
    fn has_op_checks(&self) -> bool {
        !matches!(self, Instance::Cpu)
    }

    /// Why this machine cannot run the instance, if it cannot: (a short label, the detail).
    fn missing(&self) -> Option<(&'static str, String)> {
        match self {
            Instance::Cpu => None,
            Instance::Wgpu(o, products) => {
                if list_adapters().is_empty() {
                    let why = "no wgpu adapter with compute shaders on this machine";
                    return Some(("no wgpu adapter", why.into()));
                }
                let own = WgpuBackend::new(None, &BackendOptions::default(), *products).ok()?;
                if *products != ProductMode::F32Grade && own.product_type() == FloatType::F32 {
                    let why = "no cooperative matrices on this adapter: every mode runs the \
                               f32 kernels, which the `wgpu` instance checks";
                    return Some(("not applicable", why.into()));
                }
                (o.wgpu_tiles == Some(own.tiles())).then(|| {
                    let why = "the adapter's own tiles are these";
                    ("not applicable", why.into())
                })
            }
            Instance::Cuda { options, .. } => {
                if let Err(e) = cuda_available() {
                    return Some(("no CUDA GPU", e.to_string()));
                }
                if !options.cuda_portable_attention {
                    return None;
                }
                let kernel = |o: &BackendOptions| {
                    CudaBackend::new(0, CudaPrecision::Bf16, o)
                        .and_then(|b| b.attention_kernel())
                        .ok()
                };
                (kernel(options)? == kernel(&BackendOptions::default())?).then(|| {
                    let why = "this GPU has no second attention kernel";
                    ("not applicable", why.into())
                })
            }
        }
    }

    /// Runs `job` on this instance's backend, created once and shared by its trials (drivers
    /// run out of devices when every trial opens its own).
    fn run<J: OnBackend>(&self, job: J) -> anyhow::Result<J::Output> {
        match self {
            Instance::Cpu => job.run(&[CpuBackend::new()]),
            Instance::Wgpu(o, products) => job.run(shared(self.name(), || {
                WgpuBackend::new(None, o, *products)
            })?),
            Instance::Cuda { precision, options } => job.run(shared(self.name(), || {
                CudaBackend::new(0, *precision, options)
            })?),
        }
    }
}

/// The backend named `name`, made by `make` at the first call and kept for the process.
fn shared<B: Send + Sync + 'static>(
    name: String,
    make: impl FnOnce() -> quantppl::Result<B>,
) -> anyhow::Result<&'static [B]> {
    type Made = Result<&'static (dyn std::any::Any + Send + Sync), String>;
    static BACKENDS: OnceLock<Mutex<HashMap<String, Made>>> = OnceLock::new();
    let mut made = BACKENDS.get_or_init(Default::default).lock().unwrap();
    let entry = made.entry(name).or_insert_with(|| {
        make()
            .map(|b| &*Box::leak(Box::new(b)) as &'static (dyn std::any::Any + Send + Sync))
            .map_err(|e| e.to_string())
    });
    match entry {
        Ok(b) => Ok(std::slice::from_ref(
            b.downcast_ref::<B>().expect("one backend type per name"),
        )),
        Err(e) => Err(anyhow::anyhow!("{e}")),
    }
}

/// The mixtures whose whole plan a software adapter runs: one per routing rule (softmax
/// renormalised over the top k, softmax without renormalisation beside a gated shared expert,
/// gpt-oss's softmax over the top-k logits, grouped sigmoid with its selection bias).
const ROUTING_SAMPLE: [&str; 4] = [
    "synth-qwen3moe-mini",
    "synth-qwen2moe-mini",
    "synth-gpt-oss-mini",
    "synth-deepseek-v3-mini",
];

/// The fixtures a software adapter runs with the second tile shape: one per weight layout the
/// matmul tiles decode and per attention form.
const SECOND_TILES_SAMPLE: [&str; 18] = [
    "synth-llama-mini",
    "synth-llama-mini-w4a16-g32-asym-actorder",
    "synth-llama-mini-w4a16-g128",
    "synth-gptq-v2-3bit",
    "synth-awq-gemm",
    "synth-llama-mini-fp8-dynamic",
    "synth-ct-fp8-block",
    "synth-llama-mini-nvfp4",
    "synth-llama-mini-nvfp4a16",
    "synth-mxfp8",
    "synth-mxfp4",
    "synth-gguf-llama",
    "synth-gguf-iq4",
    "synth-qwen3moe-mini-w4a16-g32",
    "synth-gpt-oss-mxfp4",
    "synth-gemma3-mini",
    "synth-deepseek-v3.2-mini",
    "synth-vocab32k",
];

/// The GGUF fixtures a software adapter runs: what only a GGUF file brings to the kernels — a
/// legacy and a k-quant model, i-quants, tiled value heads (Qwen3.5), gate and up stacks
/// apart with MXFP4 experts (gpt-oss), k-quant experts, a latent attention joined from halves
/// (DeepSeek). The rest map names and configs the CPU rows hold, onto kernels the op checks
/// (every ggml block type) and the families' safetensors fixtures run there; a GPU runs all.
const GGUF_SOFTWARE_SAMPLE: [&str; 6] = [
    "synth-gguf-llama",
    "synth-gguf-iq4",
    "synth-gguf-qwen35",
    "synth-gguf-gpt-oss",
    "synth-gguf-qwen3moe",
    "synth-gguf-deepseek2",
];

/// The op families whose WGSL kernels read the tile shape (`lib/matmul.wgsl`'s matmuls and
/// `attention.wgsl`): what the second tile shape changes. The others (norms, elementwise ops and
/// the recurrences, 29 of the 44 s these op checks took on lavapipe) run the same modules on
/// every tile shape.
const TILED_FAMILIES: [&str; 5] = ["linear", "attention", "vocab", "mixture", "sparse"];

/// Every op case of `families` (all where empty) against the CPU; the failing ones listed.
struct Ops {
    families: &'static [&'static str],
}

impl OnBackend for Ops {
    type Output = Vec<String>;

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<Vec<String>> {
        let b = &backends[0];
        println!("ops on {} (seed {SEED})", b.name());
        let names: Vec<String> = self.families.iter().map(|f| f.to_string()).collect();
        let reports = check_op_families(b, SEED, &names)?;
        // The registry names every case `check --op` can select, and nothing else.
        let mut failures: Vec<String> = OP_FAMILIES
            .iter()
            .filter(|f| self.families.is_empty() || self.families.contains(&f.name))
            .flat_map(|f| f.ops)
            .filter(|op| !reports.iter().any(|r| r.name == **op))
            .map(|op| format!("op `{op}` is registered but no case reports it"))
            .collect();
        failures.extend(
            reports
                .iter()
                .filter(|r| !OP_FAMILIES.iter().any(|f| f.ops.contains(&r.name.as_str())))
                .map(|r| format!("case `{}` belongs to no registered op family", r.name)),
        );
        Ok(failures
            .into_iter()
            .chain(reports.into_iter().filter(|c| !c.passed).map(|c| {
                format!(
                    "{} {}: max err {:.3e} (scale {:.3e}, tol {:.1e}) at {}: got {} want {}",
                    c.name,
                    c.vars,
                    c.max_abs_err,
                    c.ref_scale,
                    c.tolerance,
                    c.worst.0,
                    c.worst.1,
                    c.worst.2
                )
            }))
            .collect())
    }
}

/// One fixture end to end: exl3 rows 0 and 1 per token against the reference (where the
/// activation type allows a per-token bound), then, where `full_plan`, the PPL of the whole exl3
/// plan of its reference.json as `quantppl check` judges it. A fixture whose activations are
/// fake-quantized is judged by PPL alone (rounding flips at quantization boundaries move single
/// tokens): over the whole plan where it runs, else over rows 0 and 1.
struct Fixture {
    dir: PathBuf,
    full_plan: bool,
    /// The per-token |dNLL| bound of the instance (`None`: judged by PPL alone).
    per_token: Option<f64>,
}

impl OnBackend for Fixture {
    type Output = Vec<String>;

    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<Vec<String>> {
        let b = &backends[0];
        let name = self.dir.file_name().unwrap_or_default().to_string_lossy();
        let per_token = self.per_token;
        if per_token.is_none() && !self.full_plan {
            anyhow::bail!("{name}: neither a per-token bound nor the whole plan: nothing judged");
        }
        let r = common::reference(&self.dir);
        let rows01 = !(self.full_plan && common::activations_quantized(&r));
        let mut failures: Vec<String> = match per_token {
            Some(tol) if rows01 => common::rows01_failures_of(b, &self.dir, &r, tol)
                .into_iter()
                .collect(),
            _ => Vec::new(),
        };
        if self.full_plan {
            let m = check_model(b, &self.dir)?;
            println!(
                "{name}: exl3 plan PPL {:.6} vs {:.6} (rel {:.2e}, tol {:.1e}), max |dNLL| rows 0-1 {:.2e}",
                m.ppl, m.reference_ppl, m.ppl_rel_diff, m.tolerance, m.max_token_diff
            );
            if let Some(f) = &m.routing {
                println!(
                    "{name}: against the CPU, {} tokens moved, the PPL's standard error {:.2e}, the CPU's {:.2e} from the reference",
                    f.moved_tokens, f.standard_error, f.cpu_rel_diff
                );
            }
            if !m.passed {
                failures.push(format!(
                    "{name}: exl3 plan PPL {} vs reference {} (rel {:.3e}, tol {:.1e}{})",
                    m.ppl,
                    m.reference_ppl,
                    m.ppl_rel_diff,
                    m.tolerance,
                    m.routing.as_ref().map_or(String::new(), |f| format!(
                        "; {} tokens moved from the CPU's, the PPL's standard error {:.2e}, the CPU's {:.2e} from the reference",
                        f.moved_tokens, f.standard_error, f.cpu_rel_diff
                    ))
                ));
            }
        }
        Ok(failures)
    }
}

/// Whether the fixture in `dir` is a mixture of experts.
fn is_mixture(dir: &std::path::Path) -> bool {
    quantppl::checkpoint::Checkpoint::open(dir).is_ok_and(|c| c.config.moe.is_some())
}

/// `compare --base-states` against the in-memory `compare` on this backend, for every
/// quantized fixture and its base, with f32 states: every window's KL divergence terms
/// identical.
fn base_states_match(inst: &Instance) -> Result<(), Failed> {
    use quantppl::run::base_states::{States, StatesDtype, StatesWriter};
    use quantppl::run::{Activations, CompareRun, Parallel, RecordOptions, RunOptions, open_model};
    let one_pair = |base: &str, quants: &[&str]| -> anyhow::Result<Vec<String>> {
        let base = open_model(Some(&common::fixture(base)), None, Activations::Declared)?;
        let quants = quants
            .iter()
            .map(|q| (common::fixture(q), q.to_string()))
            .collect();
        let settings = quantppl::plan::PlanSettings {
            data: None,
            field: None,
            text: None,
            method: Some(quantppl::plan::Method::Exl3),
            ctx: Some(128),
            stride: Some(64),
            rows: Some(4),
        };
        let run = CompareRun::prepare(base, quants, &settings, Activations::Declared)?;
        let options = RunOptions {
            records: RecordOptions::default(),
            batch_tokens: Some(256),
            parallel: Parallel::Auto,
            quiet: true,
        };
        let path = std::env::temp_dir().join(format!(
            "quantppl-conformance-{}-{}.states",
            inst.name(),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let mut writer = StatesWriter::open(&path, run.states_header(StatesDtype::F32)?)?;
        inst.run(run.save_job(&options, &mut writer))?;
        writer.finish()?;
        let states = States::open(&path)?;
        let in_memory = inst.run(run.compare_job(&options, None))?;
        let from_states = inst.run(run.compare_job(&options, Some(&states)))?;
        let _ = std::fs::remove_file(&path);
        let (a, b) = (
            in_memory.map(|f| f.results).unwrap_or_default(),
            from_states.map(|f| f.results).unwrap_or_default(),
        );
        if a.len() != run.quants.len() {
            return Ok(vec![format!(
                "{} of {} models compared",
                a.len(),
                run.quants.len()
            )]);
        }
        Ok((0..a.len())
            .filter(|&m| a.get(m) != b.get(m))
            .map(|m| {
                format!(
                    "{}: base-states terms differ from the in-memory ones",
                    run.quants[m].name
                )
            })
            .collect())
    };
    let mut failures = Vec::new();
    // A software adapter compares the first base's quantizations (four weight layouts); a
    // GPU, every pair's.
    let pairs = match (inst, software_adapter()) {
        (Instance::Wgpu(..), true) => &common::QUANTIZED_WITH_BASE[..1],
        _ => &common::QUANTIZED_WITH_BASE[..],
    };
    for (base, quants) in pairs {
        match one_pair(base, quants) {
            Ok(f) => failures.extend(f),
            Err(e) => failures.push(format!("{base}: {e:#}")),
        }
    }
    outcome(Ok(failures))
}

/// A recurrent model (the tiny Qwen3.5-MoE synth) over one window of 2,048 tokens on the best
/// wgpu adapter, through the binary: the CPU's PPL, also on a CPU Vulkan driver, whose loop
/// limit once cut such a window's recurrence short (lavapipe zeroed its last tokens): its chunk
/// scan now walks the 32 chunks in several dispatches.
/// A batch whose MLP intermediate values exceed the adapter's largest storage binding runs the
/// MLP in blocks of rows (wgpu: one window of 131,072 tokens through an 8B's MLP holds 7.5 GB):
/// `synth-llama-mini`'s exl3 rows 0-1 (512 tokens, 1.5 MB of intermediate values) on the
/// adapter held to a binding of 640 KiB (`wgpu-max-binding`: three blocks; unblocked, the
/// batch is refused), against transformers' float32 reference.
fn mlp_in_row_blocks() -> Result<(), Failed> {
    let options = BackendOptions {
        wgpu_max_binding: Some(640 << 10),
        ..BackendOptions::default()
    };
    let backend = WgpuBackend::new(None, &options, ProductMode::F32Grade)?;
    let dir = common::fixture("synth-llama-mini");
    let r = common::reference(&dir);
    match common::rows01_failures_of(&backend, &dir, &r, 1e-3) {
        None => Ok(()),
        Some(e) => Err(e.into()),
    }
}

/// `QUANTPPL_DEV=wgpu-sources=DIR` runs DIR's file of a kernel in place of the built-in one:
/// `check --op add` with an `add.wgsl` that subtracts fails its case, and names it.
fn kernel_file_from_wgpu_sources() -> Result<(), Failed> {
    use std::process::Command;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("quantppl-wgpu-sources-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let add = std::fs::read_to_string(root.join("shaders/wgsl/add.wgsl"))?;
    let subtract = add.replace("x[i] + y[i]", "x[i] - y[i]");
    if subtract == add {
        return Err("add.wgsl no longer computes `x[i] + y[i]`: update this test".into());
    }
    std::fs::write(dir.join("add.wgsl"), subtract)?;
    let out = Command::new(env!("CARGO_BIN_EXE_quantppl"))
        .args(["check", "--backend", "wgpu", "--op", "add"])
        .env("QUANTPPL_DEV", format!("wgpu-sources={}", dir.display()))
        .output()?;
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let failed = stdout
        .lines()
        .any(|l| l.trim_start().starts_with("add ") && l.contains("FAIL"));
    if out.status.success() || !failed {
        return Err(format!(
            "the subtracting add.wgsl was not run (exit {}):\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(())
}

fn long_recurrence_window() -> Result<(), Failed> {
    use std::process::Command;
    let q = env!("CARGO_BIN_EXE_quantppl");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let model =
        std::env::temp_dir().join(format!("quantppl-long-recurrence-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&model);
    let synth = Command::new(q)
        .args([
            "synth",
            "--shape",
            "tiny-qwen3.5-moe",
            "--scheme",
            "dense-bf16",
            "-q",
            "--out",
        ])
        .arg(&model)
        .output()?;
    if !synth.status.success() {
        return Err(String::from_utf8_lossy(&synth.stderr).into_owned().into());
    }
    let eval = |backend: &str| {
        Command::new(q)
            .args([
                "eval", "--method", "gptq", "--ctx", "2048", "--rows", "1", "-q", "--json", "-",
            ])
            .args(["--backend", backend, "--model"])
            .arg(&model)
            .arg("--tokenizer")
            .arg(root.join("assets/stories260K/tokenizer.json"))
            .arg("--data")
            .arg(root.join("assets/wikitext-2-raw/wiki.test.raw"))
            .output()
    };
    let ppl = |out: &std::process::Output| -> Result<f64, Failed> {
        let j: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&out.stderr)))?;
        j["ppl"]
            .as_f64()
            .ok_or_else(|| "no ppl in the report".into())
    };
    let (gpu, cpu) = (eval("wgpu")?, eval("cpu")?);
    let _ = std::fs::remove_dir_all(&model);
    let (got, want) = (ppl(&gpu)?, ppl(&cpu)?);
    match ((got - want) / want).abs() <= 1e-4 {
        true => Ok(()),
        false => Err(format!("PPL {got}, the CPU's {want}").into()),
    }
}

/// Whether the adapter wgpu picks (the first listed, discrete GPUs first) is a CPU driver.
fn software_adapter() -> bool {
    list_adapters()
        .first()
        .is_some_and(|a| a.device_type == "Cpu")
}

fn outcome(result: anyhow::Result<Vec<String>>) -> Result<(), Failed> {
    match result {
        Ok(f) if f.is_empty() => Ok(()),
        Ok(f) => Err(f.join("\n").into()),
        Err(e) => Err(format!("{e:#}").into()),
    }
}

fn main() {
    // As the binary does: Mesa's drivers complain on every adapter listing without it.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none_or(|v| v.is_empty()) {
        // SAFETY: start-up, before any thread exists.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) };
    }
    let args = Arguments::from_args();
    let require_gpu = std::env::var_os("QUANTPPL_REQUIRE_GPU").is_some_and(|v| v == "1");
    // The second tile shape beside the adapter's own: the medium tiles on GPUs (theirs are the
    // large ones), the small ones on a software adapter (its own are the medium ones).
    let second = BackendOptions {
        wgpu_tiles: Some(match software_adapter() {
            true => TileConfig::SMALL,
            false => TileConfig::MEDIUM,
        }),
        ..BackendOptions::default()
    };
    let portable = BackendOptions {
        cuda_portable_attention: true,
        ..BackendOptions::default()
    };
    let cuda = |precision, options: &BackendOptions| Instance::Cuda {
        precision,
        options: options.clone(),
    };
    let default = BackendOptions::default();
    let instances = [
        Instance::Cpu,
        Instance::Wgpu(default.clone(), ProductMode::F32Grade),
        Instance::Wgpu(second, ProductMode::F32Grade),
        Instance::Wgpu(default.clone(), ProductMode::OneProduct { named: true }),
        cuda(CudaPrecision::Bf16, &default),
        cuda(CudaPrecision::Bf16, &portable),
        cuda(CudaPrecision::F32, &default),
        cuda(CudaPrecision::F32Grade, &default),
        cuda(CudaPrecision::Bf16With8BitCores, &default),
    ];
    let fixtures = common::reference_dirs();
    for s in ROUTING_SAMPLE {
        assert!(
            fixtures.iter().any(|d| d.ends_with(s) && is_mixture(d)),
            "{s} is not a mixture-of-experts fixture"
        );
    }
    for s in SECOND_TILES_SAMPLE.iter().chain(&GGUF_SOFTWARE_SAMPLE) {
        assert!(
            fixtures.iter().any(|d| d.ends_with(s)),
            "{s} is not a fixture"
        );
    }
    // The long trials (op checks, base states, whole plans) are queued first, so that the test
    // threads finish together rather than one running the last long trial alone.
    let (mut long, mut short) = (Vec::new(), Vec::new());
    for inst in instances {
        let missing = inst.missing();
        if let Some((_, why)) = &missing {
            eprintln!("{}: {why}", inst.name());
        }
        // A GPU required but absent fails; an instance that does not apply (no second kernel,
        // the adapter's own tiles) is ignored either way.
        let mark = |t: Trial| match &missing {
            Some(("not applicable", _)) => t.with_ignored_flag(true).with_kind("not applicable"),
            Some(_) if require_gpu => t,
            Some((label, _)) => t.with_ignored_flag(true).with_kind(*label),
            None => t,
        };
        let unavailable = missing.clone();
        let name = inst.name();
        let check = move || -> Option<Result<(), Failed>> {
            unavailable
                .as_ref()
                .map(|(_, why)| Err(format!("{name}: {why}").into()))
        };
        if inst.has_op_checks() {
            // On a software adapter the second tiles run the families that read the tiles.
            let second = matches!(&inst, Instance::Wgpu(o, _) if o.wgpu_tiles.is_some());
            let families: &[&str] = match software_adapter() && second {
                true => &TILED_FAMILIES,
                false => &[],
            };
            let (check, inst) = (check.clone(), inst.clone());
            long.push(mark(Trial::test(
                format!("{}::ops", inst.name()),
                move || check().unwrap_or_else(|| outcome(inst.run(Ops { families }))),
            )));
        }
        // On the CPU, tests/suite/base_states.rs runs the same comparison through the binary.
        if inst.default_switches() && !matches!(inst, Instance::Cpu) {
            let (check, inst) = (check.clone(), inst.clone());
            long.push(mark(Trial::test(
                format!("{}::base_states", inst.name()),
                move || check().unwrap_or_else(|| base_states_match(&inst)),
            )));
        }
        if matches!(&inst, Instance::Wgpu(o, ProductMode::F32Grade) if o.wgpu_tiles.is_none()) {
            let (first, second) = (check.clone(), check.clone());
            short.push(mark(Trial::test(
                format!("{}::long_recurrence_window", inst.name()),
                move || first().unwrap_or_else(long_recurrence_window),
            )));
            short.push(mark(Trial::test(
                format!("{}::mlp_in_row_blocks", inst.name()),
                move || second().unwrap_or_else(mlp_in_row_blocks),
            )));
            let third = check.clone();
            short.push(mark(Trial::test(
                format!("{}::kernel_file_from_wgpu_sources", inst.name()),
                move || third().unwrap_or_else(kernel_file_from_wgpu_sources),
            )));
        }
        // The whole plan on real GPUs; rows 0 and 1 only on the CPU (suite/fixtures_ppl.rs
        // runs whole plans of three methods on a sample) and, for every fixture, on a software
        // adapter, where one mixture per routing rule also runs its whole plan, with the
        // adapter's own tiles (`ROUTING_SAMPLE`; whole, the other seven took 157 of the
        // suite's 350 s on lavapipe, one test thread; a GPU runs them all whole). The second
        // tiles change only the matmuls and attention, held per token on rows 0 and 1 of one
        // fixture per weight layout and attention form on a software adapter
        // (`SECOND_TILES_SAMPLE`; all 94 fixtures took 300 of its 970 s), of every fixture on
        // a GPU. Of the GGUF fixtures a software adapter runs a sample (`GGUF_SOFTWARE_SAMPLE`;
        // all 27 took 18 of the suite's 240 s on two threads).
        let software = software_adapter();
        for dir in &fixtures {
            let name_of = |d: &std::path::Path| d.file_name().unwrap_or_default().to_owned();
            if software
                && matches!(&inst, Instance::Wgpu(o, _) if o.wgpu_tiles.is_some())
                && !SECOND_TILES_SAMPLE.iter().any(|s| name_of(dir) == *s)
            {
                continue;
            }
            if software
                && matches!(&inst, Instance::Wgpu(..))
                && name_of(dir).to_string_lossy().starts_with("synth-gguf-")
                && !GGUF_SOFTWARE_SAMPLE.iter().any(|s| name_of(dir) == *s)
            {
                continue;
            }
            let w8a8 = CudaPrecision::Bf16With8BitCores;
            if matches!(&inst, Instance::Cuda { precision, .. } if *precision == w8a8)
                && !common::activations_quantized(&common::reference(dir))
            {
                continue;
            }
            let full_plan = match &inst {
                Instance::Cpu => false,
                Instance::Wgpu(o, _) => {
                    !software
                        || (o.wgpu_tiles.is_none()
                            && ROUTING_SAMPLE.iter().any(|s| name_of(dir) == *s))
                }
                Instance::Cuda { .. } => true,
            };
            let (dir, check, inst) = (dir.clone(), check.clone(), inst.clone());
            let name = dir
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            let queue = if full_plan { &mut long } else { &mut short };
            queue.push(mark(Trial::test(
                format!("{}::fixture::{name}", inst.name()),
                move || {
                    check().unwrap_or_else(|| {
                        let per_token = inst.per_token_tolerance();
                        outcome(inst.run(Fixture {
                            dir,
                            full_plan,
                            per_token,
                        }))
                    })
                },
            )));
        }
    }
    long.append(&mut short);
    libtest_mimic::run(&args, long).exit();
}
