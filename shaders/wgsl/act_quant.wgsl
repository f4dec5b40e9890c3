// Input-activation fake quantization of one row per workgroup (numerics.rs ActQuant::apply_row
// with f32 activations), op by op and with correctly rounded divisions so that every value
// lands on the same side of every rounding boundary as the CPU reference.

struct Params {
    rows: u32, cols: u32,
    // 0 = FP8 per token, 1 = FP8 static, 2 = INT per token, 3 = NVFP4 (groups of 16),
    // 4 = FP8 per token and group, 5 = the same as compressed-tensors computes it (identical
    // on f32 activations), 6 = MX (power-of-two scales per 32), 7 = FP8 per token and group
    // under a power-of-two scale (DeepSeek-V4's FP4 experts).
    mode: u32,
    // FP8 static: the scale; NVFP4: the global scale (a divisor); modes 4, 5, 7: the group size;
    // mode 2: the integer bits; mode 6: the element bits (4: E2M1, 8: E4M3).
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

var<workgroup> red: array<f32, 256>;

fn fp8_value(v: f32, s: f32) -> f32 {
    let q = clamp(div_rn(v, s), -448.0, 448.0);
    return round_fp8_e4m3(q) * s;
}

// compressed-tensors' MX scale exponent of a group (numerics.rs mx_scale_exponent).
fn mx_scale_exponent(amax: f32, bits: u32) -> i32 {
    let r = (bitcast<u32>(amax) + (1u << 21u)) & 0x7f800000u;
    var code = 0;
    if (r != 0u) {
        code = clamp(i32(r >> 23u) - select(8, 2, bits == 4u), 0, 255);
    }
    return code - 127;
}

// The smallest power of two at least v, a positive normal f32 (numerics.rs pow2_at_least).
fn pow2_at_least(v: f32) -> f32 {
    let b = bitcast<u32>(v);
    let power = b & 0x7f800000u;
    return bitcast<f32>(select(power + (1u << 23u), power, (b & 0x007fffffu) == 0u));
}

@compute @workgroup_size(256)
fn act_quant(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    // Uniform across the workgroup, so the barriers below are reached by every thread.
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    if (p.mode == 3u) {
        for (var g = lid; g * 16u < p.cols; g = g + 256u) {
            let g0 = base + g * 16u;
            var amax = 0.0;
            for (var i = 0u; i < 16u; i = i + 1u) {
                amax = max(amax, abs(x[g0 + i]));
            }
            var s = round_fp8_e4m3(clamp(p.scale * div_rn(amax, 6.0), -448.0, 448.0));
            if (s == 0.0) {
                s = 0.125;
            }
            let s_eff = div_rn(s, p.scale);
            for (var i = 0u; i < 16u; i = i + 1u) {
                let q = clamp(div_rn(x[g0 + i], s_eff), -6.0, 6.0);
                y[g0 + i] = round_e2m1(q) * s_eff;
            }
        }
        return;
    }
    if (p.mode == 6u) {
        let bits = u32(p.scale);
        let top = select(448.0, 6.0, bits == 4u);
        for (var g = lid; g * 32u < p.cols; g = g + 256u) {
            let c0 = base + g * 32u;
            let n = min(32u, p.cols - g * 32u);
            var amax = 0.0;
            for (var i = 0u; i < n; i = i + 1u) {
                amax = max(amax, abs(x[c0 + i]));
            }
            let e = mx_scale_exponent(amax, bits);
            for (var i = 0u; i < n; i = i + 1u) {
                let v = clamp(ldexp(x[c0 + i], -e), -top, top);
                var q = round_fp8_e4m3(v);
                if (bits == 4u) {
                    q = round_e2m1(v);
                }
                y[c0 + i] = ldexp(q, e);
            }
        }
        return;
    }
    if (p.mode == 4u || p.mode == 5u || p.mode == 7u) {
        let group = u32(p.scale);
        for (var g = lid; g * group < p.cols; g = g + 256u) {
            let c0 = g * group;
            let c1 = min(c0 + group, p.cols);
            var amax = 0.0;
            for (var c = c0; c < c1; c = c + 1u) {
                amax = max(amax, abs(x[base + c]));
            }
            var s = div_rn(amax, 448.0);
            if (p.mode == 7u) {
                s = pow2_at_least(div_rn(max(amax, 1e-4), 448.0));
            }
            for (var c = c0; c < c1; c = c + 1u) {
                if (amax > 0.0 || p.mode == 7u) {
                    y[base + c] = fp8_value(x[base + c], s);
                } else {
                    y[base + c] = x[base + c];
                }
            }
        }
        return;
    }
    var amax = 0.0;
    for (var c = lid; c < p.cols; c = c + 256u) {
        amax = max(amax, abs(x[base + c]));
    }
    red[lid] = amax;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w = w >> 1u) {
        if (lid < w) {
            red[lid] = max(red[lid], red[lid + w]);
        }
        workgroupBarrier();
    }
    amax = red[0];
    if (p.mode == 2u) {
        let hi = ldexp(1.0, i32(p.scale) - 1) - 1.0;
        let lo = -hi - 1.0;
        var s = div_rn(amax, (hi - lo) * 0.5);
        if (s == 0.0) {
            s = 0x1p-23f;
        }
        for (var c = lid; c < p.cols; c = c + 256u) {
            let q = round(clamp(div_rn(x[base + c], s), lo, hi));
            y[base + c] = q * s;
        }
        return;
    }
    var s = p.scale;
    if (p.mode == 0u) {
        s = div_rn(amax, 448.0);
    }
    if (s == 0.0) {
        s = 0x1p-23f;
    }
    for (var c = lid; c < p.cols; c = c + 256u) {
        y[base + c] = fp8_value(x[base + c], s);
    }
}
