//! Several sequences in one forward pass give the same logits as each sequence alone, bit for
//! bit in fast numerics (integer ternary dots, per-token activation scales, per-sequence
//! attention and a head whose rows do not depend on the batch), so a server's answers do not
//! depend on which other requests share a step.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use bitnet_gguf::{GgufFile, Limits};
use bitnet_kernels::Pool;
use bitnet_model::{Exec, KvType, Model, Numerics, Outputs, Seq};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn batched_sequences_match_single_sequences() {
    let f = GgufFile::from_bytes(
        bitnet_testkit::tiny_model_bytes(3).unwrap(),
        &Limits::default(),
    )
    .unwrap();
    let m = Model::load(&f).unwrap();
    let pool = Pool::new(2);
    let mut exec = Exec {
        backend: &pool,
        numerics: Numerics::Fast,
        trace: None,
        scratch: None,
    };
    let prompts: [&[u32]; 3] = [&[4000, 10, 20, 30, 40], &[4000, 7], &[4000, 99, 98, 97]];
    // alone
    let mut alone = Vec::new();
    for p in prompts {
        let mut c = m.new_cache(16, KvType::F16, u64::MAX).unwrap();
        m.forward(p, &mut c, Outputs::Last, &mut exec).unwrap();
        let step = m.forward(&[123], &mut c, Outputs::Last, &mut exec).unwrap();
        alone.push(step);
    }
    // prefill separately, then one batched decode step
    let mut caches: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut c = m.new_cache(16, KvType::F16, u64::MAX).unwrap();
            m.forward(p, &mut c, Outputs::None, &mut exec).unwrap();
            c
        })
        .collect();
    let mut seqs: Vec<Seq<'_>> = caches
        .iter_mut()
        .map(|c| Seq {
            tokens: &[123],
            cache: c,
            outputs: Outputs::Last,
        })
        .collect();
    let batched = m.forward_seqs(&mut seqs, &mut exec).unwrap();
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert_eq!(bits(a), bits(b), "sequence {i}");
    }
    // mixed batch: one sequence prefilling while another decodes
    let mut c1 = m.new_cache(16, KvType::F16, u64::MAX).unwrap();
    let mut c2 = m.new_cache(16, KvType::F16, u64::MAX).unwrap();
    m.forward(prompts[1], &mut c2, Outputs::None, &mut exec)
        .unwrap();
    let mut seqs = vec![
        Seq {
            tokens: prompts[0],
            cache: &mut c1,
            outputs: Outputs::None,
        },
        Seq {
            tokens: &[123],
            cache: &mut c2,
            outputs: Outputs::Last,
        },
    ];
    let out = m.forward_seqs(&mut seqs, &mut exec).unwrap();
    assert!(out[0].is_empty());
    assert_eq!(bits(&out[1]), bits(&alone[1]), "mixed batch");
    assert_eq!((c1.len(), c2.len()), (5, 3));
}
