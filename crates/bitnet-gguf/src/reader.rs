//! Validating GGUF v2/v3 (little-endian) parser and the file handle that owns the bytes.
//!
//! File layout (all integers little-endian):
//! ```text
//! "GGUF" | version u32 | n_tensors u64 | n_kv u64
//! n_kv ×      { key: string | value_type u32 | value }
//! n_tensors × { name: string | n_dims u32 | ne[n_dims] u64 | type u32 | offset u64 }
//! zero padding to general.alignment (default 32)
//! tensor data: each tensor at data_start + offset (offset a multiple of the alignment)
//! string = len u64 | len bytes (UTF-8, no NUL)
//! array  = elem_type u32 | count u64 | count × elem
//! ```
//! Every read is checked against the bytes remaining before anything is allocated, and all
//! heap use is charged against [`Limits::max_alloc`].

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use crate::value::type_id as vt;
use crate::MappedFile;
use crate::{Array, GgmlType, GgufError, Limits, Metadata, Value};

/// The GGUF magic, "GGUF" as bytes.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment used when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Key holding the data alignment.
pub const KEY_ALIGNMENT: &str = "general.alignment";

/// A tensor placed in another container's file, for [`GgufFile::from_mapped_table`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableEntry {
    pub name: String,
    /// ggml `ne` order.
    pub dims: Vec<u64>,
    /// GGUF type id.
    pub type_id: u32,
    /// Absolute byte offset in the file.
    pub offset: u64,
    /// Exact byte size.
    pub size: u64,
}

/// One entry of the tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Unique, non-empty, valid UTF-8, shorter than [`Limits::max_name_len`].
    pub name: String,
    /// Shape in ggml `ne` order: `dims[0]` is the row length (in_features, fastest varying).
    /// 1..=4 entries, none zero, product ≤ i64::MAX.
    pub dims: Vec<u64>,
    /// Type resolved from `type_id` in the file's context (see [`GgmlType::from_id`]).
    pub ggml_type: GgmlType,
    /// The type id as stored.
    pub type_id: u32,
    /// Byte offset relative to the start of the data section; a multiple of the alignment.
    pub offset: u64,
    /// Bytes from `offset` to the next tensor's offset (by offset order) or to the end of the
    /// file. Includes alignment padding (and trailing bytes after the last tensor).
    pub available: u64,
}

impl TensorInfo {
    /// Number of elements (product of `dims`; saturates at u64::MAX, which a parsed tensor
    /// never reaches).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Expected byte size when the type defines one (see [`GgmlType::nbytes`]).
    pub fn nbytes(&self) -> Option<u64> {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .and_then(|n| self.ggml_type.nbytes(n))
    }
}

/// Result of parsing the header, KV table and tensor table.
#[derive(Debug)]
struct Parsed {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Metadata,
    /// Tensors in file order.
    tensors: Vec<TensorInfo>,
    /// Indices into `tensors`, sorted by name.
    by_name: Vec<usize>,
    bitnet_context: bool,
}

impl Parsed {
    fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let t = &self.tensors;
        self.by_name
            .binary_search_by(|&i| t[i].name.as_str().cmp(name))
            .ok()
            .map(|pos| &t[self.by_name[pos]])
    }
}

#[derive(Debug)]
enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// A parsed, validated GGUF file. Owns the bytes (a memory map or a buffer); tensor data is
/// borrowed from them without copying.
#[derive(Debug)]
pub struct GgufFile {
    backing: Backing,
    parsed: Arc<Parsed>,
    /// The file offset of the first byte of `backing` (0 unless it is a window).
    base: usize,
    /// The file's size (the backing's length unless it is a window).
    size: u64,
    /// The open file behind a map made by [`GgufFile::open`], for [`GgufFile::read_at`].
    #[cfg_attr(not(unix), allow(dead_code))]
    file: Option<File>,
    /// What the file was when [`GgufFile::open`] mapped it.
    identity: Option<crate::FileIdentity>,
}

impl Drop for GgufFile {
    fn drop(&mut self) {
        if let Backing::Mmap(m) = &self.backing {
            crate::guard::unregister(m);
        }
    }
}

/// Bytes of a transparent huge page on x86-64 and on aarch64 with 4 KiB pages: the piece of a
/// map that one page-table entry can cover (see [`GgufFile::advise_huge_pages`]).
pub const HUGE_PAGE: usize = 2 << 20;

/// The `FilePmdMapped` of the mapping that starts at address `base` (Linux
/// `/proc/self/smaps`, KiB): how much of it is mapped in huge pages now.
fn smaps_pmd_kib(base: usize) -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let s = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut in_map = false;
        for line in s.lines() {
            let mut words = line.split_whitespace();
            let Some(first) = words.next() else {
                continue;
            };
            if let Some((a, b)) = first.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    in_map = a <= base && base < b;
                    continue;
                }
            }
            if in_map && first == "FilePmdMapped:" {
                return words.next()?.parse().ok();
            }
        }
        None
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = base;
        None
    }
}

fn to_u64(n: usize) -> u64 {
    // usize is at most 64 bits on every supported target.
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// A GGUF file's header (metadata and tensor table), read from its first bytes before the
/// rest has arrived: for a file that comes in pieces (a download) and is consumed tensor by
/// tensor, never held whole. Every check of [`GgufFile::from_bytes`] is made against the
/// file's declared size; [`GgufHeader::window`] then gives the tensors of any byte range.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    parsed: Arc<Parsed>,
    size: u64,
}

