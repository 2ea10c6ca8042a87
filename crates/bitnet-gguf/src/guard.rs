//! Memory-mapped files changed underneath.
//!
//! A map reads the file as it is now: if another process truncates the file (a re-download
//! into the same path, a full disk), touching a page past the new end raises SIGBUS, which
//! would end the process with no word. Two defences:
//!
//! - [`FileIdentity`]: what the file was when it was mapped (device, inode, size, modification
//!   time); [`FileIdentity::changed`] says whether the path still names that file, unchanged
//!   (the server's `/health` asks it).
//! - On Linux, a SIGBUS handler: a fault inside a registered map ends the process with one
//!   line naming the file, exit status 135 (128 + SIGBUS, as a shell reports the signal); a
//!   fault anywhere else goes to the handler that was there before (by default, the signal).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What a mapped file was when it was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileIdentity {
    pub path: PathBuf,
    pub len: u64,
    pub modified: Option<SystemTime>,
    /// Device and inode (Unix): a file replaced by rename has another inode.
    pub dev_ino: Option<(u64, u64)>,
}

impl FileIdentity {
    /// The identity of the open `file` (read through the handle, not the path).
    pub fn of(path: &Path, file: &std::fs::File) -> std::io::Result<Self> {
        let md = file.metadata()?;
        Ok(Self {
            path: path.to_path_buf(),
            len: md.len(),
            modified: md.modified().ok(),
            dev_ino: dev_ino(&md),
        })
    }

    /// `None` while the path names the same file with the same size and modification time;
    /// otherwise what changed, in words.
    pub fn changed(&self) -> Option<String> {
        let p = self.path.display();
        let md = match std::fs::metadata(&self.path) {
            Ok(md) => md,
            Err(e) => return Some(format!("{p} cannot be read any more ({e})")),
        };
        if self.dev_ino.is_some() && dev_ino(&md) != self.dev_ino {
            return Some(format!("{p} was replaced by another file"));
        }
        if md.len() != self.len {
            return Some(format!(
                "{p} is now {} bytes; it was {} bytes when loaded (truncated or rewritten)",
                md.len(),
                self.len
            ));
        }
        if md.modified().ok() != self.modified {
            return Some(format!("{p} was modified after it was loaded"));
        }
        None
    }
}

#[cfg(unix)]
fn dev_ino(md: &std::fs::Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((md.dev(), md.ino()))
}

#[cfg(not(unix))]
fn dev_ino(_: &std::fs::Metadata) -> Option<(u64, u64)> {
    None
}

#[cfg(target_os = "linux")]
mod handler {
    use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
    use std::sync::{Once, OnceLock};

