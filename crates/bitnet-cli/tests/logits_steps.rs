//! `bitnet logits --then`: the step-wise (teacher-forced) comparison with bitnet.cpp's
//! `step_logits` files, from the command line. The prompt is one batch, then every generated
//! token is fed alone, as bitnet.cpp computed those rows.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use std::path::PathBuf;
use std::process::{Command, Output};

use bitnet_testdata::{compare_logits, first_bit_difference, golden_str, read, read_f32, PROMPTS};

const N_VOCAB: usize = 4256;

fn bitnet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bitnet"))
        .args(args)
        .output()
        .expect("run bitnet")
}

fn tmp_dir() -> PathBuf {
    let d = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("steps-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ids(stem: &str, key: &str) -> Vec<u32> {
    ids_in("tiny", stem, key)
}

fn ids_in(dir: &str, stem: &str, key: &str) -> Vec<u32> {
    bitnet_testdata::token_ids(dir, stem, key)
}

fn csv(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Step logits for a golden prompt: the prompt, then the 31 generated tokens that produced
/// rows 1..32 of `step_logits.f32`.
fn step_logits(stem: &str, numerics: &str, threads: &str) -> Vec<f32> {
    step_logits_of("tiny", "bitnet-tiny-i2_s.gguf", stem, numerics, threads)
}

fn step_logits_of(dir: &str, file: &str, stem: &str, numerics: &str, threads: &str) -> Vec<f32> {
    let prompt = ids_in(dir, stem, "prompt_tokens");
    let generated = ids_in(dir, stem, "generated_tokens");
    let out = tmp_dir().join(format!("{dir}-{stem}-{numerics}-{threads}.f32"));
    let o = bitnet(&[
        "logits",
        "-m",
        &golden_str(&format!("{dir}/{file}")),
        "--ids",
        &csv(&prompt),
        "--then",
        &csv(&generated[..generated.len() - 1]),
        "--numerics",
        numerics,
        "-t",
        threads,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(&out).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn exact_steps_are_byte_identical_to_bitnet_cpp() {
    for threads in ["1", "2"] {
        for stem in PROMPTS {
            let golden = read_f32(&format!("tiny/{stem}.step_logits.f32"));
            assert_eq!(golden.len(), 32 * N_VOCAB, "{stem}");
            let ours = step_logits(stem, "exact", threads);
            if let Some((i, x, y)) = first_bit_difference(&ours, &golden) {
                panic!(
                    "{stem} ({threads} threads): first difference at row {} id {}: ours {x:e}, bitnet.cpp {y:e}",
                    i / N_VOCAB,
                    i % N_VOCAB
                );
            }
        }
    }
}

/// Architecture `llama` (testdata/golden/llama-tiny and falcon3-tiny, run by bitnet.cpp's
/// fork): the prompt text through the CLI's tokenizer gives bitnet.cpp's last-position logits,
/// and the one-token steps its step logits, byte for byte. llama-tiny names no pre-tokenizer
/// (`--pre default`: bitnet.cpp's fallback); falcon3-tiny names Falcon3's, which is used;
/// 1bitllm-tiny (architecture `bitnet`) has a SentencePiece vocabulary.
#[test]
fn llama_architecture_is_byte_identical_to_bitnet_cpp() {
    for (dir, pre) in [
        ("llama-tiny", Some("default")),
        ("falcon3-tiny", None),
        ("1bitllm-tiny", None),
    ] {
        let file = format!("{dir}-i2_s.gguf");
        let model = golden_str(&format!("{dir}/{file}"));
        for stem in PROMPTS {
            let text = String::from_utf8(read(&format!("{dir}/{stem}.txt"))).unwrap();
            let out = tmp_dir().join(format!("{dir}-{stem}-last.f32"));
            let mut args = vec![
                "logits",
                "-m",
                &model,
                "-p",
                &text,
                "--numerics",
                "exact",
                "-t",
                "2",
                "--out",
            ];
            let out_s = out.to_str().unwrap().to_string();
            args.push(&out_s);
            if let Some(p) = pre {
                args.extend(["--pre", p]);
            }
            let o = bitnet(&args);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            assert!(
                std::fs::read(&out).unwrap() == read(&format!("{dir}/{stem}.logits.f32")),
                "{dir} {stem}: last-position logits differ from bitnet.cpp's"
            );
            let golden = read_f32(&format!("{dir}/{stem}.step_logits.f32"));
            let ours = step_logits_of(dir, &file, stem, "exact", "1");
            let n_vocab = golden.len() / 32;
            if let Some((i, x, y)) = first_bit_difference(&ours, &golden) {
                panic!(
                    "{dir} {stem}: first step difference at row {} id {}: ours {x:e}, bitnet.cpp {y:e}",
                    i / n_vocab,
                    i % n_vocab
                );
            }
        }
    }
}

#[test]
fn fast_steps_hold_the_statistical_gates() {
    for stem in PROMPTS {
        let golden = read_f32(&format!("tiny/{stem}.step_logits.f32"));
        let ours = step_logits(stem, "fast", "2");
        let g = compare_logits(&ours, &golden, N_VOCAB, 0.05);
        eprintln!("{stem}: max |Δ| {:.4}, min cos {:.6}", g.max_abs, g.min_cos);
        assert_eq!(g.rows, 32, "{stem}");
        assert!(g.max_abs <= 0.2, "{stem}: max |Δ| {} > 0.2", g.max_abs);
        assert!(g.min_cos >= 0.996, "{stem}: cosine {} < 0.996", g.min_cos);
        assert_eq!(
            g.top1_misses_above_margin, 0,
            "{stem}: top-1 differs where the reference margin is above 0.05"
        );
    }
}

#[test]
fn step_rows_are_not_one_batch() {
    // The step rows are the one-token-batch computation: in exact numerics the row after the
    // prompt's last token differs from the same position evaluated inside one batch
    // (bitnet.cpp rounds the LM-head input to f16 only for single-row outputs), so step mode
    // cannot be faked by slicing a whole-sequence run.
    let stem = "p1_english";
    let prompt = ids(stem, "prompt_tokens");
    let generated = ids(stem, "generated_tokens");
    let steps = step_logits(stem, "exact", "1");
    let mut whole = prompt.clone();
    whole.push(generated[0]);
    let out = tmp_dir().join("whole.f32");
    let o = bitnet(&[
        "logits",
        "-m",
        &golden_str("tiny/bitnet-tiny-i2_s.gguf"),
        "--ids",
        &csv(&whole),
        "--all",
        "--numerics",
        "exact",
        "-t",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let all = std::fs::read(&out).unwrap();
    let last_row = &all[(whole.len() - 1) * N_VOCAB * 4..];
    let step_row: Vec<u8> = steps[N_VOCAB..2 * N_VOCAB]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    assert_eq!(last_row.len(), step_row.len());
    assert_ne!(last_row, &step_row[..]);
}

#[test]
fn step_mode_refuses_bad_input_and_writes_nothing() {
    // A folder of its own: the other tests of this binary write theirs concurrently.
    let dir = tmp_dir().join("refused");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("refused.f32");
    let model = golden_str("tiny/bitnet-tiny-i2_s.gguf");
    for then in ["4256", "1,2,99999"] {
        let o = bitnet(&[
            "logits",
            "-m",
            &model,
            "--ids",
            "4000,1,2",
            "--then",
            then,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("outside the vocabulary"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // More positions than the model's context (512).
    let long = csv(&vec![1u32; 600]);
    let o = bitnet(&[
        "logits",
        "-m",
        &model,
        "--ids",
        "4000",
        "--then",
        &long,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("context"));
    assert!(!out.exists());
    // Nothing half-written was left behind in the folder.
    for e in std::fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name();
        assert!(
            !name.to_string_lossy().ends_with(".tmp"),
            "left behind: {name:?}"
        );
    }
}

#[test]
fn logits_to_stdout_equal_the_file() {
    let stem = "p3_digits_punct";
    let o = bitnet(&[
        "logits",
        "-m",
        &golden_str("tiny/bitnet-tiny-i2_s.gguf"),
        "--ids",
        &csv(&ids(stem, "prompt_tokens")),
        "--numerics",
        "exact",
        "--out",
        "-",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stdout == read(&format!("tiny/{stem}.logits.f32")));
}
