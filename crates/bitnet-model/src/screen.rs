//! The screened LM head: the next token chosen from the file's own logits without computing
//! all of them.
//!
//! A generation step that samples greedily, or from the top-k with `k` at most a few dozen,
//! needs the exact logits of a handful of tokens, not of the whole vocabulary. The screen is a
//! Q8_0 copy `Ĥ` of the head `H` built at load (half the bytes of the F16 rows), and for every
//! row `i` two numbers that bound how far its Q8_0 dot can be from the exact one:
//!
//! ```text
//! |l_i − a_i| ≤ b_i = ‖x‖·(‖h_i − ĥ_i‖ + γ‖h_i‖) + ‖ĥ_i‖·(‖x − x̂‖ + γ‖x̂‖)
//! ```
//!
//! where `l_i` is the logit the full head computes (`h_i · x` rounded in f32 in the kernel's
//! order), `a_i` the screen's (`ĥ_i · x̂` with the activations `x̂` quantized to Q8_0 per 32,
//! integer block sums scaled in f32), and γ a rounding allowance for a dot product of that
//! length in f32 in any order (twice the textbook `n·2^-24/(1 − n·2^-24)`). The terms are
//! the head's quantization error, the activations' quantization error and the two dots'
//! float rounding (Cauchy–Schwarz bounds each). The norms are computed in f64 and rounded up.
//!
//! So every logit lies in `[a_i − b_i, a_i + b_i]`. For the arg-max, every token whose upper
//! end reaches the largest lower end is a candidate; for the `n` most likely tokens, every
//! token whose upper end reaches the `n`-th largest lower end. Any other token is below `n`
//! tokens for certain. The candidates' logits are then computed from the file's F16 rows with
//! the kernels the full head uses (`Backend::lm_head_rows`: the same bits), and the choice is
//! made among them: the same token, and for top-k the same candidates and logits, as from the
//! full logits. When the bounds leave too many candidates, or anything is not finite, the
//! screen declines and the caller computes the full logits.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::sync::atomic::{self, AtomicU64};

use bitnet_kernels::rows::{
    dequantize_row_bytes, quantize_q8_0_split, quantize_row_into, RELEASE_ROWS,
};
use bitnet_kernels::{Pool, RowMatrix, RowType};

use crate::{Backend, ModelError, Numerics, Result};

/// What a step needs to choose its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// The arg-max (lowest id among equal maxima).
    Greedy,
    /// The `n` most likely tokens with their logits.
    Top(usize),
}

/// What a step gives back to choose its token from (a screened head's answer, a GPU's, or the
/// logits).
#[derive(Debug, Clone, PartialEq)]
pub enum Picked {
    /// The arg-max of the logits.
    Chosen(u32),
    /// The `n` most likely tokens, most likely first (lowest id first among equal logits),
    /// with their logits (a screen's top-k; in the engine also a GPU's top candidates).
    Top(Vec<(u32, f32)>),
    /// The full logits (the screen declined, there is none, or the step needs them).
    Logits(Vec<f32>),
}

/// Candidates above this share of the vocabulary make the screen decline (the full head then
/// reads about as much).
const MAX_CANDIDATE_SHARE: usize = 4;

/// Per-row bounds and the Q8_0 copy of the head (see the module docs).
#[derive(Debug)]
pub struct HeadScreen {
    q8: RowMatrix<'static>,
    /// `‖h_i − ĥ_i‖ + γ‖h_i‖`, rounded up.
    weight_err: Vec<f32>,
    /// `‖ĥ_i‖`, rounded up.
    shadow_norm: Vec<f32>,
    tally: Tally,
}

/// What a screen has done since it was built, counted as it goes.
#[derive(Debug, Default)]
struct Tally {
    decided: AtomicU64,
    declined: AtomicU64,
    candidates: AtomicU64,
    max_candidates: AtomicU64,
}

/// How a screen has served its steps ([`HeadScreen::counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScreenCounts {
    /// Rows the screen chose for (a greedy token or a top-k list).
    pub decided: u64,
    /// Rows it left to the full head: too many candidates, a value not finite, or a pick it
    /// cannot decide.
    pub declined: u64,
    /// The candidates whose logits it computed from the head's rows, over the decided rows.
    pub candidates: u64,
    /// The most candidates of one decided row.
    pub max_candidates: u64,
}

