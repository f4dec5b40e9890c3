//! Cooperative matrices through wgpu, the smallest test (issue 21, item 5): 16x16 f16 tiles
//! loaded with `coopLoad`, multiplied into f32 with `coopMultiplyAdd` and stored, fed the ways
//! a matmul kernel feeds them: straight from a storage buffer (row- and column-major), and
//! staged in workgroup memory with rows padded by 0, 4 or 8 halves, 16 to 64 deep in steps of
//! 16, by one subgroup or four (each its own 16 rows). Each product is compared with the host's
//! (small integers: every sum is exact); a wrong one names the inner positions k it behaves as
//! if it had lost. A session-16 matmul on cooperative matrices lost the last 4 halves of each
//! padded shared-memory row; on NVIDIA's driver 580.159 (H100 and H200) with wgpu/naga 30
//! every case here is exact (BENCHMARKS.md, session 18), so that was the kernel's own doing.
//!
//! `--speed` times an f16 GEMM on them instead (4096^3; tiles from storage, or staged in
//! workgroup memory as `f16` or `vec4<f16>` arrays, the last also double-buffered with the
//! next tiles prefetched: `coopLoad`'s stride counts the pointer's elements, so from a
//! `vec4<f16>` array it is in vectors), then an f32-grade GEMM of f16 hi/lo planes (three
//! products) with its error against f64.
//!
//! `cargo run --release --example wgpu_coop_probe [-- --wgsl DIR | --speed]` (the adapter must
//! offer `EXPERIMENTAL_COOPERATIVE_MATRIX` and `SHADER_F16`; `--wgsl` writes the shaders).

use wgpu::util::DeviceExt;

const N: usize = 16;

/// How a case feeds the tiles: straight from storage (one 16x16x16 product, row-major
/// `coopLoadT` or column-major `coopLoad`), or as a matmul kernel does: `subgroups` subgroups
/// each multiplying its 16 rows of A `[16 * subgroups, depth]` by B `[depth, 16]` in steps of
/// 16 deep, both staged row-major in workgroup memory with rows padded by `pad` halves.
#[derive(Clone, Copy)]
struct Case {
    workgroup: bool,
    row_major: bool,
    depth: usize,
    subgroups: usize,
    pad: usize,
}

impl Case {
    fn rows(&self) -> usize {
        N * self.subgroups
    }
}

fn shader(c: Case) -> String {
    let (load, store) = if c.row_major {
        ("coopLoadT", "coopStoreT")
    } else {
        ("coopLoad", "coopStore")
    };
    let head = "enable f16;\nenable wgpu_cooperative_matrix;\n\
         @group(0) @binding(0) var<storage, read> a_in: array<f16>;\n\
         @group(0) @binding(1) var<storage, read> b_in: array<f16>;\n\
         @group(0) @binding(2) var<storage, read> c_in: array<f32>;\n\
         @group(0) @binding(3) var<storage, read_write> c_out: array<f32>;\n";
    if !c.workgroup {
        return format!(
            "{head}@compute @workgroup_size(32)\nfn main() {{\n\
             let a = {load}<coop_mat16x16<f16, A>>(&a_in[0], 16u);\n\
             let b = {load}<coop_mat16x16<f16, B>>(&b_in[0], 16u);\n\
             let c = {load}<coop_mat16x16<f32, C>>(&c_in[0], 16u);\n\
             {store}(coopMultiplyAdd(a, b, c), &c_out[0], 16u);\n}}\n"
        );
    }
    let (k, rows) = (c.depth, c.rows());
    let (sa, sb) = (k + c.pad, N + c.pad);
    let threads = 32 * c.subgroups;
    format!(
        "{head}var<workgroup> sa: array<f16, {la}>;\nvar<workgroup> sb: array<f16, {lb}>;\n\
         @compute @workgroup_size({threads})\n\
         fn main(@builtin(local_invocation_index) i: u32) {{\n\
         for (var j = i; j < {na}u; j += {threads}u) {{ sa[j / {k}u * {sa}u + j % {k}u] = a_in[j]; }}\n\
         for (var j = i; j < {nb}u; j += {threads}u) {{ sb[j / 16u * {sb}u + j % 16u] = b_in[j]; }}\n\
         workgroupBarrier();\n\
         let s = i / 32u;\n\
         var c = coopLoadT<coop_mat16x16<f32, C>>(&c_in[0], 16u);\n\
         for (var kk = 0u; kk < {k}u; kk += 16u) {{\n\
             let a = coopLoadT<coop_mat16x16<f16, A>>(&sa[s * 16u * {sa}u + kk], {sa}u);\n\
             let b = coopLoadT<coop_mat16x16<f16, B>>(&sb[kk * {sb}u], {sb}u);\n\
             c = coopMultiplyAdd(a, b, c);\n\
         }}\n\
         coopStoreT(c, &c_out[s * 256u], 16u);\n}}\n",
        la = rows * sa,
        lb = k * sb,
        na = rows * k,
        nb = k * N,
    )
}