impl GgufHeader {
    /// The header of a file of `file_size` bytes whose first bytes are `prefix`; `None` when
    /// the header goes on past `prefix` (call again with more).
    pub fn parse_prefix(
        prefix: &[u8],
        file_size: u64,
        limits: &Limits,
    ) -> Result<Option<Self>, GgufError> {
        if to_u64(prefix.len()) > file_size {
            return Err(GgufError::LimitExceeded {
                what: "bytes received (more than the file's size)",
                value: to_u64(prefix.len()),
                limit: file_size,
            });
        }
        match parse_sized(prefix, file_size, limits) {
            Ok(p) => Ok(Some(GgufHeader {
                parsed: Arc::new(p),
                size: file_size,
            })),
            Err(GgufError::Incomplete { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Metadata key-value pairs in file order.
    pub fn metadata(&self) -> &Metadata {
        &self.parsed.metadata
    }

    /// Tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.parsed.tensors
    }

    /// Looks a tensor up by name (O(log n)).
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.parsed.tensor(name)
    }

    /// Absolute byte offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.parsed.data_offset
    }

    /// The file's size in bytes.
    pub fn file_size(&self) -> u64 {
        self.size
    }

    /// Where a tensor's available bytes ([`GgufFile::tensor_bytes`]) lie in the file
    /// (absolute offsets).
    pub fn tensor_range(&self, t: &TensorInfo) -> std::ops::Range<u64> {
        // Checked at parse: offset + available lies inside the file.
        let start = self.parsed.data_offset.saturating_add(t.offset);
        start..start.saturating_add(t.available)
    }

    /// The file's bytes from offset `start` (`bytes`, a piece of it) as a [`GgufFile`] with
    /// this header: the tensors that lie wholly inside the piece read as in the whole file;
    /// the others are out of bounds.
    pub fn window(&self, start: u64, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let end = start.checked_add(to_u64(bytes.len()));
        let base = usize::try_from(start).ok();
        match (end, base) {
            (Some(end), Some(base)) if end <= self.size => Ok(GgufFile {
                backing: Backing::Owned(bytes),
                parsed: Arc::clone(&self.parsed),
                base,
                size: self.size,
                file: None,
                identity: None,
            }),
            _ => Err(GgufError::NotInFile { len: bytes.len() }),
        }
    }
}

impl GgufFile {
    /// Memory-maps `path` and validates it. The file length is checked against
    /// `limits.max_file_size` before mapping.
    ///
    /// A memory map reflects later changes to the file: if another process truncates the file
    /// while it is mapped, touching the lost pages raises SIGBUS. Use
    /// [`GgufFile::open_in_memory`] when the file may change underneath.
    pub fn open(path: &Path, limits: &Limits) -> Result<Self, GgufError> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        check_file_size(len, limits)?;
        if len == 0 {
            return Self::from_bytes(Vec::new(), limits);
        }
        // SAFETY: the map is read-only and private to this value. Undefined behaviour is only
        // possible if another process modifies the file while it is mapped; that is documented
        // above and `open_in_memory` exists for that case.
        let map = unsafe { memmap2::MmapOptions::new().map(&file)? };
        debug_assert_eq!(to_u64(map.len()), len);
        if to_u64(map.len()) != len {
            return Err(GgufError::Truncated {
                what: "file (changed while opening)",
                offset: to_u64(map.len()),
            });
        }
        let parsed = Arc::new(parse(&map, limits)?);
        crate::guard::register(&map, path);
        Ok(Self {
            identity: crate::FileIdentity::of(path, &file).ok(),
            backing: Backing::Mmap(map),
            parsed,
            base: 0,
            size: len,
            file: Some(file),
        })
    }

