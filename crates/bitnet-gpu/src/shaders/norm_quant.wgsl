// y = RMS(x, w) (docs/MODEL.md), then BitNet's per-token int8 quantization of y
// (docs/FORMATS.md §1): m = max(1e-5, max|y|), s = 127 / m, q = clamp(round_half_even(y·s));
// a row with a NaN gets s = NaN (common.wgsl's `quant_scale`).
// One workgroup per token row; codes packed four to a u32 (little-endian bytes). The row
// scale is norm_common.wgsl's.
@group(0) @binding(4) var<storage, read_write> xq: array<u32>;
@group(0) @binding(5) var<storage, read_write> xs: array<f32>;

// The largest |y| of the row as bits (`quant_scale`'s argument).
var<workgroup> redm: array<u32, WG>;

// The maximum of every thread's `v`, for the whole workgroup.
fn tree_max_bits(lid: u32, v: u32) -> u32 {
    redm[lid] = v;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid < k {
            redm[lid] = max(redm[lid], redm[lid + k]);
        }
        workgroupBarrier();
    }
    let r = redm[0];
    workgroupBarrier();
    return r;
}

// PV, the vec4s a thread holds in registers on the fast path (rows of up to 4 · WG · PV
// values), is defined in front of this file with WG.

fn tree_sum(lid: u32) -> f32 {
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid < k {
            red[lid] += red[lid + k];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// The same row with each thread's values read once, four consecutive ones at a time, and
// kept in registers for the three steps (sum of squares, maximum, quantization).
fn fast_row(row: u32, base: u32, lid: u32) {
    let words = dims.width / 4u;
    var xv: array<vec4<f32>, PV>;
    var wv: array<vec4<f32>, PV>;
    var ss = 0.0;
    for (var k = 0u; k < PV; k++) {
        let j = lid + k * WG;
        if j < words {
            let i = base + 4u * j;
            xv[k] = vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
            wv[k] = vec4<f32>(w[4u * j], w[4u * j + 1u], w[4u * j + 2u], w[4u * j + 3u]);
            ss += dot(xv[k], xv[k]);
        }
    }
    red[lid] = ss;
    var scale = 1.0 / sqrt(tree_sum(lid) / f32(dims.width) + dims.eps);
    if dims.plain != 0u {
        scale = 1.0;
    }
    var m = 0u;
    for (var k = 0u; k < PV; k++) {
        if lid + k * WG < words {
            let y = bitcast<vec4<u32>>((xv[k] * scale) * wv[k]) & vec4<u32>(0x7fffffffu);
            m = max(m, max(max(y.x, y.y), max(y.z, y.w)));
        }
    }
    let s = quant_scale(tree_max_bits(lid, m));
    for (var k = 0u; k < PV; k++) {
        let j = lid + k * WG;
        if j < words {
            let q = vec4<i32>(clamp(round(((xv[k] * scale) * wv[k]) * s), vec4<f32>(-128.0), vec4<f32>(127.0)));
            let b = bitcast<vec4<u32>>(q) & vec4<u32>(0xffu);
            xq[row * words + j] = b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
        }
    }
    if lid == 0u {
        xs[row] = s;
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wg.x;
    if row >= step.n_tok {
        return;
    }
    let base = row * dims.width;
    if dims.width <= 4u * WG * PV {
        fast_row(row, base, lid.x);
        return;
    }
    let scale = rms_scale(base, lid.x);
    var m = 0u;
    for (var i = lid.x; i < dims.width; i += WG) {
        m = max(m, bitcast<u32>((x[base + i] * scale) * w[i]) & 0x7fffffffu);
    }
    let s = quant_scale(tree_max_bits(lid.x, m));
    let words = dims.width / 4u;
    for (var j = lid.x; j < words; j += WG) {
        var packed = 0u;
        for (var b = 0u; b < 4u; b++) {
            let i = 4u * j + b;
            let y = (x[base + i] * scale) * w[i];
            let q = i32(clamp(round(y * s), -128.0, 127.0));
            packed |= (bitcast<u32>(q) & 0xffu) << (8u * b);
        }
        xq[row * words + j] = packed;
    }
    if lid.x == 0u {
        xs[row] = s;
    }
}
