//! The C API called as C would call it: argument checks, error codes and messages,
//! buffers, callbacks, exact-numerics logits against the golden file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::{null, null_mut};

use bitnet::*;

fn model() -> CString {
    let p = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    CString::new(p.to_str().unwrap()).unwrap()
}

fn last_error() -> String {
    // SAFETY: a NUL-terminated string owned by the library.
    unsafe { CStr::from_ptr(bitnet_last_error()) }
        .to_string_lossy()
        .into_owned()
}

struct Engine(*mut bitnet_engine);

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: from bitnet_load, freed once.
        unsafe { bitnet_free(self.0) };
    }
}

fn load(cfg: &bitnet_config) -> Result<Engine, (i32, String)> {
    let mut e = null_mut();
    // SAFETY: valid pointers.
    let rc = unsafe { bitnet_load(model().as_ptr(), cfg, &mut e) };
    if rc == BITNET_OK {
        assert!(!e.is_null());
        Ok(Engine(e))
    } else {
        assert!(e.is_null());
        Err((rc, last_error()))
    }
}

fn cfg() -> bitnet_config {
    bitnet_config {
        n_threads: 1,
        ..bitnet_config_default()
    }
}

#[test]
fn bad_load_arguments_are_codes_with_messages() {
    let mut e = null_mut();
    // SAFETY: the pointers are null or valid, as each case says.
    unsafe {
        assert_eq!(bitnet_load(null(), null(), &mut e), BITNET_ERR_NULL);
        assert!(last_error().contains("path"));
        assert_eq!(
            bitnet_load(model().as_ptr(), null(), null_mut()),
            BITNET_ERR_NULL
        );
        let missing = CString::new("/nonexistent/model.gguf").unwrap();
        assert_eq!(
            bitnet_load(missing.as_ptr(), null(), &mut e),
            BITNET_ERR_LOAD
        );
        assert!(
            last_error().contains("/nonexistent/model.gguf"),
            "{}",
            last_error()
        );
        let not_gguf = CString::new(
            bitnet_testdata::golden("tiny/p1_english.txt")
                .to_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            bitnet_load(not_gguf.as_ptr(), null(), &mut e),
            BITNET_ERR_LOAD
        );
        let bad_utf8 = [0xffu8, 0xfe, 0];
        assert_eq!(
            bitnet_load(bad_utf8.as_ptr().cast::<c_char>(), null(), &mut e),
            BITNET_ERR_INVALID
        );
    }
    for (c, code, word) in [
        (
            bitnet_config {
                numerics: 7,
                ..cfg()
            },
            BITNET_ERR_INVALID,
            "numerics",
        ),
        (
            bitnet_config {
                kv_type: -1,
                ..cfg()
            },
            BITNET_ERR_INVALID,
            "kv_type",
        ),
        (
            bitnet_config {
                lm_head: 9,
                ..cfg()
            },
            BITNET_ERR_INVALID,
            "lm_head",
        ),
        (
            bitnet_config { device: 5, ..cfg() },
            BITNET_ERR_INVALID,
            "device",
        ),
        (
            bitnet_config {
                device: BITNET_DEVICE_GPU,
                numerics: BITNET_NUMERICS_EXACT,
                ..cfg()
            },
            BITNET_ERR_INVALID,
            "GPU backend does not run exact",
        ),
        (
            bitnet_config {
                ram_budget: 1 << 20,
                ..cfg()
            },
            BITNET_ERR_ENGINE,
            "too small",
        ),
        (
            bitnet_config {
                ram_budget: 1 << 30,
                in_memory: true,
                ..cfg()
            },
            BITNET_ERR_INVALID,
            "in-memory",
        ),
        (
            bitnet_config {
                n_threads: 100_000,
                ..cfg()
            },
            BITNET_ERR_INVALID,
            "n_threads",
        ),
        (
            bitnet_config {
                numerics: BITNET_NUMERICS_EXACT,
                kv_type: BITNET_KV_Q8_0,
                ..cfg()
            },
            BITNET_ERR_INVALID,
            "f16",
        ),
        (
            bitnet_config {
                numerics: BITNET_NUMERICS_EXACT,
                kv_type: BITNET_KV_Q4_0,
                ..cfg()
            },
            BITNET_ERR_INVALID,
            "f16",
        ),
        (
            bitnet_config {
                numerics: BITNET_NUMERICS_EXACT,
                lm_head: BITNET_LM_HEAD_Q8_0,
                ..cfg()
            },
            BITNET_ERR_INVALID,
            "head",
        ),
    ] {
        let (rc, msg) = load(&c).err().unwrap();
        assert_eq!(rc, code, "{msg}");
        assert!(msg.contains(word), "{msg} lacks {word}");
    }
    // A budget the model fits: the low-memory mode, the same logits.
    let streamed = load(&bitnet_config {
        ram_budget: 1 << 30,
        n_ctx: 256,
        ..cfg()
    })
    .unwrap();
    let normal = load(&cfg()).unwrap();
    let ids = [4000u32, 791, 1217, 1419];
    let (mut a, mut b) = (vec![0f32; 4256], vec![0f32; 4256]);
    let mut info = bitnet_info::default();
    // SAFETY: valid pointers.
    unsafe {
        assert_eq!(
            bitnet_forward(streamed.0, ids.as_ptr(), 4, a.as_mut_ptr(), 4256),
            BITNET_OK
        );
        assert_eq!(
            bitnet_forward(normal.0, ids.as_ptr(), 4, b.as_mut_ptr(), 4256),
            BITNET_OK
        );
        assert_eq!(bitnet_info_get(streamed.0, &mut info), BITNET_OK);
    }
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    assert_eq!(info.n_ctx, 256);
    // AUTO runs on the CPU in this build.
    assert!(load(&bitnet_config {
        device: BITNET_DEVICE_AUTO,
        ..cfg()
    })
    .is_ok());
}

