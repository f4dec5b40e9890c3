//! Which backend(s) a run gets: the kind asked for (or the best available), the devices, and
//! the activation precision; the job is then called once with those backends, whatever their type.

use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, CudaPrecision, cuda_available};
use crate::backend::options::BackendOptions;
use crate::backend::wgpu::{ProductMode, WgpuBackend, list_adapters};
use crate::numerics::FloatType;

/// Which compute backend runs the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The best available: CUDA, then a discrete wgpu adapter, then the CPU.
    Auto,
    /// The f32 reference implementation on all CPU cores.
    Cpu,
    /// NVIDIA GPU 0 through CUDA: cuBLAS GEMMs, weights packed on the device (see --dtype).
    Cuda,
    /// Any Vulkan / Metal / DX12 GPU through wgpu: f32 activations, weights packed on the
    /// device and dequantized inside the matmul tiles.
    Wgpu,
}

/// Precision of the activations on a GPU backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ActDtype {
    /// f32 for float32 checkpoints, bf16 for every other; on wgpu f32-grade for float32
    /// checkpoints, the one-product mode (`f16`) for every other.
    Auto,
    /// f32 activations and GEMMs (no TF32): per-token NLL within the 1e-3 contract of the f32
    /// reference (measured within 3e-5 on the weight-only fixtures). INT8 W8A8 linears (bf16
    /// scales) here and in `f32-grade` run exactly on the integer tensor cores, as two INT8
    /// GEMMs whose int32 sums give the reference's rounded weights' products.
    F32,
    /// bf16 activations, tensor-core GEMMs with f32 accumulation: the fast path.
    Bf16,
    /// f32-grade numbers on 16-bit tensor cores: f32 activations as `f32`, the GEMMs and
    /// attention with each f32 operand split into a high part and its residual (f16 planes
    /// with a power of two per row on Hopper, bf16 parts elsewhere), the products summed in
    /// f32 (an H100's 8B: per token within ~1e-4 of f32, as two f32 implementations differ)
    /// at about 0.4x bf16's speed. `split-bf16`, its former name, still works.
    #[value(name = "f32-grade", alias = "split-bf16")]
    F32Grade,
    /// `bf16`, and the linears whose checkpoint quantizes both operands to 8 bits (FP8 or
    /// INT8 W8A8, one scale a channel and a token; FP8 with 128x128 weight blocks and 1x128
    /// input groups on Hopper) multiply their codes on the 8-bit tensor
    /// cores as vLLM's kernels do: weights `code x scale` unrounded (the reference rounds them
    /// to the model dtype), FP8 sums as the tensor cores accumulate them (about 2^-10 of the
    /// products' magnitude on an H200, truncated); INT8 sums exact. 1.4-1.7x `bf16` on an 8B
    /// W8A8, within 6.5e-3 of the reference PPL on the W8A8 fixtures (outside bf16's 0.2 %
    /// there): a speed mode, never chosen by `auto`. Other linears run as in `bf16`.
    W8a8,
    /// wgpu's one-product mode (its 16-bit mode, `auto`'s for all but float32 checkpoints):
    /// where the adapter has cooperative matrices, each linear multiplies one f16 product of
    /// every activation and weight (each row of activations scaled by a power of two, each
    /// operand rounded to nearest once to f16's 11 significant bits; f32 sums, f32 activations
    /// between the linears, attention in f32), where `f32-grade` multiplies two or three.
    /// Held to the 16-bit contract (PPL within 0.2 %, 0.5 % for mixtures of experts); routers
    /// and linears that fake-quantize their input keep f32-grade products. Without cooperative
    /// matrices the f32 kernels run. Not a CUDA mode (its 16-bit mode is `bf16`).
    F16,
}

/// The devices a run asks for.
#[derive(Clone, Debug)]
pub struct DeviceRequest {
    pub backend: BackendKind,
    /// wgpu adapter index, in the order `list_adapters` gives them (`None`: the best one).
    pub adapter: Option<usize>,
    /// CUDA ordinals (empty: every visible GPU, or GPU 0 for one-device jobs); on the CPU,
    /// N ids make N CPU workers (a stand-in for tests).
    pub devices: Vec<usize>,
    pub dtype: ActDtype,
    /// The backends' development switches (`QUANTPPL_DEV`).
    pub options: BackendOptions,
}

