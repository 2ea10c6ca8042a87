//! The server crate's modules form layers: no module reaches, through the `crate::` paths of
//! its code, a module that reaches back to it (`bitnet_testdata::layers`): the routes
//! (`http`) and the embeddings endpoint share their handler helpers through `request`.
#![allow(clippy::expect_used, clippy::panic)]

use std::path::Path;

use bitnet_testdata::layers::{assert_layered, read};

#[test]
fn no_module_reaches_back_to_itself() {
    let g = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &[]);
    for (from, to) in [
        ("http", "embeddings"),
        ("http", "request"),
        ("embeddings", "request"),
        ("scheduler", "metrics"),
    ] {
        assert!(
            g.get(from).is_some_and(|s| s.contains(to)),
            "the reader misses {from} → {to}: {g:#?}"
        );
    }
    assert!(
        !g.get("embeddings").is_some_and(|s| s.contains("http")),
        "embeddings names the router: {g:#?}"
    );
    assert_layered("bitnet-server", &g);
}
