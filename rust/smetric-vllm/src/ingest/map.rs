//! Per-source bookkeeping: which engine block hash stands for which smetric blocks, in which
//! of the publisher's tiers it is held, and how many sources hold each smetric block.
//!
//! # Invariants
//! * An entry exists iff the source holds the engine block in at least one tier (`tiers != 0`);
//!   the last tier bit cleared removes it.
//! * The GPU bit is set iff `gpu_copies > 0`. vLLM's block pool does not de-duplicate: two
//!   requests that compute the same block each cache a physical copy, each copy is announced by
//!   its own `BlockStored` and each eviction by its own `BlockRemoved`, and a lookup hits while
//!   any copy is left. So GPU stores and removals count copies; CPU and STORAGE stay a bit (their
//!   stores are puts into a keyed store).
//! * [`Refs`] counts, per holder (an instance's local tier or the global tier) and smetric
//!   block, the sources whose entries hold it there. The ingestor removes a block from the
//!   router's index exactly when its count drops to zero, so several sources (data-parallel
//!   ranks of one instance; every instance for the global tier) never remove each other's blocks.
//! * [`EngineMap`] holds at most its capacity; making room evicts the least recently used
//!   eighth, which releases those blocks like a removal would.
//!
//! # Complexity
//! O(1) expected per lookup, insert and tier change; an eviction round is O(capacity) and runs
//! once per capacity/8 inserts, so O(1) amortised. Both maps key on 64-bit hashes (engine
//! hashes, smetric's xxh3 chain), so they use a one-multiply mixer instead of SipHash.

use std::collections::hash_map::Entry as MapEntry;

// Keys are already hashes: the core's multiply-xorshift hasher spreads them (and small test keys).
use smetric_core::{BlockHash, MixMap};

/// Tier bits of an entry.
pub(super) const GPU: u8 = 1;
pub(super) const CPU: u8 = 2;
pub(super) const STORAGE: u8 = 4;
const GLOBAL_TIERS: u8 = CPU | STORAGE;

/// The holder id of the global tier; instances get ids from 1.
pub(super) const GLOBAL_HOLDER: u32 = 0;
/// Set in the holder id of an instance's host pool: `HOST_HOLDER | local holder`.
const HOST_HOLDER: u32 = 1 << 31;

/// The reference-count holders a source's tiers count in: its instance's GPU, and for CPU
/// and STORAGE either the global tier (a shared store, [`GLOBAL_HOLDER`]) or the instance's
/// host pool (a host-local offload, docs/routing-semantics.md §2.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Holders {
    pub(super) local: u32,
    pub(super) offload: u32,
}

impl Holders {
    /// `local`'s holders, its offloads in the global tier or (`host_local`) in its host pool.
    pub(super) fn new(local: u32, host_local: bool) -> Self {
        Self {
            local,
            offload: if host_local { HOST_HOLDER | local } else { GLOBAL_HOLDER },
        }
    }
}

/// The smetric blocks one engine block stands for: one when the block sizes agree, `k` when
/// the engine's block is `k` router blocks long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Blocks {
    One(BlockHash),
    Many(Box<[BlockHash]>),
}

impl Blocks {
    pub(super) fn from_slice(hashes: &[BlockHash]) -> Self {
        match hashes {
            [one] => Self::One(*one),
            many => Self::Many(many.into()),
        }
    }

    pub(super) fn as_slice(&self) -> &[BlockHash] {
        match self {
            Self::One(h) => std::slice::from_ref(h),
            Self::Many(hs) => hs,
        }
    }

    /// The block covering the engine block's whole prefix (the parent of the next one).
    pub(super) fn last(&self) -> BlockHash {
        match self {
            Self::One(h) => *h,
            // Never empty: built from the chunks of a non-empty run.
            Self::Many(hs) => hs.last().copied().unwrap_or(BlockHash(0)),
        }
    }
}

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) blocks: Blocks,
    pub(super) tiers: u8,
    /// Physical GPU copies the engine announced and has not removed.
    gpu_copies: u32,
    stamp: u64,
}

/// Reference counts of smetric blocks per holder, over all sources.
#[derive(Debug, Default)]
pub(super) struct Refs(MixMap<(u32, u64), u32>);

impl Refs {
    fn inc(&mut self, holder: u32, blocks: &[BlockHash]) {
        for b in blocks {
            *self.0.entry((holder, b.0)).or_insert(0) += 1;
        }
    }

    /// Decrements; blocks no source holds any more go to `gone`.
    fn dec(&mut self, holder: u32, blocks: &[BlockHash], gone: &mut Vec<BlockHash>) {
        for b in blocks {
            if let MapEntry::Occupied(mut e) = self.0.entry((holder, b.0)) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                    gone.push(*b);
                }
            }
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// `(local, global)`: blocks held in instances' tiers, GPU and host pools (summed over
    /// instances), and in the global tier. O(entries).
    pub(super) fn held(&self) -> (usize, usize) {
        let global = self.0.keys().filter(|(holder, _)| *holder == GLOBAL_HOLDER).count();
        (self.0.len() - global, global)
    }
}

