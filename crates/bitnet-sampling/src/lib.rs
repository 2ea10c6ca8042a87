#![forbid(unsafe_code)]
//! Sampler chain over a vector of logits, with a seeded RNG.
//!
//! The chain follows the llama.cpp family's order and defaults:
//!
//! 1. repetition / presence / frequency penalties over the last `repeat_last_n`
//!    accepted tokens,
//! 2. top-k (the kept candidates then in the order "higher logit, then lower id", so the
//!    draw depends on the set alone: [`Sampler::sample_candidates`] draws the same token from
//!    a device's top candidates),
//! 3. top-p (nucleus, on the softmax at temperature 1),
//! 4. min-p (relative to the most likely token),
//! 5. temperature,
//! 6. a categorical draw from a `ChaCha8` RNG seeded with [`SamplerParams::seed`].
//!
//! A temperature `<= 0` selects greedy decoding: penalties still apply, then the
//! highest logit wins (lowest id on ties); the RNG is not used.
//!
//! # Hostile logits
//! * `NaN` logits are treated as `-inf` (never sampled).
//! * If any logit is `+inf` (after penalties), only the `+inf` tokens are candidates,
//!   each equally likely (greedy: the lowest such id).
//! * If every logit is `NaN` or `-inf`, [`Sampler::sample`] returns
//!   [`SamplingError::NoValidLogits`] rather than inventing a token.
//!
//! # Parameters
//! [`SamplerParams::validate`] rejects non-finite floats and out-of-range values with
//! [`SamplingError::InvalidParam`], naming the field. Values with a defined meaning
//! are accepted: `top_k <= 0` (off) or larger than the vocabulary (clamped),
//! `top_p` in `[0, 1]` (`0` keeps only the top token, `1` is off), `min_p` in `[0, 1]`
//! (`0` is off), any finite temperature (`<= 0` is greedy).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Errors from parameter validation and sampling.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// A sampling parameter is out of its accepted range.
    #[error("invalid sampling parameter `{field}`: {reason}")]
    InvalidParam {
        /// The name of the offending [`SamplerParams`] field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The logits slice is empty.
    #[error("logits are empty")]
    EmptyLogits,
    /// The logits slice has more entries than a `u32` token id can address.
    #[error("logits have {0} entries, more than a u32 token id can address")]
    TooManyLogits(usize),
    /// Every logit is NaN or -inf (after penalties): there is no token to choose.
    #[error("no valid logits: every value is NaN or -inf")]
    NoValidLogits,
}

/// Sampling parameters. See the crate docs for the chain order and the meaning of
/// edge values.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerParams {
    /// Softmax temperature; `<= 0` selects greedy decoding. Must be finite.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `<= 0` disables the stage.
    pub top_k: i32,
    /// Nucleus sampling mass in `[0, 1]`; `1` disables the stage.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the top token's, in `[0, 1]`;
    /// `0` disables the stage.
    pub min_p: f32,
    /// Repetition penalty (> 0, finite): a recent token's positive logit is divided by
    /// it, a negative one multiplied. `1` disables it.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every token seen in the window (finite).
    pub presence_penalty: f32,
    /// Subtracted `count` times from the logit of every token seen in the window (finite).
    pub frequency_penalty: f32,
    /// How many of the most recently accepted tokens the penalties look at; `0` disables
    /// all penalties.
    pub repeat_last_n: usize,
    /// Seed of the draw's RNG. The same seed, parameters, logits and accepted tokens
    /// give the same tokens. A caller wanting fresh randomness passes a random seed.
    pub seed: u64,
}

/// llama.cpp's `LLAMA_DEFAULT_SEED` value; here it is an ordinary, fixed seed.
pub const DEFAULT_SEED: u64 = 0xFFFF_FFFF;

impl Default for SamplerParams {
    /// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05,
    /// repeat penalty off (1.0) over the last 64 tokens, no presence/frequency penalty.
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            seed: DEFAULT_SEED,
        }
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> SamplingError {
    SamplingError::InvalidParam {
        field,
        reason: reason.into(),
    }
}

