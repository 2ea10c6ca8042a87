//! Embeddings: one vector per input, as llama.cpp's `llama-embedding` and `/v1/embeddings`
//! compute them — the output-normed hidden states pooled (the file's `pooling_type`: last
//! token for bitnet.cpp's embedding models) and L2-normalized.

use bitnet_model::{numerics, Outputs, Pooling, Seq};

use crate::{Engine, EngineError, Result};

/// How [`Engine::embed`] reduces and scales each input's vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EmbedOptions {
    /// The pooling; `None`: the file's `pooling_type`, else the last position (a causal
    /// model's summary of its input).
    pub pooling: Option<Pooling>,
    /// Leave the vectors as pooled (llama.cpp's `--embd-normalize -1`); otherwise each is
    /// L2-normalized (its default, 2).
    pub raw: bool,
}

/// [`Engine::embed_tokens`] with a tokenizer of its own (a server's handlers hold one).
pub fn embed_tokens(tok: &bitnet_tokenizer::Tokenizer, text: &str) -> Result<Vec<u32>> {
    let mut ids = tok.encode(text, tok.add_bos(), true)?;
    if tok.add_eos() {
        if let Some(eos) = tok.eos() {
            ids.push(eos);
        }
    }
    Ok(ids)
}

impl Engine {
    /// The pooling [`Engine::embed`] uses with `opts`.
    pub fn pooling(&self, opts: &EmbedOptions) -> Pooling {
        opts.pooling
            .or(self.config().pooling)
            .unwrap_or(Pooling::Last)
    }

    /// The tokens of one input as an embedding reads it: BOS where the vocabulary adds it,
    /// special-token text parsed, EOS appended where the file asks (`add_eos_token`: the
    /// last-token pooling of Qwen 3's embedding model reads it).
    pub fn embed_tokens(&self, text: &str) -> Result<Vec<u32>> {
        embed_tokens(&self.tokenizer, text)
    }

    /// One vector per input (for [`Pooling::None`], `n_embd` values per position, one after
    /// another). Inputs run whole, each over a cache of its own, several in one forward pass
    /// while their tokens fit a prefill batch (`n_batch`; a longer input runs alone). They run
    /// on the CPU, also for an engine that generates on a GPU (its weights are on the host
    /// too; a model streamed onto a GPU has none there: [`EngineError::WeightsOnDevice`]).
    pub fn embed(&self, inputs: &[Vec<u32>], opts: &EmbedOptions) -> Result<Vec<Vec<f32>>> {
        let model = self.model()?;
        let c = self.config();
        for ids in inputs {
            if ids.is_empty() {
                return Err(EngineError::EmptyPrompt);
            }
            if ids.len() > c.n_ctx_train {
                return Err(EngineError::ContextFull {
                    n_past: ids.len(),
                    n_ctx: c.n_ctx_train,
                });
            }
        }
        let pooling = self.pooling(opts);
        let mut out = Vec::with_capacity(inputs.len());
        let mut start = 0;
        while start < inputs.len() {
            // A group of inputs whose tokens fit one prefill batch (at least one input).
            let mut end = start + 1;
            let mut total = inputs[start].len();
            while end < inputs.len() && total + inputs[end].len() <= self.opts.n_batch {
                total += inputs[end].len();
                end += 1;
            }
            let group = &inputs[start..end];
            let mut caches = group
                .iter()
                .map(|ids| model.new_cache(ids.len(), self.opts.kv_type, self.opts.kv_budget_bytes))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let mut seqs: Vec<Seq<'_>> = group
                .iter()
                .zip(caches.iter_mut())
                .map(|(ids, cache)| Seq {
                    tokens: ids,
                    cache,
                    outputs: Outputs::None,
                })
                .collect();
            let mut scratch = self.scratch();
            let mut exec = self.exec(&mut scratch);
            let vectors = model.embed_seqs(&mut seqs, pooling, &mut exec)?;
            for v in vectors {
                out.push(if opts.raw {
                    v
                } else {
                    v.chunks(c.n_embd)
                        .flat_map(numerics::l2_normalized)
                        .collect()
                });
            }
            start = end;
        }
        Ok(out)
    }
}

/// An embedding quantized to a few bits per value (docs/MODEL.md, "Embedding quantization"):
/// one code per value and one scale, `value ≈ code · scale` (1 bit: `±scale`, the code's
/// sign bit).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedEmbedding {
    /// Bits per value: 8, 4, 2 or 1.
    pub bits: u32,
    /// One code per value: −127..=127 (8 bits), −7..=7 (4), −1..=1 (2), 0 or 1 (1 bit:
    /// 1 where the value is above zero).
    pub codes: Vec<i8>,
    /// What one step of the codes is worth (1 bit: the mean magnitude).
    pub scale: f32,
}

