//! The whole forward pass on the GPU against the CPU's fast numerics: the tiny golden model and
//! a synthetic medium model (GQA, 16k vocabulary; I2_S and TQ2_0), every prompt position and
//! the teacher-forced steps after it, greedy generation, and the typed errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

use bitnet_gguf::{Array, GgufFile, Limits, Value};
use bitnet_gpu::{DecodeKernels, GpuCache, GpuError, GpuKv, GpuModel, GpuOptions};
use bitnet_kernels::{Pool, RowMatrix, RowType};
use bitnet_model::{Exec, KvType, Model, Numerics, Outputs};
use bitnet_testkit::{synth, Preset, SynthSpec, WeightLayout};

fn tiny() -> GgufFile {
    GgufFile::open(
        &bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf"),
        &Limits::default(),
    )
    .unwrap()
}

/// The tiny vocabulary padded to 16,384 tokens.
fn vocab_16k() -> Vec<(String, Value)> {
    let mut v = synth::vocab_from_gguf_bytes(bitnet_testkit::TINY_VOCAB_GGUF).unwrap();
    for (k, val) in &mut v {
        match (k.as_str(), val) {
            ("tokenizer.ggml.tokens", Value::Array(Array::String(t))) => {
                let n = t.len();
                t.extend((n..16_384).map(|i| format!("[PAD{i}]")));
            }
            ("tokenizer.ggml.scores", Value::Array(Array::F32(s))) => s.resize(16_384, 0.0),
            ("tokenizer.ggml.token_type", Value::Array(Array::I32(s))) => s.resize(16_384, 1),
            _ => {}
        }
    }
    v
}

/// The small preset's shapes (1024 wide, 6 blocks, 8 heads over 2 KV heads) at `layout`.
fn medium(dir: &Path, layout: WeightLayout) -> PathBuf {
    let path = dir.join(format!("medium-{layout:?}.gguf"));
    let mut spec = SynthSpec::preset(Preset::Small);
    spec.layout = layout;
    let f = std::fs::File::create(&path).unwrap();
    synth::write(
        &spec,
        &vocab_16k(),
        std::io::BufWriter::new(f),
        &mut |_, _| {},
    )
    .unwrap();
    path
}

/// The index of the largest value and its margin over the second.
fn top2(row: &[f32]) -> (usize, f32) {
    let mut best = (0, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &x) in row.iter().enumerate() {
        if x > best.1 {
            best = (i, x, best.1);
        } else if x > best.2 {
            best.2 = x;
        }
    }
    (best.0, best.1 - best.2)
}

/// The gates on one row of logits.
fn gate(what: &str, cpu: &[f32], gpu: &[f32]) {
    let g = bitnet_testdata::compare_logits(gpu, cpu, cpu.len(), 0.08);
    assert!(g.max_abs <= 0.25, "{what}: max |Δ| {}", g.max_abs);
    assert!(g.min_cos >= 0.995, "{what}: cosine {}", g.min_cos);
    assert_eq!(g.top1_misses_above_margin, 0, "{what}: top-1 differs");
}

/// The CPU cache type that stores what `kv` stores.
fn cpu_kv(kv: GpuKv) -> KvType {
    match kv {
        GpuKv::F16 => KvType::F16,
        GpuKv::F32 => KvType::F32,
        GpuKv::Q8_0 => KvType::Q8_0,
    }
}

/// The CPU's fast forward pass on `pool`.
fn fast(pool: &Pool) -> Exec<'_> {
    Exec {
        backend: pool,
        numerics: Numerics::Fast,
        trace: None,
        scratch: None,
    }
}

/// Every prompt position, then 32 steps fed the CPU's greedy choice, on both.
fn compare(m: &Model<'_>, opts: GpuOptions, kv: GpuKv, prompt: &[u32], what: &str) {
    compare_steps(m, opts, kv, prompt, 32, what);
}

/// Every prompt position, then `steps` steps fed the CPU's greedy choice, on both.
fn compare_steps(
    m: &Model<'_>,
    opts: GpuOptions,
    kv: GpuKv,
    prompt: &[u32],
    steps: usize,
    what: &str,
) {
    compare_with(m, m, opts, kv, prompt, steps, what);
}

