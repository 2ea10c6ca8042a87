// Shared by the LM head kernels (head*.wgsl): a chunk's shape, and the stores of their
// results into the logits (bound by each kernel's own bindings file).
struct Dims {
    n_embd: u32,
    rows: u32,
    row0: u32,
    n_vocab: u32,
    // 0: F16 rows (two halves per word), 1: F32 rows, 2: Q8_0, 3: Q4_0
    ty: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

// The tree kernels' (head.wgsl, head_q.wgsl) reduction of each thread's sums of four rows
// `acc` into the logits of rows r0.. for output row t.
const TREE_WG: u32 = 64u;
var<workgroup> red: array<vec4<f32>, 64>;

fn reduce_store(lid: u32, r0: u32, t: u32, acc: vec4<f32>) {
    red[lid] = acc;
    workgroupBarrier();
    for (var k = TREE_WG / 2u; k > 0u; k >>= 1u) {
        if lid < k {
            red[lid] += red[lid + k];
        }
        workgroupBarrier();
    }
    if lid < 4u {
        let r = r0 + lid;
        if r < dims.rows {
            logits[t * dims.n_vocab + dims.row0 + r] = red[0][lid];
        }
    }
}

// The lane kernels' (head_lanes.wgsl, head_q_lanes.wgsl) stores: four rows from r0 of
// output row t, and of the nt output rows from t0.
fn store4(t: u32, r0: u32, acc: vec4<f32>) {
    for (var i = 0u; i < 4u; i++) {
        if r0 + i < dims.rows {
            logits[t * dims.n_vocab + dims.row0 + r0 + i] = acc[i];
        }
    }
}

fn store_rows4(t0: u32, r0: u32, nt: u32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>) {
    store4(t0, r0, a0);
    if nt > 1u {
        store4(t0 + 1u, r0, a1);
    }
    if nt > 2u {
        store4(t0 + 2u, r0, a2);
    }
    if nt > 3u {
        store4(t0 + 3u, r0, a3);
    }
}
