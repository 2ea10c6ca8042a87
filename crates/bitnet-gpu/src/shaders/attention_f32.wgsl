// The f32 cache for attention.wgsl.
@group(0) @binding(3) var<storage, read> kc: array<f32>;
@group(0) @binding(4) var<storage, read> vc: array<f32>;

fn k_at(i: u32) -> f32 {
    return kc[i];
}

fn v_at(i: u32) -> f32 {
    return vc[i];
}
