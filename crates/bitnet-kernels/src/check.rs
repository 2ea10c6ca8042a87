//! The selected tier against the scalar tier, at run time: random I2_S and TQ2_0 matrices
//! and activations (ragged shapes, every token count of a call, codes 11, extreme
//! activations), and the LM head's F16, Q8_0 and Q4_0 dots and the attention where the tier's
//! are the scalar tier's (everywhere but WebAssembly without a fused multiply-add), compared
//! bit for bit. The twin tests do this under `cargo test`; this is
//! for builds whose tier can only run where they are loaded, such as the WebAssembly
//! module with relaxed SIMD, which only a browser runs (the package's tests call it there).

use std::borrow::Cow;

use half::f16;

use crate::attn::{attend_isa, AttnShape, KvLayout, KvRows};
use crate::layout::{i2s, tq2_0};
use crate::rows::quantize_row_into;
use crate::{isa, F16DotOrder, Isa, Pool, RowMatrix, RowType, TernaryLayout, TernaryMatrix};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % u64::try_from(n.max(1)).unwrap_or(1)).unwrap_or(0)
    }
    fn i8(&mut self) -> i8 {
        i8::from_le_bytes([self.next().to_le_bytes()[0]])
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        let bits = u32::try_from(self.next() >> 40).unwrap_or(0); // 24 bits
        bits as f32 / 8_388_608.0 - 1.0
    }
}

/// Compare the selected tier's ternary matmuls with the scalar tier's over `rounds` random
/// cases per layout, then its head dots and attention where they are the scalar tier's
/// (`heads_against_scalar`, `attention_against_scalar`); the number of outputs compared,
/// or the first difference.
pub fn tier_against_scalar(seed: u64, rounds: usize) -> Result<usize, String> {
    let tier = isa();
    let pool = Pool::new(1);
    let mut rng = Rng(seed | 1);
    let mut compared = 0;
    for round in 0..rounds {
        for layout in [TernaryLayout::I2S, TernaryLayout::Tq2_0] {
            let km = layout.k_multiple();
            // Past 16 blocks of 128 now and then (the chunks a multi-token call decodes).
            let k = km * (1 + rng.below(if round % 4 == 0 { 20 } else { 6 }));
            let n_out = 1 + rng.below(40);
            let values: Vec<i8> = (0..n_out * k).map(|_| [-1, 0, 1][rng.below(3)]).collect();
            let w = match layout {
                TernaryLayout::I2S => {
                    let mut codes: Vec<u8> = values
                        .iter()
                        .map(|&v| match v {
                            -1 => 0,
                            0 => 1,
                            _ => 2,
                        })
                        .collect();
                    if round % 3 == 0 {
                        // Code 11, which reads as 01 (zero), in some rows.
                        for c in codes.iter_mut().step_by(7) {
                            *c = 3;
                        }
                    }
                    i2s::pack_codes(&codes, 0.5).map_err(|e| e.to_string())?
                }
                _ => {
                    let scales: Vec<f32> = (0..n_out * k / 256)
                        .map(|i| 0.25 + i as f32 * 0.01)
                        .collect();
                    tq2_0::pack(&values, &scales).map_err(|e| e.to_string())?
                }
            };
            let mut m =
                TernaryMatrix::new(layout, n_out, k, &w, None).map_err(|e| e.to_string())?;
            if layout == TernaryLayout::I2S && round % 3 == 1 {
                // Checked to hold no code 11: the tier's kernels for such tensors.
                m.check_codes();
            }
            for n_tok in [1usize, 2, 3, 4, 5, 9] {
                let x: Vec<i8> = (0..n_tok * k)
                    .map(|j| match round % 5 {
                        0 => -128,
                        1 if j % 2 == 0 => 127,
                        _ => rng.i8(),
                    })
                    .collect();
                let s: Vec<f32> = (0..n_tok).map(|t| 1.0 + t as f32 * 0.125).collect();
                let mut want = vec![0f32; n_tok * n_out];
                let mut got = vec![f32::NAN; n_tok * n_out];
                let run = |isa: Isa, out: &mut [f32]| {
                    m.matmul_on(isa, &x, &s, out, &pool)
                        .ok_or_else(|| format!("tier {} is not available", isa.name()))?
                        .map_err(|e| e.to_string())
                };
                run(Isa::Scalar, &mut want)?;
                run(tier, &mut got)?;
                let what = || format!("{layout:?} {n_out}x{k}, {n_tok} tokens");
                compared += same_bits(tier, what, &got, &want)?;
            }
        }
    }
    if tier != Isa::Simd128 || crate::wasm_fused_madd() {
        compared += heads_against_scalar(tier, &mut rng, rounds)?;
        compared += attention_against_scalar(tier, &mut rng, rounds)?;
    }
    Ok(compared)
}

