use super::*;
use proptest::prelude::*;
use rand::Rng;

/// Sampling-only parameters: every filter off, temperature 1.
fn plain(seed: u64) -> SamplerParams {
    SamplerParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        repeat_last_n: 64,
        seed,
    }
}

fn counts(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<usize> {
    let mut c = vec![0usize; logits.len()];
    for _ in 0..n {
        c[s.sample(logits).unwrap() as usize] += 1;
    }
    c
}

/// Asserts an empirical frequency is within 5 binomial standard deviations of `p`.
fn assert_freq(count: usize, n: usize, p: f64) {
    let mean = p * n as f64;
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    let got = count as f64;
    assert!(
        (got - mean).abs() <= 5.0 * sd + 1e-9,
        "count {count} of {n}, expected {mean:.1} +- {:.1}",
        5.0 * sd
    );
}

fn ln_probs(p: &[f32]) -> Vec<f32> {
    p.iter().map(|&x| x.ln()).collect()
}

#[test]
fn defaults_are_llama_cpp() {
    let p = SamplerParams::default();
    assert_eq!(p.temperature, 0.8);
    assert_eq!(p.top_k, 40);
    assert_eq!(p.top_p, 0.95);
    assert_eq!(p.min_p, 0.05);
    assert_eq!(p.repeat_penalty, 1.0);
    assert_eq!(p.repeat_last_n, 64);
    assert_eq!(p.presence_penalty, 0.0);
    assert_eq!(p.frequency_penalty, 0.0);
    assert!(p.validate().is_ok());
    assert!(SamplerParams::greedy().is_greedy());
    assert!(SamplerParams::greedy().validate().is_ok());
}

#[test]
fn argmax_lowest_id_on_ties_and_ignores_nan() {
    assert_eq!(argmax(&[]), None);
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), Some(1));
    assert_eq!(argmax(&[f32::NAN, -5.0, f32::NAN]), Some(1));
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), None);
    assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), None);
    assert_eq!(argmax(&[0.0, f32::INFINITY, f32::INFINITY]), Some(1));
    assert_eq!(argmax(&[-0.0, 0.0]), Some(0));
}

#[test]
fn validate_names_the_field() {
    let field_of = |p: SamplerParams| match p.validate() {
        Err(SamplingError::InvalidParam { field, .. }) => field,
        other => panic!("expected InvalidParam, got {other:?}"),
    };
    let d = SamplerParams::default;
    for t in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        assert_eq!(
            field_of(SamplerParams {
                temperature: t,
                ..d()
            }),
            "temperature"
        );
    }
    for v in [f32::NAN, -0.1, 1.5, f32::INFINITY] {
        assert_eq!(field_of(SamplerParams { top_p: v, ..d() }), "top_p");
        assert_eq!(field_of(SamplerParams { min_p: v, ..d() }), "min_p");
    }
    for v in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert_eq!(
            field_of(SamplerParams {
                repeat_penalty: v,
                ..d()
            }),
            "repeat_penalty"
        );
    }
    for v in [f32::NAN, f32::INFINITY] {
        assert_eq!(
            field_of(SamplerParams {
                presence_penalty: v,
                ..d()
            }),
            "presence_penalty"
        );
        assert_eq!(
            field_of(SamplerParams {
                frequency_penalty: v,
                ..d()
            }),
            "frequency_penalty"
        );
    }
    assert!(Sampler::new(SamplerParams { top_p: 2.0, ..d() }).is_err());
    // Edge values with a defined meaning are accepted.
    for p in [
        SamplerParams {
            temperature: -1.0,
            ..d()
        },
        SamplerParams { top_k: -7, ..d() },
        SamplerParams {
            top_k: i32::MAX,
            ..d()
        },
        SamplerParams { top_p: 0.0, ..d() },
        SamplerParams { min_p: 1.0, ..d() },
        SamplerParams {
            presence_penalty: -2.0,
            ..d()
        },
        SamplerParams {
            repeat_last_n: usize::MAX,
            ..d()
        },
    ] {
        assert!(Sampler::new(p).is_ok());
    }
}

