//! Constrained decoding on the tiny golden model (random weights: left alone it writes no
//! JSON at all): schemas, JSON objects, regular expressions and Lark grammars hold the output
//! at temperature 1.0 whatever the seed; bad schemas and grammars are typed errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bitnet_engine::{load, Constraint, Engine, EngineError, FinishReason, GenParams, LoadOptions};
use bitnet_sampling::SamplerParams;
use serde_json::{json, Value};

fn engine() -> Engine {
    let path = bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf");
    load(
        &path,
        &LoadOptions {
            threads: 2,
            ..LoadOptions::default()
        },
        &mut |_| {},
    )
    .unwrap()
}

fn generate(e: &Engine, c: Constraint, seed: u64, max_tokens: usize) -> (String, FinishReason) {
    let prompt = e.tokenizer.encode("Answer in JSON:", true, false).unwrap();
    let mut s = e.new_session(512).unwrap();
    let params = GenParams {
        max_tokens,
        sampler: SamplerParams {
            temperature: 1.0,
            seed,
            ..SamplerParams::default()
        },
        constraint: Some(c),
        ..GenParams::default()
    };
    let mut text = String::new();
    let stats = e
        .generate(&mut s, &prompt, false, &params, &mut |ev| {
            if let bitnet_engine::Event::Text(t) = ev {
                text.push_str(t);
            }
            true
        })
        .unwrap();
    (text, stats.finish)
}

#[test]
fn unconstrained_output_is_not_json() {
    let e = engine();
    let mut s = e.new_session(512).unwrap();
    let prompt = e.tokenizer.encode("Answer in JSON:", true, false).unwrap();
    let params = GenParams {
        max_tokens: 48,
        sampler: SamplerParams {
            temperature: 1.0,
            seed: 1,
            ..SamplerParams::default()
        },
        ..GenParams::default()
    };
    let mut text = String::new();
    e.generate(&mut s, &prompt, false, &params, &mut |ev| {
        if let bitnet_engine::Event::Text(t) = ev {
            text.push_str(t);
        }
        true
    })
    .unwrap();
    assert!(serde_json::from_str::<Value>(&text).is_err(), "{text:?}");
}

#[test]
fn schemas_hold_the_output_at_temperature_one() {
    let e = engine();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": { "type": "string", "maxLength": 12 },
            "age": { "type": "integer", "minimum": 0, "maximum": 120 },
            "tags": { "type": "array", "items": { "enum": ["a", "b", "c"] },
                      "minItems": 1, "maxItems": 3 },
            "ok": { "type": "boolean" }
        },
        "required": ["name", "age", "tags", "ok"],
        "additionalProperties": false
    });
    for seed in 0..8 {
        let (text, finish) = generate(&e, Constraint::JsonSchema(schema.clone()), seed, 200);
        assert_eq!(finish, FinishReason::Eog, "seed {seed}: {text:?}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|err| panic!("{text:?}: {err}"));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 4, "{text}");
        assert!(o["name"].as_str().unwrap().chars().count() <= 12, "{text}");
        assert!((0..=120).contains(&o["age"].as_i64().unwrap()), "{text}");
        let tags = o["tags"].as_array().unwrap();
        assert!((1..=3).contains(&tags.len()), "{text}");
        assert!(tags
            .iter()
            .all(|t| ["a", "b", "c"].contains(&t.as_str().unwrap())));
        assert!(o["ok"].is_boolean(), "{text}");
    }
}

