// Lin(W, x) for a prompt: a tile of BM output rows × BN token rows per workgroup, stepping
// through the input in blocks of 128 values whose codes and int8 activations are staged in
// workgroup memory, so each code word read from memory serves BN tokens and each activation
// word BM rows. I2_S codes (ternary.wgsl's order and value code − 1; one tensor scale β):
// T = Σ code·x − Σ x in i32, y = (T / s)·β. Thread (tr, tc) of 16 × 16 holds rows tr + 16i and
// tokens tc + 16j (i, j < 4). Shape, bindings and epilogue: gemm_common.wgsl.
// activation words of a token in one block, padded so that 16 tokens fall in 16 banks
const AS: u32 = 33u;
var<workgroup> cs: array<u32, 512>;
var<workgroup> xa: array<u32, 2112>;
var<workgroup> sums: array<i32, 256>;

// Four tokens' dot products with one code word: component j for token j.
fn dot4x4(c: u32, a: vec4<u32>) -> vec4<i32> {
    return vec4<i32>(
        dot4I8Packed(c, a.x),
        dot4I8Packed(c, a.y),
        dot4I8Packed(c, a.z),
        dot4I8Packed(c, a.w),
    );
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let tid = lid.x;
    let tr = tid / 16u;
    let tc = tid % 16u;
    let r0 = wg.x * BM;
    let t0 = wg.y * BN;
    let xw = dims.n_in / 4u;
    // Row tr + 16i's sums in acc_i, token tc + 16j in component j: plain variables, so that
    // they stay in registers.
    var acc0 = vec4<i32>(0);
    var acc1 = vec4<i32>(0);
    var acc2 = vec4<i32>(0);
    var acc3 = vec4<i32>(0);
    // Σx of token tid % 64 over words (tid / 64)·8 .. + 8 of each block.
    var xsum = 0;
    for (var k0 = 0u; k0 < dims.n_in; k0 += 128u) {
        // Codes: row idx / 8, word idx % 8 of the block (rows past the end load 0: unused).
        for (var e = 0u; e < 2u; e++) {
            let idx = tid + e * 256u;
            let r = r0 + idx / 8u;
            var c = 0u;
            if r < dims.n_out {
                c = wt[r * dims.words + k0 / 16u + idx % 8u];
            }
            cs[idx] = c;
        }
        // Activations: token idx / 32, word idx % 32 of the block (tokens past the end: 0).
        for (var e = 0u; e < 8u; e++) {
            let idx = tid + e * 256u;
            let t = t0 + idx / 32u;
            var a = 0u;
            if t < step.n_tok {
                a = xq[t * xw + k0 / 4u + idx % 32u];
            }
            xa[(idx / 32u) * AS + idx % 32u] = a;
        }
        workgroupBarrier();
        let st = tid % 64u;
        let sw = (tid / 64u) * 8u;
        for (var w = 0u; w < 8u; w++) {
            xsum += dot4I8Packed(0x01010101u, xa[st * AS + sw + w]);
        }
        for (var w = 0u; w < 8u; w++) {
            let c0 = cs[tr * 8u + w];
            let c1 = cs[(tr + 16u) * 8u + w];
            let c2 = cs[(tr + 32u) * 8u + w];
            let c3 = cs[(tr + 48u) * 8u + w];
            for (var l = 0u; l < 4u; l++) {
                let b = tc * AS + w + 8u * l;
                let a = vec4<u32>(xa[b], xa[b + 16u * AS], xa[b + 32u * AS], xa[b + 48u * AS]);
                let sh = 6u - 2u * l;
                acc0 += dot4x4((c0 >> sh) & 0x03030303u, a);
                acc1 += dot4x4((c1 >> sh) & 0x03030303u, a);
                acc2 += dot4x4((c2 >> sh) & 0x03030303u, a);
                acc3 += dot4x4((c3 >> sh) & 0x03030303u, a);
            }
        }
        workgroupBarrier();
    }
    sums[tid] = xsum;
    workgroupBarrier();
    let beta = sc[0];
    for (var j = 0u; j < 4u; j++) {
        let tl = tc + 16u * j;
        let t = t0 + tl;
        if t >= step.n_tok {
            continue;
        }
        let sx = sums[tl] + sums[tl + 64u] + sums[tl + 128u] + sums[tl + 192u];
        let s = xs[t];
        let col = vec4<i32>(acc0[j], acc1[j], acc2[j], acc3[j]);
        for (var i = 0u; i < 4u; i++) {
            let r = r0 + tr + 16u * i;
            if r >= dims.n_out {
                continue;
            }
            put(t * dims.n_out + r, (f32(col[i] - sx) / s) * beta);
        }
    }
}
