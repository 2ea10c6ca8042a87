//! Test helpers: a deterministic RNG and a minimal test-only GGUF tensor-table walker.
#![allow(clippy::cast_possible_truncation, clippy::unwrap_used, clippy::panic)]
#![allow(dead_code)]

/// xorshift64* — deterministic, dependency-free.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn i8(&mut self) -> i8 {
        self.next_u64() as u8 as i8
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn ternary(&mut self) -> i8 {
        self.below(3) as i8 - 1
    }
}

/// One tensor of a GGUF file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: u32,
    /// Absolute offset in the file.
    pub offset: usize,
}

/// Walk a GGUF v3 header just far enough to list tensors with absolute offsets.
pub fn gguf_tensors(buf: &[u8]) -> (Vec<TensorInfo>, usize) {
    let mut pos = 0usize;
    let u32_ = |pos: &mut usize| {
        let v = u32::from_le_bytes(buf[*pos..*pos + 4].try_into().unwrap());
        *pos += 4;
        v
    };
    let u64_ = |pos: &mut usize| {
        let v = u64::from_le_bytes(buf[*pos..*pos + 8].try_into().unwrap());
        *pos += 8;
        v
    };
    assert_eq!(&buf[0..4], b"GGUF");
    pos += 4;
    let _version = u32_(&mut pos);
    let n_tensors = u64_(&mut pos) as usize;
    let n_kv = u64_(&mut pos) as usize;
    let mut alignment = 32usize;
    fn skip_value(buf: &[u8], pos: &mut usize, ty: u32) -> Option<u64> {
        let sz = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => {
                let n = u64::from_le_bytes(buf[*pos..*pos + 8].try_into().unwrap()) as usize;
                *pos += 8 + n;
                return None;
            }
            9 => {
                let et = u32::from_le_bytes(buf[*pos..*pos + 4].try_into().unwrap());
                let n = u64::from_le_bytes(buf[*pos + 4..*pos + 12].try_into().unwrap());
                *pos += 12;
                for _ in 0..n {
                    skip_value(buf, pos, et);
                }
                return None;
            }
            _ => panic!("bad gguf value type {ty}"),
        };
        let mut v = [0u8; 8];
        v[..sz].copy_from_slice(&buf[*pos..*pos + sz]);
        *pos += sz;
        Some(u64::from_le_bytes(v))
    }
    for _ in 0..n_kv {
        let kl = u64_(&mut pos) as usize;
        let key = std::str::from_utf8(&buf[pos..pos + kl]).unwrap().to_owned();
        pos += kl;
        let ty = u32_(&mut pos);
        let v = skip_value(buf, &mut pos, ty);
        if key == "general.alignment" {
            alignment = v.unwrap() as usize;
        }
    }
    let mut infos = Vec::new();
    for _ in 0..n_tensors {
        let nl = u64_(&mut pos) as usize;
        let name = std::str::from_utf8(&buf[pos..pos + nl]).unwrap().to_owned();
        pos += nl;
        let nd = u32_(&mut pos) as usize;
        let dims = (0..nd).map(|_| u64_(&mut pos)).collect();
        let ty = u32_(&mut pos);
        let offset = u64_(&mut pos) as usize;
        infos.push(TensorInfo {
            name,
            dims,
            ty,
            offset,
        });
    }
    let data_start = pos.div_ceil(alignment) * alignment;
    for t in &mut infos {
        t.offset += data_start;
    }
    (infos, data_start)
}
