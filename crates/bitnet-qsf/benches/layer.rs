//! What LZ4 buys and costs on ternary layers: `cargo bench -p bitnet-qsf --bench layer`.
//!
//! Writes one synthetic block of the 2B-4T shapes (I2_S, seeded) as QSF with and without LZ4,
//! then reads the layer section back (CRC check, decompression, tensor records) and prints
//! sizes, times and the ratios. `BENCH_REPS` sets the repetitions (default 20).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_precision_loss)]

use std::time::Instant;

use bitnet_gguf::{GgufFile, Limits};
use bitnet_qsf::{write_from_gguf, Compression, QsfFile};
use bitnet_testkit::{synth, Preset, SynthSpec};

fn main() {
    let reps: usize = std::env::var("BENCH_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let mut spec = SynthSpec::preset(Preset::B2);
    spec.n_layer = 1;
    let vocab = synth::vocab_from_gguf_bytes(bitnet_testkit::TINY_VOCAB_GGUF).unwrap();
    let gguf = GgufFile::from_bytes(
        synth::write(&spec, &vocab, Vec::new(), &mut |_, _| {}).unwrap(),
        &Limits::default(),
    )
    .unwrap();
    println!("one 2B-4T block (I2_S), {reps} reads each");
    println!(
        "{:<6} {:>12} {:>12} {:>8} {:>10} {:>10}",
        "layers", "raw B", "stored B", "ratio", "read ms", "GB/s"
    );
    let mut times = Vec::new();
    for c in [Compression::None, Compression::Lz4] {
        let bytes = write_from_gguf(&gguf, c, None, Vec::new(), &mut |_, _| true).unwrap();
        let q = QsfFile::from_bytes(bytes).unwrap();
        let e = q.layers[0].section;
        q.layer(0).unwrap(); // warm
        let t = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(q.layer(0).unwrap());
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        times.push(s);
        println!(
            "{:<6} {:>12} {:>12} {:>8.4} {:>10.3} {:>10.2}",
            format!("{c:?}").to_lowercase(),
            e.raw,
            e.stored,
            e.stored as f64 / e.raw as f64,
            s * 1e3,
            e.raw as f64 / s / 1e9
        );
    }
    println!("lz4 / none read time: {:.2}", times[1] / times[0]);
}
