// The f16 cache for attention.wgsl: two halves per u32 word, element 2j in the low half
// (little-endian order, as the CPU's f16 cache stores them).
@group(0) @binding(3) var<storage, read> kc: array<u32>;
@group(0) @binding(4) var<storage, read> vc: array<u32>;

fn k_at(i: u32) -> f32 {
    let w = unpack2x16float(kc[i >> 1u]);
    return select(w.x, w.y, (i & 1u) == 1u);
}

fn v_at(i: u32) -> f32 {
    let w = unpack2x16float(vc[i >> 1u]);
    return select(w.x, w.y, (i & 1u) == 1u);
}
