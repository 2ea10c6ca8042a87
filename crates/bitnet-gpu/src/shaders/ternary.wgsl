// Lin(W, x) of docs/FORMATS.md §1 for up to TT token rows per workgroup, one output row each.
//
// Weights are 2-bit codes (value = code − 1) in I2_S order: per 128 elements 32 bytes, byte p
// holding elements p, p+32, p+64, p+96 in bits 7–6, 5–4, 3–2, 1–0. Word w of a row holds
// bytes 4w..4w+3 of block w / 8, so `(word >> (6 − 2l)) & 0x03030303` is the codes of four
// consecutive elements, which meet one packed activation word.
// mode 0 (I2_S): T = Σ (code − 1)·q in i32, y = (T / s)·β with β = sc[0].
// mode 1 (TQ2_0): per 256-element block b, y = Σ_b T_b·d_b / s with d = sc[row·nb + b].
// accumulate 1: y += Lin(W, x) (the O and down projections add into the residual stream).
struct Dims {
    n_in: u32,
    n_out: u32,
    // u32 words of codes per row (n_in / 16)
    words: u32,
    mode: u32,
    accumulate: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read> wt: array<u32>;
@group(0) @binding(3) var<storage, read> sc: array<f32>;
@group(0) @binding(4) var<storage, read> xq: array<u32>;
@group(0) @binding(5) var<storage, read> xs: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
const TT: u32 = 4u;
var<workgroup> redi: array<vec4<i32>, 64>;
var<workgroup> redf: array<vec4<f32>, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let r = wg.x;
    let t0 = wg.y * TT;
    let nt = min(TT, step.n_tok - t0);
    let xw = dims.n_in / 4u;
    let nb = dims.n_in / 256u;
    var acc_i = vec4<i32>(0);
    var acc_f = vec4<f32>(0.0);
    for (var w = lid.x; w < dims.words; w += WG) {
        let word = wt[r * dims.words + w];
        let xbase = (w / 8u) * 32u + (w % 8u);
        var c: array<u32, 4>;
        for (var l = 0u; l < 4u; l++) {
            c[l] = (word >> (6u - 2u * l)) & 0x03030303u;
        }
        var d = 0.0;
        if dims.mode == 1u {
            d = sc[r * nb + w / 16u];
        }
        for (var ti = 0u; ti < TT; ti++) {
            if ti < nt {
                let xo = (t0 + ti) * xw + xbase;
                var dot = 0;
                for (var l = 0u; l < 4u; l++) {
                    let xv = xq[xo + 8u * l];
                    dot += dot4I8Packed(c[l], xv) - dot4I8Packed(0x01010101u, xv);
                }
                if dims.mode == 0u {
                    acc_i[ti] += dot;
                } else {
                    acc_f[ti] += f32(dot) * d;
                }
            }
        }
    }
    redi[lid.x] = acc_i;
    redf[lid.x] = acc_f;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid.x < k {
            redi[lid.x] += redi[lid.x + k];
            redf[lid.x] += redf[lid.x + k];
        }
        workgroupBarrier();
    }
    if lid.x < nt {
        let t = t0 + lid.x;
        var v: f32;
        if dims.mode == 0u {
            v = (f32(redi[0][lid.x]) / xs[t]) * sc[0];
        } else {
            v = redf[0][lid.x] / xs[t];
        }
        let o = t * dims.n_out + r;
        if dims.accumulate == 1u {
            y[o] = y[o] + v;
        } else {
            y[o] = v;
        }
    }
}
