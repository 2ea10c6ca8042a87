// The quantized LM head (head_q_common.wgsl): one workgroup per 4 rows × 1 output row, its
// threads over the blocks, a tree reduction (as head.wgsl).

const WG: u32 = TREE_WG;
const RPW: u32 = 4u;

// Σ q_w·q_x of block b of the row at word rb against the codes of the row at word xb.
fn blk(rb: u32, xb: u32, b: u32) -> i32 {
    var s = 0;
    if TY == 2u {
        for (var k = 0u; k < 8u; k++) {
            s += dot4I8Packed(w[rb + 8u * b + k], xq[xb + 8u * b + k]);
        }
    } else {
        // Nibbles 0..15 are the codes + 8: Σ (c − 8)·x = Σ c·x − 8·Σ x.
        var sx = 0;
        for (var k = 0u; k < 4u; k++) {
            let c = w[rb + 4u * b + k];
            let xl = xq[xb + 8u * b + k];
            let xh = xq[xb + 8u * b + 4u + k];
            s += dot4I8Packed(c & 0x0f0f0f0fu, xl) + dot4I8Packed((c >> 4u) & 0x0f0f0f0fu, xh);
            sx += dot4I8Packed(0x01010101u, xl) + dot4I8Packed(0x01010101u, xh);
        }
        s -= 8 * sx;
    }
    return s;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let r0 = wg.x * RPW;
    let t = wg.y;
    if t >= step.out_rows {
        return;
    }
    let nb = dims.n_embd / 32u;
    let xb = t * (dims.n_embd / 4u);
    let stride = row_words();
    var acc = vec4<f32>(0.0);
    for (var rr = 0u; rr < RPW; rr++) {
        let r = r0 + rr;
        if r < dims.rows {
            let rb = r * stride;
            var s = 0.0;
            for (var b = lid.x; b < nb; b += WG) {
                s += (w_scale(rb, b) * xd[t * nb + b]) * f32(blk(rb, xb, b));
            }
            acc[rr] = s;
        }
    }
    reduce_store(lid.x, r0, t, acc);
}
