//! Ternary matrices between their sources and the GGUF layouts.
//!
//! A [`Ternary`] is the values (−1, 0, +1, row-major, `n_out` rows of `n_in`) and their scale:
//! one per tensor (I2_S, and every Hugging Face source) or one per 256-element block (TQ2_0,
//! TQ1_0). Encoding to I2_S needs one scale: blocks that hold a non-zero value must agree.
//!
//! Sources:
//! - **bf16 master weights**: the b1.58 absmean rule of the reference (`weight_quant`),
//!   `scale = max(mean|W|, 1e-5)`, `W_q = clamp(round(W / scale), −1, 1)` with round half to
//!   even; β = scale. The mean is summed in f64 and rounded to f32 once.
//! - **the packed release** (`microsoft/bitnet-b1.58-2B-4T`): `weight` is U8 of shape
//!   `[n_out/4, n_in]` and `weight_scale` one number. Byte `[p][k]` holds rows
//!   `p + i·n_out/4` (i = 0..4) of column k at bits `2i..2i+1`, least significant pair first,
//!   code = value + 1. Hugging Face transformers' `BitLinear` computes
//!   `y = (x_q · W) / (s_x · weight_scale)`, so β = 1 / weight_scale.

use bitnet_kernels::layout::{i2s, tq1_0, tq2_0};

use crate::error::ConvertError;

/// The ternary layouts the converter writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// bitnet.cpp's I2_S (type 36): the official file's layout.
    I2S,
    /// upstream llama.cpp's TQ2_0 (type 35): 2.06 bits per weight, f16 scale per 256.
    Tq2_0,
    /// upstream llama.cpp's TQ1_0 (type 34): 1.69 bits per weight, f16 scale per 256.
    Tq1_0,
}

impl std::str::FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "i2_s" | "i2s" => Ok(Target::I2S),
            "tq2_0" => Ok(Target::Tq2_0),
            "tq1_0" => Ok(Target::Tq1_0),
            _ => Err(format!("unknown layout '{s}' (i2_s, tq2_0, tq1_0)")),
        }
    }
}

impl Target {
    /// The GGUF tensor type id.
    pub fn type_id(self) -> u32 {
        match self {
            Target::I2S => 36,
            Target::Tq2_0 => 35,
            Target::Tq1_0 => 34,
        }
    }

    /// `general.file_type`: llama.cpp's MOSTLY_TQ1_0 = 36, MOSTLY_TQ2_0 = 37; the BitNet fork's
    /// MOSTLY_I2_S = 40.
    pub fn file_type(self) -> u32 {
        match self {
            Target::I2S => 40,
            Target::Tq2_0 => 37,
            Target::Tq1_0 => 36,
        }
    }

    /// The kernel layout.
    pub fn layout(self) -> bitnet_kernels::TernaryLayout {
        match self {
            Target::I2S => bitnet_kernels::TernaryLayout::I2S,
            Target::Tq2_0 => bitnet_kernels::TernaryLayout::Tq2_0,
            Target::Tq1_0 => bitnet_kernels::TernaryLayout::Tq1_0,
        }
    }

    /// Lower-case name (`i2_s`, `tq2_0`, `tq1_0`).
    pub fn name(self) -> &'static str {
        match self {
            Target::I2S => "i2_s",
            Target::Tq2_0 => "tq2_0",
            Target::Tq1_0 => "tq1_0",
        }
    }
}

/// How a ternary matrix is scaled.
#[derive(Debug, Clone, PartialEq)]
pub enum Scale {
    /// One β for the whole tensor.
    Tensor(f32),
    /// One scale per 256-element block, in order.
    Blocks(Vec<f32>),
}

/// Ternary values with their scale.
#[derive(Debug, Clone)]
pub struct Ternary {
    pub values: Vec<i8>,
    pub scale: Scale,
}

