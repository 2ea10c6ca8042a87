//! Pieces shared by subcommands: opening a model, thread defaults.

use std::path::Path;

use anyhow::{Context, Result};
use bitnet_gguf::GgufFile;

/// Open a GGUF file (memory-mapped, or read into memory with `in_memory`).
pub fn open_gguf(path: &Path, in_memory: bool) -> Result<GgufFile> {
    Ok(bitnet_engine::open_file(path, in_memory)?)
}

pub use bitnet_engine::sys::{default_threads, peak_rss_bytes};

/// A progress bar over bytes written (hidden with `quiet`), `msg` formatting its message.
pub fn bytes_bar(quiet: bool, msg: &str) -> Result<indicatif::ProgressBar> {
    let bar = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(0)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{msg} [{{bar:40}}] {{bytes}}/{{total_bytes}} {{bytes_per_sec}} eta {{eta}}"
        ))?
        .progress_chars("=> "),
    );
    Ok(bar)
}

/// Human-readable bytes.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Options every command that runs a model shares.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// Model file (GGUF). Without it, --hf is used.
    #[arg(short, long)]
    pub model: Option<std::path::PathBuf>,
    /// Hugging Face repo[:file] to download into the HF cache when -m is not given.
    #[arg(
        long,
        default_value = "microsoft/bitnet-b1.58-2B-4T-gguf:ggml-model-i2_s.gguf"
    )]
    pub hf: String,
    /// Threads (default: physical cores). `bench` also takes a comma-separated list.
    #[arg(short, long, value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Context size in tokens (default: the model's training context, at most 4096).
    #[arg(short = 'c', long)]
    pub ctx_size: Option<usize>,
    /// fast (default) or exact (bit-identical to bitnet.cpp's logits).
    #[arg(long, default_value = "fast")]
    pub numerics: bitnet_model::Numerics,
    /// KV cache element type: f16 (default), f32, q8_0 (ggml Q8_0 blocks: 0.56 × the bytes of
    /// f16) or q4_0 (ggml Q4_0 blocks: 0.31 × f16, coarser); the quantized types need fast
    /// numerics.
    #[arg(long)]
    pub kv_cache: Option<bitnet_model::KvType>,
    /// Run within this much RAM (e.g. 200M, 1G): the low-memory mode streams the weights
    /// through a window of two blocks and fits the KV cache and context to the budget,
    /// printing its plan. Bytes, or a number with K, M or G (powers of 1024).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub ram_budget: Option<u64>,
    /// How --ram-budget brings each block in: mmap (the mapped pages, in 2 MiB pages where
    /// the system can, dropped behind; default) or pread (copies into two reusable buffers on
    /// an I/O thread).
    #[arg(long, default_value = "mmap")]
    pub stream: StreamArg,
    /// Skip these blocks (comma-separated indices), or `auto`: the least important ones
    /// (1 − cosine of a block's input and output over built-in calibration text), up to
    /// --skip-fraction of the blocks, never the first or last two. An approximation: check it
    /// with `bitnet perplexity --kl-divergence`. Fast numerics only.
    #[arg(long, value_name = "LIST|auto")]
    pub skip_layers: Option<String>,
    /// The fraction of blocks `--skip-layers auto` may skip.
    #[arg(long, default_value_t = 0.1)]
    pub skip_fraction: f64,
    /// Read the whole model into memory instead of memory-mapping it.
    #[arg(long)]
    pub in_memory: bool,
    /// Pre-tokenizer override: llama3 or default (bitnet.cpp's fallback).
    #[arg(long)]
    pub pre: Option<String>,
    /// LM head format: f16 (the file's tied embedding, exact; default), q8_0 / q6_k / q4_0
    /// built from it at load and kept in memory (less to read per token, small logit error),
    /// or approx: the vocabulary clustered at load (seeded k-means over the head's rows), and
    /// per token exact logits only for the members of the best-scoring clusters (the others
    /// get an estimate from their cluster); fast numerics; check it with `bitnet perplexity
    /// --kl-divergence`.
    #[arg(long, default_value = "f16")]
    pub lm_head: LmHead,
    /// `--lm-head approx`: clusters (default: 2·√vocabulary rounded up to a power of two,
    /// 1024 for a 128K vocabulary).
    #[arg(long, value_name = "N")]
    pub approx_clusters: Option<usize>,
    /// `--lm-head approx`: clusters whose members get exact logits, per token (default:
    /// clusters / 32). More is closer to the exact head and slower.
    #[arg(long, value_name = "N")]
    pub approx_probe: Option<usize>,
    /// Screen the file's LM head: a Q8_0 copy built at load (half its bytes) bounds every
    /// logit, so a greedy or top-k step (top-k at most 64, no repetition penalty) computes
    /// only the logits that can decide its token, from the file's own rows: the same tokens
    /// as without it, faster on a CPU whose decode is bound by memory. Fast numerics, the CPU.
    #[arg(long)]
    pub screen_head: bool,
    /// Keep the file's weight layout: no repacked copy of the I2_S weights for the integer
    /// GEMM (slower prefill; the repacked copy replaces the file's pages, so it costs no
    /// memory on a mapped file).
    #[arg(long)]
    pub no_repack: bool,
    /// Where the forward pass runs: cpu (default), gpu (wgpu: Vulkan, Metal or DX12; fast
    /// numerics, the file's F16 head), or auto (the GPU when one can run the model, else the
    /// CPU with a note).
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
    /// The GPU adapter to use (its index in `bitnet inspect --system`; default: the best found).
    #[arg(long, value_name = "N")]
    pub gpu: Option<usize>,
}

