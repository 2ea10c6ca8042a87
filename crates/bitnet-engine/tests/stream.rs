//! A model streamed onto the GPU as its bytes arrive ([`GpuStream`]) against the same file
//! loaded whole onto the GPU: the same logits bit for bit and the same greedy text, for
//! pieces of any size; what the stream refuses (bytes past the file's size, a file cut
//! short, a broken header, exact numerics) is a typed error.
//! Needs a GPU adapter (CI installs Mesa's software Vulkan driver); without one it fails
//! unless `BITNET_GPU_TESTS=skip`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bitnet_engine::{load, Device, Engine, EngineError, Event, GenParams, GpuStream, LoadOptions};
use bitnet_model::{Numerics, Outputs};
use bitnet_sampling::SamplerParams;

fn have_gpu() -> bool {
    bitnet_gpu::probe::gpu_tests_enabled()
}

fn opts() -> LoadOptions {
    LoadOptions {
        device: Device::Gpu,
        ..LoadOptions::default()
    }
}

fn tiny_bytes() -> Vec<u8> {
    std::fs::read(bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf")).unwrap()
}

/// `bytes` streamed in pieces of the sizes `sizes` gives (cycled).
fn streamed(bytes: &[u8], sizes: &[usize], opts: &LoadOptions) -> bitnet_engine::Result<Engine> {
    let mut s = bitnet_gpu::block(GpuStream::new_async(bytes.len() as u64, opts))??;
    let mut at = 0;
    for &n in sizes.iter().cycle() {
        if at == bytes.len() {
            break;
        }
        let e = (at + n).min(bytes.len());
        s.push(&bytes[at..e])?;
        at = e;
        assert_eq!(s.received(), at as u64);
    }
    s.finish()
}

fn logits(e: &Engine, prompt: &[u32]) -> Vec<f32> {
    let mut s = e.new_session(64).unwrap();
    e.eval(&mut s, prompt, Outputs::All).unwrap()
}

fn greedy(e: &Engine, prompt: &[u32]) -> Vec<u32> {
    let mut s = e.new_session(64).unwrap();
    let mut ids = Vec::new();
    let params = GenParams {
        max_tokens: 16,
        sampler: SamplerParams::greedy(),
        ..GenParams::default()
    };
    e.generate(&mut s, prompt, false, &params, &mut |ev| {
        if let Event::Token(t) = ev {
            ids.push(t);
        }
        true
    })
    .unwrap();
    ids
}

#[test]
fn a_streamed_model_computes_what_the_whole_file_computes() {
    if !have_gpu() {
        return;
    }
    let bytes = tiny_bytes();
    let path = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    let whole = load(&path, &opts(), &mut |_| {}).unwrap();
    let prompt = whole
        .tokenizer
        .encode("The quick brown fox", true, false)
        .unwrap();
    let want = logits(&whole, &prompt);
    let want_ids = greedy(&whole, &prompt);
    assert!(!want_ids.is_empty());
    // One piece; pieces of 1 MiB (the header and several blocks in one); odd sizes that
    // split the header, words and tensors anywhere.
    for sizes in [
        &[bytes.len()][..],
        &[1 << 20],
        &[1, 7, 4093, 65_537, 3, 100_003],
    ] {
        let e = streamed(&bytes, sizes, &opts()).unwrap();
        assert!(e.gpu().is_some());
        assert_eq!(e.config().n_vocab, whole.config().n_vocab);
        assert_eq!(e.file_size(), bytes.len() as u64);
        assert_eq!(logits(&e, &prompt), want, "pieces {sizes:?}");
        assert_eq!(greedy(&e, &prompt), want_ids, "pieces {sizes:?}");
        // The weights are on the GPU only.
        assert!(matches!(e.model(), Err(EngineError::WeightsOnDevice)));
        assert!(e.file().is_err());
    }
}

#[test]
fn a_stream_refuses_what_it_cannot_load() {
    if !have_gpu() {
        return;
    }
    let bytes = tiny_bytes();
    let n = bytes.len();
    // Bytes past the declared size.
    let mut s = bitnet_gpu::block(GpuStream::new_async(n as u64 - 1, &opts()))
        .unwrap()
        .unwrap();
    assert!(s.push(&bytes).is_err());
    // After an error the loader is spent.
    assert!(s.push(&bytes[..1]).is_err());
    // A file cut short: finish says how much came.
    let mut s = bitnet_gpu::block(GpuStream::new_async(n as u64, &opts()))
        .unwrap()
        .unwrap();
    s.push(&bytes[..n - 10]).unwrap();
    let e = s.finish().unwrap_err();
    assert!(e.to_string().contains("ended after"), "{e}");
    // A broken header: an error as soon as the bytes show it.
    let mut bad = bytes.clone();
    bad[..4].copy_from_slice(b"GGUX");
    let e = streamed(&bad, &[1 << 20], &opts()).unwrap_err();
    assert!(e.to_string().contains("magic"), "{e}");
    // Bytes after the last tensor (as a whole file may have them): the model loads.
    let mut longer = bytes.clone();
    longer.extend_from_slice(&[0xAB; 100]);
    streamed(&longer, &[4096], &opts()).unwrap();
    // What the GPU does not run, refused before anything is read.
    let exact = LoadOptions {
        numerics: Numerics::Exact,
        ..opts()
    };
    let e = bitnet_gpu::block(GpuStream::new_async(n as u64, &exact))
        .unwrap()
        .unwrap_err();
    assert!(e.to_string().contains("exact"), "{e}");
}

/// Rows of the embedding table holding NaN (all of token 7's) or infinity (the last value of
/// token 4000's), streamed in pieces that split values: the rows are found on the way to the
/// GPU, so a step with either token is refused before the device looks it up, as the CPU
/// refuses it; logits holding the NaN are refused too.
#[test]
fn non_finite_embedding_rows_are_found_as_they_stream() {
    if !have_gpu() {
        return;
    }
    let f =
        bitnet_gguf::GgufFile::from_bytes(tiny_bytes(), &bitnet_gguf::Limits::default()).unwrap();
    let bytes = bitnet_testkit::rewrite(&f, |_, ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.name == "token_embd.weight")
            .unwrap();
        assert_eq!(t.type_id, 1, "F16");
        let w = usize::try_from(t.dims[0]).unwrap() * 2;
        for half in t.data[7 * w..8 * w].chunks_exact_mut(2) {
            half.copy_from_slice(&[0x00, 0x7e]);
        }
        t.data[4001 * w - 2..4001 * w].copy_from_slice(&[0x00, 0x7c]);
    })
    .unwrap();
    let e = streamed(&bytes, &[1, 3, 4097, 333], &opts()).unwrap();
    let mut s = e.new_session(16).unwrap();
    for (tokens, token) in [(&[5, 7, 6][..], 7), (&[5, 4000][..], 4000)] {
        let err = e.eval(&mut s, tokens, Outputs::Last).unwrap_err();
        assert!(
            matches!(err, EngineError::Model(bitnet_model::ModelError::NonFiniteEmbedding { token: t }) if t == token),
            "{err}"
        );
        let err = e.eval_greedy(&mut s, tokens).unwrap_err();
        assert!(
            matches!(err, EngineError::Model(bitnet_model::ModelError::NonFiniteEmbedding { token: t }) if t == token),
            "{err}"
        );
        assert!(s.tokens().is_empty());
    }
    let err = e.eval(&mut s, &[1, 2], Outputs::Last).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Model(bitnet_model::ModelError::NonFiniteOutput { index: 7, .. })
        ),
        "{err}"
    );
}
