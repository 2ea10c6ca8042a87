//! Low-memory mode: a RAM budget, the plan that fits the model into it, and the backend
//! that streams the weights through a window of two layers, in one of two ways
//! ([`StreamMode`]):
//!
//! - **mmap** (the default): the weights are read where they are mapped. Before block `il`
//!   runs, the streamer drops the pages of the block before `il` from the process
//!   (`MADV_DONTNEED`). The map asks for huge pages, and the page cache is readied to hold the
//!   file in them ([`prefer_huge_pages`]): then a block comes in and goes with a few dozen
//!   page-table entries, and the faults themselves read ahead. Where the system cannot, the
//!   streamer asks the OS to read block `il + 1` ahead (`MADV_WILLNEED`).
//! - **pread**: an I/O thread copies block `il + 1`'s bytes into a second reusable buffer
//!   while block `il` computes from the first ([`crate::pread`]); the mapped file's pages are
//!   never touched, so there are no page faults and nothing to drop, but every byte is copied
//!   (about 6.5 GB/s on one core here).
//!
//! Either way resident weights stay within two blocks. The LM head (the tied F16 embedding of
//! the official file, 656 MB for the 2B model) is computed in chunks of rows, each dropped once
//! used; an embedding lookup reads (or releases) just its row. The kernels are the same as in
//! normal mode (the file's layout, not the repacked panels, which would be a resident copy),
//! so the logits are the same bits.

use std::fmt::Write as _;
use std::ops::Range;
use std::sync::Arc;

use bitnet_gguf::{GgufFile, HUGE_PAGE};
use bitnet_kernels::{Pool, RowMatrix, TernaryMatrix};
use bitnet_model::{Backend, Config, KvCache, KvType, Model, ModelError, Numerics};

use crate::pread::{Key, PreadIo};
use crate::{EngineError, Result};

/// Bytes of LM-head rows computed (and released) at a time.
pub const HEAD_CHUNK_BYTES: usize = 8 << 20;

/// Prompt tokens per forward pass in fast numerics under a budget (exact numerics keeps
/// bitnet.cpp's 512).
pub const BUDGET_BATCH: usize = 32;

/// Allocator slack, thread stacks and buffers not itemized, kept free under the budget.
const OTHER_BYTES: u64 = 12 << 20;

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetRequest {
    /// The budget in bytes (resident memory of the process).
    pub bytes: u64,
    /// An explicit context size (`-c`); `None` lets the plan choose up to the default.
    pub n_ctx: Option<usize>,
    /// Whether the KV type was chosen explicitly (then the plan never lowers it).
    pub kv_type_explicit: bool,
    /// How the weights are brought in.
    pub stream: StreamMode,
    /// Bytes the caller will hold besides the engine once it runs (a server's threads,
    /// connections and request buffers), planned as a line of their own.
    pub reserve_bytes: u64,
}

/// How the low-memory mode brings each block's weights in (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamMode {
    /// `pread` into two reusable buffers on an I/O thread.
    Pread,
    /// The mapped file, in huge pages where the system can, dropped behind.
    #[default]
    Mmap,
}

/// One line of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanItem {
    pub what: String,
    pub bytes: u64,
}

/// How the budget is spent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryPlan {
    pub budget: u64,
    /// Context positions of a session.
    pub n_ctx: usize,
    pub kv_type: KvType,
    /// Prompt tokens per forward pass.
    pub n_batch: usize,
    /// Blocks whose weights may be resident at once (2: the one computing and the next).
    pub window_layers: usize,
    /// What the room left over keeps resident for good (read once, never released): the
    /// first blocks, then the first bytes of the LM head. Less to stream per token.
    pub pinned_layers: usize,
    pub pinned_head_bytes: u64,
    pub items: Vec<PlanItem>,
    /// Notes on what was lowered to fit.
    pub notes: Vec<String>,
}

impl MemoryPlan {
    pub fn total(&self) -> u64 {
        self.items.iter().map(|i| i.bytes).sum()
    }

