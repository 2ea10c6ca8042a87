//! `include/bitnet.h` is generated from `src/lib.rs` by cbindgen and checked in; this test
//! fails when it is stale. `BITNET_UPDATE_HEADER=1 cargo test -p bitnet-capi --test header`
//! rewrites it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::PathBuf;

#[test]
fn header_is_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).unwrap();
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen reads src/lib.rs");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let path = dir.join("../../include/bitnet.h");
    if std::env::var_os("BITNET_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    let current = std::fs::read(&path).unwrap_or_default();
    assert!(
        current == fresh,
        "{} is stale or missing: regenerate it with \
         BITNET_UPDATE_HEADER=1 cargo test -p bitnet-capi --test header",
        path.display()
    );
}