#[test]
fn info_tokenize_detokenize() {
    let e = load(&cfg()).unwrap();
    let mut info = bitnet_info::default();
    // SAFETY: valid pointers throughout.
    unsafe {
        assert_eq!(bitnet_info_get(e.0, &mut info), BITNET_OK);
        assert_eq!((info.n_vocab, info.n_ctx, info.n_layer), (4256, 512, 2));
        assert_eq!((info.bos, info.eos, info.n_threads), (4000, 4001, 1));

        let text = CString::new("Hello <|eot_id|> world — ü").unwrap();
        let mut n = 0usize;
        // Size query, then a buffer one too small, then the right size.
        assert_eq!(
            bitnet_tokenize(e.0, text.as_ptr(), true, true, null_mut(), 0, &mut n),
            BITNET_ERR_BUFFER
        );
        let need = n;
        let mut ids = vec![0u32; need];
        assert_eq!(
            bitnet_tokenize(
                e.0,
                text.as_ptr(),
                true,
                true,
                ids.as_mut_ptr(),
                need - 1,
                &mut n
            ),
            BITNET_ERR_BUFFER
        );
        assert!(ids.iter().all(|&t| t == 0), "nothing written on failure");
        assert_eq!(
            bitnet_tokenize(
                e.0,
                text.as_ptr(),
                true,
                true,
                ids.as_mut_ptr(),
                need,
                &mut n
            ),
            BITNET_OK
        );
        assert_eq!(ids[0], 4000);
        assert!(ids.contains(&4009), "special parsed: {ids:?}");
        let mut plain = vec![0u32; 64];
        assert_eq!(
            bitnet_tokenize(
                e.0,
                text.as_ptr(),
                false,
                false,
                plain.as_mut_ptr(),
                64,
                &mut n
            ),
            BITNET_OK
        );
        assert!(!plain[..n].contains(&4009) && plain[0] != 4000);

        // Back to text: the BOS text plus the original.
        let mut buf = vec![0 as c_char; 256];
        let mut len = 0usize;
        assert_eq!(
            bitnet_detokenize(
                e.0,
                ids[1..].as_ptr(),
                ids.len() - 1,
                buf.as_mut_ptr(),
                256,
                &mut len
            ),
            BITNET_OK
        );
        let back = CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
        assert_eq!(back, "Hello <|eot_id|> world — ü");
        assert_eq!(len, back.len());
        assert_eq!(
            bitnet_detokenize(e.0, ids.as_ptr(), ids.len(), buf.as_mut_ptr(), 3, &mut len),
            BITNET_ERR_BUFFER
        );
        let bad = [4256u32];
        assert_eq!(
            bitnet_detokenize(e.0, bad.as_ptr(), 1, buf.as_mut_ptr(), 256, &mut len),
            BITNET_ERR_INVALID
        );
        assert_eq!(
            bitnet_tokenize(null(), text.as_ptr(), true, true, null_mut(), 0, &mut n),
            BITNET_ERR_NULL
        );
    }
}

/// One byte past `p`: inside the same buffer, misaligned for any `T` wider than a byte.
fn one_byte_past<T>(p: *const T) -> *const T {
    p.cast::<u8>().wrapping_add(1).cast()
}

