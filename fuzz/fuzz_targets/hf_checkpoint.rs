//! Arbitrary bytes → a Hugging Face directory (`config.json`, `model.safetensors`, and with
//! byte 0's low bit a shard index naming it) → `bitnet_convert::hf::HfDir::open` and, when it
//! opens, a conversion in memory. Bytes 1–2 give the length of `config.json`.
//!
//! Checks: no panic, abort, OOM or timeout: every malformed header, shape, dtype or key is a
//! typed error.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn dir() -> &'static PathBuf {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("bitnet-fuzz-hf-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a scratch folder");
        d
    })
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let n = usize::from(u16::from_le_bytes([data[1], data[2]])).min(data.len() - 3);
    let (config, weights) = data[3..].split_at(n);
    let d = dir();
    let _ = std::fs::remove_file(d.join("model.safetensors.index.json"));
    std::fs::write(d.join("config.json"), config).expect("scratch write");
    std::fs::write(d.join("model.safetensors"), weights).expect("scratch write");
    if data[0] & 1 == 1 {
        let index = br#"{"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model.safetensors", "model.norm.weight": "model.safetensors"}}"#;
        std::fs::write(d.join("model.safetensors.index.json"), index).expect("scratch write");
    }
    let Ok(hf) = bitnet_convert::hf::HfDir::open(d) else {
        return;
    };
    for name in hf.names().map(str::to_string).collect::<Vec<_>>() {
        if let Some(t) = hf.get(&name) {
            let shape = t.shape.clone();
            let _ = hf.floats(&name, &shape);
        }
    }
    if data[0] & 2 == 2 {
        let _ = bitnet_convert::convert(
            d,
            &bitnet_convert::Options::default(),
            Vec::new(),
            &mut |_| true,
        );
    }
});