/// [`compare_steps`] with the GPU's model uploaded from `up` (the same model, its head in
/// another form).
fn compare_with(
    m: &Model<'_>,
    up: &Model<'_>,
    opts: GpuOptions,
    kv: GpuKv,
    prompt: &[u32],
    steps: usize,
    what: &str,
) {
    let g = GpuModel::new(up, opts).unwrap();
    let nv = m.config.n_vocab;
    let pool = Pool::new(2);
    let mut exec = fast(&pool);
    let mut cache = m
        .new_cache(prompt.len() + steps, cpu_kv(kv), u64::MAX)
        .unwrap();
    let mut gc = g.new_cache(prompt.len() + steps, kv).unwrap();
    let cpu = m
        .forward(prompt, &mut cache, Outputs::All, &mut exec)
        .unwrap();
    let gpu = g.forward(prompt, &mut gc, Outputs::All).unwrap();
    assert_eq!(cpu.len(), prompt.len() * nv);
    assert_eq!(gpu.len(), cpu.len(), "{what}");
    for (p, (a, b)) in cpu.chunks_exact(nv).zip(gpu.chunks_exact(nv)).enumerate() {
        gate(&format!("{what} prompt position {p}"), a, b);
    }
    let mut next = top2(&cpu[cpu.len() - nv..]).0;
    for step in 0..steps {
        let id = u32::try_from(next).unwrap();
        let a = m
            .forward(&[id], &mut cache, Outputs::Last, &mut exec)
            .unwrap();
        let b = g.forward(&[id], &mut gc, Outputs::Last).unwrap();
        gate(&format!("{what} step {step}"), &a, &b);
        next = top2(&a).0;
    }
    assert_eq!(gc.len(), prompt.len() + steps);
}

/// Greedy generation on both; ids equal while the CPU's margins are clear.
fn greedy(m: &Model<'_>, prompt: &[u32], what: &str) {
    let g = GpuModel::new(m, GpuOptions::default()).unwrap();
    let nv = m.config.n_vocab;
    let pool = Pool::new(2);
    let mut exec = fast(&pool);
    let mut cache = m
        .new_cache(prompt.len() + 24, KvType::F16, u64::MAX)
        .unwrap();
    let mut gc = g.new_cache(prompt.len() + 24, GpuKv::F16).unwrap();
    let mut logits = m
        .forward(prompt, &mut cache, Outputs::Last, &mut exec)
        .unwrap();
    let mut gid = g.forward_greedy(prompt, &mut gc).unwrap();
    for step in 0..20 {
        let (ci, margin) = top2(&logits[..nv]);
        if margin <= 0.08 {
            break;
        }
        assert_eq!(
            usize::try_from(gid).unwrap(),
            ci,
            "{what}: greedy step {step}"
        );
        let id = u32::try_from(ci).unwrap();
        logits = m
            .forward(&[id], &mut cache, Outputs::Last, &mut exec)
            .unwrap();
        gid = g.forward_greedy(&[id], &mut gc).unwrap();
    }
}

const PROMPT: [u32; 13] = [4000, 791, 1864, 315, 9, 2000, 17, 3, 88, 1024, 4001, 5, 640];

#[test]
fn tiny_golden_model_matches_the_cpu() {
    if !common::have_gpu() {
        return;
    }
    let f = tiny();
    let m = Model::load(&f).unwrap();
    compare(
        &m,
        GpuOptions::default(),
        GpuKv::F16,
        &PROMPT,
        "tiny, f16 cache",
    );
    compare(
        &m,
        GpuOptions::default(),
        GpuKv::F32,
        &PROMPT,
        "tiny, f32 cache",
    );
    // Several submissions per prompt (3 rows each), and the head and embedding split into
    // chunks of 100 rows (ragged last chunk): the same logits.
    let small = GpuOptions {
        max_batch: 3,
        chunk_bytes: Some(100 * 512),
        ..GpuOptions::default()
    };
    compare(
        &m,
        small,
        GpuKv::F16,
        &PROMPT,
        "tiny, batches of 3, head in chunks",
    );
    for (decode, what) in [
        (DecodeKernels::Rows, "tiny, row decode kernels"),
        (DecodeKernels::Mv, "tiny, team decode kernels"),
        (DecodeKernels::Fused, "tiny, fused decode kernels"),
    ] {
        let opts = GpuOptions {
            decode,
            ..GpuOptions::default()
        };
        compare(&m, opts, GpuKv::F16, &PROMPT, what);
    }
    // The lane kernels, asked for by name: only a CPU device has them.
    let lanes = GpuOptions {
        decode: DecodeKernels::Lanes,
        ..GpuOptions::default()
    };
    match GpuModel::new(&m, lanes) {
        Ok(_) => compare(&m, lanes, GpuKv::F16, &PROMPT, "tiny, lane decode kernels"),
        Err(GpuError::Unsupported(why)) => eprintln!("lane decode kernels not tested: {why}"),
        Err(e) => panic!("tiny, lane decode kernels: {e}"),
    }
    greedy(&m, &PROMPT, "tiny");
}