/// Pointers that no valid buffer has: misaligned for their type, or a length of -1 passed as
/// `size_t`. Each is an error code with a message, never undefined behaviour.
#[test]
fn misaligned_pointers_and_impossible_lengths_are_refused() {
    let e = load(&cfg()).unwrap();
    let ids = [1u32, 2, 3, 4];
    let mut logits = vec![0f32; 4256 + 1];
    let mut n = 0usize;
    let mut bytes = [0u8; 64];
    let odd_ids = one_byte_past(ids.as_ptr());
    let odd_logits = one_byte_past(logits.as_ptr()).cast_mut();
    let odd_n = one_byte_past(bytes.as_ptr().cast::<usize>()).cast_mut();
    let text = CString::new("Hello").unwrap();
    // SAFETY: no call reads or writes through the bad pointers: each is refused first.
    unsafe {
        let check = |rc: i32, what: &str, why: &str| {
            assert_eq!(rc, BITNET_ERR_INVALID, "{what}");
            let msg = last_error();
            assert!(
                msg.contains(&format!("`{what}`")) && msg.contains(why),
                "{msg}"
            );
        };
        let misaligned = "is not aligned";
        check(
            bitnet_forward(e.0, odd_ids, 2, logits.as_mut_ptr(), 4256),
            "ids",
            "is not aligned to 4 bytes",
        );
        check(
            bitnet_forward(e.0, ids.as_ptr(), 2, odd_logits, 4256),
            "logits",
            misaligned,
        );
        check(
            bitnet_detokenize(e.0, odd_ids, 2, bytes.as_mut_ptr().cast(), 64, &mut n),
            "ids",
            misaligned,
        );
        check(
            bitnet_tokenize(e.0, text.as_ptr(), true, false, null_mut(), 0, odd_n),
            "n_out",
            misaligned,
        );
        check(
            bitnet_forward(e.0, ids.as_ptr(), usize::MAX, logits.as_mut_ptr(), 4256),
            "ids",
            "cannot fit in memory",
        );
        check(
            bitnet_detokenize(
                e.0,
                ids.as_ptr(),
                usize::MAX / 2,
                bytes.as_mut_ptr().cast(),
                64,
                &mut n,
            ),
            "ids",
            "cannot fit in memory",
        );
        // A misaligned config or params struct.
        let cfgs = [cfg(), cfg()];
        let odd_cfg = one_byte_past(cfgs.as_ptr());
        let mut out = null_mut();
        assert_eq!(
            bitnet_load(model().as_ptr(), odd_cfg, &mut out),
            BITNET_ERR_INVALID
        );
        assert!(out.is_null());
        assert!(
            last_error().contains("`config` is not aligned"),
            "{}",
            last_error()
        );
        let params = [bitnet_gen_params_default(), bitnet_gen_params_default()];
        let odd_params = one_byte_past(params.as_ptr());
        let mut sampler = null_mut();
        assert_eq!(
            bitnet_sampler_new(odd_params, &mut sampler),
            BITNET_ERR_INVALID
        );
        assert!(sampler.is_null());
        assert!(
            last_error().contains("`params` is not aligned"),
            "{}",
            last_error()
        );
        // The same calls with good pointers succeed.
        assert_eq!(
            bitnet_forward(e.0, ids.as_ptr(), 2, logits.as_mut_ptr(), 4256),
            BITNET_OK
        );
    }
}

#[test]
fn exact_forward_matches_the_golden_logits() {
    let e = load(&bitnet_config {
        numerics: BITNET_NUMERICS_EXACT,
        ..cfg()
    })
    .unwrap();
    for p in ["p1_english", "p2_unicode", "p4_code_ws"] {
        let tokens: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(bitnet_testdata::golden(&format!("tiny/{p}.tokens.json")))
                .unwrap(),
        )
        .unwrap();
        let ids: Vec<u32> = serde_json::from_value(tokens["prompt_tokens"].clone()).unwrap();
        let want = std::fs::read(bitnet_testdata::golden(&format!("tiny/{p}.logits.f32"))).unwrap();
        let mut logits = vec![0f32; 4256];
        // SAFETY: valid pointers.
        let rc = unsafe { bitnet_forward(e.0, ids.as_ptr(), ids.len(), logits.as_mut_ptr(), 4256) };
        assert_eq!(rc, BITNET_OK, "{}", last_error());
        let got: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert!(got == want, "{p}: exact logits differ from bitnet.cpp's");
    }
    let mut logits = vec![0f32; 10];
    let ids = [4000u32, 5000];
    // SAFETY: valid pointers.
    unsafe {
        assert_eq!(
            bitnet_forward(e.0, ids.as_ptr(), 1, logits.as_mut_ptr(), 10),
            BITNET_ERR_BUFFER
        );
        let mut big = vec![0f32; 4256];
        assert_eq!(
            bitnet_forward(e.0, ids.as_ptr(), 2, big.as_mut_ptr(), 4256),
            BITNET_ERR_INVALID
        );
        assert_eq!(
            bitnet_forward(e.0, ids.as_ptr(), 0, big.as_mut_ptr(), 4256),
            BITNET_ERR_INVALID
        );
    }
}