fn check_unit_interval(field: &'static str, v: f32) -> Result<(), SamplingError> {
    if v.is_nan() || !(0.0..=1.0).contains(&v) {
        return Err(invalid(field, format!("{v} is not in [0, 1]")));
    }
    Ok(())
}

impl SamplerParams {
    /// Greedy decoding: temperature 0, no penalties (other stages cannot change the
    /// arg-max and are left at their defaults).
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Whether these parameters select greedy decoding.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Checks every field; the error names the first offending field.
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !self.temperature.is_finite() {
            return Err(invalid(
                "temperature",
                format!("{} is not finite", self.temperature),
            ));
        }
        check_unit_interval("top_p", self.top_p)?;
        check_unit_interval("min_p", self.min_p)?;
        if !self.repeat_penalty.is_finite() || self.repeat_penalty <= 0.0 {
            return Err(invalid(
                "repeat_penalty",
                format!("{} is not a finite value > 0", self.repeat_penalty),
            ));
        }
        if !self.presence_penalty.is_finite() {
            return Err(invalid(
                "presence_penalty",
                format!("{} is not finite", self.presence_penalty),
            ));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(invalid(
                "frequency_penalty",
                format!("{} is not finite", self.frequency_penalty),
            ));
        }
        Ok(())
    }

    fn penalties_active(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

/// One candidate token: its id and current logit (never NaN once built).
#[derive(Debug, Clone, Copy)]
struct Cand {
    id: u32,
    logit: f32,
}

/// Total order "more likely first": higher logit, then lower id.
/// (`-0.0` and `0.0` tie, as in [`argmax`]; candidates are never NaN.)
fn more_likely_first(a: &Cand, b: &Cand) -> Ordering {
    b.logit
        .partial_cmp(&a.logit)
        .unwrap_or(Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

/// Index of the arg-max with the lowest id on ties, ignoring NaN and `-inf`.
///
/// Returns `None` when the slice is empty, every value is NaN or `-inf`, or the slice
/// is longer than a `u32` id can address.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    // Pass 1: the maximum, in 8 independent lanes so the loop vectorizes. `v > m` is
    // false for NaN, so NaN never becomes the maximum.
    const LANES: usize = 8;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = if v > *m { v } else { *m };
        }
    }
    let max = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    if max == f32::NEG_INFINITY {
        return None;
    }
    // Pass 2: the lowest id holding it.
    let i = logits.iter().position(|&v| v == max)?;
    u32::try_from(i).ok()
}

/// Largest number of tokens the window preallocates for, whatever `repeat_last_n` says
/// (the window still grows up to `repeat_last_n` as tokens are accepted).
const MAX_PREALLOC_WINDOW: usize = 4096;

/// A stateful sampler: parameters, the RNG, and the window of recent tokens used by
/// the penalties.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplerParams,
    rng: ChaCha8Rng,
    /// The last `params.repeat_last_n` accepted tokens, oldest first.
    recent: VecDeque<u32>,
    /// Scratch buffer reused between calls (one entry per vocabulary id at most).
    cands: Vec<Cand>,
}

