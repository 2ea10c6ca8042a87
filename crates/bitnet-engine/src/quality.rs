//! Quality measures over a text, as llama.cpp's `llama-perplexity` computes them: the text
//! is cut into chunks of `n_ctx` tokens, each evaluated alone (its first token replaced by
//! BOS); the second half of each chunk is scored, every position predicting the next token.
//! The same scored log-probabilities can be saved as a base (a full-precision configuration)
//! and compared with another configuration's: mean KL divergence, top-1 agreement, the
//! largest change in the probability of the actual next token.

use std::io::{Read, Write};

use bitnet_model::Outputs;

use crate::{Engine, EngineError, Result};

/// Chunks of `n_ctx` tokens of `tokens` (at most `max_chunks`), each starting with `bos`
/// when there is one. A trailing part shorter than `n_ctx` is not used.
pub fn chunks(
    tokens: &[u32],
    n_ctx: usize,
    bos: Option<u32>,
    max_chunks: Option<usize>,
) -> Vec<Vec<u32>> {
    if n_ctx < 2 {
        return Vec::new();
    }
    tokens
        .chunks_exact(n_ctx)
        .take(max_chunks.unwrap_or(usize::MAX))
        .map(|c| {
            let mut c = c.to_vec();
            if let Some(b) = bos {
                c[0] = b;
            }
            c
        })
        .collect()
}

/// The first scored position of a chunk (llama-perplexity's `n_ctx / 2`).
pub fn first_scored(n_ctx: usize) -> usize {
    n_ctx / 2
}

/// `out = log_softmax(row)`, computed in f64.
pub fn log_softmax(row: &[f32], out: &mut [f32]) {
    let max = row
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
    let sum: f64 = row.iter().map(|&x| (f64::from(x) - max).exp()).sum();
    let log_z = max + sum.ln();
    for (o, &x) in out.iter_mut().zip(row) {
        // Rounded once to f32.
        #[allow(clippy::cast_possible_truncation)]
        let v = (f64::from(x) - log_z) as f32;
        *o = v;
    }
}

/// Evaluates one chunk from an empty context and returns the log-probabilities of its
/// scored positions: rows `first..n_ctx - 1` (each predicting the next token), row-major,
/// `n_vocab` each.
pub fn chunk_log_probs(engine: &Engine, chunk: &[u32]) -> Result<Vec<f32>> {
    let n = chunk.len();
    let first = first_scored(n);
    let n_vocab = engine.config().n_vocab;
    let mut s = engine.new_session(n)?;
    if s.n_ctx() < n {
        return Err(EngineError::ContextFull {
            n_past: n,
            n_ctx: s.n_ctx(),
        });
    }
    let logits = engine.eval(&mut s, chunk, Outputs::All)?;
    let rows = n.saturating_sub(first + 1);
    let mut out = vec![0.0f32; rows * n_vocab];
    for (j, o) in out.chunks_exact_mut(n_vocab).enumerate() {
        let p = first + j;
        log_softmax(&logits[p * n_vocab..(p + 1) * n_vocab], o);
    }
    Ok(out)
}

/// Running negative log-likelihood of the scored tokens.
#[derive(Debug, Clone, Copy, Default)]
pub struct Nll {
    sum: f64,
    sum_sq: f64,
    count: u64,
}

