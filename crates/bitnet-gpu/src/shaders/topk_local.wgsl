// The K = 64 most likely tokens of the last logits row, first pass: workgroup g takes the
// `chunk` logits from g·chunk and writes its own 64 best as (id, logit bits) pairs, best
// first, in the order "higher logit, then lower id". NaN counts as -inf; -inf never wins
// (a slot without a valid token gets id 0xffffffff).
struct Dims {
    n_vocab: u32,
    chunk: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> cand: array<u32>;

const WG: u32 = 256u;
const K: u32 = 64u;
// values per thread: chunk ≤ 256 · 16
const P: u32 = 16u;
const NONE: u32 = 0xffffffffu;
const NEG: f32 = -3.4028235e38;

var<workgroup> sv: array<f32, 256>;
var<workgroup> si: array<u32, 256>;

fn better(v: f32, i: u32, w: f32, j: u32) -> bool {
    return v > w || (v == w && i < j);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let base = (step.out_rows - 1u) * dims.n_vocab;
    let start = wg.x * dims.chunk;
    let end = min(start + dims.chunk, dims.n_vocab);
    var v: array<f32, 16>;
    var id: array<u32, 16>;
    for (var j = 0u; j < P; j++) {
        let i = start + lid.x + j * WG;
        v[j] = NEG;
        id[j] = NONE;
        if i < end {
            let x = logits[base + i];
            // NaN and -inf are no candidates (x == x is false for NaN).
            if x == x && x > NEG {
                v[j] = x;
                id[j] = i;
            }
        }
    }
    for (var r = 0u; r < K; r++) {
        var bv = NEG;
        var bi = NONE;
        var bj = 0u;
        for (var j = 0u; j < P; j++) {
            if id[j] != NONE && (bi == NONE || better(v[j], id[j], bv, bi)) {
                bv = v[j];
                bi = id[j];
                bj = j;
            }
        }
        sv[lid.x] = bv;
        si[lid.x] = bi;
        workgroupBarrier();
        for (var k = WG / 2u; k > 0u; k >>= 1u) {
            if lid.x < k {
                let ov = sv[lid.x + k];
                let oi = si[lid.x + k];
                if oi != NONE && (si[lid.x] == NONE || better(ov, oi, sv[lid.x], si[lid.x])) {
                    sv[lid.x] = ov;
                    si[lid.x] = oi;
                }
            }
            workgroupBarrier();
        }
        let wv = sv[0];
        let wi = si[0];
        if wi != NONE && wi == bi {
            id[bj] = NONE;
        }
        if lid.x == 0u {
            let o = (wg.x * K + r) * 2u;
            cand[o] = wi;
            cand[o + 1u] = bitcast<u32>(wv);
        }
        workgroupBarrier();
    }
}