    /// Maps registered at once (more are mapped without the message).
    const SLOTS: usize = 128;
    /// Bytes of a path kept for the message (a longer one is cut, with "…").
    const PATH_MAX: usize = 480;
    static START: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static LEN: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    /// Each slot's path, in static storage: nothing to allocate or free, so the handler never
    /// reads freed memory.
    static PATH: [[AtomicU8; PATH_MAX]; SLOTS] =
        [const { [const { AtomicU8::new(0) }; PATH_MAX] }; SLOTS];
    static PATH_LEN: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    /// Slots claimed (a slot's fields are written before its START is published).
    static CLAIMED: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];

    struct Saved(libc::sigaction);
    // SAFETY: a plain C struct of a handler address, flags and a signal mask, written once
    // before the handler that reads it is installed, never changed after.
    unsafe impl Sync for Saved {}
    // SAFETY: as above: plain data, no pointer into anything owned.
    unsafe impl Send for Saved {}
    static PREVIOUS: OnceLock<Saved> = OnceLock::new();
    static INSTALL: Once = Once::new();

    /// Register the map `[start, start + len)` of the file at `path`.
    pub fn register(start: usize, len: usize, path: &std::path::Path) {
        if start == 0 || len == 0 {
            return;
        }
        INSTALL.call_once(install);
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.as_os_str().as_bytes();
        let (bytes, cut) = if bytes.len() > PATH_MAX {
            (&bytes[..PATH_MAX - 3], true)
        } else {
            (bytes, false)
        };
        for i in 0..SLOTS {
            if CLAIMED[i]
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                let mut n = 0;
                for (dst, &b) in
                    PATH[i]
                        .iter()
                        .zip(bytes.iter().chain(if cut { "…".as_bytes() } else { &[] }))
                {
                    dst.store(b, Ordering::Relaxed);
                    n += 1;
                }
                PATH_LEN[i].store(n, Ordering::Relaxed);
                LEN[i].store(len, Ordering::Relaxed);
                START[i].store(start, Ordering::Release);
                return;
            }
        }
    }

    /// Forget the map that starts at `start` (it is being unmapped).
    pub fn unregister(start: usize) {
        if start == 0 {
            return;
        }
        for i in 0..SLOTS {
            if START[i].load(Ordering::Acquire) == start {
                START[i].store(0, Ordering::Release);
                CLAIMED[i].store(0, Ordering::Release);
                return;
            }
        }
    }

    fn install() {
        // SAFETY: sigaction with a zeroed struct filled field by field; the handler only
        // reads atomics and the saved previous action, and calls async-signal-safe
        // functions (write, _exit, sigaction).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return;
            }
            let _ = PREVIOUS.set(Saved(old));
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = (on_sigbus as *const ()).addr();
            act.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut());
        }
    }

    fn write_all(b: &[u8]) {
        let mut off = 0;
        while off < b.len() {
            // SAFETY: write(2) of an initialised slice to stderr; async-signal-safe.
            let n = unsafe { libc::write(2, b[off..].as_ptr().cast(), b.len() - off) };
            if n <= 0 {
                return;
            }
            off += n.unsigned_abs();
        }
    }

    extern "C" fn on_sigbus(
        _sig: libc::c_int,
        info: *mut libc::siginfo_t,
        _ctx: *mut libc::c_void,
    ) {
        // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler.
        let addr = unsafe { (*info).si_addr() }.addr();
        for i in 0..SLOTS {
            let s = START[i].load(Ordering::Acquire);
            if s != 0 && addr >= s && addr - s < LEN[i].load(Ordering::Relaxed) {
                let mut path = [0u8; PATH_MAX];
                let n = PATH_LEN[i].load(Ordering::Relaxed).min(PATH_MAX);
                for (dst, src) in path.iter_mut().zip(&PATH[i]).take(n) {
                    *dst = src.load(Ordering::Relaxed);
                }
                write_all(b"bitnet: the model file ");
                write_all(&path[..n]);
                write_all(
                    b" changed while in use (truncated or replaced on disk): its mapped bytes \
                      cannot be read. Restart with the file restored, or load it with \
                      --in-memory.\n",
                );
                // SAFETY: _exit is async-signal-safe; nothing else can run safely here.
                unsafe { libc::_exit(135) };
            }
        }
        // Not one of ours: the previous disposition, and the fault happens again under it.
        if let Some(Saved(old)) = PREVIOUS.get() {
            // SAFETY: restoring the action saved at install.
            unsafe { libc::sigaction(libc::SIGBUS, old, std::ptr::null_mut()) };
        }
    }
}

/// Register a map for the SIGBUS message (Linux; elsewhere nothing).
pub(crate) fn register(map: &[u8], path: &Path) {
    #[cfg(target_os = "linux")]
    handler::register(map.as_ptr().addr(), map.len(), path);
    #[cfg(not(target_os = "linux"))]
    let _ = (map, path);
}

/// Unregister the map that starts at `map` (before it is unmapped).
pub(crate) fn unregister(map: &[u8]) {
    #[cfg(target_os = "linux")]
    handler::unregister(map.as_ptr().addr());
    #[cfg(not(target_os = "linux"))]
    let _ = map;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn identity_sees_truncation_modification_and_replacement() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let p = dir.join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        let id = FileIdentity::of(&p, &std::fs::File::open(&p).unwrap()).unwrap();
        assert_eq!(id.changed(), None);

        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(4)
            .unwrap();
        assert!(id.changed().unwrap().contains("is now 4 bytes"));

        std::fs::write(dir.join("g"), b"0123456789").unwrap();
        std::fs::rename(dir.join("g"), &p).unwrap();
        #[cfg(unix)]
        assert!(id.changed().unwrap().contains("replaced"));

        std::fs::remove_file(&p).unwrap();
        assert!(id.changed().unwrap().contains("cannot be read"));
    }
}
