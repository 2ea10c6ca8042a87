//! Locates the golden reference fixtures in `testdata/golden` at the workspace root (see its
//! README for where each file came from).
//!
//! Every lookup checks that the file exists and panics with its path when it does not: a test
//! whose fixture is missing fails loudly, it never passes without checking anything. This crate
//! is only a dev-dependency of the workspace's tests, which is why it panics instead of returning
//! errors.
#![allow(clippy::panic)]

use std::path::{Path, PathBuf};

pub mod layers;

/// The golden model file of each architecture the loader runs: bitnet-b1.58, `llama`,
/// Falcon3 (`llama`), 1bitLLM's `bitnet`, and the embedding models' `qwen3` and `gemma3`
/// (paths for [`golden`] and [`read`]).
pub const MODEL_FILES: [&str; 6] = [
    "tiny/bitnet-tiny-i2_s.gguf",
    "llama-tiny/llama-tiny-i2_s.gguf",
    "falcon3-tiny/falcon3-tiny-i2_s.gguf",
    "1bitllm-tiny/1bitllm-tiny-i2_s.gguf",
    "embed/qwen3-converted.gguf",
    "embed/gemma3-converted.gguf",
];

/// The names in folder `dir`, sorted (what a test expects to find there after writing, and
/// that nothing temporary was left beside it).
#[must_use]
pub fn dir_names(dir: &Path) -> Vec<String> {
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read the folder {}: {e}", dir.display()));
    let mut v: Vec<String> = entries
        .map(|e| match e {
            Ok(e) => e.file_name().to_string_lossy().into_owned(),
            Err(e) => panic!("cannot read the folder {}: {e}", dir.display()),
        })
        .collect();
    v.sort();
    v
}

/// `testdata/golden` of this workspace (whether or not it exists).
#[must_use]
pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden")
}

/// The path of the golden fixture `rel` (for example `"tiny/bitnet-tiny-i2_s.gguf"`).
///
/// # Panics
/// When the file does not exist, naming the path.
#[must_use]
pub fn golden(rel: &str) -> PathBuf {
    let p = golden_dir().join(rel);
    if !p.is_file() {
        panic!(
            "golden fixture {} is missing (testdata/golden is part of the repository; see its README)",
            p.display()
        );
    }
    p
}

/// The path of `rel` in `testdata/trained`, the trained model and its references (for example
/// `"kjv-i2_s.gguf"`); [`read`] and [`read_f32`] reach them as `"../trained/REL"`.
///
/// # Panics
/// When the file does not exist, naming the path.
#[must_use]
pub fn trained(rel: &str) -> PathBuf {
    golden(&format!("../trained/{rel}"))
}

/// [`golden`] as a `String`, for command lines.
///
/// # Panics
/// When the file does not exist, or its path is not UTF-8.
#[must_use]
pub fn golden_str(rel: &str) -> String {
    let p = golden(rel);
    match p.to_str() {
        Some(s) => s.to_owned(),
        None => panic!("golden fixture path {} is not UTF-8", p.display()),
    }
}

/// The bytes of the golden fixture `rel`.
///
/// # Panics
/// When the file does not exist or cannot be read, naming the path.
#[must_use]
pub fn read(rel: &str) -> Vec<u8> {
    let p = golden(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("cannot read golden fixture {}: {e}", p.display()))
}

/// A JSON list of token ids (as the golden tokenizer files hold them).
///
/// # Panics
/// When `v` is not a list of integers that fit in u32.
#[must_use]
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    let Some(list) = v.as_array() else {
        panic!("not a list of token ids: {v}");
    };
    list.iter()
        .map(|x| match x.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(id) => id,
            None => panic!("not a token id: {x}"),
        })
        .collect()
}

/// A golden f32 file (little-endian) as values.
///
/// # Panics
/// When the file is missing, unreadable, or not a whole number of f32s.
#[must_use]
pub fn read_f32(rel: &str) -> Vec<f32> {
    let b = read(rel);
    if !b.len().is_multiple_of(4) {
        panic!(
            "golden fixture {rel}: {} bytes is not a whole number of f32s",
            b.len()
        );
    }
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The token ids under `key` (`prompt_tokens`, `generated_tokens`) of the golden prompt
/// `dir/stem.tokens.json`.
///
/// # Panics
/// When the file is missing or unreadable, or `key` is not an array of u32 values.
#[must_use]
pub fn token_ids(dir: &str, stem: &str, key: &str) -> Vec<u32> {
    let rel = format!("{dir}/{stem}.tokens.json");
    let meta: serde_json::Value = serde_json::from_slice(&read(&rel))
        .unwrap_or_else(|e| panic!("golden fixture {rel} is not JSON: {e}"));
    let Some(ids) = meta[key].as_array() else {
        panic!("golden fixture {rel} has no array `{key}`");
    };
    ids.iter()
        .map(|v| {
            v.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .unwrap_or_else(|| panic!("golden fixture {rel}: `{key}` holds {v}, not a u32"))
        })
        .collect()
}

/// How far a set of logit rows is from the reference rows (see testdata/golden/README.md,
/// "How to compare").
#[derive(Debug, Clone, Copy)]
pub struct Gate {
    /// The largest |ours − reference| over every element.
    pub max_abs: f32,
    /// The smallest per-row cosine similarity.
    pub min_cos: f64,
    /// Rows whose argmax differs although the reference's top-2 margin exceeds `margin`.
    pub top1_misses_above_margin: usize,
    /// Rows compared.
    pub rows: usize,
}

/// The cosine of two vectors, in f64 (embeddings against a reference's).
#[must_use]
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let na: f64 = a.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    let nb: f64 = b.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    dot / (na.sqrt() * nb.sqrt())
}

