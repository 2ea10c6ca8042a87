//! Bad model files (docs/RELIABILITY.md §4 B): each becomes a specific typed error at load,
//! before anything large is allocated; never a panic.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use bitnet_gguf::{GgufFile, Limits, Value};
use bitnet_model::{Model, ModelError};
use bitnet_testkit::{rewrite, tiny_model_bytes, RawTensor};

fn base() -> GgufFile {
    GgufFile::from_bytes(tiny_model_bytes(1).unwrap(), &Limits::default()).unwrap()
}

fn load_edited(edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<RawTensor>)) -> ModelError {
    let bytes = rewrite(&base(), edit).unwrap();
    let f = GgufFile::from_bytes(bytes, &Limits::default()).unwrap();
    Model::load(&f).expect_err("load must fail")
}

fn set(kv: &mut [(String, Value)], key: &str, v: Value) {
    kv.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
}

const A: &str = "bitnet-b1.58";

#[test]
fn the_unedited_model_loads() {
    let f = base();
    let m = Model::load(&f).unwrap();
    assert_eq!(
        (
            m.config.n_layer,
            m.config.n_embd,
            m.config.n_head,
            m.config.n_head_kv
        ),
        (2, 256, 2, 1)
    );
}

#[test]
fn missing_or_unknown_architecture() {
    let e = load_edited(|kv, _| kv.retain(|(k, _)| k != "general.architecture"));
    assert!(matches!(e, ModelError::MissingArch(_)), "{e}");
    let e = load_edited(|kv, _| set(kv, "general.architecture", Value::String("gptneox".into())));
    assert!(
        matches!(e, ModelError::UnsupportedArch(ref a) if a == "gptneox"),
        "{e}"
    );
}

#[test]
fn missing_key_and_wrong_key_type() {
    let e = load_edited(|kv, _| kv.retain(|(k, _)| k != "bitnet-b1.58.embedding_length"));
    assert!(
        matches!(
            e,
            ModelError::Gguf(bitnet_gguf::GgufError::MissingKey { .. })
        ),
        "{e}"
    );
    let e = load_edited(|kv, _| set(kv, &format!("{A}.block_count"), Value::String("2".into())));
    assert!(
        matches!(
            e,
            ModelError::Gguf(bitnet_gguf::GgufError::WrongType { .. })
        ),
        "{e}"
    );
}

#[test]
fn zero_and_inconsistent_counts() {
    for (key, v) in [
        ("block_count", 0u32),
        ("attention.head_count", 0),
        ("attention.head_count_kv", 0),
        ("context_length", 0),
        ("attention.head_count_kv", 3), // does not divide head_count 2
        ("attention.head_count", 3),    // 256 % 3 != 0
        ("rope.dimension_count", 129),  // odd and > head_dim
        ("block_count", 100_000),       // over MAX_LAYERS
    ] {
        let e = load_edited(|kv, _| set(kv, &format!("{A}.{key}"), Value::U32(v)));
        assert!(matches!(e, ModelError::BadHparam { .. }), "{key}={v}: {e}");
    }
}

#[test]
fn block_count_disagrees_with_tensors() {
    let e = load_edited(|kv, _| set(kv, &format!("{A}.block_count"), Value::U32(3)));
    assert!(
        matches!(e, ModelError::MissingTensor(ref n) if n.starts_with("blk.2.")),
        "{e}"
    );
    let e = load_edited(|kv, _| set(kv, &format!("{A}.block_count"), Value::U32(1)));
    assert!(
        matches!(e, ModelError::UnexpectedTensor(ref n) if n.starts_with("blk.1.")),
        "{e}"
    );
}

#[test]
fn bad_eps_and_rope_base() {
    for v in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let e = load_edited(|kv, _| {
            set(
                kv,
                &format!("{A}.attention.layer_norm_rms_epsilon"),
                Value::F32(v),
            )
        });
        assert!(matches!(e, ModelError::BadHparam { .. }), "eps={v}: {e}");
        let e = load_edited(|kv, _| set(kv, &format!("{A}.rope.freq_base"), Value::F32(v)));
        assert!(matches!(e, ModelError::BadHparam { .. }), "base={v}: {e}");
    }
}

#[test]
fn vocab_size_disagrees_with_embedding() {
    let e = load_edited(|kv, _| set(kv, &format!("{A}.vocab_size"), Value::U32(4000)));
    assert!(matches!(e, ModelError::BadHparam { .. }), "{e}");
}

#[test]
fn unknown_activation_is_rejected_and_silu_is_honoured() {
    let e = load_edited(|kv, _| kv.push((format!("{A}.hidden_act"), Value::String("tanh".into()))));
    assert!(matches!(e, ModelError::UnknownActivation(_)), "{e}");
    let bytes = rewrite(&base(), |kv, _| {
        kv.push((format!("{A}.hidden_act"), Value::String("silu".into())))
    })
    .unwrap();
    let f = GgufFile::from_bytes(bytes, &Limits::default()).unwrap();
    assert_eq!(
        Model::load(&f).unwrap().config.activation,
        bitnet_model::Activation::Silu
    );
}

