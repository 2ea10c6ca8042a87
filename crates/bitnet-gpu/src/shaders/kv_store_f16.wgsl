// The new rows' K and V into an f16 cache at positions pos0.. (rounded to nearest even, two
// halves per word), in one dispatch: workgroup t stores row t of both.
struct Dims {
    // n_head_kv · head_dim (even)
    kv: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> kc: array<u32>;
@group(0) @binding(5) var<storage, read_write> vc: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wg.x;
    if t >= step.n_tok {
        return;
    }
    let words = dims.kv / 2u;
    let src = t * dims.kv;
    let dst = (step.pos0 + t) * words;
    for (var j = lid.x; j < words; j += 256u) {
        kc[dst + j] = pack2x16float(vec2<f32>(k[src + 2u * j], k[src + 2u * j + 1u]));
        vc[dst + j] = pack2x16float(vec2<f32>(v[src + 2u * j], v[src + 2u * j + 1u]));
    }
}