/// C = A B for A `[rows, depth]` and B `[depth, 16]` read as the case reads them: row-major,
/// or column-major (16x16 only: the same memory is then the transpose).
fn expected(a: &[f32], b: &[f32], c: Case) -> Vec<f32> {
    let (k, rows) = (if c.workgroup { c.depth } else { N }, c.rows());
    let at = |m: &[f32], r: usize, col: usize, width: usize| {
        if c.row_major {
            m[r * width + col]
        } else {
            m[col * width + r]
        }
    };
    let mut out = vec![0.0; rows * N];
    for r in 0..rows {
        for col in 0..N {
            let v: f32 = (0..k).map(|i| at(a, r, i, k) * at(b, i, col, N)).sum();
            if c.row_major {
                out[r * N + col] = v;
            } else {
                out[col * N + r] = v;
            }
        }
    }
    out
}

/// The inner positions k whose terms, left out of the product, best explain `got` (greedy):
/// a lost or misplaced column of A / row of B shows as its k.
fn missing_k(a: &[f32], b: &[f32], c: Case, got: &[f32]) -> Vec<usize> {
    let (k, rows) = (c.depth, c.rows());
    let want = expected(a, b, c);
    let mut residual: Vec<f32> = want.iter().zip(got).map(|(w, g)| w - g).collect();
    let norm = |r: &[f32]| r.iter().map(|v| v * v).sum::<f32>();
    let mut left_out = Vec::new();
    for i in 0..k {
        let term: Vec<f32> = (0..rows * N)
            .map(|j| a[j / N * k + i] * b[i * N + j % N])
            .collect();
        let rest: Vec<f32> = residual.iter().zip(&term).map(|(r, t)| r - t).collect();
        if norm(&rest) < norm(&residual) {
            residual = rest;
            left_out.push(i);
        }
    }
    left_out
}

/// `line(i, j)` for every accumulator `c{i}{j}` of a `tm x tn` grid, joined.
fn per_tile(tm: usize, tn: usize, line: impl Fn(usize, usize) -> String) -> String {
    (0..tm)
        .flat_map(|i| (0..tn).map(move |j| (i, j)))
        .map(|(i, j)| line(i, j))
        .collect()
}

/// WGSL declaring the `tm x tn` f32 accumulators `c{i}{j}` at zero (loaded from `z`).
fn accumulators(tm: usize, tn: usize) -> String {
    per_tile(tm, tn, |i, j| {
        format!("var c{i}{j} = coopLoadT<coop_mat16x16<f32, C>>(&z[0], 16u);\n")
    })
}

/// WGSL adding `a{i} b{j}` to every accumulator.
fn multiply_adds(tm: usize, tn: usize) -> String {
    per_tile(tm, tn, |i, j| {
        format!("c{i}{j} = coopMultiplyAdd(a{i}, b{j}, c{i}{j});\n")
    })
}

/// WGSL storing every accumulator into row-major `c` (`n` wide) from row `row0`, column `col0`.
fn store_tiles(tm: usize, tn: usize, row0: &str, col0: &str, n: usize) -> String {
    per_tile(tm, tn, |i, j| {
        format!(
            "coopStoreT(c{i}{j}, &c[({row0} + {r}u) * {n}u + {col0} + {q}u], {n}u);\n",
            r = 16 * i,
            q = 16 * j
        )
    })
}

/// The GEMM shaders' bindings: A and W as `operand` arrays, the zeros `z`, the output `c`.
fn gemm_bindings(operand: &str) -> String {
    let (a, w) = if operand == "f16" {
        ("a", "w")
    } else {
        ("a4", "w4")
    };
    format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n\
         @group(0) @binding(0) var<storage, read> {a}: array<{operand}>;\n\
         @group(0) @binding(1) var<storage, read> {w}: array<{operand}>;\n\
         @group(0) @binding(2) var<storage, read> z: array<f32>;\n\
         @group(0) @binding(3) var<storage, read_write> c: array<f32>;\n"
    )
}

