// The Q8_0 cache for attention.wgsl: per position, its kv = n_head_kv·head_dim codes (four a
// word, element e at byte e % 4 of word e / 4) then its kv / 32 block scales (f32 bits), as
// rope_store_q8.wgsl writes them; the CPU's Q8_0 cache holds the same codes and scales.
@group(0) @binding(3) var<storage, read> kc: array<u32>;
@group(0) @binding(4) var<storage, read> vc: array<u32>;

// Element i of the cache (position i / kv, element i % kv): its code's word, its block's
// scale word, and its byte in the code word.
fn q8_loc(i: u32) -> vec3<u32> {
    let kv = dims.n_head_kv * dims.head_dim;
    let p = i / kv;
    let e = i - p * kv;
    let base = p * (kv / 4u + kv / 32u);
    return vec3<u32>(base + e / 4u, base + kv / 4u + e / 32u, e % 4u);
}

fn k_at(i: u32) -> f32 {
    let l = q8_loc(i);
    return i8_at(kc[l.x], l.z) * bitcast<f32>(kc[l.y]);
}

fn v_at(i: u32) -> f32 {
    let l = q8_loc(i);
    return i8_at(vc[l.x], l.z) * bitcast<f32>(vc[l.y]);
}

// Σ qs[i]·K[ko + i] over a head (a whole number of blocks): each block's codes dotted, then
// scaled once.
fn k_dot(ko: u32, d: u32) -> f32 {
    // The head's first code word and first scale word (ko starts a block).
    let l = q8_loc(ko);
    var dot = 0.0;
    for (var b = 0u; b < d / 32u; b++) {
        var part = 0.0;
        for (var k = 0u; k < 8u; k++) {
            let w = kc[l.x + 8u * b + k];
            let i = 32u * b + 4u * k;
            part += qs[i] * i8_at(w, 0u) + qs[i + 1u] * i8_at(w, 1u) + qs[i + 2u] * i8_at(w, 2u) + qs[i + 3u] * i8_at(w, 3u);
        }
        dot += part * bitcast<f32>(kc[l.y + b]);
    }
    return dot;
}

// V[at] and V[at + 1] (at even).
fn v_pair(at: u32) -> vec2<f32> {
    let l = q8_loc(at);
    let w = vc[l.x];
    return vec2<f32>(i8_at(w, l.z), i8_at(w, l.z + 1u)) * bitcast<f32>(vc[l.y]);
}
