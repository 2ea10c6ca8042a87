// The f32 cache for attention.wgsl.
@group(0) @binding(3) var<storage, read> kc: array<f32>;
@group(0) @binding(4) var<storage, read> vc: array<f32>;

fn k_at(i: u32) -> f32 {
    return kc[i];
}

fn v_at(i: u32) -> f32 {
    return vc[i];
}

// Σ qs[i]·K[ko + i] over a head, in the same order as one element at a time.
fn k_dot(ko: u32, d: u32) -> f32 {
    var dot = 0.0;
    for (var i = 0u; i < d; i++) {
        dot += qs[i] * kc[ko + i];
    }
    return dot;
}

fn v_pair(at: u32) -> vec2<f32> {
    return vec2<f32>(vc[at], vc[at + 1u]);
}
