// Shared by every kernel: the per-call parameters, rewritten before each submission.
struct Step {
    // token rows in this call
    n_tok: u32,
    // position of the first row (the cache already holds 0..pos0)
    pos0: u32,
    // first row whose logits are wanted, and how many
    out_first: u32,
    out_rows: u32,
    // the call's first row in the activation buffers: 0, but for a cache's kernels in a
    // batched step, the row of its sequence's token
    row0: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

// The id the arg-max and top-k kernels give a range that held a NaN or infinite logit; its
// value slot holds the lowest such index (the model's error: the CPU refuses those logits
// too). The host's `NON_FINITE` in model.rs.
const NONFINITE: u32 = 0xfffffffeu;

// The int8 activation scale 127 / max(1e-5, m) of a row whose largest |y|, as bits, is
// `m_bits` (the maximum taken on the bits, so that a NaN, whose bits are above +∞'s, is not
// passed over as float max may pass it). A row with a NaN gets a NaN scale (its own bits: a
// NaN written as a constant is not valid WGSL), so its outputs, T / s, are NaN too and reach
// the logits' checks instead of being quantized away.
fn quant_scale(m_bits: u32) -> f32 {
    if m_bits > 0x7f800000u {
        return bitcast<f32>(m_bits);
    }
    return 127.0 / max(bitcast<f32>(m_bits), 1e-5);
}

// Q8_0 as bitnet_kernels' quantizer encodes a block of 32 (`quantize_q8_0_split`): the scale
// d = max|y| / 127 kept as its f16 value, each code y·(1/d) (d before rounding) rounded half
// away from zero and clamped, as a byte. The largest |y| is taken on the bits, so a block
// with a NaN gets a NaN scale (its values decode to NaN and reach the logits' checks).
fn q8_inv(m_bits: u32) -> vec2<f32> {
    let d = bitcast<f32>(m_bits) / 127.0;
    var id = 0.0;
    if d != 0.0 {
        id = 1.0 / d;
    }
    return vec2<f32>(unpack2x16float(pack2x16float(vec2<f32>(d, 0.0))).x, id);
}

fn q8_code(v: f32) -> u32 {
    let r = clamp(sign(v) * floor(abs(v) + 0.5), -128.0, 127.0);
    return bitcast<u32>(i32(r)) & 0xffu;
}

// The four int8 values of a packed word, sign-extended (byte 0 in x).
fn i8x4(x: u32) -> vec4<i32> {
    return vec4<i32>(
        bitcast<i32>(x << 24u) >> 24u,
        bitcast<i32>(x << 16u) >> 24u,
        bitcast<i32>(x << 8u) >> 24u,
        bitcast<i32>(x) >> 24u,
    );
}

// Byte b of w as a signed value.
fn i8_at(w: u32, b: u32) -> f32 {
    return f32(bitcast<i32>(w << (24u - 8u * b)) >> 24u);
}
