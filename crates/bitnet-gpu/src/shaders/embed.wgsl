// Token embedding rows, copied from the embedding's buffers into `rows` (one row per token in
// its stored type), widened to the f32 residual stream h.
struct Dims {
    n_embd: u32,
    // 0: F16 rows, 1: F32 rows
    ty: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read> rows: array<u32>;
@group(0) @binding(3) var<storage, read_write> h: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wg.x;
    if t >= step.n_tok {
        return;
    }
    let e = dims.n_embd;
    if dims.ty == 0u {
        let words = e / 2u;
        for (var j = lid.x; j < words; j += 256u) {
            let v = unpack2x16float(rows[t * words + j]);
            h[t * e + 2u * j] = v.x;
            h[t * e + 2u * j + 1u] = v.y;
        }
    } else {
        for (var i = lid.x; i < e; i += 256u) {
            h[t * e + i] = bitcast<f32>(rows[t * e + i]);
        }
    }
}
