//! Layer skip: leave out the blocks that change the hidden state least (an opt-in
//! approximation; fast numerics only).
//!
//! A block's importance is `1 − cos(input, output)` of the hidden state it receives and
//! passes on, averaged over every position of a few calibration prompts. `auto` skips the
//! least important blocks up to a fraction of the model, always keeping the first and last
//! two.

use bitnet_model::{Exec, Outputs, TraceEvent};

use crate::{Engine, EngineError, Result};

/// Which blocks to skip.
#[derive(Debug, Clone, PartialEq)]
pub enum SkipLayers {
    /// These block indices.
    List(Vec<usize>),
    /// The least important blocks, up to this fraction of them (in `(0, 1)`).
    Auto { fraction: f64 },
}

/// Blocks never skipped at either end.
pub const KEEP_ENDS: usize = 2;

/// Calibration text for `auto` (plain English prose, code and numbers).
const CALIBRATION: [&str; 3] = [
    "The quick brown fox jumps over the lazy dog. Once upon a time, there was a little robot \
     who wanted to learn how to paint. Every morning it rolled to the window and watched the light.",
    "fn main() {\n    let xs: Vec<u32> = (1..=10).collect();\n    println!(\"{}\", xs.iter().sum::<u32>());\n}",
    "In 1969, 3 astronauts flew 384,400 km to the Moon; the mission lasted 8 days, 3 hours and 18 minutes.",
];

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 {
        return 1.0;
    }
    ab / (aa.sqrt() * bb.sqrt())
}

/// Each block's importance (`1 − cos(in, out)`, mean over the calibration positions); a
/// block the engine skips now scores 0.
pub fn importance(engine: &Engine) -> Result<Vec<f64>> {
    let c = engine.config();
    let (n_layer, n_embd) = (c.n_layer, c.n_embd);
    let mut sum = vec![0.0f64; n_layer];
    let mut count = 0usize;
    let tok = &engine.tokenizer;
    for text in CALIBRATION {
        let ids = tok.encode(text, tok.add_bos(), false)?;
        let mut cache =
            engine
                .model()?
                .new_cache(ids.len().max(1), engine.options().kv_type, u64::MAX)?;
        // The embedding, and each block's output (skipped blocks report none).
        let mut embd: Vec<f32> = Vec::new();
        let mut outs: Vec<Option<Vec<f32>>> = vec![None; n_layer];
        {
            let mut hook = |ev: &TraceEvent<'_>| match (ev.name, ev.layer) {
                ("inp_embd", _) => embd = ev.data.to_vec(),
                ("l_out", Some(il)) if il < n_layer => outs[il] = Some(ev.data.to_vec()),
                _ => {}
            };
            let mut exec = Exec {
                backend: engine.backend(),
                numerics: engine.options().numerics,
                trace: Some(&mut hook),
                scratch: None,
            };
            engine
                .model()?
                .forward(&ids, &mut cache, Outputs::None, &mut exec)?;
        }
        if embd.len() != ids.len() * n_embd {
            return Err(EngineError::Skip(
                "the forward pass did not report its embedding".into(),
            ));
        }
        let mut input = &embd;
        for il in 0..n_layer {
            let Some(out) = &outs[il] else {
                continue; // skipped: the input passes through unchanged
            };
            for (a, b) in input.chunks_exact(n_embd).zip(out.chunks_exact(n_embd)) {
                sum[il] += 1.0 - cosine(a, b);
            }
            input = out;
        }
        count += ids.len();
    }
    Ok(sum.into_iter().map(|s| s / count.max(1) as f64).collect())
}

/// The blocks to skip for `auto`: the least important, at most `fraction` of the blocks,
/// never the first or last [`KEEP_ENDS`]. Sorted.
pub fn choose(importance: &[f64], fraction: f64) -> Vec<usize> {
    let n = importance.len();
    if n <= 2 * KEEP_ENDS || fraction.is_nan() || fraction <= 0.0 {
        return Vec::new();
    }
    // Fractions of a block count: floor, at least... none when it rounds to 0.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let budget = ((n as f64) * fraction.min(1.0)).floor() as usize;
    let mut middle: Vec<usize> = (KEEP_ENDS..n - KEEP_ENDS).collect();
    middle.sort_by(|&a, &b| importance[a].total_cmp(&importance[b]).then(a.cmp(&b)));
    let mut out: Vec<usize> = middle.into_iter().take(budget).collect();
    out.sort_unstable();
    out
}
