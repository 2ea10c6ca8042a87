//! Stop strings matched across token boundaries and never emitted.

/// Holds back text that could still be the start of a stop string.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Add generated text; returns (text safe to emit, whether a stop string matched).
    /// On a match, the text before the match is returned and the rest is dropped.
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), false);
        }
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // Keep the shortest suffix that is a prefix of some stop string.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&self.held[i..])))
            .unwrap_or(self.held.len());
        let out = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        (out, false)
    }

    /// End of generation: release what was held back (it never completed a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let (e, hit) = m.push(p);
            out.push_str(&e);
            if hit {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_across_tokens_is_not_emitted() {
        assert_eq!(
            run(&["User:"], &["Hello", " Us", "er", ": more"]),
            ("Hello ".to_string(), true)
        );
    }

    #[test]
    fn partial_match_at_end_is_released() {
        assert_eq!(
            run(&["User:"], &["Hello", " Us"]),
            ("Hello Us".to_string(), false)
        );
    }

    #[test]
    fn empty_stop_string_is_ignored_and_multibyte_is_safe() {
        assert_eq!(
            run(&["", "é!"], &["caf", "é", "?"]),
            ("café?".to_string(), false)
        );
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".to_string(), true));
    }

    #[test]
    fn earliest_stop_wins() {
        assert_eq!(run(&["b", "abc"], &["xabc"]), ("x".to_string(), true));
    }
}
