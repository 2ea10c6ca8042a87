//! Bad model files (docs/RELIABILITY.md §4 B): each becomes a specific typed error at load,
//! before anything large is allocated; never a panic.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use bitnet_gguf::{GgufFile, Limits, Value};
use bitnet_model::{Exec, KvType, Model, ModelError, Numerics, Outputs, Pooling, Seq};
use bitnet_testkit::{
    rewrite, synth, tiny_model_bytes, Preset, RawTensor, SynthSpec, WeightLayout, Xorshift,
    EXTREME_F32S, EXTREME_U32S,
};

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

/// F16 NaN, as two little-endian bytes.
const F16_NAN: [u8; 2] = [0x00, 0x7e];

fn tensor<'t>(ts: &'t mut [RawTensor], name: &str) -> &'t mut RawTensor {
    ts.iter_mut().find(|t| t.name == name).unwrap()
}

#[test]
fn non_finite_ternary_scales_are_refused() {
    // I2_S: the tensor scale follows the n/4 bytes of codes.
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let e = load_edited(|_, ts| {
            let t = tensor(ts, "blk.1.ffn_up.weight");
            let n = usize::try_from(t.dims[0] * t.dims[1] / 4).unwrap();
            t.data[n..n + 4].copy_from_slice(&bad.to_le_bytes());
        });
        assert!(
            matches!(e, ModelError::NonFiniteScale { ref name, block: 0 } if name == "blk.1.ffn_up.weight"),
            "{e}"
        );
    }
    // A zero scale is a matrix of zeros: defined, and finite.
    let bytes = rewrite(&base(), |_, ts| {
        let t = tensor(ts, "blk.1.ffn_up.weight");
        let n = usize::try_from(t.dims[0] * t.dims[1] / 4).unwrap();
        t.data[n..n + 4].copy_from_slice(&0f32.to_le_bytes());
    })
    .unwrap();
    let f = GgufFile::from_bytes(bytes, &Limits::default()).unwrap();
    let m = Model::load(&f).unwrap();
    let pool = bitnet_kernels::Pool::new(1);
    let mut cache = m.new_cache(8, KvType::F16, u64::MAX).unwrap();
    let l = m
        .forward(
            &[1, 2, 3],
            &mut cache,
            Outputs::Last,
            &mut exec(&pool, Numerics::Exact),
        )
        .unwrap();
    assert!(l.iter().all(|x| x.is_finite()));
    // TQ2_0: the f16 scale of block 5 (bytes 64..66 of each 66-byte block; at 256 inputs
    // each row of attn_k is one block, so block 5 is row 5's).
    let mut spec = SynthSpec::preset(Preset::Tiny);
    spec.layout = WeightLayout::Tq2_0;
    let vocab = synth::vocab_from_gguf_bytes(bitnet_testkit::TINY_VOCAB_GGUF).unwrap();
    let tq2 = synth::write(&spec, &vocab, Vec::new(), &mut |_, _| {}).unwrap();
    let tq2 = GgufFile::from_bytes(tq2, &Limits::default()).unwrap();
    Model::load(&tq2).unwrap();
    let bytes = rewrite(&tq2, |_, ts| {
        tensor(ts, "blk.0.attn_k.weight").data[5 * 66 + 64..5 * 66 + 66].copy_from_slice(&F16_NAN);
    })
    .unwrap();
    let e = Model::load(&GgufFile::from_bytes(bytes, &Limits::default()).unwrap()).unwrap_err();
    assert!(
        matches!(e, ModelError::NonFiniteScale { ref name, block: 5 } if name == "blk.0.attn_k.weight"),
        "{e}"
    );
}

/// One sequence's embedding.
fn embed(
    m: &Model<'_>,
    tokens: &[u32],
    cache: &mut bitnet_model::KvCache,
    pooling: Pooling,
    exec: &mut Exec<'_>,
) -> Result<Vec<Vec<f32>>, ModelError> {
    let mut seqs = [Seq {
        tokens,
        cache,
        outputs: Outputs::None,
    }];
    m.embed_seqs(&mut seqs, pooling, exec)
}

fn exec(pool: &bitnet_kernels::Pool, numerics: Numerics) -> Exec<'_> {
    Exec {
        backend: pool,
        numerics,
        trace: None,
        scratch: None,
    }
}

