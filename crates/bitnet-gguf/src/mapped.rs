//! A read-only memory map of any file, for readers of other containers (the converter maps
//! safetensors shards with it) so that `unsafe` stays in this I/O layer.

use std::fs::File;
use std::path::Path;

use crate::GgufError;

/// The bytes of a file, memory-mapped read-only (an empty file holds no map).
#[derive(Debug)]
pub struct MappedFile {
    map: Option<memmap2::Mmap>,
}

impl MappedFile {
    /// Map `path` read-only.
    ///
    /// As with [`crate::GgufFile::open`], another process truncating the file while it is
    /// mapped makes a later read of the lost pages raise SIGBUS.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        if len == 0 {
            return Ok(MappedFile { map: None });
        }
        // SAFETY: the map is read-only and private to this value; undefined behaviour needs
        // another process to modify the file while it is mapped (documented above).
        let map = unsafe { memmap2::MmapOptions::new().map(&file)? };
        if u64::try_from(map.len()).ok() != Some(len) {
            return Err(GgufError::Truncated {
                what: "file (changed while opening)",
                offset: u64::try_from(map.len()).unwrap_or(u64::MAX),
            });
        }
        crate::guard::register(&map, path);
        Ok(MappedFile { map: Some(map) })
    }

    /// The file's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// The file's length.
    pub fn len(&self) -> u64 {
        u64::try_from(self.as_bytes().len()).unwrap_or(u64::MAX)
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_none()
    }

    /// Drops the pages of `bytes[range]` from this process's resident set (see
    /// [`crate::GgufFile::release`]); a later read faults them back in unchanged. Returns
    /// whether pages were released (false off Unix, or for an empty range).
    pub fn release(&self, range: std::ops::Range<usize>) -> Result<bool, GgufError> {
        let Some(m) = &self.map else {
            return Ok(false);
        };
        if range.start >= range.end || range.end > m.len() {
            return Ok(false);
        }
        #[cfg(unix)]
        {
            // SAFETY: a read-only mapping of a file; MADV_DONTNEED drops only page-table
            // entries, and the next access reads the same bytes back from the page cache or the
            // file. The range lies inside the map (checked above).
            unsafe {
                m.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    range.start,
                    range.end - range.start,
                )?;
            }
            Ok(true)
        }
        #[cfg(not(unix))]
        Ok(false)
    }

    pub(crate) fn into_map(mut self) -> Option<memmap2::Mmap> {
        // The map stays registered: its new owner unregisters it when it drops it.
        self.map.take()
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        if let Some(m) = &self.map {
            crate::guard::unregister(m);
        }
    }
}
