// rope.wgsl's cache store for an f32 cache: a head's K and V rows as they are.
@group(0) @binding(7) var<storage, read_write> kc: array<f32>;
@group(0) @binding(8) var<storage, read_write> vc: array<f32>;

// Elements src.. of k and v (one head) to elements dst.. of the cache.
fn store_head(dst: u32, src: u32, lid: u32) {
    for (var j = lid; j < dims.head_dim; j += 64u) {
        kc[dst + j] = k[src + j];
        vc[dst + j] = v[src + j];
    }
}
