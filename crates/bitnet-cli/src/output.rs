//! Output files written atomically: the data goes to a temporary file in the destination's
//! folder and is renamed over the destination only once it is complete and synced. An error
//! (or an early return) removes the temporary file and leaves any earlier destination as it was.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The folder that holds `dest`, and the name prefix of a temporary entry beside it
/// (`.NAME.`); `kind` (file or folder) is for the message when `dest` names neither.
fn beside<'a>(dest: &'a Path, kind: &str) -> Result<(&'a Path, std::ffi::OsString)> {
    let dir = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = dest
        .file_name()
        .with_context(|| format!("{} names no {kind}", dest.display()))?;
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    Ok((dir, prefix))
}

/// A file being written; [`AtomicFile::commit`] publishes it under its final name.
#[derive(Debug)]
pub struct AtomicFile {
    dest: PathBuf,
    tmp: tempfile::NamedTempFile,
}

impl AtomicFile {
    /// Start writing `dest` (its folder must exist and be writable).
    pub fn create(dest: &Path) -> Result<Self> {
        let (dir, prefix) = beside(dest, "file")?;
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

/// A folder of files being written (a Hugging Face checkpoint): the files go to a temporary
/// folder beside the destination, and [`AtomicDir::commit`] publishes them only once all are
/// complete and synced. An error (or an early return) removes the temporary folder and leaves
/// the destination as it was.
#[derive(Debug)]
pub struct AtomicDir {
    dest: PathBuf,
    tmp: tempfile::TempDir,
}

impl AtomicDir {
    /// Start writing the folder `dest` (its parent must exist and be writable; `dest` itself
    /// may be absent or a folder).
    pub fn create(dest: &Path) -> Result<Self> {
        if dest.exists() && !dest.is_dir() {
            anyhow::bail!("{} exists and is not a folder", dest.display());
        }
        // `.` or `..` names its folder only once resolved.
        let resolved;
        let dest = if dest.file_name().is_none() && dest.exists() {
            resolved = dest
                .canonicalize()
                .with_context(|| format!("cannot resolve {}", dest.display()))?;
            resolved.as_path()
        } else {
            dest
        };
        let (dir, prefix) = beside(dest, "folder")?;
        let tmp = tempfile::Builder::new()
            .prefix(&prefix)
            .suffix(".tmp")
            .tempdir_in(dir)
            .with_context(|| format!("cannot create a folder in {}", dir.display()))?;
        Ok(AtomicDir {
            dest: dest.to_path_buf(),
            tmp,
        })
    }

    /// The temporary folder to write the files into.
    pub fn path(&self) -> &Path {
        self.tmp.path()
    }

    /// Sync the files, then publish them: the temporary folder is renamed to the destination
    /// when that is absent or empty; otherwise each file is renamed over its namesake in it
    /// (other files there stay), and the temporary folder is removed.
    pub fn commit(self) -> Result<()> {
        let fail = |e: std::io::Error| {
            anyhow::Error::new(e).context(format!("cannot write {}", self.dest.display()))
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(self.tmp.path()).map_err(fail)? {
            let entry = entry.map_err(fail)?;
            if !entry.file_type().map_err(fail)?.is_file() {
                anyhow::bail!(
                    "cannot write {}: {} is not a file",
                    self.dest.display(),
                    entry.path().display()
                );
            }
            File::open(entry.path())
                .and_then(|f| f.sync_all())
                .map_err(fail)?;
            files.push(entry.file_name());
        }
        let empty = match std::fs::read_dir(&self.dest) {
            Ok(mut d) => d.next().is_none(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(fail(e)),
        };
        if empty {
            if self.dest.exists() {
                std::fs::remove_dir(&self.dest).map_err(fail)?;
            }
            std::fs::rename(self.tmp.path(), &self.dest).map_err(fail)?;
            // The folder now lives under its final name: nothing is left to remove.
            let _ = self.tmp.keep();
        } else {
            for name in files {
                std::fs::rename(self.tmp.path().join(&name), self.dest.join(&name))
                    .map_err(fail)?;
            }
        }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use bitnet_testdata::dir_names as names;

    #[test]
    fn a_folder_appears_only_when_committed() {
        let root = tempfile::tempdir().unwrap();
        let dest = root.path().join("hf");
        // Dropped before its commit (an error while writing): nothing is left.
        let out = AtomicDir::create(&dest).unwrap();
        std::fs::write(out.path().join("config.json"), b"{}").unwrap();
        drop(out);
        assert!(names(root.path()).is_empty());
        // Committed to an absent destination, then to an empty one.
        for _ in 0..2 {
            let out = AtomicDir::create(&dest).unwrap();
            std::fs::write(out.path().join("config.json"), b"new").unwrap();
            assert!(!dest.join("config.json").exists());
            out.commit().unwrap();
            assert_eq!(names(root.path()), ["hf"]);
            assert_eq!(std::fs::read(dest.join("config.json")).unwrap(), b"new");
            std::fs::remove_file(dest.join("config.json")).unwrap();
        }
        // Into a folder that holds files: its namesakes are replaced, the others stay.
        std::fs::write(dest.join("config.json"), b"old").unwrap();
        std::fs::write(dest.join("notes.txt"), b"mine").unwrap();
        let out = AtomicDir::create(&dest).unwrap();
        std::fs::write(out.path().join("config.json"), b"new").unwrap();
        std::fs::write(out.path().join("model.safetensors"), b"w").unwrap();
        out.commit().unwrap();
        assert_eq!(names(root.path()), ["hf"]);
        assert_eq!(
            names(&dest),
            ["config.json", "model.safetensors", "notes.txt"]
        );
        assert_eq!(std::fs::read(dest.join("config.json")).unwrap(), b"new");
        assert_eq!(std::fs::read(dest.join("notes.txt")).unwrap(), b"mine");
        // `DIR/..` (as `.`): the folder it names once resolved, here the root; its temporary
        // folder goes beside that.
        let out = AtomicDir::create(&dest.join("..")).unwrap();
        std::fs::write(out.path().join("tokenizer.json"), b"t").unwrap();
        out.commit().unwrap();
        assert_eq!(names(root.path()), ["hf", "tokenizer.json"]);
        std::fs::remove_file(root.path().join("tokenizer.json")).unwrap();
        // A destination that is a file is refused before anything is written.
        let file = root.path().join("f");
        std::fs::write(&file, b"keep").unwrap();
        let err = AtomicDir::create(&file).unwrap_err().to_string();
        assert!(err.contains("not a folder"), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");
        assert_eq!(names(root.path()), ["f", "hf"]);
    }
}
