//! A purpose-built thread pool for row-partitioned kernels.
//!
//! Why not rayon: a decode step runs ~7 matvecs per layer of 20–100 µs each; the pool's
//! dispatch cost must be a small fraction of that. Workers spin briefly on an epoch counter
//! after each job (so back-to-back matvecs start without a wake-up syscall), then park; the
//! caller works too. `benches/matvec.rs` measures this pool against rayon on the 2B-4T shapes.
//!
//! Work split: `n` rows are cut into `ceil(n / grain)` units of `grain` rows (the last one
//! ragged), grouped into `min(units, CHUNKS_PER_THREAD · threads)` contiguous chunks by
//! [`part_range`] (balanced to within one unit, covering `0..n` exactly once for any `n`,
//! e.g. 640 rows on 2 threads). Threads claim chunks from an atomic counter, so a worker
//! the OS has not scheduled yet (2-core machines are often oversubscribed) simply gets no
//! chunk instead of stalling the caller.
//!
//! Protocol (all in `for_rows` / `worker_loop`): the caller writes the job slot, opens the
//! job (`open = true`, SeqCst) and bumps the epoch; a woken worker increments `active`, then
//! reads `open` (both SeqCst) and only if it is open reads the job slot and claims chunks.
//! When no chunk is left the caller closes the job and waits for `active == 0`. A worker that
//! checks in after the close sees `open == false` and never touches the job, so the caller
//! waits only for workers that are running a chunk.
//!
//! Unsafe: the job closure is borrowed for the duration of [`Pool::for_rows`] only; its
//! lifetime is erased to hand it to the workers, which is sound because `for_rows` does not
//! return (or unwind) before every worker that saw the job open has finished with it.

use std::cell::{Cell, UnsafeCell};
use std::ops::Range;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use crate::KernelError;

/// How long an idle worker spins before parking (covers the gap between consecutive
/// matvecs of a decode step without a wake-up syscall).
const SPIN: Duration = Duration::from_micros(100);
/// Spin iterations of the caller waiting for workers before it parks (a few µs): on an
/// oversubscribed machine a spinning caller can keep the worker it waits for off the CPU.
const CALLER_SPINS: u32 = 2000;
/// Chunks per thread: enough to rebalance when a thread starts late, few enough that each
/// chunk is a long contiguous stream of weight rows.
pub const CHUNKS_PER_THREAD: usize = 4;

type JobFn = dyn Fn(Range<usize>) + Sync;

#[derive(Clone, Copy)]
struct Job {
    f: *const JobFn,
    /// The calling thread, unparked by the last worker to leave.
    caller: *const Thread,
    n: usize,
    grain: usize,
    chunks: usize,
}

struct Shared {
    /// Bumped after a job is opened; workers wake on a change.
    epoch: AtomicU64,
    /// Written only by the lock holder while `open == false`; read by workers only after they
    /// incremented `active` and then saw `open == true`.
    job: UnsafeCell<Option<Job>>,
    /// The current job accepts workers.
    open: AtomicBool,
    /// Workers that checked in and have not left.
    active: AtomicUsize,
    /// Next chunk index to claim.
    next: AtomicUsize,
    /// The panic payload of a closure run by a worker during the current job.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    shutdown: AtomicBool,
}

// SAFETY: `job` is accessed under the protocol in the module doc (no write while a reader may
// hold it); the raw pointers it holds point to a `Sync` closure and a `Thread` that outlive
// every access.
unsafe impl Sync for Shared {}
// SAFETY: as above.
unsafe impl Send for Shared {}

thread_local! {
    /// True inside a pool job: nested `for_rows` calls run inline instead of deadlocking.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

/// A fixed set of threads for the whole run; `for_rows` splits row ranges over them.
pub struct Pool {
    n_threads: usize,
    shared: Arc<Shared>,
    workers: Vec<(Thread, JoinHandle<()>)>,
    lock: Mutex<()>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("n_threads", &self.n_threads)
            .finish()
    }
}

/// Rows of part `i` of `parts` (see the module doc): contiguous, multiples of `grain` except
/// the last row of `0..n`, together covering `0..n` exactly once.
pub fn part_range(n: usize, grain: usize, parts: usize, i: usize) -> Range<usize> {
    let grain = grain.max(1);
    let parts = parts.max(1);
    let units = n.div_ceil(grain);
    let u0 = i * units / parts;
    let u1 = (i + 1) * units / parts;
    (u0 * grain).min(n)..(u1 * grain).min(n)
}

