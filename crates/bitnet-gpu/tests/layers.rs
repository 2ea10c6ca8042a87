//! The GPU crate's modules form layers: no module reaches, through the `crate::` paths of its
//! code, a module that reaches back to it (`bitnet_testdata::layers`).
#![allow(clippy::expect_used, clippy::panic)]

use std::path::Path;

use bitnet_testdata::layers::{assert_layered, read};

#[test]
fn no_module_reaches_back_to_itself() {
    let g = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &[]);
    assert!(g.len() >= 8, "modules read: {g:?}");
    for (from, to) in [
        ("model", "kernels"),
        ("kernels", "cache"),
        ("builder", "upload"),
    ] {
        assert!(
            g.get(from).is_some_and(|s| s.contains(to)),
            "the reader misses {from} → {to}: {g:#?}"
        );
    }
    assert_layered("bitnet-gpu", &g);
}
