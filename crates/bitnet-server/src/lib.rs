//! An OpenAI-compatible HTTP server over [`bitnet_engine::Engine`].
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`,
//! `GET /health` (503 while the model loads), `GET /metrics` (Prometheus text),
//! llama-server's `POST /tokenize`, `POST /detokenize`, `GET /props` and `GET /slots`,
//! and a chat page at `/` (embedded: no network needed).
//!
//! # Architecture
//! * One **scheduler thread** owns the engine and `parallel` slots, each with its own KV
//!   cache. It batches the decode steps of every busy slot (and prompt chunks of new
//!   ones) into one forward pass ([`bitnet_model::Model::forward_seqs`]): N streams share
//!   every ternary matmul.
//! * HTTP handlers (tokio, hyper HTTP/1.1) validate and tokenize a request, then hand it
//!   to the scheduler over a channel and read its events from a per-request channel.
//! * **Admission**: at most `parallel + max_queue` requests are in the scheduler's hands;
//!   more get 429 with `Retry-After`. A request that waits past its time limit gets 503;
//!   one that runs past it ends with `finish_reason: "length"`.
//! * **Cancellation**: a client that disconnects drops its event receiver; the scheduler
//!   sees the closed channel at its next pass and frees the slot.
//! * **Shutdown** ([`Server::run`]'s future resolving): stop accepting, answer new
//!   requests 503, let in-flight ones finish for `shutdown_grace`, then end what is left
//!   with an error event (streams) or 503 (others) and close.
//! * Limits: request body size (413), header and body read time (hyper's header timeout,
//!   408 for a slow body), concurrent connections, stop strings, context (400).
#![forbid(unsafe_code)]

pub mod api;
mod embeddings;
mod http;
pub mod metrics;
mod request;
mod scheduler;
mod web;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bitnet_engine::Engine;
use bitnet_sampling::SamplerParams;
use bitnet_tokenizer::Tokenizer;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use api::{ApiError, Endpoint};
pub use metrics::Metrics;

/// Errors starting or running the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid server setting `{field}`: {reason}")]
    Config { field: &'static str, reason: String },
    #[error("loading the model failed: {0}")]
    Load(String),
    #[error("the server stopped before the model was loaded")]
    NotLoaded,
}

/// Server settings. [`ServerConfig::default`] gives the `bitnet serve` defaults.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Parallel sequences (slots), each with its own KV cache.
    pub parallel: usize,
    /// Context positions per slot; `None`: the training context, at most 4096.
    pub n_ctx: Option<usize>,
    /// Requests allowed to wait for a slot; beyond it, 429.
    pub max_queue: usize,
    /// Largest request body, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Time limit of one request, from its arrival: waiting past it gives 503,
    /// generating past it ends the generation with `finish_reason: "length"`.
    pub request_timeout: Duration,
    /// Time allowed to send the request headers, and separately the body (408).
    pub read_timeout: Duration,
    /// Most simultaneous connections; more are closed at once.
    pub max_connections: usize,
    /// Bearer token required on every endpoint but `/health` (compared in constant time).
    pub api_key: Option<String>,
    /// The model id reported by `/v1/models` and in responses.
    pub model_name: String,
    /// Prompt tokens evaluated per forward pass, over all prefilling slots.
    pub prefill_chunk: usize,
    /// How long in-flight requests may run after shutdown is requested.
    pub shutdown_grace: Duration,
    /// Most stop strings in a request, and longest one in bytes.
    pub max_stop: usize,
    pub max_stop_bytes: usize,
    /// Sampling parameters for fields a request leaves out (llama.cpp's defaults).
    pub sampling_defaults: SamplerParams,
    /// A pause after every forward pass: a throttle, and a way for tests to make
    /// generation slow enough to observe queueing, cancellation and draining.
    pub step_delay: Option<Duration>,
    /// Origins allowed to call the API from a web page on another origin (CORS):
    /// `scheme://host[:port]` each, or `*` for any. Empty (the default): cross-origin
    /// calls are refused, so a web site the user visits cannot drive the server.
    pub cors_origins: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            parallel: 1,
            n_ctx: None,
            max_queue: 16,
            max_body_bytes: 1 << 20,
            request_timeout: Duration::from_secs(600),
            read_timeout: Duration::from_secs(30),
            max_connections: 512,
            api_key: None,
            model_name: "bitnet".into(),
            prefill_chunk: 128,
            shutdown_grace: Duration::from_secs(30),
            max_stop: 16,
            max_stop_bytes: 1024,
            sampling_defaults: SamplerParams::default(),
            step_delay: None,
            cors_origins: Vec::new(),
        }
    }
}