/// Quantize `v` to `bits` per value. 8 and 4 bits: absmax, BitNet's activation rule
/// (`s = max|v| / m`, `code = round_half_even(v · (m / max|v|))` with `m` = 127 or 7); 2 bits:
/// absmean ternary, BitNet's weight rule (`s = mean|v|`, `code = clamp(round_half_even(v / s),
/// −1, 1)`); 1 bit: the sign (`code = v > 0`), with `s = mean|v|`. A zero vector gives zero
/// codes (1 bit: all 0) and scale 0. f32 arithmetic throughout, in the order written.
pub fn quantize_embedding(v: &[f32], bits: u32) -> Result<QuantizedEmbedding> {
    #[allow(clippy::cast_precision_loss)] // vector widths are far below 2^24
    let n = v.len().max(1) as f32;
    let mean_abs = v.iter().map(|x| x.abs()).sum::<f32>() / n;
    let (codes, scale) = match bits {
        8 | 4 => {
            let m = if bits == 8 { 127.0f32 } else { 7.0 };
            let max = v.iter().fold(0.0f32, |a, x| a.max(x.abs()));
            if max > 0.0 {
                let inv = m / max;
                let codes = v.iter().map(|&x| code_of((x * inv).round_ties_even(), m));
                (codes.collect(), max / m)
            } else {
                (vec![0; v.len()], 0.0)
            }
        }
        2 => {
            if mean_abs > 0.0 {
                let codes = v
                    .iter()
                    .map(|&x| code_of((x / mean_abs).round_ties_even(), 1.0));
                (codes.collect(), mean_abs)
            } else {
                (vec![0; v.len()], 0.0)
            }
        }
        1 => (v.iter().map(|&x| i8::from(x > 0.0)).collect(), mean_abs),
        other => return Err(EngineError::EmbedBits(other)),
    };
    Ok(QuantizedEmbedding { bits, codes, scale })
}

/// `r` (a whole number) clamped to ±m, as an i8.
fn code_of(r: f32, m: f32) -> i8 {
    // r.clamp(−m, m) with m ≤ 127 is a whole number in i8's range.
    #[allow(clippy::cast_possible_truncation)]
    let c = r.clamp(-m, m) as i8;
    c
}

impl QuantizedEmbedding {
    /// The codes packed `bits` at a time, two's complement, the first value in each byte's
    /// highest bits (numpy's `packbits` order); a last partial byte is padded with zero bits.
    /// 8 bits: the codes as bytes.
    pub fn packed(&self) -> Vec<u8> {
        let bits = usize::try_from(self.bits).unwrap_or(8).clamp(1, 8);
        let per = 8 / bits;
        let mask = u8::MAX >> (8 - bits);
        self.codes
            .chunks(per)
            .map(|chunk| {
                chunk.iter().enumerate().fold(0u8, |b, (i, &c)| {
                    let shift = 8 - bits * (i + 1);
                    b | ((c.to_ne_bytes()[0] & mask) << shift)
                })
            })
            .collect()
    }

    /// The values the codes stand for: `code · scale` (1 bit: `±scale`).
    pub fn dequantized(&self) -> Vec<f32> {
        self.codes
            .iter()
            .map(|&c| match self.bits {
                1 => {
                    if c > 0 {
                        self.scale
                    } else {
                        -self.scale
                    }
                }
                _ => f32::from(c) * self.scale,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_scales_and_packing_by_hand() {
        let v = [0.5f32, -0.25, 0.0, 1.0, -1.0, 0.126];
        let q8 = quantize_embedding(&v, 8).unwrap();
        // 127 / 1.0 = 127: 63.5 → 64 (half to even), −31.75 → −32, 16.002 → 16
        assert_eq!(q8.codes, vec![64, -32, 0, 127, -127, 16]);
        assert_eq!(q8.scale, 1.0 / 127.0);
        assert_eq!(q8.packed(), vec![64, 0xe0, 0, 127, 0x81, 16]);
        let q4 = quantize_embedding(&v, 4).unwrap();
        // 7: 3.5 → 4, −1.75 → −2, 0.882 → 1
        assert_eq!(q4.codes, vec![4, -2, 0, 7, -7, 1]);
        assert_eq!(q4.packed(), vec![0x4e, 0x07, 0x91]);
        // mean |v| = 2.876 / 6 = 0.47933: 1.043 → 1, −0.52 → −1, 0.263 → 0
        let q2 = quantize_embedding(&v, 2).unwrap();
        assert_eq!(q2.codes, vec![1, -1, 0, 1, -1, 0]);
        assert_eq!(q2.packed(), vec![0b0111_0001, 0b1100_0000]);
        let q1 = quantize_embedding(&v, 1).unwrap();
        assert_eq!(q1.codes, vec![1, 0, 0, 1, 0, 1]);
        assert_eq!(q1.packed(), vec![0b1001_0100]);
        assert_eq!(q1.scale, q2.scale);
        assert_eq!(q1.dequantized()[..2], [q1.scale, -q1.scale]);
        for bits in [0, 3, 16] {
            assert!(matches!(
                quantize_embedding(&v, bits),
                Err(EngineError::EmbedBits(b)) if b == bits
            ));
        }
        let zero = quantize_embedding(&[0.0; 9], 4).unwrap();
        assert_eq!((zero.codes, zero.scale), (vec![0; 9], 0.0));
        assert_eq!(
            quantize_embedding(&[0.0; 9], 1).unwrap().packed(),
            vec![0, 0]
        );
    }
}
