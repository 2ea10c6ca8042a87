// Shared by norm_quant.wgsl and rmsnorm.wgsl: RMSNorm's bindings and its row scale.
struct Dims {
    width: u32,
    eps: f32,
    // 1: no RMSNorm, the rows pass as they are (scale 1, weights all ones): a block without
    // sub-norms (`llama`) quantizes its attention output and FFN activation directly
    plain: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;

// WG, the workgroup's threads, is defined in front of this file (rmsnorm: 256; norm_quant:
// 256, or 32 on the CPU-lane adapters, where each tree level's barrier costs more than the
// threads it adds save).
var<workgroup> red: array<f32, WG>;

// 1 / sqrt(mean(x²) + eps) of the row at x[base..base + width], for the whole workgroup
// (leaves `red` free for the caller once every thread has it).
fn rms_scale(base: u32, lid: u32) -> f32 {
    var ss = 0.0;
    for (var i = lid; i < dims.width; i += WG) {
        let v = x[base + i];
        ss += v * v;
    }
    red[lid] = ss;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid < k {
            red[lid] += red[lid + k];
        }
        workgroupBarrier();
    }
    var scale = 1.0 / sqrt(red[0] / f32(dims.width) + dims.eps);
    if dims.plain != 0u {
        scale = 1.0;
    }
    workgroupBarrier();
    return scale;
}
