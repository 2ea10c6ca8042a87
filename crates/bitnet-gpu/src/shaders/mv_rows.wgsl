// mv.wgsl for adapters that run invocations as SIMD lanes (mv_rows_common.wgsl): the same
// bindings, segments and modes (mv_out.wgsl), each thread four output rows (4·WG rows a
// workgroup). The output file in front of this one says which rows a thread takes
// (`thread_rows`) and where they go (`emit`): mv_out.wgsl four consecutive rows stored as
// they are, mv_out_rope.wgsl Q, K and V with RoPE and the cache store.

fn seg_scale(r: u32) -> f32 {
    return sc[select(select(2u, 1u, r < dims.seg2), 0u, r < dims.seg1)];
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let rows = thread_rows(wg.x, lid.x);
    let vw = dims.vwords;
    let rr = rows_read(rows);
    let b = rr * vw;
    let nb = dims.n_in / 256u;
    let xv = dims.n_in / 16u;
    let gt = group_tokens();
    for (var t0 = 0u; t0 < step.n_tok; t0 += gt) {
        let nt = min(gt, step.n_tok - t0);
        prologue(t0, nt, lid.x);
        for (var ti = 0u; ti < nt; ti++) {
            var acc = vec4<i32>(0);
            var accf = vec4<f32>(0.0);
            if rows.x < dims.n_out {
                for (var j = 0u; j < vw; j++) {
                    let xo = ti * xv + (j / 2u) * 8u + (j % 2u);
                    let d = dot_rows4(wt[b.x + j], wt[b.y + j], wt[b.z + j], wt[b.w + j], xo);
                    if dims.mode == 0u {
                        acc += d;
                    } else {
                        let s = rr * nb + vec4<u32>(j / 4u);
                        let scale = vec4<f32>(sc[s.x], sc[s.y], sc[s.z], sc[s.w]);
                        accf += vec4<f32>(d - vec4<i32>(ones_rows(xo))) * scale;
                    }
                }
            }
            var v: vec4<f32>;
            for (var i = 0u; i < 4u; i++) {
                if dims.mode == 0u {
                    v[i] = (f32(acc[i] - tok_sum[ti]) / tok_s[ti]) * seg_scale(rr[i]);
                } else {
                    v[i] = accf[i] / tok_s[ti];
                }
            }
            emit(t0 + ti, rows, v);
        }
        workgroupBarrier();
    }
}