impl Ternary {
    /// Reorder the rows of each of `heads` equal row groups as bitnet.cpp's (and llama.cpp's)
    /// converter does for Q and K of a Llama checkpoint, so that llama.cpp's normal RoPE
    /// (pairs 2i, 2i+1) rotates the pairs the checkpoint's rotation (pairs i, i + d/2) does:
    /// within a head of d rows, new row `2j + i` is old row `i·d/2 + j` (i in 0..2, j < d/2).
    pub fn permute_for_normal_rope(
        &mut self,
        name: &str,
        n_in: usize,
        heads: usize,
    ) -> Result<(), ConvertError> {
        let n_out = self.values.len().checked_div(n_in).unwrap_or(0);
        let bad = |what: String| ConvertError::Unsupported {
            name: name.to_string(),
            what,
        };
        if !matches!(self.scale, Scale::Tensor(_)) {
            return Err(bad("a RoPE permutation of per-block scales".into()));
        }
        if heads == 0
            || n_out == 0
            || !n_out.is_multiple_of(heads)
            || !(n_out / heads).is_multiple_of(2)
        {
            return Err(bad(format!(
                "{n_out} rows cannot be split into {heads} heads of an even size"
            )));
        }
        let d = n_out / heads;
        let half = d / 2;
        let old = std::mem::take(&mut self.values);
        let mut new = vec![0i8; old.len()];
        for h in 0..heads {
            for i in 0..2 {
                for j in 0..half {
                    let src = (h * d + i * half + j) * n_in;
                    let dst = (h * d + 2 * j + i) * n_in;
                    new[dst..dst + n_in].copy_from_slice(&old[src..src + n_in]);
                }
            }
        }
        self.values = new;
        Ok(())
    }
}

/// The reference's epsilon in the absmean rule.
const ABSMEAN_EPS: f32 = 1e-5;

/// `clamp(rint(x), −1, 1)` (half to even) as a code.
fn ternary_code(x: f32) -> i8 {
    let q = x.round_ties_even().clamp(-1.0, 1.0);
    // q is exactly −1, 0 or +1 here (NaN falls through to 0).
    if q > 0.5 {
        1
    } else if q < -0.5 {
        -1
    } else {
        0
    }
}

/// Ternarize float weights with the absmean rule (module docs).
pub fn absmean(w: &[f32]) -> Ternary {
    let sum: f64 = w.iter().map(|x| f64::from(x.abs())).sum();
    // Element counts of real tensors are far below 2^52: the conversion is exact.
    #[allow(clippy::cast_precision_loss)]
    let n = w.len().max(1) as f64;
    #[allow(clippy::cast_possible_truncation)]
    let mean = (sum / n) as f32;
    let scale = mean.max(ABSMEAN_EPS);
    let values = w.iter().map(|&x| ternary_code(x / scale)).collect();
    Ternary {
        values,
        scale: Scale::Tensor(scale),
    }
}

/// bitnet.cpp's ternarization of a 1bitLLM projection (`BitnetModel.weight_quant`), in f32
/// as torch computes it: `s = 1 / max(mean|W|, 1e-5)`, `W_q = clamp(round(W·s), −1, 1)`
/// (half to even), and the values written are `W_q / s` cast back to the checkpoint's dtype:
/// β = `1/s`, rounded to f16 for an f16 checkpoint (bf16 ones are widened to f32 before,
/// so β stays f32). The mean is `sum / n` with the sum rounded to f32 once (torch sums in f32;
/// the two agree when the sum is exact, and differ by an ulp of the mean at most otherwise).
pub fn absmean_1bitllm(w: &[f32], f16_source: bool) -> Ternary {
    let sum: f64 = w.iter().map(|x| f64::from(x.abs())).sum();
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    let mean = (sum as f32) / (w.len().max(1) as f32);
    let s = 1.0 / mean.max(ABSMEAN_EPS);
    let values = w.iter().map(|&x| ternary_code(x * s)).collect();
    let beta = 1.0 / s;
    let beta = if f16_source {
        half::f16::from_f32(beta).to_f32()
    } else {
        beta
    };
    Ternary {
        values,
        scale: Scale::Tensor(beta),
    }
}

