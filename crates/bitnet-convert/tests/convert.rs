//! The converter end to end: Hugging Face directories (bf16 and packed, one file and shards)
//! against the same weights written directly as GGUF; layout round trips; the llama.cpp flavor;
//! hostile checkpoints.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use std::path::Path;

use bitnet_convert::{convert, ConvertError, Flavor, Options, Target};
use bitnet_gguf::{GgmlType, GgufFile, Limits, Value};
use bitnet_kernels::Pool;
use bitnet_model::{Exec, KvType, Model, Numerics, Outputs};
use bitnet_testkit::hf::{write_dir, HfWeights};
use bitnet_testkit::{synth, Preset, SynthSpec, WeightLayout};

fn tiny_spec(layout: WeightLayout) -> SynthSpec {
    let mut s = SynthSpec::preset(Preset::Tiny);
    s.layout = layout;
    s
}

fn vocab() -> Vec<(String, Value)> {
    synth::vocab_from_gguf_bytes(bitnet_testkit::TINY_VOCAB_GGUF).unwrap()
}

fn synth_bytes(spec: &SynthSpec) -> Vec<u8> {
    synth::write(spec, &vocab(), Vec::new(), &mut |_, _| {}).unwrap()
}

fn run(input: &Path, opts: &Options) -> Result<Vec<u8>, ConvertError> {
    convert(input, opts, Vec::new(), &mut |_| true).map(|(w, _)| w)
}

fn to(t: Target) -> Options {
    Options {
        to: Some(t),
        ..Options::default()
    }
}

fn parse(bytes: Vec<u8>) -> GgufFile {
    GgufFile::from_bytes(bytes, &Limits::default()).unwrap()
}

/// All-position logits of a fixed prompt, then four single steps.
fn logits(file: &GgufFile, numerics: Numerics) -> Vec<f32> {
    logits_of(file, numerics, false)
}

/// [`logits`], with every projection repacked into panels first when `repack`.
fn logits_of(file: &GgufFile, numerics: Numerics, repack: bool) -> Vec<f32> {
    let mut model = Model::load(file).unwrap();
    let pool = Pool::new(2);
    if repack {
        for layer in &mut model.layers {
            for m in layer.projections_mut() {
                assert!(m.repack_always(&pool).unwrap() > 0);
            }
        }
    }
    let mut exec = Exec {
        backend: &pool,
        numerics,
        trace: None,
        scratch: None,
    };
    let prompt = [4000u32, 17, 300, 1200, 5, 99, 2048, 7, 4100];
    let mut cache = model.new_cache(32, KvType::F16, u64::MAX).unwrap();
    let mut out = model
        .forward(&prompt, &mut cache, Outputs::All, &mut exec)
        .unwrap();
    for t in [11u32, 12, 13, 14] {
        out.extend(
            model
                .forward(&[t], &mut cache, Outputs::Last, &mut exec)
                .unwrap(),
        );
    }
    out
}

fn assert_bits_equal(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = a
        .iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
    {
        panic!("{what}: first difference at {i}: {} vs {}", a[i], b[i]);
    }
}

/// Same tensors (name, type, shape, bytes, in order) and bit-identical logits in both numerics.
fn assert_same_model(got: &GgufFile, expected: &GgufFile, what: &str) {
    assert_eq!(got.tensors().len(), expected.tensors().len(), "{what}");
    for (g, e) in got.tensors().iter().zip(expected.tensors()) {
        assert_eq!(
            (&g.name, g.ggml_type, &g.dims),
            (&e.name, e.ggml_type, &e.dims),
            "{what}"
        );
        assert!(
            got.tensor_data(g).unwrap() == expected.tensor_data(e).unwrap(),
            "{what}: {} differs",
            g.name
        );
    }
    for numerics in [Numerics::Exact, Numerics::Fast] {
        assert_bits_equal(
            &logits(got, numerics),
            &logits(expected, numerics),
            &format!("{what}, {numerics:?}"),
        );
    }
}

fn tensor_data<'a>(f: &'a GgufFile, name: &str) -> &'a [u8] {
    f.tensor_data(f.tensor(name).unwrap()).unwrap()
}

fn projections(f: &GgufFile) -> Vec<String> {
    f.tensors()
        .iter()
        .filter(|t| {
            matches!(
                t.ggml_type,
                GgmlType::I2S | GgmlType::TQ2_0 | GgmlType::TQ1_0
            )
        })
        .map(|t| t.name.clone())
        .collect()
}

#[test]
fn hf_checkpoints_give_the_same_logits_as_the_same_weights_written_directly() {
    let spec = tiny_spec(WeightLayout::I2S);
    for (weights, shards) in [
        (HfWeights::Bf16, 1),
        (HfWeights::Packed, 1),
        (HfWeights::Bf16, 3),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let expected = parse(write_dir(&spec, &vocab(), weights, shards, dir.path()).unwrap());
        let got = parse(run(dir.path(), &Options::default()).unwrap());
        let what = format!("{weights:?}, {shards} shard(s)");

        // Every tensor: same name, type, shape and bytes (I2_S tails hold β and zeros).
        assert_same_model(&got, &expected, &what);

        // Metadata: the official key set and order, the tokenizer round-tripped.
        let md = got.metadata();
        let keys: Vec<&str> = md.iter().map(|(k, _)| k).collect();
        let want: Vec<&str> = expected
            .metadata()
            .iter()
            .map(|(k, _)| k)
            .chain(["tokenizer.ggml.pre"])
            .filter(|k| *k != "general.quantization_version")
            .chain(["general.quantization_version"])
            .collect();
        assert_eq!(keys, want, "{what}");
        for key in [
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges",
            "tokenizer.ggml.scores",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.padding_token_id",
            "tokenizer.chat_template",
            "tokenizer.ggml.add_bos_token",
            "bitnet-b1.58.rope.freq_base",
            "bitnet-b1.58.attention.layer_norm_rms_epsilon",
        ] {
            assert_eq!(md.get(key), expected.metadata().get(key), "{what}: {key}");
        }
        assert_eq!(md.get_str("tokenizer.ggml.pre").unwrap(), "llama-bpe");
    }
}