#[test]
fn greedy_and_negative_temperature_pick_argmax() {
    let logits = [0.5, 2.0, -1.0, 2.0, 1.9];
    for t in [0.0, -0.5] {
        let mut s = Sampler::new(SamplerParams {
            temperature: t,
            ..SamplerParams::default()
        })
        .unwrap();
        for _ in 0..5 {
            assert_eq!(s.sample(&logits).unwrap(), 1);
        }
    }
}

#[test]
fn top_k_one_equals_greedy() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut g = Sampler::new(SamplerParams::greedy()).unwrap();
    for seed in 0..50 {
        let logits: Vec<f32> = (0..500).map(|_| rng.random_range(-10.0f32..10.0)).collect();
        let mut s = Sampler::new(SamplerParams {
            top_k: 1,
            seed,
            ..SamplerParams::default()
        })
        .unwrap();
        assert_eq!(s.sample(&logits).unwrap(), g.sample(&logits).unwrap());
        assert_eq!(Some(g.sample(&logits).unwrap()), argmax(&logits));
    }
}

#[test]
fn same_seed_same_tokens_and_reset_replays() {
    let logits: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32) * 0.05).collect();
    let run = |seed| {
        let mut s = Sampler::new(SamplerParams {
            seed,
            ..SamplerParams::default()
        })
        .unwrap();
        (0..64)
            .map(|_| s.sample(&logits).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    let mut s = Sampler::new(SamplerParams {
        seed: 42,
        ..SamplerParams::default()
    })
    .unwrap();
    let a: Vec<u32> = (0..64).map(|_| s.sample(&logits).unwrap()).collect();
    s.reset();
    let b: Vec<u32> = (0..64).map(|_| s.sample(&logits).unwrap()).collect();
    assert_eq!(a, b);
    assert_eq!(a, run(42));
}

#[test]
fn draw_follows_the_softmax() {
    let probs = [0.5f32, 0.3, 0.15, 0.05];
    let logits = ln_probs(&probs);
    let n = 40_000;
    let mut s = Sampler::new(plain(1)).unwrap();
    let c = counts(&mut s, &logits, n);
    for (i, &p) in probs.iter().enumerate() {
        assert_freq(c[i], n, f64::from(p));
    }
    // Adding a constant to every logit changes nothing in distribution.
    let shifted: Vec<f32> = logits.iter().map(|l| l + 1000.0).collect();
    let mut s = Sampler::new(plain(2)).unwrap();
    let c = counts(&mut s, &shifted, n);
    for (i, &p) in probs.iter().enumerate() {
        assert_freq(c[i], n, f64::from(p));
    }
}

#[test]
fn temperature_scales_logits() {
    // Logits 0, 1, 2 at temperature 2 -> softmax(0, 0.5, 1).
    let logits = [0.0f32, 1.0, 2.0];
    let e: Vec<f64> = [0.0f64, 0.5, 1.0].iter().map(|x| x.exp()).collect();
    let z: f64 = e.iter().sum();
    let n = 40_000;
    let mut s = Sampler::new(SamplerParams {
        temperature: 2.0,
        ..plain(3)
    })
    .unwrap();
    let c = counts(&mut s, &logits, n);
    for i in 0..3 {
        assert_freq(c[i], n, e[i] / z);
    }
    // A tiny temperature is effectively greedy.
    let mut s = Sampler::new(SamplerParams {
        temperature: 1e-3,
        ..plain(3)
    })
    .unwrap();
    assert_eq!(counts(&mut s, &logits, 1000), vec![0, 0, 1000]);
}

#[test]
fn top_k_restricts_and_renormalizes() {
    let probs = [0.1f32, 0.4, 0.2, 0.3];
    let logits = ln_probs(&probs);
    let n = 30_000;
    let mut s = Sampler::new(SamplerParams {
        top_k: 2,
        ..plain(4)
    })
    .unwrap();
    let c = counts(&mut s, &logits, n);
    assert_eq!(c[0] + c[2], 0);
    assert_freq(c[1], n, 0.4 / 0.7);
    assert_freq(c[3], n, 0.3 / 0.7);
}

#[test]
fn top_p_keeps_the_nucleus() {
    let probs = [0.05f32, 0.5, 0.15, 0.3];
    let logits = ln_probs(&probs);
    let n = 30_000;
    // 0.5 < 0.75 <= 0.5 + 0.3: the nucleus is {1, 3}.
    let mut s = Sampler::new(SamplerParams {
        top_p: 0.75,
        ..plain(5)
    })
    .unwrap();
    let c = counts(&mut s, &logits, n);
    assert_eq!(c[0] + c[2], 0);
    assert_freq(c[1], n, 0.5 / 0.8);
    // top_p = 0 keeps only the top token.
    let mut s = Sampler::new(SamplerParams {
        top_p: 0.0,
        ..plain(5)
    })
    .unwrap();
    assert_eq!(counts(&mut s, &logits, 500)[1], 500);
    // 0.5 + 0.3 + 0.15 = 0.95 < 0.97: every token stays in the nucleus.
    let mut s = Sampler::new(SamplerParams {
        top_p: 0.97,
        ..plain(5)
    })
    .unwrap();
    let c = counts(&mut s, &logits, n);
    assert!(c.iter().all(|&x| x > 0), "{c:?}");
}

#[test]
fn top_p_over_a_large_vocab_matches_a_full_sort() {
    // Many near-equal logits force the nucleus past the first sorted chunks.
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let logits: Vec<f32> = (0..20_000).map(|_| rng.random_range(0.0f32..0.5)).collect();
    let p = 0.9f32;
    // Independent nucleus: full sort, then prefix.
    let mut order: Vec<u32> = (0..20_000).collect();
    let at = |i: u32| logits[i as usize];
    order.sort_by(|&a, &b| at(b).total_cmp(&at(a)).then(a.cmp(&b)));
    let max = f64::from(at(order[0]));
    let w: Vec<f64> = logits.iter().map(|&l| (f64::from(l) - max).exp()).collect();
    let z: f64 = w.iter().sum();
    let mut cum = 0.0;
    let mut nucleus = std::collections::HashSet::new();
    for &i in &order {
        cum += w[i as usize] / z;
        nucleus.insert(i);
        if cum >= f64::from(p) {
            break;
        }
    }
    assert!(nucleus.len() > 1000);
    let mut cands: Vec<Cand> = logits
        .iter()
        .zip(0u32..)
        .map(|(&logit, id)| Cand { id, logit })
        .collect();
    top_p(&mut cands, p);
    let got: std::collections::HashSet<u32> = cands.iter().map(|c| c.id).collect();
    // The two sums add in a different order, which can move the cut by one token.
    let diff = got.symmetric_difference(&nucleus).count();
    assert!(diff <= 1, "nucleus differs by {diff} tokens");
}

#[test]
fn min_p_drops_unlikely_tokens() {
    let probs = [0.5f32, 0.3, 0.02, 0.18];
    let logits = ln_probs(&probs);
    // Threshold 0.05 * 0.5 = 0.025 drops only token 2.
    let n = 20_000;
    let mut s = Sampler::new(SamplerParams {
        min_p: 0.05,
        ..plain(6)
    })
    .unwrap();
    let c = counts(&mut s, &logits, n);
    assert_eq!(c[2], 0);
    assert!(c[0] > 0 && c[1] > 0 && c[3] > 0);
    assert_freq(c[3], n, 0.18 / 0.98);
    // min_p = 1 keeps only the top token.
    let mut s = Sampler::new(SamplerParams {
        min_p: 1.0,
        ..plain(6)
    })
    .unwrap();
    assert_eq!(counts(&mut s, &logits, 500)[0], 500);
}

fn greedy_with(repeat: f32, presence: f32, frequency: f32, last_n: usize) -> Sampler {
    Sampler::new(SamplerParams {
        repeat_penalty: repeat,
        presence_penalty: presence,
        frequency_penalty: frequency,
        repeat_last_n: last_n,
        ..SamplerParams::greedy()
    })
    .unwrap()
}

#[test]
fn repeat_penalty_divides_positive_and_multiplies_negative() {
    let mut s = greedy_with(2.0, 0.0, 0.0, 64);
    assert_eq!(s.sample(&[2.0, 1.5]).unwrap(), 0);
    s.accept(0);
    // 2.0 / 2 = 1.0 < 1.5
    assert_eq!(s.sample(&[2.0, 1.5]).unwrap(), 1);
    // -1.0 * 2 = -2.0 < -1.5
    assert_eq!(s.sample(&[-1.0, -1.5]).unwrap(), 1);
    // 3.2 / 2 = 1.6 > 1.5: still wins.
    assert_eq!(s.sample(&[3.2, 1.5]).unwrap(), 0);
}

#[test]
fn presence_and_frequency_penalties() {
    let mut s = greedy_with(1.0, 0.6, 0.0, 64);
    s.accept(0);
    assert_eq!(s.sample(&[1.0, 0.5]).unwrap(), 1); // 1.0 - 0.6 = 0.4
    let mut s = greedy_with(1.0, 0.0, 0.3, 64);
    s.accept(0);
    assert_eq!(s.sample(&[1.0, 0.5]).unwrap(), 0); // 1.0 - 0.3 = 0.7
    s.accept(0);
    assert_eq!(s.sample(&[1.0, 0.5]).unwrap(), 1); // 1.0 - 0.6 = 0.4
}

#[test]
fn penalty_window_and_out_of_range_history() {
    let mut s = greedy_with(1.0, 1.0, 0.0, 4);
    s.accept(0);
    assert_eq!(s.sample(&[1.0, 0.5]).unwrap(), 1);
    for _ in 0..4 {
        s.accept(7); // pushes token 0 out of the 4-token window; 7 is out of range here
    }
    assert_eq!(s.sample(&[1.0, 0.5]).unwrap(), 0);
    s.accept(u32::MAX);
    assert_eq!(s.sample(&[1.0, 0.5]).unwrap(), 0);
    // repeat_last_n = 0 disables penalties.
    let mut s = greedy_with(1.0, 1.0, 0.0, 0);
    s.accept(0);
    assert_eq!(s.sample(&[1.0, 0.5]).unwrap(), 0);
    // reset clears the window.
    let mut s = greedy_with(1.0, 1.0, 0.0, 8);
    s.accept(0);
    s.reset();
    assert_eq!(s.sample(&[1.0, 0.5]).unwrap(), 0);
}

#[test]
fn nan_and_inf_logits() {
    for params in [SamplerParams::greedy(), SamplerParams::default(), plain(9)] {
        let mut s = Sampler::new(params).unwrap();
        assert_eq!(s.sample(&[f32::NAN, 1.0, f32::NAN]).unwrap(), 1);
        assert_eq!(s.sample(&[]), Err(SamplingError::EmptyLogits));
        assert_eq!(
            s.sample(&[f32::NAN, f32::NEG_INFINITY]),
            Err(SamplingError::NoValidLogits)
        );
        assert_eq!(
            s.sample(&[f32::NEG_INFINITY; 5]),
            Err(SamplingError::NoValidLogits)
        );
        for _ in 0..50 {
            let t = s
                .sample(&[1.0, f32::INFINITY, 3.0, f32::INFINITY, f32::NAN])
                .unwrap();
            assert!(t == 1 || t == 3);
        }
    }
    let mut g = Sampler::new(SamplerParams::greedy()).unwrap();
    assert_eq!(
        g.sample(&[1.0, f32::INFINITY, 3.0, f32::INFINITY]).unwrap(),
        1
    );
    // Both +inf tokens are drawn.
    let mut s = Sampler::new(plain(10)).unwrap();
    let c = counts(&mut s, &[1.0, f32::INFINITY, 3.0, f32::INFINITY], 2000);
    assert_eq!(c[0] + c[2], 0);
    assert_freq(c[1], 2000, 0.5);
}

#[test]
fn extreme_penalties_do_not_panic() {
    let mut s = greedy_with(f32::MAX, f32::MAX, f32::MAX, 8);
    s.accept(0);
    s.accept(0);
    // Token 0's logit is pushed to -inf; token 1 remains.
    assert_eq!(s.sample(&[1.0, 0.5]).unwrap(), 1);
    assert_eq!(s.sample(&[1.0]), Err(SamplingError::NoValidLogits));
    let mut s = greedy_with(f32::MIN_POSITIVE, -f32::MAX, -f32::MAX, 8);
    s.accept(1);
    assert_eq!(s.sample(&[1.0, 0.5]).unwrap(), 1);
}

fn special_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -100.0f32..100.0,
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(f32::MAX),
        1 => Just(f32::MIN),
        1 => Just(0.0f32),
        1 => any::<f32>(),
    ]
}