/// `C = A W^T` for f16 A `[m, k]` and W `[n, k]` (an activation and a weight as a linear has
/// them), f32 C, on cooperative matrices read straight from storage: 4 subgroups a workgroup
/// in 2 x 2, each `16 TM x 16 TN` of C (TM x TN accumulators), so a workgroup makes
/// `32 TM x 32 TN`.
fn gemm_shader(k: usize, n: usize, tm: usize, tn: usize) -> String {
    let mut body = accumulators(tm, tn);
    body += &format!("    for (var kk = 0u; kk < {k}u; kk += 16u) {{\n");
    for i in 0..tm {
        body += &format!(
            "        let a{i} = coopLoadT<coop_mat16x16<f16, A>>(&a[(m0 + {r}u) * {k}u + kk], {k}u);\n",
            r = 16 * i
        );
    }
    for j in 0..tn {
        body += &format!(
            "        let b{j} = coopLoad<coop_mat16x16<f16, B>>(&w[(n0 + {r}u) * {k}u + kk], {k}u);\n",
            r = 16 * j
        );
    }
    body += &multiply_adds(tm, tn);
    body += "    }\n";
    body += &store_tiles(tm, tn, "m0", "n0", n);
    format!(
        "{}@compute @workgroup_size(128)\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) i: u32) {{\n\
         let s = i / 32u;\n\
         let m0 = wid.y * {bm}u + (s / 2u) * {sm}u;\n\
         let n0 = wid.x * {bn}u + (s % 2u) * {sn}u;\n{body}}}\n",
        gemm_bindings("f16"),
        bm = 32 * tm,
        bn = 32 * tn,
        sm = 16 * tm,
        sn = 16 * tn,
    )
}

/// `gemm_shader`'s product with a workgroup's A and W tiles staged in workgroup memory:
/// 4 subgroups in 2 x 2, each 64 x 64 of C (4 x 4 accumulators), so a workgroup makes
/// 128 x 128 and reads each A and W value once per workgroup instead of once per subgroup.
/// K steps of `bk` (32 or 64); rows padded by 8 halves (16 bytes). A and W are also bound as u32 words
/// (`a4`, `w4`: one 16-byte load for 8 halves).
/// `vectors`: the staged tiles as `vec4<f16>` arrays (two 8-byte stores a chunk of 8 halves)
/// with `coopLoad`'s stride given in vectors (`Some(true)`) or in halves (`Some(false)`),
/// instead of `f16` arrays filled value by value (`None`).
fn staged_gemm_shader(k: usize, n: usize, vectors: Option<bool>, bk: usize) -> String {
    let ld = bk + 8;
    let (chunks, per) = (128 * bk / 8, bk / 8);
    let h2 = |v: &str| format!("vec2<f16>(unpack2x16float({v}))");
    let fill = match vectors {
        None => format!(
            "for (var e = 0u; e < 4u; e++) {{ let ha = {}; let hw = {}; \
             sa[r * {ld}u + c + 2u * e] = ha.x; sa[r * {ld}u + c + 2u * e + 1u] = ha.y; \
             sw[r * {ld}u + c + 2u * e] = hw.x; sw[r * {ld}u + c + 2u * e + 1u] = hw.y; }}",
            h2("va[e]"),
            h2("vw[e]")
        ),
        Some(_) => format!(
            "let o = (r * {ld}u + c) / 4u; \
             sa[o] = vec4<f16>({}, {}); sa[o + 1u] = vec4<f16>({}, {}); \
             sw[o] = vec4<f16>({}, {}); sw[o + 1u] = vec4<f16>({}, {});",
            h2("va.x"),
            h2("va.y"),
            h2("va.z"),
            h2("va.w"),
            h2("vw.x"),
            h2("vw.y"),
            h2("vw.z"),
            h2("vw.w")
        ),
    };
    // Where a tile row starts and the stride coopLoad is given.
    let (at, stride) = match vectors {
        None => ("", ld),
        Some(true) => (" / 4u", ld / 4),
        Some(false) => (" / 4u", ld),
    };
    let mut body = accumulators(4, 4);
    body += &format!(
        "    for (var k0 = 0u; k0 < {k}u; k0 += {bk}u) {{\n\
         // 128 rows x bk halves of A and of W, in chunks of 8.\n\
         for (var q = t; q < {chunks}u; q += 128u) {{\n\
             let r = q / {per}u; let c = (q % {per}u) * 8u;\n\
             let va = a4[((wm + r) * {k}u + k0 + c) / 8u];\n\
             let vw = w4[((wn + r) * {k}u + k0 + c) / 8u];\n\
             {fill}\n\
         }}\n\
         workgroupBarrier();\n\
         for (var kk = 0u; kk < {bk}u; kk += 16u) {{\n"
    );
    for i in 0..4 {
        body += &format!(
            "        let a{i} = coopLoadT<coop_mat16x16<f16, A>>(&sa[((sm + {r}u) * {ld}u + kk){at}], {stride}u);\n",
            r = 16 * i
        );
    }
    for j in 0..4 {
        body += &format!(
            "        let b{j} = coopLoad<coop_mat16x16<f16, B>>(&sw[((sn + {r}u) * {ld}u + kk){at}], {stride}u);\n",
            r = 16 * j
        );
    }
    body += &multiply_adds(4, 4);
    body += "        }\n        workgroupBarrier();\n    }\n";
    body += &store_tiles(4, 4, "wm + sm", "wn + sn", n);
    format!(
        "{}var<workgroup> sa: array<{ty}, {len}>;\nvar<workgroup> sw: array<{ty}, {len}>;\n\
         @compute @workgroup_size(128)\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {{\n\
         let s = t / 32u;\n\
         let wm = wid.y * 128u; let wn = wid.x * 128u;\n\
         let sm = (s / 2u) * 64u; let sn = (s % 2u) * 64u;\n{body}}}\n",
        gemm_bindings("vec4<u32>"),
        ty = if vectors.is_some() {
            "vec4<f16>"
        } else {
            "f16"
        },
        len = if vectors.is_some() {
            128 * ld / 4
        } else {
            128 * ld
        },
    )
}

