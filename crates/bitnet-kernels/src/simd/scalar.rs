//! Scalar reference kernels: the obvious code, the source of truth for every SIMD tier.
//!
//! Ternary kernels return raw per-block sums `Σ u·q` (u = the unsigned code each layout
//! module defines); `crate::ternary` turns them into outputs. They read the activations in
//! their original order and decode codes with the layout modules' element formulas, so they
//! share nothing with the SIMD kernels' data paths.
//!
//! Float row dots define an accumulation order (documented per function) that the SIMD tiers
//! reproduce exactly; `f32::mul_add` is a fused multiply-add like the SIMD FMA.

use crate::layout::{i2s, qk256, seq32, tq1_0, tq2_0};
use crate::tier::Prepared;
use crate::tier::{Isa, Kernels};

/// I2_S: `out[ti] = Σ_j u(c_j) · q_j` over the whole row, u = (0, 1, 2, 1) for c = 0..3.
pub(crate) fn i2s(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    const U: [i32; 4] = [0, 1, 2, 1];
    for (ti, o) in out.iter_mut().enumerate().take(nt) {
        let x = p.token(t0 + ti);
        *o = x
            .iter()
            .enumerate()
            .map(|(j, &q)| U[usize::from(i2s::code(w_row, j))] * i32::from(q))
            .sum();
    }
}

/// I2_S for `out.len()` consecutive rows and one token (the twin of the SIMD several-row
/// kernels): `w` holds the rows back to back, K/4 bytes each.
// Only the x86 and simd128 tables have such a kernel (NEON's and the plain scalar table do not).
#[cfg_attr(
    not(any(
        target_arch = "x86_64",
        all(target_arch = "wasm32", target_feature = "simd128")
    )),
    allow(dead_code)
)]
pub(crate) fn i2s_rows(w: &[u8], p: &Prepared<'_>, t: usize, _clean: bool, out: &mut [i32]) {
    let rb = p.k / 4;
    for (r, o) in out.iter_mut().enumerate() {
        i2s(&w[r * rb..(r + 1) * rb], p, t, 1, std::slice::from_mut(o));
    }
}

/// TQ2_0: `out[ti·nb + b] = Σ_e c_e · q_(256b+e)`.
pub(crate) fn tq2(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    let nb = p.k / tq2_0::BLOCK_ELEMS;
    for ti in 0..nt {
        let x = p.token(t0 + ti);
        for b in 0..nb {
            let blk = &w_row[b * tq2_0::BLOCK_BYTES..][..64];
            out[ti * nb + b] = (0..256)
                .map(|e| i32::from(tq2_0::code(blk, e)) * i32::from(x[256 * b + e]))
                .sum();
        }
    }
}

/// TQ1_0: `out[ti·nb + b] = Σ_e trit_e · q_(256b+e)`.
pub(crate) fn tq1(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    let nb = p.k / tq1_0::BLOCK_ELEMS;
    for ti in 0..nt {
        let x = p.token(t0 + ti);
        for b in 0..nb {
            let blk = &w_row[b * tq1_0::BLOCK_BYTES..][..tq1_0::BLOCK_BYTES];
            out[ti * nb + b] = (0..256)
                .map(|e| i32::from(tq1_0::code(blk, e)) * i32::from(x[256 * b + e]))
                .sum();
        }
    }
}

fn seq32_blocks(
    w_row: &[u8],
    stride: usize,
    p: &Prepared<'_>,
    t0: usize,
    nt: usize,
    out: &mut [i32],
) {
    let nb = p.k / seq32::BLOCK_ELEMS;
    for ti in 0..nt {
        let x = p.token(t0 + ti);
        for b in 0..nb {
            let blk = &w_row[b * stride..][..8];
            out[ti * nb + b] = (0..32)
                .map(|i| i32::from(seq32::code(blk, i)) * i32::from(x[32 * b + i]))
                .sum();
        }
    }
}

/// BitNet32F16: `out[ti·nb + b] = Σ_i c_i · q_(32b+i)` (10-byte blocks).
pub(crate) fn bitnet32(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    seq32_blocks(w_row, seq32::INLINE_BLOCK_BYTES, p, t0, nt, out);
}

/// Split32WithSibling: as BitNet32F16 with 8-byte blocks.
pub(crate) fn split32(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    seq32_blocks(w_row, seq32::PACKED_BYTES, p, t0, nt, out);
}

/// QK256: `out[ti·nb + b] = Σ_(j in block b, j < K) u(c_j) · q_j`, u = c + (c >> 1).
pub(crate) fn qk256(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    let nb = p.k.div_ceil(qk256::BLOCK_ELEMS);
    for ti in 0..nt {
        let x = p.token(t0 + ti);
        for b in 0..nb {
            let end = (256 * (b + 1)).min(p.k);
            out[ti * nb + b] = (256 * b..end)
                .map(|j| {
                    let c = qk256::code(w_row, j);
                    i32::from(c + (c >> 1)) * i32::from(x[j])
                })
                .sum();
        }
    }
}

