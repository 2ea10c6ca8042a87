//! bitnet.cpp's embedding graphs (`qwen3` and `gemma3` with an input norm per projection,
//! per-head Q/K norms, last-token pooling; Gemma 3's post-norms, GELU and scaled embeddings)
//! against an independent reference: the numpy oracle `testdata/golden/make/embed_ref.py`,
//! written from bitnet.cpp's guide and converter, whose vectors `make/embed.sh` keeps in
//! `testdata/golden/embed` for two synthetic models: cosine ≥ 0.9999 per vector with fast
//! numerics; with exact numerics the vectors of the oracle's exact variant, bit for bit, in a
//! batch of inputs or alone, on 1 and 2 threads.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use bitnet_engine::{load, EmbedOptions, Engine, EngineError, LoadOptions};
use bitnet_model::{Numerics, Pooling};
use bitnet_testdata::ids;
use bitnet_testkit::{synth, Preset, SynthArch, SynthSpec};

struct Golden {
    prompts: Vec<(String, Vec<u32>)>,
    vectors: Vec<Vec<f32>>,
}

/// The synthetic model `name` as make/embed.sh writes it (its `bitnet synth` arguments), checked
/// against the SHA-256 the goldens were made from.
fn model(name: &str) -> PathBuf {
    let mut spec = SynthSpec::preset(Preset::Tiny);
    spec.seed = 7;
    match name {
        "qwen3-tiny" => {
            spec.arch = SynthArch::Qwen3;
            (spec.n_head, spec.n_head_kv, spec.head_dim) = (4, 2, Some(128));
            spec.pre = Some("qwen2".into());
        }
        "gemma3-tiny" => {
            spec.arch = SynthArch::Gemma3;
            (spec.n_head, spec.n_head_kv, spec.head_dim) = (2, 1, Some(256));
        }
        _ => panic!("{name}"),
    }
    let vocab = synth::vocab_from_gguf_bytes(bitnet_testkit::TINY_VOCAB_GGUF).unwrap();
    let bytes = synth::write(&spec, &vocab, Vec::new(), &mut |_, _| {}).unwrap();
    let meta: serde_json::Value =
        serde_json::from_slice(&bitnet_testdata::read(&format!("embed/{name}.json"))).unwrap();
    use sha2::{Digest, Sha256};
    let sha: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        meta["file_sha256"], sha,
        "{name}: the synthetic file is not the one the goldens were made from (remake them \
         with testdata/golden/make/embed.sh)"
    );
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("embed-{name}.gguf"));
    std::fs::write(&path, &bytes).unwrap();
    path
}