/// NaN in token 7's row of the tied embedding: logit 7 is NaN in every step, and a step
/// that reads the row refuses it. Both are errors (the logit's names the output entry), and
/// the cache keeps only what came before.
#[test]
fn non_finite_outputs_are_errors_and_leave_the_cache() {
    let bytes = rewrite(&base(), |_, ts| {
        let t = tensor(ts, "token_embd.weight");
        let w = usize::try_from(t.dims[0]).unwrap() * 2;
        for half in t.data[7 * w..8 * w].chunks_exact_mut(2) {
            half.copy_from_slice(&F16_NAN);
        }
    })
    .unwrap();
    let f = GgufFile::from_bytes(bytes, &Limits::default()).unwrap();
    let m = Model::load(&f).unwrap();
    let pool = bitnet_kernels::Pool::new(2);
    for numerics in [Numerics::Fast, Numerics::Exact] {
        let mut exec = exec(&pool, numerics);
        let mut cache = m.new_cache(16, KvType::F16, u64::MAX).unwrap();
        m.forward(&[1, 2], &mut cache, Outputs::None, &mut exec)
            .unwrap();
        let e = m
            .forward(&[3, 4], &mut cache, Outputs::All, &mut exec)
            .unwrap_err();
        assert!(
            matches!(
                e,
                ModelError::NonFiniteOutput {
                    what: "a logit",
                    row: 0,
                    index: 7
                }
            ),
            "{numerics:?}: {e}"
        );
        assert_eq!(cache.len(), 2, "{numerics:?}");
        let e = m
            .forward(&[5, 7, 6], &mut cache, Outputs::Last, &mut exec)
            .unwrap_err();
        assert!(
            matches!(e, ModelError::NonFiniteEmbedding { token: 7 }),
            "{numerics:?}: {e}"
        );
        assert_eq!(cache.len(), 2, "{numerics:?}");
        // A step without token 7 still computes logit 7 from its NaN head row.
        let l = m.forward(&[3], &mut cache, Outputs::Last, &mut exec);
        assert!(l.is_err(), "{numerics:?}: logit 7 is still NaN");
        let mut c2 = m.new_cache(16, KvType::F16, u64::MAX).unwrap();
        let e = embed(&m, &[1, 7, 2], &mut c2, Pooling::Mean, &mut exec).unwrap_err();
        assert!(
            matches!(e, ModelError::NonFiniteEmbedding { token: 7 }),
            "{numerics:?}: {e}"
        );
        assert_eq!(c2.len(), 0);
        let v = embed(&m, &[1, 3, 2], &mut c2, Pooling::Mean, &mut exec).unwrap();
        assert!(v[0].iter().all(|x| x.is_finite()));
    }
}

/// `src` with every element of its F32 norm `name` set to f32::MAX (finite, so it loads).
fn norm_at_max(src: &GgufFile, name: &str) -> GgufFile {
    let bytes = rewrite(src, |_, ts| {
        let t = tensor(ts, name);
        assert_eq!(t.type_id, 0, "an F32 norm");
        for v in t.data.chunks_exact_mut(4) {
            v.copy_from_slice(&f32::MAX.to_le_bytes());
        }
    })
    .unwrap();
    GgufFile::from_bytes(bytes, &Limits::default()).unwrap()
}

/// Finite weights whose arithmetic overflows (an output norm of f32::MAX): the logits and the
/// embedding are errors, not infinities.
#[test]
fn overflowing_outputs_are_errors() {
    let f = norm_at_max(&base(), "output_norm.weight");
    let m = Model::load(&f).unwrap();
    let pool = bitnet_kernels::Pool::new(1);
    for numerics in [Numerics::Fast, Numerics::Exact] {
        let mut exec = exec(&pool, numerics);
        let mut cache = m.new_cache(8, KvType::F16, u64::MAX).unwrap();
        let e = m
            .forward(&[1, 2, 3], &mut cache, Outputs::Last, &mut exec)
            .unwrap_err();
        assert!(
            matches!(
                e,
                ModelError::NonFiniteOutput {
                    what: "a logit",
                    row: 0,
                    ..
                }
            ),
            "{numerics:?}: {e}"
        );
        assert_eq!(cache.len(), 0);
        let e = embed(&m, &[1, 2, 3], &mut cache, Pooling::Last, &mut exec).unwrap_err();
        assert!(
            matches!(
                e,
                ModelError::NonFiniteOutput {
                    what: "a value",
                    row: 0,
                    ..
                }
            ),
            "{numerics:?}: {e}"
        );
        assert_eq!(cache.len(), 0);
    }
}

