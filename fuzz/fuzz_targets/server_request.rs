//! Arbitrary bytes → the server's request parsing and validation (`api::parse_request`, the
//! code every chat and completions handler runs first), for both endpoints; a request that
//! parses has its constraint compiled as the handler compiles it.
//!
//! Checks: no panic; a refusal is a 4xx with a message; an accepted request is within the
//! limits it was checked against.
#![no_main]

use std::sync::OnceLock;

use bitnet_engine::Grammars;
use bitnet_gguf::{GgufFile, Limits};
use bitnet_sampling::SamplerParams;
use bitnet_server::api::{parse_request, RequestLimits};
use bitnet_server::Endpoint;
use bitnet_tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

const SPM: &[u8] = include_bytes!("../../testdata/golden/tokenizer/spm-vocab.gguf");

fn grammars() -> &'static Grammars {
    static G: OnceLock<Grammars> = OnceLock::new();
    G.get_or_init(|| {
        let f = GgufFile::from_bytes(SPM.to_vec(), &Limits::default()).expect("vocabulary parses");
        let tok = Tokenizer::from_gguf(f.metadata(), None).expect("vocabulary loads");
        Grammars::new(&tok).expect("the compiler builds")
    })
}

fuzz_target!(|data: &[u8]| {
    let limits = RequestLimits {
        n_ctx: 512,
        n_vocab: 3911,
        max_stop: 4,
        max_stop_bytes: 64,
        defaults: SamplerParams::default(),
    };
    for endpoint in [Endpoint::Chat, Endpoint::Completion] {
        match parse_request(data, endpoint, &limits) {
            Err(e) => {
                assert!(e.status.is_client_error(), "{e:?}");
                assert!(!e.message.is_empty());
            }
            Ok(r) => {
                assert!(r.max_tokens.is_none_or(|m| (1..=512).contains(&m)));
                assert!(r.stop.len() <= 4 && r.stop.iter().all(|s| s.len() <= 64));
                if let Some(c) = &r.constraint {
                    let _ = grammars().start(c);
                }
            }
        }
    }
});
