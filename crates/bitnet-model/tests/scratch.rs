//! Reused forward buffers: a caller-kept `Scratch` gives the same bits as fresh buffers, over
//! batches that grow and shrink and across sequences, and stops growing once warm.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bitnet_gguf::{GgufFile, Limits};
use bitnet_kernels::Pool;
use bitnet_model::{Exec, KvType, Model, Numerics, Outputs, Scratch};

#[test]
fn reused_buffers_change_nothing_and_stop_growing() {
    let f = GgufFile::open(
        &bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf"),
        &Limits::default(),
    )
    .unwrap();
    let m = Model::load(&f).unwrap();
    let pool = Pool::new(2);
    for numerics in [Numerics::Fast, Numerics::Exact] {
        let mut kept = Scratch::default();
        let batches: [&[u32]; 4] = [&[4000, 791, 1864, 315, 9, 77, 12], &[42], &[4000, 5], &[7]];
        let run = |scratch: Option<&mut Scratch>| {
            let mut exec = Exec {
                backend: &pool,
                numerics,
                trace: None,
                scratch,
            };
            let mut c1 = m.new_cache(32, KvType::F16, u64::MAX).unwrap();
            let mut c2 = m.new_cache(32, KvType::F16, u64::MAX).unwrap();
            let mut out = Vec::new();
            for (i, b) in batches.iter().enumerate() {
                let c = if i % 2 == 0 { &mut c1 } else { &mut c2 };
                out.extend(m.forward(b, c, Outputs::All, &mut exec).unwrap());
            }
            out
        };
        let fresh = run(None);
        let reused = run(Some(&mut kept));
        assert!(
            fresh
                .iter()
                .zip(&reused)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{numerics:?}: reused buffers changed the logits"
        );
        let warm = kept.capacity_bytes();
        assert!(warm > 0, "the kept buffers were not used");
        let again = run(Some(&mut kept));
        assert_eq!(again.len(), fresh.len());
        assert_eq!(
            kept.capacity_bytes(),
            warm,
            "{numerics:?}: buffers grew on the same batches"
        );
    }
}