/// Blocks that left a holder and must be removed from the index.
#[derive(Debug, Default)]
pub(super) struct Gone {
    /// From the instance's GPU.
    pub(super) local: Vec<BlockHash>,
    /// From the source's offload holder: the global tier, or the instance's host pool.
    pub(super) offload: Vec<BlockHash>,
}

/// Applies a tier change of one entry to the reference counts.
pub(super) fn transition(
    refs: &mut Refs,
    holders: Holders,
    blocks: &[BlockHash],
    before: u8,
    after: u8,
    gone: &mut Gone,
) {
    let (was_local, is_local) = (before & GPU != 0, after & GPU != 0);
    let (was_global, is_global) = (before & GLOBAL_TIERS != 0, after & GLOBAL_TIERS != 0);
    if !was_local && is_local {
        refs.inc(holders.local, blocks);
    } else if was_local && !is_local {
        refs.dec(holders.local, blocks, &mut gone.local);
    }
    if !was_global && is_global {
        refs.inc(holders.offload, blocks);
    } else if was_global && !is_global {
        refs.dec(holders.offload, blocks, &mut gone.offload);
    }
}

/// Engine block hash → entry, bounded.
#[derive(Debug)]
pub(super) struct EngineMap {
    entries: MixMap<u64, Entry>,
    clock: u64,
    capacity: usize,
}