struct Collect {
    text: Vec<u8>,
    calls: usize,
    stop_after: usize,
    engine: *const bitnet_engine,
    reentry: i32,
}

unsafe extern "C" fn collect(text: *const c_char, len: usize, user: *mut c_void) -> bool {
    // SAFETY: `user` is the `Collect` passed to bitnet_generate; `text` has `len` bytes.
    let c = unsafe { &mut *user.cast::<Collect>() };
    // SAFETY: as above.
    let bytes = unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len) };
    // SAFETY: the text is also NUL-terminated.
    assert_eq!(unsafe { *text.add(len) }, 0);
    c.text.extend_from_slice(bytes);
    c.calls += 1;
    if !c.engine.is_null() {
        let mut info = bitnet_info::default();
        // SAFETY: valid pointers; the engine is busy, which the call must report.
        c.reentry = unsafe { bitnet_info_get(c.engine, &mut info) };
    }
    c.calls < c.stop_after
}

#[test]
fn generate_streams_stops_and_refuses_reentry() {
    let e = load(&cfg()).unwrap();
    let prompt = CString::new("Once upon a time").unwrap();
    let params = bitnet_gen_params {
        max_tokens: 40,
        temperature: 0.0,
        ..bitnet_gen_params_default()
    };
    let mut c = Collect {
        text: Vec::new(),
        calls: 0,
        stop_after: usize::MAX,
        engine: null(),
        reentry: 0,
    };
    let mut ids = [0u32; 64];
    let mut res = bitnet_gen_result::default();
    // SAFETY: valid pointers; `c` outlives the call.
    let rc = unsafe {
        bitnet_generate(
            e.0,
            prompt.as_ptr(),
            &params,
            Some(collect),
            (&raw mut c).cast(),
            ids.as_mut_ptr(),
            64,
            &mut res,
        )
    };
    assert_eq!(rc, BITNET_OK, "{}", last_error());
    assert_eq!(res.n_generated, 40);
    assert_eq!(res.finish, BITNET_FINISH_LENGTH);
    // The streamed text is the detokenized ids, less the control tokens (ids 4000 and up
    // in this vocabulary), which are never printed.
    let text_ids: Vec<u32> = ids[..40].iter().copied().filter(|&t| t < 4000).collect();
    assert!(text_ids.len() < 40, "the greedy reply has control tokens");
    let mut buf = vec![0 as c_char; 4096];
    let mut len = 0;
    // SAFETY: valid pointers.
    unsafe {
        assert_eq!(
            bitnet_detokenize(
                e.0,
                text_ids.as_ptr(),
                text_ids.len(),
                buf.as_mut_ptr(),
                4096,
                &mut len
            ),
            BITNET_OK
        );
    }
    let full: Vec<u8> = buf[..len].iter().map(|&b| b.to_ne_bytes()[0]).collect();
    assert_eq!(
        String::from_utf8_lossy(&full),
        String::from_utf8_lossy(&c.text)
    );

    // Stop from the callback after 3 pieces; a call into the busy engine is refused.
    let mut c2 = Collect {
        text: Vec::new(),
        calls: 0,
        stop_after: 3,
        engine: e.0,
        reentry: 0,
    };
    let mut stats = bitnet_stats::default();
    // SAFETY: valid pointers; `c2` outlives the call.
    unsafe {
        let rc = bitnet_generate(
            e.0,
            prompt.as_ptr(),
            &params,
            Some(collect),
            (&raw mut c2).cast(),
            null_mut(),
            0,
            &mut res,
        );
        assert_eq!(rc, BITNET_OK);
        assert_eq!(res.finish, BITNET_FINISH_CANCELLED);
        assert_eq!(c2.calls, 3);
        assert_eq!(c2.reentry, BITNET_ERR_INVALID);
        // The prompt was cached from the first call.
        assert!(res.n_cached_tokens > 0);
        assert_eq!(bitnet_stats_get(e.0, &mut stats), BITNET_OK);
        assert_eq!(stats.last.finish, BITNET_FINISH_CANCELLED);
        assert!(stats.peak_rss_bytes > 0 && stats.kv_cache_bytes > 0);
        assert!(stats.model_file_bytes > 2_000_000);

        // Bad parameters.
        let bad = bitnet_gen_params {
            top_p: 2.0,
            ..params
        };
        assert_eq!(
            bitnet_generate(
                e.0,
                prompt.as_ptr(),
                &bad,
                None,
                null_mut(),
                null_mut(),
                0,
                null_mut()
            ),
            BITNET_ERR_INVALID
        );
        assert!(last_error().contains("top_p"), "{}", last_error());
        let zero = bitnet_gen_params {
            max_tokens: 0,
            ..params
        };
        assert_eq!(
            bitnet_generate(
                e.0,
                prompt.as_ptr(),
                &zero,
                None,
                null_mut(),
                null_mut(),
                0,
                null_mut()
            ),
            BITNET_ERR_INVALID
        );
        let stops = bitnet_gen_params {
            stop: null(),
            n_stop: 2,
            ..params
        };
        assert_eq!(
            bitnet_generate(
                e.0,
                prompt.as_ptr(),
                &stops,
                None,
                null_mut(),
                null_mut(),
                0,
                null_mut()
            ),
            BITNET_ERR_NULL
        );
        assert_eq!(
            bitnet_generate(
                e.0,
                prompt.as_ptr(),
                &params,
                None,
                null_mut(),
                null_mut(),
                5,
                null_mut()
            ),
            BITNET_ERR_NULL
        );
    }
}

