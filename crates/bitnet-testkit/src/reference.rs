//! A plain f32 reference forward pass, written independently of `bitnet-model`: weights
//! dequantized to f32 rows, no int8 activation quantization, naive loops. It is the yardstick
//! for the model's trace hook: the only intended difference is the activation quantization.

// f64 accumulations rounded to f32 are the point of a reference; shapes come from a file the
// model loader has already validated in the tests that use this.
#![allow(clippy::cast_possible_truncation)]

use bitnet_gguf::{GgufFile, Value};
use bitnet_kernels::{RowMatrix, RowType, TernaryMatrix};

use crate::SynthError;

/// Intermediates of one token position, by step name, per layer.
#[derive(Debug, Default, Clone)]
pub struct RefTrace {
    /// (step name, layer, values) in evaluation order, for the last position.
    pub steps: Vec<(&'static str, Option<usize>, Vec<f32>)>,
    /// logits of the last position
    pub logits: Vec<f32>,
}

struct Dense {
    rows: usize,
    cols: usize,
    /// [rows][cols]
    w: Vec<f32>,
}

impl Dense {
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        (0..self.rows)
            .map(|r| {
                self.w[r * self.cols..(r + 1) * self.cols]
                    .iter()
                    .zip(x)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum::<f64>() as f32
            })
            .collect()
    }
}

fn uint(f: &GgufFile, key: &str) -> Result<usize, SynthError> {
    let v = f.metadata().get_uint(key)?;
    usize::try_from(v).map_err(|_| SynthError::Shape(format!("{key} too large")))
}

fn f32s(f: &GgufFile, name: &str) -> Result<Vec<f32>, SynthError> {
    let t = f
        .tensor(name)
        .ok_or_else(|| SynthError::Shape(format!("missing {name}")))?;
    Ok(f.tensor_data(t)?
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn ternary(f: &GgufFile, name: &str, n_in: usize, n_out: usize) -> Result<Dense, SynthError> {
    let t = f
        .tensor(name)
        .ok_or_else(|| SynthError::Shape(format!("missing {name}")))?;
    let align = usize::try_from(f.alignment()).unwrap_or(32);
    let m = TernaryMatrix::detect_type36(name, n_out, n_in, f.tensor_bytes(t)?, align, None)?;
    let mut w = vec![0.0f32; n_out * n_in];
    for (r, row) in w.chunks_exact_mut(n_in).enumerate() {
        m.dequantize_row(r, row)?;
    }
    Ok(Dense {
        rows: n_out,
        cols: n_in,
        w,
    })
}

fn rms(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + f64::from(eps)).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, g)| (f64::from(*v) * s * f64::from(*g)) as f32)
        .collect()
}

fn rope(x: &mut [f32], head_dim: usize, pos: usize, base: f32) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let theta = pos as f64 * f64::from(base).powf(-2.0 * i as f64 / head_dim as f64);
            let (s, c) = theta.sin_cos();
            let (a, b) = (f64::from(head[i]), f64::from(head[i + half]));
            head[i] = (a * c - b * s) as f32;
            head[i + half] = (a * s + b * c) as f32;
        }
    }
}

