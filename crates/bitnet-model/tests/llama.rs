//! Architecture `llama` with ternary projections (bitnet.cpp's Llama3-8B-1.58 and Falcon3
//! files): what the golden file binds, and the files that must be refused rather than run
//! wrong. Parity with bitnet.cpp's logits is in golden.rs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bitnet_gguf::{GgufFile, Limits, Value};
use bitnet_model::{Activation, Model, ModelError, RopeStyle};
use bitnet_testkit::{rewrite, tiny_model_bytes, RawTensor};

fn llama_tiny() -> GgufFile {
    GgufFile::open(
        &bitnet_testdata::golden("llama-tiny/llama-tiny-i2_s.gguf"),
        &Limits::default(),
    )
    .unwrap()
}

fn load_edited(
    src: &GgufFile,
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<RawTensor>),
) -> Result<(), ModelError> {
    let bytes = rewrite(src, edit).unwrap();
    let f = GgufFile::from_bytes(bytes, &Limits::default()).unwrap();
    Model::load(&f).map(|_| ())
}

fn set(kv: &mut Vec<(String, Value)>, key: &str, v: Value) {
    match kv.iter_mut().find(|(k, _)| k == key) {
        Some(e) => e.1 = v,
        None => kv.push((key.to_string(), v)),
    }
}

#[test]
fn the_golden_llama_file_binds_as_bitnet_cpp_reads_it() {
    let f = llama_tiny();
    let m = Model::load(&f).unwrap();
    let c = &m.config;
    assert_eq!(c.arch, "llama");
    assert_eq!(
        (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.n_ff),
        (2, 256, 4, 2, 768)
    );
    assert_eq!(c.activation, Activation::Silu);
    assert_eq!(c.rope_style, RopeStyle::Norm);
    assert!(!c.sub_norms);
    assert!(
        m.output.is_some(),
        "llama-quantize keeps the untied head (F16)"
    );
    for l in &m.layers {
        assert!(l.attn_sub_norm.is_none() && l.ffn_sub_norm.is_none());
    }
}

/// Falcon3's hyperparameters come from the file: heads of 256, RoPE base 1000042, ε 1e-6.
#[test]
fn the_golden_falcon3_file_binds_its_hyperparameters() {
    let f = GgufFile::open(
        &bitnet_testdata::golden("falcon3-tiny/falcon3-tiny-i2_s.gguf"),
        &Limits::default(),
    )
    .unwrap();
    let c = Model::load(&f).unwrap().config;
    assert_eq!((c.arch.as_str(), c.head_dim, c.n_rot), ("llama", 256, 256));
    assert_eq!((c.rope_freq_base, c.rms_eps), (1_000_042.0, 1e-6));
    assert_eq!(c.rope_style, RopeStyle::Norm);
}

#[test]
fn a_bitnet_file_relabelled_llama_is_refused_for_its_sub_norms() {
    // The 2B-4T graph's sub-norms have no place in llama's: running without them would be
    // silently wrong, so the tensor is named.
    let src = GgufFile::from_bytes(tiny_model_bytes(1).unwrap(), &Limits::default()).unwrap();
    let e = load_edited(&src, |kv, _| {
        for (k, v) in kv.iter_mut() {
            if let Some(rest) = k.strip_prefix("bitnet-b1.58.") {
                *k = format!("llama.{rest}");
            }
            if k == "general.architecture" {
                *v = Value::String("llama".into());
            }
        }
    })
    .unwrap_err();
    assert!(
        matches!(e, ModelError::UnexpectedTensor(ref n) if n == "blk.0.attn_sub_norm.weight"),
        "{e}"
    );
}

#[test]
fn rope_scaling_and_frequency_factors_are_refused_not_ignored() {
    let f = llama_tiny();
    // The linear factor 1 bitnet.cpp's converter writes for `bitnet` models is no scaling.
    load_edited(&f, |kv, _| {
        set(
            kv,
            "llama.rope.scaling.type",
            Value::String("linear".into()),
        );
        set(kv, "llama.rope.scaling.factor", Value::F32(1.0));
    })
    .unwrap();
    for (ty, factor) in [
        ("linear", Some(4.0f32)),
        ("yarn", None),
        ("yarn", Some(1.0)),
    ] {
        let e = load_edited(&f, |kv, _| {
            set(kv, "llama.rope.scaling.type", Value::String(ty.into()));
            if let Some(x) = factor {
                set(kv, "llama.rope.scaling.factor", Value::F32(x));
            }
        })
        .unwrap_err();
        assert!(
            matches!(e, ModelError::Unsupported(ref m) if m.contains("RoPE scaling")),
            "{ty} {factor:?}: {e}"
        );
    }
    let e = load_edited(&f, |_, t| {
        t.push(RawTensor {
            name: "rope_freqs.weight".into(),
            dims: vec![32],
            type_id: 0,
            data: 1.0f32
                .to_le_bytes()
                .iter()
                .copied()
                .cycle()
                .take(128)
                .collect(),
        })
    })
    .unwrap_err();
    assert!(
        matches!(e, ModelError::Unsupported(ref m) if m.contains("rope_freqs.weight")),
        "{e}"
    );
}