    /// The plan as a small table (for stderr at load).
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "memory plan for a budget of {}:", mib(self.budget));
        for i in &self.items {
            let _ = writeln!(s, "  {:<44} {:>10}", i.what, mib(i.bytes));
        }
        let _ = writeln!(
            s,
            "  {:<44} {:>10}  ({} left)",
            "total",
            mib(self.total()),
            mib(self.budget.saturating_sub(self.total()))
        );
        for n in &self.notes {
            let _ = writeln!(s, "  note: {n}");
        }
        s
    }
}

fn mib(b: u64) -> String {
    // Display only.
    #[allow(clippy::cast_precision_loss)]
    let m = b as f64 / f64::from(1u32 << 20);
    format!("{m:.1} MiB")
}

fn u64_of(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The file's byte range of every block's weights, in layer order.
pub fn layer_ranges(model: &Model<'_>, file: &GgufFile) -> Result<Vec<Range<usize>>> {
    let mut out = Vec::with_capacity(model.layers.len());
    for (il, l) in model.layers.iter().enumerate() {
        let mut span: Option<Range<usize>> = None;
        for m in l.projections() {
            let r = file
                .range_of(m.packed_data())
                .ok_or_else(|| EngineError::Budget {
                    reason: format!(
                        "block {il}'s weights are not read from the mapped file (repacked?)"
                    ),
                })?;
            span = Some(match span {
                None => r,
                Some(s) => s.start.min(r.start)..s.end.max(r.end),
            });
        }
        out.push(span.unwrap_or(0..0));
    }
    Ok(out)
}

/// Pieces probed by [`prefer_huge_pages`].
const HUGE_PROBES: usize = 16;

/// Readies the page cache for the mmap window, and says whether it comes in huge pages.
///
/// A block is about 16 MB in the 2B model and its F16 head 656 MB. Held in the page cache as
/// 4 KiB folios, the window maps and drops them 4 KiB at a time: thousands of page-table
/// entries and cache lookups per block, about 7 GB/s on one core here. Held as 2 MiB folios,
/// it takes a few dozen entries per block, at about 28 GB/s, the memory's own speed. So this
/// asks for huge pages on the map, then probes [`HUGE_PROBES`] pieces spread evenly over the
/// `streamed` byte ranges (the blocks and the head; the file is read in huge pages where it is
/// not cached). Even a fifth of the bytes in small folios takes half the streaming time, so
/// when any piece comes in small folios, it drops that piece from the page cache and reads it
/// back: if that comes back huge, the system can do it, and the whole file's cached pages are
/// dropped so that the window reads them again in huge pages (one read of the file from
/// storage; the returned note says so). If it does not (another process maps those pages, or
/// the system cannot), the cache is left as it is.
///
/// Returns whether the pieces (now, or at least three in four of them) come in huge pages,
/// when read-ahead should not use `MADV_WILLNEED`, which brings pages in at 4 KiB; and the
/// note. A file held in memory, a system without huge pages for files, and ranges too small
/// to hold a piece give `(false, None)`.
pub(crate) fn prefer_huge_pages(
    file: &GgufFile,
    streamed: &[Range<usize>],
) -> Result<(bool, Option<String>)> {
    let gguf = |e: bitnet_gguf::GgufError| EngineError::Model(ModelError::from(e));
    if !file.advise_huge_pages().map_err(gguf)? {
        return Ok((false, None));
    }
    // Every whole piece inside the ranges, then an even sample of them.
    let pieces: Vec<usize> = streamed
        .iter()
        .filter_map(|r| Some((r.start.checked_next_multiple_of(HUGE_PAGE)?, r.end)))
        .flat_map(|(start, end)| {
            (start..end)
                .step_by(HUGE_PAGE)
                .take_while(move |o| o.checked_add(HUGE_PAGE).is_some_and(|e| e <= end))
        })
        .collect();
    let step = pieces.len().div_ceil(HUGE_PROBES).max(1);
    let probes: Vec<usize> = pieces.iter().copied().step_by(step).collect();
    // The probed pieces that come in small folios.
    let mut small = Vec::new();
    for &o in &probes {
        match file.huge_mapped_pieces(&[o]).map_err(gguf)? {
            None => return Ok((false, None)),
            Some(0) => small.push(o),
            Some(_) => {}
        }
    }
    let Some(&trial) = small.first() else {
        return Ok((!probes.is_empty(), None));
    };
    // Mostly huge already: the faults read ahead well enough without MADV_WILLNEED.
    let mostly = small.len().saturating_mul(4) <= probes.len();
    file.drop_cached(trial..trial + HUGE_PAGE).map_err(gguf)?;
    if file.huge_mapped_pieces(&[trial]).map_err(gguf)? != Some(1) {
        // Pages another map holds, or a system that cannot: leave the cache as it is.
        return Ok((mostly, None));
    }
    file.drop_cached(0..file.as_bytes().len()).map_err(gguf)?;
    Ok((
        true,
        Some(
            "the page cache held (part of) the file in small pages; dropped them so that the \
             window reads the file back in 2 MiB pages (one read from storage, faster streaming \
             after)"
                .into(),
        ),
    ))
}

/// Bytes of the forward pass's buffers for a batch of `n` tokens (activations, int8 codes,
/// the logits of one row, attention scores per thread).
fn scratch_bytes(c: &Config, n: usize, n_ctx: usize, threads: usize) -> u64 {
    let n_embd_kv = c.n_head_kv * c.head_dim;
    let per_row = 4 * (7 * c.n_embd + 2 * n_embd_kv + 4 * c.n_ff) + c.n_ff.max(c.n_embd);
    let logits = 4 * c.n_vocab;
    // Attention: per thread, scores for a block of query rows over the positions.
    let attn = threads * 4 * 16 * n_ctx.clamp(64, 4096);
    u64_of(n * per_row + logits + attn + n * 4 * c.n_embd)
}

/// Fits the model into `req.bytes`: the weight window, a head chunk, the KV cache of the
/// requested (or largest fitting) context, the forward pass's buffers and what the process
/// already holds (`runtime_bytes`: code, tokenizer). Lowers the KV type to q8_0 unless it was
/// chosen explicitly, then the window (2 → 1 blocks: no read-ahead), then the KV type to q4_0
/// (coarser: it costs more quality than the read-ahead costs speed), then the context unless
/// it was given; never silently below what was asked for.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    model: &Model<'_>,
    layers: &[Range<usize>],
    req: &BudgetRequest,
    kv_type: KvType,
    numerics: Numerics,
    threads: usize,
    runtime_bytes: u64,
) -> Result<MemoryPlan> {
    let c = &model.config;
    let default_ctx = c.n_ctx_train.min(4096);
    let n_ctx_want = req.n_ctx.unwrap_or(default_ctx).max(1);
    let n_batch = match numerics {
        Numerics::Exact => 512,
        Numerics::Fast => BUDGET_BATCH,
    };
    let mut spans: Vec<u64> = layers.iter().map(|r| u64_of(r.len())).collect();
    spans.sort_unstable_by(|a, b| b.cmp(a));
    let window = |k: usize| spans.iter().take(k).sum::<u64>();
    let head = model.lm_head();
    let head_chunk = u64_of(HEAD_CHUNK_BYTES.min(head.nbytes()));
    let scratch = scratch_bytes(c, n_batch, n_ctx_want, threads);
    let fixed = |w: usize| {
        runtime_bytes + req.reserve_bytes + window(w) + head_chunk + scratch + OTHER_BYTES
    };

    let mut kv_types = vec![kv_type];
    if !req.kv_type_explicit
        && kv_type == KvType::F16
        && numerics == Numerics::Fast
        && c.head_dim.is_multiple_of(32)
    {
        kv_types.extend([KvType::Q8_0, KvType::Q4_0]);
    }
    // (window, KV type) in order of preference: every type but a lowered q4_0 with two blocks,
    // then with one; a lowered q4_0 only after that.
    let lowered_q4 = |t: KvType| t == KvType::Q4_0 && t != kv_type;
    let (last, first): (Vec<KvType>, Vec<KvType>) = kv_types.iter().partition(|&&t| lowered_q4(t));
    let tries: Vec<(usize, KvType)> = [&first, &last]
        .into_iter()
        .flat_map(|ts| {
            [2usize, 1]
                .into_iter()
                .flat_map(move |w| ts.iter().map(move |&t| (w, t)))
        })
        .collect();
    let kv_bytes = |n: usize, t: KvType| c.kv_cache_bytes(n, t).map_err(EngineError::from);
    let mut notes = Vec::new();
    // In order: the KV type and window as above, then (when not given) the context.
    let mut chosen = None;
    for &(w, t) in &tries {
        if fixed(w) + kv_bytes(n_ctx_want, t)? <= req.bytes {
            chosen = Some((w, t, n_ctx_want));
            break;
        }
    }
    if chosen.is_none() && req.n_ctx.is_none() {
        // The largest context that fits beside one block, with the smallest KV type allowed,
        // in whole multiples of 256 positions (at least 256).
        let t = *kv_types.last().unwrap_or(&kv_type);
        let per_pos = kv_bytes(1, t)?.max(1);
        let room = req.bytes.saturating_sub(fixed(1));
        let fits = usize::try_from(room / per_pos)
            .unwrap_or(usize::MAX)
            .min(n_ctx_want)
            / 256
            * 256;
        if fits >= 256 {
            chosen = Some((1, t, fits));
        }
    }
    let Some((w, t, n_ctx)) = chosen else {
        let t = *kv_types.last().unwrap_or(&kv_type);
        let needed = fixed(1) + kv_bytes(req.n_ctx.unwrap_or(256), t)?;
        let what = match req.n_ctx {
            Some(n) => {
                let per_pos = kv_bytes(1, t)?.max(1);
                let fits = req.bytes.saturating_sub(fixed(1)) / per_pos;
                format!(
                    "-c {n} with a {} KV cache needs {} in all, {} more than the budget; {}",
                    t.name(),
                    mib(needed),
                    mib(needed.saturating_sub(req.bytes)),
                    if fits > 0 {
                        format!("-c {fits} would fit")
                    } else {
                        "no context fits".into()
                    }
                )
            }
            None => format!(
                "the smallest plan (one block of weights, a 256-position {} KV cache) needs {}",
                t.name(),
                mib(needed)
            ),
        };
        return Err(EngineError::BudgetTooSmall {
            budget: req.bytes,
            needed,
            detail: what,
        });
    };
    if t != kv_type {
        notes.push(format!(
            "KV cache lowered from {} to {} to fit (choose it with --kv-cache)",
            kv_type.name(),
            t.name()
        ));
    }
    if n_ctx < n_ctx_want {
        notes.push(format!(
            "context lowered from {n_ctx_want} to {n_ctx} positions to fit (choose it with -c)"
        ));
    }
    if w == 1 {
        notes.push("one block of weights resident at a time (no read-ahead)".into());
    }
    // Room left: keep the first blocks resident, then the start of the head.
    let used = fixed(w) + kv_bytes(n_ctx, t)?;
    let mut spare = req.bytes.saturating_sub(used);
    let mut pinned_layers = 0;
    for r in layers {
        let b = u64_of(r.len());
        if b > spare {
            break;
        }
        spare -= b;
        pinned_layers += 1;
    }
    let pinned_head_bytes = if pinned_layers == layers.len() {
        spare.min(u64_of(head.nbytes()))
    } else {
        0
    };
    let mut items = vec![
        PlanItem {
            what: "runtime (code, tokenizer; measured)".into(),
            bytes: runtime_bytes,
        },
        PlanItem {
            what: format!("weights: {w} of {} blocks", layers.len()),
            bytes: window(w),
        },
        PlanItem {
            what: format!("LM head chunk (of {})", mib(u64_of(head.nbytes()))),
            bytes: head_chunk,
        },
        PlanItem {
            what: format!("KV cache: {n_ctx} positions, {}", t.name()),
            bytes: kv_bytes(n_ctx, t)?,
        },
        PlanItem {
            what: format!("activations (batches of {n_batch}) and logits"),
            bytes: scratch,
        },
        PlanItem {
            what: "other (allocator, stacks)".into(),
            bytes: OTHER_BYTES,
        },
    ];
    if req.reserve_bytes > 0 {
        items.push(PlanItem {
            what: "reserved (server threads and requests)".into(),
            bytes: req.reserve_bytes,
        });
    }
    if pinned_layers > 0 {
        let pinned: u64 = layers
            .iter()
            .take(pinned_layers)
            .map(|r| u64_of(r.len()))
            .sum();
        items.push(PlanItem {
            what: format!("kept resident: {pinned_layers} more blocks"),
            bytes: pinned,
        });
    }
    if pinned_head_bytes > 0 {
        items.push(PlanItem {
            what: "kept resident: part of the LM head".into(),
            bytes: pinned_head_bytes,
        });
    }
    Ok(MemoryPlan {
        budget: req.bytes,
        n_ctx,
        kv_type: t,
        n_batch,
        window_layers: w,
        pinned_layers,
        pinned_head_bytes,
        items,
        notes,
    })
}