fn any_params() -> impl Strategy<Value = SamplerParams> {
    (
        special_f32(),
        any::<i32>(),
        prop_oneof![0.0f32..=1.0, special_f32()],
        prop_oneof![0.0f32..=1.0, special_f32()],
        prop_oneof![0.5f32..2.0, special_f32()],
        special_f32(),
        special_f32(),
        0usize..100,
        any::<u64>(),
    )
        .prop_map(
            |(
                temperature,
                top_k,
                top_p,
                min_p,
                repeat_penalty,
                presence_penalty,
                frequency_penalty,
                repeat_last_n,
                seed,
            )| {
                SamplerParams {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    repeat_penalty,
                    presence_penalty,
                    frequency_penalty,
                    repeat_last_n,
                    seed,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn argmax_matches_a_naive_scan(logits in prop::collection::vec(special_f32(), 0..100)) {
        let mut want: Option<(u32, f32)> = None;
        for (&l, i) in logits.iter().zip(0u32..) {
            if l.is_nan() || l == f32::NEG_INFINITY {
                continue;
            }
            if want.is_none_or(|(_, b)| l > b) {
                want = Some((i, l));
            }
        }
        prop_assert_eq!(argmax(&logits), want.map(|(i, _)| i));
    }

    #[test]
    fn top_k_scan_matches_a_full_sort(
        // Few distinct values, so ties are common.
        logits in prop::collection::vec(prop_oneof![
            4 => (-3i8..3).prop_map(f32::from),
            1 => Just(f32::INFINITY),
            1 => Just(f32::NAN),
            1 => Just(f32::NEG_INFINITY),
        ], 1..200),
        k in 1usize..50,
    ) {
        let valid = || logits.iter().zip(0u32..)
            .filter(|(l, _)| !l.is_nan() && **l != f32::NEG_INFINITY)
            .map(|(&logit, id)| Cand { id, logit });
        let mut got = Vec::new();
        top_k_scan(valid(), k, &mut got);
        let mut got: Vec<u32> = got.iter().map(|c| c.id).collect();
        got.sort_unstable();
        // Independent: stable sort by logit descending keeps lower ids first on ties.
        let mut all: Vec<(u32, f32)> = valid().map(|c| (c.id, c.logit)).collect();
        all.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
        let mut want: Vec<u32> = all.iter().take(k).map(|c| c.0).collect();
        want.sort_unstable();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn never_panics(
        params in any_params(),
        logits in prop::collection::vec(special_f32(), 0..300),
        history in prop::collection::vec(0u32..400, 0..20),
    ) {
        let Ok(mut s) = Sampler::new(params) else { return Ok(()) };
        for &t in &history {
            s.accept(t);
        }
        for _ in 0..3 {
            match s.sample(&logits) {
                Ok(t) => {
                    prop_assert!((t as usize) < logits.len());
                    let l = logits[t as usize];
                    prop_assert!(!l.is_nan());
                }
                Err(SamplingError::EmptyLogits) => prop_assert!(logits.is_empty()),
                Err(SamplingError::NoValidLogits) => {}
                Err(e) => prop_assert!(false, "unexpected error {e:?}"),
            }
        }
    }

    #[test]
    fn without_penalties_valid_logits_always_give_a_token(
        params in any_params(),
        logits in prop::collection::vec(special_f32(), 1..300),
    ) {
        let params = SamplerParams { repeat_last_n: 0, ..params };
        let Ok(mut s) = Sampler::new(params) else { return Ok(()) };
        let any_valid = logits.iter().any(|l| !l.is_nan() && *l != f32::NEG_INFINITY);
        let r = s.sample(&logits);
        prop_assert_eq!(r.is_ok(), any_valid);
        if let Ok(t) = r {
            let l = logits[t as usize];
            prop_assert!(!l.is_nan() && l != f32::NEG_INFINITY);
            if s.params().is_greedy() {
                prop_assert_eq!(Some(t), argmax(&logits));
            }
        }
    }
}

/// Timing of one draw over a LLaMA-3-sized vocabulary (run with `--ignored --nocapture`).
#[test]
#[ignore = "timing, not a check"]
fn time_sample_128k() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let logits: Vec<f32> = (0..128_256)
        .map(|_| rng.random_range(-15.0f32..15.0))
        .collect();
    for (name, params) in [
        ("default", SamplerParams::default()),
        ("greedy", SamplerParams::greedy()),
        (
            "top_k off, top_p 0.95",
            SamplerParams {
                top_k: 0,
                ..SamplerParams::default()
            },
        ),
        (
            "penalties 1.1/64",
            SamplerParams {
                repeat_penalty: 1.1,
                ..SamplerParams::default()
            },
        ),
    ] {
        let mut s = Sampler::new(params).unwrap();
        for t in 0..64 {
            s.accept(t * 3);
        }
        let n = 200;
        let t0 = std::time::Instant::now();
        for _ in 0..n {
            std::hint::black_box(s.sample(&logits).unwrap());
        }
        println!("{name}: {:?} per sample", t0.elapsed() / n);
    }
}

/// log-softmax of `logits / t` in f64, written out directly.
fn log_softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let max = logits
        .iter()
        .map(|&l| f64::from(l))
        .fold(f64::MIN, f64::max);
    let z: f64 = logits
        .iter()
        .map(|&l| ((f64::from(l) - max) / t).exp())
        .sum();
    logits
        .iter()
        .map(|&l| (f64::from(l) - max) / t - z.ln())
        .collect()
}

fn random_logits(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-8.0f32..8.0)).collect()
}

