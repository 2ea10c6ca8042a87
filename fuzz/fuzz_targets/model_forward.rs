//! Structured edits of the golden model files of every architecture, then load and run.
//!
//! Byte 0 picks the file (six architectures), the numerics, the KV cache's type and the path
//! (the model alone, or the engine's CPU load, which repacks the weights for the panel GEMM
//! where the tier has it); then
//! 8-byte edits follow until a byte 0xff or the end: a scalar metadata value replaced (by a
//! value from a list of extremes, or by the edit's own bits), a key or a tensor removed, a
//! dimension or a type changed, or four bytes of a tensor overwritten. What follows the 0xff
//! is the prompt, as little-endian u16 token ids (16 at most). The edited file is loaded and
//! runs the prompt with all logits, then one more token (through the engine: greedy), then an
//! embedding. Every outcome
//! must be a typed error or finite numbers: a panic, an abort, a hang or a NaN that comes
//! out is a finding.
#![no_main]

use std::sync::{Arc, OnceLock};

use bitnet_engine::{EmbedOptions, LoadOptions};
use bitnet_gguf::{GgufFile, Limits, Value};
use bitnet_model::{Exec, KvType, Model, Numerics, Outputs, Pooling, Seq};
use bitnet_testkit::{rewrite, RawTensor, EXTREME_F32S, EXTREME_U32S};
use libfuzzer_sys::fuzz_target;

fn parsed() -> &'static [GgufFile] {
    static P: OnceLock<Vec<GgufFile>> = OnceLock::new();
    P.get_or_init(|| {
        bitnet_testdata::MODEL_FILES
            .iter()
            .map(|f| GgufFile::from_bytes(bitnet_testdata::read(f), &Limits::default()).unwrap())
            .collect()
    })
}

/// One edit from 8 bytes `e`.
fn edit(e: &[u8], kv: &mut Vec<(String, Value)>, ts: &mut Vec<RawTensor>) {
    let word = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
    let pick = |n: usize| usize::from(e[1]) % n.max(1);
    match e[0] % 6 {
        0 => {
            let scalars: Vec<usize> = (0..kv.len())
                .filter(|&i| !matches!(kv[i].1, Value::Array(_)))
                .collect();
            if scalars.is_empty() {
                return;
            }
            let i = scalars[pick(scalars.len())];
            let own = e[2] & 0x80 != 0;
            let extreme_u32 = EXTREME_U32S[usize::from(e[3]) % EXTREME_U32S.len()];
            let extreme_f32 = EXTREME_F32S[usize::from(e[3]) % EXTREME_F32S.len()];
            let v = match (&kv[i].1, e[2] & 3) {
                (Value::U32(_), 0..=2) if own => Value::U32(word),
                (Value::U32(_), 0..=2) => Value::U32(extreme_u32),
                (Value::F32(_), 0..=2) if own => Value::F32(f32::from_bits(word)),
                (Value::F32(_), 0..=2) => Value::F32(extreme_f32),
                (Value::Bool(b), 0..=2) => Value::Bool(!b),
                (Value::String(_), 0..=2) => Value::String(
                    [
                        "",
                        "llama",
                        "bitnet",
                        "bitnet-b1.58",
                        "qwen3",
                        "gemma3",
                        "falcon3",
                        "x",
                    ][usize::from(e[3]) % 8]
                        .into(),
                ),
                _ => [
                    Value::I32(-1),
                    Value::U64(u64::MAX),
                    Value::F32(f32::NAN),
                    Value::U32(word),
                ][usize::from(e[3]) % 4]
                    .clone(),
            };
            kv[i].1 = v;
        }
        1 => {
            if !kv.is_empty() {
                kv.remove(pick(kv.len()));
            }
        }
        2 => {
            if !ts.is_empty() {
                ts.remove(pick(ts.len()));
            }
        }
        3 => {
            if ts.is_empty() {
                return;
            }
            let n = ts.len();
            let t = &mut ts[pick(n)];
            if t.dims.is_empty() {
                return;
            }
            let d = usize::from(e[2]) % t.dims.len();
            let old = t.dims[d];
            t.dims[d] = match e[3] % 6 {
                0 => u64::from(word),
                1 => old / 2,
                2 => old + 1,
                3 => old.saturating_mul(2),
                4 => 0,
                _ => 1,
            };
        }
        4 => {
            if ts.is_empty() {
                return;
            }
            let n = ts.len();
            ts[pick(n)].type_id = u32::from(e[2]);
        }
        _ => {
            if ts.is_empty() {
                return;
            }
            let n = ts.len();
            let t = &mut ts[pick(n)];
            if t.data.is_empty() {
                return;
            }
            let at = usize::from(u16::from_le_bytes([e[2], e[3]])) * t.data.len() / 65536;
            for (k, b) in word.to_le_bytes().iter().enumerate() {
                if let Some(x) = t.data.get_mut(at + k) {
                    *x = *b;
                }
            }
        }
    }
}