/// An overflow inside a block, not at the output: each F32 norm of block 0 of the generative
/// golden models (bitnet-b1.58 and 1bitLLM with sub-norms, llama and Falcon3 without) set to
/// f32::MAX makes infinities there, and the NaN that follows (∞ · 0, ∞ − ∞) reaches the next
/// activation quantization (and, with a quantized cache, K and V's). The model must refuse the
/// result rather than compute on with that row quantized to zeros (which gave finite, wrong
/// logits for a pre-norm).
#[test]
fn overflow_inside_a_block_is_an_error() {
    let pool = bitnet_kernels::Pool::new(1);
    let mut cases = Vec::new();
    for file in &bitnet_testdata::MODEL_FILES[..4] {
        let src = GgufFile::from_bytes(bitnet_testdata::read(file), &Limits::default()).unwrap();
        let norms: Vec<String> = src
            .tensors()
            .iter()
            .filter(|t| {
                t.name.starts_with("blk.0.") && t.name.contains("norm") && t.ggml_type.id() == 0
            })
            .map(|t| t.name.clone())
            .collect();
        for name in norms {
            cases.push((format!("{file}: {name}"), norm_at_max(&src, &name)));
        }
    }
    // attn_norm and ffn_norm in each; attn_sub_norm and ffn_sub_norm in two.
    assert_eq!(
        cases.len(),
        12,
        "{:?}",
        cases.iter().map(|c| &c.0).collect::<Vec<_>>()
    );
    for (name, f) in &cases {
        let m = Model::load(f).unwrap();
        let kinds = [Numerics::Fast, Numerics::Exact]
            .into_iter()
            .flat_map(|n| [KvType::F16, KvType::Q8_0, KvType::Q4_0].map(|k| (n, k)));
        for (numerics, kv) in kinds {
            let mut exec = exec(&pool, numerics);
            let mut cache = m.new_cache(8, kv, u64::MAX).unwrap();
            let r = m.forward(&[1, 2, 3], &mut cache, Outputs::Last, &mut exec);
            assert!(
                matches!(r, Err(ModelError::NonFiniteOutput { .. })),
                "{name}, {numerics:?}, {kv:?}: {:?}",
                r.map(|l| l[..4].to_vec())
            );
            assert_eq!(cache.len(), 0);
            let r = embed(&m, &[1, 2, 3], &mut cache, Pooling::Last, &mut exec);
            assert!(
                matches!(r, Err(ModelError::NonFiniteOutput { .. })),
                "{name}, {numerics:?}, {kv:?}: {:?}",
                r.map(|v| v[0][..4].to_vec())
            );
        }
    }
}

/// One random edit of a model file: a metadata value replaced by an extreme one (or by one
/// of another type), a key or a tensor removed, a dimension or a type changed, or NaN, ∞ or
/// a huge value written into a tensor's bytes. Returns what it did.
fn random_edit(r: &mut Xorshift, kv: &mut Vec<(String, Value)>, ts: &mut Vec<RawTensor>) -> String {
    match r.below(12) {
        0..=5 => {
            let scalars: Vec<usize> = (0..kv.len())
                .filter(|&i| !matches!(kv[i].1, Value::Array(_)))
                .collect();
            let i = r.pick(&scalars);
            let v = match (&kv[i].1, r.below(5)) {
                (Value::U32(_), 0..=3) => Value::U32(r.pick(&EXTREME_U32S)),
                (Value::F32(_), 0..=3) => Value::F32(r.pick(&EXTREME_F32S)),
                (Value::Bool(b), 0..=3) => Value::Bool(!b),
                (Value::String(_), 0..=3) => Value::String(
                    r.pick(&["", "llama", "bitnet", "qwen3", "gemma3", "x"])
                        .into(),
                ),
                _ => r.pick(&[Value::I32(-1), Value::U64(u64::MAX), Value::F32(f32::NAN)]),
            };
            let what = format!("{} = {v:?}", kv[i].0);
            kv[i].1 = v;
            what
        }
        6 => format!("remove key {}", kv.remove(r.below(kv.len())).0),
        7 => format!("remove tensor {}", ts.remove(r.below(ts.len())).name),
        8 => {
            let n = ts.len();
            let t = &mut ts[r.below(n)];
            let d = r.below(t.dims.len());
            let old = t.dims[d];
            t.dims[d] = r.pick(&[0, 1, 16, old / 2, old + 1, old * 2]);
            format!("{} dim {d}: {old} -> {}", t.name, t.dims[d])
        }
        9 => {
            let n = ts.len();
            let t = &mut ts[r.below(n)];
            t.type_id = r.pick(&[0, 1, 8, 30, 34, 35, 36, 39]);
            format!("{} type {}", t.name, t.type_id)
        }
        _ => {
            let n = ts.len();
            let t = &mut ts[r.below(n)];
            let bytes: Vec<u8> = r.pick(&[
                F16_NAN.to_vec(),
                vec![0x00, 0x7c],
                f32::NAN.to_le_bytes().to_vec(),
                f32::INFINITY.to_le_bytes().to_vec(),
                f32::MAX.to_le_bytes().to_vec(),
            ]);
            let at = r.below(t.data.len()) & !1;
            for (k, b) in bytes.iter().enumerate() {
                if let Some(x) = t.data.get_mut(at + k) {
                    *x = *b;
                }
            }
            format!("{} bytes {at}.. = {bytes:?}", t.name)
        }
    }
}

