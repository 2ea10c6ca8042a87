// rope.wgsl's cache store for a Q8_0 cache (attention_q8.wgsl's layout): a head's K and V
// rows quantized per 32 as the CPU's Q8_0 cache quantizes them (common.wgsl's `q8_inv`,
// `q8_code`), one thread a block.
@group(0) @binding(7) var<storage, read_write> kc: array<u32>;
@group(0) @binding(8) var<storage, read_write> vc: array<u32>;

fn kv_src(is_v: bool, i: u32) -> f32 {
    if is_v {
        return v[i];
    }
    return k[i];
}

// Elements src.. of k and v (one head) to elements dst.. of the cache (dst, src and the head
// size multiples of 32).
fn store_head(dst: u32, src: u32, lid: u32) {
    let kv = dims.n_head_kv * dims.head_dim;
    let p = dst / kv;
    let e0 = dst - p * kv;
    let base = p * (kv / 4u + kv / 32u);
    let nb = dims.head_dim / 32u;
    for (var j = lid; j < 2u * nb; j += 64u) {
        let is_v = j >= nb;
        let b = j % nb;
        let s0 = src + 32u * b;
        var m = 0u;
        for (var i = 0u; i < 32u; i++) {
            m = max(m, bitcast<u32>(abs(kv_src(is_v, s0 + i))));
        }
        let q = q8_inv(m);
        for (var k = 0u; k < 8u; k++) {
            var word = 0u;
            for (var i = 0u; i < 4u; i++) {
                word |= q8_code(kv_src(is_v, s0 + 4u * k + i) * q.y) << (8u * i);
            }
            let at = base + e0 / 4u + 8u * b + k;
            if is_v {
                vc[at] = word;
            } else {
                kc[at] = word;
            }
        }
        let at = base + kv / 4u + e0 / 32u + b;
        if is_v {
            vc[at] = bitcast<u32>(q.x);
        } else {
            kc[at] = bitcast<u32>(q.x);
        }
    }
}
