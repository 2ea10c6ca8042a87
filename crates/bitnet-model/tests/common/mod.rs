//! Helpers shared by this crate's integration tests.

/// The prompt token ids of the tiny golden prompts (`tiny/<stem>.tokens.json`).
#[allow(clippy::unwrap_used, clippy::cast_possible_truncation)]
pub fn golden_prompts() -> Vec<Vec<u32>> {
    bitnet_testdata::PROMPTS
        .iter()
        .map(|s| {
            let v: serde_json::Value =
                serde_json::from_slice(&bitnet_testdata::read(&format!("tiny/{s}.tokens.json")))
                    .unwrap();
            v["prompt_tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}
