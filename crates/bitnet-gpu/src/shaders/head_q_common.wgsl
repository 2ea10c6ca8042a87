// Shared by head_q.wgsl and head_q_lanes.wgsl: one chunk of an LM head quantized per 32
// (Q8_0 or Q4_0, as bitnet_kernels' quantizer encodes it), dotted in integers with the normed
// rows quantized per 32 to Q8_0 (rmsnorm_q8.wgsl): logits[t][row0 + r] =
// Σ_b (d_w[r][b]·d_x[t][b])·Σ_i q_w·q_x, the CPU's `RowMatrix::matmul_q8`.
// A row is its codes (Q8_0: one byte a weight; Q4_0: ggml's 16 bytes a block, byte j holding
// element j low and j + 16 high) then its blocks' f16 scales, two a word (a padding half
// after an odd count). The kernel's row type is TY, a constant in front of it (2: Q8_0,
// 3: Q4_0); its shape and stores: head_shared.wgsl.

@group(0) @binding(0) var<uniform> step: Step;
@group(0) @binding(1) var<uniform> dims: Dims;
@group(0) @binding(2) var<storage, read> w: array<u32>;
// The rows' codes, four a word, n_embd / 4 words a row; their scales, n_embd / 32 a row.
@group(0) @binding(3) var<storage, read> xq: array<u32>;
@group(0) @binding(4) var<storage, read_write> logits: array<f32>;
@group(0) @binding(5) var<storage, read> xd: array<f32>;

fn code_words() -> u32 {
    if TY == 2u {
        return dims.n_embd / 4u;
    }
    return dims.n_embd / 8u;
}

fn row_words() -> u32 {
    return code_words() + (dims.n_embd / 32u + 1u) / 2u;
}

// The scale of block b of the row at word rb.
fn w_scale(rb: u32, b: u32) -> f32 {
    let s = unpack2x16float(w[rb + code_words() + b / 2u]);
    return select(s.x, s.y, (b & 1u) == 1u);
}
