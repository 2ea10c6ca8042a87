//! Which chat format a file's conversations take (chat.rs lays them out).

use std::str::FromStr;

use crate::TokenizerError;

/// How a conversation becomes a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ChatFormat {
    /// BitNet b1.58 2B-4T's `Role: content<|eot_id|>` (the module docs).
    #[default]
    Bitnet,
    /// LLaMA-3's: `<|start_header_id|>role<|end_header_id|>\n\n` + trimmed content +
    /// `<|eot_id|>`, the reply opened with the assistant's header (llama.cpp `llama3`).
    Llama3,
    /// Falcon3's: `<|role|>\n` + content + `\n`, the reply opened with `<|assistant|>\n`
    /// (llama.cpp `falcon3`).
    Falcon3,
}

impl ChatFormat {
    /// The format of a file: `bitnet*` architectures (and files without one) use
    /// [`ChatFormat::Bitnet`]; a `llama` file's `tokenizer.chat_template` is recognised by
    /// llama.cpp's markers (`<|start_header_id|>` and `<|end_header_id|>`: LLaMA-3;
    /// `<|assistant|>` and `<|user|>`: Falcon3; `Assistant: `: 2B-4T's); without one it
    /// recognises, the vocabulary decides (LLaMA-3's header tokens, else Falcon3's role
    /// tokens, else 2B-4T's format): `has_token` says whether it holds a token of that text.
    pub fn detect(
        arch: Option<&str>,
        template: Option<&str>,
        has_token: impl Fn(&str) -> bool,
    ) -> Self {
        if arch != Some("llama") {
            return Self::Bitnet;
        }
        if let Some(t) = template {
            if t.contains("<|start_header_id|>") && t.contains("<|end_header_id|>") {
                return Self::Llama3;
            }
            if t.contains("<|assistant|>") && t.contains("<|user|>") {
                return Self::Falcon3;
            }
            if t.contains("Assistant: ") {
                return Self::Bitnet;
            }
        }
        if has_token("<|start_header_id|>") && has_token("<|end_header_id|>") {
            Self::Llama3
        } else if has_token("<|assistant|>") && has_token("<|user|>") {
            Self::Falcon3
        } else {
            Self::Bitnet
        }
    }

    /// The name used on command lines and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bitnet => "bitnet",
            Self::Llama3 => "llama3",
            Self::Falcon3 => "falcon3",
        }
    }
}

impl FromStr for ChatFormat {
    type Err = TokenizerError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bitnet" => Ok(Self::Bitnet),
            "llama3" => Ok(Self::Llama3),
            "falcon3" => Ok(Self::Falcon3),
            other => Err(TokenizerError::UnknownChatFormat(crate::pretok::truncate(
                other, 64,
            ))),
        }
    }
}