#[test]
fn logprobs_do_not_change_the_tokens() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for (i, params) in [
        SamplerParams::default(),
        SamplerParams::greedy(),
        SamplerParams {
            repeat_penalty: 1.3,
            presence_penalty: 0.5,
            ..SamplerParams::default()
        },
        SamplerParams {
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            temperature: 1.7,
            ..SamplerParams::default()
        },
    ]
    .into_iter()
    .enumerate()
    {
        let params = SamplerParams {
            seed: 100 + i as u64,
            ..params
        };
        let mut a = Sampler::new(params.clone()).unwrap();
        let mut b = Sampler::new(params).unwrap();
        for step in 0..60 {
            let logits = random_logits(&mut rng, 300 + step);
            let x = a.sample(&logits).unwrap();
            let y = b.sample_with_logprobs(&logits, 5).unwrap();
            assert_eq!(x, y.id, "params {i}, step {step}");
            a.accept(x);
            b.accept(x);
        }
    }
}

#[test]
fn logprobs_are_the_tempered_softmax_when_no_filter_applies() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let t = 0.7;
    let mut s = Sampler::new(SamplerParams {
        temperature: 0.7,
        ..plain(3)
    })
    .unwrap();
    for _ in 0..20 {
        let logits = random_logits(&mut rng, 1000);
        let want = log_softmax(&logits, t);
        let got = s.sample_with_logprobs(&logits, 20).unwrap();
        let id = got.id as usize;
        assert!((f64::from(got.logprob) - want[id]).abs() < 1e-5);
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| want[b].total_cmp(&want[a]).then(a.cmp(&b)));
        assert_eq!(got.top.len(), 20);
        for (&(tid, lp), &wid) in got.top.iter().zip(&order) {
            assert_eq!(tid as usize, wid);
            assert!((f64::from(lp) - want[wid]).abs() < 1e-5);
        }
    }
}

