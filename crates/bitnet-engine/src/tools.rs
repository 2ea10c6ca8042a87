//! Tool (function) calling as OpenAI's chat API defines it: the tool definitions go into the
//! prompt, the reply is held by a grammar to either text or calls whose arguments match each
//! function's parameter schema, and the reply's text is split back into content and calls.
//!
//! The format (Llama 3.1's "custom tool" syntax): a call is
//!
//! ```text
//! <function=get_weather>{"city": "Paris"}</function>
//! ```
//!
//! and several calls follow one another, separated by a newline. The system message gets the
//! definitions, one JSON object per line, and how to call them ([`ToolSet::instructions`]);
//! an assistant message of the history that made calls is written the same way after its
//! content; a `tool` message's content is the function's result.
//!
//! `tool_choice`: `auto` (text or calls), `required` (calls only), a named function (calls of
//! that function only), `none` (no tools in the prompt, text only).

use serde_json::{json, Value};

use crate::constrain::compact;
use crate::{Constraint, EngineError, Result};
use bitnet_tokenizer::{ChatMessage, ChatRole};

/// What opens a call; the function's name and `>` follow.
pub const CALL_OPEN: &str = "<function=";
/// What closes a call.
pub const CALL_CLOSE: &str = "</function>";

/// Most tools one request may define.
pub const MAX_TOOLS: usize = 128;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// `[A-Za-z0-9_-]{1,64}`, as OpenAI requires.
    pub name: String,
    pub description: Option<String>,
    /// A JSON schema of the arguments object.
    pub parameters: Value,
}

/// Which calls the reply may (or must) make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No calls: the tools are left out of the prompt.
    None,
    /// Text or calls.
    Auto,
    /// At least one call.
    Required,
    /// Calls of this function only.
    Named(String),
}

/// The tools of one chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSet {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// Several calls in one reply (OpenAI's `parallel_tool_calls`, default true).
    pub parallel: bool,
}

