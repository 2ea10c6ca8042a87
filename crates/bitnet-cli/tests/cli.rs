//! The `bitnet` binary end to end, on the golden fixtures in testdata/golden.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn bitnet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bitnet"))
        .args(args)
        .output()
        .expect("run bitnet")
}

/// A golden fixture's path (the test fails, naming it, when the file is missing).
fn golden(p: &str) -> String {
    bitnet_testdata::golden_str(p)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

#[test]
fn inspect_lists_the_golden_keys_and_tensors() {
    let out = bitnet(&["inspect", "--json", &golden("tiny/bitnet-tiny-i2_s.gguf")]);
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
    // testdata/golden/tiny/TENSORS.md rows 2 and 23
    assert_eq!(t[2]["name"], "blk.0.attn_q.weight");
    assert_eq!(t[2]["type"], "I2_S");
    assert_eq!(t[2]["bytes"], 16416);
    assert_eq!(t[2]["offset"], 2_180_096);
    assert_eq!(t[23]["name"], "output_norm.weight");
    assert_eq!(t[23]["offset"], 2_484_672);
    assert_eq!(v["data_offset"], 194_848);
    // the table form has the same rows
    let out = bitnet(&["inspect", &golden("tiny/bitnet-tiny-i2_s.gguf")]);
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
        serde_json::from_slice(&std::fs::read(golden("tokenizer/cases.json")).unwrap()).unwrap();
    let case = &cases[3]; // contractions: where LLaMA-3 and bitnet.cpp's default differ
    let text = case["text"].as_str().unwrap();
    let vocab = golden("tokenizer/llama3-vocab.gguf");
    let out = bitnet(&["tokenize", "-m", &vocab, "--json", "--no-bos", text]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ids"], case["hf_llama3_ids"]);
    let out = bitnet(&[
        "tokenize", "-m", &vocab, "--json", "--no-bos", "--pre", "default", text,
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ids"], case["bitnetcpp_default_ids"]);
}

#[test]
fn logits_exact_is_bit_identical_to_the_golden_file() {
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(golden("tiny/p3_digits_punct.tokens.json")).unwrap())
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
        &golden("tiny/bitnet-tiny-i2_s.gguf"),
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
    let golden = std::fs::read(golden("tiny/p3_digits_punct.logits.f32")).unwrap();
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
        &golden("tiny/bitnet-tiny-i2_s.gguf"),
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
            &golden("tiny/bitnet-tiny-i2_s.gguf"),
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
        &golden("tiny/bitnet-tiny-i2_s.gguf"),
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
        &golden("tiny/bitnet-tiny-i2_s.gguf"),
        "--batch",
        "1",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--batch"));
    // Prefill batches: a prompt longer than -u is evaluated in batches of it; 0, and anything
    // but 512 with exact numerics, are refused.
    let tiny = golden("tiny/bitnet-tiny-i2_s.gguf");
    let ok = bitnet(&[
        "bench", "-m", &tiny, "-p", "9", "-n", "0", "-r", "1", "-t", "1", "-u", "4",
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("pp9"));
    for (extra, word) in [
        (&["-u", "0"][..], "--ubatch-size"),
        (&["-u", "128", "--numerics", "exact"][..], "512"),
    ] {
        let mut args = vec!["bench", "-m", &tiny, "-p", "8", "-n", "0", "-r", "1"];
        args.extend_from_slice(extra);
        let bad = bitnet(&args);
        assert!(!bad.status.success());
        let err = String::from_utf8_lossy(&bad.stderr);
        assert!(err.contains(word), "{err}");
    }
    // llama-bench's comma lists: every prompt length at every ubatch, every generation length,
    // each row saying what it ran.
    let out = bitnet(&[
        "bench", "-m", &tiny, "-p", "4,9", "-n", "2,3", "-u", "4,8", "-t", "1", "-r", "1",
        "--batch", "2", "--json",
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
    let got: Vec<(String, u64, u64, Option<u64>)> = rows
        .iter()
        .map(|r| {
            (
                r["test"].as_str().unwrap().to_string(),
                r["n_prompt"].as_u64().unwrap(),
                r["n_gen"].as_u64().unwrap(),
                r["n_ubatch"].as_u64(),
            )
        })
        .collect();
    let want: Vec<(String, u64, u64, Option<u64>)> = vec![
        ("pp4@u4".into(), 4, 0, Some(4)),
        ("pp9@u4".into(), 9, 0, Some(4)),
        ("pp4@u8".into(), 4, 0, Some(8)),
        ("pp9@u8".into(), 9, 0, Some(8)),
        ("tg2".into(), 0, 2, None),
        ("tg3".into(), 0, 3, None),
        ("tg2x2".into(), 0, 2, None),
        ("tg3x2".into(), 0, 3, None),
    ];
    assert_eq!(got, want);
    for r in &rows {
        assert_eq!(r["samples_ts"].as_array().map(Vec::len), Some(1), "{r}");
        assert_eq!(r["n_depth"].as_u64(), Some(0), "{r}");
    }
    // A zero in a list skips that test, as in llama-bench; a zero ubatch anywhere is refused.
    let out = bitnet(&[
        "bench", "-m", &tiny, "-p", "0", "-n", "0,2", "-t", "1", "-r", "1", "--json",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("\"tg2\""), "{text}");
    let bad = bitnet(&["bench", "-m", &tiny, "-p", "8", "-u", "4,0", "-r", "1"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--ubatch-size"));
    // A thread list is for bench only.
    let bad = bitnet(&[
        "run",
        "-m",
        &golden("tiny/bitnet-tiny-i2_s.gguf"),
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

/// The golden model with the bytes at `name` replaced (same length), written to a temp file.
fn patched_golden(out: &str, patch: impl FnOnce(&mut Vec<u8>)) -> String {
    let mut b = std::fs::read(golden("tiny/bitnet-tiny-i2_s.gguf")).unwrap();
    patch(&mut b);
    let p = tmp(out);
    std::fs::write(&p, b).unwrap();
    p.to_str().unwrap().to_owned()
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not in the file", String::from_utf8_lossy(needle)))
}

#[test]
fn duplicate_tensor_names_and_unknown_types_fail_inspect_and_run() {
    // Tensor #13 renamed to the name of tensor #2.
    let dup = patched_golden("dup.gguf", |b| {
        let i = find(b, b"blk.1.attn_q.weight");
        b[i..i + 19].copy_from_slice(b"blk.0.attn_q.weight");
    });
    // output_norm.weight (#23, F32, one dimension) given type id 1000.
    let unk = patched_golden("unknown-type.gguf", |b| {
        let name = b"output_norm.weight";
        let i = find(b, name) + name.len();
        assert_eq!(b[i..i + 4], 1u32.to_le_bytes(), "n_dims");
        let ty = i + 4 + 8;
        assert_eq!(b[ty..ty + 4], 0u32.to_le_bytes(), "F32");
        b[ty..ty + 4].copy_from_slice(&1000u32.to_le_bytes());
    });
    let dup_msg = "duplicate tensor name \"blk.0.attn_q.weight\": tensors #2 and #13";
    let unk_inspect = "tensor #23 \"output_norm.weight\" has ggml type id 1000";
    for (file, inspect_msg, run_msg) in [
        (&dup, dup_msg, dup_msg),
        (&unk, unk_inspect, "output_norm.weight"),
    ] {
        let out = bitnet(&["inspect", file]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "inspect {file} succeeded");
        assert!(err.contains(inspect_msg), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        let out = bitnet(&["run", "-m", file, "-p", "hi", "-n", "2"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "run {file} succeeded");
        assert!(err.contains(run_msg), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // inspect still shows what it can of the unknown-type file before failing.
    let out = bitnet(&["inspect", &unk]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("UNKNOWN(1000)"), "{text}");
    assert!(text.contains("blk.0.attn_q.weight"), "{text}");
    let out = bitnet(&["inspect", "--json", &unk]);
    assert!(!out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tensors"][23]["type_id"], 1000);
}

#[test]
fn tokenize_parses_special_tokens_unless_told_not_to() {
    let vocab = golden("tokenizer/llama3-vocab.gguf");
    let ids = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["tokenize", "-m", &vocab, "--json", "--no-bos"];
        args.extend_from_slice(extra);
        args.push("<|eot_id|>");
        let out = bitnet(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["ids"].clone()
    };
    assert_eq!(ids(&[]), serde_json::json!([128009]));
    let plain = ids(&["--no-parse-special"]);
    let plain = plain.as_array().unwrap();
    assert!(plain.len() > 1, "{plain:?}");
    assert!(!plain.contains(&serde_json::json!(128009)));
}

/// The `peak RSS` of `run`'s summary line, in MiB.
fn peak_rss_mib(stderr: &str) -> f64 {
    let tail = stderr
        .rsplit("peak RSS ")
        .next()
        .unwrap_or_else(|| panic!("no peak RSS in {stderr}"));
    let mut it = tail.split_whitespace();
    let v: f64 = it.next().unwrap().parse().unwrap();
    match it.next().unwrap() {
        "KiB" => v / 1024.0,
        "MiB" => v,
        "GiB" => v * 1024.0,
        u => panic!("unit {u}"),
    }
}

#[test]
fn ram_budget_streams_the_model_within_the_budget() {
    let model = tmp("small.gguf");
    let out = bitnet(&[
        "synth",
        "--preset",
        "small",
        "--quiet",
        "-o",
        model.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let m = model.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run", "-m", m, "-p", "Hello", "-n", "16", "--temp", "0", "-c", "512", "-t", "2",
        ];
        args.extend_from_slice(extra);
        let out = bitnet(&args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        (out.stdout, err)
    };
    let (normal_text, normal_err) = run(&[]);
    let (text, err) = run(&["--ram-budget", "48M"]);
    assert_eq!(text, normal_text, "the same greedy text");
    // Both ways of streaming give the logits of normal mode bit for bit (every prompt
    // position, then steps), within the budget.
    let logits = |extra: &[&str]| {
        let mut args = vec![
            "logits",
            "-m",
            m,
            "-p",
            "Hello there, streaming",
            "--then",
            "5,77,300,9",
            "-c",
            "512",
            "-t",
            "2",
        ];
        args.extend_from_slice(extra);
        let out = bitnet(&args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        assert!(!out.stdout.is_empty());
        (out.stdout, err)
    };
    let (plain, _) = logits(&[]);
    for mode in ["pread", "mmap"] {
        let (streamed, err) = logits(&["--ram-budget", "48M", "--stream", mode]);
        assert!(err.contains("weights: 2 of 6 blocks"), "{mode}: {err}");
        assert!(
            streamed == plain,
            "{mode}: streamed logits differ from normal mode"
        );
        let (t, err) = run(&["--ram-budget", "48M", "--stream", mode]);
        assert_eq!(t, normal_text, "{mode}: the same greedy text");
        let peak = peak_rss_mib(&err);
        assert!(
            peak < 48.0,
            "{mode}: peak RSS {peak} MiB over the 48 MiB budget"
        );
    }
    assert!(
        err.contains("memory plan for a budget of 48.0 MiB"),
        "{err}"
    );
    assert!(err.contains("weights: 2 of 6 blocks"), "{err}");
    let (peak, normal_peak) = (peak_rss_mib(&err), peak_rss_mib(&normal_err));
    assert!(peak < 48.0, "peak RSS {peak} MiB over the 48 MiB budget");
    assert!(
        peak < normal_peak,
        "peak RSS {peak} MiB, normal mode {normal_peak} MiB"
    );

    // bench in the low-memory mode: pp and tg rows, within the budget.
    let out = bitnet(&[
        "bench",
        "-m",
        m,
        "-p",
        "16",
        "-n",
        "8",
        "-r",
        "1",
        "-t",
        "2",
        "-c",
        "512",
        "--json",
        "--ram-budget",
        "48M",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(names, ["pp16", "tg8"]);
    for r in &rows {
        assert!(r["tok_s_median"].as_f64().unwrap() > 0.0);
        assert!(r["peak_rss_bytes"].as_u64().unwrap() < 48 << 20, "{r}");
    }
    let out = bitnet(&["bench", "-m", m, "--ram-budget", "48M", "--batch", "4"]);
    assert!(!out.status.success());

    // Too small, and an explicit context that cannot fit: errors with the numbers.
    let out = bitnet(&[
        "run",
        "-m",
        m,
        "-p",
        "Hi",
        "-c",
        "512",
        "--ram-budget",
        "20M",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("RAM budget of 20 MiB is too small"), "{err}");
    let out = bitnet(&["run", "-m", m, "-p", "Hi", "--ram-budget", "lots"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a size"));
}

#[test]
fn perplexity_and_kl_divergence_against_a_saved_base() {
    let text = tmp("ppl.txt");
    let mut s = String::new();
    for p in ["p1_english", "p2_unicode", "p3_digits_punct", "p4_code_ws"] {
        s.push_str(&std::fs::read_to_string(golden(&format!("tiny/{p}.txt"))).unwrap());
    }
    std::fs::write(&text, s.repeat(3)).unwrap();
    let model = golden("tiny/bitnet-tiny-i2_s.gguf");
    let base = tmp("base.kl");
    let (t, b) = (text.to_str().unwrap(), base.to_str().unwrap());
    let out = bitnet(&[
        "perplexity",
        "-m",
        &model,
        "-f",
        t,
        "-c",
        "64",
        "--chunks",
        "4",
        "-t",
        "2",
        "--numerics",
        "exact",
        "--kl-divergence-base",
        b,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("[4]") && stdout.contains("Final estimate: PPL = "),
        "{stdout}"
    );
    assert!(stdout.contains("(124 tokens scored)"), "{stdout}");
    // 4 chunks: header + 4 × (64 ids + 31 rows × 4256 f32).
    assert_eq!(
        std::fs::metadata(&base).unwrap().len(),
        24 + 4 * (64 * 4 + 31 * 4256 * 4)
    );
    let compare = |extra: &[&str]| {
        let mut args = vec![
            "perplexity",
            "-m",
            &model,
            "-t",
            "2",
            "--kl-divergence-base",
            b,
            "--kl-divergence",
        ];
        args.extend_from_slice(extra);
        let out = bitnet(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let same = compare(&["--numerics", "exact"]);
    assert!(
        same.contains("mean KL divergence 0.000000") && same.contains("top-1 agreement 100.000%"),
        "{same}"
    );
    for kv in ["q8_0", "q4_0"] {
        let q = compare(&["--kv-cache", kv]);
        assert!(!q.contains("top-1 agreement 100.000%"), "{kv}: {q}");
    }

    // A truncated base, and a text too short for one chunk, are errors.
    let bytes = std::fs::read(&base).unwrap();
    let cut = tmp("cut.kl");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = bitnet(&[
        "perplexity",
        "-m",
        &model,
        "--kl-divergence-base",
        cut.to_str().unwrap(),
        "--kl-divergence",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("truncated"));
    let short = tmp("short.txt");
    std::fs::write(&short, "Hello").unwrap();
    let out = bitnet(&["perplexity", "-m", &model, "-f", short.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("need at least 512"));
}

#[test]
fn kv_window_lets_generation_go_past_the_context() {
    let model = golden("tiny/bitnet-tiny-i2_s.gguf");
    let gen = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "-m",
            &model,
            "-p",
            "Once upon a time",
            "-n",
            "100",
            "--temp",
            "0",
            "-t",
            "1",
        ];
        args.extend_from_slice(extra);
        bitnet(&args)
    };
    let out = gen(&["-c", "32"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("finish: Length"), "{err}");
    let capped: usize = err
        .split("generated ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(capped < 32, "{err}");
    let out = gen(&["--kv-window", "32"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let n: usize = err
        .split("generated ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(n > 32, "{err}");
    // Refused: exact numerics, a window with -c, a window too small.
    for extra in [
        &["--kv-window", "32", "--numerics", "exact"][..],
        &["--kv-window", "32", "-c", "64"][..],
        &["--kv-window", "8"][..],
    ] {
        let out = gen(extra);
        assert!(!out.status.success(), "{extra:?}");
    }
}

#[test]
fn skip_layers_is_reported_and_checked() {
    let model = golden("tiny/bitnet-tiny-i2_s.gguf");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "-m", &model, "-p", "Hi", "-n", "4", "-t", "1"];
        args.extend_from_slice(extra);
        bitnet(&args)
    };
    let out = run(&["--skip-layers", "1"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("skipping 1 of 2 blocks: [1]"));
    // Two blocks: `auto` keeps the first and last two, so nothing.
    let out = run(&["--skip-layers", "auto"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("skipping 0 of 2 blocks: []"));
    for bad in [
        &["--skip-layers", "2"][..],
        &["--skip-layers", "0,1"][..],
        &["--skip-layers", "one"][..],
        &["--skip-layers", "1", "--numerics", "exact"][..],
    ] {
        assert!(!run(bad).status.success(), "{bad:?}");
    }
}

#[test]
fn approx_lm_head_is_reported_and_checked() {
    let model = golden("tiny/bitnet-tiny-i2_s.gguf");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run", "-m", &model, "-p", "Hi", "-n", "6", "-t", "2", "--seed", "7",
        ];
        args.extend_from_slice(extra);
        bitnet(&args)
    };
    let exact = run(&[]);
    assert!(exact.status.success());
    // Every cluster probed: the exact head's greedy text.
    let all = run(&[
        "--lm-head",
        "approx",
        "--approx-clusters",
        "32",
        "--approx-probe",
        "32",
    ]);
    assert!(all.status.success());
    assert_eq!(all.stdout, exact.stdout);
    let err = String::from_utf8_lossy(&all.stderr);
    assert!(
        err.contains("approximate LM head: 32 clusters of the 4256 rows"),
        "{err}"
    );
    for bad in [
        &["--approx-probe", "4"][..],
        &["--lm-head", "approx", "--approx-clusters", "0"][..],
        &["--lm-head", "approx", "--numerics", "exact"][..],
    ] {
        assert!(!run(bad).status.success(), "{bad:?}");
    }
}

#[test]
fn bench_profile_needs_the_gpu_and_prints_dispatches_and_kernel_times_there() {
    let model = golden("tiny/bitnet-tiny-i2_s.gguf");
    let out = bitnet(&[
        "bench",
        "-m",
        &model,
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "1",
        "--profile",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--profile times GPU kernels"), "{err}");
    if !bitnet_gpu::probe::gpu_tests_enabled() {
        return;
    }
    let out = bitnet(&[
        "bench",
        "-m",
        &model,
        "--device",
        "gpu",
        "-p",
        "20",
        "-n",
        "3",
        "-r",
        "1",
        "--profile",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The tiny model's 2 blocks, no merge under 64 positions: on a GPU the team kernels, 10
    // dispatches each (four norms, QKV, RoPE with the K/V store, attention, O, gate+up, down);
    // on a CPU device (lavapipe) the lane kernels, 5 (the norms in the matrix kernels, RoPE
    // with the store in the QKV kernel). Then the embedding, the final norm, the head and the
    // argmax.
    let lanes = bitnet_gpu::Gpu::open(None)
        .expect("the adapter the bench opened")
        .lane_kernels();
    let per_block = if lanes { 5 } else { 10 };
    let want = format!("decode: {} dispatches", per_block * 2 + 4);
    assert!(text.contains(&want), "{want} not in:\n{text}");
    for test in ["pp20", "tg3"] {
        let head = format!("kernel time per token, {test}");
        assert!(text.contains(&head), "{head} not in:\n{text}");
    }
    // The prompt's matrices go through the GEMM (20 rows), the steps' through mv.
    assert!(text.contains("  mv gate+up"), "{text}");
    assert!(text.contains("  ternary gate+up"), "{text}");
}

/// `bitnet embed` on the file bitnet.cpp's embedding converter writes (gemma3,
/// testdata/golden/embed): one line per input, `--json` in OpenAI's shape, inputs from a file,
/// raw vectors and another pooling, and refusals (the vectors themselves are checked against
/// the oracle in the model, engine, server, Python and C tests).
#[test]
fn embed_prints_vectors() {
    let model = golden("embed/gemma3-converted.gguf");
    let run = |args: &[&str]| {
        let mut all = vec!["embed", "-m", model.as_str(), "-t", "1"];
        all.extend_from_slice(args);
        bitnet(&all)
    };
    let parse_line = |l: &str| -> Vec<f32> { l.split(' ').map(|x| x.parse().unwrap()).collect() };
    let out = run(&["hello world", "bonjour"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    let first = parse_line(lines[0]);
    assert_eq!(first.len(), 128);
    let norm: f32 = first.iter().map(|x| x * x).sum();
    assert!((norm - 1.0).abs() < 1e-5);

    // The same inputs from a file (empty lines skipped), as JSON.
    let f = tmp("embed-inputs.txt");
    std::fs::write(&f, "hello world\n\nbonjour\n").unwrap();
    let out = run(&["--json", "-f", f.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    assert_eq!(data[1]["index"], 1);
    let got: Vec<f32> = data[0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(got, first);
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 2);

    // Raw vectors are not of unit length; mean pooling differs from the file's (last).
    let raw = parse_line(
        String::from_utf8(run(&["--no-normalize", "hello world"]).stdout)
            .unwrap()
            .trim(),
    );
    assert!((raw.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() > 1e-3);
    let mean = parse_line(
        String::from_utf8(run(&["--pooling", "mean", "hello world"]).stdout)
            .unwrap()
            .trim(),
    );
    assert_ne!(mean, first);

    // --bits: the 4-bit codes of the first vector (absmax: ±7 at its largest value), and
    // with --json the 1-bit codes and their scale (the mean magnitude).
    let out = run(&["--bits", "4", "hello world"]);
    let codes: Vec<i32> = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    let max = first.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let want: Vec<i32> = first
        .iter()
        .map(|x| (x * (7.0 / max)).round_ties_even() as i32)
        .collect();
    assert_eq!(codes, want);
    let v: serde_json::Value =
        serde_json::from_slice(&run(&["--bits", "1", "--json", "hello world"]).stdout).unwrap();
    let d = &v["data"][0];
    let signs: Vec<i64> = first.iter().map(|&x| i64::from(x > 0.0)).collect();
    assert_eq!(d["embedding"], serde_json::json!(signs));
    let mean_abs = first.iter().map(|x| x.abs()).sum::<f32>() / 128.0;
    assert!((d["scale"].as_f64().unwrap() as f32 - mean_abs).abs() < 1e-6);
    assert_eq!(d["bits"], 1);

    // Refusals: no input, an empty one, an unknown pooling, a bit width that is none of
    // 8, 4, 2, 1.
    for args in [
        &[][..],
        &[""][..],
        &["--pooling", "max", "a"][..],
        &["--bits", "3", "a"][..],
    ] {
        let out = run(args);
        assert!(!out.status.success(), "{args:?}");
        assert!(!out.stderr.is_empty());
    }
}
