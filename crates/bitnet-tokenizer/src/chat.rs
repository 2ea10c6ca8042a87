//! The chat format BitNet b1.58 2B-4T was tuned on.
//!
//! `<|begin_of_text|>` then, per message, `Role: content<|eot_id|>` with roles
//! `System`, `User`, `Assistant`, then `Assistant: ` to prompt a reply:
//!
//! ```text
//! <|begin_of_text|>System: You are a helpful assistant.<|eot_id|>User: Hi<|eot_id|>Assistant:
//! ```
//!
//! The `tokenizer.chat_template` stored in GGUF files is never evaluated.

use std::fmt;
use std::str::FromStr;

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
}

impl ChatRole {
    /// The label written before the message (`System`, `User`, `Assistant`).
    pub fn label(&self) -> &'static str {
        match self {
            Self::System => "System",
            Self::User => "User",
            Self::Assistant => "Assistant",
        }
    }
}

impl FromStr for ChatRole {
    type Err = TokenizerError;

    /// Parses `system`, `user` or `assistant` (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        for role in [Self::System, Self::User, Self::Assistant] {
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

/// Formats a conversation as text, starting with the BOS text.
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
    /// Token ids of [`format_chat`]'s text, with BOS and `<|eot_id|>` as tokens and
    /// message contents encoded as plain text (special-token text inside a message
    /// stays literal, so it cannot end a turn early).
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let bos = self.bos().ok_or(TokenizerError::NoBosToken)?;
        let eot = self
            .token_id(EOT_TEXT)
            .ok_or(TokenizerError::MissingSpecialToken(EOT_TEXT))?;
        let mut ids = vec![bos];
        let mut text = String::new();
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
