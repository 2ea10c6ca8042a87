//! The kernel crate's modules form layers: no module reaches, through the `crate::` and
//! `super::` paths of its code (tests excluded), a module that reaches back to it; the tiers
//! (`simd::*`) and their shared types (`tier`, `cpu`) never name the dispatch table that
//! names them.
//!
//! Nodes are the top-level modules, except that each file under `src/simd/` (the tiers) and
//! `src/attn/` (the attention's plan, items, cache rows) is a node of its own; the files of
//! `layout/` belong to their module (`bitnet_testdata::layers`).
#![allow(clippy::expect_used, clippy::panic)]

use std::path::Path;

use bitnet_testdata::layers::{assert_layered, read, Graph};

fn graph() -> Graph {
    read(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &["simd", "attn"],
    )
}

#[test]
fn modules_form_layers_without_a_circle() {
    let g = graph();
    // The reader sees the modules it must see: a broken reader would find no edges at all.
    for (from, to) in [
        ("dispatch", "simd::avx2"),
        ("dispatch", "tier"),
        ("simd::avx2", "tier"),
        ("simd::avx512", "simd::avx2"),
        ("ternary", "dispatch"),
        ("error", "formats"),
        ("attn::item", "attn::work"),
        ("attn::item", "attn::kv"),
        ("attn::x86", "attn::kv"),
    ] {
        assert!(
            g.get(from).is_some_and(|e| e.contains(to)),
            "expected {from} → {to}; the graph read: {g:#?}"
        );
    }
    assert_layered("bitnet-kernels", &g);
}

#[test]
fn tiers_and_their_types_never_name_the_dispatch() {
    let g = graph();
    for (n, edges) in &g {
        if n.starts_with("simd") || n == "tier" || n == "cpu" || n == "formats" {
            assert!(
                !edges.contains("dispatch"),
                "{n} names the dispatch table: {edges:?}"
            );
        }
    }
    // The leaves name nothing above them.
    for leaf in ["cpu", "formats", "aligned"] {
        let e = g.get(leaf).expect("leaf module present");
        assert!(e.is_empty(), "{leaf} should be a leaf, names {e:?}");
    }
}