/// Integers and numbers the schema leaves open are bounded (16 digits, as llama.cpp's schema
/// grammar; 8 decimals), so sampling at temperature 1 on random weights cannot write
/// digits until `max_tokens` cuts the JSON: every reply ends and parses; a schema's own
/// bound is kept.
#[test]
fn open_integers_and_numbers_cannot_run_away() {
    let e = engine();
    let schema = json!({
        "type": "object",
        "properties": {
            "n": { "type": "integer" },
            "x": { "type": "number" },
            "low": { "type": "integer", "minimum": 5 }
        },
        "required": ["n", "x", "low"],
        "additionalProperties": false
    });
    let digits = |s: &str| s.chars().filter(char::is_ascii_digit).count();
    for seed in 0..20 {
        let (text, finish) = generate(&e, Constraint::JsonSchema(schema.clone()), seed, 200);
        assert_eq!(finish, FinishReason::Eog, "seed {seed}: {text:?}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|err| panic!("{text:?}: {err}"));
        // The numbers as written: n and low at most 16 digits; x at most 16 before the point
        // and 8 after it, no exponent.
        let raw = |k: &str| -> String {
            let at = text.find(&format!("\"{k}\": ")).unwrap() + k.len() + 4;
            text[at..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || "-.eE+".contains(*c))
                .collect()
        };
        assert!(digits(&raw("n")) <= 16, "seed {seed}: {text}");
        let x = raw("x");
        assert!(!x.contains(['e', 'E']), "seed {seed}: {text}");
        let (int, frac) = x.split_once('.').unwrap_or((&x, ""));
        assert!(
            digits(int) <= 16 && digits(frac) <= 16,
            "seed {seed}: {text}"
        );
        assert!(
            v["low"].as_i64().is_some_and(|l| l >= 5),
            "seed {seed}: {text}"
        );
        assert!(digits(&raw("low")) <= 16, "seed {seed}: {text}");
    }
}

#[test]
fn json_object_regex_and_lark() {
    let e = engine();
    for seed in 0..4 {
        let (text, finish) = generate(&e, Constraint::JsonObject, seed, 400);
        assert!(text.starts_with('{'), "{text:?}");
        if finish == FinishReason::Eog {
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|err| panic!("{text:?}: {err}"));
            assert!(v.is_object(), "{text:?}");
        }

        let (text, finish) = generate(
            &e,
            Constraint::Regex("[0-9]{3}-[a-z]{2,4}".into()),
            seed,
            64,
        );
        assert_eq!(finish, FinishReason::Eog, "{text:?}");
        let (digits, letters) = text.split_once('-').unwrap();
        assert!(
            digits.len() == 3 && digits.bytes().all(|b| b.is_ascii_digit()),
            "{text:?}"
        );
        assert!((2..=4).contains(&letters.len()), "{text:?}");
        assert!(letters.bytes().all(|b| b.is_ascii_lowercase()), "{text:?}");

        let lark = "start: \"yes\" | \"no\" | \"maybe \" NUM\nNUM: /[1-9]/";
        let (text, finish) = generate(&e, Constraint::Lark(lark.into()), seed, 16);
        assert_eq!(finish, FinishReason::Eog, "{text:?}");
        assert!(
            text == "yes" || text == "no" || (text.starts_with("maybe ") && text.len() == 7),
            "{text:?}"
        );
    }
}

#[test]
fn bad_schemas_and_grammars_are_typed_errors() {
    let e = engine();
    let cases = [
        Constraint::JsonSchema(json!({ "type": "no-such-type" })),
        Constraint::JsonSchema(json!({ "$ref": "#/$defs/missing" })),
        Constraint::JsonSchema(json!({ "type": "integer", "minimum": 5, "maximum": 1 })),
        // Finer than the number automaton holds (a panic or a wrap inside the compiler).
        Constraint::JsonSchema(json!({ "type": "number", "multipleOf": 1e-10 })),
        Constraint::Regex("(unclosed".into()),
        Constraint::Lark("start: undefined_rule".into()),
        Constraint::Lark("this is not a grammar ::= [".into()),
    ];
    for c in cases {
        match e.constraint(&c) {
            Err(EngineError::Grammar { reason, .. }) => assert!(!reason.is_empty()),
            other => panic!("{c:?}: {other:?}"),
        }
    }
}