/// The LM head quantized (Q8_0, Q4_0) against the CPU running the same quantized head
/// (`--lm-head`): uploaded from the file's F16 rows and quantized on the way, and from the
/// CPU's quantized copy; the tiny model (tied head, whose embedding keeps its F16 rows) and
/// the medium one, the lane and the team decode kernels, a head in chunks and a batched
/// step; greedy picks equal while the margins are clear.
#[test]
fn quantized_heads_match_the_cpu() {
    if !common::have_gpu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new(2);
    let medium_f =
        GgufFile::open(&medium(dir.path(), WeightLayout::I2S), &Limits::default()).unwrap();
    let tiny_f = tiny();
    let prompt: Vec<u32> = (0..20u32).map(|i| (i * 409 + 7) % 16_384).collect();
    for (name, f, prompt) in [
        ("tiny", &tiny_f, &PROMPT[..]),
        ("medium", &medium_f, &prompt[..]),
    ] {
        let m = Model::load(f).unwrap();
        assert!(m.output.is_none(), "{name}: a tied head");
        for ty in [RowType::Q8_0, RowType::Q4_0] {
            let mut mq = Model::load(f).unwrap();
            mq.set_lm_head(RowMatrix::quantize_from(m.lm_head(), ty, &pool).unwrap());
            let opts = GpuOptions {
                head: Some(ty),
                ..GpuOptions::default()
            };
            let what = format!("{name}, {ty:?} head");
            compare_with(
                &mq,
                &m,
                opts,
                GpuKv::F16,
                prompt,
                8,
                &format!("{what} from F16"),
            );
            compare_with(
                &mq,
                &mq,
                GpuOptions::default(),
                GpuKv::F16,
                prompt,
                4,
                &format!("{what} from the CPU's"),
            );
            let other = GpuOptions {
                decode: DecodeKernels::Mv,
                max_batch: 3,
                chunk_bytes: Some(100 * 2048),
                ..opts
            };
            compare_with(
                &mq,
                &m,
                other,
                GpuKv::F32,
                prompt,
                4,
                &format!("{what}, team kernels, chunks"),
            );
            batched_against_the_cpu(&mq, opts, GpuKv::F16, &what);
        }
    }
}

/// Each decode kernel on the medium model: a 60-token prompt, then 12 steps, the fifth of
/// which passes the first attention chunk (64 positions). A step costs a software Vulkan
/// driver as much as eight prompt rows, so the positions are mostly the prompt's.
#[test]
fn medium_synth_matches_the_cpu_in_i2s_and_tq2() {
    if !common::have_gpu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let prompt: Vec<u32> = (0..60u32).map(|i| (i * 409 + 7) % 16_384).collect();
    const STEPS: usize = 12;
    for layout in [WeightLayout::I2S, WeightLayout::Tq2_0] {
        let path = medium(dir.path(), layout);
        let f = GgufFile::open(&path, &Limits::default()).unwrap();
        let m = Model::load(&f).unwrap();
        assert_eq!(m.config.n_vocab, 16_384);
        assert!(m.config.n_head_kv < m.config.n_head);
        compare_steps(
            &m,
            GpuOptions::default(),
            GpuKv::F16,
            &prompt,
            STEPS,
            &format!("medium {layout:?}"),
        );
        for decode in [DecodeKernels::Rows, DecodeKernels::Mv, DecodeKernels::Fused] {
            let opts = GpuOptions {
                decode,
                ..GpuOptions::default()
            };
            compare_steps(
                &m,
                opts,
                GpuKv::F16,
                &prompt,
                STEPS,
                &format!("medium {layout:?}, {decode:?} decode kernels"),
            );
        }
        greedy(&m, &prompt, &format!("medium {layout:?}"));
    }
}

/// Batched decode steps: sequences at different depths (1, 13 and 70 positions: past one
/// attention chunk, so the team kernels split and merge per sequence) step together, each
/// row against the CPU stepping that sequence alone; the batched arg-max is the row's
/// arg-max; every decode kernel set, both cache types, and batches of 2, 3 and 5 rows (the
/// head's four rows a thread on the lane kernels, then a ragged group).
fn batched_against_the_cpu(m: &Model<'_>, opts: GpuOptions, kv: GpuKv, what: &str) {
    const STEPS: usize = 4;
    let g = GpuModel::new(m, opts).unwrap();
    let nv = m.config.n_vocab;
    let pool = Pool::new(2);
    let mut exec = fast(&pool);
    let prompts: Vec<Vec<u32>> = [1u32, 13, 70, 5, 2]
        .iter()
        .map(|&len| (0..len).map(|i| (i * 409 + 7 * len) % 4256).collect())
        .collect();
    for b in [2usize, 3, 5] {
        let mut cpu = Vec::new();
        let mut gcs = Vec::new();
        let mut next = Vec::new();
        for p in &prompts[..b] {
            let mut c = m
                .new_cache(p.len() + 2 * STEPS, cpu_kv(kv), u64::MAX)
                .unwrap();
            let l = m.forward(p, &mut c, Outputs::Last, &mut exec).unwrap();
            let mut gc = g.new_cache(p.len() + 2 * STEPS, kv).unwrap();
            g.forward(p, &mut gc, Outputs::None).unwrap();
            next.push(u32::try_from(top2(&l).0).unwrap());
            cpu.push(c);
            gcs.push(gc);
        }
        for step in 0..STEPS {
            let mut refs: Vec<&mut GpuCache> = gcs.iter_mut().collect();
            let got = g.forward_batch(&next, &mut refs).unwrap();
            assert_eq!(got.len(), b * nv, "{what}");
            for r in refs.iter_mut() {
                r.truncate(r.len() - 1);
            }
            let picks = g.forward_batch_greedy(&next, &mut refs).unwrap();
            for (i, c) in cpu.iter_mut().enumerate() {
                let want = m.forward(&[next[i]], c, Outputs::Last, &mut exec).unwrap();
                let row = &got[i * nv..(i + 1) * nv];
                gate(&format!("{what} batch {b} step {step} row {i}"), &want, row);
                assert_eq!(
                    picks[i],
                    bitnet_sampling::argmax(row).unwrap(),
                    "{what} batch {b} step {step} row {i}: arg-max"
                );
                assert_eq!(gcs[i].len(), c.len(), "{what}");
                next[i] = u32::try_from(top2(&want).0).unwrap();
            }
        }
    }
}

