// y = RMS(x, w) (docs/MODEL.md), then BitNet's per-token int8 quantization of y
// (docs/FORMATS.md §1): m = max(1e-5, max|y|), s = 127 / m, q = clamp(round_half_even(y·s)).
// One workgroup per token row; codes packed four to a u32 (little-endian bytes). The row
// scale is norm_common.wgsl's.
@group(0) @binding(4) var<storage, read_write> xq: array<u32>;
@group(0) @binding(5) var<storage, read_write> xs: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wg.x;
    if row >= step.n_tok {
        return;
    }
    let base = row * dims.width;
    let scale = rms_scale(base, lid.x);
    var m = 0.0;
    for (var i = lid.x; i < dims.width; i += WG) {
        m = max(m, abs((x[base + i] * scale) * w[i]));
    }
    red[lid.x] = m;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid.x < k {
            red[lid.x] = max(red[lid.x], red[lid.x + k]);
        }
        workgroupBarrier();
    }
    let s = 127.0 / max(red[0], 1e-5);
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