/// llguidance's negated and intersected terminals are refused (compiling a negated large
/// regex has no bound on time or memory); `~` and `&` inside strings, regexes, comments and
/// special tokens, and `~ N` repetitions, are not operators and compile.
#[test]
fn negated_and_intersected_terminals_are_refused_the_rest_compiles() {
    for (g, op) in [
        ("start: ~\"a\"", "negated"),
        ("start: A\nA: ~ /x+/", "negated"),
        ("start: A\nA: ~(\"a\" | \"b\")", "negated"),
        ("start: A\nA: /a+/ & /[ab]+/", "intersected"),
        ("start: \"~\" A\nA: \"x\"&\"x\"", "intersected"),
        ("start: \"unterminated ~\nA: ~\"b\"", "negated"),
    ] {
        match Constraint::grammar_text(g) {
            Err(EngineError::Grammar { reason, .. }) => {
                assert!(reason.starts_with(op), "{g:?}: {reason}")
            }
            other => panic!("{g:?}: {other:?}"),
        }
    }
    let e = engine();
    for g in [
        "start: \"ab\" ~ 2",
        "start: \"ab\" ~ 1..3 \"c\"~2",
        "start: \"~&\" A // a ~comment & more\n# ~ & too\nA: /[~&\\/]+~/",
        "start: %json {\"type\": \"string\", \"pattern\": \"^[a-z~&]{2}$\"}",
    ] {
        let c = Constraint::grammar_text(g).unwrap_or_else(|err| panic!("{g:?}: {err}"));
        e.constraint(&c)
            .unwrap_or_else(|err| panic!("{g:?}: {err}"));
    }
}

fn weather_tools(choice: Value, parallel: bool) -> bitnet_engine::tools::ToolSet {
    bitnet_engine::tools::ToolSet::from_openai(
        &json!([
            {"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 12},
                                   "unit": {"enum": ["C", "F"]}},
                    "required": ["city", "unit"], "additionalProperties": false}}},
            {"type": "function", "function": {"name": "now"}}
        ]),
        Some(&choice),
        Some(parallel),
    )
    .unwrap()
    .unwrap()
}

/// Each call's name is a tool's and its arguments match that tool's schema.
fn check_calls(calls: &[(String, String)], only: Option<&str>, text: &str) {
    for (name, args) in calls {
        let a: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        let o = a.as_object().unwrap();
        match name.as_str() {
            "get_weather" => {
                assert_eq!(o.len(), 2, "{text:?}");
                assert!(
                    o["city"].as_str().unwrap().chars().count() <= 12,
                    "{text:?}"
                );
                assert!(
                    ["C", "F"].contains(&o["unit"].as_str().unwrap()),
                    "{text:?}"
                );
            }
            "now" => assert!(o.is_empty(), "{text:?}"),
            other => panic!("unknown function {other:?} in {text:?}"),
        }
        if let Some(n) = only {
            assert_eq!(name, n, "{text:?}");
        }
    }
}

#[test]
fn tool_grammars_give_text_or_calls_that_match_their_schemas() {
    use bitnet_engine::tools::split_reply;
    let e = engine();
    for seed in 0..6 {
        // Required: calls only, one per line when parallel.
        let c = weather_tools(json!("required"), true).constraint().unwrap();
        let (text, finish) = generate(&e, c, seed, 300);
        let (content, mut calls) = split_reply(&text);
        assert!(!calls.is_empty(), "{text:?}");
        if finish == FinishReason::Length {
            // A random model may call on and on: the last call can be cut short (cut
            // within its name, what there is of it is text).
            assert!(
                content.is_empty() || content.starts_with("<function="),
                "{text:?}"
            );
            calls.pop();
        } else {
            assert_eq!(finish, FinishReason::Eog, "{text:?}");
            assert!(content.is_empty(), "{text:?}");
        }
        check_calls(&calls, None, &text);

        // One named function, one call.
        let c = weather_tools(
            json!({"type": "function", "function": {"name": "get_weather"}}),
            false,
        )
        .constraint()
        .unwrap();
        let (text, finish) = generate(&e, c, seed, 300);
        let (content, calls) = split_reply(&text);
        assert_eq!(finish, FinishReason::Eog, "{text:?}");
        assert!(content.is_empty() && calls.len() == 1, "{text:?}");
        check_calls(&calls, Some("get_weather"), &text);

        // Auto: text that does not open a call, or calls.
        let c = weather_tools(json!("auto"), true).constraint().unwrap();
        let (text, _) = generate(&e, c, seed, 40);
        let (content, calls) = split_reply(&text);
        assert!(content.is_empty() || calls.is_empty(), "{text:?}");
        assert!(
            !text.starts_with("<function=") || !calls.is_empty(),
            "{text:?}"
        );
        check_calls(&calls, None, &text);
    }
}
