//! bitnet.cpp's float reductions, bit for bit (the x86 AVX2 + FMA + F16C build), and its
//! attention path built from them, threaded.
//!
//! The functions below state the order of every addition and the place of every rounding;
//! the exact numerics of the model call nothing else for these steps. Speed comes from doing
//! the same operations lane for lane, never from reordering them:
//! - [`attend`] runs one work item per (query row, head) on the pool, each writing its own
//!   output slice;
//! - the item is one inlined body compiled twice: plainly (the scalar twin, where `mul_add`
//!   is a libm call on a baseline x86-64 build) and with AVX2 + FMA + F16C enabled, where the
//!   compiler turns the same per-lane operations into vector instructions and `mul_add` into
//!   `vfmadd` (a fused multiply-add either way, so the bits are the same);
//! - the P·V products keep tinyBLAS's / ggml's per-output accumulator sequences, but are
//!   computed for all outputs of a head at once, reading each V row contiguously instead of
//!   gathering a V column per output.

use half::f16;

use crate::pool::{Pool, SharedMut};
use crate::tier::Isa;
use crate::KernelError;

/// Round an f32 to the nearest f16 (ties to even, as F16C's `vcvtps2ph` with mode 0) and back.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// `ggml_vec_dot_f16` (AVX2/F16C): both inputs hold f16 values (given as f32). Four
/// accumulators of 8 lanes over chunks of 32 (f16 x f16 products are exact in f32, so FMA and
/// mul+add agree), reduced `(a0 + a2) + (a1 + a3)`, then the 128-bit halves `lo + hi`, then two
/// horizontal adds: `(t0 + t1) + (t2 + t3)`. Leftover elements past the last full chunk are
/// added in f64 and the result rounded to f32.
#[inline(always)]
pub fn dot_f16_ggml(x: &[f32], y: &[f32]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    let n = x.len().min(y.len());
    let np = n - n % 32;
    let mut acc = [[0.0f32; 8]; 4];
    for c in (0..np).step_by(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            let base = c + 8 * j;
            for (l, al) in a.iter_mut().enumerate() {
                *al += x[base + l] * y[base + l];
            }
        }
    }
    let sum = reduce_ggml_f32x8(&acc);
    if np == n {
        return sum;
    }
    let mut s = f64::from(sum);
    for i in np..n {
        s += f64::from(x[i] * y[i]);
    }
    #[allow(clippy::cast_possible_truncation)]
    let r = s as f32;
    r
}

/// GGML_F32x8_REDUCE for four 8-lane accumulators followed by ggml's 8-lane horizontal sum.
#[inline(always)]
fn reduce_ggml_f32x8(acc: &[[f32; 8]; 4]) -> f32 {
    let mut a = [0.0f32; 8];
    for l in 0..8 {
        let a0 = acc[0][l] + acc[2][l];
        let a1 = acc[1][l] + acc[3][l];
        a[l] = a0 + a1;
    }
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// One 8-lane accumulator of llamafile tinyBLAS (F16 A x F32 B, AVX2+FMA) for a single output:
/// `acc = fma(a[l..l+8], b[l..l+8], acc)` over chunks of 8, then `t = lo + hi` and
/// `(t0 + t2) + (t1 + t3)`. `a` holds f16 values (as f32), `b` plain f32; `len % 8 == 0`.
#[inline(always)]
pub fn dot_tinyblas(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    debug_assert_eq!(a.len() % 8, 0);
    let mut acc = [0.0f32; 8];
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] = ca[l].mul_add(cb[l], acc[l]);
        }
    }
    reduce_tinyblas(&acc)
}

/// tinyBLAS's 8-lane horizontal sum: `t = lo + hi`, `(t0 + t2) + (t1 + t3)`.
#[inline(always)]
fn reduce_tinyblas(acc: &[f32; 8]) -> f32 {
    let t = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (t[0] + t[2]) + (t[1] + t[3])
}

