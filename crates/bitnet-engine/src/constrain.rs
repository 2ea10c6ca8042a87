//! Constrained decoding: the output held to a JSON schema, any JSON object, a regular
//! expression or a Lark grammar while it is sampled, by llguidance over the model's own
//! vocabulary.
//!
//! Each step the matcher gives the set of tokens that keep the output a prefix of something
//! the grammar accepts; every other token's logit becomes −∞ before sampling, so the sampler's
//! settings (temperature, top-k, top-p, seed) act on the allowed tokens only. Once the grammar
//! can end, the end-of-generation tokens are allowed too; once it must end, only they are.
//!
//! The vocabulary handed to llguidance is each token's bytes; control tokens (BOS, EOS,
//! `<|eot_id|>`, reserved specials) are marked special (llguidance's 0xFF prefix), so no
//! grammar produces them as text.

use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};

use bitnet_tokenizer::{TokenKind, Tokenizer};

use crate::{EngineError, Result};

/// What the generated text must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON schema (the draft 2020-12 subset llguidance supports).
    JsonSchema(serde_json::Value),
    /// A regular expression that the whole output matches.
    Regex(String),
    /// A grammar in llguidance's Lark syntax (`start: …`; `%json {…}` embeds a schema).
    Lark(String),
}

impl Constraint {
    /// A grammar as a user wrote it: llguidance's Lark syntax (llama.cpp's `%llguidance {}`
    /// header allowed). llama.cpp's own GBNF (`root ::= …`) is refused with what to write
    /// instead, and so are llguidance's negated (`~x`) and intersected (`x & y`) terminals:
    /// compiling the negation of a large regular expression can take minutes and gigabytes
    /// (llguidance's fuel does not bound it), so a request could stall the server.
    pub fn grammar_text(text: &str) -> Result<Constraint> {
        let gbnf = text.lines().any(|l| {
            let l = l.trim_start();
            !l.starts_with('#')
                && l.split_once("::=").is_some_and(|(name, _)| {
                    let name = name.trim();
                    !name.is_empty()
                        && name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                })
        });
        if gbnf {
            return Err(EngineError::Grammar {
                what: "grammar",
                reason: "llama.cpp's GBNF (`name ::= …` rules) is not supported: write it in \
                         llguidance's Lark syntax (`name: …` rules, `start` the top one, \
                         `%json {…}` for a JSON schema)"
                    .into(),
            });
        }
        if let Some(op) = lark_set_operator(text) {
            return Err(EngineError::Grammar {
                what: "grammar",
                reason: format!(
                    "{op} terminals are not supported (their compilation has no bound on time \
                     or memory): write the terminal as a regular expression or alternatives"
                ),
            });
        }
        Ok(Constraint::Lark(text.to_string()))
    }

