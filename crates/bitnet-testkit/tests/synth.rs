#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use bitnet_gguf::{GgufFile, Limits};
use bitnet_kernels::Pool;
use bitnet_model::{Exec, KvType, Model, Numerics, Outputs};
use bitnet_testkit::{synth, Preset, SynthArch, SynthSpec, WeightLayout};

fn write(spec: &SynthSpec) -> Vec<u8> {
    let vocab = synth::vocab_from_gguf_bytes(bitnet_testkit::TINY_VOCAB_GGUF).unwrap();
    synth::write(spec, &vocab, Vec::new(), &mut |_, _| {}).unwrap()
}

fn tiny(layout: WeightLayout) -> SynthSpec {
    let mut s = SynthSpec::preset(Preset::Tiny);
    s.layout = layout;
    s
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let a = write(&tiny(WeightLayout::I2S));
    let b = write(&tiny(WeightLayout::I2S));
    assert_eq!(a, b);
    let mut s = tiny(WeightLayout::I2S);
    s.seed = 7;
    assert_ne!(a, write(&s));
}

/// The tiny preset has the tiny golden model's structure: the same keys in the same order,
/// and the tensor table of testdata/golden/tiny/TENSORS.md (names, types, ne, data-relative
/// offsets and byte sizes).
#[test]
fn tiny_preset_matches_golden_structure() {
    let f = GgufFile::from_bytes(write(&tiny(WeightLayout::I2S)), &Limits::default()).unwrap();
    let golden = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    let g = GgufFile::open(&golden, &Limits::default()).unwrap();
    let keys = |f: &GgufFile| {
        f.metadata()
            .iter()
            .map(|(k, _)| k.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(&f), keys(&g));
    assert_eq!(f.tensors().len(), 24);
    // From testdata/golden/tiny/TENSORS.md: (name, type, ne, bytes, offset) of a few rows, and the totals.
    let expect = [
        (
            "token_embd.weight",
            "F16",
            vec![256u64, 4256],
            2_179_072u64,
            0u64,
        ),
        (
            "blk.0.attn_q.weight",
            "I2_S",
            vec![256, 256],
            16416,
            2_180_096,
        ),
        (
            "blk.0.attn_k.weight",
            "I2_S",
            vec![256, 128],
            8224,
            2_196_512,
        ),
        (
            "blk.0.ffn_down.weight",
            "I2_S",
            vec![512, 256],
            32800,
            2_297_024,
        ),
        (
            "blk.1.ffn_sub_norm.weight",
            "F32",
            vec![512],
            2048,
            2_482_624,
        ),
        ("output_norm.weight", "F32", vec![256], 1024, 2_484_672),
    ];
    for (name, ty, dims, bytes, offset) in expect {
        let t = f.tensor(name).unwrap();
        assert_eq!(
            (t.ggml_type.name(), &t.dims, t.nbytes(), t.offset),
            (ty, &dims, Some(bytes), offset),
            "{name}"
        );
    }
    for (a, b) in f.tensors().iter().zip(g.tensors()) {
        assert_eq!(
            (&a.name, a.ggml_type, &a.dims, a.offset),
            (&b.name, b.ggml_type, &b.dims, b.offset)
        );
    }
}

fn last_logits(bytes: Vec<u8>) -> Vec<f32> {
    let f = GgufFile::from_bytes(bytes, &Limits::default()).unwrap();
    let model = Model::load(&f).unwrap();
    let pool = Pool::new(1);
    let mut exec = Exec {
        backend: &pool,
        numerics: Numerics::Fast,
        trace: None,
        scratch: None,
    };
    let mut cache = model.new_cache(16, KvType::F32, u64::MAX).unwrap();
    model
        .forward(&[4000, 791, 934, 875], &mut cache, Outputs::Last, &mut exec)
        .unwrap()
}

/// Every layout writes a model that loads and runs; layouts holding the same ternary values
/// agree with I2_S up to the scale's storage precision (f16 scales in TQ2_0, TQ1_0,
/// BitNet32F16), and Split32, whose sibling holds I2_S's f32 scale in every block, gives its
/// logits bit for bit (a row with one scale takes I2_S's float steps).
#[test]
fn every_layout_loads_and_runs() {
    let reference = last_logits(write(&tiny(WeightLayout::I2S)));
    for layout in [
        WeightLayout::Tq2_0,
        WeightLayout::Tq1_0,
        WeightLayout::BitNet32F16,
        WeightLayout::Split32WithSibling,
        WeightLayout::Qk256,
    ] {
        let logits = last_logits(write(&tiny(layout)));
        assert_eq!(logits.len(), reference.len());
        assert!(logits.iter().all(|x| x.is_finite()), "{layout:?}");
        if layout != WeightLayout::Qk256 {
            let max = logits
                .iter()
                .zip(&reference)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(max < 0.05, "{layout:?}: max |Δ| {max} vs I2_S");
        }
        if layout == WeightLayout::Split32WithSibling {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&logits), bits(&reference), "{layout:?} vs I2_S");
        }
    }
}

/// `--arch llama` in I2_S writes, tensor for tensor, what bitnet.cpp's llama-quantize made of
/// the same model's F32 file (testdata/golden/llama-tiny): the same names, types, shapes and
/// bytes (I2_S codes and scale, F16 embedding and head, F32 norms). The 28 bytes after an
/// I2_S scale are padding that llama-quantize leaves uninitialized: not compared.
#[test]
fn llama_preset_in_i2s_equals_bitnet_cpp_quantizing_its_f32_file() {
    let mut spec = tiny(WeightLayout::I2S);
    spec.arch = SynthArch::Llama;
    (spec.n_head, spec.n_head_kv, spec.n_ff) = (4, 2, 768);
    let ours = GgufFile::from_bytes(write(&spec), &Limits::default()).unwrap();
    let theirs = GgufFile::open(
        &bitnet_testdata::golden("llama-tiny/llama-tiny-i2_s.gguf"),
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(
        ours.metadata().get_str("general.architecture").unwrap(),
        "llama"
    );
    let names = |f: &GgufFile| {
        let mut v: Vec<String> = f.tensors().iter().map(|t| t.name.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&ours), names(&theirs));
    for t in theirs.tensors() {
        let o = ours.tensor(&t.name).unwrap();
        assert_eq!((o.type_id, &o.dims), (t.type_id, &t.dims), "{}", t.name);
        let (a, b) = (ours.tensor_data(o).unwrap(), theirs.tensor_data(t).unwrap());
        assert_eq!(a.len(), b.len(), "{}", t.name);
        let meaningful = if t.type_id == 36 {
            let n: u64 = t.dims.iter().product();
            usize::try_from(n / 4 + 4).unwrap()
        } else {
            b.len()
        };
        assert!(
            a[..meaningful] == b[..meaningful],
            "{}: bytes differ",
            t.name
        );
    }
}