fn bad(field: impl Into<String>, reason: impl Into<String>) -> EngineError {
    EngineError::Tools {
        field: field.into(),
        reason: reason.into(),
    }
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl ToolSet {
    /// OpenAI's `tools` (`[{"type": "function", "function": {"name", "description",
    /// "parameters"}}]`), `tool_choice` and `parallel_tool_calls`. Errors name the field at
    /// fault (`tools[1].function.name`). An empty `tools` array is no tools (`None`), as
    /// llama-server and Ollama take it; `tool_choice` must then be `none`, `auto` or absent.
    pub fn from_openai(
        tools: &Value,
        tool_choice: Option<&Value>,
        parallel: Option<bool>,
    ) -> Result<Option<ToolSet>> {
        let Value::Array(items) = tools else {
            return Err(bad("tools", "`tools` must be an array"));
        };
        if items.is_empty() {
            return match tool_choice {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(c)) if c == "none" || c == "auto" => Ok(None),
                Some(_) => Err(bad("tool_choice", "`tool_choice` needs `tools`")),
            };
        }
        if items.len() > MAX_TOOLS {
            return Err(bad(
                "tools",
                format!("{} tools: at most {MAX_TOOLS} are allowed", items.len()),
            ));
        }
        let mut out: Vec<Tool> = Vec::with_capacity(items.len());
        for (i, t) in items.iter().enumerate() {
            let f = format!("tools[{i}]");
            let Value::Object(t) = t else {
                return Err(bad(&f, format!("`{f}` must be an object")));
            };
            match t.get("type") {
                Some(Value::String(ty)) if ty == "function" => {}
                _ => {
                    return Err(bad(
                        format!("{f}.type"),
                        format!("`{f}.type` must be \"function\""),
                    ))
                }
            }
            let Some(Value::Object(func)) = t.get("function") else {
                return Err(bad(
                    format!("{f}.function"),
                    format!("`{f}.function` must be an object"),
                ));
            };
            let name = match func.get("name") {
                Some(Value::String(n)) if valid_name(n) => n.clone(),
                _ => {
                    return Err(bad(
                        format!("{f}.function.name"),
                        format!("`{f}.function.name` must be 1 to 64 of a-z, A-Z, 0-9, _ and -"),
                    ))
                }
            };
            if out.iter().any(|o| o.name == name) {
                return Err(bad(
                    format!("{f}.function.name"),
                    format!("two tools are named {name:?}"),
                ));
            }
            let description = match func.get("description") {
                None | Some(Value::Null) => None,
                Some(Value::String(d)) => Some(d.clone()),
                Some(_) => {
                    return Err(bad(
                        format!("{f}.function.description"),
                        format!("`{f}.function.description` must be a string"),
                    ))
                }
            };
            let pf = format!("{f}.function.parameters");
            let parameters = match func.get("parameters") {
                // No parameters: the function takes none (OpenAI).
                None | Some(Value::Null) => {
                    json!({"type": "object", "properties": {}, "additionalProperties": false})
                }
                Some(Value::Object(p)) => {
                    let mut p = p.clone();
                    match p.get("type") {
                        None => {
                            p.insert("type".into(), json!("object"));
                        }
                        Some(Value::String(t)) if t == "object" => {}
                        Some(_) => {
                            return Err(bad(
                                &pf,
                                format!("`{pf}` must describe an object (\"type\": \"object\")"),
                            ))
                        }
                    }
                    Value::Object(p)
                }
                Some(_) => return Err(bad(&pf, format!("`{pf}` must be a JSON schema object"))),
            };
            if let Some(why) = crate::constrain::unsupported_multiple_of(&parameters) {
                return Err(bad(&pf, format!("`{pf}`: {why}")));
            }
            out.push(Tool {
                name,
                description,
                parameters,
            });
        }
        let choice = match tool_choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                other => {
                    return Err(bad(
                        "tool_choice",
                        format!(
                            "`tool_choice` = {:?}: expected \"auto\", \"none\", \"required\" \
                             or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}",
                            truncate_chars(other, 32)
                        ),
                    ))
                }
            },
            Some(Value::Object(o)) => {
                let name = o
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str);
                match name {
                    Some(n) if out.iter().any(|t| t.name == n) => ToolChoice::Named(n.to_string()),
                    Some(n) => {
                        return Err(bad(
                            "tool_choice",
                            format!(
                                "`tool_choice` names {:?}, which is not in `tools`",
                                truncate_chars(n, 64)
                            ),
                        ))
                    }
                    None => {
                        return Err(bad(
                            "tool_choice",
                            "`tool_choice` must be {\"type\": \"function\", \"function\": {\"name\": …}}",
                        ))
                    }
                }
            }
            Some(_) => {
                return Err(bad(
                    "tool_choice",
                    "`tool_choice` must be a string or an object",
                ))
            }
        };
        Ok(Some(ToolSet {
            tools: out,
            choice,
            parallel: parallel.unwrap_or(true),
        }))
    }

    /// Whether the reply may call a function at all (`tool_choice` is not `none`).
    pub fn active(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The tools the reply may call.
    fn callable(&self) -> impl Iterator<Item = &Tool> {
        self.tools.iter().filter(move |t| match &self.choice {
            ToolChoice::None => false,
            ToolChoice::Named(n) => &t.name == n,
            ToolChoice::Auto | ToolChoice::Required => true,
        })
    }

    /// The text added to the system message: the definitions and how to call them.
    pub fn instructions(&self) -> Option<String> {
        if !self.active() {
            return None;
        }
        let mut s = String::from("You can call functions. Each line below defines one, as JSON:\n");
        for t in &self.tools {
            let mut def = serde_json::Map::new();
            def.insert("name".into(), json!(t.name));
            if let Some(d) = &t.description {
                def.insert("description".into(), json!(d));
            }
            def.insert("parameters".into(), t.parameters.clone());
            s.push_str(&Value::Object(def).to_string());
            s.push('\n');
        }
        s.push_str(&format!(
            "To call a function, reply with {CALL_OPEN}NAME>ARGUMENTS{CALL_CLOSE}, where \
             ARGUMENTS is a JSON object of its parameters."
        ));
        if self.parallel {
            s.push_str(" To call several, write one call per line.");
        }
        match &self.choice {
            ToolChoice::Auto => s.push_str(" Otherwise reply in plain text."),
            ToolChoice::Required => s.push_str(" You must call a function."),
            ToolChoice::Named(n) => s.push_str(&format!(" You must call {n}.")),
            ToolChoice::None => {}
        }
        Some(s)
    }

    /// Adds [`ToolSet::instructions`] to the conversation: after the first system message's
    /// text, or as a system message of its own at the start.
    pub fn apply_to(&self, messages: &mut Vec<ChatMessage>) {
        let Some(text) = self.instructions() else {
            return;
        };
        match messages.first_mut() {
            Some(m) if m.role == ChatRole::System => {
                if !m.content.is_empty() {
                    m.content.push_str("\n\n");
                }
                m.content.push_str(&text);
            }
            _ => messages.insert(0, ChatMessage::new(ChatRole::System, text)),
        }
    }

    /// The grammar the reply is held to (an llguidance Lark grammar; `None` when no call
    /// may be made). Text, when allowed, is anything that does not start with
    /// [`CALL_OPEN`].
    pub fn constraint(&self) -> Option<Constraint> {
        if !self.active() {
            return None;
        }
        let mut g = String::new();
        match self.choice {
            ToolChoice::Auto => g.push_str("start: TEXT | calls\n"),
            _ => g.push_str("start: calls\n"),
        }
        if self.parallel {
            g.push_str("calls: call (\"\\n\" call)*\n");
        } else {
            g.push_str("calls: call\n");
        }
        let names: Vec<String> = self
            .callable()
            .enumerate()
            .map(|(i, _)| format!("call_{i}"))
            .collect();
        g.push_str(&format!("call: {}\n", names.join(" | ")));
        for (i, t) in self.callable().enumerate() {
            // Names are [A-Za-z0-9_-]: nothing to escape in a Lark string.
            g.push_str(&format!(
                "call_{i}: \"{CALL_OPEN}{}>\" %json {} \"{CALL_CLOSE}\"\n",
                t.name,
                compact(t.parameters.clone())
            ));
        }
        g.push_str(&format!(
            "TEXT: /(?s:.+)/ & ~/{}(?s:.*)/\n",
            regex_escape(CALL_OPEN)
        ));
        Some(Constraint::Lark(g))
    }
}