#[test]
fn batched_steps_match_the_cpu() {
    if !common::have_gpu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = medium(dir.path(), WeightLayout::I2S);
    let f = GgufFile::open(&path, &Limits::default()).unwrap();
    let medium = Model::load(&f).unwrap();
    let t = tiny();
    let tiny = Model::load(&t).unwrap();
    for decode in [
        DecodeKernels::Auto,
        DecodeKernels::Rows,
        DecodeKernels::Mv,
        DecodeKernels::Fused,
    ] {
        let opts = GpuOptions {
            decode,
            ..GpuOptions::default()
        };
        batched_against_the_cpu(&medium, opts, GpuKv::F16, &format!("medium {decode:?}"));
        batched_against_the_cpu(&tiny, opts, GpuKv::F32, &format!("tiny {decode:?} f32"));
    }
    batched_against_the_cpu(&medium, GpuOptions::default(), GpuKv::Q8_0, "medium q8_0");
}

/// The Q8_0 cache against the CPU's Q8_0 cache: every prompt position and the steps after
/// it, on the lane (RoPE and the store then a kernel of their own) and the team kernels;
/// a cache for a head size that is not a multiple of 32 is a typed error.
#[test]
fn q8_0_cache_matches_the_cpu() {
    if !common::have_gpu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = GgufFile::open(&medium(dir.path(), WeightLayout::I2S), &Limits::default()).unwrap();
    let medium = Model::load(&f).unwrap();
    let t = tiny();
    let tiny = Model::load(&t).unwrap();
    let prompt: Vec<u32> = (0..70u32).map(|i| (i * 409 + 7) % 4256).collect();
    for decode in [DecodeKernels::Auto, DecodeKernels::Mv] {
        let opts = GpuOptions {
            decode,
            ..GpuOptions::default()
        };
        compare(
            &tiny,
            opts,
            GpuKv::Q8_0,
            &PROMPT,
            &format!("tiny q8_0 {decode:?}"),
        );
        compare_steps(
            &medium,
            opts,
            GpuKv::Q8_0,
            &prompt,
            8,
            &format!("medium q8_0 {decode:?}"),
        );
    }
    let mut odd = Model::load(&t).unwrap();
    odd.config.head_dim = 48;
    odd.config.n_head = odd.config.n_embd / 48;
    odd.config.n_head_kv = odd.config.n_head;
    if let Ok(g) = GpuModel::new(&odd, GpuOptions::default()) {
        assert!(matches!(
            g.new_cache(8, GpuKv::Q8_0),
            Err(GpuError::Unsupported(_))
        ));
    }
}

#[test]
fn batched_steps_refuse_bad_inputs() {
    if !common::have_gpu() {
        return;
    }
    let t = tiny();
    let m = Model::load(&t).unwrap();
    let g = GpuModel::new(&m, GpuOptions::default()).unwrap();
    let mut a = g.new_cache(4, GpuKv::F16).unwrap();
    let mut b = g.new_cache(1, GpuKv::F16).unwrap();
    // One token a cache.
    assert!(matches!(
        g.forward_batch(&[1, 2, 3], &mut [&mut a, &mut b]),
        Err(GpuError::Shape { .. })
    ));
    assert!(matches!(
        g.forward_batch(&[], &mut []),
        Err(GpuError::Shape { .. })
    ));
    // A token past the vocabulary, and a full cache: nothing joins any cache.
    assert!(matches!(
        g.forward_batch(&[1, 1_000_000], &mut [&mut a, &mut b]),
        Err(GpuError::TokenOutOfRange { .. })
    ));
    g.forward(&[7], &mut b, Outputs::None).unwrap();
    assert!(matches!(
        g.forward_batch_greedy(&[1, 2], &mut [&mut a, &mut b]),
        Err(GpuError::ContextFull { .. })
    ));
    assert_eq!((a.len(), b.len()), (0, 1));
}

