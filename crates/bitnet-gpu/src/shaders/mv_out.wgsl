// Shared by mv.wgsl and mv_rows.wgsl: the matrix's codes and scales, and where an output row
// goes. Rows below seg1 go to y0 (added into it with op 1: the O and down projections add into
// the residual stream), below seg2 to y1, the rest to y2 (Q, K and V read as one matrix).
@group(0) @binding(2) var<storage, read> wt: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> sc: array<f32>;
@group(0) @binding(6) var<storage, read_write> y0: array<f32>;
@group(0) @binding(7) var<storage, read_write> y1: array<f32>;
@group(0) @binding(8) var<storage, read_write> y2: array<f32>;

fn store(t: u32, r: u32, v: f32) {
    if r < dims.seg1 {
        let o = t * dims.seg1 + r;
        if dims.op == 1u {
            y0[o] = y0[o] + v;
        } else {
            y0[o] = v;
        }
    } else if r < dims.seg2 {
        y1[t * (dims.seg2 - dims.seg1) + r - dims.seg1] = v;
    } else {
        y2[t * (dims.n_out - dims.seg2) + r - dims.seg2] = v;
    }
}

// mv_rows.wgsl's rows: thread lid of workgroup wg takes four consecutive rows, and stores
// those below n_out.
fn thread_rows(wg: u32, lid: u32) -> vec4<u32> {
    return (wg * WG + lid) * 4u + vec4<u32>(0u, 1u, 2u, 3u);
}

fn emit(t: u32, rows: vec4<u32>, v: vec4<f32>) {
    for (var i = 0u; i < 4u; i++) {
        if rows[i] < dims.n_out {
            store(t, rows[i], v[i]);
        }
    }
}
