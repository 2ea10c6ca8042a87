// head.wgsl for adapters that run invocations as SIMD lanes (as mv_rows.wgsl): the same
// bindings (head_common.wgsl), each thread four rows over the whole hidden state, no
// reduction across threads. Workgroups: (rows / (4·WG), output rows).

const WG: u32 = 64u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wg.y;
    let r0 = (wg.x * WG + lid.x) * 4u;
    if t >= step.out_rows || r0 >= dims.rows {
        return;
    }
    let e = dims.n_embd;
    let x0 = t * e;
    let last = dims.rows - 1u;
    let rr = vec4<u32>(r0, min(r0 + 1u, last), min(r0 + 2u, last), min(r0 + 3u, last));
    var acc = vec4<f32>(0.0);
    if dims.ty == 0u {
        let b = rr * (e / 2u);
        for (var j = 0u; j < e / 2u; j++) {
            let h = vec2<f32>(hn[x0 + 2u * j], hn[x0 + 2u * j + 1u]);
            acc += vec4<f32>(
                dot(unpack2x16float(w[b.x + j]), h),
                dot(unpack2x16float(w[b.y + j]), h),
                dot(unpack2x16float(w[b.z + j]), h),
                dot(unpack2x16float(w[b.w + j]), h),
            );
        }
    } else {
        let b = rr * e;
        for (var j = 0u; j < e; j++) {
            let h = hn[x0 + j];
            acc += vec4<f32>(
                bitcast<f32>(w[b.x + j]),
                bitcast<f32>(w[b.y + j]),
                bitcast<f32>(w[b.z + j]),
                bitcast<f32>(w[b.w + j]),
            ) * h;
        }
    }
    for (var i = 0u; i < 4u; i++) {
        if r0 + i < dims.rows {
            logits[t * dims.n_vocab + dims.row0 + r0 + i] = acc[i];
        }
    }
}
