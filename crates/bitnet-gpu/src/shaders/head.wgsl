// Logits of the normed rows through one chunk of the LM head's rows (F16 or F32 rows):
// logits[t][row0 + r] = Σ_i W[r][i] · hn[t][i]. One workgroup per 4 rows × 1 output row.
// Shape and bindings: head_common.wgsl.

const WG: u32 = 64u;
const RPW: u32 = 4u;
var<workgroup> red: array<vec4<f32>, 64>;

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
    red[lid.x] = acc;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid.x < k {
            red[lid.x] += red[lid.x + k];
        }
        workgroupBarrier();
    }
    if lid.x < RPW {
        let r = r0 + lid.x;
        if r < dims.rows {
            logits[t * dims.n_vocab + dims.row0 + r] = red[0][lid.x];
        }
    }
}
