// The final norm: y[r] = RMS(x[out_first + r], w) for the rows whose logits are wanted.
struct Dims {
    width: u32,
    eps: f32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const WG: u32 = 256u;
var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let src = (step.out_first + wg.x) * dims.width;
    let dst = wg.x * dims.width;
    var ss = 0.0;
    for (var i = lid.x; i < dims.width; i += WG) {
        let v = x[src + i];
        ss += v * v;
    }
    red[lid.x] = ss;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid.x < k {
            red[lid.x] += red[lid.x + k];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(red[0] / f32(dims.width) + dims.eps);
    for (var i = lid.x; i < dims.width; i += WG) {
        y[dst + i] = (x[src + i] * scale) * w[i];
    }
}
