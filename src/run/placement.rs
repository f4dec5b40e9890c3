//! Where a run's models live: a full replica on every device, or the decoder layers split
//! across the devices in proportion to their free memory; decided once, before any model is
//! loaded, then each device loads its part on its own thread.

use anyhow::Context;

use super::devices::progress_bar;
use crate::backend::{Backend, Device};
use crate::checkpoint::{Checkpoint, ModelConfig};
use crate::model::forward::split_layers;
use crate::model::{LoadFor, Model};
use crate::numerics::FloatType;
use crate::plan::Plan;
use crate::units::human_bytes;

/// How several devices share the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Parallel {
    /// Replicas when one fits every device, else layers.
    Auto,
    /// A full model replica per device, windows dealt out.
    Data,
    /// The decoder layers split across devices, batches pipelined through them.
    Layers,
}

/// Models placed on the devices: full replicas (data parallel), or pipeline stages.
pub struct Placed<B: Backend> {
    pub models: Vec<Model<B>>,
    pub pipeline: bool,
}

impl<B: Backend> Placed<B> {
    /// How the devices share the work, as reports and record files name it: `single`, `data`
    /// (a replica on each device) or `layers 0..16, 16..32` (each device's layers).
    pub fn label(&self) -> String {
        if self.pipeline {
            let ranges: Vec<String> = self
                .models
                .iter()
                .map(|m| format!("{}..{}", m.layers_range.start, m.layers_range.end))
                .collect();
            format!("layers {}", ranges.join(", "))
        } else if self.models.len() > 1 {
            "data".to_string()
        } else {
            "single".to_string()
        }
    }
}

/// How a run's models are laid out on its devices, decided once, before any is loaded.
pub enum Placement {
    /// A full replica of each model on every device.
    Replicas,
    /// Each model's layers split across the devices in proportion to `capacity` (their free
    /// memory before loading; equal where unknown), so models of one depth split alike.
    Layers { capacity: Vec<u64> },
}

impl Placement {
    /// The layout `parallel` asks for `weights` bytes resident on `backends` at once (`auto`:
    /// replicas when they fit every device); an error naming `what` when they fit neither way.
    pub fn choose<B: Backend>(
        backends: &[B],
        weights: u64,
        what: &str,
        parallel: Parallel,
    ) -> anyhow::Result<Placement> {
        let free: Option<Vec<u64>> = backends.iter().map(Device::free_memory_bytes).collect();
        let pipeline = split_across_devices(weights, free.as_deref(), backends.len(), parallel)
            .map_err(|why| anyhow::anyhow!("{what}: {why}"))?;
        Ok(if pipeline {
            Placement::Layers {
                capacity: free.unwrap_or_else(|| vec![1; backends.len()]),
            }
        } else {
            Placement::Replicas
        })
    }

    /// Loads `ckpt` onto `backends` in this layout, for `batches`.
    pub fn load<B: Backend>(
        &self,
        backends: &[B],
        ckpt: &Checkpoint,
        batches: LoadFor,
        quiet: bool,
    ) -> anyhow::Result<Placed<B>> {
        match self {
            Placement::Replicas => Ok(Placed {
                models: load_replicas(backends, ckpt, batches, quiet)?,
                pipeline: false,
            }),
            Placement::Layers { capacity } => {
                let n_layers = ckpt.config.num_layers;
                if backends.len() > n_layers {
                    anyhow::bail!(
                        "{}: {} devices for {n_layers} layers: use at most {n_layers} devices",
                        ckpt.dir.display(),
                        backends.len()
                    );
                }
                let ranges = split_layers(n_layers, capacity, |l| ckpt.config.may_begin_stage(l));
                let models = load_each(backends, ckpt, batches, quiet, |i| ranges[i].clone())?;
                Ok(Placed {
                    models,
                    pipeline: true,
                })
            }
        }
    }
}

