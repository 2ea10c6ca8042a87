// Lin(W, x) for a prompt on adapters that run a workgroup's invocations as the lanes of a
// CPU's SIMD registers (lavapipe, SwiftShader): gemm.wgsl's bindings, tile (BM = 64 output
// rows × BN = 64 token rows a workgroup) and epilogues (gemm_common.wgsl), with no workgroup memory, barriers
// or packed int8 dots (these drivers run each as many scalar steps).
//
// Thread rg of 8 holds rows 8rg + i (i < 8) and, for each group of 4 of the tile's tokens in
// turn, tokens 4tg + j (j < 4): the eight threads, one SIMD register, share their tokens, so
// an activation load is the same address in every lane. Two rows' codes share a u32, row 8rg + 2p in the low 16 bits and
// 8rg + 2p + 1 in the high 16, so one multiply by a token's x + 128 (0..255) adds both rows'
// code·(x + 128): within one block of 128 values a half sums to at most 128 · 2 · 255 < 2^16,
// and after each block the halves move to i32 sums. With S = Σ code·(x + 128),
// C = Σ code and X = Σ (x + 128) over the row:
//   T = Σ (code − 1)·x = S − 128·C − X + 128·n_in,   y = (T / s)·β,
// the same integer as gemm.wgsl's, so the outputs are identical.

// The code sums of four code words (a 2-bit code is its low bit plus twice its high bit).
fn code_sum(c: vec4<u32>) -> vec4<u32> {
    return countOneBits(c & vec4<u32>(0x55555555u)) + 2u * countOneBits(c & vec4<u32>(0xaaaaaaaau));
}

// Two 16-bit halves summed into i32s: the low halves' rows and the high halves'.
fn halves(a: vec4<u32>) -> vec4<i32> {
    return vec4<i32>(a & vec4<u32>(0xffffu));
}

fn highs(a: vec4<u32>) -> vec4<i32> {
    return vec4<i32>(a >> vec4<u32>(16u));
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let r0 = wg.x * BM + 8u * lid.x;
    // The tile's token groups one after the other, so a token's address is the same in
    // every lane (a loop variable, not the invocation id): one load, not one a lane.
    for (var t0 = wg.y * BN; t0 < min(step.n_tok, wg.y * BN + BN); t0 += 4u) {
        tile(r0, t0);
    }
}