fn golden(name: &str) -> Golden {
    let meta: serde_json::Value =
        serde_json::from_slice(&bitnet_testdata::read(&format!("embed/{name}.json"))).unwrap();
    let mut g = Golden {
        prompts: Vec::new(),
        vectors: Vec::new(),
    };
    for p in meta["prompts"].as_array().unwrap() {
        let key = p["name"].as_str().unwrap().to_string();
        let ids = p["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| u32::try_from(v.as_u64().unwrap()).unwrap())
            .collect();
        g.vectors.push(bitnet_testdata::read_f32(&format!(
            "embed/{name}.{key}.embd.f32"
        )));
        g.prompts.push((key, ids));
    }
    assert_eq!(g.prompts.len(), 4);
    g
}

fn engine(path: &std::path::Path, numerics: Numerics, threads: usize) -> Engine {
    let opts = LoadOptions {
        numerics,
        threads,
        ..LoadOptions::default()
    };
    load(path, &opts, &mut |_| {}).unwrap()
}

fn check(name: &str) {
    let path = model(name);
    let g = golden(name);
    let inputs: Vec<Vec<u32>> = g.prompts.iter().map(|(_, ids)| ids.clone()).collect();
    for numerics in [Numerics::Fast, Numerics::Exact] {
        for threads in [1, 2] {
            let e = engine(&path, numerics, threads);
            assert_eq!(e.pooling(&EmbedOptions::default()), Pooling::Last);
            // All four inputs in one pass, then one at a time.
            let batched = e.embed(&inputs, &EmbedOptions::default()).unwrap();
            for (i, ((key, _), want)) in g.prompts.iter().zip(&g.vectors).enumerate() {
                let got = &batched[i];
                assert_eq!(got.len(), want.len(), "{name} {key}");
                let cos = bitnet_testdata::cosine(got, want);
                eprintln!("{name} {numerics:?} {threads}t {key}: cosine {cos:.7}");
                // The oracle's default variant computes in f32 with f16 K/V; exact numerics
                // also round where bitnet.cpp's kernels do (Q and P to f16 in attention),
                // which int8 activation quantization amplifies a little. Its exact variant
                // follows those paths: bit for bit.
                let gate = if numerics == Numerics::Fast {
                    0.9999
                } else {
                    0.999
                };
                assert!(cos >= gate, "{name} {numerics:?} {key}: cosine {cos}");
                if numerics == Numerics::Exact {
                    let exact =
                        bitnet_testdata::read_f32(&format!("embed/{name}.{key}.exact.embd.f32"));
                    let diff = bitnet_testdata::first_bit_difference(got, &exact);
                    assert!(diff.is_none(), "{name} {key}: exact differs at {diff:?}");
                }
                let norm: f64 = got.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
                assert!((norm - 1.0).abs() < 1e-5, "{name} {key}: |v|² {norm}");
                let alone = e
                    .embed(std::slice::from_ref(&inputs[i]), &EmbedOptions::default())
                    .unwrap();
                if numerics == Numerics::Exact {
                    assert!(
                        alone[0]
                            .iter()
                            .zip(got)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{name} {key}: a batch of inputs changes exact numerics"
                    );
                } else {
                    assert!(
                        bitnet_testdata::cosine(&alone[0], got) > 0.99999,
                        "{name} {key}"
                    );
                }
            }
        }
    }
}

#[test]
fn qwen3_embeddings_match_the_oracle() {
    check("qwen3-tiny");
}

#[test]
fn gemma3_embeddings_match_the_oracle() {
    check("gemma3-tiny");
}

/// Other poolings, raw vectors, and inputs the engine refuses.
#[test]
fn pooling_options_and_bad_inputs() {
    let path = model("qwen3-tiny");
    let g = golden("qwen3-tiny");
    let e = engine(&path, Numerics::Fast, 1);
    let ids = g.prompts[3].1.clone();
    let n_embd = e.config().n_embd;
    let raw = EmbedOptions {
        pooling: Some(Pooling::None),
        raw: true,
    };
    let rows = e.embed(std::slice::from_ref(&ids), &raw).unwrap().remove(0);
    assert_eq!(rows.len(), ids.len() * n_embd);
    // Last and CLS are rows of the per-position output; mean is their average.
    let pick = |p: Pooling| {
        e.embed(
            std::slice::from_ref(&ids),
            &EmbedOptions {
                pooling: Some(p),
                raw: true,
            },
        )
        .unwrap()
        .remove(0)
    };
    assert_eq!(pick(Pooling::Last), rows[rows.len() - n_embd..].to_vec());
    assert_eq!(pick(Pooling::Cls), rows[..n_embd].to_vec());
    let mean = pick(Pooling::Mean);
    for (i, &m) in mean.iter().enumerate() {
        let avg: f32 = rows.chunks(n_embd).map(|r| r[i]).sum::<f32>() / ids.len() as f32;
        assert!((m - avg).abs() < 1e-5, "{i}: {m} vs {avg}");
    }
    // Normalized: unit length; raw: not.
    let normed = e
        .embed(std::slice::from_ref(&ids), &EmbedOptions::default())
        .unwrap()
        .remove(0);
    let last = pick(Pooling::Last);
    let scale = normed[0] / last[0];
    assert!(normed
        .iter()
        .zip(&last)
        .all(|(a, b)| (a - b * scale).abs() < 1e-6));

    assert!(matches!(
        e.embed(&[Vec::new()], &EmbedOptions::default()),
        Err(EngineError::EmptyPrompt)
    ));
    assert!(e
        .embed(&[vec![1_000_000]], &EmbedOptions::default())
        .is_err());
    let long = vec![5u32; e.config().n_ctx_train + 1];
    assert!(matches!(
        e.embed(&[long], &EmbedOptions::default()),
        Err(EngineError::ContextFull { .. })
    ));
    // The tokens of an input end with EOS where the file asks (`add_eos_token`).
    let t = e.embed_tokens("Paris").unwrap();
    assert_eq!(t.last().copied(), e.tokenizer.eos());
}

/// The tokens an embedding reads, against upstream llama.cpp's `llama_tokenize` (its ids in
/// testdata/golden/embed/tokenize-cases.json, made by `make/embed-tokenize.sh`): the
/// vocabularies of both converted embedding files (Qwen 3's byte-level BPE with pre-tokenizer
/// `qwen2`, EOS appended; Gemma 3's SentencePiece, no space prefix, BOS added) and LLaMA-3's
/// full vocabulary under `qwen2`, each text with nothing added (special-token text parsed) and,
/// for the two files, as `embed_tokens` reads it.
#[test]
fn embedding_vocabularies_tokenize_as_llama_cpp() {
    use bitnet_gguf::{GgufFile, Limits};
    use bitnet_tokenizer::{Tokenizer, VocabData};
    let vocab = |rel: &str| {
        let f = GgufFile::open(&bitnet_testdata::golden(rel), &Limits::default()).unwrap();
        VocabData::from_metadata(f.metadata()).unwrap()
    };
    // The converter writes Qwen 3's EOS id (151643, `<|endoftext|>` there) whatever the
    // vocabulary; in this 383-token one `<|endoftext|>` is 380 (the script gave llama.cpp
    // the same).
    let mut qwen3 = vocab("embed/qwen3-converted.gguf");
    assert_eq!(qwen3.eos, Some(151_643));
    qwen3.eos = Some(380);
    let mut llama3 = vocab("tokenizer/llama3-vocab.gguf");
    assert_eq!(llama3.pre, None);
    llama3.pre = Some("qwen2".into());
    let toks = [
        ("qwen3", Tokenizer::from_vocab(qwen3, None).unwrap()),
        (
            "gemma3",
            Tokenizer::from_vocab(vocab("embed/gemma3-converted.gguf"), None).unwrap(),
        ),
        ("llama3-qwen2", Tokenizer::from_vocab(llama3, None).unwrap()),
    ];
    assert_eq!(toks[0].1.pre(), bitnet_tokenizer::PreTokenizer::Qwen2);
    assert_eq!(toks[2].1.pre(), bitnet_tokenizer::PreTokenizer::Qwen2);
    let cases: serde_json::Value =
        serde_json::from_slice(&bitnet_testdata::read("embed/tokenize-cases.json")).unwrap();
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 24, "{} cases", cases.len());
    let mut checked = 0;
    for c in cases {
        let text = c["text"].as_str().unwrap();
        for (name, t) in &toks {
            let want = ids(&c[format!("{name}_plain")]);
            assert_eq!(
                t.encode(text, false, true).unwrap(),
                want,
                "{name} {text:?}"
            );
            checked += 1;
            if let Some(s) = c.get(format!("{name}_special")) {
                let want = ids(s);
                let got = bitnet_engine::embed_tokens(t, text).unwrap();
                assert_eq!(got, want, "{name} with specials {text:?}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, cases.len() * 5);
}

/// Gemma 3's real vocabulary (262,144 ids; testdata/golden/tokenizer/gemma3-vocab.gguf, the
/// metadata bitnet.cpp's embedding converter writes for a Gemma 3 checkpoint, made by
/// `make/gemma3-tokenize.sh`) tokenizes as upstream llama.cpp's `llama_tokenize` does with
/// that file (`gemma3-cases.json`: nothing added, special-token text parsed; and with BOS,
/// as `embed_tokens` reads a text), on llama.cpp's tokenizer-test texts and more (whitespace
/// runs past the longest piece, byte fallback, specials, scripts, emoji). For these texts the
/// Hugging Face tokenizer of the model gives the same ids; the test holds that too.
#[test]
fn gemma3_real_vocabulary_tokenizes_as_llama_cpp() {
    use bitnet_gguf::{GgufFile, Limits};
    use bitnet_tokenizer::{Tokenizer, VocabData};
    let f = GgufFile::open(
        &bitnet_testdata::golden("tokenizer/gemma3-vocab.gguf"),
        &Limits::default(),
    )
    .unwrap();
    let vocab = VocabData::from_metadata(f.metadata()).unwrap();
    assert_eq!(vocab.tokens.len(), 262_144);
    assert_eq!(vocab.model, "llama");
    assert_eq!(vocab.add_space_prefix, Some(false));
    let t = Tokenizer::from_vocab(vocab, None).unwrap();
    let cases: serde_json::Value =
        serde_json::from_slice(&bitnet_testdata::read("tokenizer/gemma3-cases.json")).unwrap();
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 80, "{} cases", cases.len());
    let mut bad = Vec::new();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let (plain, special, hf) = (ids(&c["llama"]), ids(&c["llama_special"]), ids(&c["hf"]));
        assert_eq!(plain, hf, "the reference files disagree on {text:?}");
        assert_eq!(special.first(), Some(&2), "BOS first: {text:?}");
        let got = t.encode(text, false, true).unwrap();
        if got != plain {
            bad.push(format!("{text:?}: got {got:?}, want {plain:?}"));
        }
        let got = bitnet_engine::embed_tokens(&t, text).unwrap();
        if got != special {
            bad.push(format!("{text:?} with BOS: got {got:?}, want {special:?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} differ:\n{}",
        bad.len(),
        2 * cases.len(),
        bad.join("\n")
    );
}
