//! Counters and gauges, rendered in the Prometheus text format.
//!
//! A dozen atomics rendered by hand: the text format is a few lines per metric, which
//! does not warrant a metrics registry crate.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Shared between the HTTP handlers and the scheduler thread.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Completion requests received (valid or not).
    pub requests: AtomicU64,
    /// Requests answered with 4xx because of the request itself (400, 401, 413).
    pub rejected_invalid: AtomicU64,
    /// Requests answered 429 because the wait queue was full.
    pub rejected_busy: AtomicU64,
    /// Requests that ended in a server-side error (5xx or an error event mid-stream).
    pub errors: AtomicU64,
    /// Requests whose generation ran to an end (stop, length).
    pub completed: AtomicU64,
    /// Generations cut short because the client went away.
    pub cancelled: AtomicU64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens actually evaluated (the rest came from a slot's cache).
    pub prompt_tokens_evaluated: AtomicU64,
    /// Tokens sampled.
    pub generated_tokens: AtomicU64,
    /// Tokens chosen through the screened LM head (`--screen-head`) without full logits.
    pub screened_tokens: AtomicU64,
    /// Forward passes run by the scheduler.
    pub steps: AtomicU64,
    /// Requests waiting for a slot (admission bound: the wait queue).
    pub queue_depth: AtomicUsize,
    /// Slots generating or prefilling.
    pub slots_busy: AtomicUsize,
    /// Slots in total (0 while loading).
    pub slots_total: AtomicUsize,
    /// Aggregate generation rate over the last few seconds of work, as f64 bits.
    pub tok_per_s_bits: AtomicU64,
    /// Seconds spent in forward passes, as microseconds.
    pub busy_us: AtomicU64,
}

impl Metrics {
    pub fn set_tok_per_s(&self, v: f64) {
        self.tok_per_s_bits.store(v.to_bits(), Relaxed);
    }

    pub fn tok_per_s(&self) -> f64 {
        f64::from_bits(self.tok_per_s_bits.load(Relaxed))
    }

    /// The Prometheus text exposition (version 0.0.4).
    pub fn render(&self) -> String {
        let mut s = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(s, "# HELP {name} {help}");
            let _ = writeln!(s, "# TYPE {name} {kind}");
            let _ = writeln!(s, "{name} {value}");
        };
        let c = |a: &AtomicU64| a.load(Relaxed).to_string();
        let g = |a: &AtomicUsize| a.load(Relaxed).to_string();
        metric(
            "bitnet_requests_total",
            "counter",
            "Completion requests received.",
            c(&self.requests),
        );
        metric(
            "bitnet_requests_completed_total",
            "counter",
            "Requests whose generation ended with stop or length.",
            c(&self.completed),
        );
        metric(
            "bitnet_requests_rejected_invalid_total",
            "counter",
            "Requests refused as invalid (400, 401, 413).",
            c(&self.rejected_invalid),
        );
        metric(
            "bitnet_requests_rejected_busy_total",
            "counter",
            "Requests refused with 429 because the wait queue was full.",
            c(&self.rejected_busy),
        );
        metric(
            "bitnet_requests_cancelled_total",
            "counter",
            "Generations cancelled because the client disconnected.",
            c(&self.cancelled),
        );
        metric(
            "bitnet_requests_failed_total",
            "counter",
            "Requests that ended with a server-side error.",
            c(&self.errors),
        );
        metric(
            "bitnet_prompt_tokens_total",
            "counter",
            "Prompt tokens of admitted requests.",
            c(&self.prompt_tokens),
        );
        metric(
            "bitnet_prompt_tokens_evaluated_total",
            "counter",
            "Prompt tokens evaluated (the others were reused from a slot's cache).",
            c(&self.prompt_tokens_evaluated),
        );
        metric(
            "bitnet_generated_tokens_total",
            "counter",
            "Tokens generated.",
            c(&self.generated_tokens),
        );
        metric(
            "bitnet_screened_tokens_total",
            "counter",
            "Tokens chosen through the screened LM head, without computing every logit.",
            c(&self.screened_tokens),
        );
        metric(
            "bitnet_forward_passes_total",
            "counter",
            "Batched forward passes run.",
            c(&self.steps),
        );
        metric(
            "bitnet_busy_seconds_total",
            "counter",
            "Time spent in forward passes.",
            format!("{:.6}", self.busy_us.load(Relaxed) as f64 / 1e6),
        );
        metric(
            "bitnet_queue_depth",
            "gauge",
            "Requests waiting for a free slot.",
            g(&self.queue_depth),
        );
        metric(
            "bitnet_slots_busy",
            "gauge",
            "Slots prefilling or generating.",
            g(&self.slots_busy),
        );
        metric(
            "bitnet_slots_total",
            "gauge",
            "Slots (parallel sequences).",
            g(&self.slots_total),
        );
        metric(
            "bitnet_generation_tokens_per_second",
            "gauge",
            "Aggregate generation rate over the last seconds of work.",
            format!("{:.3}", self.tok_per_s()),
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_metric_with_help_and_type() {
        let m = Metrics::default();
        m.requests.store(3, Relaxed);
        m.queue_depth.store(2, Relaxed);
        m.set_tok_per_s(12.5);
        let text = m.render();
        assert!(text.contains("\nbitnet_requests_total 3\n"));
        assert!(text.contains("\nbitnet_queue_depth 2\n"));
        assert!(text.contains("\nbitnet_generation_tokens_per_second 12.500\n"));
        // every sample line is preceded by its HELP and TYPE lines
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len() % 3, 0);
        for t in lines.chunks(3) {
            let name = t[2].split(' ').next().unwrap();
            assert!(t[0].starts_with(&format!("# HELP {name} ")));
            assert!(t[1].starts_with(&format!("# TYPE {name} ")));
        }
    }
}