impl DeviceRequest {
    /// The CUDA precision for a checkpoint of dtype `model`.
    pub fn cuda_precision(&self, model: FloatType) -> CudaPrecision {
        match (self.dtype, model) {
            (ActDtype::F32, _) | (ActDtype::Auto, FloatType::F32) => CudaPrecision::F32,
            (ActDtype::F32Grade, _) => CudaPrecision::F32Grade,
            (ActDtype::W8a8, _) => CudaPrecision::Bf16With8BitCores,
            _ => CudaPrecision::Bf16,
        }
    }

    /// How wgpu's linears multiply for a checkpoint of dtype `model`: as CUDA's `auto`, the
    /// 16-bit mode (one f16 product) unless the checkpoint is float32, f32-grade for `f32`
    /// and `f32-grade`.
    pub fn wgpu_products(&self, model: FloatType) -> ProductMode {
        match (self.dtype, model) {
            (ActDtype::F16, _) => ProductMode::OneProduct { named: true },
            (ActDtype::Auto, FloatType::F32) | (ActDtype::F32 | ActDtype::F32Grade, _) => {
                ProductMode::F32Grade
            }
            _ => ProductMode::OneProduct { named: false },
        }
    }
}

/// Something that runs on any backend: called once with the chosen backends.
pub trait OnBackend {
    type Output;
    /// The job runs on one device: without explicit devices it gets GPU 0, not every visible GPU.
    const ONE_DEVICE: bool = false;
    fn run<B: Backend>(self, backends: &[B]) -> anyhow::Result<Self::Output>;
}

/// Picks the backend(s) for `req` and runs `job` on them; `model_dtype` is the checkpoint's
/// dtype, from which CUDA backends choose their activation precision under `ActDtype::Auto`.
pub fn with_backend<J: OnBackend>(
    req: &DeviceRequest,
    model_dtype: FloatType,
    job: J,
) -> anyhow::Result<J::Output> {
    // Each device holds one replica or pipeline stage: one listed twice would hold two.
    if let Some(d) = (1..req.devices.len()).find_map(|i| {
        let d = req.devices[i];
        req.devices[..i].contains(&d).then_some(d)
    }) {
        anyhow::bail!("--devices: device {d} is listed twice");
    }
    let precision = req.cuda_precision(model_dtype);
    let products = req.wgpu_products(model_dtype);
    let on_cuda = || {
        matches!(req.backend, BackendKind::Cuda)
            || matches!(req.backend, BackendKind::Auto) && cuda_available().is_ok()
    };
    if req.dtype == ActDtype::F16 && on_cuda() {
        anyhow::bail!(
            "--dtype f16 is wgpu's one-product mode; CUDA's 16-bit mode is --dtype bf16 \
             (or give --backend wgpu)"
        );
    }
    // The GPUs asked for, else `default` (every visible GPU, or GPU 0).
    let cuda = |default: Vec<usize>| -> crate::Result<Vec<CudaBackend>> {
        let ordinals = if req.devices.is_empty() {
            default
        } else {
            req.devices.clone()
        };
        ordinals
            .iter()
            .map(|&i| CudaBackend::new(i, precision, &req.options))
            .collect()
    };
    match req.backend {
        BackendKind::Cpu => {
            let n = req.devices.len().max(1);
            job.run(&(0..n).map(|_| CpuBackend::new()).collect::<Vec<_>>())
        }
        BackendKind::Cuda => {
            let count = cuda_available()
                .map_err(|e| anyhow::anyhow!("cuda: {e}"))?
                .device_count;
            let count = if J::ONE_DEVICE { count.min(1) } else { count };
            job.run(&cuda((0..count).collect())?)
        }
        BackendKind::Wgpu => job.run(&[WgpuBackend::new(req.adapter, &req.options, products)?]),
        BackendKind::Auto => match cuda_available() {
            Ok(_) => job.run(&cuda(vec![0])?),
            Err(_) => match list_adapters()
                .iter()
                .find(|a| a.device_type == "DiscreteGpu")
            {
                Some(a) => job.run(&[WgpuBackend::new(Some(a.index), &req.options, products)?]),
                None => job.run(&[CpuBackend::new()]),
            },
        },
    }
}