/// Loading and running an edited file, with both numerics: a typed error, or finite logits
/// and embeddings. `Ok(true)` when the file loaded.
fn load_and_run(bytes: Vec<u8>) -> Result<bool, String> {
    let Ok(f) = GgufFile::from_bytes(bytes, &Limits::default()) else {
        return Ok(false);
    };
    let Ok(m) = Model::load(&f) else {
        return Ok(false);
    };
    let pool = bitnet_kernels::Pool::new(2);
    for numerics in [Numerics::Fast, Numerics::Exact] {
        let mut exec = exec(&pool, numerics);
        let Ok(mut cache) = m.new_cache(16, KvType::F16, 1 << 30) else {
            return Ok(true);
        };
        for (tokens, outputs) in [(&[1, 2, 3][..], Outputs::All), (&[4][..], Outputs::Last)] {
            if let Ok(l) = m.forward(tokens, &mut cache, outputs, &mut exec) {
                if l.iter().any(|x| !x.is_finite()) {
                    return Err(format!("{numerics:?}: non-finite logits"));
                }
            }
        }
        cache.reset();
        let pooling = m.config.pooling.unwrap_or(Pooling::Mean);
        if let Ok(v) = embed(&m, &[1, 2, 5], &mut cache, pooling, &mut exec) {
            if v.iter().flatten().any(|x| !x.is_finite()) {
                return Err(format!("{numerics:?}: a non-finite embedding"));
            }
        }
    }
    Ok(true)
}

/// 300 random edits (one to three each) of the golden model files of every architecture:
/// each file loads and runs to a typed error or to finite outputs, never a panic.
#[test]
fn random_edits_are_typed_errors_or_finite_outputs() {
    let files = bitnet_testdata::MODEL_FILES;
    let parsed: Vec<GgufFile> = files
        .iter()
        .map(|f| GgufFile::from_bytes(bitnet_testdata::read(f), &Limits::default()).unwrap())
        .collect();
    for f in &parsed {
        Model::load(f).unwrap();
    }
    let mut r = Xorshift(0x9e37_79b9_7f4a_7c15);
    let mut loaded = 0;
    for i in 0..300 {
        let which = r.below(files.len());
        let mut edits = Vec::new();
        // The writer refuses a tensor whose bytes no longer fit its shape and type (the
        // reader's side of that is the gguf crate's).
        let Ok(bytes) = rewrite(&parsed[which], |kv, ts| {
            for _ in 0..=r.below(3) {
                edits.push(random_edit(&mut r, kv, ts));
            }
        }) else {
            continue;
        };
        let run = std::panic::catch_unwind(|| load_and_run(bytes));
        match run {
            Ok(Ok(ran)) => loaded += usize::from(ran),
            Ok(Err(e)) => panic!("edit {i} of {}: {e} after {edits:?}", files[which]),
            Err(_) => panic!("edit {i} of {}: a panic after {edits:?}", files[which]),
        }
    }
    // Most edits are refused at load; enough of the rest still run.
    eprintln!("{loaded} of 300 edited files loaded");
    assert!(loaded >= 30, "only {loaded} of 300 edited files loaded");
}
