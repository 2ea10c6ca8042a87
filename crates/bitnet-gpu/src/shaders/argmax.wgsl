// Greedy decoding on the device: the first index of the largest logit of each row of
// logits (workgroup y: the row, one a batched step's sequence), in GROUPS workgroups a row
// over consecutive ranges of it, each writing its (index, value) pair; the CPU takes the best pair (the larger value, then the lower index), so a step reads
// back 8 · GROUPS bytes instead of the vocabulary. A NaN or infinite logit is the model's
// error, not a candidate: its range writes (NONFINITE, the lowest such index) instead.
struct Dims {
    n_vocab: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> best: array<u32>;

const WG: u32 = 256u;
var<workgroup> bv: array<f32, 256>;
var<workgroup> bi: array<u32, 256>;
// 0xffffffff − the lowest non-finite index seen (0: none; workgroup memory starts zeroed).
var<workgroup> bad: atomic<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    if wg.y >= step.out_rows {
        return;
    }
    let base = wg.y * dims.n_vocab;
    let per = (dims.n_vocab + GROUPS - 1u) / GROUPS;
    let lo = wg.x * per;
    let hi = min(dims.n_vocab, lo + per);
    var v = -3.4e38;
    var idx = 0xffffffffu;
    for (var i = lo + lid.x; i < hi; i += WG) {
        let x = logits[base + i];
        // All exponent bits set: NaN or ±∞ (tested on the bits: NaN compares are not kept).
        if (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u {
            atomicMax(&bad, 0xffffffffu - i);
        }
        if x > v || (idx == 0xffffffffu && x == v) {
            v = x;
            idx = i;
        }
    }
    bv[lid.x] = v;
    bi[lid.x] = idx;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid.x < k {
            let ov = bv[lid.x + k];
            let oi = bi[lid.x + k];
            if ov > bv[lid.x] || (ov == bv[lid.x] && oi < bi[lid.x]) {
                bv[lid.x] = ov;
                bi[lid.x] = oi;
            }
        }
        workgroupBarrier();
    }
    if lid.x == 0u {
        let b = atomicLoad(&bad);
        let at = 2u * (wg.y * GROUPS + wg.x);
        if b != 0u {
            best[at] = NONFINITE;
            best[at + 1u] = 0xffffffffu - b;
        } else {
            best[at] = bi[0];
            best[at + 1u] = bitcast<u32>(bv[0]);
        }
    }
}
