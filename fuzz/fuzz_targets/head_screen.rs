//! The screened LM head (`bitnet_model::HeadScreen`) against the full logits, differentially.
//!
//! Byte 0 picks the head's type (F16, BF16 or F32) and how values are read: as raw bits
//! (every NaN, infinity, subnormal and huge value the type has) or as small multiples of
//! 1/16 (exact ties, rows that differ in one place). Byte 1 gives the rows (1–766), byte 2 the
//! columns (32–256), byte 3 the top-k of the fourth pick; the rest are the head's values,
//! then the hidden state's, repeated when the input runs out. The screen is built and asked
//! for greedy, top-1, top-5 and top-k; each answer it gives must be the full logits' own (the
//! arg-max with the lowest id among equal maxima; the k most likely with their logits' bits,
//! higher logit then lower id), and a screen must never answer where the full logits are not
//! all finite. A panic, a wrong pick or a hang is a finding.
#![no_main]

use std::borrow::Cow;
use std::sync::OnceLock;

use bitnet_kernels::{Pool, RowMatrix, RowType};
use bitnet_model::{Backend, HeadScreen, Numerics, Pick, Picked};
use libfuzzer_sys::fuzz_target;

fn pool() -> &'static Pool {
    static P: OnceLock<Pool> = OnceLock::new();
    P.get_or_init(|| Pool::new(1))
}

/// The input's bytes from `at` on, cycled (zeros for an empty input).
fn bytes(data: &[u8], at: usize, n: usize) -> Vec<u8> {
    if data.len() <= at {
        return vec![0; n];
    }
    data[at..].iter().copied().cycle().take(n).collect()
}

/// `n` values of `ty` as stored bytes: raw bits, or signed bytes / 16.
fn values(ty: RowType, raw: bool, src: &[u8], n: usize) -> Vec<u8> {
    let width = match ty {
        RowType::F32 => 4,
        _ => 2,
    };
    if raw {
        return src.iter().copied().cycle().take(n * width).collect();
    }
    let mut out = Vec::with_capacity(n * width);
    for &b in src.iter().cycle().take(n) {
        let v = f32::from(i8::from_le_bytes([b])) / 16.0;
        match ty {
            RowType::F32 => out.extend_from_slice(&v.to_le_bytes()),
            RowType::BF16 => out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            _ => out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let head_bytes = bytes(data, 0, 4);
    let ty = [RowType::F16, RowType::BF16, RowType::F32][usize::from(head_bytes[0] % 3)];
    let raw_head = head_bytes[0] & 0x10 != 0;
    let raw_h = head_bytes[0] & 0x20 != 0;
    // Up to 766 rows: the screen answers only when at most a quarter of them are candidates.
    let rows = 1 + 3 * usize::from(head_bytes[1]);
    let cols = 32 * (1 + usize::from(head_bytes[2] % 8));
    let k = 1 + usize::from(head_bytes[3] % 64);
    let src = bytes(data, 4, 4 * (rows + 1) * cols);
    let head_data = values(ty, raw_head, &src, rows * cols);
    // The hidden state's bytes follow the head's (one byte a value unless raw).
    let used = if raw_head {
        head_data.len()
    } else {
        rows * cols
    };
    let h_src = &src[used.min(src.len())..];
    let h: Vec<f32> = if raw_h {
        h_src
            .chunks_exact(4)
            .cycle()
            .take(cols)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    } else {
        h_src
            .iter()
            .cycle()
            .take(cols)
            .map(|&b| f32::from(i8::from_le_bytes([b])) / 8.0)
            .collect()
    };
    if h.len() != cols {
        return;
    }
    let Ok(head) = RowMatrix::new(ty, rows, cols, Cow::Borrowed(&head_data)) else {
        return;
    };
    // A head the screen cannot bound is refused with a typed error.
    let Ok(screen) = HeadScreen::build(&head, pool(), &|_| {}) else {
        return;
    };
    let mut full = vec![0f32; rows];
    if Backend::lm_head(pool(), &head, &h, 1, Numerics::Fast, &mut full).is_err() {
        return;
    }
    let finite = full.iter().all(|v| v.is_finite());
    for pick in [Pick::Greedy, Pick::Top(1), Pick::Top(5), Pick::Top(k)] {
        let Ok(answer) = screen.pick(&head, &h, pick, pool()) else {
            continue;
        };
        let Some(answer) = answer else {
            continue;
        };
        assert!(
            finite,
            "{ty:?} {rows}x{cols}: the screen answered {pick:?} over non-finite logits"
        );
        match (pick, answer) {
            (Pick::Greedy, Picked::Chosen(t)) => {
                let mut best = 0;
                for (i, &v) in full.iter().enumerate() {
                    if v > full[best] {
                        best = i;
                    }
                }
                assert_eq!(
                    usize::try_from(t).ok(),
                    Some(best),
                    "{ty:?} {rows}x{cols}: greedy"
                );
            }
            (Pick::Top(n), Picked::Top(got)) => {
                let mut all: Vec<(u32, f32)> = (0u32..).zip(full.iter().copied()).collect();
                // All finite: −0 and +0 are equal, as in the sampler's order.
                all.sort_by(|a, b| {
                    b.1.partial_cmp(&a.1)
                        .unwrap_or(std::cmp::Ordering::Equal)
                        .then(a.0.cmp(&b.0))
                });
                all.truncate(n);
                assert_eq!(got.len(), all.len(), "{ty:?} {rows}x{cols}: top {n}");
                for (g, w) in got.iter().zip(&all) {
                    assert_eq!(g.0, w.0, "{ty:?} {rows}x{cols}: top {n} ids");
                    assert_eq!(
                        g.1.to_bits(),
                        w.1.to_bits(),
                        "{ty:?} {rows}x{cols}: top {n} logits"
                    );
                }
            }
            (p, a) => panic!("{ty:?} {rows}x{cols}: {p:?} answered as {a:?}"),
        }
    }
});
