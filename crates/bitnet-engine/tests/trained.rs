//! The trained model of testdata/trained (a BitNet b1.58 model in the 2B-4T architecture,
//! trained on the King James Bible): bitnet.cpp's own tokens and logits for ten held-out
//! prompts (make-refs.sh), and what the model learned.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bitnet_engine::quality::{self, Nll};
use bitnet_engine::{load, Engine, LoadOptions};
use bitnet_model::{KvType, Numerics, Outputs};
use bitnet_testdata::{compare_logits, first_bit_difference, read, read_f32, token_ids};

const N_VOCAB: usize = 4096;
const N_GEN: usize = 64;
const PROMPTS: usize = 10;
/// The prompts whose every greedy step's logits are kept (`pNN.step_logits.f32`).
const STEPPED: [usize; 2] = [1, 2];

fn engine(numerics: Numerics) -> Engine {
    load(
        &bitnet_testdata::trained("kjv-i2_s.gguf"),
        &LoadOptions {
            threads: 2,
            numerics,
            kv_type: KvType::F16,
            ..LoadOptions::default()
        },
        &mut |_| {},
    )
    .unwrap()
}

fn stem(i: usize) -> String {
    format!("p{i:02}")
}

fn prompt_text(i: usize) -> String {
    String::from_utf8(read(&format!("../trained/refs/{}.txt", stem(i)))).unwrap()
}

/// Lowest id on ties, as dump_logits chooses.
fn argmax(row: &[f32]) -> u32 {
    let i = row
        .iter()
        .enumerate()
        .fold(0, |b, (i, &x)| if x > row[b] { i } else { b });
    u32::try_from(i).unwrap()
}

/// The prompt in one batch, then `n` greedy steps of one token: every step's logits and the
/// tokens chosen (no stop at EOS), as dump_logits runs bitnet.cpp.
fn greedy(e: &Engine, prompt: &[u32], n: usize) -> (Vec<f32>, Vec<u32>) {
    let mut s = e.new_session(512).unwrap();
    let mut logits = e.eval(&mut s, prompt, Outputs::Last).unwrap();
    let (mut steps, mut picked) = (Vec::new(), Vec::new());
    for k in 0..n {
        steps.extend_from_slice(&logits);
        picked.push(argmax(&logits));
        if k + 1 < n {
            logits = e.eval(&mut s, &picked[k..=k], Outputs::Last).unwrap();
        }
    }
    (steps, picked)
}

#[test]
fn exact_numerics_give_bitnet_cpps_tokens_logits_and_text() {
    let e = engine(Numerics::Exact);
    assert_eq!(e.config().n_vocab, N_VOCAB);
    for i in 1..=PROMPTS {
        let p = stem(i);
        let prompt = e.tokenizer.encode(&prompt_text(i), true, false).unwrap();
        assert_eq!(
            prompt,
            token_ids("../trained/refs", &p, "prompt_tokens"),
            "{p}: the prompt's ids"
        );
        let (steps, picked) = greedy(&e, &prompt, N_GEN);
        let want = read_f32(&format!("../trained/refs/{p}.logits.f32"));
        assert_eq!(
            first_bit_difference(&steps[..N_VOCAB], &want),
            None,
            "{p}: the last prompt position's logits"
        );
        if STEPPED.contains(&i) {
            let want = read_f32(&format!("../trained/refs/{p}.step_logits.f32"));
            assert_eq!(
                first_bit_difference(&steps, &want),
                None,
                "{p}: every greedy step's logits"
            );
        }
        assert_eq!(
            picked,
            token_ids("../trained/refs", &p, "generated_tokens"),
            "{p}: 64 greedy tokens"
        );
        // llama-cli's greedy text: the same tokens, up to the end of text where it stops.
        let eos = e.tokenizer.eos();
        let upto = picked
            .iter()
            .position(|&t| Some(t) == eos)
            .unwrap_or(picked.len());
        let text = e.tokenizer.decode(&picked[..upto]).unwrap();
        // llama-cli ends every generation with "\n\n" (examples/main/main.cpp), after
        // " [end of text]\n" where it stopped at EOS.
        let cli = String::from_utf8(read(&format!("../trained/refs/{p}.cli.txt"))).unwrap();
        let mut cli = cli.strip_suffix("\n\n").expect("llama-cli's closing lines");
        if upto < picked.len() {
            cli = cli
                .strip_suffix(" [end of text]\n")
                .expect("llama-cli's EOS line");
        }
        assert_eq!(text, cli, "{p}: llama-cli's text");
        if i == 1 {
            println!("{}{text}", prompt_text(i));
        }
    }
}

