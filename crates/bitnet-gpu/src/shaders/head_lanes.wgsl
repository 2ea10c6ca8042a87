// head.wgsl for adapters that run invocations as SIMD lanes (as mv_rows.wgsl): the same
// bindings (head_common.wgsl), each thread four rows over the whole hidden state, no
// reduction across threads. Workgroups: (rows / (4·WG), output rows / 4): a thread takes
// up to four output rows (a batched decode step's sequences), so each weight it unpacks
// serves all of them; a call with one output row takes the single-row loop.

const WG: u32 = 64u;

// Four rows' values at hidden-state pair j (F16 rows) or element j (F32 rows, in x).
fn pair_f16(b: vec4<u32>, j: u32) -> array<vec2<f32>, 4> {
    return array<vec2<f32>, 4>(
        unpack2x16float(w[b.x + j]),
        unpack2x16float(w[b.y + j]),
        unpack2x16float(w[b.z + j]),
        unpack2x16float(w[b.w + j]),
    );
}

fn elem_f32(b: vec4<u32>, j: u32) -> vec4<f32> {
    return vec4<f32>(
        bitcast<f32>(w[b.x + j]),
        bitcast<f32>(w[b.y + j]),
        bitcast<f32>(w[b.z + j]),
        bitcast<f32>(w[b.w + j]),
    );
}

fn dot4(p: array<vec2<f32>, 4>, h: vec2<f32>) -> vec4<f32> {
    return vec4<f32>(dot(p[0], h), dot(p[1], h), dot(p[2], h), dot(p[3], h));
}

fn h2(x0: u32, j: u32) -> vec2<f32> {
    return vec2<f32>(hn[x0 + 2u * j], hn[x0 + 2u * j + 1u]);
}


@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t0 = wg.y * 4u;
    let r0 = (wg.x * WG + lid.x) * 4u;
    if t0 >= step.out_rows || r0 >= dims.rows {
        return;
    }
    let e = dims.n_embd;
    let last = dims.rows - 1u;
    let rr = vec4<u32>(r0, min(r0 + 1u, last), min(r0 + 2u, last), min(r0 + 3u, last));
    // The thread's output rows, the last repeated where fewer than four are left.
    let nt = min(4u, step.out_rows - t0);
    let tl = t0 + nt - 1u;
    let xo = vec4<u32>(t0, min(t0 + 1u, tl), min(t0 + 2u, tl), tl) * e;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    if dims.ty == 0u {
        let b = rr * (e / 2u);
        if nt == 1u {
            for (var j = 0u; j < e / 2u; j++) {
                a0 += dot4(pair_f16(b, j), h2(xo.x, j));
            }
        } else {
            for (var j = 0u; j < e / 2u; j++) {
                let p = pair_f16(b, j);
                a0 += dot4(p, h2(xo.x, j));
                a1 += dot4(p, h2(xo.y, j));
                a2 += dot4(p, h2(xo.z, j));
                a3 += dot4(p, h2(xo.w, j));
            }
        }
    } else {
        let b = rr * e;
        if nt == 1u {
            for (var j = 0u; j < e; j++) {
                a0 += elem_f32(b, j) * hn[xo.x + j];
            }
        } else {
            for (var j = 0u; j < e; j++) {
                let p = elem_f32(b, j);
                a0 += p * hn[xo.x + j];
                a1 += p * hn[xo.y + j];
                a2 += p * hn[xo.z + j];
                a3 += p * hn[xo.w + j];
            }
        }
    }
    store_rows4(t0, r0, nt, a0, a1, a2, a3);
}