/// `ggml_v_expf` (AVX2 + FMA), lane-wise.
#[inline(always)]
pub fn v_expf(x: f32) -> f32 {
    let fma = |a: f32, b: f32, c: f32| a.mul_add(b, c);
    let r = f32::from_bits(0x4B40_0000); // 0x1.8p23
    let z = fma(x, f32::from_bits(0x3FB8_AA3B), r); // 0x1.715476p+0
    let n = z - r;
    let b = fma(
        -n,
        f32::from_bits(0x35BF_BE8E),
        fma(-n, f32::from_bits(0x3F31_7200), x),
    );
    let e = z.to_bits().wrapping_shl(23);
    let k = f32::from_bits(e.wrapping_add(0x3F80_0000));
    let u = b * b;
    let j = fma(
        fma(
            fma(f32::from_bits(0x3C07_2010), b, f32::from_bits(0x3D2B_9F17)),
            u,
            fma(f32::from_bits(0x3E2A_AF33), b, f32::from_bits(0x3EFF_FEDB)),
        ),
        u,
        f32::from_bits(0x3F7F_FFF6) * b,
    );
    if n.abs() <= 126.0 {
        return fma(j, k, k);
    }
    // n is NaN or |n| > 126: the slow path (NaN compares false above and lands here too,
    // where it propagates as in the vector code's blend).
    if n.is_nan() {
        return fma(j, k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7F00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        fma(s2, j, s2) * s1
    }
}

/// SiLU of one row in place, as ggml's `ggml_vec_silu_f32` (AVX2 + FMA build) computes it:
/// whole groups of eight from the row's start as `x / (1 + ggml_v_expf(0 − x))`, the ragged
/// tail as `x / (1 + expf(−x))` with libm's `expf`. Where the CPU has AVX2 and FMA the groups
/// run as ggml's own eight-lane code does; [`silu_row_portable`] is its scalar twin (the same
/// results: each fused multiply-add rounds once either way).
pub fn silu_row(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa() >= Isa::Avx2 && Isa::Avx2.is_supported() {
        // SAFETY: AVX2 and FMA are available (checked above: the AVX2 tier requires FMA).
        unsafe { silu_row_fma(x) };
        return;
    }
    silu_row_portable(x);
}

/// [`silu_row`] without the FMA compilation (the scalar twin its test compares with).
pub fn silu_row_portable(x: &mut [f32]) {
    silu_impl(x);
}

/// # Safety
/// AVX2 and FMA are available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_row_fma(x: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut groups = x.chunks_exact_mut(8);
    for g in &mut groups {
        // SAFETY: `g` holds exactly 8 floats (unaligned loads and stores).
        unsafe {
            let v = _mm256_loadu_ps(g.as_ptr());
            let e = v_expf_avx2(_mm256_sub_ps(_mm256_setzero_ps(), v));
            let y = _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            _mm256_storeu_ps(g.as_mut_ptr(), y);
        }
    }
    for v in groups.into_remainder() {
        *v /= 1.0 + (-*v).exp();
    }
}

/// ggml's `ggml_v_expf` for AVX2 + FMA, eight lanes ([`v_expf`] is its lane-wise twin).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::cast_possible_wrap)]
fn v_expf_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
    let r = c(0x4B40_0000);
    let z = _mm256_fmadd_ps(x, c(0x3FB8_AA3B), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(n, c(0x35BF_BE8E), _mm256_fnmadd_ps(n, c(0x3F31_7200), x));
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(
        e,
        _mm256_castps_si256(_mm256_set1_ps(1.0)),
    ));
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let cm = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3C07_2010), b, c(0x3D2B_9F17)),
            u,
            _mm256_fmadd_ps(c(0x3E2A_AF33), b, c(0x3EFF_FEDB)),
        ),
        u,
        _mm256_mul_ps(c(0x3F7F_FFF6), b),
    );
    if _mm256_movemask_ps(cm) == 0 {
        return _mm256_fmadd_ps(k, j, k);
    }
    let le = _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps());
    let g = _mm256_and_si256(
        _mm256_castps_si256(le),
        _mm256_set1_epi32(0x8200_0000u32 as i32),
    );
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7F00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let d = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
    _mm256_or_ps(
        _mm256_and_ps(d, _mm256_mul_ps(s1, s1)),
        _mm256_andnot_ps(
            d,
            _mm256_or_ps(
                _mm256_and_ps(cm, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                _mm256_andnot_ps(cm, _mm256_fmadd_ps(k, j, k)),
            ),
        ),
    )
}

#[inline(always)]
fn silu_impl(x: &mut [f32]) {
    let mut groups = x.chunks_exact_mut(8);
    for g in &mut groups {
        for v in g.iter_mut() {
            *v /= 1.0 + v_expf(0.0 - *v);
        }
    }
    for v in groups.into_remainder() {
        *v /= 1.0 + (-*v).exp();
    }
}