impl Sampler {
    /// Validates `params` and builds a sampler seeded with `params.seed`.
    pub fn new(params: SamplerParams) -> Result<Self, SamplingError> {
        params.validate()?;
        let window = params.repeat_last_n.min(MAX_PREALLOC_WINDOW);
        Ok(Self {
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            recent: VecDeque::with_capacity(window),
            cands: Vec::new(),
            params,
        })
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Records a token that was emitted (or fed as prompt), for the penalties.
    pub fn accept(&mut self, token: u32) {
        let n = self.params.repeat_last_n;
        if n == 0 {
            return;
        }
        if self.recent.len() >= n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Forgets the accepted tokens and re-seeds the RNG, so the sampler behaves as
    /// freshly built.
    pub fn reset(&mut self) {
        self.recent.clear();
        self.rng = ChaCha8Rng::seed_from_u64(self.params.seed);
    }

    /// Chooses the next token from `logits` (one entry per vocabulary id).
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        if logits.is_empty() {
            return Err(SamplingError::EmptyLogits);
        }
        if u32::try_from(logits.len()).is_err() {
            return Err(SamplingError::TooManyLogits(logits.len()));
        }
        let mut cands = std::mem::take(&mut self.cands);
        let result = self.sample_into(logits, &mut cands);
        self.cands = cands;
        result
    }

    /// Like [`Sampler::sample`] (the same token, the same RNG use), and also the
    /// log-probabilities of the distribution the token was drawn from: the chosen
    /// token's and those of the `n_top` most likely tokens of that distribution.
    ///
    /// That distribution is the softmax, at the request's temperature, over the
    /// candidates left after the penalties, top-k, top-p and min-p; tokens those stages
    /// removed have probability 0 and are never listed. Greedy decoding (temperature
    /// `<= 0`) draws nothing; there the distribution is the softmax of the penalized
    /// logits at temperature 1 over the whole vocabulary, whose mode greedy picks.
    pub fn sample_with_logprobs(
        &mut self,
        logits: &[f32],
        n_top: usize,
    ) -> Result<Sampled, SamplingError> {
        if logits.is_empty() {
            return Err(SamplingError::EmptyLogits);
        }
        if u32::try_from(logits.len()).is_err() {
            return Err(SamplingError::TooManyLogits(logits.len()));
        }
        let mut cands = std::mem::take(&mut self.cands);
        let result = self.sample_with_logprobs_into(logits, n_top, &mut cands);
        self.cands = cands;
        result
    }

    fn sample_with_logprobs_into(
        &mut self,
        logits: &[f32],
        n_top: usize,
        cands: &mut Vec<Cand>,
    ) -> Result<Sampled, SamplingError> {
        let id = self.sample_into(logits, cands)?;
        if self.params.is_greedy() {
            // `sample_into` left no candidates behind: rebuild the penalized logits'
            // distribution over the whole vocabulary.
            let logits = self.penalized(logits);
            cands.clear();
            cands.extend(
                logits
                    .iter()
                    .zip(0u32..)
                    .filter(|(l, _)| !l.is_nan() && **l != f32::NEG_INFINITY)
                    .map(|(&logit, id)| Cand { id, logit }),
            );
            sanitize(cands);
            Ok(distribution(cands, id, 1.0, n_top))
        } else {
            Ok(distribution(
                cands,
                id,
                f64::from(self.params.temperature),
                n_top,
            ))
        }
    }

    fn sample_into(&mut self, logits: &[f32], cands: &mut Vec<Cand>) -> Result<u32, SamplingError> {
        let logits = self.penalized(logits);
        let logits = &logits[..];
        let p = &self.params;
        if p.is_greedy() {
            // `argmax` skips NaN/-inf and takes the lowest id among +inf, exactly what
            // `sanitize` + `best` would pick.
            return argmax(logits).ok_or(SamplingError::NoValidLogits);
        }
        let valid = logits
            .iter()
            .zip(0u32..)
            .filter(|(l, _)| !l.is_nan() && **l != f32::NEG_INFINITY)
            .map(|(&logit, id)| Cand { id, logit });
        cands.clear();
        match usize::try_from(p.top_k) {
            // top-k in one pass over the logits, without building the full list, then in
            // the total order "more likely first", so that the draw depends on the set
            // alone (the same as from a device's top candidates, `sample_candidates`).
            Ok(k) if k > 0 && k < logits.len() => {
                top_k_scan(valid, k, cands);
                cands.sort_unstable_by(more_likely_first);
            }
            _ => cands.extend(valid),
        }
        self.filter_and_draw(cands)
    }

    /// The stages after top-k: sanitize, top-p, min-p, temperature and the draw.
    fn filter_and_draw(&mut self, cands: &mut Vec<Cand>) -> Result<u32, SamplingError> {
        let p = &self.params;
        sanitize(cands);
        if cands.is_empty() {
            return Err(SamplingError::NoValidLogits);
        }
        top_p(cands, p.top_p);
        min_p(cands, p.min_p);
        self.draw(cands)
    }

    /// Whether the next token is the arg-max of the logits as they are (lowest id on ties):
    /// greedy decoding with no penalty that changes them (none set, or no history yet).
    pub fn argmax_suffices(&self) -> bool {
        self.params.is_greedy() && !self.penalties_apply()
    }

    /// Whether the penalties change the logits of the next step.
    fn penalties_apply(&self) -> bool {
        self.params.penalties_active() && !self.recent.is_empty()
    }

    /// Whether the `n` most likely tokens of a step are all [`Sampler::sample_candidates`]
    /// needs: top-k is on with `top_k <= n`, the temperature is positive, and no penalty
    /// applies (penalties change logits outside any fixed candidate set).
    pub fn candidates_suffice(&self, n: usize) -> bool {
        let p = &self.params;
        let top_k = usize::try_from(p.top_k).is_ok_and(|k| k > 0 && k <= n);
        !p.is_greedy() && top_k && !self.penalties_apply()
    }

    /// [`Sampler::sample`] from the most likely tokens only: `top` holds the `(id, logit)`
    /// pairs of the `searched` most likely tokens of the full logits (fewer when the
    /// vocabulary has fewer valid ones), e.g. a device's top-k read-back. It gives the same
    /// token and the same RNG use as `sample` over the full logits whenever
    /// [`Sampler::candidates_suffice`]`(searched)` holds, and is an error otherwise.
    /// `n_vocab` is the full vocabulary's size (top-k is off when it is at least that).
    pub fn sample_candidates(
        &mut self,
        top: &[(u32, f32)],
        searched: usize,
        n_vocab: usize,
    ) -> Result<u32, SamplingError> {
        if !self.candidates_suffice(searched) || top.len() > searched {
            return Err(invalid(
                "top_k",
                format!(
                    "the {searched} most likely tokens cannot stand for the full logits with \
                     these parameters"
                ),
            ));
        }
        let mut cands = std::mem::take(&mut self.cands);
        cands.clear();
        cands.extend(
            top.iter()
                .filter(|(_, l)| !l.is_nan() && *l != f32::NEG_INFINITY)
                .map(|&(id, logit)| Cand { id, logit }),
        );
        cands.sort_unstable_by(more_likely_first);
        cands.dedup_by_key(|c| c.id);
        if let Ok(k) = usize::try_from(self.params.top_k) {
            if k < n_vocab {
                cands.truncate(k);
            }
        }
        let result = if cands.is_empty() {
            Err(SamplingError::NoValidLogits)
        } else {
            self.filter_and_draw(&mut cands)
        };
        self.cands = cands;
        result
    }

    /// `logits` with the penalties applied (borrowed when none apply).
    fn penalized<'l>(&self, logits: &'l [f32]) -> std::borrow::Cow<'l, [f32]> {
        if self.penalties_apply() {
            let mut copy = logits.to_vec();
            self.apply_penalties(&mut copy);
            std::borrow::Cow::Owned(copy)
        } else {
            std::borrow::Cow::Borrowed(logits)
        }
    }

    /// Repetition, presence and frequency penalties over the recent-token window
    /// (llama.cpp `penalties` sampler). Ids outside the vocabulary are ignored.
    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        let mut counts: HashMap<u32, u32> = HashMap::with_capacity(self.recent.len());
        for &t in &self.recent {
            let c = counts.entry(t).or_insert(0);
            *c = c.saturating_add(1);
        }
        for (&id, &count) in &counts {
            let Some(slot) = usize::try_from(id).ok().and_then(|i| logits.get_mut(i)) else {
                continue;
            };
            let mut l = *slot;
            if p.repeat_penalty != 1.0 {
                l = if l <= 0.0 {
                    l * p.repeat_penalty
                } else {
                    l / p.repeat_penalty
                };
            }
            // Computed in f64 (count * penalty cannot overflow there) and rounded once;
            // a result beyond f32's range becomes +-inf, which `sanitize` handles.
            let freq = f64::from(count) * f64::from(p.frequency_penalty);
            let total = freq + f64::from(p.presence_penalty);
            #[allow(clippy::cast_possible_truncation)] // intended f64 -> f32 rounding
            let penalized = (f64::from(l) - total) as f32;
            *slot = penalized;
        }
    }

    /// Temperature, then a categorical draw over the remaining candidates.
    fn draw(&mut self, cands: &[Cand]) -> Result<u32, SamplingError> {
        let Some(top) = cands.iter().copied().min_by(more_likely_first) else {
            return Err(SamplingError::NoValidLogits);
        };
        let max = f64::from(top.logit);
        let inv_t = 1.0 / f64::from(self.params.temperature);
        // Weights relative to the top token (whose weight is exactly 1), in f64 so the
        // difference of two finite f32 values cannot overflow.
        let weight = |c: &Cand| ((f64::from(c.logit) - max) * inv_t).exp();
        let total: f64 = cands.iter().map(weight).sum();
        if !(total.is_finite() && total > 0.0) {
            return Ok(top.id);
        }
        let u = self.rng.random::<f64>() * total;
        let mut acc = 0.0;
        for c in cands {
            acc += weight(c);
            if u < acc {
                return Ok(c.id);
            }
        }
        // Rounding left `u` just past the last partial sum: take the last candidate
        // with a non-zero weight.
        Ok(cands
            .iter()
            .rev()
            .find(|c| weight(c) > 0.0)
            .map_or(top.id, |c| c.id))
    }
}