    /// Reads `path` into memory and validates it (immune to the file changing later).
    pub fn open_in_memory(path: &Path, limits: &Limits) -> Result<Self, GgufError> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        check_file_size(len, limits)?;
        let mut bytes = Vec::new();
        let cap = usize::try_from(len).map_err(|_| GgufError::LimitExceeded {
            what: "file size",
            value: len,
            limit: to_u64(usize::MAX),
        })?;
        bytes
            .try_reserve_exact(cap)
            .map_err(|_| GgufError::LimitExceeded {
                what: "file size (allocation failed)",
                value: len,
                limit: limits.max_file_size,
            })?;
        // Read at most one byte past the limit, in case the file grew since `metadata()`.
        file.take(limits.max_file_size.saturating_add(1))
            .read_to_end(&mut bytes)?;
        Self::from_bytes(bytes, limits)
    }

    /// Validates a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>, limits: &Limits) -> Result<Self, GgufError> {
        let parsed = Arc::new(parse(&bytes, limits)?);
        Ok(Self {
            file: None,
            identity: None,
            size: to_u64(bytes.len()),
            base: 0,
            backing: Backing::Owned(bytes),
            parsed,
        })
    }

    /// A model held in another container's file (QSF): `metadata` and a tensor table whose
    /// entries give each tensor's absolute byte offset in `data` and its exact size. Every
    /// tensor is checked as a GGUF tensor would be (name, dims, type, bounds, overlap); its
    /// available bytes are its size. The bytes stay memory-mapped, so [`Self::release`] and
    /// [`Self::will_need`] work on them as on a GGUF file.
    pub fn from_mapped_table(
        data: MappedFile,
        metadata: Metadata,
        table: Vec<TableEntry>,
        limits: &Limits,
    ) -> Result<Self, GgufError> {
        let data_len = data.len();
        check_file_size(data_len, limits)?;
        let bitnet_context = is_bitnet_context(&metadata);
        let mut tensors = Vec::with_capacity(table.len());
        let mut sizes = Vec::with_capacity(table.len());
        for e in table {
            if e.name.is_empty() {
                return Err(GgufError::NameEmpty);
            }
            if e.name.len() >= limits.max_name_len {
                return Err(GgufError::NameTooLong {
                    len: to_u64(e.name.len()),
                    limit: limits.max_name_len,
                });
            }
            if e.dims.is_empty() || e.dims.len() > limits.max_dims {
                return Err(GgufError::BadDims {
                    tensor: e.name,
                    reason: format!("{} dims, must be 1..={}", e.dims.len(), limits.max_dims),
                });
            }
            if let Some(axis) = e.dims.iter().position(|&d| d == 0) {
                return Err(GgufError::ZeroDim {
                    tensor: e.name,
                    axis,
                });
            }
            let n = e
                .dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|&n| i64::try_from(n).is_ok() && usize::try_from(n).is_ok());
            let Some(n) = n else {
                return Err(GgufError::ShapeOverflow {
                    tensor: e.name,
                    dims: e.dims,
                });
            };
            sizes.push(e.size);
            tensors.push(check_tensor(
                e.name,
                e.dims,
                n,
                e.type_id,
                e.offset,
                bitnet_context,
            )?);
        }
        // Bounds and overlap, by offset; each tensor's available bytes are its own size.
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        order.sort_by_key(|&i| tensors[i].offset);
        for (k, &i) in order.iter().enumerate() {
            let t = &tensors[i];
            let min = t.ggml_type.min_bytes(t.n_elements()).unwrap_or(u64::MAX);
            let end = t.offset.checked_add(sizes[i]);
            if sizes[i] < min || end.is_none_or(|e| e > data_len) {
                return Err(GgufError::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    offset: t.offset,
                    needed: min.max(sizes[i]),
                    data_len,
                });
            }
            if let Some(&j) = order.get(k + 1) {
                let n = &tensors[j];
                if end.is_none_or(|e| e > n.offset) {
                    return Err(GgufError::OverlappingTensors {
                        tensor: t.name.clone(),
                        offset: t.offset,
                        needed: sizes[i],
                        next: n.name.clone(),
                        next_offset: n.offset,
                    });
                }
            }
        }
        for (t, &size) in tensors.iter_mut().zip(&sizes) {
            t.available = size;
        }
        let by_name = index_by_name(&tensors)?;
        let backing = match data.into_map() {
            Some(m) => Backing::Mmap(m),
            None => Backing::Owned(Vec::new()),
        };
        Ok(GgufFile {
            size: to_u64(match &backing {
                Backing::Mmap(m) => m.len(),
                Backing::Owned(v) => v.len(),
            }),
            base: 0,
            backing,
            file: None,
            identity: None,
            parsed: Arc::new(Parsed {
                version: 3,
                alignment: DEFAULT_ALIGNMENT,
                data_offset: 0,
                metadata,
                tensors,
                by_name,
                bitnet_context,
            }),
        })
    }

    fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.parsed.version
    }

    /// Data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.parsed.alignment
    }

    /// Absolute byte offset of the tensor data section (aligned; for a file without tensors
    /// that omits the final padding, the file size). Always ≤ [`GgufFile::file_size`].
    pub fn data_offset(&self) -> u64 {
        self.parsed.data_offset
    }

    /// File size in bytes.
    pub fn file_size(&self) -> u64 {
        self.size
    }

    /// The whole file (for a window made by [`GgufHeader::window`], the window's bytes).
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes()
    }

    /// Where `bytes` lies in [`Self::as_bytes`] (byte offsets), or `None` when it is not a
    /// sub-slice of the file's bytes.
    pub fn range_of(&self, bytes: &[u8]) -> Option<std::ops::Range<usize>> {
        let all = self.bytes();
        let start = bytes.as_ptr().addr().checked_sub(all.as_ptr().addr())?;
        let end = start.checked_add(bytes.len())?;
        (end <= all.len()).then_some(start..end)
    }

    /// Tells the OS that the pages holding `bytes` (a sub-slice of [`Self::as_bytes`]) are
    /// not needed for now. For a memory-mapped file they leave this process's resident set;
    /// a later read faults them back in from the page cache or the file, with the same
    /// contents, so slices borrowed from the file stay valid and unchanged. A no-op for a file
    /// held in memory. Returns whether pages were released.
    ///
    /// Pages are whole: the first and last page of the range may also hold bytes of a
    /// neighbouring tensor, which are then read back in when next used.
    pub fn release(&self, bytes: &[u8]) -> Result<bool, GgufError> {
        match self.mapped_range(bytes)? {
            None => Ok(false),
            #[cfg(unix)]
            Some((m, offset)) => {
                // SAFETY: the map is a shared, read-only mapping of a file (see `open`).
                // MADV_DONTNEED on such a mapping only drops this process's page-table
                // entries; the next access reads the same bytes back from the page cache or
                // the file, so no borrowed slice observes a change. The range was checked to
                // lie inside the map just above.
                unsafe {
                    m.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        offset,
                        bytes.len(),
                    )?;
                }
                Ok(true)
            }
            #[cfg(not(unix))]
            Some(_) => Ok(false),
        }
    }

    /// The map and the offset of `bytes` in it, when `bytes` is a non-empty sub-slice of a
    /// memory-mapped file; `None` for a file held in memory or an empty slice.
    fn mapped_range(&self, bytes: &[u8]) -> Result<Option<(&memmap2::Mmap, usize)>, GgufError> {
        let offset = self
            .range_of(bytes)
            .ok_or(GgufError::NotInFile { len: bytes.len() })?
            .start;
        Ok(match &self.backing {
            Backing::Mmap(m) if !bytes.is_empty() => Some((m, offset)),
            _ => None,
        })
    }

    /// Asks the OS to start reading the pages holding `bytes` (a sub-slice of
    /// [`Self::as_bytes`]) in the background, ahead of their use. Only a hint: the contents
    /// are not changed and nothing waits. A no-op for a file held in memory. Returns whether
    /// the hint was given.
    pub fn will_need(&self, bytes: &[u8]) -> Result<bool, GgufError> {
        match self.mapped_range(bytes)? {
            None => Ok(false),
            #[cfg(unix)]
            Some((m, offset)) => {
                m.advise_range(memmap2::Advice::WillNeed, offset, bytes.len())?;
                Ok(true)
            }
            #[cfg(not(unix))]
            Some(_) => Ok(false),
        }
    }

    /// Asks the OS to back the map with huge pages where it can (Linux `MADV_HUGEPAGE`):
    /// pages read from the file through the map from now on enter the page cache as
    /// [`HUGE_PAGE`] folios, which the map takes in, and drops, with one page-table entry each
    /// instead of 512. Only a hint: contents are unchanged. A no-op for a file held in memory,
    /// off Linux, and on a kernel without transparent huge pages. Returns whether the hint was
    /// given.
    pub fn advise_huge_pages(&self) -> Result<bool, GgufError> {
        match &self.backing {
            #[cfg(target_os = "linux")]
            Backing::Mmap(m) => match m.advise(memmap2::Advice::HugePage) {
                Ok(()) => Ok(true),
                // A kernel built without transparent huge pages.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
                Err(e) => Err(e.into()),
            },
            _ => Ok(false),
        }
    }

    /// How many of the [`HUGE_PAGE`] pieces of the file that start at `offsets` the OS maps
    /// whole, with one entry each, when they are read (the page cache holds them as huge
    /// folios, or reads them in as such after [`Self::advise_huge_pages`]). Touches one byte
    /// of each piece, counts the growth of the map's `FilePmdMapped` (Linux
    /// `/proc/self/smaps`), and drops the pieces from the process again, before and after.
    /// Offsets that are not multiples of [`HUGE_PAGE`], or whose piece runs past the end, are
    /// skipped. `None` when it cannot be known: off Linux, a file held in memory, no usable
    /// offset, or smaps unreadable.
    pub fn huge_mapped_pieces(&self, offsets: &[usize]) -> Result<Option<usize>, GgufError> {
        let all = self.bytes();
        let pieces: Vec<&[u8]> = offsets
            .iter()
            .filter(|&&o| o % HUGE_PAGE == 0)
            .filter_map(|&o| all.get(o..o.checked_add(HUGE_PAGE)?))
            .collect();
        if pieces.is_empty() || !self.is_mapped() {
            return Ok(None);
        }
        for p in &pieces {
            self.release(p)?;
        }
        let base = all.as_ptr().addr();
        let Some(before) = smaps_pmd_kib(base) else {
            return Ok(None);
        };
        for p in &pieces {
            std::hint::black_box(p[0]);
        }
        let after = smaps_pmd_kib(base);
        for p in &pieces {
            self.release(p)?;
        }
        let piece_kib = to_u64(HUGE_PAGE / 1024);
        Ok(after.map(|a| {
            usize::try_from(a.saturating_sub(before) / piece_kib)
                .unwrap_or(usize::MAX)
                .min(pieces.len())
        }))
    }

    /// Drops the file's clean pages over `range` (byte offsets) from the OS page cache
    /// (Linux `posix_fadvise(POSIX_FADV_DONTNEED)`): later reads come from storage again, and
    /// after [`Self::advise_huge_pages`] they come in as huge folios. Pages that a process has
    /// mapped stay. Contents are unchanged. A no-op for a file held in memory and off Linux.
    /// Returns whether the advice was given.
    pub fn drop_cached(&self, range: std::ops::Range<usize>) -> Result<bool, GgufError> {
        if range.start >= range.end || range.end > self.bytes().len() {
            return Ok(false);
        }
        #[cfg(target_os = "linux")]
        if let (Some(f), Backing::Mmap(_)) = (&self.file, &self.backing) {
            use std::os::fd::AsRawFd;
            let (Ok(at), Ok(len)) = (
                libc::off_t::try_from(range.start),
                libc::off_t::try_from(range.end - range.start),
            ) else {
                return Ok(false);
            };
            // SAFETY: `posix_fadvise` only reads its integer arguments; the descriptor is the
            // open file this value owns. The advice changes what the page cache keeps, never
            // the file's contents.
            let rc =
                unsafe { libc::posix_fadvise(f.as_raw_fd(), at, len, libc::POSIX_FADV_DONTNEED) };
            if rc != 0 {
                return Err(GgufError::Io(std::io::Error::from_raw_os_error(rc)));
            }
            return Ok(true);
        }
        Ok(false)
    }

    /// Copies `out.len()` bytes of the file, from byte `offset` of [`Self::as_bytes`], into
    /// `out`: with `pread` from the open file when [`Self::open`] mapped it (the map's pages are
    /// not touched, so they do not join this process's resident set), else from the bytes
    /// themselves (for a mapped QSF container, whose pages are then released again).
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), GgufError> {
        let end = offset
            .checked_add(out.len())
            .filter(|&e| e <= self.bytes().len())
            .ok_or(GgufError::NotInFile { len: out.len() })?;
        #[cfg(unix)]
        if let Some(f) = &self.file {
            use std::os::unix::fs::FileExt;
            f.read_exact_at(out, to_u64(offset))?;
            return Ok(());
        }
        let src = &self.bytes()[offset..end];
        out.copy_from_slice(src);
        self.release(src)?;
        Ok(())
    }

    /// Whether the file is memory-mapped (rather than held in memory).
    pub fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::Mmap(_))
    }

    /// Metadata key-value pairs in file order.
    pub fn metadata(&self) -> &Metadata {
        &self.parsed.metadata
    }

    /// Parses the metadata of a GGUF held in `bytes` (borrowed, not copied) and returns it
    /// with the number of tensors the file declares.
    pub fn metadata_of(bytes: &[u8], limits: &Limits) -> Result<(Metadata, usize), GgufError> {
        let parsed = parse(bytes, limits)?;
        Ok((parsed.metadata, parsed.tensors.len()))
    }

    /// The metadata, keeping nothing else of the file.
    pub fn into_metadata(self) -> Metadata {
        let parsed = Arc::clone(&self.parsed);
        drop(self);
        Arc::try_unwrap(parsed).map_or_else(|p| p.metadata.clone(), |p| p.metadata)
    }

    /// What the file was when [`GgufFile::open`] mapped it (`None` for a file read into
    /// memory, which its later changes cannot reach).
    pub fn identity(&self) -> Option<&crate::FileIdentity> {
        self.identity.as_ref()
    }

    /// Tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.parsed.tensors
    }

    /// Looks a tensor up by name (O(log n)).
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.parsed.tensor(name)
    }

    /// `general.architecture`, if present and a string.
    pub fn architecture(&self) -> Option<&str> {
        self.parsed.metadata.get_str("general.architecture").ok()
    }

    /// True when type ids were resolved in bitnet.cpp's numbering (38 = TL1, 39 = TL2):
    /// the architecture starts with "bitnet" or `general.file_type` is 40.
    pub fn bitnet_context(&self) -> bool {
        self.parsed.bitnet_context
    }

    /// All `available` bytes of a tensor (zero-copy), including any padding up to the next
    /// tensor. Used to tell layouts that share a type id apart by size.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        self.slice(t, t.available)
    }

    /// Exactly [`TensorInfo::nbytes`] bytes of a tensor (zero-copy). `UnsupportedType` when the
    /// type has no context-free size (unknown ids, TL1, TL2); `TensorOutOfBounds` when fewer
    /// bytes are available (e.g. an I2_S tensor in a layout smaller than bitnet.cpp's).
    pub fn tensor_data(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let n = t.nbytes().ok_or_else(|| GgufError::UnsupportedType {
            tensor: t.name.clone(),
            type_name: t.ggml_type.name(),
            type_id: t.type_id,
        })?;
        if n > t.available {
            return Err(self.out_of_bounds(t, n));
        }
        self.slice(t, n)
    }

    fn out_of_bounds(&self, t: &TensorInfo, needed: u64) -> GgufError {
        GgufError::TensorOutOfBounds {
            tensor: t.name.clone(),
            offset: t.offset,
            needed,
            data_len: self.file_size().saturating_sub(self.parsed.data_offset),
        }
    }

    fn slice(&self, t: &TensorInfo, len: u64) -> Result<&[u8], GgufError> {
        let range = self
            .parsed
            .data_offset
            .checked_add(t.offset)
            .and_then(|s| Some((s, s.checked_add(len)?)))
            .and_then(|(s, e)| Some(usize::try_from(s).ok()?..usize::try_from(e).ok()?))
            .and_then(|r| Some(r.start.checked_sub(self.base)?..r.end.checked_sub(self.base)?));
        range
            .and_then(|r| self.bytes().get(r))
            .ok_or_else(|| self.out_of_bounds(t, len))
    }
}

