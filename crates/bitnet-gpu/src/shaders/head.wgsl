// Logits of the normed rows through one chunk of the LM head's rows (F16 or F32 rows):
// logits[t][row0 + r] = Σ_i W[r][i] · hn[t][i]. One workgroup per 4 rows × 1 output row.
// Bindings: head_common.wgsl; shape and the reduction: head_shared.wgsl.

const WG: u32 = TREE_WG;
const RPW: u32 = 4u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let r0 = wg.x * RPW;
    let t = wg.y;
    if t >= step.out_rows {
        return;
    }
    let e = dims.n_embd;
    let x0 = t * e;
    var acc = vec4<f32>(0.0);
    for (var rr = 0u; rr < RPW; rr++) {
        let r = r0 + rr;
        if r < dims.rows {
            var s = 0.0;
            if dims.ty == 0u {
                let base = r * (e / 2u);
                for (var j = lid.x; j < e / 2u; j += WG) {
                    let v = unpack2x16float(w[base + j]);
                    s += v.x * hn[x0 + 2u * j] + v.y * hn[x0 + 2u * j + 1u];
                }
            } else {
                let base = r * e;
                for (var j = lid.x; j < e; j += WG) {
                    s += bitcast<f32>(w[base + j]) * hn[x0 + j];
                }
            }
            acc[rr] = s;
        }
    }
    reduce_store(lid.x, r0, t, acc);
}