// Rows r0 + i (i < 8) of tokens t0 + j (j < 4).
fn tile(r0: u32, t0: u32) {
    let xw = dims.n_in / 4u;
    // Word offsets of the rows (even rows in ra, odd in rb: pair p is ra[p], rb[p]) and of
    // the tokens, clamped to the last ones so every load is in bounds (only rows and tokens
    // inside are stored).
    let last_r = vec4<u32>(dims.n_out - 1u);
    let ra = min(r0 + vec4<u32>(0u, 2u, 4u, 6u), last_r) * dims.words;
    let rb = min(r0 + vec4<u32>(1u, 3u, 5u, 7u), last_r) * dims.words;
    let to = min(t0 + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(step.n_tok - 1u)) * xw;
    // S of pair p's even row in sa_p, odd row in sb_p; token j in component j.
    var sa0 = vec4<i32>(0);
    var sa1 = vec4<i32>(0);
    var sa2 = vec4<i32>(0);
    var sa3 = vec4<i32>(0);
    var sb0 = vec4<i32>(0);
    var sb1 = vec4<i32>(0);
    var sb2 = vec4<i32>(0);
    var sb3 = vec4<i32>(0);
    var ca = vec4<u32>(0u);
    var cb = vec4<u32>(0u);
    var xsum = vec4<i32>(0);
    let m = 0x00030003u;
    for (var k0 = 0u; k0 < dims.n_in; k0 += 128u) {
        var acc0 = vec4<u32>(0u);
        var acc1 = vec4<u32>(0u);
        var acc2 = vec4<u32>(0u);
        var acc3 = vec4<u32>(0u);
        // X of the block in two 16-bit halves a token.
        var xh = vec4<u32>(0u);
        for (var w = 0u; w < 8u; w++) {
            let wo = k0 / 16u + w;
            let wa = vec4<u32>(wt[ra.x + wo], wt[ra.y + wo], wt[ra.z + wo], wt[ra.w + wo]);
            let wb = vec4<u32>(wt[rb.x + wo], wt[rb.y + wo], wt[rb.z + wo], wt[rb.w + wo]);
            ca += code_sum(wa);
            cb += code_sum(wb);
            // Bytes 0 and 1 of both rows in lo, bytes 2 and 3 in hi.
            let lo = (wa & vec4<u32>(0xffffu)) | (wb << vec4<u32>(16u));
            let hi = (wa >> vec4<u32>(16u)) | (wb & vec4<u32>(0xffff0000u));
            for (var l = 0u; l < 4u; l++) {
                // Activation word 8l + w of the block: values 32l + 4w + b, b < 4, which byte
                // b of code word w holds at bits 6 − 2l (gemm.wgsl's order), as x + 128.
                let ao = k0 / 4u + 8u * l + w;
                let a = vec4<u32>(xq[to.x + ao], xq[to.y + ao], xq[to.z + ao], xq[to.w + ao]) ^ vec4<u32>(0x80808080u);
                xh += (a & vec4<u32>(0x00ff00ffu)) + ((a >> vec4<u32>(8u)) & vec4<u32>(0x00ff00ffu));
                let sh = 6u - 2u * l;
                let x0 = a & vec4<u32>(0xffu);
                let q0 = (lo >> vec4<u32>(sh)) & vec4<u32>(m);
                acc0 += q0.x * x0;
                acc1 += q0.y * x0;
                acc2 += q0.z * x0;
                acc3 += q0.w * x0;
                let x1 = (a >> vec4<u32>(8u)) & vec4<u32>(0xffu);
                let q1 = (lo >> vec4<u32>(sh + 8u)) & vec4<u32>(m);
                acc0 += q1.x * x1;
                acc1 += q1.y * x1;
                acc2 += q1.z * x1;
                acc3 += q1.w * x1;
                let x2 = (a >> vec4<u32>(16u)) & vec4<u32>(0xffu);
                let q2 = (hi >> vec4<u32>(sh)) & vec4<u32>(m);
                acc0 += q2.x * x2;
                acc1 += q2.y * x2;
                acc2 += q2.z * x2;
                acc3 += q2.w * x2;
                let x3 = a >> vec4<u32>(24u);
                let q3 = (hi >> vec4<u32>(sh + 8u)) & vec4<u32>(m);
                acc0 += q3.x * x3;
                acc1 += q3.y * x3;
                acc2 += q3.z * x3;
                acc3 += q3.w * x3;
            }
        }
        sa0 += halves(acc0);
        sb0 += highs(acc0);
        sa1 += halves(acc1);
        sb1 += highs(acc1);
        sa2 += halves(acc2);
        sb2 += highs(acc2);
        sa3 += halves(acc3);
        sb3 += highs(acc3);
        xsum += halves(xh) + highs(xh);
    }
    let beta = sc[0];
    // T's terms shared by a row (−128·C) and by a token (128·n_in − X).
    let cra = -128 * vec4<i32>(ca);
    let crb = -128 * vec4<i32>(cb);
    let tx = 128 * i32(dims.n_in) - xsum;
    for (var j = 0u; j < 4u; j++) {
        let t = t0 + j;
        if t >= step.n_tok {
            continue;
        }
        let s = xs[t];
        // Rows 8rg + i: i even from sa, odd from sb.
        let ev = vec4<i32>(sa0[j], sa1[j], sa2[j], sa3[j]) + cra + tx[j];
        let od = vec4<i32>(sb0[j], sb1[j], sb2[j], sb3[j]) + crb + tx[j];
        for (var i = 0u; i < 8u; i++) {
            let r = r0 + i;
            if r >= dims.n_out {
                continue;
            }
            var ti = ev[i / 2u];
            if i % 2u == 1u {
                ti = od[i / 2u];
            }
            put(t * dims.n_out + r, (f32(ti) / s) * beta);
        }
    }
}