/// The LM head's dots on `tier` against the scalar tier's, bit for bit: F16 rows in both
/// numerics (exact's ggml order, fast numerics' dots, the one-token rows kernel and the
/// selected-rows call) and Q8_0 and Q4_0 rows with int8 activations, over random shapes with
/// ragged K, 1 to 5 tokens, and now and then an activation past 2^16.
fn heads_against_scalar(tier: Isa, rng: &mut Rng, rounds: usize) -> Result<usize, String> {
    let pool = Pool::new(1);
    let mut compared = 0;
    for round in 0..rounds {
        for ty in [RowType::F16, RowType::Q8_0, RowType::Q4_0] {
            let rows = 1 + rng.below(24);
            let cols = if ty == RowType::F16 {
                1 + rng.below(600)
            } else {
                32 * (1 + rng.below(20))
            };
            let row_bytes = ty.row_bytes(cols).map_err(|e| e.to_string())?;
            let mut data = vec![0u8; rows * row_bytes];
            if ty == RowType::F16 {
                for pair in data.chunks_exact_mut(2) {
                    // Finite halves of every exponent, subnormals and zeros among them.
                    let sign = u16::from(rng.below(2) == 1) << 15;
                    let exp = u16::try_from(rng.below(31)).unwrap_or(0) << 10;
                    let man = u16::try_from(rng.below(1024)).unwrap_or(0);
                    pair.copy_from_slice(&(sign | exp | man).to_le_bytes());
                }
            } else {
                let mut w = vec![0f32; cols];
                for row in data.chunks_exact_mut(row_bytes) {
                    w.iter_mut().for_each(|v| *v = rng.unit());
                    quantize_row_into(ty, &w, row);
                }
            }
            let m =
                RowMatrix::new(ty, rows, cols, Cow::Borrowed(&data)).map_err(|e| e.to_string())?;
            for n_tok in 1..=5 {
                let mut x: Vec<f32> = (0..n_tok * cols).map(|_| 2.0 * rng.unit()).collect();
                if round % 4 == 3 {
                    let i = rng.below(x.len());
                    x[i] = 70_000.0;
                }
                let mut want = vec![0f32; n_tok * rows];
                let mut got = vec![f32::NAN; n_tok * rows];
                let what = |form: &str| format!("{ty:?} {form} {rows}x{cols}, {n_tok} tokens");
                let unsupported = || format!("tier {} is not available", tier.name());
                m.matmul_q8_on(Isa::Scalar, &x, &mut want, &pool)
                    .ok_or_else(unsupported)?
                    .map_err(|e| e.to_string())?;
                m.matmul_q8_on(tier, &x, &mut got, &pool)
                    .ok_or_else(unsupported)?
                    .map_err(|e| e.to_string())?;
                compared += same_bits(tier, || what("fast"), &got, &want)?;
                if ty == RowType::F16 {
                    m.matmul_f32_on(Isa::Scalar, &x, &mut want, &pool, F16DotOrder::Ggml)
                        .ok_or_else(unsupported)?
                        .map_err(|e| e.to_string())?;
                    m.matmul_f32_on(tier, &x, &mut got, &pool, F16DotOrder::Ggml)
                        .ok_or_else(unsupported)?
                        .map_err(|e| e.to_string())?;
                    compared += same_bits(tier, || what("exact"), &got, &want)?;
                }
                // Some rows of the first token, as the approximate head asks for them.
                let ids: Vec<u32> = (0..rows)
                    .filter(|_| rng.below(2) == 0)
                    .filter_map(|r| u32::try_from(r).ok())
                    .collect();
                let (mut a, mut b) = (vec![0f32; ids.len()], vec![f32::NAN; ids.len()]);
                m.matmul_q8_rows_on(Isa::Scalar, &ids, &x[..cols], &mut a, &pool)
                    .ok_or_else(unsupported)?
                    .map_err(|e| e.to_string())?;
                m.matmul_q8_rows_on(tier, &ids, &x[..cols], &mut b, &pool)
                    .ok_or_else(unsupported)?
                    .map_err(|e| e.to_string())?;
                compared += same_bits(tier, || what("rows"), &b, &a)?;
            }
        }
    }
    Ok(compared)
}

