//! The one seeded generator of the crate: splitmix64, small, seekable (a fresh state per row
//! or per case) and the same on every platform. Synthetic checkpoints, `check`'s random
//! inputs, `bench`'s tokens and the tests all draw from it, so a printed seed reproduces them.

/// splitmix64's state increment (the golden ratio in 64 bits).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix(self.0)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo)
    }

    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [-1, 1).
    pub fn symmetric(&mut self) -> f32 {
        (2.0 * self.unit() - 1.0) as f32
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let (u, v) = (self.unit(), self.unit());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }

    pub fn normal_vec(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * std).collect()
    }

    /// Approximately standard normal: the Irwin-Hall sum of four 16-bit uniforms (one
    /// generator call per value, for the billions of weights `synth` writes; bounded at about
    /// ±3.5 sigma, which weights do not miss).
    pub fn approx_normal(&mut self) -> f32 {
        const MEAN: f32 = 2.0 * 65535.0;
        // Standard deviation of the sum of four U{0..65535}: sqrt(4 * (65536^2 - 1) / 12).
        const INV_STD: f32 = 1.0 / 37_837.23;
        let r = self.next_u64();
        let s = (r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48);
        // `as i32` first: u64 -> f32 has no single instruction before AVX-512.
        (s as i32 as f32 - MEAN) * INV_STD
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// The generator of row `row` of a stream seeded `seed`: independent of every other row,
    /// so rows can be drawn in any order or in parallel.
    pub fn for_row(seed: u64, row: u64) -> Self {
        Rng(mix(seed ^ row.wrapping_mul(GOLDEN)))
    }
}

/// The splitmix64 finalizer, also used to derive independent seeds.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