#[test]
fn logprobs_of_a_filtered_distribution_cover_only_what_is_kept() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let mut s = Sampler::new(SamplerParams {
        temperature: 1.3,
        top_k: 3,
        ..plain(4)
    })
    .unwrap();
    for _ in 0..20 {
        let logits = random_logits(&mut rng, 500);
        let got = s.sample_with_logprobs(&logits, 10).unwrap();
        // Only the 3 kept candidates, and they carry the whole mass.
        assert_eq!(got.top.len(), 3);
        let mass: f64 = got.top.iter().map(|&(_, lp)| f64::from(lp).exp()).sum();
        assert!((mass - 1.0).abs() < 1e-5, "{mass}");
        let mut best: Vec<usize> = (0..logits.len()).collect();
        best.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let kept: Vec<f32> = best[..3].iter().map(|&i| logits[i]).collect();
        let want = log_softmax(&kept, 1.3);
        for (k, &(tid, lp)) in got.top.iter().enumerate() {
            assert_eq!(tid as usize, best[k]);
            assert!((f64::from(lp) - want[k]).abs() < 1e-5);
        }
        assert!(got
            .top
            .iter()
            .any(|&(t, lp)| t == got.id && lp == got.logprob));
    }
}

#[test]
fn greedy_logprobs_are_the_full_softmax() {
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let mut s = Sampler::new(SamplerParams::greedy()).unwrap();
    let mut logits = random_logits(&mut rng, 400);
    logits[17] = f32::NAN;
    logits[18] = f32::NEG_INFINITY;
    let got = s.sample_with_logprobs(&logits, 3).unwrap();
    let finite: Vec<f32> = logits
        .iter()
        .map(|&l| if l.is_finite() { l } else { f32::NEG_INFINITY })
        .collect();
    let want = log_softmax(&finite, 1.0);
    assert_eq!(Some(got.id), argmax(&logits));
    assert_eq!(got.top[0].0, got.id);
    assert!((f64::from(got.logprob) - want[got.id as usize]).abs() < 1e-5);
    assert_eq!(got.top.len(), 3);
    // One token left: it is certain.
    let mut one = vec![f32::NEG_INFINITY; 10];
    one[4] = -3.0;
    let got = s.sample_with_logprobs(&one, 5).unwrap();
    assert_eq!((got.id, got.logprob, got.top.len()), (4, 0.0, 1));
}