fn check_file_size(len: u64, limits: &Limits) -> Result<(), GgufError> {
    if len > limits.max_file_size {
        return Err(GgufError::LimitExceeded {
            what: "file size",
            value: len,
            limit: limits.max_file_size,
        });
    }
    Ok(())
}

/// Bounds-checked little-endian cursor that also meters heap use.
struct Reader<'a> {
    buf: &'a [u8],
    /// The file's size: `buf.len()`, or more when `buf` is only its first bytes.
    total: u64,
    pos: usize,
    limits: &'a Limits,
    /// Heap bytes charged so far (compared against `limits.max_alloc`).
    alloc: u64,
}

/// Smallest encoding of one metadata KV pair: key length (8) + 1 key byte + type (4) + 1 byte.
const MIN_KV_BYTES: u64 = 14;
/// Smallest encoding of one tensor info: name length (8) + 1 name byte + n_dims (4) + one
/// dim (8) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 33;
/// Smallest encoding of an inner array: element type (4) + count (8).
const MIN_ARRAY_BYTES: u64 = 12;

impl<'a> Reader<'a> {
    /// Bytes of the file after the cursor (counted to the file's end, also when only a
    /// prefix is at hand).
    fn remaining(&self) -> u64 {
        self.total.saturating_sub(to_u64(self.pos))
    }