/// bitnet.cpp's embedding converter's ternarization (`quantize_to_i2_s`, BitLinear's
/// `weight_quant_minmax`) as it runs under numpy 1.x: `m = max(mean|W|, 1e-5)` with the mean
/// an f32 sum ([`numpy_sum_f32`]) divided by n and rounded to f32, `W_q = clip(rint(W ·
/// f32(1/m)), −1, 1)` (half to even, the product in f32); β = m.
pub fn absmean_embedding(w: &[f32]) -> Ternary {
    let abs: Vec<f32> = w.iter().map(|x| x.abs()).collect();
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    let mean = (f64::from(numpy_sum_f32(&abs)) / w.len().max(1) as f64) as f32;
    let m = mean.max(ABSMEAN_EPS);
    let inv = 1.0f32 / m;
    let values = w.iter().map(|&x| ternary_code(x * inv)).collect();
    Ternary {
        values,
        scale: Scale::Tensor(m),
    }
}

/// `np.add.reduce` of a contiguous f32 array in numpy 1.x: from 0, the array in pieces of 8192
/// (its iterator's buffer), each summed pairwise (halves rounded down to a multiple of 8,
/// leaves of at most 128 values: eight f32 accumulators combined ((0+1)+(2+3))+((4+5)+(6+7)),
/// then the leaf's last n mod 8 values in order) and added to the running f32 total.
pub fn numpy_sum_f32(a: &[f32]) -> f32 {
    fn pairwise(a: &[f32]) -> f32 {
        let n = a.len();
        if n < 8 {
            return a.iter().fold(0.0f32, |s, &x| s + x);
        }
        if n <= 128 {
            let mut r = [0f32; 8];
            r.copy_from_slice(&a[..8]);
            let full = n - n % 8;
            let mut i = 8;
            while i < full {
                for (j, acc) in r.iter_mut().enumerate() {
                    *acc += a[i + j];
                }
                i += 8;
            }
            let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
            for &x in &a[full..] {
                res += x;
            }
            return res;
        }
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise(&a[..n2]) + pairwise(&a[n2..])
    }
    a.chunks(8192).fold(0.0f32, |total, c| total + pairwise(c))
}

/// Decode the packed release's U8 weight (`[n_out/4, n_in]`) and its `weight_scale`.
pub fn unpack_hf(
    name: &str,
    packed: &[u8],
    n_out: usize,
    n_in: usize,
    weight_scale: f32,
) -> Result<Ternary, ConvertError> {
    let rows = n_out / 4;
    let mut values = vec![0i8; n_out * n_in];
    for (p, prow) in packed.chunks_exact(n_in).enumerate().take(rows) {
        for (k, &byte) in prow.iter().enumerate() {
            for i in 0..4 {
                let code = (byte >> (2 * i)) & 3;
                let r = p + i * rows;
                let idx = r * n_in + k;
                if code == 3 {
                    return Err(ConvertError::InvalidCode {
                        name: name.to_string(),
                        index: idx,
                    });
                }
                values[idx] = i8::try_from(code).unwrap_or(1) - 1;
            }
        }
    }
    if !(weight_scale.is_finite() && weight_scale != 0.0) {
        return Err(ConvertError::NonFinite {
            name: format!("{name} (weight_scale {weight_scale})"),
            index: 0,
        });
    }
    Ok(Ternary {
        values,
        scale: Scale::Tensor(1.0 / weight_scale),
    })
}