    fn what(&self) -> &'static str {
        match self {
            Constraint::JsonObject | Constraint::JsonSchema(_) => "JSON schema",
            Constraint::Regex(_) => "regular expression",
            Constraint::Lark(_) => "grammar",
        }
    }

    fn grammar(&self) -> TopLevelGrammar {
        match self {
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(compact(any_object())),
            Constraint::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
            Constraint::Regex(r) => TopLevelGrammar::from_regex(r),
            Constraint::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

/// The first of llguidance's Lark set operators in `text`, outside strings, regular
/// expressions, comments and special tokens: `"negated"` for `~` before an atom (`~ 3`,
/// `~ 1..5` are repetitions), `"intersected"` for `&`. The scan skips what the Lark lexer
/// reads as one token; a run it cannot close (an unterminated string or regex) is read on
/// as ordinary text. Where it reads a run more loosely than the lexer (any escape, a tab in
/// a string) the lexer refuses the text before anything is compiled, so no operator that
/// would reach the compiler is missed.
fn lark_set_operator(text: &str) -> Option<&'static str> {
    let b = text.as_bytes();
    let mut i = 0;
    // The end of a quoted run from `i` (on its opening `q`): after its closing `q`, or at
    // `None` when the line or text ends first (then the run is read as ordinary text).
    let run_end = |i: usize, q: u8, multiline: bool| -> Option<usize> {
        let mut j = i + 1;
        while j < b.len() {
            match b[j] {
                b'\\' => j += 2,
                c if c == q => return Some(j + 1),
                b'\n' if !multiline => return None,
                _ => j += 1,
            }
        }
        None
    };
    while i < b.len() {
        match b[i] {
            b'"' => i = run_end(i, b'"', false).unwrap_or(i + 1),
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i = b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |n| i + n);
            }
            b'/' => i = run_end(i, b'/', true).unwrap_or(i + 1),
            b'#' => {
                i = b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |n| i + n)
            }
            b'<' => {
                // A special token `<[^<>\s]+>`.
                let n = b[i + 1..]
                    .iter()
                    .position(|&c| c == b'<' || c == b'>' || c.is_ascii_whitespace());
                i = match n {
                    Some(n) if n > 0 && b[i + 1 + n] == b'>' => i + n + 2,
                    _ => i + 1,
                };
            }
            b'&' => return Some("intersected"),
            b'~' => {
                let rest = text[i + 1..].trim_start_matches([' ', '\t']).as_bytes();
                let digit = |k: usize| rest.get(k).is_some_and(u8::is_ascii_digit);
                let number = digit(0) || (matches!(rest.first(), Some(b'+' | b'-')) && digit(1));
                if !number {
                    return Some("negated");
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    None
}

/// A schema as the engine compiles it: JSON written on one line, `", "` between items and
/// `": "` after keys (as Python's `json.dumps` writes it), unless the schema sets its own
/// layout (llguidance's `x-guidance` key), since llguidance's default allows any whitespace
/// between tokens, which a sampled model can fill without end; and its integers and numbers
/// bounded where the schema leaves them open ([`bound_numbers`]).
pub(crate) fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    bound_numbers(&mut schema);
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    schema
}

/// Any JSON object, its values any JSON (numbers among them, so [`bound_numbers`] bounds
/// them as it bounds a schema's): JSON mode's schema.
fn any_object() -> serde_json::Value {
    serde_json::json!({
        "$defs": { "value": { "anyOf": [
            { "type": "null" },
            { "type": "boolean" },
            { "type": "number" },
            { "type": "string" },
            { "type": "array", "items": { "$ref": "#/$defs/value" } },
            { "type": "object", "additionalProperties": { "$ref": "#/$defs/value" } }
        ] } },
        "type": "object",
        "additionalProperties": { "$ref": "#/$defs/value" }
    })
}

/// The open side of an integer or number's range where the schema gives no bound: below
/// 10^16 in magnitude, the 16 digits of an integral part that llama.cpp's schema grammar
/// allows.
pub const NUMBER_BOUND: f64 = 1e16;
/// The step of a number's fraction where the schema gives no `multipleOf`: at most 8
/// decimals. (llguidance's `multipleOf` automaton keeps `digit · 10^decimals` in a u32, so
/// 1e-9 and finer overflow it.)
pub const NUMBER_STEP: f64 = 1e-8;

/// What a schema keyword's value is, for the walks over a schema.
enum Holds {
    /// Data (`const`, `enum`, `default`, `examples`): left as it is.
    Data,
    /// A map of names to schemas (a property may be called "const").
    Schemas,
    /// A schema, or an array or object of them.
    Schema,
}

fn key_holds(k: &str) -> Holds {
    match k {
        "const" | "enum" | "default" | "examples" => Holds::Data,
        "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
            Holds::Schemas
        }
        _ => Holds::Schema,
    }
}