impl Nll {
    /// Add the scored rows of `chunk` (from [`chunk_log_probs`]).
    pub fn add(&mut self, chunk: &[u32], log_probs: &[f32], n_vocab: usize) {
        let first = first_scored(chunk.len());
        for (j, row) in log_probs.chunks_exact(n_vocab).enumerate() {
            let Some(&next) = chunk.get(first + j + 1) else {
                break;
            };
            let lp = usize::try_from(next).ok().and_then(|t| row.get(t)).copied();
            let nll = -f64::from(lp.unwrap_or(f32::NEG_INFINITY));
            self.sum += nll;
            self.sum_sq += nll * nll;
            self.count += 1;
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Perplexity, `exp(mean NLL)`.
    pub fn perplexity(&self) -> f64 {
        (self.sum / self.count.max(1) as f64).exp()
    }

    /// The standard error of the perplexity (from the NLL's standard error, as
    /// llama-perplexity reports it).
    pub fn perplexity_error(&self) -> f64 {
        let n = self.count as f64;
        if n < 2.0 {
            return f64::NAN;
        }
        let mean = self.sum / n;
        let var = (self.sum_sq / n - mean * mean).max(0.0) * n / (n - 1.0);
        self.perplexity() * (var / n).sqrt()
    }
}

/// How far a configuration's scored distributions are from a base's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Divergence {
    kl_sum: f64,
    kl_sum_sq: f64,
    top1_same: u64,
    count: u64,
    /// Largest |p_base − p| of the actual next token.
    pub max_dp: f64,
}

impl Divergence {
    /// Add one scored row: the base's and this configuration's log-probabilities, and the
    /// actual next token.
    pub fn add(&mut self, base: &[f32], this: &[f32], next: u32) {
        let mut kl = 0.0f64;
        for (&b, &t) in base.iter().zip(this) {
            if b > f32::NEG_INFINITY {
                kl += f64::from(b).exp() * (f64::from(b) - f64::from(t));
            }
        }
        let argmax = |r: &[f32]| {
            r.iter()
                .enumerate()
                .fold((0usize, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
                    if v > bv {
                        (i, v)
                    } else {
                        (bi, bv)
                    }
                })
                .0
        };
        if argmax(base) == argmax(this) {
            self.top1_same += 1;
        }
        if let Some((&b, &t)) = usize::try_from(next)
            .ok()
            .and_then(|i| base.get(i).zip(this.get(i)))
        {
            let dp = (f64::from(b).exp() - f64::from(t).exp()).abs();
            self.max_dp = self.max_dp.max(dp);
        }
        self.kl_sum += kl;
        self.kl_sum_sq += kl * kl;
        self.count += 1;
    }

    /// Add the scored rows of `chunk`: the base's and this configuration's log-probabilities
    /// (from [`chunk_log_probs`]), each row scored against the chunk's next token.
    pub fn add_chunk(&mut self, chunk: &[u32], base: &[f32], this: &[f32], n_vocab: usize) {
        let first = first_scored(chunk.len());
        for (j, (b, t)) in base
            .chunks_exact(n_vocab)
            .zip(this.chunks_exact(n_vocab))
            .enumerate()
        {
            let Some(&next) = chunk.get(first + j + 1) else {
                break;
            };
            self.add(b, t, next);
        }
    }

    pub fn mean_kl(&self) -> f64 {
        self.kl_sum / self.count.max(1) as f64
    }

    /// Standard error of the mean KL.
    pub fn kl_error(&self) -> f64 {
        let n = self.count as f64;
        if n < 2.0 {
            return f64::NAN;
        }
        let mean = self.mean_kl();
        let var = (self.kl_sum_sq / n - mean * mean).max(0.0) * n / (n - 1.0);
        (var / n).sqrt()
    }

    /// Fraction of rows whose most likely token is the base's.
    pub fn top1_agreement(&self) -> f64 {
        self.top1_same as f64 / self.count.max(1) as f64
    }
}

/// The KL base file: `BNKLBASE`, version 1, then `n_vocab`, `n_ctx`, `n_chunks` (u32 little
/// endian), then per chunk its `n_ctx` token ids (u32) and its scored rows of f32
/// log-probabilities (`n_ctx − n_ctx/2 − 1` rows of `n_vocab`).
pub const KL_MAGIC: &[u8; 8] = b"BNKLBASE";

/// The header of a KL base file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KlHeader {
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub n_chunks: usize,
}

fn u32_of(n: usize, what: &'static str) -> Result<u32> {
    u32::try_from(n)
        .map_err(|_| EngineError::KlBase(format!("{what} {n} does not fit the file format")))
}

