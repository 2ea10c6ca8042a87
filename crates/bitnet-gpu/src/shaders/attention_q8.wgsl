// The Q8_0 cache for attention.wgsl: per position, its kv = n_head_kv·head_dim codes (four a
// word, element e at byte e % 4 of word e / 4) then its kv / 32 block scales (f32 bits), as
// rope_store_q8.wgsl writes them; the CPU's Q8_0 cache holds the same codes and scales.
@group(0) @binding(3) var<storage, read> kc: array<u32>;
@group(0) @binding(4) var<storage, read> vc: array<u32>;

// Words of one position's row.
fn q8_row() -> u32 {
    let kv = dims.n_head_kv * dims.head_dim;
    return kv / 4u + kv / 32u;
}

fn k_at(i: u32) -> f32 {
    let kv = dims.n_head_kv * dims.head_dim;
    let p = i / kv;
    let e = i - p * kv;
    let base = p * q8_row();
    return i8_at(kc[base + e / 4u], e % 4u) * bitcast<f32>(kc[base + kv / 4u + e / 32u]);
}

fn v_at(i: u32) -> f32 {
    let kv = dims.n_head_kv * dims.head_dim;
    let p = i / kv;
    let e = i - p * kv;
    let base = p * q8_row();
    return i8_at(vc[base + e / 4u], e % 4u) * bitcast<f32>(vc[base + kv / 4u + e / 32u]);
}

// Σ qs[i]·K[ko + i] over a head (a whole number of blocks): each block's codes dotted, then
// scaled once.
fn k_dot(ko: u32, d: u32) -> f32 {
    let kv = dims.n_head_kv * dims.head_dim;
    let p = ko / kv;
    let e0 = ko - p * kv;
    let base = p * q8_row();
    var dot = 0.0;
    for (var b = 0u; b < d / 32u; b++) {
        var part = 0.0;
        for (var k = 0u; k < 8u; k++) {
            let w = kc[base + e0 / 4u + 8u * b + k];
            let i = 32u * b + 4u * k;
            part += qs[i] * i8_at(w, 0u) + qs[i + 1u] * i8_at(w, 1u) + qs[i + 2u] * i8_at(w, 2u) + qs[i + 3u] * i8_at(w, 3u);
        }
        dot += part * bitcast<f32>(kc[base + kv / 4u + e0 / 32u + b]);
    }
    return dot;
}

// V[at] and V[at + 1] (at even).
fn v_pair(at: u32) -> vec2<f32> {
    let kv = dims.n_head_kv * dims.head_dim;
    let p = at / kv;
    let e = at - p * kv;
    let base = p * q8_row();
    let w = vc[base + e / 4u];
    let s = bitcast<f32>(vc[base + kv / 4u + e / 32u]);
    return vec2<f32>(i8_at(w, e % 4u), i8_at(w, e % 4u + 1u)) * s;
}