#[test]
fn stop_strings_and_chat_prompts() {
    let e = load(&cfg()).unwrap();
    let prompt = CString::new("Once upon a time").unwrap();
    let base = bitnet_gen_params {
        max_tokens: 40,
        temperature: 0.0,
        ..bitnet_gen_params_default()
    };
    let mut c = Collect {
        text: Vec::new(),
        calls: 0,
        stop_after: usize::MAX,
        engine: null(),
        reentry: 0,
    };
    let mut res = bitnet_gen_result::default();
    // SAFETY: valid pointers throughout.
    unsafe {
        let rc = bitnet_generate(
            e.0,
            prompt.as_ptr(),
            &base,
            Some(collect),
            (&raw mut c).cast(),
            null_mut(),
            0,
            &mut res,
        );
        assert_eq!(rc, BITNET_OK);
        let text = String::from_utf8(c.text.clone()).unwrap();
        // A stop string from the middle of the greedy reply ends it there.
        let cut = text.char_indices().nth(text.chars().count() / 2).unwrap().0;
        let stop_at = &text[cut..];
        let stop_s = CString::new(stop_at.chars().take(3).collect::<String>()).unwrap();
        let list = [stop_s.as_ptr()];
        let with_stop = bitnet_gen_params {
            stop: list.as_ptr(),
            n_stop: 1,
            ..base
        };
        c.text.clear();
        let rc = bitnet_generate(
            e.0,
            prompt.as_ptr(),
            &with_stop,
            Some(collect),
            (&raw mut c).cast(),
            null_mut(),
            0,
            &mut res,
        );
        assert_eq!(rc, BITNET_OK);
        assert_eq!(res.finish, BITNET_FINISH_STOP);
        let got = String::from_utf8(c.text.clone()).unwrap();
        assert!(
            text.starts_with(&got) && got.len() <= cut,
            "{got:?} / {text:?}"
        );

        let chat = bitnet_gen_params {
            chat: true,
            max_tokens: 4,
            ..base
        };
        assert_eq!(
            bitnet_generate(
                e.0,
                prompt.as_ptr(),
                &chat,
                None,
                null_mut(),
                null_mut(),
                0,
                &mut res
            ),
            BITNET_OK
        );
        // BOS, "User: " ... <|eot_id|> "Assistant: ": more tokens than the plain prompt.
        assert!(res.n_prompt_tokens + res.n_cached_tokens > 8);
    }
}

#[test]
fn sampler_matches_the_rust_chain() {
    let logits: Vec<f32> = (0..300).map(|i| ((i * 37) % 101) as f32 / 10.0).collect();
    let params = bitnet_gen_params {
        seed: 42,
        temperature: 1.1,
        ..bitnet_gen_params_default()
    };
    let mut s = null_mut();
    let mut rust = bitnet_sampling::Sampler::new(bitnet_sampling::SamplerParams {
        seed: 42,
        temperature: 1.1,
        ..bitnet_sampling::SamplerParams::default()
    })
    .unwrap();
    // SAFETY: valid pointers throughout.
    unsafe {
        assert_eq!(bitnet_sampler_new(&params, &mut s), BITNET_OK);
        for _ in 0..50 {
            let mut t = 0;
            assert_eq!(
                bitnet_sampler_sample(s, logits.as_ptr(), logits.len(), &mut t),
                BITNET_OK
            );
            assert_eq!(t, rust.sample(&logits).unwrap());
            assert_eq!(bitnet_sampler_accept(s, t), BITNET_OK);
            rust.accept(t);
        }
        let mut t = 0;
        assert_eq!(
            bitnet_sampler_sample(s, null(), 0, &mut t),
            BITNET_ERR_INVALID
        );
        let nan = [f32::NAN; 4];
        assert_eq!(
            bitnet_sampler_sample(s, nan.as_ptr(), 4, &mut t),
            BITNET_ERR_INVALID
        );
        assert_eq!(
            bitnet_sampler_sample(null_mut(), nan.as_ptr(), 4, &mut t),
            BITNET_ERR_NULL
        );
        bitnet_sampler_free(s);
        bitnet_sampler_free(null_mut());
        bitnet_free(null_mut());

        let bad = bitnet_gen_params {
            min_p: -1.0,
            ..params
        };
        assert_eq!(bitnet_sampler_new(&bad, &mut s), BITNET_ERR_INVALID);
        assert!(s.is_null());
    }
    // SAFETY: a static NUL-terminated string.
    let v = unsafe { CStr::from_ptr(bitnet_version()) };
    assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}

