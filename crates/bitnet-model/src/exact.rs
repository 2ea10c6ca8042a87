//! The LM head as bitnet.cpp computes it (exact numerics).
//!
//! One output row: the hidden state is rounded to f16 and each logit is
//! `ggml_vec_dot_f16(h16, E[r])`. Two or more rows: the hidden state stays f32 and tinyBLAS
//! (F16 x F32) computes each logit with one 8-lane FMA accumulator. Both orders run on the
//! kernels' SIMD F16 dots ([`F16DotOrder`]), which follow these orders exactly.

use bitnet_kernels::{F16DotOrder, Pool, RowMatrix, RowType};

use crate::numerics;
use crate::{ModelError, Result};

pub(crate) fn lm_head(
    head: &RowMatrix<'_>,
    hn: &[f32],
    rows: usize,
    logits: &mut [f32],
    pool: &Pool,
) -> Result<()> {
    if head.row_type() != RowType::F16 {
        return Err(ModelError::WrongType {
            name: "LM head".into(),
            expected: "F16 (exact numerics)",
            found: format!("{:?}", head.row_type()),
        });
    }
    let tinyblas = rows >= 2 && head.cols() % 8 == 0;
    if tinyblas {
        head.matmul_f32_order(hn, logits, pool, F16DotOrder::Lanes8)?;
    } else {
        let x: Vec<f32> = hn.iter().map(|&v| numerics::round_f16(v)).collect();
        head.matmul_f32_order(&x, logits, pool, F16DotOrder::Ggml)?;
    }
    Ok(())
}