/// Run `tokens` through an I2_S BitNet b1.58 file in plain f32 and return the intermediates of
/// the last position (names as the model's trace hook uses: `attn_norm`, `kqv_out`, `ffn_inp`,
/// `l_out`, `result_norm`) and its logits.
pub fn reference_forward(f: &GgufFile, tokens: &[u32]) -> Result<RefTrace, SynthError> {
    let arch = match f.metadata().get("general.architecture") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(SynthError::Shape("no architecture".into())),
    };
    let k = |s: &str| format!("{arch}.{s}");
    let (e, n_layer, ff) = (
        uint(f, &k("embedding_length"))?,
        uint(f, &k("block_count"))?,
        uint(f, &k("feed_forward_length"))?,
    );
    let (n_head, n_kv) = (
        uint(f, &k("attention.head_count"))?,
        uint(f, &k("attention.head_count_kv"))?,
    );
    let eps = f
        .metadata()
        .get_f32(&k("attention.layer_norm_rms_epsilon"))?;
    let base = f.metadata().get_f32(&k("rope.freq_base"))?;
    let hd = e / n_head;
    let kvw = n_kv * hd;
    let emb_t = f
        .tensor("token_embd.weight")
        .ok_or_else(|| SynthError::Shape("no embedding".into()))?;
    let n_vocab = usize::try_from(emb_t.dims[1]).unwrap_or(0);
    let emb = RowMatrix::new(
        RowType::F16,
        n_vocab,
        e,
        std::borrow::Cow::Borrowed(f.tensor_data(emb_t)?),
    )?;
    let mut trace = RefTrace::default();
    let last = tokens.len() - 1;

    let mut hs: Vec<Vec<f32>> = tokens
        .iter()
        .map(|&t| {
            let mut row = vec![0.0f32; e];
            emb.dequantize_row(t as usize, &mut row).map(|()| row)
        })
        .collect::<Result<_, _>>()?;
    for il in 0..n_layer {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let (wq, wk, wv, wo) = (
            ternary(f, &n("attn_q"), e, e)?,
            ternary(f, &n("attn_k"), e, kvw)?,
            ternary(f, &n("attn_v"), e, kvw)?,
            ternary(f, &n("attn_output"), e, e)?,
        );
        let (wg, wu, wd) = (
            ternary(f, &n("ffn_gate"), e, ff)?,
            ternary(f, &n("ffn_up"), e, ff)?,
            ternary(f, &n("ffn_down"), ff, e)?,
        );
        let (an, asn, fnn, fsn) = (
            f32s(f, &n("attn_norm"))?,
            f32s(f, &n("attn_sub_norm"))?,
            f32s(f, &n("ffn_norm"))?,
            f32s(f, &n("ffn_sub_norm"))?,
        );
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut qs = Vec::new();
        for (pos, h) in hs.iter().enumerate() {
            let a = rms(h, &an, eps);
            if pos == last {
                trace.steps.push(("attn_norm", Some(il), a.clone()));
            }
            let (mut q, mut kk) = (wq.apply(&a), wk.apply(&a));
            rope(&mut q, hd, pos, base);
            rope(&mut kk, hd, pos, base);
            qs.push(q);
            ks.push(kk);
            vs.push(wv.apply(&a));
        }
        for pos in 0..hs.len() {
            let mut o = vec![0.0f32; e];
            for h in 0..n_head {
                let g = h / (n_head / n_kv);
                let q = &qs[pos][h * hd..(h + 1) * hd];
                let scores: Vec<f64> = (0..=pos)
                    .map(|j| {
                        q.iter()
                            .zip(&ks[j][g * hd..(g + 1) * hd])
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let mx = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                let sum: f64 = ex.iter().sum();
                for d in 0..hd {
                    o[h * hd + d] = (0..=pos)
                        .map(|j| ex[j] / sum * f64::from(vs[j][g * hd + d]))
                        .sum::<f64>() as f32;
                }
            }
            if pos == last {
                trace.steps.push(("kqv_out", Some(il), o.clone()));
            }
            let o = rms(&o, &asn, eps);
            let h = &mut hs[pos];
            for (x, y) in h.iter_mut().zip(wo.apply(&o)) {
                *x += y;
            }
            if pos == last {
                trace.steps.push(("ffn_inp", Some(il), h.clone()));
            }
            let fx = rms(h, &fnn, eps);
            let g: Vec<f32> = wg
                .apply(&fx)
                .iter()
                .zip(wu.apply(&fx))
                .map(|(g, u)| g.max(0.0) * g.max(0.0) * u)
                .collect();
            let g = rms(&g, &fsn, eps);
            for (x, y) in h.iter_mut().zip(wd.apply(&g)) {
                *x += y;
            }
            if pos == last {
                trace.steps.push(("l_out", Some(il), h.clone()));
            }
        }
    }
    let hn = rms(&hs[last], &f32s(f, "output_norm.weight")?, eps);
    trace.steps.push(("result_norm", None, hn.clone()));
    let mut row = vec![0.0f32; e];
    trace.logits = (0..n_vocab)
        .map(|r| {
            emb.dequantize_row(r, &mut row).map(|()| {
                row.iter()
                    .zip(&hn)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum::<f64>() as f32
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(trace)
}