/// At most `max` characters of `s` (for quoting user input in an error).
fn truncate_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn regex_escape(s: &str) -> String {
    let mut o = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$/".contains(c) {
            o.push('\\');
        }
        o.push(c);
    }
    o
}

/// How a call of the history is written into an assistant message (the reply format).
pub fn call_text(name: &str, arguments: &str) -> String {
    format!("{CALL_OPEN}{name}>{arguments}{CALL_CLOSE}")
}

/// A piece of a reply split by [`ToolCallParser`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    /// Reply text.
    Content(String),
    /// Call number `index` (from 0) begins, of function `name`.
    CallStart { index: usize, name: String },
    /// The next piece of call `index`'s arguments (JSON text).
    Arguments { index: usize, fragment: String },
}

#[derive(Debug, Clone)]
enum Mode {
    /// Nothing decided: the text so far could still open a call.
    Start(String),
    Text,
    /// Inside `<function=`: the name so far.
    Name(String),
    /// Inside a call's arguments.
    Args {
        depth: usize,
        in_str: bool,
        esc: bool,
    },
    /// After the arguments: what of `</function>` has been seen.
    Close(String),
    /// Between calls: what of `\n<function=` has been seen.
    Between(String),
}

/// Splits a reply, as it streams, into text and calls (the format of the module docs).
/// Fed the reply in pieces, it gives the same events, joined, as fed it whole.
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    mode: Mode,
    calls: usize,
}

impl Default for ToolCallParser {
    fn default() -> Self {
        Self::new()
    }
}

impl ToolCallParser {
    pub fn new() -> Self {
        Self {
            mode: Mode::Start(String::new()),
            calls: 0,
        }
    }