    fn offset(&self) -> u64 {
        to_u64(self.pos)
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        let truncated = GgufError::Truncated {
            what,
            offset: self.offset(),
        };
        let n = usize::try_from(n).map_err(|_| GgufError::Truncated {
            what,
            offset: self.offset(),
        })?;
        let end = self.pos.checked_add(n).ok_or(truncated)?;
        if end > self.buf.len() && to_u64(end) <= self.total {
            // Within the file, past the bytes received so far.
            return Err(GgufError::Incomplete {
                offset: self.offset(),
            });
        }
        let s = self.buf.get(self.pos..end).ok_or(GgufError::Truncated {
            what,
            offset: self.offset(),
        })?;
        self.pos = end;
        Ok(s)
    }

    fn array_n<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let s = self.take(to_u64(N), what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        Ok(self.array_n::<1>(what)?[0])
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array_n(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array_n(what)?))
    }

    fn charge(&mut self, bytes: u64) -> Result<(), GgufError> {
        let total = self.alloc.saturating_add(bytes);
        if total > self.limits.max_alloc {
            return Err(GgufError::LimitExceeded {
                what: "metadata allocation",
                value: total,
                limit: self.limits.max_alloc,
            });
        }
        self.alloc = total;
        Ok(())
    }

    /// Charges `count` × `size` bytes; fails (without allocating) on overflow or over budget.
    fn charge_n(&mut self, count: u64, size: usize) -> Result<(), GgufError> {
        self.charge(count.saturating_mul(to_u64(size)))
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let at = self.offset();
        let len = self.u64(what)?;
        if len > self.limits.max_string_len {
            return Err(GgufError::StringTooLong {
                len,
                limit: self.limits.max_string_len,
                offset: at,
            });
        }
        let bytes = self.take(len, what)?;
        let s = std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 { what })?;
        self.charge(len)?;
        Ok(s.to_owned())
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            vt::U8 => Value::U8(self.u8("u8 value")?),
            vt::I8 => Value::I8(i8::from_le_bytes(self.array_n("i8 value")?)),
            vt::U16 => Value::U16(u16::from_le_bytes(self.array_n("u16 value")?)),
            vt::I16 => Value::I16(i16::from_le_bytes(self.array_n("i16 value")?)),
            vt::U32 => Value::U32(self.u32("u32 value")?),
            vt::I32 => Value::I32(i32::from_le_bytes(self.array_n("i32 value")?)),
            vt::F32 => Value::F32(f32::from_le_bytes(self.array_n("f32 value")?)),
            vt::BOOL => Value::Bool(bool_of(self.u8("bool value")?)?),
            vt::STRING => Value::String(self.string("string value")?),
            vt::ARRAY => Value::Array(self.array(depth.saturating_add(1))?),
            vt::U64 => Value::U64(self.u64("u64 value")?),
            vt::I64 => Value::I64(i64::from_le_bytes(self.array_n("i64 value")?)),
            vt::F64 => Value::F64(f64::from_le_bytes(self.array_n("f64 value")?)),
            other => return Err(GgufError::BadValueType(other)),
        })
    }

    /// Reads an array header and body; `depth` is this array's nesting level (1 = top level).
    fn array(&mut self, depth: u32) -> Result<Array, GgufError> {
        if depth > self.limits.max_array_depth {
            return Err(GgufError::ArrayNestingTooDeep {
                limit: self.limits.max_array_depth,
            });
        }
        let elem = self.u32("array element type")?;
        let at = self.offset();
        let count = self.u64("array length")?;
        if count > self.limits.max_array_len {
            return Err(GgufError::ArrayTooLong {
                len: count,
                limit: self.limits.max_array_len,
                offset: at,
            });
        }
        // Minimum encoded bytes per element; checked against the bytes left before allocating.
        let min_elem: u64 = match elem {
            vt::U8 | vt::I8 | vt::BOOL => 1,
            vt::U16 | vt::I16 => 2,
            vt::U32 | vt::I32 | vt::F32 => 4,
            vt::U64 | vt::I64 | vt::F64 => 8,
            vt::STRING => 8,
            vt::ARRAY => MIN_ARRAY_BYTES,
            other => return Err(GgufError::BadValueType(other)),
        };
        if count
            .checked_mul(min_elem)
            .is_none_or(|need| need > self.remaining())
        {
            return Err(GgufError::Truncated {
                what: "array elements",
                offset: self.offset(),
            });
        }
        // `count` ≤ remaining bytes, so it fits usize.
        let n = usize::try_from(count).map_err(|_| GgufError::Truncated {
            what: "array elements",
            offset: at,
        })?;

        macro_rules! numeric {
            ($variant:ident, $t:ty) => {{
                const W: usize = std::mem::size_of::<$t>();
                self.charge_n(count, W)?;
                let bytes = self.take(count.saturating_mul(to_u64(W)), "array elements")?;
                let mut v: Vec<$t> = Vec::with_capacity(n);
                v.extend(bytes.chunks_exact(W).map(|c| {
                    let mut a = [0u8; W];
                    a.copy_from_slice(c);
                    <$t>::from_le_bytes(a)
                }));
                Array::$variant(v)
            }};
        }
        Ok(match elem {
            vt::U8 => numeric!(U8, u8),
            vt::I8 => numeric!(I8, i8),
            vt::U16 => numeric!(U16, u16),
            vt::I16 => numeric!(I16, i16),
            vt::U32 => numeric!(U32, u32),
            vt::I32 => numeric!(I32, i32),
            vt::F32 => numeric!(F32, f32),
            vt::U64 => numeric!(U64, u64),
            vt::I64 => numeric!(I64, i64),
            vt::F64 => numeric!(F64, f64),
            vt::BOOL => {
                self.charge_n(count, 1)?;
                let bytes = self.take(count, "array elements")?;
                let mut v = Vec::with_capacity(n);
                for &b in bytes {
                    v.push(bool_of(b)?);
                }
                Array::Bool(v)
            }
            vt::STRING => {
                self.charge_n(count, std::mem::size_of::<String>())?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string("string array element")?);
                }
                Array::String(v)
            }
            // vt::ARRAY (the only remaining type accepted above)
            _ => {
                if depth >= self.limits.max_array_depth {
                    return Err(GgufError::ArrayNestingTooDeep {
                        limit: self.limits.max_array_depth,
                    });
                }
                self.charge_n(count, std::mem::size_of::<Array>())?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array(depth.saturating_add(1))?);
                }
                Array::Array(v)
            }
        })
    }
}