#[test]
fn layout_round_trips_keep_every_ternary_code() {
    let i2s = synth_bytes(&tiny_spec(WeightLayout::I2S));
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    std::fs::write(p("i2s.gguf"), &i2s).unwrap();

    // I2_S → TQ2_0 → I2_S: the packed codes byte for byte; β rounded to f16 once.
    let tq2 = run(&p("i2s.gguf"), &to(Target::Tq2_0)).unwrap();
    std::fs::write(p("tq2.gguf"), &tq2).unwrap();
    let back = parse(run(&p("tq2.gguf"), &to(Target::I2S)).unwrap());
    let orig = parse(i2s.clone());
    for name in projections(&orig) {
        let (a, b) = (tensor_data(&orig, &name), tensor_data(&back, &name));
        let n4 = a.len() - 32;
        assert!(a[..n4] == b[..n4], "{name}: codes changed");
        let beta = f32::from_le_bytes(a[n4..n4 + 4].try_into().unwrap());
        let beta16 = half::f16::from_f32(beta).to_f32();
        assert_eq!(b[n4..n4 + 4], beta16.to_le_bytes(), "{name}: scale");
    }
    // I2_S → TQ2_0 gives the bytes the synthetic TQ2_0 writer gives (same values, β per block).
    let direct_tq2 = parse(synth_bytes(&tiny_spec(WeightLayout::Tq2_0)));
    let tq2f = parse(tq2.clone());
    for name in projections(&direct_tq2) {
        assert!(
            tensor_data(&tq2f, &name) == tensor_data(&direct_tq2, &name),
            "{name}"
        );
    }

    // TQ2_0 → I2_S → TQ2_0, TQ1_0 → I2_S → TQ1_0, TQ2_0 → TQ1_0 → TQ2_0: byte-identical.
    for (start, via) in [
        (WeightLayout::Tq2_0, Target::I2S),
        (WeightLayout::Tq1_0, Target::I2S),
        (WeightLayout::Tq2_0, Target::Tq1_0),
        (WeightLayout::Tq1_0, Target::Tq2_0),
    ] {
        let src = synth_bytes(&tiny_spec(start));
        std::fs::write(p("src.gguf"), &src).unwrap();
        let mid = run(&p("src.gguf"), &to(via)).unwrap();
        std::fs::write(p("mid.gguf"), &mid).unwrap();
        let back_to = if start == WeightLayout::Tq2_0 {
            Target::Tq2_0
        } else {
            Target::Tq1_0
        };
        let back = parse(run(&p("mid.gguf"), &to(back_to)).unwrap());
        let src = parse(src);
        for t in src.tensors() {
            assert!(
                src.tensor_data(t).unwrap() == tensor_data(&back, &t.name),
                "{start:?} via {via:?}: {}",
                t.name
            );
        }
        // And the logits of every layout agree where the scales agree: the values are the same.
        let mid = parse(mid);
        assert_eq!(
            mid.tensor(&projections(&mid)[0]).unwrap().ggml_type.id(),
            via.type_id()
        );
    }
}

/// A NaN or infinite scale in a ternary GGUF tensor (I2_S's β, a TQ2_0 or TQ1_0 block's d),
/// or NaN or infinity in a float tensor the conversion copies, is a typed error naming the
/// tensor, not a file that carries it on.
#[test]
fn non_finite_ternary_scales_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.gguf");
    for (layout, block_bytes, scale_at, bad, to_layout) in [
        (
            WeightLayout::I2S,
            0,
            0,
            f32::NAN.to_le_bytes().to_vec(),
            Target::Tq2_0,
        ),
        (WeightLayout::Tq2_0, 66, 64, vec![0x00, 0x7c], Target::I2S),
        (WeightLayout::Tq1_0, 54, 52, vec![0x00, 0x7e], Target::Tq2_0),
    ] {
        let src = parse(synth_bytes(&tiny_spec(layout)));
        let bytes = bitnet_testkit::rewrite(&src, |_, ts| {
            let t = ts
                .iter_mut()
                .find(|t| t.name == "blk.1.ffn_down.weight")
                .unwrap();
            // I2_S: β after the n/4 bytes of codes; blocks: block 3's scale.
            let at = if block_bytes == 0 {
                usize::try_from(t.dims[0] * t.dims[1] / 4).unwrap()
            } else {
                3 * block_bytes + scale_at
            };
            t.data[at..at + bad.len()].copy_from_slice(&bad);
        })
        .unwrap();
        std::fs::write(&path, bytes).unwrap();
        let e = run(&path, &to(to_layout)).unwrap_err();
        let want = if block_bytes == 0 { 0 } else { 3 };
        assert!(
            matches!(e, ConvertError::NonFinite { ref name, index } if name.starts_with("blk.1.ffn_down.weight") && index == want),
            "{layout:?}: {e}"
        );
    }
    // A copied float tensor: element 5 of the F16 embedding.
    let src = parse(synth_bytes(&tiny_spec(WeightLayout::I2S)));
    let bytes = bitnet_testkit::rewrite(&src, |_, ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.name == "token_embd.weight")
            .unwrap();
        assert_eq!(t.type_id, 1, "F16");
        t.data[10..12].copy_from_slice(&[0x00, 0xfc]);
    })
    .unwrap();
    std::fs::write(&path, bytes).unwrap();
    let e = run(&path, &to(Target::Tq2_0)).unwrap_err();
    assert!(
        matches!(e, ConvertError::NonFinite { ref name, index: 5 } if name == "token_embd.weight"),
        "{e}"
    );
    // A copied block tensor: the embedding as Q8_0, block 3's f16 scale NaN (its first
    // element is 96).
    let bytes = bitnet_testkit::rewrite(&src, |_, ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.name == "token_embd.weight")
            .unwrap();
        let x: Vec<f32> = t
            .data
            .chunks_exact(2)
            .map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f32())
            .collect();
        let ty = bitnet_kernels::RowType::Q8_0;
        let mut q = vec![0u8; ty.row_bytes(x.len()).unwrap()];
        bitnet_kernels::rows::quantize_row_into(ty, &x, &mut q);
        q[3 * 34..3 * 34 + 2].copy_from_slice(&[0x00, 0x7e]);
        t.type_id = 8;
        t.data = q;
    })
    .unwrap();
    std::fs::write(&path, bytes).unwrap();
    let e = run(&path, &to(Target::Tq2_0)).unwrap_err();
    assert!(
        matches!(e, ConvertError::NonFinite { ref name, index: 96 } if name == "token_embd.weight"),
        "{e}"
    );
}