/// The fixed 8-lane reduction used by the tinyBLAS-order dots: t = lo + hi; (t0+t2)+(t1+t3).
#[inline]
pub(crate) fn reduce8_tiny(a: &[f32; 8]) -> f32 {
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (t[0] + t[2]) + (t[1] + t[3])
}

/// F16 row · f32 x in ggml_vec_dot_f16 order (AVX2): 4 accumulators × 8 lanes over chunks of
/// 32 with FMA; then (a0+a2)+(a1+a3), lo+hi halves, (t0+t1)+(t2+t3); the K % 32 leftovers
/// are added in f64 (each product rounded to f32 first), and the f64 sum rounded to f32.
pub(crate) fn f16_dot_ggml(row: &[u8], x: &[f32]) -> f32 {
    let k = x.len();
    let main = k - k % 32;
    let mut acc = [[0f32; 8]; 4];
    for c in (0..main).step_by(32) {
        for (j, aj) in acc.iter_mut().enumerate() {
            for (l, a) in aj.iter_mut().enumerate() {
                let i = c + 8 * j + l;
                *a = f16_at(row, i).mul_add(x[i], *a);
            }
        }
    }
    let mut a = [0f32; 8];
    for l in 0..8 {
        a[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let mut sum = f64::from((t[0] + t[1]) + (t[2] + t[3]));
    for (i, &xi) in x.iter().enumerate().skip(main) {
        sum += f64::from(f16_at(row, i) * xi);
    }
    #[allow(clippy::cast_possible_truncation)] // f64 -> f32 rounding is the defined result
    let r = sum as f32;
    r
}

/// F16 row · f32 x in llamafile tinyBLAS order: one 8-lane FMA accumulator over chunks of 8,
/// reduced by [`reduce8_tiny`]; the K % 8 leftovers are added sequentially in f32.
pub(crate) fn f16_dot_tiny(row: &[u8], x: &[f32]) -> f32 {
    let k = x.len();
    let main = k - k % 8;
    let mut acc = [0f32; 8];
    for c in (0..main).step_by(8) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a = f16_at(row, c + l).mul_add(x[c + l], *a);
        }
    }
    let mut r = reduce8_tiny(&acc);
    for (i, &xi) in x.iter().enumerate().skip(main) {
        r += f16_at(row, i) * xi;
    }
    r
}

/// f32 row · f32 x in the same 8-lane order as [`f16_dot_tiny`] (used for F32 / BF16 /
/// Q6_K / Q4_0 rows after dequantizing the row).
pub(crate) fn f32_dot_lanes8(w: &[f32], x: &[f32]) -> f32 {
    let k = x.len().min(w.len());
    let main = k - k % 8;
    let mut acc = [0f32; 8];
    for c in (0..main).step_by(8) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a = w[c + l].mul_add(x[c + l], *a);
        }
    }
    let mut r = reduce8_tiny(&acc);
    for i in main..k {
        r += w[i] * x[i];
    }
    r
}

/// Q8_0 row (34-byte blocks: f16 d, 32 × i8) · f32 x. Order: per block, lane l of 8 sums
/// `fma(q[8j+l], x[8j+l], ·)` for j = 0..4 from 0; then `acc[l] = fma(d, blk[l], acc[l])`;
/// finally [`reduce8_tiny`].
pub(crate) fn q8_0_dot(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (blk, xb) in row.chunks_exact(34).zip(x.chunks_exact(32)) {
        let d = crate::layout::read_f16(blk, 0);
        let mut bl = [0f32; 8];
        for j in 0..4 {
            for (l, b) in bl.iter_mut().enumerate() {
                let q = i8::from_le_bytes([blk[2 + 8 * j + l]]);
                *b = f32::from(q).mul_add(xb[8 * j + l], *b);
            }
        }
        for l in 0..8 {
            acc[l] = d.mul_add(bl[l], acc[l]);
        }
    }
    reduce8_tiny(&acc)
}

/// Q4_0 row (18-byte blocks: f16 d, 16 nibble bytes; element j low nibble of byte j,
/// element j+16 high nibble) · f32 x, in the Q8_0 order with `q − 8` as the integer.
pub(crate) fn q4_0_dot(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (blk, xb) in row.chunks_exact(18).zip(x.chunks_exact(32)) {
        let d = crate::layout::read_f16(blk, 0);
        let mut bl = [0f32; 8];
        for j in 0..4 {
            for (l, b) in bl.iter_mut().enumerate() {
                let e = 8 * j + l;
                let byte = blk[2 + e % 16];
                let q = if e < 16 { byte & 15 } else { byte >> 4 };
                *b = (f32::from(q) - 8.0).mul_add(xb[e], *b);
            }
        }
        for l in 0..8 {
            acc[l] = d.mul_add(bl[l], acc[l]);
        }
    }
    reduce8_tiny(&acc)
}

