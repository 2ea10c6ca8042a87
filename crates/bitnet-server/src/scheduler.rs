//! The scheduler thread: owns the engine and the slots, runs continuous batching.
//!
//! Each tick:
//! 1. take new jobs from the channel into the wait list; drop waiting jobs whose client
//!    is gone or whose deadline passed;
//! 2. admit waiting jobs into free slots, reusing the longest cached prompt prefix;
//! 3. one forward pass ([`Model::forward_seqs`]) over every busy slot: a decoding slot
//!    contributes its last sampled token, a prefilling slot a chunk of its prompt
//!    (at most `prefill_chunk` prompt tokens per tick in total, so a long prompt never
//!    stalls the other streams for long), all sharing every ternary matmul;
//! 4. sample per slot with its own [`Sampler`], push the text through its
//!    [`StreamDecoder`] and [`StopMatcher`], send events; free slots that finished, whose
//!    client went away (their event channel is closed) or whose time is up.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bitnet_engine::Session;
use bitnet_engine::{Engine, FinishReason, Pick, Picked, StopMatcher};
use bitnet_model::Outputs;
use bitnet_sampling::{Sampler, SamplerParams};
use bitnet_tokenizer::{StreamDecoder, TokenKind};
use tokio::sync::mpsc::UnboundedSender;

use crate::api::{TokenLogprob, Usage};
use crate::metrics::Metrics;

/// A generation request, validated and tokenized.
#[derive(Debug)]
pub(crate) struct Job {
    pub prompt: Vec<u32>,
    /// At least 1; `prompt.len() + max_tokens <= n_ctx` (checked by the handler).
    pub max_tokens: usize,
    pub sampler: SamplerParams,
    pub stop: Vec<String>,
    /// Log-probabilities to report: `Some(n)` with the `n` most likely alternatives.
    pub logprobs: Option<usize>,
    /// The structured-output constraint, compiled by the handler.
    pub constraint: Option<Box<bitnet_engine::ConstraintState>>,
    /// The field the constraint came from (named when it fails while generating).
    pub constraint_field: &'static str,
    /// Generation ends (`finish_reason: "length"`) at this instant; a job still waiting
    /// then is refused with 503.
    pub deadline: Instant,
    pub events: UnboundedSender<GenEvent>,
    /// Counts the job as in flight until it is dropped, whatever path drops it.
    pub _ticket: Ticket,
}

/// Holds one unit of the in-flight count; gives it back on drop.
#[derive(Debug)]
pub(crate) struct Ticket(Arc<AtomicUsize>);

impl Ticket {
    /// Take a unit if fewer than `max` are taken.
    pub fn try_take(count: &Arc<AtomicUsize>, max: usize) -> Option<Ticket> {
        count
            .fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| Ticket(Arc::clone(count)))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// What the scheduler tells a request's handler.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum GenEvent {
    /// The job has a slot; text follows.
    Started,
    /// Generated text: complete UTF-8, stop strings held back; with the
    /// log-probabilities of the tokens sampled since the last text (when asked for).
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    /// The end; `finish` is OpenAI's `finish_reason`.
    Done { finish: &'static str, usage: Usage },
    /// The job failed or was refused; no more events follow.
    Error {
        status: u16,
        kind: &'static str,
        message: String,
        /// The request field at fault, if one is.
        param: Option<&'static str>,
    },
}

/// An embeddings request, validated and tokenized: run whole between two passes.
#[derive(Debug)]
pub(crate) struct EmbedJob {
    pub inputs: Vec<Vec<u32>>,
    pub opts: bitnet_engine::EmbedOptions,
    pub reply: tokio::sync::oneshot::Sender<Result<Vec<Vec<f32>>, String>>,
    /// Counts the job as in flight until it is dropped.
    pub _ticket: Ticket,
}

/// Messages to the scheduler thread.
#[derive(Debug)]
pub(crate) enum Msg {
    Job(Job),
    Embed(EmbedJob),
    /// Stop taking new work; end whatever is still running at `deadline` with an error.
    Drain {
        deadline: Instant,
    },
}

/// What `/slots` shows of one slot, published by the scheduler after every pass.
#[derive(Debug, Default)]
pub(crate) struct SlotStatus {
    pub busy: AtomicBool,
    /// Tokens whose K/V are in the slot's cache.
    pub cached: AtomicUsize,
    /// The current (or last) request's prompt tokens and tokens generated so far.
    pub prompt: AtomicUsize,
    pub generated: AtomicUsize,
}

/// Scheduler settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SchedConfig {
    pub parallel: usize,
    pub n_ctx: usize,
    pub prefill_chunk: usize,
    pub step_delay: Option<Duration>,
}