/// Softmax of one attention row as `ggml_compute_forward_soft_max_f32` computes it:
/// `w = kq * scale + mask`; `e = ggml_v_expf(w - max)`; per 8-lane group `t = e[4..8] + e[0..4]`,
/// `(t0 + t2) + (t1 + t3)`, groups added sequentially into an f64; `p = e * (f32)(1 / sum)`.
/// `kq.len()` is a multiple of 8; masked entries are `-inf` in `w` (and give `e = 0`).
#[inline(always)]
pub fn softmax_exact(w: &mut [f32]) {
    debug_assert_eq!(w.len() % 8, 0);
    let mx = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in w.iter_mut() {
        *v = if *v == f32::NEG_INFINITY {
            0.0
        } else {
            v_expf(*v - mx)
        };
    }
    let mut sum = 0.0f64;
    for g in w.chunks_exact(8) {
        let t = [g[4] + g[0], g[5] + g[1], g[6] + g[2], g[7] + g[3]];
        sum += f64::from((t[0] + t[2]) + (t[1] + t[3]));
    }
    #[allow(clippy::cast_possible_truncation)]
    let inv = (1.0 / sum) as f32;
    for v in w.iter_mut() {
        *v *= inv;
    }
}

/// Shape of an [`attend`] call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExactShape {
    /// Query heads.
    pub n_head: usize,
    /// KV heads (`n_head` a non-zero multiple of it).
    pub n_head_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// The factor of K·Q before the mask (`1/sqrtf(head_dim)`, see [`ExactShape::new`]; 1 where
    /// the graph scales Q itself, as Gemma 3's does).
    pub kq_scale: f32,
}

impl ExactShape {
    /// The shape with the usual factor `1/sqrtf(head_dim)`.
    pub fn new(n_head: usize, n_head_kv: usize, head_dim: usize) -> Self {
        #[allow(clippy::cast_precision_loss)]
        let kq_scale = 1.0f32 / (head_dim as f32).sqrt();
        ExactShape {
            n_head,
            n_head_kv,
            head_dim,
            kq_scale,
        }
    }
}

/// bitnet.cpp's attention for `n` query rows `q` (`[n][n_head·head_dim]`, roped) at positions
/// `pos0 .. pos0+n` over `k` and `v` (`[pos0+n][n_head_kv·head_dim]`, f16 values as f32), into
/// `out` (same shape as `q`):
///
/// Q rounded to f16; `kq_j = dot_f16_ggml(q, k_j)` — except for one query head and a batch of
/// more rows (ggml's permuted Q is then contiguous and llamafile's tinyBLAS takes the product
/// with Q in f32: `kq_j = dot_tinyblas(k_j, q)`, when head_dim is a multiple of 8); the KV
/// length padded to a multiple of 32
/// with a `-inf` mask; `w = kq · kq_scale + mask` (`kq_scale` usually `1/sqrtf(head_dim)`); [`softmax_exact`]; then for a
/// one-row batch P is rounded to f16 and `out_i = dot_f16_ggml(p, v_col_i)`, for a larger batch
/// P stays f32 and `out_i = dot_tinyblas(v_col_i, p)`. Query head `h` reads KV head
/// `h / (n_head / n_head_kv)`. Work items (query row, head) run on `pool`; the selected tier
/// picks the compiled body ([`attend_on`] to choose one).
#[allow(clippy::too_many_arguments)]
pub fn attend(
    shape: &ExactShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    pos0: usize,
    n: usize,
    out: &mut [f32],
    pool: &Pool,
) -> Result<(), KernelError> {
    attend_on(crate::isa(), shape, q, k, v, pos0, n, out, pool)
}

