// The final norm for a quantized LM head (head_q*.wgsl): each wanted row normed as
// rmsnorm.wgsl norms it, then quantized per 32 to Q8_0 (common.wgsl's `q8_inv`, `q8_code`):
// the codes four a word into yq, each block's scale into yd.
@group(0) @binding(4) var<storage, read_write> yq: array<u32>;
@group(0) @binding(5) var<storage, read_write> yd: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let src = (step.out_first + wg.x) * dims.width;
    let nb = dims.width / 32u;
    let scale = rms_scale(src, lid.x);
    for (var b = lid.x; b < nb; b += WG) {
        let i0 = 32u * b;
        var m = 0u;
        for (var i = 0u; i < 32u; i++) {
            m = max(m, bitcast<u32>(abs((x[src + i0 + i] * scale) * w[i0 + i])));
        }
        let q = q8_inv(m);
        yd[wg.x * nb + b] = q.x;
        for (var k = 0u; k < 8u; k++) {
            var word = 0u;
            for (var j = 0u; j < 4u; j++) {
                let i = i0 + 4u * k + j;
                word |= q8_code((x[src + i] * scale) * w[i] * q.y) << (8u * j);
            }
            yq[wg.x * (dims.width / 4u) + 8u * b + k] = word;
        }
    }
}