#[test]
fn missing_tensor_wrong_shape_wrong_type() {
    let e = load_edited(|_, t| t.retain(|t| t.name != "blk.1.ffn_up.weight"));
    assert!(
        matches!(e, ModelError::MissingTensor(ref n) if n == "blk.1.ffn_up.weight"),
        "{e}"
    );
    // ffn_sub_norm must be [n_ff]
    let e = load_edited(|_, t| {
        let x = t
            .iter_mut()
            .find(|t| t.name == "blk.0.ffn_sub_norm.weight")
            .unwrap();
        x.dims = vec![256];
        x.data.truncate(1024);
    });
    assert!(
        matches!(e, ModelError::WrongShape { ref name, .. } if name == "blk.0.ffn_sub_norm.weight"),
        "{e}"
    );
    // a norm stored as I2_S
    let e = load_edited(|_, t| {
        let x = t
            .iter_mut()
            .find(|t| t.name == "blk.0.attn_norm.weight")
            .unwrap();
        x.type_id = 36;
        x.dims = vec![128, 2];
        x.data = vec![0x55; 64 + 32];
    });
    assert!(
        matches!(
            e,
            ModelError::WrongShape { .. } | ModelError::WrongType { .. }
        ),
        "{e}"
    );
}

/// bitnet.cpp's TL1 and TL2 projections: a typed error that names the tensor and the way to
/// a file this engine reads.
#[test]
fn tiled_lookup_table_layouts_are_refused_with_the_way_out() {
    for (id, ty) in [(38u32, "TL1"), (39, "TL2")] {
        let e = load_edited(|_, t| {
            let x = t
                .iter_mut()
                .find(|t| t.name == "blk.0.attn_q.weight")
                .unwrap();
            x.type_id = id;
        });
        assert!(
            matches!(e, ModelError::TiledLayout { ref name, ref found } if name == "blk.0.attn_q.weight" && found == ty),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("bitnet convert") && msg.contains("I2_S"),
            "{msg}"
        );
    }
}

#[test]
fn non_finite_norm_weight() {
    let e = load_edited(|_, t| {
        let x = t
            .iter_mut()
            .find(|t| t.name == "output_norm.weight")
            .unwrap();
        x.data[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    assert!(matches!(e, ModelError::NonFinite { index: 2, .. }), "{e}");
}

#[test]
fn truncated_i2s_scale_tail() {
    // Without its 32-byte tail an I2_S tensor has the size of a QK256 tensor without
    // companion scales: refuse rather than run with scale 1.0.
    let e = load_edited(|_, t| {
        let x = t
            .iter_mut()
            .find(|t| t.name == "blk.0.attn_q.weight")
            .unwrap();
        x.data.truncate(256 * 256 / 4);
    });
    assert!(
        matches!(e, ModelError::MissingScales(ref n) if n == "blk.0.attn_q.weight"),
        "{e}"
    );
    // Shorter than every type-36 flavor: the container itself is rejected.
    let bytes = rewrite(&base(), |_, t| {
        let x = t
            .iter_mut()
            .find(|t| t.name == "blk.0.attn_q.weight")
            .unwrap();
        x.data.truncate(256 * 256 / 4 - 32);
    })
    .unwrap();
    assert!(GgufFile::from_bytes(bytes, &Limits::default()).is_err());
}

#[test]
fn kv_cache_over_budget_is_refused_before_allocating() {
    let f = base();
    let m = Model::load(&f).unwrap();
    let e = m
        .new_cache(512, bitnet_model::KvType::F32, 1024)
        .unwrap_err();
    assert!(matches!(e, ModelError::OverBudget { .. }), "{e}");
    let e = m
        .new_cache(usize::MAX / 2, bitnet_model::KvType::F32, u64::MAX)
        .unwrap_err();
    assert!(
        matches!(e, ModelError::Overflow(_) | ModelError::OverBudget { .. }),
        "{e}"
    );
}

#[test]
fn out_of_range_token_and_full_context() {
    let f = base();
    let m = Model::load(&f).unwrap();
    let pool = bitnet_kernels::Pool::new(1);
    let mut exec = bitnet_model::Exec {
        backend: &pool,
        numerics: bitnet_model::Numerics::Fast,
        trace: None,
        scratch: None,
    };
    let mut cache = m.new_cache(4, bitnet_model::KvType::F16, u64::MAX).unwrap();
    let e = m
        .forward(&[4256], &mut cache, bitnet_model::Outputs::Last, &mut exec)
        .unwrap_err();
    assert!(
        matches!(e, ModelError::TokenOutOfRange { id: 4256, .. }),
        "{e}"
    );
    let e = m
        .forward(
            &[1, 2, 3, 4, 5],
            &mut cache,
            bitnet_model::Outputs::Last,
            &mut exec,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::ContextFull {
                needed: 5,
                n_ctx: 4
            }
        ),
        "{e}"
    );
    assert_eq!(cache.len(), 0);
}
