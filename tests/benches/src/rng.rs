//! A seeded pseudo-random sequence (SplitMix64) for load and fault schedules that are the same
//! in every run, so two runs (or two versions of the code) meet the same inputs.

pub struct Rng(pub u64);

impl Rng {
    /// The next value in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A whole number in [lo, hi).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + (self.unit() * (hi - lo) as f64) as u64
    }
}
