// Shared by topk_local.wgsl and topk_merge.wgsl: K rounds of a workgroup-wide selection. Each
// thread holds up to P (value, id) pairs (id NONE: empty); round r finds the best pair of the
// workgroup in the order "higher logit, then lower id", writes it to out[2·(at + r)] (id) and
// out[2·(at + r) + 1] (logit bits), and its owner drops it. The including shader declares
// `out`.
const WG: u32 = 256u;
const K: u32 = 64u;
const P: u32 = 64u;
const NONE: u32 = 0xffffffffu;
const NEG: f32 = -0x1.fffffep+127f;

var<workgroup> sv: array<f32, 256>;
var<workgroup> si: array<u32, 256>;
// 0xffffffff − the lowest non-finite index seen (0: none; workgroup memory starts zeroed).
var<workgroup> bad: atomic<u32>;

// After select_top: a workgroup that saw a non-finite logit overwrites its first pair with
// (NONFINITE, the lowest index).
fn mark_non_finite(lid: u32, at: u32) {
    if lid == 0u {
        let b = atomicLoad(&bad);
        if b != 0u {
            out[2u * at] = NONFINITE;
            out[2u * at + 1u] = 0xffffffffu - b;
        }
    }
}

fn better(v: f32, i: u32, w: f32, j: u32) -> bool {
    return v > w || (v == w && i < j);
}

fn select_top(v: ptr<function, array<f32, 64>>, id: ptr<function, array<u32, 64>>, lid: u32, at: u32) {
    for (var r = 0u; r < K; r++) {
        var bv = NEG;
        var bi = NONE;
        var bj = 0u;
        for (var j = 0u; j < P; j++) {
            if (*id)[j] != NONE && (bi == NONE || better((*v)[j], (*id)[j], bv, bi)) {
                bv = (*v)[j];
                bi = (*id)[j];
                bj = j;
            }
        }
        sv[lid] = bv;
        si[lid] = bi;
        workgroupBarrier();
        for (var k = WG / 2u; k > 0u; k >>= 1u) {
            if lid < k {
                let ov = sv[lid + k];
                let oi = si[lid + k];
                if oi != NONE && (si[lid] == NONE || better(ov, oi, sv[lid], si[lid])) {
                    sv[lid] = ov;
                    si[lid] = oi;
                }
            }
            workgroupBarrier();
        }
        let wv = sv[0];
        let wi = si[0];
        if wi != NONE && wi == bi {
            (*id)[bj] = NONE;
        }
        if lid == 0u {
            out[2u * (at + r)] = wi;
            out[2u * (at + r) + 1u] = bitcast<u32>(wv);
        }
        workgroupBarrier();
    }
}
