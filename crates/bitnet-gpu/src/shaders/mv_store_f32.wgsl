// mv_out_rope.wgsl's cache store for an f32 cache: elements e and e + 1 as they are.
@group(0) @binding(7) var<storage, read_write> kc: array<f32>;
@group(0) @binding(8) var<storage, read_write> vc: array<f32>;

fn store_kv(is_v: bool, e: u32, a: f32, b: f32) {
    if is_v {
        vc[e] = a;
        vc[e + 1u] = b;
    } else {
        kc[e] = a;
        kc[e + 1u] = b;
    }
}
