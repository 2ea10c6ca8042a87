// The FFN's gate and up projections and the activation in one kernel:
// g = act(Lin(W_gate, x)) · Lin(W_up, x), act = ReLU² (act 1) or SiLU (act 2). Both matrices
// are read in the same pass over one row each, so the activations are read once; the codes,
// modes and output steps are those of ternary.wgsl.
struct Dims {
    n_in: u32,
    n_out: u32,
    words: u32,
    mode: u32,
    act: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read> wg: array<u32>;
@group(0) @binding(3) var<storage, read> sg: array<f32>;
@group(0) @binding(4) var<storage, read> wu: array<u32>;
@group(0) @binding(5) var<storage, read> su: array<f32>;
@group(0) @binding(6) var<storage, read> xq: array<u32>;
@group(0) @binding(7) var<storage, read> xs: array<f32>;
@group(0) @binding(8) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
const TT: u32 = 4u;
var<workgroup> rgi: array<vec4<i32>, 64>;
var<workgroup> rgf: array<vec4<f32>, 64>;
var<workgroup> rui: array<vec4<i32>, 64>;
var<workgroup> ruf: array<vec4<f32>, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wgid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let r = wgid.x;
    let t0 = wgid.y * TT;
    let nt = min(TT, step.n_tok - t0);
    let xw = dims.n_in / 4u;
    let nb = dims.n_in / 256u;
    var gi = vec4<i32>(0);
    var gf = vec4<f32>(0.0);
    var ui = vec4<i32>(0);
    var uf = vec4<f32>(0.0);
    for (var w = lid.x; w < dims.words; w += WG) {
        let word_g = wg[r * dims.words + w];
        let word_u = wu[r * dims.words + w];
        let xbase = (w / 8u) * 32u + (w % 8u);
        var cg: array<u32, 4>;
        var cu: array<u32, 4>;
        for (var l = 0u; l < 4u; l++) {
            cg[l] = (word_g >> (6u - 2u * l)) & 0x03030303u;
            cu[l] = (word_u >> (6u - 2u * l)) & 0x03030303u;
        }
        var dg = 0.0;
        var du = 0.0;
        if dims.mode == 1u {
            dg = sg[r * nb + w / 16u];
            du = su[r * nb + w / 16u];
        }
        for (var ti = 0u; ti < TT; ti++) {
            if ti < nt {
                let xo = (t0 + ti) * xw + xbase;
                var a = 0;
                var b = 0;
                for (var l = 0u; l < 4u; l++) {
                    let xv = xq[xo + 8u * l];
                    let ones = dot4I8Packed(0x01010101u, xv);
                    a += dot4I8Packed(cg[l], xv) - ones;
                    b += dot4I8Packed(cu[l], xv) - ones;
                }
                if dims.mode == 0u {
                    gi[ti] += a;
                    ui[ti] += b;
                } else {
                    gf[ti] += f32(a) * dg;
                    uf[ti] += f32(b) * du;
                }
            }
        }
    }
    rgi[lid.x] = gi;
    rgf[lid.x] = gf;
    rui[lid.x] = ui;
    ruf[lid.x] = uf;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid.x < k {
            rgi[lid.x] += rgi[lid.x + k];
            rgf[lid.x] += rgf[lid.x + k];
            rui[lid.x] += rui[lid.x + k];
            ruf[lid.x] += ruf[lid.x + k];
        }
        workgroupBarrier();
    }
    if lid.x < nt {
        let t = t0 + lid.x;
        var g: f32;
        var u: f32;
        if dims.mode == 0u {
            g = (f32(rgi[0][lid.x]) / xs[t]) * sg[0];
            u = (f32(rui[0][lid.x]) / xs[t]) * su[0];
        } else {
            g = rgf[0][lid.x] / xs[t];
            u = ruf[0][lid.x] / xs[t];
        }
        var a: f32;
        if dims.act == 1u {
            let p = max(g, 0.0);
            a = (p * p) * u;
        } else {
            a = (g / (1.0 + exp(-g))) * u;
        }
        y[t * dims.n_out + r] = a;
    }
}
