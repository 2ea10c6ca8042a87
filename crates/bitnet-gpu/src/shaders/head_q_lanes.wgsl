// head_q.wgsl for adapters that run invocations as SIMD lanes (as head_lanes.wgsl): each
// thread four rows over the whole hidden state, up to four output rows, no reduction across
// threads; the integer dots written out (these drivers lower `dot4I8Packed` to slower code).

const WG: u32 = 64u;

// The codes of the four nibbles of a Q4_0 word at bit `sh` (0: low, 4: high), minus 8.
fn nib4(v: u32, sh: u32) -> vec4<i32> {
    let n = (vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) >> vec4<u32>(sh)) & vec4<u32>(15u);
    return vec4<i32>(n) - vec4<i32>(8);
}

// Σ q_w·q_x of block b of the four rows at words rb against the codes of the row at word xb.
fn blk4(rb: vec4<u32>, xb: u32, b: u32) -> vec4<i32> {
    var s = vec4<i32>(0);
    if TY == 2u {
        for (var k = 0u; k < 8u; k++) {
            let x = i8x4(xq[xb + 8u * b + k]);
            let o = 8u * b + k;
            s += vec4<i32>(
                dot(i8x4(w[rb.x + o]), x),
                dot(i8x4(w[rb.y + o]), x),
                dot(i8x4(w[rb.z + o]), x),
                dot(i8x4(w[rb.w + o]), x),
            );
        }
    } else {
        for (var k = 0u; k < 4u; k++) {
            let xl = i8x4(xq[xb + 8u * b + k]);
            let xh = i8x4(xq[xb + 8u * b + 4u + k]);
            let o = 4u * b + k;
            let c = vec4<u32>(w[rb.x + o], w[rb.y + o], w[rb.z + o], w[rb.w + o]);
            s += vec4<i32>(
                dot(nib4(c.x, 0u), xl) + dot(nib4(c.x, 4u), xh),
                dot(nib4(c.y, 0u), xl) + dot(nib4(c.y, 4u), xh),
                dot(nib4(c.z, 0u), xl) + dot(nib4(c.z, 4u), xh),
                dot(nib4(c.w, 0u), xl) + dot(nib4(c.w, 4u), xh),
            );
        }
    }
    return s;
}

// Block b of output row t for the four rows at words rb (scales ds).
fn term(rb: vec4<u32>, ds: vec4<f32>, t: u32, b: u32, nb: u32) -> vec4<f32> {
    return (ds * xd[t * nb + b]) * vec4<f32>(blk4(rb, t * (dims.n_embd / 4u), b));
}


@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t0 = wg.y * 4u;
    let r0 = (wg.x * WG + lid.x) * 4u;
    if t0 >= step.out_rows || r0 >= dims.rows {
        return;
    }
    let last = dims.rows - 1u;
    let rr = vec4<u32>(r0, min(r0 + 1u, last), min(r0 + 2u, last), min(r0 + 3u, last));
    let rb = rr * row_words();
    let nt = min(4u, step.out_rows - t0);
    let nb = dims.n_embd / 32u;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    // One output row (a decode step) on a loop of its own, as head_lanes.wgsl.
    if nt == 1u {
        for (var b = 0u; b < nb; b++) {
            let ds = vec4<f32>(w_scale(rb.x, b), w_scale(rb.y, b), w_scale(rb.z, b), w_scale(rb.w, b));
            a0 += term(rb, ds, t0, b, nb);
        }
    } else {
        for (var b = 0u; b < nb; b++) {
            let ds = vec4<f32>(w_scale(rb.x, b), w_scale(rb.y, b), w_scale(rb.z, b), w_scale(rb.w, b));
            a0 += term(rb, ds, t0, b, nb);
            a1 += term(rb, ds, min(t0 + 1u, t0 + nt - 1u), b, nb);
            a2 += term(rb, ds, min(t0 + 2u, t0 + nt - 1u), b, nb);
            a3 += term(rb, ds, t0 + nt - 1u, b, nb);
        }
    }
    store_rows4(t0, r0, nt, a0, a1, a2, a3);
}
