// Shared by mv_glu.wgsl and mv_glu_rows.wgsl: the gate's and the up projection's codes and
// scales, the output, and a row's value act(g)·u from its sums (dims.op 1 ReLU², 2 SiLU).
@group(0) @binding(2) var<storage, read> wg_: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> sg: array<f32>;
@group(0) @binding(4) var<storage, read> wu: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> su: array<f32>;
@group(0) @binding(8) var<storage, read_write> y: array<f32>;

fn glu_act(g: f32, u: f32) -> f32 {
    if dims.op == 1u {
        let p = max(g, 0.0);
        return (p * p) * u;
    }
    return (g / (1.0 + exp(-g))) * u;
}

// Token ti's value of a row from its integer sums gi, ui (mode 0: one tensor scale each) or
// its block-scaled sums gf, uf (mode 1).
fn glu_out(gi: i32, ui: i32, gf: f32, uf: f32, ti: u32) -> f32 {
    if dims.mode == 0u {
        let g = (f32(gi - tok_sum[ti]) / tok_s[ti]) * sg[0];
        let u = (f32(ui - tok_sum[ti]) / tok_s[ti]) * su[0];
        return glu_act(g, u);
    }
    return glu_act(gf / tok_s[ti], uf / tok_s[ti]);
}