/// A sampled token with the log-probabilities of the distribution it was drawn from
/// (natural logarithms; see [`Sampler::sample_with_logprobs`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub id: u32,
    /// The chosen token's log-probability (`<= 0`).
    pub logprob: f32,
    /// The most likely tokens of the distribution, most likely first (higher
    /// probability, then lower id), at most the `n_top` asked for.
    pub top: Vec<(u32, f32)>,
}

/// Log-probabilities of `cands` at temperature `t` (> 0): the chosen token's and the
/// `n_top` largest. Computed in f64 relative to the top logit, as the draw weighs them.
fn distribution(cands: &mut [Cand], chosen: u32, t: f64, n_top: usize) -> Sampled {
    let max = cands
        .iter()
        .map(|c| f64::from(c.logit))
        .fold(f64::NEG_INFINITY, f64::max);
    let inv_t = 1.0 / t;
    let scaled = |c: &Cand| (f64::from(c.logit) - max) * inv_t;
    let log_z = cands.iter().map(|c| scaled(c).exp()).sum::<f64>().ln();
    // Rounded once to f32; never above 0 (a lone candidate is exactly 0).
    #[allow(clippy::cast_possible_truncation)]
    let lp = |c: &Cand| ((scaled(c) - log_z).min(0.0)) as f32;
    let logprob = cands
        .iter()
        .find(|c| c.id == chosen)
        .map_or(f32::NEG_INFINITY, lp);
    extend_sorted_prefix(cands, 0, n_top);
    let top = cands.iter().take(n_top).map(|c| (c.id, lp(c))).collect();
    Sampled {
        id: chosen,
        logprob,
        top,
    }
}