/// Bound every `integer` and `number` of a schema whose range is open: a missing lower bound
/// becomes `exclusiveMinimum: -1e16`, a missing upper one `exclusiveMaximum: 1e16` (16
/// digits at most), and a `number` without `multipleOf` takes `1e-8` (8 decimals at most,
/// no exponent), so that sampling cannot run away inside one (unbounded, a sampled model may
/// write digits until `max_tokens` cuts the JSON). A schema's own bounds are kept, each side
/// on its own. Values of `const`, `enum`, `default` and `examples` are data, left as they
/// are.
pub(crate) fn bound_numbers(schema: &mut serde_json::Value) {
    use serde_json::Value;
    match schema {
        Value::Object(o) => {
            let has = |t: &str| match o.get("type") {
                Some(Value::String(s)) => s == t,
                Some(Value::Array(a)) => a.iter().any(|x| x.as_str() == Some(t)),
                _ => false,
            };
            let (int, num) = (has("integer"), has("number"));
            if int || num {
                if !o.contains_key("minimum") && !o.contains_key("exclusiveMinimum") {
                    o.insert("exclusiveMinimum".into(), (-NUMBER_BOUND).into());
                }
                if !o.contains_key("maximum") && !o.contains_key("exclusiveMaximum") {
                    o.insert("exclusiveMaximum".into(), NUMBER_BOUND.into());
                }
                if num && !o.contains_key("multipleOf") {
                    o.insert("multipleOf".into(), NUMBER_STEP.into());
                }
            }
            for (k, v) in o.iter_mut() {
                match key_holds(k) {
                    Holds::Data => {}
                    Holds::Schemas => {
                        if let Value::Object(m) = v {
                            m.values_mut().for_each(bound_numbers);
                        }
                    }
                    Holds::Schema => bound_numbers(v),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(bound_numbers),
        _ => {}
    }
}

/// The first `multipleOf` of a schema that llguidance's number automaton cannot hold, with
/// why: it reads the value as `coef · 10^-decimals` (multiplying by ten until no fraction is
/// left, as llguidance does) and keeps `coef · 10` and `9 · 10^decimals` in a u32, so more
/// than 8 decimals or a coefficient past 429,496,729 would overflow it (a panic in a debug
/// build, a silent wrap in a release one). Values of `const`/`enum`/`default`/`examples`
/// are data.
pub(crate) fn unsupported_multiple_of(schema: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match schema {
        Value::Object(o) => {
            if let Some(m) = o.get("multipleOf").and_then(Value::as_f64) {
                let (mut v, mut decimals) = (m, 0u32);
                while v.fract() != 0.0 && decimals <= 8 {
                    v *= 10.0;
                    decimals += 1;
                }
                if decimals > 8 || v > f64::from(u32::MAX / 10) {
                    return Some(format!(
                        "multipleOf {m} is finer than 1e-8 or its digits exceed 429496729 \
                         (the schema compiler's number automaton holds no more)"
                    ));
                }
            }
            o.iter().find_map(|(k, v)| match (key_holds(k), v) {
                (Holds::Data, _) => None,
                (Holds::Schemas, Value::Object(m)) => m.values().find_map(unsupported_multiple_of),
                (Holds::Schemas, _) => None,
                (Holds::Schema, _) => unsupported_multiple_of(v),
            })
        }
        Value::Array(a) => a.iter().find_map(unsupported_multiple_of),
        _ => None,
    }
}

/// llguidance's grammar compiler over one vocabulary (an engine builds one at its first
/// constrained generation; [`crate::Engine::constraint`]).
pub struct Grammars {
    factory: ParserFactory,
    n_vocab: usize,
    eog: Vec<u32>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("n_vocab", &self.n_vocab)
            .finish_non_exhaustive()
    }
}

/// Limits on what one grammar may cost to compile and to run a step (llguidance's defaults,
/// which bound a hostile schema's time and memory; a step over its fuel is an error, not a
/// hang). Errors name the problem without the parser's state dump.
fn limits() -> ParserLimits {
    ParserLimits {
        verbose_errors: false,
        ..ParserLimits::default()
    }
}

/// The stack of the thread a grammar compiles on (reserved, touched only as deep as the
/// compiler goes).
#[cfg(not(target_arch = "wasm32"))]
const COMPILE_STACK: usize = 256 << 20;

/// The stack of the thread that computes a generation's next mask (see
/// [`crate::Generation::advance`]): llguidance recurses over large grammars there too.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) const MASK_STACK: usize = 64 << 20;

/// The first line of an llguidance error (the rest, when there is any, is its state).
fn first_line(e: &str) -> String {
    e.lines().next().unwrap_or("").trim().to_string()
}

impl Grammars {
    /// The compiler for `tok`'s vocabulary.
    pub fn new(tok: &Tokenizer) -> Result<Self> {
        let n = tok.n_vocab();
        let vocab_err = |why: String| EngineError::Grammar {
            what: "vocabulary",
            reason: why,
        };
        let n_u32 = u32::try_from(n).map_err(|_| vocab_err("too many tokens".into()))?;
        let eog = tok.eog_tokens().to_vec();
        let eos = tok
            .eot()
            .or(tok.eos())
            .or(eog.first().copied())
            .ok_or_else(|| vocab_err("the vocabulary has no end-of-generation token".into()))?;
        let mut words = Vec::with_capacity(n);
        for id in 0..n_u32 {
            let bytes = tok.token_bytes(id)?;
            let word = match tok.token_kind(id) {
                Some(TokenKind::Control) => {
                    let mut w = Vec::with_capacity(bytes.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(bytes);
                    w
                }
                Some(TokenKind::Unknown | TokenKind::Unused) => Vec::new(),
                _ => bytes.to_vec(),
            };
            words.push(word);
        }
        let info = TokRxInfo {
            vocab_size: n_u32,
            tok_eos: eos,
            tok_bos: tok.bos(),
            tok_pad: tok.pad(),
            tok_unk: None,
            tok_end_of_turn: tok.eot(),
        };
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| vocab_err(format!("{e:#}")))?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Grammars {
            factory,
            n_vocab: n,
            eog,
        })
    }

    /// Compile `c` for one generation. On a thread of its own with a large stack (natively):
    /// llguidance's compiler recurses over the schema, and a schema of a few hundred
    /// kilobytes goes deeper than a default thread's stack.
    pub fn start(&self, c: &Constraint) -> Result<ConstraintState> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            std::thread::scope(|scope| {
                std::thread::Builder::new()
                    .name("bitnet-grammar".into())
                    .stack_size(COMPILE_STACK)
                    .spawn_scoped(scope, || self.compile(c))
                    .map_err(|e| EngineError::Grammar {
                        what: c.what(),
                        reason: format!("cannot start its compiler's thread: {e}"),
                    })?
                    .join()
                    .map_err(|_| EngineError::Grammar {
                        what: c.what(),
                        reason: "its compiler panicked".into(),
                    })?
            })
        }
        #[cfg(target_arch = "wasm32")]
        self.compile(c)
    }

    fn compile(&self, c: &Constraint) -> Result<ConstraintState> {
        let invalid = |e: &dyn std::fmt::Display| EngineError::Grammar {
            what: c.what(),
            reason: first_line(&e.to_string()),
        };
        if let Constraint::JsonSchema(s) = c {
            if let Some(why) = unsupported_multiple_of(s) {
                return Err(invalid(&why));
            }
        }
        let parser = self
            .factory
            .create_parser(c.grammar())
            .map_err(|e| invalid(&format!("{e:#}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(invalid(&e));
        }
        let mut state = ConstraintState {
            matcher,
            n_vocab: self.n_vocab,
            eog: self.eog.clone(),
            ready: None,
        };
        // The first mask now: a schema or grammar that admits no text at all (an
        // unsatisfiable schema, a `$ref` that only refers to itself) fails here, before a
        // generation starts.
        state.prepare().map_err(|e| match e {
            EngineError::Grammar { reason, .. } => EngineError::Grammar {
                what: c.what(),
                reason: format!("it admits no output ({reason})"),
            },
            other => other,
        })?;
        Ok(state)
    }
}

/// The constraint of one generation in progress ([`crate::Engine::constraint`]): each step,
/// [`ConstraintState::apply`] to the logits, sample, then [`ConstraintState::commit`] the token.
pub struct ConstraintState {
    matcher: Matcher,
    n_vocab: usize,
    eog: Vec<u32>,
    /// The next step's mask, computed ahead ([`ConstraintState::prepare`]).
    ready: Option<Vec<bool>>,
}

impl std::fmt::Debug for ConstraintState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintState").finish_non_exhaustive()
    }
}

