// The final norm: y[r] = RMS(x[out_first + r], w) for the rows whose logits are wanted.
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let src = (step.out_first + wg.x) * dims.width;
    let dst = wg.x * dims.width;
    let scale = rms_scale(src, lid.x);
    for (var i = lid.x; i < dims.width; i += WG) {
        y[dst + i] = (x[src + i] * scale) * w[i];
    }
}