/// A progress bar on stderr, hidden with `quiet`; where stderr is not a terminal (CI, Slurm,
/// a pipe) a plain line every `LOG_EVERY` instead, so a long run shows it is alive.
pub fn progress_bar(len: u64, what: &str, quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressBar::new(len)
    } else {
        indicatif::ProgressBar::with_draw_target(
            Some(len),
            indicatif::ProgressDrawTarget::term_like(Box::new(LogLines::default())),
        )
    };
    let style = indicatif::ProgressStyle::with_template(
        "{msg:>10} [{bar:32}] {human_pos}/{human_len} {rate} ETA {eta}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    // Whole units a second: indicatif's own `{per_sec}` prints "153.3699/s".
    .with_key(
        "rate",
        |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.0}/s", state.per_sec());
        },
    )
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}

/// How often a progress line goes to a stderr that is not a terminal.
const LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// indicatif's drawing as plain lines for a log: each drawing of the bar (written piece by
/// piece, then flushed) goes out as one line at most every `LOG_EVERY`; cursor moves and
/// clears are ignored.
#[derive(Debug, Default)]
struct LogLines {
    /// The drawing being written, and when a line last went out.
    state: std::sync::Mutex<(String, Option<std::time::Instant>)>,
}

impl LogLines {
    fn state(
        &self,
    ) -> std::io::Result<std::sync::MutexGuard<'_, (String, Option<std::time::Instant>)>> {
        self.state
            .lock()
            .map_err(|_| std::io::Error::other("progress log lock poisoned"))
    }
}

impl indicatif::TermLike for LogLines {
    fn width(&self) -> u16 {
        100
    }
    fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn write_line(&self, line: &str) -> std::io::Result<()> {
        self.write_str(line)
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.state()?.0.push_str(s);
        Ok(())
    }
    fn clear_line(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        let mut state = self.state()?;
        let line = std::mem::take(&mut state.0);
        let line = line.trim();
        let now = std::time::Instant::now();
        // The first drawing (nothing done yet) only starts the clock: a run shorter than
        // LOG_EVERY prints no line.
        match state.1 {
            None => state.1 = Some(now),
            Some(t) if now.duration_since(t) >= LOG_EVERY && !line.is_empty() => {
                state.1 = Some(now);
                eprintln!("{line}");
            }
            Some(_) => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// wgpu's `auto` is its 16-bit mode for all but float32 checkpoints, as CUDA's is bf16;
    /// only `--dtype f16` names the mode (the backend line says where it is not given).
    #[test]
    fn wgpu_products_follow_cuda_auto() {
        let req = |dtype| DeviceRequest {
            backend: BackendKind::Wgpu,
            adapter: None,
            devices: Vec::new(),
            dtype,
            options: BackendOptions::default(),
        };
        let one = ProductMode::OneProduct { named: false };
        for (dtype, model, want) in [
            (ActDtype::Auto, FloatType::Bf16, one),
            (ActDtype::Auto, FloatType::F16, one),
            (ActDtype::Auto, FloatType::F32, ProductMode::F32Grade),
            (ActDtype::F32, FloatType::Bf16, ProductMode::F32Grade),
            (ActDtype::F32Grade, FloatType::Bf16, ProductMode::F32Grade),
            (ActDtype::Bf16, FloatType::F32, one),
            (
                ActDtype::F16,
                FloatType::F32,
                ProductMode::OneProduct { named: true },
            ),
        ] {
            assert_eq!(req(dtype).wgpu_products(model), want, "{dtype:?} {model:?}");
            let cuda = req(dtype).cuda_precision(model);
            // The same split on CUDA: f32-grade products where CUDA computes in f32.
            let f32_like = matches!(cuda, CudaPrecision::F32 | CudaPrecision::F32Grade);
            assert_eq!(
                f32_like,
                want == ProductMode::F32Grade,
                "{dtype:?} {model:?}"
            );
        }
    }
}
