//! A hash map for keys that are already hashes or small ids: [`MixMap`], a std `HashMap`
//! with [`MixHasher`], one multiply-fold per key instead of SipHash's rounds.
//!
//! Why not the default hasher: the keys here are block hashes (uniform already), request ids
//! and entry ids (small sequential integers); SipHash's DoS resistance buys nothing for keys
//! the router itself issues or that are already xxh3 outputs, and its rounds sit on the
//! decision path of every lookup. Invariant: the fold keeps hashbrown's control bytes (the hash's top 7 bits)
//! well spread even for sequential ids. Complexity: O(1) per key.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hasher for keys that are already hashes or small ids: one multiply, high bits folded
/// down, so that hashbrown's control bytes (top 7 bits) stay well spread even for the
/// sequential ids that traces use.
#[derive(Debug, Default, Clone, Copy)]
pub struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        let m = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = m ^ (m >> 29);
    }
    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
}

/// A `HashMap` keyed by hashes or small ids, with [`MixHasher`].
pub type MixMap<K, V> = HashMap<K, V, BuildHasherDefault<MixHasher>>;
