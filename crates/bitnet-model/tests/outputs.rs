//! Past the last layer's attention, only the rows an output reads are computed. The rows that
//! are read keep their bits, and the cache, written before that point, is the same: later
//! steps do not depend on which outputs a prompt asked for.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bitnet_gguf::{GgufFile, Limits};
use bitnet_kernels::Pool;
use bitnet_model::{Exec, KvType, Model, Numerics, Outputs, Pooling, Seq};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn exec(pool: &Pool, numerics: Numerics) -> Exec<'_> {
    Exec {
        backend: pool,
        numerics,
        trace: None,
        scratch: None,
    }
}

fn model_file() -> GgufFile {
    GgufFile::from_bytes(
        bitnet_testkit::tiny_model_bytes(5).unwrap(),
        &Limits::default(),
    )
    .unwrap()
}

const PROMPT: [u32; 19] = [
    4000, 10, 20, 30, 40, 791, 1864, 315, 9, 77, 12, 5, 6, 7, 8, 900, 901, 902, 3,
];

/// Fast numerics: the last row of `Outputs::All` is `Outputs::Last`, bit for bit (the head's
/// rows do not depend on each other there), alone and beside a sequence that asks for none.
#[test]
fn the_rows_asked_for_keep_their_bits() {
    let f = model_file();
    let m = Model::load(&f).unwrap();
    let pool = Pool::new(2);
    let mut exec = exec(&pool, Numerics::Fast);
    let nv = m.config.n_vocab;
    let mut c = m.new_cache(32, KvType::F16, u64::MAX).unwrap();
    let all = m.forward(&PROMPT, &mut c, Outputs::All, &mut exec).unwrap();
    assert_eq!(all.len(), PROMPT.len() * nv);
    let want = &all[all.len() - nv..];
    let mut c = m.new_cache(32, KvType::F16, u64::MAX).unwrap();
    let last = m
        .forward(&PROMPT, &mut c, Outputs::Last, &mut exec)
        .unwrap();
    assert_eq!(bits(&last), bits(want), "Outputs::Last alone");
    // Two sequences in one pass: the first asks for nothing, the second for its last row
    // (row 24 of the batch's 25).
    let other: [u32; 6] = [4000, 3, 1, 4, 1, 5];
    let mut c1 = m.new_cache(32, KvType::F16, u64::MAX).unwrap();
    let mut c2 = m.new_cache(32, KvType::F16, u64::MAX).unwrap();
    let mut seqs = [
        Seq {
            tokens: &other,
            cache: &mut c1,
            outputs: Outputs::None,
        },
        Seq {
            tokens: &PROMPT,
            cache: &mut c2,
            outputs: Outputs::Last,
        },
    ];
    let out = m.forward_seqs(&mut seqs, &mut exec).unwrap();
    assert!(out[0].is_empty());
    assert_eq!(
        bits(&out[1]),
        bits(want),
        "Outputs::Last beside Outputs::None"
    );
}

/// Both numerics: a prompt that asked for no logits, or for its last row, leaves the cache
/// as one that asked for every row does, so the next step's logits are the same bits.
#[test]
fn the_cache_does_not_depend_on_the_outputs_asked_for() {
    let f = model_file();
    let m = Model::load(&f).unwrap();
    let pool = Pool::new(2);
    for numerics in [Numerics::Fast, Numerics::Exact] {
        let mut exec = exec(&pool, numerics);
        let steps = [Outputs::All, Outputs::Last, Outputs::None].map(|outputs| {
            let mut c = m.new_cache(32, KvType::F16, u64::MAX).unwrap();
            m.forward(&PROMPT, &mut c, outputs, &mut exec).unwrap();
            let mut v = m.forward(&[42], &mut c, Outputs::Last, &mut exec).unwrap();
            v.extend(m.forward(&[43], &mut c, Outputs::Last, &mut exec).unwrap());
            bits(&v)
        });
        assert_eq!(steps[1], steps[0], "{numerics:?}: Outputs::Last prompt");
        assert_eq!(steps[2], steps[0], "{numerics:?}: Outputs::None prompt");
    }
}

/// Both numerics: last-token and first-token pooling give the last and first of the
/// per-position vectors, bit for bit.
#[test]
fn pooled_rows_are_the_unpooled_rows() {
    let f = model_file();
    let m = Model::load(&f).unwrap();
    let pool = Pool::new(2);
    let e = m.config.n_embd;
    for numerics in [Numerics::Fast, Numerics::Exact] {
        let mut exec = exec(&pool, numerics);
        let embed = |pooling: Pooling, exec: &mut Exec<'_>| {
            let mut c = m.new_cache(32, KvType::F16, u64::MAX).unwrap();
            let mut seqs = [Seq {
                tokens: &PROMPT,
                cache: &mut c,
                outputs: Outputs::None,
            }];
            m.embed_seqs(&mut seqs, pooling, exec).unwrap().remove(0)
        };
        let rows = embed(Pooling::None, &mut exec);
        assert_eq!(rows.len(), PROMPT.len() * e);
        let last = embed(Pooling::Last, &mut exec);
        let first = embed(Pooling::Cls, &mut exec);
        assert_eq!(
            bits(&last),
            bits(&rows[rows.len() - e..]),
            "{numerics:?}: last"
        );
        assert_eq!(bits(&first), bits(&rows[..e]), "{numerics:?}: first");
    }
}
