// rope.wgsl's cache store for an f16 cache: a head's K and V rows rounded to f16 (nearest
// even), two halves per word, element 2j in the low half (the CPU's f16 cache order).
@group(0) @binding(7) var<storage, read_write> kc: array<u32>;
@group(0) @binding(8) var<storage, read_write> vc: array<u32>;

// Elements src.. of k and v (one head) to elements dst.. of the cache (dst, src and the head
// size even).
fn store_head(dst: u32, src: u32, lid: u32) {
    for (var j = lid; j < dims.head_dim / 2u; j += 64u) {
        kc[dst / 2u + j] = pack2x16float(vec2<f32>(k[src + 2u * j], k[src + 2u * j + 1u]));
        vc[dst / 2u + j] = pack2x16float(vec2<f32>(v[src + 2u * j], v[src + 2u * j + 1u]));
    }
}
