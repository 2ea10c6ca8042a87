// The decode kernels' input as rows norm_quant.wgsl already quantized (codes four to a word,
// and each row's scale s): the prologue copies rows t0.. into workgroup memory and sums each
// row's codes. Bindings B_IN0 and B_IN1 as in mv_in_norm.wgsl.
@group(0) @binding(B_IN0) var<storage, read> xqg: array<vec4<u32>>;
@group(0) @binding(B_IN1) var<storage, read> xsg: array<f32>;

fn prologue(t0: u32, nt: u32, lid: u32) {
    let n16 = dims.n_in / 16u;
    var sums = vec4<i32>(0);
    for (var ti = 0u; ti < nt; ti++) {
        var acc = 0;
        for (var j = lid; j < n16; j += WG) {
            let v = xqg[(t0 + ti) * n16 + j];
            xq[ti * n16 + j] = v;
            acc += dot4I8Packed(0x01010101u, v.x) + dot4I8Packed(0x01010101u, v.y);
            acc += dot4I8Packed(0x01010101u, v.z) + dot4I8Packed(0x01010101u, v.w);
        }
        sums[ti] = acc;
    }
    let tot = wg_sum_i(sums, lid);
    if lid == 0u {
        for (var ti = 0u; ti < nt; ti++) {
            tok_s[ti] = xsg[t0 + ti];
            tok_sum[ti] = tot[ti];
        }
    }
    workgroupBarrier();
}
