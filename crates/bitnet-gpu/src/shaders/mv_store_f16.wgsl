// mv_out_rope.wgsl's cache store for an f16 cache: elements e and e + 1 (e even) rounded to
// f16 (nearest even) in one word, e in the low half (rope_store_f16.wgsl's order).
@group(0) @binding(7) var<storage, read_write> kc: array<u32>;
@group(0) @binding(8) var<storage, read_write> vc: array<u32>;

fn store_kv(is_v: bool, e: u32, a: f32, b: f32) {
    let w = pack2x16float(vec2<f32>(a, b));
    if is_v {
        vc[e / 2u] = w;
    } else {
        kc[e / 2u] = w;
    }
}
