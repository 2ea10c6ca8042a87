//! The selected tier against the scalar tier, at run time: random I2_S and TQ2_0 matrices
//! and activations (ragged shapes, every token count of a call, codes 11, extreme
//! activations), compared bit for bit. The twin tests do this under `cargo test`; this is
//! for builds whose tier can only run where they are loaded, such as the WebAssembly
//! module with relaxed SIMD, which only a browser runs (the package's tests call it there).

use crate::layout::{i2s, tq2_0};
use crate::{isa, Isa, Pool, TernaryLayout, TernaryMatrix};

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
}

/// Compare the selected tier's ternary matmuls with the scalar tier's over `rounds` random
/// cases per layout; the number of outputs compared, or the first difference.
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
                if let Some(i) = (0..want.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                    return Err(format!(
                        "{} differs from scalar: {layout:?} {n_out}x{k}, {n_tok} tokens, output {i}: {} vs {}",
                        tier.name(),
                        got[i],
                        want[i]
                    ));
                }
                compared += want.len();
            }
        }
    }
    Ok(compared)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_selected_tier_passes() {
        let n = super::tier_against_scalar(7, 8).unwrap();
        assert!(n > 1000, "{n}");
    }
}
