//! The trace hook against the testkit's plain f32 reference forward (no int8 activations):
//! every named intermediate of the last position agrees within a stated bound, so the
//! activation quantization is the only difference.
//!
//! Bounds (relative L2 error ||ours − ref|| / ||ref||): layer 0's `attn_norm` sees no
//! quantized projection yet, so it must agree to float rounding (1e-5); every later step
//! carries the int8 re-quantization of each projection input (measured 1.1%–2.4% on this
//! two-layer model), bounded by 0.05; the logits' cosine ≥ 0.995 (measured 0.9997).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use bitnet_gguf::{GgufFile, Limits};
use bitnet_kernels::Pool;
use bitnet_model::{Exec, KvType, Model, Numerics, Outputs, TraceEvent};
use bitnet_testkit::reference::reference_forward;

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn trace_matches_the_f32_reference_up_to_activation_quantization() {
    let f = GgufFile::from_bytes(
        bitnet_testkit::tiny_model_bytes(11).unwrap(),
        &Limits::default(),
    )
    .unwrap();
    let tokens = [4000u32, 791, 934, 875, 293, 654, 77, 282, 78, 87];
    let reference = reference_forward(&f, &tokens).unwrap();

    let m = Model::load(&f).unwrap();
    let pool = Pool::new(2);
    let mut seen: Vec<(&'static str, Option<usize>, Vec<f32>)> = Vec::new();
    let mut hook = |ev: &TraceEvent<'_>| {
        let last = &ev.data[(ev.rows - 1) * ev.cols..];
        seen.push((ev.name, ev.layer, last.to_vec()));
    };
    let mut exec = Exec {
        backend: &pool,
        numerics: Numerics::Fast,
        trace: Some(&mut hook),
        scratch: None,
    };
    let mut cache = m.new_cache(16, KvType::F32, u64::MAX).unwrap();
    let logits = m
        .forward(&tokens, &mut cache, Outputs::Last, &mut exec)
        .unwrap();

    for (name, layer, want) in &reference.steps {
        let got = &seen
            .iter()
            .find(|(n, l, _)| n == name && l == layer)
            .unwrap_or_else(|| panic!("no trace of {name} {layer:?}"))
            .2;
        assert_eq!(got.len(), want.len(), "{name} {layer:?}");
        let err = rel_err(got, want);
        let bound = if (*name, *layer) == ("attn_norm", Some(0)) {
            1e-5
        } else {
            0.05
        };
        eprintln!("{name:<12} {layer:?}: relative error {err:.2e} (bound {bound:.0e})");
        assert!(
            err <= bound,
            "{name} layer {layer:?}: relative error {err} > {bound}"
        );
    }
    let cos = {
        let (mut d, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
        for (a, b) in logits.iter().zip(&reference.logits) {
            d += f64::from(*a) * f64::from(*b);
            na += f64::from(*a).powi(2);
            nb += f64::from(*b).powi(2);
        }
        d / (na.sqrt() * nb.sqrt())
    };
    eprintln!("logits cosine {cos:.6}");
    assert!(cos >= 0.995, "logits cosine {cos}");
}