/// The low-memory backend: the CPU kernels over weights streamed through a window of
/// blocks (see the module docs).
#[derive(Debug)]
pub(crate) struct LayerStreamer {
    pub(crate) pool: Arc<Pool>,
    pub(crate) file: Arc<GgufFile>,
    pub(crate) layers: Vec<Range<usize>>,
    /// Read block `il + 1` ahead while `il` computes.
    pub(crate) read_ahead: bool,
    /// The mapped file comes in huge pages ([`prefer_huge_pages`]): no `MADV_WILLNEED`.
    pub(crate) huge_pages: bool,
    /// Blocks `0..pinned_layers` are never released.
    pub(crate) pinned_layers: usize,
    /// File bytes never released (the start of the LM head).
    pub(crate) pinned: Range<usize>,
    /// The pread reader; `None`: the mmap window.
    pub(crate) io: Option<PreadIo>,
}

impl LayerStreamer {
    fn bytes(&self, r: &Range<usize>) -> &[u8] {
        self.file.as_bytes().get(r.clone()).unwrap_or_default()
    }

    fn release(&self, bytes: &[u8]) -> bitnet_model::Result<()> {
        // Only what lies wholly outside the pinned range (a chunk straddling its end keeps
        // its pinned part).
        let bytes = match self.file.range_of(bytes) {
            Some(r) if r.start < self.pinned.end && r.end > self.pinned.start => {
                if r.end <= self.pinned.end {
                    return Ok(());
                }
                &self.file.as_bytes()[self.pinned.end.max(r.start)..r.end]
            }
            _ => bytes,
        };
        match self.file.release(bytes) {
            Ok(_) | Err(bitnet_gguf::GgufError::NotInFile { .. }) => Ok(()),
            Err(e) => Err(ModelError::from(e)),
        }
    }

