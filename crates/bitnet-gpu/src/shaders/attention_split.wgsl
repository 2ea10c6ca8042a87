// Shared by attention.wgsl and attention_merge.wgsl: their shapes and uniforms, and how a
// call's positions are split over workgroups. A call of at most dims.split_tokens rows (a
// decode step; 0 on the lane kernels' adapters, where the heads alone outnumber the cores) cuts the positions into n_split() chunks of chunk_len() (whole blocks of 64), one
// workgroup each (its z index), so that a long history keeps the whole GPU busy; the merge
// kernel then combines the chunks' softmax states. A longer call (a prompt) has rows enough:
// one workgroup per (head, row) sees every position. CHUNK (the fewest positions worth a
// chunk) and MAX_SPLIT are defined in front of this file from the Rust constants, which the
// dispatch uses too.

struct Dims {
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    scale: f32,
    // calls of at most this many rows split their positions (model.rs's `attn_split_tokens`)
    split_tokens: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;

// Threads per workgroup; each holds dimensions lid, lid + WG, ... of a row (head_dim ≤ WG · ACC).
const WG: u32 = 64u;
const ACC: u32 = 4u;

fn n_split() -> u32 {
    if step.n_tok > dims.split_tokens {
        return 1u;
    }
    return min(MAX_SPLIT, (step.pos0 + step.n_tok + CHUNK - 1u) / CHUNK);
}

fn chunk_len(ns: u32) -> u32 {
    let n_kv = step.pos0 + step.n_tok;
    return ((n_kv + ns - 1u) / ns + 63u) / 64u * 64u;
}
