//! The LM head as bitnet.cpp computes it (exact numerics).
//!
//! One output row: the hidden state is rounded to f16 and each logit is
//! `ggml_vec_dot_f16(h16, E[r])`. Two or more rows: the hidden state stays f32 and tinyBLAS
//! (F16 x F32) computes each logit with one 8-lane FMA accumulator.

use bitnet_kernels::RowMatrix;

use crate::numerics;
use crate::Result;

pub(crate) fn lm_head(
    head: &RowMatrix<'_>,
    hn: &[f32],
    rows: usize,
    logits: &mut [f32],
) -> Result<()> {
    let n_vocab = head.rows();
    let n_embd = head.cols();
    let mut erow = vec![0.0f32; n_embd];
    let tinyblas = rows >= 2 && n_embd % 8 == 0;
    let x: Vec<f32> = if tinyblas {
        hn.to_vec()
    } else {
        hn.iter().map(|&v| numerics::round_f16(v)).collect()
    };
    for r in 0..n_vocab {
        head.dequantize_row(r, &mut erow)?;
        for t in 0..rows {
            let xt = &x[t * n_embd..(t + 1) * n_embd];
            logits[t * n_vocab + r] = if tinyblas {
                numerics::dot_tinyblas(&erow, xt)
            } else {
                numerics::dot_f16_ggml(xt, &erow)
            };
        }
    }
    Ok(())
}
