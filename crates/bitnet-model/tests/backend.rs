//! The backend seam: every heavy operation of a forward pass goes through `Exec::backend`, in
//! the order docs/BACKENDS.md describes, and a backend that only delegates to the CPU pool
//! gives bit-identical logits in both numerics.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Mutex;

use bitnet_gguf::{GgufFile, Limits};
use bitnet_kernels::{Pool, RowMatrix, TernaryMatrix};
use bitnet_model::{Backend, Config, Exec, KvCache, KvType, Model, Numerics, Outputs, Result};

/// Delegates to a CPU pool and records each call.
#[derive(Debug)]
struct Recording {
    pool: Pool,
    calls: Mutex<Vec<String>>,
}

impl Recording {
    fn log(&self, s: String) {
        self.calls.lock().unwrap().push(s);
    }
}

impl Backend for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }
    fn begin_layer(&self, il: usize) -> Result<()> {
        self.log(format!("layer {il}"));
        Ok(())
    }
    fn ternary_matmul(
        &self,
        w: &TernaryMatrix<'_>,
        xq: &[i8],
        scales: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        self.log(format!("lin {}x{} n{}", w.n_out(), w.n_in(), scales.len()));
        self.pool.ternary_matmul(w, xq, scales, out)
    }
    fn lm_head(
        &self,
        head: &RowMatrix<'_>,
        hn: &[f32],
        rows: usize,
        numerics: Numerics,
        out: &mut [f32],
    ) -> Result<()> {
        self.log(format!("head rows{rows}"));
        self.pool.lm_head(head, hn, rows, numerics, out)
    }
    fn lm_head_rows(
        &self,
        head: &RowMatrix<'_>,
        ids: &[u32],
        h: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        self.log(format!("head ids{}", ids.len()));
        self.pool.lm_head_rows(head, ids, h, out)
    }
    fn attention(
        &self,
        c: &Config,
        q: &[f32],
        cache: &KvCache,
        il: usize,
        pos0: usize,
        n: usize,
        numerics: Numerics,
        out: &mut [f32],
    ) -> Result<()> {
        self.log(format!("attn l{il} pos{pos0} n{n}"));
        self.pool.attention(c, q, cache, il, pos0, n, numerics, out)
    }
}

#[test]
fn every_heavy_operation_goes_through_the_backend() {
    let f = GgufFile::open(
        &bitnet_testdata::golden("tiny/bitnet-tiny-i2_s.gguf"),
        &Limits::default(),
    )
    .unwrap();
    let m = Model::load(&f).unwrap();
    let rec = Recording {
        pool: Pool::new(2),
        calls: Mutex::new(Vec::new()),
    };
    let plain = Pool::new(2);
    // Long enough (≥ 16 rows) for the plain pool to split the light steps over its threads.
    let prompt: Vec<u32> = (0..20u32).map(|i| (i * 797 + 9) % 4096).collect();
    for numerics in [Numerics::Fast, Numerics::Exact] {
        let run = |backend: &dyn Backend| {
            let mut exec = Exec {
                backend,
                numerics,
                trace: None,
                scratch: None,
            };
            let mut cache = m.new_cache(32, KvType::F16, u64::MAX).unwrap();
            let mut out = m
                .forward(&prompt, &mut cache, Outputs::Last, &mut exec)
                .unwrap();
            out.extend(
                m.forward(&[42], &mut cache, Outputs::Last, &mut exec)
                    .unwrap(),
            );
            out
        };
        rec.calls.lock().unwrap().clear();
        // `Recording` has no row pool: its norms, quantization, RoPE and residual adds run on
        // the calling thread, the plain pool's on its two threads.
        let a = run(&rec);
        let b = run(&plain);
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{numerics:?}: a delegating backend changed the logits"
        );
        let calls = rec.calls.lock().unwrap().clone();
        // Per forward call: for each of the 2 layers, the hook, Q K V, attention, O, gate
        // up, down (past the last layer's attention, only the output row); then the head once.
        let mut want = Vec::new();
        for (pos0, n) in [(0, 20), (20, 1)] {
            for il in 0..2 {
                let tail = if il == 1 { 1 } else { n };
                want.push(format!("layer {il}"));
                want.push(format!("lin 256x256 n{n}"));
                want.push(format!("lin 128x256 n{n}"));
                want.push(format!("lin 128x256 n{n}"));
                want.push(format!("attn l{il} pos{pos0} n{n}"));
                want.push(format!("lin 256x256 n{tail}"));
                want.push(format!("lin 512x256 n{tail}"));
                want.push(format!("lin 512x256 n{tail}"));
                want.push(format!("lin 256x512 n{tail}"));
            }
            want.push("head rows1".to_string());
        }
        assert_eq!(calls, want, "{numerics:?}");
    }
}
