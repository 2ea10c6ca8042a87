// Shared by gemm.wgsl and gemm_lanes.wgsl: the prompt GEMM's shape, bindings, tile and
// epilogue (op 0: y = v; 1: y += v, the O and down projections; 2 and 3: y = act(y)·v with
// act ReLU² or SiLU, the up projection over the gate's output).
struct Dims {
    n_in: u32,
    n_out: u32,
    // u32 words of codes per row (n_in / 16)
    words: u32,
    op: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read> wt: array<u32>;
@group(0) @binding(3) var<storage, read> sc: array<f32>;
@group(0) @binding(4) var<storage, read> xq: array<u32>;
@group(0) @binding(5) var<storage, read> xs: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

const BM: u32 = 64u;
const BN: u32 = 64u;

// Output o's value v, by dims.op.
fn put(o: u32, v: f32) {
    if dims.op == 0u {
        y[o] = v;
    } else if dims.op == 1u {
        y[o] = y[o] + v;
    } else if dims.op == 2u {
        let p = max(y[o], 0.0);
        y[o] = (p * p) * v;
    } else {
        let g = y[o];
        y[o] = (g / (1.0 + exp(-g))) * v;
    }
}