    /// Calls begun so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// The events of the next piece of the reply.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        let mut ev = Vec::new();
        let mut args = String::new();
        for c in text.chars() {
            self.step(c, &mut ev, &mut args);
        }
        self.flush_args(&mut ev, &mut args);
        merge(ev)
    }

    /// The events of the end of the reply: text held back (it could have opened a call) is
    /// content after all.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mode = std::mem::replace(&mut self.mode, Mode::Text);
        match mode {
            Mode::Start(s) if !s.is_empty() => vec![ToolEvent::Content(s)],
            Mode::Name(s) => vec![ToolEvent::Content(format!("{CALL_OPEN}{s}"))],
            _ => Vec::new(),
        }
    }

    fn flush_args(&self, ev: &mut Vec<ToolEvent>, args: &mut String) {
        if !args.is_empty() {
            ev.push(ToolEvent::Arguments {
                index: self.calls.saturating_sub(1),
                fragment: std::mem::take(args),
            });
        }
    }

    fn step(&mut self, c: char, ev: &mut Vec<ToolEvent>, args: &mut String) {
        match &mut self.mode {
            Mode::Text => ev.push(ToolEvent::Content(c.to_string())),
            Mode::Start(s) => {
                s.push(c);
                if s == CALL_OPEN {
                    self.mode = Mode::Name(String::new());
                } else if !CALL_OPEN.starts_with(s.as_str()) {
                    ev.push(ToolEvent::Content(std::mem::take(s)));
                    self.mode = Mode::Text;
                }
            }
            Mode::Name(s) => {
                if c == '>' {
                    let name = std::mem::take(s);
                    ev.push(ToolEvent::CallStart {
                        index: self.calls,
                        name,
                    });
                    self.calls += 1;
                    self.mode = Mode::Args {
                        depth: 0,
                        in_str: false,
                        esc: false,
                    };
                } else {
                    s.push(c);
                }
            }
            Mode::Args { depth, in_str, esc } => {
                args.push(c);
                let mut closed = false;
                if *in_str {
                    if *esc {
                        *esc = false;
                    } else if c == '\\' {
                        *esc = true;
                    } else if c == '"' {
                        *in_str = false;
                    }
                } else {
                    match c {
                        '"' => *in_str = true,
                        '{' | '[' => *depth += 1,
                        '}' | ']' => {
                            *depth = depth.saturating_sub(1);
                            closed = *depth == 0;
                        }
                        _ => {}
                    }
                }
                if closed {
                    self.flush_args(ev, args);
                    self.mode = Mode::Close(String::new());
                }
            }
            Mode::Close(s) => {
                s.push(c);
                if s == CALL_CLOSE {
                    self.mode = Mode::Between(String::new());
                } else if !CALL_CLOSE.starts_with(s.as_str()) {
                    // Not the format (only without the grammar): the rest is text.
                    ev.push(ToolEvent::Content(std::mem::take(s)));
                    self.mode = Mode::Text;
                }
            }
            Mode::Between(s) => {
                s.push(c);
                let sep = format!("\n{CALL_OPEN}");
                if s.as_str() == sep || s.as_str() == CALL_OPEN {
                    self.mode = Mode::Name(String::new());
                } else if !sep.starts_with(s.as_str()) && !CALL_OPEN.starts_with(s.as_str()) {
                    ev.push(ToolEvent::Content(std::mem::take(s)));
                    self.mode = Mode::Text;
                }
            }
        }
    }
}

/// Joins neighbouring content events.
fn merge(ev: Vec<ToolEvent>) -> Vec<ToolEvent> {
    let mut out: Vec<ToolEvent> = Vec::with_capacity(ev.len());
    for e in ev {
        match (out.last_mut(), e) {
            (Some(ToolEvent::Content(a)), ToolEvent::Content(b)) => a.push_str(&b),
            (_, e) => out.push(e),
        }
    }
    out
}