/// Drops NaN and `-inf` candidates; if any `+inf` remain, keeps only those, at logit 0
/// (equally likely).
fn sanitize(cands: &mut Vec<Cand>) {
    cands.retain(|c| !c.logit.is_nan() && c.logit != f32::NEG_INFINITY);
    if cands.iter().any(|c| c.logit == f32::INFINITY) {
        cands.retain(|c| c.logit == f32::INFINITY);
        for c in cands.iter_mut() {
            c.logit = 0.0;
        }
    }
}

/// Orders a min-heap so its top is the *least* likely kept candidate.
#[derive(Debug, Clone, Copy)]
struct LeastLikelyFirst(Cand);

impl PartialEq for LeastLikelyFirst {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for LeastLikelyFirst {}
impl PartialOrd for LeastLikelyFirst {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for LeastLikelyFirst {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap is a max-heap: "greatest" = least likely.
        more_likely_first(&self.0, &other.0)
    }
}

/// Collects the `k` most likely of `valid` (in the total order "higher logit, then
/// lower id") into `out`, in O(n log k) with a k-entry heap. Because the order is
/// total, this is the same set a full sort would keep; `+inf` logits, the most likely,
/// are kept lowest id first, as `sanitize` then expects.
fn top_k_scan(valid: impl Iterator<Item = Cand>, k: usize, out: &mut Vec<Cand>) {
    let mut heap: BinaryHeap<LeastLikelyFirst> = BinaryHeap::with_capacity(k);
    for c in valid {
        if heap.len() < k {
            heap.push(LeastLikelyFirst(c));
        } else if let Some(mut worst) = heap.peek_mut() {
            if more_likely_first(&c, &worst.0) == Ordering::Less {
                *worst = LeastLikelyFirst(c);
            }
        }
    }
    out.extend(heap.into_iter().map(|c| c.0));
}

/// Sorts `cands` so that its first `want` entries are the most likely, in order.
/// `sorted` entries at the front are already in place.
fn extend_sorted_prefix(cands: &mut [Cand], sorted: usize, want: usize) {
    let want = want.min(cands.len());
    if want <= sorted {
        return;
    }
    let rest = &mut cands[sorted..];
    let n = want - sorted;
    if n < rest.len() {
        rest.select_nth_unstable_by(n - 1, more_likely_first);
    }
    rest[..n].sort_unstable_by(more_likely_first);
}

/// Nucleus filter: keeps the shortest most-likely prefix whose probability mass
/// (softmax at temperature 1 over the current candidates) reaches `p`, at least one.
fn top_p(cands: &mut Vec<Cand>, p: f32) {
    if p >= 1.0 || cands.len() <= 1 {
        return;
    }
    let max = cands
        .iter()
        .map(|c| f64::from(c.logit))
        .fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = cands.iter().map(|c| (f64::from(c.logit) - max).exp()).sum();
    let target = f64::from(p) * z;
    // Sort only as much of the list as the nucleus needs, growing geometrically.
    let mut sorted = 0;
    let mut want = 64;
    let mut cum = 0.0;
    loop {
        extend_sorted_prefix(cands, sorted, want);
        let upto = want.min(cands.len());
        for (i, c) in cands[sorted..upto].iter().enumerate() {
            cum += (f64::from(c.logit) - max).exp();
            if cum >= target {
                cands.truncate(sorted + i + 1);
                return;
            }
        }
        sorted = upto;
        if sorted >= cands.len() {
            // Rounding kept the sum just below the target: keep everything.
            return;
        }
        want = want.saturating_mul(4);
    }
}

/// Keeps candidates whose probability is at least `p` times the top one's.
fn min_p(cands: &mut Vec<Cand>, p: f32) {
    if p <= 0.0 || cands.len() <= 1 {
        return;
    }
    let max = cands
        .iter()
        .map(|c| f64::from(c.logit))
        .fold(f64::NEG_INFINITY, f64::max);
    let threshold = max + f64::from(p).ln();
    cands.retain(|c| f64::from(c.logit) >= threshold);
}

// A sampler moves with its sequence between threads.
const _: () = {
    const fn movable<T: Send + Sync>() {}
    movable::<Sampler>();
};

#[cfg(test)]
mod tests;