/// Causal attention on `tier` against the scalar tier's, bit for bit: random GQA shapes and
/// head sizes (ragged ones among them), prompts and single rows after a cached prefix, F16 and
/// f32 caches.
fn attention_against_scalar(tier: Isa, rng: &mut Rng, rounds: usize) -> Result<usize, String> {
    let pool = Pool::new(1);
    let mut compared = 0;
    for round in 0..rounds {
        let n_head_kv = 1 + rng.below(3);
        let n_head = n_head_kv * [1, 2, 4, 5][rng.below(4)];
        let head_dim = [16, 64, 128, 40, 8][round % 5];
        let shape = AttnShape {
            n_head,
            n_head_kv,
            head_dim,
        };
        let (pos0, n) = if round % 2 == 0 {
            (0, 1 + rng.below(80))
        } else {
            (rng.below(150), 1)
        };
        let kv_len = (pos0 + n) * n_head_kv * head_dim;
        let q: Vec<f32> = (0..n * n_head * head_dim)
            .map(|_| 2.0 * rng.unit())
            .collect();
        let k: Vec<f32> = (0..kv_len).map(|_| 2.0 * rng.unit()).collect();
        let v: Vec<f32> = (0..kv_len).map(|_| rng.unit()).collect();
        let (k16, v16): (Vec<f16>, Vec<f16>) = (
            k.iter().map(|&x| f16::from_f32(x)).collect(),
            v.iter().map(|&x| f16::from_f32(x)).collect(),
        );
        let layout = KvLayout::position_major(&shape);
        let scale = 1.0 / 8.0;
        for half in [true, false] {
            let mut want = vec![0f32; q.len()];
            let mut got = vec![f32::NAN; q.len()];
            for (isa, out) in [(Isa::Scalar, &mut want), (tier, &mut got)] {
                let (kr, vr) = if half {
                    (KvRows::F16(&k16), KvRows::F16(&v16))
                } else {
                    (KvRows::F32(&k), KvRows::F32(&v))
                };
                attend_isa(isa, &shape, &q, kr, vr, layout, pos0, n, scale, out, &pool)
                    .map_err(|e| e.to_string())?;
            }
            let what = || {
                format!("attention {n_head}/{n_head_kv} heads × {head_dim}, positions {pos0}+{n}, f16 cache {half}")
            };
            compared += same_bits(tier, what, &got, &want)?;
        }
    }
    Ok(compared)
}

/// `want.len()` when `got` has `want`'s bits everywhere, else an error naming `tier`, the
/// case (`what`) and the first output that differs.
fn same_bits(
    tier: Isa,
    what: impl FnOnce() -> String,
    got: &[f32],
    want: &[f32],
) -> Result<usize, String> {
    match (0..want.len()).find(|&i| got.get(i).map(|g| g.to_bits()) != Some(want[i].to_bits())) {
        None => Ok(want.len()),
        Some(i) => Err(format!(
            "{} differs from scalar: {}, output {i}: {} vs {}",
            tier.name(),
            what(),
            got.get(i).copied().unwrap_or(f32::NAN),
            want[i]
        )),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_selected_tier_passes() {
        let n = super::tier_against_scalar(7, 8).unwrap();
        assert!(n > 1000, "{n}");
    }

    #[test]
    fn the_selected_tiers_heads_and_attention_pass() {
        let tier = crate::isa();
        if tier == crate::Isa::Simd128 && !crate::wasm_fused_madd() {
            eprintln!("the_selected_tiers_heads_and_attention_pass: simd128 without a fused multiply-add rounds each product (tests/rows.rs and tests/attn.rs check that form)");
            return;
        }
        let n = super::heads_against_scalar(tier, &mut super::Rng(11), 8).unwrap();
        assert!(n > 500, "{n}");
        let n = super::attention_against_scalar(tier, &mut super::Rng(12), 10).unwrap();
        assert!(n > 500, "{n}");
    }
}