/// [`attend`] with the body of tier `isa` (x86 tiers from AVX2 up run the FMA-compiled body,
/// every other the plain one); results are identical on every tier.
#[allow(clippy::too_many_arguments)]
pub fn attend_on(
    isa: Isa,
    shape: &ExactShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    pos0: usize,
    n: usize,
    out: &mut [f32],
    pool: &Pool,
) -> Result<(), KernelError> {
    let d = shape.head_dim;
    let gqa = shape.n_head.checked_div(shape.n_head_kv).unwrap_or(0);
    if d == 0 || gqa == 0 || gqa * shape.n_head_kv != shape.n_head {
        return Err(KernelError::ShapeMismatch {
            what: "attention heads (n_head must be a non-zero multiple of n_head_kv)",
            expected: shape.n_head_kv,
            got: shape.n_head,
        });
    }
    let n_embd = shape.n_head * d;
    let kv_w = shape.n_head_kv * d;
    let n_kv = pos0
        .checked_add(n)
        .ok_or(KernelError::Overflow { what: "positions" })?;
    let need = |what: &'static str, expected: Option<usize>, got: usize| match expected {
        Some(e) if e == got => Ok(()),
        Some(e) => Err(KernelError::ShapeMismatch {
            what,
            expected: e,
            got,
        }),
        None => Err(KernelError::Overflow { what }),
    };
    need("attention queries", n.checked_mul(n_embd), q.len())?;
    need("attention output", n.checked_mul(n_embd), out.len())?;
    need("attention keys", n_kv.checked_mul(kv_w), k.len())?;
    need("attention values", n_kv.checked_mul(kv_w), v.len())?;
    if n == 0 {
        return Ok(());
    }
    let job = Job {
        d,
        gqa,
        kq_tinyblas: shape.n_head == 1 && n > 1 && d.is_multiple_of(8),
        kq_scale: shape.kq_scale,
        n_head: shape.n_head,
        kv_w,
        pos0,
        n,
        q,
        k,
        v,
    };
    let fma = cfg!(target_arch = "x86_64") && isa >= Isa::Avx2 && Isa::Avx2.is_supported();
    let outp = SharedMut::new(out);
    pool.for_rows(n * shape.n_head, 1, &|items| {
        let mut sc = ItemScratch::new(d, n_kv.div_ceil(32) * 32);
        for it in items {
            let (t, h) = (it / job.n_head, it % job.n_head);
            // SAFETY: item (t, h) owns out[t·n_embd + h·d ..][..d]; items are disjoint
            // between chunks and the range lies inside `out` (checked above).
            let o = unsafe { outp.slice_mut(t * n_embd + h * d..t * n_embd + (h + 1) * d) };
            run_item(fma, &job, t, h, &mut sc, o);
        }
    });
    Ok(())
}

struct Job<'a> {
    d: usize,
    gqa: usize,
    /// K·Q by tinyBLAS with Q in f32 (see [`attend`]).
    kq_tinyblas: bool,
    kq_scale: f32,
    n_head: usize,
    kv_w: usize,
    pos0: usize,
    n: usize,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
}

struct ItemScratch {
    qh: Vec<f32>,
    w: Vec<f32>,
    /// P·V accumulators, `[32][d]` (ggml: 4 × 8 lanes) or `[8][d]` (tinyBLAS).
    acc: Vec<f32>,
}

impl ItemScratch {
    fn new(d: usize, n_pad: usize) -> Self {
        ItemScratch {
            qh: vec![0.0; d],
            w: vec![0.0; n_pad],
            acc: vec![0.0; 32 * d],
        }
    }
}

fn run_item(fma: bool, job: &Job<'_>, t: usize, h: usize, sc: &mut ItemScratch, o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if fma {
        // SAFETY: `fma` is true only when the AVX2 tier (AVX2, FMA, F16C) is supported.
        unsafe { item_fma(job, t, h, sc, o) };
        return;
    }
    let _ = fma;
    item_impl(job, t, h, sc, o);
}

/// # Safety
/// AVX2, FMA and F16C are available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn item_fma(job: &Job<'_>, t: usize, h: usize, sc: &mut ItemScratch, o: &mut [f32]) {
    item_impl(job, t, h, sc, o);
}

