// The K = 64 most likely tokens, second pass: one workgroup takes the first pass's `n_cand`
// (id, logit bits) pairs (at most 256 · P) and writes the 64 best, best first, in the order
// "higher logit, then lower id" (entries with id 0xffffffff are empty); a first pass's
// (NONFINITE, index) pair makes the first pair (NONFINITE, the lowest index). The selection
// is topk_select.wgsl's.
struct Dims {
    n_cand: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read> cand: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
    // Every kernel reads `step` (it is in every layout); a call without output rows has no
    // row to select from.
    if step.out_rows == 0u {
        return;
    }
    var v: array<f32, 64>;
    var id: array<u32, 64>;
    for (var j = 0u; j < P; j++) {
        let c = lid.x + j * WG;
        v[j] = NEG;
        id[j] = NONE;
        if c < dims.n_cand {
            if cand[2u * c] == NONFINITE {
                atomicMax(&bad, 0xffffffffu - cand[2u * c + 1u]);
            } else {
                id[j] = cand[2u * c];
                v[j] = bitcast<f32>(cand[2u * c + 1u]);
            }
        }
    }
    select_top(&v, &id, lid.x, 0u);
    mark_non_finite(lid.x, 0u);
}
