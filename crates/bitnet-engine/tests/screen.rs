//! `LoadOptions::screen_head` through the loading call: generation chooses the same tokens
//! with the screened LM head as without it (greedy, top-k sampling, and the settings the
//! screen cannot serve), on the golden model and on wider synthetic ones, one session at a
//! time and batched (a server's steps); the combinations it cannot serve are refused before
//! the file is opened.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use bitnet_engine::budget::{BudgetRequest, StreamMode};
use bitnet_engine::{
    load, Device, Engine, EngineError, Event, GenParams, LmHeadFormat, LoadEvent, LoadOptions,
    Pick, Picked, Session,
};
use bitnet_model::{Numerics, Outputs};
use bitnet_sampling::SamplerParams;
use bitnet_testkit::{synth, Preset, SynthArch, SynthSpec};

fn tiny() -> PathBuf {
    bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf")
}

fn engine(path: &Path, screen_head: bool) -> Engine {
    let mut reported = None;
    let e = load(
        path,
        &LoadOptions {
            threads: 2,
            screen_head,
            ..LoadOptions::default()
        },
        &mut |ev| {
            if let LoadEvent::HeadScreen {
                bytes, head_bytes, ..
            } = ev
            {
                reported = Some((bytes, head_bytes));
            }
        },
    )
    .unwrap();
    assert_eq!(
        reported.is_some(),
        screen_head,
        "the screen's build is reported"
    );
    if let Some((bytes, head)) = reported {
        // Q8_0 (34 bytes a 32) and two bounds a row beside an F16 head (64 bytes a 32).
        assert!(bytes < head * 6 / 10, "{bytes} of {head}");
    }
    assert_eq!(e.screened(), screen_head);
    e
}

/// The tokens of `n` generated after `prompt` with `sampler`.
fn tokens(e: &Engine, prompt: &[u32], sampler: &SamplerParams, n: usize) -> Vec<u32> {
    let mut s = e.new_session(256).unwrap();
    let params = GenParams {
        max_tokens: n,
        sampler: sampler.clone(),
        ..GenParams::default()
    };
    let mut out = Vec::new();
    e.generate(&mut s, prompt, false, &params, &mut |ev| {
        if let Event::Token(t) = ev {
            out.push(t);
        }
        true
    })
    .unwrap();
    out
}

fn samplers() -> Vec<SamplerParams> {
    let greedy = SamplerParams {
        temperature: 0.0,
        ..SamplerParams::default()
    };
    let mut all = vec![greedy.clone()];
    for (seed, top_k) in [(1, 40), (2, 40), (3, 1), (4, 64), (5, 7)] {
        all.push(SamplerParams {
            temperature: 0.9,
            top_k,
            seed,
            ..SamplerParams::default()
        });
    }
    // What the screen does not serve: no top-k, a top-k above 64, a penalty.
    all.push(SamplerParams {
        temperature: 0.9,
        top_k: 0,
        seed: 6,
        ..SamplerParams::default()
    });
    all.push(SamplerParams {
        temperature: 0.9,
        top_k: 100,
        seed: 7,
        ..SamplerParams::default()
    });
    all.push(SamplerParams {
        repeat_penalty: 1.3,
        ..greedy
    });
    all
}

/// A synthetic model of `spec` with the tiny vocabulary at `path`.
fn write_synth(spec: &SynthSpec, path: &Path) {
    let vocab = synth::vocab_from_gguf_bytes(bitnet_testkit::TINY_VOCAB_GGUF).unwrap();
    let f = std::fs::File::create(path).unwrap();
    synth::write(spec, &vocab, std::io::BufWriter::new(f), &mut |_, _| {}).unwrap();
}

fn same_tokens(path: &Path, prompts: &[Vec<u32>], n: usize) {
    let (plain, screened) = (engine(path, false), engine(path, true));
    for prompt in prompts {
        for sampler in samplers() {
            let want = tokens(&plain, prompt, &sampler, n);
            assert_eq!(want.len(), n, "{sampler:?}");
            assert_eq!(tokens(&screened, prompt, &sampler, n), want, "{sampler:?}");
        }
    }
}

#[test]
fn the_golden_model_generates_the_same_tokens() {
    let prompts: Vec<Vec<u32>> = bitnet_testdata::PROMPTS
        .iter()
        .map(|p| bitnet_testdata::token_ids("tiny", p, "prompt_tokens"))
        .collect();
    same_tokens(&tiny(), &prompts, 24);
}

/// The small synthetic preset (1,024 wide, 6 blocks, the tiny vocabulary), as 2B-4T's
/// architecture and as a `llama` one.
#[test]
fn wider_synthetic_models_generate_the_same_tokens() {
    let dir = tempfile::tempdir().unwrap();
    for (name, arch) in [
        ("b.gguf", SynthArch::BitnetB158),
        ("l.gguf", SynthArch::Llama),
    ] {
        let spec = SynthSpec {
            arch,
            silu: arch == SynthArch::Llama,
            ..SynthSpec::preset(Preset::Small)
        };
        let path = dir.path().join(name);
        write_synth(&spec, &path);
        let prompts = vec![vec![1, 2, 3, 4, 5], (10..40).collect()];
        same_tokens(&path, &prompts, 16);
    }
}

