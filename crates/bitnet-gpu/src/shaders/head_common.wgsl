// Shared by head.wgsl and head_lanes.wgsl: the F16/F32 LM head chunk's bindings (its shape
// and stores: head_shared.wgsl).

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> hn: array<f32>;
@group(0) @binding(4) var<storage, read_write> logits: array<f32>;