fn bool_of(b: u8) -> Result<bool, GgufError> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(GgufError::BadBool(other)),
    }
}

fn parse(buf: &[u8], limits: &Limits) -> Result<Parsed, GgufError> {
    parse_sized(buf, to_u64(buf.len()), limits)
}

/// Parses the header of a file of `file_size` bytes from `buf`, its first bytes (all of
/// them, or a prefix: then `Incomplete` when the header goes on past `buf`).
fn parse_sized(buf: &[u8], file_size: u64, limits: &Limits) -> Result<Parsed, GgufError> {
    check_file_size(file_size, limits)?;
    let mut r = Reader {
        buf,
        total: file_size,
        pos: 0,
        limits,
        alloc: 0,
    };

    // --- header ---
    if r.take(4, "magic")? != GGUF_MAGIC {
        return Err(GgufError::BadMagic);
    }
    let version = r.u32("version")?;
    match version {
        2 | 3 => {}
        v if v & 0xFFFF == 0 && (1..=3).contains(&v.swap_bytes()) => {
            return Err(GgufError::BigEndian)
        }
        v => return Err(GgufError::UnsupportedVersion(v)),
    }
    // v2 and v3 share the layout (u64 counts and lengths); v3 only added big-endian files.
    let n_tensors = r.u64("tensor count")?;
    let n_kv = r.u64("metadata key-value count")?;
    let rem = r.remaining();
    if n_kv.checked_mul(MIN_KV_BYTES).is_none_or(|b| b > rem) {
        return Err(GgufError::CountTooLarge {
            what: "metadata key-value",
            count: n_kv,
        });
    }
    if n_tensors
        .checked_mul(MIN_TENSOR_INFO_BYTES)
        .is_none_or(|b| b > rem.saturating_sub(n_kv.saturating_mul(MIN_KV_BYTES)))
    {
        return Err(GgufError::CountTooLarge {
            what: "tensor",
            count: n_tensors,
        });
    }
    if n_kv > limits.max_kv {
        return Err(GgufError::LimitExceeded {
            what: "metadata key-value count",
            value: n_kv,
            limit: limits.max_kv,
        });
    }
    if n_tensors > limits.max_tensors {
        return Err(GgufError::LimitExceeded {
            what: "tensor count",
            value: n_tensors,
            limit: limits.max_tensors,
        });
    }
    // Both counts are now ≤ remaining bytes, hence fit usize.
    let n_kv_usize = usize::try_from(n_kv).map_err(|_| GgufError::CountTooLarge {
        what: "metadata key-value",
        count: n_kv,
    })?;
    let n_tensors_usize = usize::try_from(n_tensors).map_err(|_| GgufError::CountTooLarge {
        what: "tensor",
        count: n_tensors,
    })?;

    // --- metadata ---
    // entries + sorted index
    r.charge_n(
        n_kv,
        std::mem::size_of::<(String, Value)>() + std::mem::size_of::<usize>(),
    )?;
    let mut entries = Vec::with_capacity(n_kv_usize);
    for _ in 0..n_kv {
        let key = r.string("metadata key")?;
        if key.is_empty() {
            return Err(GgufError::KeyEmpty);
        }
        let ty = r.u32("metadata value type")?;
        let value = r.value(ty, 0)?;
        entries.push((key, value));
    }
    let metadata = Metadata::from_entries(entries)?;

    let bitnet_context = is_bitnet_context(&metadata);

    let alignment = match metadata.get(KEY_ALIGNMENT) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) => {
            let a = u64::from(*a);
            if a == 0 {
                return Err(GgufError::BadAlignment {
                    value: a,
                    reason: "zero",
                });
            }
            if !a.is_power_of_two() {
                return Err(GgufError::BadAlignment {
                    value: a,
                    reason: "not a power of two",
                });
            }
            if a > limits.max_alignment {
                return Err(GgufError::BadAlignment {
                    value: a,
                    reason: "above the configured maximum",
                });
            }
            a
        }
        Some(other) => {
            return Err(GgufError::WrongType {
                key: KEY_ALIGNMENT.to_owned(),
                expected: "u32",
                found: other.type_name(),
            })
        }
    };

    // --- tensor infos ---
    r.charge_n(
        n_tensors,
        std::mem::size_of::<TensorInfo>() + std::mem::size_of::<usize>(),
    )?;
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors_usize);
    for _ in 0..n_tensors {
        tensors.push(read_tensor_info(&mut r, bitnet_context)?);
    }

    let by_name = index_by_name(&tensors)?;

    // --- data section ---
    let data_offset =
        r.offset()
            .checked_next_multiple_of(alignment)
            .ok_or(GgufError::Truncated {
                what: "tensor data section",
                offset: r.offset(),
            })?;
    if !tensors.is_empty() && data_offset > file_size {
        return Err(GgufError::Truncated {
            what: "padding before tensor data",
            offset: r.offset(),
        });
    }
    // A file without tensors may omit the final padding (the llama3 vocab fixture does);
    // report its end as the data offset so `file_size - data_offset` never underflows.
    let data_offset = data_offset.min(file_size);
    let data_len = file_size.saturating_sub(data_offset);
    assign_available(&mut tensors, alignment, data_len)?;

    Ok(Parsed {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
        by_name,
        bitnet_context,
    })
}

