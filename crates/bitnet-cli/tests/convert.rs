//! `bitnet convert` and `bitnet synth --hf` end to end: the output appears only when complete.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

use bitnet_testdata::dir_names as names;

fn bitnet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bitnet"))
        .args(args)
        .output()
        .expect("run bitnet")
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn converts_a_hf_directory_and_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    let gguf = dir.path().join("out.gguf");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    ok(&bitnet(&["synth", "--hf", "packed", "-o", &s(&hf)]));
    ok(&bitnet(&["convert", &s(&hf), "-o", &s(&gguf), "--quiet"]));
    let out = bitnet(&[
        "run",
        "-m",
        &s(&gguf),
        "-p",
        "Hello",
        "-n",
        "4",
        "--temp",
        "0",
    ]);
    ok(&out);
    assert_eq!(names(dir.path()), ["hf", "out.gguf"]);

    // A stored Q8_0 head: `run` uses it as the file's head.
    let q8 = dir.path().join("q8.gguf");
    ok(&bitnet(&[
        "convert",
        &s(&gguf),
        "-o",
        &s(&q8),
        "--lm-head",
        "q8_0",
        "--quiet",
    ]));
    let out = bitnet(&["inspect", "--json", &s(&q8)]);
    ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("output.weight"));
    ok(&bitnet(&[
        "run",
        "-m",
        &s(&q8),
        "-p",
        "Hello",
        "-n",
        "4",
        "--temp",
        "0",
    ]));
    std::fs::remove_file(&q8).unwrap();

    // To TQ1_0 and back; and the llama.cpp flavor's refusal, naming the flag.
    let tq1 = dir.path().join("tq1.gguf");
    ok(&bitnet(&[
        "convert",
        &s(&gguf),
        "-o",
        &s(&tq1),
        "--to",
        "tq1_0",
        "--quiet",
    ]));
    let up = dir.path().join("up.gguf");
    let out = bitnet(&["convert", &s(&gguf), "-o", &s(&up), "--for", "llama.cpp"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--allow-activation-mismatch"), "{err}");
    assert!(!up.exists());
}

#[test]
fn a_failed_conversion_leaves_no_output_and_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    ok(&bitnet(&["synth", "--hf", "bf16", "-o", &s(&hf)]));
    // A NaN in the last tensor of the checkpoint: found while writing, after the header and
    // earlier tensors went out.
    let st = hf.join("model.safetensors");
    let mut bytes = std::fs::read(&st).unwrap();
    let n = bytes.len();
    bytes[n - 2..].copy_from_slice(&[0xC0, 0x7F]);
    std::fs::write(&st, bytes).unwrap();
    let out_dir = dir.path().join("o");
    std::fs::create_dir(&out_dir).unwrap();
    let target = out_dir.join("model.gguf");
    // An earlier file of that name stays as it was.
    std::fs::write(&target, b"earlier").unwrap();
    let out = bitnet(&["convert", &s(&hf), "-o", &s(&target), "--quiet"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("non-finite"), "{err}");
    assert_eq!(std::fs::read(&target).unwrap(), b"earlier");
    assert_eq!(names(&out_dir), ["model.gguf"]);
}

#[test]
fn qsf_runs_like_the_gguf_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let gguf = dir.path().join("m.gguf");
    ok(&bitnet(&["synth", "-o", &s(&gguf), "--quiet"]));
    for compress in ["none", "lz4"] {
        let qsf = dir.path().join(format!("m-{compress}.qsf"));
        ok(&bitnet(&[
            "convert",
            &s(&gguf),
            "-o",
            &s(&qsf),
            "--to",
            "qsf",
            "--compress",
            compress,
            "--quiet",
        ]));
        let logits = |m: &Path| {
            let out = bitnet(&[
                "logits",
                "-m",
                &s(m),
                "-p",
                "Once upon a time",
                "--all",
                "-o",
                "-",
            ]);
            ok(&out);
            out.stdout
        };
        assert_eq!(logits(&qsf), logits(&gguf), "{compress}");
        // The index holds each block's importance as `--skip-layers auto` measures it.
        let q = bitnet_qsf::QsfFile::open(&qsf).unwrap();
        let engine =
            bitnet_engine::load(&gguf, &bitnet_engine::LoadOptions::default(), &mut |_| {})
                .unwrap();
        let want = bitnet_engine::skip::importance(&engine).unwrap();
        assert_eq!(q.layers.len(), want.len());
        for (l, w) in q.layers.iter().zip(&want) {
            assert!(l.importance.is_finite() && l.importance >= 0.0);
            assert!(
                (f64::from(l.importance) - w).abs() <= 1e-6 * w.abs().max(1.0),
                "{} vs {w}",
                l.importance
            );
        }
        // Back to GGUF: the same file, tensor for tensor.
        let back = dir.path().join(format!("back-{compress}.gguf"));
        ok(&bitnet(&["convert", &s(&qsf), "-o", &s(&back), "--quiet"]));
        assert_eq!(logits(&back), logits(&gguf), "{compress}");
    }
    // The low-memory mode streams an uncompressed QSF like the GGUF (same logits); an LZ4 one
    // is decompressed whole, so the mode refuses it.
    let budget_logits = |m: &Path| {
        bitnet(&[
            "logits",
            "-m",
            &s(m),
            "-p",
            "Once upon a time",
            "--all",
            "--ram-budget",
            "200M",
            "-o",
            "-",
        ])
    };
    let (a, b) = (
        budget_logits(&dir.path().join("m-none.qsf")),
        budget_logits(&gguf),
    );
    ok(&a);
    ok(&b);
    assert_eq!(a.stdout, b.stdout);
    let out = budget_logits(&dir.path().join("m-lz4.qsf"));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("LZ4"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
