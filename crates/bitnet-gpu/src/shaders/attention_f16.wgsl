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

// Σ qs[i]·K[ko + i] over a head (ko even): eight halves per vec4 load where the head size
// allows (ko and d multiples of 8), so a position's row takes d / 8 loads.
fn k_dot(ko: u32, d: u32) -> f32 {
    var dot = 0.0;
    if (d % 8u) == 0u && (ko % 8u) == 0u {
        let w0 = ko / 2u;
        for (var i = 0u; i < d; i += 8u) {
            let w = vec4<u32>(kc[w0 + i / 2u], kc[w0 + i / 2u + 1u], kc[w0 + i / 2u + 2u], kc[w0 + i / 2u + 3u]);
            let a = unpack2x16float(w.x);
            let b = unpack2x16float(w.y);
            let c = unpack2x16float(w.z);
            let e = unpack2x16float(w.w);
            dot += qs[i] * a.x;
            dot += qs[i + 1u] * a.y;
            dot += qs[i + 2u] * b.x;
            dot += qs[i + 3u] * b.y;
            dot += qs[i + 4u] * c.x;
            dot += qs[i + 5u] * c.y;
            dot += qs[i + 6u] * e.x;
            dot += qs[i + 7u] * e.y;
        }
    } else {
        for (var i = 0u; i < d; i++) {
            dot += qs[i] * k_at(ko + i);
        }
    }
    return dot;
}

// V[vo + i] and V[vo + i + 1] (vo + i even): one load for both.
fn v_pair(at: u32) -> vec2<f32> {
    return unpack2x16float(vc[at >> 1u]);
}
