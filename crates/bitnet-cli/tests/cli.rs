//! The `bitnet` binary end to end, on the golden fixtures beside the checkout.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bitnet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bitnet"))
        .args(args)
        .output()
        .expect("run bitnet")
}

fn shared(p: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared")
        .join(p)
        .display()
        .to_string()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("bitnet-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

#[test]
fn inspect_lists_the_golden_keys_and_tensors() {
    let out = bitnet(&[
        "inspect",
        "--json",
        &shared("golden/tiny/bitnet-tiny-i2_s.gguf"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let keys: Vec<&str> = v["metadata"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 24);
    assert_eq!(keys[0], "general.architecture");
    assert_eq!(keys[23], "general.quantization_version");
    let t = v["tensors"].as_array().unwrap();
    assert_eq!(t.len(), 24);
    // TENSORS.md rows 2 and 23
    assert_eq!(t[2]["name"], "blk.0.attn_q.weight");
    assert_eq!(t[2]["type"], "I2_S");
    assert_eq!(t[2]["bytes"], 16416);
    assert_eq!(t[2]["offset"], 2_180_096);
    assert_eq!(t[23]["name"], "output_norm.weight");
    assert_eq!(t[23]["offset"], 2_484_672);
    assert_eq!(v["data_offset"], 194_848);
    // the table form has the same rows
    let out = bitnet(&["inspect", &shared("golden/tiny/bitnet-tiny-i2_s.gguf")]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("24 KV pairs, 24 tensors"), "{text}");
}

#[test]
fn inspect_fails_cleanly_on_bad_files() {
    let missing = tmp("missing.gguf");
    let empty = tmp("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let garbage = tmp("garbage.gguf");
    std::fs::write(
        &garbage,
        b"GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff",
    )
    .unwrap();
    for p in [&missing, &empty, &garbage] {
        let out = bitnet(&["inspect", p.to_str().unwrap()]);
        assert!(!out.status.success(), "{}", p.display());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("error:"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn tokenize_json_matches_the_reference_tokenizer() {
    let cases: serde_json::Value =
        serde_json::from_slice(&std::fs::read(shared("golden/tokenizer/cases.json")).unwrap())
            .unwrap();
    let case = &cases[3]; // contractions: where LLaMA-3 and bitnet.cpp's default differ
    let text = case["text"].as_str().unwrap();
    let vocab = shared("golden/tokenizer/llama3-vocab.gguf");
    let out = bitnet(&[
        "tokenize",
        "-m",
        &vocab,
        "--json",
        "--no-bos",
        "--parse-special",
        text,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ids"], case["hf_llama3_ids"]);
    let out = bitnet(&[
        "tokenize",
        "-m",
        &vocab,
        "--json",
        "--no-bos",
        "--parse-special",
        "--pre",
        "default",
        text,
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ids"], case["bitnetcpp_default_ids"]);
}

#[test]
fn logits_exact_is_bit_identical_to_the_golden_file() {
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(shared("golden/tiny/p3_digits_punct.tokens.json")).unwrap(),
    )
    .unwrap();
    let ids: Vec<String> = meta["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap().to_string())
        .collect();
    let out_path = tmp("p3.logits.f32");
    let out = bitnet(&[
        "logits",
        "-m",
        &shared("golden/tiny/bitnet-tiny-i2_s.gguf"),
        "--ids",
        &ids.join(","),
        "--numerics",
        "exact",
        "-t",
        "2",
        "--out",
        out_path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours = std::fs::read(&out_path).unwrap();
    let golden = std::fs::read(shared("golden/tiny/p3_digits_punct.logits.f32")).unwrap();
    assert!(ours == golden, "logits differ from bitnet.cpp's");
}

#[test]
fn synth_then_run_generates_tokens() {
    let model = tmp("tiny.gguf");
    let out = bitnet(&[
        "synth",
        "--preset",
        "tiny",
        "--quiet",
        "-o",
        model.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = bitnet(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "Hello",
        "-n",
        "8",
        "--seed",
        "3",
        "-t",
        "1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("Hello"), "{stdout}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("generated 8 tokens"), "{err}");
    // same seed, same text
    let again = bitnet(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "Hello",
        "-n",
        "8",
        "--seed",
        "3",
        "-t",
        "2",
    ]);
    assert_eq!(out.stdout, again.stdout);
}

#[test]
fn run_refuses_bad_sampling_parameters() {
    let out = bitnet(&[
        "run",
        "-m",
        &shared("golden/tiny/bitnet-tiny-i2_s.gguf"),
        "-p",
        "x",
        "--top-p",
        "1.5",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("top_p"), "{err}");
}

#[test]
fn chat_keeps_going_across_turns_and_exits_on_eof() {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_bitnet"))
        .args([
            "chat",
            "-m",
            &shared("golden/tiny/bitnet-tiny-i2_s.gguf"),
            "-n",
            "6",
            "--seed",
            "1",
            "-t",
            "1",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Hello there\n/reset\nAnd again\nthird turn\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("conversation reset"), "{err}");
    assert!(!err.contains("error"), "{err}");
}

#[test]
fn bench_json_reports_every_test_including_batched_decode() {
    let out = bitnet(&[
        "bench",
        "-m",
        &shared("golden/tiny/bitnet-tiny-i2_s.gguf"),
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "1,2",
        "--batch",
        "3",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<(String, u64, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["test"].as_str().unwrap().to_string(),
                r["threads"].as_u64().unwrap(),
                r["batch"].as_u64().unwrap(),
            )
        })
        .collect();
    for t in [1, 2] {
        assert!(names.contains(&("pp8".into(), t, 1)), "{names:?}");
        assert!(names.contains(&("tg4".into(), t, 1)), "{names:?}");
        assert!(names.contains(&("tg4x3".into(), t, 3)), "{names:?}");
    }
    for r in &rows {
        let (lo, med, hi) = (
            r["tok_s_min"].as_f64().unwrap(),
            r["tok_s_median"].as_f64().unwrap(),
            r["tok_s_max"].as_f64().unwrap(),
        );
        assert!(lo > 0.0 && lo <= med && med <= hi, "{r}");
        assert!(r["bytes_per_token"].as_u64().unwrap() > 0);
        assert!(r["peak_rss_bytes"].as_u64().unwrap() > 0);
    }
    let bad = bitnet(&[
        "bench",
        "-m",
        &shared("golden/tiny/bitnet-tiny-i2_s.gguf"),
        "--batch",
        "1",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--batch"));
    // A thread list is for bench only.
    let bad = bitnet(&[
        "run",
        "-m",
        &shared("golden/tiny/bitnet-tiny-i2_s.gguf"),
        "-t",
        "1,2",
        "-p",
        "a",
        "-n",
        "1",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("-t takes one thread count"));
}
