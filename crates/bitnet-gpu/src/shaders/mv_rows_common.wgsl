// Shared by the decode kernels for adapters that run a workgroup's invocations as the lanes
// of a CPU's SIMD registers (lavapipe, SwiftShader): one thread computes four output rows
// over the whole input, so no reduction crosses threads, and each activation word it
// unpacks serves four rows. The packed int8 dot is written out (sign-extended bytes times
// the codes) because these drivers lower `dot4I8Packed` to slower code.

// The four int8 values of a packed activation word, sign-extended.
fn unpack_x(x: u32) -> vec4<i32> {
    return vec4<i32>(
        bitcast<i32>(x << 24u) >> 24u,
        bitcast<i32>(x << 16u) >> 24u,
        bitcast<i32>(x << 8u) >> 24u,
        bitcast<i32>(x) >> 24u,
    );
}

// The four 2-bit codes in the low bits of each byte of `c` (the caller shifts them there).
fn unpack_c(c: u32) -> vec4<i32> {
    return vec4<i32>(vec4<u32>(c, c >> 8u, c >> 16u, c >> 24u) & vec4<u32>(3u));
}

fn hsum(v: vec4<i32>) -> i32 {
    return v.x + v.y + v.z + v.w;
}

// Σ code·x of four rows' vec4 of code words (64 weights each, I2_S order as in
// mv_common.wgsl) against the token at activation vec4 `xo`: component i is row i's.
fn dot_rows4(w0: vec4<u32>, w1: vec4<u32>, w2: vec4<u32>, w3: vec4<u32>, xo: u32) -> vec4<i32> {
    var d = vec4<i32>(0);
    for (var l = 0u; l < 4u; l++) {
        let x = xq[xo + 2u * l];
        let x0 = unpack_x(x.x);
        let x1 = unpack_x(x.y);
        let x2 = unpack_x(x.z);
        let x3 = unpack_x(x.w);
        let sh = 6u - 2u * l;
        d += vec4<i32>(
            hsum(unpack_c(w0.x >> sh) * x0 + unpack_c(w0.y >> sh) * x1 + unpack_c(w0.z >> sh) * x2 + unpack_c(w0.w >> sh) * x3),
            hsum(unpack_c(w1.x >> sh) * x0 + unpack_c(w1.y >> sh) * x1 + unpack_c(w1.z >> sh) * x2 + unpack_c(w1.w >> sh) * x3),
            hsum(unpack_c(w2.x >> sh) * x0 + unpack_c(w2.y >> sh) * x1 + unpack_c(w2.z >> sh) * x2 + unpack_c(w2.w >> sh) * x3),
            hsum(unpack_c(w3.x >> sh) * x0 + unpack_c(w3.y >> sh) * x1 + unpack_c(w3.z >> sh) * x2 + unpack_c(w3.w >> sh) * x3),
        );
    }
    return d;
}

// Σ x over the same 64 activations (TQ2_0's per-block −1), written out as above.
fn ones_rows(xo: u32) -> i32 {
    var d = vec4<i32>(0);
    for (var l = 0u; l < 4u; l++) {
        let x = xq[xo + 2u * l];
        d += unpack_x(x.x) + unpack_x(x.y) + unpack_x(x.z) + unpack_x(x.w);
    }
    return hsum(d);
}

// The first of the thread's four rows, and the rows it reads (clamped to the last row, so
// every load is in bounds; only rows below n_out are stored).
fn rows_of(wg: u32, lid: u32) -> u32 {
    return (wg * WG + lid) * 4u;
}

fn rows_read(r0: u32) -> vec4<u32> {
    return min(r0 + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(dims.n_out - 1u));
}