impl ScreenCounts {
    /// Candidates per decided row (0 when none was decided).
    #[must_use]
    #[allow(clippy::cast_precision_loss)] // counts of steps: far below 2^53, exact in f64
    pub fn mean_candidates(&self) -> f64 {
        if self.decided == 0 {
            0.0
        } else {
            self.candidates as f64 / self.decided as f64
        }
    }
}

/// The rounding allowance of an f32 dot product of `n` terms summed in any order, with or
/// without fused multiply-adds: twice the textbook `γ_n = n·u/(1 − n·u)` (u = 2^-24), which
/// also covers the two products that scale each block of the Q8_0 dot. Fast numerics' F16
/// dot widens the halves exactly and keeps the activations in f32 on every tier, so its only
/// error is that of the sums.
fn gamma(n: usize) -> f64 {
    let nu = f64::from(u32::try_from(n).unwrap_or(u32::MAX)) * 2f64.powi(-24);
    2.0 * nu / (1.0 - nu).max(0.5)
}

/// `v` as an f32 no smaller than it (non-negative `v`; NaN stays NaN, +∞ stays +∞).
fn round_up(v: f64) -> f32 {
    #[allow(clippy::cast_possible_truncation)] // f64 → f32 rounds to nearest; corrected below
    let f = v as f32;
    if f64::from(f) < v {
        f.next_up()
    } else {
        f
    }
}

fn norm(v: impl Iterator<Item = f64>) -> f64 {
    v.map(|x| x * x).sum::<f64>().sqrt()
}

impl HeadScreen {
    /// Build the screen of `head` (F16, BF16 or F32: a head whose full logits dot the
    /// activations in f32, as the bound assumes; its width a multiple of 32), rows in
    /// parallel, handing each run of at most [`RELEASE_ROWS`] source rows to `release` once
    /// they are read (so a memory-mapped source need not stay resident).
    pub fn build(
        head: &RowMatrix<'_>,
        pool: &Pool,
        release: &(dyn Fn(&[u8]) + Sync),
    ) -> Result<HeadScreen> {
        let cols = head.cols();
        let rows = head.rows();
        if !matches!(head.row_type(), RowType::F16 | RowType::BF16 | RowType::F32) {
            // A quantized head's own dot quantizes the activations too (Q8_0, Q4_0), which
            // the bound does not cover, and a Q8_0 screen would not read fewer bytes.
            return Err(ModelError::Unsupported(format!(
                "a screened LM head of type {:?} (the screen is for F16, BF16 and F32 heads)",
                head.row_type()
            )));
        }
        if !cols.is_multiple_of(32) || cols == 0 {
            return Err(ModelError::Unsupported(format!(
                "a screened LM head {cols} wide (the screen is Q8_0: a multiple of 32)"
            )));
        }
        let row_bytes = RowType::Q8_0.row_bytes(cols)?;
        let src_bytes = head.row_type().row_bytes(cols)?;
        let g = gamma(cols);
        let total = rows
            .checked_mul(row_bytes)
            .ok_or(ModelError::Overflow("the LM head's screen"))?;
        let mut data = vec![0u8; total];
        let mut norms = vec![0f32; rows * 2];
        pool.for_rows_mut2(
            &mut data,
            row_bytes,
            &mut norms,
            2,
            16,
            &|range, out, nr| {
                let mut h = vec![0f32; cols];
                let mut hat = vec![0f32; cols];
                let mut start = range.start;
                while start < range.end {
                    let end = (start + RELEASE_ROWS).min(range.end);
                    for r in start..end {
                        let i = r - range.start;
                        let src = &head.data()[r * src_bytes..(r + 1) * src_bytes];
                        dequantize_row_bytes(head.row_type(), src, &mut h);
                        let dst = &mut out[i * row_bytes..(i + 1) * row_bytes];
                        quantize_row_into(RowType::Q8_0, &h, dst);
                        dequantize_row_bytes(RowType::Q8_0, dst, &mut hat);
                        let err = norm(
                            h.iter()
                                .zip(&hat)
                                .map(|(&a, &b)| f64::from(a) - f64::from(b)),
                        );
                        let nh = norm(h.iter().map(|&a| f64::from(a)));
                        let nq = norm(hat.iter().map(|&a| f64::from(a)));
                        nr[2 * i] = round_up(err + g * nh);
                        nr[2 * i + 1] = round_up(nq);
                    }
                    release(&head.data()[start * src_bytes..end * src_bytes]);
                    start = end;
                }
            },
        )?;
        let (weight_err, shadow_norm) = norms.chunks_exact(2).map(|p| (p[0], p[1])).unzip();
        Ok(HeadScreen {
            q8: RowMatrix::new(RowType::Q8_0, rows, cols, Cow::Owned(data))?,
            weight_err,
            shadow_norm,
            tally: Tally::default(),
        })
    }

