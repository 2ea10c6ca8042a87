//! `bitnet bench`: prompt processing (pp) and text generation (tg) throughput, in the spirit
//! of llama-bench, with the decode bandwidth compared to a memory read measured in the same run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bitnet_kernels::Pool;
use bitnet_model::{Exec, Model, Outputs, Pick, Picked, Seq};
use serde_json::json;

use super::common::{human_bytes, open_gguf, peak_rss_bytes, ConstraintArgs, ModelArgs};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt lengths for the pp tests, comma separated like llama-bench's (`-p 128,512`;
    /// 0 = skip).
    #[arg(
        short = 'p',
        long,
        value_delimiter = ',',
        default_value = "128",
        value_name = "N[,N...]"
    )]
    n_prompt: Vec<usize>,
    /// Generated tokens for the tg tests, comma separated (0 = skip).
    #[arg(
        short = 'n',
        long,
        value_delimiter = ',',
        default_value = "64",
        value_name = "N[,N...]"
    )]
    n_gen: Vec<usize>,
    /// Thread counts to test, comma separated, like `-t 1,2` (default: 1 and the physical
    /// core count).
    #[arg(long = "threads-list", value_delimiter = ',')]
    threads_list: Option<Vec<usize>>,
    /// Repetitions per test.
    #[arg(short = 'r', long, default_value_t = 5)]
    repetitions: usize,
    /// One JSON object per test on stdout.
    #[arg(long)]
    json: bool,
    /// Tokens per prefill batch, comma separated (llama-bench's `-ub`; default: the engine's,
    /// which `run` uses): a prompt longer than this is evaluated in batches of it; each value
    /// runs the pp tests again, named like `pp512@u128` when more than one is given.
    #[arg(
        long = "ubatch-size",
        short = 'u',
        value_name = "N[,N...]",
        value_delimiter = ','
    )]
    ubatch: Vec<usize>,
    /// Context depths, comma separated (llama-bench's `-d`): pp and tg run with this many
    /// tokens already in the KV cache (filled once per thread count, untimed, in prefill
    /// batches); tests at a depth are named like `tg64@d4096`. Batched decode runs at depth 0.
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    depth: Vec<usize>,
    /// Also measure batched decode: for each B listed (comma separated, ≥ 2), B sequences
    /// decode together, one token each per step, as the server's continuous batching does;
    /// reported as test `tg<N>x<B>` with the aggregate tok/s over all B sequences.
    #[arg(long, value_delimiter = ',')]
    batch: Vec<usize>,
    /// `--device gpu`: time every kernel of the pp and tg tests (GPU timestamps; each kernel
    /// then runs in a pass of its own, in an extra repetition that is not counted) and print
    /// where a token's time goes.
    #[arg(long)]
    profile: bool,
    /// Embedding tests instead of pp: for each prompt length N, one input of N tokens embedded
    /// whole (the blocks, the output norm and the file's pooling; no LM head), as `bitnet embed`
    /// runs it, reported as test `embd<N>` with tokens/s and vectors/s (llama-bench's
    /// `-embd 1`). The header gives the ternary multiply-adds per token, to compare models.
    #[arg(long)]
    embed: bool,
    /// Also time each tg test under this constraint (`--json-schema FILE`, `--json-object`,
    /// `--grammar FILE`, `--regex RE`): greedy steps with the grammar's token mask applied
    /// before each choice, the next mask computed beside the forward pass as generation does
    /// (a fresh grammar whenever it ends), reported as `tg<N>+constraint`
    /// beside the plain tg test. The normal CPU mode only.
    #[command(flatten)]
    constraint: ConstraintArgs,
}

/// GB/s of a plain parallel read of `buf` (the mapped model file: as large as what decode
/// reads, already resident after the warm-up, and no extra allocation to inflate peak RSS),
/// summing 8-byte words; best of 3.
fn read_bandwidth(pool: &Pool, buf: &[u8]) -> f64 {
    const CHUNK: usize = 1 << 16;
    let n_chunks = buf.len() / CHUNK;
    let mut best = 0.0f64;
    for _ in 0..3 {
        let sink = AtomicU64::new(0);
        let t = Instant::now();
        pool.for_rows(n_chunks, 1, &|r| {
            let bytes = &buf[r.start * CHUNK..r.end * CHUNK];
            let s = bytes.chunks_exact(8).fold(0u64, |a, w| {
                a.wrapping_add(u64::from_le_bytes([
                    w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7],
                ]))
            });
            sink.fetch_add(s, Ordering::Relaxed);
        });
        let dt = t.elapsed().as_secs_f64();
        std::hint::black_box(sink.load(Ordering::Relaxed));
        best = best.max((n_chunks * CHUNK) as f64 / dt / 1e9);
    }
    best
}