/// Read a ternary GGUF tensor in I2_S (bitnet.cpp), TQ2_0 or TQ1_0.
pub fn decode(
    name: &str,
    layout: bitnet_kernels::TernaryLayout,
    data: &[u8],
    n: usize,
) -> Result<Ternary, ConvertError> {
    use bitnet_kernels::TernaryLayout as L;
    let invalid = |index| ConvertError::InvalidCode {
        name: name.to_string(),
        index,
    };
    match layout {
        L::I2S => {
            let codes = i2s::unpack_codes(data, n);
            if let Some(index) = codes.iter().position(|&c| c == 3) {
                return Err(invalid(index));
            }
            let beta = i2s::tensor_scale(data, n).ok_or_else(|| ConvertError::Unsupported {
                name: name.to_string(),
                what: "I2_S tensor without its scale".into(),
            })?;
            if !beta.is_finite() {
                return Err(ConvertError::NonFinite {
                    name: format!("{name} (scale)"),
                    index: 0,
                });
            }
            Ok(Ternary {
                values: codes.iter().map(|&c| i2s::value_of_code(c)).collect(),
                scale: Scale::Tensor(beta),
            })
        }
        L::Tq2_0 | L::Tq1_0 => {
            let (codes, block_bytes, scale_at) = if layout == L::Tq2_0 {
                (tq2_0::unpack_codes(data), tq2_0::BLOCK_BYTES, 64)
            } else {
                (tq1_0::unpack_codes(data), tq1_0::BLOCK_BYTES, 52)
            };
            if let Some(index) = codes.iter().position(|&c| c > 2) {
                return Err(invalid(index));
            }
            let scales: Vec<f32> = data
                .chunks_exact(block_bytes)
                .map(|b| half::f16::from_le_bytes([b[scale_at], b[scale_at + 1]]).to_f32())
                .collect();
            if let Some(index) = scales.iter().position(|d| !d.is_finite()) {
                return Err(ConvertError::NonFinite {
                    name: format!("{name} (block scales)"),
                    index,
                });
            }
            Ok(Ternary {
                values: codes
                    .iter()
                    .map(|&c| i8::try_from(c).unwrap_or(1) - 1)
                    .collect(),
                scale: Scale::Blocks(scales),
            })
        }
        other => Err(ConvertError::Unsupported {
            name: name.to_string(),
            what: format!("layout {other:?}: the converter reads I2_S, TQ2_0 and TQ1_0"),
        }),
    }
}

/// The one scale of a tensor: its β, or the scale every block with a non-zero value shares.
fn tensor_scale(name: &str, t: &Ternary) -> Result<f32, ConvertError> {
    match &t.scale {
        Scale::Tensor(b) => Ok(*b),
        Scale::Blocks(d) => {
            let mut distinct: Vec<f32> = Vec::new();
            for (blk, &s) in t.values.chunks(256).zip(d) {
                if blk.iter().any(|&v| v != 0)
                    && !distinct.iter().any(|x| x.to_bits() == s.to_bits())
                {
                    distinct.push(s);
                }
            }
            match distinct.as_slice() {
                [] => Ok(d.first().copied().unwrap_or(0.0)),
                [one] => Ok(*one),
                [first, other, ..] => Err(ConvertError::MixedScales {
                    name: name.to_string(),
                    count: distinct.len(),
                    first: *first,
                    other: *other,
                }),
            }
        }
    }
}

/// Encode in the target layout. Per-block layouts take a tensor's β as every block's scale
/// (rounded to f16: the only rounding of any conversion).
pub fn encode(name: &str, t: &Ternary, target: Target) -> Result<Vec<u8>, ConvertError> {
    let n = t.values.len();
    let blocks = |t: &Ternary| -> Vec<f32> {
        match &t.scale {
            Scale::Tensor(b) => vec![*b; n / 256],
            Scale::Blocks(d) => d.clone(),
        }
    };
    Ok(match target {
        Target::I2S => i2s::pack_values(&t.values, tensor_scale(name, t)?)?,
        Target::Tq2_0 => tq2_0::pack(&t.values, &blocks(t))?,
        Target::Tq1_0 => tq1_0::pack(&t.values, &blocks(t))?,
    })
}