/// `staged_gemm_shader`'s `vec4<f16>` staging, K steps of 32, with the next step's tiles read
/// into registers while this step multiplies and stored into a second pair of tiles: one
/// barrier a step, global reads overlapping the products. `k` a multiple of 64.
fn pipelined_gemm_shader(k: usize, n: usize) -> String {
    const LD: usize = 40; // 32 halves a row + 8 of padding
    let h2 = |v: String| format!("vec2<f16>(unpack2x16float({v}))");
    let mut load = String::new();
    let mut store = [String::new(), String::new()];
    for e in 0..4 {
        load += &format!(
            "va{e} = a4[((wm + r{e}) * {k}u + k1 + c{e}) / 8u]; \
             vw{e} = w4[((wn + r{e}) * {k}u + k1 + c{e}) / 8u];\n"
        );
        for (b, st) in store.iter_mut().enumerate() {
            for (m, v) in [("sa", "va"), ("sw", "vw")] {
                *st += &format!(
                    "{m}{b}[o{e}] = vec4<f16>({}, {}); {m}{b}[o{e} + 1u] = vec4<f16>({}, {});\n",
                    h2(format!("{v}{e}.x")),
                    h2(format!("{v}{e}.y")),
                    h2(format!("{v}{e}.z")),
                    h2(format!("{v}{e}.w"))
                );
            }
        }
    }
    let compute = |b: usize| {
        let mut out = String::from("for (var kk = 0u; kk < 32u; kk += 16u) {\n");
        for i in 0..4 {
            out += &format!(
                "let a{i} = coopLoadT<coop_mat16x16<f16, A>>(&sa{b}[((sm + {r}u) * {LD}u + kk) / 4u], {s}u);\n",
                r = 16 * i,
                s = LD / 4
            );
        }
        for j in 0..4 {
            out += &format!(
                "let b{j} = coopLoad<coop_mat16x16<f16, B>>(&sw{b}[((sn + {r}u) * {LD}u + kk) / 4u], {s}u);\n",
                r = 16 * j,
                s = LD / 4
            );
        }
        out + &multiply_adds(4, 4) + "}\n"
    };
    let mut body = accumulators(4, 4);
    for e in 0..4 {
        body += &format!(
            "let r{e} = (t + {q}u) / 4u; let c{e} = ((t + {q}u) % 4u) * 8u; \
             let o{e} = (r{e} * {LD}u + c{e}) / 4u;\nvar va{e}: vec4<u32>; var vw{e}: vec4<u32>;\n",
            q = 128 * e
        );
    }
    body += &format!(
        "var k1 = 0u;\n{load}{st0}workgroupBarrier();\n\
         for (var k0 = 0u; k0 < {k}u; k0 += 64u) {{\n\
         k1 = k0 + 32u;\n{load}{c0}{st1}workgroupBarrier();\n\
         k1 = k0 + 64u;\nif (k1 < {k}u) {{\n{load}}}\n{c1}if (k1 < {k}u) {{\n{st0}}}\nworkgroupBarrier();\n}}\n",
        st0 = store[0],
        st1 = store[1],
        c0 = compute(0),
        c1 = compute(1),
    );
    body += &store_tiles(4, 4, "wm + sm", "wn + sn", n);
    let len = 128 * LD / 4;
    format!(
        "{}var<workgroup> sa0: array<vec4<f16>, {len}>;\nvar<workgroup> sw0: array<vec4<f16>, {len}>;\n\
         var<workgroup> sa1: array<vec4<f16>, {len}>;\nvar<workgroup> sw1: array<vec4<f16>, {len}>;\n\
         @compute @workgroup_size(128)\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {{\n\
         let s = t / 32u;\n\
         let wm = wid.y * 128u; let wn = wid.x * 128u;\n\
         let sm = (s / 2u) * 64u; let sn = (s % 2u) * 64u;\n{body}}}\n",
        gemm_bindings("vec4<u32>")
    )
}

/// The device and queue, with the few things both runs do with them.
struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
}