/// Stack of the thread computing token masks: llguidance's matcher recurses over deep
/// schemas, as on the scheduler thread (`SCHEDULER_STACK`).
const MASK_STACK: usize = 64 << 20;

#[derive(Debug)]
struct Slot {
    /// The slot's KV cache (in memory, or on the GPU when the engine runs there).
    cache: Session,
    /// Tokens whose K/V are in `cache` (`cache.tokens() == tokens`).
    tokens: Vec<u32>,
    active: Option<Active>,
}

#[derive(Debug)]
struct Active {
    job: Job,
    /// Next prompt token to evaluate; `== job.prompt.len()` once prefilled.
    next_prompt: usize,
    /// Prompt tokens reused from the cache.
    cached: usize,
    sampler: Sampler,
    decoder: StreamDecoder,
    stops: StopMatcher,
    /// The sampled token to evaluate in the next pass.
    pending: Option<u32>,
    generated: usize,
    /// Log-probabilities of sampled tokens whose text has not been sent yet.
    logprobs: Vec<TokenLogprob>,
}

impl Active {
    fn prefilling(&self) -> bool {
        self.next_prompt < self.job.prompt.len()
    }
}

/// The planned work of one slot in a forward pass.
struct Plan {
    slot: usize,
    tokens: Vec<u32>,
    outputs: Outputs,
}

pub(crate) struct Scheduler {
    engine: Engine,
    slots: Vec<Slot>,
    waiting: VecDeque<Job>,
    cfg: SchedConfig,
    metrics: Arc<Metrics>,
    drain_deadline: Option<Instant>,
    /// (end of a pass, tokens generated in it), for the tok/s gauge.
    recent: VecDeque<(Instant, Duration, usize)>,
    status: Arc<[SlotStatus]>,
}

impl Scheduler {
    /// Allocate every slot's KV cache up front, so memory use is fixed from the start.
    pub fn new(
        engine: Engine,
        cfg: SchedConfig,
        metrics: Arc<Metrics>,
        status: Arc<[SlotStatus]>,
    ) -> Result<Self, bitnet_engine::EngineError> {
        let mut slots = Vec::with_capacity(cfg.parallel);
        for _ in 0..cfg.parallel {
            let cache = engine.new_session(cfg.n_ctx)?;
            slots.push(Slot {
                cache,
                tokens: Vec::new(),
                active: None,
            });
        }
        metrics.slots_total.store(cfg.parallel, Relaxed);
        Ok(Scheduler {
            engine,
            slots,
            waiting: VecDeque::new(),
            cfg,
            metrics,
            drain_deadline: None,
            recent: VecDeque::new(),
            status,
        })
    }