/// Type ids are read in bitnet.cpp's numbering when the architecture starts with "bitnet" or
/// `general.file_type` is 40.
fn is_bitnet_context(metadata: &Metadata) -> bool {
    metadata
        .get_str("general.architecture")
        .is_ok_and(|a| a.starts_with("bitnet"))
        || metadata
            .get_uint("general.file_type")
            .is_ok_and(|t| t == 40)
}

/// Sorted indices by name; a duplicate name is an error naming its first two uses.
fn index_by_name(tensors: &[TensorInfo]) -> Result<Vec<usize>, GgufError> {
    let mut by_name: Vec<usize> = (0..tensors.len()).collect();
    // A stable sort keeps equal names in file order, so a duplicate names its first two uses.
    by_name.sort_by(|&a, &b| tensors[a].name.cmp(&tensors[b].name));
    for w in by_name.windows(2) {
        if tensors[w[0]].name == tensors[w[1]].name {
            return Err(GgufError::DuplicateTensor {
                name: tensors[w[0]].name.clone(),
                first: w[0],
                second: w[1],
            });
        }
    }
    Ok(by_name)
}

fn read_tensor_info(r: &mut Reader<'_>, bitnet_context: bool) -> Result<TensorInfo, GgufError> {
    let limits = r.limits;
    let len = r.u64("tensor name length")?;
    if len == 0 {
        return Err(GgufError::NameEmpty);
    }
    if len >= to_u64(limits.max_name_len) {
        return Err(GgufError::NameTooLong {
            len,
            limit: limits.max_name_len,
        });
    }
    let raw = r.take(len, "tensor name")?;
    let name = std::str::from_utf8(raw)
        .map_err(|_| GgufError::InvalidUtf8 {
            what: "tensor name",
        })?
        .to_owned();
    r.charge(len)?;

    let n_dims = r.u32("tensor n_dims")?;
    let n_dims = usize::try_from(n_dims).unwrap_or(usize::MAX);
    if n_dims == 0 || n_dims > limits.max_dims {
        return Err(GgufError::BadDims {
            tensor: name,
            reason: format!("n_dims is {n_dims}, must be 1..={}", limits.max_dims),
        });
    }
    if to_u64(n_dims).saturating_mul(8) > r.remaining() {
        return Err(GgufError::Truncated {
            what: "tensor dimension",
            offset: r.offset(),
        });
    }
    r.charge_n(to_u64(n_dims), std::mem::size_of::<u64>())?;
    let mut dims = Vec::with_capacity(n_dims);
    for _ in 0..n_dims {
        dims.push(r.u64("tensor dimension")?);
    }
    for (axis, &d) in dims.iter().enumerate() {
        if d == 0 {
            return Err(GgufError::ZeroDim { tensor: name, axis });
        }
        if i64::try_from(d).is_err() {
            return Err(GgufError::BadDims {
                tensor: name,
                reason: format!("ne[{axis}] = {d} is negative as i64"),
            });
        }
    }
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| i64::try_from(n).is_ok() && usize::try_from(n).is_ok());
    let Some(n_elements) = n_elements else {
        return Err(GgufError::ShapeOverflow { tensor: name, dims });
    };

    let type_id = r.u32("tensor type")?;
    let offset = r.u64("tensor offset")?;
    check_tensor(name, dims, n_elements, type_id, offset, bitnet_context)
}