/// The golden model (bitnet.cpp's I2_S) converted to TQ2_0 or TQ1_0 (β rounded to f16, one
/// scale per block) gives, in both numerics, the logits of the I2_S file converted back from
/// it (the same codes, β that f16 value) bit for bit: run from the file's blocks, and
/// repacked into the panels. Exact numerics on such a file are thus bitnet.cpp's on that
/// I2_S file.
#[test]
fn block_layouts_with_one_scale_give_the_i2s_files_logits_bit_for_bit() {
    let golden = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    let dir = tempfile::tempdir().unwrap();
    eprintln!("tier {}", bitnet_kernels::isa().name());
    for target in [Target::Tq2_0, Target::Tq1_0] {
        let out = dir.path().join(format!("{}.gguf", target.name()));
        std::fs::write(&out, run(&golden, &to(target)).unwrap()).unwrap();
        let tq = GgufFile::open(&out, &Limits::default()).unwrap();
        let i2s = parse(run(&out, &to(Target::I2S)).unwrap());
        for numerics in [Numerics::Fast, Numerics::Exact] {
            let want = logits(&i2s, numerics);
            for repack in [false, true] {
                let what = format!("{} {numerics:?} repacked {repack}", target.name());
                assert_bits_equal(&logits_of(&tq, numerics, repack), &want, &what);
            }
        }
    }
}