/// `--stream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StreamArg {
    Pread,
    Mmap,
}

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceArg {
    Cpu,
    Gpu,
    Auto,
}

/// The LM head's storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LmHead {
    F16,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q6_k")]
    Q6K,
    #[value(name = "q4_0")]
    Q4_0,
    Approx,
}

impl LmHead {
    /// The library's format; `approx` takes its options from the flags.
    pub fn format(self, approx: bitnet_model::ApproxOptions) -> bitnet_engine::LmHeadFormat {
        match self {
            LmHead::Approx => bitnet_engine::LmHeadFormat::Approx(approx),
            LmHead::F16 => bitnet_engine::LmHeadFormat::File,
            LmHead::Q8_0 => bitnet_engine::LmHeadFormat::Q8_0,
            LmHead::Q6K => bitnet_engine::LmHeadFormat::Q6K,
            LmHead::Q4_0 => bitnet_engine::LmHeadFormat::Q4_0,
        }
    }
}

/// Loading progress on stderr: a spinner while the LM head is built, notes as they come.
pub struct LoadProgress {
    bar: Option<indicatif::ProgressBar>,
}

impl LoadProgress {
    pub fn new() -> Self {
        LoadProgress { bar: None }
    }

    pub fn event(&mut self, e: bitnet_engine::LoadEvent<'_>) {
        use bitnet_engine::LoadEvent;
        match e {
            LoadEvent::Opened { .. } => {}
            LoadEvent::LmHeadStart { format, .. } => {
                let bar = indicatif::ProgressBar::new_spinner();
                bar.set_message(match format {
                    bitnet_engine::LmHeadFormat::Approx(_) => {
                        "clustering the LM head's rows (k-means)".to_string()
                    }
                    _ => format!("building a {format} LM head from the embedding"),
                });
                bar.enable_steady_tick(std::time::Duration::from_millis(120));
                self.bar = Some(bar);
            }
            LoadEvent::LmHeadDone {
                format,
                bytes,
                source_bytes,
                elapsed,
                ..
            } => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                if let bitnet_engine::LmHeadFormat::Approx(_) = format {
                    eprintln!(
                        "LM head: approx, an index of {} beside the file's {} head, built in \
                         {:.1} s",
                        human_bytes(bytes as u64),
                        human_bytes(source_bytes as u64),
                        elapsed.as_secs_f64()
                    );
                    return;
                }
                eprintln!(
                    "LM head: {format}, {} in memory (was {}), built in {:.1} s",
                    human_bytes(bytes as u64),
                    human_bytes(source_bytes as u64),
                    elapsed.as_secs_f64()
                );
            }
            LoadEvent::HeadScreen {
                bytes,
                head_bytes,
                elapsed,
                released,
            } => eprintln!(
                "LM head: screened, a Q8_0 screen of {} beside the file's {} head{}, built in \
                 {:.1} s",
                human_bytes(bytes as u64),
                human_bytes(head_bytes as u64),
                if released {
                    " (its pages released)"
                } else {
                    ""
                },
                elapsed.as_secs_f64()
            ),
            LoadEvent::Repacked {
                matrices,
                bytes,
                elapsed,
                released,
            } => eprintln!(
                "weights: {matrices} ternary matrices repacked for the integer GEMM, {} in memory{}, \
                 in {:.1} s",
                human_bytes(bytes as u64),
                if released {
                    " (the file's pages released)"
                } else {
                    ""
                },
                elapsed.as_secs_f64()
            ),
            LoadEvent::Plan(p) => eprint!("{}", p.table()),
            LoadEvent::Gpu {
                adapter,
                backend,
                bytes,
                elapsed,
            } => eprintln!(
                "GPU: {adapter} ({backend}), {} on the device (weights and activations), \
                 uploaded in {:.1} s",
                human_bytes(bytes),
                elapsed.as_secs_f64()
            ),
            LoadEvent::Note(n) => eprintln!("note: {n}"),
        }
    }
}