#[test]
fn the_top_candidates_draw_what_the_full_logits_draw() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    for case in 0..200usize {
        let n = 300 + (case % 7) * 50;
        let mut logits: Vec<f32> = (0..n).map(|_| rng.random_range(-4.0..4.0f32)).collect();
        // Ties, NaN and -inf among the top.
        logits[3] = logits[7];
        if case % 5 == 0 {
            logits[11] = f32::NAN;
            logits[12] = f32::NEG_INFINITY;
        }
        let params = SamplerParams {
            temperature: [0.3f32, 0.8, 1.5][case % 3],
            top_k: [1, 5, 40, 64][case % 4],
            top_p: [1.0f32, 0.95, 0.5][case % 3],
            min_p: [0.0f32, 0.05][case % 2],
            seed: u64::try_from(case).unwrap(),
            ..SamplerParams::default()
        };
        let mut full = Sampler::new(params.clone()).unwrap();
        let mut top = Sampler::new(params).unwrap();
        assert!(top.candidates_suffice(64));
        // The 64 most likely, in an order of their own (a device returns them as it likes).
        let mut ids: Vec<usize> = (0..n).filter(|&i| !logits[i].is_nan()).collect();
        ids.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let mut cands: Vec<(u32, f32)> = ids[..64]
            .iter()
            .map(|&i| (u32::try_from(i).unwrap(), logits[i]))
            .collect();
        cands.reverse();
        for step in 0..5 {
            let a = full.sample(&logits).unwrap();
            let b = top.sample_candidates(&cands, 64, n).unwrap();
            assert_eq!(a, b, "case {case} step {step}");
        }
    }
    // Penalties with history, greedy, or top-k beyond the candidates: not enough.
    let mut s = Sampler::new(SamplerParams {
        repeat_penalty: 1.1,
        ..SamplerParams::default()
    })
    .unwrap();
    assert!(s.candidates_suffice(64));
    s.accept(3);
    assert!(!s.candidates_suffice(64));
    assert!(!Sampler::new(SamplerParams::greedy())
        .unwrap()
        .candidates_suffice(64));
    let wide = Sampler::new(SamplerParams {
        top_k: 100,
        ..SamplerParams::default()
    })
    .unwrap();
    assert!(!wide.candidates_suffice(64));
    let mut wide = wide;
    assert!(wide.sample_candidates(&[(1, 0.5)], 64, 1000).is_err());
    // The arg-max alone decides greedy steps, unless a penalty has history to act on.
    let mut g = Sampler::new(SamplerParams {
        repeat_penalty: 1.1,
        ..SamplerParams::greedy()
    })
    .unwrap();
    assert!(g.argmax_suffices());
    g.accept(3);
    assert!(!g.argmax_suffices());
    assert!(!s.argmax_suffices());
}