    fn will_need(&self, bytes: &[u8]) -> bitnet_model::Result<()> {
        if self.huge_pages {
            // Faults read ahead in huge pages; MADV_WILLNEED would read in 4 KiB folios.
            return Ok(());
        }
        match self.file.will_need(bytes) {
            Ok(_) | Err(bitnet_gguf::GgufError::NotInFile { .. }) => Ok(()),
            Err(e) => Err(ModelError::from(e)),
        }
    }
}

impl Backend for LayerStreamer {
    fn name(&self) -> &'static str {
        "cpu (streamed)"
    }

    fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    fn row_pool(&self) -> Option<&Pool> {
        Some(&self.pool)
    }

    fn begin_layer(&self, il: usize) -> bitnet_model::Result<()> {
        let n = self.layers.len();
        if n == 0 {
            return Ok(());
        }
        // Drop the block before this one (the last block when starting over), unless it is
        // the next one as well (two blocks in all).
        let prev = (il + n - 1) % n;
        let next = (il + 1) % n;
        if let Some(io) = &self.io {
            // Pinned blocks are read where they are mapped.
            let range = (il >= self.pinned_layers).then(|| self.layers[il].clone());
            let ahead = self.read_ahead && next != il && next >= self.pinned_layers;
            let next = ahead.then(|| (next, self.layers[next].clone()));
            return io.enter_block(il, range, next);
        }
        if prev != il && prev != next && prev >= self.pinned_layers {
            self.release(self.bytes(&self.layers[prev]))?;
        }
        if self.read_ahead && next != il {
            self.will_need(self.bytes(&self.layers[next]))?;
        }
        Ok(())
    }

    fn embedding_row(
        &self,
        embd: &RowMatrix<'_>,
        r: usize,
        out: &mut [f32],
    ) -> bitnet_model::Result<()> {
        let rb = embd.row_type().row_bytes(embd.cols())?;
        let start = r.saturating_mul(rb);
        let row = embd.data().get(start..start.saturating_add(rb));
        if let (Some(_), Some(_), Some(at)) = (&self.io, row, self.file.range_of(embd.data())) {
            // Just this row, copied: the map's page stays out of the process.
            let mut bytes = vec![0u8; rb];
            self.file.read_at(at.start + start, &mut bytes)?;
            let one = RowMatrix::new(
                embd.row_type(),
                1,
                embd.cols(),
                std::borrow::Cow::Borrowed(&bytes[..]),
            )?;
            one.dequantize_row(0, out)?;
            return Ok(());
        }
        embd.dequantize_row(r, out)?;
        if let Some(row) = row {
            self.release(row)?;
        }
        Ok(())
    }

    fn ternary_matmul(
        &self,
        w: &TernaryMatrix<'_>,
        xq: &[i8],
        scales: &[f32],
        out: &mut [f32],
    ) -> bitnet_model::Result<()> {
        if let Some(io) = &self.io {
            let held = io.block()?;
            if let (Some((il, buf)), Some(at)) = (&*held, self.file.range_of(w.packed_data())) {
                let block = &self.layers[*il];
                if at.start >= block.start && at.end <= block.end {
                    let copy = buf
                        .get(at.start - block.start..at.end - block.start)
                        .ok_or_else(|| {
                            ModelError::Backend("a block buffer shorter than its block".into())
                        })?;
                    return self
                        .pool
                        .ternary_matmul(&w.with_packed(copy)?, xq, scales, out);
                }
            }
        }
        self.pool.ternary_matmul(w, xq, scales, out)
    }

    fn lm_head(
        &self,
        head: &RowMatrix<'_>,
        hn: &[f32],
        rows: usize,
        numerics: Numerics,
        out: &mut [f32],
    ) -> bitnet_model::Result<()> {
        let n_vocab = head.rows();
        let rb = head.row_type().row_bytes(head.cols())?;
        // The pread reader holds two chunks at a time (one computing, one being read): half
        // the size each, so that together they take the plan's one chunk.
        let chunk_bytes = if self.io.is_some() {
            HEAD_CHUNK_BYTES / 2
        } else {
            HEAD_CHUNK_BYTES
        };
        let chunk = (chunk_bytes / rb.max(1)).clamp(1, n_vocab.max(1));
        let head_at = self.file.range_of(head.data());
        // The file range of rows r0..r1, when the pread reader should read them (not pinned).
        let to_read = |r0: usize, r1: usize| {
            let at = head_at.as_ref()?;
            let range = at.start + r0 * rb..at.start + r1 * rb;
            (self.io.is_some() && range.end > self.pinned.end).then_some(range)
        };
        let mut tmp = vec![0.0f32; rows * chunk];
        let mut r0 = 0;
        while r0 < n_vocab {
            let r1 = (r0 + chunk).min(n_vocab);
            let bytes = head.data().get(r0 * rb..r1 * rb).ok_or(ModelError::Kernel(
                bitnet_kernels::KernelError::ShapeMismatch {
                    what: "LM head chunk",
                    expected: r1 * rb,
                    got: head.data().len(),
                },
            ))?;
            let r2 = (r1 + chunk).min(n_vocab);
            let copy = match (&self.io, to_read(r0, r1)) {
                (Some(io), Some(range)) => {
                    let buf = io.take(Key::Head(r0), range)?;
                    if let Some(next) = to_read(r1, r2).filter(|_| r1 < r2) {
                        io.request(Key::Head(r1), next)?;
                    }
                    Some(buf)
                }
                _ => {
                    if let Some(next) = head.data().get(r1 * rb..r2 * rb) {
                        self.will_need(next)?;
                    }
                    None
                }
            };
            let sub = RowMatrix::new(
                head.row_type(),
                r1 - r0,
                head.cols(),
                std::borrow::Cow::Borrowed(copy.as_deref().unwrap_or(bytes)),
            )?;
            let t = &mut tmp[..rows * (r1 - r0)];
            self.pool.lm_head(&sub, hn, rows, numerics, t)?;
            for (dst, src) in out.chunks_exact_mut(n_vocab).zip(t.chunks_exact(r1 - r0)) {
                dst[r0..r1].copy_from_slice(src);
            }
            match (&self.io, copy) {
                (Some(io), Some(buf)) => io.recycle(Key::Head(r0), buf)?,
                _ => self.release(bytes)?,
            }
            r0 = r1;
        }
        Ok(())
    }

    fn lm_head_rows(
        &self,
        head: &RowMatrix<'_>,
        ids: &[u32],
        h: &[f32],
        out: &mut [f32],
    ) -> bitnet_model::Result<()> {
        let Some(at) = self.file.range_of(head.data()) else {
            return self.pool.lm_head_rows(head, ids, h, out);
        };
        // The rows copied from the file (runs of consecutive ids in one read), so the mapped
        // head's pages stay out of the process; in pieces of at most half the plan's head
        // chunk.
        let rb = head.row_type().row_bytes(head.cols())?;
        let per = (HEAD_CHUNK_BYTES / 2 / rb.max(1)).max(1);
        let mut bytes = vec![0u8; per.min(ids.len()).saturating_mul(rb)];
        for (piece, o) in ids.chunks(per).zip(out.chunks_mut(per)) {
            let mut i = 0;
            while i < piece.len() {
                let mut j = i + 1;
                while j < piece.len() && piece[j] == piece[j - 1].wrapping_add(1) {
                    j += 1;
                }
                let r = piece[i] as usize;
                if r.saturating_add(j - i) > head.rows() {
                    return Err(ModelError::Kernel(
                        bitnet_kernels::KernelError::RowOutOfRange {
                            row: r.saturating_add(j - i - 1),
                            rows: head.rows(),
                        },
                    ));
                }
                self.file
                    .read_at(at.start + r * rb, &mut bytes[i * rb..j * rb])?;
                i = j;
            }
            let rows = RowMatrix::new(
                head.row_type(),
                piece.len(),
                head.cols(),
                std::borrow::Cow::Borrowed(&bytes[..piece.len() * rb]),
            )?;
            // Every row of the copy, one token: the values `lm_head_rows` gives for them.
            self.pool.lm_head(&rows, h, 1, Numerics::Fast, o)?;
        }
        Ok(())
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
    ) -> bitnet_model::Result<()> {
        self.pool.attention(c, q, cache, il, pos0, n, numerics, out)
    }
}