/// Batched steps as the server takes them (`Engine::forward_sessions_pick`): four sessions,
/// one still prefilling (no output), the others asking for the arg-max, a top-5, a top-40
/// or every logit. Each answer must be what the unscreened engine's full logits of the same
/// pass give: the arg-max (lowest id among equal maxima), the top-k in the sampler's order
/// with their logits' bits, or the logits themselves bit for bit. The screen must have
/// answered arg-maxes and top-5s, so the check cannot pass on declines alone.
fn batched_picks_match(path: &Path, prompts: &[Vec<u32>; 4], steps: usize) {
    let (plain, screened) = (engine(path, false), engine(path, true));
    let new =
        |e: &Engine| -> Vec<Session> { (0..4).map(|_| e.new_session(256).unwrap()).collect() };
    let (mut ps, mut ss) = (new(&plain), new(&screened));
    let picks = [
        Some(Pick::Greedy),
        Some(Pick::Top(5)),
        Some(Pick::Top(40)),
        None,
    ];
    let mut next: Vec<Vec<u32>> = prompts.to_vec();
    let (mut greedy_answered, mut top5_answered) = (0, 0);
    for step in 0..steps {
        // Session 3's prompt goes in two chunks: its first pass has no output.
        let mut toks = next.clone();
        let mut outs = [Outputs::Last; 4];
        if step == 0 {
            let half = toks[3].len() / 2;
            next[3] = toks[3].split_off(half);
            outs[3] = Outputs::None;
        }
        let mut pw: Vec<(&mut Session, &[u32], Outputs)> = ps
            .iter_mut()
            .zip(&toks)
            .zip(outs)
            .map(|((s, t), o)| (s, t.as_slice(), o))
            .collect();
        let want = plain.forward_sessions(&mut pw).unwrap();
        let mut sw: Vec<(&mut Session, &[u32], Outputs)> = ss
            .iter_mut()
            .zip(&toks)
            .zip(outs)
            .map(|((s, t), o)| (s, t.as_slice(), o))
            .collect();
        let got = screened.forward_sessions_pick(&mut sw, &picks).unwrap();
        assert_eq!(got.len(), 4);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let at = format!("step {step} session {i}");
            match g {
                Picked::Logits(l) => {
                    assert_eq!(l.len(), w.len(), "{at}");
                    assert!(
                        l.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{at}"
                    );
                }
                Picked::Chosen(t) => {
                    assert_eq!(picks[i], Some(Pick::Greedy), "{at}");
                    assert_eq!(Some(*t), bitnet_sampling::argmax(w), "{at}");
                    greedy_answered += 1;
                }
                Picked::Top(c) => {
                    let Some(Pick::Top(k)) = picks[i] else {
                        panic!("{at}: a top-k for {:?}", picks[i])
                    };
                    let mut all: Vec<(u32, f32)> = (0u32..).zip(w.iter().copied()).collect();
                    all.sort_by(|x, y| y.1.total_cmp(&x.1).then(x.0.cmp(&y.0)));
                    all.truncate(k);
                    assert_eq!(c.len(), k, "{at}");
                    for (a, b) in c.iter().zip(&all) {
                        assert_eq!((a.0, a.1.to_bits()), (b.0, b.1.to_bits()), "{at}");
                    }
                    if k == 5 {
                        top5_answered += 1;
                    }
                }
            }
        }
        // Every session goes on with the plain logits' arg-max (session 3 with the rest of
        // its prompt after its first pass).
        for (i, w) in want.iter().enumerate() {
            if !w.is_empty() {
                next[i] = vec![bitnet_sampling::argmax(w).unwrap()];
            }
        }
        for (p, s) in ps.iter().zip(&ss) {
            assert_eq!(p.tokens(), s.tokens(), "step {step}: the sessions' tokens");
        }
    }
    assert!(
        greedy_answered * 2 >= steps && top5_answered * 2 >= steps,
        "the screen answered {greedy_answered} arg-maxes and {top5_answered} top-5s of {steps}"
    );
}

#[test]
fn batched_steps_pick_what_the_full_logits_give() {
    let p = |n: &str| bitnet_testdata::token_ids("tiny", n, "prompt_tokens");
    let names = bitnet_testdata::PROMPTS;
    let prompts = [p(names[0]), p(names[1]), p(names[2]), p(names[3])];
    batched_picks_match(&tiny(), &prompts, 12);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.gguf");
    write_synth(&SynthSpec::preset(Preset::Small), &path);
    batched_picks_match(
        &path,
        &[
            vec![1, 2, 3],
            (10..40).collect(),
            vec![7; 9],
            (100..117).collect(),
        ],
        8,
    );
}

#[test]
fn what_the_screen_cannot_serve_is_refused_before_the_file_is_opened() {
    let missing = Path::new("/nonexistent/model.gguf");
    let with = |f: &dyn Fn(&mut LoadOptions)| {
        let mut o = LoadOptions {
            screen_head: true,
            ..LoadOptions::default()
        };
        f(&mut o);
        load(missing, &o, &mut |_| {}).err().unwrap()
    };
    let budget = Some(BudgetRequest {
        bytes: 1 << 30,
        n_ctx: Some(128),
        kv_type_explicit: false,
        stream: StreamMode::default(),
        reserve_bytes: 0,
    });
    for (what, err) in [
        ("exact", with(&|o| o.numerics = Numerics::Exact)),
        ("q8_0 head", with(&|o| o.lm_head = LmHeadFormat::Q8_0)),
        ("budget", with(&|o| o.budget = budget)),
        ("gpu", with(&|o| o.device = Device::Gpu)),
    ] {
        assert!(matches!(err, EngineError::HeadScreen(_)), "{what}: {err}");
    }
    // Without those it is the missing file that is reported.
    assert!(matches!(with(&|_| {}), EngineError::Open { .. }));
}