/// The golden model as TQ2_0 and TQ1_0 with block `i` of each matrix's scale `i mod 3` f16
/// steps larger (block scales that differ, inside rows and between them): repacked into the panels with
/// its scales kept apart, it gives the block kernels' logits bit for bit, in both numerics.
#[test]
fn block_layouts_with_differing_scales_are_repacked_bit_for_bit() {
    let golden = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    for (target, block, at) in [(Target::Tq2_0, 66, 64), (Target::Tq1_0, 54, 52)] {
        let mut bytes = run(&golden, &to(target)).unwrap();
        let one_scale = parse(bytes.clone());
        let base = usize::try_from(one_scale.data_offset()).unwrap();
        for name in projections(&one_scale) {
            let t = one_scale.tensor(&name).unwrap();
            let start = base + usize::try_from(t.offset).unwrap();
            let len = tensor_data(&one_scale, &name).len();
            for (i, blk) in bytes[start..start + len]
                .chunks_exact_mut(block)
                .enumerate()
            {
                let step = u16::try_from(i % 3).unwrap();
                let d = u16::from_le_bytes([blk[at], blk[at + 1]]) + step;
                blk[at..at + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
        let mixed = parse(bytes);
        for numerics in [Numerics::Fast, Numerics::Exact] {
            let want = logits(&mixed, numerics);
            let what = format!("{} {numerics:?}", target.name());
            assert_bits_equal(&logits_of(&mixed, numerics, true), &want, &what);
            // The scales did change the logits.
            assert_ne!(want, logits(&one_scale, numerics), "{what}");
        }
    }
}

#[test]
fn per_block_f16_scales_keep_the_fast_gates_on_the_golden_model() {
    // The golden model (bitnet.cpp's I2_S, per-tensor f32 β) converted to TQ2_0 and TQ1_0:
    // every β becomes an f16 per block. Fast numerics must stay within the golden gates.
    let golden = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    let dir = tempfile::tempdir().unwrap();
    for target in [Target::Tq2_0, Target::Tq1_0] {
        let out = dir.path().join(format!("{}.gguf", target.name()));
        std::fs::write(&out, run(&golden, &to(target)).unwrap()).unwrap();
        let file = GgufFile::open(&out, &Limits::default()).unwrap();
        let model = Model::load(&file).unwrap();
        let n_vocab = model.config.n_vocab;
        let pool = Pool::new(2);
        for stem in bitnet_testdata::PROMPTS {
            let meta: serde_json::Value =
                serde_json::from_slice(&bitnet_testdata::read(&format!("tiny/{stem}.tokens.json")))
                    .unwrap();
            let prompt: Vec<u32> = meta["prompt_tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let golden_all = bitnet_testdata::read_f32(&format!("tiny/{stem}.all_logits.f32"));
            let mut exec = Exec {
                backend: &pool,
                numerics: Numerics::Fast,
                trace: None,
                scratch: None,
            };
            let mut cache = model
                .new_cache(prompt.len(), KvType::F16, u64::MAX)
                .unwrap();
            let all = model
                .forward(&prompt, &mut cache, Outputs::All, &mut exec)
                .unwrap();
            let g = bitnet_testdata::compare_logits(&all, &golden_all, n_vocab, 0.08);
            eprintln!(
                "{} {stem}: max |Δ| {:.4}, min cos {:.6}",
                target.name(),
                g.max_abs,
                g.min_cos
            );
            assert!(g.max_abs <= 0.25, "{stem}: max |Δ| {}", g.max_abs);
            assert!(g.min_cos >= 0.995, "{stem}: cosine {}", g.min_cos);
            assert_eq!(g.top1_misses_above_margin, 0, "{stem}: top-1");
        }
    }
}

#[test]
fn llama_cpp_flavor_refuses_relu2_unless_allowed_and_stays_loadable_here() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    std::fs::write(&src, synth_bytes(&tiny_spec(WeightLayout::I2S))).unwrap();
    let mut opts = Options {
        flavor: Flavor::LlamaCpp,
        ..Options::default()
    };
    match run(&src, &opts) {
        Err(ConvertError::ActivationMismatch { model, upstream }) => {
            assert_eq!((model, upstream), ("ReLU²", "SiLU"));
        }
        other => panic!(
            "expected an activation mismatch, got {:?}",
            other.map(|b| b.len())
        ),
    }
    // I2_S is not an upstream type.
    opts.to = Some(Target::I2S);
    opts.allow_activation_mismatch = true;
    assert!(matches!(run(&src, &opts), Err(ConvertError::Options(_))));
    // Nor is a separate head: upstream's `bitnet` graph loads no output.weight.
    opts.to = None;
    opts.lm_head = Some(bitnet_kernels::RowType::Q8_0);
    assert!(matches!(run(&src, &opts), Err(ConvertError::Options(_))));
    opts.lm_head = None;

    opts.to = None;
    let up = parse(run(&src, &opts).unwrap());
    let md = up.metadata();
    assert_eq!(md.get_str("general.architecture").unwrap(), "bitnet");
    assert_eq!(md.get_uint("bitnet.block_count").unwrap(), 2);
    assert!(md.iter().all(|(k, _)| !k.starts_with("bitnet-b1.58.")));
    assert_eq!(md.get_str("bitnet.hidden_act").unwrap(), "relu2");
    assert_eq!(md.get_uint("general.file_type").unwrap(), 37);
    for name in projections(&up) {
        assert_eq!(up.tensor(&name).unwrap().ggml_type, GgmlType::TQ2_0);
    }
    // The tiny vocabulary carries LLaMA-3's control tokens: upstream gets its pre-tokenizer.
    assert_eq!(md.get_str("tokenizer.ggml.pre").unwrap(), "llama-bpe");
    // Our reader computes ReLU² from it: same logits as the native TQ2_0 conversion.
    let native = parse(run(&src, &to(Target::Tq2_0)).unwrap());
    assert_bits_equal(
        &logits(&up, Numerics::Fast),
        &logits(&native, Numerics::Fast),
        "llama.cpp flavor vs native TQ2_0",
    );

    // A SiLU model converts without the flag, and reads back as SiLU.
    let silu = bitnet_testkit::rewrite(
        &parse(synth_bytes(&tiny_spec(WeightLayout::I2S))),
        |kv, _| {
            kv.push((
                "bitnet-b1.58.hidden_act".into(),
                Value::String("silu".into()),
            ))
        },
    )
    .unwrap();
    std::fs::write(&src, &silu).unwrap();
    let up = parse(
        run(
            &src,
            &Options {
                flavor: Flavor::LlamaCpp,
                to: Some(Target::Tq1_0),
                ..Options::default()
            },
        )
        .unwrap(),
    );
    assert!(up.metadata().get("bitnet.hidden_act").is_none());
    let cfg = Model::load(&up).unwrap().config;
    assert_eq!(cfg.activation, bitnet_model::Activation::Silu);
}

#[test]
fn cancelling_stops_with_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    std::fs::write(&src, synth_bytes(&tiny_spec(WeightLayout::I2S))).unwrap();
    let mut calls = 0;
    let r = convert(&src, &to(Target::Tq2_0), Vec::new(), &mut |_| {
        calls += 1;
        calls < 3
    });
    assert!(matches!(r, Err(ConvertError::Cancelled)));
    assert_eq!(calls, 3);
}

// ---- hostile checkpoints -------------------------------------------------------------------

/// A valid bf16 directory to damage.
fn hf_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_dir(
        &tiny_spec(WeightLayout::I2S),
        &vocab(),
        HfWeights::Bf16,
        1,
        dir.path(),
    )
    .unwrap();
    dir
}

/// Replace model.safetensors by a hand-written file: header JSON + data.
fn write_raw_safetensors(dir: &Path, header: &str, data: &[u8], declared_len: Option<u64>) {
    let mut b = declared_len
        .unwrap_or(header.len() as u64)
        .to_le_bytes()
        .to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    std::fs::write(dir.join("model.safetensors"), b).unwrap();
}

#[test]
fn hostile_safetensors_are_typed_errors() {
    let dir = hf_dir();
    let d = dir.path();
    let opts = Options::default();
    let safetensors_err = |r: Result<Vec<u8>, ConvertError>, what: &str| match r {
        Err(ConvertError::Safetensors { .. }) => {}
        other => panic!(
            "{what}: expected a safetensors error, got {:?}",
            other.map(|b| b.len())
        ),
    };

    // Header length past the end of the file.
    write_raw_safetensors(d, "{}", &[], Some(1 << 40));
    safetensors_err(run(d, &opts), "huge header length");
    // Header length pointing inside the JSON.
    write_raw_safetensors(
        d,
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        &[0; 4],
        Some(5),
    );
    safetensors_err(run(d, &opts), "short header length");
    // Overlapping offsets.
    write_raw_safetensors(
        d,
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
        &[0; 12],
        None,
    );
    safetensors_err(run(d, &opts), "overlapping offsets");
    // Bytes that do not match dtype × shape.
    write_raw_safetensors(
        d,
        r#"{"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}}"#,
        &[0; 8],
        None,
    );
    safetensors_err(run(d, &opts), "dtype/shape mismatch");
    // Not JSON.
    write_raw_safetensors(d, "{nope", &[], None);
    safetensors_err(run(d, &opts), "bad JSON");

    // A valid file that lacks the model's tensors.
    write_raw_safetensors(
        d,
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        &[0; 4],
        None,
    );
    match run(d, &opts) {
        Err(ConvertError::MissingTensor(name)) => assert_eq!(name, "model.embed_tokens.weight"),
        other => panic!(
            "expected a missing tensor, got {:?}",
            other.map(|b| b.len())
        ),
    }
}

#[test]
fn wrong_shapes_dtypes_and_configs_are_typed_errors() {
    // A projection with the wrong shape: change the config's FFN width.
    let dir = hf_dir();
    let cfg_path = dir.path().join("config.json");
    let orig: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = orig.clone();
        f(&mut c);
        std::fs::write(&cfg_path, serde_json::to_string(&c).unwrap()).unwrap();
        run(dir.path(), &Options::default())
    };
    match with(&|c| c["intermediate_size"] = serde_json::json!(768)) {
        Err(ConvertError::Shape { name, .. }) => assert!(name.contains("layers.0"), "{name}"),
        other => panic!("expected a shape error, got {:?}", other.map(|b| b.len())),
    }
    for (key, value) in [
        ("hidden_act", serde_json::json!("gelu")),
        ("num_attention_heads", serde_json::json!(3)),
        ("hidden_size", serde_json::json!(0)),
        ("rms_norm_eps", serde_json::json!(-1.0)),
        ("architectures", serde_json::json!(["LlamaForCausalLM"])),
        (
            "rope_scaling",
            serde_json::json!({"type": "linear", "factor": 2.0}),
        ),
    ] {
        match with(&|c| c[key] = value.clone()) {
            Err(ConvertError::Config { .. }) => {}
            other => panic!(
                "{key}: expected a config error, got {:?}",
                other.map(|b| b.len())
            ),
        }
    }
    match with(&|c| {
        c.as_object_mut().unwrap().remove("vocab_size");
    }) {
        Err(ConvertError::Json { .. }) => {}
        other => panic!("expected a JSON error, got {:?}", other.map(|b| b.len())),
    }
    with(&|_| {}).unwrap();

    // A projection stored as I32: a dtype error naming it.
    let dir2 = tempfile::tempdir().unwrap();
    write_dir(
        &tiny_spec(WeightLayout::I2S),
        &vocab(),
        HfWeights::Packed,
        1,
        dir2.path(),
    )
    .unwrap();
    let st = dir2.path().join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    let mut h: serde_json::Value = serde_json::from_str(header).unwrap();
    let name = "model.layers.1.self_attn.q_proj.weight_scale";
    h[name]["dtype"] = serde_json::json!("I16");
    let new_header = serde_json::to_string(&h).unwrap();
    let mut out = (new_header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(new_header.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&st, out).unwrap();
    match run(dir2.path(), &Options::default()) {
        Err(ConvertError::Dtype { name: n, .. }) => assert_eq!(n, name),
        other => panic!("expected a dtype error, got {:?}", other.map(|b| b.len())),
    }

    // A shard index naming a missing shard, and a directory without a checkpoint.
    let dir3 = tempfile::tempdir().unwrap();
    write_dir(
        &tiny_spec(WeightLayout::I2S),
        &vocab(),
        HfWeights::Bf16,
        2,
        dir3.path(),
    )
    .unwrap();
    std::fs::remove_file(dir3.path().join("model-00002-of-00002.safetensors")).unwrap();
    assert!(matches!(
        run(dir3.path(), &Options::default()),
        Err(ConvertError::Io { .. })
    ));
    std::fs::write(
        dir3.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"x": "../../etc/passwd"}}"#,
    )
    .unwrap();
    assert!(matches!(
        run(dir3.path(), &Options::default()),
        Err(ConvertError::Index { .. })
    ));
    std::fs::remove_file(dir3.path().join("model.safetensors.index.json")).unwrap();
    assert!(matches!(
        run(dir3.path(), &Options::default()),
        Err(ConvertError::UnknownInput { .. })
    ));
}