impl Gpu {
    /// A storage buffer holding `contents`.
    fn storage(&self, label: &str, contents: &[u8]) -> wgpu::Buffer {
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage: wgpu::BufferUsages::STORAGE,
            })
    }

    /// A storage buffer of `bytes` that can be read back.
    fn output(&self, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("output"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// `source`'s `main` as a pipeline, with `buffers` bound at 0, 1, ... of group 0.
    fn kernel(&self, source: String, buffers: &[&wgpu::Buffer]) -> Kernel {
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("coop"),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("coop"),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        Kernel { pipeline, group }
    }

    /// `iters` dispatches of `grid` workgroups in one submission; seconds until done.
    fn dispatch(&self, k: &Kernel, grid: (u32, u32), iters: usize) -> Result<f64, String> {
        let mut enc = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&k.pipeline);
            pass.set_bind_group(0, &k.group, &[]);
            for _ in 0..iters {
                pass.dispatch_workgroups(grid.0, grid.1, 1);
            }
        }
        let t = std::time::Instant::now();
        self.queue.submit([enc.finish()]);
        self.wait()?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// TFLOP/s of `flops` a dispatch: the median of 5 timings of 10 dispatches, after 2.
    fn tflops(&self, k: &Kernel, grid: (u32, u32), flops: f64) -> Result<f64, String> {
        self.dispatch(k, grid, 2)?;
        let mut times: Vec<f64> = (0..5)
            .map(|_| self.dispatch(k, grid, 10))
            .collect::<Result<_, _>>()?;
        times.sort_by(f64::total_cmp);
        Ok(flops * 10.0 / times[2] / 1e12)
    }

    fn wait(&self) -> Result<(), String> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| format!("poll: {e}"))
    }

    /// The f32 values of `buf` (an `output`).
    fn read(&self, buf: &wgpu::Buffer) -> Result<Vec<f32>, String> {
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("staging"),
            size: buf.size(),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buf, 0, &staging, 0, buf.size());
        self.queue.submit([enc.finish()]);
        staging.map_async(wgpu::MapMode::Read, .., |_| {});
        self.wait()?;
        let view = staging
            .get_mapped_range(..)
            .map_err(|e| format!("map: {e}"))?;
        Ok(bytemuck::pod_collect_to_vec(&view[..]))
    }
}

/// The 256 output positions the speed runs check, spread over `len`.
fn sampled(len: usize) -> impl Iterator<Item = usize> {
    (0..256).map(move |s| (s * 104_729 + 13) % len)
}

/// A compiled kernel and its bindings.
struct Kernel {
    pipeline: wgpu::ComputePipeline,
    group: wgpu::BindGroup,
}

/// An f32-grade `C = A W^T` on f16 cooperative matrices: A and W arrive as two f16 planes each
/// (every row's high parts scaled by a power of two, then the residuals), and each product sums
/// hi·hi + hi·lo + lo·hi in f32 (the dropped lo·lo is ~2^-22 of a product). A workgroup makes
/// 128 x 64 of C (4 subgroups of 64 x 32: 4 x 2 accumulators), K steps of 32 staged as
/// `vec4<f16>` tiles of both planes (30 KB), the next step read into registers during this
/// step's products. C is left scaled (the host divides by the rows' scales).
fn split_gemm_shader(m: usize, k: usize, n: usize) -> String {
    const LD: usize = 40;
    let h2 = |v: String| format!("vec2<f16>(unpack2x16float({v}))");
    // (tile, rows, source, row base, plane size in vec4s) for A's and W's two planes.
    let planes = [
        ("sah", 128, "a4", "wm", 0),
        ("sal", 128, "a4", "wm", m * k / 8),
        ("swh", 64, "w4", "wn", 0),
        ("swl", 64, "w4", "wn", n * k / 8),
    ];
    let (mut load, mut store, mut decl) = (String::new(), String::new(), String::new());
    for (p, &(tile, rows, src, base, plane)) in planes.iter().enumerate() {
        decl += &format!(
            "var<workgroup> {tile}: array<vec4<f16>, {}>;\n",
            rows * LD / 4
        );
        for e in 0..rows / 32 {
            let q = format!("(t + {}u)", 128 * e);
            load += &format!(
                "v{p}_{e} = {src}[{plane}u + (({base} + {q} / 4u) * {k}u + k1 + ({q} % 4u) * 8u) / 8u];\n"
            );
            store += &format!(
                "{tile}[({q} / 4u * {LD}u + ({q} % 4u) * 8u) / 4u] = vec4<f16>({}, {}); \
                 {tile}[({q} / 4u * {LD}u + ({q} % 4u) * 8u) / 4u + 1u] = vec4<f16>({}, {});\n",
                h2(format!("v{p}_{e}.x")),
                h2(format!("v{p}_{e}.y")),
                h2(format!("v{p}_{e}.z")),
                h2(format!("v{p}_{e}.w"))
            );
            decl += &format!("var<private> v{p}_{e}: vec4<u32>;\n");
        }
    }
    let mut compute = String::from("for (var kk = 0u; kk < 32u; kk += 16u) {\n");
    for i in 0..4 {
        for (plane, tile) in [("h", "sah"), ("l", "sal")] {
            compute += &format!(
                "let a{plane}{i} = coopLoadT<coop_mat16x16<f16, A>>(&{tile}[((sm + {r}u) * {LD}u + kk) / 4u], {s}u);\n",
                r = 16 * i,
                s = LD / 4
            );
        }
    }
    for j in 0..2 {
        for (plane, tile) in [("h", "swh"), ("l", "swl")] {
            compute += &format!(
                "let b{plane}{j} = coopLoad<coop_mat16x16<f16, B>>(&{tile}[((sn + {r}u) * {LD}u + kk) / 4u], {s}u);\n",
                r = 16 * j,
                s = LD / 4
            );
        }
    }
    compute += &per_tile(4, 2, |i, j| {
        format!(
            "c{i}{j} = coopMultiplyAdd(ah{i}, bl{j}, c{i}{j}); \
             c{i}{j} = coopMultiplyAdd(al{i}, bh{j}, c{i}{j}); \
             c{i}{j} = coopMultiplyAdd(ah{i}, bh{j}, c{i}{j});\n"
        )
    });
    compute += "}\n";
    let mut body = accumulators(4, 2);
    body += &format!(
        "var k1 = 0u;\n{load}{store}workgroupBarrier();\n\
         for (var k0 = 0u; k0 < {k}u; k0 += 32u) {{\n\
         k1 = k0 + 32u;\nif (k1 < {k}u) {{\n{load}}}\n{compute}workgroupBarrier();\n\
         if (k1 < {k}u) {{\n{store}}}\nworkgroupBarrier();\n}}\n"
    );
    body += &store_tiles(4, 2, "wm + sm", "wn + sn", n);
    format!(
        "{}{decl}@compute @workgroup_size(128)\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {{\n\
         let s = t / 32u;\n\
         let wm = wid.y * 128u; let wn = wid.x * 64u;\n\
         let sm = (s / 2u) * 64u; let sn = (s % 2u) * 32u;\n{body}}}\n",
        gemm_bindings("vec4<u32>")
    )
}