impl ServerConfig {
    fn check(&self) -> Result<(), ServerError> {
        let bad = |field, reason: &str| {
            Err(ServerError::Config {
                field,
                reason: reason.into(),
            })
        };
        if self.parallel == 0 || self.parallel > 256 {
            return bad("parallel", "must be in 1..=256");
        }
        if self.n_ctx == Some(0) {
            return bad("n_ctx", "must be at least 1");
        }
        if self.prefill_chunk == 0 {
            return bad("prefill_chunk", "must be at least 1");
        }
        if self.max_connections == 0 {
            return bad("max_connections", "must be at least 1");
        }
        if self.api_key.as_deref() == Some("") {
            return bad("api_key", "must not be empty");
        }
        for o in &self.cors_origins {
            if let Err(reason) = http::check_origin(o) {
                return Err(ServerError::Config {
                    field: "cors_origins",
                    reason: format!("{o:?}: {reason}"),
                });
            }
        }
        Ok(())
    }
}

/// The scheduler thread's stack.
const SCHEDULER_STACK: usize = 64 << 20;

/// What handlers need once the model is loaded.
#[derive(Debug)]
pub(crate) struct Ready {
    tx: std::sync::mpsc::Sender<scheduler::Msg>,
    tokenizer: Arc<Tokenizer>,
    n_ctx: usize,
    n_vocab: usize,
    n_ctx_train: usize,
    /// Width of an embedding, and the pooling the file asks for (`/v1/embeddings`).
    n_embd: usize,
    pooling: bitnet_model::Pooling,
    slots: Arc<[scheduler::SlotStatus]>,
    /// The grammar compiler over the vocabulary, built at the first constrained request.
    grammars: Arc<std::sync::OnceLock<Result<bitnet_engine::Grammars, String>>>,
    /// The memory-mapped model file as loaded: `/health` turns unhealthy when it changes.
    file: Option<bitnet_engine::FileIdentity>,
}

/// Loading state, as `/health` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Phase {
    Loading,
    Ready,
    Failed(String),
}

/// State shared by handlers, the accept loop and the scheduler thread.
#[derive(Debug)]
pub(crate) struct Shared {
    cfg: ServerConfig,
    metrics: Arc<Metrics>,
    ready: OnceLock<Ready>,
    phase: watch::Sender<Phase>,
    draining: AtomicBool,
    /// Requests admitted and not yet finished (being prepared, waiting or in a slot).
    in_flight: Arc<AtomicUsize>,
    /// Constraint compilations running at once: at most `parallel` (a hostile schema or
    /// grammar can take seconds and hundreds of MB to compile within llguidance's limits).
    compiles: tokio::sync::Semaphore,
    scheduler: Mutex<Option<std::thread::JoinHandle<()>>>,
    started: u64,
}

/// A bound, not yet running server.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
}

/// A cheap handle to a server: load its model, wait for it, read its metrics.
#[derive(Debug, Clone)]
pub struct ServerHandle {
    shared: Arc<Shared>,
}

