//! A backend wrapper that times every op (synchronizing around it) when profiling is on, for
//! `bench`'s per-op time shares. Off, it only forwards, so one loaded model serves both the
//! throughput runs and the profiled run.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{
    AttnSpec, Backend, ColumnBlocks, Device, GatedMlp, Head, IndexSpec, KldTerms, NormGate,
    OutType, RecurrenceGates, RotarySpan, RouteRule, RowGroups, RowStats, SeqLayout,
};
use crate::Result;
use crate::checkpoint::{DeltaNetConfig, GatedActivation, ModelConfig, QLinear};
use crate::numerics::FloatType;

pub struct Profiled<'a, B> {
    pub inner: &'a B,
    enabled: AtomicBool,
    times: Mutex<BTreeMap<&'static str, (Duration, u64)>>,
}

impl<'a, B: Backend> Profiled<'a, B> {
    pub fn new(inner: &'a B) -> Self {
        Self {
            inner,
            enabled: AtomicBool::new(false),
            times: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// Accumulated (op, total time, calls), largest first; clears the record.
    pub fn take(&self) -> Vec<(&'static str, Duration, u64)> {
        let mut t = self.times.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = t.iter().map(|(k, (d, n))| (*k, *d, *n)).collect();
        t.clear();
        v.sort_by_key(|e| std::cmp::Reverse(e.1));
        v
    }

    fn timed<T>(&self, op: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if !self.enabled.load(Ordering::Relaxed) {
            return f();
        }
        self.inner.synchronize()?;
        let start = Instant::now();
        let r = f()?;
        self.inner.synchronize()?;
        let mut t = self.times.lock().unwrap_or_else(|p| p.into_inner());
        let e = t.entry(op).or_default();
        e.0 += start.elapsed();
        e.1 += 1;
        Ok(r)
    }
}

impl<B: Backend> Device for Profiled<'_, B> {
    type Tensor = B::Tensor;
    type Linear = B::Linear;
    type Sequences = B::Sequences;
    type Groups = B::Groups;

    fn name(&self) -> String {
        self.inner.name()
    }
    fn is_reference(&self) -> bool {
        self.inner.is_reference()
    }
    fn upload_linear(&self, w: &QLinear) -> Result<B::Linear> {
        self.inner.upload_linear(w)
    }
    fn upload_vector(&self, name: &str, values: &[f32]) -> Result<B::Tensor> {
        self.inner.upload_vector(name, values)
    }
    fn upload_sequences(&self, layout: &SeqLayout) -> Result<B::Sequences> {
        self.timed("upload", || self.inner.upload_sequences(layout))
    }
    fn upload_groups(&self, groups: &RowGroups) -> Result<B::Groups> {
        self.timed("upload", || self.inner.upload_groups(groups))
    }
    fn zeros(&self, rows: usize, cols: usize) -> Result<B::Tensor> {
        self.timed("zeros", || self.inner.zeros(rows, cols))
    }
    fn download(&self, t: &B::Tensor) -> Result<Vec<f32>> {
        self.inner.download(t)
    }
    fn tensor_bytes(&self, t: &B::Tensor) -> u64 {
        self.inner.tensor_bytes(t)
    }
    fn copy_from(&self, src: &Self, t: &B::Tensor) -> Result<B::Tensor> {
        self.timed("copy_from", || self.inner.copy_from(src.inner, t))
    }
    fn activation_type(&self) -> FloatType {
        self.inner.activation_type()
    }
    fn product_type(&self) -> FloatType {
        self.inner.product_type()
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn enter_thread(&self) -> Result<()> {
        self.inner.enter_thread()
    }
    fn warms_up_while_loading(&self) -> bool {
        self.inner.warms_up_while_loading()
    }
    fn free_memory_bytes(&self) -> Option<u64> {
        self.inner.free_memory_bytes()
    }
    fn upload_activation(&self, values: &[f32]) -> Result<B::Tensor> {
        self.inner.upload_activation(values)
    }

    fn max_buffer_bytes(&self) -> Option<u64> {
        self.inner.max_buffer_bytes()
    }
    fn max_head_dim(&self) -> usize {
        self.inner.max_head_dim()
    }

    fn workspace_bytes(&self, cfg: &ModelConfig) -> u64 {
        self.inner.workspace_bytes(cfg)
    }

    fn gemm_split(&self) -> Option<crate::backend::GemmSplit> {
        self.inner.gemm_split()
    }

    fn peak_memory_bytes(&self) -> Option<u64> {
        self.inner.peak_memory_bytes()
    }
}

impl<B: Backend> Backend for Profiled<'_, B> {
    fn embed(&self, table: &B::Linear, ids: &[u32], scale: f32) -> Result<B::Tensor> {
        self.timed("embed", || self.inner.embed(table, ids, scale))
    }
    fn rms_norm(&self, x: &B::Tensor, w: &B::Tensor, eps: f32, out: OutType) -> Result<B::Tensor> {
        self.timed("rms_norm", || self.inner.rms_norm(x, w, eps, out))
    }
    fn linear_split(&self, w: &B::Linear) -> Option<crate::backend::GemmSplit> {
        self.inner.linear_split(w)
    }
    fn input_type(&self, w: &B::Linear) -> OutType {
        self.inner.input_type(w)
    }
    fn linear(&self, x: &B::Tensor, w: &B::Linear) -> Result<B::Tensor> {
        self.timed("linear", || self.inner.linear(x, w))
    }
    fn linears(&self, x: &B::Tensor, ws: &[&B::Linear]) -> Result<Vec<B::Tensor>> {
        self.timed("linear", || self.inner.linears(x, ws))
    }
    fn logits(&self, x: &B::Tensor, w: &B::Linear) -> Result<Vec<f32>> {
        self.timed("logits", || self.inner.logits(x, w))
    }
    fn route(
        &self,
        x: &B::Tensor,
        router: &B::Linear,
        rule: &RouteRule,
        all_rows: Option<&[f32]>,
    ) -> Result<(B::Groups, Vec<usize>)> {
        self.timed("router", || self.inner.route(x, router, rule, all_rows))
    }
    fn take_rows(&self, parts: &[&B::Tensor], rows: &[u32]) -> Result<B::Tensor> {
        self.timed("take rows", || self.inner.take_rows(parts, rows))
    }
    fn gather_group(
        &self,
        x: &B::Tensor,
        groups: &B::Groups,
        g: usize,
        out: OutType,
    ) -> Result<B::Tensor> {
        self.timed("gather rows", || self.inner.gather_group(x, groups, g, out))
    }
    fn scatter_add_group(
        &self,
        acc: &mut B::Tensor,
        y: &B::Tensor,
        groups: &B::Groups,
        g: usize,
    ) -> Result<()> {
        self.timed("scatter_add", || {
            self.inner.scatter_add_group(acc, y, groups, g)
        })
    }
    fn mixture(
        &self,
        x: &B::Tensor,
        groups: &B::Groups,
        lens: &[usize],
        mlps: &[GatedMlp<'_, B::Linear>],
    ) -> Result<B::Tensor> {
        // The backend's own way (grouped on CUDA), timed whole.
        self.timed("experts", || self.inner.mixture(x, groups, lens, mlps))
    }
    fn mixture_into(
        &self,
        residual: &mut B::Tensor,
        x: &B::Tensor,
        groups: &B::Groups,
        lens: &[usize],
        mlps: &[GatedMlp<'_, B::Linear>],
    ) -> Result<Option<B::Tensor>> {
        self.timed("experts", || {
            self.inner.mixture_into(residual, x, groups, lens, mlps)
        })
    }
    fn rope(
        &self,
        x: &mut B::Tensor,
        seqs: &B::Sequences,
        cos: &B::Tensor,
        sin: &B::Tensor,
        span: RotarySpan,
    ) -> Result<()> {
        self.timed("rope", || self.inner.rope(x, seqs, cos, sin, span))
    }
    fn norm_rope(
        &self,
        x: B::Tensor,
        weight: &B::Tensor,
        eps: f32,
        seqs: &B::Sequences,
        cos: &B::Tensor,
        sin: &B::Tensor,
        span: RotarySpan,
    ) -> Result<B::Tensor> {
        self.timed("norm+rope", || {
            self.inner.norm_rope(x, weight, eps, seqs, cos, sin, span)
        })
    }
    fn assemble_columns(
        &self,
        rows: usize,
        cols: usize,
        parts: &[(&B::Tensor, ColumnBlocks)],
        out: OutType,
    ) -> Result<B::Tensor> {
        self.timed("assemble_columns", || {
            self.inner.assemble_columns(rows, cols, parts, out)
        })
    }
    fn attention(
        &self,
        q: &B::Tensor,
        k: &B::Tensor,
        v: &B::Tensor,
        seqs: &B::Sequences,
        spec: AttnSpec,
        sinks: Option<&B::Tensor>,
        out: OutType,
    ) -> Result<B::Tensor> {
        self.timed("attention", || {
            self.inner.attention(q, k, v, seqs, spec, sinks, out)
        })
    }
    fn sparse_attention(
        &self,
        q: &B::Tensor,
        k: &B::Tensor,
        v: &B::Tensor,
        seqs: &B::Sequences,
        spec: AttnSpec,
        keys: (&B::Tensor, Option<&B::Tensor>),
        out: OutType,
    ) -> Result<B::Tensor> {
        self.timed("sparse_attention", || {
            self.inner.sparse_attention(q, k, v, seqs, spec, keys, out)
        })
    }
    fn index_top_k(
        &self,
        q: &B::Tensor,
        k: &B::Tensor,
        weights: &B::Tensor,
        seqs: &B::Sequences,
        spec: IndexSpec,
    ) -> Result<B::Tensor> {
        self.timed("index_top_k", || {
            self.inner.index_top_k(q, k, weights, seqs, spec)
        })
    }
    fn mix_streams(
        &self,
        streams: &B::Tensor,
        weights: &B::Tensor,
        added: Option<(&B::Tensor, &B::Tensor)>,
        m: usize,
    ) -> Result<B::Tensor> {
        self.timed("mix_streams", || {
            self.inner.mix_streams(streams, weights, added, m)
        })
    }
    fn hyper_weights(
        &self,
        x: &B::Tensor,
        mix: &B::Linear,
        rule: &crate::backend::compressed::HyperRule,
    ) -> Result<[B::Tensor; 3]> {
        self.timed("hyper_weights", || self.inner.hyper_weights(x, mix, rule))
    }
    fn compressed_keys(
        &self,
        seqs: (&B::Sequences, &SeqLayout),
        window: usize,
        entries: crate::backend::compressed::EntryKeys<'_, B::Tensor>,
    ) -> Result<B::Tensor> {
        self.timed("compressed_keys", || {
            self.inner.compressed_keys(seqs, window, entries)
        })
    }
    fn pool_windows(
        &self,
        kv: &B::Tensor,
        gate: &B::Tensor,
        bias: &B::Tensor,
        seqs: &B::Sequences,
        windows: (usize, bool),
    ) -> Result<B::Tensor> {
        self.timed("pool_windows", || {
            self.inner.pool_windows(kv, gate, bias, seqs, windows)
        })
    }
    fn layer_norm(
        &self,
        x: &B::Tensor,
        weight: &B::Tensor,
        bias: &B::Tensor,
        eps: f32,
        out: OutType,
    ) -> Result<B::Tensor> {
        self.timed("layer_norm", || {
            self.inner.layer_norm(x, weight, bias, eps, out)
        })
    }
    fn causal_conv(
        &self,
        x: &B::Tensor,
        weight: &B::Tensor,
        bias: Option<&B::Tensor>,
        silu: bool,
        seqs: &B::Sequences,
        out: OutType,
    ) -> Result<B::Tensor> {
        self.timed("causal_conv", || {
            self.inner.causal_conv(x, weight, bias, silu, seqs, out)
        })
    }
    fn linear_recurrence(
        &self,
        qkv: &B::Tensor,
        gates: RecurrenceGates<'_, B::Tensor>,
        seqs: &B::Sequences,
        net: DeltaNetConfig,
        out: OutType,
    ) -> Result<B::Tensor> {
        self.timed("linear_recurrence", || {
            self.inner.linear_recurrence(qkv, gates, seqs, net, out)
        })
    }
    fn gated_rms_norm(
        &self,
        x: &B::Tensor,
        gate: &B::Tensor,
        weight: &B::Tensor,
        group: usize,
        how: NormGate,
        eps: f32,
        out: OutType,
    ) -> Result<B::Tensor> {
        self.timed("gated_rms_norm", || {
            self.inner
                .gated_rms_norm(x, gate, weight, group, how, eps, out)
        })
    }
    fn gated_act(
        &self,
        gate: &B::Tensor,
        up: Option<&B::Tensor>,
        act: GatedActivation,
        out: OutType,
    ) -> Result<B::Tensor> {
        self.timed("gated_act", || self.inner.gated_act(gate, up, act, out))
    }
    fn gated_linear(
        &self,
        gate: B::Tensor,
        up: Option<B::Tensor>,
        act: GatedActivation,
        w: &B::Linear,
    ) -> Result<B::Tensor> {
        // One op: a backend may fuse the activation into the GEMM's operand.
        self.timed("gated_act+linear", || {
            self.inner.gated_linear(gate, up, act, w)
        })
    }
    fn row_stats(
        &self,
        hidden: &B::Tensor,
        head: Head<'_, B::Linear>,
        targets: &[i32],
        vocab_top: (usize, usize),
    ) -> Result<Vec<RowStats>> {
        self.timed("lm_head+row stats", || {
            self.inner.row_stats(hidden, head, targets, vocab_top)
        })
    }
    fn scale_columns(&self, x: &mut B::Tensor, scales: &B::Tensor) -> Result<()> {
        self.timed("scale_columns", || self.inner.scale_columns(x, scales))
    }
    fn add_assign(&self, x: &mut B::Tensor, y: &B::Tensor) -> Result<()> {
        self.timed("add", || self.inner.add_assign(x, y))
    }
    fn add_rms_norm(
        &self,
        x: &mut B::Tensor,
        y: &B::Tensor,
        weight: &B::Tensor,
        eps: f32,
        out: OutType,
    ) -> Result<B::Tensor> {
        self.timed("add+rms_norm", || {
            self.inner.add_rms_norm(x, y, weight, eps, out)
        })
    }
    fn nll(
        &self,
        hidden: &B::Tensor,
        head: Head<'_, B::Linear>,
        targets: &[i32],
    ) -> Result<Vec<f32>> {
        self.timed("lm_head+nll", || self.inner.nll(hidden, head, targets))
    }
    fn kld(
        &self,
        base_hidden: &B::Tensor,
        base_head: Head<'_, B::Linear>,
        hidden: &B::Tensor,
        head: Head<'_, B::Linear>,
        targets: &[i32],
    ) -> Result<Vec<KldTerms>> {
        self.timed("lm_head+kld", || {
            self.inner
                .kld(base_hidden, base_head, hidden, head, targets)
        })
    }
}

#[cfg(test)]
mod tests {
    /// The names of the methods an `impl`/`trait` block's text defines at its first level.
    fn methods(block: &str) -> std::collections::BTreeSet<String> {
        block
            .lines()
            .filter_map(|l| l.strip_prefix("    fn "))
            .map(|l| l.split(['(', '<']).next().unwrap_or_default().to_string())
            .collect()
    }

    /// The text from `start` to the first line that closes it (`}` in column 0).
    fn block<'a>(text: &'a str, start: &str) -> &'a str {
        let from = text.find(start).unwrap_or_else(|| panic!("{start}"));
        let len = text[from..].find("\n}\n").expect("end of block");
        &text[from..from + len]
    }

    /// A trait method `Profiled` did not forward would run the trait's default on it, not the
    /// inner backend's own: its fusions dropped from what `bench` measures, silently.
    #[test]
    fn profiled_forwards_every_method_of_both_traits() {
        let traits = include_str!("mod.rs");
        let own = include_str!("profiled.rs");
        for (tr, imp) in [
            (
                "pub trait Device: ",
                "impl<B: Backend> Device for Profiled<",
            ),
            (
                "pub trait Backend: ",
                "impl<B: Backend> Backend for Profiled<",
            ),
        ] {
            let wanted = methods(block(traits, tr));
            let forwarded = methods(block(own, imp));
            assert!(wanted.len() > 10, "{tr}: {wanted:?}");
            let missing: Vec<_> = wanted.difference(&forwarded).collect();
            assert!(missing.is_empty(), "Profiled does not forward {missing:?}");
        }
    }
}
