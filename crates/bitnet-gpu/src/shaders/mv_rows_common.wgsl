// Shared by the decode kernels for adapters that run a workgroup's invocations as the lanes
// of a CPU's SIMD registers (lavapipe, SwiftShader): one thread computes four output rows
// over the whole input, so no reduction crosses threads, and each activation word it
// unpacks serves four rows. The packed int8 dot is written out (`dot_rows4`) because these
// drivers lower `dot4I8Packed` to slower code.

fn hsum(v: vec4<i32>) -> i32 {
    return v.x + v.y + v.z + v.w;
}

// Σ code·x of four rows' vec4 of code words (64 weights each, I2_S order as in
// mv_common.wgsl) against the token at activation vec4 `xo`: component i is row i's.
// Rows 0 and 1 share a u32 (row 0's codes in the low 16 bits, row 1's in the high), as do
// rows 2 and 3, so one multiply by x + 128 (0..255) adds both rows' code·(x + 128): over the
// 64 weights a half sums to at most 64 · 3 · 255 < 2^16. Then Σ code·x = that − 128·Σ code.
fn dot_rows4(w0: vec4<u32>, w1: vec4<u32>, w2: vec4<u32>, w3: vec4<u32>, xo: u32) -> vec4<i32> {
    // Bytes 0 and 1 of both rows' words in lo, bytes 2 and 3 in hi.
    let m16 = vec4<u32>(0xffffu);
    let h16 = vec4<u32>(0xffff0000u);
    let s16 = vec4<u32>(16u);
    let lo_a = (w0 & m16) | (w1 << s16);
    let hi_a = (w0 >> s16) | (w1 & h16);
    let lo_b = (w2 & m16) | (w3 << s16);
    let hi_b = (w2 >> s16) | (w3 & h16);
    let m2 = vec4<u32>(0x00030003u);
    let m8 = vec4<u32>(0xffu);
    var acc_a = 0u;
    var acc_b = 0u;
    for (var l = 0u; l < 4u; l++) {
        // Word k of the vec4 meets code word k; byte b of each at bits 6 − 2l of byte b.
        let x = xq[xo + 2u * l] ^ vec4<u32>(0x80808080u);
        let sh = vec4<u32>(6u - 2u * l);
        let sh8 = sh + vec4<u32>(8u);
        let x0 = x & m8;
        let x1 = (x >> vec4<u32>(8u)) & m8;
        let x2 = (x >> s16) & m8;
        let x3 = x >> vec4<u32>(24u);
        acc_a += dot((lo_a >> sh) & m2, x0) + dot((lo_a >> sh8) & m2, x1) + dot((hi_a >> sh) & m2, x2) + dot((hi_a >> sh8) & m2, x3);
        acc_b += dot((lo_b >> sh) & m2, x0) + dot((lo_b >> sh8) & m2, x1) + dot((hi_b >> sh) & m2, x2) + dot((hi_b >> sh8) & m2, x3);
    }
    let s = vec4<i32>(vec4<u32>(acc_a & 0xffffu, acc_a >> 16u, acc_b & 0xffffu, acc_b >> 16u));
    return s - 128 * vec4<i32>(vec4<u32>(code_sum4(w0), code_sum4(w1), code_sum4(w2), code_sum4(w3)));
}

// The sum of the 16 codes of each word of `w`, over the four words (a 2-bit code is its low
// bit plus twice its high bit).
fn code_sum4(w: vec4<u32>) -> u32 {
    let c = countOneBits(w & vec4<u32>(0x55555555u)) + 2u * countOneBits(w & vec4<u32>(0xaaaaaaaau));
    return c.x + c.y + c.z + c.w;
}

// Σ x over the same 64 activations (TQ2_0's per-block −1), written out as above.
fn ones_rows(xo: u32) -> i32 {
    var d = vec4<i32>(0);
    for (var l = 0u; l < 4u; l++) {
        let x = xq[xo + 2u * l];
        d += i8x4(x.x) + i8x4(x.y) + i8x4(x.z) + i8x4(x.w);
    }
    return hsum(d);
}

// The first of the thread's four rows, and the rows it reads: `rows` clamped to the last row, so
// every load is in bounds (only rows below n_out are stored).
fn rows_of(wg: u32, lid: u32) -> u32 {
    return (wg * WG + lid) * 4u;
}

fn rows_read(rows: vec4<u32>) -> vec4<u32> {
    return min(rows, vec4<u32>(dims.n_out - 1u));
}