/// Loads `ckpt` onto `backends` as `parallel` asks: replicas, or a layer split in proportion to
/// each device's free memory. `auto` takes replicas when one fits every device.
pub fn place<B: Backend>(
    backends: &[B],
    ckpt: &Checkpoint,
    batches: LoadFor,
    parallel: Parallel,
    quiet: bool,
) -> anyhow::Result<Placed<B>> {
    let what = ckpt.dir.display().to_string();
    Placement::choose(backends, ckpt.store.total_bytes(), &what, parallel)?
        .load(backends, ckpt, batches, quiet)
}

/// Whether the layers are split across the devices (`true`) or each holds a replica, for
/// a checkpoint of `weights` bytes and the devices' free memory (where known); an error that
/// says how much is needed and how much is free when the model fits neither way asked.
pub fn split_across_devices(
    weights: u64,
    free: Option<&[u64]>,
    devices: usize,
    parallel: Parallel,
) -> Result<bool, String> {
    let pipeline = match parallel {
        _ if devices < 2 => false,
        Parallel::Data => false,
        Parallel::Layers => true,
        // A replica needs its weights plus room for activations (a tenth more, at least 2 GiB).
        Parallel::Auto => {
            free.is_some_and(|f| f.iter().any(|&b| b < weights + (weights / 10).max(2 << 30)))
        }
    };
    if let Some(f) = free {
        let available: u64 = if pipeline {
            f.iter().sum()
        } else {
            f.iter().copied().min().unwrap_or(0)
        };
        if weights > available {
            return Err(format!(
                "needs {} for the weights, but {} {} free{}",
                human_bytes(weights),
                if pipeline {
                    "the devices together have"
                } else {
                    "each device has only"
                },
                human_bytes(available),
                if pipeline || devices < 2 {
                    ""
                } else {
                    " (try --parallel layers)"
                }
            ));
        }
    }
    Ok(pipeline)
}

