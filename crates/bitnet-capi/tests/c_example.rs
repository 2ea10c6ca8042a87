//! `examples/c/generate.c`, compiled with the system C compiler against `libbitnet` and
//! run on the tiny golden model: its greedy ids equal the Rust engine's, and in exact
//! numerics bitnet.cpp's (the golden file).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::PathBuf;
use std::process::Command;

use bitnet_engine::{load, ContextPolicy, Event, GenParams, LoadOptions};
use bitnet_model::Numerics;
use bitnet_sampling::SamplerParams;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory holding `libbitnet.so`: the one beside this test's executable
/// (`target/<profile>/deps`). The library's crate types (cdylib, staticlib, rlib) come
/// from one compiler run, which cargo makes before it links the integration tests, so the
/// shared library there is always the one this test's rlib was built with.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its executable");
    let dir = exe
        .parent()
        .expect("the executable has a directory")
        .to_path_buf();
    assert!(
        dir.join("libbitnet.so").is_file(),
        "libbitnet.so not found beside the test executable in {}",
        dir.display()
    );
    dir
}

fn compile() -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("generate");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let lib = lib_dir();
    let st = Command::new(&cc)
        .arg(root().join("examples/c/generate.c"))
        .arg("-std=c11")
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg("-I")
        .arg(root().join("include"))
        .arg(format!("-L{}", lib.display()))
        .arg("-lbitnet")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(st.success(), "compiling examples/c/generate.c failed");
    out
}

/// The Rust engine's greedy generation: every sampled id.
fn rust_ids(prompt: &str, n: usize, numerics: Numerics) -> Vec<u32> {
    let engine = load(
        &bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf"),
        &LoadOptions {
            threads: 1,
            numerics,
            ..LoadOptions::default()
        },
        &mut |_| {},
    )
    .unwrap();
    let ids = engine.tokenizer.encode(prompt, true, false).unwrap();
    let mut s = engine.new_session(512).unwrap();
    let mut out = Vec::new();
    let params = GenParams {
        max_tokens: n,
        sampler: SamplerParams::greedy(),
        stop: Vec::new(),
        context_policy: ContextPolicy::Stop,
        constraint: None,
    };
    engine
        .generate(&mut s, &ids, false, &params, &mut |e| {
            if let Event::Token(t) = e {
                out.push(t);
            }
            true
        })
        .unwrap();
    out
}

fn run(exe: &PathBuf, prompt: &str, n: usize, mode: &str) -> (Vec<u32>, u32) {
    let model = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    let out = Command::new(exe)
        .arg(&model)
        .arg(prompt)
        .arg(n.to_string())
        .arg(mode)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the C example failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut lines = stdout.lines();
    let ids = lines
        .next()
        .and_then(|l| l.strip_prefix("ids:"))
        .unwrap()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    let next = lines
        .next()
        .and_then(|l| l.strip_prefix("next: "))
        .unwrap()
        .parse()
        .unwrap();
    (ids, next)
}

#[test]
fn c_example_generates_the_engines_tokens() {
    let exe = compile();
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(bitnet_testdata::golden("tiny/p1_english.tokens.json")).unwrap(),
    )
    .unwrap();
    let prompt = std::fs::read_to_string(bitnet_testdata::golden("tiny/p1_english.txt")).unwrap();
    let want: Vec<u32> = serde_json::from_value(golden["generated_tokens"].clone()).unwrap();

    // Exact numerics: bitnet.cpp's own greedy tokens, and the Rust engine's.
    let (ids, next) = run(&exe, &prompt, want.len(), "exact");
    assert_eq!(ids, want, "exact: bitnet.cpp's greedy ids");
    assert_eq!(ids, rust_ids(&prompt, want.len(), Numerics::Exact));
    assert_eq!(next, want[0]);

    // Fast numerics: the Rust engine's tokens.
    for prompt in ["Once upon a time", "1, 2, 3, 4,"] {
        let (ids, next) = run(&exe, prompt, 24, "fast");
        assert_eq!(ids, rust_ids(prompt, 24, Numerics::Fast), "{prompt}");
        assert_eq!(next, ids[0]);
    }
}
