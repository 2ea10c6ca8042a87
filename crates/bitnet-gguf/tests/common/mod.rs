//! Hand-assembled GGUF bytes for negative tests, written straight from the format spec
//! (independent of the crate's writer).
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use bitnet_gguf::{GgufError, GgufFile, GgufWriter, Limits};

pub const T_U8: u32 = 0;
pub const T_I8: u32 = 1;
pub const T_U32: u32 = 4;
pub const T_I32: u32 = 5;
pub const T_F32: u32 = 6;
pub const T_BOOL: u32 = 7;
pub const T_STRING: u32 = 8;
pub const T_ARRAY: u32 = 9;
pub const T_U64: u32 = 10;

/// ggml type ids used in tests.
pub const G_F32: u32 = 0;
pub const G_F16: u32 = 1;
pub const G_Q4_0: u32 = 2;
pub const G_I2S: u32 = 36;

#[derive(Default, Clone)]
pub struct Raw(pub Vec<u8>);

impl Raw {
    /// Magic, version, tensor count, KV count.
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    /// GGUF string: u64 length + bytes.
    pub fn str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).bytes(s)
    }
    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key.as_bytes()).u32(T_U32).u32(v)
    }
    pub fn kv_str(&mut self, key: &str, v: &str) -> &mut Self {
        self.str(key.as_bytes()).u32(T_STRING).str(v.as_bytes())
    }
    /// Tensor info: name, n_dims, dims, type, offset.
    pub fn tensor(&mut self, name: &[u8], dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Zero padding up to a multiple of `align`.
    pub fn pad(&mut self, align: usize) -> &mut Self {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self
    }
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    pub fn fill(&mut self, n: usize, byte: u8) -> &mut Self {
        self.0.resize(self.0.len() + n, byte);
        self
    }
    pub fn parse(&self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0.clone(), &Limits::default())
    }
    pub fn parse_with(&self, limits: &Limits) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0.clone(), limits)
    }
}

/// A file with the given KV section (`n_kv` entries already encoded in `kvs`) and one F32
/// tensor `t` of 8 elements at offset 0.
pub fn with_kvs(n_kv: u64, kvs: &[u8]) -> Raw {
    let mut r = Raw::header(3, 1, n_kv);
    r.bytes(kvs).tensor(b"t", &[8], G_F32, 0).pad(32).zeros(32);
    r
}

/// A file with no KV pairs and the given tensor-info section (`n` entries) followed by
/// `data_len` bytes of tensor data after padding to 32.
pub fn with_tensors(n: u64, infos: &[u8], data_len: usize) -> Raw {
    let mut r = Raw::header(3, n, 0);
    r.bytes(infos).pad(32).zeros(data_len);
    r
}

/// One encoded tensor info.
pub fn info(name: &[u8], dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut r = Raw::default();
    r.tensor(name, dims, ty, offset);
    r.0
}

/// One encoded KV pair with a raw value.
pub fn kv_raw(key: &[u8], ty: u32, value: &[u8]) -> Vec<u8> {
    let mut r = Raw::default();
    r.str(key).u32(ty).bytes(value);
    r.0
}

/// Asserts the result is an error matching the pattern, with a readable failure message.
#[macro_export]
macro_rules! assert_err {
    ($res:expr, $pat:pat $(if $guard:expr)?) => {{
        match $res {
            Err(e) => assert!(matches!(&e, $pat $(if $guard)?), "unexpected error: {e:?}"),
            Ok(_) => panic!("expected an error matching {}, got Ok", stringify!($pat)),
        }
    }};
}

/// Resident file-backed memory of this process, in KiB (Linux only).
#[cfg(target_os = "linux")]
pub fn rss_file_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("RssFile:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A GGUF (written by the crate's writer into the test target's temporary folder as `name`)
/// holding the F16 tensor "big" of `big`'s bytes, then the 16-element F16 tensor "small" of
/// `small`'s 32 bytes when given. Returns the path and the file's bytes.
pub fn f16_file(name: &str, big: &[u8], small: Option<&[u8; 32]>) -> (std::path::PathBuf, Vec<u8>) {
    let mut w = GgufWriter::new(Vec::new(), 32).unwrap();
    w.add_kv("general.architecture", "llama".into()).unwrap();
    let n = big.len() as u64;
    w.add_tensor("big", &[n / 2], G_F16, n).unwrap();
    if small.is_some() {
        w.add_tensor("small", &[16], G_F16, 32).unwrap();
    }
    w.write_header().unwrap();
    w.write_tensor_data("big", big).unwrap();
    if let Some(t) = small {
        w.write_tensor_data("small", t).unwrap();
    }
    let bytes = w.finish().unwrap();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}
