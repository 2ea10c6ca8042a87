// The FFN's gate and up projections and the activation for a decode step, as mv.wgsl reads
// one matrix: g = act(Lin(W_gate, f)) · Lin(W_up, f), f the int8 rows staged by the
// prologue (bindings 6 and 7); bindings and act: mv_glu_out.wgsl.

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let lane = lid.x % LANES;
    let r = wg.x * RPW + lid.x / LANES;
    let gt = group_tokens();
    let nb = dims.n_in / 256u;
    let xv = dims.n_in / 16u;
    for (var t0 = 0u; t0 < step.n_tok; t0 += gt) {
        let nt = min(gt, step.n_tok - t0);
        prologue(t0, nt, lid.x);
        var gi = vec4<i32>(0);
        var ui = vec4<i32>(0);
        var gf = vec4<f32>(0.0);
        var uf = vec4<f32>(0.0);
        if r < dims.n_out {
            for (var j = lane; j < dims.vwords; j += LANES) {
                let a = wg_[r * dims.vwords + j];
                let b = wu[r * dims.vwords + j];
                let xb = (j / 2u) * 8u + (j % 2u);
                if dims.mode == 0u {
                    gi.x += dot_codes(a, xb);
                    ui.x += dot_codes(b, xb);
                    if nt > 1u {
                        gi.y += dot_codes(a, xv + xb);
                        ui.y += dot_codes(b, xv + xb);
                    }
                    if nt > 2u {
                        gi.z += dot_codes(a, 2u * xv + xb);
                        ui.z += dot_codes(b, 2u * xv + xb);
                    }
                    if nt > 3u {
                        gi.w += dot_codes(a, 3u * xv + xb);
                        ui.w += dot_codes(b, 3u * xv + xb);
                    }
                } else {
                    let dg = sg[r * nb + j / 4u];
                    let du = su[r * nb + j / 4u];
                    for (var ti = 0u; ti < nt; ti++) {
                        let xo = ti * xv + xb;
                        let ones = dot_ones(xo);
                        gf[ti] += f32(dot_codes(a, xo) - ones) * dg;
                        uf[ti] += f32(dot_codes(b, xo) - ones) * du;
                    }
                }
            }
        }
        let sgi = team_sum_i(gi, lid.x);
        let sui = team_sum_i(ui, lid.x);
        var sgf = vec4<f32>(0.0);
        var suf = vec4<f32>(0.0);
        if dims.mode == 1u {
            sgf = team_sum_f(gf, lid.x);
            suf = team_sum_f(uf, lid.x);
        }
        if lane == 0u && r < dims.n_out {
            for (var ti = 0u; ti < nt; ti++) {
                y[(t0 + ti) * dims.n_out + r] = glu_out(sgi[ti], sui[ti], sgf[ti], suf[ti], ti);
            }
        }
        workgroupBarrier();
    }
}
