//! The low-memory mode's reader: weights copied with `pread` into reusable buffers by an I/O
//! thread, so that the mapped file's pages never join the process (no page faults, no
//! `MADV_DONTNEED` per block). While block `il` computes, block `il + 1` is being read into the
//! second buffer; the LM head streams through two chunk buffers the same way.

use std::ops::Range;
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use bitnet_gguf::{GgufError, GgufFile};
use bitnet_model::ModelError;

/// What a buffer holds: a block's weights, or the LM-head chunk starting at a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Key {
    Layer(usize),
    Head(usize),
}

impl Key {
    fn is_layer(self) -> bool {
        matches!(self, Key::Layer(_))
    }
}

/// A read for the I/O thread: `buf.len()` bytes of the file from byte `at`.
struct Job {
    key: Key,
    at: usize,
    buf: Vec<u8>,
}

/// A finished read.
struct Done {
    key: Key,
    buf: Vec<u8>,
    res: std::result::Result<(), GgufError>,
}

#[derive(Debug, Default)]
struct State {
    /// Reads handed to the I/O thread and not yet received.
    inflight: Vec<Key>,
    /// Reads received before they were asked for (at most a couple).
    ready: Vec<(Key, Vec<u8>)>,
    /// Buffers to reuse, per kind (blocks and head chunks differ in size).
    spare_layer: Vec<Vec<u8>>,
    spare_head: Vec<Vec<u8>>,
}

/// The I/O thread and its buffers.
#[derive(Debug)]
pub(crate) struct PreadIo {
    file: Arc<GgufFile>,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    done: Mutex<mpsc::Receiver<Done>>,
    state: Mutex<State>,
    /// The block whose bytes are held now, and their buffer.
    block: Mutex<Option<(usize, Vec<u8>)>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The block held now ([`PreadIo::block`]).
pub(crate) type Held<'a> = MutexGuard<'a, Option<(usize, Vec<u8>)>>;

fn poisoned() -> ModelError {
    ModelError::Backend("the low-memory reader's state was poisoned by a panic".into())
}

fn lock<T>(m: &Mutex<T>) -> bitnet_model::Result<MutexGuard<'_, T>> {
    m.lock().map_err(|_| poisoned())
}

impl PreadIo {
    /// Start the I/O thread over `file`.
    pub(crate) fn new(file: Arc<GgufFile>) -> std::io::Result<PreadIo> {
        let (jtx, jrx) = mpsc::channel::<Job>();
        let (dtx, drx) = mpsc::channel::<Done>();
        let reader = Arc::clone(&file);
        let thread = std::thread::Builder::new()
            .name("bitnet-io".into())
            .spawn(move || {
                for mut job in jrx {
                    // Two copies at once: one core's copy loop does not reach the memory's
                    // bandwidth.
                    let half = job.buf.len() / 2;
                    let (a, b) = job.buf.split_at_mut(half);
                    let at = job.at;
                    let res = std::thread::scope(|sc| {
                        let first = sc.spawn(|| reader.read_at(at, a));
                        let second = reader.read_at(at + half, b);
                        first.join().unwrap_or_else(|_| {
                            Err(GgufError::Io(std::io::Error::other(
                                "a reader thread panicked",
                            )))
                        })?;
                        second
                    });
                    let done = Done {
                        key: job.key,
                        buf: job.buf,
                        res,
                    };
                    if dtx.send(done).is_err() {
                        break;
                    }
                }
            })?;
        Ok(PreadIo {
            file,
            jobs: Mutex::new(Some(jtx)),
            done: Mutex::new(drx),
            state: Mutex::new(State::default()),
            block: Mutex::new(None),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// A buffer of `len` bytes for `key`'s kind (reused when one is spare; its old contents
    /// are overwritten by the read).
    fn buffer(st: &mut State, key: Key, len: usize) -> Vec<u8> {
        let spare = if key.is_layer() {
            &mut st.spare_layer
        } else {
            &mut st.spare_head
        };
        let mut buf = spare.pop().unwrap_or_default();
        buf.resize(len, 0);
        buf
    }

    /// Move to block `il`: give the held block's buffer back, hold `il`'s bytes (`range`;
    /// `None` for a block read where it is mapped), and ask for `next` ahead.
    pub(crate) fn enter_block(
        &self,
        il: usize,
        range: Option<Range<usize>>,
        next: Option<(usize, Range<usize>)>,
    ) -> bitnet_model::Result<()> {
        let mut held = lock(&self.block)?;
        if let Some((done, buf)) = held.take() {
            self.recycle(Key::Layer(done), buf)?;
        }
        if let Some(range) = range {
            *held = Some((il, self.take(Key::Layer(il), range)?));
        }
        if let Some((n, range)) = next {
            self.request(Key::Layer(n), range)?;
        }
        Ok(())
    }

    /// The block held now and its bytes.
    pub(crate) fn block(&self) -> bitnet_model::Result<Held<'_>> {
        lock(&self.block)
    }

    /// Give a buffer back for reuse.
    pub(crate) fn recycle(&self, key: Key, buf: Vec<u8>) -> bitnet_model::Result<()> {
        let mut st = lock(&self.state)?;
        if key.is_layer() {
            st.spare_layer.push(buf);
        } else {
            st.spare_head.push(buf);
        }
        Ok(())
    }

    /// Ask the I/O thread to read `range` of the file for `key` (nothing when that read is
    /// already asked for or done).
    pub(crate) fn request(&self, key: Key, range: Range<usize>) -> bitnet_model::Result<()> {
        let mut st = lock(&self.state)?;
        if st.inflight.contains(&key) || st.ready.iter().any(|(k, _)| *k == key) {
            return Ok(());
        }
        let buf = Self::buffer(&mut st, key, range.len());
        let jobs = lock(&self.jobs)?;
        let sent = jobs.as_ref().is_some_and(|tx| {
            tx.send(Job {
                key,
                at: range.start,
                buf,
            })
            .is_ok()
        });
        if !sent {
            return Err(ModelError::Backend(
                "the low-memory reader's I/O thread has stopped".into(),
            ));
        }
        st.inflight.push(key);
        Ok(())
    }

    /// The bytes of `range` for `key`: the I/O thread's read when it was asked for (waiting
    /// for it if needed), else read here and now.
    pub(crate) fn take(&self, key: Key, range: Range<usize>) -> bitnet_model::Result<Vec<u8>> {
        let mut st = lock(&self.state)?;
        if let Some(i) = st.ready.iter().position(|(k, _)| *k == key) {
            return Ok(st.ready.swap_remove(i).1);
        }
        if st.inflight.contains(&key) {
            let done = lock(&self.done)?;
            loop {
                let d = done.recv().map_err(|_| {
                    ModelError::Backend("the low-memory reader's I/O thread has stopped".into())
                })?;
                st.inflight.retain(|k| *k != d.key);
                d.res?;
                if d.key == key {
                    return Ok(d.buf);
                }
                st.ready.push((d.key, d.buf));
            }
        }
        let mut buf = Self::buffer(&mut st, key, range.len());
        drop(st);
        self.file.read_at(range.start, &mut buf)?;
        Ok(buf)
    }
}

impl Drop for PreadIo {
    fn drop(&mut self) {
        // Closing the job channel ends the thread's loop.
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.take();
        }
        if let Ok(mut t) = self.thread.lock() {
            if let Some(h) = t.take() {
                // A panic on the I/O thread has already been reported by its reads failing.
                let _ = h.join();
            }
        }
    }
}