/// `screen_head` generates the ids the plain head generates, greedy and sampled; it is
/// refused with exact numerics.
#[test]
fn the_screened_head_generates_the_same_ids() {
    let ids_of = |e: &Engine, params: &bitnet_gen_params| {
        let prompt = CString::new("Once upon a time").unwrap();
        let mut ids = [0u32; 32];
        let mut res = bitnet_gen_result::default();
        // SAFETY: valid pointers; no callback.
        let rc = unsafe {
            bitnet_generate(
                e.0,
                prompt.as_ptr(),
                params,
                None,
                null_mut(),
                ids.as_mut_ptr(),
                32,
                &mut res,
            )
        };
        assert_eq!(rc, BITNET_OK, "{}", last_error());
        ids[..usize::try_from(res.n_generated).unwrap()].to_vec()
    };
    let plain = load(&cfg()).unwrap();
    let screened = load(&bitnet_config {
        screen_head: true,
        ..cfg()
    })
    .unwrap();
    for (temperature, top_k, seed) in [(0.0, 40, 1), (0.9, 40, 2), (0.9, 5, 3)] {
        let params = bitnet_gen_params {
            max_tokens: 32,
            temperature,
            top_k,
            seed,
            ..bitnet_gen_params_default()
        };
        let want = ids_of(&plain, &params);
        assert_eq!(want.len(), 32);
        assert_eq!(ids_of(&screened, &params), want, "{temperature} {top_k}");
    }
    let err = load(&bitnet_config {
        screen_head: true,
        numerics: BITNET_NUMERICS_EXACT,
        ..cfg()
    })
    .err()
    .unwrap();
    assert_eq!(err.0, BITNET_ERR_INVALID);
    assert!(err.1.contains("screened LM head"), "{}", err.1);
}

#[test]
fn gpu_device_forward_matches_the_cpu() {
    // CI has Mesa's software Vulkan driver; without an adapter this fails unless
    // BITNET_GPU_TESTS=skip.
    if !bitnet_gpu::probe::gpu_tests_enabled() {
        return;
    }
    let cpu = load(&cfg()).unwrap();
    let gpu = load(&bitnet_config {
        device: BITNET_DEVICE_GPU,
        ..cfg()
    })
    .unwrap();
    let ids = [4000u32, 791, 1864, 315, 9, 2000, 17];
    let mut a = vec![0f32; 4256];
    let mut b = vec![0f32; 4256];
    // SAFETY: valid pointers and lengths.
    unsafe {
        assert_eq!(
            bitnet_forward(cpu.0, ids.as_ptr(), ids.len(), a.as_mut_ptr(), 4256),
            BITNET_OK
        );
        assert_eq!(
            bitnet_forward(gpu.0, ids.as_ptr(), ids.len(), b.as_mut_ptr(), 4256),
            BITNET_OK,
            "{}",
            last_error()
        );
    }
    let md = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(md <= 0.25, "max |Δ| {md}");
    let top = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|x, y| x.1.total_cmp(y.1))
            .map(|(i, _)| i)
    };
    assert_eq!(top(&a), top(&b));
}