impl ConstraintState {
    fn error(&self, e: impl std::fmt::Display) -> EngineError {
        EngineError::Grammar {
            what: "constrained output",
            reason: first_line(&e.to_string()),
        }
    }

    /// The tokens allowed next: what keeps the text inside the grammar, and every
    /// end-of-generation token once the grammar may end here.
    pub fn mask(&mut self) -> Result<Vec<bool>> {
        let m: SimpleVob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| self.error(format!("{e:#}")))?;
        let mut allowed: Vec<bool> = (0..self.n_vocab).map(|i| i < m.len() && m.get(i)).collect();
        if self.eog.iter().any(|&t| m.is_allowed(t)) {
            for &t in &self.eog {
                if let Some(a) = usize::try_from(t).ok().and_then(|i| allowed.get_mut(i)) {
                    *a = true;
                }
            }
        }
        if !allowed.iter().any(|&a| a) {
            return Err(self.error("the grammar allows no token here"));
        }
        Ok(allowed)
    }

    /// Compute the next step's mask now (on another thread while the forward pass runs);
    /// [`Self::apply`] then uses it.
    pub fn prepare(&mut self) -> Result<()> {
        if self.ready.is_none() {
            self.ready = Some(self.mask()?);
        }
        Ok(())
    }

    /// The logits of the tokens the grammar forbids here become −∞ (see [`Self::mask`]).
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<()> {
        let allowed = match self.ready.take() {
            Some(m) => m,
            None => self.mask()?,
        };
        for (l, &a) in logits.iter_mut().zip(&allowed) {
            if !a {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Whether the text so far is complete under the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Take the sampled token. End-of-generation tokens end the text and are not fed.
    pub fn commit(&mut self, tok: u32) -> Result<()> {
        self.ready = None;
        if self.eog.contains(&tok) {
            return Ok(());
        }
        self.matcher
            .consume_token(tok)
            .map_err(|e| self.error(format!("{e:#}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn multiples_the_number_automaton_cannot_hold_are_found() {
        for ok in [
            json!({"multipleOf": 0.01}),
            json!({"multipleOf": 1e-8}),
            json!({"multipleOf": 5}),
            json!({"multipleOf": 429_496_729}),
            json!({"const": {"multipleOf": 1e-12}}),
        ] {
            assert_eq!(unsupported_multiple_of(&ok), None, "{ok}");
        }
        for bad in [
            json!({"multipleOf": 1e-9}),
            json!({"properties": {"a": {"type": "number", "multipleOf": 1e-12}}}),
            json!({"anyOf": [{"multipleOf": 1e12}]}),
        ] {
            assert!(unsupported_multiple_of(&bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn open_numbers_are_bounded_and_a_schemas_own_bounds_kept() {
        let mut s = json!({
            "type": "object",
            "properties": {
                "n": { "type": "integer" },
                "x": { "type": ["number", "null"] },
                "low": { "type": "integer", "minimum": 0 },
                "high": { "type": "number", "exclusiveMaximum": 1e30, "multipleOf": 0.5 },
                "const": { "type": "integer" },
                "fixed": { "const": { "type": "integer" } },
                "pick": { "enum": [{ "type": "number" }] },
                "list": { "type": "array", "items": { "type": "integer" } },
                "any": { "anyOf": [{ "type": "number" }, { "type": "string" }] }
            },
            "$defs": { "d": { "type": "integer", "maximum": 7 } }
        });
        bound_numbers(&mut s);
        let p = &s["properties"];
        let open =
            json!({ "type": "integer", "exclusiveMinimum": -1e16, "exclusiveMaximum": 1e16 });
        assert_eq!(p["n"], open);
        assert_eq!(p["const"], open, "a property named const is a schema");
        assert_eq!(p["list"]["items"], open);
        assert_eq!(
            p["x"],
            json!({ "type": ["number", "null"], "exclusiveMinimum": -1e16,
                    "exclusiveMaximum": 1e16, "multipleOf": 1e-8 })
        );
        assert_eq!(
            p["low"],
            json!({ "type": "integer", "minimum": 0, "exclusiveMaximum": 1e16 })
        );
        assert_eq!(
            p["high"],
            json!({ "type": "number", "exclusiveMaximum": 1e30, "multipleOf": 0.5,
                    "exclusiveMinimum": -1e16 })
        );
        assert_eq!(
            p["fixed"],
            json!({ "const": { "type": "integer" } }),
            "data"
        );
        assert_eq!(p["pick"], json!({ "enum": [{ "type": "number" }] }), "data");
        assert_eq!(p["any"]["anyOf"][0]["multipleOf"], json!(1e-8));
        assert_eq!(p["any"]["anyOf"][1], json!({ "type": "string" }));
        assert_eq!(
            s["$defs"]["d"],
            json!({ "type": "integer", "maximum": 7, "exclusiveMinimum": -1e16 })
        );
    }
}
