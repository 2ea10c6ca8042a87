//! Chat formats: the one BitNet b1.58 2B-4T was tuned on, and those of the ternary `llama`
//! models bitnet.cpp runs (Llama3-8B-1.58: LLaMA-3's; Falcon3: its own).
//!
//! [`ChatFormat::Bitnet`]: `<|begin_of_text|>` then, per message, `Role: content<|eot_id|>`
//! with roles `System`, `User`, `Assistant`, then `Assistant: ` to prompt a reply:
//!
//! ```text
//! <|begin_of_text|>System: You are a helpful assistant.<|eot_id|>User: Hi<|eot_id|>Assistant:
//! ```
//!
//! The `tokenizer.chat_template` stored in GGUF files is never evaluated: it only picks the
//! format of a `llama` file, by the markers llama.cpp's `llama_chat_apply_template` looks
//! for ([`ChatFormat::detect`]). The `bitnet*` architectures always use the 2B-4T format.

use std::fmt;
use std::str::FromStr;

use crate::chat_format::ChatFormat;
use crate::tokenizer::EOT_TEXT;
use crate::{Tokenizer, TokenizerError};

/// Text of the BOS token that starts a chat.
pub const BOS_TEXT: &str = "<|begin_of_text|>";

/// A chat participant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChatRole {
    /// Instructions for the assistant.
    System,
    /// The person chatting.
    User,
    /// The model.
    Assistant,
    /// The result of a function the model called (OpenAI's role `tool`); written `Tool: `
    /// in the 2B-4T format and as role `tool` in the marker formats, as llama.cpp writes a
    /// role it has no special case for.
    Tool,
}

impl ChatRole {
    /// The label written before the message (`System`, `User`, `Assistant`).
    pub fn label(&self) -> &'static str {
        match self {
            Self::System => "System",
            Self::User => "User",
            Self::Assistant => "Assistant",
            Self::Tool => "Tool",
        }
    }
}

impl FromStr for ChatRole {
    type Err = TokenizerError;

    /// Parses `system`, `user`, `assistant` or `tool` (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        for role in [Self::System, Self::User, Self::Assistant, Self::Tool] {
            if s.eq_ignore_ascii_case(role.label()) {
                return Ok(role);
            }
        }
        Err(TokenizerError::UnknownRole(crate::pretok::truncate(s, 64)))
    }
}

impl fmt::Display for ChatRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: ChatRole,
    /// What they wrote.
    pub content: String,
}

impl ChatMessage {
    /// A message from `role`.
    pub fn new(role: ChatRole, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
        }
    }
}

impl ChatRole {
    /// The lower-case role name of the LLaMA-3 and Falcon3 formats.
    fn lower(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

/// A conversation as prompt text in `format`: [`format_chat`] for the 2B-4T format (which
/// starts with the BOS text); for LLaMA-3 and Falcon3, llama.cpp's `llama_chat_apply_template`
/// text (without BOS, which tokenization adds).
pub fn format_chat_as(
    format: ChatFormat,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> String {
    match marked(format) {
        None => format_chat(messages, add_generation_prompt),
        Some(m) => {
            let mut s = String::new();
            for msg in messages {
                s.push_str(&(m.open)(msg.role));
                s.push_str(m.content(&msg.content));
                s.push_str(m.close);
            }
            if add_generation_prompt {
                s.push_str(&(m.open)(ChatRole::Assistant));
            }
            s
        }
    }
}

/// The markers of a marker-based format (LLaMA-3, Falcon3).
struct Marked {
    open: fn(ChatRole) -> String,
    close: &'static str,
    /// LLaMA-3's template trims each content.
    trim: bool,
}

impl Marked {
    fn content<'c>(&self, c: &'c str) -> &'c str {
        if self.trim {
            c.trim()
        } else {
            c
        }
    }
}

fn marked(format: ChatFormat) -> Option<Marked> {
    match format {
        ChatFormat::Bitnet => None,
        ChatFormat::Llama3 => Some(Marked {
            open: |r| format!("<|start_header_id|>{}<|end_header_id|>\n\n", r.lower()),
            close: "<|eot_id|>",
            trim: true,
        }),
        ChatFormat::Falcon3 => Some(Marked {
            open: |r| format!("<|{}|>\n", r.lower()),
            close: "\n",
            trim: false,
        }),
    }
}

/// Formats a conversation as text in the 2B-4T format, starting with the BOS text.
///
/// To tokenize it, encode with `add_bos = false, parse_special = true` — but then
/// special-token text inside message contents is parsed too. [`Tokenizer::encode_chat`]
/// gives the same ids while keeping contents literal; prefer it for untrusted input.
pub fn format_chat(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut s = String::from(BOS_TEXT);
    for m in messages {
        s.push_str(m.role.label());
        s.push_str(": ");
        s.push_str(&m.content);
        s.push_str(EOT_TEXT);
    }
    if add_generation_prompt {
        s.push_str(ChatRole::Assistant.label());
        s.push_str(": ");
    }
    s
}

impl Tokenizer {
    /// Token ids of a conversation in this tokenizer's [`ChatFormat`]: the format's markers
    /// as special tokens, message contents encoded as plain text (special-token text inside
    /// a message stays literal, so it cannot end a turn early). For the 2B-4T format, the
    /// ids of [`format_chat`]'s text.
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let Some(m) = marked(self.chat_format()) else {
            return self.encode_chat_bitnet(messages, add_generation_prompt);
        };
        // BOS when the vocabulary adds one, then [`format_chat_as`]'s text tokenized at once,
        // special tokens parsed in the markers only (contents stay literal).
        let mut ids = Vec::new();
        if self.add_bos() {
            ids.push(self.bos().ok_or(TokenizerError::NoBosToken)?);
        }
        let opens: Vec<String> = messages.iter().map(|msg| (m.open)(msg.role)).collect();
        let reply = (m.open)(ChatRole::Assistant);
        let mut segments: Vec<(&str, bool)> = Vec::with_capacity(3 * messages.len() + 1);
        for (msg, open) in messages.iter().zip(&opens) {
            segments.push((open, true));
            segments.push((m.content(&msg.content), false));
            segments.push((m.close, true));
        }
        if add_generation_prompt {
            segments.push((&reply, true));
        }
        self.encode_segments(&segments, &mut ids)?;
        Ok(ids)
    }

    fn encode_chat_bitnet(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let bos = self.bos().ok_or(TokenizerError::NoBosToken)?;
        let mut ids = vec![bos];
        let mut text = String::new();
        let Some(eot) = self.token_id(EOT_TEXT) else {
            // A vocabulary without `<|eot_id|>` (a small model converted by bitnet.cpp's
            // converter): the marker is text, and the conversation one text, tokenized at
            // once as llama.cpp tokenizes a template's output.
            let all = format_chat(messages, add_generation_prompt);
            self.encode_into(&all[BOS_TEXT.len()..], false, &mut ids)?;
            return Ok(ids);
        };
        for m in messages {
            text.clear();
            text.push_str(m.role.label());
            text.push_str(": ");
            text.push_str(&m.content);
            self.encode_into(&text, false, &mut ids)?;
            ids.push(eot);
        }
        if add_generation_prompt {
            text.clear();
            text.push_str(ChatRole::Assistant.label());
            text.push_str(": ");
            self.encode_into(&text, false, &mut ids)?;
        }
        Ok(ids)
    }
}
