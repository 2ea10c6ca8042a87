//! The sliding context window (`ContextPolicy::Shift`, `Engine::shift`): after a shift the
//! model sees what a fresh evaluation of the kept tokens at their new positions sees.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use bitnet_engine::{ContextPolicy, EngineError, Event, GenParams};
use bitnet_model::{KvType, Numerics, Outputs};
use bitnet_sampling::SamplerParams;

fn engine(numerics: Numerics, kv_type: KvType) -> bitnet_engine::Engine {
    common::tiny_engine(numerics, kv_type)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The kept tokens' cached keys and values come from the full history (they attended to the
/// dropped tokens), so a shifted session is not a fresh evaluation of the kept tokens; the
/// rotation itself is checked position by position in the KV cache's unit tests. Here: the
/// session keeps the sinks and the newest half, and evaluation goes on at the new length.
#[test]
fn a_shift_keeps_the_sinks_and_the_newest_tokens() {
    let tokens: Vec<u32> = std::iter::once(4000)
        .chain((1..40).map(|i| (i * 577 + 11) % 4000))
        .collect();
    for kv in [KvType::F32, KvType::F16, KvType::Q8_0] {
        let e = engine(Numerics::Fast, kv);
        let mut s = e.new_session(48).unwrap();
        e.eval(&mut s, &tokens, Outputs::None).unwrap();
        e.shift(&mut s, 4).unwrap();
        // (40 - 4) / 2 = 18 positions dropped after the 4 sinks.
        let kept: Vec<u32> = tokens[..4].iter().chain(&tokens[22..]).copied().collect();
        assert_eq!(s.tokens(), &kept[..]);
        let shifted = e.eval(&mut s, &[123], Outputs::Last).unwrap();
        assert!(shifted.iter().all(|x| x.is_finite()));
        assert_eq!(s.tokens().len(), 23);
        let mut long = e.new_session(48).unwrap();
        e.eval(&mut long, &tokens, Outputs::None).unwrap();
        let unshifted = e.eval(&mut long, &[123], Outputs::Last).unwrap();
        assert!(max_abs_diff(&unshifted, &shifted) > 0.0);
    }
}

#[test]
fn generation_goes_on_past_the_window() {
    let e = engine(Numerics::Fast, KvType::F16);
    let prompt = e.tokenizer.encode("Once upon a time", true, false).unwrap();
    let mut s = e.new_session(32).unwrap();
    let mut n = 0usize;
    let params = GenParams {
        max_tokens: 120,
        sampler: SamplerParams {
            seed: 5,
            ..SamplerParams::default()
        },
        stop: Vec::new(),
        context_policy: ContextPolicy::Shift { keep: 4 },
        constraint: None,
    };
    let stats = e
        .generate(&mut s, &prompt, false, &params, &mut |ev| {
            if let Event::Token(_) = ev {
                n += 1;
            }
            true
        })
        .unwrap();
    assert_eq!(stats.generated_tokens, n);
    assert!(n > 40, "stopped after {n} tokens ({:?})", stats.finish);
    assert!(s.tokens().len() <= 32);
    assert_eq!(&s.tokens()[..4], &prompt[..4]);
    // Without the window the same generation stops at the end of the context.
    let mut s = e.new_session(32).unwrap();
    let stats = e
        .generate(
            &mut s,
            &prompt,
            false,
            &GenParams {
                context_policy: ContextPolicy::Stop,
                ..params
            },
            &mut |_| true,
        )
        .unwrap();
    assert!(stats.generated_tokens <= 32 - prompt.len() + 1);
}

#[test]
fn exact_numerics_refuses_to_shift() {
    let e = engine(Numerics::Exact, KvType::F16);
    let mut s = e.new_session(16).unwrap();
    e.eval(&mut s, &[4000, 1, 2, 3, 4, 5, 6, 7, 8, 9], Outputs::None)
        .unwrap();
    assert!(matches!(
        e.shift(&mut s, 4),
        Err(EngineError::ShiftNeedsFast)
    ));
    assert_eq!(s.tokens().len(), 10);
}
