//! The whole model on the AMX tier gives the AVX-512 VNNI tier's logits bit for bit, in both
//! numerics, on the golden model and a synthetic one: every prompt position (the projections
//! of a prompt run on the tiles) and the one-token steps after it. The tier is chosen per
//! process, so each side is its own `bitnet logits` run (`BITNET_ISA=avx512vnni` lowers it).
//! On a CPU without the AMX tier the test says so and checks nothing else.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn bitnet(args: &[&str], isa: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bitnet"));
    c.args(args).env_remove("BITNET_ISA");
    if let Some(i) = isa {
        c.env("BITNET_ISA", i);
    }
    c.output().expect("run bitnet")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tiers-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// The tiers `inspect --system` lists as available, and its first line.
fn available() -> (Vec<String>, String) {
    let out = bitnet(&["inspect", "--system"], None);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text.lines().next().unwrap_or("").to_string();
    let list = line
        .split("available: ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or("")
        .split(", ")
        .map(str::to_string)
        .collect();
    (list, line)
}

fn logits(model: &str, extra: &[&str], isa: Option<&str>, out: &PathBuf) -> Vec<u8> {
    let mut args = vec![
        "logits",
        "-m",
        model,
        "-t",
        "2",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = bitnet(&args, isa);
    assert!(
        o.status.success(),
        "{:?} {args:?}: {}",
        isa,
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::read(out).unwrap()
}

#[test]
fn amx_tier_gives_the_vnni_tiers_logits() {
    let (tiers, line) = available();
    if !tiers.iter().any(|t| t == "amx") {
        println!("AMX tier not available on this CPU, nothing compared: {line}");
        return;
    }
    let synth = tmp("small.gguf");
    let o = bitnet(
        &[
            "synth",
            "--preset",
            "small",
            "--quiet",
            "-o",
            synth.to_str().unwrap(),
        ],
        None,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let golden = bitnet_testdata::golden_str("tiny/bitnet-tiny-i2_s.gguf");
    // 45 prompt tokens: two full 16-row tiles and a ragged one, then 5 single steps.
    let prompt: Vec<String> = (0..45u32)
        .map(|i| (1 + (i * 37) % 4000).to_string())
        .collect();
    let prompt = prompt.join(",");
    let then = "7,99,1234,5,42";
    let out = tmp("logits.f32");
    let mut compared = 0;
    for model in [golden.as_str(), synth.to_str().unwrap()] {
        for numerics in ["fast", "exact"] {
            for mode in [&["--all"][..], &["--then", then][..]] {
                let mut extra = vec!["--ids", &prompt, "--numerics", numerics];
                extra.extend_from_slice(mode);
                let amx = logits(model, &extra, None, &out);
                let vnni = logits(model, &extra, Some("avx512vnni"), &out);
                assert!(!amx.is_empty());
                assert!(
                    amx == vnni,
                    "{model} {numerics} {mode:?}: the AMX tier's logits differ from the VNNI tier's"
                );
                compared += 1;
            }
        }
    }
    println!("AMX against VNNI: {compared} logit files identical");
}
