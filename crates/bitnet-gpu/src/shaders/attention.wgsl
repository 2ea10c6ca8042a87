// Causal GQA attention of one query row and head per workgroup (and, for a decode step, one
// chunk of its positions: attention_split.wgsl) over the cache, in blocks of 64 positions
// with an online softmax (running max m, sum l, rescaled accumulators), so memory does not
// grow with the context. Query head h reads KV head h / (n_head / n_head_kv). A split call
// leaves each chunk's state (acc, m, l) to attention_merge.wgsl.
// The cache's element type comes from the prelude compiled in front of this file
// (attention_f32.wgsl or attention_f16.wgsl): `k_at(i)` and `v_at(i)` read element i; the
// shapes, uniforms and workgroup constants (`dims`, `step`, `WG`, `ACC`) are
// attention_split.wgsl's.
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(5) var<storage, read_write> o: array<f32>;
// Chunk states of a split call: per (row, head, chunk) `acc[d]`, m, l.
@group(0) @binding(6) var<storage, read_write> part: array<f32>;

var<workgroup> qs: array<f32, 256>;
var<workgroup> p: array<f32, 64>;
var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let h = wg.x;
    let t = wg.y;
    let d = dims.head_dim;
    let kvh = h / (dims.n_head / dims.n_head_kv);
    let kv_stride = dims.n_head_kv * d;
    // Q and O rows from step.row0 (a batched step's sequence); chunk states per call row.
    let qo = ((step.row0 + t) * dims.n_head + h) * d;
    let n_pos = step.pos0 + t + 1u;
    let ns = n_split();
    var lo = 0u;
    var hi = n_pos;
    if ns > 1u {
        let cl = chunk_len(ns);
        lo = min(wg.z * cl, n_pos);
        hi = min(n_pos, lo + cl);
    }
    for (var i = lid.x; i < d; i += WG) {
        qs[i] = q[qo + i];
    }
    workgroupBarrier();
    var m = -3.0e38;
    var l = 0.0;
    var acc: array<f32, ACC>;
    for (var c0 = lo; c0 < hi; c0 += WG) {
        let j = c0 + lid.x;
        var s = -3.0e38;
        if j < hi {
            let ko = j * kv_stride + kvh * d;
            s = k_dot(ko, d) * dims.scale;
        }
        red[lid.x] = s;
        workgroupBarrier();
        for (var k = WG / 2u; k > 0u; k >>= 1u) {
            if lid.x < k {
                red[lid.x] = max(red[lid.x], red[lid.x + k]);
            }
            workgroupBarrier();
        }
        let m_new = max(m, red[0]);
        workgroupBarrier();
        var pj = 0.0;
        if j < hi {
            pj = exp(s - m_new);
        }
        p[lid.x] = pj;
        red[lid.x] = pj;
        workgroupBarrier();
        for (var k = WG / 2u; k > 0u; k >>= 1u) {
            if lid.x < k {
                red[lid.x] += red[lid.x + k];
            }
            workgroupBarrier();
        }
        let alpha = exp(m - m_new);
        l = l * alpha + red[0];
        m = m_new;
        let n = min(WG, hi - c0);
        // Thread lid holds dimension pairs 2·(lid + a·WG) + 0, 1 in acc[2a], acc[2a + 1];
        // four positions' loads go out before their sums.
        for (var a = 0u; a < ACC / 2u; a++) {
            let i = 2u * (lid.x + a * WG);
            if i < d {
                var v = vec2<f32>(acc[2u * a], acc[2u * a + 1u]) * alpha;
                let vb = c0 * kv_stride + kvh * d + i;
                var jj = 0u;
                for (; jj + 4u <= n; jj += 4u) {
                    let v0 = v_pair(vb + jj * kv_stride);
                    let v1 = v_pair(vb + (jj + 1u) * kv_stride);
                    let v2 = v_pair(vb + (jj + 2u) * kv_stride);
                    let v3 = v_pair(vb + (jj + 3u) * kv_stride);
                    v += p[jj] * v0;
                    v += p[jj + 1u] * v1;
                    v += p[jj + 2u] * v2;
                    v += p[jj + 3u] * v3;
                }
                for (; jj < n; jj++) {
                    v += p[jj] * v_pair(vb + jj * kv_stride);
                }
                acc[2u * a] = v.x;
                acc[2u * a + 1u] = v.y;
            }
        }
        workgroupBarrier();
    }
    if ns == 1u {
        for (var a = 0u; a < ACC; a++) {
            let i = 2u * (lid.x + (a / 2u) * WG) + a % 2u;
            if i < d {
                o[qo + i] = acc[a] / l;
            }
        }
    } else {
        let pb = ((t * dims.n_head + h) * ns + wg.z) * (d + 2u);
        for (var a = 0u; a < ACC; a++) {
            let i = 2u * (lid.x + (a / 2u) * WG) + a % 2u;
            if i < d {
                part[pb + i] = acc[a];
            }
        }
        if lid.x == 0u {
            part[pb + d] = m;
            part[pb + d + 1u] = l;
        }
    }
}
