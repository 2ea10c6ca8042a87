// mv_glu.wgsl for adapters that run invocations as SIMD lanes (mv_rows_common.wgsl): the
// same bindings and modes, each thread four rows of the gate and the same four of the up
// projection (4·WG rows a workgroup).

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let r0 = rows_of(wg.x, lid.x);
    let vw = dims.vwords;
    let rr = rows_read(r0 + vec4<u32>(0u, 1u, 2u, 3u));
    let b = rr * vw;
    let nb = dims.n_in / 256u;
    let xv = dims.n_in / 16u;
    let gt = group_tokens();
    for (var t0 = 0u; t0 < step.n_tok; t0 += gt) {
        let nt = min(gt, step.n_tok - t0);
        prologue(t0, nt, lid.x);
        for (var ti = 0u; ti < nt; ti++) {
            var gi = vec4<i32>(0);
            var ui = vec4<i32>(0);
            var gf = vec4<f32>(0.0);
            var uf = vec4<f32>(0.0);
            if r0 < dims.n_out {
                for (var j = 0u; j < vw; j++) {
                    let xo = ti * xv + (j / 2u) * 8u + (j % 2u);
                    let dg = dot_rows4(wg_[b.x + j], wg_[b.y + j], wg_[b.z + j], wg_[b.w + j], xo);
                    let du = dot_rows4(wu[b.x + j], wu[b.y + j], wu[b.z + j], wu[b.w + j], xo);
                    if dims.mode == 0u {
                        gi += dg;
                        ui += du;
                    } else {
                        let s = rr * nb + vec4<u32>(j / 4u);
                        let ones = vec4<i32>(ones_rows(xo));
                        gf += vec4<f32>(dg - ones) * vec4<f32>(sg[s.x], sg[s.y], sg[s.z], sg[s.w]);
                        uf += vec4<f32>(du - ones) * vec4<f32>(su[s.x], su[s.y], su[s.z], su[s.w]);
                    }
                }
            }
            for (var i = 0u; i < 4u; i++) {
                let r = r0 + i;
                if r < dims.n_out {
                    y[(t0 + ti) * dims.n_out + r] = glu_out(gi[i], ui[i], gf[i], uf[i], ti);
                }
            }
        }
        workgroupBarrier();
    }
}