#[test]
fn a_stored_quantized_head_gives_the_logits_of_the_head_built_at_load() {
    use bitnet_kernels::{RowMatrix, RowType};
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    std::fs::write(&src, synth_bytes(&tiny_spec(WeightLayout::I2S))).unwrap();
    let hf = tempfile::tempdir().unwrap();
    write_dir(
        &tiny_spec(WeightLayout::I2S),
        &vocab(),
        HfWeights::Bf16,
        1,
        hf.path(),
    )
    .unwrap();
    for ty in [RowType::Q8_0, RowType::Q6K, RowType::Q4_0] {
        let opts = Options {
            lm_head: Some(ty),
            ..Options::default()
        };
        for input in [src.as_path(), hf.path()] {
            let with_head = parse(run(input, &opts).unwrap());
            let t = with_head.tensor("output.weight").unwrap();
            assert_eq!(t.dims, [256, 4256]);
            // The same model without the stored head, its head built at load.
            let plain = parse(run(input, &Options::default()).unwrap());
            assert!(plain.tensor("output.weight").is_none());
            let mut model = Model::load(&plain).unwrap();
            let q = RowMatrix::quantize_from(model.lm_head(), ty, &Pool::new(2)).unwrap();
            model.set_lm_head(q);
            let stored = Model::load(&with_head).unwrap();
            assert_eq!(stored.lm_head().row_type(), ty);
            let run_model = |m: &Model<'_>| {
                let pool = Pool::new(2);
                let mut exec = Exec {
                    backend: &pool,
                    numerics: Numerics::Fast,
                    trace: None,
                    scratch: None,
                };
                let mut cache = m.new_cache(16, KvType::F16, u64::MAX).unwrap();
                m.forward(
                    &[4000, 17, 300, 1200, 5],
                    &mut cache,
                    Outputs::All,
                    &mut exec,
                )
                .unwrap()
            };
            assert_bits_equal(
                &run_model(&stored),
                &run_model(&model),
                &format!("{ty:?} from {}", input.display()),
            );
        }
    }
}

