// Element-wise steps over n_tok rows of `width`: the residual add (mode 0: a += b) and the
// FFN activation (mode 1: a = relu(a)²·b, mode 2: a = silu(a)·b).
struct Dims {
    width: u32,
    mode: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read_write> a: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if i >= step.n_tok * dims.width {
        return;
    }
    let x = a[i];
    let y = b[i];
    switch dims.mode {
        case 0u: {
            a[i] = x + y;
        }
        case 1u: {
            let r = max(x, 0.0);
            a[i] = (r * r) * y;
        }
        default: {
            a[i] = (x / (1.0 + exp(-x))) * y;
        }
    }
}
