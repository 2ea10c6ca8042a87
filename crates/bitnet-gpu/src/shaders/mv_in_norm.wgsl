// The decode kernels' input as f32 rows x and the norm's weights: each workgroup norms and
// quantizes them itself (no dispatch of its own). Bindings B_IN0 and B_IN1 are set where
// this file is put in front of mv.wgsl or mv_glu.wgsl.
@group(0) @binding(B_IN0) var<storage, read> xin: array<vec4<f32>>;
@group(0) @binding(B_IN1) var<storage, read> nw: array<vec4<f32>>;

// `dims.eps` of an input with no RMSNorm (a NaN's bits, never an eps): the rows are
// quantized as they are (scale 1; the weights bound are all ones).
const NO_NORM: u32 = 0xffffffffu;

fn x_in(i: u32) -> vec4<f32> {
    return xin[i];
}

// y = RMS(x, w) then q = clamp(round_half_even(y·s)), s = 127 / max(1e-5, max|y|) (NaN for
// a row with a NaN), as norm_quant.wgsl computes it, for tokens t0..t0 + nt into xq (token i
// at vec4 i·n_in/16).
// Each thread holds its elements (4 consecutive ones per vec4, PV vec4s at most) in
// registers, so the row is read once: n_in ≤ 4·WG·PV.
fn prologue(t0: u32, nt: u32, lid: u32) {
    let n4 = dims.n_in / 4u;
    let eps = bitcast<f32>(dims.eps);
    for (var ti = 0u; ti < nt; ti++) {
        let base = (t0 + ti) * n4;
        var xv: array<vec4<f32>, PV>;
        var wv: array<vec4<f32>, PV>;
        var ss = 0.0;
        for (var k = 0u; k < PV; k++) {
            let j = lid + k * WG;
            if j < n4 {
                xv[k] = x_in(base + j);
                wv[k] = nw[j];
                ss += dot(xv[k], xv[k]);
            }
        }
        var scale = 1.0 / sqrt(wg_sum(vec4<f32>(ss, 0.0, 0.0, 0.0), lid).x / f32(dims.n_in) + eps);
        if dims.eps == NO_NORM {
            scale = 1.0;
        }
        // The maximum on the bits of |y| (below 2^31, so as i32 too): see `quant_scale`.
        var m = 0u;
        for (var k = 0u; k < PV; k++) {
            if lid + k * WG < n4 {
                let y = bitcast<vec4<u32>>((xv[k] * scale) * wv[k]) & vec4<u32>(0x7fffffffu);
                m = max(m, max(max(y.x, y.y), max(y.z, y.w)));
            }
        }
        let s = quant_scale(bitcast<u32>(wg_max_i(vec4<i32>(bitcast<i32>(m), 0, 0, 0), lid).x));
        var acc = 0;
        for (var k = 0u; k < PV; k++) {
            let j = lid + k * WG;
            if j < n4 {
                let q = vec4<i32>(clamp(round(((xv[k] * scale) * wv[k]) * s), vec4<f32>(-128.0), vec4<f32>(127.0)));
                acc += q.x + q.y + q.z + q.w;
                let b = bitcast<vec4<u32>>(q) & vec4<u32>(0xffu);
                let at = ti * n4 + j;
                xq[at / 4u][at % 4u] = b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
            }
        }
        let qs = wg_sum_i(vec4<i32>(acc, 0, 0, 0), lid).x;
        if lid == 0u {
            tok_s[ti] = s;
            tok_sum[ti] = qs;
        }
    }
    workgroupBarrier();
}