impl ModelArgs {
    /// The local model path, downloading it first when needed.
    pub fn path(&self) -> Result<std::path::PathBuf> {
        match &self.model {
            Some(p) => Ok(p.clone()),
            None => crate::download::resolve_hf(&self.hf, true),
        }
    }

    /// The thread count (the first of a list; [`Self::single_threads`] refuses lists).
    pub fn threads(&self) -> usize {
        self.threads
            .first()
            .copied()
            .unwrap_or_else(default_threads)
            .max(1)
    }

    /// The thread count for commands that run one configuration: a list is an error.
    pub fn single_threads(&self) -> Result<usize> {
        if self.threads.len() > 1 {
            anyhow::bail!("-t takes one thread count here (a comma-separated list is for `bench`)");
        }
        if self.threads.first() == Some(&0) {
            anyhow::bail!("-t must be at least 1");
        }
        Ok(self.threads())
    }

    pub fn pre_tokenizer(&self) -> Result<Option<bitnet_tokenizer::PreTokenizer>> {
        self.pre
            .as_deref()
            .map(|s| bitnet_tokenizer::PreTokenizer::from_gguf_name(s).map_err(anyhow::Error::from))
            .transpose()
    }
}

impl ModelArgs {
    /// `--lm-head` with its `--approx-*` options.
    pub fn lm_head_format(&self) -> Result<bitnet_engine::LmHeadFormat> {
        if self.lm_head != LmHead::Approx
            && (self.approx_clusters.is_some() || self.approx_probe.is_some())
        {
            anyhow::bail!("--approx-clusters and --approx-probe go with --lm-head approx");
        }
        if self.approx_clusters == Some(0) || self.approx_probe == Some(0) {
            anyhow::bail!("--approx-clusters and --approx-probe must be at least 1");
        }
        Ok(self.lm_head.format(bitnet_model::ApproxOptions {
            clusters: self.approx_clusters.unwrap_or(0),
            probe: self.approx_probe.unwrap_or(0),
            ..Default::default()
        }))
    }

    /// `--screen-head` serves generation that chooses its tokens greedily or from the top-k
    /// (`run`, `chat`, `bench`, `serve`); a command that reads every logit, or embeddings,
    /// refuses it rather than build a screen it never reads.
    pub fn refuse_screen_head(&self, command: &str) -> Result<()> {
        if self.screen_head {
            anyhow::bail!(
                "--screen-head serves run, chat, bench and serve (tokens chosen greedily or \
                 from the top-k); `{command}` reads every logit or embedding: drop it"
            );
        }
        Ok(())
    }