impl KlHeader {
    pub fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(KL_MAGIC)?;
        w.write_all(&1u32.to_le_bytes())?;
        for v in [self.n_vocab, self.n_ctx, self.n_chunks] {
            // Checked by `KlHeader::new`.
            w.write_all(&u32::try_from(v).unwrap_or(u32::MAX).to_le_bytes())?;
        }
        Ok(())
    }

    /// A header, checked to fit the format.
    pub fn new(n_vocab: usize, n_ctx: usize, n_chunks: usize) -> Result<Self> {
        u32_of(n_vocab, "n_vocab")?;
        u32_of(n_ctx, "n_ctx")?;
        u32_of(n_chunks, "the chunk count")?;
        Ok(KlHeader {
            n_vocab,
            n_ctx,
            n_chunks,
        })
    }

    pub fn read(r: &mut impl Read) -> Result<Self> {
        let mut magic = [0u8; 8];
        read_exact(r, &mut magic, "the header")?;
        if &magic != KL_MAGIC {
            return Err(EngineError::KlBase("not a KL base file (bad magic)".into()));
        }
        let mut v = [0u32; 4];
        for x in &mut v {
            let mut b = [0u8; 4];
            read_exact(r, &mut b, "the header")?;
            *x = u32::from_le_bytes(b);
        }
        if v[0] != 1 {
            return Err(EngineError::KlBase(format!("unknown version {}", v[0])));
        }
        let us = |x: u32| usize::try_from(x).unwrap_or(usize::MAX);
        let h = KlHeader {
            n_vocab: us(v[1]),
            n_ctx: us(v[2]),
            n_chunks: us(v[3]),
        };
        if h.n_vocab == 0 || h.n_ctx < 2 || h.n_chunks == 0 {
            return Err(EngineError::KlBase(format!(
                "empty or invalid header {h:?}"
            )));
        }
        Ok(h)
    }

    /// Scored rows per chunk.
    pub fn rows(&self) -> usize {
        self.n_ctx.saturating_sub(first_scored(self.n_ctx) + 1)
    }
}

/// Reads exactly `buf.len()` bytes; a short file is a [`EngineError::KlBase`] error.
pub fn read_exact(r: &mut impl Read, buf: &mut [u8], what: &str) -> Result<()> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => {
            EngineError::KlBase(format!("the file ends inside {what} (truncated?)"))
        }
        _ => EngineError::KlBase(format!("cannot read {what}: {e}")),
    })
}

/// Writes one chunk of a KL base: its tokens and its scored log-probabilities.
pub fn write_chunk(w: &mut impl Write, chunk: &[u32], log_probs: &[f32]) -> std::io::Result<()> {
    for t in chunk {
        w.write_all(&t.to_le_bytes())?;
    }
    for x in log_probs {
        w.write_all(&x.to_le_bytes())?;
    }
    Ok(())
}

/// Reads one chunk of a KL base described by `h`: its tokens (checked below `n_vocab`) and
/// its scored log-probabilities.
pub fn read_chunk(r: &mut impl Read, h: &KlHeader) -> Result<(Vec<u32>, Vec<f32>)> {
    let mut buf = vec![0u8; h.n_ctx * 4];
    read_exact(r, &mut buf, "a chunk's tokens")?;
    let tokens: Vec<u32> = buf
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if let Some(&bad) = tokens
        .iter()
        .find(|&&t| usize::try_from(t).map_or(true, |t| t >= h.n_vocab))
    {
        return Err(EngineError::KlBase(format!(
            "token id {bad} is not below n_vocab = {}",
            h.n_vocab
        )));
    }
    let n = h.rows() * h.n_vocab;
    let mut buf = vec![0u8; n * 4];
    read_exact(r, &mut buf, "a chunk's log-probabilities")?;
    let lp = buf
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok((tokens, lp))
}