impl Server {
    /// Bind `addr` (use port 0 for any free port). The server answers 503 until a model
    /// is loaded with [`ServerHandle::load`].
    pub async fn bind(addr: SocketAddr, cfg: ServerConfig) -> Result<Server, ServerError> {
        cfg.check()?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })?;
        let (phase, _) = watch::channel(Phase::Loading);
        let compiles = tokio::sync::Semaphore::new(cfg.parallel);
        Ok(Server {
            listener,
            shared: Arc::new(Shared {
                cfg,
                metrics: Arc::new(Metrics::default()),
                ready: OnceLock::new(),
                phase,
                draining: AtomicBool::new(false),
                in_flight: Arc::new(AtomicUsize::new(0)),
                compiles,
                scheduler: Mutex::new(None),
                started: api::unix_now(),
            }),
        })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, ServerError> {
        Ok(self.listener.local_addr()?)
    }

    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Serve until `shutdown` resolves, then drain (see the crate docs) and return.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), ServerError> {
        http::serve(self.listener, self.shared, shutdown).await
    }
}

impl ServerHandle {
    /// Start the scheduler thread: it runs `loader` (the server answers 503 meanwhile),
    /// allocates every slot's KV cache, then serves. The engine owns its model and file
    /// (`bitnet_engine::load`), and is dropped with the scheduler.
    pub fn load<F>(&self, loader: F)
    where
        F: FnOnce() -> Result<Engine, String> + Send + 'static,
    {
        let shared = Arc::clone(&self.shared);
        // A large stack (reserved, touched only as used): the scheduler computes the token
        // masks of constrained requests, and llguidance recurses over large grammars.
        let handle = std::thread::Builder::new()
            .name("bitnet-scheduler".into())
            .stack_size(SCHEDULER_STACK)
            .spawn(move || run_scheduler(&shared, loader));
        match handle {
            Ok(h) => {
                if let Ok(mut g) = self.shared.scheduler.lock() {
                    *g = Some(h);
                }
            }
            Err(e) => {
                self.shared.phase.send_replace(Phase::Failed(format!(
                    "cannot start the scheduler thread: {e}"
                )));
            }
        }
    }

    /// Wait until the model is loaded (Ok) or loading failed (Err).
    pub async fn wait_ready(&self) -> Result<(), ServerError> {
        let mut rx = self.shared.phase.subscribe();
        let phase = rx
            .wait_for(|p| *p != Phase::Loading)
            .await
            .map_err(|_| ServerError::NotLoaded)?
            .clone();
        match phase {
            Phase::Failed(e) => Err(ServerError::Load(e)),
            _ => Ok(()),
        }
    }

    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Requests admitted and not finished (being prepared, waiting or generating).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Relaxed)
    }

    /// Context positions per slot (known once loaded).
    pub fn n_ctx(&self) -> Option<usize> {
        self.shared.ready.get().map(|r| r.n_ctx)
    }
}

fn run_scheduler<F>(shared: &Arc<Shared>, loader: F)
where
    F: FnOnce() -> Result<Engine, String>,
{
    let engine = match loader() {
        Ok(e) => e,
        Err(e) => {
            shared.phase.send_replace(Phase::Failed(e));
            return;
        }
    };
    let n_ctx_train = engine.config().n_ctx_train;
    // Under a RAM budget the memory plan chose the context (honouring an explicit one).
    let n_ctx = engine
        .plan()
        .map(|p| p.n_ctx)
        .or(shared.cfg.n_ctx)
        .unwrap_or(n_ctx_train.min(4096))
        .min(n_ctx_train)
        .max(1);
    let tokenizer = Arc::new(engine.tokenizer.clone());
    let n_vocab = engine.config().n_vocab;
    let n_embd = engine.config().n_embd;
    let pooling = engine.pooling(&bitnet_engine::EmbedOptions::default());
    let file = engine.mapped_file();
    let cfg = scheduler::SchedConfig {
        parallel: shared.cfg.parallel,
        n_ctx,
        // A step never evaluates more prompt tokens than the engine's prefill batch (under a
        // RAM budget the plan sized the activations for it).
        prefill_chunk: shared
            .cfg
            .prefill_chunk
            .min(engine.options().n_batch.max(1)),
        step_delay: shared.cfg.step_delay,
    };
    let slots: Arc<[scheduler::SlotStatus]> = (0..cfg.parallel)
        .map(|_| scheduler::SlotStatus::default())
        .collect();
    let sched = match scheduler::Scheduler::new(
        engine,
        cfg,
        Arc::clone(&shared.metrics),
        Arc::clone(&slots),
    ) {
        Ok(s) => s,
        Err(e) => {
            shared.phase.send_replace(Phase::Failed(format!(
                "cannot allocate {} KV caches of {n_ctx} positions: {e}",
                cfg.parallel
            )));
            return;
        }
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let _ = shared.ready.set(Ready {
        tx,
        tokenizer,
        n_ctx,
        n_vocab,
        n_ctx_train,
        n_embd,
        pooling,
        slots,
        grammars: Arc::default(),
        file,
    });
    shared.phase.send_replace(Phase::Ready);
    // A panic here would be a bug; if it happens, report it on /health and refuse new
    // requests (503) instead of leaving a server that accepts work nobody does.
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || sched.run(rx)));
    if run.is_err() {
        shared.phase.send_replace(Phase::Failed(
            "the scheduler stopped unexpectedly (a panic); restart the server".into(),
        ));
    }
}