/// Ternary `LlamaForCausalLM` checkpoints (Llama3-8B-1.58's and Falcon3's form): the converter
/// writes architecture `llama` as bitnet.cpp's does (no sub-norms, the untied head, Q and K
/// rows permuted for normal RoPE, the pre-tokenizer named), tensor for tensor the GGUF the
/// same weights give written directly, with the same logits in both numerics.
#[test]
fn llama_checkpoints_convert_to_architecture_llama() {
    let mut llama = tiny_spec(WeightLayout::I2S);
    llama.arch = bitnet_testkit::SynthArch::Llama;
    (llama.n_head, llama.n_head_kv, llama.n_ff) = (4, 2, 768);
    let mut falcon3 = SynthSpec::preset(bitnet_testkit::Preset::Falcon3_1B);
    (falcon3.n_layer, falcon3.n_embd, falcon3.n_ff) = (2, 512, 768);
    (falcon3.n_head, falcon3.n_head_kv, falcon3.n_ctx) = (2, 1, 512);
    for (spec, weights, pre) in [
        (&llama, HfWeights::Packed, "llama-bpe"),
        (&llama, HfWeights::Bf16, "llama-bpe"),
        (&falcon3, HfWeights::Packed, "falcon3"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let expected = parse(write_dir(spec, &vocab(), weights, 1, dir.path()).unwrap());
        let got = parse(run(dir.path(), &Options::default()).unwrap());
        let what = format!("{} {weights:?}", spec.name);
        assert_same_model(&got, &expected, &what);
        assert!(got.tensor("output.weight").is_some(), "{what}");
        assert!(
            got.tensors().iter().all(|t| !t.name.contains("sub_norm")),
            "{what}"
        );
        let md = got.metadata();
        assert_eq!(
            md.get_str("general.architecture").unwrap(),
            "llama",
            "{what}"
        );
        assert_eq!(md.get_str("tokenizer.ggml.pre").unwrap(), pre, "{what}");
        for key in [
            "llama.rope.freq_base",
            "llama.attention.layer_norm_rms_epsilon",
            "llama.attention.head_count_kv",
            "llama.feed_forward_length",
        ] {
            assert_eq!(md.get(key), expected.metadata().get(key), "{what}: {key}");
        }
        assert!(md.get("llama.hidden_act").is_none(), "{what}");
    }
}

/// The permutation the converter applies to Q and K rows turns the checkpoint's rotation
/// (NEOX pairs i, i + d/2) into llama.cpp's normal RoPE (pairs 2i, 2i+1): normal RoPE of the
/// permuted rows is the permuted NEOX RoPE of the original rows, at every position.
#[test]
fn the_rope_permutation_pairs_the_checkpoints_dimensions() {
    use bitnet_convert::ternary::{Scale, Ternary};
    use bitnet_model::numerics::{rope_neox, rope_norm, rope_row};
    let (heads, d) = (3usize, 8usize);
    let rows: Vec<i8> = (0..heads * d)
        .map(|r| i8::try_from(r % 3).unwrap() - 1)
        .collect();
    let mut t = Ternary {
        values: rows.clone(),
        scale: Scale::Tensor(1.0),
    };
    t.permute_for_normal_rope("q", 1, heads).unwrap();
    let y: Vec<f32> = (0..heads * d).map(|i| (i as f32 * 0.37).sin()).collect();
    // y as the checkpoint's projection output; yp as the permuted projection's (row r of
    // the permuted matrix is the checkpoint's row perm[r]).
    let perm: Vec<usize> = (0..heads * d)
        .map(|r| {
            let (h, g) = (r / d, r % d);
            h * d + (g % 2) * (d / 2) + g / 2
        })
        .collect();
    for (r, &p) in perm.iter().enumerate() {
        assert_eq!(t.values[r], rows[p], "row {r}");
    }
    for pos in [0usize, 1, 7, 300] {
        let rope = rope_row(pos, d, 10_000.0);
        let mut a = y.clone();
        for h in a.chunks_exact_mut(d) {
            rope_neox(h, &rope, Numerics::Fast);
        }
        let mut b: Vec<f32> = perm.iter().map(|&p| y[p]).collect();
        for h in b.chunks_exact_mut(d) {
            rope_norm(h, &rope, Numerics::Fast);
        }
        let a_perm: Vec<f32> = perm.iter().map(|&p| a[p]).collect();
        assert_eq!(b, a_perm, "position {pos}");
    }
}

/// `--for llama.cpp` on an architecture `llama` file keeps it `llama` (upstream's own graph is
/// that block) in TQ2_0, names the LLaMA-3 pre-tokenizer, and still runs here.
#[test]
fn llama_cpp_flavor_keeps_a_llama_file_llama() {
    let src = bitnet_testdata::golden("llama-tiny/llama-tiny-i2_s.gguf");
    let opts = Options {
        flavor: Flavor::LlamaCpp,
        ..Options::default()
    };
    let up = parse(run(&src, &opts).unwrap());
    let md = up.metadata();
    assert_eq!(md.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(md.get_uint("llama.block_count").unwrap(), 2);
    assert!(md.iter().all(|(k, _)| !k.starts_with("bitnet.")));
    assert_eq!(md.get_str("tokenizer.ggml.pre").unwrap(), "llama-bpe");
    assert_eq!(
        up.tensor("blk.0.attn_q.weight").unwrap().ggml_type,
        GgmlType::TQ2_0
    );
    let config = bitnet_model::Config::from_metadata(md, None).unwrap();
    assert_eq!(config.activation, bitnet_model::Activation::Silu);
    assert!(logits(&up, Numerics::Fast).iter().all(|x| x.is_finite()));
}

/// A metadata value in the form of testdata/golden/make/gguf_digest.py: the GGUF type id, then
/// the value (an array: element type, length, SHA-256 of the elements as a GGUF file stores
/// them).
fn digest_value(v: &Value) -> serde_json::Value {
    use bitnet_gguf::Array;
    use serde_json::json;
    use sha2::{Digest, Sha256};
    fn bytes<T: Copy>(xs: &[T], le: impl Fn(T) -> Vec<u8>) -> Vec<u8> {
        xs.iter().flat_map(|&x| le(x)).collect()
    }
    let (ty, body) = match v {
        Value::U8(x) => (0, json!({ "num": x })),
        Value::I8(x) => (1, json!({ "num": x })),
        Value::U16(x) => (2, json!({ "num": x })),
        Value::I16(x) => (3, json!({ "num": x })),
        Value::U32(x) => (4, json!({ "num": x })),
        Value::I32(x) => (5, json!({ "num": x })),
        Value::F32(x) => (6, json!({ "num": f64::from(*x) })),
        Value::Bool(x) => (7, json!({ "bool": x })),
        Value::String(s) => (8, json!({ "str": s })),
        Value::U64(x) => (10, json!({ "num": x })),
        Value::I64(x) => (11, json!({ "num": x })),
        Value::F64(x) => (12, json!({ "num": x })),
        Value::Array(a) => {
            let (et, n, data) = match a {
                Array::U8(x) => (0, x.len(), x.clone()),
                Array::I32(x) => (5, x.len(), bytes(x, |v| v.to_le_bytes().to_vec())),
                Array::U32(x) => (4, x.len(), bytes(x, |v| v.to_le_bytes().to_vec())),
                Array::F32(x) => (6, x.len(), bytes(x, |v| v.to_le_bytes().to_vec())),
                Array::String(x) => (
                    8,
                    x.len(),
                    x.iter()
                        .flat_map(|s| {
                            let mut b = u64::try_from(s.len()).unwrap().to_le_bytes().to_vec();
                            b.extend_from_slice(s.as_bytes());
                            b
                        })
                        .collect(),
                ),
                other => panic!("no digest for {other:?}"),
            };
            let hex = Sha256::digest(&data)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>();
            (9, json!({ "array": et, "n": n, "sha256": hex }))
        }
    };
    let mut body = body;
    body["type"] = json!(ty);
    body
}

/// Every tensor of `got` has the type, dimensions and SHA-256 of its bytes (I2_S: the codes
/// and the scale) that a digest file made by make/gguf_digest.py records, and no other.
fn assert_tensors_match(got: &GgufFile, want: &serde_json::Value) {
    use sha2::{Digest, Sha256};
    let tensors = want.as_object().unwrap();
    assert_eq!(got.tensors().len(), tensors.len());
    for t in got.tensors() {
        let w = &tensors[&t.name];
        assert_eq!(w["type"], t.type_id, "{}", t.name);
        assert_eq!(w["ne"], serde_json::json!(t.dims), "{}", t.name);
        let data = tensor_data(got, &t.name);
        let n: u64 = t.dims.iter().product();
        let len = usize::try_from(match t.type_id {
            0 => 4 * n,
            1 => 2 * n,
            36 => n / 4 + 4,
            other => panic!("{}: type {other}", t.name),
        })
        .unwrap();
        let hex = Sha256::digest(&data[..len])
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>();
        assert_eq!(w["sha256"], hex, "{}", t.name);
    }
}

/// bitnet.cpp's own converter (`convert-hf-to-gguf-bitnet.py --outtype f32`, then its
/// `llama-quantize … I2_S 1`, as its setup_env.py runs them) on a packed LlamaForCausalLM
/// checkpoint with LLaMA-3's tokenizer, kept as a digest (testdata/golden/convert/
/// llama-packed.json, made by make/convert-llama.sh): `bitnet convert` of the same checkpoint
/// writes every key and every tensor of that file, byte for byte (I2_S: codes and scale). The
/// one recorded difference, bitnet.cpp's converter writing the special tokens' texts with the
/// BOS text in front, is checked against the reference's list with that prefix taken off.
#[test]
fn llama_conversion_equals_bitnet_cpps_converter() {
    let s =
        std::fs::read_to_string(bitnet_testdata::golden_str("convert/llama-packed.json")).unwrap();
    let want: serde_json::Value = serde_json::from_str(&s).unwrap();
    let vocab_file = GgufFile::open(
        Path::new(&bitnet_testdata::golden_str("tokenizer/llama3-vocab.gguf")),
        &Limits::default(),
    )
    .unwrap();
    let vocab = synth::vocab_from_gguf(&vocab_file).unwrap();
    let mut spec = SynthSpec::preset(Preset::Tiny);
    spec.arch = bitnet_testkit::SynthArch::Llama;
    spec.seed = 42;
    let tmp = tempfile::tempdir().unwrap();
    // The folder's name becomes general.name, as in the reference (`hf`).
    let dir = tmp.path().join("hf");
    std::fs::create_dir(&dir).unwrap();
    write_dir(&spec, &vocab, HfWeights::Packed, 1, &dir).unwrap();
    let got = parse(run(&dir, &Options::default()).unwrap());

    let known = want["known_differences"].as_object().unwrap();
    let mut keys = 0;
    for (key, value) in got.metadata().iter() {
        let mine = digest_value(value);
        if let Some(k) = known.get(key) {
            let theirs = &k["as_written"];
            assert_eq!(key, "tokenizer.ggml.tokens");
            assert_eq!(mine["n"], theirs["n"]);
            assert_ne!(
                mine["sha256"], theirs["sha256"],
                "the recorded difference is gone"
            );
            assert_eq!(mine["sha256"], theirs["sha256_prefix_removed"], "{key}");
        } else {
            assert_eq!(&mine, &want["kv"][key], "{key}");
        }
        keys += 1;
    }
    let n_want = want["kv"].as_object().unwrap().len() + known.len();
    assert_eq!(keys, n_want, "the same keys");

    assert_tensors_match(&got, &want["tensors"]);
}

/// 1bitLLM's `BitnetForCausalLM` (f16 master weights, SentencePiece `tokenizer.model`, tied
/// head): `bitnet convert` writes what bitnet.cpp's converter and its `llama-quantize … I2_S`
/// write (`testdata/golden/convert/1bitllm-f16.json`, made by `make/convert-1bitllm.sh`):
/// every key and every tensor's bytes.
#[test]
fn onebitllm_conversion_equals_bitnet_cpps_converter() {
    let s =
        std::fs::read_to_string(bitnet_testdata::golden_str("convert/1bitllm-f16.json")).unwrap();
    let want: serde_json::Value = serde_json::from_str(&s).unwrap();
    let vocab_file = GgufFile::open(
        Path::new(&bitnet_testdata::golden_str("tokenizer/spm-vocab.gguf")),
        &Limits::default(),
    )
    .unwrap();
    let vocab = synth::vocab_from_gguf(&vocab_file).unwrap();
    let mut spec = SynthSpec::preset(Preset::Tiny);
    spec.arch = bitnet_testkit::SynthArch::Bitnet;
    spec.n_head = 4;
    spec.n_head_kv = 4;
    spec.n_ff = 768;
    spec.seed = 42;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hf");
    std::fs::create_dir(&dir).unwrap();
    write_dir(&spec, &vocab, HfWeights::F16, 1, &dir).unwrap();
    let out = run(&dir, &Options::default()).unwrap();
    let got = parse(out);

    // The converted file runs as bitnet.cpp's fork runs its own conversion: exact numerics
    // give its logits bit for bit (one prompt; the graph's own goldens are 1bitllm-tiny's).
    let meta: serde_json::Value = serde_json::from_slice(&bitnet_testdata::read(
        "convert/1bitllm-f16.p1_english.tokens.json",
    ))
    .unwrap();
    let prompt: Vec<u32> = meta["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| u32::try_from(v.as_u64().unwrap()).unwrap())
        .collect();
    // The file's vocabulary tokenizes the prompt as the fork did.
    let tok = bitnet_tokenizer::Tokenizer::from_gguf(got.metadata(), None).unwrap();
    let text = String::from_utf8(bitnet_testdata::read("tiny/p1_english.txt")).unwrap();
    assert_eq!(tok.encode(&text, tok.add_bos(), false).unwrap(), prompt);
    let want_logits = bitnet_testdata::read_f32("convert/1bitllm-f16.p1_english.logits.f32");
    let model = bitnet_model::Model::load(&got).unwrap();
    let pool = bitnet_kernels::Pool::new(1);
    let mut exec = bitnet_model::Exec {
        backend: &pool,
        numerics: bitnet_model::Numerics::Exact,
        trace: None,
        scratch: None,
    };
    let mut cache = model
        .new_cache(prompt.len(), bitnet_model::KvType::F16, u64::MAX)
        .unwrap();
    let logits = model
        .forward(&prompt, &mut cache, bitnet_model::Outputs::Last, &mut exec)
        .unwrap();
    assert_eq!(logits.len(), want_logits.len());
    assert!(
        logits
            .iter()
            .zip(&want_logits)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "logits differ from bitnet.cpp's"
    );

    let mut keys = 0;
    for (key, value) in got.metadata().iter() {
        assert_eq!(&digest_value(value), &want["kv"][key], "{key}");
        keys += 1;
    }
    assert_eq!(keys, want["kv"].as_object().unwrap().len(), "the same keys");
    assert_tensors_match(&got, &want["tensors"]);
}

/// bitnet.cpp's embedding models: `bitnet convert` of the synthetic `qwen3` and `gemma3_text`
/// checkpoints in testdata/golden/embed (`make/embed_hf.py build`) writes, byte for byte, the
/// file bitnet.cpp's own `convert-bitnet-embedding-to-gguf.py --outtype i2_s` wrote from them
/// (`make/embed-convert.sh`): keys and their order, tokenizer, tensor order, F16 norms with
/// Gemma's +1, each projection's ternarization and scale.
#[test]
fn embedding_conversion_equals_bitnet_cpps_converter() {
    for arch in ["qwen3", "gemma3"] {
        let config = bitnet_testdata::golden(&format!("embed/hf-{arch}/config.json"));
        let dir = config.parent().unwrap();
        let got = run(dir, &Options::default()).unwrap();
        let want = bitnet_testdata::read(&format!("embed/{arch}-converted.gguf"));
        assert_eq!(got.len(), want.len(), "{arch}: size");
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            panic!("{arch}: the files differ from byte {i}");
        }
        // Another target is refused with the reason.
        let e = run(dir, &to(Target::Tq2_0)).unwrap_err();
        assert!(e.to_string().contains("I2_S"), "{e}");
    }
}

/// The trained model (testdata/trained): `make-refs.sh` ran bitnet.cpp's own converter for
/// this architecture on the checkpoint in `hf/` (`convert-helper-bitnet.py`'s steps:
/// `preprocess-huggingface-bitnet.py`, `convert-ms-to-gguf-bitnet.py --outtype f32`,
/// `llama-quantize … I2_S 1`) and kept its file. `bitnet convert --for bitnet.cpp` of the same
/// checkpoint writes that file byte for byte, except the 28 bytes after each I2_S scale that
/// llama-quantize leaves uninitialized (bitnet-rs writes zeros there); the default flavor writes
/// the same tensors under the official file's metadata (architecture `bitnet-b1.58`, the
/// folder's name, no chat template, scores 0).
#[test]
fn the_trained_checkpoint_converts_as_bitnet_cpps_converter_converts_it() {
    let want = std::fs::read(bitnet_testdata::trained("kjv-i2_s.gguf")).unwrap();
    let hf = bitnet_testdata::trained("hf/config.json");
    let hf = hf.parent().unwrap();
    let opts = Options {
        flavor: Flavor::BitnetCpp,
        ..Options::default()
    };
    let got = run(hf, &opts).unwrap();
    assert_eq!(got.len(), want.len(), "file sizes");
    let f = parse(want.clone());
    // The uninitialized bytes: the last 28 of each I2_S tensor's data (codes, f32 scale, 28).
    let mut loose = vec![false; want.len()];
    for t in f.tensors() {
        if t.ggml_type == GgmlType::I2S {
            let end = usize::try_from(f.data_offset() + t.offset + t.nbytes().unwrap()).unwrap();
            loose[end - 28..end].fill(true);
        }
    }
    let differ: Vec<usize> = (0..want.len())
        .filter(|&i| got[i] != want[i] && !loose[i])
        .collect();
    assert!(
        differ.is_empty(),
        "{} bytes differ from bitnet.cpp's file outside the uninitialized ones, the first at {}",
        differ.len(),
        differ[0]
    );
    assert!(loose.iter().any(|&l| l), "the file has I2_S tensors");

    // The default flavor: the same tensors, the official file's metadata.
    let native = parse(run(hf, &Options::default()).unwrap());
    let theirs = parse(got);
    for t in theirs.tensors() {
        let a = tensor_data(&theirs, &t.name);
        let b = tensor_data(&native, &t.name);
        assert_eq!(a, b, "{}", t.name);
    }
    let md = native.metadata();
    assert_eq!(
        md.get("general.architecture").and_then(Value::as_str),
        Some("bitnet-b1.58")
    );
    assert_eq!(md.get("general.name").and_then(Value::as_str), Some("hf"));
    assert!(md.get("tokenizer.chat_template").is_none());
    let their_md = theirs.metadata();
    assert_eq!(
        their_md.get("general.architecture").and_then(Value::as_str),
        Some("bitnet-25")
    );
    assert_eq!(
        their_md.get("general.name").and_then(Value::as_str),
        Some("trained"),
        "the name of the folder holding the checkpoint's folder"
    );
}

#[test]
fn the_bitnet_cpp_flavor_is_refused_where_that_converter_writes_nothing() {
    // A GGUF input, and a checkpoint asked for another layout or a separate head.
    let tiny = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    let hf = bitnet_testdata::trained("hf/config.json");
    let hf = hf.parent().unwrap();
    for (input, to, head) in [
        (tiny.as_path(), None, None),
        (hf, Some(Target::Tq2_0), None),
        (hf, None, Some(bitnet_kernels::RowType::Q8_0)),
    ] {
        let e = run(
            input,
            &Options {
                flavor: Flavor::BitnetCpp,
                to,
                lm_head: head,
                ..Options::default()
            },
        )
        .unwrap_err();
        assert!(matches!(e, ConvertError::Options(_)), "{e}");
    }
}
