// RoPE in place on the Q and K rows: NeoX (dim i pairs with i + n_rot/2) or, with `normal`,
// llama.cpp's mode 0 (dim 2i pairs with 2i + 1); dims past n_rot pass. cos/sin come from the
// table the CPU builds (the same values as its forward pass; both styles use angle i).
// In the same dispatch, each KV head's workgroup then stores its rotated K head and its V head
// into the cache at position pos0 + t (call row t is activation row row0 + t), through `store_head` of the prelude in front of this
// file (rope_store_f16.wgsl rounds to f16, rope_store_f32.wgsl copies).
struct Dims {
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    half: u32,
    normal: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read_write> k: array<f32>;
// [pos][half] cos, then [pos][half] sin after n_ctx·half values
@group(0) @binding(4) var<storage, read> table: array<f32>;
@group(0) @binding(5) var<uniform> ctx: vec4<u32>;
@group(0) @binding(6) var<storage, read> v: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wg.x;
    let hh = wg.y;
    let pos = step.pos0 + t;
    let tb = pos * dims.half;
    let sin_off = ctx.x * dims.half;
    for (var i = lid.x; i < dims.half; i += 64u) {
        let c = table[tb + i];
        let s = table[sin_off + tb + i];
        // the pair's two dims within the head
        var i0 = i;
        var i1 = i + dims.half;
        if dims.normal != 0u {
            i0 = 2u * i;
            i1 = 2u * i + 1u;
        }
        if hh < dims.n_head {
            let o = ((step.row0 + t) * dims.n_head + hh) * dims.head_dim;
            let x0 = q[o + i0];
            let x1 = q[o + i1];
            q[o + i0] = x0 * c - x1 * s;
            q[o + i1] = x0 * s + x1 * c;
        } else {
            let o = ((step.row0 + t) * dims.n_head_kv + (hh - dims.n_head)) * dims.head_dim;
            let x0 = k[o + i0];
            let x1 = k[o + i1];
            k[o + i0] = x0 * c - x1 * s;
            k[o + i1] = x0 * s + x1 * c;
        }
    }
    if hh >= dims.n_head {
        // The head's rotated K (written above by other threads of this workgroup) and its V.
        storageBarrier();
        let kv = dims.n_head_kv * dims.head_dim;
        let src = (step.row0 + t) * kv + (hh - dims.n_head) * dims.head_dim;
        store_head(pos * kv + (hh - dims.n_head) * dims.head_dim, src, lid.x);
    }
}