/// Instant after which a request started now must end.
pub(crate) fn deadline(cfg: &ServerConfig) -> Instant {
    let now = Instant::now();
    now.checked_add(cfg.request_timeout)
        .unwrap_or(now + Duration::from_secs(365 * 24 * 3600))
}

/// What [`run_blocking`] reports as the server goes through its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lifecycle {
    /// Bound and answering (503 until ready).
    Listening(SocketAddr),
    /// The model is loaded: slots and their context size.
    Ready { parallel: usize, n_ctx: usize },
    /// SIGINT or SIGTERM received: draining.
    ShuttingDown { grace: Duration },
}

/// Bind `addr`, load the engine with `loader` (answering 503 meanwhile), serve until
/// SIGINT or SIGTERM, then drain and return. Runs its own tokio runtime (2 worker
/// threads: the HTTP side is light, the model runs on the engine's pool).
pub fn run_blocking<L>(
    addr: SocketAddr,
    cfg: ServerConfig,
    loader: L,
    mut on_event: impl FnMut(Lifecycle) + Send + 'static,
) -> Result<(), ServerError>
where
    L: FnOnce() -> Result<Engine, String> + Send + 'static,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bitnet-http")
        .enable_all()
        .build()?;
    let on_event = Arc::new(Mutex::new(move |e: Lifecycle| on_event(e)));
    let report = move |e: Lifecycle| {
        if let Ok(mut f) = on_event.lock() {
            f(e);
        }
    };
    rt.block_on(async move {
        let grace = cfg.shutdown_grace;
        let parallel = cfg.parallel;
        let signal = shutdown_signal()?;
        let server = Server::bind(addr, cfg).await?;
        report(Lifecycle::Listening(server.local_addr()?));
        let handle = server.handle();
        handle.load(loader);
        let (sig_tx, sig_rx) = tokio::sync::oneshot::channel::<()>();
        let report_sig = report.clone();
        tokio::spawn(async move {
            signal.await;
            report_sig(Lifecycle::ShuttingDown { grace });
            let _ = sig_tx.send(());
        });
        let stop = async move {
            let _ = sig_rx.await;
        };
        let mut serving = tokio::spawn(server.run(stop));
        let joined = |r: Result<Result<(), ServerError>, tokio::task::JoinError>| match r {
            Ok(r) => r,
            Err(e) => Err(ServerError::Io(std::io::Error::other(e))),
        };
        tokio::select! {
            r = handle.wait_ready() => match r {
                Ok(()) => report(Lifecycle::Ready {
                    parallel,
                    n_ctx: handle.n_ctx().unwrap_or(0),
                }),
                Err(e) => {
                    serving.abort();
                    return Err(e);
                }
            },
            // Stopped (a signal) before the model finished loading.
            r = &mut serving => return joined(r),
        }
        joined(serving.await)
    })
}

/// A future resolving on SIGINT (Ctrl-C) or, on Unix, SIGTERM. The handlers are
/// installed when this is called (not when first polled), so no signal is missed.
fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        Ok(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}
