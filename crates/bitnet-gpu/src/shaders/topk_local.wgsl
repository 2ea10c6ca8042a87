// The K = 64 most likely tokens of the last logits row, first pass: workgroup g takes the
// `chunk` logits from g·chunk (at most 256 · P) and writes its own 64 best as (id, logit
// bits) pairs, best first, in the order "higher logit, then lower id" (a slot without a
// token gets id 0xffffffff). A NaN or infinite logit is no candidate, and makes the
// workgroup's first pair (NONFINITE, the lowest such index). The selection is
// topk_select.wgsl's.
struct Dims {
    n_vocab: u32,
    chunk: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let base = (step.out_rows - 1u) * dims.n_vocab;
    let start = wg.x * dims.chunk;
    let end = min(start + dims.chunk, dims.n_vocab);
    var v: array<f32, 64>;
    var id: array<u32, 64>;
    for (var j = 0u; j < P; j++) {
        let i = start + lid.x + j * WG;
        v[j] = NEG;
        id[j] = NONE;
        if i < end {
            let x = logits[base + i];
            // All exponent bits set: NaN or ±∞ (tested on the bits: NaN compares are not kept).
            if (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u {
                atomicMax(&bad, 0xffffffffu - i);
            } else if x > NEG {
                v[j] = x;
                id[j] = i;
            }
        }
    }
    select_top(&v, &id, lid.x, wg.x * K);
    mark_non_finite(lid.x, wg.x * K);
}
