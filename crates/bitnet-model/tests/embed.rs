//! Files written by bitnet.cpp's own embedding converter (`convert-bitnet-embedding-to-gguf.py
//! --outtype i2_s` on tiny synthetic `qwen3` and `gemma3_text` checkpoints: F16 norms, one I2_S
//! scale per tensor, `key_length` ≠ n_embd / n_head, last-token pooling; made by
//! `testdata/golden/make/embed-convert.sh`) bind and embed as the numpy oracle `embed_ref.py`
//! does: cosine ≥ 0.9999 per vector with fast numerics, and with exact numerics bit for bit
//! the vectors of the oracle's exact variant (bitnet.cpp's float paths); every prompt in one
//! batched pass.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bitnet_gguf::{GgufFile, Limits};
use bitnet_model::{numerics, Exec, KvType, Model, Numerics, Outputs, Pooling, Seq};

fn check(arch: &str, gemma: bool) {
    let path = bitnet_testdata::golden(&format!("embed/{arch}-converted.gguf"));
    let file = GgufFile::open(&path, &Limits::default()).unwrap();
    let model = Model::load(&file).unwrap();
    let c = &model.config;
    assert_eq!(c.arch, arch);
    assert!(c.norm_in && c.qk_norm);
    assert_eq!(c.post_norms, gemma);
    assert_eq!(c.pooling, Some(Pooling::Last));
    assert_ne!(
        c.head_dim,
        c.n_embd / c.n_head,
        "{arch}: key_length is its own"
    );
    let prompts: serde_json::Value = serde_json::from_slice(&bitnet_testdata::read(&format!(
        "embed/{arch}-converted.prompts.json"
    )))
    .unwrap();
    let prompts: Vec<(String, Vec<u32>)> = prompts
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let ids = p["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| u32::try_from(v.as_u64().unwrap()).unwrap())
                .collect();
            (p["name"].as_str().unwrap().to_string(), ids)
        })
        .collect();
    assert!(prompts.len() >= 5);
    let pool = bitnet_kernels::Pool::new(2);
    for numerics in [Numerics::Fast, Numerics::Exact] {
        let mut caches: Vec<_> = prompts
            .iter()
            .map(|(_, ids)| model.new_cache(ids.len(), KvType::F16, u64::MAX).unwrap())
            .collect();
        let mut seqs: Vec<Seq<'_>> = prompts
            .iter()
            .zip(caches.iter_mut())
            .map(|((_, ids), cache)| Seq {
                tokens: ids,
                cache,
                outputs: Outputs::None,
            })
            .collect();
        let mut exec = Exec {
            backend: &pool,
            numerics,
            trace: None,
            scratch: None,
        };
        let got = model
            .embed_seqs(&mut seqs, Pooling::Last, &mut exec)
            .unwrap();
        for ((name, _), v) in prompts.iter().zip(&got) {
            let want =
                bitnet_testdata::read_f32(&format!("embed/{arch}-converted.{name}.embd.f32"));
            let v = numerics::l2_normalized(v);
            let cos = bitnet_testdata::cosine(&v, &want);
            eprintln!("{arch} {numerics:?} {name}: cosine {cos:.7}");
            // Exact numerics also rounds Q and P to f16 where bitnet.cpp's kernels do; the
            // oracle's default variant computes them in f32.
            let gate = if numerics == Numerics::Fast {
                0.9999
            } else {
                0.999
            };
            assert!(cos >= gate, "{arch} {numerics:?} {name}: cosine {cos}");
            if numerics == Numerics::Exact {
                // The oracle's exact variant (bitnet.cpp's float paths): bit for bit.
                let exact = bitnet_testdata::read_f32(&format!(
                    "embed/{arch}-converted.{name}.exact.embd.f32"
                ));
                let diff = bitnet_testdata::first_bit_difference(&v, &exact);
                assert!(diff.is_none(), "{arch} {name}: exact differs at {diff:?}");
            }
        }
    }
}

#[test]
fn qwen3_file_of_bitnet_cpps_converter_embeds_as_the_oracle() {
    check("qwen3", false);
}

#[test]
fn gemma3_file_of_bitnet_cpps_converter_embeds_as_the_oracle() {
    check("gemma3", true);
}