    /// Run until the channel closes (every sender dropped) and no work is left.
    pub fn run(mut self, rx: Receiver<Msg>) {
        let mut closed = false;
        loop {
            let busy = self.slots.iter().any(|s| s.active.is_some()) || !self.waiting.is_empty();
            if !busy {
                if closed || self.drain_deadline.is_some() {
                    return;
                }
                // Idle: block for the next message.
                match rx.recv_timeout(Duration::from_millis(500)) {
                    Ok(m) => self.on_msg(m),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => closed = true,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(m) => self.on_msg(m),
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            }
            self.tick();
            self.publish();
        }
    }

    /// Update what `/slots` shows.
    fn publish(&self) {
        for (s, st) in self.slots.iter().zip(self.status.iter()) {
            st.busy.store(s.active.is_some(), Relaxed);
            st.cached.store(s.tokens.len(), Relaxed);
            if let Some(a) = &s.active {
                st.prompt.store(a.job.prompt.len(), Relaxed);
                st.generated.store(a.generated, Relaxed);
            }
        }
    }

    fn on_msg(&mut self, m: Msg) {
        match m {
            Msg::Job(j) => self.waiting.push_back(j),
            Msg::Embed(e) => {
                // A client that went away gets nothing computed.
                if !e.reply.is_closed() {
                    let r = self
                        .engine
                        .embed(&e.inputs, &e.opts)
                        .map_err(|x| x.to_string());
                    if r.is_err() {
                        self.metrics.errors.fetch_add(1, Relaxed);
                    }
                    let _ = e.reply.send(r);
                }
            }
            Msg::Drain { deadline } => self.drain_deadline = Some(deadline),
        }
    }

    fn tick(&mut self) {
        let now = Instant::now();
        let draining_over = self.drain_deadline.is_some_and(|d| now >= d);

        // 1. Waiting jobs: drop the abandoned, refuse the expired.
        let m = Arc::clone(&self.metrics);
        self.waiting.retain(|j| {
            if j.events.is_closed() {
                m.cancelled.fetch_add(1, Relaxed);
                false
            } else if draining_over {
                send_error(j, 503, "unavailable_error", "the server is shutting down");
                m.errors.fetch_add(1, Relaxed);
                false
            } else if now >= j.deadline {
                send_error(
                    j,
                    503,
                    "unavailable_error",
                    "timed out waiting for a free slot",
                );
                m.errors.fetch_add(1, Relaxed);
                false
            } else {
                true
            }
        });

        // 2. Busy slots: cancel the abandoned, end the expired.
        for i in 0..self.slots.len() {
            let Some(a) = &self.slots[i].active else {
                continue;
            };
            if a.job.events.is_closed() {
                self.metrics.cancelled.fetch_add(1, Relaxed);
                self.free(i);
            } else if draining_over {
                send_error(
                    &a.job,
                    503,
                    "unavailable_error",
                    "the server is shutting down; generation was stopped",
                );
                self.metrics.errors.fetch_add(1, Relaxed);
                self.free(i);
            } else if now >= a.job.deadline {
                self.finish(i, FinishReason::Length);
            }
        }

        // 3. Admit.
        while !self.waiting.is_empty() {
            let Some(slot) = self.pick_slot() else { break };
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            self.admit(slot, job);
        }
        self.metrics.queue_depth.store(self.waiting.len(), Relaxed);

        // 4. One batched forward pass.
        let plans = self.plan();
        if plans.is_empty() {
            return;
        }
        let t0 = Instant::now();
        let result = self.forward(&plans);
        let dt = t0.elapsed();
        self.metrics.steps.fetch_add(1, Relaxed);
        self.metrics
            .busy_us
            .fetch_add(u64::try_from(dt.as_micros()).unwrap_or(u64::MAX), Relaxed);
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                // A model error is not the client's fault and not recoverable for these
                // sequences: fail them, reset their caches, keep serving.
                for p in &plans {
                    if let Some(a) = &self.slots[p.slot].active {
                        send_error(
                            &a.job,
                            500,
                            "server_error",
                            &format!("generation failed: {e}"),
                        );
                        self.metrics.errors.fetch_add(1, Relaxed);
                    }
                    self.free(p.slot);
                    self.slots[p.slot].cache.reset();
                    self.slots[p.slot].tokens.clear();
                }
                return;
            }
        };