/// Run `f` on chunks claimed from `next` until none is left; returns a panic payload if `f`
/// panicked (the remaining chunks are still claimed, so the job drains).
fn run_chunks(
    f: &(dyn Fn(Range<usize>) + Sync + '_),
    next: &AtomicUsize,
    n: usize,
    grain: usize,
    chunks: usize,
) -> Option<Box<dyn std::any::Any + Send>> {
    let mut panic = None;
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= chunks {
            return panic;
        }
        if panic.is_none() {
            let r = part_range(n, grain, chunks, i);
            IN_JOB.with(|c| c.set(true));
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(r))) {
                panic = Some(p);
            }
            IN_JOB.with(|c| c.set(false));
        }
    }
}

impl Pool {
    /// A pool of `n_threads` threads in total (the caller counts as one; 0 is treated as 1).
    /// If the OS refuses to start a thread, the pool uses the ones it has.
    pub fn new(n_threads: usize) -> Self {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            open: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            panic: Mutex::new(None),
            shutdown: AtomicBool::new(false),
        });
        let mut workers = Vec::new();
        for i in 1..n_threads.max(1) {
            let sh = Arc::clone(&shared);
            let spawned = thread::Builder::new()
                .name(format!("bitnet-pool-{i}"))
                .spawn(move || worker_loop(&sh));
            match spawned {
                Ok(h) => workers.push((h.thread().clone(), h)),
                Err(_) => break,
            }
        }
        Pool {
            n_threads: workers.len() + 1,
            shared,
            workers,
            lock: Mutex::new(()),
        }
    }

    /// A pool with one thread per available CPU.
    pub fn with_available_parallelism() -> Self {
        Pool::new(thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// Total threads (including the caller).
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Run `f` over disjoint row ranges covering `0..n` (each a multiple of `grain` rows
    /// except the one ending at `n`) on all threads, and block until all are done. A panic
    /// in `f` is re-raised here after every thread has stopped using `f`.
    pub fn for_rows(&self, n: usize, grain: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
        if n == 0 {
            return;
        }
        let grain = grain.max(1);
        let units = n.div_ceil(grain);
        let chunks = units.min(self.n_threads * CHUNKS_PER_THREAD);
        if self.workers.is_empty() || chunks <= 1 || IN_JOB.with(Cell::get) {
            f(0..n);
            return;
        }
        // A poisoned lock only means an earlier job panicked; the pool state is still valid
        // (every job drains before `for_rows` returns or unwinds).
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: erasing the closure's lifetime; workers dereference it only while checked
        // in (`active > 0`) to an open job, and we wait for `active == 0` after closing it.
        let f_static: *const JobFn =
            unsafe { std::mem::transmute::<&(dyn Fn(Range<usize>) + Sync), &'static JobFn>(f) };
        let caller = thread::current();
        let sh = &*self.shared;
        // SAFETY: we hold the lock and the job is closed, so no worker reads the slot.
        unsafe {
            *sh.job.get() = Some(Job {
                f: f_static,
                caller: &caller,
                n,
                grain,
                chunks,
            })
        };
        sh.next.store(0, Ordering::Relaxed);
        sh.open.store(true, Ordering::SeqCst);
        sh.epoch.fetch_add(1, Ordering::Release);
        for (t, _) in &self.workers {
            t.unpark();
        }
        let mine = run_chunks(f, &sh.next, n, grain, chunks);
        sh.open.store(false, Ordering::SeqCst);
        let mut spins = 0u32;
        while sh.active.load(Ordering::SeqCst) != 0 {
            if spins < CALLER_SPINS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                // The last worker to leave unparks us; a stale token or timeout re-checks.
                thread::park_timeout(Duration::from_millis(10));
            }
        }
        if let Some(p) = mine {
            resume_unwind(p);
        }
        let worker_panic = sh.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = worker_panic {
            // Re-raise a worker's panic on the calling thread.
            resume_unwind(p);
        }
    }
}

fn worker_loop(sh: &Shared) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let e = sh.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            if sh.shutdown.load(Ordering::Acquire) {
                return;
            }
            spins = spins.wrapping_add(1);
            if spins < 256 {
                std::hint::spin_loop();
            } else if start.elapsed() < SPIN {
                // Stay responsive but let a thread sharing this core run (on an
                // oversubscribed machine that is often our own caller).
                thread::yield_now();
            } else {
                // Spurious wake-ups are fine: the loop re-checks the epoch.
                thread::park_timeout(Duration::from_millis(50));
            }
        }
        sh.active.fetch_add(1, Ordering::SeqCst);
        let mut caller = None;
        if sh.open.load(Ordering::SeqCst) {
            // SAFETY: the job is open and we are checked in, so the slot is initialised and
            // the caller neither rewrites it nor returns until we leave.
            let job = unsafe { *sh.job.get() };
            if let Some(job) = job {
                // SAFETY: as above; cloned now so the unpark after leaving does not touch
                // the caller's stack.
                caller = Some(unsafe { (*job.caller).clone() });
                // SAFETY: the closure outlives our check-in (see the module doc).
                let f = unsafe { &*job.f };
                if let Some(p) = run_chunks(f, &sh.next, job.n, job.grain, job.chunks) {
                    *sh.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
                }
            }
        }
        if sh.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            if let Some(c) = caller {
                c.unpark();
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for (t, h) in self.workers.drain(..) {
            t.unpark();
            let _ = h.join();
        }
    }
}

