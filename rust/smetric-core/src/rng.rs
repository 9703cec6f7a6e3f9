//! Counter-based random numbers: draw `k` is `splitmix64(seed + (k+1)·γ)`.
//!
//! A counter (one atomic add per draw) instead of a stateful generator keeps the router
//! lock-free and makes every decision reproducible from `(seed, k)`; the Python reference
//! computes the same stream. Draws are only taken when a decision needs one (a tie between
//! two or more candidates, a weighted sample), see `docs/routing-semantics.md` §5.
//!
//! This is the workspace's one SplitMix64: the simulator's arrival draws use [`DrawCounter`],
//! its trace-id mixing and synthetic token ids use [`mix64`] and [`GOLDEN_GAMMA`].

use std::sync::atomic::{AtomicU64, Ordering};

/// SplitMix64's increment: 2^64 / φ, odd, so `k·γ` visits every `u64` once.
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function: a bijective 64-bit finaliser.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The router's random stream.
#[derive(Debug)]
pub struct DrawCounter {
    seed: u64,
    next: AtomicU64,
}

impl DrawCounter {
    /// A stream starting at draw 0.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            next: AtomicU64::new(0),
        }
    }

    /// The next 64-bit draw.
    pub fn draw(&self) -> u64 {
        let k = self.next.fetch_add(1, Ordering::Relaxed);
        mix64(self.seed.wrapping_add(k.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)))
    }

    /// A uniform float in `[0, 1)` from the next draw.
    pub fn uniform(&self) -> f64 {
        (self.draw() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform index in `[0, m)`; takes no draw when `m <= 1`.
    pub fn pick(&self, m: usize) -> usize {
        if m <= 1 { 0 } else { (self.draw() % m as u64) as usize }
    }

    /// Draws taken so far.
    pub fn draws(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproducible_and_counted() {
        let (a, b) = (DrawCounter::new(7), DrawCounter::new(7));
        let xs: Vec<u64> = (0..5).map(|_| a.draw()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.draw()).collect();
        assert_eq!(xs, ys);
        assert_eq!(a.draws(), 5);
        assert_eq!(a.pick(1), 0);
        assert_eq!(a.draws(), 5, "a single candidate takes no draw");
        let u = a.uniform();
        assert!((0.0..1.0).contains(&u));
    }
}