struct Stat {
    median: f64,
    min: f64,
    max: f64,
}

fn stat(mut v: Vec<f64>) -> Stat {
    v.sort_by(f64::total_cmp);
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    Stat {
        median,
        min: v[0],
        max: v[v.len() - 1],
    }
}

/// One measured test: its name, what it ran and the rates of its repetitions.
struct Test {
    name: String,
    /// Sequences decoding together (1 for pp and tg).
    batch: usize,
    n_prompt: usize,
    n_gen: usize,
    depth: usize,
    /// Prefill batch of a pp test.
    ubatch: Option<usize>,
    rates: Vec<f64>,
}

impl Test {
    /// A prompt test of `np` tokens at `depth` (`@u<ubatch>` in its name when `u_suffix`).
    fn pp(np: usize, depth: usize, ubatch: Option<usize>, u_suffix: bool, rates: Vec<f64>) -> Test {
        let u = match ubatch {
            Some(u) if u_suffix => format!("@u{u}"),
            _ => String::new(),
        };
        Test {
            name: format!("pp{np}{}{u}", depth_suffix(depth)),
            batch: 1,
            n_prompt: np,
            n_gen: 0,
            depth,
            ubatch,
            rates,
        }
    }

    /// A generation test of `ng` tokens at `depth`, or of `batch` sequences together.
    fn tg(ng: usize, depth: usize, batch: usize, rates: Vec<f64>) -> Test {
        let name = if batch > 1 {
            format!("tg{ng}x{batch}")
        } else {
            format!("tg{ng}{}", depth_suffix(depth))
        };
        Test {
            name,
            batch,
            n_prompt: 0,
            n_gen: ng,
            depth,
            ubatch: None,
            rates,
        }
    }

    /// The fields every JSON row carries, llama-bench's names where it has one.
    fn json_fields(&self, s: &Stat) -> serde_json::Map<String, serde_json::Value> {
        let v = json!({
            "test": self.name, "batch": self.batch, "n_prompt": self.n_prompt, "n_gen": self.n_gen,
            "n_depth": self.depth, "n_ubatch": self.ubatch, "tok_s_median": s.median,
            "tok_s_min": s.min, "tok_s_max": s.max, "samples_ts": self.rates,
        });
        match v {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        }
    }
}

/// The non-zero values of a `-p` or `-n` list.
fn lengths(list: &[usize]) -> Vec<usize> {
    list.iter().copied().filter(|&n| n > 0).collect()
}

/// `@d<depth>` for a test at a depth, nothing at depth 0.
fn depth_suffix(depth: usize) -> String {
    if depth > 0 {
        format!("@d{depth}")
    } else {
        String::new()
    }
}

