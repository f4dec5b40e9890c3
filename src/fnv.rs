//! The crate's one content hash.

/// 64-bit FNV-1a: a dependency-free content hash, stable across Rust versions (unlike
/// `DefaultHasher`), for fingerprints, record checksums, kernel cache keys and per-tensor
/// seeds. It detects accidents, not adversaries.
#[derive(Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub fn value(&self) -> u64 {
        self.0
    }

    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }

    pub fn of(bytes: &[u8]) -> Fnv {
        let mut h = Fnv::default();
        h.update(bytes);
        h
    }
}
