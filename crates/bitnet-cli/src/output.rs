//! Output files written atomically: the data goes to a temporary file in the destination's
//! folder and is renamed over the destination only once it is complete and synced. An error
//! (or an early return) removes the temporary file and leaves any earlier destination as it was.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A file being written; [`AtomicFile::commit`] publishes it under its final name.
#[derive(Debug)]
pub struct AtomicFile {
    dest: PathBuf,
    tmp: tempfile::NamedTempFile,
}

impl AtomicFile {
    /// Start writing `dest` (its folder must exist and be writable).
    pub fn create(dest: &Path) -> Result<Self> {
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = dest
            .file_name()
            .with_context(|| format!("{} names no file", dest.display()))?;
        let mut prefix = std::ffi::OsString::from(".");
        prefix.push(name);
        prefix.push(".");
        let tmp = tempfile::Builder::new()
            .prefix(&prefix)
            .suffix(".tmp")
            .tempfile_in(dir)
            .with_context(|| format!("cannot create a file in {}", dir.display()))?;
        Ok(AtomicFile {
            dest: dest.to_path_buf(),
            tmp,
        })
    }

    /// The open temporary file.
    pub fn file(&self) -> &File {
        self.tmp.as_file()
    }

    /// A buffered writer over the temporary file.
    pub fn writer(&self) -> BufWriter<&File> {
        BufWriter::with_capacity(1 << 22, self.tmp.as_file())
    }

    /// Sync the data and rename the file to its destination.
    pub fn commit(self) -> Result<()> {
        self.tmp
            .as_file()
            .sync_all()
            .with_context(|| format!("cannot write {}", self.dest.display()))?;
        let dest = self.dest;
        self.tmp
            .persist(&dest)
            .map_err(|e| e.error)
            .with_context(|| format!("cannot write {}", dest.display()))?;
        Ok(())
    }
}

/// Write `f32` values little-endian to `w`.
pub fn write_f32s(w: &mut impl Write, xs: &[f32]) -> std::io::Result<()> {
    for x in xs {
        w.write_all(&x.to_le_bytes())?;
    }
    Ok(())
}