    /// Bytes held (the Q8_0 copy and the bounds), all of which a screened step reads besides
    /// its candidates' rows.
    pub fn nbytes(&self) -> usize {
        self.q8.nbytes() + 8 * self.weight_err.len()
    }

    /// How the screen has served its steps since it was built.
    pub fn counts(&self) -> ScreenCounts {
        let t = &self.tally;
        let get = |a: &AtomicU64| a.load(atomic::Ordering::Relaxed);
        ScreenCounts {
            decided: get(&t.decided),
            declined: get(&t.declined),
            candidates: get(&t.candidates),
            max_candidates: get(&t.max_candidates),
        }
    }

    /// The choice `pick` for one normed hidden state `h` (`n_embd`) through `head`, whose
    /// screen this is: `Ok(None)` when the screen declines (too many candidates, a value that
    /// is not finite: the full logits decide, and report what is wrong).
    pub fn pick(
        &self,
        head: &RowMatrix<'_>,
        h: &[f32],
        pick: Pick,
        backend: &dyn Backend,
    ) -> Result<Option<Picked>> {
        Ok(self.pick_rows(head, h, &[pick], backend)?.pop().flatten())
    }

    /// [`HeadScreen::pick`] for several normed hidden states at once (`hs`: `picks.len()`
    /// rows of `n_embd`, row `r` chosen as `picks[r]` asks): one pass over the screen serves
    /// them all, as a batch of sequences decoding together reads the head once. Each answer
    /// is the one [`HeadScreen::pick`] gives that row alone.
    pub fn pick_rows(
        &self,
        head: &RowMatrix<'_>,
        hs: &[f32],
        picks: &[Pick],
        backend: &dyn Backend,
    ) -> Result<Vec<Option<Picked>>> {
        let rows = self.q8.rows();
        let cols = self.q8.cols();
        if head.rows() != rows
            || head.cols() != cols
            || picks.len().checked_mul(cols) != Some(hs.len())
        {
            return Err(ModelError::Backend(
                "the LM head's screen does not match the head".into(),
            ));
        }
        let mut out = vec![None; picks.len()];
        // The rows the screen may answer: a pick it can decide, every value finite.
        let live: Vec<usize> = (0..picks.len())
            .filter(|&r| {
                let ok = match picks[r] {
                    Pick::Greedy => true,
                    Pick::Top(n) => n > 0 && n < rows,
                };
                ok && hs[r * cols..(r + 1) * cols].iter().all(|v| v.is_finite())
            })
            .collect();
        self.tally.declined.fetch_add(
            u64::try_from(picks.len() - live.len()).unwrap_or(u64::MAX),
            atomic::Ordering::Relaxed,
        );
        if live.is_empty() {
            return Ok(out);
        }
        let x: Vec<f32> = live
            .iter()
            .flat_map(|&r| hs[r * cols..(r + 1) * cols].iter().copied())
            .collect();
        let mut a = vec![0f32; live.len() * rows];
        backend.lm_head(&self.q8, &x, live.len(), Numerics::Fast, &mut a)?;
        for (j, &r) in live.iter().enumerate() {
            out[r] = self.decide(
                head,
                &x[j * cols..(j + 1) * cols],
                &a[j * rows..(j + 1) * rows],
                picks[r],
                backend,
            )?;
            if out[r].is_none() {
                self.tally.declined.fetch_add(1, atomic::Ordering::Relaxed);
            }
        }
        Ok(out)
    }

