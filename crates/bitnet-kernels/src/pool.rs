//! A purpose-built thread pool for row-partitioned kernels.
//!
//! Why not rayon: a decode step runs ~7 matvecs per layer of 20–60 µs each; the pool's
//! dispatch cost must be well under a microsecond. Workers spin briefly on an epoch counter
//! after each job (so back-to-back matvecs start without a syscall), then park. The caller
//! runs part 0 itself. `benches/matvec.rs` measures this pool against rayon on the 2B-4T
//! shapes.
//!
//! Work split: `n` rows are cut into `ceil(n / grain)` units of `grain` rows (the last one
//! ragged), and thread `i` of `p` gets units `[i·u/p, (i+1)·u/p)` — contiguous, balanced to
//! within one unit, covering `0..n` exactly once for any `n` (e.g. 640 rows on 2 threads).
//!
//! Unsafe: the job closure is borrowed for the duration of [`Pool::for_rows`] only; its
//! lifetime is erased to hand it to the workers, which is sound because `for_rows` does not
//! return (or unwind) before every worker has finished with it.

use std::cell::{Cell, UnsafeCell};
use std::ops::Range;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(300);

type JobFn = dyn Fn(Range<usize>) + Sync;

#[derive(Clone, Copy)]
struct Job {
    f: *const JobFn,
    n: usize,
    grain: usize,
    parts: usize,
}

struct Shared {
    /// Incremented (Release) after `job` is written; workers read `job` after seeing it (Acquire).
    epoch: AtomicU64,
    /// Written only by the thread holding `Pool::lock`, while no worker runs a job.
    job: UnsafeCell<Option<Job>>,
    /// Workers that have not finished the current job.
    remaining: AtomicUsize,
    /// The panic payload of a worker's closure during the current job.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    shutdown: AtomicBool,
}

// SAFETY: `job` is only written while no worker reads it (see the field comments); the raw
// closure pointer it holds points to a `Sync` closure.
unsafe impl Sync for Shared {}
// SAFETY: as above; the pointer is only dereferenced while the closure is alive.
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

/// Rows `[a, b)` of part `i` of `parts` (see the module doc).
pub fn part_range(n: usize, grain: usize, parts: usize, i: usize) -> Range<usize> {
    let grain = grain.max(1);
    let units = n.div_ceil(grain);
    let u0 = i * units / parts;
    let u1 = (i + 1) * units / parts;
    (u0 * grain).min(n)..(u1 * grain).min(n)
}

impl Pool {
    /// A pool of `n_threads` threads in total (the caller counts as one; 0 is treated as 1).
    /// If the OS refuses to start a thread, the pool uses the ones it has.
    pub fn new(n_threads: usize) -> Self {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            remaining: AtomicUsize::new(0),
            panic: Mutex::new(None),
            shutdown: AtomicBool::new(false),
        });
        let mut workers = Vec::new();
        for i in 1..n_threads.max(1) {
            let sh = Arc::clone(&shared);
            let spawned = thread::Builder::new()
                .name(format!("bitnet-pool-{i}"))
                .spawn(move || worker_loop(&sh, i));
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
    /// except the last), one range per thread, and block until all are done. A panic in `f`
    /// is re-raised here after every thread has stopped using `f`.
    pub fn for_rows(&self, n: usize, grain: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
        if n == 0 {
            return;
        }
        let units = n.div_ceil(grain.max(1));
        let parts = self.n_threads.min(units);
        if parts <= 1 || IN_JOB.with(Cell::get) {
            f(0..n);
            return;
        }
        // A poisoned lock only means an earlier job panicked; the pool state is still valid
        // (every job waits for all workers before returning or unwinding).
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: erasing the closure's lifetime; it is dereferenced only by workers running
        // this job, and we wait below until `remaining == 0` before returning or unwinding.
        let f_static: *const JobFn =
            unsafe { std::mem::transmute::<&(dyn Fn(Range<usize>) + Sync), &'static JobFn>(f) };
        let job = Job {
            f: f_static,
            n,
            grain,
            parts,
        };
        let sh = &*self.shared;
        // SAFETY: we hold the lock and the previous job has completed (remaining == 0), so no
        // worker reads `job` now.
        unsafe { *sh.job.get() = Some(job) };
        sh.remaining.store(self.workers.len(), Ordering::Relaxed);
        sh.epoch.fetch_add(1, Ordering::Release);
        for (t, _) in &self.workers {
            t.unpark();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| {
            IN_JOB.with(|c| c.set(true));
            f(part_range(n, grain, parts, 0));
            IN_JOB.with(|c| c.set(false));
        }));
        IN_JOB.with(|c| c.set(false));
        let mut spins = 0u32;
        while sh.remaining.load(Ordering::Acquire) != 0 {
            spins = spins.wrapping_add(1);
            if spins < 1 << 16 {
                std::hint::spin_loop();
            } else {
                thread::yield_now();
            }
        }
        // SAFETY: every worker is done with the job.
        unsafe { *sh.job.get() = None };
        if let Err(p) = mine {
            resume_unwind(p);
        }
        let worker_panic = sh.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = worker_panic {
            // Re-raise a worker's panic on the calling thread.
            resume_unwind(p);
        }
    }
}

fn worker_loop(sh: &Shared, index: usize) {
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
            if !spins.is_multiple_of(1024) || start.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                // Spurious wake-ups are fine: the loop re-checks the epoch.
                thread::park_timeout(Duration::from_millis(50));
            }
        }
        // SAFETY: the epoch load (Acquire) happens after the caller wrote `job` (Release).
        let job = unsafe { *sh.job.get() };
        if let Some(job) = job {
            if index < job.parts {
                let r = part_range(job.n, job.grain, job.parts, index);
                IN_JOB.with(|c| c.set(true));
                // SAFETY: the caller keeps the closure alive until `remaining` reaches 0,
                // which happens only after this call returns.
                let res = catch_unwind(AssertUnwindSafe(|| unsafe { (*job.f)(r) }));
                IN_JOB.with(|c| c.set(false));
                if let Err(p) = res {
                    *sh.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
                }
            }
        }
        sh.remaining.fetch_sub(1, Ordering::Release);
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
