// Lin(W, x) for a decode step (up to TT token rows; a longer call runs them in groups): the
// int8 rows staged by the prologue (bindings 4 and 5: mv_in_norm.wgsl or mv_in_q.wgsl),
// then one output row per team of LANES threads, each lane reading a vec4
// of code words (64 weights) per step. The rows may be the concatenation of up to three
// matrices with the same input (Q, K and V): rows below seg1 go to y0, below seg2 to y1, the
// rest to y2, each segment with its own I2_S tensor scale sc[segment] (mode 0), or the rows'
// TQ2_0 block scales (mode 1). op 1: y0 += Lin (the O and down projections add into the
// residual stream). Its bindings and `store` are mv_out.wgsl's.

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
        var acc = vec4<i32>(0);
        var accf = vec4<f32>(0.0);
        if r < dims.n_out {
            for (var j = lane; j < dims.vwords; j += LANES) {
                let w = wt[r * dims.vwords + j];
                let xb = (j / 2u) * 8u + (j % 2u);
                if dims.mode == 0u {
                    // Unrolled over the tokens, so the sums stay in registers.
                    acc.x += dot_codes(w, xb);
                    if nt > 1u {
                        acc.y += dot_codes(w, xv + xb);
                    }
                    if nt > 2u {
                        acc.z += dot_codes(w, 2u * xv + xb);
                    }
                    if nt > 3u {
                        acc.w += dot_codes(w, 3u * xv + xb);
                    }
                } else {
                    let d = sc[r * nb + j / 4u];
                    for (var ti = 0u; ti < nt; ti++) {
                        let xo = ti * xv + xb;
                        accf[ti] += f32(dot_codes(w, xo) - dot_ones(xo)) * d;
                    }
                }
            }
        }
        let si = team_sum_i(acc, lid.x);
        var sf = vec4<f32>(0.0);
        if dims.mode == 1u {
            sf = team_sum_f(accf, lid.x);
        }
        if lane == 0u && r < dims.n_out {
            let seg = select(select(2u, 1u, r < dims.seg2), 0u, r < dims.seg1);
            for (var ti = 0u; ti < nt; ti++) {
                var v: f32;
                if dims.mode == 0u {
                    v = (f32(si[ti] - tok_sum[ti]) / tok_s[ti]) * sc[seg];
                } else {
                    v = sf[ti] / tok_s[ti];
                }
                store(t0 + ti, r, v);
            }
        }
        workgroupBarrier();
    }
}
