// The chunks of a split attention call (attention.wgsl) combined, per (head, row): with
// M the largest chunk maximum and w_c = exp(m_c − M), o = Σ acc_c·w_c / Σ l_c·w_c, the sums
// in chunk order; a chunk that saw no position (l = 0) weighs 0. Thread c reads chunk c's
// state (n_split() ≤ 64); each thread then sums its dimensions over the chunks, issuing four
// chunks' loads before it adds them. The shapes, uniforms and WG, ACC are
// attention_split.wgsl's.
@group(0) @binding(2) var<storage, read> part: array<f32>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;

var<workgroup> red: array<f32, 64>;
// Per chunk: its weight w_c, and l_c·w_c.
var<workgroup> wc: array<f32, 64>;
var<workgroup> lw: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = wg.x;
    let t = wg.y;
    let ns = n_split();
    let d = dims.head_dim;
    let base = (t * dims.n_head + h) * ns;
    var mc = -3.0e38;
    var lc = 0.0;
    if lid.x < ns {
        let pb = (base + lid.x) * (d + 2u);
        lc = part[pb + d + 1u];
        if lc > 0.0 {
            mc = part[pb + d];
        }
    }
    red[lid.x] = mc;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid.x < k {
            red[lid.x] = max(red[lid.x], red[lid.x + k]);
        }
        workgroupBarrier();
    }
    var w = 0.0;
    if lc > 0.0 {
        w = exp(mc - red[0]);
    }
    wc[lid.x] = w;
    lw[lid.x] = lc * w;
    workgroupBarrier();
    var l = 0.0;
    for (var c = 0u; c < ns; c++) {
        l += lw[c];
    }
    let qo = ((step.row0 + t) * dims.n_head + h) * d;
    for (var a = 0u; a < ACC; a++) {
        let i = lid.x + a * WG;
        if i < d {
            var acc = 0.0;
            for (var c = 0u; c < ns; c += 4u) {
                var x: array<f32, 4>;
                for (var u = 0u; u < 4u; u++) {
                    if c + u < ns {
                        x[u] = part[(base + c + u) * (d + 2u) + i];
                    }
                }
                for (var u = 0u; u < 4u; u++) {
                    if c + u < ns {
                        acc += x[u] * wc[c + u];
                    }
                }
            }
            o[qo + i] = acc / l;
        }
    }
}