        // 5. Sample and emit.
        let mut generated = 0usize;
        for (p, l) in plans.iter().zip(logits) {
            let slot = &mut self.slots[p.slot];
            slot.tokens.extend_from_slice(&p.tokens);
            let Some(a) = slot.active.as_mut() else {
                continue;
            };
            if a.prefilling() {
                a.next_prompt += p.tokens.len();
                self.metrics
                    .prompt_tokens_evaluated
                    .fetch_add(len_u64(p.tokens.len()), Relaxed);
                if a.prefilling() {
                    continue;
                }
            } else {
                a.pending = None;
            }
            generated += 1;
            if let Some(reason) = self.step(p.slot, &l) {
                self.finish(p.slot, reason);
            }
        }
        self.record_rate(t0 + dt, dt, generated);
        if let Some(d) = self.cfg.step_delay {
            std::thread::sleep(d);
        }
    }

    /// A free slot for the first waiting job: the one sharing the longest prefix with
    /// its prompt (so a follow-up chat turn reuses its KV), else any free one.
    fn pick_slot(&self) -> Option<usize> {
        let job = self.waiting.front()?;
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.active.is_none())
            .max_by_key(|(i, s)| (common_prefix(&s.tokens, &job.prompt), usize::MAX - i))
            .map(|(i, _)| i)
    }

    fn admit(&mut self, i: usize, job: Job) {
        if job.events.send(GenEvent::Started).is_err() {
            self.metrics.cancelled.fetch_add(1, Relaxed);
            return;
        }
        let sampler = match Sampler::new(job.sampler.clone()) {
            Ok(s) => s,
            Err(e) => {
                send_error(&job, 400, "invalid_request_error", &e.to_string());
                return;
            }
        };
        let slot = &mut self.slots[i];
        // Keep at least one prompt token to evaluate: its logits start the generation.
        let common =
            common_prefix(&slot.tokens, &job.prompt).min(job.prompt.len().saturating_sub(1));
        slot.cache.truncate(common);
        slot.tokens.truncate(common);
        let mut sampler = sampler;
        for &t in &job.prompt {
            sampler.accept(t);
        }
        self.metrics
            .prompt_tokens
            .fetch_add(len_u64(job.prompt.len()), Relaxed);
        self.metrics.slots_busy.fetch_add(1, Relaxed);
        slot.active = Some(Active {
            stops: StopMatcher::new(&job.stop),
            job,
            next_prompt: common,
            cached: common,
            sampler,
            decoder: StreamDecoder::new(),
            pending: None,
            generated: 0,
            logprobs: Vec::new(),
        });
    }

    fn plan(&self) -> Vec<Plan> {
        let mut plans = Vec::new();
        // Decoding slots first: one token each.
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(t) = s.active.as_ref().and_then(|a| a.pending) {
                plans.push(Plan {
                    slot: i,
                    tokens: vec![t],
                    outputs: Outputs::Last,
                });
            }
        }
        // Then prompt chunks, within the per-pass prompt budget.
        let mut budget = self.cfg.prefill_chunk.max(1);
        for (i, s) in self.slots.iter().enumerate() {
            let Some(a) = s.active.as_ref().filter(|a| a.prefilling()) else {
                continue;
            };
            if budget == 0 {
                break;
            }
            let rest = &a.job.prompt[a.next_prompt..];
            let n = rest.len().min(budget);
            budget -= n;
            plans.push(Plan {
                slot: i,
                tokens: rest[..n].to_vec(),
                outputs: if n == rest.len() {
                    Outputs::Last
                } else {
                    Outputs::None
                },
            });
        }
        plans.sort_by_key(|p| p.slot);
        plans
    }

    /// The batched forward pass; meanwhile, on a thread of its own, the token masks of the
    /// constrained slots that get logits from it are computed (so a constraint's cost hides
    /// behind the pass instead of following it).
    fn forward(&mut self, plans: &[Plan]) -> Result<Vec<Picked>, bitnet_engine::EngineError> {
        // What chooses each slot's next token: the screen where the engine has one and the
        // request reads nothing else (no constraint to mask the logits, no log-probabilities
        // to report), else the full logits.
        let picks: Vec<Option<Pick>> = plans
            .iter()
            .map(|p| {
                let a = self.slots[p.slot].active.as_ref()?;
                if p.outputs != Outputs::Last
                    || a.job.constraint.is_some()
                    || a.job.logprobs.is_some()
                {
                    return None;
                }
                self.engine.pick_for(&a.sampler)
            })
            .collect();
        let mut states: Vec<(usize, Box<bitnet_engine::ConstraintState>)> = plans
            .iter()
            .filter(|p| p.outputs != Outputs::None)
            .filter_map(|p| {
                let a = self.slots[p.slot].active.as_mut()?;
                a.job.constraint.take().map(|c| (p.slot, c))
            })
            .collect();
        if states.is_empty() {
            return self.forward_pass(plans, &picks);
        }
        let r = std::thread::scope(|scope| {
            // The thread borrows the states: if it cannot start, they stay here and each
            // mask is computed when it is applied.
            let masks = std::thread::Builder::new()
                .name("bitnet-mask".into())
                .stack_size(MASK_STACK)
                .spawn_scoped(scope, || {
                    for (_, c) in states.iter_mut() {
                        // An error here comes back from `apply`, which computes the mask
                        // again.
                        let _ = c.prepare();
                    }
                });
            let r = self.forward_pass(plans, &picks);
            if let Ok(h) = masks {
                // A panic there left no mask ready: `apply` computes it.
                let _ = h.join();
            }
            r
        });
        for (slot, c) in states {
            if let Some(a) = self.slots[slot].active.as_mut() {
                a.job.constraint = Some(c);
            }
        }
        r
    }

    fn forward_pass(
        &mut self,
        plans: &[Plan],
        picks: &[Option<Pick>],
    ) -> Result<Vec<Picked>, bitnet_engine::EngineError> {
        // `plans` is sorted by slot; pair each plan with its slot's cache.
        let mut it = plans.iter().peekable();
        let mut work: Vec<(&mut Session, &[u32], Outputs)> = Vec::with_capacity(plans.len());
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(p) = it.next_if(|p| p.slot == i) {
                work.push((&mut s.cache, &p.tokens, p.outputs));
            }
        }
        self.engine.forward_sessions_pick(&mut work, picks)
    }

    /// Sample the next token of slot `i` from its pass's answer; `Some` when generation
    /// ends.
    fn step(&mut self, i: usize, picked: &Picked) -> Option<FinishReason> {
        let n_ctx = self.cfg.n_ctx;
        let slot = &mut self.slots[i];
        let cache_len = slot.tokens.len();
        let a = slot.active.as_mut()?;
        let sampled = match picked {
            Picked::Logits(logits) => {
                let masked;
                let logits = match a.job.constraint.as_mut() {
                    None => logits.as_slice(),
                    Some(c) => {
                        let mut l = logits.clone();
                        if let Err(e) = c.apply(&mut l) {
                            send_grammar_error(&a.job, &e);
                            self.metrics.errors.fetch_add(1, Relaxed);
                            return Some(FinishReason::Cancelled);
                        }
                        masked = l;
                        &masked[..]
                    }
                };
                match a.job.logprobs {
                    None => a.sampler.sample(logits),
                    Some(n) => a.sampler.sample_with_logprobs(logits, n).map(|s| {
                        a.logprobs.push(TokenLogprob {
                            id: s.id,
                            logprob: s.logprob,
                            top: s.top,
                        });
                        s.id
                    }),
                }
                .map_err(|e| e.to_string())
            }
            // The screen answers only requests with no constraint and no log-probabilities
            // (`forward`); a token counts as screened once `choose` has given it.
            screened => {
                let t = self.engine.choose(&mut a.sampler, screened);
                if t.is_ok() {
                    self.metrics.screened_tokens.fetch_add(1, Relaxed);
                }
                t.map_err(|e| e.to_string())
            }
        };
        let t = match sampled {
            Ok(t) => t,
            Err(e) => {
                send_error(
                    &a.job,
                    500,
                    "server_error",
                    &format!("sampling failed: {e}"),
                );
                self.metrics.errors.fetch_add(1, Relaxed);
                return Some(FinishReason::Cancelled);
            }
        };
        if let Some(Err(e)) = a.job.constraint.as_mut().map(|c| c.commit(t)) {
            send_grammar_error(&a.job, &e);
            self.metrics.errors.fetch_add(1, Relaxed);
            return Some(FinishReason::Cancelled);
        }
        self.emit(i, t, cache_len, n_ctx)
    }

    /// Take slot `i`'s sampled token `t` (the cache held `cache_len` tokens): count it, send
    /// its text; `Some` when generation ends with it.
    fn emit(&mut self, i: usize, t: u32, cache_len: usize, n_ctx: usize) -> Option<FinishReason> {
        let tok = &self.engine.tokenizer;
        let a = self.slots[i].active.as_mut()?;
        a.sampler.accept(t);
        a.generated += 1;
        self.metrics.generated_tokens.fetch_add(1, Relaxed);
        if tok.is_eog(t) {
            // The end-of-generation token is not part of the reply, nor its logprob.
            a.logprobs.pop();
            return Some(FinishReason::Eog);
        }
        // Control tokens are not text (they never reach the client).
        let piece = if tok.token_kind(t) == Some(TokenKind::Control) {
            String::new()
        } else {
            match a.decoder.push(tok, t) {
                Ok(p) => p,
                Err(e) => {
                    send_error(
                        &a.job,
                        500,
                        "server_error",
                        &format!("decoding failed: {e}"),
                    );
                    self.metrics.errors.fetch_add(1, Relaxed);
                    return Some(FinishReason::Cancelled);
                }
            }
        };
        let (emit, hit) = a.stops.push(&piece);
        if !emit.is_empty() {
            let logprobs = std::mem::take(&mut a.logprobs);
            if a.job
                .events
                .send(GenEvent::Text {
                    text: emit,
                    logprobs,
                })
                .is_err()
            {
                self.metrics.cancelled.fetch_add(1, Relaxed);
                return Some(FinishReason::Cancelled);
            }
        }
        if hit {
            // Tokens whose text went into the stop string are not part of the reply.
            a.logprobs.clear();
            return Some(FinishReason::StopString);
        }
        if a.generated >= a.job.max_tokens || cache_len >= n_ctx {
            return Some(FinishReason::Length);
        }
        a.pending = Some(t);
        None
    }

    /// End slot `i`'s generation: free the slot, flush held-back text, send `Done`.
    /// The slot and the request's admission ticket are released before `Done` is sent,
    /// so a client that has its answer never sees its slot still counted as busy.
    fn finish(&mut self, i: usize, reason: FinishReason) {
        let Some(a) = self.free(i) else {
            return;
        };
        if reason == FinishReason::Cancelled {
            return;
        }
        let Active {
            job,
            mut stops,
            mut decoder,
            cached,
            generated,
            logprobs,
            ..
        } = a;
        let Job {
            events,
            _ticket,
            prompt,
            ..
        } = job;
        drop(_ticket);
        let mut tail = String::new();
        if reason != FinishReason::StopString {
            let (emit, _) = stops.push(&decoder.finish());
            tail.push_str(&emit);
            tail.push_str(&stops.finish());
        }
        if !tail.is_empty() || !logprobs.is_empty() {
            let _ = events.send(GenEvent::Text {
                text: tail,
                logprobs,
            });
        }
        let usage = Usage {
            prompt_tokens: prompt.len(),
            cached_tokens: cached,
            completion_tokens: generated,
        };
        self.metrics.completed.fetch_add(1, Relaxed);
        let _ = events.send(GenEvent::Done {
            finish: reason.as_openai(),
            usage,
        });
    }

    /// Take slot `i`'s request out of it (the KV cache keeps its tokens for reuse).
    fn free(&mut self, i: usize) -> Option<Active> {
        let slot = &mut self.slots[i];
        let a = slot.active.take()?;
        if let Some(st) = self.status.get(i) {
            st.generated.store(a.generated, Relaxed);
        }
        // A token sampled but never evaluated is not in the cache; a prompt cut short
        // leaves a valid prefix in it. Either way `tokens` matches the cache.
        debug_assert_eq!(slot.tokens, slot.cache.tokens());
        self.metrics.slots_busy.fetch_sub(1, Relaxed);
        Some(a)
    }

    /// Update the tok/s gauge over the passes of the last few seconds.
    fn record_rate(&mut self, end: Instant, dt: Duration, generated: usize) {
        const WINDOW: Duration = Duration::from_secs(5);
        self.recent.push_back((end, dt, generated));
        while self
            .recent
            .front()
            .is_some_and(|(t, _, _)| end.duration_since(*t) > WINDOW)
        {
            self.recent.pop_front();
        }
        let busy: f64 = self.recent.iter().map(|(_, d, _)| d.as_secs_f64()).sum();
        let toks: usize = self.recent.iter().map(|(_, _, n)| n).sum();
        if busy > 0.0 {
            self.metrics.set_tok_per_s(toks as f64 / busy);
        }
    }
}

fn send_error(j: &Job, status: u16, kind: &'static str, message: &str) {
    let _ = j.events.send(GenEvent::Error {
        status,
        kind,
        message: message.to_string(),
        param: None,
    });
}

/// A constraint that fails while generating (a grammar beyond llguidance's limits on
/// parser work, found only as the text grows): the request's fault, a 400 naming its field.
fn send_grammar_error(j: &Job, e: &bitnet_engine::EngineError) {
    let _ = j.events.send(GenEvent::Error {
        status: 400,
        kind: "invalid_request_error",
        message: format!("`{}`: {e}", j.constraint_field),
        param: Some(j.constraint_field),
    });
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn len_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