#[test]
fn fast_numerics_stay_within_the_gates_on_the_trained_model() {
    let e = engine(Numerics::Fast);
    let (mut rows, mut agree, mut total) = (0, 0, 0);
    for i in 1..=PROMPTS {
        let p = stem(i);
        let prompt = token_ids("../trained/refs", &p, "prompt_tokens");
        let want_tokens = token_ids("../trained/refs", &p, "generated_tokens");
        // Teacher-forced on bitnet.cpp's greedy tokens: the last prompt position and each step.
        let mut s = e.new_session(512).unwrap();
        let mut seq = prompt.clone();
        seq.extend_from_slice(&want_tokens[..N_GEN - 1]);
        let all = e.eval(&mut s, &seq, Outputs::All).unwrap();
        let steps = &all[(prompt.len() - 1) * N_VOCAB..];
        let want = if STEPPED.contains(&i) {
            read_f32(&format!("../trained/refs/{p}.step_logits.f32"))
        } else {
            read_f32(&format!("../trained/refs/{p}.logits.f32"))
        };
        let g = compare_logits(&steps[..want.len()], &want, N_VOCAB, 0.05);
        println!(
            "{p}: {} rows, max |Δ| {:.4}, min cos {:.6}",
            g.rows, g.max_abs, g.min_cos
        );
        assert!(g.max_abs <= 0.25, "{p}: max |Δ| {}", g.max_abs);
        assert!(g.min_cos >= 0.995, "{p}: cosine {}", g.min_cos);
        assert_eq!(g.top1_misses_above_margin, 0, "{p}");
        rows += g.rows;
        for (row, &t) in steps.chunks_exact(N_VOCAB).zip(&want_tokens) {
            agree += usize::from(argmax(row) == t);
            total += 1;
        }
    }
    println!(
        "fast numerics: {rows} reference rows within the gates; greedy agreement {agree}/{total}"
    );
    assert!(
        agree * 100 >= total * 95,
        "greedy agreement {agree}/{total}"
    );
}