/// `json_schema` and `grammar` hold the reply (temperature 1 on the random tiny model); one
/// that does not compile, a negated Lark terminal, or both at once, is `BITNET_ERR_INVALID`
/// with a message.
#[test]
fn structured_output_through_the_c_api() {
    let e = load(&cfg()).unwrap();
    let prompt = CString::new("A number:").unwrap();
    let schema = CString::new(
        r#"{"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":9}},"required":["n"],"additionalProperties":false}"#,
    )
    .unwrap();
    let grammar = CString::new(r#"start: "yes" | "no""#).unwrap();
    let bad = CString::new(r#"{"type":"nope"}"#).unwrap();
    // A negated terminal: refused (its compilation has no bound on time or memory).
    let negated = CString::new("start: A\nA: ~/[a-z]+/").unwrap();
    let run = |p: &bitnet_gen_params| -> (i32, String) {
        let mut c = Collect {
            text: Vec::new(),
            calls: 0,
            stop_after: usize::MAX,
            engine: null(),
            reentry: 0,
        };
        let mut res = bitnet_gen_result::default();
        // SAFETY: valid pointers throughout.
        let rc = unsafe {
            bitnet_generate(
                e.0,
                prompt.as_ptr(),
                p,
                Some(collect),
                (&raw mut c).cast(),
                null_mut(),
                0,
                &mut res,
            )
        };
        (rc, String::from_utf8(c.text).unwrap())
    };
    for seed in 0..3 {
        let base = bitnet_gen_params {
            max_tokens: 40,
            temperature: 1.0,
            seed,
            ..bitnet_gen_params_default()
        };
        let (rc, text) = run(&bitnet_gen_params {
            json_schema: schema.as_ptr(),
            ..base
        });
        assert_eq!(rc, BITNET_OK, "{}", last_error());
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!((0..=9).contains(&v["n"].as_i64().unwrap()), "{text}");
        let (rc, text) = run(&bitnet_gen_params {
            grammar: grammar.as_ptr(),
            ..base
        });
        assert_eq!(rc, BITNET_OK, "{}", last_error());
        assert!(text == "yes" || text == "no", "{text:?}");
    }
    let base = bitnet_gen_params_default();
    for p in [
        bitnet_gen_params {
            json_schema: bad.as_ptr(),
            ..base
        },
        bitnet_gen_params {
            grammar: negated.as_ptr(),
            ..base
        },
        bitnet_gen_params {
            json_schema: schema.as_ptr(),
            grammar: grammar.as_ptr(),
            ..base
        },
    ] {
        let (rc, _) = run(&p);
        assert_eq!(rc, BITNET_ERR_INVALID);
        assert!(!last_error().is_empty());
    }
}

/// `bitnet_embed` on the file bitnet.cpp's embedding converter writes (gemma3,
/// testdata/golden/embed): the numpy oracle's vectors (fast numerics: cosine ≥ 0.9999; exact:
/// its exact variant bit for bit), the count query, a text, and bad arguments.
#[test]
fn embeddings() {
    let path = bitnet_testdata::golden("embed/gemma3-converted.gguf");
    let path = CString::new(path.to_str().unwrap()).unwrap();
    let prompts: serde_json::Value = serde_json::from_slice(&bitnet_testdata::read(
        "embed/gemma3-converted.prompts.json",
    ))
    .unwrap();
    let p = &prompts[1];
    let name = p["name"].as_str().unwrap();
    let ids: Vec<u32> = p["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| u32::try_from(v.as_u64().unwrap()).unwrap())
        .collect();
    for numerics in [BITNET_NUMERICS_FAST, BITNET_NUMERICS_EXACT] {
        let mut e = null_mut();
        let c = bitnet_config { numerics, ..cfg() };
        // SAFETY: valid pointers.
        assert_eq!(unsafe { bitnet_load(path.as_ptr(), &c, &mut e) }, BITNET_OK);
        let e = Engine(e);
        let mut n = 0usize;
        // SAFETY: valid pointers; a null `out` with capacity 0 asks for the count.
        let rc = unsafe {
            bitnet_embed(
                e.0,
                null(),
                ids.as_ptr(),
                ids.len(),
                true,
                null_mut(),
                0,
                &mut n,
            )
        };
        assert_eq!((rc, n), (BITNET_ERR_BUFFER, 128));
        let mut v = vec![0.0f32; n];
        // SAFETY: room for n floats.
        let rc = unsafe {
            bitnet_embed(
                e.0,
                null(),
                ids.as_ptr(),
                ids.len(),
                true,
                v.as_mut_ptr(),
                n,
                &mut n,
            )
        };
        assert_eq!(rc, BITNET_OK, "{}", last_error());
        if numerics == BITNET_NUMERICS_EXACT {
            let want =
                bitnet_testdata::read_f32(&format!("embed/gemma3-converted.{name}.exact.embd.f32"));
            assert!(bitnet_testdata::first_bit_difference(&v, &want).is_none());
        } else {
            let want =
                bitnet_testdata::read_f32(&format!("embed/gemma3-converted.{name}.embd.f32"));
            assert!(bitnet_testdata::cosine(&v, &want) >= 0.9999);
        }
        // A text, raw: not of unit length.
        let text = CString::new("hello world").unwrap();
        // SAFETY: valid pointers.
        let rc = unsafe {
            bitnet_embed(
                e.0,
                text.as_ptr(),
                null(),
                0,
                false,
                v.as_mut_ptr(),
                v.len(),
                &mut n,
            )
        };
        assert_eq!(rc, BITNET_OK, "{}", last_error());
        let norm: f32 = v.iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() > 1e-3);
        // Bad arguments.
        let empty = CString::new("").unwrap();
        // SAFETY: valid pointers, each bad in the way its case says.
        unsafe {
            assert_eq!(
                bitnet_embed(
                    e.0,
                    empty.as_ptr(),
                    null(),
                    0,
                    true,
                    v.as_mut_ptr(),
                    v.len(),
                    &mut n
                ),
                BITNET_ERR_INVALID
            );
            assert_eq!(
                bitnet_embed(
                    e.0,
                    null(),
                    null(),
                    0,
                    true,
                    v.as_mut_ptr(),
                    v.len(),
                    &mut n
                ),
                BITNET_ERR_INVALID
            );
            let bad = [1_000_000u32];
            assert_eq!(
                bitnet_embed(
                    e.0,
                    null(),
                    bad.as_ptr(),
                    1,
                    true,
                    v.as_mut_ptr(),
                    v.len(),
                    &mut n
                ),
                BITNET_ERR_INVALID
            );
            assert!(last_error().contains("n_vocab"));
            assert_eq!(
                bitnet_embed(
                    null(),
                    text.as_ptr(),
                    null(),
                    0,
                    true,
                    v.as_mut_ptr(),
                    v.len(),
                    &mut n
                ),
                BITNET_ERR_NULL
            );
            assert_eq!(
                bitnet_embed(
                    e.0,
                    text.as_ptr(),
                    null(),
                    0,
                    true,
                    v.as_mut_ptr(),
                    v.len(),
                    null_mut()
                ),
                BITNET_ERR_NULL
            );
        }
    }
}

/// `bitnet_embed_quantize`: a vector's codes worked out by hand (docs/MODEL.md), the count
/// query, a short buffer, a bad width and null pointers.
#[test]
fn embed_quantize() {
    let v = [0.5f32, -0.25, 0.0, 1.0, -1.0, 0.126];
    // (bits, packed codes, scale): 4 bits: codes 4 −2 0 7 −7 1 (×7 / max|v|, half to even);
    // 2 bits: 1 −1 0 1 −1 0 (÷ mean|v|); 1 bit: the signs 1 0 0 1 0 1.
    let mean_abs = 2.876f32 / 6.0;
    for (bits, want, scale) in [
        (4u32, vec![0x4eu8, 0x07, 0x91], 1.0f32 / 7.0),
        (2, vec![0b0111_0001, 0b1100_0000], mean_abs),
        (1, vec![0b1001_0100], mean_abs),
    ] {
        let (mut n, mut s) = (0usize, 0f32);
        // SAFETY: valid pointers; a null `packed` with capacity 0 asks for the count.
        let rc = unsafe {
            bitnet_embed_quantize(v.as_ptr(), v.len(), bits, null_mut(), 0, &mut n, &mut s)
        };
        assert_eq!((rc, n), (BITNET_ERR_BUFFER, want.len()));
        let mut out = vec![0u8; n];
        // SAFETY: room for `n` bytes.
        let rc = unsafe {
            bitnet_embed_quantize(
                v.as_ptr(),
                v.len(),
                bits,
                out.as_mut_ptr(),
                n,
                &mut n,
                &mut s,
            )
        };
        assert_eq!(rc, BITNET_OK);
        assert_eq!(out, want, "{bits} bits");
        assert!((s - scale).abs() < 1e-6, "{bits} bits: scale {s}");
    }
    let (mut n, mut s) = (0usize, 0f32);
    let mut out = [0u8; 8];
    // SAFETY: valid pointers.
    unsafe {
        assert_eq!(
            bitnet_embed_quantize(v.as_ptr(), v.len(), 3, out.as_mut_ptr(), 8, &mut n, &mut s),
            BITNET_ERR_INVALID
        );
        assert_eq!(
            bitnet_embed_quantize(null(), 4, 8, out.as_mut_ptr(), 8, &mut n, &mut s),
            BITNET_ERR_NULL
        );
        assert_eq!(
            bitnet_embed_quantize(
                v.as_ptr(),
                v.len(),
                8,
                out.as_mut_ptr(),
                8,
                null_mut(),
                &mut s
            ),
            BITNET_ERR_NULL
        );
        assert_eq!(
            bitnet_embed_quantize(
                v.as_ptr(),
                v.len(),
                8,
                out.as_mut_ptr(),
                8,
                &mut n,
                null_mut()
            ),
            BITNET_ERR_NULL
        );
    }
}