/// An f32 matrix as f16 planes for `split_gemm_shader`: each row scaled by the power of two that
/// puts its largest magnitude in [1, 2), then the high parts of every row and the residuals of
/// every row; and the scales.
fn split_rows(x: &[f32], cols: usize) -> (Vec<half::f16>, Vec<f32>) {
    let rows = x.len() / cols;
    let mut planes = vec![half::f16::ZERO; 2 * x.len()];
    let mut scales = Vec::with_capacity(rows);
    for (r, row) in x.chunks(cols).enumerate() {
        let max = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = if max > 0.0 {
            (2.0f32).powi(-max.log2().floor() as i32)
        } else {
            1.0
        };
        for (c, &v) in row.iter().enumerate() {
            let hi = half::f16::from_f32(v * scale);
            planes[r * cols + c] = hi;
            planes[x.len() + r * cols + c] = half::f16::from_f32(v * scale - hi.to_f32());
        }
        scales.push(scale);
    }
    (planes, scales)
}

/// Times `split_gemm_shader` on 4096^3 f32 operands of mixed magnitudes and measures its error
/// on sampled outputs against f64, beside an f32 dot product's (summed in order) on the host.
fn split_gemm_speed(gpu: &Gpu) -> Result<(), String> {
    let (m, n, k) = (4096usize, 4096usize, 4096usize);
    // Normal-ish values spread over several binades, different per row.
    let val = |i: usize, seed: u64| {
        let h = (i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let u = (h >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
        (u * (1.0 + ((h >> 3) % 7) as f64)) as f32
    };
    let a: Vec<f32> = (0..m * k).map(|i| val(i, 1)).collect();
    let w: Vec<f32> = (0..n * k).map(|i| val(i, 2) * 0.01).collect();
    let (ap, sa) = split_rows(&a, k);
    let (wp, sw) = split_rows(&w, k);
    let a_buf = gpu.storage("a planes", bytemuck::cast_slice(&ap));
    let w_buf = gpu.storage("w planes", bytemuck::cast_slice(&wp));
    let z_buf = gpu.storage("z", &[0u8; 1024]);
    let c_buf = gpu.output((m * n * 4) as u64);
    let kernel = gpu.kernel(
        split_gemm_shader(m, k, n),
        &[&a_buf, &w_buf, &z_buf, &c_buf],
    );
    let grid = ((n / 64) as u32, (m / 128) as u32);
    let tflops = gpu.tflops(&kernel, grid, 2.0 * (m * n * k) as f64)?;
    let got = gpu.read(&c_buf)?;
    // Errors relative to sum |a w| (the scale every f32 summation error is measured against).
    let (mut split, mut f32_seq) = (0.0f64, 0.0f64);
    for i in sampled(m * n) {
        let (r, col) = (i / n, i % n);
        let (ar, wr) = (&a[r * k..(r + 1) * k], &w[col * k..(col + 1) * k]);
        let exact: f64 = ar.iter().zip(wr).map(|(&x, &y)| x as f64 * y as f64).sum();
        let size: f64 = ar
            .iter()
            .zip(wr)
            .map(|(&x, &y)| (x as f64 * y as f64).abs())
            .sum();
        let seq: f32 = ar.iter().zip(wr).fold(0.0f32, |acc, (&x, &y)| acc + x * y);
        let g = got[i] as f64 / (sa[r] as f64 * sw[col] as f64);
        split = split.max((g - exact).abs() / size);
        f32_seq = f32_seq.max((seq as f64 - exact).abs() / size);
    }
    println!(
        "f32-grade split GEMM {m}x{n}x{k} (3 f16 products, 128 x 64 tiles): {tflops:.1} TFLOP/s \
         (median of 5 x 10); max error / sum|a w| on 256 sampled outputs {split:.2e} \
         (an f32 dot product summed in order: {f32_seq:.2e})"
    );
    Ok(())
}

/// Times `gemm_shader` on 4096^3 for a few accumulator shapes and checks sampled outputs
/// exactly (small integers).
fn gemm_speed(gpu: &Gpu) -> Result<(), String> {
    let (m, n, k) = (4096usize, 4096usize, 4096usize);
    let val = |i: usize, mul: usize| ((i * mul + 7) % 5) as f32 - 2.0;
    let a: Vec<half::f16> = (0..m * k)
        .map(|i| half::f16::from_f32(val(i, 31)))
        .collect();
    let w: Vec<half::f16> = (0..n * k)
        .map(|i| half::f16::from_f32(val(i, 17)))
        .collect();
    let a_buf = gpu.storage("a", bytemuck::cast_slice(&a));
    let w_buf = gpu.storage("w", bytemuck::cast_slice(&w));
    let z_buf = gpu.storage("z", &[0u8; 1024]);
    let c_buf = gpu.output((m * n * 4) as u64);
    println!("f16 GEMM {m}x{n}x{k} on cooperative matrices, f32 accumulation:");
    // (TM, TN) of gemm_shader, or (0, v) for staged_gemm_shader (a workgroup 128 x 128) with
    // f16 arrays (v = 0), vec4<f16> arrays and strides in vectors (1) or in halves (2), K
    // steps of 32, or of 64 (v = 3: vec4<f16>, strides in vectors); (5, 5):
    // pipelined_gemm_shader.
    for (tm, tn) in [
        (1, 1),
        (2, 2),
        (4, 4),
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (5, 5),
    ] {
        let vectors = [None, Some(true), Some(false), Some(true)][tn % 4];
        let bk = if tn == 3 { 64 } else { 32 };
        let (source, (bm, bn)) = match tm {
            0 => (staged_gemm_shader(k, n, vectors, bk), (128, 128)),
            5 => (pipelined_gemm_shader(k, n), (128, 128)),
            _ => (gemm_shader(k, n, tm, tn), (32 * tm, 32 * tn)),
        };
        let kernel = gpu.kernel(source, &[&a_buf, &w_buf, &z_buf, &c_buf]);
        let grid = ((n / bn) as u32, (m / bm) as u32);
        let tflops = gpu.tflops(&kernel, grid, 2.0 * (m * n * k) as f64)?;
        // Sampled outputs against the host's exact sums.
        let got = gpu.read(&c_buf)?;
        let wrong = sampled(m * n)
            .filter(|&i| {
                let (r, col) = (i / n, i % n);
                let want: f32 = (0..k)
                    .map(|j| a[r * k + j].to_f32() * w[col * k + j].to_f32())
                    .sum();
                got[i] != want
            })
            .count();
        let kind = match tm {
            5 => "4 x 4, vec4<f16>, next step's tiles prefetched".to_string(),
            0 => match vectors {
                None => format!("4 x 4, staged as f16, K steps of {bk}"),
                Some(true) => format!("4 x 4, staged as vec4<f16>, K steps of {bk}"),
                Some(false) => format!("4 x 4, vec4<f16>, stride in halves, K {bk}"),
            },
            _ => format!("{tm} x {tn} accumulators, from storage"),
        };
        println!(
            "  {kind:48}: {tflops:7.1} TFLOP/s (median of 5 x 10), {wrong} of 256 sampled outputs wrong"
        );
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Every case, in the order they run.
fn cases() -> Vec<Case> {
    let plain = |row_major| Case {
        workgroup: false,
        row_major,
        depth: N,
        subgroups: 1,
        pad: 0,
    };
    let mut cases = vec![plain(true), plain(false)];
    for (depth, subgroups) in [(16, 1), (32, 1), (32, 4), (64, 4)] {
        for pad in [0, 4, 8] {
            cases.push(Case {
                workgroup: true,
                row_major: true,
                depth,
                subgroups,
                pad,
            });
        }
    }
    cases
}

fn run() -> Result<(), String> {
    // `--wgsl DIR` writes each case's shader there (for a bug report) and stops.
    let args: Vec<String> = std::env::args().collect();
    if let Some(dir) = args
        .iter()
        .position(|a| a == "--wgsl")
        .map(|i| args.get(i + 1))
    {
        let dir = dir.ok_or("--wgsl needs a folder")?;
        for (i, c) in cases().into_iter().enumerate() {
            let path = format!("{dir}/case{i}.wgsl");
            std::fs::write(&path, shader(c)).map_err(|e| format!("{path}: {e}"))?;
        }
        let path = format!("{dir}/gemm.wgsl");
        std::fs::write(&path, gemm_shader(4096, 4096, 2, 4)).map_err(|e| format!("{path}: {e}"))?;
        let path = format!("{dir}/gemm_split.wgsl");
        std::fs::write(&path, split_gemm_shader(4096, 4096, 4096))
            .map_err(|e| format!("{path}: {e}"))?;
        let path = format!("{dir}/gemm_pipelined.wgsl");
        std::fs::write(&path, pipelined_gemm_shader(4096, 4096))
            .map_err(|e| format!("{path}: {e}"))?;
        let path = format!("{dir}/gemm_staged.wgsl");
        std::fs::write(&path, staged_gemm_shader(4096, 4096, Some(true), 64))
            .map_err(|e| format!("{path}: {e}"))?;
        return Ok(());
    }
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::PRIMARY;
    let instance = wgpu::Instance::new(desc.with_env());
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    }))
    .map_err(|e| format!("no adapter: {e}"))?;
    let info = adapter.get_info();
    println!(
        "adapter: {} ({:?}, driver {})",
        info.name, info.backend, info.driver_info
    );
    for p in adapter.cooperative_matrix_properties() {
        println!(
            "  offers {}x{}x{} {:?} -> {:?}",
            p.m_size, p.n_size, p.k_size, p.ab_type, p.cr_type
        );
    }
    let want = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
    if !adapter.features().contains(want) {
        return Err(format!(
            "{} lacks {:?}",
            info.name,
            want - adapter.features()
        ));
    }
    // SAFETY: a test program; wgpu's experimental cooperative matrices are what it tests.
    let experimental = unsafe { wgpu::ExperimentalFeatures::enabled() };
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("coop probe"),
        required_features: want,
        required_limits: adapter.limits(),
        experimental_features: experimental,
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }))
    .map_err(|e| format!("device: {e}"))?;

    let gpu = Gpu { device, queue };
    if args.iter().any(|a| a == "--speed") {
        gemm_speed(&gpu)?;
        return split_gemm_speed(&gpu);
    }
    // Small integers, different in every position, so a lost or moved value shows.
    // The largest case's A and B (each case reads their first values).
    let a: Vec<f32> = (0..64 * 64)
        .map(|i| ((i * 37 + 11) % 7) as f32 - 3.0)
        .collect();
    let b: Vec<f32> = (0..64 * N)
        .map(|i| ((i * 13 + 5) % 9) as f32 - 4.0)
        .collect();
    let halves = |v: &[f32]| -> Vec<u8> {
        let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
        bytemuck::cast_slice(&h).to_vec()
    };
    let a_buf = gpu.storage("a", &halves(&a));
    let b_buf = gpu.storage("b", &halves(&b));
    let c_buf = gpu.storage("c", &vec![0u8; 64 * N * 4]);

    println!(
        "source     depth subgroups pad  layout        max |err|  wrong  first wrong (row, col)"
    );
    let mut failed = 0;
    for case in cases() {
        let out = gpu.output((case.rows() * N * 4) as u64);
        let kernel = gpu.kernel(shader(case), &[&a_buf, &b_buf, &c_buf, &out]);
        gpu.dispatch(&kernel, (1, 1), 1)?;
        let got = gpu.read(&out)?;
        let want = expected(&a, &b, case);
        let wrong: Vec<usize> = (0..want.len()).filter(|&i| got[i] != want[i]).collect();
        let max = (0..want.len())
            .map(|i| (got[i] - want[i]).abs())
            .fold(0.0f32, f32::max);
        let first = wrong.first().map_or(String::new(), |&i| {
            format!("({}, {}): {} for {}", i / N, i % N, got[i], want[i])
        });
        println!(
            "{:10} {:5} {:9} {:3}  {:12} {:10.3e}  {:5}  {first}",
            if case.workgroup {
                "workgroup"
            } else {
                "storage"
            },
            case.depth,
            case.subgroups,
            case.pad,
            if case.row_major {
                "row-major"
            } else {
                "column-major"
            },
            max,
            wrong.len()
        );
        if !wrong.is_empty() && case.row_major {
            println!(
                "           as if these k were left out: {:?}",
                missing_k(&a, &b, case, &got)
            );
        }
        failed += usize::from(!wrong.is_empty());
    }
    if failed > 0 {
        return Err(format!("{failed} case(s) gave wrong products"));
    }
    println!("every case exact");
    Ok(())
}
