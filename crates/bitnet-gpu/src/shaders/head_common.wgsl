// Shared by head.wgsl and head_lanes.wgsl: the LM head chunk's shape and bindings.
struct Dims {
    n_embd: u32,
    rows: u32,
    row0: u32,
    n_vocab: u32,
    // 0: F16 rows (two halves per word), 1: F32 rows
    ty: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> hn: array<f32>;
@group(0) @binding(4) var<storage, read_write> logits: array<f32>;