/// Held-out perplexity (llama-perplexity's method: chunks of 512, the second half of each
/// scored) at most a tenth of a unigram model's on the same tokens. The unigram model is the
/// training text's token counts (`unigram.json`) with add-one smoothing.
#[test]
fn the_trained_model_predicts_held_out_text_ten_times_better_than_unigrams() {
    let e = engine(Numerics::Fast);
    let text = String::from_utf8(read("../trained/heldout.txt")).unwrap();
    let tokens = e.tokenizer.encode(&text, true, false).unwrap();
    let chunks = quality::chunks(&tokens, 512, e.tokenizer.bos(), None);
    assert!(chunks.len() >= 40, "{} chunks", chunks.len());
    let uni: serde_json::Value = serde_json::from_slice(&read("../trained/unigram.json")).unwrap();
    let counts: Vec<f64> = uni["counts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_f64().unwrap() + 1.0)
        .collect();
    assert_eq!(counts.len(), N_VOCAB);
    let sum: f64 = counts.iter().sum();
    let first = quality::first_scored(512);
    let mut nll = Nll::default();
    let (mut uni_nll, mut uni_n) = (0.0f64, 0u64);
    for c in &chunks {
        nll.add(c, &quality::chunk_log_probs(&e, c).unwrap(), N_VOCAB);
        for &t in &c[first + 1..] {
            uni_nll -= (counts[t as usize] / sum).ln();
            uni_n += 1;
        }
    }
    assert_eq!(nll.count(), uni_n, "both score the same tokens");
    let unigram = (uni_nll / uni_n as f64).exp();
    println!(
        "held-out perplexity {:.3} over {} tokens; unigram {unigram:.3}; ratio {:.4}",
        nll.perplexity(),
        nll.count(),
        nll.perplexity() / unigram
    );
    assert!(
        nll.perplexity() <= unigram / 10.0,
        "perplexity {} against unigram {unigram}",
        nll.perplexity()
    );
}

/// This vocabulary has no `<|eot_id|>`: a chat is the 2B-4T format's text with the marker as
/// text, tokenized at once (bitnet.cpp's template output, as llama.cpp tokenizes it), not an
/// error.
#[test]
fn a_chat_without_an_eot_token_is_the_formats_text() {
    use bitnet_tokenizer::{ChatMessage, ChatRole};
    let e = engine(Numerics::Fast);
    let t = &e.tokenizer;
    assert_eq!(t.token_id("<|eot_id|>"), None);
    let msgs = [
        ChatMessage::new(ChatRole::System, "Be brief."),
        ChatMessage::new(ChatRole::User, "Who begat Enos?"),
    ];
    let ids = t.encode_chat(&msgs, true).unwrap();
    let text = "System: Be brief.<|eot_id|>User: Who begat Enos?<|eot_id|>Assistant: ";
    let mut want = vec![t.bos().unwrap()];
    want.extend(t.encode(text, false, false).unwrap());
    assert_eq!(ids, want);
}

/// `scripts/quality`'s measure in CI, on part of the held-out text (8 chunks of 512, 2,040
/// scored tokens): each fast or smaller configuration against exact numerics, within gates a
/// few times above what the whole text gives (docs/NUMERICS.md, "Measuring quality"), so a
/// change that makes one of them worse on real text fails here.
#[test]
fn fast_and_smaller_configurations_stay_close_to_exact_on_held_out_text() {
    use bitnet_engine::quality::Divergence;
    use bitnet_engine::LmHeadFormat;
    let load_with = |numerics, kv_type, lm_head| {
        load(
            &bitnet_testdata::trained("kjv-i2_s.gguf"),
            &LoadOptions {
                threads: 2,
                numerics,
                kv_type,
                lm_head,
                ..LoadOptions::default()
            },
            &mut |_| {},
        )
        .unwrap()
    };
    let base = engine(Numerics::Exact);
    let text = String::from_utf8(read("../trained/heldout.txt")).unwrap();
    let tokens = base.tokenizer.encode(&text, true, false).unwrap();
    let chunks = quality::chunks(&tokens, 512, base.tokenizer.bos(), Some(8));
    assert_eq!(chunks.len(), 8);
    let base_lp: Vec<Vec<f32>> = chunks
        .iter()
        .map(|c| quality::chunk_log_probs(&base, c).unwrap())
        .collect();
    // (configuration, mean KL at most, top-1 agreement at least)
    let cases = [
        (
            "fast",
            Numerics::Fast,
            KvType::F16,
            LmHeadFormat::File,
            0.001,
            0.97,
        ),
        (
            "q8_0 cache",
            Numerics::Fast,
            KvType::Q8_0,
            LmHeadFormat::File,
            0.001,
            0.97,
        ),
        (
            "q4_0 cache",
            Numerics::Fast,
            KvType::Q4_0,
            LmHeadFormat::File,
            0.02,
            0.90,
        ),
        (
            "q8_0 head",
            Numerics::Fast,
            KvType::F16,
            LmHeadFormat::Q8_0,
            0.001,
            0.97,
        ),
        (
            "q4_0 head",
            Numerics::Fast,
            KvType::F16,
            LmHeadFormat::Q4_0,
            0.02,
            0.88,
        ),
    ];
    for (what, numerics, kv, head, max_kl, min_top1) in cases {
        let e = load_with(numerics, kv, head);
        let mut d = Divergence::default();
        for (c, b) in chunks.iter().zip(&base_lp) {
            d.add_chunk(c, b, &quality::chunk_log_probs(&e, c).unwrap(), N_VOCAB);
        }
        println!(
            "{what}: mean KL {:.6}, top-1 agreement {:.2}%",
            d.mean_kl(),
            100.0 * d.top1_agreement()
        );
        assert!(d.mean_kl() <= max_kl, "{what}: mean KL {}", d.mean_kl());
        assert!(
            d.top1_agreement() >= min_top1,
            "{what}: top-1 agreement {}",
            d.top1_agreement()
        );
    }
}