/// One (query row, head): the plain body, inlined into both compilations.
#[inline(always)]
fn item_impl(job: &Job<'_>, t: usize, h: usize, sc: &mut ItemScratch, o: &mut [f32]) {
    let d = job.d;
    let g = h / job.gqa;
    let qpos = job.pos0 + t;
    let n_kv = job.pos0 + job.n;
    let scale = job.kq_scale;
    let n_embd = job.n_head * d;
    let qsrc = &job.q[t * n_embd + h * d..][..d];
    for (dst, &x) in sc.qh.iter_mut().zip(qsrc) {
        *dst = if job.kq_tinyblas { x } else { round_f16(x) };
    }
    for (j, wj) in sc.w.iter_mut().enumerate() {
        *wj = if j <= qpos {
            let kj = &job.k[j * job.kv_w + g * d..][..d];
            let kq = if job.kq_tinyblas {
                dot_tinyblas(kj, &sc.qh)
            } else {
                dot_f16_ggml(&sc.qh, kj)
            };
            kq * scale + 0.0
        } else {
            f32::NEG_INFINITY
        };
    }
    softmax_exact(&mut sc.w);
    let vrow = |j: usize| &job.v[j * job.kv_w + g * d..][..d];
    if job.n == 1 {
        // out_i = dot_f16_ggml(p, v_col_i) over n_pad (a multiple of 32, so no leftover):
        // accumulator (chunk lane c % 32) of output i adds p_j · v_j,i for j ≡ c, in order.
        for p in sc.w.iter_mut() {
            *p = round_f16(*p);
        }
        let acc = &mut sc.acc[..32 * d];
        acc.fill(0.0);
        for j in 0..n_kv {
            let p = sc.w[j];
            let a = &mut acc[(j % 32) * d..][..d];
            for (ai, &vi) in a.iter_mut().zip(vrow(j)) {
                *ai += p * vi;
            }
        }
        // Positions n_kv..n_pad have p = 0 and v = 0: they add +0.0 products, which leave
        // every accumulator unchanged except -0.0 → +0.0; accumulators start at +0.0 and a
        // sum of products never returns to -0.0 from there, so skipping them is exact.
        for (i, oi) in o.iter_mut().enumerate() {
            let mut lanes = [[0.0f32; 8]; 4];
            for (c, lane) in lanes.iter_mut().flatten().enumerate() {
                *lane = acc[c * d + i];
            }
            *oi = reduce_ggml_f32x8(&lanes);
        }
    } else {
        // out_i = dot_tinyblas(v_col_i, p) over n_pad: lane j % 8 of output i does
        // acc = fma(v_j,i, p_j, acc), j in order.
        let acc = &mut sc.acc[..8 * d];
        acc.fill(0.0);
        for j in 0..n_kv {
            let p = sc.w[j];
            let a = &mut acc[(j % 8) * d..][..d];
            for (ai, &vi) in a.iter_mut().zip(vrow(j)) {
                *ai = vi.mul_add(p, *ai);
            }
        }
        // Positions n_kv..n_pad: fma(0, 0, acc) = acc for every accumulator that is not
        // -0.0, and none is (as above: from +0.0, round-to-nearest sums give -0.0 only from
        // two -0.0 operands), so skipping them is exact.
        for (i, oi) in o.iter_mut().enumerate() {
            let lanes: [f32; 8] = std::array::from_fn(|l| acc[l * d + i]);
            *oi = reduce_tinyblas(&lanes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The straightforward form of [`attend`]: one (row, head) after another, a V column
    /// gathered per output, `dot_f16_ggml` / `dot_tinyblas` over the padded length.
    fn reference(
        s: &ExactShape,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        pos0: usize,
        n: usize,
    ) -> Vec<f32> {
        let (d, kv_w, gqa) = (s.head_dim, s.n_head_kv * s.head_dim, s.n_head / s.n_head_kv);
        let n_embd = s.n_head * d;
        let n_kv = pos0 + n;
        let n_pad = n_kv.div_ceil(32) * 32;
        let scale = s.kq_scale;
        let mut out = vec![0.0f32; n * n_embd];
        // One query head and several rows: ggml hands K·Q to tinyBLAS with Q in f32.
        let tinyblas_kq = s.n_head == 1 && n > 1 && d % 8 == 0;
        for t in 0..n {
            for h in 0..s.n_head {
                let g = h / gqa;
                let qh: Vec<f32> = q[t * n_embd + h * d..][..d]
                    .iter()
                    .map(|&x| if tinyblas_kq { x } else { round_f16(x) })
                    .collect();
                let mut w: Vec<f32> = (0..n_pad)
                    .map(|j| {
                        if j > pos0 + t {
                            return f32::NEG_INFINITY;
                        }
                        let kj = &k[j * kv_w + g * d..][..d];
                        if tinyblas_kq {
                            dot_tinyblas(kj, &qh) * scale + 0.0
                        } else {
                            dot_f16_ggml(&qh, kj) * scale + 0.0
                        }
                    })
                    .collect();
                softmax_exact(&mut w);
                if n == 1 {
                    w.iter_mut().for_each(|p| *p = round_f16(*p));
                }
                for i in 0..d {
                    let mut vcol = vec![0.0f32; n_pad];
                    for (j, vj) in vcol.iter_mut().enumerate().take(n_kv) {
                        *vj = v[j * kv_w + g * d + i];
                    }
                    out[t * n_embd + h * d + i] = if n == 1 {
                        dot_f16_ggml(&w, &vcol)
                    } else {
                        dot_tinyblas(&vcol, &w)
                    };
                }
            }
        }
        out
    }

    fn halfs(st: &mut u64, n: usize, amp: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *st ^= *st << 13;
                *st ^= *st >> 7;
                *st ^= *st << 17;
                let u = (*st >> 40) as f32 / (1u64 << 24) as f32;
                round_f16((2.0 * u - 1.0) * amp)
            })
            .collect()
    }

    /// Every tier's threaded kernel equals the straightforward reference bit for bit: head
    /// sizes with and without a leftover past 32, GQA 1 and 4, one-row steps deep in the
    /// cache and multi-row prompts, 1 and 3 threads.
    #[test]
    fn threaded_kernel_matches_reference_bit_for_bit() {
        let mut st = 0x5EED_1234_ABCD_0001u64;
        let mut checked = 0;
        for (n_head, n_head_kv, d) in [
            (2usize, 2usize, 32usize),
            (8, 2, 40),
            (4, 1, 128),
            (5, 5, 16),
            (1, 1, 256),
            (1, 1, 36),
        ] {
            let shape = ExactShape::new(n_head, n_head_kv, d);
            for (pos0, n) in [(0usize, 1usize), (0, 7), (33, 1), (70, 5), (5, 40)] {
                let n_kv = pos0 + n;
                // Q in f32 (the kernel rounds it to f16 where ggml does).
                let q: Vec<f32> = halfs(&mut st, n * n_head * d, 3.0)
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| x * (1.0 + 1e-4 * (i % 7) as f32))
                    .collect();
                let k = halfs(&mut st, n_kv * n_head_kv * d, 2.0);
                let v = halfs(&mut st, n_kv * n_head_kv * d, 1.5);
                let want = reference(&shape, &q, &k, &v, pos0, n);
                for threads in [1usize, 3] {
                    let pool = Pool::new(threads);
                    for isa in crate::supported_isas() {
                        let mut got = vec![f32::NAN; want.len()];
                        attend_on(isa, &shape, &q, &k, &v, pos0, n, &mut got, &pool).unwrap();
                        let same = got
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{isa:?} {shape:?} pos0 {pos0} n {n} threads {threads}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        eprintln!("exact attention cases: {checked}");
    }

    #[test]
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    fn silu_with_fma_equals_its_scalar_twin() {
        // Every magnitude the polynomial's paths take (|n| ≤ 126, the slow path, overflow to
        // 0 or ∞), NaN, ±0, and rows with ragged tails.
        let mut st = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            st
        };
        for len in [0usize, 1, 7, 8, 9, 31, 64, 3072, 3077] {
            let mut a: Vec<f32> = (0..len)
                .map(|i| match i % 11 {
                    0 => f32::NAN,
                    1 => -0.0,
                    2 => 120.0 + (next() % 1000) as f32 * 0.1,
                    3 => -120.0 - (next() % 1000) as f32 * 0.1,
                    _ => {
                        f32::from_bits(next() as u32 & 0x7fff_ffff) % 40.0
                            * if next() % 2 == 0 { 1.0 } else { -1.0 }
                    }
                })
                .collect();
            let mut b = a.clone();
            silu_row(&mut a);
            silu_row_portable(&mut b);
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!(
                    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                    "len {len} [{i}]: {x} vs {y}"
                );
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let pool = Pool::new(1);
        let s = ExactShape::new(3, 2, 4);
        assert!(attend(&s, &[], &[], &[], 0, 0, &mut [], &pool).is_err());
        let s = ExactShape::new(2, 1, 4);
        let mut out = [0.0f32; 8];
        assert!(attend(&s, &[0.0; 8], &[0.0; 3], &[0.0; 4], 0, 1, &mut out, &pool).is_err());
        assert!(attend(&s, &[0.0; 8], &[0.0; 4], &[0.0; 4], 0, 1, &mut out, &pool).is_ok());
    }

    #[test]
    fn v_expf_tracks_exp() {
        for i in -2000..=2000 {
            let x = i as f32 * 0.01;
            let want = (x as f64).exp();
            let got = v_expf(x) as f64;
            assert!(
                ((got - want) / want).abs() < 4e-7,
                "x={x} got={got} want={want}"
            );
        }
        assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(v_expf(-200.0), 0.0);
    }

    #[test]
    fn ggml_dot_handles_leftovers() {
        let x: Vec<f32> = (0..45).map(|i| round_f16(i as f32 * 0.25)).collect();
        let y: Vec<f32> = (0..45).map(|i| round_f16(1.0 - i as f32 * 0.01)).collect();
        let want: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        assert!((f64::from(dot_f16_ggml(&x, &y)) - want).abs() < 1e-4);
    }
}