/// A whole reply split into its text and its calls (`(name, arguments)`).
pub fn split_reply(text: &str) -> (String, Vec<(String, String)>) {
    let mut p = ToolCallParser::new();
    let mut ev = p.push(text);
    ev.extend(p.finish());
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in ev {
        match e {
            ToolEvent::Content(t) => content.push_str(&t),
            ToolEvent::CallStart { name, .. } => calls.push((name, String::new())),
            ToolEvent::Arguments { fragment, .. } => {
                if let Some(c) = calls.last_mut() {
                    c.1.push_str(&fragment);
                }
            }
        }
    }
    (content, calls)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn set(choice: Value) -> Result<ToolSet> {
        ToolSet::from_openai(
            &json!([{"type": "function", "function": {"name": "get_weather",
                "description": "Weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}},
                    {"type": "function", "function": {"name": "now"}}]),
            Some(&choice),
            None,
        )
        .map(Option::unwrap)
    }

    #[test]
    fn choices_are_read_and_checked() {
        assert_eq!(set(json!("auto")).unwrap().choice, ToolChoice::Auto);
        assert_eq!(set(json!("none")).unwrap().choice, ToolChoice::None);
        assert_eq!(set(json!("required")).unwrap().choice, ToolChoice::Required);
        assert_eq!(
            set(json!({"type": "function", "function": {"name": "now"}}))
                .unwrap()
                .choice,
            ToolChoice::Named("now".into())
        );
        for bad in [
            json!("sometimes"),
            json!({"type": "function", "function": {"name": "later"}}),
            json!(3),
        ] {
            match set(bad) {
                Err(EngineError::Tools { field, .. }) => assert_eq!(field, "tool_choice"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn bad_tools_name_the_field() {
        let cases = [
            (json!({}), "tools"),
            (json!([1]), "tools[0]"),
            (json!([{"type": "code"}]), "tools[0].type"),
            (json!([{"type": "function"}]), "tools[0].function"),
            (
                json!([{"type": "function", "function": {"name": "a b"}}]),
                "tools[0].function.name",
            ),
            (
                json!([{"type": "function", "function": {"name": "f"}},
                       {"type": "function", "function": {"name": "f"}}]),
                "tools[1].function.name",
            ),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]),
                "tools[0].function.parameters",
            ),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
                "tools[0].function.parameters",
            ),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters":
                    {"properties": {"x": {"type": "number", "multipleOf": 1e-9}}}}}]),
                "tools[0].function.parameters",
            ),
        ];
        assert_eq!(ToolSet::from_openai(&json!([]), None, None).unwrap(), None);
        for (tools, want) in cases {
            match ToolSet::from_openai(&tools, None, None) {
                Err(EngineError::Tools { field, .. }) => assert_eq!(field, want, "{tools}"),
                other => panic!("{tools}: {other:?}"),
            }
        }
    }

    #[test]
    fn instructions_join_the_system_message() {
        let s = set(json!("auto")).unwrap();
        let mut m = vec![ChatMessage::new(ChatRole::User, "hi")];
        s.apply_to(&mut m);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].role, ChatRole::System);
        assert!(m[0]
            .content
            .contains(r#"{"name":"get_weather","description":"Weather of a city","parameters":"#));
        let now: Value = m[0]
            .content
            .lines()
            .find(|l| l.starts_with(r#"{"name":"now""#))
            .map(|l| serde_json::from_str(l).unwrap())
            .unwrap();
        assert_eq!(
            now,
            json!({"name": "now", "parameters": {"type": "object", "properties": {},
                   "additionalProperties": false}})
        );
        let mut m = vec![
            ChatMessage::new(ChatRole::System, "Be brief."),
            ChatMessage::new(ChatRole::User, "hi"),
        ];
        s.apply_to(&mut m);
        assert_eq!(m.len(), 2);
        assert!(m[0]
            .content
            .starts_with("Be brief.\n\nYou can call functions."));
        let none = set(json!("none")).unwrap();
        let mut m = vec![ChatMessage::new(ChatRole::User, "hi")];
        none.apply_to(&mut m);
        assert_eq!(m, vec![ChatMessage::new(ChatRole::User, "hi")]);
        assert!(none.constraint().is_none());
    }

    #[test]
    fn replies_split_into_text_and_calls() {
        assert_eq!(
            split_reply("Hello <there>"),
            ("Hello <there>".into(), vec![])
        );
        assert_eq!(split_reply("<func"), ("<func".into(), vec![]));
        assert_eq!(split_reply("<b>bold</b>"), ("<b>bold</b>".into(), vec![]));
        let two = "<function=get_weather>{\"city\": \"a}\\\"</function>\"}</function>\n<function=now>{}</function>";
        assert_eq!(
            split_reply(two),
            (
                String::new(),
                vec![
                    (
                        "get_weather".into(),
                        "{\"city\": \"a}\\\"</function>\"}".into()
                    ),
                    ("now".into(), "{}".into())
                ]
            )
        );
        // Cut short: the call's arguments so far.
        assert_eq!(
            split_reply("<function=now>{\"a\": [1, "),
            (String::new(), vec![("now".into(), "{\"a\": [1, ".into())])
        );
    }

    #[test]
    fn any_split_of_a_reply_gives_the_same_events() {
        let texts = [
            "<function=get_weather>{\"city\": \"Pa\\\\ris{\"}</function>\n<function=now>{}</function>",
            "Plain <function text",
            "<functio",
            "<function=now>{}</function>tail",
        ];
        for t in texts {
            let whole = split_reply(t);
            let chars: Vec<char> = t.chars().collect();
            for cut in 0..=chars.len() {
                for cut2 in cut..=chars.len() {
                    let a: String = chars[..cut].iter().collect();
                    let b: String = chars[cut..cut2].iter().collect();
                    let c: String = chars[cut2..].iter().collect();
                    let mut p = ToolCallParser::new();
                    let mut ev = p.push(&a);
                    ev.extend(p.push(&b));
                    ev.extend(p.push(&c));
                    ev.extend(p.finish());
                    let mut content = String::new();
                    let mut calls: Vec<(String, String)> = Vec::new();
                    for e in ev {
                        match e {
                            ToolEvent::Content(x) => content.push_str(&x),
                            ToolEvent::CallStart { index, name } => {
                                assert_eq!(index, calls.len());
                                calls.push((name, String::new()));
                            }
                            ToolEvent::Arguments { index, fragment } => {
                                assert_eq!(index + 1, calls.len());
                                calls[index].1.push_str(&fragment);
                            }
                        }
                    }
                    assert_eq!((content, calls), whole, "{t:?} cut at {cut}, {cut2}");
                }
            }
        }
    }
}