/// Compare `mine` with `golden`, both `[rows][n_vocab]`.
///
/// # Panics
/// When the two differ in length or are not whole rows.
#[must_use]
pub fn compare_logits(mine: &[f32], golden: &[f32], n_vocab: usize, margin: f32) -> Gate {
    if mine.len() != golden.len() || n_vocab == 0 || !golden.len().is_multiple_of(n_vocab) {
        panic!(
            "{} logits against {} reference logits of {n_vocab} per row",
            mine.len(),
            golden.len()
        );
    }
    let mut g = Gate {
        max_abs: 0.0,
        min_cos: 1.0,
        top1_misses_above_margin: 0,
        rows: 0,
    };
    for (a, b) in mine.chunks_exact(n_vocab).zip(golden.chunks_exact(n_vocab)) {
        let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
        for (&x, &y) in a.iter().zip(b) {
            g.max_abs = g.max_abs.max((x - y).abs());
            dot += f64::from(x) * f64::from(y);
            na += f64::from(x) * f64::from(x);
            nb += f64::from(y) * f64::from(y);
        }
        g.min_cos = g.min_cos.min(dot / (na.sqrt() * nb.sqrt()));
        let argmax = |v: &[f32]| {
            v.iter()
                .enumerate()
                .fold(0, |bi, (i, &x)| if x > v[bi] { i } else { bi })
        };
        let (ia, ib) = (argmax(a), argmax(b));
        let mut sorted = b.to_vec();
        sorted.sort_by(|x, y| y.total_cmp(x));
        if ia != ib && sorted[0] - sorted[1] > margin {
            g.top1_misses_above_margin += 1;
        }
        g.rows += 1;
    }
    g
}

/// The index of the first element whose bits differ, with both values.
#[must_use]
pub fn first_bit_difference(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    if a.len() != b.len() {
        return Some((a.len().min(b.len()), f32::NAN, f32::NAN));
    }
    a.iter()
        .zip(b)
        .enumerate()
        .find(|(_, (x, y))| x.to_bits() != y.to_bits())
        .map(|(i, (x, y))| (i, *x, *y))
}

/// The four golden prompts' file stems.
pub const PROMPTS: [&str; 4] = ["p1_english", "p2_unicode", "p3_digits_punct", "p4_code_ws"];

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file listed in SHA256SUMS is present (the checksums themselves are verified by
    /// `.ci/run` with `sha256sum -c`).
    #[test]
    fn every_listed_fixture_exists() {
        let sums = String::from_utf8(read("SHA256SUMS")).unwrap_or_default();
        let mut n = 0;
        for line in sums.lines() {
            let Some((_, name)) = line.split_once("  ") else {
                panic!("malformed SHA256SUMS line: {line}");
            };
            let _ = golden(name.trim_start_matches("./"));
            n += 1;
        }
        assert!(n >= 29, "SHA256SUMS lists only {n} files");
    }

    #[test]
    fn the_gate_sees_each_kind_of_difference() {
        let golden = [1.0f32, 0.5, 0.0, 0.0, 2.0, 1.0];
        let g = compare_logits(&golden, &golden, 3, 0.05);
        assert_eq!((g.max_abs, g.rows, g.top1_misses_above_margin), (0.0, 2, 0));
        assert!((g.min_cos - 1.0).abs() < 1e-12);
        // Row 0's argmax moves although the margin is 0.5: a miss; row 1 is off by 0.25.
        let mine = [0.4f32, 0.6, 0.0, 0.0, 2.0, 1.25];
        let g = compare_logits(&mine, &golden, 3, 0.05);
        assert_eq!(g.top1_misses_above_margin, 1);
        assert!((g.max_abs - 0.6).abs() < 1e-6);
        assert!(g.min_cos < 0.99);
        assert_eq!(first_bit_difference(&mine, &golden).map(|d| d.0), Some(0));
        assert_eq!(first_bit_difference(&golden, &golden), None);
        assert!(first_bit_difference(&golden[..3], &golden).is_some());
    }

    #[test]
    #[should_panic(expected = "is missing")]
    fn a_missing_fixture_fails_naming_it() {
        let _ = golden("tiny/no-such-file.gguf");
    }
}