/// Bench through the engine: the low-memory mode (`--ram-budget`) and the GPU (`--device`):
/// pp and tg of one sequence at one thread count (under a budget the weights stream from the
/// mapped file, so there is no read-bandwidth column).
fn run_engine(a: &Args) -> Result<()> {
    let what = if a.model.ram_budget.is_some() {
        "--ram-budget"
    } else {
        "--device gpu"
    };
    if a.threads_list.as_ref().is_some_and(|l| l.len() > 1) || a.model.threads.len() > 1 {
        bail!("{what} benches one thread count (-t N)");
    }
    if !a.batch.is_empty() && a.model.ram_budget.is_some() {
        bail!("{what} runs one sequence: drop --batch");
    }
    if a.batch.iter().any(|&b| b < 2) {
        bail!("--batch takes batch sizes of at least 2 (the single-sequence test is tg)");
    }
    if !a.ubatch.is_empty() {
        bail!("{what} prefills in the engine's batches: drop --ubatch-size");
    }
    let t = a
        .threads_list
        .as_ref()
        .and_then(|l| l.first().copied())
        .unwrap_or_else(|| a.model.threads());
    if t == 0 {
        bail!("thread counts must be at least 1");
    }
    let prompts = lengths(&a.n_prompt);
    let gens = lengths(&a.n_gen);
    let mut model_args = a.model.clone();
    model_args.threads = vec![t];
    let engine = super::common::load_engine(&model_args)?;
    if a.profile && engine.gpu().is_none() {
        bail!("--profile times GPU kernels: add --device gpu");
    }
    let n_vocab = engine.config().n_vocab;
    let deepest = a.depth.iter().copied().max().unwrap_or(0);
    let longest = prompts.iter().copied().max().unwrap_or(0);
    let needed = deepest + longest + gens.iter().copied().max().unwrap_or(0) + 1;
    let n_ctx = engine.plan().map_or(needed, |p| p.n_ctx);
    if needed > n_ctx {
        bail!(
            "the tests need {needed} positions; the context the RAM budget allows holds {n_ctx} \
             (lower -d/-p/-n, or give -c and a larger budget)"
        );
    }
    let gpu = engine.gpu().is_some();
    if a.constraint.constraint()?.is_some() {
        bail!("{what}: bench times a constraint in the normal CPU mode only");
    }
    // Bytes a decode step reads: every projection and the head (for the GPU's GB/s: the head
    // as the device holds it, quantized there by --lm-head q8_0|q4_0).
    let step_bytes = match engine.gpu() {
        Some(g) => g.weight_reads(1) as f64,
        None => engine.model()?.bytes_per_token() as f64,
    };
    if !a.json {
        if a.model.ram_budget.is_some() {
            println!(
                "model {} | low-memory mode, budget {} | numerics {:?} | kv {:?}",
                model_args.path()?.display(),
                human_bytes(a.model.ram_budget.unwrap_or(0)),
                a.model.numerics,
                engine.options().kv_type
            );
        } else {
            println!(
                "model {} | device {} | numerics {:?} | kv {:?} on the device",
                model_args.path()?.display(),
                engine.device_name(),
                a.model.numerics,
                engine.options().kv_type
            );
        }
        println!(
            "{:<14} {:>7} {:>12} {:>20}",
            "test", "threads", "tok/s", "(min .. max)"
        );
    }
    let mut session = engine.new_session(n_ctx)?;
    // The GPU's dispatches per decode token, and kernel profiles of the tg tests.
    let mut dispatches = None;
    let mut submits = None;
    let mut profiles = Vec::new();
    let mut best_tg_gbs: Option<f64> = None;
    // Dispatches and submissions of a batched step, per batch size.
    let mut batch_dispatches: Vec<(usize, u32, u32)> = Vec::new();
    // (n_gen, batch, median tok/s) of the tg tests at depth 0 and the batched ones.
    let mut medians: Vec<(usize, usize, f64)> = Vec::new();
    for &depth in &a.depth {
        session.reset();
        engine.eval(&mut session, &tokens(depth, n_vocab, 3), Outputs::None)?;
        let mut tests: Vec<Test> = Vec::new();
        for &np in &prompts {
            let prompt = tokens(np, n_vocab, 1);
            let mut rates = Vec::new();
            for rep in 0..=a.repetitions {
                session.truncate(depth);
                let t0 = Instant::now();
                engine.eval(&mut session, &prompt, Outputs::Last)?;
                if rep > 0 {
                    rates.push(np as f64 / t0.elapsed().as_secs_f64());
                }
            }
            if let (Some(g), true) = (engine.gpu(), a.profile) {
                session.truncate(depth);
                g.set_profile(true)?;
                engine.eval(&mut session, &prompt, Outputs::Last)?;
                profiles.push((format!("pp{np}{}", depth_suffix(depth)), g.profile()));
                g.set_profile(false)?;
            }
            tests.push(Test::pp(np, depth, None, false, rates));
        }
        for &ng in &gens {
            let mut rates = Vec::new();
            // Greedy steps as `run` takes them (on the GPU only the arg-max comes back).
            for rep in 0..=a.repetitions {
                session.truncate(depth);
                let mut next = engine.eval_greedy(&mut session, &tokens(1, n_vocab, 2))?;
                let t0 = Instant::now();
                for _ in 0..ng {
                    next = engine.eval_greedy(&mut session, &[next])?;
                }
                if rep > 0 {
                    rates.push(ng as f64 / t0.elapsed().as_secs_f64());
                }
            }
            if let Some(g) = engine.gpu() {
                dispatches = Some(g.last_dispatches());
                submits = Some(g.last_submits());
                if a.profile {
                    session.truncate(depth);
                    let mut next = engine.eval_greedy(&mut session, &tokens(1, n_vocab, 2))?;
                    g.set_profile(true)?;
                    for _ in 0..ng {
                        next = engine.eval_greedy(&mut session, &[next])?;
                    }
                    profiles.push((format!("tg{ng}{}", depth_suffix(depth)), g.profile()));
                    g.set_profile(false)?;
                }
            }
            tests.push(Test::tg(ng, depth, 1, rates));
            // Batched decode on the GPU (at depth 0, as on the CPU): B sessions step together
            // through the engine's batched pass, each greedy, as the server's slots do.
            for &b in a.batch.iter().filter(|_| depth == 0) {
                let mut rates = Vec::new();
                // With --profile, one more repetition with the kernels timed.
                let timed = usize::from(a.profile);
                for rep in 0..=a.repetitions + timed {
                    let profiled = rep > a.repetitions;
                    let mut sessions = Vec::with_capacity(b);
                    let mut next = Vec::with_capacity(b);
                    for i in 0..b {
                        let mut s = engine.new_session(ng + 2)?;
                        let seed = 2 + u64::try_from(i).unwrap_or(0);
                        next.push(engine.eval_greedy(&mut s, &tokens(1, n_vocab, seed))?);
                        sessions.push(s);
                    }
                    let picks = vec![Some(Pick::Greedy); b];
                    if let (Some(g), true) = (engine.gpu(), profiled) {
                        g.set_profile(true)?;
                    }
                    let t0 = Instant::now();
                    for _ in 0..ng {
                        let mut work: Vec<(&mut bitnet_engine::Session, &[u32], Outputs)> =
                            sessions
                                .iter_mut()
                                .zip(next.chunks(1))
                                .map(|(s, t)| (s, t, Outputs::Last))
                                .collect();
                        let picked = engine.forward_sessions_pick(&mut work, &picks)?;
                        for (n, p) in next.iter_mut().zip(&picked) {
                            *n = match p {
                                Picked::Chosen(id) => *id,
                                Picked::Logits(l) => bitnet_sampling::argmax(l).unwrap_or(0),
                                Picked::Top(c) => c.first().map_or(0, |&(id, _)| id),
                            };
                        }
                    }
                    if let (Some(g), true) = (engine.gpu(), profiled) {
                        profiles.push((format!("tg{ng}x{b}"), g.profile()));
                        g.set_profile(false)?;
                    } else if rep > 0 {
                        rates.push((ng * b) as f64 / t0.elapsed().as_secs_f64());
                    }
                    if let (Some(g), 1) = (engine.gpu(), rep) {
                        batch_dispatches.push((b, g.last_dispatches(), g.last_submits()));
                    }
                }
                tests.push(Test::tg(ng, 0, b, rates));
            }
        }
        for test in tests {
            let s = stat(test.rates.clone());
            // Batched decode reads the weights once per step for several tokens: no
            // per-token bandwidth figure; its rate against one sequence's below.
            let gbs =
                (gpu && test.n_gen > 0 && test.batch == 1).then(|| s.median * step_bytes / 1e9);
            if gpu && test.n_gen > 0 && test.depth == 0 {
                medians.push((test.n_gen, test.batch, s.median));
            }
            if let Some(g) = gbs {
                best_tg_gbs = Some(best_tg_gbs.map_or(g, |b: f64| b.max(g)));
            }
            if a.json {
                let mut row = test.json_fields(&s);
                for (k, v) in [
                    ("threads", json!(t)),
                    ("ram_budget", json!(a.model.ram_budget)),
                    ("peak_rss_bytes", json!(peak_rss_bytes())),
                    ("numerics", json!(format!("{:?}", a.model.numerics))),
                    ("device", json!(engine.device_name())),
                    ("weights_gb_s", json!(gbs)),
                ] {
                    row.insert(k.into(), v);
                }
                println!("{}", serde_json::Value::Object(row));
            } else {
                println!(
                    "{:<14} {t:>7} {:>12.2} {:>20}{}",
                    test.name,
                    s.median,
                    format!("({:.2} .. {:.2})", s.min, s.max),
                    gbs.map_or_else(String::new, |g| format!("  {g:.1} GB/s of weights"))
                );
            }
        }
    }
    if let Some(g) = engine.gpu() {
        let copy = g.copy_probe()?;
        let best_tg = best_tg_gbs.unwrap_or(0.0);
        // Weights a prompt token reads against a decode token, by the kernels' geometry (a
        // prompt runs in calls of up to n_batch tokens).
        let decode_reads = g.weight_reads(1) as f64;
        let prompt_reads: Vec<(usize, f64)> = prompts
            .iter()
            .filter(|&&np| np > 0)
            .map(|&np| {
                let call = np.min(engine.options().n_batch.max(1));
                (np, g.weight_reads(call) as f64 / call as f64)
            })
            .collect();
        // Each batched test against one sequence's tg of the same length: (n_gen, batch,
        // tok/s, its ratio to tg, dispatches and submissions of a step).
        type Batched = (usize, usize, f64, Option<f64>, Option<(u32, u32)>);
        let batched: Vec<Batched> = medians
            .iter()
            .filter(|m| m.1 > 1)
            .map(|&(ng, b, rate)| {
                let one = medians
                    .iter()
                    .find(|m| m.0 == ng && m.1 == 1)
                    .map(|m| rate / m.2.max(1e-12));
                let d = batch_dispatches
                    .iter()
                    .find(|d| d.0 == b)
                    .map(|d| (d.1, d.2));
                (ng, b, rate, one, d)
            })
            .collect();
        if a.json {
            println!(
                "{}",
                json!({
                    "device": engine.device_name(),
                    "batched": batched
                        .iter()
                        .map(|&(ng, b, rate, one, d)| json!({
                            "n_gen": ng, "batch": b, "tok_s": rate,
                            "vs_one_sequence": one,
                            "dispatches_per_step": d.map(|d| d.0),
                            "submits_per_step": d.map(|d| d.1),
                        }))
                        .collect::<Vec<_>>(),
                    "dispatches_per_token": dispatches,
                    "submits_per_token": submits,
                    "bytes_per_token": step_bytes,
                    "copy_gb_s": copy,
                    "tg_weights_gb_s": best_tg_gbs,
                    "decode_weight_reads": decode_reads,
                    "prompt_weight_reads_per_token": prompt_reads
                        .iter()
                        .map(|&(np, b)| json!({"n_prompt": np, "bytes": b}))
                        .collect::<Vec<_>>(),
                })
            );
        } else {
            for &(np, b) in &prompt_reads {
                println!(
                    "prompt pp{np}: {:.1} MB of weights read per token = 1/{:.0} of a decode \
                     token's {:.2} GB",
                    b / 1e6,
                    decode_reads / b.max(1.0),
                    decode_reads / 1e9
                );
            }
            println!(
                "decode: {} dispatches, {} submissions and {:.2} GB of weights per token; device \
                 copy {copy:.0} GB/s (read + write), best tg {best_tg:.1} GB/s = {:.1} % of it",
                dispatches.map_or_else(|| "?".into(), |d| d.to_string()),
                submits.map_or_else(|| "?".into(), |d| d.to_string()),
                step_bytes / 1e9,
                100.0 * best_tg / copy.max(1e-9),
            );
            for &(ng, b, rate, one, d) in &batched {
                println!(
                    "batched tg{ng}x{b}: {rate:.2} tok/s over {b} sequences = {} one sequence's \
                     tg{ng}; {} dispatches and {} submissions a step",
                    one.map_or_else(|| "?".into(), |x| format!("{x:.2}×")),
                    d.map_or_else(|| "?".into(), |d| d.0.to_string()),
                    d.map_or_else(|| "?".into(), |d| d.1.to_string()),
                );
            }
            for (test, prof) in &profiles {
                let total: f64 = prof.iter().map(|k| k.us_per_token).sum();
                println!("kernel time per token, {test} (sum {total:.1} µs):");
                for k in prof {
                    println!(
                        "  {:<18} {:>9.1} µs {:>5.1} %  {:>6.1} dispatches",
                        k.name,
                        k.us_per_token,
                        100.0 * k.us_per_token / total.max(1e-9),
                        k.per_token
                    );
                }
            }
        }
    }
    if !a.json {
        println!(
            "peak RSS {}",
            peak_rss_bytes().map_or_else(|| "?".into(), human_bytes)
        );
    }
    Ok(())
}