/// [`f16_dot_ggml`] of one row with each of several tokens (the definition the SIMD tiers'
/// multi-token kernels reproduce bit for bit).
pub(crate) fn f16_dot_ggml_multi(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    for (row, o) in rows
        .chunks_exact(row_bytes.max(1))
        .zip(out.chunks_mut(xs.len().max(1)))
    {
        for (o, x) in o.iter_mut().zip(xs) {
            *o = f16_dot_ggml(row, x);
        }
    }
}

/// Q8_0 row · activations quantized per 32: codes `xq` (|q| ≤ 127), scales `xd`.
/// Order: per block, lane l of 8 holds the exact i32 sum of elements 4l..4l+4 (w·x), then
/// `acc[l] = fma(d_w·d_x, lane as f32, acc[l])` (|lane| ≤ 4·128·127, exact in f32);
/// finally [`reduce8_tiny`]. Blocks past the shortest input are ignored.
pub(crate) fn q8_0_q8(row: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    q8_blocks(row, 34, xq, xd, |blk, e| {
        i32::from(i8::from_le_bytes([blk[2 + e]]))
    })
}

/// Q4_0 row (integer `nibble − 8`, element layout as in [`q4_0_dot`]) · activations
/// quantized per 32, in the [`q8_0_q8`] order.
pub(crate) fn q4_0_q8(row: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    q8_blocks(row, 18, xq, xd, |blk, e| {
        let byte = blk[2 + e % 16];
        i32::from(if e < 16 { byte & 15 } else { byte >> 4 }) - 8
    })
}

/// [`q8_0_q8`] per token (the definition of the multi-token kernels).
pub(crate) fn q8_0_q8_multi(row: &[u8], xq: &[i8], xd: &[f32], cols: usize, out: &mut [f32]) {
    per_token(q8_0_q8, row, xq, xd, cols, out);
}

/// [`q4_0_q8`] per token.
pub(crate) fn q4_0_q8_multi(row: &[u8], xq: &[i8], xd: &[f32], cols: usize, out: &mut [f32]) {
    per_token(q4_0_q8, row, xq, xd, cols, out);
}

/// `out[t] = dot(row, codes of token t, scales of token t)`; tokens missing from short
/// inputs give 0 (callers pass whole tokens; this only keeps a bad call from panicking).
pub(crate) fn per_token(
    dot: fn(&[u8], &[i8], &[f32]) -> f32,
    row: &[u8],
    xq: &[i8],
    xd: &[f32],
    cols: usize,
    out: &mut [f32],
) {
    let (cols, nb) = (cols.max(1), (cols / 32).max(1));
    out.fill(0.0);
    for ((o, q), d) in out
        .iter_mut()
        .zip(xq.chunks_exact(cols))
        .zip(xd.chunks_exact(nb))
    {
        *o = dot(row, q, d);
    }
}

/// The shared order of [`q8_0_q8`] / [`q4_0_q8`]: `w(blk, e)` is element e of a row block.
fn q8_blocks(
    row: &[u8],
    wbytes: usize,
    xq: &[i8],
    xd: &[f32],
    w: impl Fn(&[u8], usize) -> i32,
) -> f32 {
    let mut acc = [0f32; 8];
    for ((blk, xb), &dx) in row.chunks_exact(wbytes).zip(xq.chunks_exact(32)).zip(xd) {
        let d = crate::layout::read_f16(blk, 0) * dx;
        for (l, a) in acc.iter_mut().enumerate() {
            let lane: i32 = (4 * l..4 * l + 4)
                .map(|e| w(blk, e) * i32::from(xb[e]))
                .sum();
            // |lane| ≤ 65024: exact in f32.
            #[allow(clippy::cast_precision_loss)]
            let lf = lane as f32;
            *a = d.mul_add(lf, *a);
        }
    }
    reduce8_tiny(&acc)
}

/// BF16 row · f32 x in the [`f32_dot_lanes8`] order (bf16 → f32 is exact).
pub(crate) fn bf16_dot(row: &[u8], x: &[f32]) -> f32 {
    let w: Vec<f32> = row
        .chunks_exact(2)
        .take(x.len())
        .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    f32_dot_lanes8(&w, x)
}

#[inline]
fn f16_at(row: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([row[2 * i], row[2 * i + 1]]).to_f32()
}

/// The scalar tier's table: the reference every other tier is tested against.
pub(crate) static TABLE: Kernels = Kernels {
    isa: Isa::Scalar,
    i2s,
    i2s_clean: i2s,
    i2s_rows: None,
    tq2,
    tq1,
    bitnet32,
    split32,
    qk256,
    f16_dot_ggml,
    f16_dot_tiny,
    q8_0_dot,
    q4_0_dot,
    bf16_dot,
    f32_dot: f32_dot_lanes8,
    q8_0_q8,
    q4_0_q8,
    f16_dot_ggml_multi,
    f16_dot_fast: f16_dot_ggml,
    f16_dot_fast_multi: f16_dot_ggml_multi,
    f16_fast_rows: None,
    q8_0_q8_multi,
    q4_0_q8_multi,
    i2s_panel: None,
    panel_tokens: 0,
    i2s_lut: None,
    i2s_amx: None,
};