/// A row-wise job over two slices: `f(rows, a_rows, b_rows)` (see [`Pool::for_rows_mut2`]).
pub type RowsJob2<'f, A, B> = dyn Fn(Range<usize>, &mut [A], &mut [B]) + Sync + 'f;

impl Pool {
    /// Run `f(rows, a_rows, b_rows)` over disjoint row ranges covering every row on all
    /// threads (as [`Pool::for_rows`]), where row `i` of `a` is `a[i·wa..(i+1)·wa]` and of `b`
    /// is `b[i·wb..(i+1)·wb]`: `a_rows` and `b_rows` hold exactly the rows of `rows`. There
    /// are `a.len() / wa` rows (`wa ≥ 1`); `b` needs `wb` elements for each (`wb` may be 0).
    /// For steps that compute each row on its own (norms, quantization, element-wise
    /// products): the result does not depend on the thread count.
    ///
    /// # Errors
    /// [`KernelError::ShapeMismatch`] when `wa` is 0, `a` is not whole rows, or `b` is not
    /// exactly `wb` elements per row.
    pub fn for_rows_mut2<A: Send, B: Send>(
        &self,
        a: &mut [A],
        wa: usize,
        b: &mut [B],
        wb: usize,
        grain: usize,
        f: &RowsJob2<'_, A, B>,
    ) -> Result<(), KernelError> {
        let mismatch = |what, expected, got| {
            Err(KernelError::ShapeMismatch {
                what,
                expected,
                got,
            })
        };
        if wa == 0 {
            return mismatch("row width", 1, 0);
        }
        let n = a.len() / wa;
        if n * wa != a.len() {
            return mismatch(
                "rows of the first slice",
                (n + 1).saturating_mul(wa),
                a.len(),
            );
        }
        let want_b = n.checked_mul(wb).ok_or(KernelError::Overflow {
            what: "row-wise job",
        })?;
        if b.len() != want_b {
            return mismatch("rows of the second slice", want_b, b.len());
        }
        let (sa, sb) = (SharedMut::new(a), SharedMut::new(b));
        self.for_rows(n, grain, &|r: Range<usize>| {
            // SAFETY: `for_rows` hands out disjoint ranges within 0..n, so these element
            // ranges are disjoint and within both slices (checked above); the slices stay
            // borrowed mutably by this call until every range is done.
            let (ra, rb) = unsafe {
                (
                    sa.slice_mut(r.start * wa..r.end * wa),
                    sb.slice_mut(r.start * wb..r.end * wb),
                )
            };
            f(r, ra, rb);
        });
        Ok(())
    }
}

/// Shared mutable access to a slice for writes to disjoint indices from pool threads.
pub(crate) struct SharedMut<T> {
    ptr: *mut T,
    len: usize,
}
// SAFETY: used only for disjoint writes while the owning `&mut [T]` is borrowed for the call.
unsafe impl<T: Send> Sync for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub(crate) fn new(s: &mut [T]) -> Self {
        SharedMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }

    /// # Safety
    /// `i < len`, the slice outlives the use, and no other thread accesses index `i`.
    #[inline]
    pub(crate) unsafe fn write(&self, i: usize, v: T) {
        debug_assert!(i < self.len);
        // SAFETY: guaranteed by the caller.
        unsafe { *self.ptr.add(i) = v };
    }

    /// # Safety
    /// `r` is within `0..len`, the slice outlives the use, and no other thread accesses `r`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, r: Range<usize>) -> &mut [T] {
        debug_assert!(r.start <= r.end && r.end <= self.len);
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.end - r.start) }
    }
}
