//! `bitnet serve`: an OpenAI-compatible HTTP API (see the `bitnet-server` crate).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result};
use bitnet_server::{Lifecycle, ServerConfig};
use indicatif::{ProgressBar, ProgressStyle};

use super::common::ModelArgs;

/// What the server holds besides the engine under `--ram-budget` (its runtime's threads,
/// connections, request and response buffers, the slot's sampling state), planned as its own
/// line: with the 2b synth under `--ram-budget 200M`, a plan without it (195.4 MiB) peaked at
/// 205 MiB after a few requests.
const SERVE_RESERVE_BYTES: u64 = 20 << 20;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on. The default accepts local connections only; use 0.0.0.0
    /// (with --api-key) to serve other hosts.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Parallel sequences; each has its own KV cache of --ctx-size positions, and their
    /// decode steps run batched.
    #[arg(long, short = 'P', default_value_t = 1)]
    parallel: usize,
    /// Requests that may wait for a free slot; more get 429.
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// Require `Authorization: Bearer KEY` (default: the BITNET_API_KEY environment
    /// variable, if set).
    #[arg(long)]
    api_key: Option<String>,
    /// The model id shown by /v1/models (default: the file name).
    #[arg(long)]
    alias: Option<String>,
    /// Time limit of one request in seconds (waiting + generating).
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_body: usize,
    /// Prompt tokens evaluated per batched step (smaller keeps other streams smoother).
    #[arg(long, default_value_t = 128)]
    prefill_chunk: usize,
    /// Seconds in-flight requests may run after SIGTERM before they are ended.
    #[arg(long, default_value_t = 30)]
    shutdown_grace: u64,
    /// Let web pages from ORIGIN (`http://host:port`, or `*` for any) call the API
    /// (CORS); repeatable. Default: none, so web sites you visit cannot use the server.
    /// The API key, if set, is still required.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origins: Vec<String>,
}

/// The model id: --alias, else the file name without `.gguf`.
fn model_name(a: &Args) -> String {
    if let Some(n) = &a.alias {
        return n.clone();
    }
    let file = match &a.model.model {
        Some(p) => p.file_name().map(|f| f.to_string_lossy().into_owned()),
        None => a.model.hf.rsplit([':', '/']).next().map(str::to_string),
    };
    let file = file.unwrap_or_else(|| "bitnet".into());
    file.strip_suffix(".gguf").unwrap_or(&file).to_string()
}

pub fn run(a: Args) -> Result<()> {
    if a.model.ram_budget.is_some() && a.parallel > 1 {
        anyhow::bail!(
            "--ram-budget plans for one sequence: use -P 1 (each slot would need its own KV cache)"
        );
    }
    let api_key = a
        .api_key
        .clone()
        .or_else(|| std::env::var("BITNET_API_KEY").ok())
        .filter(|k| !k.is_empty());
    let cfg = ServerConfig {
        parallel: a.parallel,
        n_ctx: a.model.ctx_size,
        max_queue: a.queue,
        max_body_bytes: a.max_body,
        request_timeout: Duration::from_secs(a.timeout),
        api_key,
        model_name: model_name(&a),
        prefill_chunk: a.prefill_chunk,
        shutdown_grace: Duration::from_secs(a.shutdown_grace),
        cors_origins: a.cors_origins.clone(),
        ..ServerConfig::default()
    };
    let addr = SocketAddr::new(a.host, a.port);
    let auth = if cfg.api_key.is_some() {
        "API key required"
    } else {
        "no API key"
    };
    let name = cfg.model_name.clone();

    let bar = ProgressBar::new(4).with_style(
        ProgressStyle::with_template("{spinner} loading [{bar:24}] {pos}/{len} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let model_args = a.model.clone();
    let load_bar = bar.clone();
    let loader = move || -> Result<bitnet_engine::Engine, String> {
        let b = load_bar;
        b.enable_steady_tick(Duration::from_millis(120));
        b.set_message("locating the model");
        // A download (--hf) draws its own progress bar.
        let path = b
            .suspend(|| model_args.path())
            .map_err(|e| format!("{e:#}"))?;
        b.inc(1);
        b.set_message(format!("loading {}", path.display()));
        let mut opts = model_args.load_options().map_err(|e| format!("{e:#}"))?;
        if let Some(b) = &mut opts.budget {
            b.reserve_bytes = SERVE_RESERVE_BYTES;
        }
        let skip = model_args.skip_layers().map_err(|e| format!("{e:#}"))?;
        let mut progress = super::common::LoadProgress::new();
        let mut engine = b
            .suspend(|| bitnet_engine::load(&path, &opts, &mut |e| progress.event(e)))
            .map_err(|e| format!("cannot load model: {e}"))?;
        if let Some(s) = skip {
            let list = engine
                .set_skip_layers(&s)
                .map_err(|e| format!("cannot skip blocks: {e}"))?;
            b.suspend(|| eprintln!("skipping {} blocks: {list:?}", list.len()));
        }
        b.inc(2);
        // One token through every layer: faults the mapped weights in, so the first
        // request does not pay for it.
        b.set_message("warming up");
        if let (Ok(mut s), Some(bos)) = (engine.new_session(8), engine.tokenizer.bos()) {
            engine
                .eval(&mut s, &[bos], bitnet_model::Outputs::Last)
                .map_err(|e| format!("warm-up failed: {e}"))?;
        }
        b.inc(1);
        b.finish_and_clear();
        Ok(engine)
    };
    let threads = a.model.single_threads()?;
    bitnet_server::run_blocking(addr, cfg, loader, move |ev| match ev {
        Lifecycle::Listening(addr) => {
            eprintln!("bitnet serve: listening on http://{addr} ({auth}); loading the model…")
        }
        Lifecycle::Ready { parallel, n_ctx } => eprintln!(
            "bitnet serve: ready — model \"{name}\", {parallel} slot(s) × {n_ctx} tokens, {threads} threads. \
             Chat page: http://{addr}/ · API: /v1/chat/completions /v1/completions /v1/models \
             /tokenize /detokenize /props /slots /health /metrics"
        ),
        Lifecycle::ShuttingDown { grace } => eprintln!(
            "bitnet serve: shutting down; in-flight requests have {} s to finish",
            grace.as_secs()
        ),
    })
    .context("the server failed")?;
    bar.finish_and_clear();
    eprintln!("bitnet serve: stopped");
    Ok(())
}