/// Decode steps past one attention chunk split each row's positions over workgroups and
/// merge the chunks; a 3-row call whose first row ends on a chunk boundary gives that row an
/// empty chunk. Both must match the CPU, as the unsplit prompt does.
#[test]
fn split_attention_matches_the_cpu() {
    if !common::have_gpu() {
        return;
    }
    let f = tiny();
    let m = Model::load(&f).unwrap();
    let g = GpuModel::new(&m, GpuOptions::default()).unwrap();
    let pool = Pool::new(2);
    let mut exec = fast(&pool);
    let nv = m.config.n_vocab;
    // 381 prompt rows (one workgroup per row and head), then steps at 381 and 382 (6 chunks
    // of 64), then rows at 383..386 (7 chunks; the first row sees 384 positions, so its 7th
    // is empty).
    let prompt: Vec<u32> = (0..381u32).map(|i| (i * 211 + 5) % 4256).collect();
    for kv in [GpuKv::F16, GpuKv::F32] {
        let mut cache = m.new_cache(400, cpu_kv(kv), u64::MAX).unwrap();
        let mut gc = g.new_cache(400, kv).unwrap();
        let a = m
            .forward(&prompt, &mut cache, Outputs::Last, &mut exec)
            .unwrap();
        let b = g.forward(&prompt, &mut gc, Outputs::Last).unwrap();
        gate(&format!("{kv:?} prompt of 381"), &a, &b);
        for (i, call) in [&[17u32][..], &[99], &[1234, 5, 4000]].iter().enumerate() {
            let a = m
                .forward(call, &mut cache, Outputs::All, &mut exec)
                .unwrap();
            let b = g.forward(call, &mut gc, Outputs::All).unwrap();
            assert_eq!(a.len(), call.len() * nv);
            for (r, (x, y)) in a.chunks_exact(nv).zip(b.chunks_exact(nv)).enumerate() {
                gate(&format!("{kv:?} split call {i}, row {r}"), x, y);
            }
        }
        assert_eq!(gc.len(), 386);
    }
}

/// The shift turns cached keys back with the model's RoPE style: NEOX (tiny) and normal
/// (`llama`).
#[test]
fn context_shift_matches_the_cpu() {
    if !common::have_gpu() {
        return;
    }
    for file in [
        "tiny/bitnet-tiny-i2_s.gguf",
        "llama-tiny/llama-tiny-i2_s.gguf",
    ] {
        let f = GgufFile::open(&bitnet_testdata::golden(file), &Limits::default()).unwrap();
        shift_on(&Model::load(&f).unwrap(), file);
    }
}

fn shift_on(m: &Model<'_>, file: &str) {
    let g = GpuModel::new(m, GpuOptions::default()).unwrap();
    let pool = Pool::new(2);
    let mut exec = fast(&pool);
    let prompt: Vec<u32> = (0..20u32).map(|i| (i * 211 + 5) % 4256).collect();
    let nv = m.config.n_vocab;
    let mut shifted = Vec::new();
    // F32 last: its logits are the ones the unshifted cache is told apart from below.
    for kv in [GpuKv::F16, GpuKv::Q8_0, GpuKv::F32] {
        let mut cache = m.new_cache(24, cpu_kv(kv), u64::MAX).unwrap();
        let mut gc = g.new_cache(24, kv).unwrap();
        m.forward(&prompt, &mut cache, Outputs::None, &mut exec)
            .unwrap();
        g.forward(&prompt, &mut gc, Outputs::None).unwrap();
        cache.shift(&m.config, 4, 8).unwrap();
        g.shift(&mut gc, 4, 8).unwrap();
        assert_eq!(gc.len(), 12);
        let a = m
            .forward(&[17, 99, 1234], &mut cache, Outputs::All, &mut exec)
            .unwrap();
        let b = g.forward(&[17, 99, 1234], &mut gc, Outputs::All).unwrap();
        for (i, (x, y)) in a.chunks_exact(nv).zip(b.chunks_exact(nv)).enumerate() {
            gate(
                &format!("{file}: {kv:?} cache after the shift, row {i}"),
                x,
                y,
            );
        }
        shifted = b;
    }
    let b = shifted;
    // Without the shift the logits differ: the test sees it.
    let mut plain = g.new_cache(24, GpuKv::F32).unwrap();
    g.forward(&prompt[..12], &mut plain, Outputs::None).unwrap();
    let c = g
        .forward(&[17, 99, 1234], &mut plain, Outputs::All)
        .unwrap();
    assert!(c.iter().zip(&b).any(|(x, y)| (x - y).abs() > 0.01));
    assert!(matches!(
        g.shift(&mut plain, 10, 8),
        Err(GpuError::Shape { .. })
    ));
}