    /// The library's load options for these flags (one thread count).
    pub fn load_options(&self) -> Result<bitnet_engine::LoadOptions> {
        Ok(bitnet_engine::LoadOptions {
            threads: self.single_threads()?,
            numerics: self.numerics,
            kv_type: self.kv_type(),
            lm_head: self.lm_head_format()?,
            in_memory: self.in_memory,
            pre_tokenizer: self.pre_tokenizer()?,
            repack: !self.no_repack,
            device: match self.device {
                DeviceArg::Cpu => bitnet_engine::Device::Cpu,
                DeviceArg::Gpu => bitnet_engine::Device::Gpu,
                DeviceArg::Auto => bitnet_engine::Device::Auto,
            },
            gpu_adapter: self.gpu,
            screen_head: self.screen_head,
            budget: self
                .ram_budget
                .map(|bytes| bitnet_engine::budget::BudgetRequest {
                    bytes,
                    n_ctx: self.ctx_size,
                    kv_type_explicit: self.kv_cache.is_some(),
                    stream: match self.stream {
                        StreamArg::Pread => bitnet_engine::budget::StreamMode::Pread,
                        StreamArg::Mmap => bitnet_engine::budget::StreamMode::Mmap,
                    },
                    reserve_bytes: 0,
                }),
            ..Default::default()
        })
    }

    /// `--skip-layers`, parsed.
    pub fn skip_layers(&self) -> Result<Option<bitnet_engine::skip::SkipLayers>> {
        use bitnet_engine::skip::SkipLayers;
        let Some(s) = self.skip_layers.as_deref() else {
            return Ok(None);
        };
        if s == "auto" {
            return Ok(Some(SkipLayers::Auto {
                fraction: self.skip_fraction,
            }));
        }
        let list = s
            .split(',')
            .map(|x| x.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| {
                anyhow::anyhow!("--skip-layers takes block indices like 5,6,7 or `auto`")
            })?;
        Ok(Some(SkipLayers::List(list)))
    }

    /// The KV cache type (f16 unless given).
    pub fn kv_type(&self) -> bitnet_model::KvType {
        self.kv_cache.unwrap_or(bitnet_model::KvType::F16)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("200M"), Ok(200 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("64 kb"), Ok(64 << 10));
        assert_eq!(parse_size("300000000"), Ok(300_000_000));
        for bad in ["", "M", "lots", "-5M", "0", "nan", "1e30G", "inf"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}

/// A size in bytes: `200M`, `1G`, `1.5G`, `512MiB`, `300000000`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let (num, mult) = [
        ("gib", 1u64 << 30),
        ("mib", 1 << 20),
        ("kib", 1 << 10),
        ("gb", 1 << 30),
        ("mb", 1 << 20),
        ("kb", 1 << 10),
        ("g", 1 << 30),
        ("m", 1 << 20),
        ("k", 1 << 10),
        ("b", 1),
    ]
    .iter()
    .find_map(|(suf, m)| lower.strip_suffix(suf).map(|n| (n.trim().to_string(), *m)))
    .unwrap_or((lower.clone(), 1));
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 200M, 1G, 300000000)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("`{s}`: a size must be positive"));
    }
    // Precision: sizes are far below 2^53.
    #[allow(clippy::cast_precision_loss)]
    let bytes = v * mult as f64;
    if bytes >= 1.8e19 {
        return Err(format!("`{s}` is too large"));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes as u64)
}

/// Resolve the model path (downloading when needed) and load the engine, with progress on
/// stderr.
pub fn load_engine(a: &ModelArgs) -> Result<bitnet_engine::Engine> {
    load_engine_at(&a.path()?, a)
}

/// Load the engine from `path` with the flags in `a`, with progress on stderr.
pub fn load_engine_at(path: &std::path::Path, a: &ModelArgs) -> Result<bitnet_engine::Engine> {
    let opts = a.load_options()?;
    let skip = a.skip_layers()?;
    let mut progress = LoadProgress::new();
    let mut engine =
        bitnet_engine::load(path, &opts, &mut |e| progress.event(e)).map_err(|e| match e {
            bitnet_engine::EngineError::Open { .. } => anyhow::Error::from(e),
            other => anyhow::Error::from(other).context("cannot load model"),
        })?;
    if let Some(s) = skip {
        let list = engine.set_skip_layers(&s)?;
        eprintln!(
            "skipping {} of {} blocks: {list:?}",
            list.len(),
            engine.config().n_layer
        );
    }
    Ok(engine)
}