    /// One row's choice from its screened logits `a`: the bound of every logit, the
    /// candidates, their exact logits from `head`'s rows. `h` is finite and the pick one the
    /// screen can decide.
    fn decide(
        &self,
        head: &RowMatrix<'_>,
        h: &[f32],
        a: &[f32],
        pick: Pick,
        backend: &dyn Backend,
    ) -> Result<Option<Picked>> {
        let rows = self.q8.rows();
        let cols = self.q8.cols();
        let n = match pick {
            Pick::Greedy => 1,
            Pick::Top(n) if n > 0 && n < rows => n,
            Pick::Top(_) => return Ok(None),
        };
        // The activations as the integer dots quantize them.
        let mut xq = vec![0i8; cols];
        let mut xd = vec![0f32; cols / 32];
        quantize_q8_0_split(h, &mut xq, &mut xd)?;
        let hat = |j: usize| f64::from(xq[j]) * f64::from(xd[j / 32]);
        let x_norm = norm(h.iter().map(|&v| f64::from(v)));
        let d_norm = norm((0..cols).map(|j| f64::from(h[j]) - hat(j)));
        let xq_norm = norm((0..cols).map(hat));
        let c_weight = x_norm;
        let c_shadow = d_norm + gamma(cols) * xq_norm;
        // The bound's own arithmetic (a few f64 operations) is covered by a relative margin.
        let margin = 1.0 + 2f64.powi(-20);

        let mut lo: Vec<f64> = Vec::with_capacity(rows);
        let mut hi = Vec::with_capacity(rows);
        for ((&ai, &we), &sn) in a.iter().zip(&self.weight_err).zip(&self.shadow_norm) {
            let b = (c_weight * f64::from(we) + c_shadow * f64::from(sn)) * margin;
            let ai = f64::from(ai);
            // |a| + b finite and far below f32::MAX: no exact logit can overflow either.
            let reach = ai.abs() + b;
            if reach.is_nan() || reach >= 1e37 {
                return Ok(None);
            }
            lo.push(ai - b);
            hi.push(ai + b);
        }
        // `lo` is read only for the threshold: the selection may reorder it in place.
        let threshold = if n == 1 {
            lo.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        } else {
            *lo.select_nth_unstable_by(n - 1, |x, y| y.total_cmp(x)).1
        };
        let ids: Vec<u32> = (0u32..)
            .zip(&hi)
            .filter(|&(_, &u)| u >= threshold)
            .map(|(i, _)| i)
            .collect();
        if ids.len() > rows / MAX_CANDIDATE_SHARE || ids.len() < n {
            return Ok(None);
        }
        let mut logits = vec![0f32; ids.len()];
        backend.lm_head_rows(head, &ids, h, &mut logits)?;
        if logits.iter().any(|l| !l.is_finite()) {
            return Ok(None);
        }
        let n_cands = u64::try_from(ids.len()).unwrap_or(u64::MAX);
        self.tally.decided.fetch_add(1, atomic::Ordering::Relaxed);
        self.tally
            .candidates
            .fetch_add(n_cands, atomic::Ordering::Relaxed);
        self.tally
            .max_candidates
            .fetch_max(n_cands, atomic::Ordering::Relaxed);
        let mut cands: Vec<(u32, f32)> = ids.into_iter().zip(logits).collect();
        Ok(match pick {
            // Ascending ids: the first of equal maxima is kept.
            Pick::Greedy => cands
                .iter()
                .copied()
                .reduce(|best, c| if c.1 > best.1 { c } else { best })
                .map(|best| Picked::Chosen(best.0)),
            Pick::Top(_) => {
                // The sampler's order: higher logit, then lower id (all finite here).
                cands.sort_unstable_by(|x, y| {
                    y.1.partial_cmp(&x.1)
                        .unwrap_or(Ordering::Equal)
                        .then(x.0.cmp(&y.0))
                });
                cands.truncate(n);
                Some(Picked::Top(cands))
            }
        })
    }
}
