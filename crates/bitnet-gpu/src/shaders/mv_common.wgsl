// Shared by the decode kernels (mv.wgsl, mv_glu.wgsl): the workgroup memory that holds up to
// TT int8 input rows (filled by the prologue of mv_in_norm.wgsl, which norms and quantizes
// them itself, or of mv_in_q.wgsl, which copies rows norm_quant.wgsl quantized), the
// I2_S-order dot products over a vec4 of code words, and the reduction over a row's lanes.
//
// Workgroup: WG threads in RPW teams of LANES, one output row a team. Codes in I2_S order
// (ternary.wgsl): vec4 j of a row holds words 4j..4j+3, that is bytes 16(j % 2).. of the
// 128-element block j / 2; its four words meet activation words x_l (l = 0..3) at vec4
// (j / 2)·8 + j % 2 + 2l of the token's packed row, component k with word k.
// XQ (activation words held at most), TT, WG, RPW, LANES and PV are defined in front of this
// file; every token's row takes n_in / 4 words, so a group holds min(TT, XQ / (n_in / 4)).
struct Dims {
    n_in: u32,
    n_out: u32,
    // vec4 words of codes per row (n_in / 64)
    vwords: u32,
    // 0: one I2_S tensor scale per segment, 1: TQ2_0 block scales
    mode: u32,
    // mv: 1 adds into y; mv_glu: 1 ReLU², 2 SiLU
    op: u32,
    // RMSNorm's eps (f32 bits)
    eps: u32,
    // mv: rows of the first segment and of the first two (Q; Q and K), n_out when one
    seg1: u32,
    seg2: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;

var<workgroup> xq: array<vec4<u32>, XQ / 4u>;
var<workgroup> red: array<vec4<f32>, WG>;
var<workgroup> redi: array<vec4<i32>, WG>;
// per token of the group: quantization scale s, and Σq over the row
var<workgroup> tok_s: array<f32, TT>;
var<workgroup> tok_sum: array<i32, TT>;

// Tokens one group holds.
fn group_tokens() -> u32 {
    return max(1u, min(TT, XQ / (dims.n_in / 4u)));
}

// Sum of `v` over the workgroup, in red[0] for every thread afterwards.
fn wg_sum(v: vec4<f32>, lid: u32) -> vec4<f32> {
    red[lid] = v;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid < k {
            red[lid] += red[lid + k];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn wg_max_i(v: vec4<i32>, lid: u32) -> vec4<i32> {
    redi[lid] = v;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid < k {
            redi[lid] = max(redi[lid], redi[lid + k]);
        }
        workgroupBarrier();
    }
    let r = redi[0];
    workgroupBarrier();
    return r;
}

fn wg_sum_i(v: vec4<i32>, lid: u32) -> vec4<i32> {
    redi[lid] = v;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid < k {
            redi[lid] += redi[lid + k];
        }
        workgroupBarrier();
    }
    let r = redi[0];
    workgroupBarrier();
    return r;
}

// Σ code·x over one vec4 of code words and the token at activation vec4 `xo` (codes 0..2;
// the caller subtracts Σx for the −1).
fn dot_codes(w: vec4<u32>, xo: u32) -> i32 {
    var d = 0;
    for (var l = 0u; l < 4u; l++) {
        let x = xq[xo + 2u * l];
        let sh = 6u - 2u * l;
        d += dot4I8Packed((w.x >> sh) & 0x03030303u, x.x);
        d += dot4I8Packed((w.y >> sh) & 0x03030303u, x.y);
        d += dot4I8Packed((w.z >> sh) & 0x03030303u, x.z);
        d += dot4I8Packed((w.w >> sh) & 0x03030303u, x.w);
    }
    return d;
}

// Σ x over the same 64 activations (for TQ2_0's per-block −1).
fn dot_ones(xo: u32) -> i32 {
    var d = 0;
    for (var l = 0u; l < 4u; l++) {
        let x = xq[xo + 2u * l];
        d += dot4I8Packed(0x01010101u, x.x) + dot4I8Packed(0x01010101u, x.y);
        d += dot4I8Packed(0x01010101u, x.z) + dot4I8Packed(0x01010101u, x.w);
    }
    return d;
}

// Sum over the LANES threads of each team (lane 0 of the team gets the total).
fn team_sum_i(v: vec4<i32>, lid: u32) -> vec4<i32> {
    redi[lid] = v;
    workgroupBarrier();
    for (var k = LANES / 2u; k > 0u; k >>= 1u) {
        if lid % LANES < k {
            redi[lid] += redi[lid + k];
        }
        workgroupBarrier();
    }
    let r = redi[lid];
    workgroupBarrier();
    return r;
}

fn team_sum_f(v: vec4<f32>, lid: u32) -> vec4<f32> {
    red[lid] = v;
    workgroupBarrier();
    for (var k = LANES / 2u; k > 0u; k >>= 1u) {
        if lid % LANES < k {
            red[lid] += red[lid + k];
        }
        workgroupBarrier();
    }
    let r = red[lid];
    workgroupBarrier();
    return r;
}