/// Loads layers `range(i)` of `ckpt` onto every backend `i` at once, one thread per device
/// (the uploads are independent); the progress bar follows the first device.
fn load_each<B: Backend>(
    backends: &[B],
    ckpt: &Checkpoint,
    batches: LoadFor,
    quiet: bool,
    range: impl Fn(usize) -> std::ops::Range<usize> + Sync,
) -> anyhow::Result<Vec<Model<B>>> {
    let bar = progress_bar(0, "loading", quiet);
    let models = std::thread::scope(|scope| {
        let handles: Vec<_> = backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let (bar, range) = (&bar, &range);
                scope.spawn(move || -> anyhow::Result<Model<B>> {
                    b.enter_thread()?;
                    let r = range(i);
                    let progress = |done: usize, total: usize| {
                        if i == 0 {
                            bar.set_length(total as u64);
                            bar.set_position(done as u64);
                        }
                    };
                    let whole = r.start == 0 && r.end == ckpt.config.num_layers;
                    Model::load_stage(b, ckpt, r.clone(), batches, &progress).with_context(|| {
                        if whole {
                            format!("loading {} onto {}", ckpt.dir.display(), b.name())
                        } else {
                            format!("loading layers {}..{} onto {}", r.start, r.end, b.name())
                        }
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a loading thread panicked")))
            })
            .collect::<anyhow::Result<Vec<_>>>()
    });
    bar.finish_and_clear();
    if models.is_ok() {
        warn_about_weights(ckpt);
    }
    models
}

/// Says what of the checkpoint a run may not hold as written: shards with holes (never
/// written regions, which read as zeros: an interrupted download or write that sized the file
/// first), and the language model's tensors that loading never read (every layer is loaded
/// once the devices' ranges are; transformers warns of such unused weights too).
fn warn_about_weights(ckpt: &Checkpoint) {
    for h in ckpt.store.holes() {
        eprintln!(
            "warning: {}: {} of it were never written (holes, read as zeros){}: an interrupted download or copy? This run reads zeros there",
            h.file.display(),
            human_bytes(h.bytes),
            h.first_tensor
                .as_ref()
                .map_or(String::new(), |t| format!(", from tensor {t} on"))
        );
    }
    const NAMED: usize = 5;
    let unread = ckpt.unread_tensors();
    if !unread.is_empty() {
        let more = match unread.len() {
            n if n > NAMED => format!(" and {} more", n - NAMED),
            _ => String::new(),
        };
        let names = unread[..unread.len().min(NAMED)].join(", ");
        eprintln!(
            "warning: {}: the model as its config describes it never reads {names}{more}: the config may not describe this checkpoint",
            ckpt.dir.display()
        );
    }
}

/// Uploads one model replica per backend, showing progress.
pub fn load_replicas<B: Backend>(
    backends: &[B],
    ckpt: &Checkpoint,
    batches: LoadFor,
    quiet: bool,
) -> anyhow::Result<Vec<Model<B>>> {
    load_each(backends, ckpt, batches, quiet, |_| {
        0..ckpt.config.num_layers
    })
}

/// Batches per pipeline stage that a layer split's default batch size aims for: with `s`
/// stages and `b` batches each stage is busy `b / (b + s - 1)` of the time (8 of 9 on 2 GPUs).
const PIPELINE_BATCHES_PER_STAGE: usize = 4;

/// What each device takes on in a run, decided before loading: the weight bytes it will hold
/// and how many batches keep every device busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceShare {
    /// Weight bytes still to load on each device (0 once they are loaded).
    pub to_load: u64,
    /// One batch per replica; `PIPELINE_BATCHES_PER_STAGE` per stage where layers split.
    pub busy_batches: usize,
}

impl DeviceShare {
    /// The share of each of `devices` once their models are loaded (`pipeline`: layers split).
    pub fn loaded(devices: usize, pipeline: bool) -> Self {
        let devices = devices.max(1);
        DeviceShare {
            to_load: 0,
            busy_batches: if pipeline {
                PIPELINE_BATCHES_PER_STAGE * devices
            } else {
                devices
            },
        }
    }

    /// The share of each of `backends` when `weights` bytes are loaded at once as `parallel`
    /// places them: all of them with replicas, an even share where the layers split.
    pub fn before_loading<D: Device>(backends: &[D], weights: u64, parallel: Parallel) -> Self {
        let free: Option<Vec<u64>> = backends.iter().map(Device::free_memory_bytes).collect();
        let devices = backends.len().max(1);
        let pipeline =
            split_across_devices(weights, free.as_deref(), devices, parallel).unwrap_or(false);
        DeviceShare {
            to_load: if pipeline {
                weights.div_ceil(devices as u64)
            } else {
                weights
            },
            ..Self::loaded(devices, pipeline)
        }
    }
}

/// Routed rows per expert from which a mixture's grouped GEMMs run as fast as they will: the
/// experts of a layer hold all their routed rows at once (~77 KB a token for Qwen3-30B-A3B),
/// so a larger batch only costs memory. On an H100 (docs/decisions.md: Batches sized by rows an
/// expert), Qwen3-30B-A3B
/// W4A16 ran 55,955 tokens/s at 8,192 rows an expert (25.77 GiB), 57,926 at 12,800 (30.84
/// GiB) and 57,204 at 25,600 (44.89 GiB).
const EXPERT_ROWS_ENOUGH: usize = 16_384;

/// Tokens per forward batch: `requested`, else what the device allows for `cfg` once
/// `share.to_load` more bytes of weights are on it ([`device_batch_tokens`]), but no larger
/// than splits the plan's windows into `share.busy_batches` (so no device waits for want of
/// a batch), than gives a mixture's experts `EXPERT_ROWS_ENOUGH` rows each, nor than the whole
/// plan (so the report's "batches of up to" is one that can occur), and evened out over the
/// batches that size makes (200 windows at most 128 a batch: 2 of 100, not 128 and 72); never
/// fewer than the longest window.
pub fn batch_tokens<D: Device>(
    requested: Option<usize>,
    backend: &D,
    (cfg, experts_quantize_input): (&ModelConfig, bool),
    plan: &Plan,
    share: DeviceShare,
) -> usize {
    let max_len = plan.max_window();
    let all = plan.forwarded() as usize;
    let windows = plan.windows.len();
    let busy = windows.div_ceil(share.busy_batches.max(1)) * max_len;
    let enough_rows = cfg.moe.as_ref().map_or(usize::MAX, |m| {
        EXPERT_ROWS_ENOUGH * m.num_experts / m.experts_per_token.max(1)
    });
    requested
        .unwrap_or_else(|| {
            let most = device_batch_tokens(
                backend,
                (cfg, experts_quantize_input),
                max_len,
                share.to_load,
            )
            .min(busy)
            .min(enough_rows)
            .min(all);
            let batches = windows.div_ceil((most / max_len.max(1)).max(1));
            windows.div_ceil(batches.max(1)) * max_len
        })
        .max(max_len)
}

/// An error unless a window of `window` tokens fits `device`'s largest buffer, where it has
/// one: its residual stream (f32; hyper-connections' several streams side by side) is held whole, in
/// one buffer, and so is every other hidden-wide activation. Checked before any weight loads:
/// wgpu on NVIDIA's Vulkan binds at most 2 GiB, so an 8B's windows stop below 131,072 tokens.
pub fn check_window_fits<D: Device>(
    device: &D,
    cfg: &ModelConfig,
    window: usize,
) -> crate::Result<()> {
    let Some(max) = device.max_buffer_bytes() else {
        return Ok(());
    };
    let streams = cfg.hyper.as_ref().map_or(1, |h| h.streams.max(1));
    let width = streams * cfg.hidden_size.max(1);
    let (row, bytes) = (4 * width as u64, window as u64 * 4 * width as u64);
    if bytes <= max {
        return Ok(());
    }
    Err(crate::Error::InvalidArgument(format!(
        "a window of {window} tokens does not fit {}: its [{window}, {width}] f32 residual \
         stream takes {bytes} bytes, and the largest buffer it binds is {max} bytes; windows of \
         at most {} tokens fit (CUDA has no such limit)",
        device.name(),
        max / row
    )))
}

/// How many tokens of windows of `ctx` one batch may hold on `device`, in whole windows:
/// - with its free memory known: what 90 % of it holds after `to_load` bytes of weights still
///   to be loaded and the backend's workspace, at the
///   live activations of one layer per token (f32 residual; normed input, q/k/v and attention
///   output, gate/up/product and an act-quant copy in the activation type; a mixture's
///   accumulator, input copy and each routed row's gathered input, gate and up, and where
///   `experts_quantize_input` the gathered input in f32 beside its quantized copy; 25 %
///   slack; the MLP width the widest of any layer's);
/// - else with a buffer limit: as many tokens as keep the widest activation
///   `[tokens, max(intermediate, hidden, q width)]` (f32) in one buffer, at most 8 windows;
/// - else (the CPU) 4 windows.
pub fn device_batch_tokens<D: Device>(
    device: &D,
    (cfg, experts_quantize_input): (&ModelConfig, bool),
    ctx: usize,
    to_load: u64,
) -> usize {
    let ctx = ctx.max(1);
    let (h, i) = (cfg.hidden_size, cfg.widest_mlp());
    let tokens = match (device.free_memory_bytes(), device.max_buffer_bytes()) {
        (Some(free), _) => {
            let split = device.gemm_split().is_some();
            let per_token = activation_bytes_per_token(
                (cfg, experts_quantize_input),
                device.activation_type(),
                split,
            );
            let budget = (free * 9 / 10).saturating_sub(device.workspace_bytes(cfg) + to_load);
            (budget / per_token) as usize
        }
        (None, Some(max_buffer)) => {
            let widest = i.max(h).max(cfg.num_heads * cfg.head_dim).max(1) as u64;
            ((max_buffer / (4 * widest)) as usize).min(8 * ctx)
        }
        (None, None) => 4 * ctx,
    };
    (tokens / ctx * ctx).max(ctx)
}

/// The device memory one token of a batch takes, as the batch sizer reserves it (and
/// `inspect` reports it): the residual stream (f32), the normed input, q/k/v, the attention
/// output, the widest MLP's gate, up and product in the activation type `act`; where `split`
/// GEMMs run on f32 activations, the two 16-bit parts of the widest input; for a mixture its
/// f32 accumulator and input, and per routed row (k a token, all of a layer's at once where
/// experts run grouped) its gathered input beside its gate and up, in f32 and quantized where
/// the experts quantize their input; a recurrent layer's chunked intermediates; sparse
/// attention's indexer activations and selection; 25 % slack.
pub fn activation_bytes_per_token(
    (cfg, experts_quantize_input): (&ModelConfig, bool),
    act: FloatType,
    split: bool,
) -> u64 {
    let (h, i) = (cfg.hidden_size, cfg.widest_mlp());
    let e = act.bytes();
    let moe = cfg.moe.as_ref().map_or(0, |m| {
        let gathered = if experts_quantize_input { 4 * h } else { 0 };
        8 * h + m.experts_per_token * (gathered + e * (h + 2 * m.expert_intermediate_size))
    });
    let qkv = cfg.attention_width();
    // Split f32 GEMMs copy their input as two 16-bit parts, the widest one too; so does split
    // attention its q, k and v.
    let copy = if split && e == 4 {
        4 * i.max(h).max(qkv)
    } else {
        0
    };
    // The chunked recurrence's f32 intermediates (the CUDA kernels'): within-chunk products,
    // solved values and keys, summed decays a value head (Kimi's: a key channel each).
    let recurrence = [cfg.delta_net, cfg.mamba.map(|m| m.as_recurrence())]
        .into_iter()
        .flatten()
        .map(|n| {
            let decays = match n.layout {
                crate::checkpoint::config::DeltaNetLayout::Kimi => n.k_dim,
                _ => 1,
            };
            4 * n.v_heads * (crate::backend::recurrent::CHUNK + n.v_dim + n.k_dim + decays)
        })
        .max()
        .unwrap_or(0);
    // Sparse attention: the indexer's queries, key and head weights, each query's selection (f32
    // positions) and as much again for CUDA's key mask (a bit a key: no larger up to 64k).
    let sparse = cfg.indexer.as_ref().map_or(0, |ix| {
        8 * ix.top_k + e * (ix.heads * ix.head_dim + ix.head_dim + ix.heads)
    });
    ((4 * h + moe + recurrence + sparse + e * (2 * h + qkv + 4 * i) + copy) * 5 / 4).max(1) as u64
}

#[cfg(test)]
mod tests {
    use super::{
        DeviceShare, Parallel, batch_tokens, check_window_fits, device_batch_tokens,
        split_across_devices,
    };
    use crate::backend::cpu::{CpuBackend, CpuLinear, CpuTensor};
    use crate::backend::{Device, RowGroups, SeqLayout};
    use crate::checkpoint::{ModelConfig, QLinear};
    use crate::numerics::FloatType;
    use crate::synth::SynthShape;

    const GIB: u64 = 1 << 30;

    /// A bf16 device with `free` bytes free (the CPU's buffers stand in for its own).
    struct Gpu {
        cpu: CpuBackend,
        free: u64,
        max_buffer: Option<u64>,
    }

    impl Device for Gpu {
        type Tensor = CpuTensor;
        type Linear = CpuLinear;
        type Sequences = SeqLayout;
        type Groups = RowGroups;
        fn name(&self) -> String {
            "a bf16 GPU".into()
        }
        fn activation_type(&self) -> FloatType {
            FloatType::Bf16
        }
        fn upload_linear(&self, w: &QLinear) -> crate::Result<CpuLinear> {
            self.cpu.upload_linear(w)
        }
        fn upload_vector(&self, name: &str, values: &[f32]) -> crate::Result<CpuTensor> {
            self.cpu.upload_vector(name, values)
        }
        fn upload_sequences(&self, layout: &SeqLayout) -> crate::Result<SeqLayout> {
            self.cpu.upload_sequences(layout)
        }
        fn upload_groups(&self, groups: &RowGroups) -> crate::Result<RowGroups> {
            self.cpu.upload_groups(groups)
        }
        fn download(&self, t: &CpuTensor) -> crate::Result<Vec<f32>> {
            self.cpu.download(t)
        }
        fn free_memory_bytes(&self) -> Option<u64> {
            Some(self.free)
        }
        fn max_buffer_bytes(&self) -> Option<u64> {
            self.max_buffer
        }
    }

    /// Where memory would allow one batch of every window, the default batch still gives each
    /// replica a batch, and a layer split's pipeline four batches a stage.
    #[test]
    fn default_batches_keep_every_device_busy() {
        let json = SynthShape::Qwen3_30bA3b.spec().config_json(None);
        let cfg = ModelConfig::from_json(&json).unwrap();
        let gpus: Vec<Gpu> = (0..2)
            .map(|_| Gpu {
                cpu: CpuBackend::new(),
                free: 1 << 50,
                max_buffer: None,
            })
            .collect();
        let (ctx, windows) = (2048, 200);
        let tokens: Vec<u32> = (0..(windows + 3) * 512 + ctx)
            .map(|t| t as u32 % 1000)
            .collect();
        let plan = crate::plan::exl3(&tokens, ctx, 512, Some(windows)).unwrap();
        assert_eq!(plan.windows.len(), windows);
        let batch = |share| batch_tokens(None, &gpus[0], (&cfg, false), &plan, share) / ctx;
        let share = |n, parallel| DeviceShare::before_loading(&gpus[..n], 15 << 30, parallel);
        // One device: as many windows as give the experts 16,384 rows each (128 windows),
        // evened out: 2 batches of 100.
        assert_eq!(batch(share(1, Parallel::Auto)), windows / 2);
        assert_eq!(batch(share(2, Parallel::Data)), windows / 2);
        assert_eq!(batch(share(2, Parallel::Layers)), windows / 8);
        assert_eq!(batch(DeviceShare::loaded(2, true)), windows / 8);
        // A requested size stands.
        let requested = batch_tokens(
            Some(4 * ctx),
            &gpus[0],
            (&cfg, false),
            &plan,
            share(2, Parallel::Layers),
        );
        assert_eq!(requested, 4 * ctx);
    }

    /// A mixture's default batch stops growing at 16,384 routed rows an expert, and batches
    /// come out even: Qwen3-30B-A3B (128 experts, 8 a token) takes 128 windows of 2048 at
    /// most, so 130 windows run as 2 of 65 and 300 as 3 of 100; Mixtral (8 experts, 2 a
    /// token) 32 at most.
    #[test]
    fn mixture_batches_stop_at_enough_rows_an_expert_and_come_out_even() {
        let gpu = Gpu {
            cpu: CpuBackend::new(),
            free: 1 << 50,
            max_buffer: None,
        };
        let ctx = 2048;
        let batch = |shape: SynthShape, windows: usize| {
            let cfg = ModelConfig::from_json(&shape.spec().config_json(None)).unwrap();
            let tokens: Vec<u32> = (0..(windows + 3) * 512 + ctx)
                .map(|t| t as u32 % 1000)
                .collect();
            let plan = crate::plan::exl3(&tokens, ctx, 512, Some(windows)).unwrap();
            let share = DeviceShare::loaded(1, false);
            batch_tokens(None, &gpu, (&cfg, false), &plan, share) / ctx
        };
        assert_eq!(batch(SynthShape::Qwen3_30bA3b, 128), 128);
        assert_eq!(batch(SynthShape::Qwen3_30bA3b, 130), 65);
        assert_eq!(batch(SynthShape::Qwen3_30bA3b, 300), 100);
        assert_eq!(batch(SynthShape::Mixtral8x7b, 100), 25);
    }

    #[test]
    fn batches_leave_room_for_the_weights_still_to_load_and_a_mixtures_routed_rows() {
        let json = SynthShape::Qwen3_30bA3b.spec().config_json(None);
        let cfg = ModelConfig::from_json(&json).unwrap();
        let gpu = Gpu {
            cpu: CpuBackend::new(),
            free: 79 * GIB,
            max_buffer: None,
        };
        let ctx = 2048;
        // Sized before loading, the weights' bytes come off the budget.
        let weights = 17_230 * GIB / 1000;
        let w4a4 = (&cfg, true);
        let batch = device_batch_tokens(&gpu, w4a4, ctx, weights);
        assert!(batch < device_batch_tokens(&gpu, w4a4, ctx, 0));
        assert_eq!(batch % ctx, 0);
        // The most a token of this shape took at the grouped experts' peak, measured on an
        // H100 (docs/decisions.md: Batches sized by rows an expert; FP8 attention with W4A4
        // NVFP4 experts, 71.13 GiB at 409,600 tokens with 17.23 GiB of weights): such a batch
        // fits.
        let per_token = (71.13 - 17.23) * GIB as f64 / 409_600.0;
        assert!(batch as f64 * per_token + weights as f64 <= (79 * GIB) as f64);
        // Weight-only experts hold no f32 or quantized copy of their rows: larger batches,
        // which still fit what W4A16 experts took (the same measurement: 44.89 GiB at 409,600 tokens
        // with 15.55 GiB of weights).
        let weights = 15_550 * GIB / 1000;
        let w4a16 = device_batch_tokens(&gpu, (&cfg, false), ctx, weights);
        assert!(w4a16 > device_batch_tokens(&gpu, w4a4, ctx, weights));
        let per_token = (44.89 - 15.55) * GIB as f64 / 409_600.0;
        assert!(w4a16 as f64 * per_token + weights as f64 <= (79 * GIB) as f64);
        // Weights that leave no room still get one window.
        assert_eq!(device_batch_tokens(&gpu, w4a4, ctx, 78 * GIB), ctx);
    }

    /// A window whose residual stream exceeds the device's largest buffer is refused before
    /// any weight loads, naming the longest window that fits: an 8B on NVIDIA's Vulkan driver,
    /// which binds 2 GiB - 4 bytes.
    #[test]
    fn windows_past_the_largest_buffer_are_refused() {
        let cfg = ModelConfig::from_json(&SynthShape::Llama3_8b.spec().config_json(None)).unwrap();
        let vulkan = Gpu {
            cpu: CpuBackend::new(),
            free: 139 * GIB,
            max_buffer: Some(2 * GIB - 4),
        };
        assert!(check_window_fits(&vulkan, &cfg, 131_071).is_ok());
        let e = check_window_fits(&vulkan, &cfg, 131_072)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("131072 tokens") && e.contains("at most 131071"),
            "{e}"
        );
        let cuda = Gpu {
            max_buffer: None,
            ..vulkan
        };
        assert!(check_window_fits(&cuda, &cfg, 1 << 20).is_ok());
    }

    #[test]
    fn replicas_when_they_fit_layers_otherwise_and_a_clear_error_when_nothing_fits() {
        let two_h200 = [139 * GIB, 139 * GIB];
        // An 8B W4A16 (5.3 GiB) gets a replica per GPU; a 123B W4A16 (60 GiB) too.
        assert_eq!(
            split_across_devices(5 * GIB, Some(&two_h200), 2, Parallel::Auto),
            Ok(false)
        );
        // 200 GiB of weights fit only split.
        assert_eq!(
            split_across_devices(200 * GIB, Some(&two_h200), 2, Parallel::Auto),
            Ok(true)
        );
        // One device never splits; unknown free memory (the CPU) keeps replicas.
        assert_eq!(
            split_across_devices(200 * GIB, None, 1, Parallel::Layers),
            Ok(false)
        );
        assert_eq!(
            split_across_devices(200 * GIB, None, 3, Parallel::Auto),
            Ok(false)
        );
        let err = split_across_devices(300 * GIB, Some(&two_h200), 2, Parallel::Auto).unwrap_err();
        assert!(
            err.contains("300.00 GiB") && err.contains("278.00 GiB"),
            "{err}"
        );
        let err = split_across_devices(200 * GIB, Some(&two_h200), 2, Parallel::Data).unwrap_err();
        assert!(
            err.contains("each device has only 139.00 GiB") && err.contains("--parallel layers"),
            "{err}"
        );
    }
}
