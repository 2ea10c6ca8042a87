//! Perplexity and KL divergence (`bitnet_engine::quality`) against sums written out here
//! from the engine's raw logits.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use bitnet_engine::quality::{self, Divergence, KlHeader, Nll};
use bitnet_engine::EngineError;
use bitnet_model::{KvType, Numerics, Outputs};

fn engine(numerics: Numerics, kv_type: KvType) -> bitnet_engine::Engine {
    common::tiny_engine(numerics, kv_type)
}

fn text_tokens(e: &bitnet_engine::Engine) -> Vec<u32> {
    let mut text = String::new();
    for p in ["p1_english", "p2_unicode", "p3_digits_punct", "p4_code_ws"] {
        text.push_str(&String::from_utf8(bitnet_testdata::read(&format!("tiny/{p}.txt"))).unwrap());
    }
    let text = text.repeat(3);
    e.tokenizer.encode(&text, true, false).unwrap()
}

#[test]
fn perplexity_is_the_mean_nll_of_the_second_half_of_each_chunk() {
    let e = engine(Numerics::Fast, KvType::F16);
    let tokens = text_tokens(&e);
    let n_ctx = 64;
    let chunks = quality::chunks(&tokens, n_ctx, e.tokenizer.bos(), Some(5));
    assert_eq!(chunks.len(), 5);
    assert!(chunks.iter().all(|c| c.len() == n_ctx && c[0] == 4000));
    assert_eq!(&chunks[1][1..], &tokens[n_ctx + 1..2 * n_ctx]);

    let mut nll = Nll::default();
    let (mut sum, mut count) = (0.0f64, 0u64);
    for c in &chunks {
        nll.add(c, &quality::chunk_log_probs(&e, c).unwrap(), 4256);
        // Written out: softmax of the raw logits in f64, positions 32..62 predicting 33..63.
        let mut s = e.new_session(n_ctx).unwrap();
        let logits = e.eval(&mut s, c, Outputs::All).unwrap();
        for p in n_ctx / 2..n_ctx - 1 {
            let row = &logits[p * 4256..(p + 1) * 4256];
            let max = row.iter().map(|&x| f64::from(x)).fold(f64::MIN, f64::max);
            let z: f64 = row.iter().map(|&x| (f64::from(x) - max).exp()).sum();
            let next = c[p + 1] as usize;
            sum += -(f64::from(row[next]) - max - z.ln());
            count += 1;
        }
    }
    assert_eq!(nll.count(), count);
    assert_eq!(count, 5 * 31);
    let want = (sum / count as f64).exp();
    assert!(
        (nll.perplexity() / want - 1.0).abs() < 1e-6,
        "{} vs {want}",
        nll.perplexity()
    );
    assert!(nll.perplexity_error() > 0.0);
    // Too short a text gives no chunk.
    assert!(quality::chunks(&tokens[..63], 64, Some(4000), None).is_empty());
}

#[test]
fn divergence_is_zero_against_itself_and_small_for_near_configurations() {
    let base = engine(Numerics::Exact, KvType::F16);
    let tokens = text_tokens(&base);
    let chunks = quality::chunks(&tokens, 64, base.tokenizer.bos(), Some(3));
    let base_lp: Vec<Vec<f32>> = chunks
        .iter()
        .map(|c| quality::chunk_log_probs(&base, c).unwrap())
        .collect();
    let measure = |e: &bitnet_engine::Engine| {
        let mut d = Divergence::default();
        for (c, b) in chunks.iter().zip(&base_lp) {
            let lp = quality::chunk_log_probs(e, c).unwrap();
            for (j, (rb, rt)) in b.chunks_exact(4256).zip(lp.chunks_exact(4256)).enumerate() {
                d.add(rb, rt, c[32 + j + 1]);
            }
        }
        d
    };
    let same = measure(&engine(Numerics::Exact, KvType::F16));
    assert_eq!(
        (same.mean_kl(), same.top1_agreement(), same.max_dp),
        (0.0, 1.0, 0.0)
    );
    let fast = measure(&engine(Numerics::Fast, KvType::Q8_0));
    assert!(
        fast.mean_kl() > 0.0 && fast.mean_kl() < 0.01,
        "{}",
        fast.mean_kl()
    );
    assert!(fast.top1_agreement() > 0.5 && fast.top1_agreement() < 1.0);
    assert!(fast.max_dp > 0.0 && fast.max_dp < 0.05);
}

#[test]
fn kl_base_files_round_trip_and_bad_ones_are_refused() {
    let h = KlHeader::new(8, 6, 1).unwrap();
    let lp: Vec<f32> = (0..h.rows() * 8).map(|i| -(i as f32)).collect();
    let mut buf = Vec::new();
    h.write(&mut buf).unwrap();
    quality::write_chunk(&mut buf, &[1, 2, 3, 4, 5, 6], &lp).unwrap();
    let mut r = &buf[..];
    let got = KlHeader::read(&mut r).unwrap();
    assert_eq!(got, h);
    assert_eq!(
        quality::read_chunk(&mut r, &got).unwrap(),
        (vec![1, 2, 3, 4, 5, 6], lp)
    );

    let bad = |bytes: &[u8], word: &str| {
        let mut r = bytes;
        let e = KlHeader::read(&mut r).and_then(|h| quality::read_chunk(&mut r, &h).map(|_| ()));
        match e {
            Err(EngineError::KlBase(m)) => assert!(m.contains(word), "{m}"),
            other => panic!("expected a KlBase error, got {other:?}"),
        }
    };
    bad(&buf[..buf.len() - 1], "truncated");
    bad(&buf[..10], "truncated");
    let mut magic = buf.clone();
    magic[0] = b'X';
    bad(&magic, "magic");
    let mut version = buf.clone();
    version[8] = 2;
    bad(&version, "version");
    let mut token = buf.clone();
    token[24] = 9; // the first token id, now 9 >= n_vocab 8
    bad(&token, "not below n_vocab");
    let mut empty = buf.clone();
    empty[12..16].copy_from_slice(&0u32.to_le_bytes());
    bad(&empty, "invalid header");
}