/// The checks of a tensor's shape against its type, shared by the GGUF parser and
/// [`GgufFile::from_mapped_table`].
fn check_tensor(
    name: String,
    dims: Vec<u64>,
    n_elements: u64,
    type_id: u32,
    offset: u64,
    bitnet_context: bool,
) -> Result<TensorInfo, GgufError> {
    let ggml_type = GgmlType::from_id(type_id, bitnet_context);
    // Shape must suit the type: whole blocks per row, as ggml requires.
    if let Some(block) = ggml_type.block_elems() {
        if !dims[0].is_multiple_of(block) {
            return Err(GgufError::BadDims {
                tensor: name,
                reason: format!(
                    "ne[0] = {} is not a multiple of the {} block size {block}",
                    dims[0],
                    ggml_type.name()
                ),
            });
        }
    }
    if ggml_type == GgmlType::I2S && !n_elements.is_multiple_of(4) {
        return Err(GgufError::BadDims {
            tensor: name,
            reason: format!("{n_elements} elements is not a multiple of 4 (I2_S packs 4 per byte)"),
        });
    }
    // The byte size must be representable (e.g. 2^42+1 rows of a wide type must not wrap).
    if ggml_type
        .min_bytes(n_elements)
        .is_none_or(|b| usize::try_from(b).is_err())
    {
        return Err(GgufError::ShapeOverflow { tensor: name, dims });
    }
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        type_id,
        offset,
        available: 0,
    })
}

/// Checks alignment, bounds and overlap, and sets each tensor's `available` byte count.
fn assign_available(
    tensors: &mut [TensorInfo],
    alignment: u64,
    data_len: u64,
) -> Result<(), GgufError> {
    for t in tensors.iter() {
        if t.offset % alignment != 0 {
            return Err(GgufError::MisalignedOffset {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for (k, &i) in order.iter().enumerate() {
        let t = &tensors[i];
        let next = order.get(k + 1).map(|&j| &tensors[j]);
        let end = next.map_or(data_len, |n| n.offset.min(data_len));
        // min_bytes was checked to be Some when the tensor info was read.
        let min = t.ggml_type.min_bytes(t.n_elements()).unwrap_or(u64::MAX);
        let out_of_bounds = || GgufError::TensorOutOfBounds {
            tensor: t.name.clone(),
            offset: t.offset,
            needed: min,
            data_len,
        };
        if t.offset > data_len || t.offset.checked_add(min).is_none_or(|e| e > data_len) {
            return Err(out_of_bounds());
        }
        if let Some(n) = next {
            if t.offset.checked_add(min).is_none_or(|e| e > n.offset) {
                return Err(GgufError::OverlappingTensors {
                    tensor: t.name.clone(),
                    offset: t.offset,
                    needed: min,
                    next: n.name.clone(),
                    next_offset: n.offset,
                });
            }
        }
        let available = end.saturating_sub(t.offset);
        tensors[i].available = available;
    }
    Ok(())
}