impl EngineMap {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            entries: MixMap::default(),
            clock: 0,
            capacity: capacity.max(1),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The smetric blocks of an engine hash, marking it recently used.
    pub(super) fn lookup(&mut self, engine: u64) -> Option<&Blocks> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(&engine).map(|e| {
            e.stamp = clock;
            &e.blocks
        })
    }

    /// Sets `bit` on an engine block, creating its entry (evicting first if full). When the
    /// entry exists with other blocks (a 64-bit engine-hash collision), the old blocks are
    /// released first. Returns how many entries were evicted to make room.
    pub(super) fn gain(
        &mut self,
        refs: &mut Refs,
        holders: Holders,
        engine: u64,
        blocks: &[BlockHash],
        bit: u8,
        gone: &mut Gone,
    ) -> usize {
        self.clock += 1;
        let mut evicted = 0;
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&engine) {
            evicted = self.evict(refs, holders, gone);
        }
        let stamp = self.clock;
        let entry = self.entries.entry(engine).or_insert_with(|| Entry {
            blocks: Blocks::from_slice(blocks),
            tiers: 0,
            gpu_copies: 0,
            stamp,
        });
        entry.stamp = stamp;
        if entry.blocks.as_slice() != blocks {
            transition(refs, holders, entry.blocks.as_slice(), entry.tiers, 0, gone);
            entry.blocks = Blocks::from_slice(blocks);
            entry.tiers = 0;
            entry.gpu_copies = 0;
        }
        if bit == GPU {
            entry.gpu_copies = entry.gpu_copies.saturating_add(1);
        }
        let before = entry.tiers;
        entry.tiers |= bit;
        transition(refs, holders, entry.blocks.as_slice(), before, entry.tiers, gone);
        evicted
    }

    /// Clears `bit` of an engine block (for GPU: drops one copy, and the bit with the last);
    /// false if the source did not hold it in that tier.
    pub(super) fn lose(&mut self, refs: &mut Refs, holders: Holders, engine: u64, bit: u8, gone: &mut Gone) -> bool {
        let MapEntry::Occupied(mut e) = self.entries.entry(engine) else {
            return false;
        };
        let entry = e.get_mut();
        if entry.tiers & bit == 0 {
            return false;
        }
        if bit == GPU {
            entry.gpu_copies = entry.gpu_copies.saturating_sub(1);
            if entry.gpu_copies > 0 {
                return true;
            }
        }
        let before = entry.tiers;
        entry.tiers &= !bit;
        transition(refs, holders, entry.blocks.as_slice(), before, entry.tiers, gone);
        if entry.tiers == 0 {
            e.remove();
        }
        true
    }

    /// Clears `bits` on every entry (`u8::MAX`: forget everything).
    pub(super) fn lose_all(&mut self, refs: &mut Refs, holders: Holders, bits: u8, gone: &mut Gone) {
        self.entries.retain(|_, entry| {
            let before = entry.tiers;
            entry.tiers &= !bits;
            if bits & GPU != 0 {
                entry.gpu_copies = 0;
            }
            transition(refs, holders, entry.blocks.as_slice(), before, entry.tiers, gone);
            entry.tiers != 0
        });
    }

    /// Drops the least recently used eighth of the entries; returns how many.
    fn evict(&mut self, refs: &mut Refs, holders: Holders, gone: &mut Gone) -> usize {
        let mut stamps: Vec<u64> = self.entries.values().map(|e| e.stamp).collect();
        let k = (stamps.len() / 8).max(1) - 1;
        let (_, &mut threshold, _) = stamps.select_nth_unstable(k);
        let before = self.entries.len();
        self.entries.retain(|_, entry| {
            if entry.stamp > threshold {
                return true;
            }
            transition(refs, holders, entry.blocks.as_slice(), entry.tiers, 0, gone);
            false
        });
        before - self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(v: u64) -> BlockHash {
        BlockHash(v)
    }

    /// Instance `n`'s holders, offloading to the shared store.
    fn sh(n: u32) -> Holders {
        Holders::new(n, false)
    }

    #[test]
    fn tiers_and_refcounts() {
        let (mut refs, mut gone) = (Refs::default(), Gone::default());
        let mut a = EngineMap::new(16);
        let mut b = EngineMap::new(16);
        a.gain(&mut refs, sh(1), 10, &[h(100)], GPU, &mut gone);
        a.gain(&mut refs, sh(1), 10, &[h(100)], CPU, &mut gone);
        b.gain(&mut refs, sh(2), 77, &[h(100)], STORAGE, &mut gone);
        assert_eq!(refs.len(), 2, "local of holder 1 and global");
        assert!(a.lose(&mut refs, sh(1), 10, CPU, &mut gone));
        assert!(gone.offload.is_empty(), "b still holds it globally");
        assert!(
            !a.lose(&mut refs, sh(1), 10, CPU, &mut gone),
            "not held in that tier any more"
        );
        assert!(a.lose(&mut refs, sh(1), 10, GPU, &mut gone));
        assert_eq!((gone.local.as_slice(), a.len()), (&[h(100)][..], 0));
        b.lose_all(&mut refs, sh(2), u8::MAX, &mut gone);
        assert_eq!(gone.offload, [h(100)]);
        assert_eq!(refs.len(), 0);
    }

    #[test]
    fn gpu_copies_are_counted_and_the_last_removal_releases() {
        let (mut refs, mut gone) = (Refs::default(), Gone::default());
        let mut m = EngineMap::new(8);
        // Two requests cached the same block: vLLM keeps (and announces) both copies.
        m.gain(&mut refs, sh(1), 9, &[h(90)], GPU, &mut gone);
        m.gain(&mut refs, sh(1), 9, &[h(90)], GPU, &mut gone);
        m.gain(&mut refs, sh(1), 9, &[h(90)], CPU, &mut gone);
        assert!(m.lose(&mut refs, sh(1), 9, GPU, &mut gone));
        assert!(gone.local.is_empty(), "one copy is still cached");
        assert!(m.lose(&mut refs, sh(1), 9, GPU, &mut gone));
        assert_eq!(gone.local, [h(90)]);
        assert!(!m.lose(&mut refs, sh(1), 9, GPU, &mut gone), "no copy left");
        // A store stays a set: one removal releases it whatever the number of puts.
        m.gain(&mut refs, sh(1), 9, &[h(90)], CPU, &mut gone);
        assert!(m.lose(&mut refs, sh(1), 9, CPU, &mut gone));
        assert_eq!((gone.offload.as_slice(), m.len()), (&[h(90)][..], 0));
        // A clear forgets every copy.
        m.gain(&mut refs, sh(1), 7, &[h(70)], GPU, &mut gone);
        m.gain(&mut refs, sh(1), 7, &[h(70)], GPU, &mut gone);
        m.lose_all(&mut refs, sh(1), GPU, &mut gone);
        m.gain(&mut refs, sh(1), 7, &[h(70)], GPU, &mut gone);
        assert!(m.lose(&mut refs, sh(1), 7, GPU, &mut gone));
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn eviction_releases_the_least_recently_used() {
        let (mut refs, mut gone) = (Refs::default(), Gone::default());
        let mut m = EngineMap::new(8);
        for i in 0..8 {
            m.gain(&mut refs, sh(1), i, &[h(i)], GPU, &mut gone);
        }
        assert!(m.lookup(0).is_some(), "0 becomes the most recent");
        let evicted = m.gain(&mut refs, sh(1), 8, &[h(8)], GPU, &mut gone);
        assert_eq!((evicted, m.len()), (1, 8));
        assert_eq!(gone.local, [h(1)]);
        assert!(m.lookup(0).is_some() && m.lookup(1).is_none());
    }

    #[test]
    fn a_colliding_engine_hash_replaces_its_blocks() {
        let (mut refs, mut gone) = (Refs::default(), Gone::default());
        let mut m = EngineMap::new(8);
        m.gain(&mut refs, sh(1), 5, &[h(1), h(2)], GPU, &mut gone);
        assert_eq!(m.lookup(5).map(Blocks::last), Some(h(2)));
        m.gain(&mut refs, sh(1), 5, &[h(3)], CPU, &mut gone);
        assert_eq!(gone.local, [h(1), h(2)]);
        assert_eq!(m.lookup(5).map(Blocks::as_slice), Some(&[h(3)][..]));
    }
}