/// The session context size: the memory plan's under a RAM budget, else `--ctx-size`, else
/// the training context capped at 4096.
pub fn ctx_size(a: &ModelArgs, engine: &bitnet_engine::Engine) -> usize {
    if let Some(p) = engine.plan() {
        return p.n_ctx;
    }
    a.ctx_size
        .unwrap_or_else(|| engine.config().n_ctx_train.min(4096))
}

/// The `--kv-window N` flag of run and chat.
#[derive(Debug, Clone, clap::Args)]
pub struct WindowArgs {
    /// A sliding context of N positions: when it is full, the first 4 positions (attention
    /// sinks) stay, half of the rest is dropped and generation goes on (llama.cpp's context
    /// shift; the kept keys are rotated to their new positions). Fast numerics only.
    #[arg(long, value_name = "N", conflicts_with = "ctx_size")]
    pub kv_window: Option<usize>,
}

/// Positions kept at the start of a sliding window (attention sinks).
pub const WINDOW_SINKS: usize = 4;

impl WindowArgs {
    /// The session's context and the generation's policy at the end of it.
    pub fn context(
        &self,
        a: &ModelArgs,
        engine: &bitnet_engine::Engine,
    ) -> Result<(usize, bitnet_engine::ContextPolicy)> {
        let Some(n) = self.kv_window else {
            return Ok((ctx_size(a, engine), bitnet_engine::ContextPolicy::Stop));
        };
        if a.numerics == bitnet_model::Numerics::Exact {
            anyhow::bail!("--kv-window needs fast numerics (its rotation of the cached keys is not bitnet.cpp's)");
        }
        if n <= 2 * WINDOW_SINKS {
            anyhow::bail!("--kv-window must be more than {}", 2 * WINDOW_SINKS);
        }
        let limit = engine
            .plan()
            .map_or(engine.config().n_ctx_train, |p| p.n_ctx);
        if n > limit {
            anyhow::bail!(
                "--kv-window {n} is more than the {} positions {}",
                limit,
                if engine.plan().is_some() {
                    "the RAM budget allows"
                } else {
                    "the model was trained for"
                }
            );
        }
        Ok((
            n,
            bitnet_engine::ContextPolicy::Shift { keep: WINDOW_SINKS },
        ))
    }
}

/// Sampling flags in llama.cpp's spelling and defaults.
#[derive(Debug, Clone, clap::Args)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: i32,
    /// Top-p (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the repetition penalties look back over.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// RNG seed (default: random, printed in the summary).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn params(&self) -> Result<bitnet_sampling::SamplerParams> {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| {
                    u64::try_from(d.as_nanos() % (1u128 << 64)).unwrap_or(0)
                })
        });
        let p = bitnet_sampling::SamplerParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repeat_last_n: self.repeat_last_n,
            seed,
        };
        p.validate()?;
        Ok(p)
    }
}

/// Structured-output flags: hold the generated text to a JSON schema, any JSON object, a
/// regular expression or a grammar (at most one).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConstraintArgs {
    /// The output is JSON matching this JSON schema (a file).
    #[arg(long, value_name = "FILE", group = "constraint")]
    pub json_schema: Option<std::path::PathBuf>,
    /// The output is one JSON object (OpenAI's `json_object`).
    #[arg(long, group = "constraint")]
    pub json_object: bool,
    /// The output is a grammar's text: llguidance's Lark syntax (a file; `start:` is the top
    /// rule, `%json {…}` embeds a schema). llama.cpp's GBNF (`root ::= …`) is refused.
    #[arg(long, value_name = "FILE", group = "constraint")]
    pub grammar: Option<std::path::PathBuf>,
    /// The whole output matches this regular expression.
    #[arg(long, value_name = "REGEX", group = "constraint")]
    pub regex: Option<String>,
}

impl ConstraintArgs {
    pub fn constraint(&self) -> Result<Option<bitnet_engine::Constraint>> {
        use bitnet_engine::Constraint;
        let read = |p: &Path| {
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
        };
        Ok(if let Some(p) = &self.json_schema {
            let text = read(p)?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", p.display()))?;
            Some(Constraint::JsonSchema(v))
        } else if self.json_object {
            Some(Constraint::JsonObject)
        } else if let Some(p) = &self.grammar {
            Some(Constraint::grammar_text(&read(p)?)?)
        } else {
            self.regex.clone().map(Constraint::Regex)
        })
    }
}