fn finite(v: &[f32], what: &str) {
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        panic!("{what}: value {i} is {}", v[i]);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&head, mut rest)) = data.split_first() else {
        return;
    };
    let which = usize::from(head & 7) % bitnet_testdata::MODEL_FILES.len();
    let numerics = if head & 0x08 != 0 {
        Numerics::Exact
    } else {
        Numerics::Fast
    };
    let kv_type =
        [KvType::F16, KvType::F32, KvType::Q8_0, KvType::Q4_0][usize::from(head >> 4) & 3];
    let engine = head & 0x40 != 0;
    let mut edits = Vec::new();
    while rest.len() >= 8 && rest[0] != 0xff && edits.len() < 8 {
        edits.push(&rest[..8]);
        rest = &rest[8..];
    }
    let prompt: Vec<u32> = rest
        .get(1..)
        .unwrap_or(&[])
        .chunks_exact(2)
        .take(16)
        .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
        .collect();
    let Ok(bytes) = rewrite(&parsed()[which], |kv, ts| {
        for e in &edits {
            edit(e, kv, ts);
        }
    }) else {
        return;
    };
    let Ok(f) = GgufFile::from_bytes(bytes, &Limits::default()) else {
        return;
    };
    let prompt = if prompt.is_empty() {
        vec![1, 2, 3]
    } else {
        prompt
    };
    if engine {
        run_engine(f, numerics, kv_type, &prompt);
        return;
    }
    let Ok(m) = Model::load(&f) else { return };
    let pool = bitnet_kernels::Pool::new(1);
    let mut exec = Exec {
        backend: &pool,
        numerics,
        trace: None,
        scratch: None,
    };
    let Ok(mut cache) = m.new_cache(32, kv_type, 1 << 28) else {
        return;
    };
    if let Ok(l) = m.forward(&prompt, &mut cache, Outputs::All, &mut exec) {
        finite(&l, "prompt logits");
        if let Ok(l) = m.forward(&[prompt[0]], &mut cache, Outputs::Last, &mut exec) {
            finite(&l, "step logits");
        }
    }
    cache.reset();
    let pooling = m.config.pooling.unwrap_or(Pooling::Mean);
    let mut seqs = [Seq {
        tokens: &prompt,
        cache: &mut cache,
        outputs: Outputs::None,
    }];
    if let Ok(v) = m.embed_seqs(&mut seqs, pooling, &mut exec) {
        for e in &v {
            finite(e, "embedding");
        }
    }
});

/// The engine's CPU path: loaded (and repacked) from the edited file, the prompt's logits,
/// a greedy step, an embedding.
fn run_engine(f: GgufFile, numerics: Numerics, kv_type: KvType, prompt: &[u32]) {
    let opts = LoadOptions {
        threads: 1,
        numerics,
        kv_type,
        kv_budget_bytes: 1 << 28,
        ..LoadOptions::default()
    };
    let Ok(e) = bitnet_engine::load_file(Arc::new(f), &opts, &mut |_| {}) else {
        return;
    };
    let Ok(mut s) = e.new_session(32) else { return };
    if let Ok(l) = e.eval(&mut s, prompt, Outputs::All) {
        finite(&l, "prompt logits");
        let _ = e.eval_greedy(&mut s, &prompt[..1]);
    }
    if let Ok(v) = e.embed(&[prompt.to_vec()], &EmbedOptions::default()) {
        for x in &v {
            finite(x, "embedding");
        }
    }
}