/// Deterministic pseudo-random token ids (a prompt of noise, as llama-bench uses).
fn tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            u32::try_from(x % n_vocab as u64).unwrap_or(0)
        })
        .collect()
}

pub fn run(a: Args) -> Result<()> {
    if a.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    if a.model.skip_layers.is_some() {
        bail!("bench does not skip blocks; measure --skip-layers with `bitnet run` and `bitnet perplexity`");
    }
    if a.model.ram_budget.is_some() || a.model.device != super::common::DeviceArg::Cpu {
        if a.embed {
            bail!("--embed measures the CPU path without a RAM budget");
        }
        return run_engine(&a);
    }
    if a.profile {
        bail!("--profile times GPU kernels: add --device gpu");
    }
    let ubatches = if a.ubatch.is_empty() {
        vec![bitnet_engine::EngineOptions::default().n_batch]
    } else {
        a.ubatch.clone()
    };
    if ubatches.contains(&0) {
        bail!("--ubatch-size must be at least 1");
    }
    if a.model.numerics == bitnet_model::Numerics::Exact && ubatches.iter().any(|&u| u != 512) {
        bail!(
            "exact numerics prefills in batches of 512 (bitnet.cpp's ubatch): drop --ubatch-size"
        );
    }
    let prompts = lengths(&a.n_prompt);
    // Embedding tests replace pp and tg.
    let gens = if a.embed {
        Vec::new()
    } else {
        lengths(&a.n_gen)
    };
    let path = a.model.path()?;
    let file = open_gguf(&path, a.model.in_memory)?;
    let mut model = Model::load(&file).context("cannot load model")?;
    // The loader's own check of the numerics / LM-head combination (bench takes a thread list,
    // so it builds the model itself).
    bitnet_engine::LoadOptions {
        numerics: a.model.numerics,
        lm_head: a.model.lm_head_format()?,
        screen_head: a.model.screen_head,
        ..Default::default()
    }
    .validate()?;
    let mut progress = super::common::LoadProgress::new();
    let load_pool = Pool::new(a.model.threads());
    let mut released = bitnet_engine::build_lm_head(
        &mut model,
        &file,
        a.model.lm_head_format()?,
        &load_pool,
        &mut |e| progress.event(e),
    )?;
    if a.model.screen_head {
        released = bitnet_engine::build_head_screen(&mut model, &file, &load_pool, &mut |e| {
            progress.event(e)
        })?;
    }
    let listed = a
        .threads_list
        .clone()
        .or_else(|| (!a.model.threads.is_empty()).then(|| a.model.threads.clone()));
    if listed.as_ref().is_some_and(|l| l.contains(&0)) {
        bail!("thread counts must be at least 1");
    }
    let threads = listed.unwrap_or_else(|| {
        let t = a.model.threads();
        if t > 1 {
            vec![1, t]
        } else {
            vec![1]
        }
    });
    let n_vocab = model.config.n_vocab;
    let constrained = match a.constraint.constraint()? {
        Some(c) => {
            let tok = bitnet_tokenizer::Tokenizer::from_gguf(file.metadata(), None)?;
            let grammars = bitnet_engine::Grammars::new(&tok)?;
            Some((c, grammars, tok))
        }
        None => None,
    };
    let n_ctx =
        (prompts.iter().copied().max().unwrap_or(0) + gens.iter().copied().max().unwrap_or(0) + 1)
            .max(2);
    if a.batch.iter().any(|&b| b < 2) {
        bail!("--batch takes batch sizes of at least 2 (the single-sequence test is tg)");
    }
    let bytes_per_token = model.bytes_per_token() as u64;
    let macs_per_token: u64 = model
        .layers
        .iter()
        .flat_map(|l| l.projections())
        .map(|m| (m.n_out() * m.n_in()) as u64)
        .sum();
    if a.embed && (!a.batch.is_empty() || constrained.is_some()) {
        bail!("--embed measures embeddings of the -p lengths: no --batch, no constraint");
    }
    let pooling = model.config.pooling.unwrap_or(bitnet_model::Pooling::Last);
    if !a.json {
        println!(
            "model {} | {} layers, n_embd {} | weights read per token {} | ternary MACs per \
             token {macs_per_token} | numerics {:?} | kv {:?}",
            path.display(),
            model.config.n_layer,
            model.config.n_embd,
            human_bytes(bytes_per_token),
            a.model.numerics,
            a.model.kv_type()
        );
        println!(
            "{:<14} {:>7} {:>12} {:>20} {:>10} {:>10} {:>8}",
            "test", "threads", "tok/s", "(min .. max)", "GB/s", "read GB/s", "ratio"
        );
    }
    // The read baseline covers the mapped file, except the source of a quantized head
    // (released after conversion, and no longer read by decode): the larger side of it. It is
    // measured per thread count before the weights are repacked: repacking releases the
    // file's pages, and reading them afterwards would bring them back beside the new copy.
    let all = file.as_bytes();
    let base = match &released {
        Some(r) => {
            let (head, tail) = (&all[..r.start], &all[r.end..]);
            if head.len() >= tail.len() {
                head
            } else {
                tail
            }
        }
        _ => all,
    };
    let bws: Vec<f64> = threads
        .iter()
        .map(|&t| read_bandwidth(&Pool::new(t.max(1)), base))
        .collect();
    if !a.model.no_repack {
        bitnet_engine::repack_weights(&mut model, &file, &load_pool, &mut |e| progress.event(e))?;
    }
    for (ti, &t) in threads.iter().enumerate() {
        let pool = Pool::new(t.max(1));
        let mut scratch = bitnet_model::Scratch::default();
        let mut exec = Exec {
            backend: &pool,
            numerics: a.model.numerics,
            trace: None,
            scratch: Some(&mut scratch),
        };
        let mut tests: Vec<Test> = Vec::new();
        for &depth in &a.depth {
            // The history every repetition starts from; each one truncates back to it.
            let mut cache = model.new_cache(depth + n_ctx, a.model.kv_type(), u64::MAX)?;
            for chunk in tokens(depth, n_vocab, 3).chunks(ubatches[0]) {
                model.forward(chunk, &mut cache, Outputs::None, &mut exec)?;
            }
            for &ubatch in &ubatches {
                for &np in prompts.iter().filter(|_| a.embed) {
                    let prompt = tokens(np, n_vocab, 1);
                    let mut rates = Vec::new();
                    for rep in 0..=a.repetitions {
                        cache.truncate(depth);
                        let t0 = Instant::now();
                        let mut seqs = [Seq {
                            tokens: &prompt,
                            cache: &mut cache,
                            outputs: Outputs::None,
                        }];
                        let v = model.embed_seqs(&mut seqs, pooling, &mut exec)?;
                        std::hint::black_box(bitnet_model::numerics::l2_normalized(&v[0]));
                        if rep > 0 {
                            rates.push(np as f64 / t0.elapsed().as_secs_f64());
                        }
                    }
                    let mut test = Test::pp(np, depth, None, false, rates);
                    test.name = test.name.replacen("pp", "embd", 1);
                    tests.push(test);
                }
                for &np in prompts.iter().filter(|_| !a.embed) {
                    let prompt = tokens(np, n_vocab, 1);
                    let mut rates = Vec::new();
                    // one warm-up run pages the weights in
                    for rep in 0..=a.repetitions {
                        cache.truncate(depth);
                        let t0 = Instant::now();
                        // In prefill batches, as `run` prefills; only the last batch's last
                        // row is projected to logits.
                        let batches: Vec<&[u32]> = prompt.chunks(ubatch).collect();
                        for (i, b) in batches.iter().enumerate() {
                            let out = if i + 1 == batches.len() {
                                Outputs::Last
                            } else {
                                Outputs::None
                            };
                            model.forward(b, &mut cache, out, &mut exec)?;
                        }
                        if rep > 0 {
                            rates.push(np as f64 / t0.elapsed().as_secs_f64());
                        }
                    }
                    tests.push(Test::pp(np, depth, Some(ubatch), ubatches.len() > 1, rates));
                }
            }
            for &ng in &gens {
                let mut rates = Vec::new();
                for rep in 0..=a.repetitions {
                    cache.truncate(depth);
                    // Greedy decoding, as `run --temp 0` chooses its tokens (through the
                    // screened head with --screen-head).
                    let greedy = |p: Picked| match p {
                        Picked::Chosen(t) => t,
                        Picked::Top(t) => t.first().map_or(0, |c| c.0),
                        Picked::Logits(l) => bitnet_sampling::argmax(&l).unwrap_or(0),
                    };
                    let first = tokens(1, n_vocab, 2);
                    let mut next =
                        greedy(model.forward_pick(&first, &mut cache, Pick::Greedy, &mut exec)?);
                    let t0 = Instant::now();
                    for _ in 0..ng {
                        next = greedy(model.forward_pick(
                            &[next],
                            &mut cache,
                            Pick::Greedy,
                            &mut exec,
                        )?);
                    }
                    if rep > 0 {
                        rates.push(ng as f64 / t0.elapsed().as_secs_f64());
                    }
                }
                tests.push(Test::tg(ng, depth, 1, rates));
                if let Some((c, grammars, tok)) = &constrained {
                    let mut rates = Vec::new();
                    for rep in 0..=a.repetitions {
                        cache.truncate(depth);
                        let mut state = grammars.start(c)?;
                        let mut logits = model.forward(
                            &tokens(1, n_vocab, 2),
                            &mut cache,
                            Outputs::Last,
                            &mut exec,
                        )?;
                        let t0 = Instant::now();
                        for _ in 0..ng {
                            state.apply(&mut logits)?;
                            let next = bitnet_sampling::argmax(&logits).unwrap_or(0);
                            if tok.is_eog(next) {
                                state = grammars.start(c)?;
                            } else {
                                state.commit(next)?;
                            }
                            // The next mask beside the forward pass, as generation runs it.
                            let (l, prepared) = std::thread::scope(|scope| {
                                let h = scope.spawn(|| state.prepare());
                                let l =
                                    model.forward(&[next], &mut cache, Outputs::Last, &mut exec);
                                (l, h.join())
                            });
                            prepared.map_err(|_| {
                                anyhow::anyhow!("the token mask's thread panicked")
                            })??;
                            logits = l?;
                        }
                        if rep > 0 {
                            rates.push(ng as f64 / t0.elapsed().as_secs_f64());
                        }
                    }
                    let mut t = Test::tg(ng, depth, 1, rates);
                    t.name.push_str("+constraint");
                    tests.push(t);
                }
            }
        }
        for &ng in &gens {
            for &b in a.batch.iter().filter(|&&b| b >= 2) {
                let mut rates = Vec::new();
                for rep in 0..=a.repetitions {
                    let mut caches = Vec::with_capacity(b);
                    let mut next = Vec::with_capacity(b);
                    for i in 0..b {
                        let mut cache = model.new_cache(n_ctx, a.model.kv_type(), u64::MAX)?;
                        let seed = 2 + u64::try_from(i).unwrap_or(0);
                        let logits = model.forward(
                            &tokens(1, n_vocab, seed),
                            &mut cache,
                            Outputs::Last,
                            &mut exec,
                        )?;
                        next.push(bitnet_sampling::argmax(&logits).unwrap_or(0));
                        caches.push(cache);
                    }
                    let t0 = Instant::now();
                    for _ in 0..ng {
                        let mut seqs: Vec<Seq<'_>> = caches
                            .iter_mut()
                            .zip(next.chunks(1))
                            .map(|(cache, t)| Seq {
                                tokens: t,
                                cache,
                                outputs: Outputs::Last,
                            })
                            .collect();
                        let out = model.forward_seqs(&mut seqs, &mut exec)?;
                        drop(seqs);
                        for (n, l) in next.iter_mut().zip(&out) {
                            *n = bitnet_sampling::argmax(l).unwrap_or(0);
                        }
                    }
                    if rep > 0 {
                        rates.push((ng * b) as f64 / t0.elapsed().as_secs_f64());
                    }
                }
                tests.push(Test::tg(ng, 0, b, rates));
            }
        }
        let bw = bws[ti];
        for test in tests {
            let s = stat(test.rates.clone());
            // Batched decode reads the weights once per step for several tokens: no
            // per-token bandwidth figure.
            let is_tg = test.n_gen > 0 && test.batch == 1;
            let gbs = if is_tg {
                s.median * bytes_per_token as f64 / 1e9
            } else {
                f64::NAN
            };
            let name = &test.name;
            if a.json {
                let mut row = test.json_fields(&s);
                for (k, v) in [
                    ("threads", json!(t)),
                    ("bytes_per_token", json!(bytes_per_token)),
                    ("achieved_gb_s", json!(is_tg.then_some(gbs))),
                    ("read_gb_s", json!(bw)),
                    ("ratio_to_read", json!(is_tg.then_some(gbs / bw))),
                    ("peak_rss_bytes", json!(peak_rss_bytes())),
                    ("ternary_macs_per_token", json!(macs_per_token)),
                    (
                        "vectors_per_s",
                        json!(a.embed.then(|| s.median / test.n_prompt.max(1) as f64)),
                    ),
                    ("numerics", json!(format!("{:?}", a.model.numerics))),
                    ("isa", json!(bitnet_kernels::isa().name())),
                ] {
                    row.insert(k.into(), v);
                }
                println!("{}", serde_json::Value::Object(row));
            } else if is_tg {
                println!(
                    "{name:<14} {t:>7} {:>12.2} {:>20} {gbs:>10.2} {bw:>10.2} {:>8.2}",
                    s.median,
                    format!("({:.2} .. {:.2})", s.min, s.max),
                    gbs / bw
                );
            } else if a.embed {
                println!(
                    "{name:<14} {t:>7} {:>12.2} {:>20} {:>10} {bw:>10.2} {:>8}   {:.2} vectors/s",
                    s.median,
                    format!("({:.2} .. {:.2})", s.min, s.max),
                    "-",
                    "-",
                    s.median / test.n_prompt.max(1) as f64
                );
            } else {
                println!(
                    "{name:<14} {t:>7} {:>12.2} {:>20} {:>10} {bw:>10.2} {:>8}",
                    s.median,
                    format!("({:.2} .. {:.2})", s.min, s.max),
                    "-",
                    "-"
                );
            }
        }
    }
    if !a.json {
        println!(
            "peak RSS {}",
            peak_rss_bytes().map_or_else(|| "?".into(), human_bytes)
        );
    }
    Ok(())
}
