pub mod chat;
pub mod common;
pub mod inspect;
pub mod logits;
pub mod run;
pub mod synth;
pub mod tokenize;