#[test]
fn calls_from_two_threads_take_turns() {
    if !common::have_gpu() {
        return;
    }
    let f = tiny();
    let m = Model::load(&f).unwrap();
    let g = GpuModel::new(&m, GpuOptions::default()).unwrap();
    let run = |seed: u32| {
        let mut c = g.new_cache(64, GpuKv::F16).unwrap();
        let ids: Vec<u32> = (0..24u32).map(|i| (i * 97 + seed) % 4256).collect();
        let mut out = g.forward(&ids, &mut c, Outputs::Last).unwrap();
        for t in 0..8u32 {
            out.extend(
                g.forward(&[(t * 31 + seed) % 4256], &mut c, Outputs::Last)
                    .unwrap(),
            );
        }
        out
    };
    let (a, b) = (run(1), run(2));
    let (pa, pb) = std::thread::scope(|s| {
        let ta = s.spawn(|| run(1));
        let tb = s.spawn(|| run(2));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    assert!(a.iter().zip(&pa).all(|(x, y)| x.to_bits() == y.to_bits()));
    assert!(b.iter().zip(&pb).all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn bad_inputs_are_typed_errors() {
    if !common::have_gpu() {
        return;
    }
    let f = tiny();
    let m = Model::load(&f).unwrap();
    let g = GpuModel::new(&m, GpuOptions::default()).unwrap();
    let mut gc = g.new_cache(4, GpuKv::F16).unwrap();
    let nv = u32::try_from(m.config.n_vocab).unwrap();
    assert!(matches!(
        g.forward(&[nv], &mut gc, Outputs::Last),
        Err(GpuError::TokenOutOfRange { .. })
    ));
    assert!(matches!(
        g.forward(&[], &mut gc, Outputs::Last),
        Err(GpuError::Shape { .. })
    ));
    assert!(matches!(
        g.forward(&[1, 2, 3, 4, 5], &mut gc, Outputs::Last),
        Err(GpuError::ContextFull { need: 5, n_ctx: 4 })
    ));
    assert_eq!(gc.len(), 0, "a refused call stores nothing");
    assert!(matches!(
        GpuModel::new(
            &m,
            GpuOptions {
                adapter: Some(99),
                ..GpuOptions::default()
            }
        ),
        Err(GpuError::NoSuchAdapter { index: 99, .. })
    ));
    // A layout the kernels do not take, and a quantized head.
    let mut spec = SynthSpec::preset(Preset::Tiny);
    spec.layout = WeightLayout::Tq1_0;
    let bytes = synth::write(
        &spec,
        &synth::vocab_from_gguf_bytes(bitnet_testkit::TINY_VOCAB_GGUF).unwrap(),
        Vec::new(),
        &mut |_, _| {},
    )
    .unwrap();
    let f1 = GgufFile::from_bytes(bytes, &Limits::default()).unwrap();
    let m1 = Model::load(&f1).unwrap();
    let e = GpuModel::new(&m1, GpuOptions::default()).unwrap_err();
    assert!(
        matches!(&e, GpuError::Unsupported(s) if s.contains("Tq1_0")),
        "{e}"
    );
    let pool = Pool::new(1);
    // A Q6_K head (Q8_0 and Q4_0 run: quantized_heads_match_the_cpu), and a head quantized
    // at upload to a type the GPU has no kernel for.
    let mut mq = Model::load(&f).unwrap();
    let q6 = RowMatrix::quantize_from(m.lm_head(), RowType::Q6K, &pool).unwrap();
    mq.set_lm_head(q6);
    let e = GpuModel::new(&mq, GpuOptions::default()).unwrap_err();
    assert!(
        matches!(&e, GpuError::Unsupported(s) if s.contains("Q6K")),
        "{e}"
    );
    let to_q6 = GpuOptions {
        head: Some(RowType::Q6K),
        ..GpuOptions::default()
    };
    let e = GpuModel::new(&m, to_q6).unwrap_err();
    assert!(
        matches!(&e, GpuError::Unsupported(s) if s.contains("Q6K")),
        "{e}"
    );
}

/// Logits of every position of `prompt`.
fn all_logits(g: &GpuModel, prompt: &[u32]) -> Vec<f32> {
    let mut c = g.new_cache(32, GpuKv::F16).unwrap();
    g.forward(prompt, &mut c, Outputs::All).unwrap()
}

/// `m` uploaded through the builder: blocks last to first, the rows in pieces of uneven
/// sizes (words split across pieces and across the head's chunks).
fn built_in_pieces(m: &Model<'_>, opts: GpuOptions) -> GpuModel {
    let gpu = bitnet_gpu::Gpu::open(None).unwrap();
    let mut b = GpuModel::builder(
        gpu,
        &m.config,
        bitnet_gpu::RowsSpec::of(&m.tok_embd),
        m.output.as_ref().map(bitnet_gpu::RowsSpec::of),
        opts,
    )
    .unwrap();
    for (il, l) in m.layers.iter().enumerate().rev() {
        b.layer(il, l).unwrap();
    }
    let sizes = [1, 3, 5, 4096, 2, 7, 65_537, 1, 6];
    let feed = |data: &[u8], out: bool, b: &mut bitnet_gpu::GpuBuilder| {
        let mut at = 0;
        for &n in sizes.iter().cycle() {
            if at == data.len() {
                break;
            }
            let e = (at + n).min(data.len());
            if out {
                b.write_output(&data[at..e]).unwrap();
            } else {
                b.write_embd(&data[at..e]).unwrap();
            }
            at = e;
        }
    };
    if let Some(o) = &m.output {
        feed(o.data(), true, &mut b);
    }
    b.output_norm(&m.output_norm).unwrap();
    feed(m.tok_embd.data(), false, &mut b);
    b.finish().unwrap()
}

#[test]
fn a_model_built_in_pieces_equals_one_uploaded_whole() {
    if !common::have_gpu() {
        return;
    }
    let f = tiny();
    let mut m = Model::load(&f).unwrap();
    let chunked = GpuOptions {
        chunk_bytes: Some(100 * 512 + 4),
        ..GpuOptions::default()
    };
    for opts in [GpuOptions::default(), chunked] {
        let whole = all_logits(&GpuModel::new(&m, opts).unwrap(), &PROMPT);
        let pieces = all_logits(&built_in_pieces(&m, opts), &PROMPT);
        assert_eq!(whole, pieces, "tied head");
    }
    // A head of its own (the embedding with every value's sign flipped): read from the head
    // buffers, the embedding from its own.
    let mut flipped = m.tok_embd.data().to_vec();
    for w in flipped.chunks_exact_mut(2) {
        w[1] ^= 0x80;
    }
    let head = bitnet_kernels::RowMatrix::new(
        m.tok_embd.row_type(),
        m.tok_embd.rows(),
        m.tok_embd.cols(),
        std::borrow::Cow::Owned(flipped),
    )
    .unwrap();
    let tied = all_logits(&GpuModel::new(&m, chunked).unwrap(), &PROMPT);
    m.output = Some(head);
    let whole = all_logits(&GpuModel::new(&m, chunked).unwrap(), &PROMPT);
    let pieces = all_logits(&built_in_pieces(&m, chunked), &PROMPT);
    assert_eq!(whole, pieces, "separate head");
    let neg: Vec<f32> = tied.iter().map(|x| -x).collect();
    assert_eq!(whole, neg, "the separate head is the one read");
}

#[test]
fn a_builder_refuses_missing_extra_and_repeated_pieces() {
    if !common::have_gpu() {
        return;
    }
    let f = tiny();
    let m = Model::load(&f).unwrap();
    let start = || {
        GpuModel::builder(
            bitnet_gpu::Gpu::open(None).unwrap(),
            &m.config,
            bitnet_gpu::RowsSpec::of(&m.tok_embd),
            None,
            GpuOptions::default(),
        )
        .unwrap()
    };
    let embd = m.tok_embd.data();
    // A block missing.
    let mut b = start();
    for (il, l) in m.layers.iter().enumerate().skip(1) {
        b.layer(il, l).unwrap();
    }
    b.output_norm(&m.output_norm).unwrap();
    b.write_embd(embd).unwrap();
    let e = b.finish().unwrap_err();
    assert!(e.to_string().contains("block 0 never came"), "{e}");
    // A block twice, one past the last, an embedding byte short and one too many, a head
    // for a tied model, a norm of the wrong width.
    let mut b = start();
    b.layer(0, &m.layers[0]).unwrap();
    assert!(b.layer(0, &m.layers[0]).is_err());
    assert!(b.layer(m.layers.len(), &m.layers[0]).is_err());
    assert!(b.write_output(&[0; 4]).is_err());
    assert!(b.output_norm(&m.output_norm[1..]).is_err());
    b.write_embd(embd).unwrap();
    assert!(matches!(b.write_embd(&[0]), Err(GpuError::Shape { .. })));
    let mut b = start();
    for (il, l) in m.layers.iter().enumerate() {
        b.layer(il, l).unwrap();
    }
    b.output_norm(&m.output_norm).unwrap();
    b.write_embd(&embd[..embd.len() - 1]).unwrap();
    assert!(matches!(b.finish(), Err(GpuError::Shape { .. })));
    // A head whose rows are not the vocabulary.
    let spec = bitnet_gpu::RowsSpec {
        rows: m.config.n_vocab - 1,
        ..bitnet_gpu::RowsSpec::of(&m.tok_embd)
    };
    assert!(GpuModel::builder(
        bitnet_gpu::Gpu::open(None).unwrap(),
        &m.config,
        spec,
        None,
        GpuOptions::default()
    )
    .is_err());
}

/// (prompt ids, generated ids, bitnet.cpp's all-position logits, its 32 teacher-forced step
/// rows)
type GoldenPrompt = (Vec<u32>, Vec<u32>, Vec<f32>, Vec<f32>);

/// The golden model in `dir`'s prompts.
fn golden_prompts(dir: &str) -> Vec<GoldenPrompt> {
    bitnet_testdata::PROMPTS
        .iter()
        .map(|stem| {
            let ids = |key: &str| bitnet_testdata::token_ids(dir, stem, key);
            (
                ids("prompt_tokens"),
                ids("generated_tokens"),
                bitnet_testdata::read_f32(&format!("{dir}/{stem}.all_logits.f32")),
                bitnet_testdata::read_f32(&format!("{dir}/{stem}.step_logits.f32")),
            )
        })
        .collect()
}

/// The other graphs bitnet.cpp runs on the GPU: architecture `llama` (no sub-norms, normal
/// RoPE, SiLU, untied F16 head; Llama3-8B-1.58 and Falcon3 with heads of 256) and 1bitLLM's
/// `bitnet`. Each golden file against bitnet.cpp's own logits (every prompt position and the
/// 32 teacher-forced steps) with the fast gates, and against the CPU's fast numerics with
/// both decode kernels and greedy generation.
#[test]
fn llama_falcon3_and_1bitllm_goldens_match_bitnet_cpp_and_the_cpu() {
    if !common::have_gpu() {
        return;
    }
    for (dir, file) in [
        ("llama-tiny", "llama-tiny-i2_s.gguf"),
        ("falcon3-tiny", "falcon3-tiny-i2_s.gguf"),
        ("1bitllm-tiny", "1bitllm-tiny-i2_s.gguf"),
    ] {
        let f = GgufFile::open(
            &bitnet_testdata::golden(&format!("{dir}/{file}")),
            &Limits::default(),
        )
        .unwrap();
        let m = Model::load(&f).unwrap();
        let nv = m.config.n_vocab;
        let g = GpuModel::new(&m, GpuOptions::default()).unwrap();
        for (pi, (prompt, generated, all, steps)) in golden_prompts(dir).iter().enumerate() {
            let what = format!("{dir} prompt {pi}");
            let n_ctx = prompt.len() + generated.len();
            let mut gc = g.new_cache(n_ctx, GpuKv::F16).unwrap();
            let gpu_all = g.forward(prompt, &mut gc, Outputs::All).unwrap();
            assert_eq!(gpu_all.len(), all.len(), "{what}");
            for (p, (a, b)) in all
                .chunks_exact(nv)
                .zip(gpu_all.chunks_exact(nv))
                .enumerate()
            {
                gate(&format!("{what} position {p} vs bitnet.cpp"), a, b);
            }
            let mut rows = gpu_all[gpu_all.len() - nv..].to_vec();
            for &t in &generated[..generated.len() - 1] {
                rows.extend(g.forward(&[t], &mut gc, Outputs::Last).unwrap());
            }
            assert_eq!(rows.len(), steps.len(), "{what}");
            for (s, (a, b)) in steps
                .chunks_exact(nv)
                .zip(rows.chunks_exact(nv))
                .enumerate()
            {
                gate(&format!("{what} step {s} vs bitnet.cpp"), a, b);
            }
        }
        let prompt = &golden_prompts(dir)[0].0;
        for decode in [DecodeKernels::Rows, DecodeKernels::Mv, DecodeKernels::Fused] {
            let opts = GpuOptions {
                decode,
                ..GpuOptions::default()
            };
            compare(&m, opts, GpuKv::F16, prompt, &format!("{dir}, {decode:?}"));
        }
        compare(&m, GpuOptions::default(), GpuKv::F32, prompt, dir);
        greedy(&m, prompt, dir);
    }
}

/// The embedding models' blocks (input norms, Q/K norms, a head size apart from
/// n_embd / n_head) are not what the kernels build: refused with a typed error before any
/// device is opened (so `--device auto` falls back to the CPU).
#[test]
fn embedding_architectures_are_refused_before_a_device_is_opened() {
    for (file, arch, features) in [
        ("embed/qwen3-converted.gguf", "'qwen3'", &["Q/K norms"][..]),
        (
            "embed/gemma3-converted.gguf",
            "'gemma3'",
            &["Q/K norms", "post-norms", "GELU"][..],
        ),
    ] {
        let f = GgufFile::open(&bitnet_testdata::golden(file), &Limits::default()).unwrap();
        let m = Model::load(&f).unwrap();
        match GpuModel::new(&m, GpuOptions::default()) {
            // The message names the architecture and each feature the GPU lacks.
            Err(GpuError::Unsupported(msg)) => {
                assert!(msg.contains(arch), "{msg}");
                for f in features {
                    assert!(msg.contains(f), "{msg} does not name {f}");
                }
            }
            Err(e) => panic!("expected Unsupported, got {e}"),
            Ok(_) => panic!("{file} was uploaded to the GPU"),
        }
    }
}
